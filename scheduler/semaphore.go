package scheduler

import (
	"slices"
	"strings"
	"time"
)

// semaphore is a named semaphore (scheduler.semaphores): permits shared by
// every definition that lists it, acquired all or nothing at admission.
//
// Permits are leased. While warden itself is delivering a run it knows the
// holder is alive, so the permit does not expire; once the worker has taken
// the run over (202) the permit is held until the lease ends — the run's
// heartbeat_timeout, or permitLease without one — after its last heartbeat.
// A holder that stops heartbeating (a crashed worker) loses the permit when
// the sweeper passes, even if the run itself stays RUNNING.
type semaphore struct {
	name    string
	permits int
	// holders maps each admission holding a permit to its lease end (unix
	// nanos; 0: no expiry). Keyed by admission, not run: a retried run may
	// be admitted again before its previous admission is released.
	holders map[*active]int64
}

// permitLease is the lease of a permit held by a run without a
// heartbeat_timeout.
const permitLease = 60 * time.Second

func (s *semaphore) full() bool { return len(s.holders) >= s.permits }

// semaphoresFree reports whether every configured semaphore of d has a
// permit free. A semaphore the policy does not configure gates nothing.
func (s *Scheduler) semaphoresFree(d *definition) bool {
	for _, name := range d.semaphores {
		if sem := s.sems[name]; sem != nil && sem.full() {
			return false
		}
	}
	return true
}

// acquireSemaphores takes one permit of each of d's semaphores for a;
// semaphoresFree must have been true.
func (s *Scheduler) acquireSemaphores(d *definition, a *active) []string {
	var held []string
	for _, name := range d.semaphores {
		if sem := s.sems[name]; sem != nil {
			sem.holders[a] = 0
			held = append(held, name)
		}
	}
	return held
}

// releaseSemaphores frees a's permits; a permit already swept or a
// semaphore removed by a reload is simply gone.
func (s *Scheduler) releaseSemaphores(names []string, a *active) {
	for _, name := range names {
		if sem := s.sems[name]; sem != nil {
			delete(sem.holders, a)
		}
	}
}

// leaseSemaphores starts or renews the expiring lease of a's permits.
func (s *Scheduler) leaseSemaphores(names []string, a *active, until int64) {
	changed := false
	for _, name := range names {
		if sem := s.sems[name]; sem != nil {
			if _, ok := sem.holders[a]; ok {
				sem.holders[a] = until
				changed = true
			}
		}
	}
	if changed {
		s.armSweepLocked()
	}
}

// leaseHeldPermits starts or renews the lease of the permits a holds in
// this sidecar's semaphores (the local and Redis admitters' leasePermits).
func (s *Scheduler) leaseHeldPermits(a *active, until int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !a.released {
		s.leaseSemaphores(a.sems, a, until)
	}
}

// applySemaphores reconciles the semaphores with a reloaded policy: permits
// change at once, holders are kept, a removed semaphore is dropped.
func (s *Scheduler) applySemaphores(permits map[string]int) {
	for name, n := range permits {
		sem := s.sems[name]
		if sem == nil {
			sem = &semaphore{name: name, holders: map[*active]int64{}}
			s.sems[name] = sem
		}
		sem.permits = n
	}
	for name := range s.sems {
		if _, ok := permits[name]; !ok {
			delete(s.sems, name)
		}
	}
}

// armSweepLocked sets the sweeper's timer at the earliest lease end.
func (s *Scheduler) armSweepLocked() {
	var next int64
	for _, sem := range s.sems {
		for _, until := range sem.holders {
			if until != 0 && (next == 0 || until < next) {
				next = until
			}
		}
	}
	if next == 0 || s.closed {
		return
	}
	if s.sweep != nil && s.sweepAt != 0 && s.sweepAt <= next {
		return
	}
	if s.sweep != nil {
		s.sweep.Stop()
	}
	s.sweepAt = next
	s.sweep = s.clk.AfterFuncAt(time.Unix(0, next), s.sweepLeases)
}

// sweepLeases frees every permit whose lease ended and admits what that
// lets in.
func (s *Scheduler) sweepLeases() {
	if !s.enter() {
		return
	}
	defer s.leave()
	now := s.clk.Now()
	s.mu.Lock()
	s.sweepAt = 0
	for _, sem := range s.sems {
		for a, until := range sem.holders {
			if until != 0 && until <= now.UnixNano() {
				delete(sem.holders, a)
				s.adm.permitExpiredLocked(a, sem.name)
				s.log.Warn("semaphore permit lease expired; permit returned", "semaphore", sem.name, "run", s.formatID(a.seq))
			}
		}
	}
	s.armSweepLocked()
	started := s.admitLocked(now)
	s.mu.Unlock()
	s.launch(started)
}

// SemaphoreState is one semaphore in GET /v1/semaphores.
type SemaphoreState struct {
	Name    string `json:"name"`
	Permits int    `json:"permits"`
	Held    int    `json:"held"`
}

// Semaphores lists every configured semaphore, for GET /v1/semaphores.
func (s *Scheduler) Semaphores() []SemaphoreState {
	s.mu.Lock()
	adm := s.adm
	s.mu.Unlock()
	if adm == nil {
		return []SemaphoreState{} // never started
	}
	return adm.semaphores(s.clk.Now())
}

// heldSemaphores lists this sidecar's semaphores with the permits its own
// admissions hold.
func (s *Scheduler) heldSemaphores() []SemaphoreState {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]SemaphoreState, 0, len(s.sems))
	for _, sem := range s.sems {
		out = append(out, SemaphoreState{Name: sem.name, Permits: sem.permits, Held: len(sem.holders)})
	}
	slices.SortFunc(out, func(a, b SemaphoreState) int { return strings.Compare(a.Name, b.Name) })
	return out
}
