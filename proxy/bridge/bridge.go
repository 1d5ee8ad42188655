package bridge

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/warden-dev/warden/internal/accept"
	"github.com/warden-dev/warden/policy"
	"github.com/warden-dev/warden/proxy/bridge/dbpool"
)

const protocolPostgres = policy.ProtocolPostgres

var errDeadline = os.ErrDeadlineExceeded

// generation is a bridge's settings under one policy. A reload that changes
// a bridge starts a new generation: new clients get it, sessions keep the
// one they started under until they end.
type generation struct {
	cfg    policy.Bridge
	pool   *dbpool.Pool
	logins *loginCache // password-less logins of this pool's upstream
}

// bridge is one listener in front of one database, across reloads.
type bridge struct {
	name string
	set  *Set
	log  *slog.Logger

	mu          sync.Mutex
	gen         *generation
	ln          *accept.Listener
	accepting   chan struct{}  // closed when the accept loop of ln has returned
	pools       []*dbpool.Pool // every pool with sessions of this bridge: the current one last
	sessions    map[*session]struct{}
	handshaking map[*net.TCPConn]struct{} // accepted, not yet a session
	cancels     map[string]*cancelTarget
	closing     cause // causeRemoved or causeShutdown once retired
	changed     chan struct{}

	handlers sync.WaitGroup // one per accepted connection
	reaped   map[string]*reapCount
	waitHist prometheus.Observer
}

type reapCount struct {
	n uint64
	c prometheus.Counter
}

func newBridge(set *Set, cfg policy.Bridge) *bridge {
	b := &bridge{
		name: cfg.Name, set: set, log: set.opts.Log.With("bridge", cfg.Name),
		sessions: map[*session]struct{}{}, handshaking: map[*net.TCPConn]struct{}{},
		cancels: map[string]*cancelTarget{}, changed: make(chan struct{}),
		reaped:   map[string]*reapCount{},
		waitHist: set.opts.Metrics.BridgeWait.WithLabelValues(cfg.Name),
	}
	for _, r := range Reasons {
		b.reaped[r] = &reapCount{c: set.opts.Metrics.BridgeReaped.WithLabelValues(cfg.Name, r)}
	}
	return b
}

func (b *bridge) poolConfig(cfg policy.Bridge) dbpool.Config {
	return dbpool.Config{
		Name: cfg.Name, Addr: cfg.Upstream, Max: cfg.MaxConnections,
		IdleTimeout: cfg.IdleTimeout, MaxLifetime: cfg.MaxLifetime,
		DialTimeout: b.set.opts.DialTimeout, KeepAlive: b.set.opts.KeepAlive,
	}
}

func (b *bridge) newPool(cfg policy.Bridge) *dbpool.Pool {
	p := dbpool.New(b.poolConfig(cfg), b.set.clk)
	p.OnReap = func(reason string) {
		b.countReap(reason, "connection", "kept upstream connection, no client")
		b.notify()
	}
	return p
}

// start binds the listener and serves the first generation.
func (b *bridge) start(cfg policy.Bridge) error {
	ln, err := b.set.listen(cfg.Listen)
	if err != nil {
		return err
	}
	g := &generation{cfg: cfg, pool: b.newPool(cfg), logins: newLoginCache()}
	b.mu.Lock()
	b.gen, b.pools = g, []*dbpool.Pool{g.pool}
	b.serveLocked(ln)
	b.mu.Unlock()
	b.log.Info("bridge listening", "listen", ln.Addr().String(), "upstream", cfg.Upstream,
		"protocol", cfg.Protocol, "max_connections", cfg.MaxConnections)
	return nil
}

