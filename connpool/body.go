package connpool

import (
	"errors"
	"io"
	"sync"
)

// Finisher is told when a streamed response body ends. The proxies
// implement it on their per-request state to release pool slots and record
// metrics once the response is complete.
type Finisher interface {
	// Finish is called exactly once: err is nil when the body was read to
	// its end, otherwise why it was not.
	Finish(err error)
}

type bodyMode uint8

const (
	modeLength     bodyMode = iota // Content-Length bytes
	modeChunked                    // chunked transfer coding
	modeUntilClose                 // until the upstream closes (no framing)
)

// errAbandoned is reported when the body was closed before its end without
// a write error, i.e. the server gave up on the client.
var errAbandoned = errors.New("response body abandoned before its end")

// Body is a response body read from an upstream connection while it is
// written to the client (fasthttp's server reads it and then closes it).
// Closing it gives the connection back to its pool: for reuse when the body
// was read to its end, closed otherwise. Bodies are pooled.
type Body struct {
	p         *Pool
	c         *Conn
	mode      bodyMode
	remaining int64
	chunked   chunkedReader
	eof       bool
	keepAlive bool
	err       error
	fin       Finisher
}

var bodyPool = sync.Pool{New: func() any { return new(Body) }}

func newBody(p *Pool, c *Conn, mode bodyMode, length int64, keepAlive bool, fin Finisher) *Body {
	b := bodyPool.Get().(*Body)
	*b = Body{p: p, c: c, mode: mode, remaining: length, keepAlive: keepAlive, fin: fin}
	if mode == modeChunked {
		b.chunked.reset(c.br)
	}
	return b
}

// Read reads the body; io.EOF marks its end.
func (b *Body) Read(p []byte) (int, error) {
	if b.eof {
		return 0, io.EOF
	}
	if b.err != nil {
		return 0, b.err
	}
	var n int
	var err error
	switch b.mode {
	case modeLength:
		if b.remaining == 0 {
			b.eof = true
			return 0, io.EOF
		}
		if int64(len(p)) > b.remaining {
			p = p[:b.remaining]
		}
		n, err = b.c.br.Read(p)
		b.remaining -= int64(n)
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		if err == nil && b.remaining == 0 {
			b.eof = true
			err = io.EOF
		}
	case modeChunked:
		n, err = b.chunked.Read(p)
		if err == io.EOF {
			b.eof = true
		}
	case modeUntilClose:
		n, err = b.c.br.Read(p)
		if err == io.EOF {
			b.eof = true
		}
	}
	if err != nil && err != io.EOF {
		b.err = wrap(KindUpstream, "read response body from", b.p.cfg.Addr, err)
		return n, b.err
	}
	return n, err
}

// CloseWithError ends the body; writeErr is the error writing it to the
// client, if any (fasthttp's server passes it). Body has no Close method on
// purpose: fasthttp calls both Close and CloseWithError when a stream has
// both, and a pooled Body must be ended exactly once.
func (b *Body) CloseWithError(writeErr error) error {
	b.p.release(b.c, b.eof && b.keepAlive && b.mode != modeUntilClose)
	err := b.err
	if err == nil && !b.eof {
		err = writeErr
		if err == nil {
			err = errAbandoned
		}
	}
	fin := b.fin
	*b = Body{}
	bodyPool.Put(b)
	if fin != nil {
		fin.Finish(err)
	}
	return nil
}
