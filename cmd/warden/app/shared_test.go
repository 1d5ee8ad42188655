package app

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	commonpb "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/warden-dev/warden/governor/clock"
	"github.com/warden-dev/warden/internal/testkit/redistest"
	"github.com/warden-dev/warden/internal/testkit/testenv"
	"github.com/warden-dev/warden/proxy/rls"
)

// testTimeout bounds Redis calls in these tests: exact counts must not
// depend on a busy CI machine never stalling 100 ms (an outage here is a
// stopped server, which refuses connections at once).
const testTimeout = 5 * time.Second

// instance is one in-process warden, running until the test ends.
type instance struct {
	*App
	cancel context.CancelFunc
	done   chan error
	file   string

	once sync.Once
	err  error // Run's result, once result has returned
}

func startApp(t *testing.T, policyBody, prefix string, clk clock.Clock) *instance {
	t.Helper()
	return startAppWith(t, policyBody, Options{BackendPrefix: prefix, Clock: clk, BackendTimeout: testTimeout})
}

// startAppWith runs a warden on policyBody with opts (PolicyFile and
// NoWatch are set here; a nil Log discards).
func startAppWith(t *testing.T, policyBody string, opts Options) *instance {
	t.Helper()
	file := filepath.Join(t.TempDir(), "p.yaml")
	writePolicy(t, file, policyBody)
	opts.PolicyFile, opts.NoWatch = file, true
	if opts.Log == nil {
		opts.Log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	a, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	in := &instance{App: a, cancel: cancel, done: make(chan error, 1), file: file}
	go func() { in.done <- a.Run(ctx, nil) }()
	select {
	case <-a.Started():
	case err := <-in.done:
		t.Fatalf("warden did not start: %v", err)
	}
	t.Cleanup(func() {
		cancel()
		if err := in.result(); err != nil {
			t.Errorf("shutdown: %v", err)
		}
	})
	return in
}

// result waits for Run to return and gives its error; every call gives
// the same one, so a test may wait for the shutdown before its cleanup
// does.
func (in *instance) result() error {
	in.once.Do(func() { in.err = <-in.done })
	return in.err
}

func (in *instance) rls() *rls.Server { return component[*rls.Server](in) }

func rlsClient(t *testing.T, addr string) rlspb.RateLimitServiceClient {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return rlspb.NewRateLimitServiceClient(conn)
}

func tenantRequest(tenant string) *rlspb.RateLimitRequest {
	return &rlspb.RateLimitRequest{Domain: "edge", Descriptors: []*commonpb.RateLimitDescriptor{
		{Entries: []*commonpb.RateLimitDescriptor_Entry{{Key: "tenant", Value: tenant}}},
	}}
}

func sharedPolicy(url, onError string) string {
	return fmt.Sprintf(`version: 1
admin: { listen: "127.0.0.1:0" }
backend: { kind: redis, url: %q, on_error: %s }
pools:
  stripe: { rate: 50, window: 60 }
rls:
  listen: 127.0.0.1:0
  domains:
    edge:
      - { key: tenant, rate: 30, window: 86400 }
`, url, onError)
}

// Three wardens on one Redis behave as one governor: a pool of 50 per
// minute and an RLS limit of 30 per day, hammered in parallel through all
// three, admit exactly 50 and 30 in total.
func TestThreeWardensShareWindows(t *testing.T) {
	url := testenv.RedisURL(t)
	prefix := redistest.Prefix(t, url)
	// 10 s into a minute of the present: the minute window cannot end
	// mid-test, and Redis expiries computed from this clock are real.
	clk := clock.NewFake(time.Now().Truncate(time.Minute).Add(10 * time.Second))
	var apps []*instance
	for range 3 {
		apps = append(apps, startApp(t, sharedPolicy(url, "fail_open"), prefix, clk))
	}
	var pools, rlsOK atomic.Int64
	var wg sync.WaitGroup
	for _, a := range apps {
		cli := rlsClient(t, a.rls().Addr())
		pool := a.Governor().Current().Pools.Get("stripe")
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range 20 {
					if _, _, ok := pool.TryAcquire(clk.Now()); ok {
						pools.Add(1)
					}
					resp, err := cli.ShouldRateLimit(context.Background(), tenantRequest("acme"))
					if err != nil {
						t.Error(err)
						return
					}
					if resp.OverallCode == rlspb.RateLimitResponse_OK {
						rlsOK.Add(1)
					}
				}
			}()
		}
	}
	wg.Wait()
	if pools.Load() != 50 || rlsOK.Load() != 30 {
		t.Fatalf("admitted %d pool starts (want 50) and %d RLS calls (want 30) across three wardens", pools.Load(), rlsOK.Load())
	}
	body := getBody(t, "http://"+apps[0].AdminAddr()+"/v1/pools")
	if !strings.Contains(body, `"count": 50`) {
		t.Fatalf("/v1/pools does not show the shared count: %s", body)
	}
}

// tripBackend makes calls until the backend's breaker opens: the calls
// that find Redis gone (at most three) open it.
func tripBackend(t *testing.T, a *instance, call func()) {
	t.Helper()
	for i := 0; !a.backend.red.Client().Down(); i++ {
		if i == 3 {
			t.Fatal("three failed calls did not open the breaker")
		}
		call()
	}
}

