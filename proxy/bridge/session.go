package bridge

import (
	"bufio"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/warden-dev/warden/governor/clock"
	"github.com/warden-dev/warden/internal/rawio"
	"github.com/warden-dev/warden/proxy/bridge/dbpool"
)

// Buffer sizes of a session's two copy loops. Results flow server→client
// and can be large; queries are usually small.
const (
	c2sBufSize   = 16 << 10
	s2cBufSize   = 32 << 10
	loginBufSize = 8 << 10 // frames during login and reset are small
)

// farewellTimeout bounds how long an ending session may take to deliver
// its last error to a client that does not read, and to drain what the
// client still sends before closing (closing with unread input would reset
// the connection and could destroy the error before the client reads it).
const farewellTimeout = time.Second

// aLongTimeAgo is a deadline in the past: it interrupts a blocked read.
var aLongTimeAgo = time.Unix(1, 0)

// Session states.
const (
	stBusy     = iota // executing, logging in, or sending (tcp: bytes moved recently)
	stIdle            // between transactions (tcp: quiet)
	stIdleInTx        // postgres: inside a transaction, waiting for the client
)

// session is one client attached to one upstream connection until either
// side leaves or the bridge reaps it. Two goroutines copy bytes, one per
// direction; every other part (timer, run watch, reloads, stats) only reads
// atomics or calls end.
type session struct {
	b        *bridge
	g        *generation // the settings the session started under
	clk      clock.Clock
	pg       bool
	cl       *net.TCPConn
	up       *dbpool.Conn
	upNet    *net.TCPConn
	clIO     net.Conn // the data path's reads and writes of cl and upNet
	upIO     net.Conn
	born     time.Time // of the upstream connection
	key      string    // login key for reuse; "" never reused
	runID    string
	runEnded <-chan struct{} // closed when the bound run ends; nil if unbound
	bufs     *buffers

	// Written by the copy loops, read by anyone.
	pending   atomic.Int32  // ReadyForQuery messages the client still awaits
	status    atomic.Uint32 // status byte of the last ReadyForQuery
	lastMove  atomic.Int64  // clock UnixNano of the last traffic that left the session idle (tcp: of any)
	closeIdle atomic.Int32  // a cause to end the session with at its next idle moment

	endOnce sync.Once
	cause   atomic.Int32
	hurry   atomic.Bool           // shutdown_grace is over: no lingering goodbye
	err     atomic.Pointer[error] // detail of a protocol violation
	// The server said it ends the session (an ErrorResponse during login,
	// a FATAL after it), set before that reaches the client: a client that
	// hangs up once it has read it did not vanish, and its EOF may well
	// reach the bridge before the server's close does.
	serverEnding atomic.Bool
	// tcp: the client sent EOF and its half-close was passed upstream; the
	// upstream's reply still flows to it.
	halfClosed atomic.Bool

	timerMu sync.Mutex
	timer   clock.Timer
	done    chan struct{}

	// Owned by the server→client goroutine until it ends.
	bs     backendScanner
	cancel string        // the client's cancel key, published in the bridge
	ct     *cancelTarget // where it leads
	quiet  bool          // the client was answered from the login cache: log in without relaying
	told   []byte        // quiet: the ParameterStatus messages the client was answered with
	// quiet: closed once the login is over; the client's bytes wait for
	// it, to reach the server only if its settings are the ones told.
	loggedIn chan struct{}
	// Set once by the login (or before the loops start, for a reused
	// connection), read when the client terminates.
	trusted atomic.Bool             // the server admitted this login without asking for a password
	welcome atomic.Pointer[welcome] // what a later client with the same key is replayed
	// Owned by the client→server goroutine.
	fs         frontendScanner
	terminated bool
}

// buffers are a session's copy buffers, recycled across sessions.
type buffers struct {
	c2s, s2c, login []byte
	br              *bufio.Reader
}

var bufferPool = sync.Pool{New: func() any {
	return &buffers{
		c2s: make([]byte, c2sBufSize), s2c: make([]byte, s2cBufSize), login: make([]byte, 0, loginBufSize),
		br: bufio.NewReaderSize(nil, loginBufSize),
	}
}}

