package connpool

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/warden-dev/warden/governor/clock"
)

// DefaultTick is the janitor's period: the resolution of idle timeouts and
// lifetimes, and the idle time after which a connection is probed before
// reuse.
const DefaultTick = time.Second

// Set owns the pools of one component, by key, and a janitor that closes
// expired idle connections and drops on-demand pools once they are empty.
type Set struct {
	clk  clock.Clock
	tick time.Duration
	now  atomic.Int64 // janitor ticks since the set was made

	mu    sync.Mutex
	pools map[string]*Pool

	stop chan struct{}
	done chan struct{}

	unrequested func() // counts connections dropped for unread bytes; may be nil
}

// NewSet starts a set whose janitor runs every tick (DefaultTick when 0)
// on clk.
func NewSet(clk clock.Clock, tick time.Duration) *Set {
	if tick <= 0 {
		tick = DefaultTick
	}
	s := &Set{clk: clk, tick: tick, pools: map[string]*Pool{}, stop: make(chan struct{}), done: make(chan struct{})}
	// The timer is armed before NewSet returns so that a test advancing a
	// fake clock right after cannot miss the first tick.
	t := clk.NewTimer(tick)
	go s.janitor(t)
	return s
}

func (s *Set) ticks() int64 { return s.now.Load() }

// OnUnrequested makes f count each connection closed instead of reused
// because it held bytes nobody asked for. Call it before the set's pools
// are used.
func (s *Set) OnUnrequested(f func()) { s.unrequested = f }

func (s *Set) countUnrequested() {
	if s.unrequested != nil {
		s.unrequested()
	}
}

// Pool returns the pool for key with settings cfg: the existing one when
// its settings are unchanged, else a new one (the old one is closed: it
// finishes its exchanges and closes their connections).
func (s *Set) Pool(key string, cfg Config) *Pool {
	return s.get(key, cfg, false)
}

// Lookup returns the pool held under key, or nil.
func (s *Set) Lookup(key []byte) *Pool {
	s.mu.Lock()
	p := s.pools[string(key)]
	s.mu.Unlock()
	return p
}

// Dynamic is Pool for upstreams known only from a request (a host no
// target names, or a target without upstream). Such pools are dropped once
// they have had no connection for a whole idle timeout. Like Pool, it
// replaces a pool whose settings changed (a reload).
func (s *Set) Dynamic(key []byte, cfg Config) *Pool {
	s.mu.Lock()
	p := s.pools[string(key)]
	s.mu.Unlock()
	if p != nil && p.cfg.equal(cfg) {
		return p
	}
	return s.get(string(key), cfg, true)
}

func (s *Set) get(key string, cfg Config, dynamic bool) *Pool {
	s.mu.Lock()
	defer s.mu.Unlock()
	old := s.pools[key]
	if old != nil && old.cfg.equal(cfg) {
		if !dynamic {
			old.dynamic.Store(false)
		}
		return old
	}
	p := s.newPool(cfg, dynamic)
	s.pools[key] = p
	if old != nil {
		old.close()
	}
	return p
}

func (s *Set) newPool(cfg Config, dynamic bool) *Pool {
	life := cfg.MaxLifetime
	if life <= 0 {
		life = DefaultMaxLifetime
	}
	ticks := func(d time.Duration) int64 {
		// Rounded up and one more: a connection is closed between d and
		// d plus one tick of idleness, never before d.
		return int64((d+s.tick-1)/s.tick) + 1
	}
	p := &Pool{cfg: cfg, set: s, lifeTicks: ticks(life)}
	if cfg.TLS != nil {
		p.tls = cfg.TLS.Clone()
		if cfg.ServerName != "" {
			p.tls.ServerName = cfg.ServerName
		}
	}
	p.dynamic.Store(dynamic)
	if cfg.IdleTimeout > 0 {
		p.idleTicks = ticks(cfg.IdleTimeout)
	}
	return p
}

// Retain closes every non-dynamic pool whose key keep does not hold: after
// a reload, the pools of targets that are gone.
func (s *Set) Retain(keep func(key string) bool) {
	s.mu.Lock()
	var gone []*Pool
	for k, p := range s.pools {
		if !p.dynamic.Load() && !keep(k) {
			gone = append(gone, p)
			delete(s.pools, k)
		}
	}
	s.mu.Unlock()
	for _, p := range gone {
		p.close()
	}
}

// Close stops the janitor and closes every pool.
func (s *Set) Close() {
	close(s.stop)
	<-s.done
	s.mu.Lock()
	pools := s.pools
	s.pools = map[string]*Pool{}
	s.mu.Unlock()
	for _, p := range pools {
		p.close()
	}
}

// Len reports how many pools the set holds.
func (s *Set) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.pools)
}

func (s *Set) janitor(t clock.Timer) {
	defer close(s.done)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C():
		}
		now := s.now.Add(1)
		s.mu.Lock()
		pools := make([]*Pool, 0, len(s.pools))
		keys := make([]string, 0, len(s.pools))
		for k, p := range s.pools {
			pools = append(pools, p)
			keys = append(keys, k)
		}
		s.mu.Unlock()
		for i, p := range pools {
			if p.reap(now) && p.dynamic.Load() {
				p.unused++
				if p.unused > p.idleTicks {
					s.dropIfSame(keys[i], p)
				}
			} else {
				p.unused = 0
			}
		}
		t.Reset(s.tick)
	}
}

func (s *Set) dropIfSame(key string, p *Pool) {
	s.mu.Lock()
	same := s.pools[key] == p
	if same {
		delete(s.pools, key)
	}
	s.mu.Unlock()
	if same {
		// A request that picked the pool just before still works; its
		// connection is closed after use.
		p.close()
	}
}
