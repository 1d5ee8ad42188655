package app

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warden-dev/warden/governor/clock"
	"github.com/warden-dev/warden/internal/testkit/redistest"
	"github.com/warden-dev/warden/internal/testkit/testenv"
	"github.com/warden-dev/warden/proxy/egress"
	"github.com/warden-dev/warden/proxy/ingress"
)

// upstream is an HTTP server that counts what reaches it: requests in
// total and the most in flight at once.
type upstream struct {
	*httptest.Server
	served, inFlight, peak atomic.Int64
}

func newUpstream(t *testing.T, hold time.Duration) *upstream {
	t.Helper()
	u := &upstream{}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := u.inFlight.Add(1)
		for old := u.peak.Load(); n > old && !u.peak.CompareAndSwap(old, n); old = u.peak.Load() {
		}
		u.served.Add(1)
		if hold > 0 {
			time.Sleep(hold) // the work an upstream call holds its slot for
		}
		u.inFlight.Add(-1)
		_, _ = io.WriteString(w, "ok")
	}))
	t.Cleanup(u.Close)
	return u
}

// component is in's component of type T (nil when it has none).
func component[T Component](in *instance) T {
	for _, c := range in.components {
		if t, ok := c.(T); ok {
			return t
		}
	}
	var none T
	return none
}

func (in *instance) ingressAddr() string { return component[*ingress.Ingress](in).Addr() }
func (in *instance) egressAddr() string  { return component[*egress.Egress](in).Addr() }

// proxyClient sends requests through a warden's egress listener, the way
// a worker with HTTP_PROXY does.
func proxyClient(t *testing.T, in *instance) *http.Client {
	t.Helper()
	proxy, err := url.Parse("http://" + in.egressAddr())
	if err != nil {
		t.Fatal(err)
	}
	tr := &http.Transport{Proxy: http.ProxyURL(proxy), MaxIdleConnsPerHost: 64}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 60 * time.Second}
}

func poolPolicy(redisURL, onError, upstreamHost, pool string) string {
	return fmt.Sprintf(`version: 1
admin: { listen: "127.0.0.1:0" }
backend: { kind: redis, url: %q, on_error: %s }
egress:
  http_listen: 127.0.0.1:0
targets:
  - name: up
    hosts: [%q]
    pools: [p]
pools:
  p: %s
`, redisURL, onError, upstreamHost, pool)
}

// hammer sends perClient requests from each of clients goroutines through
// every warden at once and counts the answers by status.
func hammer(t *testing.T, apps []*instance, target string, clients, perClient int) map[int]int64 {
	t.Helper()
	var mu sync.Mutex
	codes := map[int]int64{}
	var wg sync.WaitGroup
	for _, a := range apps {
		c := proxyClient(t, a)
		for range clients {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range perClient {
					resp, err := c.Get(target)
					if err != nil {
						t.Error(err)
						return
					}
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					mu.Lock()
					codes[resp.StatusCode]++
					mu.Unlock()
				}
			}()
		}
	}
	wg.Wait()
	return codes
}

// Three wardens, each with its own egress listener, on one Redis: a pool
// of rate 50 per minute under parallel load through all three lets exactly
// 50 requests reach the upstream; the rest are refused (429).
func TestThreeWardensShareRateAtUpstream(t *testing.T) {
	redisURL := testenv.RedisURL(t)
	prefix := redistest.Prefix(t, redisURL)
	up := newUpstream(t, 0)
	clk := clock.NewFake(time.Now().Truncate(time.Minute).Add(10 * time.Second))
	var apps []*instance
	for range 3 {
		apps = append(apps, startApp(t, poolPolicy(redisURL, "fail_open", up.Listener.Addr().String(), "{ rate: 50, window: 60 }"), prefix, clk))
	}
	codes := hammer(t, apps, up.URL+"/", 8, 10)
	if up.served.Load() != 50 || codes[200] != 50 || codes[429] != 3*8*10-50 {
		t.Fatalf("upstream served %d, answers %v: want exactly 50 served and the rest 429", up.served.Load(), codes)
	}
}

// Three wardens on one Redis: a pool of concurrency 4 (with a queue)
// under parallel load through all three never has more than 4 requests
// in flight at the upstream, and every request is served.
func TestThreeWardensShareConcurrencyAtUpstream(t *testing.T) {
	redisURL := testenv.RedisURL(t)
	prefix := redistest.Prefix(t, redisURL)
	up := newUpstream(t, 3*time.Millisecond)
	var apps []*instance
	for range 3 {
		apps = append(apps, startApp(t, poolPolicy(redisURL, "fail_open", up.Listener.Addr().String(),
			"{ concurrency: 4, queue: 1000, max_wait: 30s }"), prefix, clock.Real{}))
	}
	codes := hammer(t, apps, up.URL+"/", 8, 5)
	if codes[200] != 3*8*5 {
		t.Fatalf("answers %v: want all %d served", codes, 3*8*5)
	}
	if up.peak.Load() > 4 {
		t.Fatalf("%d requests in flight at the upstream at once through three wardens, want ≤ 4", up.peak.Load())
	}
}

// Redis stops under a warden whose pool has concurrency 1: fail_open
// serves on the sidecar's own concurrency count, fail_closed answers 429
// with control upstream; both return to the shared lease set once Redis
// answers, without a restart.
func TestPoolConcurrencyOutageThroughTheApp(t *testing.T) {
	for _, onError := range []string{"fail_open", "fail_closed"} {
		t.Run(onError, func(t *testing.T) {
			srv := redistest.StartServer(t)
			up := newUpstream(t, 0)
			a := startApp(t, poolPolicy(srv.URL, onError, up.Listener.Addr().String(), "{ concurrency: 1 }"), "", clock.Real{})
			c := proxyClient(t, a)
			get := func() (int, string) {
				t.Helper()
				resp, err := c.Get(up.URL + "/")
				if err != nil {
					t.Fatal(err)
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				return resp.StatusCode, resp.Header.Get("x-warden-control")
			}
			if code, _ := get(); code != 200 {
				t.Fatalf("with Redis up: %d", code)
			}
			srv.Stop()
			tripBackend(t, a, func() { get() })
			if _, metrics := getStatus(t, "http://"+a.AdminAddr()+"/metrics"); !strings.Contains(metrics, "warden_backend_degraded 1") {
				t.Fatal("warden_backend_degraded is not 1 during the outage")
			}
			code, control := get()
			if onError == "fail_open" && code != 200 {
				t.Fatalf("fail_open during the outage: %d %s", code, control)
			}
			if onError == "fail_closed" && (code != 429 || control != "upstream") {
				t.Fatalf("fail_closed during the outage: %d %q, want 429 upstream", code, control)
			}
			srv.Start()
			waitBackend(t, a, true)
			if code, control := get(); code != 200 {
				t.Fatalf("after recovery: %d %s", code, control)
			}
			// Back on the shared set: a lease taken now is in Redis.
			l, _, ok := a.Governor().Current().Pools.Get("p").TryAcquire(time.Now())
			if !ok {
				t.Fatal("pool refused after recovery")
			}
			defer l.Release()
			rdb := redistest.Client(t, srv.URL)
			if n := rdb.ZCard(t.Context(), "warden:lease:pool:p").Val(); n != 1 {
				t.Fatalf("lease set holds %d after recovery, want 1", n)
			}
		})
	}
}