// reconfigure moves the bridge to cfg. Sessions keep running under their
// old settings; new clients get the new ones. The cap stays one cap: with
// the same upstream the pool is kept (its connections in use count against
// the new max_connections); a new upstream gets a new pool and the old one
// winds down with its sessions.
func (b *bridge) reconfigure(cfg policy.Bridge) error {
	b.mu.Lock()
	old := b.gen
	b.mu.Unlock()
	if sameSettings(old.cfg, cfg) {
		return nil
	}
	var ln net.Listener
	if cfg.Listen != old.cfg.Listen {
		var err error
		if ln, err = b.set.listen(cfg.Listen); err != nil {
			return err // the bridge keeps its running settings
		}
	}
	g := &generation{cfg: cfg, pool: old.pool, logins: old.logins}
	if cfg.Upstream == old.cfg.Upstream && cfg.Protocol == old.cfg.Protocol {
		old.pool.Reconfigure(b.poolConfig(cfg))
	} else {
		g.pool, g.logins = b.newPool(cfg), newLoginCache()
		old.pool.Drain()
	}
	b.mu.Lock()
	b.gen = g
	if g.pool != old.pool {
		b.pools = append(b.prunePoolsLocked(), g.pool)
	}
	var oldLn *accept.Listener
	var oldAccepting chan struct{}
	if ln != nil {
		oldLn, oldAccepting = b.ln, b.accepting
		b.serveLocked(ln)
	}
	b.mu.Unlock()
	if oldLn != nil {
		_ = oldLn.Close()
		<-oldAccepting
	}
	b.log.Info("bridge reconfigured; running sessions keep their settings", "listen", cfg.Listen,
		"upstream", cfg.Upstream, "protocol", cfg.Protocol, "max_connections", cfg.MaxConnections)
	return nil
}

// prunePoolsLocked drops pools of earlier upstreams that have nothing
// left: no connection, no waiter.
func (b *bridge) prunePoolsLocked() []*dbpool.Pool {
	now := b.set.clk.Now()
	kept := b.pools[:0]
	for _, p := range b.pools {
		p.DropDead()
		if st := p.Stats(now); p == b.gen.pool || st.Live > 0 || st.Waiting > 0 {
			kept = append(kept, p)
		}
	}
	return kept
}

// sameSettings compares two bridge settings, ignoring where they were written.
func sameSettings(a, b policy.Bridge) bool {
	a.Pos, b.Pos = policy.Position{}, policy.Position{}
	return a == b
}

// serveLocked serves ln. Its temporary accept errors (out of descriptors
// and the like) are retried by accept.Listener, logged once per burst and
// counted under the listener "bridge:<name>", and make Ready fail
// meanwhile.
func (b *bridge) serveLocked(ln net.Listener) {
	name := "bridge:" + b.name
	al := accept.New(ln, accept.Options{Name: name, Clock: b.set.clk, Log: b.log,
		Errors: b.set.opts.Metrics.ListenerAcceptErrors.WithLabelValues(name)})
	done := make(chan struct{})
	b.ln, b.accepting = al, done
	go func() {
		defer close(done)
		b.acceptLoop(al)
	}()
}

// ready is nil while the bridge's listener accepts, else why not.
func (b *bridge) ready() error {
	b.mu.Lock()
	ln := b.ln
	b.mu.Unlock()
	if ln == nil {
		return nil
	}
	if err := ln.Err(); err != nil {
		return fmt.Errorf("listener %s not accepting: %w", ln.Addr(), err)
	}
	return nil
}

// acceptLoop serves ln until it is closed: it never ends before.
func (b *bridge) acceptLoop(ln *accept.Listener) {
	backoff := time.Duration(0)
	for {
		c, err := ln.Accept()
		if err != nil {
			if ln.Closed() || errors.Is(err, net.ErrClosed) {
				return
			}
			// An error accept.Listener does not take for temporary:
			// back off all the same, do not spin, and never give up.
			backoff = accept.Backoff(backoff)
			b.log.Error("accept failed", "err", err, "retry_in", backoff)
			t := b.set.clk.NewTimer(backoff)
			select {
			case <-t.C():
			case <-ln.Done():
				t.Stop()
				return
			}
			continue
		}
		backoff = 0
		tc, ok := c.(*net.TCPConn)
		if !ok || !b.track(tc) {
			_ = c.Close()
			continue
		}
		go b.handle(tc)
	}
}

// track notes a new client; false once the bridge is retired.
func (b *bridge) track(c *net.TCPConn) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closing != causeNone {
		return false
	}
	b.handlers.Add(1)
	b.handshaking[c] = struct{}{}
	return true
}

