// Package window implements warden's fixed windows: boundaries aligned to the
// sidecar's local wall clock (SPEC §4) and the counters that count starts
// within them.
package window

import (
	"time"

	"github.com/warden-dev/warden/policy"
)

// Bounds returns the start and end of the fixed window of size w that holds t,
// aligned to t's location: seconds to the second, minutes and hours to the
// local minute and hour, days to local midnight. A day window spans a local
// calendar day, so it lasts 23 or 25 hours across a DST change.
func Bounds(t time.Time, w policy.Window) (start, end time.Time) {
	switch w {
	case policy.WindowSecond:
		start = t.Truncate(time.Second)
		return start, start.Add(time.Second)
	case policy.WindowMinute, policy.WindowHour:
		// Offsets in use today are whole minutes and change only on hour
		// boundaries, so aligning the local reading with the offset in force
		// at t gives the local boundary; time.Truncate alone would align to
		// UTC and be 30 minutes off in +05:30.
		_, off := t.Zone()
		size := int64(w)
		local := t.Unix() + int64(off)
		s := local - mod(local, size)
		start = time.Unix(s-int64(off), 0).In(t.Location())
		end = time.Unix(s+size-int64(off), 0).In(t.Location())
		// Across a DST change the offset at the end can differ from the one
		// at t (fall back repeats an hour). The boundary is still the
		// instant the local clock next shows a round reading, which is
		// where the transition happens, so clamp to it.
		if _, endOff := end.Zone(); endOff != off {
			if tr := nextTransition(t, end); !tr.IsZero() {
				end = tr
			}
		}
		// Likewise a window cannot start before a transition that happened
		// since: after Lord Howe falls back half an hour the clock reads
		// 01:30, and the window runs from that instant to 02:00.
		if _, startOff := start.Zone(); startOff != off {
			if tr := nextTransition(start, t); !tr.IsZero() {
				start = tr
			}
		}
		return start, end
	case policy.WindowDay:
		y, m, d := t.Date()
		loc := t.Location()
		return time.Date(y, m, d, 0, 0, 0, 0, loc), time.Date(y, m, d+1, 0, 0, 0, 0, loc)
	}
	panic("window: unsupported window size") // policy validation admits only the four sizes
}

func mod(a, b int64) int64 {
	r := a % b
	if r < 0 {
		r += b
	}
	return r
}

// nextTransition finds the first instant in (t, limit] where the zone offset
// differs from the one at t, by bisection to the second.
func nextTransition(t, limit time.Time) time.Time {
	_, off := t.Zone()
	lo, hi := t.Unix(), limit.Unix()
	if _, o := time.Unix(hi, 0).In(t.Location()).Zone(); o == off {
		return time.Time{}
	}
	for hi-lo > 1 {
		mid := lo + (hi-lo)/2
		if _, o := time.Unix(mid, 0).In(t.Location()).Zone(); o == off {
			lo = mid
		} else {
			hi = mid
		}
	}
	return time.Unix(hi, 0).In(t.Location())
}
