package store

import (
	"context"
	"slices"
	"sync"
)

// Memory keeps runs in process: not durable, for tests and benchmarks
// (scheduler.store.kind: memory).
type Memory struct {
	mu     sync.Mutex
	seq    uint64
	runs   map[uint64]*Run
	idem   map[string]uint64
	counts [maxStatus + 1]int
	closed bool
}

// NewMemory returns an empty store.
func NewMemory() *Memory {
	return &Memory{runs: map[uint64]*Run{}, idem: map[string]uint64{}}
}

func idemKey(name, key string) string { return name + "\x00" + key }

// Submit implements Store.
func (m *Memory) Submit(_ context.Context, r *Run) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return false, ErrClosed
	}
	if r.IdempotencyKey != "" {
		if seq, ok := m.idem[idemKey(r.Name, r.IdempotencyKey)]; ok {
			*r = *m.runs[seq]
			return false, nil
		}
	}
	m.seq++
	r.Seq = m.seq
	c := *r
	m.runs[r.Seq] = &c
	m.counts[r.Status]++
	if r.IdempotencyKey != "" {
		m.idem[idemKey(r.Name, r.IdempotencyKey)] = r.Seq
	}
	return true, nil
}

// Get implements Store.
func (m *Memory) Get(_ context.Context, seq uint64) (Run, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return Run{}, ErrClosed
	}
	r, ok := m.runs[seq]
	if !ok {
		return Run{}, ErrNotFound
	}
	return *r, nil
}

// List implements Store.
func (m *Memory) List(_ context.Context, q Query) ([]Run, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, ErrClosed
	}
	var out []Run
	for seq, r := range m.runs {
		if seq > q.After && (q.Status == 0 || r.Status == q.Status) {
			out = append(out, *r)
		}
	}
	slices.SortFunc(out, func(a, b Run) int { return cmpSeq(a.Seq, b.Seq) })
	if q.Limit > 0 && len(out) > q.Limit {
		out = out[:q.Limit]
	}
	return out, nil
}

func cmpSeq(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// Update implements Store.
func (m *Memory) Update(_ context.Context, r *Run, from Statuses) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return ErrClosed
	}
	cur, ok := m.runs[r.Seq]
	if !ok {
		return ErrNotFound
	}
	if !from.Has(cur.Status) {
		return ErrConflict
	}
	m.counts[cur.Status]--
	m.counts[r.Status]++
	*cur = *r
	return nil
}

// Unfinished implements Store.
func (m *Memory) Unfinished(ctx context.Context, fn func(*Run) error) error {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return ErrClosed
	}
	var all []Run
	for _, r := range m.runs {
		if !r.Status.Terminal() {
			c := *r
			c.Input, c.Output = nil, nil
			all = append(all, c)
		}
	}
	m.mu.Unlock()
	rank := func(s Status) int { return slices.Index(Unfinished, s) }
	slices.SortFunc(all, func(a, b Run) int {
		if d := rank(a.Status) - rank(b.Status); d != 0 {
			return d
		}
		return cmpSeq(a.Seq, b.Seq)
	})
	for i := range all {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := fn(&all[i]); err != nil {
			return err
		}
	}
	return nil
}

// Counts implements Store.
func (m *Memory) Counts(context.Context) (map[Status]int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make(map[Status]int, len(All))
	for _, s := range All {
		out[s] = m.counts[s]
	}
	return out, nil
}

// Close implements Store.
func (m *Memory) Close() error {
	m.mu.Lock()
	m.closed = true
	m.mu.Unlock()
	return nil
}
