package redisx

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"math"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// DefaultLeaseTTL is how long a lease lives without renewal: the time a
// holder that died (killed, partitioned, frozen) keeps its slot. Leases are
// renewed every third of it (RenewEvery), so two renewals in a row can
// fail or stall before a live holder loses its slot.
const DefaultLeaseTTL = 30 * time.Second

// leaseChunk bounds the leases one renewal script touches, so
// that a sidecar holding thousands never blocks Redis for long.
const leaseChunk = 512

// leaseRef names one held lease: its set and its holder.
type leaseRef struct{ key, holder string }

// leases keeps the leases this client took alive. Every held lease is
// renewed by one script call per RenewEvery (per chunk of leaseChunk), not
// one call per lease; releases travel in the admission batches.
type leases struct {
	id  string // this client's holder prefix, random per process
	seq atomic.Uint64

	mu   sync.Mutex
	held map[leaseRef]struct{}
}

func newLeases() *leases {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return &leases{id: hex.EncodeToString(b[:]), held: map[leaseRef]struct{}{}}
}

// LeaseTTL is the lease duration of this client.
func (c *Client) LeaseTTL() time.Duration { return c.cfg.LeaseTTL }

// NewHolder returns a holder name unique to this process and call, for a
// lease gate: process id (random) and a sequence number.
func (c *Client) NewHolder() string {
	return c.l.id + ":" + strconv.FormatUint(c.l.seq.Add(1), 36)
}

// Hold registers a lease that an admission took (a lease gate that was
// committed) for renewal until Release.
func (c *Client) Hold(key, holder string) {
	c.l.mu.Lock()
	c.l.held[leaseRef{key, holder}] = struct{}{}
	c.l.mu.Unlock()
}

// Held is how many leases this client renews.
func (c *Client) Held() int {
	c.l.mu.Lock()
	defer c.l.mu.Unlock()
	return len(c.l.held)
}

// Release stops renewing the lease and removes it from its set. The
// removal is an op of its own in the admission batcher, queued without
// waiting: it never blocks on Redis, yet an admission this process makes
// after Release returns is queued behind it and, with one sender (the
// default Senders), sent in the same or a later batch, so it sees the slot
// free (a
// caller that runs requests one after another through a pool of
// concurrency 1 is never refused by its own previous request). done (may
// be nil) runs once Redis applied the removal or it failed (the lease then
// expires by itself); it runs in the batch sender and must not block.
// Releasing twice is harmless.
func (c *Client) Release(key, holder string, done func()) {
	c.l.mu.Lock()
	delete(c.l.held, leaseRef{key, holder})
	c.l.mu.Unlock()
	if done == nil {
		done = func() {}
	}
	if c.h.isDown() {
		// Not sent: the lease expires there after LeaseTTL.
		done()
		return
	}
	op := GetOp()
	op.gates = append(op.gates, Gate{Kind: GateRelease, Key: key, Member: holder})
	op.after = done
	c.mu.RLock()
	if c.closed {
		c.mu.RUnlock()
		PutOp(op)
		done()
		return
	}
	c.b.ops <- op
	c.mu.RUnlock()
}

// revokeAgain is when Revoke removes the lease again: after the stalls that
// commonly delay a call past its timeout (a fork, a busy script, a paused
// process), well within the lease's TTL.
var revokeAgain = []time.Duration{time.Second, 5 * time.Second, 15 * time.Second}

// Revoke removes a lease whose admission failed after it was sent: Redis
// may still run it once the stall that made the call time out is over, and
// the lease would then hold a slot nobody releases until it expires. The
// removal is sent at once and again after each of revokeAgain, as it may
// overtake the delayed admission on another connection; removing a lease
// that is not there does nothing.
func (c *Client) Revoke(key, holder string) {
	c.Release(key, holder, nil)
	for _, d := range revokeAgain {
		time.AfterFunc(d, func() { c.Release(key, holder, nil) })
	}
}

