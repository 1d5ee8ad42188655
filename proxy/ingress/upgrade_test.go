package ingress

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/warden-dev/warden/internal/testkit/fasttest"
)

var upgradeHead = fasttest.UpgradeHead("/ws", "worker.test")

// TestUpgrade: a request that asks to switch protocols reaches the worker
// with its Upgrade and Connection; the worker's 101 comes back as sent,
// and then bytes pass unread both ways (what either side sent early
// included), each side's end of stream reaching the other. The request
// counts with its 101.
func TestUpgrade(t *testing.T) {
	w := fasttest.UpgradeUpstream(t)
	f := startAt(t, "", strings.TrimPrefix(w.URL, "http://"))
	fasttest.CheckUpgrade(t, f.addr, upgradeHead)
	if n := fasttest.Value(f.gov.Metrics.Requests.WithLabelValues("ingress", "worker", "101")); n != 1 {
		t.Errorf("warden_requests_total{ingress,worker,101} = %v, want 1", n)
	}
}

// TestUpgradeNotSwitched: Upgrade without "upgrade" among Connection's
// tokens, or in an HTTP/1.0 request, is a hop-by-hop field like any other
// and is removed; a worker that does not switch answers as usual, on a
// connection that stays HTTP.
func TestUpgradeNotSwitched(t *testing.T) {
	w := fasttest.UpgradeUpstream(t)
	f := startAt(t, "", strings.TrimPrefix(w.URL, "http://"))
	for _, tc := range []struct{ name, head, body string }{
		{"no Connection token", "GET /ws HTTP/1.1\r\nHost: w\r\nUpgrade: echo\r\n\r\n", "upgrade= connection="},
		{"HTTP/1.0", "GET /ws HTTP/1.0\r\nHost: w\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n", "upgrade= connection="},
		{"a protocol the worker refuses", "GET /ws HTTP/1.1\r\nHost: w\r\nConnection: Upgrade\r\nUpgrade: other\r\n\r\n", "upgrade=other connection=Upgrade"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, body := fasttest.Raw(t, f.addr, tc.head)
			if resp.StatusCode != http.StatusBadRequest || string(body) != tc.body {
				t.Fatalf("%d %q, want the worker's 400 %q", resp.StatusCode, body, tc.body)
			}
		})
	}
}

// TestUpgradeDrain: shutdown waits for a switched connection until its
// grace ends, then cuts it.
func TestUpgradeDrain(t *testing.T) {
	w := fasttest.UpgradeUpstream(t)
	f := startAt(t, "", strings.TrimPrefix(w.URL, "http://"))
	resp, br, _ := fasttest.FirstAnswer(t, f.addr, upgradeHead)
	if resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("%d, want 101", resp.StatusCode)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if err := f.in.Shutdown(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("shutdown with an open tunnel: %v, want the grace to run out", err)
	}
	if rest, err := io.ReadAll(br); err != nil || string(rest) != "hello|" {
		t.Fatalf("after the drain: %q %v, want the greeting, then the end", rest, err)
	}
}
