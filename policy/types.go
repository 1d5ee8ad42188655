// Package policy holds warden's version-1 policy: its schema, the strict
// decoder that reports every mistake as FILE:LINE:COL, the defaults, and the
// holder that swaps a reloaded policy in atomically.
//
// A *Policy returned by Load or Parse is immutable: nothing in warden writes
// to it after loading, so it may be shared between goroutines freely.
//
// The `yaml` tags name the keys; the `check` tags state single-value rules
// the decoder enforces (see checks.go). Key-by-key reference: REFERENCE.md.
package policy

import "time"

// Position is where a value sits in its policy file (1-based line and column).
type Position struct {
	File   string
	Line   int
	Column int
}

// Window is a fixed-window size in seconds: 1, 60, 3600 or 86400.
type Window int

// The only window sizes warden accepts.
const (
	WindowSecond Window = 1
	WindowMinute Window = 60
	WindowHour   Window = 3600
	WindowDay    Window = 86400
)

// Policy is a whole decoded, validated policy file with defaults filled in.
// A nil section pointer means the section is absent and that part of warden
// is off. Every Target holds its effective settings (egress.defaults and
// the built-ins merged in; CircuitBreaker and Retry never nil), and every
// Definition's Retry is non-nil, so consumers never merge defaults.
type Policy struct {
	Version       int           `yaml:"version" check:"required"`
	ShutdownGrace time.Duration `yaml:"shutdown_grace"`
	Admin         *Admin        `yaml:"admin"`
	Backend       Backend       `yaml:"backend"`
	Ingress       *Ingress      `yaml:"ingress"`
	Egress        *Egress       `yaml:"egress"`
	Targets       []Target      `yaml:"targets"`
	// Pools in file order; PoolByName indexes them.
	Pools     []Pool     `yaml:"pools"`
	Bridges   []Bridge   `yaml:"bridges"`
	Scheduler *Scheduler `yaml:"scheduler"`
	RLS       *RLS       `yaml:"rls"`
	Source    string     `yaml:"-"` // file name the policy came from
	Hash      string     `yaml:"-"` // hex sha256 of the file's bytes
	LoadedAt  time.Time  `yaml:"-"`
	// Warnings are non-fatal findings (cap_key and shared-breaker
	// mismatches, an admin listener open beyond loopback without a token)
	// in file order, at most MaxErrors; MoreWarnings counts the others.
	Warnings     []Issue `yaml:"-"`
	MoreWarnings int     `yaml:"-"`
	poolIndex    map[string]int
	targetIdx    map[string]int
	leaders      []int // breakerLeaders(Targets), built with the indexes
}

// Admin is the admin listener.
type Admin struct {
	Listen   string `yaml:"listen" check:"required,listen"`
	TokenEnv string `yaml:"token_env" check:"env"`
}

// Backend says where shared counters live.
type Backend struct {
	Kind    string `yaml:"kind" check:"oneof=memory|redis"`              // memory (default) | redis
	URL     string `yaml:"url"`                                          // redis only
	OnError string `yaml:"on_error" check:"oneof=fail_open|fail_closed"` // fail_open (default) | fail_closed
}

// Ingress is the listener in front of the worker.
type Ingress struct {
	Listen  string           `yaml:"listen" check:"required,listen"`
	Worker  string           `yaml:"worker" check:"required,url=http|https"`
	Timeout time.Duration    `yaml:"timeout"` // 0: the worker's answer is not bounded
	Tenant  *TenantCap       `yaml:"tenant"`
	Tenants map[string]Limit `yaml:"tenants"`
	// MaxConnections caps the client connections the listener holds; 0
	// (the key absent) means the default derived from the file limit.
	MaxConnections int              `yaml:"max_connections" check:"min=1"`
	Timeouts       ListenerTimeouts `yaml:"timeouts"`
}

// ListenerTimeouts bound what a slow client can hold on a data-plane
// listener.
type ListenerTimeouts struct {
	Header   time.Duration `yaml:"header" check:"positive"`    // a request head must arrive whole within this
	BodyIdle time.Duration `yaml:"body_idle" check:"positive"` // longest gap between reads of a request body
	Idle     time.Duration `yaml:"idle" check:"positive"`      // a keep-alive connection idle this long is closed
}

