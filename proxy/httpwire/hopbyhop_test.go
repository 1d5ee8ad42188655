package httpwire

import (
	"bufio"
	"fmt"
	"iter"
	"strings"
	"testing"

	"github.com/valyala/fasthttp"
)

// parseRequest reads a raw request the way the proxies' fasthttp server
// does, so the tests see the header storage StripRequest works on.
func parseRequest(t testing.TB, raw string) *fasthttp.Request {
	t.Helper()
	var req fasthttp.Request
	if err := req.Header.Read(bufio.NewReader(strings.NewReader(raw))); err != nil {
		t.Skipf("fasthttp refuses the request itself: %v", err)
	}
	return &req
}

func headerNames(h interface {
	All() iter.Seq2[[]byte, []byte]
}) []string {
	var out []string
	for k := range h.All() {
		out = append(out, strings.ToLower(string(k)))
	}
	return out
}

func TestStripRequest(t *testing.T) {
	tests := []struct {
		name string
		raw  string
		gone []string
		kept map[string]string
	}{
		{
			name: "connection and the headers it names",
			raw:  "GET / HTTP/1.1\r\nHost: a\r\nConnection: keep-alive, X-Secret , x-other\r\nX-Secret: 1\r\nX-Other: 2\r\nX-Keep: 3\r\n\r\n",
			gone: []string{"connection", "x-secret", "x-other"},
			kept: map[string]string{"X-Keep": "3", "Host": "a"},
		},
		{
			name: "connection cannot remove routing or framing",
			raw:  "POST / HTTP/1.1\r\nHost: a\r\nConnection: host, content-length, x-request-id\r\nX-Request-Id: r1\r\nContent-Length: 0\r\n\r\n",
			gone: []string{"connection"},
			kept: map[string]string{"Host": "a", "X-Request-Id": "r1"},
		},
		{
			name: "every fixed hop-by-hop header",
			raw: "GET / HTTP/1.1\r\nHost: a\r\nKeep-Alive: timeout=5\r\nProxy-Authorization: Basic x\r\nProxy-Connection: keep-alive\r\n" +
				"TE: gzip\r\nTrailer: X-T\r\nUpgrade: websocket\r\nExpect: 100-continue\r\nAccept: */*\r\n\r\n",
			gone: []string{"keep-alive", "proxy-authorization", "proxy-connection", "te", "trailer", "upgrade", "expect"},
			kept: map[string]string{"Accept": "*/*"},
		},
		{
			name: "TE trailers survives",
			raw:  "GET / HTTP/1.1\r\nHost: a\r\nTE: deflate, trailers;q=1\r\n\r\n",
			kept: map[string]string{"TE": "trailers"},
		},
		{
			name: "several connection lines form one list",
			raw:  "GET / HTTP/1.1\r\nHost: a\r\nConnection: keep-alive\r\nConnection: X-Second\r\nX-Second: leaked\r\nX-Keep: 3\r\n\r\n",
			gone: []string{"connection", "x-second"},
			kept: map[string]string{"X-Keep": "3"},
		},
		{
			name: "a connection list longer than the stack room",
			raw:  "GET / HTTP/1.1\r\nHost: a\r\nConnection: " + strings.Repeat("x-pad, ", 60) + "X-Last\r\nX-Last: leaked\r\n\r\n",
			gone: []string{"connection", "x-last"},
		},
		{
			name: "more proxy headers than one pass holds",
			raw:  "GET / HTTP/1.1\r\nHost: a\r\n" + manyProxyHeaders(20) + "Proxy-" + strings.Repeat("l", 600) + ": 1\r\nProxy-Authorization: Basic c2VjcmV0\r\nX-Keep: 3\r\n\r\n",
			gone: []string{"proxy-authorization", "proxy-x00", "proxy-x19", "proxy-" + strings.Repeat("l", 600)},
			kept: map[string]string{"X-Keep": "3"},
		},
		{
			name: "connection close is not forwarded",
			raw:  "GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
			gone: []string{"connection"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			req := parseRequest(t, tc.raw)
			s, err := ScanRequestHeaders(req.Header.RawHeaders(), "")
			if err != nil {
				t.Fatal(err)
			}
			StripRequest(&req.Header, s.Fields)
			out := string(req.Header.Header())
			for _, g := range tc.gone {
				for _, n := range headerNames(&req.Header) {
					if n == g {
						t.Errorf("%s still present:\n%s", g, out)
					}
				}
			}
			if req.Header.ConnectionClose() {
				t.Errorf("connection-close flag still set:\n%s", out)
			}
			for k, v := range tc.kept {
				if got := string(req.Header.Peek(k)); got != v {
					t.Errorf("%s = %q, want %q:\n%s", k, got, v, out)
				}
			}
		})
	}
}

