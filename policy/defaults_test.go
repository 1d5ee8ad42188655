package policy

import (
	"reflect"
	"testing"
	"time"
)

func mustParse(t *testing.T, src string) *Policy {
	t.Helper()
	p, err := Parse("t.yaml", []byte(src))
	if err != nil {
		t.Fatalf("Parse:\n%v", err)
	}
	return p
}

func TestAbsentSectionsStayNil(t *testing.T) {
	p := mustParse(t, "version: 1\n")
	if p.Admin != nil || p.Ingress != nil || p.Egress != nil || p.Scheduler != nil || p.RLS != nil {
		t.Errorf("absent sections were created: %+v", p)
	}
	if p.Targets != nil || p.Pools != nil || p.Bridges != nil {
		t.Errorf("absent lists were created")
	}
	if p.ShutdownGrace != 20*time.Second {
		t.Errorf("shutdown_grace = %v", p.ShutdownGrace)
	}
	if p.Backend != (Backend{Kind: "memory", OnError: "fail_open"}) {
		t.Errorf("backend = %+v", p.Backend)
	}
	// A section without its optional subsections keeps those nil.
	p = mustParse(t, "version: 1\ningress: {listen: ':1', worker: 'http://w'}\n")
	if p.Ingress.Tenant != nil || p.Ingress.Tenants != nil {
		t.Errorf("ingress tenant cap created: %+v", p.Ingress)
	}
}

func TestExplicitZeroesStay(t *testing.T) {
	p := mustParse(t, `version: 1
shutdown_grace: 0s
egress:
  http_listen: ':1'
  allow_unlisted: false
targets:
  - name: a
    hosts: [a.com]
    max_connections: 0
    idle_timeout: 0s
    retry: {count: 2, jitter: 0, budget: 0}
pools:
  p: {queue: 10, max_wait: 0s}
bridges:
  - {name: db, listen: ':2', upstream: 'db:1', wait_timeout: 0s}
`)
	if p.ShutdownGrace != 0 {
		t.Errorf("shutdown_grace = %v, want 0", p.ShutdownGrace)
	}
	if p.Egress.AllowUnlisted {
		t.Error("allow_unlisted: false became true")
	}
	tg := p.Targets[0]
	if tg.MaxConnections != 0 || tg.IdleTimeout != 0 {
		t.Errorf("max_connections %d idle_timeout %v, want 0, 0", tg.MaxConnections, tg.IdleTimeout)
	}
	if tg.Retry.Jitter != 0 || tg.Retry.Budget != 0 || tg.Retry.Count != 2 {
		t.Errorf("retry = %+v, want jitter 0 budget 0 count 2", *tg.Retry)
	}
	if p.Pools[0].MaxWait != 0 {
		t.Errorf("max_wait = %v", p.Pools[0].MaxWait)
	}
	if p.Bridges[0].WaitTimeout != 0 {
		t.Errorf("wait_timeout = %v", p.Bridges[0].WaitTimeout)
	}
}

func TestTargetDefaults(t *testing.T) {
	p := mustParse(t, `version: 1
targets:
  - {name: a, hosts: [a.com]}
`)
	tg := p.Targets[0]
	if tg.Timeout != 10*time.Second || tg.MaxConnections != 512 || tg.IdleTimeout != 90*time.Second {
		t.Errorf("target = %+v", tg)
	}
	wantB := CircuitBreaker{Enabled: false, FailureRatio: 0.5, MinimumRequests: 10,
		Window: 30 * time.Second, Open: 5 * time.Second, MaxOpen: 60 * time.Second}
	if tg.CircuitBreaker == nil || *tg.CircuitBreaker != wantB {
		t.Errorf("breaker = %+v, want %+v", tg.CircuitBreaker, wantB)
	}
	wantR := Retry{Count: 0, Logic: RetryFixed, Delay: time.Second, Scale: 2, MaxDelay: time.Hour, Jitter: 0.2, Budget: 1}
	if tg.Retry == nil || !reflect.DeepEqual(*tg.Retry, wantR) {
		t.Errorf("retry = %+v, want %+v", tg.Retry, wantR)
	}
}

