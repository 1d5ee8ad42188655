package pgstore

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/warden-dev/warden/scheduler/store"
)

// ClaimRequest is one sidecar asking for the next runs it may start, with
// the gates of its policy. Every sidecar sharing a store is expected to run
// the same policy; each claim checks the gates it was given.
type ClaimRequest struct {
	Owner     string        // the claiming sidecar
	Now       int64         // unix nanos, from the scheduler's clock
	Lease     time.Duration // how long a claim lasts without renewal
	Lanes     int           // runs STARTING/RUNNING at once across every sidecar
	WorkerMax int           // runs STARTING/RUNNING at once owned by Owner; 0: no cap
	// Defs are the definitions that may be admitted (a run of any other
	// definition waits untouched).
	Defs       map[string]ClaimDef
	Pools      map[string]ClaimPool // by pool id
	Semaphores map[string]int       // configured permits; an unlisted semaphore gates nothing
}

// ClaimDef is one definition's gates.
type ClaimDef struct {
	KeyLimit   int    // key_concurrency; 0: no key gate
	Pool       string // pool id; "": no pool gate
	Semaphores []string
}

// ClaimPool is a pool's gates at the claim's time: its concurrency and its
// fixed-window rate, with the bounds of the current window.
type ClaimPool struct {
	Concurrency int // 0: no concurrency gate
	Rate        int // 0: no rate gate
	WindowStart int64
	WindowEnd   int64
}

// ClaimResult is what a claim admitted.
type ClaimResult struct {
	// Runs are the claimed runs, STARTING and owned by the claimer, with
	// their inputs; RetryAt is the value it had while QUEUED (non-zero: the
	// attempt was already counted by the retry budget).
	Runs []store.Run
	// WakeAt is the earliest end of a pool window whose rate held a run:
	// the claimer should try again then. 0: none.
	WakeAt int64
}

// claimBatch is how many waiting runs one scan reads; claimScanMax bounds
// the runs one claim looks at (blocked ones are skipped, not counted).
const (
	claimBatch   = 64
	claimScanMax = 4096
)

type defKey struct{ name, key string }

// Claim admits, for one sidecar, the best waiting runs every gate has room
// for — higher priority first, then oldest — and records them STARTING
// with the claimer as owner and a lease, all in one transaction. The
// transaction holds an advisory lock (pg_advisory_xact_lock) while it
// counts, so concurrent claims by several sidecars see each other's
// admissions and the counts are exact; the candidate rows are read FOR
// UPDATE SKIP LOCKED so a run another transaction is moving is passed
// over. A run held by its key skips only that key; one held by its pool
// or semaphores skips only its definition.
func (s *Store) Claim(ctx context.Context, req ClaimRequest) (ClaimResult, error) {
	var res ClaimResult
	if len(req.Defs) == 0 {
		return res, s.check()
	}
	err := s.underClaimLock(ctx, func(ctx context.Context, tx pgx.Tx) error {
		res = ClaimResult{}
		return s.claimTx(ctx, tx, req, &res)
	})
	if err != nil {
		return ClaimResult{}, fmt.Errorf("claim runs: %w", err)
	}
	return res, nil
}

// underClaimLock runs fn in a transaction that holds the schema's claim
// lock (pg_advisory_xact_lock) from its start to its commit.
func (s *Store) underClaimLock(ctx context.Context, fn func(context.Context, pgx.Tx) error) error {
	if err := s.check(); err != nil {
		return err
	}
	ctx, cancel := bound(ctx)
	defer cancel()
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", s.claimK); err != nil {
			return err
		}
		return fn(ctx, tx)
	})
}

// admission is one run a claim admits.
type admission struct {
	seq      int64
	retryAt  int64
	poolID   string
	winStart int64
	sems     []string
}

// gates are the counts a claim checks, read under the claim lock.
type gates struct {
	global, mine int
	perKey       map[defKey]int
	perPool      map[string]int // admitted runs of the definitions using each pool
	held         map[string]int // permits held per semaphore
	used         map[string]int // rate slots counted in each pool's current window
}

