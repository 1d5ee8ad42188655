package scheduler

import (
	"context"
	"runtime"
	"strconv"
	"testing"
)

// A definition's keys come from clients: /v1/queues answers the 100
// deepest of them and costs memory in those, not in the keys waiting.
func TestQueuesKeyRowsAreBounded(t *testing.T) {
	g := newGates()
	w := newGatedWorker(t, g)
	h := newHarness(t, policyYAML(w.srv.URL, `
  lanes: 1
  definitions:
    sync: { key: "${input.t}", key_concurrency: 1 }`, ""))
	t.Cleanup(g.openAll) // before the harness stops: nothing held then
	const keys = 3000
	for i := range keys {
		depth := 1
		if i < 5 {
			depth = 2
		}
		for range depth {
			_, _, err := h.sched.Submit(context.Background(), SubmitRequest{Name: "sync", Input: []byte(`{"t":"k` + strconv.Itoa(i) + `"}`)})
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	w.next(t) // the one lane is taken; every other run waits

	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	rows := h.sched.Queues()
	runtime.ReadMemStats(&after)
	var keyRows []QueueState
	for _, r := range rows {
		if r.Scope == "key" {
			keyRows = append(keyRows, r)
		}
	}
	if len(keyRows) != maxKeyRows {
		t.Fatalf("%d key rows, want %d", len(keyRows), maxKeyRows)
	}
	// k0's first run took the lane: k1..k4 are the deepest, then k0 (one
	// waiting, one running) leads the keys of depth 1 by name.
	for i, r := range keyRows[:5] {
		want, depth := "k"+strconv.Itoa(i+1), 2
		if i == 4 {
			want, depth = "k0", 1
		}
		if *r.Key != want || r.Depth != depth {
			t.Fatalf("key row %d: %s depth %d, want %s depth %d", i, *r.Key, r.Depth, want, depth)
		}
	}
	// Rows for every key would be 3,000 × 100 bytes and more.
	if n := after.TotalAlloc - before.TotalAlloc; n > 96<<10 {
		t.Fatalf("/v1/queues over %d keys allocated %d bytes", keys, n)
	}
}
