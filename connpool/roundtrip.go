package connpool

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"
)

// Request is one exchange to send through a Pool.
type Request struct {
	// Header is written as is: the caller has set the origin-form target,
	// Host, and the framing (Content-Length, or chunked with -1).
	Header *fasthttp.RequestHeader
	// Body is the whole body when Stream is nil.
	Body []byte
	// Stream, when set, is the body, read while sending:
	// Header.ContentLength() bytes, or chunked until EOF when that is -1.
	Stream io.Reader
	// Deadline bounds the whole exchange, streamed response body included.
	// Zero means none.
	Deadline time.Time
	// Wait, when its Done closes first, ends a wait for a connection slot
	// as the caller's (KindClient): the client hung up. Its Done is asked
	// for only when the request must wait, so a lazily built context costs
	// nothing until then. Its deadline, if it has one, ends the wait as
	// Deadline does. Nil means none.
	Wait context.Context
	// Abort, when set, lets another goroutine give the exchange up while
	// the request is sent or its response awaited. Nil means never.
	Abort *Abort
	// Whole, when set, is asked with the response's status; when it
	// answers true, a body of up to WholeBodyMax is read into the response
	// whatever its framing (chunked, or longer than InlineBodyMax), so that
	// the caller can read it and send the request again. Set it to a plain
	// function, not a closure, to keep the request allocation-free.
	Whole func(status int) bool
	// Upgrade lets the upstream switch protocols: a 101 is then the
	// answer, and Do leaves the connection in Switched rather than in the
	// pool. Without it a 101 is an error.
	Upgrade bool
	// Switched is set by Do when the upstream answered an Upgrade request
	// with 101: the connection is the caller's from then on.
	Switched *Switched
	// BodyCut is set by Do when the upstream gave its final answer before
	// the whole body had gone out: the rest was not sent, the connection
	// is not reused, and what the caller has not read of Stream is still
	// unread.
	BodyCut bool
}

// StreamLeft reports whether part of Stream is left unread: the upstream
// answered before the whole of a streamed body (BodyCut). A body given
// whole (Body) was read to its end before Do.
func (r *Request) StreamLeft() bool { return r.BodyCut && r.Stream != nil }

// Switched is an upstream connection that left HTTP with a 101 Switching
// Protocols: what it reads begins with whatever the upstream sent after
// its 101. It holds its slot in the pool until Close.
type Switched struct {
	p    *Pool
	c    *Conn
	once sync.Once
}

func (s *Switched) Read(b []byte) (int, error)  { return s.c.br.Read(b) }
func (s *Switched) Write(b []byte) (int, error) { return s.c.nc.Write(b) }

// CloseWrite ends what is sent to the upstream, which may still answer.
// A connection that cannot half-close is closed.
func (s *Switched) CloseWrite() error {
	if cw, ok := s.c.nc.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return s.Close()
}

// Close closes the connection and frees its slot in the pool.
func (s *Switched) Close() error {
	s.once.Do(func() { s.p.discard(s.c) })
	return nil
}

// InlineBodyMax is the largest response body of known length that Do reads
// whole; longer, chunked and unframed bodies are streamed.
const InlineBodyMax = 64 << 10

// WholeBodyMax is the most Do reads of a body Request.Whole asked for;
// past it the body is streamed as usual.
const WholeBodyMax = 256 << 10

// maxInterim bounds the 1xx responses skipped before the final one.
const maxInterim = 16

var (
	errUpgrade      = errors.New("upstream switched protocols for a request that did not ask to")
	errTooManyInfos = errors.New("too many 1xx responses")
)

