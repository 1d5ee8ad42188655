package store

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
)

// Memory keeps runs in process: not durable, for tests and benchmarks
// (scheduler.store.kind: memory). Runs are sharded by sequence so that
// concurrent deliveries do not queue on one lock.
type Memory struct {
	seq    atomic.Uint64
	shards [memShards]memShard
	counts [maxStatus + 1]atomic.Int64
	// idemMu serialises submits that carry an idempotency key, so two of
	// them with the same key create one run.
	idemMu sync.Mutex
	idem   map[string]uint64
	closed atomic.Bool
	scope  string
}

const memShards = 64

type memShard struct {
	mu   sync.Mutex
	runs map[uint64]*Run
	_    [40]byte // keep shards' locks on separate cache lines
}

// NewMemory returns an empty store.
func NewMemory() *Memory {
	m := &Memory{idem: map[string]uint64{}, scope: newScope()}
	for i := range m.shards {
		m.shards[i].runs = map[uint64]*Run{}
	}
	return m
}

// IDScope implements IDScoper: each Memory counts from 1 anew, so each
// has a scope of its own.
func (m *Memory) IDScope() string { return m.scope }

func (m *Memory) shard(seq uint64) *memShard { return &m.shards[seq%memShards] }

func idemKey(name, key string) string { return name + "\x00" + key }

// Submit implements Store.
func (m *Memory) Submit(_ context.Context, r *Run) (bool, error) {
	if m.closed.Load() {
		return false, ErrClosed
	}
	if r.IdempotencyKey != "" {
		m.idemMu.Lock()
		defer m.idemMu.Unlock()
		if seq, ok := m.idem[idemKey(r.Name, r.IdempotencyKey)]; ok {
			sh := m.shard(seq)
			sh.mu.Lock()
			*r = *sh.runs[seq]
			sh.mu.Unlock()
			return false, nil
		}
	}
	r.Seq = m.seq.Add(1)
	c := *r
	sh := m.shard(r.Seq)
	sh.mu.Lock()
	sh.runs[r.Seq] = &c
	sh.mu.Unlock()
	m.counts[r.Status].Add(1)
	if r.IdempotencyKey != "" {
		m.idem[idemKey(r.Name, r.IdempotencyKey)] = r.Seq
	}
	return true, nil
}

// Get implements Store.
func (m *Memory) Get(_ context.Context, seq uint64) (Run, error) {
	if m.closed.Load() {
		return Run{}, ErrClosed
	}
	sh := m.shard(seq)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	r, ok := sh.runs[seq]
	if !ok {
		return Run{}, ErrNotFound
	}
	return *r, nil
}

// List implements Store.
func (m *Memory) List(_ context.Context, q Query) ([]Run, error) {
	if m.closed.Load() {
		return nil, ErrClosed
	}
	var out []Run
	m.each(func(r *Run) {
		if r.Seq > q.After && (q.Status == 0 || r.Status == q.Status) && q.Matches(r) {
			out = append(out, *r)
		}
	})
	slices.SortFunc(out, func(a, b Run) int { return cmpSeq(a.Seq, b.Seq) })
	if q.Limit > 0 && len(out) > q.Limit {
		out = out[:q.Limit]
	}
	return out, nil
}

func (m *Memory) each(f func(*Run)) {
	for i := range m.shards {
		sh := &m.shards[i]
		sh.mu.Lock()
		for _, r := range sh.runs {
			f(r)
		}
		sh.mu.Unlock()
	}
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
	if m.closed.Load() {
		return ErrClosed
	}
	sh := m.shard(r.Seq)
	sh.mu.Lock()
	cur, ok := sh.runs[r.Seq]
	if !ok {
		sh.mu.Unlock()
		return ErrNotFound
	}
	if !from.Has(cur.Status) {
		sh.mu.Unlock()
		return ErrConflict
	}
	old := cur.Status
	*cur = *r
	sh.mu.Unlock()
	if old != r.Status {
		m.counts[old].Add(-1)
		m.counts[r.Status].Add(1)
	}
	return nil
}

// Start implements Store.
func (m *Memory) Start(_ context.Context, seq uint64, a Admission) (Run, error) {
	if m.closed.Load() {
		return Run{}, ErrClosed
	}
	sh := m.shard(seq)
	sh.mu.Lock()
	cur, ok := sh.runs[seq]
	if !ok {
		sh.mu.Unlock()
		return Run{}, ErrNotFound
	}
	if cur.Status != Queued {
		sh.mu.Unlock()
		return Run{}, ErrConflict
	}
	retryAt := cur.admit(a)
	out := *cur
	sh.mu.Unlock()
	m.counts[Queued].Add(-1)
	m.counts[Starting].Add(1)
	out.RetryAt = retryAt
	return out, nil
}

// Unfinished implements Store.
func (m *Memory) Unfinished(ctx context.Context, fn func(*Run) error) error {
	if m.closed.Load() {
		return ErrClosed
	}
	var all []Run
	m.each(func(r *Run) {
		if !r.Status.Terminal() {
			c := *r
			c.Input, c.Output = nil, nil
			all = append(all, c)
		}
	})
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
	out := make(map[Status]int, len(All))
	for _, s := range All {
		out[s] = int(m.counts[s].Load())
	}
	return out, nil
}

// Purge implements Store.
func (m *Memory) Purge(_ context.Context, before int64, limit int) (map[Status]int, error) {
	if m.closed.Load() {
		return nil, ErrClosed
	}
	out := map[Status]int{}
	// idemMu first, as Submit takes it: a submit with the key of a run
	// being purged then either finds the run or creates a new one, never
	// a key pointing at nothing.
	m.idemMu.Lock()
	defer m.idemMu.Unlock()
	n := 0
	for i := range m.shards {
		sh := &m.shards[i]
		sh.mu.Lock()
		for seq, r := range sh.runs {
			if n == limit {
				break
			}
			if !r.endedBefore(before) {
				continue
			}
			delete(sh.runs, seq)
			if r.IdempotencyKey != "" {
				if k := idemKey(r.Name, r.IdempotencyKey); m.idem[k] == seq {
					delete(m.idem, k)
				}
			}
			m.counts[r.Status].Add(-1)
			out[r.Status]++
			n++
		}
		sh.mu.Unlock()
	}
	return out, nil
}

// Close implements Store.
func (m *Memory) Close() error {
	m.closed.Store(true)
	return nil
}
