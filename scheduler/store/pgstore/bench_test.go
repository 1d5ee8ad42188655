package pgstore_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/warden-dev/warden/internal/testkit/pgtest"
	"github.com/warden-dev/warden/scheduler/store"
	"github.com/warden-dev/warden/scheduler/store/pgstore"
)

// BenchmarkClaimCycle is one admission on the shared queue: a claim (lanes,
// key, pool rate and a semaphore checked) that takes one run, and that
// run's completion, with b.N runs queued up front. Run briefly:
// -benchtime=200x.
func BenchmarkClaimCycle(b *testing.B) {
	s := open(b, pgtest.SchemaURL(b, "warden_bench").String())
	defer s.Close()
	ctx := context.Background()
	for i := range b.N {
		r := &store.Run{Name: "job", Status: store.Queued, Key: fmt.Sprint(i % 50), Input: []byte(`{}`)}
		if _, err := s.Submit(ctx, r); err != nil {
			b.Fatal(err)
		}
	}
	minute := int64(time.Minute)
	req := pgstore.ClaimRequest{Owner: "bench", Lease: time.Minute, Lanes: 1,
		Defs:       map[string]pgstore.ClaimDef{"job": {KeyLimit: 1, Pool: "p", Semaphores: []string{"s"}}},
		Pools:      map[string]pgstore.ClaimPool{"p": {Rate: 1 << 30, WindowStart: 0, WindowEnd: minute}},
		Semaphores: map[string]int{"s": 1}}
	b.ResetTimer()
	for i := range b.N {
		req.Now = int64(i + 1)
		res, err := s.Claim(ctx, req)
		if err != nil || len(res.Runs) != 1 {
			b.Fatalf("claim %d: %d runs, %v", i, len(res.Runs), err)
		}
		r := res.Runs[0]
		r.Status = store.Completed
		if err := s.Update(ctx, &r, store.Of(store.Starting)); err != nil {
			b.Fatal(err)
		}
	}
}
