package window

import (
	"errors"
	"time"

	"github.com/warden-dev/warden/governor/backend/redisx"
)

// ErrNotShared is TakeLeased's answer when there is no shared decision to
// make: the counter runs on local windows (backend.kind memory after a
// reload) or Redis is down (redisx.ErrUnavailable is wrapped). The caller
// applies its local gates, or refuses when FailClosed says so.
var ErrNotShared = errors.New("no shared backend in use")

// Leased is the outcome of TakeLeased.
type Leased struct {
	// Window is the rate gate's decision (zero when there is no rate gate).
	Window Decision
	// Holders is how many unexpired leases the set has, this one included
	// when admitted; LeaseOK says whether the concurrency gate alone had
	// room (true when there is no concurrency gate, or when the rate gate
	// was refused from the local over-limit cache without asking Redis).
	Holders int64
	LeaseOK bool
	// Admitted: every gate admitted and was taken.
	Admitted bool
	// Lease is the lease taken (zero without a concurrency gate or when
	// refused). It is renewed until released.
	Lease Held
	// Extra has one entry per extra lease gate of TakeLeasedWith, in order,
	// when Redis was asked; nil when it was not (no extra gates, or the
	// rate gate was refused from the local over-limit cache).
	Extra []LeaseGot
}

// LeaseWant is a lease gate a caller adds to a shared admission
// (TakeLeasedWith): one lease in Set, a LeaseSet key, which holds at most
// Limit unexpired leases.
type LeaseWant struct {
	Set   string
	Limit int64
}

// LeaseGot is the outcome of one LeaseWant.
type LeaseGot struct {
	// Holders is how many unexpired leases the set has, this one included
	// when taken; OK says whether the gate alone had room.
	Holders int64
	OK      bool
	// Lease is the lease taken: zero unless every gate of the admission
	// admitted. It is renewed until released.
	Lease Held
}

// Held is a lease taken in Redis. The zero Held is inert.
type Held struct {
	cli         *redisx.Client
	key, holder string
}

// Shared reports whether h is a lease in Redis.
func (h Held) Shared() bool { return h.cli != nil }

// Release gives the lease back in the client's next release batch; done
// (may be nil) runs once that is done or has failed, never under a lock of
// the caller's. A zero Held runs done at once.
func (h Held) Release(done func()) {
	if h.cli == nil {
		if done != nil {
			done()
		}
		return
	}
	h.cli.Release(h.key, h.holder, done)
}

// Abandon stops renewing the lease and leaves it in Redis, where it
// expires after the client's lease TTL (redisx.Client.Forget).
func (h Held) Abandon() {
	if h.cli != nil {
		h.cli.Forget(h.key, h.holder)
	}
}

// FailClosed reports whether a decision the shared backend cannot make
// must be refused (backend.on_error fail_closed, a Redis backend in use).
func (r *Redis) FailClosed() bool {
	st := r.state.Load()
	return st.cli != nil && st.failClosed
}

// Local is the in-process counter the Redis counter falls back to
// (fail_open) and counts in after backend.kind changed to memory.
func (r *Redis) Local() *Memory { return r.local }

// Prefix is the key prefix in force (it may change on Reconfigure).
func (r *Redis) Prefix() string { return r.state.Load().prefix }

// LeaseSet is the key of the lease set kind:name under prefix, e.g.
// warden:lease:pool:cap:stripe. The name comes last and the kind has no
// ':', so two sets never collide. Callers build it once per prefix (see
// Prefix) and pass it to TakeLeased.
func LeaseSet(prefix, kind, name string) string {
	return prefix + "lease:" + kind + ":" + name
}

// TakeLeased is one shared admission: a lease in the set (a LeaseSet key
// under the current Prefix), which holds at most conc unexpired leases, and n from key's window of at most
// rate, taken together or not at all, in one round trip (the batched admit
// script). conc 0 means no concurrency gate, rate 0 no rate gate (s and
// key are then unused). Leases
// expire after the client's LeaseTTL unless renewed, which the client does
// for every lease it handed out until Held.Release.
func (r *Redis) TakeLeased(s *Scope, key []byte, rate, n int64, set string, conc int64, now time.Time) (Leased, error) {
	return r.TakeLeasedWith(nil, s, key, rate, n, set, conc, now)
}

