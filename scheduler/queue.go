package scheduler

import (
	"slices"

	"github.com/warden-dev/warden/governor/clock"
)

// The in-memory index of waiting runs. The store holds the runs; the index
// holds only what admission orders by (24 bytes a run plus 16 in a heap), so
// a million queued runs cost tens of megabytes, not their inputs.
//
// Runs wait in groups, one per (definition, resolved key). Each group is a
// heap by priority then age; each definition keeps a heap of its groups
// that may admit (key_concurrency has room), ordered by their heads. A group
// whose key is busy simply leaves its definition's heap, so it never blocks
// other keys; a definition whose pool or semaphores are full is skipped as a
// whole by the admitter, so it never blocks other definitions.

type handle = uint32

// entry is a waiting run's slot. A free slot has g == nil.
type entry struct {
	seq      uint64
	queuedAt int64 // unix nanos: for queue wait, oldest age and schedule_to_start
	g        *group
}

// item is a heap element: the sort key inline, so sifting touches only the
// heap's own array. An item whose slot no longer holds its seq is stale (the
// run left the queue by a timeout) and is dropped when it reaches the top.
type item struct {
	seq  uint64
	prio int32
	h    handle
}

func (a item) before(b item) bool {
	if a.prio != b.prio {
		return a.prio > b.prio
	}
	return a.seq < b.seq
}

type group struct {
	q       *defQueue
	key     string
	heap    []item // its top is always live
	live    int
	running int
	pos     int // index in q.ready; -1 when not there
}

// defQueue is the waiting side of one definition.
type defQueue struct {
	name     string
	keyLimit int // 0: no key gate
	groups   map[string]*group
	ready    []*group
	waiting  int
	// fifo lists the runs in queue-entry order while the definition has a
	// schedule_to_start timeout; entries of runs that left are skipped
	// lazily and compacted when they are the majority.
	fifo      []fifoEntry
	fifoHead  int
	fifoStale int
	fifoOn    bool
	// stsTimer fires at the schedule_to_start deadline of the oldest run.
	stsTimer clock.Timer
	stsAt    int64
}

func (d *defQueue) stopTimer() {
	if d.stsTimer != nil {
		d.stsTimer.Stop()
	}
	d.stsAt = 0
}

type fifoEntry struct {
	seq uint64
	h   handle
}

type queue struct {
	slab []entry
	free []handle
	defs map[string]*defQueue
	n    int
}

func newQueue() *queue { return &queue{defs: map[string]*defQueue{}} }

func (q *queue) def(name string) *defQueue {
	d := q.defs[name]
	if d == nil {
		d = &defQueue{name: name, groups: map[string]*group{}}
		q.defs[name] = d
	}
	return d
}

func (q *queue) group(d *defQueue, key string) *group {
	g := d.groups[key]
	if g == nil {
		g = &group{q: d, key: key, pos: -1}
		d.groups[key] = g
	}
	return g
}

// push adds a waiting run.
func (q *queue) push(d *defQueue, key string, seq uint64, prio int32, queuedAt int64) handle {
	g := q.group(d, key)
	var h handle
	if n := len(q.free); n > 0 {
		h = q.free[n-1]
		q.free = q.free[:n-1]
	} else {
		h = handle(len(q.slab))
		q.slab = append(q.slab, entry{})
	}
	q.slab[h] = entry{seq: seq, queuedAt: queuedAt, g: g}
	g.heap = append(g.heap, item{seq: seq, prio: prio, h: h})
	up(g.heap, len(g.heap)-1)
	g.live++
	d.waiting++
	q.n++
	if d.fifoOn {
		d.fifo = append(d.fifo, fifoEntry{seq: seq, h: h})
	}
	q.fix(g)
	return h
}

// head returns the definition's best waiting run that may admit.
func (q *queue) head(d *defQueue) (item, bool) {
	if len(d.ready) == 0 {
		return item{}, false
	}
	return d.ready[0].heap[0], true
}

// admit removes the definition's head (as returned by head) and counts it
// running in its group.
func (q *queue) admit(d *defQueue) entry {
	g := d.ready[0]
	top := g.heap[0]
	g.heap = pop(g.heap)
	e := q.release(top.h)
	g.running++
	q.clean(g)
	q.fix(g)
	return e
}

// find looks a waiting run up by its sequence: a scan of the slab, since
// only a cancellation needs it (a million waiting runs: milliseconds).
func (q *queue) find(seq uint64) (handle, bool) {
	for i := range q.slab {
		if e := &q.slab[i]; e.g != nil && e.seq == seq {
			return handle(i), true
		}
	}
	return 0, false
}

