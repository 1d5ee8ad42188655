// Package dbpool owns the upstream connections of one database bridge.
//
// A Pool holds at most Max live upstream connections — being dialed, attached
// to a client, or idle and kept for reuse. Clients that find no room wait in
// a FIFO queue for at most their wait timeout. Connections are owned by the
// pool and lent to clients: a client session either gives its connection
// back with Put (the protocol layer has reset it and vouches that the next
// client may use it) or ends it with Close. Session pooling hands a kept
// connection only to a client whose key (its login, as the protocol layer
// defines it) matches; transaction pooling would lend the same connections
// per transaction instead of per session without changing this ownership.
package dbpool

import (
	"container/list"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/warden-dev/warden/governor/clock"
)

// Config is one pool's settings; Reconfigure changes them in place.
type Config struct {
	Name        string        // the bridge, for errors
	Addr        string        // upstream host:port
	Max         int           // live upstream connections at most
	IdleTimeout time.Duration // close a kept idle connection unused this long (0: never)
	MaxLifetime time.Duration // close a kept connection older than this (0: never)
	DialTimeout time.Duration // 0: 10s
	KeepAlive   net.KeepAliveConfig
}

// Reasons the pool gives OnReap when it closes a kept idle connection.
const (
	ReasonIdle        = "idle"
	ReasonMaxLifetime = "max_lifetime"
)

// ErrClosed is returned to acquirers of a pool that was closed (its bridge
// was removed or warden is shutting down).
var ErrClosed = errors.New("bridge closed")

// WaitTimeout is the refusal of a client that waited its whole wait timeout
// without getting a connection.
type WaitTimeout struct {
	Pool   string
	Max    int
	Waited time.Duration
}

func (e *WaitTimeout) Error() string {
	return fmt.Sprintf("bridge %s: no upstream connection free after waiting %s (max_connections %d)",
		e.Pool, e.Waited.Round(time.Millisecond), e.Max)
}

// DialError is a failure to connect to the upstream after a slot was won.
type DialError struct {
	Pool, Addr string
	Err        error
}

func (e *DialError) Error() string {
	return fmt.Sprintf("bridge %s: connect to upstream %s: %v", e.Pool, e.Addr, e.Err)
}

func (e *DialError) Unwrap() error { return e.Err }

// Pool is the connection owner of one bridge.
type Pool struct {
	clk clock.Clock
	// OnReap is told of every kept idle connection the pool closes because
	// of idle_timeout or max_lifetime. Set it before use.
	OnReap func(reason string)

	mu       sync.Mutex
	cfg      Config
	dialer   net.Dialer
	live     int       // slots held: dialing, attached or kept idle
	waiters  list.List // *waiter, oldest first
	idle     list.List // *Conn kept for reuse, least recently put first
	draining bool      // Put closes instead of keeping
	closed   bool      // no acquisitions, waiters refused
}

// New returns an empty pool.
func New(cfg Config, clk clock.Clock) *Pool {
	p := &Pool{clk: clk}
	p.setConfigLocked(cfg)
	return p
}

func (p *Pool) setConfigLocked(cfg Config) {
	if cfg.DialTimeout <= 0 {
		cfg.DialTimeout = 10 * time.Second
	}
	p.cfg = cfg
	p.dialer = net.Dialer{Timeout: cfg.DialTimeout, KeepAliveConfig: cfg.KeepAlive}
}

// Reconfigure applies new settings. A larger Max admits waiters at once; a
// smaller one closes kept idle connections beyond it and admits no one until
// live connections drop below it. Connections in use are never cut.
func (p *Pool) Reconfigure(cfg Config) {
	p.mu.Lock()
	p.setConfigLocked(cfg)
	var drop []*Conn
	for p.live > p.cfg.Max && p.idle.Len() > 0 {
		drop = append(drop, p.unkeepLocked(p.idle.Front().Value.(*Conn)))
		p.live--
	}
	for e := p.idle.Front(); e != nil; e = e.Next() {
		p.armLocked(e.Value.(*Conn))
	}
	p.dispatchLocked()
	p.mu.Unlock()
	closeAll(drop)
}

// Drain stops keeping connections: kept ones are closed now and connections
// given back later are closed too. Waiters are still served. Used when a
// bridge moves to another upstream and this pool only winds down.
func (p *Pool) Drain() {
	p.mu.Lock()
	p.draining = true
	drop := p.dropIdleLocked()
	p.dispatchLocked()
	p.mu.Unlock()
	closeAll(drop)
}

// Close drains the pool and refuses every waiter and every later
// acquisition with ErrClosed. Connections in use stay open until their
// sessions end them.
func (p *Pool) Close() {
	p.mu.Lock()
	p.draining, p.closed = true, true
	drop := p.dropIdleLocked()
	for e := p.waiters.Front(); e != nil; e = p.waiters.Front() {
		w := p.waiters.Remove(e).(*waiter)
		w.granted = true
		w.ready <- grant{err: ErrClosed}
	}
	p.mu.Unlock()
	closeAll(drop)
}

func (p *Pool) dropIdleLocked() []*Conn {
	var drop []*Conn
	for e := p.idle.Front(); e != nil; e = p.idle.Front() {
		drop = append(drop, p.unkeepLocked(e.Value.(*Conn)))
		p.live--
	}
	return drop
}

// Stats is a pool's state at one moment.
type Stats struct {
	Max        int
	Live       int           // slots held: dialing, attached or kept idle
	Kept       int           // idle connections kept for reuse (part of Live)
	Waiting    int           // clients in the queue
	OldestWait time.Duration // how long the head of the queue has waited
}

// Stats reports the pool's state at now.
func (p *Pool) Stats(now time.Time) Stats {
	p.mu.Lock()
	defer p.mu.Unlock()
	st := Stats{Max: p.cfg.Max, Live: p.live, Kept: p.idle.Len(), Waiting: p.waiters.Len()}
	if e := p.waiters.Front(); e != nil {
		if d := now.Sub(e.Value.(*waiter).since); d > 0 {
			st.OldestWait = d
		}
	}
	return st
}

// DropDead closes the kept connections the server has closed meanwhile
// (pg_terminate_backend, a restart) and frees their slots: without an
// idle_timeout or max_lifetime nothing else would notice them before they
// are next lent, and they would count as live. It peeks at each kept
// connection, one system call each, so callers run it where the pool is
// looked at (/v1/bridges, a metrics scrape), not per session.
func (p *Pool) DropDead() {
	var dead []*Conn
	p.mu.Lock()
	for e := p.idle.Front(); e != nil; {
		next := e.Next()
		if c := e.Value.(*Conn); !alive(c.nc) {
			dead = append(dead, p.unkeepLocked(c))
			p.live--
		}
		e = next
	}
	if len(dead) > 0 {
		p.dispatchLocked()
	}
	p.mu.Unlock()
	closeAll(dead)
}

func closeAll(cs []*Conn) {
	for _, c := range cs {
		c.closeNet()
	}
}
