package httpwire

import (
	"bytes"
	"iter"

	"github.com/valyala/fasthttp"
)

// Hop-by-hop headers (RFC 9110 §7.6.1) describe one connection, not the
// message: a proxy removes them, and every header the Connection header
// names, before forwarding. Transfer-Encoding is not removed here because
// the proxies set the outgoing framing themselves (Content-Length or
// chunked) and fasthttp writes it from that.
//
// Expect is removed too: fasthttp answers "100-continue" to the client
// itself before the handler reads the body, so passing it on would make
// the upstream send a second, unexpected 100.

// protectedFromConnection are headers a Connection token must not remove:
// framing and routing belong to the proxy, not to the peer.
func protectedFromConnection(name []byte) bool {
	return equalFold(name, "host") || equalFold(name, "content-length") ||
		equalFold(name, "transfer-encoding") || equalFold(name, "x-request-id")
}

// maxConnectionValue bounds the Connection value copied aside; longer
// values are cut (their tail is not honoured), which only leaves extra
// headers in place.
const maxConnectionValue = 256

// StripRequest removes the hop-by-hop headers of a request whose raw scan
// found f, and clears fasthttp's connection-close flag so the upstream
// connection's keep-alive is warden's own business.
func StripRequest(h *fasthttp.RequestHeader, f Fields) {
	h.ResetConnectionClose()
	if !f.HopByHop() {
		return
	}
	delHopByHop(h, f)
	if f&HasConnection != 0 {
		h.ResetConnectionClose()
	}
	if f&HasTE != 0 {
		// Of TE, only "trailers" is passed on.
		if hasToken(h.Peek(fasthttp.HeaderTE), "trailers") {
			h.Set(fasthttp.HeaderTE, "trailers")
		} else {
			h.Del(fasthttp.HeaderTE)
		}
	}
	if f&HasExpect != 0 {
		h.Del(fasthttp.HeaderExpect)
	}
}

// delHopByHop removes the hop-by-hop headers requests and responses share:
// Connection and what it names, Keep-Alive, Trailer, Upgrade, Proxy-*.
func delHopByHop(h header, f Fields) {
	if f&HasConnection != 0 {
		delConnectionTokens(h)
	}
	if f&HasKeepAlive != 0 {
		h.Del("Keep-Alive")
	}
	if f&HasTrailer != 0 {
		h.Del(fasthttp.HeaderTrailer)
	}
	if f&HasUpgrade != 0 {
		h.Del(fasthttp.HeaderUpgrade)
	}
	if f&HasProxy != 0 {
		delProxyHeaders(h)
	}
}

// header is what the stripping needs of fasthttp's request and response
// headers.
type header interface {
	All() iter.Seq2[[]byte, []byte]
	Peek(key string) []byte
	Del(key string)
	DelBytes(key []byte)
}

// delConnectionTokens removes the Connection header and every header it
// names.
func delConnectionTokens(h header) {
	var buf [maxConnectionValue]byte
	v := append(buf[:0], h.Peek(fasthttp.HeaderConnection)...)
	h.Del(fasthttp.HeaderConnection)
	forEachToken(v, func(tok []byte) {
		if !protectedFromConnection(tok) {
			h.DelBytes(tok)
		}
	})
}

// delProxyHeaders removes every Proxy-* header. Names are copied aside
// first because deleting while iterating is undefined; a request with more
// than 16 of them keeps the rest, which is harmless.
func delProxyHeaders(h header) {
	var store [512]byte
	var ends [16]int
	buf, n := store[:0], 0
	for k := range h.All() {
		if len(k) >= 6 && equalFold(k[:6], "proxy-") && n < len(ends) && len(buf)+len(k) <= cap(buf) {
			buf = append(buf, k...)
			ends[n] = len(buf)
			n++
		}
	}
	start := 0
	for i := range n {
		h.DelBytes(buf[start:ends[i]])
		start = ends[i]
	}
}

// StripResponse removes the hop-by-hop headers of an upstream response and
// reports whether the upstream asked to close its connection. The
// response's own connection-close flag is cleared: the client connection's
// fate is not the upstream's to decide.
func StripResponse(h *fasthttp.ResponseHeader) (upstreamClose bool) {
	upstreamClose = h.ConnectionClose()
	h.ResetConnectionClose()
	var f Fields
	for k := range h.All() {
		switch len(k) {
		case 2:
			if equalFold(k, "te") {
				f |= HasTE
			}
		case 7:
			if equalFold(k, "upgrade") {
				f |= HasUpgrade
			} else if equalFold(k, "trailer") {
				f |= HasTrailer
			}
		case 10:
			if equalFold(k, "connection") {
				f |= HasConnection
			} else if equalFold(k, "keep-alive") {
				f |= HasKeepAlive
			}
		}
		if len(k) >= 6 && equalFold(k[:6], "proxy-") {
			f |= HasProxy
		}
	}
	if f == 0 {
		return upstreamClose
	}
	delHopByHop(h, f)
	if f&HasTE != 0 {
		h.Del(fasthttp.HeaderTE)
	}
	h.ResetConnectionClose()
	return upstreamClose
}

// forEachToken calls f for each comma-separated token of a header value,
// trimmed of whitespace; empty elements are skipped.
func forEachToken(v []byte, f func(tok []byte)) {
	for len(v) > 0 {
		i := bytes.IndexByte(v, ',')
		var tok []byte
		if i < 0 {
			tok, v = v, nil
		} else {
			tok, v = v[:i], v[i+1:]
		}
		if tok = trimOWS(tok); len(tok) > 0 {
			f(tok)
		}
	}
}

// hasToken reports whether the comma-separated list v holds tok (any case),
// ignoring parameters such as "trailers;q=1".
func hasToken(v []byte, tok string) bool {
	found := false
	forEachToken(v, func(t []byte) {
		if i := bytes.IndexByte(t, ';'); i >= 0 {
			t = trimOWS(t[:i])
		}
		if equalFold(t, tok) {
			found = true
		}
	})
	return found
}
