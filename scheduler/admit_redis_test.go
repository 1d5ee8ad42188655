package scheduler

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/warden-dev/warden/governor"
	"github.com/warden-dev/warden/governor/backend/redisx"
	"github.com/warden-dev/warden/governor/clock"
	"github.com/warden-dev/warden/governor/metrics"
	"github.com/warden-dev/warden/governor/window"
	"github.com/warden-dev/warden/internal/testkit/fasttest"
	"github.com/warden-dev/warden/internal/testkit/redistest"
	"github.com/warden-dev/warden/internal/testkit/testenv"
	"github.com/warden-dev/warden/policy"
	"github.com/warden-dev/warden/scheduler/store"
)

// redisSidecar is one in-process warden whose lanes and semaphores are
// shared through Redis: its own Redis client (batcher, renewals, holder
// names), governor, memory run store and scheduler, on the common Redis
// and key prefix.
type redisSidecar struct {
	t   *testing.T
	s   *Scheduler
	red *window.Redis
	m   *metrics.Metrics
}

func newRedisSidecar(t *testing.T, url, prefix string, clk clock.Clock, failClosed bool, workerURL, sched string) *redisSidecar {
	t.Helper()
	return startRedisSidecar(t, url, prefix, clk, failClosed, workerURL, sched, "", store.NewMemory())
}

// startRedisSidecar is newRedisSidecar with top-level policy sections
// (pools) and a run store the test keeps (to start a sidecar again on it).
func startRedisSidecar(t *testing.T, url, prefix string, clk clock.Clock, failClosed bool, workerURL, sched, extra string, st store.Store) *redisSidecar {
	t.Helper()
	return startRedisSidecarTTL(t, url, prefix, clk, failClosed, workerURL, sched, extra, st, 0)
}

// startRedisSidecarTTL is startRedisSidecar with the Redis client's lease
// TTL (0: the default).
func startRedisSidecarTTL(t *testing.T, url, prefix string, clk clock.Clock, failClosed bool, workerURL, sched, extra string, st store.Store, ttl time.Duration) *redisSidecar {
	t.Helper()
	// Generous deadlines: exact counts must not depend on a busy machine
	// never stalling 100 ms (the outages here are stopped servers, which
	// refuse at once).
	red, err := window.NewRedis(window.RedisConfig{Config: redisx.Config{URL: url, FailClosed: failClosed,
		DialTimeout: 5 * time.Second, ReadTimeout: 5 * time.Second, WriteTimeout: 5 * time.Second, LeaseTTL: ttl}, Prefix: prefix}, clk, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { red.Close() }) // after the scheduler's shutdown below
	yaml := policyYAML(workerURL, sched, extra)
	p, err := policy.Parse("test.yaml", []byte(yaml))
	if err != nil {
		t.Fatalf("policy: %v\n%s", err, yaml)
	}
	m := metrics.New()
	s := New(Options{Clock: clk, Store: st, Counter: red, Metrics: m})
	if err := s.Apply(context.Background(), governor.New(clk, nil, red).Apply(p)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := s.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
	})
	return &redisSidecar{t: t, s: s, red: red, m: m}
}

// submit queues a run of definition name with input and returns its id.
func (sc *redisSidecar) submit(name, input string) string {
	sc.t.Helper()
	rc, _, err := sc.s.Submit(context.Background(), SubmitRequest{Name: name, Input: []byte(input)})
	if err != nil {
		sc.t.Fatalf("submit %s %s: %v", name, input, err)
	}
	return rc.ID
}

func (sc *redisSidecar) get(id string) RunView {
	sc.t.Helper()
	v, err := sc.s.Get(context.Background(), id)
	if err != nil {
		sc.t.Fatalf("get %s: %v", id, err)
	}
	return v
}

func (sc *redisSidecar) waitStatus(id, status string) {
	sc.t.Helper()
	fasttest.WaitFor(sc.t, fmt.Sprintf("run %s %s", id, status), func() bool { return sc.get(id).Status == status })
}

// gatesState reads the scheduler's Redis admitter under its lock.
func (sc *redisSidecar) gatesState(f func(rg *redisAdmitter) bool) bool {
	sc.s.mu.Lock()
	defer sc.s.mu.Unlock()
	return f(sc.s.adm.(*redisAdmitter))
}

