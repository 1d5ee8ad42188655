package policy

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

// errorCases is every check with the exact position and a fragment of the
// message it must produce. Each source is a whole file; each must produce
// exactly one error unless n says otherwise. FuzzParse seeds from these too.
var errorCases = []struct {
	name string
	src  string
	want string // "LINE:COL: fragment"
	n    int    // expected error count; 0 means 1
}{
	// YAML and document shape.
	{"yaml syntax", "version: 1\ningress: {listen: x\n", "2:1: YAML syntax error: did not find expected ',' or '}'", 0},
	{"yaml bad indent", "version: 1\nadmin: {}\n  listen: x\n", "3:1: YAML syntax error: did not find expected key", 0},
	{"yaml block mapping", "version: 1\n- x\n", "2:1: YAML syntax error: did not find expected key", 0},
	{"yaml unknown anchor", "version: 1\nadmin: *nope\n", "1:1: YAML syntax error: unknown anchor 'nope' referenced", 0},
	{"yaml tab indent", "version: 1\ningress:\n\tlisten: x\n", "3:1: YAML syntax error", 0},
	{"empty file", "", "1:1: the file is empty", 0},
	{"comment only", "# nothing\n", "1:1: the file is empty", 0},
	{"not a mapping", "- version\n", "1:1: a policy must be a mapping", 0},
	{"two documents", "version: 1\n---\nversion: 1\n", "2:1: a policy file holds one YAML document", 0},
	{"duplicate key top", "version: 1\nversion: 1\n", `2:1: duplicate key "version" at top level (first at line 1)`, 0},
	{"duplicate key nested", "version: 1\nadmin:\n  listen: 127.0.0.1:1\n  listen: 127.0.0.1:2\n", `4:3: duplicate key "listen" in admin (first at line 3)`, 0},
	{"duplicate merge key", "version: 1\npools:\n  p3:\n    <<: {rate: 1, window: 60}\n    <<: {rate: 2, window: 60}\n", `5:5: duplicate key "<<" in pools.p3 (first at line 4)`, 0},
	{"duplicate merge key top", "version: 1\n<<: {shutdown_grace: 1s}\n<<: {shutdown_grace: 2s}\n", `3:1: duplicate key "<<" at top level (first at line 2)`, 0},
	{"non-string key", "version: 1\n[a]: 1\n", "2:1: keys must be strings, got a list", 0},
	{"null value", "version: 1\nadmin:\n", "2:7: admin: has no value", 0},

	// version.
	{"version missing", "shutdown_grace: 1s\n", `1:1: missing required key "version" at top level`, 0},
	{"version 2", "version: 2\n", "1:10: version: 2 is not supported", 0},
	{"version string", "version: one\n", `1:10: version: expected an integer, got string "one"`, 0},

	// Unknown keys and types.
	{"unknown top", "version: 1\ningres: {}\n", `2:1: unknown key "ingres" at top level (did you mean "ingress"?)`, 0},
	{"unknown nested", "version: 1\ntargets:\n  - name: a\n    hosts: [a.com]\n    retyr: {count: 1}\n", `5:5: unknown key "retyr" in targets[0] (did you mean "retry"?)`, 0},
	{"string for int", "version: 1\npools:\n  p: {concurrency: \"5\"}\n", `3:20: pools.p.concurrency: expected an integer, got string "5"`, 0},
	{"float for int", "version: 1\npools:\n  p: {queue: 1.5}\n", "3:14: pools.p.queue: expected an integer, got number 1.5", 0},
	{"string for list", "version: 1\ntargets:\n  - name: a\n    hosts: a.com\n", `4:12: targets[0].hosts: expected a list, got string "a.com"`, 0},
	{"list for mapping", "version: 1\npools: [a]\n", "2:8: pools: expected a mapping of name to settings, got a list", 0},
	{"string for bool", "version: 1\negress:\n  http_listen: :1\n  allow_unlisted: yes\n", `4:19: egress.allow_unlisted: expected true or false, got string "yes"`, 0},
	{"bool for string", "version: 1\nadmin: {listen: true}\n", "2:17: admin.listen: expected a string, got boolean true", 0},
	{"string for float", "version: 1\ntargets:\n  - {name: a, hosts: [a], retry: {scale: x}}\n", `3:42: targets[0].retry.scale: expected a number, got string "x"`, 0},

	// Durations.
	{"duration bare int", "version: 1\nshutdown_grace: 20\n", "2:17: shutdown_grace: 20 has no unit; write a Go duration such as 20s", 0},
	{"duration quoted int", "version: 1\nshutdown_grace: \"20\"\n", `2:17: shutdown_grace: "20" has no unit`, 0},
	{"duration garbage", "version: 1\nshutdown_grace: 20 seconds\n", `2:17: shutdown_grace: "20 seconds" is not a duration`, 0},
	{"duration negative", "version: 1\nshutdown_grace: -1s\n", "2:17: shutdown_grace: -1s must not be negative", 0},
	{"duration zero where positive", "version: 1\ntargets:\n  - {name: a, hosts: [a], circuit_breaker: {open: 0s}}\n", "3:51: targets[0].circuit_breaker.open: 0s must be greater than 0", 0},
	{"duration list", "version: 1\nshutdown_grace: [1s]\n", "2:17: shutdown_grace: expected a duration such as 30s, got a list", 0},

	// Numbers.
	{"negative int", "version: 1\npools:\n  p: {concurrency: -1}\n", "3:20: pools.p.concurrency: -1 must not be negative", 0},
	{"priority out of range", "version: 1\ningress: {listen: ':1', worker: 'http://w'}\nscheduler:\n  definitions:\n    d: {priority: -3000000000}\n", "5:19: scheduler.definitions.d.priority: -3000000000 is outside [-2147483648, 2147483647]", 0},
	{"huge int", "version: 1\npools:\n  p: {queue: 99999999999}\n", "3:14: pools.p.queue: 99999999999 is too large", 0},
	{"window", "version: 1\npools:\n  stripe: {rate: 5, window: 45}\n", "3:29: pools.stripe.window: 45 is not one of 1, 60, 3600, 86400", 0},
	{"failure ratio", "version: 1\ntargets:\n  - name: a\n    hosts: [a]\n    circuit_breaker: {failure_ratio: 1.5}\n", "5:38: targets[0].circuit_breaker.failure_ratio: 1.5 is outside [0,1]", 0},
	{"jitter negative", "version: 1\ntargets:\n  - {name: a, hosts: [a], retry: {jitter: -0.1}}\n", "3:43: targets[0].retry.jitter: -0.1 is outside [0,1]", 0},
	{"budget", "version: 1\negress:\n  http_listen: :1\n  defaults: {retry: {budget: 2}}\n", "4:30: egress.defaults.retry.budget: 2 is outside [0,1]", 0},
	{"nan", "version: 1\ntargets:\n  - {name: a, hosts: [a], retry: {scale: .nan}}\n", "3:42: targets[0].retry.scale: .nan is not a finite number", 0},
	{"scale zero", "version: 1\ntargets:\n  - {name: a, hosts: [a], retry: {scale: 0}}\n", "3:42: targets[0].retry.scale: 0 must be greater than 0", 0},
	{"lanes zero", "version: 1\ningress: {listen: ':1', worker: 'http://w'}\nscheduler: {lanes: 0}\n", "3:20: scheduler.lanes: 0 must be at least 1", 0},
	{"semaphore zero permits", "version: 1\ningress: {listen: ':1', worker: 'http://w'}\nscheduler:\n  semaphores: {erp: 0}\n", "4:21: scheduler.semaphores.erp: 0 must be at least 1", 0},
	{"bridge max connections zero", "version: 1\nbridges:\n  - {name: db, listen: ':1', upstream: 'db:5432', max_connections: 0}\n", "3:68: bridges[0].max_connections: 0 must be at least 1", 0},

	// Enumerations.
	{"retry logic", "version: 1\ntargets:\n  - {name: a, hosts: [a], retry: {logic: exponential}}\n", `3:42: targets[0].retry.logic: "exponential" is not one of fixed, linear_backoff, exponential_backoff`, 0},
	{"backend kind", "version: 1\nbackend: {kind: etcd}\n", `2:17: backend.kind: "etcd" is not one of memory, redis`, 0},
	{"backend on_error", "version: 1\nbackend: {on_error: open}\n", `2:21: backend.on_error: "open" is not one of fail_open, fail_closed`, 0},
	{"redis needs url", "version: 1\nbackend:\n  kind: redis\n", "2:1: backend: kind redis needs url", 0},
	{"redis url scheme", "version: 1\nbackend: {kind: redis, url: 'http://r:6379'}\n", `2:29: backend.url: "http://r:6379": scheme "http" is not one of redis, rediss, unix`, 0},
	{"redis url db", "version: 1\nbackend: {kind: redis, url: 'redis://127.0.0.1:6379/abc'}\n", `2:29: backend.url: "redis://127.0.0.1:6379/abc": redis: invalid database number`, 0},
	{"redis url option", "version: 1\nbackend: {kind: redis, url: 'redis://127.0.0.1:6379/0?foo=bar'}\n", `2:29: backend.url: "redis://127.0.0.1:6379/0?foo=bar": redis: unexpected option: foo`, 0},
	{"redis url password hidden", "version: 1\nbackend: {kind: redis, url: 'redis://:s3cret@127.0.0.1:6379/x'}\n", `2:29: backend.url: "redis://:xxxxx@127.0.0.1:6379/x": redis: invalid database number`, 0},
	{"postgres url option", "version: 1\ningress: {listen: ':1', worker: 'http://w'}\nscheduler:\n  store: {kind: postgres, url: 'postgres://u:pw@h/db?pool_max_conns=x'}\n", `4:32: scheduler.store.url: "postgres://u:xxxxx@h/db?pool_max_conns=x": cannot parse`, 0},
	{"postgres url password hidden", "version: 1\ningress: {listen: ':1', worker: 'http://w'}\nscheduler:\n  store: {kind: postgres, url: 'mysql://u:pw@h/db'}\n", `4:32: scheduler.store.url: "mysql://u:xxxxx@h/db": scheme "mysql"`, 0},
	{"store kind", "version: 1\ningress: {listen: ':1', worker: 'http://w'}\nscheduler:\n  store: {kind: sqlite}\n", `4:17: scheduler.store.kind: "sqlite" is not one of bbolt, memory, postgres`, 0},
	{"postgres needs url", "version: 1\ningress: {listen: ':1', worker: 'http://w'}\nscheduler:\n  store: {kind: postgres}\n", "4:3: scheduler.store: kind postgres needs url", 0},
	{"postgres url scheme", "version: 1\ningress: {listen: ':1', worker: 'http://w'}\nscheduler:\n  store: {kind: postgres, url: 'mysql://x/db'}\n", `4:32: scheduler.store.url: "mysql://x/db": scheme "mysql" is not one of postgres, postgresql`, 0},
	{"bridge protocol", "version: 1\nbridges:\n  - {name: db, listen: ':1', upstream: 'db:5432', protocol: mysql}\n", `3:61: bridges[0].protocol: "mysql" is not one of postgres, tcp`, 0},

	// URLs and addresses.
	{"http target h2c", "version: 1\ntargets:\n  - name: a\n    hosts: [a.com]\n    upstream: h2c://a.com\n", `5:15: targets[0].upstream: "h2c://a.com": scheme "h2c" is not one of http, https`, 0},
	{"grpc target scheme", "version: 1\ntargets:\n  - name: a\n    grpc_service: a.v1.A\n    upstream: ftp://a\n", `5:15: targets[0].upstream: "ftp://a": scheme "ftp" is not one of h2c, http, https`, 0},
	{"upstream with path", "version: 1\ntargets:\n  - name: a\n    hosts: [a.com]\n    upstream: https://a.com/v1\n", "5:15: targets[0].upstream: \"https://a.com/v1\" must be an origin", 0},
	{"worker no scheme", "version: 1\ningress: {listen: ':1', worker: '127.0.0.1:9000'}\n", `2:33: ingress.worker: "127.0.0.1:9000" has no scheme (write http://127.0.0.1:9000)`, 0},
	{"worker scheme", "version: 1\ningress: {listen: ':1', worker: 'ftp://w'}\n", `2:33: ingress.worker: "ftp://w": scheme "ftp" is not one of http, https`, 0},
	{"listen not hostport", "version: 1\nadmin: {listen: 9901}\n", `2:17: admin.listen: "9901" is not host:port (did you mean ":9901"?)`, 0},
	{"listen port range", "version: 1\nrls: {listen: '127.0.0.1:70000'}\n", `2:15: rls.listen: port "70000" is not a number in 0-65535`, 0},
	{"listen port name", "version: 1\nrls: {listen: 'localhost:http'}\n", `2:15: rls.listen: port "http" is not a number`, 0},
	{"bridge upstream", "version: 1\nbridges:\n  - {name: db, listen: ':1', upstream: 5432}\n", `3:40: bridges[0].upstream: "5432" is not host:port`, 0},
	{"host is url", "version: 1\ntargets:\n  - {name: a, hosts: ['https://a.com']}\n", `3:23: targets[0].hosts[0]: "https://a.com" is not a host`, 0},
	{"grpc service name", "version: 1\ntargets:\n  - {name: a, grpc_service: /a.B/C}\n", `3:29: targets[0].grpc_service: "/a.B/C" is not a gRPC service name`, 0},
	{"same listen twice", "version: 1\nadmin: {listen: '127.0.0.1:9901'}\nrls: {listen: '127.0.0.1:9901'}\n", "3:15: rls.listen: 127.0.0.1:9901 is already used by admin.listen (127.0.0.1:9901, line 2)", 0},
	{"wildcard after hosts clashes with the first", "version: 1\nbridges:\n  - {name: a, listen: '127.0.0.1:7000', upstream: 'db:1'}\n  - {name: b, listen: '127.0.0.2:7000', upstream: 'db:1'}\n  - {name: c, listen: ':7000', upstream: 'db:1'}\n  - {name: d, listen: '127.0.0.2:7000', upstream: 'db:1'}\n", "5:23: bridges[2].listen: :7000 is already used by bridges[0].listen (127.0.0.1:7000, line 3)", 2},
	{"host clashes with the earliest of host and wildcard", "version: 1\nbridges:\n  - {name: a, listen: '127.0.0.1:7000', upstream: 'db:1'}\n  - {name: b, listen: '127.0.0.2:7000', upstream: 'db:1'}\n  - {name: c, listen: ':7000', upstream: 'db:1'}\n  - {name: d, listen: '127.0.0.2:7000', upstream: 'db:1'}\n", "6:23: bridges[3].listen: 127.0.0.2:7000 is already used by bridges[1].listen (127.0.0.2:7000, line 4)", 2},
	{"wildcard listen clash", "version: 1\ningress: {listen: '0.0.0.0:8080', worker: 'http://w'}\nbridges:\n  - {name: db, listen: '127.0.0.1:8080', upstream: 'db:5432'}\n", "4:24: bridges[0].listen: 127.0.0.1:8080 is already used by ingress.listen", 0},
	{"env name", "version: 1\nadmin: {listen: ':1', token_env: 'my token'}\n", `2:34: admin.token_env: "my token" is not an environment variable name`, 0},
	{"tenant header", "version: 1\ningress:\n  listen: ':1'\n  worker: 'http://w'\n  tenant: {header: 'x tenant', rate: 1, window: 1}\n", `5:20: ingress.tenant.header: "x tenant" is not an HTTP header name`, 0},

	// Required keys.
	{"ingress listen", "version: 1\ningress:\n  worker: http://w\n", `2:1: missing required key "listen" in ingress`, 0},
	{"ingress worker", "version: 1\ningress:\n  listen: ':1'\n", `2:1: missing required key "worker" in ingress`, 0},
	{"egress listens", "version: 1\negress:\n  allow_unlisted: false\n", "2:1: egress: needs http_listen, grpc_listen or both", 0},
	{"admin listen", "version: 1\nadmin: {token_env: T}\n", `2:1: missing required key "listen" in admin`, 0},
	{"target name", "version: 1\ntargets:\n  - hosts: [a.com]\n", `3:5: missing required key "name" in targets[0]`, 0},
	{"target empty name", "version: 1\ntargets:\n  - {name: '', hosts: [a.com]}\n", "3:12: targets[0].name: must not be empty", 0},
	{"target bad name", "version: 1\ntargets:\n  - {name: 'a b', hosts: [a.com]}\n", `3:12: targets[0].name: name "a b" must be letters`, 0},
	{"target no selector", "version: 1\ntargets:\n  - name: a\n", "3:5: targets[0]: needs hosts (an HTTP target) or grpc_service (a gRPC target)", 0},
	{"target both selectors", "version: 1\ntargets:\n  - name: a\n    hosts: [a.com]\n    grpc_service: a.v1.A\n", "3:5: targets[0]: set hosts (an HTTP target) or grpc_service (a gRPC target), not both", 0},
	{"target no hosts", "version: 1\ntargets:\n  - {name: a, hosts: []}\n", "3:22: targets[0].hosts: lists no hosts", 0},
	{"bridge name", "version: 1\nbridges:\n  - {listen: ':1', upstream: 'db:5432'}\n", `3:5: missing required key "name" in bridges[0]`, 0},
	{"bridge listen", "version: 1\nbridges:\n  - {name: db, upstream: 'db:5432'}\n", `3:5: missing required key "listen" in bridges[0]`, 0},
	{"bridge upstream missing", "version: 1\nbridges:\n  - {name: db, listen: ':1'}\n", `3:5: missing required key "upstream" in bridges[0]`, 0},
	{"rls listen", "version: 1\nrls:\n  domains: {}\n", `2:1: missing required key "listen" in rls`, 0},
	{"rls entry rate", "version: 1\nrls:\n  listen: ':1'\n  domains:\n    edge:\n      - {key: tenant, window: 60}\n", `6:9: missing required key "rate" in rls.domains.edge[0]`, 0},
	{"rls entry window", "version: 1\nrls:\n  listen: ':1'\n  domains:\n    edge:\n      - {key: tenant, rate: 5}\n", `6:9: missing required key "window" in rls.domains.edge[0]`, 0},
	{"rls duplicate entry", "version: 1\nrls:\n  listen: ':1'\n  domains:\n    edge:\n      - {key: t, value: a, rate: 5, window: 1}\n      - {key: t, value: a, rate: 6, window: 1}\n", `7:9: rls.domains.edge[1]: duplicate entry for key "t" value "a" (first at line 6)`, 0},
	{"tenant rate", "version: 1\ningress:\n  listen: ':1'\n  worker: 'http://w'\n  tenant: {window: 1}\n", `5:3: missing required key "rate" in ingress.tenant`, 0},
	{"tenant override window", "version: 1\ningress:\n  listen: ':1'\n  worker: 'http://w'\n  tenant: {rate: 1, window: 1}\n  tenants: {acme: {rate: 5}}\n", `6:13: missing required key "window" in ingress.tenants.acme`, 0},
	{"tenants without tenant", "version: 1\negress:\n  http_listen: ':1'\n  tenants: {acme: {rate: 5, window: 1}}\n", "4:3: egress.tenants: needs egress.tenant", 0},
	{"pool window when rate", "version: 1\npools:\n  stripe: {rate: 100}\n", "3:3: pools.stripe: rate 100 needs a window", 0},
	{"pool bad name", "version: 1\npools:\n  'a/b': {concurrency: 1}\n", `3:3: pools["a/b"]: name "a/b" must be letters`, 0},

	// Duplicates and references.
	{"duplicate target", "version: 1\ntargets:\n  - {name: a, hosts: [a.com]}\n  - {name: a, hosts: [b.com]}\n", `4:12: targets[1].name: duplicate target name "a" (first at line 3)`, 0},
	{"duplicate host", "version: 1\ntargets:\n  - {name: a, hosts: [a.com]}\n  - {name: b, hosts: [A.com]}\n", `4:23: targets[1].hosts[0]: host "A.com" is already routed by targets[0].hosts[0] (line 3)`, 0},
	{"duplicate service", "version: 1\ntargets:\n  - {name: a, grpc_service: a.A}\n  - {name: b, grpc_service: a.A}\n", `4:29: targets[1].grpc_service: service "a.A" is already routed by targets[0].grpc_service (line 3)`, 0},
	{"duplicate bridge", "version: 1\nbridges:\n  - {name: db, listen: ':1', upstream: 'db:1'}\n  - {name: db, listen: ':2', upstream: 'db:1'}\n", `4:12: bridges[1].name: duplicate bridge name "db" (first at line 3)`, 0},
	{"duplicate pool key", "version: 1\npools:\n  p: {concurrency: 1}\n  p: {concurrency: 2}\n", `4:3: duplicate key "p" in pools (first at line 3)`, 0},
	{"undefined target pool", "version: 1\npools:\n  stripe: {concurrency: 1}\ntargets:\n  - {name: a, hosts: [a], pools: [strip]}\n", `5:35: targets[0].pools[0]: undefined pool "strip" (did you mean "stripe"?)`, 0},
	{"pool listed twice", "version: 1\npools:\n  p: {concurrency: 1}\ntargets:\n  - {name: a, hosts: [a], pools: [p, p]}\n", `5:38: targets[0].pools[1]: pool "p" is listed twice`, 0},
	{"one host:port spelled twice", "version: 1\ntargets:\n  - {name: a, hosts: [\"h.test:80\"]}\n  - {name: b, hosts: [\"H.test:080\", \"[0:0::1]:80\", \"[::1]:080\"]}\n", `4:52: targets[1].hosts[2]: host "[::1]:080" is already routed by targets[1].hosts[1] (line 4)`, 2},
	{"one port spelled twice", "version: 1\ntargets:\n  - {name: a, hosts: [\"h.test:80\"]}\n  - {name: b, hosts: [\"H.test:080\"]}\n", `4:23: targets[1].hosts[0]: host "H.test:080" is already routed by targets[0].hosts[0] (line 3)`, 0},
	{"boolean as a name", "version: 1\npools:\n  true: {concurrency: 1}\n", `3:3: pools: name true is YAML's boolean; quote it ("true") to use it as a name`, 0},
	{"null as a name", "version: 1\npools:\n  ~: {concurrency: 1}\n", `3:3: pools: name ~ is YAML's null; quote it ("~") to use it as a name`, 0},
	{"cap_key members listed together", "version: 1\npools:\n  p: {concurrency: 1, cap_key: k}\n  q: {concurrency: 1, cap_key: k}\ntargets:\n  - {name: a, hosts: [a], pools: [p, q]}\n", `6:38: targets[0].pools[1]: pools "p" and "q" share cap_key "k", so they are one pool: list one of them`, 0},
	{"undefined definition pool", "version: 1\ningress: {listen: ':1', worker: 'http://w'}\nscheduler:\n  definitions:\n    sync: {pool: nope}\n", `5:18: scheduler.definitions.sync.pool: undefined pool "nope"`, 0},
	{"undefined semaphore", "version: 1\ningress: {listen: ':1', worker: 'http://w'}\nscheduler:\n  semaphores: {erp: 1}\n  definitions:\n    sync: {semaphores: [erp, crm]}\n", `6:30: scheduler.definitions.sync.semaphores[1]: undefined semaphore "crm"`, 0},
	{"scheduler without ingress", "version: 1\nscheduler: {lanes: 2}\n", "2:1: scheduler: needs the ingress section", 0},

	// Scheduler shapes.
	{"key no placeholder", "version: 1\ningress: {listen: ':1', worker: 'http://w'}\nscheduler:\n  definitions:\n    sync: {key: tenant}\n", `5:17: scheduler.definitions.sync.key: "tenant" has no ${input.<path>} or ${header.<name>} placeholder`, 0},
	{"key bad placeholder", "version: 1\ningress: {listen: ':1', worker: 'http://w'}\nscheduler:\n  definitions:\n    sync: {key: 'a-${env.HOME}'}\n", "5:17: scheduler.definitions.sync.key: placeholder ${env.HOME} must be ${input.<path>} or ${header.<name>}", 0},
	{"key unterminated", "version: 1\ningress: {listen: ':1', worker: 'http://w'}\nscheduler:\n  definitions:\n    sync: {key: '${input.a'}\n", `5:17: scheduler.definitions.sync.key: "${input.a" has an unterminated ${`, 0},
	{"key concurrency without key", "version: 1\ningress: {listen: ':1', worker: 'http://w'}\nscheduler:\n  definitions:\n    sync: {key_concurrency: 1}\n", "5:29: scheduler.definitions.sync.key_concurrency: needs key", 0},
	{"path prefix slash", "version: 1\ningress: {listen: ':1', worker: 'http://w'}\nscheduler: {path_prefix: v1/runs}\n", `3:26: scheduler.path_prefix: "v1/runs" must start with '/'`, 0},
	{"path prefix trailing", "version: 1\ningress: {listen: ':1', worker: 'http://w'}\nscheduler: {path_prefix: /v1/runs/}\n", `3:26: scheduler.path_prefix: "/v1/runs/" must not end with '/'`, 0},
	{"run path slash", "version: 1\ningress: {listen: ':1', worker: 'http://w'}\nscheduler: {run_path: run}\n", `3:23: scheduler.run_path: "run" must start with '/'`, 0},

	// Orderings after defaults.
	{"max_delay below delay", "version: 1\ntargets:\n  - {name: a, hosts: [a], retry: {delay: 2s, max_delay: 1s}}\n", "3:57: targets[0].retry.max_delay: 1s is less than delay 2s", 0},
	{"inherited max_delay below delay", "version: 1\negress:\n  http_listen: ':1'\n  defaults: {retry: {max_delay: 1s}}\ntargets:\n  - {name: a, hosts: [a], retry: {delay: 2s}}\n", "6:42: targets[0].retry.delay: 2s is more than max_delay 1s", 0},
	{"max_open below open", "version: 1\ntargets:\n  - {name: a, hosts: [a], circuit_breaker: {open: 2m, max_open: 1m}}\n", "3:65: targets[0].circuit_breaker.max_open: 1m0s is less than open 2m0s", 0},
	{"idle in transaction on tcp", "version: 1\nbridges:\n  - name: db\n    listen: ':1'\n    upstream: 'db:5432'\n    idle_in_transaction_timeout: 5s\n", "6:34: bridges[0].idle_in_transaction_timeout: needs protocol: postgres", 0},
}

