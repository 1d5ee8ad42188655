// Package clock lets time-dependent code run on the real clock in production
// and on a manually advanced clock in tests.
package clock

import "time"

// Clock is the source of time for every control in warden.
type Clock interface {
	Now() time.Time
	// NewTimer returns a timer that fires once after d.
	NewTimer(d time.Duration) Timer
	// AfterFunc calls f in its own goroutine after d.
	AfterFunc(d time.Duration, f func()) Timer
	// AfterFuncAt calls f in its own goroutine once the clock reads at (at
	// once if it already does). A deadline that is an instant, such as a
	// window's end, is armed with this rather than with AfterFunc and a
	// duration from an earlier reading: time passing between the reading
	// and the arming would make the timer fire that much late (on a fake
	// clock a test advances meanwhile, a whole step late).
	AfterFuncAt(at time.Time, f func()) Timer
}

// Timer is the subset of *time.Timer that warden uses.
type Timer interface {
	C() <-chan time.Time
	Stop() bool
	Reset(d time.Duration) bool
}

// Real is the wall clock.
type Real struct{}

// Now returns time.Now().
func (Real) Now() time.Time { return time.Now() }

// NewTimer wraps time.NewTimer.
func (Real) NewTimer(d time.Duration) Timer { return realTimer{time.NewTimer(d)} }

// AfterFunc wraps time.AfterFunc.
func (Real) AfterFunc(d time.Duration, f func()) Timer { return realTimer{time.AfterFunc(d, f)} }

// AfterFuncAt is time.AfterFunc until at.
func (Real) AfterFuncAt(at time.Time, f func()) Timer {
	return realTimer{time.AfterFunc(time.Until(at), f)}
}

type realTimer struct{ t *time.Timer }

func (r realTimer) C() <-chan time.Time        { return r.t.C }
func (r realTimer) Stop() bool                 { return r.t.Stop() }
func (r realTimer) Reset(d time.Duration) bool { return r.t.Reset(d) }
