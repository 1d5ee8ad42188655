package dbpool

import (
	"container/list"
	"net"
	"sync/atomic"
	"time"

	"github.com/warden-dev/warden/governor/clock"
)

// Conn is one upstream connection, owned by its pool and lent to one client
// session at a time.
type Conn struct {
	pool   *Pool
	nc     *net.TCPConn
	born   time.Time
	key    string
	reused bool
	done   atomic.Bool // closed and its slot released

	// Payload is what the protocol layer keeps with the connection across
	// sessions (for Postgres: what the server said at login, replayed to the
	// next client with the same key).
	Payload any

	// Kept-idle state, under pool.mu.
	elem      *list.Element
	timer     clock.Timer
	idleSince time.Time
	idleGen   uint64 // bumped whenever the connection leaves the kept list
}

// Net is the upstream socket.
func (c *Conn) Net() *net.TCPConn { return c.nc }

// Born is when the upstream connection was dialed.
func (c *Conn) Born() time.Time { return c.born }

// Key is the login the connection was made for ("": never reused).
func (c *Conn) Key() string { return c.key }

// Reused reports whether the connection was kept from an earlier session
// rather than dialed for this one.
func (c *Conn) Reused() bool { return c.reused }

// Close closes the upstream connection and frees its slot, admitting the
// next waiter. It is safe to call more than once and from any goroutine.
func (c *Conn) Close() {
	if c.done.CompareAndSwap(false, true) {
		c.nc.Close()
		c.pool.releaseSlot()
	}
}

// closeNet closes the socket of a connection whose slot the pool accounts
// for itself.
func (c *Conn) closeNet() {
	c.done.Store(true)
	c.nc.Close()
}

// Put gives a connection back after its session ended cleanly; the caller
// vouches that it is reset and fit for the next client with the same key.
// A waiting client is served with it (same key) or with its slot (another
// key); otherwise it is kept until idle_timeout or max_lifetime. A draining
// pool, or one over its Max, closes it instead.
func (p *Pool) Put(c *Conn) {
	if c.done.Load() {
		return
	}
	now := p.clk.Now()
	p.mu.Lock()
	if p.draining || c.key == "" || p.live > p.cfg.Max {
		p.mu.Unlock()
		c.Close()
		return
	}
	if p.cfg.MaxLifetime > 0 && now.Sub(c.born) >= p.cfg.MaxLifetime {
		p.mu.Unlock()
		c.Close()
		p.reaped(ReasonMaxLifetime)
		return
	}
	c.reused = false
	if e := p.waiters.Front(); e != nil {
		w := p.waiters.Remove(e).(*waiter)
		w.granted = true
		if w.key == c.key {
			w.ready <- grant{conn: c}
		} else {
			c.closeNet()
			w.ready <- grant{}
		}
		p.mu.Unlock()
		return
	}
	c.idleSince = now
	c.elem = p.idle.PushBack(c)
	p.armLocked(c)
	p.mu.Unlock()
}

// unkeepLocked takes c off the kept list.
func (p *Pool) unkeepLocked(c *Conn) *Conn {
	p.idle.Remove(c.elem)
	c.elem = nil
	c.idleGen++
	if c.timer != nil {
		c.timer.Stop()
		c.timer = nil
	}
	return c
}

// armLocked sets c's timer for the first of its idle and lifetime limits.
func (p *Pool) armLocked(c *Conn) {
	if c.timer != nil {
		c.timer.Stop()
		c.timer = nil
	}
	var at time.Time
	if t := p.cfg.IdleTimeout; t > 0 {
		at = c.idleSince.Add(t)
	}
	if t := p.cfg.MaxLifetime; t > 0 {
		if l := c.born.Add(t); at.IsZero() || l.Before(at) {
			at = l
		}
	}
	if at.IsZero() {
		return
	}
	gen := c.idleGen
	c.timer = p.clk.AfterFuncAt(at, func() { p.expire(c, gen) })
}

// expire closes a kept connection whose idle or lifetime limit has come.
func (p *Pool) expire(c *Conn, gen uint64) {
	now := p.clk.Now()
	p.mu.Lock()
	if c.elem == nil || c.idleGen != gen {
		p.mu.Unlock()
		return
	}
	reason := ""
	switch {
	case p.cfg.MaxLifetime > 0 && now.Sub(c.born) >= p.cfg.MaxLifetime:
		reason = ReasonMaxLifetime
	case p.cfg.IdleTimeout > 0 && now.Sub(c.idleSince) >= p.cfg.IdleTimeout:
		reason = ReasonIdle
	default:
		p.armLocked(c) // settings changed since it was armed
		p.mu.Unlock()
		return
	}
	p.unkeepLocked(c)
	p.live--
	p.dispatchLocked()
	p.mu.Unlock()
	c.closeNet()
	p.reaped(reason)
}

func (p *Pool) reaped(reason string) {
	if p.OnReap != nil {
		p.OnReap(reason)
	}
}
