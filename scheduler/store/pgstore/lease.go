package pgstore

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/warden-dev/warden/scheduler/store"
)

// Renew extends the lease of every STARTING/RUNNING run owner holds to
// until, and reports how many it holds. The owner calls it well within
// the lease; a sidecar that stops calling it (killed, partitioned) loses
// its runs to the sweep once the lease ends.
func (s *Store) Renew(ctx context.Context, owner string, until int64) (int, error) {
	ctx, cancel := bound(ctx)
	defer cancel()
	if err := s.check(); err != nil {
		return 0, err
	}
	tag, err := s.pool.Exec(ctx, "UPDATE warden_runs SET lease_until = $2 WHERE owner = $1 AND status IN "+admittedSQL, owner, until)
	if err != nil {
		return 0, fmt.Errorf("renew the leases of %s: %w", owner, err)
	}
	return int(tag.RowsAffected()), nil
}

// LeasePermits sets when the semaphore permits of run seq expire unless
// renewed again: called when the worker accepts the run and on each of its
// heartbeats. Before that (while the owner delivers) permits do not expire
// on their own; the run's lease covers them.
func (s *Store) LeasePermits(ctx context.Context, owner string, seq uint64, until int64) error {
	ctx, cancel := bound(ctx)
	defer cancel()
	if err := s.check(); err != nil {
		return err
	}
	if _, err := s.pool.Exec(ctx, "UPDATE warden_permits SET expires_at = $2 WHERE seq = $1 AND holder = $3", int64(seq), until, owner); err != nil {
		return fmt.Errorf("lease the permits of run %d: %w", seq, err)
	}
	return nil
}

// Expired is a run whose owner's lease ended, as the sweep found it.
type Expired struct {
	Run   store.Run // as it was: STARTING or RUNNING
	Owner string
}

// Decision is what the sweep does with a run whose lease expired.
type Decision struct {
	Status store.Status // Queued (delivered again) or a terminal status
	Reason string
}

// SweepResult says what a sweep changed.
type SweepResult struct {
	Requeued      int // expired runs back in the queue
	Ended         int // expired runs the retry policy ended
	Refunded      int // rate slots given back (deliveries that never started)
	RetriesQueued int // RETRY_WAIT runs whose retry_at passed
	// SCHEDULED runs whose not_before passed
	ScheduledQueued int
	PermitsExpired  int
	TimedOut        int // QUEUED runs past their schedule_to_start_timeout
}

func (r SweepResult) changed() bool {
	return r.Requeued+r.Ended+r.RetriesQueued+r.ScheduledQueued+r.PermitsExpired+r.TimedOut > 0
}

// SweepRequest is what one sweep looks at.
type SweepRequest struct {
	Now int64
	// Decide says what happens to a RUNNING run whose owner's lease
	// expired (the worker may have done the work): the retry policy's
	// call. A STARTING run (delivery never acknowledged) always returns to
	// the queue with its rate slot refunded, as after a restart.
	Decide func(Expired) Decision
	// ScheduleToStart is each definition's schedule_to_start_timeout in
	// nanoseconds (absent or 0: none).
	ScheduleToStart map[string]int64
	// restarted, set by Restart, is an owner whose process has just
	// started: its STARTING runs count as expired whatever their lease.
	restarted string
}

// sweepMax bounds the expired runs one sweep handles; the next takes the
// rest.
const sweepMax = 1000

// Sweep returns to the queue (or ends, as req.Decide says) the runs whose
// owner's lease expired, frees expired semaphore permits, moves RETRY_WAIT
// runs whose time came back to QUEUED, times out queued runs past their
// schedule_to_start_timeout and forgets old pool windows — in one
// transaction, under the claim lock so a concurrent claim counts the
// result exactly. Any sidecar may sweep; what changed wakes the others.
func (s *Store) Sweep(ctx context.Context, req SweepRequest) (SweepResult, error) {
	var res SweepResult
	err := s.underClaimLock(ctx, func(ctx context.Context, tx pgx.Tx) error {
		res = SweepResult{}
		return s.sweepTx(ctx, tx, req, &res)
	})
	if err != nil {
		return SweepResult{}, fmt.Errorf("sweep expired leases: %w", err)
	}
	return res, nil
}