// refusedBy waits until the sidecar's last shared admission was refused
// by control and its pass is over.
func (sc *redisSidecar) refusedBy(control string) {
	sc.t.Helper()
	fasttest.WaitFor(sc.t, "a shared admission refused by "+control, func() bool {
		return sc.gatesState(func(rg *redisAdmitter) bool { return rg.global == control && !rg.passing })
	})
}

func (sc *redisSidecar) semaphoreHeld(name string) int {
	for _, st := range sc.s.Semaphores() {
		if st.Name == name {
			return st.Held
		}
	}
	sc.t.Fatalf("no semaphore %s", name)
	return 0
}

func laneSet(prefix string) string { return window.LeaseSet(prefix, laneKind, laneName) }

// gatedByBody is a worker that holds each run until the test opens the
// gate named by its input (run ids repeat across sidecars: each has its
// own store).
func gatedByBody(t *testing.T) (*worker, *gates) {
	g := newGates()
	w := newWorker(t, func(d delivery) (int, string) { g.wait(d.body); return http.StatusOK, `{}` }, g)
	return w, g
}

// redisPair is two sidecars with the scheduler section sched, sharing
// their gates through one Redis prefix and one gatedByBody worker, whose
// gates open before the sidecars shut down.
func redisPair(t *testing.T, sched string) (a, b *redisSidecar, w *worker, g *gates) {
	url := testenv.RedisURL(t)
	prefix := redistest.Prefix(t, url)
	w, g = gatedByBody(t)
	a = newRedisSidecar(t, url, prefix, clock.Real{}, false, w.srv.URL, sched)
	b = newRedisSidecar(t, url, prefix, clock.Real{}, false, w.srv.URL, sched)
	t.Cleanup(g.openAll)
	return a, b, w, g
}

// A submission through shared gates is answered as the memory backend
// answers it (SPEC §4, §6): a run every gate admits at once is RUNNING
// with no control and counts no rejection; a run that waits names the
// gate that holds it — a semaphore held on another sidecar, the lanes
// held across both — and counts one rejection under that control only.
func TestRedisSubmitNamesItsControl(t *testing.T) {
	other, sc, w, g := redisPair(t, `
  lanes: 3
  semaphores: { erp: 1 }
  definitions:
    job: {}
    sem: { semaphores: [erp] }`)

	steps := []struct {
		name    string
		on      *redisSidecar
		def     string
		status  string // the receipt's
		control string // the receipt's, as deref shows it
	}{
		{"lanes free", sc, "job", "RUNNING", "<nil>"},
		{"other takes the permit", other, "sem", "RUNNING", "<nil>"},
		{"permit held on the other sidecar", sc, "sem", "QUEUED", ControlSemaphore},
		{"other takes the last lane", other, "job", "RUNNING", "<nil>"},
		{"no lane left", sc, "job", "QUEUED", ControlLanes},
	}
	rejected := map[[2]string]float64{} // sc's, by control and definition
	for i, st := range steps {
		input := fmt.Sprintf(`{"step":%d}`, i)
		rc, _, err := st.on.s.Submit(context.Background(), SubmitRequest{Name: st.def, Input: []byte(input)})
		if err != nil {
			t.Fatalf("%s: submit: %v", st.name, err)
		}
		if rc.Status != st.status || deref(rc.Control) != st.control || rc.AwaitingAdmission != (st.status == "QUEUED") {
			t.Fatalf("%s: receipt %s awaiting=%v control %q, want %s control %q",
				st.name, rc.Status, rc.AwaitingAdmission, deref(rc.Control), st.status, st.control)
		}
		if st.status == "RUNNING" {
			if d := w.next(t); d.body != input {
				t.Fatalf("%s: delivered %s, want %s", st.name, d.body, input)
			}
		} else {
			if v := st.on.get(rc.ID); v.Status != "QUEUED" || deref(v.Control) != st.control {
				t.Fatalf("%s: GET says %s control %q after the receipt said %s", st.name, v.Status, deref(v.Control), st.control)
			}
			rejected[[2]string{st.control, st.def}]++
		}
		for _, c := range []string{ControlLanes, ControlSemaphore} {
			for _, def := range []string{"job", "sem"} {
				if got, want := value(sc.m.Rejections.WithLabelValues(c, "run:"+def)), rejected[[2]string{c, def}]; got != want {
					t.Fatalf("%s: warden_rejections_total{control=%q,scope=\"run:%s\"} = %v, want %v", st.name, c, def, got, want)
				}
			}
		}
	}
	g.openAll()
	for _, id := range []string{"1", "2", "3"} {
		sc.waitStatus(id, "COMPLETED")
	}
}

