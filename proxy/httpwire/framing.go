package httpwire

import (
	"bytes"
	"errors"
	"strconv"
)

// FramingError is why a request was refused before it was forwarded. The
// proxies answer it with 400 and close the connection: a request whose
// framing two parsers could read differently is how smuggling works.
type FramingError struct{ msg string }

func (e *FramingError) Error() string { return e.msg }

// The framing problems ScanRequestHeaders reports.
var (
	ErrContentLengthAndTransferEncoding = &FramingError{"both Content-Length and Transfer-Encoding"}
	ErrDuplicateContentLength           = &FramingError{"more than one Content-Length"}
	ErrBadContentLength                 = &FramingError{"Content-Length is not a decimal number"}
	ErrDuplicateTransferEncoding        = &FramingError{"more than one Transfer-Encoding"}
	ErrUnsupportedTransferEncoding      = &FramingError{"Transfer-Encoding other than chunked"}
	ErrObsFold                          = &FramingError{"obsolete line folding in a header"}
	ErrBareLF                           = &FramingError{"header line not ended by CRLF"}
	ErrBadHeaderName                    = &FramingError{"invalid header name"}
	ErrBadHeaderValue                   = &FramingError{"control character in a header value"}
	ErrDuplicateHost                    = &FramingError{"more than one Host"}
	ErrMissingHost                      = &FramingError{"HTTP/1.1 request without Host"}
)

// Fields records which headers of interest a request carries.
type Fields uint32

// Header presence flags.
const (
	HasContentLength Fields = 1 << iota
	HasTransferEncoding
	HasHost
	HasConnection
	HasKeepAlive
	HasProxy // any Proxy-* header
	HasTE
	HasTrailer
	HasUpgrade
	HasExpect
	HasRequestID
	HasIdempotencyKey // with a non-empty value
	HasWant           // the header the caller asked for
	HasMaxForwards
	HasForwardedFor   // X-Forwarded-For
	HasForwardedProto // X-Forwarded-Proto

	hopByHop = HasConnection | HasKeepAlive | HasProxy | HasTE | HasTrailer | HasUpgrade | HasExpect
)

// HopByHop reports whether any hop-by-hop header is present.
func (f Fields) HopByHop() bool { return f&hopByHop != 0 }

// Scan is what ScanRequestHeaders found.
type Scan struct {
	Fields Fields
	// Want is the value of the header the caller asked for (the first one
	// when repeated), aliasing the raw block; nil when absent.
	Want []byte
}

// ScanRequestHeaders checks the raw header block of a request (the lines
// after the request line, as fasthttp's RequestHeader.RawHeaders keeps
// them) for framing that could be read two ways, and notes the headers the
// proxy must act on. want is a lower-case header name whose value the
// caller needs (the tenant header), or "".
//
// It refuses, whatever fasthttp tolerates: Content-Length together with
// Transfer-Encoding, a repeated or non-numeric Content-Length, any
// Transfer-Encoding but a single "chunked", obsolete line folding, lines
// not ended by CRLF, header names that are not tokens, control characters
// in values, a repeated Host, and a repeated want header (a request names
// one tenant).
func ScanRequestHeaders(raw []byte, want string) (Scan, error) {
	var s Scan
	b := raw
	for len(b) > 0 {
		i := bytes.IndexByte(b, '\n')
		if i < 0 || i == 0 || b[i-1] != '\r' {
			return s, ErrBareLF
		}
		line := b[:i-1]
		b = b[i+1:]
		if len(line) == 0 {
			// The blank line ends the block; nothing may follow it.
			if len(b) != 0 {
				return s, ErrBareLF
			}
			break
		}
		if line[0] == ' ' || line[0] == '\t' {
			return s, ErrObsFold
		}
		// One pass finds the colon and checks that the name is a token.
		colon := 0
		for colon < len(line) && tokenTable[line[colon]] {
			colon++
		}
		if colon == 0 || colon == len(line) || line[colon] != ':' {
			return s, ErrBadHeaderName
		}
		name := line[:colon]
		value := trimOWS(line[colon+1:])
		if !validValue(value) {
			return s, ErrBadHeaderValue
		}
		f, err := classify(name, value, s.Fields)
		if err != nil {
			return s, err
		}
		s.Fields |= f
		if want != "" && len(name) == len(want) && equalFold(name, want) {
			if s.Fields&HasWant != 0 {
				// The cap would count the first, and the upstream might
				// read the last, or both joined.
				return s, &FramingError{"more than one " + want + " header"}
			}
			s.Fields |= HasWant
			s.Want = value
		}
	}
	if s.Fields&HasContentLength != 0 && s.Fields&HasTransferEncoding != 0 {
		return s, ErrContentLengthAndTransferEncoding
	}
	return s, nil
}