func TestParseErrors(t *testing.T) {
	for _, tc := range errorCases {
		t.Run(tc.name, func(t *testing.T) {
			p, err := Parse("t.yaml", []byte(tc.src))
			if err == nil {
				t.Fatalf("no error; want %q", tc.want)
			}
			if p != nil {
				t.Errorf("got a policy alongside errors")
			}
			var errs Errors
			if !errors.As(err, &errs) {
				t.Fatalf("error %T is not policy.Errors: %v", err, err)
			}
			n := max(tc.n, 1)
			if errs.Len() != n {
				t.Errorf("got %d errors, want %d:\n%v", errs.Len(), n, err)
			}
			want := "t.yaml:" + tc.want
			for _, is := range errs.Issues {
				if strings.HasPrefix(is.String(), want) {
					return
				}
			}
			t.Errorf("no error starts with\n  %s\ngot:\n  %s", want, strings.ReplaceAll(err.Error(), "\n", "\n  "))
		})
	}
}

// An element that is not a mapping where one belongs is reported once and
// left out of what is decoded; the elements after it keep their index in
// the file in every later message, and a pool left out is still a pool
// that references may name.
func TestElementsThatAreNotMappings(t *testing.T) {
	src := `version: 1
pools:
  p: 0
targets:
  - 0
  - {name: a, hosts: [x], pools: [p]}
  -
  - {name: a, hosts: [y]}
bridges: [b, {name: c, listen: ':1', upstream: 'db:1', idle_in_transaction_timeout: 1s}]
`
	_, err := Parse("t.yaml", []byte(src))
	want := []string{
		"t.yaml:3:6: pools.p: expected a mapping, got integer 0",
		"t.yaml:5:5: targets[0]: expected a mapping, got integer 0",
		"t.yaml:7:4: targets[2]: has no value; give one or remove the key",
		`t.yaml:8:12: targets[3].name: duplicate target name "a" (first at line 6)`,
		"t.yaml:9:11: bridges[0]: expected a mapping, got string \"b\"",
		"t.yaml:9:85: bridges[1].idle_in_transaction_timeout: needs protocol: postgres (a tcp bridge cannot see transactions)",
	}
	if err == nil || err.Error() != strings.Join(want, "\n") {
		t.Fatalf("got\n%v\nwant\n%s", err, strings.Join(want, "\n"))
	}
}