// Three schedulers, each with its own store, share lanes 5 through one
// Redis: 300 runs submitted across them never run more than 5 at once at
// the worker they all deliver to, every run is delivered once and
// completes, and every lane is given back at the end.
func TestRedisLanesThreeSchedulers(t *testing.T) {
	url := testenv.RedisURL(t)
	prefix := redistest.Prefix(t, url)
	const n, lanes = 300, 5
	w := newWorker(t, func(delivery) (int, string) {
		time.Sleep(3 * time.Millisecond) // the work: runs of different sidecars overlap
		return http.StatusOK, `{}`
	})
	var sc [3]*redisSidecar
	for i := range sc {
		sc[i] = newRedisSidecar(t, url, prefix, clock.Real{}, false, w.srv.URL, fmt.Sprintf(`
  lanes: %d
  worker_max_concurrent: 10
  definitions:
    job: {}`, lanes))
	}
	ids := make([]string, n)
	var wg sync.WaitGroup
	for g := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := g; i < n; i += 6 {
				rc, _, err := sc[i%3].s.Submit(context.Background(), SubmitRequest{Name: "job", Input: fmt.Appendf(nil, `{"i":%d}`, i)})
				if err != nil {
					t.Errorf("submit %d: %v", i, err)
					return
				}
				ids[i] = rc.ID
			}
		}()
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	for i, id := range ids {
		sc[i%3].waitStatus(id, "COMPLETED")
	}
	if got := w.max(); got > lanes {
		t.Fatalf("the worker ran %d runs at once across three schedulers, want at most the %d shared lanes", got, lanes)
	}
	seen := map[string]int{}
	for _, d := range w.deliveries() {
		seen[d.body]++
	}
	if len(seen) != n {
		t.Fatalf("%d distinct runs reached the worker, want %d", len(seen), n)
	}
	for body, k := range seen {
		if k != 1 {
			t.Fatalf("run %s was delivered %d times", body, k)
		}
	}
	fasttest.WaitFor(t, "every lane given back in Redis", func() bool {
		held, ok := sc[0].red.LeaseHolders(laneSet(prefix), time.Now())
		return ok && held == 0
	})
	t.Logf("at most %d runs at once", w.max())
}

// A semaphore of 2 permits, listed by two definitions served by two
// schedulers: never more than 2 runs hold it across both, a run waiting
// on the other sidecar's permits names control semaphore, and GET
// /v1/semaphores on either sidecar counts the permits both hold.
func TestRedisSemaphoreAcrossSchedulers(t *testing.T) {
	s1, s2, w, g := redisPair(t, `
  lanes: 10
  semaphores: { erp: 2 }
  definitions:
    a: { semaphores: [erp] }
    b: { semaphores: [erp] }`)

	// Two of a's runs take both permits on s1; then b's runs on s2 wait
	// although s2 itself holds none.
	a1, a2 := s1.submit("a", `{"r":"a1"}`), s1.submit("a", `{"r":"a2"}`)
	w.next(t)
	w.next(t)
	s1.waitStatus(a1, "RUNNING")
	s1.waitStatus(a2, "RUNNING")
	var bs []string
	for i := range 3 {
		bs = append(bs, s2.submit("b", fmt.Sprintf(`{"r":"b%d"}`, i)))
	}
	fasttest.WaitFor(t, "b's runs held by the shared semaphore", func() bool {
		return s2.gatesState(func(rg *redisAdmitter) bool { return rg.notes["b"] == ControlSemaphore && !rg.passing })
	})
	for _, id := range bs {
		if v := s2.get(id); v.Status != "QUEUED" || deref(v.Control) != ControlSemaphore {
			t.Fatalf("run %s on the sidecar holding no permit: %s control %s, want QUEUED semaphore", id, v.Status, deref(v.Control))
		}
	}
	if h1, h2 := s1.semaphoreHeld("erp"), s2.semaphoreHeld("erp"); h1 != 2 || h2 != 2 {
		t.Fatalf("/v1/semaphores held: %d on s1, %d on s2; want the 2 held across both on each", h1, h2)
	}
	if got := len(w.deliveries()); got != 2 {
		t.Fatalf("%d runs reached the worker, want the 2 the permits allow", got)
	}

	// Each run that ends lets exactly one more in, wherever it waits.
	g.release(`{"r":"a1"}`)
	d := w.next(t)
	g.release(d.body)
	g.release(`{"r":"a2"}`)
	for range 2 {
		g.release(w.next(t).body)
	}
	s1.waitStatus(a1, "COMPLETED")
	s1.waitStatus(a2, "COMPLETED")
	for _, id := range bs {
		s2.waitStatus(id, "COMPLETED")
	}
	if got := w.max(); got > 2 {
		t.Fatalf("%d runs held the 2-permit semaphore at once", got)
	}
	fasttest.WaitFor(t, "every permit given back in Redis", func() bool {
		return s1.semaphoreHeld("erp") == 0
	})
}

