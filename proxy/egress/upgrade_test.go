package egress

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/warden-dev/warden/internal/testkit/fasttest"
)

// TestUpgrade: a request that asks to switch protocols, in origin-form or
// absolute-form, reaches its target's upstream with its Upgrade and
// Connection; the 101 comes back as sent, and then bytes pass both ways
// until both sides are done. The request counts with its 101.
func TestUpgrade(t *testing.T) {
	up := fasttest.UpgradeUpstream(t)
	f := start(t, egressPolicy("  allow_unlisted: false", "targets:\n"+target("api", []string{"api.test"}, up.URL, "")), nil)
	fasttest.CheckUpgrade(t, f.addr, fasttest.UpgradeHead("/ws", "api.test"))
	fasttest.CheckUpgrade(t, f.addr, fasttest.UpgradeHead("http://api.test/ws", "api.test"))
	if n := fasttest.Value(f.gov.Metrics.Requests.WithLabelValues("egress", "api", "101")); n != 2 {
		t.Errorf("warden_requests_total{egress,api,101} = %v, want 2", n)
	}
	// Without the Connection token the Upgrade is hop-by-hop, removed.
	resp, body := fasttest.Raw(t, f.addr, "GET /ws HTTP/1.1\r\nHost: api.test\r\nUpgrade: echo\r\n\r\n")
	if resp.StatusCode != 400 || string(body) != "upgrade= connection=" {
		t.Fatalf("%d %q, want the upstream's 400 without Upgrade", resp.StatusCode, body)
	}
}

// TestUpgradeHoldsPoolSlot: a switched connection holds its pool's slot
// until both sides are done, as a CONNECT tunnel does.
func TestUpgradeHoldsPoolSlot(t *testing.T) {
	up := fasttest.UpgradeUpstream(t)
	f := start(t, egressPolicy("  allow_unlisted: false",
		"targets:\n"+target("api", []string{"api.test"}, up.URL, "pools: [p]")+"pools:\n  p: { concurrency: 1 }\n"), nil)
	resp, br, c := fasttest.FirstAnswer(t, f.addr, fasttest.UpgradeHead("/ws", "api.test"))
	if resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("%d, want 101", resp.StatusCode)
	}
	if r := f.do(t, "GET", "http://api.test/", nil); r.status != 429 || r.header.Get("X-Warden-Control") != "pool_queue" {
		t.Fatalf("with the tunnel open: %+v, want pool_queue's 429", r)
	}
	c.Close()
	_, _ = io.ReadAll(br)
	fasttest.WaitFor(t, "the slot freed", func() bool {
		return fasttest.Value(f.gov.Metrics.PoolInFlight.WithLabelValues("p")) == 0
	})
	if r := f.do(t, "GET", "http://api.test/", nil); r.status != 400 {
		t.Fatalf("after the tunnel: %+v, want the upstream's own 400", r)
	}
}

// TestEarlyAnswer: an upstream that refuses an upload from its head,
// reading none of the body, gets its 413 to the caller, by length or
// chunked; the caller's connection then closes cleanly.
func TestEarlyAnswer(t *testing.T) {
	up := fasttest.RefusingUpstream(t)
	f := start(t, egressPolicy("  allow_unlisted: false", "targets:\n"+target("api", []string{"api.test"}, up.URL, "")+
		target("kept", []string{"kept.test"}, up.URL, "retry: { count: 1, logic: fixed, delay: 0s, jitter: 0 }")), nil)
	fasttest.CheckEarlyAnswer(t, f.addr, fmt.Sprintf("POST /upload HTTP/1.1\r\nHost: api.test\r\nContent-Length: %d\r\n\r\n", fasttest.UploadSize))
	fasttest.CheckEarlyAnswer(t, f.addr, "POST http://api.test/upload HTTP/1.1\r\nHost: api.test\r\nTransfer-Encoding: chunked\r\n\r\n")
	if n := fasttest.Value(f.gov.Metrics.Requests.WithLabelValues("egress", "api", "413")); n != 2 {
		t.Errorf("warden_requests_total{egress,api,413} = %v, want 2", n)
	}
	// A body kept whole for a retry (an idempotent PUT to a target with a
	// retry policy, within 1 MiB) was read to its end: the caller's
	// connection carries on.
	body := strings.Repeat("x", 900<<10)
	resp, got := fasttest.Raw(t, f.addr, fmt.Sprintf("PUT /upload HTTP/1.1\r\nHost: kept.test\r\nContent-Length: %d\r\n\r\n%s", len(body), body))
	if resp.StatusCode != 413 || string(got) != "too large" || resp.Close {
		t.Fatalf("%d %q close=%v, want the upstream's 413 on a connection kept open", resp.StatusCode, got, resp.Close)
	}
}

// TestRefusalBeforeBody: a long upload the egress refuses from its head
// (an unlisted host; a tenant over its cap), its body unread, gets the
// refusal, and the connection then ends cleanly while the caller still
// sends, by length or chunked, rather than by a reset.
func TestRefusalBeforeBody(t *testing.T) {
	up := fasttest.RefusingUpstream(t)
	f := start(t, egressPolicy("  allow_unlisted: false", "targets:\n"+target("api", []string{"api.test"}, up.URL, "")), nil)
	for _, framing := range []string{fmt.Sprintf("Content-Length: %d", fasttest.UploadSize), "Transfer-Encoding: chunked"} {
		fasttest.CheckAnswerBeforeBody(t, f.addr, "POST /upload HTTP/1.1\r\nHost: nowhere.test\r\n"+framing+"\r\n\r\n",
			403, "~allow_unlisted")
	}
}

// TestHeadOnlyAnswer: an upstream that sends the head of a long answer
// and then closes before any of its body gets the caller a 502, and, as a
// failed exchange nothing of which reached the caller, is retried where
// the target retries.
func TestHeadOnlyAnswer(t *testing.T) {
	up := fasttest.StartHeadOnlyUpstream(t)
	f := start(t, egressPolicy("  allow_unlisted: false", "targets:\n"+target("api", []string{"api.test"}, "http://"+up.Addr, "")+
		target("retried", []string{"retried.test"}, "http://"+up.Addr, "retry: { count: 1, logic: fixed, delay: 0s, jitter: 0 }")), nil)
	fasttest.CheckHeadOnlyAnswer(t, f.addr, "GET /long HTTP/1.1\r\nHost: api.test\r\n\r\n")
	fasttest.CheckHeadOnlyAnswer(t, f.addr, "GET http://api.test/chunked HTTP/1.1\r\nHost: api.test\r\n\r\n")
	if n := up.Answered.Load(); n != 2 {
		t.Fatalf("upstream answered %d times, want 2", n)
	}
	fasttest.CheckHeadOnlyAnswer(t, f.addr, "GET /long HTTP/1.1\r\nHost: retried.test\r\n\r\n")
	if n := up.Answered.Load(); n != 4 {
		t.Errorf("upstream answered %d times, want 4: the retried target's request once more", n)
	}
	if n := fasttest.Value(f.gov.Metrics.Requests.WithLabelValues("egress", "api", "502")); n != 2 {
		t.Errorf("warden_requests_total{egress,api,502} = %v, want 2", n)
	}
}