func (s *Store) sweepTx(ctx context.Context, tx pgx.Tx, req SweepRequest, res *SweepResult) error {
	rows, err := tx.Query(ctx, "SELECT "+metaCols+`, owner FROM warden_runs
		WHERE status IN `+admittedSQL+` AND ((lease_until <> 0 AND lease_until <= $1) OR (status = 2 AND $3 <> '' AND owner = $3))
		ORDER BY seq LIMIT $2 FOR UPDATE SKIP LOCKED`, req.Now, sweepMax, req.restarted)
	if err != nil {
		return err
	}
	var expired []Expired
	for rows.Next() {
		var e Expired
		var st int16
		var seq int64
		r := &e.Run
		if err := rows.Scan(&seq, &r.Name, &st, &r.Priority, &r.Attempt, &r.Key, &r.Tenant, &r.IdempotencyKey,
			&r.Reason, &r.Control, &r.CreatedAt, &r.QueuedAt, &r.StartedAt, &r.FinishedAt, &r.RetryAt, &r.PoolID, &r.WindowStart,
			&e.Owner); err != nil {
			rows.Close()
			return err
		}
		r.Seq, r.Status = uint64(seq), store.Status(st)
		expired = append(expired, e)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	for _, e := range expired {
		r := e.Run
		d := Decision{Status: store.Queued, Reason: fmt.Sprintf("sidecar %s stopped renewing its lease before the worker accepted the run", e.Owner)}
		if r.Status == store.Starting && req.restarted != "" && e.Owner == req.restarted {
			d.Reason = fmt.Sprintf("sidecar %s restarted before the worker accepted the run", e.Owner)
		}
		if r.Status == store.Running && req.Decide != nil {
			d = req.Decide(e)
		}
		if r.Status == store.Starting && r.PoolID != "" && r.WindowStart != 0 {
			// Delivery never acknowledged: give the rate slot back (a
			// window that ended no longer gates anything).
			tag, err := tx.Exec(ctx, `UPDATE warden_pool_windows SET count = count - 1
				WHERE pool_id = $1 AND window_start = $2 AND count > 0`, r.PoolID, r.WindowStart)
			if err != nil {
				return err
			}
			res.Refunded += int(tag.RowsAffected())
		}
		if d.Status == store.Queued {
			// retry_at marks a RUNNING run's attempt as counted by the
			// retry budget already (the policy decided on it).
			retryAt := int64(0)
			if r.Status == store.Running {
				retryAt = req.Now
			}
			_, err = tx.Exec(ctx, `UPDATE warden_runs SET status = 1, queued_at = $2, pool_id = '', window_start = 0,
				owner = '', lease_until = 0, retry_at = $3, reason = $4 WHERE seq = $1`, int64(r.Seq), req.Now, retryAt, d.Reason)
			res.Requeued++
		} else {
			_, err = tx.Exec(ctx, `UPDATE warden_runs SET status = $2, finished_at = $3, owner = '', lease_until = 0,
				reason = $4 WHERE seq = $1`, int64(r.Seq), int16(d.Status), req.Now, d.Reason)
			res.Ended++
		}
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, "DELETE FROM warden_permits WHERE seq = $1", int64(r.Seq)); err != nil {
			return err
		}
	}
	tag, err := tx.Exec(ctx, "DELETE FROM warden_permits WHERE expires_at <> 0 AND expires_at <= $1", req.Now)
	if err != nil {
		return err
	}
	res.PermitsExpired = int(tag.RowsAffected())
	tag, err = tx.Exec(ctx, "UPDATE warden_runs SET status = 1, queued_at = $1 WHERE status = 4 AND retry_at <= $1", req.Now)
	if err != nil {
		return err
	}
	res.RetriesQueued = int(tag.RowsAffected())
	// Scheduled runs whose time came join the queue as new runs: no
	// retry_at left, so their first delivery counts as an execution.
	tag, err = tx.Exec(ctx, "UPDATE warden_runs SET status = 1, queued_at = $1, retry_at = 0 WHERE status = 10 AND retry_at <= $1", req.Now)
	if err != nil {
		return err
	}
	res.ScheduledQueued = int(tag.RowsAffected())
	for name, sts := range req.ScheduleToStart {
		if sts <= 0 {
			continue
		}
		tag, err := tx.Exec(ctx, `UPDATE warden_runs SET status = $4, finished_at = $2, control = 'timeout',
				reason = format('schedule_to_start_timeout %s exceeded: waited %s ms in the shared queue', $5::text,
					(($2 - queued_at) / 1000000)::text)
			WHERE status = 1 AND name = $1 AND queued_at + $3 <= $2`, name, req.Now, sts, int16(store.TimedOut), time.Duration(sts).String())
		if err != nil {
			return err
		}
		res.TimedOut += int(tag.RowsAffected())
	}
	// Windows are at most a day long; older counters gate nothing.
	if _, err := tx.Exec(ctx, "DELETE FROM warden_pool_windows WHERE window_start < $1", req.Now-2*86400e9); err != nil {
		return err
	}
	if res.changed() {
		if _, err := tx.Exec(ctx, "SELECT pg_notify($1, 'sweep')", s.channel); err != nil {
			return err
		}
	}
	return nil
}