// Forget stops renewing the lease without removing it from its set: it
// expires there after LeaseTTL. For a lease whose holder outlives this
// process's interest in it (a run its worker still executes while the
// sidecar that admitted it stops): the slot stays counted, by every
// sidecar, until the lease runs out.
func (c *Client) Forget(key, holder string) {
	c.l.mu.Lock()
	delete(c.l.held, leaseRef{key, holder})
	c.l.mu.Unlock()
}

// renewer extends every held lease each RenewEvery.
func (c *Client) renewer() {
	defer c.wg.Done()
	t := c.h.clk.NewTimer(c.cfg.RenewEvery)
	defer t.Stop()
	for {
		select {
		case <-t.C():
		case <-c.done:
			return
		}
		c.renew()
		t.Reset(c.cfg.RenewEvery)
	}
}

// renew sends one renewal of every held lease (per chunk). While Redis is
// down nothing is sent. A lease Redis no longer has — it restarted empty,
// or the lease expired because renewals failed for longer than LeaseTTL —
// is added back if this client still holds it: its holder runs, so its set
// must count it, even past the limit (the set then admits nobody until
// enough holders end, rather than admitting one more than the limit).
func (c *Client) renew() {
	c.l.mu.Lock()
	refs := make([]leaseRef, 0, len(c.l.held))
	for r := range c.l.held {
		refs = append(refs, r)
	}
	c.l.mu.Unlock()
	if len(refs) == 0 || c.h.isDown() {
		return
	}
	expiry := c.h.clk.Now().Add(c.cfg.LeaseTTL).UnixMilli()
	var gone []leaseRef
	for start := 0; start < len(refs); start += leaseChunk {
		chunk := refs[start:min(start+leaseChunk, len(refs))]
		idx, err := c.leaseCall(renewScript, "renew", chunk, expiry).Int64Slice()
		if err != nil {
			return
		}
		for _, i := range idx {
			if i >= 1 && int(i) <= len(chunk) {
				gone = append(gone, chunk[i-1])
			}
		}
	}
	if len(gone) == 0 {
		return
	}
	// Released since the snapshot: its removal may have been applied
	// already; adding it back would hold a slot for nobody until it
	// expires.
	c.l.mu.Lock()
	gone = slices.DeleteFunc(gone, func(r leaseRef) bool {
		_, held := c.l.held[r]
		return !held
	})
	c.l.mu.Unlock()
	readded := 0
	for start := 0; start < len(gone); start += leaseChunk {
		chunk := gone[start:min(start+leaseChunk, len(gone))]
		if err := c.leaseCall(readdScript, "renew", chunk, expiry).Err(); err != nil {
			break
		}
		readded += len(chunk)
	}
	if readded > 0 && c.errLog.allow(time.Now()) {
		c.log.Warn("leases Redis had lost (restarted empty, or renewals failed for longer than the lease) were added back; their sets may count more than their limits until those holders end",
			"readded", readded, "lease", c.cfg.LeaseTTL)
	}
}

// leaseCall runs a renew-shaped script (renewScript, readdScript) over refs,
// measured as op.
func (c *Client) leaseCall(s *Script, op string, refs []leaseRef, expiry int64) *redis.Cmd {
	args := make([]any, 3, 5+2*len(refs))
	args[2] = len(refs)
	for _, r := range refs {
		args = append(args, r.key)
	}
	args = append(args, expiry, c.cfg.LeaseTTL.Milliseconds())
	for _, r := range refs {
		args = append(args, r.holder)
	}
	t := time.Now()
	cmd := s.run(context.Background(), c.rdb, args)
	c.observe(op, t, cmd.Err())
	return cmd
}

// RenewNow renews every held lease at once, for tests that move a fake
// clock and for callers that know renewals were missed.
func (c *Client) RenewNow() { c.renew() }

// LeaseHolders reads how many unexpired holders the set key has at now. It
// is a check-only admission in the batcher, so it is ordered after every
// release this process queued before it: a caller that released and then
// asks sees its own release.
func (c *Client) LeaseHolders(key string, now time.Time) (int64, error) {
	op := GetOp()
	defer PutOp(op)
	op.AddLease(key, "", math.MaxInt64, now, time.Second)
	op.CheckOnly()
	if err := c.Admit(op); err != nil {
		return 0, err
	}
	n, _ := op.Result(0)
	return n, nil
}