// waitBackend waits for the backend's breaker to reach the wanted state;
// with the real clock the probe runs by itself.
func waitBackend(t *testing.T, a *instance, up bool) {
	t.Helper()
	cli := a.backend.red.Client()
	deadline := time.After(20 * time.Second)
	for cli.Down() == up {
		select {
		case <-cli.Changed():
		case <-deadline:
			t.Fatalf("backend never became up=%v", up)
		}
	}
}

// Redis stops under a running warden and comes back: /readyz, the
// degraded metric and the RLS answers follow, without a restart.
func TestBackendOutageThroughTheApp(t *testing.T) {
	for _, onError := range []string{"fail_open", "fail_closed"} {
		t.Run(onError, func(t *testing.T) {
			srv := redistest.StartServer(t)
			a := startApp(t, sharedPolicy(srv.URL, onError), "", clock.Real{})
			admin := "http://" + a.AdminAddr()
			cli := rlsClient(t, a.rls().Addr())
			call := func() *rlspb.RateLimitResponse {
				t.Helper()
				resp, err := cli.ShouldRateLimit(context.Background(), tenantRequest("acme"))
				if err != nil {
					t.Fatal(err)
				}
				return resp
			}
			if resp := call(); resp.OverallCode != rlspb.RateLimitResponse_OK {
				t.Fatalf("with Redis up: %v", resp)
			}

			srv.Stop()
			tripBackend(t, a, func() { call() })
			code, body := getStatus(t, admin+"/readyz")
			_, metrics := getStatus(t, admin+"/metrics")
			if !strings.Contains(metrics, "warden_backend_degraded 1") {
				t.Fatal("warden_backend_degraded is not 1 during the outage")
			}
			resp := call()
			if onError == "fail_open" {
				if code != 200 || !strings.Contains(body, `"degraded"`) || !strings.Contains(body, "redis unreachable") {
					t.Fatalf("fail_open /readyz: %d %s", code, body)
				}
				if resp.OverallCode != rlspb.RateLimitResponse_OK {
					t.Fatalf("fail_open refused on local windows: %v", resp)
				}
			} else {
				if code != 503 || !strings.Contains(body, "redis unreachable") {
					t.Fatalf("fail_closed /readyz: %d %s", code, body)
				}
				if resp.OverallCode != rlspb.RateLimitResponse_OVER_LIMIT || !strings.Contains(string(resp.RawBody), `"control":"upstream"`) {
					t.Fatalf("fail_closed answer: %v", resp)
				}
			}

			srv.Start()
			waitBackend(t, a, true)
			if code, body := getStatus(t, admin+"/readyz"); code != 200 || strings.Contains(body, "degraded") {
				t.Fatalf("after recovery /readyz: %d %s", code, body)
			}
			if resp := call(); resp.OverallCode != rlspb.RateLimitResponse_OK || resp.Statuses[0].LimitRemaining != 29 {
				t.Fatalf("after recovery: %v; want the restarted Redis's first count", resp)
			}
		})
	}
}

// Reloads: a new Redis URL is used at once; kind memory moves the counter
// to local windows; a warden started on memory refuses to switch to redis
// without a restart and says so.
func TestBackendReload(t *testing.T) {
	url := testenv.RedisURL(t)
	prefix := redistest.Prefix(t, url)
	srv := redistest.StartServer(t)
	a := startApp(t, sharedPolicy(url, "fail_open"), prefix, clock.Real{})
	first := a.backend.red.Client()
	writePolicy(t, a.file, sharedPolicy(srv.URL, "fail_closed"))
	if err := a.Reload(); err != nil {
		t.Fatal(err)
	}
	moved := a.backend.red.Client()
	if moved == first || moved.Redis().Options().Addr != fmt.Sprintf("127.0.0.1:%d", srv.Port) {
		t.Fatal("the new backend url is not in use")
	}
	writePolicy(t, a.file, strings.Replace(sharedPolicy(srv.URL, "fail_open"), "kind: redis", "kind: memory", 1))
	if err := a.Reload(); err != nil {
		t.Fatal(err)
	}
	if a.backend.red.Client() != nil {
		t.Fatal("kind memory still uses Redis")
	}

	m := startApp(t, strings.Replace(sharedPolicy(url, "fail_open"), "kind: redis", "kind: memory", 1), "", clock.Real{})
	writePolicy(t, m.file, sharedPolicy(url, "fail_open"))
	if err := m.Reload(); err == nil || !strings.Contains(err.Error(), "restart") {
		t.Fatalf("memory to redis on reload: %v", err)
	}
	// Until warden restarts, every reload of that file says so again.
	if err := m.Reload(); err == nil || !strings.Contains(err.Error(), "restart") {
		t.Fatalf("memory to redis on a repeated reload: %v", err)
	}
	if st := getPolicy(t, m); !strings.Contains(st.LastReloadError, "restart") || !strings.Contains(st.ApplyError, "restart") {
		t.Fatalf("/v1/policy after a repeated memory to redis reload: %+v", st)
	}
}