// remove takes a waiting run out of the queue wherever it is (a
// schedule_to_start timeout). Its heap item goes stale.
func (q *queue) remove(h handle) entry {
	e := q.release(h)
	q.clean(e.g)
	q.fix(e.g)
	return e
}

func (q *queue) release(h handle) entry {
	e := q.slab[h]
	q.slab[h] = entry{}
	q.free = append(q.free, h)
	e.g.live--
	d := e.g.q
	d.waiting--
	q.n--
	if d.fifoOn {
		d.fifoStale++
		d.compactFIFO(q)
	}
	return e
}

// queuedFirst is when g's oldest waiting run was queued (unix ns); 0 when none
// waits. O(len(g.heap)).
func (q *queue) queuedFirst(g *group) int64 {
	oldest := int64(0)
	for _, it := range g.heap {
		if !q.stale(it) {
			if at := q.slab[it.h].queuedAt; oldest == 0 || at < oldest {
				oldest = at
			}
		}
	}
	return oldest
}

func (q *queue) stale(it item) bool {
	e := &q.slab[it.h]
	return e.g == nil || e.seq != it.seq
}

// clean drops stale items from the top of g's heap, and rebuilds the heap
// when stale items are the majority.
func (q *queue) clean(g *group) {
	for len(g.heap) > 0 && q.stale(g.heap[0]) {
		g.heap = pop(g.heap)
	}
	if len(g.heap) > 64 && g.live < len(g.heap)/2 {
		out := g.heap[:0]
		for _, it := range g.heap {
			if !q.stale(it) {
				out = append(out, it)
			}
		}
		g.heap = out
		for i := len(out)/2 - 1; i >= 0; i-- {
			down(out, i)
		}
	}
}

// finished records that a run of the group stopped running.
func (q *queue) finished(d *defQueue, key string) {
	g := d.groups[key]
	if g == nil {
		return
	}
	if g.running > 0 {
		g.running--
	}
	q.fix(g)
}

// resumed counts a run running in its key's group without it having
// waited in the queue: recovered after a restart, or admitted at submit.
func (q *queue) resumed(d *defQueue, key string) {
	g := q.group(d, key)
	g.running++
	q.fix(g)
}

// fix puts g in or out of its definition's ready heap, and forgets a group
// with nothing waiting or running.
func (q *queue) fix(g *group) {
	d := g.q
	ready := len(g.heap) > 0 && (d.keyLimit <= 0 || g.running < d.keyLimit)
	switch {
	case ready && g.pos < 0:
		g.pos = len(d.ready)
		d.ready = append(d.ready, g)
		readyUp(d.ready, g.pos)
	case ready:
		readyDown(d.ready, g.pos)
		readyUp(d.ready, g.pos)
	case g.pos >= 0:
		readyRemove(d, g.pos)
	}
	if len(g.heap) == 0 && g.running == 0 {
		delete(d.groups, g.key)
	}
}

// setKeyLimit applies a reloaded key_concurrency.
func (q *queue) setKeyLimit(d *defQueue, limit int) {
	if d.keyLimit == limit {
		return
	}
	d.keyLimit = limit
	for _, g := range d.groups {
		q.fix(g)
	}
}

// keyBusy reports whether key_concurrency holds the group of key.
func (d *defQueue) keyBusy(key string) bool {
	g := d.groups[key]
	return g != nil && d.keyLimit > 0 && g.running >= d.keyLimit
}

func up(h []item, i int) {
	for i > 0 {
		p := (i - 1) / 2
		if !h[i].before(h[p]) {
			break
		}
		h[i], h[p] = h[p], h[i]
		i = p
	}
}

func down(h []item, i int) {
	n := len(h)
	for {
		l := 2*i + 1
		if l >= n {
			return
		}
		m := l
		if r := l + 1; r < n && h[r].before(h[l]) {
			m = r
		}
		if !h[m].before(h[i]) {
			return
		}
		h[i], h[m] = h[m], h[i]
		i = m
	}
}

func pop(h []item) []item {
	last := len(h) - 1
	h[0] = h[last]
	h = h[:last]
	if last > 0 {
		down(h, 0)
	}
	return h
}

func groupBefore(a, b *group) bool { return a.heap[0].before(b.heap[0]) }

func readyUp(r []*group, i int) {
	for i > 0 {
		p := (i - 1) / 2
		if !groupBefore(r[i], r[p]) {
			break
		}
		r[i], r[p] = r[p], r[i]
		r[i].pos, r[p].pos = i, p
		i = p
	}
}

func readyDown(r []*group, i int) {
	n := len(r)
	for {
		l := 2*i + 1
		if l >= n {
			return
		}
		m := l
		if x := l + 1; x < n && groupBefore(r[x], r[l]) {
			m = x
		}
		if !groupBefore(r[m], r[i]) {
			return
		}
		r[i], r[m] = r[m], r[i]
		r[i].pos, r[m].pos = i, m
		i = m
	}
}

