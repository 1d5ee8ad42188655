package connpool

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/warden-dev/warden/internal/rawio"
)

// Config is the settings of one pool.
type Config struct {
	Addr string // host:port to dial; the name is resolved again for every new connection
	// TLS, when set, makes the pool originate TLS. It is shared, never
	// modified: the pool uses a copy with ServerName set.
	TLS *tls.Config
	// ServerName is the name the upstream's certificate must carry (SNI);
	// empty uses TLS.ServerName.
	ServerName string
	// MaxConns caps the connections open at once; further exchanges wait
	// for one until their deadline. 0 means no cap.
	MaxConns int
	// IdleTimeout closes connections idle this long; 0 keeps them until
	// MaxLifetime.
	IdleTimeout time.Duration
	// DialTimeout bounds dialling (and the TLS handshake) for an exchange
	// without deadline; 0 means 10 s.
	DialTimeout time.Duration
	// MaxLifetime retires a connection this old when it is next released,
	// so a changed DNS answer is used by new connections. 0 means
	// DefaultMaxLifetime.
	MaxLifetime time.Duration
}

// DefaultMaxLifetime is how long a connection is reused before it is
// replaced by a freshly resolved one.
const DefaultMaxLifetime = 5 * time.Minute

func (c Config) equal(o Config) bool {
	return c.Addr == o.Addr && c.TLS == o.TLS && c.ServerName == o.ServerName && c.MaxConns == o.MaxConns &&
		c.IdleTimeout == o.IdleTimeout && c.MaxLifetime == o.MaxLifetime && c.DialTimeout == o.DialTimeout
}

// Pool is the connections to one upstream address.
type Pool struct {
	cfg Config
	tls *tls.Config // cfg.TLS with ServerName applied; nil for plain TCP
	set *Set
	// idleTicks and lifeTicks are the limits in janitor ticks.
	idleTicks, lifeTicks int64

	mu      sync.Mutex
	idle    []*Conn // LIFO: the warmest connection is reused first
	count   int     // connections open or being dialled
	waiters []*waiter
	closed  bool
	dynamic atomic.Bool // created on demand; dropped by the janitor once empty
	unused  int64       // janitor ticks a dynamic pool has been empty; janitor only
}

type waiter struct {
	// ch receives a connection to use, or nil meaning "a slot is yours,
	// dial".
	ch chan *Conn
}

// errPoolWait is wrapped when the deadline passes while waiting for a slot.
var errPoolWait = errors.New("all connections busy (max_connections) until the deadline")

// errWaitCancelled is wrapped when the request's Wait ends first.
var errWaitCancelled = errors.New("wait for a free connection (max_connections) cancelled")

// Config returns the pool's settings.
func (p *Pool) Config() Config { return p.cfg }

// acquire returns a connection for one exchange: an idle one that is still
// alive, a new one while under MaxConns, or else the first one released
// before deadline or the end of wait.
func (p *Pool) acquire(deadline time.Time, wait context.Context) (*Conn, error) {
	for {
		p.mu.Lock()
		if n := len(p.idle); n > 0 {
			c := p.idle[n-1]
			p.idle[n-1] = nil
			p.idle = p.idle[:n-1]
			p.mu.Unlock()
			if p.usable(c) {
				c.reused = true
				return c, nil
			}
			p.discard(c)
			continue
		}
		if p.cfg.MaxConns <= 0 || p.count < p.cfg.MaxConns {
			p.count++
			p.mu.Unlock()
			return p.dialSlot(deadline)
		}
		w := &waiter{ch: make(chan *Conn, 1)}
		p.waiters = append(p.waiters, w)
		p.mu.Unlock()
		c, ok, err := p.wait(w, deadline, wait)
		if err != nil {
			return nil, err
		}
		if !ok {
			return p.dialSlot(deadline)
		}
		if p.usable(c) {
			c.reused = true
			return c, nil
		}
		p.discard(c)
	}
}

// wait blocks until w is served, the deadline passes or ctx ends. ok is
// false when w was handed a slot rather than a connection.
func (p *Pool) wait(w *waiter, deadline time.Time, ctx context.Context) (c *Conn, ok bool, err error) {
	var timeout <-chan time.Time
	if !deadline.IsZero() {
		t := time.NewTimer(time.Until(deadline))
		defer t.Stop()
		timeout = t.C
	}
	var ended <-chan struct{}
	if ctx != nil {
		ended = ctx.Done()
	}
	kind, cause := KindTimeout, errPoolWait
	select {
	case c = <-w.ch:
		return c, c != nil, nil
	case <-timeout:
	case <-ended:
		if !errors.Is(ctx.Err(), context.DeadlineExceeded) {
			// Not the upstream's fault: a breaker must not count it.
			kind, cause = KindClient, fmt.Errorf("%w: %w", errWaitCancelled, context.Cause(ctx))
		}
	}
	p.mu.Lock()
	for i, x := range p.waiters {
		if x == w {
			p.waiters = append(p.waiters[:i], p.waiters[i+1:]...)
			p.mu.Unlock()
			return nil, false, wrap(kind, "wait for a connection to", p.cfg.Addr, cause)
		}
	}
	p.mu.Unlock()
	// Served while the timer fired: the grant is ours, use it.
	c = <-w.ch
	return c, c != nil, nil
}

