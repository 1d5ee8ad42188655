// Package metrics declares every warden_ metric of SPEC §8 in one place so
// names and labels stay consistent across listeners. Each process builds one
// Metrics on its own registry; nothing here is global.
package metrics

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// Metrics holds the collectors shared by every warden component.
type Metrics struct {
	Registry *prometheus.Registry

	hooksMu sync.Mutex
	hooks   map[int]func()
	hookSeq int

	Requests        *prometheus.CounterVec   // listener, target, code
	RequestDuration *prometheus.HistogramVec // listener, target
	Rejections      *prometheus.CounterVec   // control, scope
	BreakerState    *prometheus.GaugeVec     // target: 0 closed, 1 half-open, 2 open
	PoolWindowCount *prometheus.GaugeVec     // pool
	PoolInFlight    *prometheus.GaugeVec     // pool
	PoolQueued      *prometheus.GaugeVec     // pool
	Retries         *prometheus.CounterVec   // target

	Runs              *prometheus.GaugeVec     // status
	RunQueueWait      *prometheus.HistogramVec // definition
	RunsPurged        *prometheus.CounterVec   // status
	BridgeConnections *prometheus.GaugeVec     // bridge, state
	BridgeWaiting     *prometheus.GaugeVec     // bridge
	BridgeWait        *prometheus.HistogramVec // bridge
	BridgeReaped      *prometheus.CounterVec   // bridge, reason

	PolicyReloads      prometheus.Counter
	PolicyReloadErrors prometheus.Counter
	PolicyInfo         *prometheus.GaugeVec // hash

	BackendDegraded prometheus.Gauge
	BackendLatency  *prometheus.HistogramVec // op
	BackendErrors   *prometheus.CounterVec   // op

	// Hostile load on the data-plane listeners (SPEC §12).
	ListenerConnections  *prometheus.GaugeVec   // listener: client connections held
	ListenerRefused      *prometheus.CounterVec // listener: closed at accept, over max_connections
	ListenerAcceptErrors *prometheus.CounterVec // listener: temporary accept errors retried
	ListenerRestarts     *prometheus.CounterVec // listener: accept loops restarted after ending unexpectedly
	ListenerTimeouts     *prometheus.CounterVec // listener, reason (header, body_idle, idle)
	TenantOverflow       *prometheus.CounterVec // listener (ingress, egress, rls): requests counted in an overflow window
	UnrequestedBytes     *prometheus.CounterVec // listener: pooled upstream connections closed holding unread bytes
}

// latencyBuckets span 50µs..10s: proxied requests are fast, upstream
// timeouts are not.
var latencyBuckets = []float64{.00005, .0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10}

// waitBuckets span 1ms..1h: queue waits can be long by design.
var waitBuckets = []float64{.001, .005, .01, .05, .1, .5, 1, 5, 10, 30, 60, 300, 900, 3600}