// Restart is what a sidecar does once when its process starts as owner
// (an owner id kept across restarts: the scheduler keeps it in its data
// directory). In one transaction, under the claim lock:
//
//   - its RUNNING runs (the worker accepted them from the previous process)
//     stay its own: their leases are renewed to until, whether or not they
//     had expired, unless another sidecar's sweep took them first, and
//     their permits still held no longer expire on their own (the caller
//     leases them again, LeasePermits);
//   - its STARTING runs (deliveries that died with the previous process)
//     are swept at once, exactly as an expired lease is: back to QUEUED
//     with their rate slot refunded while its window is counted, the next
//     delivery carrying the next attempt;
//   - then the rest of a sweep at req.Now, as Sweep does.
//
// It returns the RUNNING runs the owner holds, whole (with input), for the
// scheduler to take back (complete, heartbeat, timeouts).
func (s *Store) Restart(ctx context.Context, owner string, until int64, req SweepRequest) ([]store.Run, SweepResult, error) {
	if owner == "" {
		return nil, SweepResult{}, fmt.Errorf("restart: no owner")
	}
	var res SweepResult
	var held []store.Run
	err := s.underClaimLock(ctx, func(ctx context.Context, tx pgx.Tx) error {
		res, held = SweepResult{}, nil
		if _, err := tx.Exec(ctx, "UPDATE warden_runs SET lease_until = $2 WHERE owner = $1 AND status = 3", owner, until); err != nil {
			return err
		}
		// Their permits still held are kept whatever their lease, covered
		// by the run's lease until the scheduler leases them again (from
		// the restart, as the embedded store does).
		if _, err := tx.Exec(ctx, `UPDATE warden_permits SET expires_at = 0 WHERE holder = $1
			AND seq IN (SELECT seq FROM warden_runs WHERE owner = $1 AND status = 3)`, owner); err != nil {
			return err
		}
		req.restarted = owner
		if err := s.sweepTx(ctx, tx, req, &res); err != nil {
			return err
		}
		rows, err := tx.Query(ctx, "SELECT "+runCols+" FROM warden_runs WHERE owner = $1 AND status = 3 ORDER BY seq", owner)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var r store.Run
			if err := scanRun(rows, &r, true); err != nil {
				return err
			}
			held = append(held, r)
		}
		return rows.Err()
	})
	if err != nil {
		return nil, SweepResult{}, fmt.Errorf("take back the runs of %s: %w", owner, err)
	}
	return held, res, nil
}
