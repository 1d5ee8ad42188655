package scheduler

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/warden-dev/warden/internal/testkit/loopback"
	"github.com/warden-dev/warden/internal/testkit/pgtest"
	"github.com/warden-dev/warden/scheduler/store"
	"github.com/warden-dev/warden/scheduler/store/pgstore"
)

// sharedDB is one schema of the test database for one test: its URL (with
// search_path), a connection for the test's own checks, and cleanup that
// drops it.
type sharedDB struct {
	url  string
	conn *pgx.Conn
}

func newSharedDB(t *testing.T) *sharedDB {
	t.Helper()
	u := pgtest.SchemaURL(t, "warden_sched")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, u.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	db := &sharedDB{url: u.String(), conn: conn}
	// Create the tables now, so the test's own queries never race the
	// first sidecar's migration.
	db.open(t).Close()
	return db
}

func (db *sharedDB) open(t *testing.T) *pgstore.Store {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	st, err := pgstore.Open(ctx, db.url)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func (db *sharedDB) count(t *testing.T, where string) int {
	t.Helper()
	var n int64
	if err := db.conn.QueryRow(context.Background(), "SELECT count(*) FROM warden_runs WHERE "+where).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return int(n)
}

// sidecar is one in-process warden on the shared store: its own store
// connection pool, scheduler, HTTP listener and worker.
func newSidecar(t *testing.T, db *sharedDB, w *worker, sched string, lease time.Duration) *harness {
	t.Helper()
	st := db.open(t)
	t.Cleanup(func() { st.Close() }) // after the harness's shutdown (cleanups run last-in first-out)
	return newHarness(t, policyYAML(w.srv.URL, sched, ""), withStore(st), withLease(lease))
}

// Three sidecars on one Postgres queue, 500 runs, lanes 5: a sampler
// reading the database never sees more than 5 runs STARTING/RUNNING across
// all three, every run reaches exactly one worker exactly once, and the
// three share the work.
func TestSharedStoreThreeSidecarsLanes(t *testing.T) {
	db := newSharedDB(t)
	const n, lanes = 500, 5
	var workers [3]*worker
	var sidecars [3]*harness
	for i := range sidecars {
		workers[i] = newWorker(t, func(d delivery) (int, string) {
			time.Sleep(2 * time.Millisecond) // runs overlap across sidecars
			return 200, `{"ok":true}`
		})
		sidecars[i] = newSidecar(t, db, workers[i], fmt.Sprintf(`
  lanes: %d
  worker_max_concurrent: 4
  definitions:
    job: {}`, lanes), 2*time.Second)
	}

	// The sampler: admitted runs across every sidecar, read from the store.
	stop := make(chan struct{})
	var maxAdmitted atomic.Int64
	var samples atomic.Int64
	sampled := make(chan error, 1)
	go func() {
		conn, err := pgx.Connect(context.Background(), db.url)
		if err != nil {
			sampled <- err
			return
		}
		defer conn.Close(context.Background())
		for {
			select {
			case <-stop:
				sampled <- nil
				return
			default:
			}
			var k int64
			if err := conn.QueryRow(context.Background(), "SELECT count(*) FROM warden_runs WHERE status IN (2, 3)").Scan(&k); err != nil {
				sampled <- err
				return
			}
			samples.Add(1)
			if k > maxAdmitted.Load() {
				maxAdmitted.Store(k)
			}
		}
	}()

	var wg sync.WaitGroup
	jobs := make(chan int)
	for range 12 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range jobs {
				h := sidecars[i%3]
				resp, err := h.client.Post(h.base, "application/json", strings.NewReader(fmt.Sprintf(`{"name":"job","input":{"i":%d}}`, i)))
				if err != nil {
					t.Error(err)
					continue
				}
				resp.Body.Close()
				if resp.StatusCode != http.StatusAccepted {
					t.Errorf("submit %d: %d", i, resp.StatusCode)
				}
			}
		}()
	}
	for i := range n {
		jobs <- i
	}
	close(jobs)
	wg.Wait()
	deadline := time.Now().Add(40 * time.Second)
	for db.count(t, "status = 5") < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d runs COMPLETED", db.count(t, "status = 5"), n)
		}
		time.Sleep(20 * time.Millisecond)
	}
	close(stop)
	if err := <-sampled; err != nil {
		t.Fatal(err)
	}
	if m := maxAdmitted.Load(); m > lanes || m < 2 {
		t.Fatalf("the sampler saw at most %d runs admitted at once (in %d samples); want 2..%d", m, samples.Load(), lanes)
	}
	seen := map[string]int{}
	for i, w := range workers {
		got := w.deliveries()
		if len(got) == 0 {
			t.Errorf("sidecar %d delivered nothing: the queue is not shared", i)
		}
		if w.max() > 4 {
			t.Errorf("worker %d ran %d at once; worker_max_concurrent is 4", i, w.max())
		}
		for _, d := range got {
			if d.attempt != "1" {
				t.Errorf("run %s delivered with attempt %s", d.id, d.attempt)
			}
			seen[d.id]++
		}
	}
	if len(seen) != n {
		t.Fatalf("%d distinct runs reached the workers, want %d", len(seen), n)
	}
	for id, k := range seen {
		if k != 1 {
			t.Errorf("run %s reached the workers %d times", id, k)
		}
	}
}

