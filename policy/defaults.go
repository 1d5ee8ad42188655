package policy

import (
	"reflect"
	"time"
)

// This file is the one place where defaults are decided. Every default is
// listed here with the reason for it; REFERENCE.md repeats them for
// operators. Defaults apply only to keys the file did not write: an explicit
// zero (jitter: 0, allow_unlisted: false, max_connections: 0) is kept.
//
// Absent sections stay nil: no admin, ingress, egress, scheduler or rls
// section means that part of warden is off, and defaults never create one.
//
// After loading, consumers never merge anything themselves: every Target
// holds its effective Timeout, MaxConnections, IdleTimeout, CircuitBreaker
// and Retry (the latter two always non-nil), and every Definition's Retry is
// non-nil.
const (
	// SIGTERM drain budget: long enough for typical in-flight API calls,
	// short enough for Kubernetes' default 30s terminationGracePeriod.
	defaultShutdownGrace = 20 * time.Second
	// The env var holding the admin bearer token (SPEC §8).
	defaultTokenEnv = "WARDEN_ADMIN_TOKEN"
	// Embedded counters: warden run works on a fresh machine (SPEC §2).
	defaultBackendKind = "memory"
	// An outage of the shared backend must not take traffic down (SPEC §9).
	defaultOnError = "fail_open"
	// The tenant header SPEC §4 and §6 use throughout.
	defaultTenantHeader = "x-tenant-id"
	// Distinct tenants per window a cap keeps apart: the 100,000 tenants
	// make bench-limits measures, some 10 MB of window entries.
	defaultTenantMaxKeys = 100_000

	// Slow clients on the data-plane listeners: nginx's
	// client_header_timeout and client_body_timeout (60 s each, the body's
	// between two reads), and Go's http.Transport idle timeout.
	defaultHeaderTimeout   = 60 * time.Second
	defaultBodyIdleTimeout = 60 * time.Second
	defaultListenerIdle    = 90 * time.Second

	// Egress targets, unless egress.defaults or the target says otherwise.
	defaultTargetTimeout = 10 * time.Second // whole exchange, SPEC §5
	// Roughly Envoy's "unlimited for practical purposes" while still
	// bounding file descriptors per target.
	defaultMaxConnections = 512
	// Go's http.Transport IdleConnTimeout.
	defaultIdleTimeout = 90 * time.Second

	// Pools: how long a queued request may wait for room when queue > 0.
	defaultMaxWait = 30 * time.Second

	// Bridges: a plain TCP governor unless told to speak postgres; 20 is
	// PgBouncer's default_pool_size; 30s matches the pool max_wait default.
	defaultBridgeProtocol    = ProtocolTCP
	defaultBridgeConnections = 20
	defaultBridgeWait        = 30 * time.Second

	// Scheduler: the paths and caps of SPEC §3's example.
	defaultPathPrefix          = "/v1/runs"
	defaultRunPath             = "/run"
	defaultLanes               = 5
	defaultWorkerMaxConcurrent = 10
	// Durable without an external service (SPEC §2).
	defaultStoreKind = "bbolt"
)

// builtinBreaker is the circuit breaker of SPEC §4. It is off unless
// enabled: true, so a target with no breaker settings has none in effect.
func builtinBreaker() CircuitBreaker {
	return CircuitBreaker{
		Enabled:         false,
		FailureRatio:    0.5,
		MinimumRequests: 10,
		Window:          30 * time.Second,
		Open:            5 * time.Second,
		MaxOpen:         60 * time.Second, // raised to Open when Open is larger and max_open unset
	}
}

// builtinRetry is the retry policy for keys nobody set. Count 0 means no
// retries, so a target or definition without a retry section is not
// retried. logic fixed because it is the only logic that means what it says
// with delay alone; jitter 0.2 per SPEC §4; budget 1 disables the retry
// budget, which an operator opts into by lowering it.
func builtinRetry() Retry {
	return Retry{
		Count:    0,
		Logic:    RetryFixed,
		Delay:    time.Second,
		Scale:    2,
		MaxDelay: time.Hour, // raised to Delay when Delay is larger and max_delay unset
		Jitter:   0.2,
		Budget:   1,
	}
}