// Do sends req and reads the response head into resp. A body up to
// InlineBodyMax of known length is read into resp too, and the connection
// is back in the pool when Do returns (streamed is false). Otherwise resp's
// body stream is a *Body still holding the connection, whose first byte
// has come (awaitBody): it is released, and fin told, when the stream is
// closed (streamed is true). fin is not used when streamed is false or err
// is not nil.
//
// Do never sends a request twice. An error is an *Error saying which side
// failed.
func (p *Pool) Do(req *Request, resp *fasthttp.Response, fin Finisher) (streamed bool, err error) {
	c, err := p.acquire(req.Deadline, req.Wait)
	if err != nil {
		return false, err
	}
	if err := c.setDeadline(req.Deadline); err != nil {
		p.discard(c)
		return false, wrap(KindUpstream, "set deadline on", p.cfg.Addr, err)
	}
	if !req.Abort.attach(c) {
		p.release(c, true)
		return false, &Error{Kind: KindClient, Op: "send request to", Addr: p.cfg.Addr, Err: ErrAbandoned}
	}
	req.BodyCut = false
	if watchesAnswer(req) {
		err = p.sendWatching(c, req, resp)
	} else if err = p.writeRequest(c, req, true); err == nil {
		err = p.readHead(c, resp, req.Upgrade)
	}
	if err == nil && streams(req, resp) {
		err = p.awaitBody(c, resp.Header.ContentLength())
	}
	if req.Abort.detach() {
		p.discard(c)
		return false, &Error{Kind: KindClient, Op: "wait for the response from", Addr: p.cfg.Addr, Err: ErrAbandoned}
	}
	if err != nil {
		p.discard(c)
		return false, err
	}
	status := resp.Header.StatusCode()
	if status == fasthttp.StatusSwitchingProtocols {
		// readHead lets a 101 through only to an Upgrade request. The
		// exchange's deadline bounded the handshake, not what follows.
		_ = c.setDeadline(time.Time{})
		req.Switched = &Switched{p: p, c: c}
		return false, nil
	}
	keepAlive := !resp.Header.ConnectionClose() && !req.Header.ConnectionClose() && !req.BodyCut
	if bodiless(req, status) {
		resp.SkipBody = req.Header.IsHead()
		p.release(c, keepAlive)
		return false, nil
	}
	cl := resp.Header.ContentLength()
	if req.Whole != nil && req.Whole(status) {
		if cl >= 0 && cl <= WholeBodyMax {
			if err := resp.ReadBody(c.br, 0); err != nil {
				p.discard(c)
				return false, wrap(KindUpstream, "read response body from", p.cfg.Addr, err)
			}
			p.release(c, keepAlive)
			return false, nil
		}
		if cl == -1 {
			return p.readChunkedWhole(c, resp, keepAlive, fin)
		}
	}
	switch {
	case cl >= 0 && cl <= InlineBodyMax:
		if err := resp.ReadBody(c.br, 0); err != nil {
			p.discard(c)
			return false, wrap(KindUpstream, "read response body from", p.cfg.Addr, err)
		}
		p.release(c, keepAlive)
		return false, nil
	case cl >= 0:
		resp.SetBodyStream(newBody(p, c, modeLength, int64(cl), keepAlive, fin), cl)
	case cl == -1:
		resp.SetBodyStream(newBody(p, c, modeChunked, 0, keepAlive, fin), -1)
	default:
		// No framing: the body ends when the upstream closes. The client
		// gets it chunked, so its own connection stays usable.
		resp.SetBodyStream(newBody(p, c, modeUntilClose, 0, false, fin), -1)
	}
	return true, nil
}

// bodiless reports whether the response to req with status has no body
// to read, whatever its head says.
func bodiless(req *Request, status int) bool {
	return req.Header.IsHead() || status == fasthttp.StatusNoContent || status == fasthttp.StatusNotModified
}

// streams reports whether resp's body may be streamed rather than read
// whole by Do: one that is longer than InlineBodyMax, chunked, or ends
// when the upstream closes.
func streams(req *Request, resp *fasthttp.Response) bool {
	status := resp.Header.StatusCode()
	if status == fasthttp.StatusSwitchingProtocols || bodiless(req, status) {
		return false
	}
	cl := resp.Header.ContentLength()
	return cl < 0 || cl > InlineBodyMax
}