// TakeLeasedWith is TakeLeased with more lease gates, checked before the
// concurrency and rate gates in the same op: every gate is taken or none,
// in the same round trip. The scheduler takes a run's lane and semaphore
// permits this way together with its definition's pool. Each extra lease
// is renewed until its Held is released.
func (r *Redis) TakeLeasedWith(extra []LeaseWant, s *Scope, key []byte, rate, n int64, set string, conc int64, now time.Time) (Leased, error) {
	st := r.state.Load()
	if st.cli == nil {
		return Leased{}, ErrNotShared
	}
	out := Leased{LeaseOK: true}
	nowNs := now.UnixNano()
	var h uint64
	var cur *span
	if rate > 0 {
		cur = r.spans.current(s.Window, now)
		out.Window = Decision{Limit: rate, start: cur.start, end: cur.end, loc: now.Location()}
		h = keyHash(s, key)
		if c, full := r.full.refused(h, cur.end, nowNs, rate, n); full {
			out.Window.Count = c
			return out, nil
		}
	}
	if st.cli.Down() {
		return Leased{}, errors.Join(ErrNotShared, redisx.ErrUnavailable)
	}
	op := redisx.GetOp()
	defer redisx.PutOp(op)
	var holder string
	if conc > 0 || len(extra) > 0 {
		// One holder name for every lease of the admission: the sets
		// differ, so the name stays unique in each.
		holder = st.cli.NewHolder()
	}
	for _, w := range extra {
		op.AddLease(w.Set, holder, w.Limit, now, st.cli.LeaseTTL())
	}
	if conc > 0 {
		op.AddLease(set, holder, conc, now, st.cli.LeaseTTL())
	}
	if rate > 0 {
		k := windowKeys(st.prefix, s, cur.start)
		ck := k.counterKey(key)
		op.AddWindow(ck, k.index, ck[len(k.base):], rate, n, int64(s.MaxKeys), time.Duration(cur.end-nowNs))
	}
	if err := st.cli.Admit(op); err != nil {
		if holder != "" && !errors.Is(err, redisx.ErrUnavailable) && !errors.Is(err, redisx.ErrClosed) {
			// Sent, and maybe applied later: take back what it took.
			for _, w := range extra {
				st.cli.Revoke(w.Set, holder)
			}
			if conc > 0 {
				st.cli.Revoke(set, holder)
			}
		}
		return Leased{}, errors.Join(ErrNotShared, err)
	}
	out.Admitted = op.Admitted()
	i := 0
	if len(extra) > 0 {
		out.Extra = make([]LeaseGot, len(extra))
		for j, w := range extra {
			g := &out.Extra[j]
			g.Holders, g.OK = op.Result(j)
			if out.Admitted {
				st.cli.Hold(w.Set, holder)
				g.Lease = Held{cli: st.cli, key: w.Set, holder: holder}
			}
		}
		i = len(extra)
	}
	if conc > 0 {
		out.Holders, out.LeaseOK = op.Result(i)
		i++
	}
	if rate > 0 {
		setResult(&out.Window, op, i)
		if !out.Window.Allowed && !out.Window.Overflow && st.recheck > 0 {
			r.full.mark(h, s.hash, cur.end, nowNs, out.Window.Count, st.recheck)
		}
	}
	if out.Admitted && conc > 0 {
		st.cli.Hold(set, holder)
		out.Lease = Held{cli: st.cli, key: set, holder: holder}
	}
	return out, nil
}

// LeaseHolders reads how many unexpired leases the set holds at now; ok is
// false when the shared backend cannot say.
func (r *Redis) LeaseHolders(set string, now time.Time) (n int64, ok bool) {
	st := r.state.Load()
	if st.cli == nil {
		return 0, false
	}
	n, err := st.cli.LeaseHolders(set, now)
	return n, err == nil
}