// classify names the header and checks the framing ones; seen holds the
// flags of the lines before it.
func classify(name, value []byte, seen Fields) (Fields, error) {
	switch len(name) {
	case 2:
		if equalFold(name, "te") {
			return HasTE, nil
		}
	case 4:
		if equalFold(name, "host") {
			if seen&HasHost != 0 {
				return 0, ErrDuplicateHost
			}
			return HasHost, nil
		}
	case 6:
		if equalFold(name, "expect") {
			return HasExpect, nil
		}
	case 7:
		if equalFold(name, "upgrade") {
			return HasUpgrade, nil
		}
		if equalFold(name, "trailer") {
			return HasTrailer, nil
		}
	case 10:
		if equalFold(name, "connection") {
			return HasConnection, nil
		}
		if equalFold(name, "keep-alive") {
			return HasKeepAlive, nil
		}
	case 12:
		// An empty id is no id: the ingress gives the request one.
		if equalFold(name, "x-request-id") && len(value) > 0 {
			return HasRequestID, nil
		}
		if equalFold(name, "max-forwards") {
			return HasMaxForwards, nil
		}
	case 14:
		if equalFold(name, "content-length") {
			if seen&HasContentLength != 0 {
				return 0, ErrDuplicateContentLength
			}
			if len(value) == 0 || len(value) > 18 {
				return 0, ErrBadContentLength
			}
			for _, c := range value {
				if c < '0' || c > '9' {
					return 0, ErrBadContentLength
				}
			}
			return HasContentLength, nil
		}
	case 15:
		if equalFold(name, "x-forwarded-for") {
			return HasForwardedFor, nil
		}
		if equalFold(name, "idempotency-key") {
			if len(value) == 0 {
				return 0, nil // no key: nothing makes a retry safe
			}
			return HasIdempotencyKey, nil
		}
	case 17:
		if equalFold(name, "x-forwarded-proto") {
			return HasForwardedProto, nil
		}
		if equalFold(name, "transfer-encoding") {
			if seen&HasTransferEncoding != 0 {
				return 0, ErrDuplicateTransferEncoding
			}
			if !equalFold(value, "chunked") {
				return 0, ErrUnsupportedTransferEncoding
			}
			return HasTransferEncoding, nil
		}
	}
	if len(name) >= 6 && equalFold(name[:6], "proxy-") {
		return HasProxy, nil
	}
	return 0, nil
}

// trimOWS drops the optional whitespace around a field value.
func trimOWS(b []byte) []byte {
	for len(b) > 0 && (b[0] == ' ' || b[0] == '\t') {
		b = b[1:]
	}
	for len(b) > 0 && (b[len(b)-1] == ' ' || b[len(b)-1] == '\t') {
		b = b[:len(b)-1]
	}
	return b
}

// equalFold compares ASCII b with lower-case s, ignoring b's case.
func equalFold(b []byte, s string) bool {
	if len(b) != len(s) {
		return false
	}
	for i := range len(b) {
		c := b[i]
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != s[i] {
			return false
		}
	}
	return true
}

// tokenTable marks the tchar bytes of RFC 9110 §5.6.2.
var tokenTable = func() (t [256]bool) {
	for c := '0'; c <= '9'; c++ {
		t[c] = true
	}
	for c := 'a'; c <= 'z'; c++ {
		t[c] = true
		t[c-'a'+'A'] = true
	}
	for _, c := range "!#$%&'*+-.^_`|~" {
		t[c] = true
	}
	return t
}()

const (
	lsb = 0x0101010101010101
	msb = 0x8080808080808080
)

// validValue reports whether a field value is free of control characters
// other than HTAB (obs-text bytes ≥ 0x80 are allowed). It tests eight bytes
// at a time: values are most of a header block's bytes.
func validValue(v []byte) bool {
	for len(v) >= 8 {
		x := uint64(v[0]) | uint64(v[1])<<8 | uint64(v[2])<<16 | uint64(v[3])<<24 |
			uint64(v[4])<<32 | uint64(v[5])<<40 | uint64(v[6])<<48 | uint64(v[7])<<56
		// A byte below 0x20 or equal to 0x7f sets its high bit in one of
		// the two masks; bytes ≥ 0x80 are excluded by &^x.
		lt := (x - 0x20*lsb) &^ x & msb
		del := x ^ 0x7f*lsb
		eq := (del - lsb) &^ del & msb
		if lt|eq != 0 {
			if !validValueSlow(v[:8]) {
				return false
			}
		}
		v = v[8:]
	}
	return validValueSlow(v)
}

func validValueSlow(v []byte) bool {
	for _, c := range v {
		if (c < ' ' && c != '\t') || c == 0x7f {
			return false
		}
	}
	return true
}

// CheckVersion refuses a request line's version that an HTTP/1.1 proxy
// cannot pass on: anything but HTTP/1.x. fasthttp reads "HTTP/2.0" (which
// needs no Host) or "HTTP/3.0" in a request line as it would "HTTP/1.0";
// RFC 9110 §15.6.6 answers them 505, which the caller sends.
func CheckVersion(proto []byte) error {
	if len(proto) == len("HTTP/1.1") && string(proto[:len("HTTP/1.")]) == "HTTP/1." && '0' <= proto[7] && proto[7] <= '9' {
		return nil
	}
	return errors.New(strconv.Quote(string(proto)) + " is not HTTP/1.x")
}