func (p *Pool) dialSlot(deadline time.Time) (*Conn, error) {
	c, err := p.dial(deadline)
	if err != nil {
		p.freeSlot()
		return nil, err
	}
	return c, nil
}

// usable reports whether an idle connection may carry another exchange.
// Every connection is peeked at before reuse, however briefly it was idle:
// bytes an upstream writes unasked after its answer (a buggy or hostile
// one writes a second response a few milliseconds later) would otherwise
// be read as the answer to the next request, which may be another
// client's. The peek is one non-blocking system call per reused exchange.
// What arrives after the peek, while the next request is on its way, no
// HTTP/1.1 client can tell from an answer.
func (p *Pool) usable(c *Conn) bool {
	now := p.set.ticks()
	if now-c.born >= p.lifeTicks || (p.idleTicks > 0 && now-c.idleFrom >= p.idleTicks) {
		return false
	}
	switch c.idleState() {
	case rawio.PeekNothing, rawio.PeekUnknown:
		return true
	case rawio.PeekData:
		p.set.countUnrequested()
	}
	return false
}

// release returns c after an exchange. reuse is false when the exchange
// left the connection in an unknown state or the upstream asked to close.
func (p *Pool) release(c *Conn, reuse bool) {
	// Bytes already read past the end of the response (a body after a HEAD
	// answer, more than Content-Length) are nobody's answer: reused, the
	// connection would hand them to the next client as its response, and
	// every response after that to the client after. Checked here as well
	// as in usable, because here it costs no system call.
	if reuse && c.br.Buffered() > 0 {
		p.set.countUnrequested()
		reuse = false
	}
	now, at := p.set.ticks(), p.set.clk.Now()
	p.mu.Lock()
	if reuse && !p.closed && now-c.born < p.lifeTicks {
		c.idleFrom, c.idleAt = now, at
		if len(p.waiters) > 0 {
			w := p.popWaiterLocked()
			p.mu.Unlock()
			w.ch <- c
			return
		}
		c.reused = false
		p.idle = append(p.idle, c)
		p.mu.Unlock()
		return
	}
	p.mu.Unlock()
	p.discard(c)
}

// discard closes c and frees its slot.
func (p *Pool) discard(c *Conn) {
	c.close()
	p.freeSlot()
}

// freeSlot gives a connection slot to the first waiter, or back to the pool.
func (p *Pool) freeSlot() {
	p.mu.Lock()
	if len(p.waiters) > 0 {
		w := p.popWaiterLocked()
		p.mu.Unlock()
		w.ch <- nil
		return
	}
	p.count--
	p.mu.Unlock()
}

func (p *Pool) popWaiterLocked() *waiter {
	w := p.waiters[0]
	copy(p.waiters, p.waiters[1:])
	p.waiters[len(p.waiters)-1] = nil
	p.waiters = p.waiters[:len(p.waiters)-1]
	return w
}

// reap closes idle connections past their idle timeout or lifetime and
// reports whether the pool is empty (no connection open, nobody waiting).
func (p *Pool) reap(now int64) (empty bool) {
	var doomed []*Conn
	p.mu.Lock()
	kept := p.idle[:0]
	for _, c := range p.idle {
		if now-c.born >= p.lifeTicks || (p.idleTicks > 0 && now-c.idleFrom >= p.idleTicks) {
			doomed = append(doomed, c)
			continue
		}
		kept = append(kept, c)
	}
	for i := len(kept); i < len(p.idle); i++ {
		p.idle[i] = nil
	}
	p.idle = kept
	p.count -= len(doomed)
	empty = p.count == 0 && len(p.waiters) == 0
	p.mu.Unlock()
	for _, c := range doomed {
		c.close()
	}
	return empty
}

// close stops reusing connections: idle ones are closed now, busy ones when
// their exchange releases them. Exchanges may still start on a closed pool
// (a request that picked it before a reload); their connections are closed
// after use.
func (p *Pool) close() {
	p.mu.Lock()
	p.closed = true
	idle := p.idle
	p.idle = nil
	p.count -= len(idle)
	p.mu.Unlock()
	for _, c := range idle {
		c.close()
	}
}

// Stats is a pool's occupancy.
type Stats struct {
	Open, Idle, Waiting int
}

// Stats reports the pool's occupancy.
func (p *Pool) Stats() Stats {
	p.mu.Lock()
	defer p.mu.Unlock()
	return Stats{Open: p.count, Idle: len(p.idle), Waiting: len(p.waiters)}
}