// A holder that died (leases left in the lane set by a sidecar nobody
// renews) keeps its lanes until their lease ends, then they return by
// themselves: the waiting run is admitted by the retry tick, on the
// injected clock.
func TestRedisLanesKilledHolderExpire(t *testing.T) {
	url := testenv.RedisURL(t)
	prefix := redistest.Prefix(t, url)
	clk := clock.NewFake(time.Now().Truncate(time.Second))
	w := newWorker(t, nil)
	sc := newRedisSidecar(t, url, prefix, clk, false, w.srv.URL, `
  lanes: 2
  definitions:
    job: {}`)
	expiry := clk.Now().Add(redisx.DefaultLeaseTTL)
	rdb := redistest.Client(t, url)
	if err := rdb.ZAdd(context.Background(), laneSet(prefix),
		redis.Z{Score: float64(expiry.UnixMilli()), Member: "killed:1"},
		redis.Z{Score: float64(expiry.UnixMilli()), Member: "killed:2"}).Err(); err != nil {
		t.Fatal(err)
	}
	id := sc.submit("job", `{}`)
	sc.refusedBy(ControlLanes)

	// One tick before the leases end: refused again.
	var tick clock.Timer
	sc.gatesState(func(rg *redisAdmitter) bool { tick = rg.tick; return true })
	clk.Set(expiry.Add(-time.Millisecond))
	fasttest.WaitFor(t, "the retry after the tick", func() bool {
		return sc.gatesState(func(rg *redisAdmitter) bool { return rg.tick != tick && rg.tickArmed && !rg.passing })
	})
	if v := sc.get(id); v.Status != "QUEUED" || deref(v.Control) != ControlLanes {
		t.Fatalf("inside the dead holder's lease: %s control %s, want QUEUED lanes", v.Status, deref(v.Control))
	}
	select {
	case d := <-w.arrived:
		t.Fatalf("run %s delivered while a dead holder's lease still held every lane", d.id)
	default:
	}

	clk.Advance(RedisRetryEvery)
	w.next(t)
	sc.waitStatus(id, "COMPLETED")
	n, err := rdb.ZCard(context.Background(), laneSet(prefix)).Result()
	if err != nil {
		t.Fatal(err)
	}
	if n > 1 {
		t.Fatalf("the lane set holds %d leases after the dead ones expired and the run ended", n)
	}
}