// kill -9 of a sidecar (a child process) while it delivers three runs and
// its worker holds a fourth it accepted (202): the other two sidecars
// finish all four after its lease expires, with the next x-run-attempt
// (the accepted one because its retry policy allows another attempt);
// every other run is delivered once. Asking a live sidecar to complete a
// run the dead one delivered is a 409 that says where the run is.
func TestSharedStoreKill9(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a child process")
	}
	db := newSharedDB(t)
	// worker_max_concurrent 4: the child takes the four runs it is given
	// and nothing the others are sent.
	defs := `
  definitions:
    job: { retry: { count: 1, delay: 0s } }`
	sched := `
  lanes: 5
  worker_max_concurrent: 4
  store: { kind: postgres, url: "` + db.url + `" }` + defs
	// The child's worker accepts run i=3 and holds the others unanswered.
	release := make(chan struct{})
	dead := newWorker(t, func(d delivery) (int, string) {
		if strings.Contains(d.body, `"i":3`) {
			return 202, ""
		}
		<-release
		return 200, "{}"
	})
	defer close(release)
	dir := t.TempDir()
	policyFile := filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(policyFile, []byte(policyYAML(dead.srv.URL, sched, "")), 0o600); err != nil {
		t.Fatal(err)
	}
	child := startChild(t, policyFile, dir, childLeaseEnv+"=1500ms")
	client := &http.Client{}
	defer client.CloseIdleConnections()
	submit := func(base string, i int) string {
		resp, err := client.Post(base, "application/json", strings.NewReader(fmt.Sprintf(`{"name":"job","input":{"i":%d}}`, i)))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var v RunView
		if err := decodeJSON(resp.Body, &v); err != nil || resp.StatusCode != http.StatusAccepted {
			t.Fatalf("submit: %d %v", resp.StatusCode, err)
		}
		return v.ID
	}
	held := map[string]bool{}
	for i := range 4 {
		held[submit(child.base, i)] = true
	}
	for range 4 {
		if d := dead.next(t); !held[d.id] {
			t.Fatalf("the child delivered run %s, not one of %v", d.id, held)
		}
	}
	accepted := ""
	for _, d := range dead.deliveries() {
		if strings.Contains(d.body, `"i":3`) {
			accepted = d.id
		}
	}
	for wait := time.Now().Add(10 * time.Second); db.count(t, "status = 3") != 1; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(wait) {
			t.Fatalf("%d runs RUNNING before the kill, want the one the child's worker accepted", db.count(t, "status = 3"))
		}
	}

	var live [2]*worker
	var sidecars [2]*harness
	for i := range sidecars {
		live[i] = newWorker(t, nil)
		sidecars[i] = newSidecar(t, db, live[i], `
  lanes: 5`+defs, 1500*time.Millisecond)
	}
	if r := sidecars[0].do("POST", "/"+accepted+"/complete", `{"status":"COMPLETED"}`); r.code != http.StatusConflict ||
		!strings.Contains(string(r.body), "another sidecar") {
		t.Fatalf("complete through a sidecar that does not hold the run: %d %s", r.code, r.body)
	}
	const more = 20
	for i := range more {
		submit(sidecars[i%2].base, 100+i)
	}
	if err := child.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	child.wait()

	deadline := time.Now().Add(20 * time.Second)
	for db.count(t, "status = 5") < 4+more {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d runs COMPLETED after the kill", db.count(t, "status = 5"), 4+more)
		}
		time.Sleep(20 * time.Millisecond)
	}
	attempts := map[string][]string{}
	for _, w := range live {
		for _, d := range w.deliveries() {
			attempts[d.id] = append(attempts[d.id], d.attempt)
		}
	}
	if len(attempts) != 4+more {
		t.Fatalf("the live workers saw %d runs, want %d", len(attempts), 4+more)
	}
	for id, got := range attempts {
		want := "[1]"
		if held[id] {
			want = "[2]"
		}
		if fmt.Sprint(got) != want {
			t.Errorf("run %s reached the live workers with attempts %v, want %s", id, got, want)
		}
	}
	if got := len(dead.deliveries()); got != 4 {
		t.Errorf("the killed sidecar's worker saw %d deliveries, want 4", got)
	}
}

