package main

import (
	"context"
	"fmt"
	"strings"
	"time"
)

const killPolicy = `ingress: { listen: %s, worker: "http://%s" }
scheduler:
  lanes: %d
  worker_max_concurrent: 10
  store: { kind: bbolt }
  definitions:
    job:
      retry: { count: 10, logic: fixed, delay: 200ms }
      start_to_close_timeout: 60s
`

// killRestart: runs offered at a steady rate to a warden with 5 lanes and
// the bbolt store, killed with -9 mid-load and restarted on the same data
// directory. Every accepted run must end; only runs in flight at a kill
// may be delivered twice; the worker never sees more than lanes at once.
func killRestart(ctx context.Context, s *scenario) error {
	const lanes, rate = 5, 60.0
	kills := s.pick(1, 3)
	loadFor := s.pickDur(8*time.Second, 20*time.Second)
	wk, a, err := s.prepare(30 * time.Millisecond)
	if err != nil {
		return err
	}
	w, err := s.launch(ctx, policyFor(a.admin, fmt.Sprintf(killPolicy, a.ingress, wk.addr, lanes)), a.admin, 0)
	if err != nil {
		return err
	}
	s.row.load = fmt.Sprintf("runs %.0f/s for %v, worker 30 ms each", rate, loadFor)
	s.row.fault = fmt.Sprintf("kill -9 ×%d mid-load, restart on same data dir", kills)

	loadCtx, stopLoad := context.WithTimeout(ctx, loadFor)
	defer stopLoad()
	sub := startRuns(loadCtx, a.ingress, "job", rate, 8)
	var killedAt []time.Time
	var restartErr error
	for range kills {
		if !sleep(loadCtx, loadFor/time.Duration(kills+1)) {
			break
		}
		killedAt = append(killedAt, time.Now())
		w.kill9()
		if restartErr = w.start(ctx); restartErr != nil {
			break
		}
	}
	if restartErr != nil {
		stopLoad()
		sub.wait()
		return fmt.Errorf("restart after kill -9: %w", restartErr)
	}
	sub.wait()
	out := trackRuns(a.ingress, sub).finish(ctx, 90*time.Second)
	wk.waitIdle(ctx)
	st := wk.stats()

	var recovery time.Duration
	for _, k := range killedAt {
		ok := sub.firstOKAfter(k)
		if ok.IsZero() {
			recovery = -1
			break
		}
		recovery = max(recovery, ok.Sub(k))
	}
	if recovery >= 0 {
		s.row.recovery = recovery
	}
	// A run was in flight at a kill if a delivery of it had begun before
	// the kill and had not ended more than a second before it (the worker
	// may have answered just before warden recorded the answer).
	var outside []string
	for _, id := range st.duplicated {
		ds := wk.deliveriesOf(id)
		inFlight := false
		for _, k := range killedAt {
			for _, d := range ds {
				if d.start.Before(k) && d.end.After(k.Add(-time.Second)) {
					inFlight = true
				}
			}
		}
		if !inFlight {
			outside = append(outside, id)
		}
	}
	s.row.checkRuns(sub, out, st, lanes, "submits while warden was down")
	s.row.check("duplicates-only-in-flight", len(st.duplicated) <= lanes*len(killedAt) && len(outside) == 0,
		"%d runs delivered twice (at most %d lanes × %d kills), %d of them not in flight at a kill %s",
		len(st.duplicated), lanes, len(killedAt), len(outside), short(outside))
	s.settle()
	return nil
}

// short lists at most 5 ids.
func short(ids []string) string {
	if len(ids) == 0 {
		return "none"
	}
	if len(ids) > 5 {
		return "[" + strings.Join(ids[:5], " ") + fmt.Sprintf(" … %d more]", len(ids)-5)
	}
	return "[" + strings.Join(ids, " ") + "]"
}