// Egress is the worker's outbound proxy.
type Egress struct {
	HTTPListen    string           `yaml:"http_listen" check:"listen"`
	GRPCListen    string           `yaml:"grpc_listen" check:"listen"`
	AllowUnlisted bool             `yaml:"allow_unlisted"`
	Tenant        *TenantCap       `yaml:"tenant"`
	Tenants       map[string]Limit `yaml:"tenants"`
	Defaults      TargetDefaults   `yaml:"defaults"`
	// MaxConnections and Timeouts apply to each egress listener (HTTP and
	// gRPC) on its own; MaxConnections 0 means derived from the file limit.
	MaxConnections int              `yaml:"max_connections" check:"min=1"`
	Timeouts       ListenerTimeouts `yaml:"timeouts"`
}

// TenantCap is the default per-tenant fixed-window cap and where the tenant
// comes from.
type TenantCap struct {
	Header string `yaml:"header" check:"header"`
	Rate   int    `yaml:"rate" check:"required"`
	Window Window `yaml:"window" check:"required"`
	// MaxKeys caps the distinct tenants held in memory per window; tenants
	// first seen beyond it share one overflow window (governor/tenant).
	MaxKeys int `yaml:"max_keys" check:"min=1"`
}

// Limit is a rate per fixed window.
type Limit struct {
	Rate   int    `yaml:"rate" check:"required"`
	Window Window `yaml:"window" check:"required"`
}

// TargetDefaults apply to every target that does not set the field itself.
type TargetDefaults struct {
	Timeout        time.Duration   `yaml:"timeout"`
	MaxConnections int             `yaml:"max_connections"`
	IdleTimeout    time.Duration   `yaml:"idle_timeout"`
	CircuitBreaker *CircuitBreaker `yaml:"circuit_breaker"`
	Retry          *Retry          `yaml:"retry"`
}

// Target is an outbound destination with its own controls. Exactly one of
// Hosts or GRPCService selects it.
type Target struct {
	Name           string          `yaml:"name" check:"required,name"`
	Hosts          []string        `yaml:"hosts" check:"host"`
	GRPCService    string          `yaml:"grpc_service" check:"service"`
	Upstream       string          `yaml:"upstream"`
	MaxConnections int             `yaml:"max_connections"`
	IdleTimeout    time.Duration   `yaml:"idle_timeout"`
	Timeout        time.Duration   `yaml:"timeout"`
	CircuitBreaker *CircuitBreaker `yaml:"circuit_breaker"`
	Retry          *Retry          `yaml:"retry"`
	Pools          []string        `yaml:"pools"`
	Pos            Position        `yaml:"-"`
}

// CircuitBreaker settings; see SPEC §4.
type CircuitBreaker struct {
	Enabled         bool          `yaml:"enabled"`
	FailureRatio    float64       `yaml:"failure_ratio" check:"ratio"`
	MinimumRequests int           `yaml:"minimum_requests"`
	Window          time.Duration `yaml:"window" check:"positive"`
	Open            time.Duration `yaml:"open" check:"positive"`
	MaxOpen         time.Duration `yaml:"max_open" check:"positive"`
}

// Retry logic names.
const (
	RetryFixed       = "fixed"
	RetryLinear      = "linear_backoff"
	RetryExponential = "exponential_backoff"
)

// Retry is a retry policy; see SPEC §4.
type Retry struct {
	Count        int           `yaml:"count"`
	Logic        string        `yaml:"logic" check:"oneof=fixed|linear_backoff|exponential_backoff"`
	Delay        time.Duration `yaml:"delay"`
	Scale        float64       `yaml:"scale" check:"positive"`
	MaxDelay     time.Duration `yaml:"max_delay"`
	Jitter       float64       `yaml:"jitter" check:"ratio"`
	Budget       float64       `yaml:"budget" check:"ratio"`
	NonRetryable []string      `yaml:"non_retryable" check:"nonempty"`
}

// Pool is a shared concurrency + fixed-window gate.
type Pool struct {
	Name        string        `yaml:"-"`           // the key under pools:
	Concurrency int           `yaml:"concurrency"` // 0 = no concurrency gate
	Rate        int           `yaml:"rate"`        // 0 = no rate gate
	Window      Window        `yaml:"window"`
	Queue       int           `yaml:"queue"` // 0 = no waiting: refuse at once
	MaxWait     time.Duration `yaml:"max_wait"`
	CapKey      string        `yaml:"cap_key"`
	Pos         Position      `yaml:"-"`
}

