package httpwire

import (
	"bytes"
	"errors"
	"strconv"

	"github.com/valyala/fasthttp"
)

// ErrBadMaxForwards is a Max-Forwards on OPTIONS or TRACE that is not one
// decimal number: which hop ends the request would be a guess.
var ErrBadMaxForwards = errors.New("Max-Forwards is not one decimal number")

// maxForwardsCeiling is the largest Max-Forwards a request goes on with;
// RFC 9110 §7.6.2 lets a proxy lower it, and it keeps the value an int.
const maxForwardsCeiling = 1<<31 - 1

// MaxForwards applies Max-Forwards (RFC 9110 §7.6.2) to a request whose
// header fields are f. Only OPTIONS and TRACE honour it; for them, a value
// of 0 makes this proxy the final recipient (final is true: it must answer
// and not forward), and any other value goes on one lower. Other methods,
// and requests without the field, are left alone.
func MaxForwards(h *fasthttp.RequestHeader, f Fields) (final bool, err error) {
	if f&HasMaxForwards == 0 || !(h.IsOptions() || h.IsTrace()) {
		return false, nil
	}
	var value []byte
	n := 0
	for k, v := range h.All() {
		if equalFold(k, "max-forwards") {
			value = v
			n++
		}
	}
	if n != 1 {
		return false, ErrBadMaxForwards
	}
	hops, ok := parseHops(value)
	if !ok {
		return false, ErrBadMaxForwards
	}
	if hops == 0 {
		return true, nil
	}
	var b [10]byte
	h.SetBytesV("Max-Forwards", strconv.AppendInt(b[:0], int64(hops-1), 10))
	return false, nil
}

// parseHops reads 1*DIGIT, capping a longer number at maxForwardsCeiling.
func parseHops(v []byte) (int, bool) {
	v = bytes.TrimSpace(v)
	if len(v) == 0 {
		return 0, false
	}
	hops := 0
	for _, c := range v {
		if c < '0' || c > '9' {
			return 0, false
		}
		if hops <= (maxForwardsCeiling-9)/10 {
			hops = hops*10 + int(c-'0')
		} else {
			hops = maxForwardsCeiling
		}
	}
	return hops, true
}

// TraceEcho is the body a final recipient answers TRACE with (RFC 9110
// §9.3.8, as message/http): the request line and header fields as
// received, without the ones likely to carry credentials.
func TraceEcho(h *fasthttp.RequestHeader) []byte {
	b := make([]byte, 0, 256+len(h.RawHeaders()))
	b = append(b, h.Method()...)
	b = append(b, ' ')
	b = append(b, h.RequestURI()...)
	b = append(b, ' ')
	b = append(b, h.Protocol()...)
	b = append(b, "\r\n"...)
	raw := h.RawHeaders()
	for len(raw) > 0 {
		i := bytes.IndexByte(raw, '\n')
		if i < 0 {
			break
		}
		line := raw[:i+1]
		raw = raw[i+1:]
		if name, _, ok := bytes.Cut(line, []byte(":")); ok && sensitive(name) {
			continue
		}
		b = append(b, line...)
	}
	if !bytes.HasSuffix(b, []byte("\r\n\r\n")) {
		b = append(b, "\r\n"...) // the blank line that ends the head
	}
	return b
}

// sensitive names the request fields a TRACE echo leaves out.
func sensitive(name []byte) bool {
	return equalFold(name, "authorization") || equalFold(name, "proxy-authorization") || equalFold(name, "cookie")
}
