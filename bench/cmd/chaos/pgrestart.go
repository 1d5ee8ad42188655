package main

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

const bridgePolicy = `bridges:
  - name: db
    listen: %s
    upstream: %s
    protocol: postgres
    max_connections: %d
    wait_timeout: 5s
    idle_timeout: 60s
`

// pgBridge: pgx clients (twice the bridge's max_connections) query through
// a bridge to the private Postgres, which restarts with an immediate
// shutdown. Clients see errors during the restart, then the bridge serves
// again, its live count never exceeds max_connections, and no slot is
// leaked: afterwards max_connections clients get in at once.
func pgBridge(ctx context.Context, s *scenario) error {
	pg, err := s.env.postgres(ctx)
	if err != nil {
		return err
	}
	const maxConns = 10
	a, err := freeAddrs()
	if err != nil {
		return err
	}
	w, err := s.launch(ctx, policyFor(a.admin, fmt.Sprintf(bridgePolicy, a.bridge, pg.addr, maxConns)), a.admin, 0)
	if err != nil {
		return err
	}
	down := s.pickDur(2*time.Second, 5*time.Second)
	s.row.load = fmt.Sprintf("%d pgx clients via bridge (max %d), sessions of 20 queries", 2*maxConns, maxConns)
	s.row.fault = fmt.Sprintf("Postgres immediate shutdown, down %v, restart", down)

	bridges := pollBridges(ctx, w)
	defer bridges.stop()
	cctx, stopClients := context.WithCancel(ctx)
	defer stopClients()
	cl := runPGClients(cctx, fmt.Sprintf("postgres://postgres@%s/postgres?sslmode=disable&connect_timeout=5", a.bridge), 2*maxConns, 20)
	if !sleep(ctx, 3*time.Second) {
		return ctx.Err()
	}
	pg.crash()
	sleep(ctx, down)
	// Recovery counts from the restart: Postgres is up when a login
	// succeeds, which is what the clients are trying too.
	back := time.Now()
	if err := pg.start(ctx); err != nil {
		return fmt.Errorf("restart postgres: %w", err)
	}
	waitFor(ctx, 30*time.Second, func() bool { return !cl.firstOKAfter(back).IsZero() })
	sleep(ctx, 3*time.Second)
	end := time.Now()
	stopClients()
	cl.wait()

	first := cl.firstOKAfter(back)
	if !first.IsZero() {
		s.row.recovery = first.Sub(back)
	}
	okLast, errLast := cl.between(end.Add(-2*time.Second), end)
	s.row.clientErrors = cl.errorCount()
	s.row.errorsNote = "during the restart"
	s.row.check("serves-again", !first.IsZero() && okLast > 0 && errLast == 0,
		"%d errors after the crash (first: %.100s); first query served %s after the restart; last 2 s: %d served, %d errors",
		cl.errorCount(), cl.firstErr, s.row.recoveryCell(), okLast, errLast)

	// No slot leaked: once every client has left, max_connections new
	// clients each hold a transaction open at the same time.
	idle := waitFor(ctx, 15*time.Second, func() bool {
		b, err := bridgeState(ctx, w)
		return err == nil && b.InUse == 0 && b.Waiting == 0
	})
	held, backends, holdErr := holdAll(ctx, fmt.Sprintf("postgres://postgres@%s/postgres?sslmode=disable&connect_timeout=5", a.bridge), pg, maxConns)
	bridges.stop()
	s.row.maxConc, s.row.capConc = bridges.maxLive, maxConns
	s.row.check("live<=max_connections", bridges.samples > 0 && bridges.maxLive <= maxConns,
		"/v1/bridges read %d times, live at most %d, max_connections %d", bridges.samples, bridges.maxLive, maxConns)
	s.row.check("no-slot-leaked", idle && held == maxConns && backends <= maxConns && holdErr == nil,
		"bridge idle after the clients left: %v; then %d of %d new clients held a transaction at once%s; server backends %d",
		idle, held, maxConns, errNote(holdErr), backends)
	s.settle()
	return nil
}