// decimal reads what yaml.v3 reads, and leaves it everything but plain
// decimals.
func TestDecimalMatchesYAML(t *testing.T) {
	for _, v := range []string{"0", "-0", "7", "500", "-1", "2147483648", "9223372036854775807", "-9223372036854775808",
		"9223372036854775808", "007", "+5", "1_000", "0x1F", "0o17", "0b11", `"5"`, "!!int 5", "1e3"} {
		var doc yaml.Node
		if err := yaml.Unmarshal([]byte("v: "+v), &doc); err != nil {
			t.Fatal(err)
		}
		n := doc.Content[0].Content[1]
		got, ok := decimal(n)
		var want int64
		err := n.Decode(&want)
		plain := !strings.ContainsAny(v, "\"!+_xob") && v != "007" && v != "1e3" && v != "9223372036854775808"
		if ok != plain || ok && (err != nil || got != want) {
			t.Errorf("decimal(%s) = %d, %v; yaml.v3: %d, %v", v, got, ok, want, err)
		}
	}
}

// A file with several unrelated mistakes reports all of them, in file order.
func TestParseReportsEveryErrorInFileOrder(t *testing.T) {
	src := `version: 1
shutdown_grace: 20
targets:
  - name: stripe
    hosts: [api.stripe.com]
    retyr: {count: 3}
    circuit_breaker: {failure_ratio: 1.5}
pools:
  stripe: {rate: 100, window: 45}
`
	_, err := Parse("multi.yaml", []byte(src))
	var errs Errors
	if !errors.As(err, &errs) {
		t.Fatalf("want Errors, got %v", err)
	}
	want := []string{
		"multi.yaml:2:17: shutdown_grace: 20 has no unit",
		`multi.yaml:6:5: unknown key "retyr" in targets[0]`,
		"multi.yaml:7:38: targets[0].circuit_breaker.failure_ratio: 1.5 is outside [0,1]",
		"multi.yaml:9:31: pools.stripe.window: 45 is not one of 1, 60, 3600, 86400",
	}
	lines := strings.Split(err.Error(), "\n")
	if len(lines) != len(want) {
		t.Fatalf("got %d lines, want %d:\n%s", len(lines), len(want), err)
	}
	for i := range want {
		if !strings.HasPrefix(lines[i], want[i]) {
			t.Errorf("line %d = %q, want prefix %q", i, lines[i], want[i])
		}
	}
}

