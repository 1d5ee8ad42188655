package bridge

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"go.uber.org/goleak"

	"github.com/warden-dev/warden/governor/clock"
	"github.com/warden-dev/warden/governor/metrics"
	"github.com/warden-dev/warden/internal/testkit/testenv"
	"github.com/warden-dev/warden/policy"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// harness runs a Set against the real Postgres (or, for tcp bridges,
// any loopback server).
type harness struct {
	t       *testing.T
	set     *Set
	clk     clock.Clock
	m       *metrics.Metrics
	pgURL   string
	pgAddr  string
	user    string
	db      string
	bridges []policy.Bridge
	logs    logBuffer
}

// logBuffer collects the bridges' log lines.
type logBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// count is the number of lines containing every one of parts.
func (l *logBuffer) count(parts ...string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, line := range strings.Split(l.b.String(), "\n") {
		all := line != ""
		for _, p := range parts {
			all = all && strings.Contains(line, p)
		}
		if all {
			n++
		}
	}
	return n
}

func newHarness(t *testing.T, clk clock.Clock, runs RunTracker) *harness {
	t.Helper()
	h := &harness{t: t, clk: clk, m: metrics.New()}
	log := slog.New(slog.NewTextHandler(&h.logs, nil))
	h.set = New(Options{Clock: clk, Metrics: h.m, Runs: runs, Log: log})
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := h.set.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
	})
	return h
}

// withPostgres points the harness at the test database.
func (h *harness) withPostgres() *harness {
	h.t.Helper()
	h.pgURL = testenv.PostgresURL(h.t)
	cfg, err := pgx.ParseConfig(h.pgURL)
	if err != nil {
		h.t.Fatal(err)
	}
	h.pgAddr = net.JoinHostPort(cfg.Host, fmt.Sprint(cfg.Port))
	h.user, h.db = cfg.User, cfg.Database
	return h
}

// pgBridge is a postgres bridge on a free loopback port in front of the
// test database, max 3 connections, waiting 30s.
func (h *harness) pgBridge(name string, mods ...func(*policy.Bridge)) policy.Bridge {
	b := policy.Bridge{
		Name: name, Listen: "127.0.0.1:0", Upstream: h.pgAddr, Protocol: policy.ProtocolPostgres,
		MaxConnections: 3, WaitTimeout: 30 * time.Second,
	}
	for _, m := range mods {
		m(&b)
	}
	return b
}

// apply makes bs the policy's bridges.
func (h *harness) apply(bs ...policy.Bridge) error {
	h.bridges = bs
	return h.set.Apply(context.Background(), controls(bs...))
}

func (h *harness) mustApply(bs ...policy.Bridge) {
	h.t.Helper()
	if err := h.apply(bs...); err != nil {
		h.t.Fatal(err)
	}
}

func (h *harness) bridge(name string) *bridge {
	h.t.Helper()
	h.set.mu.Lock()
	defer h.set.mu.Unlock()
	b := h.set.bridges[name]
	if b == nil {
		h.t.Fatalf("no bridge %s", name)
	}
	return b
}

// addr is where bridge name listens.
func (h *harness) addr(name string) string {
	h.t.Helper()
	b := h.bridge(name)
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.ln.Addr().String()
}

// connString is a pgx connection string through bridge name.
func (h *harness) connString(name, app string) string {
	host, port, _ := net.SplitHostPort(h.addr(name))
	return fmt.Sprintf("postgres://%s@%s/%s?sslmode=disable&application_name=%s",
		url.PathEscape(h.user), net.JoinHostPort(host, port), url.PathEscape(h.db), url.QueryEscape(app))
}

func (h *harness) connect(name, app string) *pgx.Conn {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, h.connString(name, app))
	if err != nil {
		h.t.Fatalf("connect through %s: %v", name, err)
	}
	h.t.Cleanup(func() { c.Close(context.Background()) })
	return c
}

