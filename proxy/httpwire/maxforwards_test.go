package httpwire

import (
	"bufio"
	"strconv"
	"strings"
	"testing"

	"github.com/valyala/fasthttp"
)

func readHeader(t *testing.T, raw string) (*fasthttp.RequestHeader, Fields) {
	t.Helper()
	var h fasthttp.RequestHeader
	if err := h.Read(bufio.NewReader(strings.NewReader(raw))); err != nil {
		t.Fatalf("reading %q: %v", raw, err)
	}
	s, err := ScanRequestHeaders(h.RawHeaders(), "")
	if err != nil {
		t.Fatalf("scanning %q: %v", raw, err)
	}
	return &h, s.Fields
}

func TestMaxForwards(t *testing.T) {
	tests := []struct {
		name, raw string
		final     bool
		bad       bool
		sent      string // the Max-Forwards the request goes on with
	}{
		{"OPTIONS at 0 ends here", "OPTIONS * HTTP/1.1\r\nHost: a\r\nMax-Forwards: 0\r\n\r\n", true, false, "0"},
		{"TRACE at 0 ends here", "TRACE / HTTP/1.1\r\nHost: a\r\nmax-forwards:  0 \r\n\r\n", true, false, "0"},
		{"OPTIONS goes on one lower", "OPTIONS / HTTP/1.1\r\nHost: a\r\nMax-Forwards: 10\r\n\r\n", false, false, "9"},
		{"TRACE at 1 goes on at 0", "TRACE / HTTP/1.1\r\nHost: a\r\nMax-Forwards: 1\r\n\r\n", false, false, "0"},
		{"a huge value is lowered", "OPTIONS / HTTP/1.1\r\nHost: a\r\nMax-Forwards: 99999999999999999999999\r\n\r\n", false, false, "2147483646"},
		{"GET ignores it", "GET / HTTP/1.1\r\nHost: a\r\nMax-Forwards: 0\r\n\r\n", false, false, "0"},
		{"POST ignores a bad one", "POST / HTTP/1.1\r\nHost: a\r\nMax-Forwards: x\r\nContent-Length: 0\r\n\r\n", false, false, "x"},
		{"OPTIONS without it", "OPTIONS / HTTP/1.1\r\nHost: a\r\n\r\n", false, false, ""},
		{"not a number", "OPTIONS / HTTP/1.1\r\nHost: a\r\nMax-Forwards: -1\r\n\r\n", false, true, "-1"},
		{"empty", "TRACE / HTTP/1.1\r\nHost: a\r\nMax-Forwards:\r\n\r\n", false, true, ""},
		{"a list", "OPTIONS / HTTP/1.1\r\nHost: a\r\nMax-Forwards: 3, 4\r\n\r\n", false, true, "3, 4"},
		{"repeated", "OPTIONS / HTTP/1.1\r\nHost: a\r\nMax-Forwards: 3\r\nMax-Forwards: 3\r\n\r\n", false, true, "3"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h, f := readHeader(t, tt.raw)
			final, err := MaxForwards(h, f)
			if final != tt.final || (err != nil) != tt.bad {
				t.Fatalf("final %v, err %v; want final %v, refused %v", final, err, tt.final, tt.bad)
			}
			if got := string(h.Peek("Max-Forwards")); got != tt.sent {
				t.Errorf("Max-Forwards %q after, want %q", got, tt.sent)
			}
		})
	}
}

func TestTraceEcho(t *testing.T) {
	h, _ := readHeader(t, "TRACE /a?b=1 HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer s3cret\r\nX-Trace: yes\r\ncookie: id=1\r\nProxy-Authorization: Basic x\r\nMax-Forwards: 0\r\n\r\n")
	want := "TRACE /a?b=1 HTTP/1.1\r\nHost: a\r\nX-Trace: yes\r\nMax-Forwards: 0\r\n\r\n"
	if got := string(TraceEcho(h)); got != want {
		t.Errorf("echo\n%q\nwant\n%q", got, want)
	}
}

// FuzzMaxForwards feeds arbitrary Max-Forwards values and header blocks to
// OPTIONS and TRACE requests: a request goes on only with one decimal
// value one lower than it came with (capped), ends here only at 0, and its
// TRACE echo never carries credentials.
func FuzzMaxForwards(f *testing.F) {
	f.Add("OPTIONS", "Max-Forwards: 3\r\n")
	f.Add("TRACE", "Max-Forwards: 0\r\nAuthorization: x\r\n")
	f.Add("OPTIONS", "Max-Forwards: 1\r\nMax-Forwards: 1\r\n")
	f.Add("TRACE", "max-forwards: 99999999999999999999\r\nCookie: a\r\n")
	f.Fuzz(func(t *testing.T, method, headers string) {
		var h fasthttp.RequestHeader
		raw := method + " / HTTP/1.1\r\nHost: a\r\n" + headers + "\r\n"
		if err := h.Read(bufio.NewReader(strings.NewReader(raw))); err != nil {
			return
		}
		s, err := ScanRequestHeaders(h.RawHeaders(), "")
		if err != nil {
			return
		}
		came := string(h.Peek("Max-Forwards"))
		final, err := MaxForwards(&h, s.Fields)
		if !(h.IsOptions() || h.IsTrace()) {
			if final || err != nil || string(h.Peek("Max-Forwards")) != came {
				t.Fatalf("%s: final %v, err %v, Max-Forwards %q → %q; other methods are left alone", method, final, err, came, h.Peek("Max-Forwards"))
			}
			return
		}
		if h.IsTrace() {
			echo := strings.ToLower(string(TraceEcho(&h)))
			for _, name := range []string{"\nauthorization:", "\nproxy-authorization:", "\ncookie:"} {
				if strings.Contains(echo, name) {
					t.Fatalf("TRACE echo carries %s: %q", name, echo)
				}
			}
		}
		if err != nil || final || s.Fields&HasMaxForwards == 0 {
			return
		}
		n, perr := strconv.Atoi(came)
		went, gerr := strconv.Atoi(string(h.Peek("Max-Forwards")))
		if gerr != nil || went < 0 || (perr == nil && went != min(n, maxForwardsCeiling)-1) || (perr != nil && went != maxForwardsCeiling-1) {
			t.Fatalf("Max-Forwards %q went on as %q", came, h.Peek("Max-Forwards"))
		}
	})
}
