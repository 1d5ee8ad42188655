package main

import (
	"context"
	"fmt"
	"strings"
	"time"
)

const redisPolicy = `backend: { kind: redis, url: "%s", on_error: %s }
ingress:
  listen: %s
  worker: "http://%s"
  tenant: { header: x-tenant-id, rate: 1000000, window: 1 }
`

// detectWithin is how long warden may take to notice that Redis went away
// (it notices a refused connection at once; this is slack for a loaded
// machine).
const detectWithin = 2 * time.Second

// recoverWithin bounds how long warden may take to use Redis again once it
// is back (its probe runs every 250 ms).
const recoverWithin = 10 * time.Second

// redisOutage: tenant-capped traffic through the ingress with the windows
// in a private Redis, which is killed and started again. fail_open keeps
// every request flowing on local windows with /readyz 200 "degraded";
// fail_closed answers 429 with control upstream and /readyz 503; both
// return to normal once Redis is back.
func redisOutage(onError string) func(ctx context.Context, s *scenario) error {
	return func(ctx context.Context, s *scenario) error {
		red, err := s.startRedis(ctx)
		if err != nil {
			return err
		}
		wk, a, err := s.prepare(0)
		if err != nil {
			return err
		}
		w, err := s.launch(ctx, policyFor(a.admin, fmt.Sprintf(redisPolicy, red.url(), onError, a.ingress, wk.addr)), a.admin, 0)
		if err != nil {
			return err
		}
		const rate = 200.0
		outage := s.pickDur(5*time.Second, 15*time.Second)
		s.row.load = fmt.Sprintf("%.0f req/s via ingress, tenant cap in Redis", rate)
		s.row.fault = fmt.Sprintf("redis-server kill -9 for %v, then started again", outage)

		ready := pollReadyz(ctx, w)
		defer ready.stop()
		tr := startTraffic(ctx, trafficConfig{addr: a.ingress, path: "/", header: map[string]string{"x-tenant-id": "acme"},
			conns: 8, rate: rate, keep: true})
		defer tr.stop()
		if !sleep(ctx, 3*time.Second) {
			return ctx.Err()
		}
		down := time.Now()
		red.kill()
		if !sleep(ctx, outage) {
			return ctx.Err()
		}
		// The outage ends when redis-server is started, not when this
		// process first sees it answer: warden may reach it sooner.
		restart := time.Now()
		if err := red.start(ctx); err != nil {
			return fmt.Errorf("restart redis: %w", err)
		}
		back := time.Now()
		// Wait for the recovery (bounded), then watch normal service.
		waitFor(ctx, recoverWithin, func() bool {
			_, ok := ready.firstAfter(back, healthy)
			return ok
		})
		sleep(ctx, 3*time.Second)
		end := time.Now()
		tr.stop()
		ready.stop()

		during := tr.between(down.Add(detectWithin), restart)
		readyDuring := ready.between(down.Add(detectWithin), restart)
		s.row.clientErrors = tr.errors()
		s.row.lostRequests = tr.lost()
		last := tr.between(end.Add(-2*time.Second), end)
		if onError == "fail_open" {
			degraded := 0
			not200 := 0
			for _, r := range readyDuring {
				if r.code != 200 {
					not200++
				} else if strings.Contains(r.body, "degraded") {
					degraded++
				}
			}
			s.row.check("traffic-flows", tr.errors() == 0 && len(during) > 0,
				"all answers: %s; during the outage: %s", tr.summary(), summarize(classesOf(during), ""))
			s.row.check("readyz-200-degraded", not200 == 0 && degraded > 0,
				"during the outage %d /readyz answers: %d not 200, %d 200 naming degraded", len(readyDuring), not200, degraded)
			r, ok := ready.firstAfter(back, healthy)
			if ok {
				s.row.recovery = r.at.Sub(back)
			}
			dg, err := w.metric(ctx, "warden_backend_degraded")
			s.row.check("recovers", ok && r.at.Sub(back) <= recoverWithin && err == nil && dg == 0,
				"/readyz 200 without degraded %s after Redis was back; warden_backend_degraded %v%s", s.row.recoveryCell(), dg, errNote(err))
		} else {
			up := classesOf(during)["429 upstream"]
			s.row.errorsNote = "429 upstream during the outage"
			other := 0
			for c, n := range tr.classes() {
				if c != "200" && c != "429 upstream" {
					other += n
				}
			}
			s.row.check("429-upstream-during-outage", up > 0 && up == len(during),
				"during the outage (after %v to notice): %s", detectWithin, summarize(classesOf(during), ""))
			s.row.check("no-other-errors", other == 0, "all answers: %s", tr.summary())
			not503 := 0
			for _, r := range readyDuring {
				if r.code != 503 {
					not503++
				}
			}
			s.row.check("readyz-503-during-outage", len(readyDuring) > 0 && not503 == 0,
				"during the outage %d /readyz answers, %d not 503", len(readyDuring), not503)
			first := tr.firstOK(back)
			if !first.IsZero() {
				s.row.recovery = first.Sub(back)
			}
			lastOK := len(last) > 0 && classesOf(last)["200"] == len(last)
			s.row.check("recovers", !first.IsZero() && first.Sub(back) <= recoverWithin && lastOK,
				"first 200 %s after Redis was back; last 2 s: %s", s.row.recoveryCell(), summarize(classesOf(last), ""))
		}
		s.settle()
		return nil
	}
}

// healthy is /readyz 200 with nothing degraded.
func healthy(r readiness) bool { return r.code == 200 && !strings.Contains(r.body, "degraded") }
