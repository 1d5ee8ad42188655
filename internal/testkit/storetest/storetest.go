// Package storetest is the behaviour every scheduler store must have, run
// against each implementation (memory, bbolt, and later Postgres) by its own
// tests.
package storetest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/warden-dev/warden/scheduler/store"
)

// Factory opens stores for the suite. Reopen, when set, closes s and opens
// the same data again: the suite then checks durability.
type Factory struct {
	Open   func(t *testing.T) store.Store
	Reopen func(t *testing.T, s store.Store) store.Store
}

// Run runs the whole suite.
func Run(t *testing.T, f Factory) {
	t.Run("SubmitGet", func(t *testing.T) { submitGet(t, f) })
	t.Run("Idempotency", func(t *testing.T) { idempotency(t, f) })
	t.Run("UpdateConflict", func(t *testing.T) { updateConflict(t, f) })
	t.Run("Start", func(t *testing.T) { start(t, f) })
	t.Run("ListByStatus", func(t *testing.T) { listByStatus(t, f) })
	t.Run("ListByNameAndKey", func(t *testing.T) { listByNameAndKey(t, f) })
	t.Run("UnfinishedAndCounts", func(t *testing.T) { unfinished(t, f) })
	t.Run("ConcurrentSubmits", func(t *testing.T) { concurrent(t, f) })
	t.Run("Purge", func(t *testing.T) { purge(t, f) })
	if f.Reopen != nil {
		t.Run("Durable", func(t *testing.T) { durable(t, f) })
	}
}

var ctx = context.Background()

func newRun(name string, i int) *store.Run {
	return &store.Run{
		Name: name, Status: store.Queued, Priority: int32(i % 3), Key: fmt.Sprintf("k%d", i%4),
		Tenant: "acme", Input: []byte(fmt.Sprintf(`{"i":%d}`, i)), CreatedAt: int64(1000 + i), QueuedAt: int64(1000 + i),
	}
}

func submitGet(t *testing.T, f Factory) {
	s := f.Open(t)
	defer s.Close()
	r := newRun("sync", 1)
	r.IdempotencyKey = ""
	created, err := s.Submit(ctx, r)
	if err != nil || !created || r.Seq == 0 {
		t.Fatalf("Submit: created=%v seq=%d err=%v", created, r.Seq, err)
	}
	got, err := s.Get(ctx, r.Seq)
	if err != nil {
		t.Fatal(err)
	}
	if got.Name != "sync" || got.Status != store.Queued || string(got.Input) != `{"i":1}` || got.Key != "k1" ||
		got.Tenant != "acme" || got.Priority != 1 || got.CreatedAt != 1001 || got.Output != nil {
		t.Fatalf("Get returned %+v", got)
	}
	if _, err := s.Get(ctx, r.Seq+1000); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("Get of an unknown run: %v, want ErrNotFound", err)
	}
	second := newRun("sync", 2)
	if _, err := s.Submit(ctx, second); err != nil || second.Seq <= r.Seq {
		t.Fatalf("second Submit seq %d after %d (err %v): seqs must grow", second.Seq, r.Seq, err)
	}
}

func idempotency(t *testing.T, f Factory) {
	s := f.Open(t)
	defer s.Close()
	a := newRun("sync", 1)
	a.IdempotencyKey = "order-7"
	if created, err := s.Submit(ctx, a); err != nil || !created {
		t.Fatalf("first: %v %v", created, err)
	}
	b := newRun("sync", 2)
	b.IdempotencyKey = "order-7"
	created, err := s.Submit(ctx, b)
	if err != nil || created || b.Seq != a.Seq || string(b.Input) != `{"i":1}` {
		t.Fatalf("same key: created=%v seq=%d (want %d) input=%s err=%v", created, b.Seq, a.Seq, b.Input, err)
	}
	c := newRun("other", 3)
	c.IdempotencyKey = "order-7"
	if created, err := s.Submit(ctx, c); err != nil || !created || c.Seq == a.Seq {
		t.Fatalf("same key, other definition: created=%v err=%v: keys are per definition", created, err)
	}
	// Concurrent submits with one key create one run.
	var wg sync.WaitGroup
	seqs := make([]uint64, 16)
	for i := range seqs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := newRun("sync", 100+i)
			r.IdempotencyKey = "race"
			if _, err := s.Submit(ctx, r); err != nil {
				t.Error(err)
			}
			seqs[i] = r.Seq
		}()
	}
	wg.Wait()
	for _, q := range seqs {
		if q != seqs[0] {
			t.Fatalf("concurrent submits with one key got different runs: %v", seqs)
		}
	}
}

