package fasttest

import (
	"bufio"
	"net"
	"strings"
	"time"

	"github.com/valyala/fasthttp"
)

// Requests feeds a handler the same raw request again and again through a
// reused RequestCtx, the way fasthttp's server calls it, without
// allocating: benchmarks then measure only the handler.
type Requests struct {
	raw string
	sr  strings.Reader
	br  *bufio.Reader
	Ctx fasthttp.RequestCtx
}

// NewRequests prepares raw (a whole HTTP/1.1 request) for replay.
func NewRequests(raw string) *Requests {
	r := &Requests{raw: raw}
	r.br = bufio.NewReaderSize(&r.sr, 4096)
	r.Ctx.Init2(fakeConn{}, nil, false)
	return r
}

// Next resets the context and parses the request into it again.
func (r *Requests) Next() (*fasthttp.RequestCtx, error) {
	r.Ctx.Response.Reset()
	r.Ctx.Request.Reset()
	r.sr.Reset(r.raw)
	r.br.Reset(&r.sr)
	return &r.Ctx, r.Ctx.Request.Read(r.br)
}

var benchAddr = &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 5555}

// fakeConn only answers address questions.
type fakeConn struct{ net.Conn }

func (fakeConn) RemoteAddr() net.Addr             { return benchAddr }
func (fakeConn) LocalAddr() net.Addr              { return benchAddr }
func (fakeConn) SetDeadline(time.Time) error      { return nil }
func (fakeConn) SetReadDeadline(time.Time) error  { return nil }
func (fakeConn) SetWriteDeadline(time.Time) error { return nil }
func (fakeConn) Close() error                     { return nil }
