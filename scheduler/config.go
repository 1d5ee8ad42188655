package scheduler

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
	"reflect"
	"slices"
	"time"

	"github.com/warden-dev/warden/governor"
	"github.com/warden-dev/warden/governor/clock"
	"github.com/warden-dev/warden/governor/control"
	"github.com/warden-dev/warden/governor/metrics"
	"github.com/warden-dev/warden/governor/pool"
	"github.com/warden-dev/warden/governor/retry"
	"github.com/warden-dev/warden/policy"
)

// config is the scheduler's view of one policy, compiled once per reload and
// read without locks (it is immutable once published).
type config struct {
	prefix       string
	runPath      string
	worker       string // ingress.worker, no trailing slash
	tenantHeader string // header naming a run's tenant
	lanes        int
	workerMax    int
	storeKind    string
	storeURL     string        // postgres
	retention    time.Duration // finished runs older than this are purged; 0 keeps them
	defs         map[string]*definition
	order        []*definition // sorted by name, for stable admission scans
	semaphores   map[string]int
}

// definition is one compiled scheduler.definitions entry.
type definition struct {
	name            string
	cfg             policy.Definition
	key             *keyExpr
	pool            *pool.Pool // nil: no pool gate
	poolName        string
	poolCfg         policy.Pool // the pool's settings, for claims from a shared store
	semaphores      []string
	priority        int32
	retry           *retry.Policy // nil: never retried
	scheduleToStart time.Duration
	startToClose    time.Duration
	heartbeat       time.Duration
	waitObs         prometheus.Observer // warden_run_queue_wait_seconds{definition}; nil without metrics

	// skip marks the definition as blocked for the admission pass with this
	// number (its pool or a semaphore is full); guarded by Scheduler.mu.
	skip uint64
}

// defaultTenantHeader names the tenant when the ingress has no tenant cap.
const defaultTenantHeader = "x-tenant-id"

// compile builds the config of c's scheduler section, keeping the retry
// policies (and so their budgets) of definitions whose retry settings did
// not change.
func compile(c *governor.Controls, prev *config, clk clock.Clock, m *metrics.Metrics) (*config, error) {
	p := c.Policy
	s := p.Scheduler
	if p.Ingress == nil {
		return nil, fmt.Errorf("the scheduler needs the ingress section: runs are served on ingress.listen and delivered to ingress.worker")
	}
	cfg := &config{
		prefix:       s.PathPrefix,
		runPath:      s.RunPath,
		worker:       trimSlash(p.Ingress.Worker),
		tenantHeader: defaultTenantHeader,
		lanes:        s.Lanes,
		workerMax:    s.WorkerMaxConcurrent,
		storeKind:    s.Store.Kind,
		storeURL:     s.Store.URL,
		retention:    s.Store.Retention,
		defs:         map[string]*definition{},
		semaphores:   map[string]int{},
	}
	if p.Ingress.Tenant != nil && p.Ingress.Tenant.Header != "" {
		cfg.tenantHeader = p.Ingress.Tenant.Header
	}
	for name, n := range s.Semaphores {
		cfg.semaphores[name] = n
	}
	for name, pd := range s.Definitions {
		key, err := compileKey(pd.Key)
		if err != nil {
			return nil, fmt.Errorf("scheduler.definitions.%s.key: %w", name, err)
		}
		d := &definition{
			name: name, cfg: pd, key: key, poolName: pd.Pool, semaphores: slices.Clone(pd.Semaphores),
			priority: int32(pd.Priority), scheduleToStart: pd.ScheduleToStartTimeout,
			startToClose: pd.StartToCloseTimeout, heartbeat: pd.HeartbeatTimeout,
		}
		if m != nil {
			d.waitObs = m.RunQueueWait.WithLabelValues(name)
		}
		if pd.Pool != "" {
			if d.pool = c.Pools.Get(pd.Pool); d.pool == nil {
				return nil, fmt.Errorf("scheduler.definitions.%s.pool: undefined pool %q", name, pd.Pool)
			}
			d.poolCfg, _ = p.PoolByName(pd.Pool)
		}
		if pd.Retry != nil && pd.Retry.Count > 0 {
			var old *definition
			if prev != nil {
				old = prev.defs[name]
			}
			if old != nil && old.retry != nil && reflect.DeepEqual(old.cfg.Retry, pd.Retry) {
				d.retry = old.retry
			} else {
				d.retry = retry.New(*pd.Retry, retry.WithClock(clk))
			}
		}
		cfg.defs[name] = d
		cfg.order = append(cfg.order, d)
	}
	slices.SortFunc(cfg.order, func(a, b *definition) int {
		switch {
		case a.name < b.name:
			return -1
		case a.name > b.name:
			return 1
		}
		return 0
	})
	return cfg, nil
}

func trimSlash(s string) string {
	for len(s) > 0 && s[len(s)-1] == '/' {
		s = s[:len(s)-1]
	}
	return s
}

// limit is the number of runs that may be admitted at once and the control
// that names it when reached: the smaller of lanes and
// worker_max_concurrent (lanes on a tie).
func (c *config) limit() (int, string) {
	if c.workerMax < c.lanes {
		return c.workerMax, ControlWorker
	}
	return c.lanes, ControlLanes
}

// Control names a waiting or ended run reports (SPEC §4).
const (
	ControlLanes     = string(control.Lanes)
	ControlWorker    = string(control.WorkerConcurrency)
	ControlKey       = string(control.KeyConcurrency)
	ControlSemaphore = string(control.Semaphore)
	ControlTimeout   = string(control.Timeout)
	ControlPoolRate  = string(control.PoolRate)
	ControlPoolConc  = string(control.PoolConcurrency)
	ControlPoolQueue = string(control.PoolQueue)
	ControlUpstream  = string(control.Upstream)
	// ControlDefinition holds runs whose definition is no longer in the
	// policy: they wait, untouched, until it comes back.
	ControlDefinition = string(control.Definition)
)
