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
