// Package forward holds what the ingress and egress proxies share to pass
// a request upstream: reading the client's body into the form the upstream
// exchange needs, and bounded reads for handlers that want a whole body.
package forward

import (
	"bytes"
	"errors"
	"io"
	"os"
	"sync"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/warden-dev/warden/connpool"
	"github.com/warden-dev/warden/proxy/listener"
)

// ChunkPreread is how much of a chunked request body is read before the
// request is forwarded. A body that ends within it is sent with a
// Content-Length, and a malformed one is refused with 400 before the
// upstream sees anything; a longer body streams on in chunks, and bad
// chunking later in it cuts the upstream exchange short, so the upstream
// never receives a complete request.
const ChunkPreread = 64 << 10

// ErrBadBody is wrapped when the client's body cannot be read as framed.
var ErrBadBody = errors.New("malformed request body")

// ErrBodyTimeout is returned by Prepare when the request's deadline passed
// while the body it reads whole was still arriving.
var ErrBodyTimeout = errors.New("the request's deadline passed while its body was arriving")

// ErrTooLarge is returned by ReadAll for a body over its limit.
var ErrTooLarge = errors.New("request body too large")

// Body is the per-request state for a forwarded body: a pooled buffer and
// the reader that replays a read-ahead prefix before the rest of a stream.
// The zero value is ready; Release returns the buffer.
type Body struct {
	buf    *[]byte
	prefix prefixReader
}

var bufs = sync.Pool{New: func() any { b := make([]byte, 0, 16<<10); return &b }}

// Prepare sets req's body from the client request in ctx, whose header is
// req.Header. Bodies of known length up to keep bytes, and chunked bodies
// ending within max(keep, ChunkPreread), are read whole (buffered reports
// true): a retry can resend them. Longer bodies are streamed. A chunked
// body read whole is re-framed with a Content-Length.
//
// req.Deadline, when set, bounds every read of the body, here
// (ErrBodyTimeout) and while it streams upstream: a slow client must not
// hold the exchange past its timeout, sent or not. fasthttp lifts the
// deadline once the handler has returned. A body that stalls for the
// listener's body_idle fails with listener.ErrBodyIdle (see Refuse).
func (b *Body) Prepare(ctx *fasthttp.RequestCtx, req *connpool.Request, keep int) (buffered bool, err error) {
	req.Body, req.Stream = nil, nil
	h := req.Header
	// fasthttp writes "Content-Type: application/octet-stream" for a body
	// that has none; a proxy passes on what the client sent.
	h.SetNoDefaultContentType(true)
	if !ctx.Request.IsBodyStream() {
		req.Body = ctx.Request.Body()
		dropTrailers(h)
		return true, nil
	}
	stream := ctx.RequestBodyStream()
	cl := h.ContentLength()
	if cl == -2 {
		// No body framing at all (a GET): nothing to send.
		return true, nil
	}
	if !req.Deadline.IsZero() {
		if err := ctx.SetReadDeadline(req.Deadline); err != nil {
			return false, errors.Join(ErrBadBody, err)
		}
	}
	switch {
	case cl >= 0 && cl <= keep:
		data, err := b.readBy(req.Deadline, stream, cl+1)
		if err != nil {
			return false, err
		}
		if len(data) != cl {
			return false, errors.Join(ErrBadBody, io.ErrUnexpectedEOF)
		}
		req.Body = data
		return true, nil
	case cl >= 0:
		req.Stream = stream
		return false, nil
	default:
		data, err := b.readBy(req.Deadline, stream, max(keep, ChunkPreread)+1)
		if err != nil {
			return false, err
		}
		if len(data) <= max(keep, ChunkPreread) {
			h.SetContentLength(len(data))
			dropTrailers(h)
			req.Body = data
			return true, nil
		}
		b.prefix = prefixReader{prefix: data, r: stream}
		req.Stream = &b.prefix
		return false, nil
	}
}

