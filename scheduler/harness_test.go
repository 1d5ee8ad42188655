package scheduler

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/warden-dev/warden/governor"
	"github.com/warden-dev/warden/governor/clock"
	"github.com/warden-dev/warden/governor/metrics"
	"github.com/warden-dev/warden/governor/window"
	"github.com/warden-dev/warden/policy"
	"github.com/warden-dev/warden/scheduler/store"
)

// t0 is a Monday 12:00:17 local time: windows of 60 s end 43 s later.
var t0 = time.Date(2026, 1, 5, 12, 0, 17, 0, time.Local)

// delivery is one request the test worker received.
type delivery struct {
	id      string
	attempt string
	tenant  string
	body    string
	at      time.Time
}

// worker is a real HTTP worker on loopback that counts what reaches it:
// deliveries in arrival order and the most it ever ran at once. respond
// decides each answer; it may block (the worker holds the run) until the
// test releases it.
type worker struct {
	srv      *httptest.Server
	mu       sync.Mutex
	got      []delivery
	inFlight int
	maxSeen  int
	arrived  chan delivery
	respond  func(d delivery) (int, string)
	header   http.Header // sent with every reply; set with setHeader
}

// setHeader has the worker send k: v with its replies from now on.
func (w *worker) setHeader(k, v string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.header == nil {
		w.header = http.Header{}
	}
	w.header.Set(k, v)
}

func newWorker(t *testing.T, respond func(d delivery) (int, string), held ...*gates) *worker {
	w := &worker{arrived: make(chan delivery, 4096), respond: respond}
	w.srv = httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		d := delivery{id: r.Header.Get("x-run-id"), attempt: r.Header.Get("x-run-attempt"),
			tenant: r.Header.Get("x-tenant-id"), body: string(body), at: time.Now()}
		w.mu.Lock()
		w.got = append(w.got, d)
		w.inFlight++
		w.maxSeen = max(w.maxSeen, w.inFlight)
		w.mu.Unlock()
		w.arrived <- d
		code, out := http.StatusOK, `{"ok":true}`
		if w.respond != nil {
			code, out = w.respond(d)
		}
		w.mu.Lock()
		w.inFlight--
		for k, v := range w.header {
			rw.Header()[k] = v
		}
		w.mu.Unlock()
		rw.WriteHeader(code)
		io.WriteString(rw, out)
	}))
	t.Cleanup(func() {
		for _, g := range held {
			g.openAll()
		}
		w.srv.Close()
	})
	return w
}

// newGatedWorker holds every run until the test releases it through g.
func newGatedWorker(t *testing.T, g *gates) *worker {
	return newWorker(t, func(d delivery) (int, string) { g.wait(d.id); return 200, "{}" }, g)
}

func (w *worker) deliveries() []delivery {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]delivery(nil), w.got...)
}

func (w *worker) max() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.maxSeen
}

// recv waits for a value on ch; after 10 s it fails the test instead of
// hanging the package until go test's timeout.
func recv[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: nothing within 10s", what)
		var zero T
		return zero
	}
}

// next waits for the next delivery.
func (w *worker) next(t *testing.T) delivery {
	t.Helper()
	return recv(t, w.arrived, "a delivery to the worker")
}

// none checks that nothing reaches the worker while the scheduler settles.
func (w *worker) none(t *testing.T, h *harness) {
	t.Helper()
	h.settle()
	select {
	case d := <-w.arrived:
		t.Fatalf("unexpected delivery of run %s (attempt %s)", d.id, d.attempt)
	default:
	}
}

// harness is a scheduler serving its handler on a fasthttp server on
// loopback, with the governor of a policy and a test worker.
type harness struct {
	t       *testing.T
	clk     clock.Clock
	fake    *clock.Fake
	gov     *governor.Governor
	sched   *Scheduler
	st      store.Store
	base    string
	client  *http.Client
	m       *metrics.Metrics
	wrap    func(*harness, fasthttp.RequestHandler) fasthttp.RequestHandler
	dataDir string // set: the scheduler opens its own bbolt store there (or keeps its owner id there, with a shared store)
	lease   time.Duration
	owner   string
}

type harnessOpt func(*harness)

func withFakeClock() harnessOpt {
	return func(h *harness) { h.fake = clock.NewFake(t0); h.clk = h.fake }
}

func withStore(st store.Store) harnessOpt { return func(h *harness) { h.st = st } }

func withWrap(f func(*harness, fasthttp.RequestHandler) fasthttp.RequestHandler) harnessOpt {
	return func(h *harness) { h.wrap = f }
}

// withLease sets the claim lease of a scheduler on a shared store.
func withLease(d time.Duration) harnessOpt { return func(h *harness) { h.lease = d } }

// withOwner sets the owner id of a scheduler on a shared store.
func withOwner(owner string) harnessOpt { return func(h *harness) { h.owner = owner } }

// withDataDir lets the scheduler open the bbolt store of the policy in dir.
func withDataDir(dir string) harnessOpt { return func(h *harness) { h.dataDir = dir } }

// withGovernor shares another harness's governor (and so its pool windows,
// as a shared backend would across a restart) and clock.
func withGovernor(g *governor.Governor, clk clock.Clock) harnessOpt {
	return func(h *harness) {
		h.gov, h.clk = g, clk
		if f, ok := clk.(*clock.Fake); ok {
			h.fake = f
		}
	}
}

