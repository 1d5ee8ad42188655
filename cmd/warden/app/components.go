package app

import (
	"context"

	"github.com/warden-dev/warden/governor"
	"github.com/warden-dev/warden/proxy/bridge"
	"github.com/warden-dev/warden/proxy/egress"
	"github.com/warden-dev/warden/proxy/grpcegress"
	"github.com/warden-dev/warden/proxy/ingress"
	"github.com/warden-dev/warden/proxy/rls"
	"github.com/warden-dev/warden/scheduler"
)

// buildComponents lists, in start order, every component a policy can turn
// on. Each is started by Apply when its section is present, reconfigured on
// reload and stopped when its section disappears. On shutdown the
// components with listeners (StopAccepting) stop accepting all at once and
// drain together; the others then shut down in reverse order, so nothing
// they serve can still arrive (see App.shutdown).
//
// Optional methods a component may have, found by the app and the admin
// API:
//
//	StopAccepting()        // shutdown: close its listeners at once
//	Ready() error          // /readyz
//	Degraded() error       // /readyz body: serving, but degraded
//
// The scheduler and the bridges are also kept in a.sched and a.bridges:
// the admin API reads their lists (/v1/semaphores, /v1/queues,
// /v1/bridges) through their typed methods.
func (a *App) buildComponents() []Component {
	// The scheduler has no listener: it shuts down after the ingress that
	// serves its runs API has drained, so a submission in flight still
	// finds the store open.
	sched := scheduler.New(scheduler.Options{
		Clock:   a.clk,
		Metrics: a.metrics,
		Log:     a.log.With("component", "scheduler"),
		DataDir: a.opts.DataDir,
		Counter: a.gov.Counter(), // lanes and semaphores shared when it is Redis
	})
	a.sched = sched
	a.bridges = bridge.New(bridge.Options{
		Clock: a.clk, Metrics: a.metrics, Log: a.log.With("component", "bridges"),
		Runs: sched, // application_name=run:<id> binds a session to its run
	})
	ing := ingress.New(ingress.Options{Clock: a.clk, Metrics: a.metrics, Log: a.log.With("component", "ingress")})
	return []Component{
		a.backend, // first: every other component counts in its windows
		rls.New(a.gov.Counter(), a.clk, a.metrics, a.log),
		sched,
		runsMount{ing: ing, sched: sched},
		ing,
		egress.New(egress.Options{Clock: a.clk, Metrics: a.metrics, Log: a.log.With("component", "egress")}),
		grpcegress.New(grpcegress.Options{Clock: a.clk, Metrics: a.metrics, Log: a.log.With("component", "grpc")}),
		a.bridges,
	}
}

// runsMount keeps the scheduler's runs API mounted on the ingress listener
// at scheduler.path_prefix, following reloads that move or remove it. The
// ingress applies the tenant cap before the mounted handler runs, and reads
// bodies up to the scheduler's own limit (scheduler.MaxBody), so the two
// layers refuse the same bodies the same way.
type runsMount struct {
	ing   *ingress.Ingress
	sched *scheduler.Scheduler
}

func (runsMount) Name() string { return "runs-mount" }

func (m runsMount) Apply(_ context.Context, c *governor.Controls) error {
	if c.Policy.Scheduler == nil {
		m.ing.Mount("", nil, 0)
		return nil
	}
	m.ing.Mount(c.Policy.Scheduler.PathPrefix, m.sched.Handler(), scheduler.MaxBody)
	return nil
}

func (runsMount) Shutdown(context.Context) error { return nil }
