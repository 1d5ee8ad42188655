package scheduler

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/warden-dev/warden/governor"
	"github.com/warden-dev/warden/governor/window"
	"github.com/warden-dev/warden/scheduler/store"
	"github.com/warden-dev/warden/scheduler/store/pgstore"
)

// admitter decides which waiting runs start. The Scheduler keeps the run
// lifecycle (submit, deliver, complete, retry, timeouts, cancel) and holds
// one admitter, chosen once at start (chooseAdmitter):
//
//   - local gates (admit_local.go): this sidecar's index decides under
//     Scheduler.mu, with no I/O;
//   - Redis leases (admit_redis*.go): the same index picks, and lanes and
//     semaphore permits are leases in Redis shared by every sidecar on it;
//   - Postgres claims (admit_postgres*.go): the shared store is the queue,
//     and a claim transaction admits across every sidecar on it.
//
// Methods named ...Locked run with Scheduler.mu held and make no round
// trip.
type admitter interface {
	// admitLocked admits what the gates allow now; the caller launches
	// the runs returned once it has unlocked. cfg is not nil and admission
	// has not stopped.
	admitLocked(cfg *config, now time.Time) []*active
	// reserveLocked admits a run being submitted, before it is stored,
	// when every gate has room for it now; nil when it must wait.
	reserveLocked(cfg *config, d *definition, key string, prio int32, now time.Time) *active
	// claim admits, outside the lock, what takes a round trip to decide;
	// the admission loop calls it when woken and after completions.
	claim()
	// enqueueLocked makes a QUEUED run wait for admission.
	enqueueLocked(r *store.Run)
	// awaitLocked is what a submission of run seq, just queued, waits for
	// before it answers; nil: answer now.
	awaitLocked(seq uint64) *verdict
	// releasedLocked follows an admission that ended, after its local
	// gates were freed.
	releasedLocked(a *active)
	// permitExpiredLocked follows the sweeper taking a's permit of
	// semaphore name, its lease ended.
	permitExpiredLocked(a *active, name string)
	// leasePermits sets the lease of a's permits (the worker accepted the
	// run, or heartbeated).
	leasePermits(a *active, until int64)

	// controlLocked names the gate holding a waiting run of d whose key
	// and semaphores have room, without a round trip.
	controlLocked(cfg *config, d *definition, now time.Time) string
	// storeControl names the control holding a waiting run when the store
	// holds the queue ("" when no gate is full); ok false: controlLocked
	// has named it.
	storeControl(ctx context.Context, name, key string, now time.Time) (control string, ok bool)
	// heldElsewhere is the error for a run the store shows admitted that
	// this sidecar does not hold; nil when it can only be this sidecar's
	// (the caller looks again).
	heldElsewhere(id, what string) error
	// queues and semaphores are GET /v1/queues and GET /v1/semaphores.
	queues(now time.Time) []QueueState
	semaphores(now time.Time) []SemaphoreState

	// start takes back, once the store is open, what it holds for this
	// sidecar (recover.go) and starts the mode's own work.
	start(ctx context.Context, c *governor.Controls) error
	// stop ends the mode's own work once admission and deliveries have
	// stopped, before the store is closed.
	stop()
}

// chooseAdmitter picks how this scheduler admits runs, once at start: a
// store shared by several sidecars (postgres) admits through its claims;
// otherwise a Redis counter (backend.kind: redis) shares the lanes and
// semaphores as leases; otherwise the gates are this sidecar's own. It
// also returns the warden_runs gauges this sidecar moves itself.
func (s *Scheduler) chooseAdmitter(st store.Store) (admitter, []prometheus.Gauge, error) {
	if pg, ok := st.(*pgstore.Store); ok {
		adm, err := newPostgresAdmitter(s, pg)
		if err != nil {
			return nil, nil, err
		}
		// warden_runs follows this sidecar's own transitions with its own
		// store; a shared queue's runs move on every sidecar, so there the
		// gauge is only set from the store's counts (loadCounts, each
		// sweep): one sidecar claiming runs another counted as queued took
		// it below zero.
		return adm, nil, nil
	}
	if red, ok := s.opts.Counter.(*window.Redis); ok {
		return newRedisAdmitter(s, red), runGauges(s.m), nil
	}
	return localAdmitter{s}, runGauges(s.m), nil
}
