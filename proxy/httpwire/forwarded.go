package httpwire

import (
	"bytes"
	"net"

	"github.com/valyala/fasthttp"
)

// SetForwarded records the hop a request takes through a reverse proxy,
// as an edge Envoy (use_remote_address) and nginx's
// $proxy_add_x_forwarded_for do: the address of the peer it came from is
// appended to X-Forwarded-For, and X-Forwarded-Proto says "http" when the
// request carries none. Without it the worker behind a sidecar sees every
// request come from loopback and has lost the address of the hop before.
//
// A request's X-Forwarded-For lines are joined into one, in order, with
// their empty members dropped: a worker that reads only the first line
// must still see the whole chain. A peer that is not TCP (a Unix socket)
// adds no address. f is what ScanRequestHeaders found; it is read only to
// skip the lookup when the request has no X-Forwarded-For.
func SetForwarded(h *fasthttp.RequestHeader, f Fields, peer net.Addr) {
	// Room for a chain of a few hops without a heap allocation.
	var buf [256]byte
	b := buf[:0]
	lines := 0
	if f&HasForwardedFor != 0 {
		for _, v := range h.PeekAll(fasthttp.HeaderXForwardedFor) {
			lines++
			b = appendListMembers(b, v)
		}
	}
	if tcp, ok := peer.(*net.TCPAddr); ok {
		if len(b) > 0 {
			b = append(b, ", "...)
		}
		b = tcp.AddrPort().Addr().Unmap().AppendTo(b)
	}
	if lines > 1 || lines == 1 && len(b) == 0 {
		// Set would replace only the first of several lines.
		h.Del(fasthttp.HeaderXForwardedFor)
	}
	if len(b) > 0 {
		h.SetBytesV(fasthttp.HeaderXForwardedFor, b)
	}
	if f&HasForwardedProto == 0 {
		h.Set(fasthttp.HeaderXForwardedProto, "http")
	}
}

// appendListMembers appends the non-empty members of a comma-separated
// field value to b, each after ", " when b is not empty.
func appendListMembers(b, v []byte) []byte {
	for len(v) > 0 {
		var member []byte
		member, v, _ = bytes.Cut(v, comma)
		if member = trimOWS(member); len(member) == 0 {
			continue
		}
		if len(b) > 0 {
			b = append(b, ", "...)
		}
		b = append(b, member...)
	}
	return b
}

var comma = []byte{','}