// awaitBody waits for the first byte of a body that may be streamed, cl
// being its Content-Length; one already read with the head costs nothing.
// A failure before it (the upstream closing after its head, the deadline
// passing) is still the exchange's error, and the client gets a 502 or
// 504 for it; once streaming, a failure can only cut the client's
// connection, since the head has gone. The client waits no longer for
// this: fasthttp sends the head with the body's first bytes.
func (p *Pool) awaitBody(c *Conn, cl int) error {
	_, err := c.br.Peek(1)
	if err == nil || cl == -2 && errors.Is(err, io.EOF) {
		return nil // an unframed body may be empty, ended by the close
	}
	if errors.Is(err, io.EOF) {
		err = io.ErrUnexpectedEOF
	}
	return wrap(KindUpstream, "read response body from", p.cfg.Addr, err)
}

// readChunkedWhole reads a chunked body into resp when it ends within
// WholeBodyMax. A longer one is streamed: what was read, then the rest.
func (p *Pool) readChunkedWhole(c *Conn, resp *fasthttp.Response, keepAlive bool, fin Finisher) (streamed bool, err error) {
	b := newBody(p, c, modeChunked, 0, keepAlive, nil)
	buf, err := io.ReadAll(io.LimitReader(b, WholeBodyMax+1))
	if err != nil {
		b.CloseWithError(err)
		return false, err
	}
	if len(buf) <= WholeBodyMax { // the body's end came first
		b.CloseWithError(nil) // the connection goes back to the pool
		resp.Header.SetContentLength(len(buf))
		resp.SetBodyRaw(buf)
		return false, nil
	}
	b.fin = fin
	resp.SetBodyStream(prefixedBody{Reader: io.MultiReader(bytes.NewReader(buf), b), Body: b}, -1)
	return true, nil
}

// prefixedBody is a streamed body of which a head was read already: it
// reads the head, then the rest, and ends as the Body does.
type prefixedBody struct {
	io.Reader
	*Body
}

func (b prefixedBody) Read(p []byte) (int, error) { return b.Reader.Read(p) }

// readHead reads the final response head, skipping 1xx interim ones; a
// 101 is final for an Upgrade request (upgrade) and an error otherwise.
func (p *Pool) readHead(c *Conn, resp *fasthttp.Response, upgrade bool) error {
	for range maxInterim {
		if err := resp.Header.Read(c.br); err != nil {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return wrap(KindUpstream, "read response from", p.cfg.Addr, err)
		}
		switch st := resp.Header.StatusCode(); {
		case st == fasthttp.StatusSwitchingProtocols && upgrade:
			return nil
		case st == fasthttp.StatusSwitchingProtocols:
			return &Error{Kind: KindUpstream, Op: "read response from", Addr: p.cfg.Addr, Err: errUpgrade}
		case st >= 100 && st < 200:
			continue // 100 Continue, 103 Early Hints: the final response follows
		}
		return nil
	}
	return &Error{Kind: KindUpstream, Op: "read response from", Addr: p.cfg.Addr, Err: errTooManyInfos}
}

// watchesAnswer reports whether req is sent while its answer is watched
// for (sendWatching): when its body is longer than half the write buffer,
// or chunked. A shorter one goes out with its head in one write, which the
// kernel takes whole even from an upstream that answers early, so the
// answer is read after it, as a request without a body's is.
func watchesAnswer(req *Request) bool {
	n := len(req.Body)
	if req.Stream != nil {
		n = req.Header.ContentLength()
		if n < 0 {
			return true
		}
	}
	return n > writeBufferSize/2
}

