// Package control owns how warden names and words a refusal (SPEC §4): the
// control names, the x-warden-control header, the rounding of Retry-After
// and the JSON body every listener sends. The packages that decide
// (governor/...) report a Name; the listeners (proxy/...) write it with
// this package's encoder, each in its protocol's framing.
package control

// Name is the name of a control: what refused a request or holds a run.
// It goes out in the x-warden-control header, the body's "control" field,
// the metric label control and a run's control field.
type Name string

// The controls of SPEC §4.
const (
	TenantRate        Name = "tenant_rate"
	CircuitBreaker    Name = "circuit_breaker"
	PoolRate          Name = "pool_rate"
	PoolConcurrency   Name = "pool_concurrency"
	PoolQueue         Name = "pool_queue"
	RetryBudget       Name = "retry_budget"
	Lanes             Name = "lanes"
	WorkerConcurrency Name = "worker_concurrency"
	KeyConcurrency    Name = "key_concurrency"
	Semaphore         Name = "semaphore"
	BridgeConnections Name = "bridge_connections"
	Timeout           Name = "timeout"
	// Upstream is the upstream failing, or a fail_closed shared backend
	// that could not be reached (SPEC §9): the limit was not consulted.
	Upstream Name = "upstream"
)

// Names beyond SPEC §4's list, each named after what it reports.
const (
	// AllowUnlisted refuses hosts no target matches when
	// egress.allow_unlisted is false; it is named after that key.
	AllowUnlisted Name = "allow_unlisted"
	// Definition holds runs whose definition is no longer in the policy:
	// they wait, untouched, until it comes back.
	Definition Name = "definition"
	// Cancelled ended a cancelled run.
	Cancelled Name = "cancelled"
)

// Header is the response header (gRPC: header or trailer) naming the
// control that refused or shaped a response, spelt as SPEC §4 spells it.
const Header = "x-warden-control"