func TestStripResponse(t *testing.T) {
	raw := "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close, X-Hop\r\nX-Hop: 1\r\nKeep-Alive: timeout=5\r\n" +
		"Proxy-Authenticate: Basic\r\nProxy-A: 1\r\nTrailer: X-T\r\nUpgrade: h2c\r\nTE: trailers\r\nX-Keep: 1\r\n\r\nok"
	var resp fasthttp.Response
	if err := resp.Read(bufio.NewReader(strings.NewReader(raw))); err != nil {
		t.Fatal(err)
	}
	if !StripResponse(&resp.Header) {
		t.Error("upstream close not reported")
	}
	if resp.Header.ConnectionClose() {
		t.Error("connection-close flag still set")
	}
	for _, n := range headerNames(&resp.Header) {
		switch n {
		case "connection", "x-hop", "keep-alive", "proxy-authenticate", "proxy-a", "trailer", "upgrade", "te":
			t.Errorf("%s still present:\n%s", n, resp.Header.Header())
		}
	}
	if string(resp.Header.Peek("X-Keep")) != "1" {
		t.Errorf("end-to-end header lost:\n%s", resp.Header.Header())
	}
}

func TestAsksUpgrade(t *testing.T) {
	for _, tc := range []struct {
		name, head string
		want       bool
	}{
		{"WebSocket handshake", "GET / HTTP/1.1\r\nHost: a\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n", true},
		{"token among others, any case", "GET / HTTP/1.1\r\nHost: a\r\nConnection: keep-alive, upgrade\r\nUpgrade: websocket\r\n\r\n", true},
		{"no Connection token", "GET / HTTP/1.1\r\nHost: a\r\nConnection: keep-alive\r\nUpgrade: websocket\r\n\r\n", false},
		{"no Upgrade", "GET / HTTP/1.1\r\nHost: a\r\nConnection: Upgrade\r\n\r\n", false},
		{"HTTP/1.0", "GET / HTTP/1.0\r\nHost: a\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n", false},
		{"with a body", "POST / HTTP/1.1\r\nHost: a\r\nConnection: Upgrade\r\nUpgrade: h2c\r\nContent-Length: 3\r\n\r\n", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := parseRequest(t, tc.head)
			s, err := ScanRequestHeaders(req.Header.RawHeaders(), "")
			if err != nil {
				t.Fatal(err)
			}
			if got := asksUpgrade(&req.Header, s.Fields); got != tc.want {
				t.Fatalf("asksUpgrade = %v, want %v", got, tc.want)
			}
		})
	}
}

