package bridge

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/warden-dev/warden/internal/rawio"
	"github.com/warden-dev/warden/proxy/bridge/dbpool"
)

// resetTimeout bounds the DISCARD ALL that readies a connection for reuse.
const resetTimeout = 5 * time.Second

// servePostgres runs one Postgres client: startup, a server connection,
// then the session. The startup message is read before any waiting so
// that a refusal can be a proper ErrorResponse.
func (b *bridge) servePostgres(c *net.TCPConn, g *generation) {
	_ = c.SetReadDeadline(time.Now().Add(b.set.opts.StartupTimeout))
	cio := rawio.Wrap(c)
	pkt, msg, err := negotiate(cio)
	if err != nil {
		if !isDisconnect(err) {
			b.refuse(c, fatal("08P01", fmt.Sprintf("bridge %s: invalid startup packet: %v", b.name, err), ""))
			return
		}
		_ = c.Close()
		return
	}
	if m, ok := msg.(*pgproto3.CancelRequest); ok {
		_ = c.Close()
		b.forwardCancel(m)
		return
	}
	_ = c.SetReadDeadline(time.Time{})
	params := msg.(*pgproto3.StartupMessage).Parameters
	runID := runOf(params)
	ended, err := b.bindRun(runID)
	if err != nil {
		b.countReap(ReasonRunEnded, "run", runID, "connection", "refused at login")
		b.refuse(c, fatal("57P01", fmt.Sprintf("bridge %s: run %s has ended", b.name, runID), ""))
		return
	}
	// The startup parameters are the login. Run-bound sessions and
	// replication connections are never kept or answered from the cache.
	key := ""
	if runID == "" && params["replication"] == "" {
		key = loginKey(msg.(*pgproto3.StartupMessage))
		if w := g.logins.get(key); w != nil {
			b.serveCachedLogin(c, cio, g, pkt, key, w)
			return
		}
	}
	conn, early, err := b.acquire(c, g, key, ended)
	if err != nil {
		b.refuseAcquire(c, g, runID, err)
		return
	}
	s := b.newSession(g, c, conn, true)
	s.key, s.runID, s.runEnded = key, runID, ended
	if conn.Reused() {
		// A kept connection whose login fell out of the cache.
		w := conn.Payload.(*welcome)
		out := s.bufs.login[:0]
		out = appendWelcome(out, w)
		out, s.cancel, s.ct = b.issueCancelKey(out, len(w.key.secret), g.cfg.Upstream)
		out, _ = (&pgproto3.ReadyForQuery{TxStatus: 'I'}).Encode(out)
		s.adopt(w)
		if _, err := cio.Write(out); err != nil {
			s.end(causeClientGone)
		}
		s.run(nil, early)
		return
	}
	s.run(pkt, early)
}

// serveCachedLogin answers a login the server admitted before without a
// password from the cache, then waits for the client's first message
// before it takes a server connection: a kept one for this login, or a new
// one logged in on the client's behalf (quietly: the client already has
// its welcome).
func (b *bridge) serveCachedLogin(c *net.TCPConn, cio net.Conn, g *generation, pkt []byte, key string, w *welcome) {
	out := appendWelcome(nil, w)
	out, cancel, ct := b.issueCancelKey(out, len(w.key.secret), g.cfg.Upstream)
	out, _ = (&pgproto3.ReadyForQuery{TxStatus: 'I'}).Encode(out)
	if _, err := cio.Write(out); err != nil {
		b.withdrawCancelKey(cancel)
		_ = c.Close()
		return
	}
	first := make([]byte, 4096)
	n, err := cio.Read(first)
	first = first[:n]
	if err != nil || isTerminate(first) {
		b.withdrawCancelKey(cancel)
		_ = c.Close()
		return
	}
	var conn *dbpool.Conn
	for {
		var early []byte
		conn, early, err = b.acquire(c, g, key, nil)
		if err != nil {
			b.withdrawCancelKey(cancel)
			b.refuseAcquire(c, g, "", err)
			return
		}
		first = append(first, early...)
		if !conn.Reused() || bytes.Equal(conn.Payload.(*welcome).params, w.params) {
			break
		}
		// A kept connection made before the server's settings for this
		// login changed (ALTER ROLE/DATABASE ... SET) would run the
		// client's statements under settings it was not told: closed,
		// it makes room for one that has them.
		conn.Close()
	}
	s := b.newSession(g, c, conn, true)
	s.key, s.cancel, s.ct = key, cancel, ct
	if conn.Reused() {
		s.adopt(conn.Payload.(*welcome))
		s.run(nil, first)
		return
	}
	s.quiet, s.told, s.loggedIn = true, w.params, make(chan struct{})
	s.run(pkt, first)
}

