package httpwire

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

func TestScanRequestHeaders(t *testing.T) {
	tests := []struct {
		name   string
		raw    string
		err    error
		fields Fields
		want   string
	}{
		{"plain", "Host: a\r\nAccept: */*\r\n\r\n", nil, HasHost, ""},
		{"without final blank line", "Host: a\r\n", nil, HasHost, ""},
		{"content-length", "Host: a\r\nContent-Length: 12\r\n\r\n", nil, HasHost | HasContentLength, ""},
		{"chunked", "Host: a\r\nTransfer-Encoding: chunked\r\n\r\n", nil, HasHost | HasTransferEncoding, ""},
		{"chunked any case", "Host: a\r\ntransfer-encoding: CHUNKED\r\n\r\n", nil, HasHost | HasTransferEncoding, ""},
		{"CL and TE", "Host: a\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n", ErrContentLengthAndTransferEncoding, 0, ""},
		{"TE and CL", "Transfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n", ErrContentLengthAndTransferEncoding, 0, ""},
		{"duplicate CL same value", "Content-Length: 5\r\nContent-Length: 5\r\n\r\n", ErrDuplicateContentLength, 0, ""},
		{"duplicate CL other value", "Content-Length: 5\r\ncontent-length: 6\r\n\r\n", ErrDuplicateContentLength, 0, ""},
		{"CL list", "Content-Length: 5, 5\r\n\r\n", ErrBadContentLength, 0, ""},
		{"CL signed", "Content-Length: +5\r\n\r\n", ErrBadContentLength, 0, ""},
		{"CL negative", "Content-Length: -1\r\n\r\n", ErrBadContentLength, 0, ""},
		{"CL hex", "Content-Length: 0x10\r\n\r\n", ErrBadContentLength, 0, ""},
		{"CL empty", "Content-Length: \r\n\r\n", ErrBadContentLength, 0, ""},
		{"CL huge", "Content-Length: 99999999999999999999\r\n\r\n", ErrBadContentLength, 0, ""},
		{"TE twice", "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n", ErrDuplicateTransferEncoding, 0, ""},
		{"TE identity", "Transfer-Encoding: identity\r\n\r\n", ErrUnsupportedTransferEncoding, 0, ""},
		{"TE gzip chunked", "Transfer-Encoding: gzip, chunked\r\n\r\n", ErrUnsupportedTransferEncoding, 0, ""},
		{"TE chunked list", "Transfer-Encoding: chunked, chunked\r\n\r\n", ErrUnsupportedTransferEncoding, 0, ""},
		{"TE with vertical tab", "Transfer-Encoding: \x0bchunked\r\n\r\n", ErrBadHeaderValue, 0, ""},
		{"obs-fold", "Host: a\r\nX-A: b\r\n c\r\n\r\n", ErrObsFold, 0, ""},
		{"obs-fold tab", "Host: a\r\nX-A: b\r\n\tc\r\n\r\n", ErrObsFold, 0, ""},
		{"folded TE", "Transfer-Encoding:\r\n chunked\r\n\r\n", ErrUnsupportedTransferEncoding, 0, ""},
		{"bare LF", "Host: a\nX-A: b\r\n\r\n", ErrBareLF, 0, ""},
		{"bare LF end", "Host: a\r\n\n", ErrBareLF, 0, ""},
		{"bytes after blank line", "Host: a\r\n\r\nX: y\r\n", ErrBareLF, 0, ""},
		{"space before colon", "Content-Length : 5\r\n\r\n", ErrBadHeaderName, 0, ""},
		{"space in name", "Transfer Encoding: chunked\r\n\r\n", ErrBadHeaderName, 0, ""},
		{"no colon", "Host a\r\n\r\n", ErrBadHeaderName, 0, ""},
		{"empty name", ": a\r\n\r\n", ErrBadHeaderName, 0, ""},
		{"NUL in value", "X-A: a\x00b\r\n\r\n", ErrBadHeaderValue, 0, ""},
		{"CR in value", "X-A: a\rb\r\n\r\n", ErrBadHeaderValue, 0, ""},
		{"two hosts", "Host: a\r\nHost: b\r\n\r\n", ErrDuplicateHost, 0, ""},
		{"hop-by-hop", "Connection: x-a\r\nKeep-Alive: 5\r\nTE: trailers\r\nTrailer: x\r\nUpgrade: h2c\r\nProxy-Authorization: b\r\nExpect: 100-continue\r\n\r\n",
			nil, HasConnection | HasKeepAlive | HasTE | HasTrailer | HasUpgrade | HasProxy | HasExpect, ""},
		{"ids", "X-Request-Id: r\r\nIdempotency-Key: k\r\n\r\n", nil, HasRequestID | HasIdempotencyKey, ""},
		{"forwarded", "x-forwarded-for: 10.0.0.1\r\nX-Forwarded-Proto: https\r\n\r\n", nil, HasForwardedFor | HasForwardedProto, ""},
		{"empty idempotency key", "Idempotency-Key: \r\n\r\n", nil, 0, ""},
		{"want", "X-Tenant-Id:  acme \r\n\r\n", nil, HasWant, "acme"},
		{"two wants", "X-Tenant-Id: acme\r\nx-tenant-id: other\r\n\r\n", errDuplicateWant, 0, ""},
		{"empty", "", nil, 0, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, err := ScanRequestHeaders([]byte(tc.raw), "x-tenant-id")
			if (err == nil) != (tc.err == nil) || err != nil && err.Error() != tc.err.Error() {
				t.Fatalf("err = %v, want %v", err, tc.err)
			}
			if err != nil {
				return
			}
			if s.Fields != tc.fields {
				t.Errorf("fields = %b, want %b", s.Fields, tc.fields)
			}
			if string(s.Want) != tc.want {
				t.Errorf("want = %q, want %q", s.Want, tc.want)
			}
		})
	}
}

