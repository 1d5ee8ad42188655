package store

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"
)

// Bolt is the embedded durable store: one bbolt file in the data directory.
//
// Writes go through a single committer goroutine that folds every operation
// waiting at the moment into one transaction and one fsync (group commit):
// under load a batch holds hundreds of submits, so durable throughput is
// set by the disk's fsync rate times the batch size rather than by the
// fsync rate alone; with a single writer a run still pays exactly one
// fsync. Operations are applied in the order they arrived, so a later
// update of a run never overtakes an earlier one.
type Bolt struct {
	db   *bolt.DB
	ops  chan *op
	stop chan struct{}
	done chan struct{}

	sendMu sync.RWMutex
	closed bool

	scope string // IDScope, kept in the meta bucket
}

var (
	bucketRuns   = []byte("runs")   // seq (8 bytes, big endian) → encoded run
	bucketStatus = []byte("status") // status byte + seq → empty: List and recovery by status
	bucketIdem   = []byte("idem")   // definition NUL idempotency key → seq
	bucketMeta   = []byte("meta")
	keyCounts    = []byte("counts") // one uint64 per status
	keyScope     = []byte("scope")  // IDScope, written when the file is created
)

// appendFill is the leaf fill for the sequence-keyed buckets; below 1 so an
// in-place update that grows a run's record seldom splits a full leaf.
const appendFill = 0.95

// maxBatch bounds one transaction so that a flood of submits still commits
// (and answers) in slices of bounded latency.
const maxBatch = 4096

// OpenBolt opens (creating if needed) the store file at path. A second
// process opening the same file fails after a second instead of waiting
// forever for the lock.
func OpenBolt(path string) (*Bolt, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("create data directory: %w", err)
	}
	db, err := bolt.Open(path, 0o600, &bolt.Options{
		Timeout: time.Second,
		// The freelist is rebuilt by a scan at open instead of being
		// rewritten by every commit: commits stay small as the file grows.
		NoFreelistSync: true,
		FreelistType:   bolt.FreelistMapType,
		// Reserve address space so that readers never wait for a remap.
		InitialMmapSize: 1 << 30,
	})
	if err != nil {
		if errors.Is(err, bolt.ErrTimeout) {
			return nil, fmt.Errorf("open run store %s: locked by another process (is another warden using this --data-dir?)", path)
		}
		return nil, fmt.Errorf("open run store %s: %w", path, err)
	}
	var scope string
	err = db.Update(func(tx *bolt.Tx) error {
		for _, b := range [][]byte{bucketRuns, bucketStatus, bucketIdem, bucketMeta} {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return err
			}
		}
		// A store written before scopes existed gets one now: its runs'
		// plain numeric ids keep resolving (the scheduler accepts both).
		meta := tx.Bucket(bucketMeta)
		if v := meta.Get(keyScope); len(v) > 0 {
			scope = string(v)
			return nil
		}
		scope = newScope()
		return meta.Put(keyScope, []byte(scope))
	})
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("open run store %s: %w", path, err)
	}
	s := &Bolt{db: db, ops: make(chan *op, maxBatch), stop: make(chan struct{}), done: make(chan struct{}), scope: scope}
	go s.commitLoop()
	return s, nil
}

// Path is the store's file.
func (s *Bolt) Path() string { return s.db.Path() }

// IDScope implements IDScoper: the token made when the file was created.
func (s *Bolt) IDScope() string { return s.scope }

type opKind uint8

const (
	opSubmit opKind = iota
	opUpdate
	opStart
	opPurge
)

type op struct {
	kind    opKind
	run     *Run
	value   []byte // encoded run, built by the caller off the committer
	from    Statuses
	adm     Admission // opStart
	seq     uint64    // opStart
	retryAt int64     // opStart: RetryAt before the admission
	before  int64     // opPurge: runs that ended before this go
	limit   int       // opPurge: at most this many
	purged  map[Status]int
	created bool
	err     error
	done    chan struct{}
	// cb, when set, receives the outcome on the committer instead of a
	// waiter on done (StartAsync); the committer then recycles the op.
	cb func(error)
}