func (b *bridge) newSession(g *generation, cl *net.TCPConn, up *dbpool.Conn, pg bool) *session {
	s := &session{
		b: b, g: g, clk: b.set.clk, pg: pg, cl: cl, up: up, upNet: up.Net(), born: up.Born(),
		done: make(chan struct{}), bufs: bufferPool.Get().(*buffers),
		clIO: rawio.Wrap(cl), upIO: rawio.Wrap(up.Net()),
	}
	s.bufs.br.Reset(s.upIO)
	return s
}

// run serves the session to its end. startup, if any, is sent upstream
// first as it is (a new connection's login); early is what the client sent
// before the session began, followed like any client traffic.
func (s *session) run(startup, early []byte) {
	s.b.register(s)
	now := s.clk.Now()
	s.lastMove.Store(now.UnixNano())
	s.status.Store('I')
	if len(startup) > 0 {
		if s.pg {
			s.pending.Store(1) // the startup message awaits its ReadyForQuery
		}
		if _, err := s.upIO.Write(startup); err != nil {
			s.end(causeServerClosed)
		}
	}
	var held []byte // quiet: early waits for the login (clientToServer)
	if len(early) > 0 && s.endCause() == causeNone {
		if s.loggedIn != nil {
			held = early
		} else {
			s.forwardClient(early)
		}
	}
	s.rearm(now)
	if s.runEnded != nil {
		go s.watchRun()
	}
	s2c := make(chan struct{})
	go func() {
		defer close(s2c)
		s.serverToClient()
	}()
	s.clientToServer(held)
	<-s2c
	close(s.done)
	s.timerMu.Lock()
	if s.timer != nil {
		s.timer.Stop()
	}
	s.timerMu.Unlock()
	s.finish()
}

// end ends the session for cause c; only the first call counts. Closing the
// upstream connection unblocks both loops; the server→client loop, the
// client's only writer, then says goodbye and closes the client.
func (s *session) end(c cause) {
	s.endOnce.Do(func() {
		s.cause.Store(int32(c))
		if c == causeReuse {
			// Stop the server→client loop but keep the connection.
			_ = s.upNet.SetReadDeadline(aLongTimeAgo)
			return
		}
		s.up.Close() // frees the slot; the server rolls back anything open
		_ = s.cl.SetWriteDeadline(time.Now().Add(farewellTimeout))
		if r := c.reapReason(); r != "" {
			s.b.countReap(r, "run", s.runID)
		}
		s.b.notify()
	})
}

func (s *session) endCause() cause { return cause(s.cause.Load()) }

func (s *session) fail(c cause, err error) {
	s.err.Store(&err)
	s.end(c)
}

func (s *session) detail() error {
	if p := s.err.Load(); p != nil {
		return *p
	}
	return errors.New("unknown")
}

// finish gives the upstream connection back (clean Terminate of a trusted
// login) or closes it, and accounts for the session.
func (s *session) finish() {
	c := s.endCause()
	s.b.unregister(s)
	cancelling := s.ct.end()
	if c == causeReuse && !cancelling && s.resetForReuse() {
		s.up.Payload = s.welcome.Load()
		s.g.pool.Put(s.up)
	} else {
		s.up.Close()
		if s.pg && s.pending.Load() > 0 && c.abandonsStatement() && s.ct != nil {
			if key, addr := s.ct.real.Load(), s.ct.addr; key != nil {
				// Within the session's handler, so the bridge's shutdown
				// waits for it.
				s.b.handlers.Add(1)
				go func() {
					defer s.b.handlers.Done()
					s.b.sendCancel(addr, key)
				}()
			}
		}
	}
	_ = s.cl.Close()
	s.b.notify()
	s.bufs.br.Reset(nil)
	bufferPool.Put(s.bufs)
	s.bufs = nil
}

// clientToServer copies client bytes upstream until the client leaves or the
// session ends; after the end it only drains what the client still sends.
// A quiet session's held bytes go first, once its login checked out.
func (s *session) clientToServer(held []byte) {
	if s.loggedIn != nil {
		<-s.loggedIn
		if len(held) > 0 && s.endCause() == causeNone && !s.forwardClient(held) {
			return
		}
	}
	buf := s.bufs.c2s
	for {
		n, err := s.clIO.Read(buf)
		if n > 0 && s.cause.Load() == int32(causeNone) {
			if !s.forwardClient(buf[:n]) {
				return
			}
		}
		if err != nil {
			if s.halfClose(err) {
				return
			}
			s.end(s.clientEnd(err))
			return
		}
	}
}

