package retry

import (
	"errors"
	"net/http"
	"strconv"
	"time"
)

// MaxRetryAfter bounds what ParseRetryAfter returns, so that a long wait
// cannot overflow a Duration (a policy's max_delay caps it further).
const MaxRetryAfter = 100 * 365 * 24 * time.Hour

// Asked is the wait an answer with status asked for in its Retry-After
// header value v (0: none). Only a 429 or a 503 asks: there Retry-After
// says when to come back (RFC 9110 §10.2.3); on a 3xx it is about the
// redirect, and elsewhere nothing.
func Asked(status int, v string, now time.Time) time.Duration {
	if status != http.StatusTooManyRequests && status != http.StatusServiceUnavailable {
		return 0
	}
	d, _ := ParseRetryAfter(v, now)
	return d
}

// ParseRetryAfter reads a Retry-After value (RFC 9110 §10.2.3): whole
// seconds, or an HTTP-date counted from now (one already past is 0). ok
// is false for anything else.
func ParseRetryAfter(v string, now time.Time) (d time.Duration, ok bool) {
	if v == "" {
		return 0, false
	}
	if v[0] >= '0' && v[0] <= '9' {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil && !errors.Is(err, strconv.ErrRange) {
			return 0, false
		}
		if err != nil || n > uint64(MaxRetryAfter/time.Second) {
			return MaxRetryAfter, true
		}
		return time.Duration(n) * time.Second, true
	}
	t, err := http.ParseTime(v)
	if err != nil {
		return 0, false
	}
	return min(max(t.Sub(now), 0), MaxRetryAfter), true
}