// sendWatching sends a request with a long body while it reads the
// response head, so that an upstream that answers before it has the whole
// body (a 413 or a 401 to a long upload) gets its answer through, whether
// it then closes the connection or stops reading it. A final answer that comes first
// ends the sending (req.BodyCut), as Envoy ends an upstream request whose
// response came first. A write failing after such an answer is not the
// exchange's error: the answer is.
func (p *Pool) sendWatching(c *Conn, req *Request, resp *fasthttp.Response) error {
	w := &watch{head: make(chan error, 1)}
	go w.read(p, c, resp, req.Upgrade)
	werr := p.writeRequest(c, req, false)
	w.sent.Store(true)
	if werr != nil && KindOf(werr) == KindClient {
		// The client's body failed: nothing more will be asked of the
		// upstream, so the read is cut short too.
		_ = c.nc.SetReadDeadline(aLongTimeAgo)
		<-w.head
		return werr
	}
	herr := <-w.head
	switch {
	case herr == nil && werr != nil:
		req.BodyCut = true
		return nil
	case herr == nil:
		if w.cut.Load() {
			// The head came as the last write ended: all was sent, and
			// the connection may carry the next request.
			_ = c.nc.SetWriteDeadline(c.deadline)
		}
		return nil
	case w.cut.Load() || werr == nil:
		// The read ended first (the upstream closed, or sent no HTTP):
		// its error says why, not the write it then cut short.
		return herr
	}
	return werr
}

// watch is the response read that runs beside a long request's writes.
type watch struct {
	head chan error  // readHead's result
	sent atomic.Bool // the writes have ended
	cut  atomic.Bool // the read ended first and stopped the writes
}

func (w *watch) read(p *Pool, c *Conn, resp *fasthttp.Response, upgrade bool) {
	err := p.readHead(c, resp, upgrade)
	if !w.sent.Load() {
		// An answer, or the connection's end, before the whole request:
		// the write under way, blocked or not, fails at once.
		w.cut.Store(true)
		_ = c.nc.SetWriteDeadline(aLongTimeAgo)
	}
	w.head <- err
}

func (p *Pool) writeRequest(c *Conn, req *Request, await bool) error {
	bw := c.bw
	writes := c.out.writes
	if err := p.writeHead(bw, req.Header); err != nil {
		return wrap(KindUpstream, "write request to", p.cfg.Addr, err)
	}
	var err error
	switch cl := req.Header.ContentLength(); {
	case req.Stream == nil:
		_, err = bw.Write(req.Body)
	case cl >= 0:
		err = copyFixed(bw, req.Stream, int64(cl))
	default:
		err = copyChunked(bw, req.Stream)
	}
	if err == nil {
		// Waiting for the reply inside the last write is only sound when
		// that write is the whole request. An upstream may answer as soon
		// as it has the head (a refusal, the rest of the body dropped);
		// that answer would arrive before the last write clears the
		// socket's readiness, and nothing would wake the wait.
		c.out.await = await && c.out.writes == writes
		err = bw.Flush()
		c.out.await = false
	}
	if err != nil {
		var ce errClientBody
		if errors.As(err, &ce) {
			return &Error{Kind: KindClient, Op: "forward request body to", Addr: p.cfg.Addr, Err: ce.err}
		}
		return wrap(KindUpstream, "write request to", p.cfg.Addr, err)
	}
	return nil
}

// writeHead writes the request's head as warden's own HTTP/1.1 request:
// an intermediary sends its own version (RFC 9110 §6.2), and an HTTP/1.0
// request line would have the upstream close the connection after its
// answer and frame that answer for an HTTP/1.0 client. The client's
// version is put back afterwards: its response is framed for it. An
// HTTP/1.0 request may come without Host, which HTTP/1.1 requires; it is
// sent with the upstream's address, as nginx sends its proxy_host.
func (p *Pool) writeHead(bw *bufio.Writer, h *fasthttp.RequestHeader) error {
	if h.IsHTTP11() {
		_, err := bw.Write(h.Header())
		return err
	}
	var keep [16]byte
	proto := append(keep[:0], h.Protocol()...)
	h.SetProtocolBytes(http11)
	if len(h.Host()) == 0 {
		h.SetHost(p.cfg.Addr)
	}
	_, err := bw.Write(h.Header())
	h.SetProtocolBytes(proto)
	return err
}