// halfClose passes a tcp client's EOF on as a half-close of the upstream
// connection, as a TCP proxy does: a client that shut down its sending side
// (request sent, now reading the reply) is done sending, not gone. The
// upstream's reply keeps flowing to it; the session ends when the upstream
// closes too, or by the reaping rules (idle_timeout) if it never does. It
// reports whether it did so.
func (s *session) halfClose(err error) bool {
	if s.pg || !errors.Is(err, io.EOF) || s.endCause() != causeNone {
		return false
	}
	s.halfClosed.Store(true)
	// This loop, the upstream's only writer, has written its last byte.
	if s.upNet.CloseWrite() != nil {
		s.end(causeServerClosed)
	}
	return true
}

// forwardClient sends one client chunk upstream; false ends the loop.
func (s *session) forwardClient(p []byte) bool {
	if !s.pg {
		s.touch()
	} else {
		rfq, term, err := s.fs.scan(p)
		if err != nil {
			s.fail(causeClientProtocol, err)
			return false
		}
		if rfq != 0 {
			s.addPending(int32(rfq))
		}
		if s.pending.Load() == 0 {
			s.touch() // traffic while idle
		}
		if term != noTerminate {
			s.terminated = true
			if term >= 0 && s.reusable() {
				if term > 0 {
					if _, err := s.upIO.Write(p[:term]); err != nil {
						s.end(causeServerClosed)
						return false
					}
				}
				s.end(causeReuse)
				return false
			}
		}
	}
	if _, err := s.upIO.Write(p); err != nil {
		s.end(causeServerClosed)
		return false
	}
	return true
}

// clientEnd classifies the end of the client's stream.
func (s *session) clientEnd(err error) cause {
	if s.terminated || (!s.pg && errors.Is(err, io.EOF)) {
		return causeClientDone
	}
	return s.clientLost()
}

// clientLost is the cause for a client that left without Terminate, or
// could no longer be written to: it vanished (a reap), unless the server
// had already said it ends the session. Then the session is the server's
// to end, however the two closes reach the bridge: a client reading the
// server's FATAL hangs up at once, often before the bridge has read the
// server's own close.
func (s *session) clientLost() cause {
	if s.serverEnding.Load() {
		return causeServerClosed
	}
	return causeClientGone
}

// serverToClient copies upstream bytes to the client, following the login
// first on a new Postgres connection, until the session ends. It then says
// goodbye to the client if the cause calls for it.
func (s *session) serverToClient() {
	defer s.sayGoodbye()
	if s.pg && !s.up.Reused() && s.welcome.Load() == nil {
		// A server that takes the connection but never finishes the login
		// would hold the slot for ever (PgBouncer: server_connect_timeout):
		// it gets the time a client gets to start.
		_ = s.upNet.SetReadDeadline(time.Now().Add(s.b.set.opts.StartupTimeout))
		err := s.login()
		if err == nil {
			err = s.upNet.SetReadDeadline(time.Time{})
		}
		if err != nil {
			s.loginFailed(err)
		}
		if s.loggedIn != nil {
			close(s.loggedIn) // after loginFailed, which ends the session
		}
		if err != nil {
			return
		}
	}
	// Bytes the login reader took beyond the login go first.
	if n := s.bufs.br.Buffered(); n > 0 {
		p, _ := s.bufs.br.Peek(n)
		ok := s.forwardServer(p)
		s.bufs.br.Discard(n)
		if !ok {
			return
		}
	}
	buf := s.bufs.s2c
	for {
		n, err := s.upIO.Read(buf)
		if n > 0 && !s.forwardServer(buf[:n]) {
			return
		}
		if err != nil {
			s.end(causeServerClosed)
			return
		}
	}
}

