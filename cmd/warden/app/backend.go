package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/warden-dev/warden/governor"
	"github.com/warden-dev/warden/governor/backend/redisx"
	"github.com/warden-dev/warden/governor/clock"
	"github.com/warden-dev/warden/governor/metrics"
	"github.com/warden-dev/warden/governor/window"
	"github.com/warden-dev/warden/policy"
)

// backend owns the window counter every control shares (policy `backend`):
// in-process memory, or Redis shared by every sidecar on it. It is a
// component so that reloads reach it, readiness reports it and shutdown
// closes it last.
//
// Reload: with kind redis, a changed url or on_error rebuilds the Redis
// client (windows continue from what that Redis holds; a new, empty Redis
// restarts them), and kind memory switches the counter to its local
// windows. A process started with kind memory cannot switch to redis
// without a restart: its controls were built on the in-process counter.
type backend struct {
	log     *slog.Logger
	prefix  string
	timeout time.Duration
	mem     *window.Memory // kind memory at start
	red     *window.Redis  // kind redis at start

	mu  sync.Mutex
	cur policy.Backend
}

func newBackend(b policy.Backend, prefix string, timeout time.Duration, clk clock.Clock, m *metrics.Metrics, log *slog.Logger) (*backend, error) {
	be := &backend{log: log, prefix: prefix, timeout: timeout, cur: b}
	if b.Kind != "redis" {
		be.mem = window.NewMemory(clk)
		return be, nil
	}
	r, err := window.NewRedis(be.redisConfig(b), clk, m, log)
	if err != nil {
		return nil, fmt.Errorf("backend: %w", err)
	}
	be.red = r
	return be, nil
}

func (b *backend) redisConfig(p policy.Backend) window.RedisConfig {
	return window.RedisConfig{
		Config: redisx.Config{URL: p.URL, FailClosed: p.OnError == "fail_closed",
			DialTimeout: b.timeout, ReadTimeout: b.timeout, WriteTimeout: b.timeout},
		Prefix: b.prefix,
	}
}

// Counter is the counter handed to the governor.
func (b *backend) Counter() window.Counter {
	if b.red != nil {
		return b.red
	}
	return b.mem
}

// Sweep drops expired in-process windows.
func (b *backend) Sweep() int {
	if b.red != nil {
		return b.red.Sweep()
	}
	return b.mem.Sweep()
}

func (b *backend) Name() string { return "backend" }

func (b *backend) Apply(_ context.Context, c *governor.Controls) error {
	next := c.Policy.Backend
	b.mu.Lock()
	defer b.mu.Unlock()
	if next == b.cur {
		return nil
	}
	if b.red == nil {
		if next.Kind == "redis" {
			return errors.New("kind changed from memory to redis: restart warden to share windows through Redis (windows stay in memory until then)")
		}
		b.cur = next
		return nil
	}
	if next.Kind != "redis" {
		b.log.Warn("backend.kind changed to memory: windows are now per sidecar", "previous", policy.RedactURL(b.cur.URL))
		b.cur = next
		return b.red.Reconfigure(nil)
	}
	cfg := b.redisConfig(next)
	if err := b.red.Reconfigure(&cfg); err != nil {
		return err // the app names the component; this names backend.url
	}
	b.log.Info("backend reconfigured", "url", policy.RedactURL(next.URL), "on_error", next.OnError)
	b.cur = next
	return nil
}

func (b *backend) Shutdown(context.Context) error {
	if b.red != nil {
		return b.red.Close()
	}
	return nil
}

// Ready fails while the backend is down with on_error fail_closed: every
// limited request is being refused, so the sidecar should not get traffic.
func (b *backend) Ready() error {
	if b.red != nil {
		return b.red.Ready()
	}
	return nil
}

// Degraded reports a fail_open outage: the sidecar serves, on local
// windows. /readyz lists it without failing.
func (b *backend) Degraded() error {
	if b.red != nil {
		return b.red.Degraded()
	}
	return nil
}
