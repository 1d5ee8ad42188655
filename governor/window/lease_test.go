package window

import (
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warden-dev/warden/governor/clock"
)

// leaseFixture is a key whose window has admitted some takes and counts
// more as credit held by processor 3's lease, as if that processor had
// leased them and not spent them yet. The counter is built for four
// processors and the tests run on two, so that credit can only be reached
// the way another processor's is: by stealing it.
type leaseFixture struct {
	m   *Memory
	s   *Scope
	key []byte
	h   uint64
	end int64
	now time.Time
}

func newLeaseFixture(t *testing.T, admitted, leasedOut int64) *leaseFixture {
	t.Helper()
	prev := runtime.GOMAXPROCS(4)
	clk := clock.NewFake(noon.Add(10 * time.Second))
	f := &leaseFixture{m: NewMemory(clk), s: NewScope("pool", 60), key: []byte("k"), now: clk.Now()}
	runtime.GOMAXPROCS(prev)
	if len(f.m.leases) != 4 {
		t.Fatalf("%d lease tables with 4 processors, want 4", len(f.m.leases))
	}
	f.h = keyHash(f.s, f.key)
	f.end = noon.Add(time.Minute).Unix()
	sh := f.m.shardOf(f.h)
	sh.mu.Lock()
	sh.slotLocked(f.h, f.s, f.key, nil).w.Store(pack(f.end, admitted+leasedOut))
	sh.mu.Unlock()
	le := &f.m.leases[3].e[leaseIndex(f.h)]
	le.h.Store(f.h)
	le.w.Store(lPack(f.end, 7, leasedOut))
	return f
}

// takes reports how many of tries takes the window admits.
func (f *leaseFixture) takes(limit int64, tries int) int {
	n := 0
	for range tries {
		if f.m.Take(f.s, f.key, limit, 1, f.now).Allowed {
			n++
		}
	}
	return n
}

func TestLeases(t *testing.T) {
	tests := []struct {
		name string
		run  func(t *testing.T, f *leaseFixture)
	}{
		{"peek and usage count only what was admitted", func(t *testing.T, f *leaseFixture) {
			if d := f.m.Peek(f.s, f.key, 30); d.Count != 10 {
				t.Fatalf("Peek count %d, want 10 (20 are unspent credit)", d.Count)
			}
			if u := slices.Collect(f.m.Usage(f.s)); len(u) != 1 || u[0].Count != 10 {
				t.Fatalf("Usage %+v, want one key counting 10", u)
			}
		}},
		{"a full window admits what leases still hold, then refuses", func(t *testing.T, f *leaseFixture) {
			// The window (30 of 30) refuses, and the 20 units of
			// processor 3's lease admit.
			if got := f.takes(30, 25); got != 20 {
				t.Fatalf("admitted %d, want the 20 leased", got)
			}
			if d := f.m.Peek(f.s, f.key, 30); d.Count != 30 {
				t.Fatalf("Peek count %d, want 30", d.Count)
			}
		}},
		{"reset drops leased credit with the count", func(t *testing.T, f *leaseFixture) {
			f.m.Reset(f.s, f.key)
			if f.m.leased(f.h, f.end) != 0 {
				t.Fatal("lease still holds credit after Reset")
			}
			if got := f.takes(5, 10); got != 5 {
				t.Fatalf("admitted %d after reset with limit 5, want 5", got)
			}
		}},
		{"reset of the scope drops leased credit", func(t *testing.T, f *leaseFixture) {
			f.m.ResetScope(f.s)
			if got := f.takes(5, 10); got != 5 {
				t.Fatalf("admitted %d after reset with limit 5, want 5", got)
			}
		}},
		{"TakeAll brings leased credit back before judging", func(t *testing.T, f *leaseFixture) {
			out := make([]Decision, 1)
			n := 0
			for range 25 {
				if f.m.TakeAll([]Want{{Scope: f.s, Key: f.key, Limit: 30, N: 1}}, f.now, out) {
					n++
				}
			}
			if n != 20 {
				t.Fatalf("TakeAll admitted %d, want 20", n)
			}
			if f.m.leased(f.h, f.end) != 0 {
				t.Fatal("lease kept credit TakeAll needed")
			}
		}},
		{"a lower limit is judged by what was admitted", func(t *testing.T, f *leaseFixture) {
			// A reload lowered the rate to 15 after 10 were admitted and
			// 20 leased: 5 more, not the 20 the lease holds.
			if got := f.takes(15, 10); got != 5 {
				t.Fatalf("admitted %d under a lowered limit of 15, want 5", got)
			}
		}},
		{"a lower limit is not spent from this processor's lease", func(t *testing.T, f *leaseFixture) {
			// Both processors the test can run on hold 20 more.
			sh := f.m.shardOf(f.h)
			sh.update(f.h, func(w uint64) uint64 { return pack(f.end, wCount(w)+40) })
			for p := range 2 {
				f.m.leases[p].e[leaseIndex(f.h)].h.Store(f.h)
				f.m.leases[p].e[leaseIndex(f.h)].w.Store(lPack(f.end, 1, 20))
			}
			if got := f.takes(15, 10); got != 5 {
				t.Fatalf("admitted %d under a lowered limit of 15, want 5", got)
			}
			if d := f.m.Peek(f.s, f.key, 15); d.Count != 15 {
				t.Fatalf("Peek count %d, want 15", d.Count)
			}
		}},
		{"credit of an earlier window admits nothing", func(t *testing.T, f *leaseFixture) {
			next := f.now.Add(time.Minute)
			n := 0
			for range 5 {
				if f.m.Take(f.s, f.key, 2, 1, next).Allowed {
					n++
				}
			}
			if n != 2 {
				t.Fatalf("admitted %d in the next window with limit 2, want 2", n)
			}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(2))
			tc.run(t, newLeaseFixture(t, 10, 20))
		})
	}
}

