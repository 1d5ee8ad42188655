package redisx

import (
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/warden-dev/warden/governor/clock"
)

// health is the breaker around Redis itself: closed (up) until calls fail
// with outage-class errors, then open (down) — every call returns
// ErrUnavailable at once, so an outage does not add a timeout to each
// decision — until a background PING succeeds. A refused connection opens
// it at once (nothing listens); other failures (timeouts, resets) open it
// after tripAfter in a row, so that one stalled batch — a Redis fork, a
// descheduled process — does not send every decision to the fallback. The
// probe closes it within ProbeEvery of Redis coming back.
type health struct {
	c     *Client
	clk   clock.Clock
	down  atomic.Bool
	fails atomic.Int32 // outage-class failures in a row
	wake  chan struct{}

	mu      sync.Mutex
	since   time.Time
	cause   error
	changed chan struct{} // closed and replaced on every transition
}

func newHealth(c *Client, clk clock.Clock) *health {
	return &health{c: c, clk: clk, wake: make(chan struct{}, 1), changed: make(chan struct{})}
}

func (h *health) isDown() bool { return h.down.Load() }

func (h *health) err() error {
	if !h.down.Load() {
		return nil
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.down.Load() {
		return nil
	}
	return fmt.Errorf("redis unreachable since %s: %w", h.since.UTC().Format(time.RFC3339), h.cause)
}

// tripAfter is how many failures in a row (other than a refused
// connection) open the breaker.
const tripAfter = 3

// failure records an outage-class error.
func (h *health) failure(err error) {
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" || h.fails.Add(1) >= tripAfter {
		h.trip(err)
	}
}

// success records a call that Redis answered.
func (h *health) success() {
	if h.fails.Load() != 0 {
		h.fails.Store(0)
	}
}

// trip opens the breaker; only the first failure of an outage is logged.
func (h *health) trip(cause error) {
	h.mu.Lock()
	if h.down.Load() {
		h.mu.Unlock()
		return
	}
	h.down.Store(true)
	h.fails.Store(0)
	h.since, h.cause = h.clk.Now(), cause
	if h.c.m != nil {
		h.c.m.BackendDegraded.Set(1)
	}
	h.notifyLocked()
	h.mu.Unlock()
	if h.c.cfg.FailClosed {
		h.c.log.Error("shared backend unreachable: refusing decisions with control upstream until it answers (on_error: fail_closed)", "err", cause)
	} else {
		h.c.log.Warn("shared backend unreachable: local windows in force until it answers (on_error: fail_open)", "err", cause)
	}
	select {
	case h.wake <- struct{}{}:
	default:
	}
}

// stillDown records why a probe failed: /readyz names the outage's current
// cause, not the first one (Redis back, but with a password warden lacks).
// A new cause is logged once.
func (h *health) stillDown(err error) {
	h.mu.Lock()
	changed := h.down.Load() && (h.cause == nil || h.cause.Error() != err.Error())
	if changed {
		h.cause = err
	}
	h.mu.Unlock()
	if changed {
		h.c.log.Warn("shared backend still unreachable, now for another reason", "err", err)
	}
}

func (h *health) recovered() {
	h.mu.Lock()
	outage := h.clk.Now().Sub(h.since)
	h.down.Store(false)
	h.cause = nil
	if h.c.m != nil {
		h.c.m.BackendDegraded.Set(0)
	}
	h.notifyLocked()
	h.mu.Unlock()
	h.c.log.Info("shared backend reachable again: shared windows in force", "outage", outage.Round(time.Millisecond))
}

func (h *health) notifyLocked() {
	close(h.changed)
	h.changed = make(chan struct{})
}

// Changed returns a channel closed at the next up/down transition, so tests
// and callers can wait on the event rather than poll.
func (c *Client) Changed() <-chan struct{} {
	c.h.mu.Lock()
	defer c.h.mu.Unlock()
	return c.h.changed
}

// probeLoop sleeps until the breaker opens, then pings every ProbeEvery
// until Redis answers.
func (h *health) probeLoop() {
	defer h.c.wg.Done()
	for {
		select {
		case <-h.wake:
		case <-h.c.done:
			return
		}
		t := h.clk.NewTimer(h.c.cfg.ProbeEvery)
		for h.down.Load() {
			select {
			case <-t.C():
			case <-h.c.done:
				t.Stop()
				return
			}
			err := h.c.probe()
			if err == nil {
				h.recovered()
				break
			}
			h.stillDown(err)
			t.Reset(h.c.cfg.ProbeEvery)
		}
		t.Stop()
	}
}

// isOutage tells a backend that cannot serve (network errors, timeouts, a
// loading or read-only server) from a call that failed on its own (a script
// error, a key of the wrong type): only the first kind opens the breaker.
func isOutage(err error) bool {
	if err == nil || errors.Is(err, redis.Nil) || errors.Is(err, redis.ErrClosed) {
		return false
	}
	var rerr redis.Error
	if errors.As(err, &rerr) {
		var nerr net.Error
		if errors.As(err, &nerr) {
			return true
		}
		msg := rerr.Error()
		// A server refusing this client (a password set or changed while
		// warden runs, an ACL that no longer allows the scripts) can no
		// more decide than one that is down, and says so to every call.
		for _, p := range []string{"LOADING", "READONLY", "MASTERDOWN", "BUSY", "CLUSTERDOWN", "TRYAGAIN", "NOREPLICAS", "MISCONF",
			"NOAUTH", "WRONGPASS", "NOPERM", "ERR Protocol error"} {
			if strings.HasPrefix(msg, p) {
				return true
			}
		}
		return false
	}
	return true
}