// On a shared store, a waiting run names the shared gate holding it
// (pool_rate, key_concurrency), and the end of the pool's window admits
// it (fake clock): not a moment before.
func TestSharedStoreControlsAndWindowBoundary(t *testing.T) {
	db := newSharedDB(t)
	w := newWorker(t, func(d delivery) (int, string) {
		if strings.Contains(d.body, `"k"`) {
			return 202, "" // keyed runs stay RUNNING
		}
		return 200, "{}"
	})
	st := db.open(t)
	t.Cleanup(func() { st.Close() })
	h := newHarness(t, policyYAML(w.srv.URL, `
  lanes: 5
  definitions:
    job: { pool: api }
    keyed: { key: "${input.k}", key_concurrency: 1 }`, "pools:\n  api: { rate: 2, window: 60 }\n"),
		withStore(st), withLease(2*time.Second), withFakeClock())
	var jobs []string
	for i := range 3 {
		rc := h.submit(fmt.Sprintf(`{"name":"job","input":{"i":%d}}`, i))
		jobs = append(jobs, rc.ID)
		// The first two find every gate open: they wait only for the
		// claim loop, which no control names and no rejection counts.
		if i < 2 && (rc.Status != "QUEUED" || rc.Control != nil) {
			t.Fatalf("receipt %d with every gate open: %s control %s, want QUEUED and no control", i, rc.Status, deref(rc.Control))
		}
	}
	h.waitStatus(jobs[0], "COMPLETED")
	h.waitStatus(jobs[1], "COMPLETED")
	if v := h.get(jobs[2]); v.Status != "QUEUED" || deref(v.Control) != ControlPoolRate {
		t.Fatalf("third run of a 2-per-minute pool: %s control %s, want QUEUED pool_rate", v.Status, deref(v.Control))
	}
	first := h.submit(`{"name":"keyed","input":{"k":"a"}}`).ID
	h.waitStatus(first, "RUNNING")
	second := h.submit(`{"name":"keyed","input":{"k":"a"}}`)
	if v := h.get(second.ID); v.Status != "QUEUED" || deref(v.Control) != ControlKey {
		t.Fatalf("second run of key a: %s control %s, want QUEUED key_concurrency", v.Status, deref(v.Control))
	}
	if deref(second.Control) != ControlKey {
		t.Fatalf("submit receipt names control %s, want key_concurrency", deref(second.Control))
	}
	// GET /v1/queues names what holds each definition's and key's next
	// run, read from the shared gates as the runs' views are.
	got := map[string]string{}
	for _, r := range h.sched.Queues() {
		name := r.Scope + ":" + r.Definition + r.Pool
		if r.Key != nil {
			name += ":" + *r.Key
		}
		got[name] = r.Control
	}
	for name, want := range map[string]string{"definition:job": ControlPoolRate, "definition:keyed": ControlKey, "key:keyed:a": ControlKey} {
		if got[name] != want {
			t.Errorf("/v1/queues %s: control %q, want %q (all: %v)", name, got[name], want, got)
		}
	}
	// t0 is 43 s before a minute boundary.
	h.fake.Advance(42 * time.Second)
	h.settle()
	if v := h.get(jobs[2]); v.Status != "QUEUED" {
		t.Fatalf("a second before the boundary the run is %s", v.Status)
	}
	h.fake.Advance(time.Second)
	h.waitStatus(jobs[2], "COMPLETED")
	if v := h.get(second.ID); v.Status != "QUEUED" {
		t.Fatalf("the key's second run is %s while the first still runs", v.Status)
	}
	// Receipts count what held them: the key's second run, and never lanes
	// that were not full. (Whether the third job's receipt saw the pool's
	// window full depends on how soon the claim loop took the first two.)
	for _, tc := range []struct {
		control, def string
		want         float64
	}{{ControlKey, "keyed", 1}, {ControlLanes, "job", 0}, {ControlLanes, "keyed", 0}} {
		if got := value(h.m.Rejections.WithLabelValues(tc.control, "run:"+tc.def)); got != tc.want {
			t.Errorf("warden_rejections_total{%s,run:%s} = %v, want %v", tc.control, tc.def, got, tc.want)
		}
	}
}

