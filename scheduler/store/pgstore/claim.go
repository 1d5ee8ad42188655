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

func (s *Store) claimTx(ctx context.Context, tx pgx.Tx, req ClaimRequest, res *ClaimResult) error {
	g, err := loadGates(ctx, tx, req)
	if err != nil {
		return err
	}
	perKey, perPool, held, used := g.perKey, g.perPool, g.held, g.used
	room := req.Lanes - g.global
	if req.WorkerMax > 0 {
		room = min(room, req.WorkerMax-g.mine)
	}
	if room <= 0 {
		return nil
	}

	names := make([]string, 0, len(req.Defs))
	for name := range req.Defs {
		names = append(names, name)
	}
	var admitted []admission
	blockedDefs := []string{}
	var blockedKeyNames, blockedKeyKeys []string
	blockedDef := map[string]bool{}
	blockedKey := map[defKey]bool{}
	var curPrio int32
	var curSeq int64
	first, scanned := true, 0
	for room > 0 && scanned < claimScanMax {
		rows, err := tx.Query(ctx, `SELECT seq, name, key, priority, retry_at FROM warden_runs r
			WHERE status = 1 AND name = ANY($1) AND NOT (name = ANY($2))
			  AND NOT EXISTS (SELECT 1 FROM unnest($3::text[], $4::text[]) AS b(n, k) WHERE b.n = r.name AND b.k = r.key)
			  AND ($5 OR priority < $6 OR (priority = $6 AND seq > $7))
			ORDER BY priority DESC, seq LIMIT $8 FOR UPDATE SKIP LOCKED`,
			names, blockedDefs, blockedKeyNames, blockedKeyKeys, first, curPrio, curSeq, claimBatch)
		if err != nil {
			return err
		}
		type cand struct {
			seq     int64
			k       defKey
			prio    int32
			retryAt int64
		}
		var batch []cand
		for rows.Next() {
			var c cand
			if err := rows.Scan(&c.seq, &c.k.name, &c.k.key, &c.prio, &c.retryAt); err != nil {
				rows.Close()
				return err
			}
			batch = append(batch, c)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		first = false
		for _, c := range batch {
			curPrio, curSeq = c.prio, c.seq
			scanned++
			if room == 0 || blockedDef[c.k.name] || blockedKey[c.k] {
				continue
			}
			d := req.Defs[c.k.name]
			if d.KeyLimit > 0 && perKey[c.k] >= d.KeyLimit {
				blockedKey[c.k] = true
				blockedKeyNames, blockedKeyKeys = append(blockedKeyNames, c.k.name), append(blockedKeyKeys, c.k.key)
				continue
			}
			semFull := false
			var sems []string
			for _, name := range d.Semaphores {
				permits, ok := req.Semaphores[name]
				if !ok {
					continue // unconfigured: gates nothing
				}
				if held[name] >= permits {
					semFull = true
					break
				}
				sems = append(sems, name)
			}
			poolFull := false
			var winStart int64
			if p, ok := req.Pools[d.Pool]; ok && d.Pool != "" {
				if p.Concurrency > 0 && perPool[d.Pool] >= p.Concurrency {
					poolFull = true
				} else if p.Rate > 0 {
					if used[d.Pool] >= p.Rate {
						poolFull = true
						if res.WakeAt == 0 || p.WindowEnd < res.WakeAt {
							res.WakeAt = p.WindowEnd
						}
					} else {
						winStart = p.WindowStart
					}
				}
			}
			if semFull || poolFull {
				blockedDef[c.k.name] = true
				blockedDefs = append(blockedDefs, c.k.name)
				continue
			}
			perKey[c.k]++
			if d.Pool != "" {
				perPool[d.Pool]++
				if winStart != 0 {
					used[d.Pool]++
				}
			}
			for _, name := range sems {
				held[name]++
			}
			a := admission{seq: c.seq, retryAt: c.retryAt, winStart: winStart, sems: sems}
			if winStart != 0 {
				a.poolID = d.Pool
			}
			admitted = append(admitted, a)
			room--
		}
		if len(batch) < claimBatch {
			break
		}
	}
	if len(admitted) == 0 {
		return nil
	}
	return recordClaims(ctx, tx, req, admitted, res)
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
