package window

import (
	"context"
	"errors"
	"iter"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/warden-dev/warden/governor/backend/redisx"
	"github.com/warden-dev/warden/governor/clock"
	"github.com/warden-dev/warden/governor/metrics"
)

// RedisConfig configures the Redis counter.
type RedisConfig struct {
	redisx.Config
	// Prefix starts every key (DefaultRedisPrefix when empty). Sidecars
	// share windows when they share a Redis and a prefix.
	Prefix string
	// FullRecheck bounds how long a window Redis reported full is refused
	// locally before Redis is asked again (1 s when 0; negative: no local
	// over-limit cache).
	FullRecheck time.Duration
}

// DefaultFullRecheck is RedisConfig.FullRecheck's default.
const DefaultFullRecheck = time.Second

// Redis is the shared Counter: windows live in Redis, so every sidecar
// using the same Redis and prefix admits against the same counts.
//
// The window is computed here, from the caller's now, exactly as Memory
// computes it (Bounds, aligned to the sidecar's local calendar); Redis only
// stores counts under keys that carry the window's start. Concurrent takes
// are batched into one script call per round trip (redisx). Windows Redis
// reported full are refused locally until they end (fullCache). While Redis
// is unreachable the counter either counts in its local Memory (fail_open)
// or refuses with Decision.Unavailable (fail_closed), and goes back to
// Redis once a background probe gets an answer.
type Redis struct {
	clk   clock.Clock
	m     *metrics.Metrics
	log   *slog.Logger
	local *Memory // fail_open windows, and everything after backend.kind: memory
	spans spans
	full  fullCache
	state atomic.Pointer[redisState]
	mu    sync.Mutex // serialises Reconfigure and Close
}

type redisState struct {
	cli        *redisx.Client // nil: local windows only
	cfg        RedisConfig
	failClosed bool
	prefix     string
	recheck    int64 // ns; < 0: no over-limit cache
}

// NewRedis returns a counter on the Redis at cfg.URL. Redis need not be
// reachable yet: the counter starts degraded and recovers by itself.
func NewRedis(cfg RedisConfig, clk clock.Clock, m *metrics.Metrics, log *slog.Logger) (*Redis, error) {
	r := &Redis{clk: clk, m: m, log: log, local: NewMemory(clk)}
	st, err := r.open(cfg)
	if err != nil {
		return nil, err
	}
	r.state.Store(st)
	return r, nil
}

func (r *Redis) open(cfg RedisConfig) (*redisState, error) {
	cli, err := redisx.Open(cfg.Config, r.clk, r.m, r.log)
	if err != nil {
		return nil, err
	}
	st := &redisState{cli: cli, cfg: cfg, failClosed: cfg.FailClosed, prefix: cfg.Prefix, recheck: int64(cfg.FullRecheck)}
	if st.prefix == "" {
		st.prefix = DefaultRedisPrefix
	}
	if st.recheck == 0 {
		st.recheck = int64(DefaultFullRecheck)
	}
	return st, nil
}

// Reconfigure switches the counter to cfg (a changed backend URL, prefix,
// on_error) or, with cfg nil, to local windows only (backend.kind changed
// to memory). Windows restart from what the new backend holds; the old
// client is closed once its in-flight batches are done.
func (r *Redis) Reconfigure(cfg *RedisConfig) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	old := r.state.Load()
	next := &redisState{}
	if cfg != nil {
		if old.cli != nil && old.cfg == *cfg {
			return nil
		}
		st, err := r.open(*cfg)
		if err != nil {
			return err
		}
		next = st
	} else if old.cli == nil {
		return nil
	}
	r.state.Store(next)
	r.full.drop(func(fullEntry) bool { return true })
	if old.cli != nil {
		return old.cli.Close()
	}
	return nil
}

// Close releases the Redis client; the counter keeps answering from its
// local windows.
func (r *Redis) Close() error { return r.Reconfigure(nil) }

// Ready returns an error while decisions are refused because the backend is
// down (fail_closed); fail_open keeps serving, see Degraded.
func (r *Redis) Ready() error {
	st := r.state.Load()
	if st.cli == nil || !st.failClosed {
		return nil
	}
	return st.cli.Ready()
}

// Degraded returns why the shared backend is not in use, nil while it is.
func (r *Redis) Degraded() error {
	if st := r.state.Load(); st.cli != nil {
		return st.cli.Ready()
	}
	return nil
}

// Client is the current Redis client, nil when running on local windows.
func (r *Redis) Client() *redisx.Client { return r.state.Load().cli }