// New registers every warden metric, plus the Go and process collectors, on a
// fresh registry.
func New() *Metrics {
	r := prometheus.NewRegistry()
	m := &Metrics{Registry: r}
	f := func(c prometheus.Collector) { r.MustRegister(c) }

	m.Requests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "warden_requests_total", Help: "Requests handled, by listener, target and status code.",
	}, []string{"listener", "target", "code"})
	m.RequestDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "warden_request_duration_seconds", Help: "Time from request received to response written.",
		Buckets: latencyBuckets,
	}, []string{"listener", "target"})
	m.Rejections = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "warden_rejections_total", Help: "Requests refused or delayed, by the control that decided and its scope.",
	}, []string{"control", "scope"})
	m.BreakerState = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "warden_breaker_state", Help: "Circuit breaker state: 0 closed, 1 half-open, 2 open.",
	}, []string{"target"})
	m.PoolWindowCount = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "warden_pool_window_count", Help: "Starts counted in the pool's current fixed window.",
	}, []string{"pool"})
	m.PoolInFlight = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "warden_pool_in_flight", Help: "Admissions holding a pool concurrency slot.",
	}, []string{"pool"})
	m.PoolQueued = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "warden_pool_queued", Help: "Callers waiting in the pool's queue.",
	}, []string{"pool"})
	m.Retries = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "warden_retries_total", Help: "Retries attempted, by target.",
	}, []string{"target"})
	m.Runs = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "warden_runs", Help: "Runs known to this sidecar, by status.",
	}, []string{"status"})
	m.RunsPurged = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "warden_runs_purged_total", Help: "Finished runs deleted by scheduler.store.retention, by status.",
	}, []string{"status"})
	m.RunQueueWait = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "warden_run_queue_wait_seconds", Help: "Time from submission to admission.",
		Buckets: waitBuckets,
	}, []string{"definition"})
	m.BridgeConnections = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "warden_bridge_connections", Help: "Upstream bridge connections by state (in_use, idle).",
	}, []string{"bridge", "state"})
	m.BridgeWaiting = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "warden_bridge_waiting", Help: "Clients waiting for a bridge connection slot.",
	}, []string{"bridge"})
	m.BridgeWait = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "warden_bridge_wait_seconds", Help: "Time clients waited for a bridge connection slot.",
		Buckets: waitBuckets,
	}, []string{"bridge"})
	m.BridgeReaped = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "warden_bridge_reaped_total", Help: "Bridge connections reaped, by reason.",
	}, []string{"bridge", "reason"})
	m.PolicyReloads = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "warden_policy_reloads_total", Help: "Policy reloads that put a policy in force, including those some component could not wholly apply.",
	})
	m.PolicyReloadErrors = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "warden_policy_reload_errors_total", Help: "Policy reloads that failed: refused because the file did not load or validate, or put in force with some component keeping its previous settings.",
	})
	m.PolicyInfo = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "warden_policy_info", Help: "1 for the policy currently in force, labelled with its hash.",
	}, []string{"hash"})
	m.BackendDegraded = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "warden_backend_degraded", Help: "1 while the shared backend is unreachable and local windows are in force.",
	})
	m.BackendLatency = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "warden_backend_duration_seconds", Help: "Shared backend call latency, by operation.",
		Buckets: latencyBuckets,
	}, []string{"op"})
	m.BackendErrors = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "warden_backend_errors_total", Help: "Shared backend call errors, by operation.",
	}, []string{"op"})
	m.ListenerConnections = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "warden_listener_connections", Help: "Client connections a data-plane listener holds.",
	}, []string{"listener"})
	m.ListenerRefused = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "warden_listener_refused_total", Help: "Client connections closed as soon as accepted because the listener held max_connections.",
	}, []string{"listener"})
	m.ListenerAcceptErrors = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "warden_listener_accept_errors_total", Help: "Temporary accept errors (out of file descriptors or memory, aborted connections), each retried after a backoff.",
	}, []string{"listener"})
	m.ListenerRestarts = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "warden_listener_restarts_total", Help: "Times a listener's accept loop ended unexpectedly and was started again on the same socket.",
	}, []string{"listener"})
	m.ListenerTimeouts = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "warden_listener_timeouts_total", Help: "Client connections ended by a slow-client timeout, by reason (header, body_idle, idle).",
	}, []string{"listener", "reason"})
	m.TenantOverflow = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "warden_tenant_overflow_total", Help: "Requests counted in a shared overflow window: their tenant (or RLS descriptor value) was first seen in a window already holding its cap (tenant.max_keys; 100000 per RLS entry).",
	}, []string{"listener"})
	m.UnrequestedBytes = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "warden_upstream_unrequested_bytes_total", Help: "Pooled upstream or worker connections closed instead of reused because they held bytes nobody asked for.",
	}, []string{"listener"})

	for _, c := range []prometheus.Collector{
		m.Requests, m.RequestDuration, m.Rejections, m.BreakerState, m.PoolWindowCount,
		m.PoolInFlight, m.PoolQueued, m.Retries, m.Runs, m.RunsPurged, m.RunQueueWait, m.BridgeConnections,
		m.BridgeWaiting, m.BridgeWait, m.BridgeReaped, m.PolicyReloads, m.PolicyReloadErrors,
		m.PolicyInfo, m.BackendDegraded, m.BackendLatency, m.BackendErrors,
		m.ListenerConnections, m.ListenerRefused, m.ListenerAcceptErrors, m.ListenerRestarts,
		m.ListenerTimeouts, m.TenantOverflow, m.UnrequestedBytes,
		prometheus.NewGoCollector(), prometheus.NewProcessCollector(prometheus.ProcessCollectorOpts{}),
	} {
		f(c)
	}
	return m
}

// OnGather registers f to run before every Gather: for gauges that are
// cheaper to compute when scraped than to keep current on a hot path. The
// returned func unregisters it.
func (m *Metrics) OnGather(f func()) (remove func()) {
	m.hooksMu.Lock()
	defer m.hooksMu.Unlock()
	if m.hooks == nil {
		m.hooks = map[int]func(){}
	}
	m.hookSeq++
	id := m.hookSeq
	m.hooks[id] = f
	return func() {
		m.hooksMu.Lock()
		delete(m.hooks, id)
		m.hooksMu.Unlock()
	}
}

// Gather runs the OnGather hooks, then gathers the registry. /metrics
// serves it (Metrics is a prometheus.Gatherer).
func (m *Metrics) Gather() ([]*dto.MetricFamily, error) {
	m.hooksMu.Lock()
	hooks := make([]func(), 0, len(m.hooks))
	for _, f := range m.hooks {
		hooks = append(hooks, f)
	}
	m.hooksMu.Unlock()
	for _, f := range hooks {
		f()
	}
	return m.Registry.Gather()
}
