-- Retention (scheduler.store.retention): finished runs by when they
-- ended, so the purge finds the oldest without scanning the rest.
-- Statuses 5 and up are the terminal ones (store.Completed on).
CREATE INDEX warden_runs_finished ON warden_runs (finished_at) WHERE status >= 5;