// policyYAML fills the worker URL into a policy whose scheduler section is
// given (indented two spaces under scheduler:). extra is appended at the
// top level (pools, ingress tenant caps).
func policyYAML(workerURL, sched, extra string) string {
	return fmt.Sprintf("version: 1\nshutdown_grace: 5s\ningress:\n  listen: 127.0.0.1:0\n  worker: %s\n%s\nscheduler:\n%s\n", workerURL, extra, sched)
}

func newHarness(t *testing.T, yaml string, opts ...harnessOpt) *harness {
	t.Helper()
	h := &harness{t: t, clk: clock.Real{}, m: metrics.New()}
	for _, o := range opts {
		o(h)
	}
	p, err := policy.Parse("test.yaml", []byte(yaml))
	if err != nil {
		t.Fatalf("policy: %v\n%s", err, yaml)
	}
	if h.gov == nil {
		h.gov = governor.New(h.clk, h.m, window.NewMemory(h.clk))
	}
	c := h.gov.Apply(p)
	if h.st == nil && h.dataDir == "" {
		h.st = store.NewMemory()
	}
	h.sched = New(Options{Clock: h.clk, Metrics: h.m, Store: h.st, DataDir: h.dataDir, Lease: h.lease, Owner: h.owner})
	if err := h.sched.Apply(context.Background(), c); err != nil {
		t.Fatal(err)
	}
	handler := h.sched.Handler()
	if h.wrap != nil {
		handler = h.wrap(h, handler)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	// A short idle-worker sweep lets the server's cleaner goroutine notice
	// Shutdown quickly (goleak).
	srv := &fasthttp.Server{Handler: handler, MaxIdleWorkerDuration: 20 * time.Millisecond}
	served := make(chan struct{})
	go func() { defer close(served); srv.Serve(ln) }()
	h.base = "http://" + ln.Addr().String() + "/v1/runs"
	h.client = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 512}}
	t.Cleanup(func() {
		h.client.CloseIdleConnections()
		srv.Shutdown()
		ln.Close() // in case Serve had not registered it (see fasttest.StartUpstream)
		<-served
		h.shutdown()
	})
	return h
}

func (h *harness) shutdown() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := h.sched.Shutdown(ctx); err != nil {
		h.t.Errorf("shutdown: %v", err)
	}
}

// reload applies a new policy.
func (h *harness) reload(yaml string) error {
	p, err := policy.Parse("test.yaml", []byte(yaml))
	if err != nil {
		h.t.Fatalf("policy: %v", err)
	}
	return h.sched.Apply(context.Background(), h.gov.Apply(p))
}

type apiReply struct {
	code int
	body []byte
	hdr  http.Header
}

func (r apiReply) run(t *testing.T) RunView {
	t.Helper()
	var v RunView
	if err := json.Unmarshal(r.body, &v); err != nil {
		t.Fatalf("decode %s: %v", r.body, err)
	}
	return v
}

func (h *harness) do(method, path, body string, hdr ...string) apiReply {
	h.t.Helper()
	req, err := http.NewRequest(method, h.base+path, strings.NewReader(body))
	if err != nil {
		h.t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := h.client.Do(req)
	if err != nil {
		h.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return apiReply{code: resp.StatusCode, body: b, hdr: resp.Header}
}

// submit posts a run and expects 202.
func (h *harness) submit(body string, hdr ...string) RunView {
	h.t.Helper()
	r := h.do("POST", "", body, hdr...)
	if r.code != http.StatusAccepted {
		h.t.Fatalf("submit %s: %d %s", body, r.code, r.body)
	}
	return r.run(h.t)
}

func (h *harness) get(id string) RunView {
	h.t.Helper()
	r := h.do("GET", "/"+id, "")
	if r.code != http.StatusOK {
		h.t.Fatalf("get %s: %d %s", id, r.code, r.body)
	}
	return r.run(h.t)
}

// waitStatus waits for a run to reach status (the last write of a
// transition lands just after the worker answers).
func (h *harness) waitStatus(id, status string) RunView {
	h.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		v := h.get(id)
		if v.Status == status {
			return v
		}
		if time.Now().After(deadline) {
			h.t.Fatalf("run %s is %s (control %v, reason %v), want %s", id, v.Status, deref(v.Control), deref(v.ReasonForIncompletion), status)
		}
		time.Sleep(time.Millisecond)
	}
}

// waitUntil polls an internal condition of the scheduler.
func (h *harness) waitUntil(what string, cond func(s *Scheduler) bool) {
	h.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		h.sched.mu.Lock()
		ok := cond(h.sched)
		h.sched.mu.Unlock()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			h.t.Fatalf("timed out waiting until %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// settle waits until no delivery is being started and no API call or timer
// callback runs: whatever the scheduler was going to do now is done.
func (h *harness) settle() {
	h.waitUntil("no admission is being persisted", func(s *Scheduler) bool {
		for _, a := range s.active {
			if a.getPhase() == phaseAdmitted {
				return false
			}
		}
		return true
	})
}

func deref(p *string) string {
	if p == nil {
		return "<nil>"
	}
	return *p
}

func jsonUnmarshal(b []byte, v any) error { return json.Unmarshal(b, v) }

func decodeJSON(r io.Reader, v any) error { return json.NewDecoder(r).Decode(v) }

// waitPhase waits until an admitted run reaches phase (phaseAsync: the
// worker's 202 was processed and its timers and leases are set).
func (h *harness) waitPhase(id string, p phase) {
	h.t.Helper()
	h.waitUntil(fmt.Sprintf("run %s reaches phase %d", id, p), func(s *Scheduler) bool {
		a := s.active[mustSeq(id)]
		return a != nil && a.getPhase() == p
	})
}
