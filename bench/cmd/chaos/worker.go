package main

import (
	"context"
	"net"
	"net/http"
	"sort"
	"sync"
	"time"
)

// worker is the harness's own HTTP server, used as warden's worker behind
// the ingress and as an upstream behind the egress. POST /run is a run
// delivery: it is recorded by x-run-id, held for hold (or until warden
// goes away, as a worker should stop when its client leaves) and answered
// 200; its concurrency is tracked. Anything else is answered 200 "ok" at
// once.
type worker struct {
	hold time.Duration
	srv  *http.Server
	addr string

	mu          sync.Mutex
	inflight    int
	maxInflight int
	deliveries  map[string][]delivery // by x-run-id
}

// delivery is one POST /run the worker received.
type delivery struct {
	attempt    string
	start, end time.Time
	aborted    bool // warden went away before the answer
}

func startWorker(hold time.Duration) (*worker, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	w := &worker{hold: hold, addr: ln.Addr().String(), deliveries: map[string][]delivery{}}
	w.srv = &http.Server{Handler: http.HandlerFunc(w.serve), ReadHeaderTimeout: time.Minute}
	go func() { _ = w.srv.Serve(ln) }()
	return w, nil
}

func (w *worker) close() { _ = w.srv.Close() }

func (w *worker) serve(rw http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/run" {
		rw.Header().Set("Content-Type", "text/plain")
		_, _ = rw.Write([]byte("ok"))
		return
	}
	id := r.Header.Get("x-run-id")
	d := delivery{attempt: r.Header.Get("x-run-attempt"), start: time.Now()}
	w.mu.Lock()
	w.inflight++
	w.maxInflight = max(w.maxInflight, w.inflight)
	w.mu.Unlock()
	t := time.NewTimer(w.hold)
	select {
	case <-t.C:
	case <-r.Context().Done():
		d.aborted = true
	}
	t.Stop()
	d.end = time.Now()
	w.mu.Lock()
	w.inflight--
	w.deliveries[id] = append(w.deliveries[id], d)
	w.mu.Unlock()
	if !d.aborted {
		rw.Header().Set("Content-Type", "application/json")
		_, _ = rw.Write([]byte(`{"done":true}`))
	}
}

// runStats is what the worker saw of run deliveries.
type runStats struct {
	delivered   int      // distinct runs delivered at least once
	duplicated  []string // runs delivered more than once
	maxInflight int
}

func (w *worker) stats() runStats {
	w.mu.Lock()
	defer w.mu.Unlock()
	s := runStats{delivered: len(w.deliveries), maxInflight: w.maxInflight}
	for id, ds := range w.deliveries {
		if len(ds) > 1 {
			s.duplicated = append(s.duplicated, id)
		}
	}
	sort.Strings(s.duplicated)
	return s
}

// deliveriesOf returns a copy of a run's deliveries.
func (w *worker) deliveriesOf(id string) []delivery {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]delivery(nil), w.deliveries[id]...)
}

// waitIdle waits until no delivery is in flight, or ctx ends.
func (w *worker) waitIdle(ctx context.Context) {
	for ctx.Err() == nil {
		w.mu.Lock()
		n := w.inflight
		w.mu.Unlock()
		if n == 0 {
			return
		}
		sleep(ctx, 20*time.Millisecond)
	}
}
