// Package redisx is warden's connection to a shared Redis (backend.kind:
// redis): one client with short timeouts, a breaker around Redis itself with
// a background probe, the batcher that sends every concurrent admission of
// the process in one EVALSHA, and the Lua gate library that admission
// scripts are built from.
//
// It knows gates (a window counter today; leases in sorted sets next), not
// warden's controls: governor/window turns a Take into a window gate and a
// Decision back, and a later multi-gate admission (pool concurrency + rate,
// lanes, semaphores) adds its gate kinds to the same library and the same
// batcher. See README.md beside this file.
package redisx

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/warden-dev/warden/governor/clock"
	"github.com/warden-dev/warden/governor/metrics"
	"github.com/warden-dev/warden/policy"
)

// ErrUnavailable is returned instead of calling Redis while the backend is
// marked down: the caller falls back (fail_open) or refuses (fail_closed).
var ErrUnavailable = errors.New("shared backend unavailable")

// ErrClosed is returned for calls made after Close.
var ErrClosed = errors.New("shared backend client closed")

// Config says how to reach Redis. Zero durations and counts take the
// defaults below.
type Config struct {
	URL string
	// FailClosed only changes what the outage log line says; the caller
	// decides what a refusal means.
	FailClosed bool
	// Dial, read and write deadlines of every Redis call. Short on purpose:
	// an outage costs the call that detects it one timeout, and the calls
	// after it none (the breaker is open until a probe succeeds).
	DialTimeout  time.Duration
	ReadTimeout  time.Duration
	WriteTimeout time.Duration
	// ProbeEvery is how often a down backend is pinged.
	ProbeEvery time.Duration
	// Senders is how many batches may be in flight at once (1: a single
	// writer, the best throughput per CPU measured on 2 cores); MaxBatch
	// caps the admissions of one batch.
	Senders  int
	MaxBatch int
	// LeaseTTL is how long a lease (pool concurrency slot) lives without
	// renewal; RenewEvery is how often every held lease is renewed
	// (LeaseTTL/3 when 0).
	LeaseTTL   time.Duration
	RenewEvery time.Duration
}

// Defaults.
const (
	DefaultDialTimeout  = 100 * time.Millisecond
	DefaultReadTimeout  = 100 * time.Millisecond
	DefaultWriteTimeout = 100 * time.Millisecond
	DefaultProbeEvery   = 250 * time.Millisecond
	DefaultSenders      = 1
	DefaultMaxBatch     = 256
)

func (c *Config) setDefaults() {
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&c.DialTimeout, DefaultDialTimeout)
	def(&c.ReadTimeout, DefaultReadTimeout)
	def(&c.WriteTimeout, DefaultWriteTimeout)
	def(&c.ProbeEvery, DefaultProbeEvery)
	if c.Senders <= 0 {
		c.Senders = DefaultSenders
	}
	if c.MaxBatch <= 0 {
		c.MaxBatch = DefaultMaxBatch
	}
	def(&c.LeaseTTL, DefaultLeaseTTL)
	def(&c.RenewEvery, c.LeaseTTL/3)
}

// Client is one process's connection to the shared Redis.
type Client struct {
	cfg Config
	rdb *redis.Client
	m   *metrics.Metrics
	log *slog.Logger
	h   *health
	b   *batcher
	l   *leases

	// mu guards closed against Admit: ops are only queued while the
	// senders run, so none is left waiting after Close.
	mu     sync.RWMutex
	closed bool
	done   chan struct{}
	wg     sync.WaitGroup

	errLog rateLog
}

// Open builds a client for cfg.URL and checks the server once with a PING:
// an unreachable Redis is not an error here (the sidecar starts degraded
// and the probe takes over), a malformed URL is.
func Open(cfg Config, clk clock.Clock, m *metrics.Metrics, log *slog.Logger) (*Client, error) {
	cfg.setDefaults()
	opt, err := redis.ParseURL(cfg.URL)
	if err != nil {
		return nil, fmt.Errorf("backend.url %q: %w", policy.RedactURL(cfg.URL), err)
	}
	opt.DialTimeout = cfg.DialTimeout
	opt.ReadTimeout = cfg.ReadTimeout
	opt.WriteTimeout = cfg.WriteTimeout
	opt.PoolTimeout = cfg.ReadTimeout
	// No client-side retries: a retry doubles the cost of an outage, and
	// the breaker plus the caller's fallback already decide what happens.
	opt.MaxRetries = -1
	opt.DialerRetries = 1
	opt.PoolSize = cfg.Senders + 8
	opt.MinIdleConns = cfg.Senders // dialled up front, not by the first batches
	opt.DisableIdentity = true
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	c := &Client{
		cfg:  cfg,
		rdb:  redis.NewClient(opt),
		m:    m,
		log:  log.With("backend", "redis", "addr", opt.Addr),
		done: make(chan struct{}),
	}
	c.h = newHealth(c, clk)
	c.b = newBatcher(c)
	c.l = newLeases()
	if err := c.ping(); err != nil {
		c.h.trip(err)
	}
	c.wg.Add(2 + cfg.Senders)
	go c.h.probeLoop()
	go c.renewer()
	for range cfg.Senders {
		go c.b.sender()
	}
	return c, nil
}