// holdAll opens n sessions through url, each inside a transaction, and
// counts how many got in within 10 s, and how many client backends the
// server then had (through a direct connection).
func holdAll(ctx context.Context, url string, pg *postgres, n int) (held, backends int, err error) {
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	in := make(chan *pgx.Conn, n)
	errs := make(chan error, n)
	for range n {
		go func() {
			c, err := pgx.Connect(ctx, url)
			if err == nil {
				_, err = c.Exec(ctx, "BEGIN; SELECT 1")
			}
			if err != nil {
				if c != nil {
					c.Close(context.Background())
				}
				errs <- err
				return
			}
			in <- c
		}()
	}
	var conns []*pgx.Conn
	defer func() {
		for _, c := range conns {
			c.Close(context.Background())
		}
	}()
	timeout := time.After(10 * time.Second)
	failed := 0
wait:
	for len(conns)+failed < n {
		select {
		case c := <-in:
			conns = append(conns, c)
		case err = <-errs:
			failed++
		case <-timeout:
			break wait
		}
	}
	if d, derr := pgx.Connect(ctx, pg.url("postgres")); derr == nil {
		_ = d.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()").Scan(&backends)
		d.Close(ctx)
	}
	return len(conns), backends, err
}

// pgClients are sessions querying in a loop, reconnecting after errors.
type pgClients struct {
	mu       sync.Mutex
	okAt     []time.Time
	errAt    []time.Time
	firstErr string
	wg       sync.WaitGroup
}

func runPGClients(ctx context.Context, url string, n, perSession int) *pgClients {
	cl := &pgClients{}
	for range n {
		cl.wg.Add(1)
		go func() {
			defer cl.wg.Done()
			for ctx.Err() == nil {
				cl.session(ctx, url, perSession)
			}
		}()
	}
	return cl
}

// session connects, runs perSession queries 10 ms apart and leaves.
func (cl *pgClients) session(ctx context.Context, url string, perSession int) {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	c, err := pgx.Connect(cctx, url)
	if err != nil {
		cl.record(ctx, err)
		sleep(ctx, 100*time.Millisecond)
		return
	}
	defer c.Close(context.Background())
	for range perSession {
		var one int
		if err := c.QueryRow(cctx, "SELECT 1").Scan(&one); err != nil {
			cl.record(ctx, err)
			sleep(ctx, 100*time.Millisecond)
			return
		}
		cl.record(ctx, nil)
		if !sleep(ctx, 10*time.Millisecond) {
			return
		}
	}
}

func (cl *pgClients) record(ctx context.Context, err error) {
	if ctx.Err() != nil {
		return // stopped by the harness, not a failure
	}
	cl.mu.Lock()
	defer cl.mu.Unlock()
	if err == nil {
		cl.okAt = append(cl.okAt, time.Now())
		return
	}
	cl.errAt = append(cl.errAt, time.Now())
	if cl.firstErr == "" {
		cl.firstErr = err.Error()
	}
}

func (cl *pgClients) wait() { cl.wg.Wait() }

func (cl *pgClients) errorCount() int {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	return len(cl.errAt)
}

func (cl *pgClients) firstOKAfter(t time.Time) time.Time {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	return firstAfter(cl.okAt, t)
}

// between counts successes and errors in [from, to).
func (cl *pgClients) between(from, to time.Time) (ok, errs int) {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	in := func(t time.Time) bool { return !t.Before(from) && t.Before(to) }
	for _, t := range cl.okAt {
		if in(t) {
			ok++
		}
	}
	for _, t := range cl.errAt {
		if in(t) {
			errs++
		}
	}
	return ok, errs
}

// bridgeRow is the part of GET /v1/bridges the scenarios read.
type bridgeRow struct {
	Name    string `json:"name"`
	Max     int    `json:"max"`
	Live    int    `json:"live"`
	InUse   int    `json:"in_use"`
	Waiting int    `json:"waiting"`
}