// direct is a connection straight to the test database.
func (h *harness) direct() *pgx.Conn {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, h.pgURL)
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(func() { c.Close(context.Background()) })
	return c
}

// table creates a per-test table with an integer primary key.
func (h *harness) table() string {
	h.t.Helper()
	name := fmt.Sprintf("bridge_test_%d", time.Now().UnixNano())
	d := h.direct()
	if _, err := d.Exec(context.Background(), "CREATE TABLE "+name+" (id int PRIMARY KEY)"); err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(func() {
		c, err := pgx.Connect(context.Background(), h.pgURL)
		if err == nil {
			_, _ = c.Exec(context.Background(), "DROP TABLE IF EXISTS "+name)
			c.Close(context.Background())
		}
	})
	return name
}

// rolledBack proves a transaction that inserted id into table is gone: the
// same key inserts at once (an open transaction would block it, a committed
// one would conflict).
func (h *harness) rolledBack(table string, id int) {
	h.t.Helper()
	d := h.direct()
	ctx := context.Background()
	if _, err := d.Exec(ctx, "SET lock_timeout = '5s'"); err != nil {
		h.t.Fatal(err)
	}
	if _, err := d.Exec(ctx, fmt.Sprintf("INSERT INTO %s VALUES (%d)", table, id)); err != nil {
		h.t.Fatalf("row %d of %s is still held or committed: %v", id, table, err)
	}
}

// waitFor waits until cond holds for bridge name's snapshot, woken by the
// bridge's own change notifications.
func (h *harness) waitFor(name, what string, cond func(Snapshot) bool) Snapshot {
	h.t.Helper()
	b := h.bridge(name)
	var snap Snapshot
	h.waitBridge(b, what, func() bool {
		snap = b.snapshot(h.clk.Now())
		return cond(snap)
	}, func() string { return fmt.Sprintf("last %+v", snap) })
	return snap
}

// waitBridge waits until cond holds, checking whenever b changes.
func (h *harness) waitBridge(b *bridge, what string, cond func() bool, last func() string) {
	h.t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		b.mu.Lock()
		ch := b.changed
		b.mu.Unlock()
		if cond() {
			return
		}
		select {
		case <-ch:
		case <-deadline:
			h.t.Fatalf("timed out waiting for %s; %s", what, last())
		}
	}
}

// until returns a channel closed once cond holds for bridge name.
func (h *harness) until(name string, cond func(Snapshot) bool) <-chan struct{} {
	b := h.bridge(name)
	done, stop := make(chan struct{}), make(chan struct{})
	h.t.Cleanup(func() { close(stop) })
	go func() {
		for {
			b.mu.Lock()
			ch := b.changed
			b.mu.Unlock()
			if cond(b.snapshot(h.clk.Now())) {
				close(done)
				return
			}
			select {
			case <-ch:
			case <-stop:
				return
			}
		}
	}()
	return done
}

// reaped waits until bridge name has counted n reaps for reason, and checks
// that each was logged (README: every reap is logged and counted).
func (h *harness) reaped(name, reason string, n uint64) {
	h.t.Helper()
	h.waitFor(name, fmt.Sprintf("%d %s reaps", n, reason), func(s Snapshot) bool { return s.Reaped[reason] == n })
	if got := h.logs.count(`msg="connection reaped"`, "bridge="+name+" ", "reason="+reason); got != int(n) {
		h.t.Fatalf("bridge %s: %d %s reaps counted, %d logged", name, n, reason, got)
	}
}

// rawClient speaks the protocol by hand, to see exactly what the bridge
// sends.
type rawClient struct {
	t  *testing.T
	c  net.Conn
	fe *pgproto3.Frontend
}

// dial connects to bridge name, closed at the end of the test; every read
// and write must be done within 10s.
func (h *harness) dial(name string) net.Conn {
	h.t.Helper()
	c, err := net.DialTimeout("tcp", h.addr(name), 5*time.Second)
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	return c
}

