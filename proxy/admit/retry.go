package admit

import (
	"context"
	"time"

	"github.com/warden-dev/warden/governor/breaker"
	"github.com/warden-dev/warden/governor/clock"
	"github.com/warden-dev/warden/governor/control"
)

// Retry is the step before retry number attempt (1-based) of a request to
// t that failed, reason describing the failure and d being the wait before
// it: a retry that could not start before ctx's deadline (the target's
// timeout) is not made; the policy's attempts, non_retryable entries and
// budget are asked; d is waited on clk unless ctx ends first (the client
// left, the timeout passed); and the breaker is passed again. again
// reports a retry to make, with its ticket, counted in
// warden_retries_total. refused names the control that stopped the
// retries when the client must be told (retry_budget); a breaker that
// opened meanwhile ends them too, and the failure stands for itself.
func Retry(ctx context.Context, t *Target, clk clock.Clock, attempt int, reason string, d time.Duration) (ticket breaker.Ticket, again bool, refused control.Name) {
	// Checked before ShouldRetry, which charges the budget with a retry
	// that must then be made.
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) <= d {
		return breaker.Ticket{}, false, ""
	}
	ok, by := t.Retry.ShouldRetry(attempt, reason)
	if !ok {
		if by == control.RetryBudget {
			return breaker.Ticket{}, false, by
		}
		return breaker.Ticket{}, false, ""
	}
	if d > 0 {
		timer := clk.NewTimer(d)
		defer timer.Stop()
		select {
		case <-timer.C():
		case <-ctx.Done():
			return breaker.Ticket{}, false, ""
		}
	}
	ticket, _, ok = t.Breaker.Allow()
	if !ok {
		return breaker.Ticket{}, false, ""
	}
	t.Stats.Retry()
	return ticket, true, ""
}