func bridgeState(ctx context.Context, w *warden) (bridgeRow, error) {
	code, body, err := w.get(ctx, "/v1/bridges")
	if err != nil {
		return bridgeRow{}, err
	}
	var rows []bridgeRow
	if code != 200 || json.Unmarshal(body, &rows) != nil || len(rows) == 0 {
		return bridgeRow{}, fmt.Errorf("/v1/bridges: %d %.200s", code, body)
	}
	return rows[0], nil
}

// bridgePoller reads /v1/bridges every 200 ms and keeps the largest live
// count.
type bridgePoller struct {
	*repeater
	maxLive, samples int
}

func pollBridges(ctx context.Context, w *warden) *bridgePoller {
	p := &bridgePoller{}
	p.repeater = repeat(ctx, 200*time.Millisecond, func(ctx context.Context) {
		if b, err := bridgeState(ctx, w); err == nil {
			p.samples++
			p.maxLive = max(p.maxLive, b.Live)
		}
	})
	return p
}

const storePolicy = `ingress: { listen: %s, worker: "http://%s" }
scheduler:
  lanes: %d
  worker_max_concurrent: 10
  store: { kind: postgres, url: "%s" }
  definitions:
    job:
      retry: { count: 10, logic: fixed, delay: 200ms }
      start_to_close_timeout: 60s
`

// pgRunStore: runs offered to a warden whose run store is the private
// Postgres, which restarts with an immediate shutdown mid-load. Every run
// accepted before and during the restart ends; the worker never sees more
// than lanes at once.
func pgRunStore(ctx context.Context, s *scenario) error {
	pg, err := s.env.postgres(ctx)
	if err != nil {
		return err
	}
	const lanes, rate = 5, 40.0
	db := fmt.Sprintf("chaos_runs_%d", time.Now().UnixNano())
	if err := pg.exec(ctx, "postgres", "CREATE DATABASE "+db); err != nil {
		return fmt.Errorf("create database: %w", err)
	}
	defer func() { _ = pg.exec(context.Background(), "postgres", "DROP DATABASE IF EXISTS "+db+" WITH (FORCE)") }()
	wk, a, err := s.prepare(30 * time.Millisecond)
	if err != nil {
		return err
	}
	if _, err := s.launch(ctx, policyFor(a.admin, fmt.Sprintf(storePolicy, a.ingress, wk.addr, lanes, pg.url(db))), a.admin, 0); err != nil {
		return err
	}
	down := s.pickDur(2*time.Second, 5*time.Second)
	s.row.load = fmt.Sprintf("runs %.0f/s, worker 30 ms each, store in Postgres", rate)
	s.row.fault = fmt.Sprintf("Postgres immediate shutdown, down %v, restart", down)

	loadCtx, stopLoad := context.WithCancel(ctx)
	defer stopLoad()
	sub := startRuns(loadCtx, a.ingress, "job", rate, 8)
	if !sleep(ctx, 3*time.Second) {
		return ctx.Err()
	}
	pg.crash()
	crashed := time.Now()
	sleep(ctx, down)
	back := time.Now()
	if err := pg.start(ctx); err != nil {
		stopLoad()
		sub.wait()
		return fmt.Errorf("restart postgres: %w", err)
	}
	sleep(ctx, 5*time.Second)
	stopLoad()
	sub.wait()
	out := trackRuns(a.ingress, sub).finish(ctx, 2*time.Minute)
	wk.waitIdle(ctx)
	st := wk.stats()
	if ok := sub.firstOKAfter(back); !ok.IsZero() {
		s.row.recovery = ok.Sub(back)
	}
	during := 0
	for _, t := range sub.okAt {
		if t.After(crashed) && t.Before(back) {
			during++
		}
	}
	s.row.checkRuns(sub, out, st, lanes, "submits while Postgres was down")
	s.row.note("%d runs accepted while Postgres was down; %d delivered more than once %s", during, len(st.duplicated), short(st.duplicated))
	s.settle()
	return nil
}