func TestBreakerInheritsEgressDefaults(t *testing.T) {
	p := mustParse(t, `version: 1
egress:
  http_listen: ':1'
  defaults:
    timeout: 3s
    max_connections: 8
    circuit_breaker: {enabled: true, failure_ratio: 0.2, open: 2s}
    retry: {count: 4, logic: linear_backoff, non_retryable: [declined]}
targets:
  - {name: plain, hosts: [a.com]}
  - name: tuned
    hosts: [b.com]
    timeout: 1s
    circuit_breaker: {minimum_requests: 3}
    retry: {delay: 2h}
`)
	plain, tuned := p.Targets[0], p.Targets[1]
	if plain.Timeout != 3*time.Second || plain.MaxConnections != 8 || plain.IdleTimeout != 90*time.Second {
		t.Errorf("plain target = %+v", plain)
	}
	if *plain.CircuitBreaker != *p.Egress.Defaults.CircuitBreaker {
		t.Errorf("plain breaker %+v != egress.defaults %+v", *plain.CircuitBreaker, *p.Egress.Defaults.CircuitBreaker)
	}
	if plain.CircuitBreaker == p.Egress.Defaults.CircuitBreaker {
		t.Error("targets share the defaults' breaker pointer")
	}
	b := *plain.CircuitBreaker
	if !b.Enabled || b.FailureRatio != 0.2 || b.Open != 2*time.Second || b.MinimumRequests != 10 || b.MaxOpen != 60*time.Second {
		t.Errorf("inherited breaker = %+v", b)
	}
	// Key-by-key: the target's own key wins, the rest still comes from
	// egress.defaults.
	tb := *tuned.CircuitBreaker
	if !tb.Enabled || tb.FailureRatio != 0.2 || tb.MinimumRequests != 3 {
		t.Errorf("tuned breaker = %+v", tb)
	}
	if tuned.Timeout != time.Second {
		t.Errorf("tuned timeout = %v", tuned.Timeout)
	}
	r := *tuned.Retry
	if r.Count != 4 || r.Logic != RetryLinear || r.Delay != 2*time.Hour || r.NonRetryable[0] != "declined" {
		t.Errorf("tuned retry = %+v", r)
	}
	// No level set max_delay, so the built-in 1h cap rises to the delay.
	if r.MaxDelay != 2*time.Hour {
		t.Errorf("max_delay = %v, want 2h", r.MaxDelay)
	}
}

func TestMaxOpenRisesToOpen(t *testing.T) {
	p := mustParse(t, "version: 1\ntargets:\n  - {name: a, hosts: [a], circuit_breaker: {open: 2m}}\n")
	if b := p.Targets[0].CircuitBreaker; b.MaxOpen != 2*time.Minute {
		t.Errorf("max_open = %v, want 2m", b.MaxOpen)
	}
}

func TestSectionDefaults(t *testing.T) {
	p := mustParse(t, `version: 1
admin: {listen: ':9'}
ingress:
  listen: ':1'
  worker: 'http://w'
  tenant: {rate: 1, window: 1}
egress:
  grpc_listen: ':2'
  tenant: {rate: 1, window: 60}
pools:
  q: {concurrency: 1, queue: 5}
  n: {concurrency: 1}
bridges:
  - {name: db, listen: ':3', upstream: 'db:5432'}
scheduler:
  definitions:
    sync: {}
`)
	if p.Admin.TokenEnv != "WARDEN_ADMIN_TOKEN" {
		t.Errorf("token_env = %q", p.Admin.TokenEnv)
	}
	if p.Ingress.Tenant.Header != "x-tenant-id" || p.Egress.Tenant.Header != "x-tenant-id" {
		t.Errorf("tenant headers = %q, %q", p.Ingress.Tenant.Header, p.Egress.Tenant.Header)
	}
	if !p.Egress.AllowUnlisted {
		t.Error("allow_unlisted should default to true")
	}
	if p.Egress.Defaults.Timeout != 10*time.Second {
		t.Errorf("egress.defaults.timeout = %v", p.Egress.Defaults.Timeout)
	}
	q, _ := p.PoolByName("q")
	n, _ := p.PoolByName("n")
	if q.MaxWait != 30*time.Second || n.MaxWait != 0 {
		t.Errorf("max_wait q=%v n=%v, want 30s and 0 (no queue)", q.MaxWait, n.MaxWait)
	}
	b := p.Bridges[0]
	if b.Protocol != ProtocolTCP || b.MaxConnections != 20 || b.WaitTimeout != 30*time.Second ||
		b.IdleTimeout != 0 || b.IdleInTransactionTimeout != 0 || b.MaxLifetime != 0 {
		t.Errorf("bridge = %+v", b)
	}
	s := p.Scheduler
	if s.PathPrefix != "/v1/runs" || s.RunPath != "/run" || s.Lanes != 5 || s.WorkerMaxConcurrent != 10 || s.Store.Kind != "bbolt" {
		t.Errorf("scheduler = %+v", s)
	}
	r := s.Definitions["sync"].Retry
	if r == nil || r.Count != 0 || r.Logic != RetryFixed || r.Jitter != 0.2 {
		t.Errorf("definition retry = %+v", r)
	}
}
