// Package stats records the data plane's SPEC §8 metrics with children
// resolved ahead of the hot path: a request's counter and histogram are
// found by array index and pointer, never by a label lookup.
package stats

import (
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/warden-dev/warden/governor/control"
	"github.com/warden-dev/warden/governor/metrics"
)

// Listener holds the per-target metric children of one listener
// ("ingress", "egress", "grpc"). Children are kept across reloads: a
// target that keeps its name keeps its series.
type Listener struct {
	name string
	m    *metrics.Metrics

	mu      sync.Mutex
	targets map[string]*Target

	rejMu sync.RWMutex
	rej   map[rejKey]prometheus.Counter
}

type rejKey struct {
	control control.Name
	scope   string
}

// NewListener returns the metric children of listener name; m nil records
// nothing.
func NewListener(name string, m *metrics.Metrics) *Listener {
	return &Listener{name: name, m: m, targets: map[string]*Target{}, rej: map[rejKey]prometheus.Counter{}}
}

// Name is the listener label.
func (l *Listener) Name() string { return l.name }

// Unrequested counts one pooled upstream connection closed because it held
// bytes nobody asked for (connpool.Set.OnUnrequested).
func (l *Listener) Unrequested() {
	if l.m != nil {
		l.m.UnrequestedBytes.WithLabelValues(l.name).Inc()
	}
}

// Target returns the children of target name, creating them once.
func (l *Listener) Target(name string) *Target {
	l.mu.Lock()
	defer l.mu.Unlock()
	if t := l.targets[name]; t != nil {
		return t
	}
	t := &Target{l: l, name: name}
	if l.m != nil {
		t.duration = l.m.RequestDuration.WithLabelValues(l.name, name)
		t.retries = l.m.Retries.WithLabelValues(name)
	}
	l.targets[name] = t
	return t
}

// Reject counts one refusal by control in scope
// (warden_rejections_total{control,scope}).
func (l *Listener) Reject(c control.Name, scope string) {
	if l.m == nil {
		return
	}
	k := rejKey{c, scope}
	l.rejMu.RLock()
	ctr := l.rej[k]
	l.rejMu.RUnlock()
	if ctr == nil {
		ctr = l.m.Rejections.WithLabelValues(string(c), scope)
		l.rejMu.Lock()
		l.rej[k] = ctr
		l.rejMu.Unlock()
	}
	ctr.Inc()
}

// Target is one target's children on one listener.
type Target struct {
	l        *Listener
	name     string
	duration prometheus.Observer
	retries  prometheus.Counter
	// codes caches the requests_total child per status code; codes outside
	// 100-599 share the last slot under the label "other".
	codes [501]atomic.Pointer[counter]
	// grpc caches the children per gRPC status code (0-16, then "other").
	grpc [18]atomic.Pointer[counter]
}

type counter struct{ c prometheus.Counter }

// Name is the target label.
func (t *Target) Name() string { return t.name }

// Done records one request that ended with status code after running
// since start.
func (t *Target) Done(code int, start time.Time) {
	if t.l.m == nil {
		return
	}
	t.Count(code)
	t.duration.Observe(time.Since(start).Seconds())
}

// Count adds one to warden_requests_total for code without observing a
// duration.
func (t *Target) Count(code int) {
	if t.l.m == nil {
		return
	}
	t.requests(t.codes[:], code-100, code).Inc()
}

// DoneGRPC records one RPC that ended with gRPC status code after running
// since start; the code label is the status number ("0", "14").
func (t *Target) DoneGRPC(code int, start time.Time) {
	if t.l.m == nil {
		return
	}
	t.requests(t.grpc[:], code, code).Inc()
	t.duration.Observe(time.Since(start).Seconds())
}

// requests returns the requests_total child labelled code from cache, slot
// i of it; an i outside the cache shares its last slot, labelled "other".
// The child is looked up once per code, not per request.
func (t *Target) requests(cache []atomic.Pointer[counter], i, code int) prometheus.Counter {
	last := len(cache) - 1
	if i < 0 || i >= last {
		i = last
	}
	c := cache[i].Load()
	if c == nil {
		label := "other"
		if i != last {
			label = strconv.Itoa(code)
		}
		c = &counter{t.l.m.Requests.WithLabelValues(t.l.name, t.name, label)}
		cache[i].Store(c)
	}
	return c.c
}

// Retry counts one retry of this target (warden_retries_total).
func (t *Target) Retry() {
	if t.retries != nil {
		t.retries.Inc()
	}
}

// Reject counts a refusal by control in scope on the target's listener.
func (t *Target) Reject(c control.Name, scope string) { t.l.Reject(c, scope) }
