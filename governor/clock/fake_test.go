package clock

import (
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var t0 = time.Date(2026, 3, 8, 12, 0, 0, 0, time.UTC)

// fired drains what has fired on t's channel, without waiting.
func fired(t Timer) (time.Time, bool) {
	select {
	case at := <-t.C():
		return at, true
	default:
		return time.Time{}, false
	}
}

func TestFakeTimers(t *testing.T) {
	tests := []struct {
		name    string
		arm     time.Duration
		steps   []time.Duration // Advance calls
		stop    bool            // Stop before advancing
		reset   time.Duration   // Reset to this after arming, when non-zero
		want    bool
		wantAt  time.Duration // the clock reading delivered, from t0
		wantNow time.Duration
	}{
		{name: "not yet due", arm: time.Second, steps: []time.Duration{999 * time.Millisecond}, want: false, wantNow: 999 * time.Millisecond},
		{name: "due exactly", arm: time.Second, steps: []time.Duration{time.Second}, want: true, wantAt: time.Second, wantNow: time.Second},
		{name: "overshoot reads the deadline", arm: time.Second, steps: []time.Duration{5 * time.Second}, want: true, wantAt: time.Second, wantNow: 5 * time.Second},
		{name: "in steps", arm: time.Second, steps: []time.Duration{600 * time.Millisecond, 600 * time.Millisecond}, want: true, wantAt: time.Second, wantNow: 1200 * time.Millisecond},
		{name: "stopped never fires", arm: time.Second, stop: true, steps: []time.Duration{time.Minute}, want: false, wantNow: time.Minute},
		{name: "reset later", arm: time.Second, reset: 3 * time.Second, steps: []time.Duration{2 * time.Second}, want: false, wantNow: 2 * time.Second},
		{name: "reset fires at new deadline", arm: time.Second, reset: 3 * time.Second, steps: []time.Duration{4 * time.Second}, want: true, wantAt: 3 * time.Second, wantNow: 4 * time.Second},
		{name: "zero fires at once", arm: 0, want: true, wantAt: 0, wantNow: 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := NewFake(t0)
			tm := c.NewTimer(tc.arm)
			if tc.stop && !tm.Stop() {
				t.Fatal("Stop of an armed timer reported it inactive")
			}
			if tc.reset != 0 && !tm.Reset(tc.reset) {
				t.Fatal("Reset of an armed timer reported it inactive")
			}
			for _, d := range tc.steps {
				c.Advance(d)
			}
			at, ok := fired(tm)
			if ok != tc.want {
				t.Fatalf("fired = %v, want %v", ok, tc.want)
			}
			if ok && !at.Equal(t0.Add(tc.wantAt)) {
				t.Fatalf("fired reading %v, want %v", at.Sub(t0), tc.wantAt)
			}
			if got := c.Now().Sub(t0); got != tc.wantNow {
				t.Fatalf("clock at %v, want %v", got, tc.wantNow)
			}
		})
	}
}

// Timers fire in deadline order, and an AfterFunc sees the clock at its
// own deadline even when one Advance passes several.
func TestFakeFiresInOrder(t *testing.T) {
	c := NewFake(t0)
	seen := make(chan time.Duration, 3)
	for _, d := range []time.Duration{3 * time.Second, time.Second, 2 * time.Second} {
		c.AfterFunc(d, func() { seen <- d })
	}
	if n := c.Timers(); n != 3 {
		t.Fatalf("%d timers armed, want 3", n)
	}
	c.Advance(10 * time.Second)
	got := map[time.Duration]bool{}
	for range 3 {
		got[<-seen] = true
	}
	if len(got) != 3 || c.Timers() != 0 {
		t.Fatalf("fired %v, %d still armed", got, c.Timers())
	}
	// Channel timers fire synchronously and in order.
	a, b := c.NewTimer(2*time.Second), c.NewTimer(time.Second)
	c.Advance(2 * time.Second)
	at, _ := fired(a)
	bt, _ := fired(b)
	if !bt.Before(at) {
		t.Fatalf("later deadline fired first: %v then %v", bt, at)
	}
}

// TimerArmed lets a test wait for code under test to start waiting.
func TestFakeTimerArmed(t *testing.T) {
	c := NewFake(t0)
	armed := c.TimerArmed()
	done := make(chan struct{})
	go func() {
		defer close(done)
		<-c.NewTimer(time.Minute).C()
	}()
	<-armed
	c.Advance(time.Minute)
	<-done
	c.Set(t0) // never backwards
	if !c.Now().Equal(t0.Add(time.Minute)) {
		t.Fatalf("Set moved the clock back to %v", c.Now())
	}
}

// AfterFuncAt fires at an instant, whatever the clock read when the caller
// last looked: the pool's window-boundary timer is armed by a dispatcher
// that may have read the clock before a test advanced it.
func TestAfterFuncAt(t *testing.T) {
	tests := []struct {
		name      string
		advance   time.Duration // before arming, after the caller's reading
		at        time.Duration // from t0
		then      time.Duration // Advance after arming
		wantFired bool
	}{
		{"not yet", 0, time.Minute, 59 * time.Second, false},
		{"at the instant", 0, time.Minute, time.Minute, true},
		{"clock moved between reading and arming", 30 * time.Second, time.Minute, 30 * time.Second, true},
		{"already past fires at once", 2 * time.Minute, time.Minute, 0, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			clk := NewFake(t0)
			clk.Advance(tc.advance)
			done := make(chan time.Time, 1)
			clk.AfterFuncAt(t0.Add(tc.at), func() { done <- clk.Now() })
			clk.Advance(tc.then)
			// A timer is disarmed inside Advance as it falls due; its
			// function then runs in a goroutine of its own.
			if armed := clk.Timers(); armed != map[bool]int{true: 0, false: 1}[tc.wantFired] {
				t.Fatalf("%d timers still armed with the clock at %v, want fired=%v", armed, clk.Now().Sub(t0), tc.wantFired)
			}
			if !tc.wantFired {
				return
			}
			at := <-done
			if want := t0.Add(max(tc.at, tc.advance)); at.Before(t0.Add(tc.at)) || at.After(want) {
				t.Fatalf("fired with the clock at %v, want %v", at.Sub(t0), want.Sub(t0))
			}
		})
	}
}

func TestArmedFor(t *testing.T) {
	c := NewFake(time.Unix(0, 0))
	tm := c.NewTimer(10 * time.Second)
	c.Advance(4 * time.Second)
	for _, tc := range []struct {
		d    time.Duration
		want bool
	}{{6 * time.Second, true}, {10 * time.Second, false}, {5 * time.Second, false}} {
		if got := c.ArmedFor(tc.d); got != tc.want {
			t.Errorf("ArmedFor(%v) = %v, want %v", tc.d, got, tc.want)
		}
	}
	tm.Stop()
	if c.ArmedFor(6 * time.Second) {
		t.Error("a stopped timer counts as armed")
	}
}