func updateConflict(t *testing.T, f Factory) {
	s := f.Open(t)
	defer s.Close()
	r := newRun("sync", 1)
	if _, err := s.Submit(ctx, r); err != nil {
		t.Fatal(err)
	}
	next := *r
	next.Status, next.Attempt, next.PoolID, next.WindowStart = store.Starting, 1, "stripe", 60e9
	if err := s.Update(ctx, &next, store.Of(store.Queued)); err != nil {
		t.Fatal(err)
	}
	again := next
	again.Status = store.Completed
	if err := s.Update(ctx, &again, store.Of(store.Queued)); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("update from the wrong status: %v, want ErrConflict", err)
	}
	again.Output = []byte(`{"ok":true}`)
	if err := s.Update(ctx, &again, store.Of(store.Starting, store.Running)); err != nil {
		t.Fatal(err)
	}
	got, _ := s.Get(ctx, r.Seq)
	if got.Status != store.Completed || got.Attempt != 1 || got.PoolID != "stripe" || got.WindowStart != 60e9 || string(got.Output) != `{"ok":true}` {
		t.Fatalf("after updates: %+v", got)
	}
	missing := store.Run{Seq: 99999, Status: store.Queued}
	if err := s.Update(ctx, &missing, store.Of(store.Queued)); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("update of an unknown run: %v", err)
	}
}

func start(t *testing.T, f Factory) {
	s := f.Open(t)
	defer s.Close()
	r := newRun("sync", 1)
	// Queued again after a failed attempt: its reason is the failure's,
	// which the next attempt must not show while it runs.
	r.RetryAt, r.Control, r.Attempt, r.Reason = 77, "timeout", 1, "HTTP 503 Service Unavailable: busy"
	if _, err := s.Submit(ctx, r); err != nil {
		t.Fatal(err)
	}
	got, err := s.Start(ctx, r.Seq, store.Admission{At: 500, PoolID: "cap:x", WindowStart: 60})
	if err != nil {
		t.Fatal(err)
	}
	if got.Seq != r.Seq || got.Status != store.Starting || got.Attempt != 2 || got.StartedAt != 500 || got.PoolID != "cap:x" ||
		got.WindowStart != 60 || got.RetryAt != 77 || got.Control != "" || got.Reason != "" || string(got.Input) != `{"i":1}` {
		t.Fatalf("Start returned %+v", got)
	}
	stored, _ := s.Get(ctx, r.Seq)
	if stored.Status != store.Starting || stored.RetryAt != 0 || stored.Attempt != 2 || stored.Reason != "" {
		t.Fatalf("stored after Start: %+v", stored)
	}
	if _, err := s.Start(ctx, r.Seq, store.Admission{At: 600}); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("second Start: %v, want ErrConflict", err)
	}
	if _, err := s.Start(ctx, r.Seq+100, store.Admission{}); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("Start of an unknown run: %v", err)
	}
	counts, _ := s.Counts(ctx)
	if counts[store.Starting] != 1 || counts[store.Queued] != 0 {
		t.Fatalf("counts after Start: %v", counts)
	}
	if starting, _ := s.List(ctx, store.Query{Status: store.Starting}); len(starting) != 1 {
		t.Fatalf("List STARTING after Start: %v", starting)
	}
}

