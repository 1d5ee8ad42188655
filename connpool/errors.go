package connpool

import (
	"errors"
	"fmt"
	"net"
	"os"

	"github.com/valyala/fasthttp"
)

// Kind says which side of an exchange failed; the proxies turn it into a
// status code and a breaker outcome.
type Kind uint8

// Kinds of failure.
const (
	// KindDial: no connection could be made (refused, DNS, TLS handshake).
	KindDial Kind = iota + 1
	// KindTimeout: the exchange's deadline passed (waiting for a
	// connection slot, dialling, writing or reading).
	KindTimeout
	// KindUpstream: the upstream broke the exchange (reset, closed before a
	// response, an unparsable response).
	KindUpstream
	// KindClient: reading the client's request body failed; the upstream
	// is not to blame.
	KindClient
)

func (k Kind) String() string {
	switch k {
	case KindDial:
		return "dial"
	case KindTimeout:
		return "timeout"
	case KindUpstream:
		return "upstream"
	case KindClient:
		return "client"
	}
	return "unknown"
}

// Error is a failed exchange.
type Error struct {
	Kind Kind
	Op   string // what was being done: "dial", "write request", "read response", ...
	Addr string
	Err  error
}

func (e *Error) Error() string {
	return fmt.Sprintf("%s %s: %v", e.Op, e.Addr, e.Err)
}

func (e *Error) Unwrap() error { return e.Err }

// KindOf returns the Kind of err, or 0 when it is not an *Error.
func KindOf(err error) Kind {
	var e *Error
	if errors.As(err, &e) {
		return e.Kind
	}
	return 0
}

// wrap classifies an I/O error of operation op: timeouts are KindTimeout
// whatever side they happened on; the rest is kind.
func wrap(kind Kind, op, addr string, err error) *Error {
	if isTimeout(err) {
		kind = KindTimeout
	}
	return &Error{Kind: kind, Op: op, Addr: addr, Err: err}
}

func isTimeout(err error) bool {
	if errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(err, fasthttp.ErrTimeout) {
		return true
	}
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// errClientBody marks a failure to read the client's body while copying it.
type errClientBody struct{ err error }

func (e errClientBody) Error() string { return "reading request body: " + e.err.Error() }
func (e errClientBody) Unwrap() error { return e.err }