// Take implements Counter.
func (r *Redis) Take(s *Scope, key []byte, limit, n int64, now time.Time) Decision {
	st := r.state.Load()
	if st.cli == nil {
		return r.local.Take(s, key, limit, n, now)
	}
	cur := r.spans.current(s.Window, now)
	d := Decision{Limit: limit, start: cur.start, end: cur.end, loc: now.Location()}
	h := keyHash(s, key)
	nowNs := now.UnixNano()
	if c, full := r.full.refused(h, cur.end, nowNs, limit, n); full {
		d.Count = c
		return d
	}
	if st.cli.Down() {
		return r.fallback(st, s, key, limit, n, now, d)
	}
	k := windowKeys(st.prefix, s, cur.start)
	ck := k.counterKey(key)
	op := redisx.GetOp()
	op.AddWindow(ck, k.index, ck[len(k.base):], limit, n, int64(s.MaxKeys), time.Duration(cur.end-nowNs))
	if err := st.cli.Admit(op); err != nil {
		redisx.PutOp(op)
		return r.fallback(st, s, key, limit, n, now, d)
	}
	setResult(&d, op, 0)
	redisx.PutOp(op)
	if !d.Allowed && !d.Overflow && st.recheck > 0 {
		r.full.mark(h, s.hash, cur.end, nowNs, d.Count, st.recheck)
	}
	return d
}

// setResult fills d from window gate i of op: its count and whether it
// admitted, or that its scope's cap refused the key (Overflow).
func setResult(d *Decision, op *redisx.Op, i int) {
	d.Count, d.Allowed = op.Result(i)
	if d.Count == redisx.Overflow {
		d.Count, d.Overflow = 0, true
	}
}

func (r *Redis) fallback(st *redisState, s *Scope, key []byte, limit, n int64, now time.Time, d Decision) Decision {
	if st.failClosed {
		d.Unavailable = true
		return d
	}
	return r.local.Take(s, key, limit, n, now)
}

// TakeAll implements Counter: one script call checks every window and
// commits all or none.
func (r *Redis) TakeAll(ws []Want, now time.Time, out []Decision) bool {
	st := r.state.Load()
	if st.cli == nil {
		return r.local.TakeAll(ws, now, out)
	}
	nowNs := now.UnixNano()
	anyFull := false
	var stack [8]int
	asked := stack[:0] // indexes in ws of the windows sent to Redis
	for i, w := range ws {
		cur := r.spans.current(w.Scope.Window, now)
		out[i] = Decision{Limit: w.Limit, start: cur.start, end: cur.end, loc: now.Location()}
		if c, full := r.full.refused(keyHash(w.Scope, w.Key), cur.end, nowNs, w.Limit, w.N); full {
			out[i].Count = c
			anyFull = true
			continue
		}
		asked = append(asked, i)
	}
	if len(asked) == 0 {
		return false
	}
	if st.cli.Down() {
		if anyFull && !st.failClosed {
			// Refused by the cache already; the local windows supply
			// the others' counts.
			for _, i := range asked {
				w := ws[i]
				out[i].Count = r.local.Peek(w.Scope, w.Key, w.Limit).Count
				out[i].Allowed = out[i].Count+w.N <= w.Limit
			}
			return false
		}
		return r.fallbackAll(st, ws, now, out)
	}
	op := redisx.GetOp()
	defer redisx.PutOp(op)
	for _, i := range asked {
		w := ws[i]
		k := windowKeys(st.prefix, w.Scope, out[i].start)
		ck := k.counterKey(w.Key)
		op.AddWindow(ck, k.index, ck[len(k.base):], w.Limit, w.N, int64(w.Scope.MaxKeys), time.Duration(out[i].end-nowNs))
	}
	if anyFull {
		op.CheckOnly() // refused already; read the others' counts for the answer
	}
	if err := st.cli.Admit(op); err != nil {
		return r.fallbackAll(st, ws, now, out)
	}
	for j, i := range asked {
		setResult(&out[i], op, j)
		if !out[i].Allowed && !out[i].Overflow && st.recheck > 0 {
			w := ws[i]
			r.full.mark(keyHash(w.Scope, w.Key), w.Scope.hash, out[i].end, nowNs, out[i].Count, st.recheck)
		}
	}
	return !anyFull && op.Admitted()
}

func (r *Redis) fallbackAll(st *redisState, ws []Want, now time.Time, out []Decision) bool {
	if st.failClosed {
		for i := range out[:len(ws)] {
			out[i].Allowed, out[i].Unavailable, out[i].Count = false, true, 0
		}
		return false
	}
	return r.local.TakeAll(ws, now, out)
}

// Peek implements Counter.
func (r *Redis) Peek(s *Scope, key []byte, limit int64) Decision {
	st := r.state.Load()
	if st.cli == nil {
		return r.local.Peek(s, key, limit)
	}
	now := r.clk.Now()
	cur := r.spans.current(s.Window, now)
	d := Decision{Limit: limit, start: cur.start, end: cur.end, loc: now.Location()}
	if c, full := r.full.refused(keyHash(s, key), cur.end, now.UnixNano(), limit, 1); full {
		d.Count = c
		return d
	}
	ck := windowKeys(st.prefix, s, cur.start).counterKey(key)
	err := st.cli.Call("peek", func(ctx context.Context, rdb *redis.Client) error {
		v, err := rdb.Get(ctx, ck).Int64()
		if errors.Is(err, redis.Nil) {
			return nil
		}
		d.Count = v
		return err
	})
	if err != nil {
		if st.failClosed {
			d.Unavailable, d.Count = true, 0
			return d
		}
		return r.local.Peek(s, key, limit)
	}
	d.Allowed = d.Count < limit
	return d
}