// fail_open: Redis stops while runs wait on the shared lanes. The waiting
// runs are admitted on this sidecar's own lanes; when Redis is back the
// runs admitted meanwhile are counted there, and lanes are shared again.
func TestRedisLanesOutageFailOpen(t *testing.T) {
	srv := redistest.StartServer(t)
	w, g := gatedByBody(t)
	sched := `
  lanes: 2
  definitions:
    job: {}`
	s1 := newRedisSidecar(t, srv.URL, "", clock.Real{}, false, w.srv.URL, sched)
	s2 := newRedisSidecar(t, srv.URL, "", clock.Real{}, false, w.srv.URL, sched)
	t.Cleanup(g.openAll)

	a1, a2 := s1.submit("job", `{"r":"a1"}`), s1.submit("job", `{"r":"a2"}`)
	w.next(t)
	w.next(t)
	b1, b2 := s2.submit("job", `{"r":"b1"}`), s2.submit("job", `{"r":"b2"}`)
	s2.refusedBy(ControlLanes)
	if got := len(w.deliveries()); got != 2 {
		t.Fatalf("%d runs delivered with 2 shared lanes", got)
	}

	srv.Stop()
	// s2's next retry finds Redis gone: its own two lanes decide.
	w.next(t)
	w.next(t)
	s2.waitStatus(b1, "RUNNING")
	s2.waitStatus(b2, "RUNNING")
	g.release(`{"r":"a1"}`)
	g.release(`{"r":"a2"}`)
	s1.waitStatus(a1, "COMPLETED")
	s1.waitStatus(a2, "COMPLETED")

	srv.Start()
	fasttest.WaitFor(t, "both sidecars see Redis again", func() bool {
		return !s1.red.Client().Down() && !s2.red.Client().Down()
	})
	// b1 and b2 still run: once s2 sees Redis again their lanes are
	// added to the set, so s1 is refused.
	fasttest.WaitFor(t, "the runs admitted during the outage counted in Redis", func() bool {
		held, ok := s2.red.LeaseHolders(laneSet(window.DefaultRedisPrefix), time.Now())
		return ok && held == 2
	})
	a3 := s1.submit("job", `{"r":"a3"}`)
	s1.refusedBy(ControlLanes)
	if v := s1.get(a3); v.Status != "QUEUED" {
		t.Fatalf("run admitted beyond the shared lanes after recovery: %s", v.Status)
	}
	g.release(`{"r":"b1"}`)
	if d := w.next(t); d.body != `{"r":"a3"}` {
		t.Fatalf("delivered %s, want a3", d.body)
	}
	g.release(`{"r":"b2"}`)
	g.release(`{"r":"a3"}`)
	s1.waitStatus(a3, "COMPLETED")
	s2.waitStatus(b1, "COMPLETED")
	s2.waitStatus(b2, "COMPLETED")
}

// fail_closed: while Redis is down, runs stay QUEUED (never refused) with
// control upstream, then run once it answers again.
func TestRedisLanesOutageFailClosed(t *testing.T) {
	srv := redistest.StartServer(t)
	w := newWorker(t, nil)
	sc := newRedisSidecar(t, srv.URL, "", clock.Real{}, true, w.srv.URL, `
  lanes: 2
  definitions:
    job: {}`)
	first := sc.submit("job", `{"r":1}`)
	w.next(t)
	sc.waitStatus(first, "COMPLETED")

	srv.Stop()
	ids := []string{sc.submit("job", `{"r":2}`), sc.submit("job", `{"r":3}`)}
	sc.refusedBy(ControlUpstream)
	for _, id := range ids {
		if v := sc.get(id); v.Status != "QUEUED" || !v.AwaitingAdmission || deref(v.Control) != ControlUpstream {
			t.Fatalf("run %s with Redis down (fail_closed): %s awaiting=%v control %s, want QUEUED upstream",
				id, v.Status, v.AwaitingAdmission, deref(v.Control))
		}
	}
	select {
	case d := <-w.arrived:
		t.Fatalf("run %s delivered with the shared lanes unavailable (fail_closed)", d.id)
	default:
	}

	srv.Start()
	for _, id := range ids {
		sc.waitStatus(id, "COMPLETED")
	}
}

// A run put back after a refused claim keeps its place in its
// definition's deadline order, so schedule_to_start still times out the
// oldest first: whether it gets its old slot back or another one.
func TestPlaceFIFOPutBack(t *testing.T) {
	for _, reuse := range []bool{true, false} {
		t.Run(fmt.Sprintf("same_slot=%v", reuse), func(t *testing.T) {
			q := newQueue()
			d := q.def("job")
			q.enableFIFO(d)
			for i := range 5 {
				q.push(d, "", uint64(i+1), 0, int64(100+i))
			}
			e := q.admit(d) // seq 1 leaves for a claim
			if !reuse {
				q.push(d, "", 6, 0, 105) // a submission takes its slot meanwhile
			}
			h := q.push(d, "", e.seq, 0, e.queuedAt) // refused: back in the queue
			q.placeFIFO(d, h)
			if live := len(d.fifo) - d.fifoHead - d.fifoStale; live != d.waiting {
				t.Fatalf("the FIFO counts %d live entries for %d waiting runs", live, d.waiting)
			}
			var order []uint64
			for {
				h, ok := q.oldest(d)
				if !ok {
					break
				}
				order = append(order, q.slab[h].seq)
				q.remove(h)
			}
			want := []uint64{1, 2, 3, 4, 5}
			if !reuse {
				want = append(want, 6)
			}
			if fmt.Sprint(order) != fmt.Sprint(want) {
				t.Fatalf("deadline order %v, want %v", order, want)
			}
			if d.fifoStale < 0 {
				t.Fatalf("stale count went negative: %d", d.fifoStale)
			}
		})
	}
}

