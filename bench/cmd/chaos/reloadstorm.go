package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/warden-dev/warden/bench/loadgen"
)

// stormPolicy is a valid policy whose marker tenant's rate makes each file
// distinct. `version` comes last, so that a file read half-written (it is
// rewritten in place) is never a valid policy with a section missing.
const stormPolicy = `shutdown_grace: 5s
admin: { listen: %s }
ingress:
  listen: %s
  worker: "http://%s"
  tenant: { header: x-tenant-id, rate: 1000000, window: 1 }
  tenants:
    marker: { rate: %d, window: 1 }%s
egress: { http_listen: %s }
targets:
  - name: up
    hosts: [up.chaos]
    upstream: "http://%s"
version: 1
`

// Bounds of the reload storm.
const (
	stormRSSGrowth   = 100e6    // bytes a refused file may cost in memory at its peak
	stormPolicyBytes = 64 << 10 // GET /v1/policy, its error list included
	stormLogBytes    = 8e6      // bytes the storm may add to warden's log
	hugeEntries      = 250_000  // tenants in the huge invalid file, two errors each
)

// reloadStorm: the policy file is rewritten in place every 100 ms, valid
// and invalid in turn, among them a huge file with 500,000 errors, while
// traffic flows through the ingress and the egress. No client sees an
// error, memory, the error report and the log stay bounded, and the last
// valid file is the policy in force at the end.
func reloadStorm(ctx context.Context, s *scenario) error {
	total := s.pick(100, 300) // writes, 100 ms apart
	wk, a, err := s.prepare(0)
	if err != nil {
		return err
	}
	admin, ingress, egress := a.admin, a.ingress, a.egress
	valid := func(i int) string {
		return fmt.Sprintf(stormPolicy, admin, ingress, wk.addr, 1000+i, "", egress, wk.addr)
	}
	small := func(i int) string {
		return fmt.Sprintf(stormPolicy, admin, ingress, wk.addr, 1000+i, "\n    bogus: { rate: 1, window: 7, color: blue }", egress, wk.addr)
	}
	var hb strings.Builder
	for i := range hugeEntries {
		fmt.Fprintf(&hb, "\n    t%d: { window: 7 }", i)
	}
	huge := fmt.Sprintf(stormPolicy, admin, ingress, wk.addr, 1, hb.String(), egress, wk.addr)
	w, err := s.launch(ctx, valid(0), admin, 0)
	if err != nil {
		return err
	}
	logBefore := fileSize(w.logPath)
	s.row.load = "200 req/s on each of ingress and egress (loadgen)"
	s.row.fault = fmt.Sprintf("policy rewritten in place %d times, 100 ms apart: valid, invalid, and every 50th a %.1f MB file with %d errors",
		total, float64(len(huge))/1e6, 2*hugeEntries)

	listeners := []endpoint{{"ingress", ingress, ingress}, {"egress", egress, "up.chaos"}}
	var goods []*loadgen.Result
	var wg sync.WaitGroup
	lctx, stopLoad := context.WithCancel(ctx)
	defer stopLoad()
	wg.Add(1)
	go func() {
		defer wg.Done()
		goods = goodClients(lctx, listeners, 200, 8, time.Hour)
	}()
	// The size of /v1/policy while refused files come and go.
	var policyMax int
	poll := repeat(ctx, 500*time.Millisecond, func(ctx context.Context) {
		if code, body, err := w.get(ctx, "/v1/policy"); err == nil && code == 200 {
			policyMax = max(policyMax, len(body))
		}
	})
	defer poll.stop()

	writes, hugeWrites, hugeMissed := 0, 0, 0
	tick := time.NewTicker(100 * time.Millisecond)
	for writes < total && ctx.Err() == nil {
		<-tick.C
		writes++
		var text string
		switch {
		case writes%50 == 25:
			text = huge
			hugeWrites++
		case writes%2 == 1:
			text = small(writes)
		default:
			text = valid(writes)
		}
		before, _ := w.metric(ctx, "warden_policy_reload_errors_total")
		if err := os.WriteFile(w.policyPath, []byte(text), 0o644); err != nil {
			tick.Stop()
			return err
		}
		if text == huge {
			// The storm pauses until warden has read the huge file and
			// refused it, so that it is sure to have been followed.
			hugeSeen := waitFor(ctx, 60*time.Second, func() bool {
				n, err := w.metric(ctx, "warden_policy_reload_errors_total")
				return err == nil && n > before
			})
			if !hugeSeen {
				hugeMissed++
			}
		}
	}
	tick.Stop()
	last := valid(writes + 1)
	if err := os.WriteFile(w.policyPath, []byte(last), 0o644); err != nil {
		return err
	}
	sum := sha256.Sum256([]byte(last))
	want := hex.EncodeToString(sum[:])
	var got policyView
	inForce := waitFor(ctx, 90*time.Second, func() bool {
		code, body, err := w.get(ctx, "/v1/policy")
		return err == nil && code == 200 && json.Unmarshal(body, &got) == nil && got.Hash == want
	})
	sleep(ctx, time.Second)
	stopLoad()
	wg.Wait()
	poll.stop()
	s.settle()

	s.row.clientErrors = s.row.checkServed("no-client-errors", listeners, goods)
	grew := s.row.peak.rss - s.row.before.rss
	s.row.check("memory-bounded", s.row.before.rss > 0 && grew <= stormRSSGrowth,
		"RSS %s before, peak %s: grew %s (bound %s)", mb(s.row.before.rss), mb(s.row.peak.rss), mb(grew), mb(stormRSSGrowth))
	s.row.check("huge-file-refused", hugeWrites > 0 && hugeMissed == 0,
		"%d huge files written, %d not refused within 60 s", hugeWrites, hugeMissed)
	s.row.check("last-valid-in-force", inForce && got.reloadErrorEmpty(),
		"%d writes; the last valid file's hash in /v1/policy: %v; last_reload_error %s",
		writes+1, inForce, clip(string(got.LastReloadError), 80))
	s.row.check("error-report-bounded", policyMax > 0 && policyMax <= stormPolicyBytes,
		"GET /v1/policy at most %d bytes during the storm (bound %d KiB)", policyMax, stormPolicyBytes>>10)
	logGrew := fileSize(w.logPath) - logBefore
	s.row.check("log-bounded", logGrew <= stormLogBytes, "warden's log grew %s (bound %s)", mb(logGrew), mb(stormLogBytes))
	return nil
}

// policyView is the part of GET /v1/policy the storm reads.
type policyView struct {
	Hash string `json:"hash"`
	// A string today; raw, so that a list of errors reads as well.
	LastReloadError json.RawMessage `json:"last_reload_error"`
}

// reloadErrorEmpty says the last reload left no error.
func (p policyView) reloadErrorEmpty() bool {
	switch strings.TrimSpace(string(p.LastReloadError)) {
	case "", `""`, "null", "[]":
		return true
	}
	return false
}

func fileSize(path string) int64 {
	fi, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return fi.Size()
}

func clip(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}
