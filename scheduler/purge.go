package scheduler

import (
	"context"
	"time"

	"github.com/warden-dev/warden/scheduler/store"
)

// Retention (scheduler.store.retention): a timer deletes the runs that
// ended longer ago than the retention, in batches, so a sidecar that runs
// for months keeps a store the size of its recent work. Unfinished runs
// are never purged. The first purge comes purgeFirst after the start (a
// sidecar redeployed more often than the interval still purges), then
// every purgeInterval.
const (
	purgeBatch = 1000
	purgeFirst = time.Minute
)

// purgeInterval spreads purges over the retention: a twenty-fourth of it,
// at least a minute and at most an hour apart.
func purgeInterval(retention time.Duration) time.Duration {
	return min(max(retention/24, time.Minute), time.Hour)
}

// armPurgeLocked starts or stops the purge timer as cfg's retention asks;
// s.mu is held. A retention changed by a reload while the timer is armed
// takes effect at its next firing.
func (s *Scheduler) armPurgeLocked(cfg *config) {
	switch {
	case cfg.retention <= 0 || s.draining || s.closed:
		if s.purgeT != nil {
			s.purgeT.Stop()
			s.purgeT, s.purgeAt = nil, 0
		}
	case s.purgeT == nil:
		s.armPurgeAtLocked(purgeFirst)
	}
}

func (s *Scheduler) armPurgeAtLocked(d time.Duration) {
	at := s.clk.Now().Add(d)
	s.purgeT, s.purgeAt = s.clk.AfterFuncAt(at, s.purge), at.UnixNano()
}

// purge deletes the runs that ended before now minus the retention and
// arms the next purge.
func (s *Scheduler) purge() {
	if !s.enter() {
		return
	}
	defer s.leave()
	defer s.rearmPurge()
	cfg := s.cfgPtr.Load()
	if cfg == nil || cfg.retention <= 0 {
		return
	}
	cut := s.clk.Now().Add(-cfg.retention)
	total := 0
	var err error
	for {
		s.mu.Lock()
		st, stop := s.st, s.draining
		s.mu.Unlock()
		if stop {
			break
		}
		var got map[store.Status]int
		if got, err = s.purgeBatch(st, cut.UnixNano()); err != nil {
			break
		}
		s.purged(got)
		n := 0
		for _, k := range got {
			n += k
		}
		total += n
		if n < purgeBatch {
			break
		}
	}
	if err != nil {
		s.log.Error("purge finished runs", "ended_before", cut, "purged", total, "err", err)
	} else if total > 0 {
		s.log.Info("purged finished runs", "ended_before", cut, "retention", cfg.retention, "purged", total)
	}
}

// rearmPurge arms the purge after this one, at the interval of the
// retention in force now.
func (s *Scheduler) rearmPurge() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.purgeT != nil {
		s.purgeT.Stop() // this purge's own timer, or one a reload armed meanwhile
	}
	s.purgeT, s.purgeAt = nil, 0
	if cur := s.cfgPtr.Load(); cur != nil && cur.retention > 0 && !s.draining && !s.closed {
		s.armPurgeAtLocked(purgeInterval(cur.retention))
	}
}

func (s *Scheduler) purgeBatch(st store.Store, before int64) (map[store.Status]int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	return st.Purge(ctx, before, purgeBatch)
}
