package dbpool

import (
	"context"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/warden-dev/warden/governor/clock"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// upstream is a loopback server that accepts and holds connections.
type upstream struct {
	ln    net.Listener
	mu    sync.Mutex
	conns []net.Conn
	wg    sync.WaitGroup
	// arrived ticks after each accepted connection is recorded, so a test
	// can wait for the server side of a connection it just dialled.
	arrived chan struct{}
}

// nth returns the i-th accepted connection, waiting for the accept loop to
// record it: a client's dial can return before the server's Accept does.
func (u *upstream) nth(t *testing.T, i int) net.Conn {
	t.Helper()
	timeout := time.After(5 * time.Second)
	for {
		u.mu.Lock()
		if len(u.conns) > i {
			c := u.conns[i]
			u.mu.Unlock()
			return c
		}
		u.mu.Unlock()
		select {
		case <-u.arrived:
		case <-timeout:
			t.Fatalf("upstream never accepted connection %d", i)
		}
	}
}

func newUpstream(t *testing.T) *upstream {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u := &upstream{ln: ln, arrived: make(chan struct{}, 1)}
	u.wg.Add(1)
	go func() {
		defer u.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			u.mu.Lock()
			u.conns = append(u.conns, c)
			u.mu.Unlock()
			select {
			case u.arrived <- struct{}{}:
			default:
			}
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		u.wg.Wait()
		u.mu.Lock()
		for _, c := range u.conns {
			c.Close()
		}
		u.mu.Unlock()
	})
	return u
}

func newPool(t *testing.T, u *upstream, clk clock.Clock, max int) *Pool {
	t.Helper()
	p := New(Config{Name: "db", Addr: u.ln.Addr().String(), Max: max}, clk)
	t.Cleanup(p.Close)
	return p
}

// setup is a pool of max in front of a loopback server, on a fake clock.
func setup(t *testing.T, max int) (*Pool, *clock.Fake) {
	t.Helper()
	clk := clock.NewFake(time.Unix(1000, 0))
	return newPool(t, newUpstream(t), clk, max), clk
}

func mustAcquire(t *testing.T, p *Pool, key string) *Conn {
	t.Helper()
	c, _, err := p.Acquire(context.Background(), key, time.Minute, nil)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

type result struct {
	c      *Conn
	waited time.Duration
	err    error
}

// acquireAsync starts an Acquire and returns once the caller is queued.
func acquireAsync(t *testing.T, p *Pool, ctx context.Context, key string, wait time.Duration) <-chan result {
	t.Helper()
	out := make(chan result, 1)
	queued := make(chan struct{})
	go func() {
		c, w, err := p.Acquire(ctx, key, wait, func() { close(queued) })
		out <- result{c, w, err}
	}()
	select {
	case <-queued:
	case r := <-out:
		t.Fatalf("Acquire returned without waiting: %+v", r)
	case <-time.After(5 * time.Second):
		t.Fatal("Acquire never queued")
	}
	return out
}

func recv(t *testing.T, ch <-chan result) result {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(5 * time.Second):
		t.Fatal("no result")
		return result{}
	}
}

func TestCapAndFIFO(t *testing.T) {
	p, clk := setup(t, 2)
	ctx := context.Background()
	a := mustAcquire(t, p, "")
	b := mustAcquire(t, p, "")
	first := acquireAsync(t, p, ctx, "", time.Minute)
	clk.Advance(time.Second)
	second := acquireAsync(t, p, ctx, "", time.Minute)
	clk.Advance(2 * time.Second)
	st := p.Stats(clk.Now())
	if st.Live != 2 || st.Waiting != 2 || st.OldestWait != 3*time.Second {
		t.Fatalf("stats = %+v", st)
	}
	a.Close()
	r := recv(t, first)
	if r.err != nil || r.waited != 3*time.Second {
		t.Fatalf("first waiter: %+v", r)
	}
	select {
	case r := <-second:
		t.Fatalf("second waiter served before a slot freed: %+v", r)
	default:
	}
	b.Close()
	if r := recv(t, second); r.err != nil {
		t.Fatal(r.err)
	} else {
		r.c.Close()
	}
	r.c.Close()
	r.c.Close() // idempotent
	if st := p.Stats(clk.Now()); st.Live != 0 || st.Waiting != 0 {
		t.Fatalf("after all closed: %+v", st)
	}
}