// loginKey is a login's identity: protocol version and parameters, in a
// canonical order (clients that build the packet from a map send the same
// login in varying orders).
func loginKey(m *pgproto3.StartupMessage) string {
	names := slices.Sorted(maps.Keys(m.Parameters))
	var b strings.Builder
	b.WriteString(strconv.FormatUint(uint64(m.ProtocolVersion), 10))
	for _, n := range names {
		b.WriteByte(0)
		b.WriteString(n)
		b.WriteByte(0)
		b.WriteString(m.Parameters[n])
	}
	return b.String()
}

// isTerminate reports whether p is exactly one Terminate message.
func isTerminate(p []byte) bool {
	return len(p) == 5 && p[0] == 'X' && binary.BigEndian.Uint32(p[1:]) == 4
}

// welcome is what the server said when a connection logged in: replayed to
// clients of the same login, with the connection's own cancel key.
type welcome struct {
	negotiate []byte // NegotiateProtocolVersion, if any
	params    []byte // ParameterStatus messages
	key       serverKey
}

// appendWelcome appends a login's answer up to, not including, the cancel
// key and ReadyForQuery.
func appendWelcome(out []byte, w *welcome) []byte {
	out = append(out, w.negotiate...)
	out, _ = (&pgproto3.AuthenticationOk{}).Encode(out)
	return append(out, w.params...)
}

// adopt makes the session the user of a kept connection logged in as w.
func (s *session) adopt(w *welcome) {
	s.ct.real.Store(&w.key)
	s.trusted.Store(true)
	s.welcome.Store(w)
}

// protocolError is a message the bridge cannot make sense of.
type protocolError struct{ error }

// clientError is a failure to write to the client.
type clientError struct{ error }

// errPasswordNow is a cached login the server now challenges.
var errPasswordNow = errors.New("the server now asks this login for a password")

// errSettingsChanged is a cached login whose server settings changed.
var errSettingsChanged = errors.New("the server's settings for this login changed since it was answered (ALTER ROLE/DATABASE ... SET)")

// peekFrame returns the next whole server message in br without consuming
// it (valid until the next read or Discard). A message too large for br is
// returned as its 5-byte header alone, with large set: the caller streams
// or skips it.
func peekFrame(br *bufio.Reader) (f []byte, large bool, err error) {
	hdr, err := br.Peek(5)
	if err != nil {
		return nil, false, err
	}
	if !backendTypes[hdr[0]] {
		return nil, false, protocolError{fmt.Errorf("invalid message type 0x%02x", hdr[0])}
	}
	n := int(int32(binary.BigEndian.Uint32(hdr[1:])))
	if n < 4 {
		return nil, false, protocolError{fmt.Errorf("invalid length %d of message %q", n, hdr[0])}
	}
	if n+1 > br.Size() {
		return hdr, true, nil
	}
	f, err = br.Peek(n + 1)
	return f, false, err
}

// frameLen is the whole length of a message from its header.
func frameLen(hdr []byte) int { return 1 + int(binary.BigEndian.Uint32(hdr[1:])) }