func (b *bridge) handle(c *net.TCPConn) {
	defer b.handlers.Done()
	b.mu.Lock()
	g := b.gen
	b.mu.Unlock()
	if g.cfg.Protocol == protocolPostgres {
		b.servePostgres(c, g)
	} else {
		b.serveTCP(c, g)
	}
	b.mu.Lock()
	delete(b.handshaking, c)
	b.mu.Unlock()
}

// serveTCP runs one client of a protocol-blind bridge.
func (b *bridge) serveTCP(c *net.TCPConn, g *generation) {
	conn, early, err := b.acquire(c, g, "", nil)
	if err != nil {
		b.refuseAcquire(c, g, "", err)
		return
	}
	b.newSession(g, c, conn, false).run(nil, early)
}

func (b *bridge) register(s *session) {
	b.mu.Lock()
	delete(b.handshaking, s.cl)
	b.sessions[s] = struct{}{}
	closing := b.closing
	b.mu.Unlock()
	if closing != causeNone {
		s.closeWhenIdle(closing)
	}
	b.notify()
}

func (b *bridge) unregister(s *session) {
	b.mu.Lock()
	delete(b.sessions, s)
	delete(b.cancels, s.cancel)
	b.mu.Unlock()
}

// countReap logs one reap and counts it by reason (README: every reap is
// logged and counted); attrs say what was reaped.
func (b *bridge) countReap(reason string, attrs ...any) {
	b.log.Info("connection reaped", append([]any{"reason", reason}, attrs...)...)
	b.mu.Lock()
	rc := b.reaped[reason]
	rc.n++
	b.mu.Unlock()
	rc.c.Inc()
}

// notify wakes everyone waiting for the bridge's state to change.
func (b *bridge) notify() {
	b.mu.Lock()
	close(b.changed)
	b.changed = make(chan struct{})
	b.mu.Unlock()
}

// retire stops the bridge for cause (removed from the policy, or shutdown):
// no more clients, waiters refused, kept connections closed, idle sessions
// closed now and the others at their next idle moment (a transaction in
// progress finishes first).
func (b *bridge) retire(c cause) {
	b.mu.Lock()
	if b.closing != causeNone {
		b.mu.Unlock()
		return
	}
	b.closing = c
	for hc := range b.handshaking {
		_ = hc.SetReadDeadline(aLongTimeAgo) // a half-sent startup ends here
	}
	pools := append([]*dbpool.Pool(nil), b.pools...)
	sessions := b.sessionList()
	b.mu.Unlock()
	b.stopAccepting()
	for _, p := range pools {
		p.Close()
	}
	for _, s := range sessions {
		s.closeWhenIdle(c)
	}
	b.notify()
}

// stopAccepting closes the listener, so new clients are refused, and waits
// for the accept loop to return; clients already accepted are served on.
func (b *bridge) stopAccepting() {
	b.mu.Lock()
	ln, accepting := b.ln, b.accepting
	b.ln = nil
	b.mu.Unlock()
	if ln != nil {
		_ = ln.Close()
		<-accepting
	}
}

// forceClose ends every session and client now: shutdown_grace is over.
func (b *bridge) forceClose() {
	b.mu.Lock()
	sessions := b.sessionList()
	for hc := range b.handshaking {
		_ = hc.Close()
	}
	b.mu.Unlock()
	for _, s := range sessions {
		s.hurry.Store(true)
		s.end(causeShutdown)
	}
}

func (b *bridge) sessionList() []*session {
	out := make([]*session, 0, len(b.sessions))
	for s := range b.sessions {
		out = append(out, s)
	}
	return out
}

// drained waits until every client of a retired bridge is gone, or ctx ends.
func (b *bridge) drained(ctx context.Context) error {
	done := make(chan struct{})
	go func() {
		b.handlers.Wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		b.forceClose()
		<-done // every loop unblocks once its sockets are closed
		return ctx.Err()
	}
}

func (b *bridge) closingWhy() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closing == causeShutdown {
		return "warden is shutting down"
	}
	return "it was removed from the policy"
}