func (h *harness) dialRaw(name string) *rawClient {
	h.t.Helper()
	c := h.dial(name)
	return &rawClient{t: h.t, c: c, fe: pgproto3.NewFrontend(c, c)}
}

// login sends a startup message and reads up to the first ReadyForQuery.
func (r *rawClient) login(user, db, app string) {
	r.t.Helper()
	r.fe.Send(&pgproto3.StartupMessage{ProtocolVersion: pgproto3.ProtocolVersionNumber,
		Parameters: map[string]string{"user": user, "database": db, "application_name": app}})
	if err := r.fe.Flush(); err != nil {
		r.t.Fatal(err)
	}
	if _, e := r.untilReady(); e != nil {
		r.t.Fatalf("login: %s %s", e.Code, e.Message)
	}
}

// query runs sql and returns the final transaction status and the error,
// if any.
func (r *rawClient) query(sql string) (byte, *pgproto3.ErrorResponse) {
	r.t.Helper()
	r.fe.Send(&pgproto3.Query{String: sql})
	if err := r.fe.Flush(); err != nil {
		r.t.Fatal(err)
	}
	return r.untilReady()
}

func (r *rawClient) untilReady() (byte, *pgproto3.ErrorResponse) {
	r.t.Helper()
	var failure *pgproto3.ErrorResponse
	for {
		msg, err := r.fe.Receive()
		if err != nil {
			r.t.Fatalf("receive: %v", err)
		}
		switch m := msg.(type) {
		case *pgproto3.ErrorResponse:
			e := *m
			failure = &e
		case *pgproto3.ReadyForQuery:
			return m.TxStatus, failure
		}
	}
}

// fatal reads until an ErrorResponse, which must carry code, then expects
// the connection to end.
func (r *rawClient) fatal(code string) *pgproto3.ErrorResponse {
	r.t.Helper()
	e := r.errorResponse(code)
	r.closed()
	return e
}

// errorResponse reads until an ErrorResponse, which must carry code.
func (r *rawClient) errorResponse(code string) *pgproto3.ErrorResponse {
	r.t.Helper()
	for {
		msg, err := r.fe.Receive()
		if err != nil {
			r.t.Fatalf("connection ended without an ErrorResponse %s: %v", code, err)
		}
		if e, ok := msg.(*pgproto3.ErrorResponse); ok {
			if e.Code != code {
				r.t.Fatalf("ErrorResponse %s %q, want code %s", e.Code, e.Message, code)
			}
			got := *e // Receive reuses its messages
			return &got
		}
	}
}

// closed expects EOF next.
func (r *rawClient) closed() {
	r.t.Helper()
	var b [1]byte
	if n, err := r.c.Read(b[:]); n != 0 || !(errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) || isReset(err)) {
		r.t.Fatalf("connection still open: n=%d err=%v", n, err)
	}
}

func isReset(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && !op.Timeout()
}

// pgCode is the SQLSTATE of a pgx error ("" if none).
func pgCode(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code
	}
	return ""
}

// runs is a RunTracker for tests: runs are added, then ended.
type runs struct {
	mu   sync.Mutex
	done map[string]chan struct{}
}

func newRuns(ids ...string) *runs {
	r := &runs{done: map[string]chan struct{}{}}
	for _, id := range ids {
		r.done[id] = make(chan struct{})
	}
	return r
}

func (r *runs) Done(id string) (<-chan struct{}, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	ch, ok := r.done[id]
	return ch, ok
}

func (r *runs) end(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	close(r.done[id])
}

// hangUpAfter reads until an ErrorResponse, which must carry code, and
// closes the connection at once, without Terminate and without waiting for
// the bridge to close it (as libpq does after a FATAL).
func (r *rawClient) hangUpAfter(code string) {
	r.t.Helper()
	r.errorResponse(code)
	_ = r.c.Close()
}