// Refund implements Counter. A refund that cannot reach Redis is applied
// to the local windows only (it is lost for the shared count).
func (r *Redis) Refund(s *Scope, key []byte, start time.Time, n int64) {
	st := r.state.Load()
	if st.cli == nil {
		r.local.Refund(s, key, start, n)
		return
	}
	ws, end := Bounds(start, s.Window)
	if !r.clk.Now().Before(end) {
		return // that window is over; a later one never gets credit
	}
	r.full.forget(keyHash(s, key))
	ck := buildKeys(st.prefix, s, ws.UnixNano()).counterKey(key)
	if _, err := st.cli.Refund(ck, n); err != nil {
		r.local.Refund(s, key, start, n)
	}
}

// Reset implements Counter: the window keeps its key, so its expiry (the
// boundary) does not move.
func (r *Redis) Reset(s *Scope, key []byte) {
	r.local.Reset(s, key)
	st := r.state.Load()
	if st.cli == nil {
		return
	}
	r.full.forget(keyHash(s, key))
	ck := windowKeys(st.prefix, s, r.spans.current(s.Window, r.clk.Now()).start).counterKey(key)
	_ = st.cli.Call("reset", func(ctx context.Context, rdb *redis.Client) error {
		return ignoreNil(rdb.SetArgs(ctx, ck, 0, redis.SetArgs{KeepTTL: true, Mode: "XX"}).Err())
	})
}

// ResetScope implements Counter.
func (r *Redis) ResetScope(s *Scope) {
	r.local.ResetScope(s)
	st := r.state.Load()
	if st.cli == nil {
		return
	}
	r.full.forgetScope(s.hash)
	k := windowKeys(st.prefix, s, r.spans.current(s.Window, r.clk.Now()).start)
	_ = st.cli.Call("reset", func(ctx context.Context, rdb *redis.Client) error {
		members, err := rdb.SMembers(ctx, k.index).Result()
		if err != nil {
			return err
		}
		for chunk := range slices.Chunk(members, 500) {
			_, err := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
				for _, m := range chunk {
					p.SetArgs(ctx, k.base+m, 0, redis.SetArgs{KeepTTL: true, Mode: "XX"})
				}
				return nil
			})
			if err = ignoreNil(err); err != nil {
				return err
			}
		}
		return nil
	})
}

// usageChunk is how many keys of a window Usage reads per round trip.
const usageChunk = 500

// Usage implements Counter: the keys of the scope's current window, from
// the window's index set, read a chunk at a time (SSCAN, then MGET of
// their counters), so a listing holds one chunk however many keys the
// window has. As SSCAN, it may yield a key twice when the set is resized
// during the listing. When Redis fails before the first key, the local
// windows (fail_open's) are listed instead.
func (r *Redis) Usage(s *Scope) iter.Seq[Usage] {
	return func(yield func(Usage) bool) {
		st := r.state.Load()
		if st.cli == nil {
			r.local.Usage(s)(yield)
			return
		}
		now := r.clk.Now()
		cur := r.spans.current(s.Window, now)
		k := windowKeys(st.prefix, s, cur.start)
		start, end := time.Unix(0, cur.start).In(now.Location()), time.Unix(0, cur.end).In(now.Location())
		yielded, stopped := false, false
		var cursor uint64
		keys := make([]string, 0, usageChunk)
		for !stopped {
			var members []string
			var vals []any
			err := st.cli.Call("usage", func(ctx context.Context, rdb *redis.Client) error {
				var err error
				members, cursor, err = rdb.SScan(ctx, k.index, cursor, "", usageChunk).Result()
				if err != nil || len(members) == 0 {
					return err
				}
				keys = keys[:0]
				for _, m := range members {
					keys = append(keys, k.base+m)
				}
				vals, err = rdb.MGet(ctx, keys...).Result()
				return err
			})
			if err != nil {
				if !yielded && !st.failClosed {
					r.local.Usage(s)(yield)
				}
				return
			}
			for i, v := range vals {
				sv, ok := v.(string)
				if !ok {
					continue // expired or never written
				}
				c, err := strconv.ParseInt(sv, 10, 64)
				if err != nil {
					continue // not a count: nothing warden wrote
				}
				yielded = true
				if !yield(Usage{Scope: s.Name, Window: s.Window, Key: members[i], Count: c, Start: start, End: end}) {
					stopped = true
					break
				}
			}
			if cursor == 0 {
				return
			}
		}
	}
}

// Sweep drops expired local windows and over-limit cache entries; Redis
// expires its own keys.
func (r *Redis) Sweep() int {
	r.full.sweep(r.clk.Now().UnixNano())
	return r.local.Sweep()
}

func ignoreNil(err error) error {
	if errors.Is(err, redis.Nil) {
		return nil
	}
	return err
}
