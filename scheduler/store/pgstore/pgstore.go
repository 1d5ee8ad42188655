// Package pgstore keeps scheduler runs in PostgreSQL, shared by several
// sidecars (scheduler.store.kind: postgres). It implements store.Store —
// each operation one statement — and adds what sharing needs: Claim, which
// admits the next runs for one sidecar with every shared gate checked in
// the claiming transaction; leases on claimed runs and on semaphore
// permits, renewed by their owner and swept by anyone; and LISTEN/NOTIFY
// wake-ups. See README.md for the schema and what is exact.
package pgstore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/warden-dev/warden/scheduler/store"
)

// callTimeout bounds every statement the store issues on its own (unlocks,
// the listener's reconnects); callers bound the rest with their contexts.
const callTimeout = 10 * time.Second

// Store is the Postgres run store. Methods are safe for concurrent use.
type Store struct {
	pool    *pgxpool.Pool
	schema  string // the schema holding the tables (current_schema())
	channel string // NOTIFY channel of this schema
	claimK  int64  // advisory lock key of the claim transaction
	closed  atomic.Bool
}

// Open connects to url, creates the schema named by its search_path (if
// any) and applies the migrations it lacks. A `search_path` query
// parameter in the URL isolates one set of tables (tests use a schema
// each).
func Open(ctx context.Context, url string) (*Store, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("parse scheduler.store.url: %w", err)
	}
	if cfg.MaxConns < 8 {
		cfg.MaxConns = 8 // deliveries, the claim loop, the sweeper and the API share it
	}
	schema := firstSchema(cfg.ConnConfig.RuntimeParams["search_path"])
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connect to the run store: %w", err)
	}
	if err := migrate(ctx, pool, schema); err != nil {
		pool.Close()
		return nil, fmt.Errorf("migrate the run store: %w", err)
	}
	var cur *string
	if err := pool.QueryRow(ctx, "SELECT current_schema()").Scan(&cur); err != nil || cur == nil {
		pool.Close()
		return nil, fmt.Errorf("resolve the run store's schema: %v", err)
	}
	return &Store{
		// A channel name is an identifier (63 bytes at most): the schema
		// enters it hashed.
		pool: pool, schema: *cur, channel: fmt.Sprintf("warden_runs_%016x", uint64(lockKey(*cur, "notify"))),
		claimK: lockKey(*cur, "claim"),
	}, nil
}

// firstSchema reads the first entry of a search_path setting as the
// server does: a double-quoted name is taken as written (`""` is a quote),
// an unquoted one is trimmed and folded to ASCII lower case; "$user" (the
// role's own schema) and an empty setting give "" (no schema to create).
func firstSchema(sp string) string {
	sp = strings.TrimLeft(sp, " \t\n\r")
	if strings.HasPrefix(sp, `"`) {
		var b strings.Builder
		for i := 1; i < len(sp); i++ {
			if sp[i] != '"' {
				b.WriteByte(sp[i])
				continue
			}
			if i+1 < len(sp) && sp[i+1] == '"' {
				b.WriteByte('"')
				i++
				continue
			}
			if name := b.String(); name != "$user" {
				return name
			}
			return ""
		}
		return "" // unterminated: the server refuses it, nothing to create
	}
	first, _, _ := strings.Cut(sp, ",")
	first = asciiLower(strings.TrimRight(first, " \t\n\r"))
	if first == "$user" {
		return ""
	}
	return first
}

func asciiLower(s string) string {
	b := []byte(s)
	for i, c := range b {
		if 'A' <= c && c <= 'Z' {
			b[i] = c + 'a' - 'A'
		}
	}
	return string(b)
}

// Schema is the schema holding the store's tables.
func (s *Store) Schema() string { return s.schema }