// login follows the server's side of a new connection's login until the
// first ReadyForQuery, message by message. Normally it relays everything to
// the client, handing it a cancel key of the bridge's own; quietly (the
// client was answered from the cache) it relays only errors and notices.
// It notes whether the server asked for a password and keeps what later
// clients of the same login are replayed.
func (s *session) login() error {
	br := s.bufs.br
	out := s.bufs.login[:0]
	defer func() { s.bufs.login = out[:0] }()
	flush := func() error {
		if len(out) == 0 {
			return nil
		}
		_, err := s.clIO.Write(out)
		out = out[:0]
		if err != nil {
			return clientError{err}
		}
		return nil
	}
	w := &welcome{}
	asked := false
	for {
		if br.Buffered() == 0 {
			if err := flush(); err != nil {
				return err
			}
		}
		f, large, err := peekFrame(br)
		if err != nil {
			_ = flush()
			return err
		}
		if large {
			// Only errors and notices can be this long: relay them as they come.
			if f[0] != 'E' && f[0] != 'N' {
				return protocolError{fmt.Errorf("message %q of %d bytes during login", f[0], frameLen(f))}
			}
			if f[0] == 'E' {
				s.serverEnding.Store(true) // the server refuses the login and will close
				if s.quiet {
					s.g.logins.forget(s.key)
				}
			}
			if err := flush(); err != nil {
				return err
			}
			if _, err := io.CopyN(s.cl, br, int64(frameLen(f))); err != nil {
				return err
			}
			continue
		}
		relay := !s.quiet
		switch f[0] {
		case 'R':
			if len(f) < 9 {
				return protocolError{errors.New("short Authentication message")}
			}
			if binary.BigEndian.Uint32(f[5:]) != 0 {
				if s.quiet {
					s.g.logins.forget(s.key)
					return errPasswordNow
				}
				asked = true
			}
		case 'v':
			w.negotiate = append(w.negotiate, f...)
		case 'S':
			w.params = append(w.params, f...)
		case 'K':
			var k pgproto3.BackendKeyData
			if err := k.Decode(f[5:]); err != nil {
				return protocolError{err}
			}
			w.key = serverKey{pid: k.ProcessID, secret: k.SecretKey}
			if !s.quiet {
				out, s.cancel, s.ct = s.b.issueCancelKey(out, len(k.SecretKey), s.g.cfg.Upstream)
			}
			s.ct.real.Store(&w.key)
			relay = false
		case 'Z':
			if len(f) != 6 || (f[5] != 'I' && f[5] != 'T' && f[5] != 'E') {
				return protocolError{errors.New("malformed ReadyForQuery")}
			}
			if relay {
				out = append(out, f...)
			}
			br.Discard(len(f))
			if !asked {
				s.trusted.Store(true)
				if s.key != "" {
					s.g.logins.put(s.key, w)
				}
			}
			if s.quiet && !bytes.Equal(w.params, s.told) {
				// The server's settings changed since the login the
				// client was answered with: its statements were written
				// for the settings it was told. The cache now has these.
				return errSettingsChanged
			}
			s.welcome.Store(w)
			if s.retire(1) == 0 {
				s.touch()
			}
			return flush()
		case 'E':
			// The server refuses the login and will close (PostgreSQL makes
			// any error before the first ReadyForQuery FATAL).
			relay = true
			s.serverEnding.Store(true)
			if s.quiet {
				s.g.logins.forget(s.key) // it no longer admits this login as cached
			}
		default:
			relay = true // notices always reach the client
		}
		if relay {
			out = append(out, f...)
		}
		br.Discard(len(f))
	}
}

// loginFailed ends a session whose login did not complete.
func (s *session) loginFailed(err error) {
	var pe protocolError
	var ce clientError
	switch {
	case errors.As(err, &pe):
		s.fail(causeServerProtocol, pe.error)
	case errors.As(err, &ce):
		s.end(s.clientLost())
	case errors.Is(err, errPasswordNow), errors.Is(err, errSettingsChanged):
		s.fail(causeLoginChanged, err)
	case errors.Is(err, os.ErrDeadlineExceeded):
		s.end(causeLoginTimeout)
	default:
		s.end(causeServerClosed) // a refused login: the server said why and closed
	}
}

// resetForReuse readies the upstream connection of a cleanly terminated
// session for the next client: DISCARD ALL (prepared statements, temp
// tables, session settings, advisory locks, LISTENs) must succeed and leave
// it idle with nothing unread.
func (s *session) resetForReuse() bool {
	br := s.bufs.br
	if !s.bs.atBoundary() || br.Buffered() != 0 {
		return false
	}
	if err := s.upNet.SetDeadline(time.Now().Add(resetTimeout)); err != nil {
		return false
	}
	q, _ := (&pgproto3.Query{String: "DISCARD ALL"}).Encode(s.bufs.login[:0])
	if _, err := s.upIO.Write(q); err != nil {
		return false
	}
	failed := false
	for {
		f, large, err := peekFrame(br)
		if err != nil {
			return false
		}
		if large {
			failed = failed || f[0] == 'E'
			if _, err := br.Discard(frameLen(f)); err != nil {
				return false
			}
			continue
		}
		switch f[0] {
		case 'E':
			failed = true
		case 'Z':
			idle := len(f) == 6 && f[5] == 'I'
			br.Discard(len(f))
			return !failed && idle && br.Buffered() == 0 && s.upNet.SetDeadline(time.Time{}) == nil
		}
		br.Discard(len(f))
	}
}
