package pgstore_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/warden-dev/warden/scheduler/store"
	"github.com/warden-dev/warden/scheduler/store/pgstore"
)

// submitN queues n runs of a definition, keys given by key(i).
func submitN(t *testing.T, s *pgstore.Store, name string, n int, key func(i int) string) []uint64 {
	t.Helper()
	var seqs []uint64
	for i := range n {
		r := &store.Run{Name: name, Status: store.Queued, Key: key(i), Input: []byte(fmt.Sprintf(`{"i":%d}`, i)), QueuedAt: 1}
		if _, err := s.Submit(context.Background(), r); err != nil {
			t.Fatal(err)
		}
		seqs = append(seqs, r.Seq)
	}
	return seqs
}

func claimSeqs(t *testing.T, s *pgstore.Store, req pgstore.ClaimRequest) ([]uint64, pgstore.ClaimResult) {
	t.Helper()
	res, err := s.Claim(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	var out []uint64
	for _, r := range res.Runs {
		if r.Status != store.Starting || r.Attempt != 1 || r.Input == nil {
			t.Fatalf("claimed run %+v: want STARTING, attempt 1, with its input", r)
		}
		out = append(out, r.Seq)
	}
	return out, res
}

func same(key string) func(int) string { return func(int) string { return key } }

// Each gate checked in the claim transaction, on one store: what a first
// claim takes, what a second claim by another sidecar takes while the
// first holds its runs, and what it takes after the first's runs end.
func TestClaimGates(t *testing.T) {
	minute := int64(60e9)
	base := int64(1_700_000_000e9) / minute * minute
	cases := []struct {
		name    string
		setup   func(t *testing.T, s *pgstore.Store) []uint64
		req     pgstore.ClaimRequest
		first   []int // indexes of the submitted runs the first claim takes
		second  []int // a second sidecar's claim meanwhile
		wakeAt  int64 // the second claim's WakeAt
		endThen []int // after the first claim's runs COMPLETED, a third claim takes
	}{
		{
			name: "lanes across sidecars",
			setup: func(t *testing.T, s *pgstore.Store) []uint64 {
				return submitN(t, s, "job", 7, func(i int) string { return fmt.Sprint(i) })
			},
			req:   pgstore.ClaimRequest{Lanes: 3, Defs: map[string]pgstore.ClaimDef{"job": {}}},
			first: []int{0, 1, 2}, second: nil, endThen: []int{3, 4, 5},
		},
		{
			name: "worker_max_concurrent per sidecar",
			setup: func(t *testing.T, s *pgstore.Store) []uint64 {
				return submitN(t, s, "job", 5, func(i int) string { return fmt.Sprint(i) })
			},
			req:   pgstore.ClaimRequest{Lanes: 10, WorkerMax: 2, Defs: map[string]pgstore.ClaimDef{"job": {}}},
			first: []int{0, 1}, second: []int{2, 3}, endThen: []int{4},
		},
		{
			name: "key_concurrency skips only its key",
			setup: func(t *testing.T, s *pgstore.Store) []uint64 {
				return submitN(t, s, "sync", 6, func(i int) string { return []string{"a", "a", "b", "a", "c", "b"}[i] })
			},
			req:   pgstore.ClaimRequest{Lanes: 10, Defs: map[string]pgstore.ClaimDef{"sync": {KeyLimit: 1}}},
			first: []int{0, 2, 4}, second: nil, endThen: []int{1, 5},
		},
		{
			name: "pool concurrency skips only its definition",
			setup: func(t *testing.T, s *pgstore.Store) []uint64 {
				a := submitN(t, s, "pooled", 3, same("x"))
				return append(a, submitN(t, s, "free", 2, same("x"))...)
			},
			req: pgstore.ClaimRequest{Lanes: 10, Defs: map[string]pgstore.ClaimDef{"pooled": {Pool: "stripe"}, "free": {}},
				Pools: map[string]pgstore.ClaimPool{"stripe": {Concurrency: 2}}},
			first: []int{0, 1, 3, 4}, second: nil, endThen: []int{2},
		},
		{
			name:  "pool rate per fixed window, boundary wakes",
			setup: func(t *testing.T, s *pgstore.Store) []uint64 { return submitN(t, s, "api", 5, same("x")) },
			req: pgstore.ClaimRequest{Lanes: 10, Defs: map[string]pgstore.ClaimDef{"api": {Pool: "partner"}},
				Pools: map[string]pgstore.ClaimPool{"partner": {Rate: 2, WindowStart: base, WindowEnd: base + minute}}},
			// Ending runs does not refill the window.
			first: []int{0, 1}, second: nil, wakeAt: base + minute, endThen: nil,
		},
		{
			name: "semaphore permits all or nothing",
			setup: func(t *testing.T, s *pgstore.Store) []uint64 {
				a := submitN(t, s, "erp", 3, func(i int) string { return fmt.Sprint(i) })
				return append(a, submitN(t, s, "other", 1, same("x"))...)
			},
			req: pgstore.ClaimRequest{Lanes: 10, Defs: map[string]pgstore.ClaimDef{
				"erp":   {Semaphores: []string{"legacy", "unconfigured"}},
				"other": {Semaphores: []string{"legacy", "second"}}},
				Semaphores: map[string]int{"legacy": 2, "second": 1}},
			first: []int{0, 1}, second: nil, endThen: []int{2, 3},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := open(t, schemaURL(t))
			defer s.Close()
			seqs := tc.setup(t, s)
			pick := func(idx []int) []uint64 {
				var out []uint64
				for _, i := range idx {
					out = append(out, seqs[i])
				}
				return out
			}
			req := tc.req
			req.Owner, req.Now, req.Lease = "sidecar-1", base+1e9, time.Minute
			got, _ := claimSeqs(t, s, req)
			if !slices.Equal(got, pick(tc.first)) {
				t.Fatalf("first claim took %v, want %v", got, pick(tc.first))
			}
			req2 := req
			req2.Owner = "sidecar-2"
			got2, res2 := claimSeqs(t, s, req2)
			if !slices.Equal(got2, pick(tc.second)) {
				t.Fatalf("second sidecar's claim took %v, want %v", got2, pick(tc.second))
			}
			if res2.WakeAt != tc.wakeAt {
				t.Fatalf("second claim WakeAt %d, want %d", res2.WakeAt, tc.wakeAt)
			}
			for _, seq := range append(got, got2...) {
				r, _ := s.Get(context.Background(), seq)
				r.Status = store.Completed
				if err := s.Update(context.Background(), &r, store.Of(store.Starting, store.Running)); err != nil {
					t.Fatal(err)
				}
			}
			got3, _ := claimSeqs(t, s, req)
			if !slices.Equal(got3, pick(tc.endThen)) {
				t.Fatalf("claim after the first runs ended took %v, want %v", got3, pick(tc.endThen))
			}
		})
	}
}