var opPool = sync.Pool{New: func() any { return &op{done: make(chan struct{}, 1)} }}

func (s *Bolt) do(ctx context.Context, o *op) error {
	if err := s.send(ctx, o); err != nil {
		return err
	}
	// Once queued the operation will be committed or failed; wait for it
	// even if ctx ends, so the caller never guesses whether it was written.
	<-o.done
	return o.err
}

// send queues o for the committer.
func (s *Bolt) send(ctx context.Context, o *op) error {
	// The read lock orders senders before Close: once Close holds the
	// write lock no operation can enter the channel after the committer's
	// final drain.
	s.sendMu.RLock()
	defer s.sendMu.RUnlock()
	if s.closed {
		return ErrClosed
	}
	select {
	case s.ops <- o:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Submit implements Store.
func (s *Bolt) Submit(ctx context.Context, r *Run) (bool, error) {
	o := opPool.Get().(*op)
	*o = op{kind: opSubmit, run: r, value: Encode(nil, r), done: o.done}
	err := s.do(ctx, o)
	created := o.created
	o.run, o.value = nil, nil
	opPool.Put(o)
	return created, err
}

// Update implements Store.
func (s *Bolt) Update(ctx context.Context, r *Run, from Statuses) error {
	o := opPool.Get().(*op)
	*o = op{kind: opUpdate, run: r, value: Encode(nil, r), from: from, done: o.done}
	err := s.do(ctx, o)
	o.run, o.value = nil, nil
	opPool.Put(o)
	return err
}

// Start implements Store.
func (s *Bolt) Start(ctx context.Context, seq uint64, a Admission) (Run, error) {
	var r Run
	o := opPool.Get().(*op)
	*o = op{kind: opStart, run: &r, seq: seq, adm: a, done: o.done}
	err := s.do(ctx, o)
	r.RetryAt = o.retryAt
	o.run = nil
	opPool.Put(o)
	if err != nil {
		return Run{}, err
	}
	return r, nil
}

// Purge implements Store. It goes through the committer like every write,
// so a purge never overtakes an update queued before it.
func (s *Bolt) Purge(ctx context.Context, before int64, limit int) (map[Status]int, error) {
	o := opPool.Get().(*op)
	purged := map[Status]int{}
	*o = op{kind: opPurge, before: before, limit: limit, purged: purged, done: o.done}
	err := s.do(ctx, o)
	o.purged = nil
	opPool.Put(o)
	if err != nil {
		return nil, err
	}
	return purged, nil
}

// StartAsync implements AsyncStarter. The run is read from the last
// commit (a QUEUED run in the index always has its record committed) and
// its admitted form is queued as a compare-and-set update from QUEUED, so
// the caller can deliver without waiting for the fsync: any later write of
// the run is sent after this one and so applied after it.
func (s *Bolt) StartAsync(ctx context.Context, seq uint64, a Admission, done func(error)) (Run, error) {
	r, err := s.Get(ctx, seq)
	if err != nil {
		return Run{}, err
	}
	if r.Status != Queued {
		return Run{}, ErrConflict
	}
	retryAt := r.admit(a)
	rec := r // the committer's copy: the caller owns the returned one
	o := opPool.Get().(*op)
	*o = op{kind: opUpdate, run: &rec, value: Encode(nil, &r), from: Of(Queued), done: o.done, cb: done}
	if err := s.send(ctx, o); err != nil {
		o.run, o.value, o.cb = nil, nil, nil
		opPool.Put(o)
		return Run{}, err
	}
	r.RetryAt = retryAt
	return r, nil
}

func (s *Bolt) commitLoop() {
	defer close(s.done)
	batch := make([]*op, 0, maxBatch)
	for {
		select {
		case o := <-s.ops:
			batch = append(batch[:0], o)
		case <-s.stop:
			// Close holds every sender out by now: commit what was
			// queued before it so that no accepted write is dropped.
			for {
				batch = batch[:0]
			drain:
				for len(batch) < maxBatch {
					select {
					case o := <-s.ops:
						batch = append(batch, o)
					default:
						break drain
					}
				}
				if len(batch) == 0 {
					return
				}
				s.commit(batch)
			}
		}
	fill:
		for len(batch) < maxBatch {
			select {
			case o := <-s.ops:
				batch = append(batch, o)
			default:
				break fill
			}
		}
		s.commit(batch)
	}
}

// commit applies a batch in one transaction. Operations that fail on their
// own (a conflict) fail alone; a failed commit fails them all.
func (s *Bolt) commit(batch []*op) {
	err := s.db.Update(func(tx *bolt.Tx) error {
		runs, status, idem, meta := tx.Bucket(bucketRuns), tx.Bucket(bucketStatus), tx.Bucket(bucketIdem), tx.Bucket(bucketMeta)
		// Keys are sequences, appended in order: pack leaves instead of
		// bbolt's half-full default split, which would double the file
		// (and the resident pages of its mapping).
		runs.FillPercent, status.FillPercent = appendFill, appendFill
		counts := readCounts(meta)
		for _, o := range batch {
			o.err = nil
			var err error
			switch o.kind {
			case opSubmit:
				err = submitTx(runs, status, idem, o, &counts)
			case opUpdate:
				err = updateTx(runs, status, o, &counts)
			case opStart:
				err = startTx(runs, status, o, &counts)
			case opPurge:
				err = purgeTx(runs, status, idem, o, &counts)
			}
			if err != nil {
				return err
			}
		}
		return meta.Put(keyCounts, writeCounts(counts))
	})
	for _, o := range batch {
		if err != nil {
			o.err = fmt.Errorf("commit runs: %w", err)
			o.created = false
			clear(o.purged)
		}
		if cb := o.cb; cb != nil {
			e := o.err
			o.run, o.value, o.cb = nil, nil, nil
			opPool.Put(o)
			cb(e)
			continue
		}
		o.done <- struct{}{}
	}
}

func submitTx(runs, status, idem *bolt.Bucket, o *op, counts *[maxStatus + 1]uint64) error {
	r := o.run
	var ik []byte
	if r.IdempotencyKey != "" {
		ik = []byte(idemKey(r.Name, r.IdempotencyKey))
		if v := idem.Get(ik); v != nil {
			seq := binary.BigEndian.Uint64(v)
			cur := runs.Get(seqKey(seq))
			if cur == nil {
				return fmt.Errorf("idempotency key %q points at missing run %d", r.IdempotencyKey, seq)
			}
			if err := Decode(cur, r, true); err != nil {
				return fmt.Errorf("run %d: %w", seq, err)
			}
			r.Seq = seq
			o.created = false
			return nil
		}
	}
	seq, err := runs.NextSequence()
	if err != nil {
		return err
	}
	r.Seq = seq
	k := seqKey(seq)
	if err := runs.Put(k, o.value); err != nil {
		return err
	}
	if err := status.Put(statusKey(r.Status, seq), nil); err != nil {
		return err
	}
	if ik != nil {
		if err := idem.Put(ik, k); err != nil {
			return err
		}
	}
	counts[r.Status]++
	o.created = true
	return nil
}

func updateTx(runs, status *bolt.Bucket, o *op, counts *[maxStatus + 1]uint64) error {
	r := o.run
	k := seqKey(r.Seq)
	cur := runs.Get(k)
	if cur == nil {
		o.err = ErrNotFound
		return nil
	}
	st, err := StatusOf(cur)
	if err != nil {
		return fmt.Errorf("run %d: %w", r.Seq, err)
	}
	if !o.from.Has(st) {
		o.err = ErrConflict
		return nil
	}
	if err := runs.Put(k, o.value); err != nil {
		return err
	}
	if st != r.Status {
		if err := status.Delete(statusKey(st, r.Seq)); err != nil {
			return err
		}
		if err := status.Put(statusKey(r.Status, r.Seq), nil); err != nil {
			return err
		}
		counts[st]--
		counts[r.Status]++
	}
	return nil
}

func startTx(runs, status *bolt.Bucket, o *op, counts *[maxStatus + 1]uint64) error {
	k := seqKey(o.seq)
	cur := runs.Get(k)
	if cur == nil {
		o.err = ErrNotFound
		return nil
	}
	if st, err := StatusOf(cur); err != nil || st != Queued {
		if err != nil {
			return fmt.Errorf("run %d: %w", o.seq, err)
		}
		o.err = ErrConflict
		return nil
	}
	r := o.run
	if err := Decode(cur, r, true); err != nil {
		return fmt.Errorf("run %d: %w", o.seq, err)
	}
	r.Seq = o.seq
	o.retryAt = r.admit(o.adm)
	if err := runs.Put(k, Encode(nil, r)); err != nil {
		return err
	}
	if err := status.Delete(statusKey(Queued, o.seq)); err != nil {
		return err
	}
	if err := status.Put(statusKey(Starting, o.seq), nil); err != nil {
		return err
	}
	counts[Queued]--
	counts[Starting]++
	return nil
}

// purgeTx deletes the runs that ended before o.before, in sequence order.
// Sequences follow creation, and a run ends after it was created, so the
// scan stops at the first run created at or after o.before: what it reads
// beyond the runs it deletes are only older runs still unfinished or that
// ended after o.before.
func purgeTx(runs, status, idem *bolt.Bucket, o *op, counts *[maxStatus + 1]uint64) error {
	type victim struct {
		seq uint64
		st  Status
		ik  []byte
	}
	var gone []victim
	var r Run
	c := runs.Cursor()
	for k, v := c.First(); k != nil && len(gone) < o.limit; k, v = c.Next() {
		seq := binary.BigEndian.Uint64(k)
		if err := Decode(v, &r, false); err != nil {
			return fmt.Errorf("run %d: %w", seq, err)
		}
		if r.CreatedAt >= o.before {
			break
		}
		if !r.endedBefore(o.before) {
			continue
		}
		g := victim{seq: seq, st: r.Status}
		if r.IdempotencyKey != "" {
			g.ik = []byte(idemKey(r.Name, r.IdempotencyKey))
		}
		gone = append(gone, g)
	}
	// Deleted after the scan: a bbolt cursor may skip the key after one
	// it deleted.
	for _, g := range gone {
		k := seqKey(g.seq)
		if err := runs.Delete(k); err != nil {
			return err
		}
		if err := status.Delete(statusKey(g.st, g.seq)); err != nil {
			return err
		}
		if g.ik != nil {
			if v := idem.Get(g.ik); v != nil && binary.BigEndian.Uint64(v) == g.seq {
				if err := idem.Delete(g.ik); err != nil {
					return err
				}
			}
		}
		counts[g.st]--
		o.purged[g.st]++
	}
	return nil
}

func seqKey(seq uint64) []byte {
	var k [8]byte
	binary.BigEndian.PutUint64(k[:], seq)
	return k[:]
}

func statusKey(st Status, seq uint64) []byte {
	var k [9]byte
	k[0] = byte(st)
	binary.BigEndian.PutUint64(k[1:], seq)
	return k[:]
}

func readCounts(meta *bolt.Bucket) [maxStatus + 1]uint64 {
	var c [maxStatus + 1]uint64
	v := meta.Get(keyCounts)
	for i := range c {
		if len(v) >= (i+1)*8 {
			c[i] = binary.BigEndian.Uint64(v[i*8:])
		}
	}
	return c
}

func writeCounts(c [maxStatus + 1]uint64) []byte {
	b := make([]byte, len(c)*8)
	for i, n := range c {
		binary.BigEndian.PutUint64(b[i*8:], n)
	}
	return b
}

// Get implements Store.
func (s *Bolt) Get(_ context.Context, seq uint64) (Run, error) {
	var r Run
	err := s.db.View(func(tx *bolt.Tx) error {
		v := tx.Bucket(bucketRuns).Get(seqKey(seq))
		if v == nil {
			return ErrNotFound
		}
		return Decode(v, &r, true)
	})
	if err != nil {
		if errors.Is(err, bolt.ErrDatabaseNotOpen) {
			return Run{}, ErrClosed
		}
		return Run{}, err
	}
	r.Seq = seq
	return r, nil
}

// List implements Store.
func (s *Bolt) List(_ context.Context, q Query) ([]Run, error) {
	var out []Run
	err := s.db.View(func(tx *bolt.Tx) error {
		runs := tx.Bucket(bucketRuns)
		filtered := q.Name != "" || q.Key != ""
		add := func(seq uint64, v []byte) error {
			var r Run
			if filtered {
				// Filter on the fields before copying the payloads.
				if err := Decode(v, &r, false); err != nil {
					return fmt.Errorf("run %d: %w", seq, err)
				}
				if !q.Matches(&r) {
					return nil
				}
			}
			if err := Decode(v, &r, true); err != nil {
				return fmt.Errorf("run %d: %w", seq, err)
			}
			r.Seq = seq
			out = append(out, r)
			return nil
		}
		full := func() bool { return q.Limit > 0 && len(out) >= q.Limit }
		if q.Status == 0 {
			c := runs.Cursor()
			for k, v := c.Seek(seqKey(q.After + 1)); k != nil && !full(); k, v = c.Next() {
				if err := add(binary.BigEndian.Uint64(k), v); err != nil {
					return err
				}
			}
			return nil
		}
		c := tx.Bucket(bucketStatus).Cursor()
		for k, _ := c.Seek(statusKey(q.Status, q.After+1)); k != nil && k[0] == byte(q.Status) && !full(); k, _ = c.Next() {
			seq := binary.BigEndian.Uint64(k[1:])
			if err := add(seq, runs.Get(k[1:])); err != nil {
				return err
			}
		}
		return nil
	})
	return out, err
}

// Unfinished implements Store.
func (s *Bolt) Unfinished(ctx context.Context, fn func(*Run) error) error {
	return s.db.View(func(tx *bolt.Tx) error {
		runs := tx.Bucket(bucketRuns)
		c := tx.Bucket(bucketStatus).Cursor()
		var r Run
		n := 0
		for _, st := range Unfinished {
			for k, _ := c.Seek([]byte{byte(st)}); k != nil && k[0] == byte(st); k, _ = c.Next() {
				if n++; n&4095 == 0 {
					if err := ctx.Err(); err != nil {
						return err
					}
				}
				seq := binary.BigEndian.Uint64(k[1:])
				v := runs.Get(k[1:])
				if v == nil {
					return fmt.Errorf("status index names missing run %d", seq)
				}
				r = Run{}
				if err := Decode(v, &r, false); err != nil {
					return fmt.Errorf("run %d: %w", seq, err)
				}
				r.Seq = seq
				if err := fn(&r); err != nil {
					return err
				}
			}
		}
		return nil
	})
}

// Counts implements Store.
func (s *Bolt) Counts(context.Context) (map[Status]int, error) {
	out := make(map[Status]int, len(All))
	err := s.db.View(func(tx *bolt.Tx) error {
		c := readCounts(tx.Bucket(bucketMeta))
		for _, st := range All {
			out[st] = int(c[st])
		}
		return nil
	})
	return out, err
}

// Close implements Store: it commits every write already queued, then
// closes the file.
func (s *Bolt) Close() error {
	s.sendMu.Lock()
	if s.closed {
		s.sendMu.Unlock()
		return nil
	}
	s.closed = true
	s.sendMu.Unlock()
	close(s.stop)
	<-s.done
	return s.db.Close()
}