// ID is the identity of the counter the pool uses: pools sharing a cap_key
// share "cap:KEY"; otherwise the pool's own name.
func (p Pool) ID() string {
	if p.CapKey != "" {
		return "cap:" + p.CapKey
	}
	return p.Name
}

// Bridge protocols.
const (
	ProtocolPostgres = "postgres"
	ProtocolTCP      = "tcp"
)

// Bridge is a capped, reaped database connection listener.
type Bridge struct {
	Name                     string        `yaml:"name" check:"required,name"`
	Listen                   string        `yaml:"listen" check:"required,listen"`
	Upstream                 string        `yaml:"upstream" check:"required,hostport"`
	Protocol                 string        `yaml:"protocol" check:"oneof=postgres|tcp"`
	MaxConnections           int           `yaml:"max_connections" check:"min=1"`
	WaitTimeout              time.Duration `yaml:"wait_timeout"`
	IdleTimeout              time.Duration `yaml:"idle_timeout"`
	IdleInTransactionTimeout time.Duration `yaml:"idle_in_transaction_timeout"`
	MaxLifetime              time.Duration `yaml:"max_lifetime"`
	Pos                      Position      `yaml:"-"`
}

// Scheduler is the durable run queue in front of the worker.
type Scheduler struct {
	PathPrefix          string                `yaml:"path_prefix" check:"path"`
	RunPath             string                `yaml:"run_path" check:"path"`
	Lanes               int                   `yaml:"lanes" check:"min=1"`
	WorkerMaxConcurrent int                   `yaml:"worker_max_concurrent" check:"min=1"`
	Store               Store                 `yaml:"store"`
	Semaphores          map[string]int        `yaml:"semaphores" check:"min=1"`
	Definitions         map[string]Definition `yaml:"definitions"`
}

// Store says where runs are kept.
type Store struct {
	Kind string `yaml:"kind" check:"oneof=bbolt|memory|postgres"` // bbolt (default) | postgres | memory
	URL  string `yaml:"url"`                                      // postgres only
	// Retention is how long a finished run stays in the store; 0 keeps
	// every run.
	Retention time.Duration `yaml:"retention"`
}

// Definition is a kind of run the worker accepts.
type Definition struct {
	Name                   string        `yaml:"-"`
	Key                    string        `yaml:"key"`
	KeyConcurrency         int           `yaml:"key_concurrency"` // 0 = no key gate
	Pool                   string        `yaml:"pool"`
	Semaphores             []string      `yaml:"semaphores"`
	Priority               int           `yaml:"priority" check:"signed"`
	Retry                  *Retry        `yaml:"retry"`
	ScheduleToStartTimeout time.Duration `yaml:"schedule_to_start_timeout"`
	StartToCloseTimeout    time.Duration `yaml:"start_to_close_timeout"`
	HeartbeatTimeout       time.Duration `yaml:"heartbeat_timeout"`
	Pos                    Position      `yaml:"-"`
}

// RLS is the Envoy RateLimitService v3 listener.
type RLS struct {
	Listen  string                `yaml:"listen" check:"required,listen"`
	Domains map[string][]RLSLimit `yaml:"domains"`
}

// RLSLimit is one descriptor entry of a domain. An entry with Value set
// overrides the Key-only entry for that value.
type RLSLimit struct {
	Key    string   `yaml:"key" check:"required"`
	Value  string   `yaml:"value"`
	Rate   int      `yaml:"rate" check:"required"`
	Window Window   `yaml:"window" check:"required"`
	Pos    Position `yaml:"-"`
}

// PoolByName returns the pool named name.
func (p *Policy) PoolByName(name string) (Pool, bool) {
	i, ok := p.poolIndex[name]
	if !ok {
		return Pool{}, false
	}
	return p.Pools[i], true
}

// TargetByName returns the target named name.
func (p *Policy) TargetByName(name string) (Target, bool) {
	i, ok := p.targetIdx[name]
	if !ok {
		return Target{}, false
	}
	return p.Targets[i], true
}

// BreakerLeaders says, for each target, which target's breaker it uses:
// leaders[i] is the index of the first target, in file order, that sends
// to a host target i sends to (i itself when none does). See
// breakerLeaders. The slice is the policy's own: do not modify it.
func (p *Policy) BreakerLeaders() []int { return p.leaders }