// A run the worker took (202) and then stopped heartbeating loses its
// permit at the local sweep, in Redis too, although its client still
// renews everything it holds: the next run gets the permit while the
// silent run stays RUNNING with its lane.
func TestRedisPermitSweptWithoutHeartbeat(t *testing.T) {
	url := testenv.RedisURL(t)
	prefix := redistest.Prefix(t, url)
	clk := clock.NewFake(time.Now().Truncate(time.Second))
	w := newWorker(t, func(delivery) (int, string) { return http.StatusAccepted, `` })
	sc := newRedisSidecar(t, url, prefix, clk, false, w.srv.URL, `
  lanes: 5
  semaphores: { erp: 1 }
  definitions:
    job: { semaphores: [erp] }`)
	silent := sc.submit("job", `{"r":1}`)
	w.next(t)
	sc.waitStatus(silent, "RUNNING")
	fasttest.WaitFor(t, "the accepted run's permit on a heartbeat lease", func() bool {
		return sc.gatesState(func(*redisAdmitter) bool { return sc.s.sweepAt != 0 })
	})
	next := sc.submit("job", `{"r":2}`)
	if v := sc.get(next); v.Status != "QUEUED" || deref(v.Control) != ControlSemaphore {
		t.Fatalf("second run: %s control %s, want QUEUED semaphore", v.Status, deref(v.Control))
	}

	clk.Advance(permitLease - time.Millisecond)
	// Fresh renewals of everything the client holds: only a release can
	// free the silent run's permit in Redis now.
	sc.red.Client().RenewNow()
	clk.Advance(time.Millisecond)
	if d := w.next(t); d.body != `{"r":2}` {
		t.Fatalf("delivered %s, want the waiting run", d.body)
	}
	sc.waitStatus(next, "RUNNING")
	if v := sc.get(silent); v.Status != "RUNNING" {
		t.Fatalf("the silent run is %s: losing its permit must not end it", v.Status)
	}
	if held, ok := sc.red.LeaseHolders(laneSet(prefix), clk.Now()); !ok || held != 2 {
		t.Fatalf("lane set holds %d (ok=%v), want both RUNNING runs' lanes", held, ok)
	}
}

// While an admission waits on Redis, the scheduler's lock is free: views,
// submissions and queue reads go on (the pass asks Redis unlocked). A
// submission stores and queues its run meanwhile, and its receipt waits
// for the pass that decides it (it says what Redis decided).
func TestRedisAdmissionNeverHoldsTheLock(t *testing.T) {
	url := testenv.RedisURL(t)
	proxy := redistest.NewStallProxy(t, url)
	w := newWorker(t, nil)
	sc := newRedisSidecar(t, proxy.URL, redistest.Prefix(t, url),
		clock.Real{}, false, w.srv.URL, `
  lanes: 5
  definitions:
    job: {}`)
	warm := sc.submit("job", `{"r":0}`) // connections dialled, scripts loaded
	w.next(t)
	sc.waitStatus(warm, "COMPLETED")

	proxy.Stall()
	receipts := make(chan Receipt, 2)
	submit := func(input string) {
		go func() {
			rc, _, err := sc.s.Submit(context.Background(), SubmitRequest{Name: "job", Input: []byte(input)})
			if err != nil {
				t.Errorf("submit %s: %v", input, err)
			}
			receipts <- rc
		}()
	}
	submit(`{"r":1}`)
	<-proxy.Held() // its admission is on the wire, held back
	done := make(chan error, 1)
	go func() {
		runs, err := sc.s.List(context.Background(), ListFilter{Limit: 10})
		if err == nil && (len(runs) != 2 || runs[1].Status != "QUEUED") {
			err = fmt.Errorf("runs while the admission waits on Redis: %+v, want the held one QUEUED", runs)
		}
		if err == nil {
			submit(`{"r":2}`)
			for end := time.Now().Add(3 * time.Second); err == nil && len(runs) < 3 && time.Now().Before(end); {
				runs, err = sc.s.List(context.Background(), ListFilter{Limit: 10})
			}
			if err == nil && len(runs) < 3 {
				err = errors.New("the second submission's run was not stored while Redis was held")
			}
		}
		sc.s.Queues()
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(3 * time.Second): // a failure bound: Redis is held until Resume
		t.Fatal("the scheduler's lock was held while an admission waited on Redis")
	}
	select {
	case d := <-w.arrived:
		t.Fatalf("run %s delivered while Redis was held back: the test proved nothing", d.body)
	case rc := <-receipts:
		t.Fatalf("receipt %+v before Redis answered", rc)
	default:
	}
	proxy.Resume()
	for range 2 {
		select {
		case rc := <-receipts:
			if rc.Status != "RUNNING" || rc.Control != nil {
				t.Fatalf("receipt %+v once Redis answered, want RUNNING", rc)
			}
		case <-time.After(10 * time.Second): // a failure bound
			t.Fatal("no receipt once Redis answered")
		}
	}
	sc.waitStatus("2", "COMPLETED")
	sc.waitStatus("3", "COMPLETED")
}

