package main

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/valyala/fasthttp"
)

const tenantPolicy = `ingress:
  listen: %s
  worker: "http://%s"
  tenant: { header: x-tenant-id, rate: 1000000, window: 3600, max_keys: %d }
`

// Bounds of the tenant flood: what warden's memory may grow by, and what
// one GET /v1/tenants may cost (its default page is the top 100).
const (
	// Measured on the 2-core machine with 1,000 distinct tenants cycling
	// instead: the load alone grows RSS by about 15 MB (the GC's 16 MiB
	// heap floor filling up); on main 400,000 tenants grow it by 54 MB
	// before the view and by hundreds of MB with it.
	tenantRSSGrowth  = 32e6
	tenantsViewBytes = 256 << 10
	tenantsViewTime  = 2 * time.Second
)

// tenantFlood: hundreds of thousands of distinct x-tenant-id values through
// the ingress (an hour's window, so none expire) with tenant.max_keys
// 1000. Memory stays bounded, and GET /v1/tenants stays small and fast,
// as does the memory after it.
func tenantFlood(ctx context.Context, s *scenario) error {
	const maxKeys = 1000
	total := s.pick(400_000, 1_000_000)
	wk, a, err := s.prepare(0)
	if err != nil {
		return err
	}
	w, err := s.launch(ctx, policyFor(a.admin, fmt.Sprintf(tenantPolicy, a.ingress, wk.addr, maxKeys)), a.admin, 0)
	if err != nil {
		return err
	}
	s.row.load = fmt.Sprintf("%d requests, each a new x-tenant-id, 32 connections closed loop", total)
	s.row.fault = fmt.Sprintf("tenant cardinality flood, tenant.max_keys %d", maxKeys)

	fctx, stopFlood := context.WithCancel(ctx)
	defer stopFlood()
	tr := startTraffic(fctx, trafficConfig{addr: a.ingress, path: "/t", conns: 32, perRequest: func(req *fasthttp.Request, n int) {
		if n > total {
			stopFlood()
			return
		}
		var b [24]byte
		req.Header.SetBytesV("x-tenant-id", strconv.AppendInt(append(b[:0], "tenant-"...), int64(n), 10))
	}})
	<-fctx.Done()
	tr.stop()
	if ctx.Err() != nil {
		return fmt.Errorf("flood did not finish: %w", ctx.Err())
	}
	flooded := s.smp.take()
	start := time.Now()
	code, body, err := httpGet(ctx, w.client, "http://"+w.admin+"/v1/tenants", tenantsViewBytes<<8)
	took := time.Since(start)
	s.settle()
	grew := s.row.peak.rss - s.row.before.rss
	s.row.clientErrors = tr.errors()
	s.row.lostRequests = tr.lost()
	s.row.check("rss-bounded", s.row.before.rss > 0 && grew <= tenantRSSGrowth,
		"RSS %s before, %s after the flood, peak %s (the GET included): grew %s, bound %s; answers %s",
		mb(s.row.before.rss), mb(flooded.rss), mb(s.row.peak.rss), mb(grew), mb(tenantRSSGrowth), tr.summary())
	size := fmt.Sprintf("%d bytes", len(body))
	if len(body) == tenantsViewBytes<<8 {
		size = "at least " + size + " (read no further)"
	}
	s.row.check("tenants-view-small-fast", err == nil && code == 200 && len(body) <= tenantsViewBytes && took <= tenantsViewTime,
		"GET /v1/tenants: %d, %s in %v (bounds %d KiB, %v)%s", code, size, took.Round(time.Millisecond),
		tenantsViewBytes>>10, tenantsViewTime, errNote(err))
	return nil
}