func listByStatus(t *testing.T, f Factory) {
	s := f.Open(t)
	defer s.Close()
	var seqs []uint64
	for i := range 10 {
		r := newRun("sync", i)
		if _, err := s.Submit(ctx, r); err != nil {
			t.Fatal(err)
		}
		seqs = append(seqs, r.Seq)
		if i%2 == 1 {
			r.Status = store.Running
			if err := s.Update(ctx, r, store.Of(store.Queued)); err != nil {
				t.Fatal(err)
			}
		}
	}
	running, err := s.List(ctx, store.Query{Status: store.Running})
	if err != nil || len(running) != 5 {
		t.Fatalf("List RUNNING: %d runs, err %v", len(running), err)
	}
	for i, r := range running {
		if r.Seq != seqs[2*i+1] || r.Status != store.Running || r.Input == nil {
			t.Fatalf("List RUNNING[%d] = seq %d status %s", i, r.Seq, r.Status)
		}
	}
	page, _ := s.List(ctx, store.Query{Status: store.Queued, After: seqs[2], Limit: 2})
	if len(page) != 2 || page[0].Seq != seqs[4] || page[1].Seq != seqs[6] {
		t.Fatalf("paged List QUEUED after %d: %v", seqs[2], page)
	}
	all, _ := s.List(ctx, store.Query{Limit: 3})
	if len(all) != 3 || all[0].Seq != seqs[0] {
		t.Fatalf("List any status: %v", all)
	}
}