// A definition's shared pool is taken in the same op as the lane: two
// schedulers whose runs go through a pool of concurrency 1 never deliver
// two at once, and every lease (lane and pool) is given back.
func TestRedisPoolAndLanesInOneOp(t *testing.T) {
	url := testenv.RedisURL(t)
	prefix := redistest.Prefix(t, url)
	const n = 30
	w := newWorker(t, func(delivery) (int, string) {
		time.Sleep(2 * time.Millisecond) // the work: runs of both sidecars overlap
		return http.StatusOK, `{}`
	})
	sched := `
  lanes: 5
  definitions:
    job: { pool: erp }`
	pools := "pools:\n  erp: { concurrency: 1 }"
	var sc [2]*redisSidecar
	for i := range sc {
		sc[i] = startRedisSidecar(t, url, prefix, clock.Real{}, false, w.srv.URL, sched, pools, store.NewMemory())
	}
	ids := make([]string, n)
	for i := range n {
		ids[i] = sc[i%2].submit("job", fmt.Sprintf(`{"i":%d}`, i))
	}
	for i, id := range ids {
		sc[i%2].waitStatus(id, "COMPLETED")
	}
	if got := w.max(); got != 1 {
		t.Fatalf("the worker ran %d runs at once through a shared pool of concurrency 1", got)
	}
	fasttest.WaitFor(t, "the lanes and the pool's slot given back in Redis", func() bool {
		lanes, ok1 := sc[0].red.LeaseHolders(laneSet(prefix), time.Now())
		slots, ok2 := sc[0].red.LeaseHolders(window.LeaseSet(prefix, "pool", "erp"), time.Now())
		return ok1 && ok2 && lanes == 0 && slots == 0
	})
}

// A RUNNING run recovered at start holds its lane in Redis again. The
// lease its previous life abandoned at the stop still counts until it
// expires (the worker was running the run all along), so for up to one
// lease TTL the run counts twice: the fleet admits less, never more.
func TestRedisRecoveredRunHoldsItsLane(t *testing.T) {
	url := testenv.RedisURL(t)
	prefix := redistest.Prefix(t, url)
	w := newWorker(t, func(delivery) (int, string) { return http.StatusAccepted, `` })
	sched := `
  lanes: 2
  definitions:
    job: {}`
	const ttl = 3 * time.Second
	st := store.NewMemory()
	first := startRedisSidecarTTL(t, url, prefix, clock.Real{}, false, w.srv.URL, sched, "", st, ttl)
	id := first.submit("job", `{"r":1}`)
	w.next(t)
	first.waitStatus(id, "RUNNING")
	if err := first.s.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n, ok := first.red.LeaseHolders(laneSet(prefix), time.Now()); !ok || n != 1 {
		t.Fatalf("after the stop the lane set holds %d leases (ok %v), want the RUNNING run's 1", n, ok)
	}

	again := startRedisSidecarTTL(t, url, prefix, clock.Real{}, false, w.srv.URL, sched, "", st, ttl)
	fasttest.WaitFor(t, "the recovered RUNNING run's lane in Redis", func() bool {
		n, ok := again.red.LeaseHolders(laneSet(prefix), time.Now())
		return ok && n == 2
	})
	other := startRedisSidecarTTL(t, url, prefix, clock.Real{}, false, w.srv.URL, sched, "", store.NewMemory(), ttl)
	waiting := other.submit("job", `{"r":2}`)
	other.refusedBy(ControlLanes)
	// The abandoned lease runs out (the recovered run's own is renewed):
	// the other sidecar's run gets the lane.
	if d := w.next(t); d.body != `{"r":2}` {
		t.Fatalf("delivered %s, want the other sidecar's waiting run", d.body)
	}
	other.waitStatus(waiting, "RUNNING")
	if _, err := again.s.Complete(context.Background(), id, Completion{Status: "COMPLETED"}); err != nil {
		t.Fatal(err)
	}
}