// A retryable failure on a shared store waits RETRY_WAIT, returns to the
// shared queue and is claimed again with the next attempt; a heartbeat
// renews the permit lease of a run the worker accepted.
func TestSharedStoreRetryAndHeartbeat(t *testing.T) {
	db := newSharedDB(t)
	w := newWorker(t, func(d delivery) (int, string) {
		switch {
		case strings.Contains(d.body, `"hold"`):
			return 202, ""
		case d.attempt == "1":
			return 503, "busy"
		}
		return 200, `{"done":true}`
	})
	h := newSidecar(t, db, w, `
  lanes: 5
  semaphores: { erp: 1 }
  definitions:
    job: { retry: { count: 1, delay: 50ms } }
    held: { semaphores: [erp], heartbeat_timeout: 1s }`, 2*time.Second)
	id := h.submit(`{"name":"job"}`).ID
	v := h.waitStatus(id, "COMPLETED")
	if v.Attempt != 2 {
		t.Fatalf("completed on attempt %d, want 2", v.Attempt)
	}
	hold := h.submit(`{"name":"held","input":{"hold":true}}`).ID
	h.waitStatus(hold, "RUNNING")
	var before, after int64
	// The lease is set just after the 202 is processed.
	for wait := time.Now().Add(10 * time.Second); before == 0; time.Sleep(time.Millisecond) {
		if err := db.conn.QueryRow(context.Background(), "SELECT expires_at FROM warden_permits WHERE seq = $1", mustSeq(hold)).Scan(&before); err != nil {
			t.Fatal(err)
		}
		if time.Now().After(wait) {
			t.Fatal("the permit of an accepted run was never leased")
		}
	}
	time.Sleep(5 * time.Millisecond)
	if r := h.do("POST", "/"+hold+"/heartbeat", ""); r.code != http.StatusOK {
		t.Fatalf("heartbeat: %d %s", r.code, r.body)
	}
	if err := db.conn.QueryRow(context.Background(), "SELECT expires_at FROM warden_permits WHERE seq = $1", mustSeq(hold)).Scan(&after); err != nil {
		t.Fatal(err)
	}
	if before == 0 || after <= before {
		t.Fatalf("permit lease %d after the 202, %d after the heartbeat: want set, then later", before, after)
	}
}

// SIGTERM on a shared store: the draining sidecar claims nothing more
// while its deliveries finish (another sidecar takes the new runs), and
// what it was delivering completes through it.
func TestSharedStoreDrainStopsClaiming(t *testing.T) {
	db := newSharedDB(t)
	release := make(chan struct{})
	var once sync.Once
	open := func() { once.Do(func() { close(release) }) }
	defer open()
	wa := newWorker(t, func(d delivery) (int, string) { <-release; return 200, "{}" })
	wb := newWorker(t, nil)
	sched := `
  lanes: 10
  definitions:
    job: {}`
	a := newSidecar(t, db, wa, sched, 2*time.Second)
	first := []string{a.submit(`{"name":"job"}`).ID, a.submit(`{"name":"job"}`).ID}
	wa.next(t)
	wa.next(t)
	drained := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		drained <- a.sched.Shutdown(ctx)
	}()
	a.waitUntil("the drain began", func(s *Scheduler) bool { return s.draining })
	b := newSidecar(t, db, wb, sched, 2*time.Second)
	var later []string
	for range 3 {
		later = append(later, b.submit(`{"name":"job"}`).ID)
	}
	for _, id := range later {
		b.waitStatus(id, "COMPLETED")
	}
	open()
	if err := recv(t, drained, "the drain"); err != nil {
		t.Fatal(err)
	}
	for _, id := range first {
		if v := b.get(id); v.Status != "COMPLETED" || v.Attempt != 1 {
			t.Fatalf("run %s delivered by the draining sidecar: %s attempt %d, want COMPLETED on attempt 1", id, v.Status, v.Attempt)
		}
	}
	if n := len(wa.deliveries()); n != 2 {
		t.Fatalf("the draining sidecar delivered %d runs, want only its first 2", n)
	}
}

