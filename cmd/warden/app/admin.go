package app

import (
	"errors"
	"net/http"
	"strings"
	"time"

	"github.com/warden-dev/warden/governor/breaker"
	"github.com/warden-dev/warden/governor/pool"
	"github.com/warden-dev/warden/governor/tenant"
	"github.com/warden-dev/warden/policy"
	"github.com/warden-dev/warden/proxy/admin"
	"github.com/warden-dev/warden/proxy/listener"
)

// newAdminSlot builds the admin API and its listener's slot, empty until
// applyAdmin.
func (a *App) newAdminSlot() *listener.Slot {
	a.adminAPI = admin.New(admin.Config{Metrics: a.metrics, Sources: a.adminSources(), Log: a.log})
	// Not a data-plane listener: its connections are not in the listener
	// metrics (Metrics nil).
	lc := listener.Config{Name: "admin", Clock: a.clk, Log: a.log}
	return listener.NewSlot("admin listener", a.clk, a.log, func(addr string, lim listener.Limits) (listener.Server, error) {
		return listener.StartHTTP(addr, &http.Server{Handler: a.adminAPI, ReadHeaderTimeout: 10 * time.Second}, lim, lc)
	})
}

// applyAdmin starts, moves or stops the admin listener to match p, and
// reads the bearer token from the variable admin.token_env names. A moved
// address is bound before the old listener stops, so a taken one leaves
// the admin API where it was, with its token, and the error says why. The
// listener it replaces, or stops when the admin section is gone, drains in
// the background: it may be serving the POST /v1/policy/reload that got
// here.
func (a *App) applyAdmin(p *policy.Policy) error {
	if p.Admin == nil {
		a.adminSlot.Retire()
		return nil
	}
	// No cap, and net/http's own header timeout: the admin API is not
	// open to the clients the data-plane limits are for.
	return a.adminSlot.Bind(p.Admin.Listen, listener.Limits{}, func() error {
		a.adminAPI.SetTokenEnv(p.Admin.TokenEnv)
		return nil
	})
}

func (a *App) adminSources() admin.Sources {
	return admin.Sources{
		Ready:    a.ready,
		Degraded: a.degraded,
		Policy: func() admin.PolicyStatus {
			p := a.holder.Load()
			a.statusMu.Lock()
			st := admin.PolicyStatus{
				Source: p.Source, Hash: p.Hash, LoadedAt: p.LoadedAt.UTC().Format(time.RFC3339Nano),
				LastReloadError: a.lastErr, ApplyError: a.applyErr, Warnings: p.WarningLines(),
			}
			if !a.lastReloadAt.IsZero() {
				st.LastReloadAt = a.lastReloadAt.UTC().Format(time.RFC3339Nano)
			}
			a.statusMu.Unlock()
			return st
		},
		Reload: a.Reload,
		Pools: func() []pool.Snapshot {
			return a.gov.Current().Pools.Snapshots(a.clk.Now())
		},
		ResetPool: func(id string) bool {
			p := a.gov.Current().Pools.ByID(id)
			if p == nil {
				return false
			}
			p.Reset()
			return true
		},
		ResetPools: func() { a.gov.Current().Pools.ResetAll() },
		Breakers:   func() []breaker.Snapshot { return a.gov.Current().BreakerSnapshots() },
		Tenants: func(limit int, after *tenant.Cursor) ([]tenant.Usage, *tenant.Cursor) {
			return a.gov.Current().Tenants(limit, after, a.clk.Now())
		},
		Tenant:     func(name string) []tenant.Usage { return a.gov.Current().Tenant(name, a.clk.Now()) },
		Bridges:    a.bridges.Bridges,
		Semaphores: a.sched.Semaphores,
		Queues:     a.sched.Queues,
	}
}

// ready reports whether every started component can serve. Once the
// drain has begun the answer is no, at once: load balancers must stop
// sending work now, and a component busy draining is not asked.
func (a *App) ready() error {
	if a.draining.Load() {
		return errShuttingDown
	}
	// The admin listener comes up first, so a probe can reach it while
	// the data-plane listeners are still binding (or the run store still
	// opening): ready only once they all are.
	select {
	case <-a.started:
	default:
		return errStarting
	}
	// Every component that cannot serve is named, not just the first: a
	// file-descriptor flood stops the ingress and the egress together.
	var down []string
	for _, comp := range a.components {
		if r, ok := comp.(interface{ Ready() error }); ok {
			if err := r.Ready(); err != nil {
				down = append(down, comp.Name()+": "+err.Error())
			}
		}
	}
	if len(down) > 0 {
		return errors.New(strings.Join(down, "; "))
	}
	return nil
}

// degraded lists components serving in a degraded mode.
func (a *App) degraded() []string {
	var out []string
	for _, comp := range a.components {
		if d, ok := comp.(interface{ Degraded() error }); ok {
			if err := d.Degraded(); err != nil {
				out = append(out, comp.Name()+": "+err.Error())
			}
		}
	}
	return out
}