// Ping checks that the database answers (readiness).
func (s *Store) Ping(ctx context.Context) error {
	if s.closed.Load() {
		return store.ErrClosed
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if err := s.pool.Ping(ctx); err != nil {
		return fmt.Errorf("run store (postgres) unreachable: %w", err)
	}
	return nil
}

// runCols is every column of a run in scanRun's order; metaCols leaves
// out input and output.
const (
	metaCols = `seq, name, status, priority, attempt, key, tenant, coalesce(idempotency_key, ''),
		reason, control, created_at, queued_at, started_at, finished_at, retry_at, pool_id, window_start`
	runCols = metaCols + `, input, output`
)

func scanRun(row pgx.Row, r *store.Run, full bool) error {
	var st int16
	var seq int64
	dest := []any{&seq, &r.Name, &st, &r.Priority, &r.Attempt, &r.Key, &r.Tenant, &r.IdempotencyKey,
		&r.Reason, &r.Control, &r.CreatedAt, &r.QueuedAt, &r.StartedAt, &r.FinishedAt, &r.RetryAt, &r.PoolID, &r.WindowStart}
	if full {
		dest = append(dest, &r.Input, &r.Output)
	}
	if err := row.Scan(dest...); err != nil {
		return err
	}
	r.Seq, r.Status = uint64(seq), store.Status(st)
	return nil
}

func nullable(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// admittedSQL is the SQL list of statuses that hold a lane.
const admittedSQL = "(2, 3)"

// bound gives a call without a deadline the store's own: a stalled
// network must not hang a delivery or an API call for ever.
func bound(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, callTimeout)
}

func (s *Store) check() error {
	if s.closed.Load() {
		return store.ErrClosed
	}
	return nil
}

// Submit implements store.Store. A QUEUED run wakes the sidecars
// listening on the store.
func (s *Store) Submit(ctx context.Context, r *store.Run) (bool, error) {
	ctx, cancel := bound(ctx)
	defer cancel()
	if err := s.check(); err != nil {
		return false, err
	}
	q := `WITH ins AS (
		INSERT INTO warden_runs (name, status, priority, attempt, key, tenant, idempotency_key, input, output,
			reason, control, created_at, queued_at, started_at, finished_at, retry_at, pool_id, window_start)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18)
		ON CONFLICT (name, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
		RETURNING seq)
	SELECT seq, CASE WHEN $2 = 1 THEN pg_notify($19, 'submit') END IS NULL FROM ins`
	var seq int64
	var ignored bool
	err := s.pool.QueryRow(ctx, q, r.Name, int16(r.Status), r.Priority, r.Attempt, r.Key, r.Tenant, nullable(r.IdempotencyKey),
		r.Input, r.Output, r.Reason, r.Control, r.CreatedAt, r.QueuedAt, r.StartedAt, r.FinishedAt, r.RetryAt,
		r.PoolID, r.WindowStart, s.channel).Scan(&seq, &ignored)
	if err == nil {
		r.Seq = uint64(seq)
		return true, nil
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return false, fmt.Errorf("insert run: %w", err)
	}
	// The idempotency key names an existing run: the conflicting insert
	// waited for it to commit, so this read sees it.
	row := s.pool.QueryRow(ctx, "SELECT "+runCols+" FROM warden_runs WHERE name = $1 AND idempotency_key = $2", r.Name, r.IdempotencyKey)
	if err := scanRun(row, r, true); err != nil {
		return false, fmt.Errorf("load the run of idempotency key %q: %w", r.IdempotencyKey, err)
	}
	return false, nil
}

// Get implements store.Store.
func (s *Store) Get(ctx context.Context, seq uint64) (store.Run, error) {
	ctx, cancel := bound(ctx)
	defer cancel()
	if err := s.check(); err != nil {
		return store.Run{}, err
	}
	var r store.Run
	err := scanRun(s.pool.QueryRow(ctx, "SELECT "+runCols+" FROM warden_runs WHERE seq = $1", int64(seq)), &r, true)
	if errors.Is(err, pgx.ErrNoRows) {
		return store.Run{}, store.ErrNotFound
	}
	if err != nil {
		return store.Run{}, fmt.Errorf("load run %d: %w", seq, err)
	}
	return r, nil
}

// List implements store.Store.
func (s *Store) List(ctx context.Context, q store.Query) ([]store.Run, error) {
	ctx, cancel := bound(ctx)
	defer cancel()
	if err := s.check(); err != nil {
		return nil, err
	}
	var limit *int64 // NULL: no limit
	if q.Limit > 0 {
		n := int64(q.Limit)
		limit = &n
	}
	rows, err := s.pool.Query(ctx, "SELECT "+runCols+` FROM warden_runs
		WHERE ($1 = 0 OR status = $1) AND seq > $2 AND ($4 = '' OR name = $4) AND ($5 = '' OR key = $5)
		ORDER BY seq LIMIT $3`,
		int16(q.Status), int64(q.After), limit, q.Name, q.Key)
	if err != nil {
		return nil, fmt.Errorf("list runs: %w", err)
	}
	defer rows.Close()
	var out []store.Run
	for rows.Next() {
		var r store.Run
		if err := scanRun(rows, &r, true); err != nil {
			return nil, fmt.Errorf("list runs: %w", err)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list runs: %w", err)
	}
	return out, nil
}

// Update implements store.Store. A run leaving STARTING/RUNNING gives up
// its owner, its lease and its semaphore permits in the same statement,
// and wakes the listening sidecars: a slot freed. An admitted run is
// updated only for the attempt it is in: a sidecar whose lease the sweep
// took (it stalled) cannot end the attempt another sidecar claimed since.
func (s *Store) Update(ctx context.Context, r *store.Run, from store.Statuses) error {
	ctx, cancel := bound(ctx)
	defer cancel()
	if err := s.check(); err != nil {
		return err
	}
	var fromList []int16
	for _, st := range store.All {
		if from.Has(st) {
			fromList = append(fromList, int16(st))
		}
	}
	admitted := r.Status == store.Starting || r.Status == store.Running
	q := `WITH u AS (
		UPDATE warden_runs SET status = $2, priority = $3, attempt = $4, key = $5, tenant = $6, input = $7, output = $8,
			reason = $9, control = $10, created_at = $11, queued_at = $12, started_at = $13, finished_at = $14,
			retry_at = $15, pool_id = $16, window_start = $17,
			owner = CASE WHEN $18 THEN owner ELSE '' END, lease_until = CASE WHEN $18 THEN lease_until ELSE 0 END
		WHERE seq = $1 AND status = ANY($19) AND (status NOT IN ` + admittedSQL + ` OR attempt = $4) RETURNING seq),
	freed AS (DELETE FROM warden_permits WHERE NOT $18 AND seq IN (SELECT seq FROM u))
	SELECT (SELECT count(*) FROM u), (SELECT CASE WHEN NOT $18 AND EXISTS (SELECT 1 FROM u) THEN pg_notify($20, 'freed') END) IS NULL,
		(SELECT status FROM warden_runs WHERE seq = $1)`
	var n int64
	var ignored bool
	var cur *int16
	err := s.pool.QueryRow(ctx, q, int64(r.Seq), int16(r.Status), r.Priority, r.Attempt, r.Key, r.Tenant, r.Input, r.Output,
		r.Reason, r.Control, r.CreatedAt, r.QueuedAt, r.StartedAt, r.FinishedAt, r.RetryAt, r.PoolID, r.WindowStart,
		admitted, fromList, s.channel).Scan(&n, &ignored, &cur)
	if err != nil {
		return fmt.Errorf("update run %d: %w", r.Seq, err)
	}
	switch {
	case n == 1:
		return nil
	case cur == nil:
		return store.ErrNotFound
	}
	return store.ErrConflict
}

// Start implements store.Store: the admission of a run the caller decided
// itself (not through Claim). It takes no owner or lease.
func (s *Store) Start(ctx context.Context, seq uint64, a store.Admission) (store.Run, error) {
	ctx, cancel := bound(ctx)
	defer cancel()
	if err := s.check(); err != nil {
		return store.Run{}, err
	}
	// Reason is cleared with control and output: they describe the
	// previous attempt, not the one starting (store.Store.Start).
	q := `UPDATE warden_runs w SET status = 2, attempt = w.attempt + 1, started_at = $2, pool_id = $3, window_start = $4,
			retry_at = 0, control = '', output = NULL, reason = ''
		FROM (SELECT seq AS old_seq, retry_at AS old_retry FROM warden_runs WHERE seq = $1) old
		WHERE w.seq = old.old_seq AND w.status = 1
		RETURNING ` + runCols + `, old.old_retry`
	var r store.Run
	row := s.pool.QueryRow(ctx, q, int64(seq), a.At, a.PoolID, a.WindowStart)
	err := scanStarted(row, &r)
	if errors.Is(err, pgx.ErrNoRows) {
		return store.Run{}, s.missing(ctx, seq)
	}
	if err != nil {
		return store.Run{}, fmt.Errorf("start run %d: %w", seq, err)
	}
	return r, nil
}

// scanStarted reads a run as an admission returns it, with the RetryAt it
// had while QUEUED.
func scanStarted(row pgx.Row, r *store.Run) error {
	var st int16
	var seq int64
	if err := row.Scan(&seq, &r.Name, &st, &r.Priority, &r.Attempt, &r.Key, &r.Tenant, &r.IdempotencyKey,
		&r.Reason, &r.Control, &r.CreatedAt, &r.QueuedAt, &r.StartedAt, &r.FinishedAt, &r.RetryAt, &r.PoolID, &r.WindowStart,
		&r.Input, &r.Output, &r.RetryAt); err != nil {
		return err
	}
	r.Seq, r.Status = uint64(seq), store.Status(st)
	return nil
}

// missing tells ErrNotFound from ErrConflict after a conditional write
// matched nothing.
func (s *Store) missing(ctx context.Context, seq uint64) error {
	var one int
	err := s.pool.QueryRow(ctx, "SELECT 1 FROM warden_runs WHERE seq = $1", int64(seq)).Scan(&one)
	if errors.Is(err, pgx.ErrNoRows) {
		return store.ErrNotFound
	}
	if err != nil {
		return fmt.Errorf("look up run %d: %w", seq, err)
	}
	return store.ErrConflict
}

// Unfinished implements store.Store.
func (s *Store) Unfinished(ctx context.Context, fn func(*store.Run) error) error {
	if err := s.check(); err != nil {
		return err
	}
	for _, st := range store.Unfinished {
		rows, err := s.pool.Query(ctx, "SELECT "+metaCols+" FROM warden_runs WHERE status = $1 ORDER BY seq", int16(st))
		if err != nil {
			return fmt.Errorf("scan %s runs: %w", st, err)
		}
		var r store.Run
		for rows.Next() {
			r = store.Run{}
			if err := scanRun(rows, &r, false); err != nil {
				rows.Close()
				return fmt.Errorf("scan %s runs: %w", st, err)
			}
			if err := fn(&r); err != nil {
				rows.Close()
				return err
			}
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return fmt.Errorf("scan %s runs: %w", st, err)
		}
	}
	return nil
}

// Counts implements store.Store.
func (s *Store) Counts(ctx context.Context) (map[store.Status]int, error) {
	ctx, cancel := bound(ctx)
	defer cancel()
	if err := s.check(); err != nil {
		return nil, err
	}
	out, err := s.statusCounts(ctx, "SELECT status, count(*) FROM warden_runs GROUP BY status")
	if err != nil {
		return nil, fmt.Errorf("count runs: %w", err)
	}
	return out, nil
}

// statusCounts runs a query that returns (status, count) rows.
func (s *Store) statusCounts(ctx context.Context, sql string, args ...any) (map[store.Status]int, error) {
	rows, err := s.pool.Query(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[store.Status]int{}
	for rows.Next() {
		var st int16
		var n int64
		if err := rows.Scan(&st, &n); err != nil {
			return nil, err
		}
		out[store.Status(st)] = int(n)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	return out, nil
}

// terminalSQL selects the statuses of runs that ended, as the
// warden_runs_finished index's predicate does: store.Completed (5) to
// store.Cancelled (9).
const terminalSQL = "status BETWEEN 5 AND 9"

// Purge implements store.Store. The oldest-ended runs go first, with any
// permit row still naming them; several sidecars may purge at once, each
// passing over the rows another is deleting.
func (s *Store) Purge(ctx context.Context, before int64, limit int) (map[store.Status]int, error) {
	ctx, cancel := bound(ctx)
	defer cancel()
	if err := s.check(); err != nil {
		return nil, err
	}
	out, err := s.statusCounts(ctx, `
		WITH gone AS (
			DELETE FROM warden_runs WHERE seq IN (
				SELECT seq FROM warden_runs WHERE `+terminalSQL+` AND finished_at < $1
				ORDER BY finished_at LIMIT $2 FOR UPDATE SKIP LOCKED)
			RETURNING seq, status),
		permits AS (DELETE FROM warden_permits WHERE seq IN (SELECT seq FROM gone))
		SELECT status, count(*) FROM gone GROUP BY status`, before, limit)
	if err != nil {
		return nil, fmt.Errorf("purge runs: %w", err)
	}
	return out, nil
}

// Close implements store.Store: the pool's connections close; committed
// writes are already durable.
func (s *Store) Close() error {
	if s.closed.Swap(true) {
		return nil
	}
	s.pool.Close()
	return nil
}
