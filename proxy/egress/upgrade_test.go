package egress

import (
	"io"
	"net/http"
	"testing"

	"github.com/warden-dev/warden/internal/fasttest"
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
