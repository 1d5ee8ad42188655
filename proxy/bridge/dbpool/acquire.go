package dbpool

import (
	"container/list"
	"context"
	"fmt"
	"net"
	"time"
)

type waiter struct {
	key     string
	since   time.Time
	ready   chan grant // buffered; written once, under the pool's lock
	elem    *list.Element
	granted bool
}

// grant is what a waiter (or an acquirer served at once) is given.
type grant struct {
	conn *Conn // a kept connection for the waiter's key; nil: a slot to dial in
	err  error
}

// Acquire lends the caller an upstream connection for a session whose login
// is key ("" never matches a kept connection): a kept idle one with the same
// key, or a new one dialed in a free slot. Without room it waits, first in
// first out, for at most wait (0: not at all), calling waiting (if not nil)
// once just before it starts to. It returns how long it waited. Refusals are
// *WaitTimeout, ErrClosed, *DialError or ctx's error.
func (p *Pool) Acquire(ctx context.Context, key string, wait time.Duration, waiting func()) (*Conn, time.Duration, error) {
	start := p.clk.Now()
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil, 0, ErrClosed
	}
	if p.waiters.Len() == 0 {
		if g, ok := p.takeLocked(key); ok {
			p.mu.Unlock()
			c, err := p.connect(ctx, key, g)
			return c, 0, err
		}
	}
	if wait <= 0 {
		max := p.cfg.Max
		p.mu.Unlock()
		return nil, 0, &WaitTimeout{Pool: p.cfg.Name, Max: max}
	}
	w := &waiter{key: key, since: start, ready: make(chan grant, 1)}
	w.elem = p.waiters.PushBack(w)
	p.mu.Unlock()
	if waiting != nil {
		waiting()
	}

	t := p.clk.NewTimer(wait)
	defer t.Stop()
	var g grant
	got := false
	select {
	case g = <-w.ready:
		got = true
	case <-t.C():
	case <-ctx.Done():
	}
	if !got {
		p.mu.Lock()
		if w.granted {
			// Served while giving up: take it rather than waste the turn.
			g, got = <-w.ready, true
		} else {
			p.waiters.Remove(w.elem)
		}
		max := p.cfg.Max
		p.mu.Unlock()
		if !got {
			waited := p.clk.Now().Sub(start)
			if err := ctx.Err(); err != nil {
				return nil, waited, fmt.Errorf("bridge %s: wait abandoned: %w", p.cfg.Name, context.Cause(ctx))
			}
			return nil, waited, &WaitTimeout{Pool: p.cfg.Name, Max: max, Waited: waited}
		}
	}
	waited := p.clk.Now().Sub(start)
	if g.err != nil {
		return nil, waited, g.err
	}
	if ctx.Err() != nil {
		p.giveBack(g)
		return nil, waited, fmt.Errorf("bridge %s: wait abandoned: %w", p.cfg.Name, context.Cause(ctx))
	}
	c, err := p.connect(ctx, key, g)
	return c, waited, err
}

// connect turns a grant into a connection: the kept one if it is still
// alive, else a new dial in the same slot.
func (p *Pool) connect(ctx context.Context, key string, g grant) (*Conn, error) {
	if g.conn != nil {
		if alive(g.conn.nc) {
			g.conn.reused = true
			return g.conn, nil
		}
		// The server closed it while it was kept: its slot is ours.
		g.conn.nc.Close()
	}
	p.mu.Lock()
	d, addr, name := p.dialer, p.cfg.Addr, p.cfg.Name
	p.mu.Unlock()
	nc, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		p.releaseSlot()
		return nil, &DialError{Pool: name, Addr: addr, Err: err}
	}
	tc, ok := nc.(*net.TCPConn)
	if !ok {
		nc.Close()
		p.releaseSlot()
		return nil, &DialError{Pool: name, Addr: addr, Err: fmt.Errorf("not a TCP connection: %T", nc)}
	}
	return &Conn{pool: p, nc: tc, born: p.clk.Now(), key: key}, nil
}

// giveBack returns a grant its waiter no longer wants.
func (p *Pool) giveBack(g grant) {
	if g.conn != nil {
		p.Put(g.conn)
		return
	}
	p.releaseSlot()
}

// takeLocked serves key at once if it can: a kept connection for key (the
// most recently used), else a free slot, else the slot of the least recently
// used connection kept for another key, which is closed.
func (p *Pool) takeLocked(key string) (grant, bool) {
	if key != "" {
		for e := p.idle.Back(); e != nil; e = e.Prev() {
			if c := e.Value.(*Conn); c.key == key {
				return grant{conn: p.unkeepLocked(c)}, true
			}
		}
	}
	if p.live < p.cfg.Max {
		p.live++
		return grant{}, true
	}
	if e := p.idle.Front(); e != nil {
		// Closing a socket does not block; the slot passes to the caller.
		p.unkeepLocked(e.Value.(*Conn)).closeNet()
		return grant{}, true
	}
	return grant{}, false
}

// dispatchLocked serves waiters from the head for as long as there is room.
func (p *Pool) dispatchLocked() {
	for e := p.waiters.Front(); e != nil; e = p.waiters.Front() {
		w := e.Value.(*waiter)
		g, ok := p.takeLocked(w.key)
		if !ok {
			return
		}
		p.waiters.Remove(e)
		w.granted = true
		w.ready <- g
	}
}

func (p *Pool) releaseSlot() {
	p.mu.Lock()
	p.live--
	p.dispatchLocked()
	p.mu.Unlock()
}
