-- Retention (scheduler.store.retention): finished runs by when they
-- ended, so the purge finds the oldest without scanning the rest.
-- Statuses 5 to 9 are the terminal ones (store.Completed to
-- store.Cancelled).
CREATE INDEX warden_runs_finished ON warden_runs (finished_at) WHERE status BETWEEN 5 AND 9;
-- SCHEDULED runs (10) by their not_before (retry_at), for the sweep that
-- queues the ones due.
CREATE INDEX warden_runs_scheduled ON warden_runs (retry_at) WHERE status = 10;
