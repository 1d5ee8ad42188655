package scheduler

import (
	"context"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/warden-dev/warden/governor/metrics"
	"github.com/warden-dev/warden/scheduler/store"
)

// apiStatus is the status the API and metrics show: STARTING (admitted,
// delivery not yet acknowledged) is RUNNING to callers.
func apiStatus(st store.Status) string {
	if st == store.Starting {
		return store.Running.String()
	}
	return st.String()
}

// runGauges resolves warden_runs{status} once per status.
func runGauges(m *metrics.Metrics) []prometheus.Gauge {
	if m == nil {
		return nil
	}
	g := make([]prometheus.Gauge, len(store.All)+1)
	for _, st := range store.All {
		g[st] = m.Runs.WithLabelValues(apiStatus(st))
	}
	return g
}

// moved keeps warden_runs{status} in step with a transition.
func (s *Scheduler) moved(from, to store.Status) {
	if s.gauges == nil || apiStatus(from) == apiStatus(to) {
		return
	}
	s.gauges[from].Dec()
	s.gauges[to].Inc()
}

// added counts a new run.
func (s *Scheduler) added(st store.Status) {
	if s.gauges != nil {
		s.gauges[st].Inc()
	}
}

// loadCounts sets warden_runs from the store at start.
func (s *Scheduler) loadCounts(ctx context.Context) error {
	if s.m == nil {
		return nil
	}
	counts, err := s.st.Counts(ctx)
	if err != nil {
		return err
	}
	byName := map[string]int{}
	for _, st := range store.All {
		byName[apiStatus(st)] += counts[st]
	}
	for name, n := range byName {
		s.m.Runs.WithLabelValues(name).Set(float64(n))
	}
	return nil
}

// purged keeps warden_runs{status} in step with a purge and counts it in
// warden_runs_purged_total.
func (s *Scheduler) purged(by map[store.Status]int) {
	for st, n := range by {
		if s.gauges != nil {
			s.gauges[st].Sub(float64(n))
		}
		if s.m != nil {
			s.m.RunsPurged.WithLabelValues(apiStatus(st)).Add(float64(n))
		}
	}
}
