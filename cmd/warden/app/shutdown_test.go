package app

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/warden-dev/warden/internal/testkit/loopback"
	"github.com/warden-dev/warden/proxy/grpcegress"
)

// logWatch is a slog handler that closes seen the first time a record
// with message msg is logged, so a test can wait for what warden says it
// has done instead of sleeping.
type logWatch struct {
	msg  string
	seen chan struct{}
	once *sync.Once
}

func watchLog(msg string) (*slog.Logger, <-chan struct{}) {
	w := logWatch{msg: msg, seen: make(chan struct{}), once: &sync.Once{}}
	return slog.New(w), w.seen
}

func (w logWatch) Enabled(context.Context, slog.Level) bool { return true }
func (w logWatch) WithAttrs([]slog.Attr) slog.Handler       { return w }
func (w logWatch) WithGroup(string) slog.Handler            { return w }

func (w logWatch) Handle(_ context.Context, r slog.Record) error {
	if r.Message == w.msg {
		w.once.Do(func() { close(w.seen) })
	}
	return nil
}

func (in *instance) grpcAddr() string { return component[*grpcegress.Grpc](in).Addr() }

// await receives from ch or fails the test after bound.
func await[T any](t *testing.T, ch <-chan T, bound time.Duration, what string) T {
	t.Helper()
	timer := time.NewTimer(bound)
	defer timer.Stop()
	select {
	case v := <-ch:
		return v
	case <-timer.C:
		t.Fatalf("no %s within %v", what, bound)
		var zero T
		return zero
	}
}

// prompt bounds what must happen "at once" when the drain starts: far
// below the grace, far above a loopback round trip.
const prompt = time.Second