// applyDefaults fills every key the file left out, in a policy that
// validated: what the defaults give is checked before (validateEffective),
// without filling in a policy that will not be returned.
func applyDefaults(p *Policy, d *decoder) {
	def(d, "shutdown_grace", &p.ShutdownGrace, defaultShutdownGrace)
	if p.Admin != nil {
		def(d, "admin.token_env", &p.Admin.TokenEnv, defaultTokenEnv)
	}
	def(d, "backend.kind", &p.Backend.Kind, defaultBackendKind)
	def(d, "backend.on_error", &p.Backend.OnError, defaultOnError)

	if in := p.Ingress; in != nil {
		tenantDefaults(d, "ingress.tenant", in.Tenant)
		timeoutDefaults(d, "ingress.timeouts", &in.Timeouts)
	}

	eff := targetDefaults(p, d)
	if e := p.Egress; e != nil {
		// allow_unlisted defaults to true: adding warden in front of a
		// worker must not cut it off from hosts nobody has listed yet.
		def(d, "egress.allow_unlisted", &e.AllowUnlisted, true)
		tenantDefaults(d, "egress.tenant", e.Tenant)
		timeoutDefaults(d, "egress.timeouts", &e.Timeouts)
		e.Defaults = eff
	}
	for i := range p.Targets {
		targetDefaultsFor(d, &p.Targets[i], d.item("targets", i), eff)
	}

	for i := range p.Pools {
		pl := &p.Pools[i]
		if pl.Queue > 0 {
			def(d, child("pools", pl.Name)+".max_wait", &pl.MaxWait, defaultMaxWait)
		}
	}

	for i := range p.Bridges {
		b, bp := &p.Bridges[i], d.item("bridges", i)
		def(d, bp+".protocol", &b.Protocol, defaultBridgeProtocol)
		def(d, bp+".max_connections", &b.MaxConnections, defaultBridgeConnections)
		def(d, bp+".wait_timeout", &b.WaitTimeout, defaultBridgeWait)
		// idle_timeout, idle_in_transaction_timeout and max_lifetime stay 0:
		// off. Reaping live connections is something to opt into.
	}

	if s := p.Scheduler; s != nil {
		def(d, "scheduler.path_prefix", &s.PathPrefix, defaultPathPrefix)
		def(d, "scheduler.run_path", &s.RunPath, defaultRunPath)
		def(d, "scheduler.lanes", &s.Lanes, defaultLanes)
		def(d, "scheduler.worker_max_concurrent", &s.WorkerMaxConcurrent, defaultWorkerMaxConcurrent)
		def(d, "scheduler.store.kind", &s.Store.Kind, defaultStoreKind)
		for name, dfn := range s.Definitions {
			r := definitionRetry(d, name, dfn)
			dfn.Retry = &r
			s.Definitions[name] = dfn
		}
	}
}

func tenantDefaults(d *decoder, path string, c *TenantCap) {
	if c == nil {
		return
	}
	def(d, path+".header", &c.Header, defaultTenantHeader)
	def(d, path+".max_keys", &c.MaxKeys, defaultTenantMaxKeys)
}

func timeoutDefaults(d *decoder, path string, t *ListenerTimeouts) {
	def(d, path+".header", &t.Header, defaultHeaderTimeout)
	def(d, path+".body_idle", &t.BodyIdle, defaultBodyIdleTimeout)
	def(d, path+".idle", &t.Idle, defaultListenerIdle)
}

// targetDefaults is egress.defaults with the built-ins filled in: what a
// target that sets nothing itself gets. It exists even without an egress
// section, since targets can be configured for other consumers.
func targetDefaults(p *Policy, d *decoder) TargetDefaults {
	const dp = "egress.defaults"
	eff := TargetDefaults{
		Timeout:        defaultTargetTimeout,
		MaxConnections: defaultMaxConnections,
		IdleTimeout:    defaultIdleTimeout,
	}
	var own TargetDefaults
	if p.Egress != nil {
		own = p.Egress.Defaults
	}
	if d.has(dp + ".timeout") {
		eff.Timeout = own.Timeout
	}
	if d.has(dp + ".max_connections") {
		eff.MaxConnections = own.MaxConnections
	}
	if d.has(dp + ".idle_timeout") {
		eff.IdleTimeout = own.IdleTimeout
	}
	b := overlay(d, builtinBreaker(), own.CircuitBreaker, dp, ".circuit_breaker")
	raiseMaxOpen(d, &b, dp, ".circuit_breaker", "")
	eff.CircuitBreaker = &b
	r := overlay(d, builtinRetry(), own.Retry, dp, ".retry")
	raiseMaxDelay(d, &r, dp, ".retry", "")
	eff.Retry = &r
	return eff
}