func readyRemove(d *defQueue, i int) {
	g := d.ready[i]
	last := len(d.ready) - 1
	if i != last {
		d.ready[i] = d.ready[last]
		d.ready[i].pos = i
	}
	d.ready[last] = nil
	d.ready = d.ready[:last]
	g.pos = -1
	if i != last {
		readyDown(d.ready, i)
		readyUp(d.ready, i)
	}
}

// enableFIFO starts tracking queue-entry order for schedule_to_start,
// seeding it with the runs already waiting.
func (q *queue) enableFIFO(d *defQueue) {
	if d.fifoOn {
		return
	}
	d.fifoOn = true
	d.fifo, d.fifoHead, d.fifoStale = d.fifo[:0], 0, 0
	for _, g := range d.groups {
		for _, it := range g.heap {
			if !q.stale(it) {
				d.fifo = append(d.fifo, fifoEntry{seq: it.seq, h: it.h})
			}
		}
	}
	sortFIFO(q, d.fifo)
}

func (q *queue) disableFIFO(d *defQueue) {
	d.fifoOn = false
	d.fifo, d.fifoHead, d.fifoStale = nil, 0, 0
}

func (q *queue) live(f fifoEntry) bool {
	e := &q.slab[f.h]
	return e.g != nil && e.seq == f.seq
}

// oldest returns the earliest-queued waiting run of a definition tracked by
// its FIFO.
func (q *queue) oldest(d *defQueue) (handle, bool) {
	for d.fifoHead < len(d.fifo) {
		f := d.fifo[d.fifoHead]
		if q.live(f) {
			return f.h, true
		}
		d.fifoHead++
		d.fifoStale--
	}
	return 0, false
}

func (d *defQueue) compactFIFO(q *queue) {
	live := len(d.fifo) - d.fifoHead - d.fifoStale
	if len(d.fifo) < 1024 || d.fifoStale+d.fifoHead < 2*live {
		return
	}
	out := d.fifo[:0]
	for _, f := range d.fifo[d.fifoHead:] {
		if q.live(f) {
			out = append(out, f)
		}
	}
	clear(d.fifo[len(out):])
	d.fifo, d.fifoHead, d.fifoStale = out, 0, 0
}

// sortFIFO orders FIFO entries by queue-entry time, then age.
func sortFIFO(q *queue, f []fifoEntry) {
	slices.SortFunc(f, func(a, b fifoEntry) int {
		ea, eb := &q.slab[a.h], &q.slab[b.h]
		switch {
		case ea.queuedAt != eb.queuedAt:
			if ea.queuedAt < eb.queuedAt {
				return -1
			}
			return 1
		case ea.seq < eb.seq:
			return -1
		case ea.seq > eb.seq:
			return 1
		}
		return 0
	})
}

// placeFIFO moves the entry of h, just pushed at the end of d's FIFO, to
// its place in queue-entry order, so that schedule_to_start sees a run put
// back after a refused Redis admission (admit_redis_pick.go) as the old
// run it is. The slot it takes is the nearest stale one before that place
// (usually the run's own previous entry), so the move costs the distance
// from the FIFO's head, not its length.
func (q *queue) placeFIFO(d *defQueue, h handle) {
	last := len(d.fifo) - 1
	me := d.fifo[last]
	key := q.slab[h]
	after := func(f fifoEntry) bool {
		e := &q.slab[f.h]
		return e.queuedAt > key.queuedAt || e.queuedAt == key.queuedAt && e.seq > key.seq
	}
	p, free := last, -1
	for i := d.fifoHead; i < last; i++ {
		f := d.fifo[i]
		if f == me {
			// The run got its slot back, so its previous entry, counted
			// stale when it left, is live again and in place.
			d.fifo = d.fifo[:last]
			d.fifoStale--
			return
		}
		if !q.live(f) {
			free = i
			continue
		}
		if after(f) {
			p = i
			break
		}
	}
	if p == last {
		return // it is the newest: already in place
	}
	switch {
	case free >= 0:
		// Shift [free+1, p) down over the stale slot.
		copy(d.fifo[free:p-1], d.fifo[free+1:p])
		d.fifo[p-1] = me
		d.fifo = d.fifo[:last]
		d.fifoStale--
	case d.fifoHead > 0:
		d.fifoHead--
		copy(d.fifo[d.fifoHead:p-1], d.fifo[d.fifoHead+1:p])
		d.fifo[p-1] = me
		d.fifo = d.fifo[:last]
	default:
		copy(d.fifo[p+1:], d.fifo[p:last])
		d.fifo[p] = me
	}
}