// addDate changes nothing of a response but its Date: every field, in
// its order, with the flags fasthttp keeps beside them (Content-Length,
// Content-Type, Server, cookies, the status line) reads back as it was.
// The Date itself is checked end to end (fasttest.CheckDate): only a
// server's response header can be told to leave Date out.
func TestAddDateKeepsTheFields(t *testing.T) {
	for _, raw := range []string{
		"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Type: application/json\r\nServer: up\r\n" +
			"Set-Cookie: a=1; Path=/\r\nSet-Cookie: b=2\r\nX-Multi: 1\r\nx-lower: v\r\nX-Multi: 2\r\nContent-Encoding: gzip\r\n\r\nok",
		"HTTP/1.1 404 Gone Fishing\r\nTransfer-Encoding: chunked\r\nCache-Control: no-store\r\n\r\n0\r\n\r\n",
		"HTTP/1.1 304 Not Modified\r\nETag: \"x\"\r\nContent-Length: 10\r\n\r\n",
		"HTTP/1.1 204 No Content\r\nX-A: 1\r\n\r\n",
		"HTTP/1.1 200 OK\r\n\r\n",
	} {
		var resp fasthttp.Response
		resp.Header.SetNoDefaultContentType(true)
		if err := resp.Header.Read(bufio.NewReader(strings.NewReader(raw))); err != nil {
			t.Fatal(err)
		}
		want := withoutDate(resp.Header.String())
		cl := resp.Header.ContentLength()
		addDate(&resp.Header)
		if got := withoutDate(resp.Header.String()); got != want {
			t.Errorf("addDate changed\n%q\ninto\n%q", want, got)
		}
		if got := resp.Header.ContentLength(); got != cl {
			t.Errorf("%q: Content-Length %d, was %d", raw, got, cl)
		}
	}
}

// FuzzAddDate: whatever response head fasthttp reads, addDate leaves its
// fields, status line and framing as they were. A status that has no body
// (1xx, 204, 304) has no framing to keep: fasthttp writes no
// Transfer-Encoding on it, so a chunked one reads back as no framing.
func FuzzAddDate(f *testing.F) {
	f.Add("200 OK", "Content-Length: 2\r\nSet-Cookie: a=1\r\nX-A: 1\r\n")
	f.Add("304 Not Modified", "ETag: \"e\"\r\nContent-Length: 7\r\n")
	f.Add("204 No Content", "Transfer-Encoding: chunked\r\n")
	f.Add("404 Nope", "Content-Type: text/html\r\nContent-Encoding: br\r\nServer: s\r\nTrailer: X-T\r\n")
	f.Add("200 OK", "X-Folded: a\r\n \r\n") // an empty obs-fold: fasthttp keeps "a ", reads back "a"
	f.Fuzz(func(t *testing.T, status, fields string) {
		var h fasthttp.ResponseHeader
		h.SetNoDefaultContentType(true)
		if err := h.Read(bufio.NewReader(strings.NewReader("HTTP/1.1 " + status + "\r\n" + fields + "\r\n"))); err != nil {
			return
		}
		want, cl, code := withoutDate(h.String()), h.ContentLength(), h.StatusCode()
		bodiless := code < 200 || code == fasthttp.StatusNoContent || code == fasthttp.StatusNotModified
		addDate(&h)
		if got := withoutDate(h.String()); got != want || (h.ContentLength() != cl && !bodiless) || h.StatusCode() != code {
			t.Fatalf("addDate changed\n%q (length %d)\ninto\n%q (length %d)", want, cl, got, h.ContentLength())
		}
	})
}

// withoutDate is head without its Date field, each line trimmed of
// trailing whitespace: that is no part of a field's value (RFC 9110 §5.5),
// and fasthttp keeps some (an obs-fold of blanks becomes a trailing space)
// that its next read drops.
func withoutDate(head string) string {
	var b strings.Builder
	for line := range strings.SplitSeq(head, "\r\n") {
		if !strings.HasPrefix(strings.ToLower(line), "date:") {
			b.WriteString(strings.TrimRight(line, " \t") + "\r\n")
		}
	}
	return b.String()
}

// BenchmarkStripResponse: a response that came with a Date, and one that
// came without (addDate).
func BenchmarkStripResponse(b *testing.B) {
	for _, bc := range []struct{ name, date string }{
		{"dated", "Date: Mon, 30 Nov 2026 10:00:00 GMT\r\n"},
		{"undated", ""},
	} {
		raw := "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n" + bc.date + "X-Request-Id: 0123456789abcdef\r\n\r\n"
		b.Run(bc.name, func(b *testing.B) {
			var h fasthttp.ResponseHeader
			br := bufio.NewReader(nil)
			src := strings.NewReader(raw)
			b.ReportAllocs()
			for b.Loop() {
				src.Reset(raw)
				br.Reset(src)
				if err := h.Read(br); err != nil {
					b.Fatal(err)
				}
				StripResponse(&h)
			}
		})
	}
}