func TestMergeKeysAndAliases(t *testing.T) {
	src := `version: 1
x-breaker: &breaker {enabled: true, open: 10s}
targets:
  - name: a
    hosts: [a.com]
    circuit_breaker:
      <<: *breaker
      open: 20s
`
	// x-breaker is not a policy key, so anchors must live inside known
	// sections; first check that the unknown key is reported...
	if _, err := Parse("t.yaml", []byte(src)); err == nil || !strings.Contains(err.Error(), `unknown key "x-breaker"`) {
		t.Fatalf("want unknown key error, got %v", err)
	}
	// ...then use an anchor defined on a real target.
	src = `version: 1
targets:
  - name: a
    hosts: [a.com]
    circuit_breaker: &breaker {enabled: true, open: 10s}
  - name: b
    hosts: [b.com]
    circuit_breaker:
      <<: *breaker
      open: 20s
  - name: c
    hosts: [c.com]
    circuit_breaker: *breaker
`
	p, err := Parse("t.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	b := p.Targets[1].CircuitBreaker
	if !b.Enabled || b.Open.String() != "20s" {
		t.Errorf("merged breaker = %+v, want enabled with open 20s", *b)
	}
	if c := p.Targets[2].CircuitBreaker; !c.Enabled || c.Open.String() != "10s" {
		t.Errorf("aliased breaker = %+v", *c)
	}
}

// One << with a list merges every mapping in it, earlier ones winning; it
// is the way to merge several, since a second << is a duplicate key.
func TestMergeKeyList(t *testing.T) {
	src := `version: 1
pools:
  a: &a {rate: 1, window: 60}
  b: &b {rate: 2, window: 1, concurrency: 3}
  c:
    <<: [*a, *b]
    queue: 7
`
	p, err := Parse("t.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	c, _ := p.PoolByName("c")
	if c.Rate != 1 || c.Concurrency != 3 || c.Queue != 7 {
		t.Errorf("pool c = %+v, want rate 1 (from a), concurrency 3 (from b), queue 7", c)
	}
}

func TestSelfMergeDoesNotHang(t *testing.T) {
	src := "version: 1\nadmin: &a\n  <<: *a\n  listen: ':1'\n"
	_, _ = Parse("t.yaml", []byte(src)) // must return, error or not
}

func TestAliasBombIsBounded(t *testing.T) {
	// Each file is a few KB whose aliases expand to about 250,000 keys and
	// values, past the bound; decoding must stop with an error instead of
	// expanding them all.
	list := func(n int, item string) string {
		return strings.TrimSuffix(strings.Repeat(item+", ", n), ", ")
	}
	repeat := func(n int, line string) string { return strings.Repeat(line+"\n", n) }
	keys := func(n int) string {
		var b strings.Builder
		for i := range n {
			fmt.Fprintf(&b, ", k%d: 1", i)
		}
		return b.String()
	}
	for _, tc := range []struct{ name, src string }{
		{"alias", "version: 1\ntargets:\n  - &t {name: a, hosts: [" + list(500, "h") + "]}\n" + repeat(500, "  - *t")},
		{"merge of an alias", "version: 1\ntargets:\n  - &t {name: a, hosts: [" + list(500, "h") + "]}\n" + repeat(500, "  - {<<: *t}")},
		{"merge of a list of aliases", "version: 1\ntargets:\n  - &t {name: a, hosts: [" + list(500, "h") + "]}\n" + repeat(500, "  - {<<: [*t]}")},
		// Unknown keys decode no value, but each is reported every time
		// the mapping is named.
		{"unknown keys", "version: 1\ntargets:\n  - &t {name: a, hosts: [h]" + keys(500) + "}\n" + repeat(500, "  - *t")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse("t.yaml", []byte(tc.src))
			if err == nil || !strings.Contains(err.Error(), "aliases expand to more than 200000 keys and values") {
				t.Fatalf("want the alias bound to trip, got %.300v", err)
			}
		})
	}
}

// tenantsPolicy is a policy with n ingress tenant overrides and no alias,
// the shape of a large generated file.
func tenantsPolicy(n int) []byte {
	var b strings.Builder
	b.WriteString("version: 1\ningress:\n  listen: ':1'\n  worker: 'http://w'\n  tenant: {rate: 100, window: 1}\n  tenants:\n")
	for i := range n {
		fmt.Fprintf(&b, "    t%d: { rate: 500, window: 1 }\n", i)
	}
	return []byte(b.String())
}

// The largest file of tenant overrides, at the size limit, parses: its
// 165,000 nodes are under maxNodes, and the alias bound does not count
// what a file writes out.
func TestLargestTenantFile(t *testing.T) {
	n := 0
	for len(tenantsPolicy(n+1000)) <= maxFileSize {
		n += 1000
	}
	p, err := Parse("t.yaml", tenantsPolicy(n))
	if err != nil {
		t.Fatalf("%.300v", err)
	}
	if got := len(p.Ingress.Tenants); got != n {
		t.Fatalf("%d tenants decoded, want %d", got, n)
	}
}

// A file is at most 1 MiB, which Load and Parse check before parsing.
func TestFileSizeBound(t *testing.T) {
	// Long comment lines, a few bytes past the limit: many bytes, few
	// YAML values.
	line := "# " + strings.Repeat("x", 61) + "\n"
	big := []byte("version: 1\n" + strings.Repeat(line, maxFileSize/len(line)))
	path := filepath.Join(t.TempDir(), "big.yaml")
	if err := os.WriteFile(path, big, 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := Load(path)
	want := fmt.Sprintf("%s:1:1: the file is over 1048576 bytes (1 MiB), the most a policy file may hold", path)
	if err == nil || err.Error() != want {
		t.Fatalf("Load(%d bytes) = %v\nwant %s", len(big), err, want)
	}
	if _, err := Parse("t.yaml", big[:maxFileSize]); err != nil {
		t.Fatalf("Parse(%d bytes) = %.200v; want the largest file accepted", maxFileSize, err)
	}
}

func TestLoad(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "p.yaml")
	if err := os.WriteFile(path, []byte("version: 1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	p, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if p.Source != path || len(p.Hash) != 64 || p.LoadedAt.IsZero() {
		t.Errorf("Source %q Hash %q LoadedAt %v", p.Source, p.Hash, p.LoadedAt)
	}

	missing := filepath.Join(dir, "nope.yaml")
	_, err = Load(missing)
	if err == nil || !strings.Contains(err.Error(), missing) || !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Load(missing) = %v; want an error naming the path and wrapping ErrNotExist", err)
	}
	if strings.Count(err.Error(), missing) != 1 {
		t.Errorf("path named more than once: %v", err)
	}

	if err := os.WriteFile(path, []byte("version: 1\nbogus: 1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = Load(path)
	if err == nil || !strings.HasPrefix(err.Error(), path+":2:1: ") {
		t.Errorf("Load(invalid) = %v; want positions naming the file", err)
	}
}

func TestIndexesAndPositions(t *testing.T) {
	src := `version: 1
targets:
  - {name: a, hosts: [a.com], pools: [p2]}
  - {name: b, grpc_service: b.v1.B}
pools:
  p1: {concurrency: 1}
  p2: {concurrency: 2}
bridges:
  - {name: db, listen: ':1', upstream: 'db:5432'}
`
	p, err := Parse("t.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	if got := []string{p.Pools[0].Name, p.Pools[1].Name}; got[0] != "p1" || got[1] != "p2" {
		t.Errorf("pools not in file order: %v", got)
	}
	if pl, ok := p.PoolByName("p2"); !ok || pl.Concurrency != 2 || pl.Pos.Line != 7 || pl.Pos.Column != 3 {
		t.Errorf("PoolByName(p2) = %+v, %v", pl, ok)
	}
	if _, ok := p.PoolByName("nope"); ok {
		t.Error("PoolByName(nope) found something")
	}
	if tg, ok := p.TargetByName("b"); !ok || tg.GRPCService != "b.v1.B" || tg.Pos.Line != 4 || tg.Pos.Column != 5 {
		t.Errorf("TargetByName(b) = %+v, %v", tg, ok)
	}
	if b := p.Bridges[0]; b.Pos.Line != 9 || b.Pos.File != "t.yaml" {
		t.Errorf("bridge Pos = %+v", b.Pos)
	}
}

func TestDefinitionNameAndPos(t *testing.T) {
	src := `version: 1
ingress: {listen: ':1', worker: 'http://w'}
scheduler:
  definitions:
    sync:
      key: ${input.tenant.id}-${header.x-region}
`
	p, err := Parse("t.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	d := p.Scheduler.Definitions["sync"]
	if d.Name != "sync" || d.Pos.Line != 5 || d.Pos.Column != 5 {
		t.Errorf("definition = %+v", d)
	}
}

func TestStringFieldsTakeNumbers(t *testing.T) {
	src := `version: 1
rls:
  listen: ':1'
  domains:
    edge:
      - {key: status, value: 200, rate: 5, window: 1}
`
	p, err := Parse("t.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	if v := p.RLS.Domains["edge"][0].Value; v != "200" {
		t.Errorf("value = %q, want \"200\"", v)
	}
}

// TestSignedPriority: priority is the one integer that may be negative
// (below the default 0), as a run's own priority may be.
func TestSignedPriority(t *testing.T) {
	for _, prio := range []int{-2147483648, -3, 0, 7, 2147483647} {
		src := fmt.Sprintf("version: 1\ningress: {listen: ':1', worker: 'http://w'}\nscheduler:\n  definitions:\n    d: {priority: %d}\n", prio)
		p, err := Parse("t.yaml", []byte(src))
		if err != nil {
			t.Fatalf("priority %d: %v", prio, err)
		}
		if got := p.Scheduler.Definitions["d"].Priority; got != prio {
			t.Fatalf("priority %d decoded as %d", prio, got)
		}
	}
}