// targetDefaultsFor merges key by key: a key the target writes wins over
// the same key in egress.defaults, which wins over the built-in. So
// `circuit_breaker: {failure_ratio: 0.3}` on a target keeps enabled: true
// from egress.defaults.
func targetDefaultsFor(d *decoder, t *Target, tp string, eff TargetDefaults) {
	def(d, tp+".timeout", &t.Timeout, eff.Timeout)
	def(d, tp+".max_connections", &t.MaxConnections, eff.MaxConnections)
	def(d, tp+".idle_timeout", &t.IdleTimeout, eff.IdleTimeout)
	b, r := targetEffective(d, t, tp, eff)
	if r.NonRetryable != nil {
		r.NonRetryable = append([]string(nil), r.NonRetryable...) // no aliasing between targets
	}
	t.CircuitBreaker, t.Retry = &b, &r
}

// targetEffective is the breaker and retry policy target t at path tp
// gets, given the effective egress defaults eff.
func targetEffective(d *decoder, t *Target, tp string, eff TargetDefaults) (CircuitBreaker, Retry) {
	b := overlay(d, *eff.CircuitBreaker, t.CircuitBreaker, tp, ".circuit_breaker")
	raiseMaxOpen(d, &b, tp, ".circuit_breaker", "egress.defaults.circuit_breaker")
	r := overlay(d, *eff.Retry, t.Retry, tp, ".retry")
	raiseMaxDelay(d, &r, tp, ".retry", "egress.defaults.retry")
	return b, r
}

// definitionRetry is the retry policy of the run definition name.
// Scheduler retries are the run's own business; they do not inherit
// egress.defaults.retry.
func definitionRetry(d *decoder, name string, dfn Definition) Retry {
	rp := child(child("scheduler.definitions", name), "retry")
	r := overlay(d, builtinRetry(), dfn.Retry, rp, "")
	raiseMaxDelay(d, &r, rp, "", "")
	return r
}

// def sets *dst to v unless the file wrote a value at path.
func def[T any](d *decoder, path string, dst *T, v T) {
	if !d.has(path) {
		*dst = v
	}
}

// overlay returns base with each key the file wrote under prefix+suffix
// taken from own. own may be nil (the file wrote no such section).
func overlay[T any](d *decoder, base T, own *T, prefix, suffix string) T {
	if own == nil {
		return base
	}
	out := base
	ov, src := reflect.ValueOf(&out).Elem(), reflect.ValueOf(own).Elem()
	for i := 0; i < ov.NumField(); i++ {
		if name := yamlName(ov.Type().Field(i)); name != "" && d.written(prefix, suffix, ".", name) {
			ov.Field(i).Set(src.Field(i))
		}
	}
	return out
}

// raiseMaxDelay keeps the built-in max_delay (1h) from undercutting a longer
// delay: when neither the retry section at prefix+suffix nor the one at
// inherited ("" for none) wrote max_delay, it is at least delay.
func raiseMaxDelay(d *decoder, r *Retry, prefix, suffix, inherited string) {
	if d.written(prefix, suffix, ".max_delay") || inherited != "" && d.written(inherited, ".max_delay") {
		return
	}
	r.MaxDelay = max(builtinRetry().MaxDelay, r.Delay)
}

// raiseMaxOpen is raiseMaxDelay for the breaker's open/max_open pair.
func raiseMaxOpen(d *decoder, b *CircuitBreaker, prefix, suffix, inherited string) {
	if d.written(prefix, suffix, ".max_open") || inherited != "" && d.written(inherited, ".max_open") {
		return
	}
	b.MaxOpen = max(builtinBreaker().MaxOpen, b.Open)
}