// FuzzStripRequest feeds arbitrary header blocks through fasthttp's parser,
// the framing scan and the stripping, and checks that no hop-by-hop header
// and no header named by Connection survives.
func FuzzStripRequest(f *testing.F) {
	f.Add("Connection: x-a, keep-alive\r\nX-A: 1\r\nKeep-Alive: 1\r\n")
	f.Add("Proxy-Authorization: x\r\nProxy-Foo: y\r\nTE: trailers\r\n")
	f.Add("Upgrade: h2c\r\nConnection: Upgrade\r\nTrailer: x\r\n")
	f.Fuzz(func(t *testing.T, headers string) {
		var req fasthttp.Request
		raw := "GET / HTTP/1.1\r\nHost: a\r\n" + headers + "\r\n"
		if err := req.Header.Read(bufio.NewReader(strings.NewReader(raw))); err != nil {
			return
		}
		s, err := ScanRequestHeaders(req.Header.RawHeaders(), "")
		if err != nil {
			return
		}
		var named []string
		forEachToken(req.Header.Peek("Connection"), func(tok []byte) {
			if !protectedFromConnection(tok) {
				named = append(named, strings.ToLower(string(tok)))
			}
		})
		StripRequest(&req.Header, s.Fields)
		proxyCount := 0
		for _, n := range headerNames(&req.Header) {
			switch {
			case n == "connection", n == "keep-alive", n == "trailer", n == "upgrade", n == "expect":
				t.Fatalf("%s survived in %q", n, req.Header.Header())
			case n == "te" && string(req.Header.Peek("TE")) != "trailers":
				t.Fatalf("TE other than trailers survived in %q", req.Header.Header())
			case strings.HasPrefix(n, "proxy-"):
				proxyCount++
			}
			for _, m := range named {
				if n == m && len(named) <= 32 && len(req.Header.Peek("Connection")) < maxConnectionValue {
					t.Fatalf("%s named by Connection survived in %q", n, req.Header.Header())
				}
			}
		}
		if proxyCount > 0 && proxyCount <= 16 && strings.Count(strings.ToLower(headers), "proxy-") <= 16 {
			t.Fatalf("Proxy-* survived in %q", req.Header.Header())
		}
	})
}

func BenchmarkStripRequest(b *testing.B) {
	raw := "GET / HTTP/1.1\r\nHost: a\r\nConnection: keep-alive\r\nAccept: */*\r\nUser-Agent: x\r\n\r\n"
	var req fasthttp.Request
	b.ReportAllocs()
	for b.Loop() {
		if err := req.Header.Read(bufio.NewReader(strings.NewReader(raw))); err != nil {
			b.Fatal(err)
		}
		s, _ := ScanRequestHeaders(req.Header.RawHeaders(), "")
		StripRequest(&req.Header, s.Fields)
	}
}

func manyProxyHeaders(n int) string {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, "Proxy-X%02d: %d\r\n", i, i)
	}
	return b.String()
}

// TestStripRequestAllocatesNothing: clients that send Connection or
// Proxy-Connection on every request stay on the allocation-free path.
func TestStripRequestAllocatesNothing(t *testing.T) {
	raw := "GET / HTTP/1.1\r\nHost: a\r\nConnection: keep-alive, X-Hop\r\nX-Hop: 1\r\nProxy-Connection: keep-alive\r\nKeep-Alive: 5\r\n\r\n"
	req := parseRequest(t, raw)
	s, err := ScanRequestHeaders(req.Header.RawHeaders(), "")
	if err != nil {
		t.Fatal(err)
	}
	var h fasthttp.RequestHeader
	allocs := testing.AllocsPerRun(200, func() {
		req.Header.CopyTo(&h)
		StripRequest(&h, s.Fields)
	})
	if allocs != 0 {
		t.Fatalf("%.1f allocations per request, want 0", allocs)
	}
	if len(h.Peek("X-Hop")) != 0 || len(h.Peek("Proxy-Connection")) != 0 {
		t.Fatalf("not stripped:\n%s", h.Header())
	}
}
