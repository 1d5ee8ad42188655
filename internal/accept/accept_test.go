package accept

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/goleak"

	"github.com/warden-dev/warden/governor/clock"
	"github.com/warden-dev/warden/internal/testkit/fasttest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// scripted is a listener whose Accept answers from a script: an error, or
// a connection. With the script empty it blocks until Close, or answers a
// timeout once its deadline is set, as a TCP listener with nothing
// pending would.
type scripted struct {
	mu       sync.Mutex
	script   []error // nil entries are connections
	deadline bool
	next     chan struct{} // a step was added, or the listener closed
	closed   bool
}

func newScripted(script ...error) *scripted {
	return &scripted{script: script, next: make(chan struct{}, 1)}
}

var errEMFILE = &net.OpError{Op: "accept", Net: "tcp", Err: os.NewSyscallError("accept4", syscall.EMFILE)}

func (s *scripted) Accept() (net.Conn, error) {
	for {
		s.mu.Lock()
		switch {
		case s.closed:
			s.mu.Unlock()
			return nil, &net.OpError{Op: "accept", Net: "tcp", Err: net.ErrClosed}
		case len(s.script) > 0:
			step := s.script[0]
			s.script = s.script[1:]
			s.mu.Unlock()
			if step != nil {
				return nil, step
			}
			a, b := net.Pipe()
			b.Close()
			return a, nil
		case s.deadline:
			s.mu.Unlock()
			return nil, &net.OpError{Op: "accept", Net: "tcp", Err: os.ErrDeadlineExceeded}
		}
		s.mu.Unlock()
		<-s.next
	}
}

func (s *scripted) wake() {
	select {
	case s.next <- struct{}{}:
	default:
	}
}

func (s *scripted) SetDeadline(t time.Time) error {
	s.mu.Lock()
	s.deadline = !t.IsZero()
	s.mu.Unlock()
	return nil
}

func (s *scripted) Close() error {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.wake()
	return nil
}

func (s *scripted) Addr() net.Addr { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 1} }

// noDeadline hides SetDeadline: a listener Accept cannot probe.
type noDeadline struct{ net.Listener }

func counter() prometheus.Counter { return prometheus.NewCounter(prometheus.CounterOpts{Name: "x"}) }

func value(c prometheus.Counter) float64 {
	var m dto.Metric
	_ = c.Write(&m)
	return m.GetCounter().GetValue()
}

type accepted struct {
	c   net.Conn
	err error
}

func acceptAsync(l *Listener) <-chan accepted {
	ch := make(chan accepted, 1)
	go func() {
		c, err := l.Accept()
		ch <- accepted{c, err}
	}()
	return ch
}

// TestTemporaryErrorsAreRetried: a burst of EMFILE never reaches the
// caller; each is counted, Err reports the burst while it lasts, the
// backoff doubles from 5 ms, and a connection ends the burst.
func TestTemporaryErrorsAreRetried(t *testing.T) {
	clk := clock.NewFake(time.Unix(1_700_000_000, 0))
	ln := newScripted(errEMFILE, errEMFILE, errEMFILE, nil)
	errs := counter()
	l := New(noDeadline{ln}, Options{Name: "test", Clock: clk, Errors: errs})
	defer l.Close()
	got := acceptAsync(l)
	for _, d := range []time.Duration{5 * time.Millisecond, 10 * time.Millisecond, 20 * time.Millisecond} {
		fasttest.WaitFor(t, fmt.Sprintf("a %v backoff", d), func() bool { return clk.ArmedFor(d) })
		if err := l.Err(); err == nil || err.Error() != "accept4: too many open files" {
			t.Fatalf("Err during the burst = %v, want the system call's error", err)
		}
		clk.Advance(d)
	}
	r := fasttest.Within(t, got, "Accept")
	if r.err != nil {
		t.Fatalf("Accept = %v, want the connection after the burst", r.err)
	}
	r.c.Close()
	if n := value(errs); n != 3 {
		t.Fatalf("%v errors counted, want 3", n)
	}
	if err := l.Err(); err != nil {
		t.Fatalf("Err after the burst = %v", err)
	}
}

// TestBurstEndsWithoutAClient: once the socket answers with nothing to
// accept (its deadline passes), the burst is over, though no client came.
func TestBurstEndsWithoutAClient(t *testing.T) {
	errs := counter()
	l := New(newScripted(errEMFILE), Options{Name: "test", Errors: errs})
	got := acceptAsync(l)
	fasttest.WaitFor(t, "the burst to end with no client", func() bool { return l.Err() == nil && value(errs) > 0 })
	l.Close()
	if r := fasttest.Within(t, got, "Accept after Close"); !errors.Is(r.err, net.ErrClosed) {
		t.Fatalf("Accept after Close = %v", r.err)
	}
}

func TestErrorsReturned(t *testing.T) {
	boom := errors.New("boom")
	tests := []struct {
		name string
		err  error
		want error
	}{
		{"not temporary", boom, boom},
		{"closed", &net.OpError{Op: "accept", Err: net.ErrClosed}, net.ErrClosed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := New(newScripted(tt.err), Options{})
			defer l.Close()
			if _, err := l.Accept(); !errors.Is(err, tt.want) {
				t.Fatalf("Accept = %v, want %v", err, tt.want)
			}
		})
	}
}

// TestCloseEndsTheBackoff: Close during a backoff returns Accept at once.
func TestCloseEndsTheBackoff(t *testing.T) {
	clk := clock.NewFake(time.Unix(1_700_000_000, 0))
	l := New(newScripted(errEMFILE), Options{Clock: clk})
	got := acceptAsync(l)
	fasttest.WaitFor(t, "the backoff", func() bool { return clk.ArmedFor(5 * time.Millisecond) })
	l.Close()
	if r := fasttest.Within(t, got, "Accept after Close"); !errors.Is(r.err, net.ErrClosed) {
		t.Fatalf("Accept = %v, want the closed socket's error", r.err)
	}
	if !l.Closed() {
		t.Fatal("Closed is false after Close")
	}
}

func TestTemporary(t *testing.T) {
	op := func(err error) error {
		return &net.OpError{Op: "accept", Net: "tcp", Err: os.NewSyscallError("accept4", err)}
	}
	tests := []struct {
		err  error
		want bool
	}{
		{op(syscall.EMFILE), true},
		{op(syscall.ENFILE), true},
		{op(syscall.ENOBUFS), true},
		{op(syscall.ENOMEM), true},
		{op(syscall.ECONNABORTED), true},
		{op(syscall.EINVAL), false},
		{&net.OpError{Op: "accept", Err: net.ErrClosed}, false},
		{errors.New("boom"), false},
	}
	for _, tt := range tests {
		if got := Temporary(tt.err); got != tt.want {
			t.Errorf("Temporary(%v) = %v, want %v", tt.err, got, tt.want)
		}
	}
}

func TestBackoff(t *testing.T) {
	var got []string
	d := time.Duration(0)
	for range 10 {
		d = Backoff(d)
		got = append(got, d.String())
	}
	want := "5ms 10ms 20ms 40ms 80ms 160ms 320ms 640ms 1s 1s"
	if strings.Join(got, " ") != want {
		t.Fatalf("backoffs %v, want %s", got, want)
	}
}