// forwardServer sends one upstream chunk to the client; false ends the loop.
func (s *session) forwardServer(p []byte) bool {
	if !s.pg {
		s.touch()
		if _, err := s.clIO.Write(p); err != nil {
			if s.halfClosed.Load() {
				// A client that closed cleanly and then refused the rest
				// of the reply (close, not shutdown) left; it did not vanish.
				s.end(causeClientDone)
			} else {
				s.end(s.clientLost())
			}
			return false
		}
		return true
	}
	rfq, status, err := s.bs.scan(p)
	if err != nil {
		s.fail(causeServerProtocol, err)
		return false
	}
	if s.bs.ending {
		s.serverEnding.Store(true) // before the client can read the FATAL
	}
	idle := false
	if rfq > 0 {
		s.status.Store(uint32(status))
		idle = s.retire(int32(rfq)) == 0
	} else {
		idle = s.pending.Load() == 0
	}
	if idle {
		s.touch()
	}
	if _, err := s.clIO.Write(p); err != nil {
		s.end(s.clientLost())
		return false
	}
	// A connection marked to close at its next idle moment (max_lifetime
	// reached, bridge removed, shutdown) closes now that the client has its
	// answer. The mark is read after the state is published, and set before
	// the timer reads the state, so one of the two always sees the other.
	if idle && rfq > 0 && status == 'I' {
		if c := cause(s.closeIdle.Load()); c != causeNone {
			s.end(c)
			return false
		}
	}
	return true
}

// sayGoodbye runs as the server→client loop ends: the client gets the
// ErrorResponse its cause calls for (only between messages), then EOF;
// what it still sends is drained for a moment so the goodbye is not lost
// to a reset.
func (s *session) sayGoodbye() {
	c := s.endCause()
	if c == causeReuse || c == causeNone {
		_ = s.cl.Close()
		return
	}
	if s.pg && s.bs.atBoundary() {
		if msg := s.farewell(c); msg != nil {
			_, _ = s.cl.Write(msg)
		}
	}
	_ = s.cl.CloseWrite()
	if s.hurry.Load() {
		_ = s.cl.Close()
		return
	}
	_ = s.cl.SetReadDeadline(time.Now().Add(farewellTimeout))
}

// addPending counts ReadyForQuery messages the client now awaits; a
// negative n (Syncs the server will ignore) never takes it below zero.
func (s *session) addPending(n int32) {
	for {
		p := s.pending.Load()
		if s.pending.CompareAndSwap(p, max(p+n, 0)) {
			return
		}
	}
}

// retire counts n ReadyForQuery messages received and returns how many the
// client still awaits.
func (s *session) retire(n int32) int32 {
	for {
		p := s.pending.Load()
		np := max(p-n, 0)
		if s.pending.CompareAndSwap(p, np) {
			return np
		}
	}
}

// touch records traffic that leaves the session idle.
func (s *session) touch() { s.lastMove.Store(s.clk.Now().UnixNano()) }

func (s *session) lastTraffic() time.Time { return time.Unix(0, s.lastMove.Load()) }

// tcpQuiet is how long a tcp session must move no bytes to count as idle,
// at most: a protocol-blind pipe has no other sign that it is between
// requests.
const tcpQuiet = time.Second

func (s *session) quietPeriod() time.Duration {
	if t := s.g.cfg.IdleTimeout; t > 0 && t < tcpQuiet {
		return t
	}
	return tcpQuiet
}

// state is the session's state at now.
func (s *session) state(now time.Time) int {
	if !s.pg {
		if now.Sub(s.lastTraffic()) >= s.quietPeriod() {
			return stIdle
		}
		return stBusy
	}
	if s.pending.Load() != 0 {
		return stBusy
	}
	switch s.status.Load() {
	case 'I':
		return stIdle
	case 'T', 'E':
		return stIdleInTx
	}
	return stBusy
}

// reusable reports whether the upstream connection may serve the next
// client with the same login once this one terminates: the server admitted
// the login without a password (it checks logins only when a connection is
// made, so a kept connection serves that login until it closes), the
// session is idle between transactions, and nothing marks it to close.
func (s *session) reusable() bool {
	return s.key != "" && s.state(s.clk.Now()) == stIdle && s.closeIdle.Load() == int32(causeNone) &&
		s.fs.atBoundary() && s.trusted.Load() && s.welcome.Load() != nil
}
