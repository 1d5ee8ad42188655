package splice

import (
	"bufio"
	"io"
	"net"
	"sync"
	"time"

	"github.com/valyala/fasthttp"
)

// LingerMax and LingerTime bound what is read and dropped of a request body
// that was answered before it was all read, as nginx's lingering close
// bounds it.
const (
	LingerMax  = 16 << 20
	LingerTime = 5 * time.Second
)

// Linger has ctx's answer written as soon as its handler returns and the
// connection closed after it, for a request answered before its client's
// whole body was read (the upstream answered early, and the rest was not
// sent on). The client may still be sending: what it sends is read and
// dropped after the answer, up to LingerMax bytes and for at most
// LingerTime, as nginx's lingering close does. Closed with those bytes
// unread, the connection would be reset, and a client still writing would
// see the reset instead of the answer. The answer says Connection: close.
// Once a drain has begun the answer is written and the connection closed
// at once, by fasthttp; a lingering close already under way is waited
// for by the drain, and cut with it.
func (s *Set) Linger(ctx *fasthttp.RequestCtx) {
	ctx.SetConnectionClose()
	l := new(lingering)
	if !s.add(l) {
		return
	}
	ctx.HijackSetNoResponse(true)
	ctx.Hijack(func(c net.Conn) {
		defer s.remove(l)
		if !l.hold(c) {
			return
		}
		// fasthttp hands ctx over with the connection and releases it only
		// once this returns, so the answer as it framed it for this client
		// (HTTP/1.0, Connection: close) is written from here; a streamed
		// body ends, and its exchange with it, once written.
		bw := bufio.NewWriterSize(c, 4<<10)
		if ctx.Response.Write(bw) != nil || bw.Flush() != nil {
			return
		}
		// The end of the answer: the client sees it while it still sends.
		if u, ok := c.(interface{ UnsafeConn() net.Conn }); ok {
			if cw, ok := u.UnsafeConn().(interface{ CloseWrite() error }); ok {
				_ = cw.CloseWrite()
			}
		}
		if c.SetReadDeadline(time.Now().Add(LingerTime)) == nil {
			_, _ = io.CopyN(io.Discard, c, LingerMax)
		}
	})
}

// lingering is a connection in a lingering close, as a drain sees it.
type lingering struct {
	mu     sync.Mutex
	c      net.Conn
	closed bool
}

// hold records c as the connection; false when a drain cut it first.
func (l *lingering) hold(c net.Conn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.c = c
	return !l.closed
}

// Close cuts the lingering close: a write or read under way fails at once
// (fasthttp closes the connection when the hijack handler returns).
func (l *lingering) Close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.closed = true
	if l.c != nil {
		_ = l.c.SetDeadline(longPast)
	}
}

// unreadDropped is how much of a request body its handler left unread
// fasthttp reads and drops itself before the next request; past it,
// fasthttp closes the connection as soon as the answer is written.
const unreadDropped = 256 << 10

// LingerUnread is Linger for a request answered from its head, its body
// unread (a refusal), when more of the body may follow than fasthttp reads
// and drops by itself (unreadDropped): one announced longer, or chunked.
// A shorter body is left to fasthttp, which keeps the connection.
func (s *Set) LingerUnread(ctx *fasthttp.RequestCtx) {
	if !ctx.Request.IsBodyStream() || ctx.Hijacked() {
		return
	}
	if cl := ctx.Request.Header.ContentLength(); cl == -1 || cl > unreadDropped {
		s.Linger(ctx)
	}
}
