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
