package app

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/warden-dev/warden/internal/testkit/fasttest"
)

// fasthttp's process-wide helpers (the server date ticker of the ingress in
// TestPostgresRunStore, the egress client's cleaners in the lease tests)
// outlive the wardens that started them.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m, fasttest.LeakOptions()...) }

func writePolicy(t *testing.T, path, body string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
}

func getBody(t *testing.T, url string) string {
	t.Helper()
	_, body := getStatus(t, url)
	return body
}

func getStatus(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestReloadKeepsStateAndRejectsBadFiles(t *testing.T) {
	file := filepath.Join(t.TempDir(), "p.yaml")
	writePolicy(t, file, `version: 1
admin: { listen: "127.0.0.1:0" }
pools:
  a: { concurrency: 2, rate: 10, window: 60 }
  b: { rate: 5, window: 60 }
`)
	a, err := New(Options{PolicyFile: file, Log: slog.New(slog.NewTextHandler(io.Discard, nil)), NoWatch: true})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx, nil) }()
	<-a.Started()
	base := "http://" + a.AdminAddr()

	c := a.Governor().Current()
	lease, _, ok := c.Pools.Get("a").TryAcquire(a.clk.Now())
	if !ok {
		t.Fatal("pool a refused")
	}

	// Pool b removed, a's rate changed: a keeps its in-flight lease.
	writePolicy(t, file, `version: 1
admin: { listen: "127.0.0.1:0" }
pools:
  a: { concurrency: 2, rate: 20, window: 60 }
`)
	if err := a.Reload(); err != nil {
		t.Fatal(err)
	}
	body := getBody(t, base+"/v1/pools")
	if !strings.Contains(body, `"in_flight": 1`) || !strings.Contains(body, `"rate": 20`) || strings.Contains(body, `"id": "b"`) {
		t.Fatalf("after reload: %s", body)
	}
	lease.Release()

	writePolicy(t, file, "version: 1\npools: { a: { rate: -1 } }\n")
	if err := a.Reload(); err == nil {
		t.Fatal("bad policy accepted")
	}
	if body := getBody(t, base+"/v1/policy"); !strings.Contains(body, "p.yaml:2:") {
		t.Fatalf("reload error not reported: %s", body)
	}
	if body := getBody(t, base+"/v1/pools"); !strings.Contains(body, `"rate": 20`) {
		t.Fatalf("bad policy replaced the running one: %s", body)
	}

	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestErrorsNameTheComponentOnce: the app puts the component's name before
// its error, so the component's own text must not start with it again
// ("egress: egress: listen on ...").
func TestErrorsNameTheComponentOnce(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	addr := busy.Addr().String()
	for _, tc := range []struct {
		name   string
		reload bool   // false: the policy fails at start; true: on reload
		policy string // after "version: 1\n"
		want   string // the error's beginning
	}{
		{"ingress start", false, "ingress: {listen: '" + addr + "', worker: 'http://127.0.0.1:9'}\n", "start ingress: listen on " + addr + ": "},
		{"egress start", false, "egress: {http_listen: '" + addr + "'}\n", "start egress: listen on " + addr + ": "},
		{"grpc start", false, "egress: {grpc_listen: '" + addr + "'}\n", "start grpc: listen on " + addr + ": "},
		{"rls start", false, "rls: {listen: '" + addr + "'}\n", "start rls: listen on " + addr + ": "},
		{"bridge start", false, "bridges:\n  - {name: db, listen: '" + addr + "', upstream: '127.0.0.1:9'}\n", "start bridges: bridge db: listen on " + addr + ": "},
		{"egress reload", true, "egress: {http_listen: '" + addr + "'}\n", "egress: listen on " + addr + ": "},
		{"backend reload", true, "backend: {kind: redis, url: 'redis://127.0.0.1:1/0'}\n", "backend: kind changed from memory to redis: "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			file := filepath.Join(t.TempDir(), "p.yaml")
			if tc.reload {
				writePolicy(t, file, "version: 1\n")
			} else {
				writePolicy(t, file, "version: 1\n"+tc.policy)
			}
			a, err := New(Options{PolicyFile: file, DataDir: t.TempDir(), Log: slog.New(slog.NewTextHandler(io.Discard, nil)), NoWatch: true})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			done := make(chan error, 1)
			go func() { done <- a.Run(ctx, nil) }()
			if tc.reload {
				<-a.Started()
				writePolicy(t, file, "version: 1\n"+tc.policy)
				err = a.Reload()
				cancel()
				if rerr := <-done; rerr != nil {
					t.Fatalf("Run: %v", rerr)
				}
			} else {
				err = <-done
			}
			if err == nil || !strings.HasPrefix(err.Error(), tc.want) {
				t.Fatalf("error = %v\nwant it to begin %q", err, tc.want)
			}
		})
	}
}

// The admin listener is bound first; /readyz must not say ready while
// the data-plane listeners are still to come.
func TestNotReadyUntilEveryListenerIsBound(t *testing.T) {
	file := filepath.Join(t.TempDir(), "p.yaml")
	writePolicy(t, file, `version: 1
admin: { listen: "127.0.0.1:0" }
ingress: { listen: "127.0.0.1:0", worker: "http://127.0.0.1:9" }
`)
	a, err := New(Options{PolicyFile: file, NoWatch: true, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	// What start does first, before any component binds.
	if err := a.applyAdmin(a.holder.Load()); err != nil {
		t.Fatal(err)
	}
	admin := "http://" + a.AdminAddr()
	if code, body := getStatus(t, admin+"/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "starting") {
		t.Fatalf("/readyz before the listeners are bound: %d %s, want 503 starting", code, body)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx, nil) }()
	select {
	case <-a.Started():
	case err := <-done:
		cancel()
		t.Fatalf("warden did not start: %v", err)
	}
	if code, body := getStatus(t, admin+"/readyz"); code != http.StatusOK {
		t.Errorf("/readyz once started: %d %s, want 200", code, body)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("shutdown: %v", err)
	}
}