// dropTrailers forgets the trailer fields fasthttp read at the end of a
// chunked body. The body goes on with a Content-Length, which has no
// trailer section; left announced, they would go out as a Trailer header
// naming fields that never follow. Their values are dropped rather than
// merged into the header section: a field meant for after the body may
// not be safe before it (RFC 9110 §6.5.1).
func dropTrailers(h *fasthttp.RequestHeader) {
	announced := h.Peek(fasthttp.HeaderTrailer)
	if len(announced) == 0 {
		return
	}
	var buf [256]byte
	names := append(buf[:0], announced...)
	for len(names) > 0 {
		var name []byte
		if i := bytes.IndexByte(names, ','); i >= 0 {
			name, names = names[:i], names[i+1:]
		} else {
			name, names = names, nil
		}
		if name = bytes.TrimSpace(name); len(name) > 0 {
			h.DelBytes(name)
		}
	}
	h.Del(fasthttp.HeaderTrailer)
}

// readBy is read under the client connection's read deadline d (none when
// zero). A read the deadline cut short is ErrBodyTimeout; one the
// listener's body_idle cut short keeps its error (listener.ErrBodyIdle);
// any other failure is a malformed body.
func (b *Body) readBy(d time.Time, r io.Reader, limit int) ([]byte, error) {
	data, err := b.read(r, limit)
	switch {
	case err == nil:
		return data, nil
	case errors.Is(err, listener.ErrBodyIdle):
		return nil, err
	case !d.IsZero() && errors.Is(err, os.ErrDeadlineExceeded):
		return nil, ErrBodyTimeout
	}
	return nil, errors.Join(ErrBadBody, err)
}

// read reads from r until EOF or limit bytes, into the pooled buffer.
func (b *Body) read(r io.Reader, limit int) ([]byte, error) {
	if b.buf == nil {
		b.buf = bufs.Get().(*[]byte)
	}
	data := (*b.buf)[:0]
	for len(data) < limit {
		if len(data) == cap(data) {
			data = append(data, 0)[:len(data)]
		}
		n, err := r.Read(data[len(data):min(cap(data), limit)])
		data = data[:len(data)+n]
		if err == io.EOF {
			break
		}
		if err != nil {
			*b.buf = data[:0]
			return nil, err
		}
	}
	*b.buf = data[:0]
	return data, nil
}

// Release returns the buffer; the body read through b must no longer be
// used.
func (b *Body) Release() {
	if b.buf != nil {
		if cap(*b.buf) <= 2<<20 {
			bufs.Put(b.buf)
		}
		b.buf = nil
	}
	b.prefix = prefixReader{}
}

// ReadAll reads the client's whole body into the request, refusing one
// over limit bytes, so that handlers can use ctx.PostBody(). fasthttp's
// StreamRequestBody skips the server's own size check, hence this one.
func ReadAll(ctx *fasthttp.RequestCtx, limit int) error {
	if !ctx.Request.IsBodyStream() {
		if len(ctx.Request.Body()) > limit {
			return ErrTooLarge
		}
		return nil
	}
	cl := ctx.Request.Header.ContentLength()
	if cl > limit {
		return ErrTooLarge
	}
	var b Body
	defer b.Release()
	data, err := b.read(ctx.RequestBodyStream(), limit+1)
	if err != nil {
		return errors.Join(ErrBadBody, err)
	}
	if len(data) > limit {
		return ErrTooLarge
	}
	ctx.Request.SetBody(data)
	return nil
}

// prefixReader replays a read-ahead prefix, then reads on from r.
type prefixReader struct {
	prefix []byte
	r      io.Reader
}

func (p *prefixReader) Read(b []byte) (int, error) {
	if len(p.prefix) > 0 {
		n := copy(b, p.prefix)
		p.prefix = p.prefix[n:]
		return n, nil
	}
	return p.r.Read(b)
}