// A run held by pool_rate is admitted in the next window; priority beats
// age.
func TestClaimRateWindowAndPriority(t *testing.T) {
	s := open(t, schemaURL(t))
	defer s.Close()
	minute := int64(60e9)
	base := int64(1_700_000_000e9) / minute * minute
	old := submitN(t, s, "api", 2, same("x"))
	urgent := &store.Run{Name: "api", Status: store.Queued, Priority: 5, Key: "x", Input: []byte(`{}`)}
	if _, err := s.Submit(context.Background(), urgent); err != nil {
		t.Fatal(err)
	}
	req := pgstore.ClaimRequest{Owner: "a", Lanes: 10, Lease: time.Minute, Now: base + 5e9,
		Defs:  map[string]pgstore.ClaimDef{"api": {Pool: "p"}},
		Pools: map[string]pgstore.ClaimPool{"p": {Rate: 1, WindowStart: base, WindowEnd: base + minute}}}
	got, _ := claimSeqs(t, s, req)
	if !slices.Equal(got, []uint64{urgent.Seq}) {
		t.Fatalf("claimed %v, want the priority-5 run %d", got, urgent.Seq)
	}
	if got, res := claimSeqs(t, s, req); len(got) != 0 || res.WakeAt != base+minute {
		t.Fatalf("same window: claimed %v wake %d", got, res.WakeAt)
	}
	req.Now, req.Pools["p"] = base+minute, pgstore.ClaimPool{Rate: 1, WindowStart: base + minute, WindowEnd: base + 2*minute}
	if got, _ := claimSeqs(t, s, req); !slices.Equal(got, old[:1]) {
		t.Fatalf("next window claimed %v, want %v", got, old[:1])
	}
}
