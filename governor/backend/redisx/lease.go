package redisx

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// DefaultLeaseTTL is how long a lease lives without renewal: the time a
// holder that died (killed, partitioned, frozen) keeps its slot. Leases are
// renewed every third of it (RenewEvery), so two renewals in a row can
// fail or stall before a live holder loses its slot.
const DefaultLeaseTTL = 30 * time.Second

// leaseChunk bounds the leases one renewal or release script touches, so
// that a sidecar holding thousands never blocks Redis for long.
const leaseChunk = 512

// leaseRef names one held lease: its set and its holder.
type leaseRef struct{ key, holder string }

// pendingRelease is a release waiting for the next batch.
type pendingRelease struct {
	ref  leaseRef
	done func()
}

// leases keeps the leases this client took alive and gives them back.
// Every held lease is renewed by one script call per RenewEvery (per chunk
// of leaseChunk), not one call per lease; releases are batched the same
// way as admissions: a single goroutine sends every release queued while
// the previous batch was on the wire.
type leases struct {
	id  string // this client's holder prefix, random per process
	seq uint64

	mu      sync.Mutex
	held    map[leaseRef]struct{}
	pending []pendingRelease
	wake    chan struct{}
}

func newLeases() *leases {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return &leases{id: hex.EncodeToString(b[:]), held: map[leaseRef]struct{}{}, wake: make(chan struct{}, 1)}
}

// LeaseTTL is the lease duration of this client.
func (c *Client) LeaseTTL() time.Duration { return c.cfg.LeaseTTL }

// NewHolder returns a holder name unique to this process and call, for a
// lease gate: process id (random) and a sequence number.
func (c *Client) NewHolder() string {
	l := c.l
	l.mu.Lock()
	l.seq++
	n := l.seq
	l.mu.Unlock()
	return l.id + ":" + strconv.FormatUint(n, 36)
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

// Release stops renewing the lease and removes it from its set in the next
// release batch; done (may be nil) runs once Redis applied it or the
// release failed (the lease then expires by itself). It never blocks on
// Redis. Releasing twice is harmless.
func (c *Client) Release(key, holder string, done func()) {
	c.mu.RLock()
	closed := c.closed
	c.l.mu.Lock()
	delete(c.l.held, leaseRef{key, holder})
	if !closed {
		c.l.pending = append(c.l.pending, pendingRelease{leaseRef{key, holder}, done})
	}
	c.l.mu.Unlock()
	c.mu.RUnlock()
	if closed {
		// The client is gone (a reload moved to another Redis): the lease
		// expires there by itself.
		if done != nil {
			done()
		}
		return
	}
	select {
	case c.l.wake <- struct{}{}:
	default:
	}
}

// releaser sends the queued releases, one script call per batch.
func (c *Client) releaser() {
	defer c.wg.Done()
	for {
		select {
		case <-c.l.wake:
		case <-c.done:
			c.flushReleases()
			return
		}
		c.flushReleases()
	}
}

func (c *Client) flushReleases() {
	c.l.mu.Lock()
	batch := c.l.pending
	c.l.pending = nil
	c.l.mu.Unlock()
	if len(batch) == 0 {
		return
	}
	if !c.h.isDown() {
		for start := 0; start < len(batch); start += leaseChunk {
			chunk := batch[start:min(start+leaseChunk, len(batch))]
			args := make([]any, 3, 3+2*len(chunk))
			args[2] = len(chunk)
			for _, r := range chunk {
				args = append(args, r.ref.key)
			}
			for _, r := range chunk {
				args = append(args, r.ref.holder)
			}
			t := time.Now()
			err := releaseScript.run(context.Background(), c.rdb, args).Err()
			c.observe("release", t, err)
		}
	}
	// Down or failed: the leases expire by themselves after LeaseTTL.
	for _, r := range batch {
		if r.done != nil {
			r.done()
		}
	}
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
// down nothing is sent; a lease whose renewals failed for longer than
// LeaseTTL is gone when Redis answers again, and stays gone.
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
	var lost int64
	for start := 0; start < len(refs); start += leaseChunk {
		chunk := refs[start:min(start+leaseChunk, len(refs))]
		args := make([]any, 3, 5+2*len(chunk))
		args[2] = len(chunk)
		for _, r := range chunk {
			args = append(args, r.key)
		}
		args = append(args, expiry, c.cfg.LeaseTTL.Milliseconds())
		for _, r := range chunk {
			args = append(args, r.holder)
		}
		t := time.Now()
		n, err := renewScript.run(context.Background(), c.rdb, args).Int64()
		c.observe("renew", t, err)
		if err != nil {
			return
		}
		lost += n
	}
	if lost > 0 && c.errLog.allow(time.Now()) {
		c.log.Warn("leases had expired before their renewal (renewals failed or stalled for longer than the lease); their holders run on without a shared slot",
			"lost", lost, "lease", c.cfg.LeaseTTL)
	}
}

// RenewNow renews every held lease at once, for tests that move a fake
// clock and for callers that know renewals were missed.
func (c *Client) RenewNow() { c.renew() }

// LeaseHolders reads how many unexpired holders the set key has at now
// (operation "peek").
func (c *Client) LeaseHolders(key string, now time.Time) (int64, error) {
	var n int64
	err := c.Call("peek", func(ctx context.Context, rdb *redis.Client) error {
		var err error
		n, err = rdb.ZCount(ctx, key, "("+strconv.FormatInt(now.UnixMilli(), 10), "+inf").Result()
		return err
	})
	return n, err
}