// A lease entry handed to another key must not let a late-stamped take of
// that key spend the credit the entry held for the first one. Both
// processors the test runs on hold credit for k in the current window; y
// shares k's entries.
// A take of y stamped in the next window claims the entry of whichever
// processor it runs on; a take of y stamped in the current window, late,
// must then be judged by y's window (full), not by k's leftover credit.
func TestLeaseEntryChangesHandsWithoutItsCredit(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(2))
	f := newLeaseFixture(t, 10, 20)
	for p := range 2 {
		f.m.leases[p].e[leaseIndex(f.h)].h.Store(f.h)
		f.m.leases[p].e[leaseIndex(f.h)].w.Store(lPack(f.end, 3, 20))
	}
	var y []byte
	for i := 0; y == nil; i++ {
		if k := []byte("y" + strconv.Itoa(i)); leaseIndex(keyHash(f.s, k)) == leaseIndex(f.h) {
			y = k
		}
	}
	next := f.now.Add(time.Minute)
	if !f.m.Take(f.s, y, 1, 1, next).Allowed {
		t.Fatal("first take of y refused")
	}
	if f.m.Take(f.s, y, 1, 1, f.now).Allowed {
		t.Fatal("late-stamped take of y admitted past its limit of 1: it spent k's credit")
	}
}

// Many goroutines on four processors taking one key: leases are granted
// (the point of them) and the window still admits exactly its limit, with
// Peek agreeing once every take is done.
func TestLeasedTakesExact(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(4))
	clk := clock.NewFake(noon.Add(10 * time.Second))
	m := NewMemory(clk)
	s := NewScope("pool", 60)
	key := []byte("hot")
	h, end := keyHash(s, key), noon.Add(time.Minute).Unix()
	const goroutines, each, limit = 8, 4000, 20_000
	var allowed atomic.Int64
	var sawLease atomic.Bool
	var wg sync.WaitGroup
	for range goroutines {
		wg.Go(func() {
			for i := range each {
				if m.Take(s, key, limit, 1, clk.Now()).Allowed {
					allowed.Add(1)
				}
				if i%64 == 0 && m.leased(h, end) > 0 {
					sawLease.Store(true)
				}
			}
		})
	}
	wg.Wait()
	if !sawLease.Load() {
		t.Fatal("no lease was ever granted: the test exercised the window alone")
	}
	if got := allowed.Load(); got != limit {
		t.Fatalf("admitted %d of %d takes, want exactly the limit %d", got, goroutines*each, limit)
	}
	if d := m.Peek(s, key, limit); d.Count != limit {
		t.Fatalf("Peek count %d, want %d", d.Count, limit)
	}
}

// With one processor there is nothing to share a cache line with: no leases.
func TestNoLeasesOnOneProcessor(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	if m := NewMemory(clock.Real{}); m.leases != nil {
		t.Fatalf("%d lease tables at GOMAXPROCS=1", len(m.leases))
	}
}
