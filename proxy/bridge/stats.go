package bridge

import (
	"time"
)

// Snapshot is one bridge in GET /v1/bridges.
type Snapshot struct {
	Name     string `json:"name"`
	Protocol string `json:"protocol"`
	Listen   string `json:"listen"`
	Upstream string `json:"upstream"`
	Max      int    `json:"max"`
	// Live upstream connections: InUse + Idle.
	Live int `json:"live"`
	// InUse: attached to a client that is executing, logging in or inside a
	// transaction (tcp: moved bytes within the last second).
	InUse int `json:"in_use"`
	// Idle: attached to a client between transactions, or kept for reuse.
	Idle int `json:"idle"`
	// Kept: part of Idle; no client, kept for the next client of the same
	// password-less login.
	Kept int `json:"kept"`
	// IdleInTransaction: part of InUse; the client holds a transaction open
	// and sends nothing.
	IdleInTransaction int `json:"idle_in_transaction"`
	// Waiting clients and how long the oldest has waited.
	Waiting           int     `json:"waiting"`
	OldestWaitSeconds float64 `json:"oldest_wait_seconds"`
	// Draining counts sessions still running under settings a reload replaced.
	Draining int               `json:"draining"`
	Reaped   map[string]uint64 `json:"reaped"`
}

// Bridges lists every bridge in policy order (the admin API's /v1/bridges).
func (s *Set) Bridges() []Snapshot {
	now := s.clk.Now()
	bs := s.inOrder()
	out := make([]Snapshot, 0, len(bs))
	for _, b := range bs {
		out = append(out, b.snapshot(now))
	}
	return out
}

// inOrder is every bridge of the policy, in policy order.
func (s *Set) inOrder() []*bridge {
	s.mu.Lock()
	defer s.mu.Unlock()
	bs := make([]*bridge, 0, len(s.order))
	for _, name := range s.order {
		if b := s.bridges[name]; b != nil {
			bs = append(bs, b)
		}
	}
	return bs
}

// snapshot counts the bridge's connections at now. Session states are read
// from the atomics the copy loops publish, so the hot path pays nothing for
// observability.
func (b *bridge) snapshot(now time.Time) Snapshot {
	b.mu.Lock()
	g := b.gen
	pools := b.pools
	snap := Snapshot{
		Name: b.name, Protocol: g.cfg.Protocol, Listen: g.cfg.Listen, Upstream: g.cfg.Upstream,
		Max: g.cfg.MaxConnections, Reaped: make(map[string]uint64, len(Reasons)),
	}
	for r, rc := range b.reaped {
		snap.Reaped[r] = rc.n
	}
	idle := 0
	for s := range b.sessions {
		if s.endCause() != causeNone {
			continue
		}
		switch s.state(now) {
		case stIdle:
			idle++
		case stIdleInTx:
			snap.IdleInTransaction++
		}
		if s.g != g {
			snap.Draining++
		}
	}
	b.mu.Unlock()
	var oldest time.Duration
	for _, p := range pools {
		p.DropDead()
		st := p.Stats(now)
		snap.Live += st.Live
		idle += st.Kept
		snap.Kept += st.Kept
		snap.Waiting += st.Waiting
		oldest = max(oldest, st.OldestWait)
	}
	snap.OldestWaitSeconds = oldest.Seconds()
	snap.Idle = min(idle, snap.Live)
	snap.InUse = snap.Live - snap.Idle
	return snap
}

// idleForGood reports whether a retired bridge has no client left.
func (b *bridge) idleForGood() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.sessions) == 0 && len(b.handshaking) == 0
}

// refreshGauges sets warden_bridge_connections and warden_bridge_waiting
// from fresh snapshots just before /metrics is gathered.
func (s *Set) refreshGauges() {
	now := s.clk.Now()
	m := s.opts.Metrics
	s.mu.Lock()
	bs := make([]*bridge, 0, len(s.bridges)+len(s.retired))
	for _, b := range s.bridges {
		bs = append(bs, b)
	}
	bs = append(bs, s.retired...)
	s.mu.Unlock()
	type sums struct{ inUse, idle, waiting int }
	by := map[string]*sums{}
	for _, b := range bs {
		snap := b.snapshot(now)
		t := by[b.name]
		if t == nil {
			t = &sums{}
			by[b.name] = t
		}
		t.inUse += snap.InUse
		t.idle += snap.Idle
		t.waiting += snap.Waiting
	}
	m.BridgeConnections.Reset()
	m.BridgeWaiting.Reset()
	for name, t := range by {
		m.BridgeConnections.WithLabelValues(name, "in_use").Set(float64(t.inUse))
		m.BridgeConnections.WithLabelValues(name, "idle").Set(float64(t.idle))
		m.BridgeWaiting.WithLabelValues(name).Set(float64(t.waiting))
	}
}
