package pgstore

import (
	"context"
	"fmt"
)

// GroupStat is the waiting and admitted runs of one definition, or of one
// key of a definition, across every sidecar.
type GroupStat struct {
	Name     string
	Key      string // "" on a definition's row
	Depth    int    // QUEUED
	Oldest   int64  // earliest queued_at of the QUEUED runs; 0 when none
	Admitted int    // STARTING or RUNNING
}

// maxKeyStats bounds the key rows per definition (the deepest first).
const maxKeyStats = 100

// QueueStats reports, for GET /v1/queues, the shared queue per definition
// and per key (keys only for the definitions in keyed, the 100 deepest
// each).
func (s *Store) QueueStats(ctx context.Context, keyed []string) (defs, keys []GroupStat, err error) {
	if err := s.check(); err != nil {
		return nil, nil, err
	}
	rows, err := s.pool.Query(ctx, `SELECT name, count(*) FILTER (WHERE status = 1), coalesce(min(queued_at) FILTER (WHERE status = 1), 0),
			count(*) FILTER (WHERE status IN `+admittedSQL+`)
		FROM warden_runs WHERE status IN (1, 2, 3) GROUP BY name ORDER BY name`)
	if err != nil {
		return nil, nil, fmt.Errorf("queue stats: %w", err)
	}
	for rows.Next() {
		var g GroupStat
		var depth, adm int64
		if err := rows.Scan(&g.Name, &depth, &g.Oldest, &adm); err != nil {
			rows.Close()
			return nil, nil, fmt.Errorf("queue stats: %w", err)
		}
		g.Depth, g.Admitted = int(depth), int(adm)
		defs = append(defs, g)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, nil, fmt.Errorf("queue stats: %w", err)
	}
	if len(keyed) == 0 {
		return defs, nil, nil
	}
	rows, err = s.pool.Query(ctx, `SELECT name, key, depth, oldest, adm FROM (
			SELECT name, key, count(*) FILTER (WHERE status = 1) AS depth,
				coalesce(min(queued_at) FILTER (WHERE status = 1), 0) AS oldest,
				count(*) FILTER (WHERE status IN `+admittedSQL+`) AS adm,
				row_number() OVER (PARTITION BY name ORDER BY count(*) FILTER (WHERE status = 1) DESC, key) AS rank
			FROM warden_runs WHERE status IN (1, 2, 3) AND name = ANY($1) GROUP BY name, key) k
		WHERE rank <= $2 ORDER BY name, depth DESC, key`, keyed, maxKeyStats)
	if err != nil {
		return nil, nil, fmt.Errorf("key stats: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var g GroupStat
		var depth, adm int64
		if err := rows.Scan(&g.Name, &g.Key, &depth, &g.Oldest, &adm); err != nil {
			return nil, nil, fmt.Errorf("key stats: %w", err)
		}
		g.Depth, g.Admitted = int(depth), int(adm)
		keys = append(keys, g)
	}
	if err := rows.Err(); err != nil {
		return nil, nil, fmt.Errorf("key stats: %w", err)
	}
	return defs, keys, nil
}

// PermitsHeld counts the permits held per semaphore across every sidecar
// (an expired permit the sweep has not freed yet is not counted).
func (s *Store) PermitsHeld(ctx context.Context, now int64) (map[string]int, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	rows, err := s.pool.Query(ctx, "SELECT semaphore, count(*) FROM warden_permits WHERE expires_at = 0 OR expires_at > $1 GROUP BY semaphore", now)
	if err != nil {
		return nil, fmt.Errorf("count permits: %w", err)
	}
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var name string
		var n int64
		if err := rows.Scan(&name, &n); err != nil {
			return nil, fmt.Errorf("count permits: %w", err)
		}
		out[name] = int(n)
	}
	return out, rows.Err()
}

// Hold says which shared gates are full for a waiting run of one
// definition and key, as the claim would count them now. It is read
// without the claim lock: a view for "why is my run not running?", not a
// decision.
type Hold struct {
	Lanes, Worker, Key, Semaphore, PoolConcurrency, PoolRate bool
}

// Holding reports the gates holding a waiting run of name with key under
// the gates of req (its Owner, Lanes, WorkerMax, Defs, Pools, Semaphores
// and Now).
func (s *Store) Holding(ctx context.Context, req ClaimRequest, name, key string) (Hold, error) {
	var h Hold
	if err := s.check(); err != nil {
		return h, err
	}
	d := req.Defs[name]
	var poolDefs []string
	for n, other := range req.Defs {
		if d.Pool != "" && other.Pool == d.Pool {
			poolDefs = append(poolDefs, n)
		}
	}
	p := req.Pools[d.Pool]
	var global, mine, keyed, pooled, used int64
	err := s.pool.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE owner = $1),
			count(*) FILTER (WHERE name = $2 AND key = $3), count(*) FILTER (WHERE name = ANY($4)),
			(SELECT coalesce(max(count), 0) FROM warden_pool_windows WHERE pool_id = $5 AND window_start = $6)
		FROM warden_runs WHERE status IN `+admittedSQL, req.Owner, name, key, poolDefs, d.Pool, p.WindowStart).
		Scan(&global, &mine, &keyed, &pooled, &used)
	if err != nil {
		return h, fmt.Errorf("read the gates of %s: %w", name, err)
	}
	held, err := s.PermitsHeld(ctx, req.Now)
	if err != nil {
		return h, err
	}
	h.Lanes = int(global) >= req.Lanes
	h.Worker = req.WorkerMax > 0 && int(mine) >= req.WorkerMax
	h.Key = d.KeyLimit > 0 && int(keyed) >= d.KeyLimit
	for _, sem := range d.Semaphores {
		if permits, ok := req.Semaphores[sem]; ok && held[sem] >= permits {
			h.Semaphore = true
		}
	}
	if d.Pool != "" {
		h.PoolConcurrency = p.Concurrency > 0 && int(pooled) >= p.Concurrency
		h.PoolRate = p.Rate > 0 && int(used) >= p.Rate
	}
	return h, nil
}
