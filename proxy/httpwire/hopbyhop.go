package httpwire

import (
	"bufio"
	"bytes"
	"iter"
	"sync"

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

// maxConnectionValue is the room kept on the stack for the Connection
// values; longer ones (rare) are copied to the heap, never cut, since a
// token left unhonoured would pass a header on.
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

// asksUpgrade reports whether a request whose scan found f asks to switch
// protocols (RFC 9110 §7.8) as the ingress passes on: HTTP/1.1 (an
// HTTP/1.0 request's Upgrade is to be ignored), an Upgrade field,
// "upgrade" among Connection's tokens, and no body, as a WebSocket
// handshake has none.
func asksUpgrade(h *fasthttp.RequestHeader, f Fields) bool {
	if f&HasUpgrade == 0 || f&HasConnection == 0 || !h.IsHTTP11() {
		return false
	}
	if cl := h.ContentLength(); cl != 0 && cl != -2 {
		return false
	}
	return hasToken(h.Peek(fasthttp.HeaderConnection), "upgrade")
}

// StripRequestKeepingUpgrade is StripRequest, except that a request that
// asks to switch protocols (asksUpgrade) keeps its Upgrade and goes on
// with Connection: Upgrade: both are hop-by-hop, and the upstream is asked
// to switch on this connection alone. It reports whether the request
// asks to switch.
func StripRequestKeepingUpgrade(h *fasthttp.RequestHeader, f Fields) (upgrade bool) {
	if !asksUpgrade(h, f) {
		StripRequest(h, f)
		return false
	}
	protocols := append([]byte(nil), h.Peek(fasthttp.HeaderUpgrade)...)
	StripRequest(h, f)
	h.Set(fasthttp.HeaderConnection, "Upgrade")
	h.SetBytesV(fasthttp.HeaderUpgrade, protocols)
	return true
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
// names. A message may carry several Connection lines: they form one list
// (RFC 9110 §5.3), so the tokens of all of them are collected first.
func delConnectionTokens(h header) {
	var buf [maxConnectionValue]byte
	v := buf[:0]
	// Each concrete type is ranged over as itself: through the interface
	// the loop's closure, and what it captures, would go to the heap.
	switch h := h.(type) {
	case *fasthttp.RequestHeader:
		for k, val := range h.All() {
			if equalFold(k, "connection") {
				v = append(append(v, val...), ',')
			}
		}
	case *fasthttp.ResponseHeader:
		for k, val := range h.All() {
			if equalFold(k, "connection") {
				v = append(append(v, val...), ',')
			}
		}
	}
	h.Del(fasthttp.HeaderConnection)
	for len(v) > 0 {
		var tok []byte
		tok, v = nextToken(v)
		if len(tok) > 0 && !protectedFromConnection(tok) {
			delBytes(h, tok)
		}
	}
}

// delProxyHeaders removes every Proxy-* header. Names are copied aside
// first because deleting while iterating is undefined; the room on the
// stack holds the usual few, and more (rare) grow onto the heap.
func delProxyHeaders(h header) {
	var store [512]byte
	var endStore [16]int
	names, ends := store[:0], endStore[:0]
	// Each concrete type is ranged over as itself, as in
	// delConnectionTokens.
	switch h := h.(type) {
	case *fasthttp.RequestHeader:
		for k := range h.All() {
			if len(k) >= 6 && equalFold(k[:6], "proxy-") {
				names = append(names, k...)
				ends = append(ends, len(names))
			}
		}
	case *fasthttp.ResponseHeader:
		for k := range h.All() {
			if len(k) >= 6 && equalFold(k[:6], "proxy-") {
				names = append(names, k...)
				ends = append(ends, len(names))
			}
		}
	}
	start := 0
	for _, end := range ends {
		delBytes(h, names[start:end])
		start = end
	}
}

// delBytes deletes header name through h's concrete type: through the
// interface, name (a slice of a stack buffer) would escape to the heap.
func delBytes(h header, name []byte) {
	switch h := h.(type) {
	case *fasthttp.RequestHeader:
		h.DelBytes(name)
	case *fasthttp.ResponseHeader:
		h.DelBytes(name)
	}
}

// StripResponse removes the hop-by-hop headers of an upstream response and
// reports whether the upstream asked to close its connection. The
// response's own connection-close flag is cleared: the client connection's
// fate is not the upstream's to decide. Its status line carries warden's
// own version, HTTP/1.1, whatever the upstream's was (RFC 9110 §6.2): the
// body is framed for the client anew, chunked when its length is unknown,
// which an "HTTP/1.0" status line would forbid. A response that came
// without a Date gets one (addDate).
func StripResponse(h *fasthttp.ResponseHeader) (upstreamClose bool) {
	h.SetProtocol(http11)
	upstreamClose = h.ConnectionClose()
	h.ResetConnectionClose()
	var f Fields
	dated := false
	for k := range h.All() {
		switch len(k) {
		case 4:
			dated = dated || equalFold(k, "date")
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
	if f != 0 {
		delHopByHop(h, f)
		if f&HasTE != 0 {
			h.Del(fasthttp.HeaderTE)
		}
		h.ResetConnectionClose()
	}
	if !dated {
		addDate(h)
	}
	return upstreamClose
}

// addDate has fasthttp write its Date on a response that came without
// one, as RFC 9110 §6.6.1 asks of a recipient with a clock that passes a
// response on; a Date that came is passed on as it came (a cache reckons
// the response's age from it). fasthttp lets no setter write Date, and
// writes its own only on a header that was Reset since the request began:
// the flag that asks for it has no setter. So the header is written out,
// Reset and read back, which gives the fields it held. Only responses
// without a Date pay for it, and every HTTP server with a clock sends one.
func addDate(h *fasthttp.ResponseHeader) {
	r := rereads.Get().(*reread)
	defer rereads.Put(r)
	r.head = h.AppendBytes(r.head[:0])
	h.CopyTo(&r.kept)
	h.Reset()
	h.SetNoDefaultContentType(true)
	r.src.Reset(r.head)
	if r.br.Size() <= len(r.head) { // a head larger than any before
		r.br = bufio.NewReaderSize(&r.src, len(r.head)+1)
	}
	r.br.Reset(&r.src)
	if err := h.Read(r.br); err != nil {
		// What fasthttp wrote it can read; should it not, the response
		// goes on as it came, without a Date, rather than changed.
		r.kept.CopyTo(h)
	}
}

// reread is addDate's scratch space.
type reread struct {
	head []byte
	kept fasthttp.ResponseHeader
	src  bytes.Reader
	br   *bufio.Reader
}

var rereads = sync.Pool{New: func() any {
	r := new(reread)
	r.br = bufio.NewReaderSize(&r.src, 8<<10)
	return r
}}

var http11 = []byte("HTTP/1.1")

// forEachToken calls f for each comma-separated token of a header value,
// trimmed of whitespace; empty elements are skipped.
func forEachToken(v []byte, f func(tok []byte)) {
	for len(v) > 0 {
		var tok []byte
		if tok, v = nextToken(v); len(tok) > 0 {
			f(tok)
		}
	}
}

// nextToken splits the first element off a comma-separated list, trimmed
// of whitespace (empty for an empty element). A loop over it keeps the list
// on the stack, where a callback taking its tokens would not.
func nextToken(v []byte) (tok, rest []byte) {
	if i := bytes.IndexByte(v, ','); i >= 0 {
		return trimOWS(v[:i]), v[i+1:]
	}
	return trimOWS(v), nil
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
