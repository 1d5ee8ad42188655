package connpool

import (
	"bufio"
	"bytes"
	"io"
	"net/http/httputil"
	"strings"
	"testing"
)

func TestChunkedReader(t *testing.T) {
	tests := []struct {
		name, in, out string
		ok            bool
	}{
		{"two chunks", "5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n", "hello world", true},
		{"extension", "5;name=v\r\nhello\r\n0\r\n\r\n", "hello", true},
		{"upper hex", "A\r\n0123456789\r\n0\r\n\r\n", "0123456789", true},
		{"trailers", "1\r\nx\r\n0\r\nX-T: 1\r\nX-U: 2\r\n\r\n", "x", true},
		{"bare LF size line", "5\nhello\r\n0\r\n\r\n", "", false},
		{"no CRLF after data", "5\r\nhelloX\r\n0\r\n\r\n", "hello", false},
		{"negative", "-5\r\nhello\r\n0\r\n\r\n", "", false},
		{"empty size", "\r\nhello\r\n0\r\n\r\n", "", false},
		{"space inside size", "5 5\r\nhello\r\n", "", false},
		{"overflow", "1000000000000000\r\n", "", false},
		{"truncated data", "5\r\nhel", "hel", false},
		{"missing last chunk", "5\r\nhello\r\n", "hello", false},
		{"folded trailer", "0\r\nX: 1\r\n 2\r\n\r\n", "", false},
		{"control in extension", "5;\x00\r\nhello\r\n0\r\n\r\n", "", false},
		{"trailing whitespace", "5 \r\nhello\r\n0\t\r\n\r\n", "hello", true},
		{"whitespace before extension", "0 ;\r\n\r\n", "", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var r chunkedReader
			r.reset(bufio.NewReader(strings.NewReader(tc.in)))
			out, err := io.ReadAll(&r)
			if (err == nil) != tc.ok {
				t.Fatalf("err = %v, want ok=%v", err, tc.ok)
			}
			if string(out) != tc.out {
				t.Fatalf("out = %q, want %q", out, tc.out)
			}
		})
	}
}

// FuzzChunkedReader holds the strict decoder to the standard library's:
// whatever it accepts, net/http's decoder must accept with the same bytes.
func FuzzChunkedReader(f *testing.F) {
	f.Add([]byte("5\r\nhello\r\n0\r\n\r\n"))
	f.Add([]byte("3;x=y\r\nabc\r\n0\r\nT: 1\r\n\r\n"))
	f.Add([]byte("ff\r\n"))
	f.Fuzz(func(t *testing.T, in []byte) {
		var r chunkedReader
		r.reset(bufio.NewReaderSize(bytes.NewReader(in), 64))
		got, err := io.ReadAll(&r)
		if err != nil {
			return
		}
		want, err := io.ReadAll(httputil.NewChunkedReader(bytes.NewReader(in)))
		if err != nil {
			t.Fatalf("accepted %q, which net/http refuses: %v", in, err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("decoded %q as %q, net/http reads %q", in, got, want)
		}
	})
}

func TestAppendChunkHeader(t *testing.T) {
	for n, want := range map[int]string{1: "1\r\n", 15: "f\r\n", 16: "10\r\n", 32768: "8000\r\n"} {
		if got := string(appendChunkHeader(nil, n)); got != want {
			t.Errorf("appendChunkHeader(%d) = %q, want %q", n, got, want)
		}
	}
}