// A sidecar that stops while its worker still runs an accepted run (202)
// leaves the run's lane counted: the lease is no longer renewed and
// expires after the TTL, rather than being given back while the run goes
// on (which would let the fleet admit one run too many). A run that ended
// gives its lane back.
func TestRedisStopAbandonsRunningLanes(t *testing.T) {
	url := testenv.RedisURL(t)
	prefix := redistest.Prefix(t, url)
	w := newWorker(t, func(d delivery) (int, string) {
		if strings.Contains(d.body, "async") {
			return 202, ""
		}
		return 200, "{}"
	})
	sc := newRedisSidecar(t, url, prefix, clock.Real{}, false, w.srv.URL, `
  lanes: 3
  definitions:
    job: {}`)
	running := sc.submit("job", `{"async":true}`)
	sc.waitStatus(running, "RUNNING")
	done := sc.submit("job", `{}`)
	sc.waitStatus(done, "COMPLETED")
	rdb := redistest.Client(t, url)
	cli := sc.red.Client()
	fasttest.WaitFor(t, "the completed run's lane given back", func() bool {
		n, err := rdb.ZCard(context.Background(), laneSet(prefix)).Result()
		return err == nil && n == 1 && cli.Held() == 1
	})

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := sc.s.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if n := cli.Held(); n != 0 {
		t.Fatalf("the stopped scheduler's client still renews %d leases", n)
	}
	members, err := rdb.ZRangeWithScores(context.Background(), laneSet(prefix), 0, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(members) != 1 {
		t.Fatalf("lane set after the stop: %v, want the RUNNING run's lease left to expire", members)
	}
	if left := time.Until(time.UnixMilli(int64(members[0].Score))); left <= 0 || left > redisx.DefaultLeaseTTL {
		t.Fatalf("abandoned lease expires in %s, want within one lease TTL (%s)", left, redisx.DefaultLeaseTTL)
	}
}

// With lanes scarce, admissions through Redis go one at a time, best
// first: a sidecar's own priority order holds (then age), even when its
// own lanes are free and the shared ones are not (another sidecar holds
// them).
func TestRedisLanesKeepPriorityOrder(t *testing.T) {
	other, sc, w, g := redisPair(t, `
  lanes: 3
  definitions:
    lo: { priority: 0 }
    hi: { priority: 5 }`)
	for i := range 2 {
		other.submit("lo", fmt.Sprintf(`{"n":"other%d"}`, i))
		w.next(t)
	}
	holder := sc.submit("lo", `{"n":"holder"}`)
	if d := w.next(t); d.body != `{"n":"holder"}` {
		t.Fatalf("third delivery %s, want the holder", d.body)
	}
	var want []string
	for i := range 4 {
		sc.submit("lo", fmt.Sprintf(`{"n":"lo%d"}`, i))
	}
	for i := range 4 {
		sc.submit("hi", fmt.Sprintf(`{"n":"hi%d"}`, i))
		want = append(want, fmt.Sprintf(`{"n":"hi%d"}`, i))
	}
	for i := range 4 {
		want = append(want, fmt.Sprintf(`{"n":"lo%d"}`, i))
	}
	sc.refusedBy(ControlLanes)
	g.release(`{"n":"holder"}`)
	sc.waitStatus(holder, "COMPLETED")
	for _, body := range want {
		d := w.next(t)
		if d.body != body {
			t.Fatalf("delivered %s, want %s (priority, then age)", d.body, body)
		}
		g.release(d.body)
	}
	if m := w.max(); m != 3 {
		t.Fatalf("%d runs at the worker at once, want the 3 lanes", m)
	}
	for i := range 2 {
		g.release(fmt.Sprintf(`{"n":"other%d"}`, i))
	}
}