// referenceScan is an independent, plainly written statement of the same
// rules, used as the oracle of the fuzz target.
func referenceScan(raw string) error {
	if raw == "" {
		return nil
	}
	if !strings.HasSuffix(raw, "\r\n") {
		return ErrBareLF
	}
	lines := strings.Split(strings.TrimSuffix(raw, "\r\n"), "\r\n")
	cl, te := 0, 0
	hosts, wants := 0, 0
	for i, line := range lines {
		if line == "" {
			if i != len(lines)-1 {
				return ErrBareLF
			}
			break
		}
		if strings.ContainsAny(line, "\n") {
			return ErrBareLF
		}
		if line[0] == ' ' || line[0] == '\t' {
			return ErrObsFold
		}
		name, value, ok := strings.Cut(line, ":")
		if !ok || name == "" {
			return ErrBadHeaderName
		}
		for _, c := range []byte(name) {
			if !strings.ContainsRune("!#$%&'*+-.^_`|~", rune(c)) && !('0' <= c && c <= '9' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z') {
				return ErrBadHeaderName
			}
		}
		value = strings.Trim(value, " \t")
		for _, c := range []byte(value) {
			if c < 0x20 && c != '\t' || c == 0x7f {
				return ErrBadHeaderValue
			}
		}
		switch strings.ToLower(name) {
		case "content-length":
			cl++
			if cl > 1 {
				return ErrDuplicateContentLength
			}
			if value == "" || len(value) > 18 || strings.Trim(value, "0123456789") != "" {
				return ErrBadContentLength
			}
		case "transfer-encoding":
			te++
			if te > 1 {
				return ErrDuplicateTransferEncoding
			}
			if !strings.EqualFold(value, "chunked") {
				return ErrUnsupportedTransferEncoding
			}
		case "host":
			hosts++
			if hosts > 1 {
				return ErrDuplicateHost
			}
		case "x-tenant-id":
			wants++
			if wants > 1 {
				return errDuplicateWant
			}
		}
	}
	if cl > 0 && te > 0 {
		return ErrContentLengthAndTransferEncoding
	}
	return nil
}

func FuzzScanRequestHeaders(f *testing.F) {
	for _, s := range []string{
		"Host: a\r\n\r\n",
		"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n",
		"X-A: b\r\n c\r\n\r\n",
		"Host: a\nX: b\r\n\r\n",
		"Transfer-Encoding: chunked\r\n\r\n",
		"Proxy-Connection: keep-alive\r\nConnection: close, x-y\r\n\r\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		s, err := ScanRequestHeaders(raw, "x-tenant-id")
		want := referenceScan(string(raw))
		if (err == nil) != (want == nil) {
			t.Fatalf("ScanRequestHeaders(%q) = %v, reference says %v", raw, err, want)
		}
		if err != nil {
			return
		}
		if s.Fields&HasContentLength != 0 && s.Fields&HasTransferEncoding != 0 {
			t.Fatalf("accepted both framings: %q", raw)
		}
		if s.Fields&HasWant != 0 && !bytes.Contains(bytes.ToLower(raw), bytes.ToLower(s.Want)) {
			t.Fatalf("want value %q not in %q", s.Want, raw)
		}
	})
}

func BenchmarkScanRequestHeaders(b *testing.B) {
	raw := []byte("Host: api.example.com\r\nUser-Agent: bench/1.0\r\nAccept: application/json\r\n" +
		"Content-Type: application/json\r\nContent-Length: 128\r\nX-Tenant-Id: acme\r\n" +
		"Authorization: Bearer 0123456789abcdef0123456789abcdef\r\n\r\n")
	b.ReportAllocs()
	for b.Loop() {
		if _, err := ScanRequestHeaders(raw, "x-tenant-id"); err != nil {
			b.Fatal(err)
		}
	}
}

// errDuplicateWant stands for ScanRequestHeaders' error for a repeated
// want header, whose text names the header.
var errDuplicateWant = errors.New("more than one x-tenant-id header")

func TestCheckVersion(t *testing.T) {
	for proto, want := range map[string]bool{
		"HTTP/1.1": true, "HTTP/1.0": true, "HTTP/1.2": true,
		"HTTP/2.0": false, "HTTP/3": false, "HTTP/0.9": false, "HTTP/1.": false, "HTTP/1.x": false, "": false, "HTTP/11.1": false,
	} {
		if got := CheckVersion([]byte(proto)) == nil; got != want {
			t.Errorf("CheckVersion(%q) accepts: %v, want %v", proto, got, want)
		}
	}
}