// One component holding work in flight (an idle CONNECT tunnel, or a slow
// request through the egress) must not keep any other listener accepting:
// once the drain starts every data-plane listener refuses new
// connections, idle keep-alive connections are closed, /readyz answers
// 503 "draining" at once while /metrics still answers, a reload is
// refused; the held work then finishes, and the admin listener closes
// last.
func TestShutdownStopsEveryListenerAtOnce(t *testing.T) {
	cases := []struct {
		name string
		// hold starts work in flight through the egress and returns how
		// to finish it, which checks that it was served.
		hold func(t *testing.T, egressAddr, workerAddr string, w *worker) (finish func())
	}{
		{"idle CONNECT tunnel", func(t *testing.T, egressAddr, workerAddr string, _ *worker) func() {
			c, err := net.DialTimeout("tcp", egressAddr, prompt)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { c.Close() })
			_ = c.SetDeadline(time.Now().Add(10 * time.Second))
			fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", workerAddr, workerAddr)
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil || resp.StatusCode != 200 {
				t.Fatalf("CONNECT through the egress: %v %v", resp, err)
			}
			return func() { c.Close() } // the worker is done with the tunnel
		}},
		{"slow egress request", func(t *testing.T, egressAddr, workerAddr string, w *worker) func() {
			res := make(chan string, 1)
			go func() {
				c, err := net.DialTimeout("tcp", egressAddr, prompt)
				if err != nil {
					res <- err.Error()
					return
				}
				defer c.Close()
				_ = c.SetDeadline(time.Now().Add(20 * time.Second))
				fmt.Fprintf(c, "GET http://%s/slow HTTP/1.1\r\nHost: %s\r\n\r\n", workerAddr, workerAddr)
				resp, err := http.ReadResponse(bufio.NewReader(c), nil)
				if err != nil {
					res <- err.Error()
					return
				}
				b, _ := io.ReadAll(resp.Body)
				res <- fmt.Sprintf("%d %s", resp.StatusCode, b)
			}()
			await(t, w.entered, 10*time.Second, "slow request at the upstream")
			return func() {
				w.free()
				if got := await(t, res, 10*time.Second, "answer to the slow request"); got != "200 slow" {
					t.Errorf("the request in flight at shutdown: %q, want 200 slow", got)
				}
			}
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			w := newWorker(t)
			bridgeUp := loopback.Serve(t, func(c net.Conn) { _, _ = io.Copy(io.Discard, c) })
			bridgeAddr := loopback.FreeAddr(t)
			log, draining := watchLog("draining")
			in := startAppWith(t, fmt.Sprintf(`version: 1
shutdown_grace: 30s
admin: { listen: "127.0.0.1:0" }
ingress: { listen: "127.0.0.1:0", worker: "http://%s" }
egress: { http_listen: "127.0.0.1:0", grpc_listen: "127.0.0.1:0" }
rls:
  listen: 127.0.0.1:0
  domains:
    edge:
      - { key: tenant, rate: 10, window: 60 }
bridges:
  - { name: db, listen: %q, upstream: %q, protocol: tcp, max_connections: 2 }
`, w.addr, bridgeAddr, bridgeUp), Options{Log: log})
			t.Cleanup(w.free) // before the app's cleanup waits for the drain, when the test fails early
			admin := "http://" + in.AdminAddr()
			listeners := map[string]string{
				"ingress": in.ingressAddr(), "egress": in.egressAddr(), "grpc": in.grpcAddr(),
				"rls": in.rls().Addr(), "bridge": bridgeAddr,
			}
			for name, addr := range listeners {
				c, err := net.DialTimeout("tcp", addr, prompt)
				if err != nil {
					t.Fatalf("%s (%s) does not accept before the shutdown: %v", name, addr, err)
				}
				c.Close()
			}
			// A caller's keep-alive connection to the ingress, idle
			// after one answered request.
			ka, err := net.DialTimeout("tcp", listeners["ingress"], prompt)
			if err != nil {
				t.Fatal(err)
			}
			defer ka.Close()
			_ = ka.SetDeadline(time.Now().Add(10 * time.Second))
			kr := bufio.NewReader(ka)
			fmt.Fprint(ka, "GET /before HTTP/1.1\r\nHost: w\r\n\r\n")
			resp, err := http.ReadResponse(kr, nil)
			if err != nil || resp.StatusCode != 200 {
				t.Fatalf("GET /before through the ingress: %v %v", resp, err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)

			finish := c.hold(t, listeners["egress"], w.addr, w)
			in.cancel() // SIGTERM
			await(t, draining, 10*time.Second, `"draining" log`)

			probe := &http.Client{Timeout: prompt}
			began := time.Now()
			if resp, err := probe.Get(admin + "/readyz"); err != nil {
				t.Errorf("/readyz during the drain: %v", err)
			} else {
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 503 || !strings.Contains(string(body), "draining") {
					t.Errorf("/readyz during the drain after %v: %d %s, want 503 draining", time.Since(began), resp.StatusCode, body)
				}
			}
			for name, addr := range listeners {
				if c, err := net.DialTimeout("tcp", addr, prompt); err == nil {
					c.Close()
					t.Errorf("%s (%s) accepts a new connection during the drain", name, addr)
				}
			}
			_ = ka.SetReadDeadline(time.Now().Add(prompt))
			var ne net.Error
			if _, err := kr.ReadByte(); err == nil || errors.As(err, &ne) && ne.Timeout() {
				t.Errorf("an idle keep-alive connection to the ingress stays open during the drain: %v", err)
			}
			if resp, err := probe.Get(admin + "/metrics"); err != nil || resp.StatusCode != 200 {
				t.Errorf("/metrics during the drain: %v %v", resp, err)
			} else {
				resp.Body.Close()
			}
			if err := in.Reload(); err == nil || !strings.Contains(err.Error(), "shutting down") {
				t.Errorf("a reload during the drain: %v, want refused: shutting down", err)
			}

			finish()
			result := make(chan error, 1)
			go func() { result <- in.result() }()
			if err := await(t, result, 10*time.Second, "end of the drain after the held work finished"); err != nil {
				t.Fatalf("shutdown: %v", err)
			}
			if c, err := net.DialTimeout("tcp", strings.TrimPrefix(admin, "http://"), prompt); err == nil {
				c.Close()
				t.Error("the admin listener still accepts after the drain")
			}
		})
	}
}