// Close stops the senders, the probe and the lease renewals; admissions
// still queued get ErrClosed, releases still queued are sent. Leases
// still held are not released: their holders may still be running, and
// the leases expire by themselves after LeaseTTL. It waits for in-flight
// batches.
func (c *Client) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	close(c.done)
	c.mu.Unlock()
	c.wg.Wait()
	c.b.drain(ErrClosed)
	if c.m != nil {
		c.m.BackendDegraded.Set(0)
	}
	return c.rdb.Close()
}

// Redis exposes the underlying go-redis client, for tests and tools.
func (c *Client) Redis() *redis.Client { return c.rdb }

// Down reports whether the breaker is open: calls would return
// ErrUnavailable without touching Redis.
func (c *Client) Down() bool { return c.h.isDown() }

// Ready returns nil while Redis answers, else why it does not and since when.
func (c *Client) Ready() error { return c.h.err() }

// Call runs f against Redis as operation op (the metric label), unless the
// backend is down. It measures f, counts its errors and opens the breaker
// on an outage-class error. f must treat redis.Nil itself.
func (c *Client) Call(op string, f func(ctx context.Context, rdb *redis.Client) error) error {
	if c.h.isDown() {
		return ErrUnavailable
	}
	c.mu.RLock()
	closed := c.closed
	c.mu.RUnlock()
	if closed {
		return ErrClosed
	}
	start := time.Now()
	err := f(context.Background(), c.rdb)
	c.observe(op, start, err)
	return err
}

// observe records a call's latency with the wall clock (a network round
// trip, not a decision: the injected clock would report a fake clock's 0)
// and classifies its error.
func (c *Client) observe(op string, start time.Time, err error) {
	if c.m != nil {
		c.m.BackendLatency.WithLabelValues(op).Observe(time.Since(start).Seconds())
	}
	if err == nil || errors.Is(err, redis.Nil) {
		c.h.success()
		return
	}
	if c.m != nil {
		c.m.BackendErrors.WithLabelValues(op).Inc()
	}
	if isOutage(err) {
		c.h.failure(err)
		return
	}
	if c.errLog.allow(time.Now()) {
		c.log.Error("shared backend call failed", "op", op, "err", err)
	}
}

// probe checks a server known down: first whether its address takes a
// connection at all, outside the client's pool, then with a PING. go-redis
// counts every dial its pool fails and, once they reach the pool's size,
// stops dialling and retries on its own once a second until one succeeds:
// a probe that pinged a refusing server every ProbeEvery tripped that
// within a couple of seconds, and a Redis that came back was then noticed
// up to a second late.
func (c *Client) probe() error {
	opt := c.rdb.Options()
	conn, err := net.DialTimeout(opt.Network, opt.Addr, c.cfg.DialTimeout)
	if err != nil {
		if c.m != nil {
			c.m.BackendErrors.WithLabelValues("ping").Inc()
		}
		return err // "dial tcp ADDR: connect: connection refused", as go-redis words it
	}
	_ = conn.Close()
	return c.ping()
}

func (c *Client) ping() error {
	ctx, cancel := context.WithTimeout(context.Background(), c.cfg.DialTimeout+c.cfg.ReadTimeout)
	defer cancel()
	start := time.Now()
	err := c.rdb.Ping(ctx).Err()
	if c.m != nil {
		c.m.BackendLatency.WithLabelValues("ping").Observe(time.Since(start).Seconds())
		if err != nil {
			c.m.BackendErrors.WithLabelValues("ping").Inc()
		}
	}
	return err
}

// rateLog lets an error that is not an outage (a script error, a wrong key
// type) be logged at most every 10 s rather than per call.
type rateLog struct {
	mu   sync.Mutex
	last time.Time
}

func (r *rateLog) allow(now time.Time) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if now.Sub(r.last) < 10*time.Second {
		return false
	}
	r.last = now
	return true
}
