package clock

import (
	"sort"
	"sync"
	"time"
)

// Fake is a clock that moves only when Advance or Set is called. Timers whose
// deadline is reached fire synchronously inside Advance (channel timers) or in
// a new goroutine (AfterFunc), in deadline order.
type Fake struct {
	mu     sync.Mutex
	now    time.Time
	timers []*fakeTimer
	seq    uint64
	// waiters are notified whenever a timer is created so tests can wait for
	// code under test to arm its timer instead of sleeping.
	waiters []chan struct{}
}

// NewFake returns a fake clock reading t.
func NewFake(t time.Time) *Fake { return &Fake{now: t} }

// Now returns the fake time.
func (f *Fake) Now() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.now
}

// NewTimer returns a timer on the fake clock.
func (f *Fake) NewTimer(d time.Duration) Timer {
	return f.add(d, nil)
}

// AfterFunc runs fn in a goroutine once the fake clock reaches now+d.
func (f *Fake) AfterFunc(d time.Duration, fn func()) Timer {
	return f.add(d, fn)
}

// AfterFuncAt runs fn in a goroutine once the fake clock reaches at. The
// deadline is taken under the clock's lock: an Advance racing with the
// arming cannot push it a step later.
func (f *Fake) AfterFuncAt(at time.Time, fn func()) Timer {
	return f.addAt(func(time.Time) time.Time { return at }, fn)
}

func (f *Fake) add(d time.Duration, fn func()) *fakeTimer {
	return f.addAt(func(now time.Time) time.Time { return now.Add(d) }, fn)
}

// addAt arms a timer for when(now), now read under the lock.
func (f *Fake) addAt(when func(now time.Time) time.Time, fn func()) *fakeTimer {
	f.mu.Lock()
	t := &fakeTimer{clock: f, fn: fn, ch: make(chan time.Time, 1)}
	f.seq++
	t.seq = f.seq
	t.when = when(f.now)
	due := !t.when.After(f.now)
	t.active = true
	t.listed = true
	f.timers = append(f.timers, t)
	waiters := f.waiters
	f.waiters = nil
	f.mu.Unlock()
	for _, w := range waiters {
		close(w)
	}
	if due {
		f.Advance(0)
	}
	return t
}

// Timers reports how many timers are armed.
func (f *Fake) Timers() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, t := range f.timers {
		if t.active {
			n++
		}
	}
	return n
}

// ArmedFor reports whether a timer is armed to fire exactly d from now: a
// test can tell the timer it waits for from others armed meanwhile.
func (f *Fake) ArmedFor(d time.Duration) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	at := f.now.Add(d)
	for _, t := range f.timers {
		if t.active && t.when.Equal(at) {
			return true
		}
	}
	return false
}

// TimerArmed returns a channel closed the next time any timer is armed or
// re-armed, so a test can wait for the code under test to start waiting.
func (f *Fake) TimerArmed() <-chan struct{} {
	f.mu.Lock()
	defer f.mu.Unlock()
	ch := make(chan struct{})
	f.waiters = append(f.waiters, ch)
	return ch
}

// Advance moves the clock forward by d, firing every timer that falls due.
func (f *Fake) Advance(d time.Duration) {
	f.mu.Lock()
	target := f.now.Add(d)
	f.mu.Unlock()
	f.Set(target)
}

// Set moves the clock to t (never backwards), firing timers that fall due in
// deadline order with the clock reading each timer's deadline as it fires.
func (f *Fake) Set(t time.Time) {
	for {
		f.mu.Lock()
		due := f.nextDue(t)
		if due == nil {
			if t.After(f.now) {
				f.now = t
			}
			f.mu.Unlock()
			return
		}
		if due.when.After(f.now) {
			f.now = due.when
		}
		due.active = false
		now := f.now
		f.mu.Unlock()
		if due.fn != nil {
			go due.fn()
		} else {
			select {
			case due.ch <- now:
			default:
			}
		}
	}
}

func (f *Fake) nextDue(limit time.Time) *fakeTimer {
	active := f.timers[:0]
	for _, t := range f.timers {
		if t.active {
			active = append(active, t)
		} else {
			t.listed = false
		}
	}
	f.timers = active
	sort.Slice(f.timers, func(i, j int) bool {
		if f.timers[i].when.Equal(f.timers[j].when) {
			return f.timers[i].seq < f.timers[j].seq
		}
		return f.timers[i].when.Before(f.timers[j].when)
	})
	if len(f.timers) == 0 || f.timers[0].when.After(limit) {
		return nil
	}
	return f.timers[0]
}

type fakeTimer struct {
	clock  *Fake
	when   time.Time
	seq    uint64
	fn     func()
	ch     chan time.Time
	active bool
	listed bool // present in clock.timers
}

func (t *fakeTimer) C() <-chan time.Time { return t.ch }

func (t *fakeTimer) Stop() bool {
	t.clock.mu.Lock()
	defer t.clock.mu.Unlock()
	was := t.active
	t.active = false
	return was
}

func (t *fakeTimer) Reset(d time.Duration) bool {
	f := t.clock
	f.mu.Lock()
	was := t.active
	t.when = f.now.Add(d)
	f.seq++
	t.seq = f.seq
	t.active = true
	if !t.listed {
		t.listed = true
		f.timers = append(f.timers, t)
	}
	waiters := f.waiters
	f.waiters = nil
	f.mu.Unlock()
	for _, w := range waiters {
		close(w)
	}
	if d <= 0 {
		f.Advance(0)
	}
	return was
}