// worker is the worker process behind the ingress and the upstream of
// the egress: /slow waits until free, everything else answers at once.
type worker struct {
	addr    string
	entered chan struct{}
	release chan struct{}
	once    sync.Once
}

func newWorker(t *testing.T) *worker {
	t.Helper()
	w := &worker{entered: make(chan struct{}, 1), release: make(chan struct{})}
	srv := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			w.entered <- struct{}{}
			<-w.release
		}
		_, _ = io.WriteString(rw, strings.TrimPrefix(r.URL.Path, "/"))
	}))
	w.addr = srv.Listener.Addr().String()
	t.Cleanup(srv.Close)
	t.Cleanup(w.free) // runs first: the server's Close waits for its handlers
	return w
}

func (w *worker) free() { w.once.Do(func() { close(w.release) }) }

// SIGTERM stops admission at once, not after the ingress that serves the
// runs API has drained: a run queued behind a key, whose key frees while
// a slow request keeps the ingress draining, is not started (the grace
// would abandon it and the restart deliver it again); it stays QUEUED.
func TestShutdownAdmitsNoRun(t *testing.T) {
	deliveries := make(chan string, 4)
	w := newWorker(t)
	finishRun := make(chan struct{})
	var finishOnce sync.Once
	free := func() { finishOnce.Do(func() { close(finishRun) }) }
	worker := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			w.entered <- struct{}{}
			<-w.release
			_, _ = io.WriteString(rw, "slow")
			return
		}
		deliveries <- r.Header.Get("x-run-id")
		<-finishRun // the run's work; its 200 completes it
	}))
	t.Cleanup(worker.Close)
	t.Cleanup(free)
	t.Cleanup(w.free)
	log, draining := watchLog("draining")
	in := startAppWith(t, fmt.Sprintf(`version: 1
shutdown_grace: 30s
admin: { listen: "127.0.0.1:0" }
ingress: { listen: "127.0.0.1:0", worker: %q }
scheduler:
  lanes: 5
  store: { kind: memory }
  definitions:
    job: { key: "${input.k}", key_concurrency: 1 }
`, worker.URL), Options{Log: log})
	base := "http://" + in.ingressAddr()
	submit := func() string { return submitRun(t, base+"/v1/runs", `{"name":"job","input":{"k":"a"}}`) }
	first := submit()
	if got := await(t, deliveries, 10*time.Second, "delivery of the first run"); got != first {
		t.Fatalf("delivered %s, want %s", got, first)
	}
	submit() // waits for the key

	slow := make(chan string, 1)
	go func() {
		resp, err := http.Get(base + "/slow")
		if err != nil {
			slow <- err.Error()
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		slow <- fmt.Sprintf("%d %s", resp.StatusCode, b)
	}()
	await(t, w.entered, 10*time.Second, "slow request at the worker")
	in.cancel() // SIGTERM
	await(t, draining, 10*time.Second, `"draining" log`)

	free() // the first run completes: its key is free
	// Before the fix the freed key admitted the second run within
	// milliseconds; this bounds a wait for what must not happen.
	select {
	case id := <-deliveries:
		t.Errorf("run %s delivered during the drain", id)
	case <-time.After(time.Second):
	}
	var queues []struct {
		Scope string
		Depth int
	}
	body := getBody(t, "http://"+in.AdminAddr()+"/v1/queues")
	if err := json.Unmarshal([]byte(body), &queues); err != nil || len(queues) == 0 || queues[0].Depth != 1 {
		t.Errorf("/v1/queues during the drain: %s (%v), want the second run queued", body, err)
	}
	w.free()
	if got := await(t, slow, 10*time.Second, "answer to the slow request"); got != "200 slow" {
		t.Errorf("the request in flight at shutdown: %q, want 200 slow", got)
	}
	result := make(chan error, 1)
	go func() { result <- in.result() }()
	if err := await(t, result, 10*time.Second, "end of the drain"); err != nil {
		t.Fatalf("shutdown: %v", err)
	}
	select {
	case id := <-deliveries:
		t.Errorf("run %s delivered during the drain", id)
	default:
	}
}