func TestWaitTimeout(t *testing.T) {
	p, clk := setup(t, 1)
	a := mustAcquire(t, p, "")
	defer a.Close()
	armed := clk.TimerArmed()
	ch := acquireAsync(t, p, context.Background(), "", 5*time.Second)
	<-armed
	clk.Advance(5 * time.Second)
	r := recv(t, ch)
	var wt *WaitTimeout
	if !errors.As(r.err, &wt) || wt.Waited != 5*time.Second || wt.Max != 1 {
		t.Fatalf("err = %v", r.err)
	}
	// wait 0: refused at once.
	if _, _, err := p.Acquire(context.Background(), "", 0, nil); !errors.As(err, &wt) || wt.Waited != 0 {
		t.Fatalf("no-wait err = %v", err)
	}
	if st := p.Stats(clk.Now()); st.Waiting != 0 || st.Live != 1 {
		t.Fatalf("stats = %+v", st)
	}
}

func TestAbandonedWaitFreesTurn(t *testing.T) {
	p, _ := setup(t, 1)
	a := mustAcquire(t, p, "")
	ctx, cancel := context.WithCancelCause(context.Background())
	gone := acquireAsync(t, p, ctx, "", time.Minute)
	next := acquireAsync(t, p, context.Background(), "", time.Minute)
	cause := errors.New("client left")
	cancel(cause)
	if r := recv(t, gone); !errors.Is(r.err, cause) {
		t.Fatalf("abandoned err = %v", r.err)
	}
	a.Close()
	r := recv(t, next)
	if r.err != nil {
		t.Fatal(r.err)
	}
	r.c.Close()
}

func TestKeptConnectionsByKey(t *testing.T) {
	p, clk := setup(t, 2)
	a := mustAcquire(t, p, "alice")
	a.Payload = "login of alice"
	p.Put(a)
	if st := p.Stats(clk.Now()); st.Live != 1 || st.Kept != 1 {
		t.Fatalf("after put: %+v", st)
	}
	again := mustAcquire(t, p, "alice")
	if again != a || !again.Reused() || again.Payload != "login of alice" {
		t.Fatalf("alice was not given her kept connection back")
	}
	// Another key takes a free slot, never alice's connection.
	bob := mustAcquire(t, p, "bob")
	if bob == a || bob.Reused() {
		t.Fatal("bob got alice's connection")
	}
	p.Put(again)
	p.Put(bob)
	// Full of kept connections for others: carol evicts the least recently
	// used one (alice's) and dials.
	carol := mustAcquire(t, p, "carol")
	if carol.Reused() || carol == a || carol == bob {
		t.Fatal("carol was lent a connection kept for another login")
	}
	if st := p.Stats(clk.Now()); st.Live != 2 || st.Kept != 1 {
		t.Fatalf("after eviction: %+v", st)
	}
	carol.Close()
	// The empty key is never kept.
	anon := mustAcquire(t, p, "")
	p.Put(anon)
	if st := p.Stats(clk.Now()); st.Kept != 1 || st.Live != 1 {
		t.Fatalf("anonymous connection was kept: %+v", st)
	}
}

func TestPutServesWaiter(t *testing.T) {
	p, _ := setup(t, 1)
	ctx := context.Background()
	a := mustAcquire(t, p, "alice")
	same := acquireAsync(t, p, ctx, "alice", time.Minute)
	p.Put(a)
	r := recv(t, same)
	if r.err != nil || r.c != a || !r.c.Reused() {
		t.Fatalf("waiter with the same key: %+v", r)
	}
	other := acquireAsync(t, p, ctx, "bob", time.Minute)
	p.Put(r.c)
	r = recv(t, other)
	if r.err != nil || r.c == a || r.c.Reused() {
		t.Fatalf("waiter with another key: %+v", r)
	}
	r.c.Close()
}

func TestKeptExpiry(t *testing.T) {
	u := newUpstream(t)
	clk := clock.NewFake(time.Unix(1000, 0))
	p := New(Config{Name: "db", Addr: u.ln.Addr().String(), Max: 2, IdleTimeout: 10 * time.Second, MaxLifetime: time.Minute}, clk)
	defer p.Close()
	reaped := make(chan string, 4)
	p.OnReap = func(r string) { reaped <- r }
	a := mustAcquire(t, p, "k")
	p.Put(a)
	clk.Advance(10 * time.Second)
	if r := <-reaped; r != ReasonIdle {
		t.Fatalf("reason = %s", r)
	}
	if st := p.Stats(clk.Now()); st.Live != 0 || st.Kept != 0 {
		t.Fatalf("after idle expiry: %+v", st)
	}
	b := mustAcquire(t, p, "k")
	clk.Advance(55 * time.Second)
	p.Put(b) // 55s old: kept, but only until its lifetime ends at 60s
	clk.Advance(5 * time.Second)
	if r := <-reaped; r != ReasonMaxLifetime {
		t.Fatalf("reason = %s", r)
	}
	c := mustAcquire(t, p, "k")
	clk.Advance(time.Minute)
	p.Put(c) // already past its lifetime: closed at once
	if r := <-reaped; r != ReasonMaxLifetime {
		t.Fatalf("reason = %s", r)
	}
	if st := p.Stats(clk.Now()); st.Live != 0 {
		t.Fatalf("stats = %+v", st)
	}
}

