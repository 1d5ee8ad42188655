package fasttest

import (
	"strings"
	"testing"

	"github.com/valyala/fasthttp"
)

// EchoMaxForwards answers with the Max-Forwards the upstream received.
func EchoMaxForwards(ctx *fasthttp.RequestCtx) { ctx.Write(ctx.Request.Header.Peek("Max-Forwards")) }

// CheckMaxForwards drives Max-Forwards (RFC 9110 §7.6.2) through the
// proxy at addr, with requests for target (its request-target) and host
// that reach up, which serves EchoMaxForwards; allow is the proxy's Allow
// when it answers OPTIONS itself.
func CheckMaxForwards(t *testing.T, addr, target, host string, up *Upstream, allow string) {
	t.Helper()
	tests := []struct {
		name, method, hops, extra string
		status                    int
		reaches                   bool
		body                      string // the upstream's echo, or the start of the proxy's own
	}{
		{"OPTIONS at 0 is answered here", "OPTIONS", "0", "", 200, false, ""},
		{"TRACE at 0 is echoed here, without credentials", "TRACE", "0", "Authorization: Bearer s3cret\r\n", 200, false, "TRACE " + target + " HTTP/1.1\r\n"},
		{"OPTIONS goes on one lower", "OPTIONS", "5", "", 200, true, "4"},
		{"TRACE at 1 goes on at 0", "TRACE", "1", "", 200, true, "0"},
		{"GET passes it on unchanged", "GET", "0", "", 200, true, "0"},
		{"a value that is not a number is refused", "OPTIONS", "x", "", 400, false, `{"error":"request refused: Max-Forwards is not one decimal number"}`},
	}
	for _, tt := range tests {
		before := up.Requests.Load()
		resp, body := Raw(t, addr, tt.method+" "+target+" HTTP/1.1\r\nHost: "+host+"\r\nMax-Forwards: "+tt.hops+"\r\n"+tt.extra+"Connection: close\r\n\r\n")
		reached := up.Requests.Load() != before
		if resp.StatusCode != tt.status || reached != tt.reaches || !strings.HasPrefix(string(body), tt.body) {
			t.Errorf("%s: %d %q, reached the upstream %v; want %d %q..., reaching it %v", tt.name, resp.StatusCode, body, reached, tt.status, tt.body, tt.reaches)
			continue
		}
		switch {
		case tt.reaches || tt.status != 200:
		case tt.method == "OPTIONS":
			if got := resp.Header.Get("Allow"); got != allow || len(body) != 0 {
				t.Errorf("%s: Allow %q, body %q; want Allow %q and no body", tt.name, got, body, allow)
			}
		case tt.method == "TRACE":
			if ct := resp.Header.Get("Content-Type"); ct != "message/http" || strings.Contains(string(body), "s3cret") {
				t.Errorf("%s: %s %q; want message/http without the Authorization", tt.name, ct, body)
			}
		}
	}
}
