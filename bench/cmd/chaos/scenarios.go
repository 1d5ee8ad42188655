package main

import "time"

// scenarios is every scenario, in the order they run. Each bound is the
// most it may take (short mode, full run); the soak adds its own length.
var scenarios = []definition{
	{"kill-restart", "kill -9 of warden under run load (lanes 5), restart on the same data dir",
		2 * time.Minute, 4 * time.Minute, killRestart},
	{"redis-fail-open", "Redis outage under tenant-capped traffic, backend.on_error fail_open",
		time.Minute, 2 * time.Minute, redisOutage("fail_open")},
	{"redis-fail-closed", "Redis outage under tenant-capped traffic, backend.on_error fail_closed",
		time.Minute, 2 * time.Minute, redisOutage("fail_closed")},
	{"pg-bridge", "Postgres restart under pgx clients through a bridge",
		2 * time.Minute, 3 * time.Minute, pgBridge},
	{"pg-run-store", "Postgres restart under run load with scheduler.store.kind postgres",
		3 * time.Minute, 4 * time.Minute, pgRunStore},
	{"breaker", "egress upstream death and flapping under a circuit breaker",
		time.Minute, time.Minute, breakerUpstream},
	{"fd-flood", "a connection flood beyond the file limit on ingress and egress, default max_connections",
		2 * time.Minute, 3 * time.Minute, fdFlood(true)},
	{"fd-exhaustion", "the same flood with max_connections above the file limit: warden runs out of descriptors",
		2 * time.Minute, 3 * time.Minute, fdFlood(false)},
	{"slow-clients", "slowloris heads, stalled bodies and idle keep-alives against small listener timeouts",
		time.Minute, 2 * time.Minute, slowClients},
	{"tenant-flood", "hundreds of thousands of distinct tenants through the ingress with a low tenant.max_keys",
		2 * time.Minute, 5 * time.Minute, tenantFlood},
	{"unrequested", "worker and upstream write unrequested responses while two clients alternate",
		time.Minute, 2 * time.Minute, unrequested},
	{"reload-storm", "valid and invalid policy files alternating every 100 ms under load, a huge invalid one among them",
		2 * time.Minute, 4 * time.Minute, reloadStorm},
	{"soak", "ingress + egress + runs + bridge together; slopes of RSS, fds and goroutines",
		2 * time.Minute, 3 * time.Minute, soak},
}