var http11 = []byte("HTTP/1.1")

// copyFixed copies exactly n body bytes from r, reading straight into the
// writer's free buffer.
func copyFixed(bw interface {
	Available() int
	AvailableBuffer() []byte
	Write([]byte) (int, error)
	Flush() error
}, r io.Reader, n int64) error {
	for n > 0 {
		if bw.Available() == 0 {
			if err := bw.Flush(); err != nil {
				return err
			}
		}
		buf := bw.AvailableBuffer()
		buf = buf[:min(int64(cap(buf)), n)]
		m, err := r.Read(buf)
		if m > 0 {
			_, _ = bw.Write(buf[:m]) // within Available: cannot fail
			n -= int64(m)
		}
		if err == io.EOF {
			if n > 0 {
				return errClientBody{io.ErrUnexpectedEOF}
			}
			return nil
		}
		if err != nil {
			return errClientBody{err}
		}
	}
	return nil
}

var chunkBufs = sync.Pool{New: func() any { return new([32 << 10]byte) }}

// copyChunked copies r to the writer in the chunked coding.
func copyChunked(bw interface {
	Write([]byte) (int, error)
}, r io.Reader) error {
	buf := chunkBufs.Get().(*[32 << 10]byte)
	defer chunkBufs.Put(buf)
	var head [20]byte
	for {
		m, err := r.Read(buf[:])
		if m > 0 {
			if _, werr := bw.Write(appendChunkHeader(head[:0], m)); werr != nil {
				return werr
			}
			if _, werr := bw.Write(buf[:m]); werr != nil {
				return werr
			}
			if _, werr := bw.Write(crlf); werr != nil {
				return werr
			}
		}
		if err == io.EOF {
			_, werr := bw.Write(lastChunk)
			return werr
		}
		if err != nil {
			return errClientBody{err}
		}
	}
}

var (
	crlf      = []byte("\r\n")
	lastChunk = []byte("0\r\n\r\n")
)

// ErrAbandoned is the cause of the KindClient error Do returns when its
// Abort was called: the caller gave the exchange up (its client hung up).
var ErrAbandoned = errors.New("abandoned: the client closed its connection before the response")

// Abort lets another goroutine cut short a Do that is sending its request
// or waiting for the response head: the connection's deadline is moved
// to the past, so the write or read under way fails at once, the
// connection is closed, and Do returns a KindClient error with
// ErrAbandoned. The zero value is ready; it is reused after Reset. Its
// methods may be called on a nil *Abort, which never aborts.
type Abort struct {
	mu      sync.Mutex
	c       *Conn
	aborted bool
}

// Abort cuts the exchange short, now or, if Do has not got its connection
// yet, as soon as it does.
func (a *Abort) Abort() {
	if a == nil {
		return
	}
	a.mu.Lock()
	a.aborted = true
	if a.c != nil {
		_ = a.c.nc.SetDeadline(aLongTimeAgo)
	}
	a.mu.Unlock()
}

// Aborted reports whether Abort was called since the last Reset.
func (a *Abort) Aborted() bool {
	if a == nil {
		return false
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.aborted
}

// Reset readies a for another exchange.
func (a *Abort) Reset() {
	if a == nil {
		return
	}
	a.mu.Lock()
	a.c, a.aborted = nil, false
	a.mu.Unlock()
}

// attach makes c the connection Abort cuts; false means Abort came first.
func (a *Abort) attach(c *Conn) bool {
	if a == nil {
		return true
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.aborted {
		return false
	}
	a.c = c
	return true
}

// detach ends Abort's hold on the connection, before it can go back to the
// pool, and reports whether the exchange was aborted.
func (a *Abort) detach() bool {
	if a == nil {
		return false
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.c = nil
	return a.aborted
}

// aLongTimeAgo is a deadline that has passed.
var aLongTimeAgo = time.Unix(1, 0)
