package fasttest

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// UpstreamDate is the Date DateUpstream sends on /dated.
const UpstreamDate = "Mon, 30 Nov 2026 10:00:00 GMT"

// DateUpstream starts a net/http server (fasthttp's cannot be told what
// Date to send) that answers /dated with UpstreamDate and every other path
// without a Date: /big with a 100 KiB body (the proxies stream it),
// /chunked with a body of unknown length, /304 with 304 Not Modified, and
// anything else with "ok". None of its answers has a Content-Type.
func DateUpstream(t testing.TB) *httptest.Server {
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h["Content-Type"] = nil // none, not net/http's sniffed one
		if r.URL.Path == "/dated" {
			h.Set("Date", UpstreamDate)
		} else {
			h["Date"] = nil // net/http would add one
		}
		switch r.URL.Path {
		case "/big":
			_, _ = w.Write([]byte(strings.Repeat("b", 100<<10)))
		case "/chunked":
			_, _ = w.Write([]byte("part one, "))
			w.(http.Flusher).Flush()
			_, _ = w.Write([]byte("part two"))
		case "/304":
			w.WriteHeader(http.StatusNotModified)
		default:
			_, _ = w.Write([]byte("ok"))
		}
	}))
	t.Cleanup(s.Close)
	return s
}

// CheckDate drives Date (RFC 9110 §6.6.1) through the proxy at addr in
// front of a DateUpstream: each request goes to prefix+path with host.
// A response that came with a Date keeps it; one that came without gets
// one of the proxy's, the time it was passed on; nothing else changes.
func CheckDate(t *testing.T, addr, prefix, host string) {
	t.Helper()
	tests := []struct {
		path   string
		status int
		body   string
		date   string // "" when the proxy's
	}{
		{"/dated", 200, "ok", UpstreamDate},
		{"/undated", 200, "ok", ""},
		{"/big", 200, strings.Repeat("b", 100<<10), ""},
		{"/chunked", 200, "part one, part two", ""},
		{"/304", 304, "", ""},
	}
	for _, tt := range tests {
		before := time.Now().Add(-time.Second).Truncate(time.Second)
		resp, body := Raw(t, addr, "GET "+prefix+tt.path+" HTTP/1.1\r\nHost: "+host+"\r\nConnection: close\r\n\r\n")
		after := time.Now().Add(time.Second)
		if resp.StatusCode != tt.status || string(body) != tt.body {
			t.Errorf("%s: %d, %d body bytes; want %d, %d", tt.path, resp.StatusCode, len(body), tt.status, len(tt.body))
			continue
		}
		if ct := resp.Header.Values("Content-Type"); len(ct) != 0 {
			t.Errorf("%s: Content-Type %q was added", tt.path, ct)
		}
		dates := resp.Header.Values("Date")
		if len(dates) != 1 {
			t.Errorf("%s: Date %q, want exactly one", tt.path, dates)
			continue
		}
		if tt.date != "" {
			if dates[0] != tt.date {
				t.Errorf("%s: Date %q, want the upstream's %q", tt.path, dates[0], tt.date)
			}
			continue
		}
		at, err := http.ParseTime(dates[0])
		if err != nil || at.Before(before) || at.After(after) {
			t.Errorf("%s: Date %q (%v), want an HTTP-date between %v and %v", tt.path, dates[0], err, before, after)
		}
	}
}
