package pgstore_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/warden-dev/warden/scheduler/store"
	"github.com/warden-dev/warden/scheduler/store/pgstore"
)

var bg = context.Background()

// sec and base are the sweep tests' unit and starting instant (20 s before
// a minute boundary, so a rate window is current).
const (
	sec  = int64(time.Second)
	base = int64(1_700_000_040) * sec
)

func mustClaim(t *testing.T, s *pgstore.Store, req pgstore.ClaimRequest) []store.Run {
	t.Helper()
	res, err := s.Claim(bg, req)
	if err != nil {
		t.Fatal(err)
	}
	return res.Runs
}

func poolCount(t *testing.T, u string, pool string, start int64) int {
	t.Helper()
	conn, err := pgx.Connect(bg, u)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(bg)
	var n int32
	err = conn.QueryRow(bg, "SELECT count FROM warden_pool_windows WHERE pool_id = $1 AND window_start = $2", pool, start).Scan(&n)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		t.Fatal(err)
	}
	return int(n)
}

// The sweep takes back what a dead sidecar held: a STARTING run returns to
// the queue with its rate slot refunded whatever the retry policy; a
// RUNNING one as Decide says; a live sidecar that renews keeps its runs;
// expired permits are freed; retry waits that are due are queued; queued
// runs past schedule_to_start time out.
func TestSweep(t *testing.T) {
	u := schemaURL(t)
	s := open(t, u)
	defer s.Close()
	lease := 2 * time.Second
	pool := pgstore.ClaimPool{Rate: 10, WindowStart: base, WindowEnd: base + 60*sec}
	req := pgstore.ClaimRequest{Owner: "dead", Now: base, Lease: lease, Lanes: 10,
		Defs: map[string]pgstore.ClaimDef{
			"rated": {Pool: "p"},
			"erp":   {Semaphores: []string{"legacy"}},
		},
		Pools: map[string]pgstore.ClaimPool{"p": pool}, Semaphores: map[string]int{"legacy": 2}}

	starting := submitN(t, s, "rated", 1, same("k"))[0]
	runningSeqs := submitN(t, s, "erp", 2, func(i int) string { return fmt.Sprint(i) })
	if got := mustClaim(t, s, req); len(got) != 3 {
		t.Fatalf("dead sidecar claimed %d runs, want 3", len(got))
	}
	// Two runs the dead sidecar's worker accepted: RUNNING, permits leased.
	for _, seq := range runningSeqs {
		r, _ := s.Get(bg, seq)
		r.Status = store.Running
		if err := s.Update(bg, &r, store.Of(store.Starting)); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.LeasePermits(bg, "dead", runningSeqs[1], base+100*sec); err != nil {
		t.Fatal(err)
	}
	// A live sidecar's run, renewed past the sweep.
	live := submitN(t, s, "erp", 1, same("live"))[0]
	req2 := req
	req2.Owner = "live"
	if got := mustClaim(t, s, req2); len(got) != 0 {
		t.Fatalf("semaphore legacy (2 permits, 2 held) let %d runs in", len(got))
	}
	if poolCount(t, u, "p", base) != 1 {
		t.Fatalf("rate slot not counted at claim")
	}
	// A retry wait that is due, and a queued run of a definition with a
	// schedule_to_start of 1 s.
	waiting := &store.Run{Name: "other", Status: store.RetryWait, RetryAt: base + sec, Input: []byte(`{}`)}
	old := &store.Run{Name: "stale", Status: store.Queued, QueuedAt: base - 5*sec, Input: []byte(`{}`)}
	// Scheduled runs: one due by the sweep, one not.
	due := &store.Run{Name: "other", Status: store.Scheduled, RetryAt: base + 2*sec, Input: []byte(`{}`)}
	later := &store.Run{Name: "other", Status: store.Scheduled, RetryAt: base + 9*sec, Input: []byte(`{}`)}
	for _, r := range []*store.Run{waiting, old, due, later} {
		if _, err := s.Submit(bg, r); err != nil {
			t.Fatal(err)
		}
	}

	// Before the lease ends nothing moves.
	res, err := s.Sweep(bg, pgstore.SweepRequest{Now: base + sec/2})
	if err != nil || res.Requeued+res.Ended != 0 {
		t.Fatalf("sweep within the lease: %+v %v", res, err)
	}
	decided := map[uint64]bool{}
	res, err = s.Sweep(bg, pgstore.SweepRequest{
		Now:             base + 3*sec,
		ScheduleToStart: map[string]int64{"stale": sec},
		Decide: func(e pgstore.Expired) pgstore.Decision {
			decided[e.Run.Seq] = true
			if e.Owner != "dead" {
				t.Errorf("expired run %d owned by %q", e.Run.Seq, e.Owner)
			}
			if e.Run.Seq == runningSeqs[0] {
				return pgstore.Decision{Status: store.Queued, Reason: "retried"}
			}
			return pgstore.Decision{Status: store.Failed, Reason: "lease expired"}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	want := pgstore.SweepResult{Requeued: 2, Ended: 1, Refunded: 1, RetriesQueued: 1, ScheduledQueued: 1, TimedOut: 1}
	if res != want {
		t.Fatalf("sweep: %+v, want %+v", res, want)
	}
	if decided[starting] || !decided[runningSeqs[0]] || !decided[runningSeqs[1]] {
		t.Fatalf("Decide called for %v: want only the RUNNING runs", decided)
	}
	if poolCount(t, u, "p", base) != 0 {
		t.Fatalf("the STARTING run's rate slot was not refunded")
	}
	checks := []struct {
		seq     uint64
		status  store.Status
		attempt int32
	}{
		{starting, store.Queued, 1},
		{runningSeqs[0], store.Queued, 1},
		{runningSeqs[1], store.Failed, 1},
		{waiting.Seq, store.Queued, 0},
		{old.Seq, store.TimedOut, 0},
		{live, store.Queued, 0},
		{due.Seq, store.Queued, 0},
		{later.Seq, store.Scheduled, 0},
	}
	if r, _ := s.Get(bg, due.Seq); r.RetryAt != 0 || r.QueuedAt != base+3*sec {
		t.Errorf("due scheduled run: retry_at %d queued_at %d, want 0 and the sweep's time (a new run)", r.RetryAt, r.QueuedAt)
	}
	for _, c := range checks {
		r, _ := s.Get(bg, c.seq)
		if r.Status != c.status || r.Attempt != c.attempt {
			t.Errorf("run %d: %s attempt %d, want %s attempt %d (reason %q)", c.seq, r.Status, r.Attempt, c.status, c.attempt, r.Reason)
		}
	}
	// The dead sidecar's permits are free: the live one gets both erp runs
	// that are queued (its own and the requeued one) and the rated one.
	req2.Now = base + 3*sec
	got := mustClaim(t, s, req2)
	if len(got) != 3 {
		t.Fatalf("after the sweep the live sidecar claimed %d runs, want 3", len(got))
	}
	// Delivered again, they no longer show why the last attempt ended.
	for _, r := range got {
		stored, _ := s.Get(bg, r.Seq)
		if r.Reason != "" || stored.Reason != "" {
			t.Errorf("run %d claimed again: reason %q (stored %q), want none", r.Seq, r.Reason, stored.Reason)
		}
	}
	// A live owner renewing keeps its runs past the first lease.
	if n, err := s.Renew(bg, "live", base+10*sec); err != nil || n != 3 {
		t.Fatalf("Renew: %d %v", n, err)
	}
	if res, err := s.Sweep(bg, pgstore.SweepRequest{Now: base + 6*sec}); err != nil || res.Requeued != 0 {
		t.Fatalf("sweep of renewed runs: %+v %v", res, err)
	}
}

// Restart of owner "a" (its process started again): its STARTING run
// returns to the queue at once with its rate slot refunded and its attempt
// kept (the next claim delivers attempt 2); its RUNNING run stays its own,
// its lease renewed although it had expired, and comes back whole; owner
// "b"'s STARTING run, within its lease, is untouched.
func TestRestart(t *testing.T) {
	u := schemaURL(t)
	s := open(t, u)
	defer s.Close()
	pool := pgstore.ClaimPool{Rate: 10, WindowStart: base, WindowEnd: base + 60*sec}
	req := pgstore.ClaimRequest{Owner: "a", Now: base, Lease: 10 * time.Second, Lanes: 10,
		Defs:       map[string]pgstore.ClaimDef{"rated": {Pool: "p"}, "job": {Semaphores: []string{"erp"}}, "free": {}},
		Pools:      map[string]pgstore.ClaimPool{"p": pool},
		Semaphores: map[string]int{"erp": 1}}
	starting := submitN(t, s, "rated", 1, same("k"))[0]
	running := submitN(t, s, "job", 1, same("k"))[0]
	if got := mustClaim(t, s, req); len(got) != 2 {
		t.Fatalf("a claimed %d runs, want 2", len(got))
	}
	r, _ := s.Get(bg, running)
	r.Status = store.Running
	if err := s.Update(bg, &r, store.Of(store.Starting)); err != nil {
		t.Fatal(err)
	}
	// Its permit's lease (heartbeat_timeout) ends before the restart.
	if err := s.LeasePermits(bg, "a", running, base+sec); err != nil {
		t.Fatal(err)
	}
	other := submitN(t, s, "free", 1, same("b"))[0]
	reqB := req
	reqB.Owner, reqB.Lease = "b", time.Minute
	if got := mustClaim(t, s, reqB); len(got) != 1 {
		t.Fatalf("b claimed %d runs, want 1", len(got))
	}
	if _, _, err := s.Restart(bg, "", base, pgstore.SweepRequest{Now: base}); err == nil {
		t.Fatal("Restart without an owner: no error")
	}

	// Past a's lease (base+10s), within b's.
	now := base + 11*sec
	held, res, err := s.Restart(bg, "a", now+10*sec, pgstore.SweepRequest{Now: now,
		Decide: func(e pgstore.Expired) pgstore.Decision {
			t.Errorf("Decide called for run %d of %s", e.Run.Seq, e.Owner)
			return pgstore.Decision{Status: store.Failed}
		}})
	if err != nil {
		t.Fatal(err)
	}
	if len(held) != 1 || held[0].Seq != running || held[0].Status != store.Running || string(held[0].Input) != `{"i":0}` {
		t.Fatalf("Restart returned %+v, want run %d RUNNING with its input", held, running)
	}
	if want := (pgstore.SweepResult{Requeued: 1, Refunded: 1}); res != want {
		t.Fatalf("Restart: %+v, want %+v", res, want)
	}
	if poolCount(t, u, "p", base) != 0 {
		t.Fatal("the STARTING run's rate slot was not refunded")
	}
	st, _ := s.Get(bg, starting)
	if st.Status != store.Queued || st.Attempt != 1 || !strings.Contains(st.Reason, "sidecar a restarted") {
		t.Fatalf("a's STARTING run after Restart: %s attempt %d reason %q", st.Status, st.Attempt, st.Reason)
	}
	if ot, _ := s.Get(bg, other); ot.Status != store.Starting {
		t.Fatalf("b's run within its lease: %s, want STARTING", ot.Status)
	}
	if held, err := s.PermitsHeld(bg, now); err != nil || held["erp"] != 1 {
		t.Fatalf("permits of erp held after Restart: %v %v, want the RUNNING run's 1", held, err)
	}
	// The renewed lease holds past the old one.
	if res, err := s.Sweep(bg, pgstore.SweepRequest{Now: now + 5*sec}); err != nil || res.Requeued+res.Ended != 0 {
		t.Fatalf("a sweep within the renewed lease: %+v %v", res, err)
	}
	req.Now = now
	got := mustClaim(t, s, req)
	if len(got) != 1 || got[0].Seq != starting || got[0].Attempt != 2 {
		t.Fatalf("claimed after Restart: %+v, want run %d attempt 2", got, starting)
	}
}

// A sidecar whose lease was swept cannot end the attempt another sidecar
// claimed since: Update of an admitted run checks the attempt.
func TestStaleOwnerCannotEndNewAttempt(t *testing.T) {
	s := open(t, schemaURL(t))
	defer s.Close()
	seq := submitN(t, s, "job", 1, same("k"))[0]
	req := pgstore.ClaimRequest{Owner: "a", Now: 1e18, Lease: time.Second, Lanes: 1, Defs: map[string]pgstore.ClaimDef{"job": {}}}
	stale := mustClaim(t, s, req)[0]
	if _, err := s.Sweep(bg, pgstore.SweepRequest{Now: 1e18 + 2e9}); err != nil {
		t.Fatal(err)
	}
	req.Owner, req.Now = "b", 1e18+3e9
	if got := mustClaim(t, s, req); len(got) != 1 || got[0].Seq != seq || got[0].Attempt != 2 {
		t.Fatalf("second claim: %+v", got)
	}
	stale.Status = store.Completed
	if err := s.Update(bg, &stale, store.Of(store.Starting, store.Running)); err != store.ErrConflict {
		t.Fatalf("stale owner's update: %v, want ErrConflict", err)
	}
}

// Three starters migrating one fresh schema at once end with one schema:
// each migration recorded once, the tables usable by all three.
func TestConcurrentMigrations(t *testing.T) {
	u := schemaURL(t)
	var wg sync.WaitGroup
	stores := make([]*pgstore.Store, 3)
	errs := make([]error, 3)
	for i := range stores {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(bg, 20*time.Second)
			defer cancel()
			stores[i], errs[i] = pgstore.Open(ctx, u)
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("starter %d: %v", i, err)
		}
		defer stores[i].Close()
	}
	conn, err := pgx.Connect(bg, u)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(bg)
	var versions, distinct int
	if err := conn.QueryRow(bg, "SELECT count(*), count(DISTINCT version) FROM schema_migrations").Scan(&versions, &distinct); err != nil {
		t.Fatal(err)
	}
	files := pgstore.MigrationCount()
	if versions != files || distinct != files {
		t.Fatalf("schema_migrations has %d rows (%d versions), want %d", versions, distinct, files)
	}
	for i, s := range stores {
		r := &store.Run{Name: "job", Status: store.Queued, Input: []byte(`{}`)}
		if _, err := s.Submit(bg, r); err != nil {
			t.Fatalf("starter %d cannot use the schema: %v", i, err)
		}
	}
	if n, _ := stores[0].Counts(bg); n[store.Queued] != 3 {
		t.Fatalf("one schema should hold the three runs: %v", n)
	}
}

// A submit and a run leaving STARTING/RUNNING wake a listener at once.
func TestListenWakes(t *testing.T) {
	s := open(t, schemaURL(t))
	defer s.Close()
	wakes := make(chan struct{}, 16)
	ctx, cancel := context.WithCancel(bg)
	done := make(chan struct{})
	go func() { defer close(done); s.Listen(ctx, func() { wakes <- struct{}{} }) }()
	defer func() { cancel(); <-done }()
	wait := func(what string) {
		t.Helper()
		select {
		case <-wakes:
		case <-time.After(5 * time.Second):
			t.Fatalf("no wake-up after %s", what)
		}
	}
	wait("LISTEN") // the listener wakes once when it starts listening
	seq := submitN(t, s, "job", 1, same("k"))[0]
	wait("a submit")
	r := mustClaim(t, s, pgstore.ClaimRequest{Owner: "a", Now: 1, Lease: time.Minute, Lanes: 1, Defs: map[string]pgstore.ClaimDef{"job": {}}})[0]
	select {
	case <-wakes:
		t.Fatal("a claim woke the listeners: it frees nothing")
	case <-time.After(100 * time.Millisecond):
	}
	r.Status = store.Completed
	if err := s.Update(bg, &r, store.Of(store.Starting)); err != nil || r.Seq != seq {
		t.Fatal(err)
	}
	wait("a run that completed")
}