func TestDeadKeptConnectionIsRedialed(t *testing.T) {
	u := newUpstream(t)
	p := newPool(t, u, clock.Real{}, 1)
	a := mustAcquire(t, p, "k")
	p.Put(a)
	// The server side closes the kept connection.
	u.nth(t, 0).Close()
	// Wait until the close has reached the kept socket.
	deadline := time.Now().Add(5 * time.Second)
	for alive(a.nc) && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	b := mustAcquire(t, p, "k")
	defer b.Close()
	if b.Reused() || b == a {
		t.Fatal("dead kept connection lent")
	}
}

// A kept connection the server closed is not reported, or held, as live.
func TestDeadKeptConnectionIsNotCounted(t *testing.T) {
	u := newUpstream(t)
	p := newPool(t, u, clock.Real{}, 2)
	a := mustAcquire(t, p, "k")
	b := mustAcquire(t, p, "k")
	p.Put(a)
	p.Put(b)
	if st := p.Stats(time.Now()); st.Live != 2 || st.Kept != 2 {
		t.Fatalf("before: %+v", st)
	}
	u.nth(t, 0).Close()
	deadline := time.Now().Add(5 * time.Second)
	for alive(a.nc) && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	p.DropDead()
	if st := p.Stats(time.Now()); st.Live != 1 || st.Kept != 1 {
		t.Fatalf("after the server closed one: %+v, want 1 live and kept", st)
	}
}

func TestCloseAndDrain(t *testing.T) {
	u := newUpstream(t)
	clk := clock.NewFake(time.Unix(1000, 0))
	p := New(Config{Name: "db", Addr: u.ln.Addr().String(), Max: 1}, clk)
	ctx := context.Background()
	a := mustAcquire(t, p, "k")
	waiter := acquireAsync(t, p, ctx, "k", time.Minute)
	p.Close()
	if r := recv(t, waiter); !errors.Is(r.err, ErrClosed) {
		t.Fatalf("waiter err = %v", r.err)
	}
	if _, _, err := p.Acquire(ctx, "k", time.Minute, nil); !errors.Is(err, ErrClosed) {
		t.Fatalf("acquire after close: %v", err)
	}
	p.Put(a) // a closed pool keeps nothing
	if st := p.Stats(clk.Now()); st.Live != 0 || st.Kept != 0 {
		t.Fatalf("stats = %+v", st)
	}

	d := New(Config{Name: "db", Addr: u.ln.Addr().String(), Max: 1}, clk)
	defer d.Close()
	b, _, err := d.Acquire(ctx, "k", time.Minute, nil)
	if err != nil {
		t.Fatal(err)
	}
	w := acquireAsync(t, d, ctx, "k", time.Minute)
	d.Drain()
	d.Put(b) // closed, its slot serves the waiter: a draining pool still serves
	r := recv(t, w)
	if r.err != nil || r.c.Reused() {
		t.Fatalf("draining waiter: %+v", r)
	}
	r.c.Close()
}

func TestReconfigure(t *testing.T) {
	p, _ := setup(t, 1)
	ctx := context.Background()
	a := mustAcquire(t, p, "")
	w := acquireAsync(t, p, ctx, "", time.Minute)
	p.Reconfigure(Config{Name: "db", Addr: p.cfg.Addr, Max: 2})
	r := recv(t, w)
	if r.err != nil {
		t.Fatal(r.err)
	}
	// Down to 1 with 2 in use: nobody is cut, nobody new admitted.
	p.Reconfigure(Config{Name: "db", Addr: p.cfg.Addr, Max: 1})
	w2 := acquireAsync(t, p, ctx, "", time.Minute)
	a.Close()
	select {
	case r := <-w2:
		t.Fatalf("admitted over the new max: %+v", r)
	default:
	}
	r.c.Close()
	r2 := recv(t, w2)
	if r2.err != nil {
		t.Fatal(r2.err)
	}
	r2.c.Close()
}

func TestDialError(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	p := New(Config{Name: "db", Addr: addr, Max: 1}, clock.Real{})
	defer p.Close()
	_, _, err = p.Acquire(context.Background(), "", time.Second, nil)
	var de *DialError
	if !errors.As(err, &de) {
		t.Fatalf("err = %v", err)
	}
	if st := p.Stats(time.Now()); st.Live != 0 {
		t.Fatalf("failed dial kept its slot: %+v", st)
	}
}
