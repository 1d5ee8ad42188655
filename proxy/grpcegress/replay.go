package grpcegress

import (
	"errors"
	"io"
	"slices"
	"sync"
)

// replayMax is how much of a call's request body is kept so that the
// transport can send it again. Unary calls and the opening messages of
// streams fit; a call that has sent more than this is no longer resent.
const replayMax = 64 << 10

// retryMax is what is kept of a call warden may retry, as the HTTP egress
// keeps a retried request's body (egress.RetryBodyMax).
const retryMax = 1 << 20

var (
	errReplayTooLong = errors.New("request body past what is kept for a resend already sent: not resent")
	errReplaced      = errors.New("request body handed to a resent attempt")
)

// replayBody lets Go's HTTP/2 transport send a call again when the upstream
// refused its stream without processing it (REFUSED_STREAM, or a GOAWAY
// past its stream ID). Until it has seen the server's SETTINGS a new
// connection assumes 100 concurrent streams, so a burst at an upstream that
// allows fewer is partly refused; the transport resends such requests only
// when GetBody gives the body again from its start.
//
// Everything read from the caller's body is recorded up to limit; each
// GetBody starts a reader at the beginning of the record, and the reader
// before it stops. Reads of the caller's body go through one lock, so the
// attempt abandoned by the transport and its successor never read it at
// once, and what the abandoned one was waiting for is recorded for the
// successor.
type replayBody struct {
	src   io.ReadCloser
	limit int        // most bytes recorded
	rd    sync.Mutex // serialises reads of src

	mu   sync.Mutex
	rec  []byte
	pos  int   // the current reader's place in rec
	over bool  // more than limit was read: no resending
	err  error // src's final error (io.EOF at its end)
	gen  int   // the current reader
}

// newReplayBody returns the body for the first attempt and a GetBody for
// the transport, which warden's retries call too; limit bytes are kept.
func newReplayBody(src io.ReadCloser, limit int) (*replayReader, func() (io.ReadCloser, error)) {
	b := &replayBody{src: src, limit: limit}
	return &replayReader{b: b}, b.next
}

func (b *replayBody) next() (io.ReadCloser, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.over {
		return nil, errReplayTooLong
	}
	b.gen++
	b.pos = 0
	return &replayReader{b: b, gen: b.gen}, nil
}

type replayReader struct {
	b   *replayBody
	gen int
}

func (r *replayReader) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	b := r.b
	for {
		b.mu.Lock()
		switch {
		case r.gen != b.gen:
			b.mu.Unlock()
			return 0, errReplaced
		case b.pos < len(b.rec):
			n := copy(p, b.rec[b.pos:])
			b.pos += n
			if b.over && b.pos == len(b.rec) {
				b.rec, b.pos = nil, 0 // never read again
			}
			b.mu.Unlock()
			return n, nil
		case b.err != nil:
			err := b.err
			b.mu.Unlock()
			return 0, err
		}
		over := b.over
		b.mu.Unlock()
		if over {
			// Nothing is recorded any more: the one reader left reads
			// the caller's body directly.
			b.rd.Lock()
			n, err := b.src.Read(p)
			b.rd.Unlock()
			return n, err
		}
		b.fill(len(p))
	}
}

// fill reads once from the caller's body into the record, unless a read
// that held the lock before it already brought something for Read to look
// at.
func (b *replayBody) fill(want int) {
	b.rd.Lock()
	defer b.rd.Unlock()
	b.mu.Lock()
	ready := b.pos < len(b.rec) || b.err != nil || b.over
	b.mu.Unlock()
	if ready {
		return
	}
	// The record grows by doubling from 512 bytes, so a small unary call
	// costs little and a long stream soon reads in the transport's sizes.
	b.mu.Lock()
	rec := slices.Grow(b.rec, min(want, max(512, len(b.rec))))
	b.rec = rec
	b.mu.Unlock()
	n, err := b.src.Read(rec[len(rec):min(cap(rec), len(rec)+want)])
	b.mu.Lock()
	defer b.mu.Unlock()
	b.rec = b.rec[:len(b.rec)+n]
	if len(b.rec) > b.limit {
		// Too long to resend: only what the current reader has not read
		// yet is kept.
		b.over = true
		b.rec, b.pos = b.rec[b.pos:], 0
	}
	if err != nil {
		b.err = err
	}
}

// Close is left to the server, which closes the caller's body when the
// handler returns: the transport closes a body it abandons, and the next
// attempt still reads it.
func (r *replayReader) Close() error { return nil }
