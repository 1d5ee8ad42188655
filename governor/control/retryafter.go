package control

import "time"

// RetryAfterSeconds turns a wait into the whole seconds of a Retry-After
// header or retryAfterSeconds field: rounded up, at least 1, because "0"
// would invite an immediate retry into the refusal (an open breaker, a
// window that has not ended).
func RetryAfterSeconds(d time.Duration) int64 {
	return max(int64((d+time.Second-1)/time.Second), 1)
}
