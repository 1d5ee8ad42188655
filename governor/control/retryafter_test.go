package control

import (
	"testing"
	"time"
)

func TestRetryAfterSeconds(t *testing.T) {
	for _, tc := range []struct {
		d    time.Duration
		want int64
	}{
		{0, 1}, {time.Nanosecond, 1}, {999 * time.Millisecond, 1}, {time.Second, 1},
		{time.Second + 1, 2}, {5 * time.Second, 5}, {59500 * time.Millisecond, 60},
		{-time.Second, 1}, // a window already over: retry at once, but not "0"
	} {
		if got := RetryAfterSeconds(tc.d); got != tc.want {
			t.Errorf("RetryAfterSeconds(%v) = %d, want %d", tc.d, got, tc.want)
		}
	}
}
