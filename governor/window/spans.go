package window

import (
	"sync/atomic"
	"time"

	"github.com/warden-dev/warden/policy"
)

// span is a window, in unix nanoseconds, with its end in seconds.
type span struct{ start, end, endSec int64 }

// spans caches the current window per size, so that a decision does not
// redo calendar arithmetic; indexed by sizeIndex. Every counter keeps one.
type spans struct {
	bounds [4]atomic.Pointer[span]
}

// current returns the window of size w holding now.
func (c *spans) current(w policy.Window, now time.Time) *span {
	n := now.UnixNano()
	p := &c.bounds[sizeIndex(w)]
	if sp := p.Load(); sp != nil && n >= sp.start && n < sp.end {
		return sp
	}
	s, e := Bounds(now, w)
	sp := &span{start: s.UnixNano(), end: e.UnixNano(), endSec: e.Unix()}
	p.Store(sp)
	return sp
}

func sizeIndex(w policy.Window) int {
	switch w {
	case policy.WindowSecond:
		return 0
	case policy.WindowMinute:
		return 1
	case policy.WindowHour:
		return 2
	default:
		return 3
	}
}
