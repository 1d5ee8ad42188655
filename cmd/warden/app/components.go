package app

import (
	"github.com/warden-dev/warden/governor/bridge"
	"github.com/warden-dev/warden/proxy/egress"
	"github.com/warden-dev/warden/proxy/grpcegress"
	"github.com/warden-dev/warden/proxy/ingress"
)

// buildComponents lists, in start order, every component a policy can turn
// on. Each is started by Apply when its section is present, reconfigured on
// reload and stopped when its section disappears; shutdown runs in reverse
// order so listeners stop taking work before what they feed drains.
//
// Optional methods a component may have, found by the admin API:
//
//	Ready() error          // /readyz
//	Bridges() any          // GET /v1/bridges
//	Semaphores() any       // GET /v1/semaphores
//	Queues() any           // GET /v1/queues
//
// The scheduler's run API is served on the ingress listener: give its
// handler to (*ingress.Ingress).Mount with scheduler.path_prefix.
func (a *App) buildComponents() []Component {
	return []Component{
		ingress.New(ingress.Options{Clock: a.clk, Metrics: a.metrics, Log: a.log.With("component", "ingress")}),
		egress.New(egress.Options{Clock: a.clk, Metrics: a.metrics, Log: a.log.With("component", "egress")}),
		grpcegress.New(grpcegress.Options{Clock: a.clk, Metrics: a.metrics, Log: a.log.With("component", "grpc")}),
		bridge.New(bridge.Options{
			Clock: a.clk, Metrics: a.metrics, Log: a.log.With("component", "bridges"),
			// Runs: the scheduler's bridge.RunTracker, once it lands; nil
			// turns run binding off (logged once).
		}),
	}
}
