package app

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/warden-dev/warden/internal/fasttest"
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