// loadGates frees expired permits and reads every count in one round trip.
func loadGates(ctx context.Context, tx pgx.Tx, req ClaimRequest) (*gates, error) {
	var ids []string
	var starts []int64
	for id, p := range req.Pools {
		if p.Rate > 0 {
			ids, starts = append(ids, id), append(starts, p.WindowStart)
		}
	}
	b := &pgx.Batch{}
	b.Queue("DELETE FROM warden_permits WHERE expires_at <> 0 AND expires_at <= $1", req.Now)
	// Admitted runs are bounded by lanes, so reading them whole is cheap.
	b.Queue("SELECT name, key, owner FROM warden_runs WHERE status IN " + admittedSQL)
	b.Queue("SELECT semaphore, count(*) FROM warden_permits GROUP BY semaphore")
	b.Queue(`SELECT w.pool_id, w.count FROM warden_pool_windows w
		JOIN unnest($1::text[], $2::bigint[]) AS c(pool_id, window_start)
		ON w.pool_id = c.pool_id AND w.window_start = c.window_start`, ids, starts)
	br := tx.SendBatch(ctx, b)
	defer br.Close()
	g := &gates{perKey: map[defKey]int{}, perPool: map[string]int{}, held: map[string]int{}, used: map[string]int{}}
	if _, err := br.Exec(); err != nil {
		return nil, err
	}
	rows, err := br.Query()
	if err != nil {
		return nil, err
	}
	var k defKey
	var owner string
	_, err = pgx.ForEachRow(rows, []any{&k.name, &k.key, &owner}, func() error {
		g.global++
		if owner == req.Owner {
			g.mine++
		}
		g.perKey[k]++
		if d, ok := req.Defs[k.name]; ok && d.Pool != "" {
			g.perPool[d.Pool]++
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	var name string
	var n int64
	if rows, err = br.Query(); err != nil {
		return nil, err
	}
	if _, err = pgx.ForEachRow(rows, []any{&name, &n}, func() error { g.held[name] = int(n); return nil }); err != nil {
		return nil, err
	}
	var count int32
	if rows, err = br.Query(); err != nil {
		return nil, err
	}
	if _, err = pgx.ForEachRow(rows, []any{&name, &count}, func() error { g.used[name] = int(count); return nil }); err != nil {
		return nil, err
	}
	return g, br.Close()
}

// claimTx admits, under the claim lock, the best waiting runs the gates
// have room for: it counts the gates, walks the waiting runs in admission
// order a batch at a time, and records the runs admitted.
func (s *Store) claimTx(ctx context.Context, tx pgx.Tx, req ClaimRequest, res *ClaimResult) error {
	g, err := loadGates(ctx, tx, req)
	if err != nil {
		return err
	}
	room := req.Lanes - g.global
	if req.WorkerMax > 0 {
		room = min(room, req.WorkerMax-g.mine)
	}
	if room <= 0 {
		return nil
	}
	c := newClaimScan(req, g, res, room)
	for c.room > 0 && c.scanned < claimScanMax {
		batch, err := c.nextBatch(ctx, tx)
		if err != nil {
			return err
		}
		for _, cand := range batch {
			c.consider(cand)
		}
		if len(batch) < claimBatch {
			break
		}
	}
	if len(c.admitted) == 0 {
		return nil
	}
	return recordClaims(ctx, tx, req, c.admitted, res)
}

// claimScan is one claim's walk over the waiting runs: the gates as
// counted so far, what it skips and where it has got to.
type claimScan struct {
	req   ClaimRequest
	g     *gates
	res   *ClaimResult
	room  int // lanes (and worker_max_concurrent) left
	names []string

	// A run held by its key skips only that key; one held by its pool or
	// semaphores skips only its definition. The slices are the query's
	// arguments, the maps the same for the runs of a batch.
	blockedDefs                     []string
	blockedKeyNames, blockedKeyKeys []string
	blockedDef                      map[string]bool
	blockedKey                      map[defKey]bool

	first   bool // no batch read yet
	curPrio int32
	curSeq  int64 // the last run looked at: the next batch starts after it
	scanned int

	admitted []admission
}

// candidate is a waiting run a batch read.
type candidate struct {
	seq     int64
	k       defKey
	prio    int32
	retryAt int64
}

func newClaimScan(req ClaimRequest, g *gates, res *ClaimResult, room int) *claimScan {
	names := make([]string, 0, len(req.Defs))
	for name := range req.Defs {
		names = append(names, name)
	}
	return &claimScan{req: req, g: g, res: res, room: room, names: names, blockedDefs: []string{},
		blockedDef: map[string]bool{}, blockedKey: map[defKey]bool{}, first: true}
}

// nextBatch reads, FOR UPDATE SKIP LOCKED, the next waiting runs in
// admission order (higher priority first, then oldest) after the last one
// looked at, leaving out the definitions and keys already held.
func (c *claimScan) nextBatch(ctx context.Context, tx pgx.Tx) ([]candidate, error) {
	rows, err := tx.Query(ctx, `SELECT seq, name, key, priority, retry_at FROM warden_runs r
		WHERE status = 1 AND name = ANY($1) AND NOT (name = ANY($2))
		  AND NOT EXISTS (SELECT 1 FROM unnest($3::text[], $4::text[]) AS b(n, k) WHERE b.n = r.name AND b.k = r.key)
		  AND ($5 OR priority < $6 OR (priority = $6 AND seq > $7))
		ORDER BY priority DESC, seq LIMIT $8 FOR UPDATE SKIP LOCKED`,
		c.names, c.blockedDefs, c.blockedKeyNames, c.blockedKeyKeys, c.first, c.curPrio, c.curSeq, claimBatch)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var batch []candidate
	for rows.Next() {
		var cand candidate
		if err := rows.Scan(&cand.seq, &cand.k.name, &cand.k.key, &cand.prio, &cand.retryAt); err != nil {
			return nil, err
		}
		batch = append(batch, cand)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	c.first = false
	return batch, nil
}

// consider admits cand when its key, semaphores and pool have room, and
// otherwise blocks its key or its definition for the rest of the claim.
func (c *claimScan) consider(cand candidate) {
	c.curPrio, c.curSeq = cand.prio, cand.seq
	c.scanned++
	if c.room == 0 || c.blockedDef[cand.k.name] || c.blockedKey[cand.k] {
		return
	}
	d := c.req.Defs[cand.k.name]
	if d.KeyLimit > 0 && c.g.perKey[cand.k] >= d.KeyLimit {
		c.blockedKey[cand.k] = true
		c.blockedKeyNames, c.blockedKeyKeys = append(c.blockedKeyNames, cand.k.name), append(c.blockedKeyKeys, cand.k.key)
		return
	}
	sems, semFull := c.permits(d)
	winStart, poolFull := c.poolRoom(d)
	if semFull || poolFull {
		c.blockedDef[cand.k.name] = true
		c.blockedDefs = append(c.blockedDefs, cand.k.name)
		return
	}
	c.take(cand, d, sems, winStart)
}

// permits lists the configured semaphores of d, each with a permit free;
// full when one has none.
func (c *claimScan) permits(d ClaimDef) (sems []string, full bool) {
	for _, name := range d.Semaphores {
		permits, ok := c.req.Semaphores[name]
		if !ok {
			continue // unconfigured: gates nothing
		}
		if c.g.held[name] >= permits {
			return nil, true
		}
		sems = append(sems, name)
	}
	return sems, false
}

// poolRoom checks d's pool: full at its concurrency or its rate (then the
// claimer is told to try again at the window's end); winStart is the rate
// window a run admitted now counts in (0: no rate gate).
func (c *claimScan) poolRoom(d ClaimDef) (winStart int64, full bool) {
	p, ok := c.req.Pools[d.Pool]
	if !ok || d.Pool == "" {
		return 0, false
	}
	if p.Concurrency > 0 && c.g.perPool[d.Pool] >= p.Concurrency {
		return 0, true
	}
	if p.Rate <= 0 {
		return 0, false
	}
	if c.g.used[d.Pool] >= p.Rate {
		if c.res.WakeAt == 0 || p.WindowEnd < c.res.WakeAt {
			c.res.WakeAt = p.WindowEnd
		}
		return 0, true
	}
	return p.WindowStart, false
}

// take admits cand and counts it in every gate it holds.
func (c *claimScan) take(cand candidate, d ClaimDef, sems []string, winStart int64) {
	c.g.perKey[cand.k]++
	if d.Pool != "" {
		c.g.perPool[d.Pool]++
		if winStart != 0 {
			c.g.used[d.Pool]++
		}
	}
	for _, name := range sems {
		c.g.held[name]++
	}
	a := admission{seq: cand.seq, retryAt: cand.retryAt, winStart: winStart, sems: sems}
	if winStart != 0 {
		a.poolID = d.Pool
	}
	c.admitted = append(c.admitted, a)
	c.room--
}

// recordClaims marks the admitted runs STARTING for the claimer, counts
// their rate slots and inserts their permits, in one round trip.
func recordClaims(ctx context.Context, tx pgx.Tx, req ClaimRequest, admitted []admission, res *ClaimResult) error {
	until := req.Now + int64(req.Lease)
	b := &pgx.Batch{}
	slots := map[[2]any]int{}
	var permitSems []string
	var permitSeqs []int64
	for _, a := range admitted {
		// As Start: the reason, control and output of the previous attempt
		// (a failure, a lease that expired) go, so a run delivered again
		// is not shown RUNNING with a reason for incompletion.
		b.Queue(`UPDATE warden_runs SET status = 2, attempt = attempt + 1, started_at = $2,
				pool_id = $3, window_start = $4, retry_at = 0, control = '', output = NULL, reason = '', owner = $5, lease_until = $6
			WHERE seq = $1 RETURNING `+runCols, a.seq, req.Now, a.poolID, a.winStart, req.Owner, until)
		if a.winStart != 0 {
			slots[[2]any{a.poolID, a.winStart}]++
		}
		for _, name := range a.sems {
			permitSems, permitSeqs = append(permitSems, name), append(permitSeqs, a.seq)
		}
	}
	for k, n := range slots {
		b.Queue(`INSERT INTO warden_pool_windows (pool_id, window_start, count) VALUES ($1, $2, $3)
			ON CONFLICT (pool_id, window_start) DO UPDATE SET count = warden_pool_windows.count + excluded.count`, k[0], k[1], n)
	}
	if len(permitSeqs) > 0 {
		b.Queue(`INSERT INTO warden_permits (semaphore, seq, holder, expires_at)
			SELECT sem, seq, $3, 0 FROM unnest($1::text[], $2::bigint[]) AS p(sem, seq)`, permitSems, permitSeqs, req.Owner)
	}
	br := tx.SendBatch(ctx, b)
	defer br.Close()
	for _, a := range admitted {
		var r store.Run
		if err := scanRun(br.QueryRow(), &r, true); err != nil {
			return err
		}
		r.RetryAt = a.retryAt
		res.Runs = append(res.Runs, r)
	}
	for range b.Len() - len(admitted) {
		if _, err := br.Exec(); err != nil {
			return err
		}
	}
	return br.Close()
}