func unfinished(t *testing.T, f Factory) {
	s := f.Open(t)
	defer s.Close()
	want := map[store.Status]int{}
	for i, st := range []store.Status{store.Queued, store.Scheduled, store.Starting, store.Running, store.RetryWait, store.Completed, store.TimedOut, store.Cancelled, store.Queued} {
		r := newRun("sync", i)
		if _, err := s.Submit(ctx, r); err != nil {
			t.Fatal(err)
		}
		if st != store.Queued {
			r.Status = st
			if err := s.Update(ctx, r, store.Of(store.Queued)); err != nil {
				t.Fatal(err)
			}
		}
		want[st]++
	}
	var order []store.Status
	var last uint64
	err := s.Unfinished(ctx, func(r *store.Run) error {
		if r.Status.Terminal() {
			t.Errorf("Unfinished visited %s run %d", r.Status, r.Seq)
		}
		if r.Input != nil {
			t.Errorf("Unfinished loaded the input of run %d", r.Seq)
		}
		if len(order) > 0 && order[len(order)-1] == r.Status && r.Seq <= last {
			t.Errorf("Unfinished out of seq order within %s", r.Status)
		}
		order, last = append(order, r.Status), r.Seq
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	wantOrder := []store.Status{store.Queued, store.Queued, store.Starting, store.Running, store.RetryWait, store.Scheduled}
	if fmt.Sprint(order) != fmt.Sprint(wantOrder) {
		t.Fatalf("Unfinished visited %v, want %v", order, wantOrder)
	}
	counts, err := s.Counts(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, st := range store.All {
		if counts[st] != want[st] {
			t.Fatalf("Counts[%s] = %d, want %d (all %v)", st, counts[st], want[st], counts)
		}
	}
}

func concurrent(t *testing.T, f Factory) {
	s := f.Open(t)
	defer s.Close()
	const n = 400
	var wg sync.WaitGroup
	seen := make([]uint64, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := newRun("sync", i)
			if _, err := s.Submit(ctx, r); err != nil {
				t.Error(err)
				return
			}
			r.Status = store.Starting
			if err := s.Update(ctx, r, store.Of(store.Queued)); err != nil {
				t.Error(err)
			}
			seen[i] = r.Seq
		}()
	}
	wg.Wait()
	uniq := map[uint64]bool{}
	for _, q := range seen {
		uniq[q] = true
	}
	if len(uniq) != n {
		t.Fatalf("%d concurrent submits got %d distinct seqs", n, len(uniq))
	}
	counts, _ := s.Counts(ctx)
	if counts[store.Starting] != n || counts[store.Queued] != 0 {
		t.Fatalf("counts after concurrent submits and updates: %v", counts)
	}
}

func durable(t *testing.T, f Factory) {
	s := f.Open(t)
	var seqs []uint64
	for i := range 5 {
		r := newRun("sync", i)
		r.IdempotencyKey = fmt.Sprint("key-", i)
		if _, err := s.Submit(ctx, r); err != nil {
			t.Fatal(err)
		}
		seqs = append(seqs, r.Seq)
	}
	r, _ := s.Get(ctx, seqs[0])
	r.Status, r.Output = store.Completed, []byte(`"done"`)
	if err := s.Update(ctx, &r, store.Of(store.Queued)); err != nil {
		t.Fatal(err)
	}
	s = f.Reopen(t, s)
	defer s.Close()
	got, err := s.Get(ctx, seqs[0])
	if err != nil || got.Status != store.Completed || string(got.Output) != `"done"` {
		t.Fatalf("after reopen: %+v %v", got, err)
	}
	dup := newRun("sync", 9)
	dup.IdempotencyKey = "key-3"
	if created, err := s.Submit(ctx, dup); err != nil || created || dup.Seq != seqs[3] {
		t.Fatalf("idempotency key forgotten across reopen: created=%v seq=%d", created, dup.Seq)
	}
	fresh := newRun("sync", 10)
	if _, err := s.Submit(ctx, fresh); err != nil || fresh.Seq <= seqs[4] {
		t.Fatalf("seq reused after reopen: %d ≤ %d", fresh.Seq, seqs[4])
	}
	counts, _ := s.Counts(ctx)
	if counts[store.Queued] != 5 || counts[store.Completed] != 1 {
		t.Fatalf("counts after reopen: %v", counts)
	}
}

// purge: runs that ended before the cut go, with their idempotency keys;
// runs that ended after it and unfinished runs of any age stay; limit
// bounds one call.
func purge(t *testing.T, f Factory) {
	s := f.Open(t)
	defer s.Close()
	const cut = 5000
	type want struct {
		seq  uint64
		kept bool
	}
	var runs []want
	add := func(i int, st store.Status, finished int64, idem string) uint64 {
		t.Helper()
		r := newRun("sync", i)
		r.IdempotencyKey = idem
		if _, err := s.Submit(ctx, r); err != nil {
			t.Fatal(err)
		}
		if st != store.Queued {
			r.Status, r.FinishedAt = st, finished
			if err := s.Update(ctx, r, store.Of(store.Queued)); err != nil {
				t.Fatal(err)
			}
		}
		runs = append(runs, want{r.Seq, !st.Terminal() || finished >= cut})
		return r.Seq
	}
	add(1, store.Completed, 2000, "k-old") // ended long before the cut: goes
	add(2, store.Queued, 0, "")            // old, waiting: stays
	add(3, store.Failed, 4999, "")         // just before: goes
	add(4, store.Running, 0, "")           // old, running: stays
	add(5, store.TimedOut, cut, "")        // at the cut: stays
	add(6, store.FailedTerminal, 3000, "") // goes
	add(7, store.Completed, 9000, "k-new") // ended after the cut: stays
	add(8, store.RetryWait, 0, "")         // stays
	add(9, store.Completed, 4000, "")      // goes
	add(10, store.Scheduled, 0, "")        // waiting for its time, however old: stays
	add(11, store.Cancelled, 1000, "")     // goes
	before, err := s.Counts(ctx)
	if err != nil {
		t.Fatal(err)
	}

	got, err := s.Purge(ctx, cut, 1)
	if err != nil {
		t.Fatal(err)
	}
	if total(got) != 1 {
		t.Fatalf("Purge with limit 1 deleted %v", got)
	}
	rest, err := s.Purge(ctx, cut, 100)
	if err != nil {
		t.Fatal(err)
	}
	for st, n := range rest {
		got[st] += n
	}
	wantGone := map[store.Status]int{store.Completed: 2, store.Failed: 1, store.FailedTerminal: 1, store.Cancelled: 1}
	for _, st := range store.All {
		if got[st] != wantGone[st] {
			t.Fatalf("purged %v, want %v", got, wantGone)
		}
	}
	if again, err := s.Purge(ctx, cut, 100); err != nil || total(again) != 0 {
		t.Fatalf("a second purge deleted %v (%v)", again, err)
	}
	for _, w := range runs {
		_, err := s.Get(ctx, w.seq)
		if w.kept && err != nil {
			t.Errorf("run %d: %v, want it kept", w.seq, err)
		}
		if !w.kept && !errors.Is(err, store.ErrNotFound) {
			t.Errorf("run %d: err %v, want ErrNotFound after the purge", w.seq, err)
		}
	}
	after, err := s.Counts(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, st := range store.All {
		if after[st] != before[st]-wantGone[st] {
			t.Errorf("count of %s: %d, want %d", st, after[st], before[st]-wantGone[st])
		}
	}
	// The purged run's key is free again; the kept run's still answers.
	old := newRun("sync", 10)
	old.IdempotencyKey = "k-old"
	if created, err := s.Submit(ctx, old); err != nil || !created {
		t.Fatalf("submit with a purged run's key: created=%v err=%v, want a new run", created, err)
	}
	if old.Seq <= runs[len(runs)-1].seq {
		t.Fatalf("new run got seq %d, not after every earlier run (%d): ids must not be reused", old.Seq, runs[len(runs)-1].seq)
	}
	kept := newRun("sync", 11)
	kept.IdempotencyKey = "k-new"
	if created, err := s.Submit(ctx, kept); err != nil || created || kept.Seq != runs[6].seq {
		t.Fatalf("submit with a kept run's key: created=%v seq=%d err=%v, want run %d", created, kept.Seq, err, runs[6].seq)
	}
	lst, err := s.List(ctx, store.Query{Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	if len(lst) != 7 {
		t.Fatalf("List after the purge: %d runs, want 7", len(lst))
	}
}

func total(m map[store.Status]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

// listByNameAndKey: the definition and key filters combine with status
// and paging.
func listByNameAndKey(t *testing.T, f Factory) {
	s := f.Open(t)
	defer s.Close()
	var seqs []uint64
	for i := range 12 {
		name := "sync"
		if i%3 == 0 {
			name = "report"
		}
		r := newRun(name, i) // key k0..k3 by i%4
		if _, err := s.Submit(ctx, r); err != nil {
			t.Fatal(err)
		}
		seqs = append(seqs, r.Seq)
		if i >= 8 {
			r.Status = store.Completed
			if err := s.Update(ctx, r, store.Of(store.Queued)); err != nil {
				t.Fatal(err)
			}
		}
	}
	tests := []struct {
		name string
		q    store.Query
		want []int // indexes into seqs
	}{
		{"name", store.Query{Name: "report"}, []int{0, 3, 6, 9}},
		{"key", store.Query{Key: "k1"}, []int{1, 5, 9}},
		{"name and key", store.Query{Name: "sync", Key: "k2"}, []int{2, 10}},
		{"with status", store.Query{Name: "report", Status: store.Queued}, []int{0, 3, 6}},
		{"paged", store.Query{Name: "sync", After: seqs[2], Limit: 3}, []int{4, 5, 7}},
		{"no match", store.Query{Name: "sync", Key: "nope"}, nil},
	}
	for _, tt := range tests {
		got, err := s.List(ctx, tt.q)
		if err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		var gotSeqs, wantSeqs []uint64
		for _, r := range got {
			gotSeqs = append(gotSeqs, r.Seq)
			if r.Input == nil {
				t.Errorf("%s: run %d listed without its input", tt.name, r.Seq)
			}
		}
		for _, i := range tt.want {
			wantSeqs = append(wantSeqs, seqs[i])
		}
		if fmt.Sprint(gotSeqs) != fmt.Sprint(wantSeqs) {
			t.Errorf("%s: listed %v, want %v", tt.name, gotSeqs, wantSeqs)
		}
	}
}
