package redisx

import (
	"context"
	"fmt"
	"runtime"
	"time"
)

// batcher turns concurrent admissions into few Redis calls. A sender (one
// goroutine by default: a single writer) takes the first waiting op, then
// every op queued behind it up to MaxBatch, and sends them as one EVALSHA;
// the ops that arrive while a batch is on the wire form the next one. This
// is natural batching: no timer lingers for more work, so a lone admission
// pays one round trip and a busy sidecar sends hundreds per round trip.
// More senders overlap batches but make them smaller, and each batch costs
// a write and a read syscall whatever it carries: on a 2-core VM one
// sender gave the most decisions per CPU second.
type batcher struct {
	c   *Client
	ops chan *Op
}

func newBatcher(c *Client) *batcher {
	return &batcher{c: c, ops: make(chan *Op, 16*c.cfg.MaxBatch)}
}

// Admit runs op in the next batch and waits for its result. It returns
// ErrUnavailable without queuing while the backend is down, and the call's
// error when the batch failed; either way op has no result.
func (c *Client) Admit(op *Op) error {
	if len(op.gates) == 0 {
		return nil
	}
	if c.h.isDown() {
		return ErrUnavailable
	}
	c.mu.RLock()
	if c.closed {
		c.mu.RUnlock()
		return ErrClosed
	}
	c.b.ops <- op
	c.mu.RUnlock()
	<-op.done
	return op.err
}

// lingerRounds bounds the scheduling rounds a batch waits for more ops.
const lingerRounds = 4

func (b *batcher) sender() {
	defer b.c.wg.Done()
	var (
		batch []*Op
		args  []any
	)
	for {
		select {
		case op := <-b.ops:
			batch = append(batch[:0], op)
		case <-b.c.done:
			return
		}
		batch = b.fill(batch)
		// Let the goroutines that are runnable right now — requests about
		// to decide — queue their admissions before this batch leaves:
		// scheduling rounds, no timer, for as long as each round brings
		// more (at most lingerRounds). An idle process sends at once; a
		// busy one sends far fewer, larger batches, and on a VM every
		// round trip's syscalls cost more than the admissions in it.
		for range lingerRounds {
			if len(batch) >= b.c.cfg.MaxBatch {
				break
			}
			n := len(batch)
			runtime.Gosched()
			if batch = b.fill(batch); len(batch) == n {
				break
			}
		}
		args = b.send(batch, args)
		clear(batch)
	}
}

// fill adds the queued ops to batch, up to MaxBatch, without waiting.
func (b *batcher) fill(batch []*Op) []*Op {
	for len(batch) < b.c.cfg.MaxBatch {
		select {
		case op := <-b.ops:
			batch = append(batch, op)
		default:
			return batch
		}
	}
	return batch
}

// send runs one batch and completes its ops. It returns args for reuse.
func (b *batcher) send(batch []*Op, args []any) []any {
	if b.c.h.isDown() {
		// Queued before the outage was noticed: do not pay another timeout.
		finish(batch, ErrUnavailable)
		return args
	}
	args = encode(batch, args[:0])
	start := time.Now()
	vals, err := admitScript.run(context.Background(), b.c.rdb, args).Int64Slice()
	b.c.observe("admit", start, err)
	clear(args) // drop references to the ops' strings
	if err == nil {
		err = decode(batch, vals)
	}
	finish(batch, err)
	return args
}

func finish(batch []*Op, err error) {
	for _, op := range batch {
		complete(op, err)
	}
}

// complete hands op its outcome: to the goroutine waiting in Admit, or,
// for an asynchronous op, to its after func (which must not block: it
// runs in the sender).
func complete(op *Op, err error) {
	if op.after != nil {
		after := op.after
		PutOp(op)
		after()
		return
	}
	op.err = err
	op.done <- struct{}{}
}

// encode builds [_, _, numkeys, KEYS..., ARGV...] for admitScript. Strings
// and integers are passed by pointer (go-redis writes *string and *int64 as
// is; an int64 in an interface would be boxed), so a batch adds no
// allocation per gate.
func encode(batch []*Op, args []any) []any {
	args = append(args, nil, nil, 0)
	nkeys := 0
	for _, op := range batch {
		for i := range op.gates {
			g := &op.gates[i]
			if g.Kind != GateWindow {
				args = append(args, &g.Key)
				nkeys++
				continue
			}
			args = append(args, &g.Key, &g.Index)
			nkeys += 2
		}
	}
	args[2] = nkeys
	args = append(args, len(batch))
	for _, op := range batch {
		n := len(op.gates)
		if op.checkOnly {
			n = -n
		}
		args = append(args, n)
		for i := range op.gates {
			g := &op.gates[i]
			switch g.Kind {
			case GateLease:
				args = append(args, "l", &g.Limit, &g.NowMillis, &g.ExpiryMillis, &g.Member, &g.TTLMillis)
				continue
			case GateRelease:
				args = append(args, "r", &g.Member)
				continue
			}
			args = append(args, "w", &g.Limit, &g.N, &g.TTLMillis, &g.Member, &g.MaxKeys)
		}
	}
	return args
}

func decode(batch []*Op, vals []int64) error {
	want := 0
	for _, op := range batch {
		want += len(op.gates)
	}
	if len(vals) != want {
		return fmt.Errorf("admit script returned %d values for %d gates", len(vals), want)
	}
	i := 0
	for _, op := range batch {
		op.res = append(op.res[:0], vals[i:i+len(op.gates)]...)
		i += len(op.gates)
	}
	return nil
}

// drain empties the queue once the senders have stopped: admissions
// still queued fail with err; releases still queued are sent in a last
// batch (a sidecar shutting down gives back the slots of the requests it
// finished rather than leave them to expire).
func (b *batcher) drain(err error) {
	var releases []*Op
	for {
		select {
		case op := <-b.ops:
			if op.after != nil {
				releases = append(releases, op)
				continue
			}
			complete(op, err)
		default:
			for start := 0; start < len(releases); start += b.c.cfg.MaxBatch {
				b.send(releases[start:min(start+b.c.cfg.MaxBatch, len(releases))], nil)
			}
			return
		}
	}
}
