package scheduler

import (
	"math"
	"slices"

	"github.com/warden-dev/warden/governor/window"
)

// The leases the Redis admitter (admit_redis.go) holds for its admissions:
// given back when a run ends or its permit's lease expires, taken after
// the fact for runs admitted while Redis could not decide or recovered at
// start, released or abandoned at stop.

// releasedLocked hands an ended admission's leases to the next pass,
// which releases them outside the lock.
func (rg *redisAdmitter) releasedLocked(a *active) {
	held := a.red
	if held == nil {
		return
	}
	a.red = nil
	if held.adopt {
		delete(rg.adopt, a)
		return
	}
	rg.releases = held.appendLeases(rg.releases)
	// Release only: whoever released decides whether to admit now (a
	// failing store must not make admissions spin, see admissionFailed).
	rg.pokeLocked(false)
}

// permitExpiredLocked releases a's permit of semaphore name in Redis:
// its local lease expired (the sweeper), so the permit is free for every
// sidecar while the run itself may go on.
func (rg *redisAdmitter) permitExpiredLocked(a *active, name string) {
	held := a.red
	if held == nil {
		return
	}
	for i, p := range held.permits {
		if p.name == name {
			rg.releases = append(rg.releases, p.h)
			held.permits = slices.Delete(held.permits, i, i+1)
			rg.pokeLocked(false)
			return
		}
	}
}

// adoptLocked records that a runs without leases in Redis (a RUNNING run
// recovered at start): the next pass adds them.
func (rg *redisAdmitter) adoptLocked(a *active) {
	a.red = &redisHeld{adopt: true}
	rg.adopt[a] = struct{}{}
	rg.pokeLocked(false)
}

// adoption is one admission getting its leases after the fact.
type adoption struct {
	a     *active
	names []string
	wants []window.LeaseWant
}

// adoptionsLocked lists the admissions to give leases to, when Redis can
// take them now.
func (rg *redisAdmitter) adoptionsLocked() []adoption {
	s := rg.s
	if len(rg.adopt) == 0 {
		return nil
	}
	if cli := rg.red.Client(); cli == nil || cli.Down() {
		return nil
	}
	prefix := rg.red.Prefix()
	out := make([]adoption, 0, len(rg.adopt))
	for a := range rg.adopt {
		// No limit: the run is running whatever the sets hold, and the
		// others must count it.
		ad := adoption{a: a, wants: []window.LeaseWant{{Set: window.LeaseSet(prefix, laneKind, laneName), Limit: math.MaxInt64}}}
		for _, name := range a.sems {
			if sem := s.sems[name]; sem != nil {
				if _, held := sem.holders[a]; held {
					ad.names = append(ad.names, name)
					ad.wants = append(ad.wants, window.LeaseWant{Set: window.LeaseSet(prefix, semKind, name), Limit: math.MaxInt64})
				}
			}
		}
		out = append(out, ad)
	}
	return out
}

// adoptLeases takes the leases of adopt in Redis, outside the lock; those
// it could not take stay in redisAdmitter.adopt for a later pass.
func (rg *redisAdmitter) adoptLeases(adopt []adoption) {
	s := rg.s
	for _, ad := range adopt {
		res, err := rg.red.TakeLeasedWith(ad.wants, nil, nil, 0, 0, "", 0, s.clk.Now())
		if err != nil || !res.Admitted {
			return // Redis failed again
		}
		s.mu.Lock()
		a := ad.a
		if a.red == nil || !a.red.adopt || s.adm != admitter(rg) {
			// Ended while its leases were being taken.
			s.mu.Unlock()
			for _, g := range res.Extra {
				g.Lease.Release(nil)
			}
			continue
		}
		delete(rg.adopt, a)
		a.red.adopt = false
		a.red.lane = res.Extra[0].Lease
		var swept []window.Held
		for j, name := range ad.names {
			h := res.Extra[1+j].Lease
			if sem := s.sems[name]; sem != nil {
				if _, held := sem.holders[a]; held {
					a.red.permits = append(a.red.permits, heldPermit{name, h})
					continue
				}
			}
			// Its local lease expired meanwhile: the sweeper freed it.
			swept = append(swept, h)
		}
		s.mu.Unlock()
		for _, h := range swept {
			h.Release(nil)
		}
	}
}

// stop stops the passes and the tick, then gives back the
// leases of the runs that are not running: nothing on this sidecar tracks
// its runs once the scheduler is stopped. The lane and permits of a run
// the worker owns (RUNNING) are abandoned instead: no longer renewed, they
// stay counted by every sidecar until the lease TTL ends, because the run
// goes on without this sidecar; a restart takes them again (for up to one
// TTL both count — the fleet admits less, never more, meanwhile).
func (rg *redisAdmitter) stop() {
	s := rg.s
	s.mu.Lock()
	rg.stopped = true
	if rg.tick != nil {
		rg.tick.Stop()
	}
	s.mu.Unlock()
	rg.passes.Wait()
	s.mu.Lock()
	releases := rg.releases
	rg.releases = nil
	var abandon []window.Held
	for _, a := range s.active {
		if held := a.red; held != nil && !held.adopt {
			if a.getPhase() == phaseAsync {
				abandon = held.appendLeases(abandon)
			} else {
				releases = held.appendLeases(releases)
			}
		}
		a.red = nil
	}
	clear(rg.adopt)
	// None should be left (stop waits for every API call, a Submit
	// included, before it stops the gates); never leave one waiting.
	for seq := range rg.verdicts {
		rg.decideLocked(seq, false, "")
	}
	s.mu.Unlock()
	for _, h := range abandon {
		h.Abandon()
	}
	for _, h := range releases {
		h.Release(nil)
	}
}

// appendLeases appends everything the admission holds in Redis to dst:
// its lane, then its permits (no slice of its own: it runs at every end
// of a run).
func (h *redisHeld) appendLeases(dst []window.Held) []window.Held {
	dst = append(dst, h.lane)
	for _, p := range h.permits {
		dst = append(dst, p.h)
	}
	return dst
}
