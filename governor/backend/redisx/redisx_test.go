package redisx

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/warden-dev/warden/governor/clock"
	"github.com/warden-dev/warden/governor/metrics"
	"github.com/warden-dev/warden/internal/testkit/loopback"
	"github.com/warden-dev/warden/internal/testkit/redistest"
	"github.com/warden-dev/warden/internal/testkit/testenv"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func open(t *testing.T, url string, m *metrics.Metrics) *Client {
	t.Helper()
	c, err := Open(Config{URL: url}, clock.Real{}, m, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func calls(t *testing.T, m *metrics.Metrics, op string) uint64 {
	t.Helper()
	var pb dto.Metric
	if err := m.BackendLatency.WithLabelValues(op).(prometheus.Metric).Write(&pb); err != nil {
		t.Fatal(err)
	}
	return pb.GetHistogram().GetSampleCount()
}

type gate struct {
	key          string
	limit, n     int64
	wantOK       bool
	wantValue    int64
	wantStored   int64 // the key's value in Redis afterwards; -1: absent
	wantExpiring bool
}

// The admit script, one batch at a time: gates are read first and
// committed only when all admit.
func TestAdmitScript(t *testing.T) {
	url := testenv.RedisURL(t)
	m := metrics.New()
	c := open(t, url, m)
	rdb := redistest.Client(t, url)
	ctx := context.Background()
	tests := []struct {
		name      string
		preset    map[string]int64
		checkOnly bool
		gates     []gate
	}{
		{"a new window is created with its expiry", nil, false, []gate{
			{key: "a", limit: 5, n: 2, wantOK: true, wantValue: 2, wantStored: 2, wantExpiring: true},
		}},
		{"an existing window is incremented", map[string]int64{"a": 3}, false, []gate{
			{key: "a", limit: 5, n: 2, wantOK: true, wantValue: 5, wantStored: 5},
		}},
		{"a full window refuses and is not incremented", map[string]int64{"a": 5}, false, []gate{
			{key: "a", limit: 5, n: 1, wantOK: false, wantValue: 5, wantStored: 5},
		}},
		{"one refusing gate refuses all", map[string]int64{"b": 1}, false, []gate{
			{key: "a", limit: 5, n: 1, wantOK: true, wantValue: 0, wantStored: -1},
			{key: "b", limit: 1, n: 1, wantOK: false, wantValue: 1, wantStored: 1},
		}},
		{"all admitting gates commit together", map[string]int64{"b": 1}, false, []gate{
			{key: "a", limit: 5, n: 1, wantOK: true, wantValue: 1, wantStored: 1, wantExpiring: true},
			{key: "b", limit: 2, n: 1, wantOK: true, wantValue: 2, wantStored: 2},
		}},
		{"check only never commits", nil, true, []gate{
			{key: "a", limit: 5, n: 1, wantOK: true, wantValue: 0, wantStored: -1},
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			prefix := redistest.Prefix(t, url)
			for k, v := range tc.preset {
				rdb.Set(ctx, prefix+k, v, time.Minute)
			}
			op := GetOp()
			defer PutOp(op)
			for _, g := range tc.gates {
				op.AddWindow(prefix+g.key, prefix+"idx", g.key, g.limit, g.n, 0, 30*time.Second)
			}
			if tc.checkOnly {
				op.CheckOnly()
			}
			if err := c.Admit(op); err != nil {
				t.Fatal(err)
			}
			all := true
			for i, g := range tc.gates {
				v, ok := op.Result(i)
				all = all && ok
				if ok != g.wantOK || v != g.wantValue {
					t.Errorf("gate %s: ok=%v value=%d, want %v %d", g.key, ok, v, g.wantOK, g.wantValue)
				}
				stored, err := rdb.Get(ctx, prefix+g.key).Int64()
				if errors.Is(err, redis.Nil) {
					stored = -1
				}
				if stored != g.wantStored {
					t.Errorf("gate %s: stored %d, want %d", g.key, stored, g.wantStored)
				}
				if g.wantExpiring {
					if ttl := rdb.PTTL(ctx, prefix+g.key).Val(); ttl <= 25*time.Second || ttl > 30*time.Second {
						t.Errorf("gate %s: PTTL %v, want the 30s it was created with", g.key, ttl)
					}
					if !rdb.SIsMember(ctx, prefix+"idx", g.key).Val() || rdb.PTTL(ctx, prefix+"idx").Val() <= 0 {
						t.Errorf("gate %s: not listed in an expiring index", g.key)
					}
				}
			}
			if op.Admitted() != all {
				t.Errorf("Admitted() = %v with per-gate oks all=%v", op.Admitted(), all)
			}
		})
	}
}

// One batch is one script call, whatever it carries, and each op gets its
// own results back; ops of a batch run in order, so two ops on one key see
// each other.
func TestBatchIsOneCall(t *testing.T) {
	url := testenv.RedisURL(t)
	m := metrics.New()
	c := open(t, url, m)
	prefix := redistest.Prefix(t, url)
	var batch []*Op
	for i := range 5 {
		op := GetOp()
		op.AddWindow(prefix+"k", prefix+"idx", "k", 3, 1, 0, time.Minute)
		if i == 2 {
			op.AddWindow(prefix+"other", prefix+"idx", "other", 10, 4, 0, time.Minute)
		}
		batch = append(batch, op)
	}
	before := calls(t, m, "admit")
	c.b.send(batch, nil)
	if got := calls(t, m, "admit") - before; got != 1 {
		t.Fatalf("%d script calls for one batch", got)
	}
	want := []struct {
		ok    bool
		value int64
	}{{true, 1}, {true, 2}, {true, 3}, {false, 3}, {false, 3}}
	for i, op := range batch {
		<-op.done
		if op.err != nil {
			t.Fatal(op.err)
		}
		if v, ok := op.Result(0); ok != want[i].ok || v != want[i].value {
			t.Errorf("op %d: ok=%v value=%d, want %+v", i, ok, v, want[i])
		}
		PutOp(op)
	}
}

// A server that accepts connections and never answers: the client finds
// it unusable within its timeouts, then answers every admission at once
// without calling it.
func TestHangingServerOpensTheBreaker(t *testing.T) {
	addr := loopback.Serve(t, func(c net.Conn) { _, _ = io.Copy(io.Discard, c) })
	m := metrics.New()
	c := open(t, "redis://"+addr+"/0", m)
	if !c.Down() || c.Ready() == nil {
		t.Fatal("a server that never answers is not reported down")
	}
	for range 100 {
		op := GetOp()
		op.AddWindow("k", "idx", "k", 1, 1, 0, time.Minute)
		if err := c.Admit(op); !errors.Is(err, ErrUnavailable) {
			t.Fatalf("admit while down: %v", err)
		}
		PutOp(op)
	}
	if n := calls(t, m, "admit"); n != 0 {
		t.Fatalf("%d admit calls reached a server known down", n)
	}
	c.Close() // before the listener, so no connection outlives the test
}

func TestClosedClientRefuses(t *testing.T) {
	c := open(t, testenv.RedisURL(t), nil)
	c.Close()
	op := GetOp()
	defer PutOp(op)
	op.AddWindow("k", "idx", "k", 1, 1, 0, time.Minute)
	if err := c.Admit(op); !errors.Is(err, ErrClosed) {
		t.Fatalf("admit after close: %v", err)
	}
	if err := c.Call("peek", func(context.Context, *redis.Client) error { return nil }); !errors.Is(err, ErrClosed) {
		t.Fatalf("call after close: %v", err)
	}
}

func TestIsOutage(t *testing.T) {
	_, dialErr := net.Dial("tcp", "127.0.0.1:1")
	tests := []struct {
		err  error
		want bool
	}{
		{nil, false},
		{redis.Nil, false},
		{redis.ErrClosed, false},
		{dialErr, true},
		{context.DeadlineExceeded, true},
		{io.EOF, true},
		{proto("LOADING Redis is loading the dataset in memory"), true},
		{proto("READONLY You can't write against a read only replica."), true},
		{proto("NOAUTH Authentication required."), true},
		{proto("WRONGPASS invalid username-password pair or user is disabled."), true},
		{proto("NOPERM User default has no permissions to run the 'evalsha' command"), true},
		{proto("ERR Protocol error: unauthenticated multibulk length"), true},
		{proto("ERR Error running script: wrong number of arguments"), false},
		{proto("WRONGTYPE Operation against a key holding the wrong kind of value"), false},
	}
	for _, tc := range tests {
		if got := isOutage(tc.err); got != tc.want {
			t.Errorf("isOutage(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

// proto is a server error reply as go-redis returns it.
type proto string

func (p proto) Error() string { return string(p) }
func (proto) RedisError()     {}

// The breaker opens at once on a refused connection, after tripAfter
// failures in a row otherwise; an answer in between starts the count over.
func TestBreakerThreshold(t *testing.T) {
	_, refused := net.Dial("tcp", "127.0.0.1:1")
	timeout := &net.OpError{Op: "read", Net: "tcp", Err: context.DeadlineExceeded}
	tests := []struct {
		name  string
		calls []error // nil: Redis answered
		down  bool
	}{
		{"a refused connection", []error{refused}, true},
		{"one timeout", []error{timeout}, false},
		{"two timeouts", []error{timeout, timeout}, false},
		{"three timeouts in a row", []error{timeout, timeout, timeout}, true},
		{"an answer in between", []error{timeout, timeout, nil, timeout, timeout}, false},
		{"a script error is no outage", []error{proto("ERR x"), proto("ERR x"), proto("ERR x")}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := open(t, testenv.RedisURL(t), nil)
			for _, err := range tc.calls {
				c.observe("admit", time.Now(), err)
			}
			if c.Down() != tc.down {
				t.Fatalf("down = %v, want %v", c.Down(), tc.down)
			}
		})
	}
}

// While Redis stays down, /readyz names the outage's current cause: a
// server that first hung up and now refuses warden's password is a
// different problem to fix.
func TestReadyNamesTheCurrentCause(t *testing.T) {
	var hangUp atomic.Bool
	hangUp.Store(true)
	addr := loopback.Serve(t, func(c net.Conn) {
		if hangUp.Load() {
			return // closed at once
		}
		buf := make([]byte, 4096)
		for {
			if _, err := c.Read(buf); err != nil {
				return
			}
			if _, err := c.Write([]byte("-WRONGPASS invalid username-password pair or user is disabled.\r\n")); err != nil {
				return
			}
		}
	})
	clk := clock.NewFake(time.Now())
	c, err := Open(Config{URL: "redis://" + addr + "/0"}, clk, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for range 3 { // past tripAfter, whatever the first calls saw
		c.observe("admit", time.Now(), io.EOF)
	}
	if err := c.Ready(); err == nil || strings.Contains(err.Error(), "WRONGPASS") {
		t.Fatalf("before: %v", err)
	}
	hangUp.Store(false)
	deadline := time.Now().Add(10 * time.Second)
	for err := c.Ready(); err == nil || !strings.Contains(err.Error(), "WRONGPASS"); err = c.Ready() {
		if time.Now().After(deadline) {
			t.Fatalf("Ready still says %v", err)
		}
		clk.Advance(c.cfg.ProbeEvery)
		time.Sleep(time.Millisecond)
	}
}

// A Redis that comes back after an outage long enough to exhaust
// go-redis's own dial budget is noticed at the next probe. Probing with
// PINGs through the pool exhausted it: the pool then answered its last
// dial error without dialling, retrying only once a second by itself, so
// the probe after Redis returned still failed.
func TestProbeSeesRedisBackAtOnce(t *testing.T) {
	redisAddr := strings.TrimPrefix(strings.TrimSuffix(testenv.RedisURL(t), "/0"), "redis://")
	addr := loopback.FreeAddr(t) // refuses until the relay below listens on it
	m := metrics.New()
	clk := clock.NewFake(time.Now())
	c, err := Open(Config{URL: "redis://" + addr + "/0"}, clk, m, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if !c.Down() {
		t.Fatal("a refusing address is not reported down")
	}
	failures := func() float64 {
		var pb dto.Metric
		_ = m.BackendErrors.WithLabelValues("ping").(prometheus.Metric).Write(&pb)
		return pb.GetCounter().GetValue()
	}
	// armed waits until the probe's timer is armed beside the lease
	// renewer's, so that an Advance fires exactly one probe.
	armed := func() {
		for deadline := time.Now().Add(10 * time.Second); clk.Timers() < 2; time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatal("the probe never waits for its next turn")
			}
		}
	}
	// Far more failed probes than the pool has connections.
	for i := range 3 * (c.cfg.Senders + 8) {
		armed()
		before := failures()
		clk.Advance(c.cfg.ProbeEvery)
		for deadline := time.Now().Add(10 * time.Second); failures() == before; time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("probe %d never ran", i+1)
			}
		}
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Skipf("the refusing port was taken meanwhile: %v", err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	defer func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	}()
	wg.Go(func() {
		for {
			cl, err := ln.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", redisAddr)
			if err != nil {
				cl.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, cl, up)
			mu.Unlock()
			wg.Go(func() { _, _ = io.Copy(up, cl); up.Close() })
			wg.Go(func() { _, _ = io.Copy(cl, up); cl.Close() })
		}
	})
	armed()
	clk.Advance(c.cfg.ProbeEvery) // one probe, and no other
	for deadline := time.Now().Add(5 * time.Second); c.Down(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("still down after the first probe since Redis came back: %v", c.Ready())
		}
	}
	c.Close() // before the relay, so no connection outlives the test
}