// warden_runs on a sidecar of a shared queue comes from the store's counts
// only: a sidecar claiming runs another one took in never counts them out
// of a QUEUED it never counted them into (it went negative). The lease is
// long, so no sweep refreshes the gauge during the test.
func TestSharedStoreRunsGaugeNeverNegative(t *testing.T) {
	db := newSharedDB(t)
	const n = 10
	w := newWorker(t, func(d delivery) (int, string) {
		time.Sleep(5 * time.Millisecond) // runs overlap, so both sidecars claim
		return 200, `{"ok":true}`
	})
	sched := `
  worker_max_concurrent: 1
  definitions:
    job: {}`
	a := newSidecar(t, db, w, sched, time.Hour)
	b := newSidecar(t, db, w, sched, time.Hour)
	for i := range n {
		resp, err := a.client.Post(a.base, "application/json", strings.NewReader(fmt.Sprintf(`{"name":"job","input":{"i":%d}}`, i)))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	deadline := time.Now().Add(20 * time.Second)
	for db.count(t, "status = 5") < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d runs COMPLETED", db.count(t, "status = 5"), n)
		}
		time.Sleep(10 * time.Millisecond)
	}
	for name, h := range map[string]*harness{"a": a, "b": b} {
		for _, st := range []string{"QUEUED", "RUNNING", "COMPLETED"} {
			if v := value(h.m.Runs.WithLabelValues(st)); v < 0 {
				t.Errorf("sidecar %s: warden_runs{status=%q} = %v", name, st, v)
			}
		}
	}
}

// pgRelay stands between a sidecar and Postgres on loopback; cut drops
// every connection and refuses new ones until mend, as a database restart
// does.
type pgRelay struct {
	mu    sync.Mutex
	down  bool
	conns map[net.Conn]struct{}
}

func newPGRelay(t *testing.T, target string) (*pgRelay, string) {
	r := &pgRelay{conns: map[net.Conn]struct{}{}}
	addr := loopback.Serve(t, func(c net.Conn) {
		r.mu.Lock()
		if r.down {
			r.mu.Unlock()
			return
		}
		up, err := net.Dial("tcp", target)
		if err != nil {
			r.mu.Unlock()
			return
		}
		r.conns[c], r.conns[up] = struct{}{}, struct{}{}
		r.mu.Unlock()
		done := make(chan struct{}, 2)
		go func() { _, _ = io.Copy(up, c); done <- struct{}{} }()
		go func() { _, _ = io.Copy(c, up); done <- struct{}{} }()
		<-done
		up.Close()
		c.Close()
		<-done
		r.mu.Lock()
		delete(r.conns, c)
		delete(r.conns, up)
		r.mu.Unlock()
	})
	return r, addr
}

func (r *pgRelay) cut() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.down = true
	for c := range r.conns {
		c.Close()
	}
}

func (r *pgRelay) mend() {
	r.mu.Lock()
	r.down = false
	r.mu.Unlock()
}

// The shared store goes away while the worker finishes a run (a Postgres
// restart): the end is written once it is back, so the run leaves its
// lane and the next run is delivered. Before, the end was logged and
// dropped, and the row stayed STARTING under the sidecar's renewed lease,
// holding the fleet's only lane for ever (found by a fleet sweep).
func TestSharedStoreOutageKeepsTheRunsEnd(t *testing.T) {
	db := newSharedDB(t)
	u, err := url.Parse(db.url)
	if err != nil {
		t.Fatal(err)
	}
	relay, addr := newPGRelay(t, u.Host)
	u.Host = addr
	var first atomic.Bool
	w := newWorker(t, func(delivery) (int, string) {
		if first.CompareAndSwap(false, true) {
			relay.cut() // the database restarts while the worker works
		}
		return 200, `{"ok":true}`
	})
	st, err := pgstore.Open(context.Background(), u.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	h := newHarness(t, policyYAML(w.srv.URL, "\n  lanes: 1\n  definitions:\n    job: {}", ""), withStore(st), withLease(2*time.Second))
	id := h.submit(`{"name":"job"}`).ID
	w.next(t)
	h.waitUntil("the run's end waits for the store", func(s *Scheduler) bool { return s.pending[mustSeq(id)] != nil })
	relay.mend()
	h.waitUntil("the run's end is written", func(s *Scheduler) bool { return s.pending[mustSeq(id)] == nil })
	if n := db.count(t, fmt.Sprintf("seq = %d AND status = %d", mustSeq(id), store.Completed)); n != 1 {
		t.Fatalf("run %s not stored COMPLETED after the outage", id)
	}
	next := h.submit(`{"name":"job"}`).ID
	if d := w.next(t); d.id != next {
		t.Fatalf("delivered %s, want the next run %s through the freed lane", d.id, next)
	}
	h.waitStatus(next, "COMPLETED")
}
