package main

import (
	"context"
	"fmt"
	"path/filepath"
	"time"
)

const soakPolicy = `ingress: { listen: %s, worker: "http://%s" }
egress: { http_listen: %s }
targets:
  - name: up
    hosts: [up.chaos]
    upstream: "http://%s"
    circuit_breaker: { enabled: true }
bridges:
  - name: db
    listen: %s
    upstream: %s
    protocol: postgres
    max_connections: %d
    wait_timeout: 10s
    idle_timeout: 30s
scheduler:
  lanes: %d
  worker_max_concurrent: 10
  store: { kind: bbolt, retention: 1m }
  definitions:
    job:
      retry: { count: 3, logic: fixed, delay: 200ms }
      start_to_close_timeout: 60s
`

// soakBounds are the largest trends (per minute, least squares over the
// soak after its warm-up) that are not a leak. Pools breathe: a rare burst
// opens one more upstream connection to the worker, and connections idle
// for 90 s close, steps of up to about ten descriptors (and goroutines)
// that swing a ten-minute slope by about 1/min, and a forty-second one by
// up to 15/min. The full run's bounds break at a leak of one descriptor or
// goroutine per 5,000 requests at the soak's load (about 550 requests/s),
// or of 100 bytes per request; the short mode's at one per 1,000 requests,
// or 300 bytes per request.
type soakBounds struct {
	rssMB, fds, goroutines float64
}

var (
	soakFull  = soakBounds{rssMB: 2, fds: 5, goroutines: 10}
	soakShort = soakBounds{rssMB: 8, fds: 20, goroutines: 30}
)

// soak: ingress, egress, runs and a bridge under steady load together for
// the soak's length. Nothing fails, and the trends of warden's memory,
// descriptors and goroutines stay under bounds a leak would break.
func soak(ctx context.Context, s *scenario) error {
	pg, err := s.env.postgres(ctx)
	if err != nil {
		return err
	}
	const lanes, maxConns = 5, 4
	wk, a, err := s.prepare(5 * time.Millisecond)
	if err != nil {
		return err
	}
	admin, ingress, egress, bridge := a.admin, a.ingress, a.egress, a.bridge
	w, err := s.launch(ctx, policyFor(admin, fmt.Sprintf(soakPolicy, ingress, wk.addr, egress, wk.addr, bridge, pg.addr, maxConns, lanes)), admin, 0)
	if err != nil {
		return err
	}
	dur := s.env.soak
	warmup := max(20*time.Second, dur/10)
	bounds := soakFull
	if s.env.short {
		bounds = soakShort
	}
	s.row.load = fmt.Sprintf("%v: 250 req/s ingress + 250 req/s egress, 20 runs/s, 4 pgx sessions via bridge", dur)
	s.row.fault = "none (soak)"

	lctx, stopLoad := context.WithTimeout(ctx, dur)
	defer stopLoad()
	bridges := pollBridges(ctx, w)
	defer bridges.stop()
	in := startTraffic(lctx, trafficConfig{addr: ingress, path: "/soak", conns: 8, rate: 250, warmup: 3 * time.Second})
	out := startTraffic(lctx, trafficConfig{addr: egress, host: "up.chaos", path: "/soak", conns: 8, rate: 250, warmup: 3 * time.Second})
	db := runPGClients(lctx, fmt.Sprintf("postgres://postgres@%s/postgres?sslmode=disable&connect_timeout=5", bridge), maxConns, 20)
	// One connection carries the submits (and one the tracker's reads), so
	// that a burst does not open another mid-soak.
	sub := startRuns(lctx, ingress, "job", 20, 1)
	// Runs are read as they end: the store's one-minute retention purges
	// them soon after.
	runs := trackRuns(ingress, sub)
	follow := repeat(lctx, 5*time.Second, runs.round)
	<-lctx.Done()
	follow.stop()
	sub.wait()
	in.stop()
	out.stop()
	db.wait()
	if ctx.Err() != nil {
		return ctx.Err()
	}
	tr := trend(s.smp.all(), s.row.before.at.Add(warmup))
	if err := writeUsage(filepath.Join(s.env.logDir, "soak-usage.csv"), s.smp.all()); err != nil {
		s.row.note("usage readings: %v", err)
	} else {
		s.row.note("usage readings every %v in chaos-logs/soak-usage.csv", sampleEvery)
	}
	ended := runs.finish(ctx, time.Minute)
	wk.waitIdle(ctx)
	st := wk.stats()
	bridges.stop()
	s.settle()

	s.row.checkRuns(sub, ended, st, lanes, "")
	errs := in.errors() + out.errors() + db.errorCount() + sub.failures()
	s.row.clientErrors = errs
	s.row.lostRequests = in.lost() + out.lost() + sub.lost
	s.row.check("no-client-errors", errs == 0,
		"ingress %s; egress %s; bridge %d errors %s; runs: %d offered, %d not accepted",
		in.summary(), out.summary(), db.errorCount(), firstOf(db.firstErr), sub.offered, sub.failures())
	s.row.check("bridge-live<=max", bridges.samples > 0 && bridges.maxLive <= maxConns, "live at most %d, max_connections %d", bridges.maxLive, maxConns)
	over := tr.n >= 50
	s.row.check("rss-slope", over && tr.rssMB <= bounds.rssMB, "%+.2f MB/min over %d readings after %v of warm-up (bound %v)", tr.rssMB, tr.n, warmup, bounds.rssMB)
	s.row.check("fds-slope", over && tr.fds <= bounds.fds, "%+.2f fds/min (bound %v)", tr.fds, bounds.fds)
	s.row.check("goroutines-slope", over && tr.goroutines <= bounds.goroutines, "%+.2f goroutines/min (bound %v)", tr.goroutines, bounds.goroutines)
	return nil
}
