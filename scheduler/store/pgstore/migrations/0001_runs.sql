-- Runs, one row each. Statuses are store.Status numbers (1 QUEUED,
-- 2 STARTING, 3 RUNNING, 4 RETRY_WAIT, 5.. terminal); times are unix
-- nanoseconds from the sidecars' clocks, 0 when unset.
CREATE TABLE warden_runs (
    seq             bigserial PRIMARY KEY,
    name            text     NOT NULL,
    status          smallint NOT NULL,
    priority        integer  NOT NULL DEFAULT 0,
    attempt         integer  NOT NULL DEFAULT 0,
    key             text     NOT NULL DEFAULT '',
    tenant          text     NOT NULL DEFAULT '',
    idempotency_key text,    -- NULL when the submit carried none
    input           bytea,
    output          bytea,
    reason          text     NOT NULL DEFAULT '',
    control         text     NOT NULL DEFAULT '',
    created_at      bigint   NOT NULL DEFAULT 0,
    queued_at       bigint   NOT NULL DEFAULT 0,
    started_at      bigint   NOT NULL DEFAULT 0,
    finished_at     bigint   NOT NULL DEFAULT 0,
    retry_at        bigint   NOT NULL DEFAULT 0,
    pool_id         text     NOT NULL DEFAULT '',
    window_start    bigint   NOT NULL DEFAULT 0,
    -- The sidecar delivering or holding a STARTING/RUNNING run and until
    -- when its claim lasts without renewal; '' and 0 otherwise.
    owner           text     NOT NULL DEFAULT '',
    lease_until     bigint   NOT NULL DEFAULT 0
);

-- Idempotency keys are per definition.
CREATE UNIQUE INDEX warden_runs_idempotency ON warden_runs (name, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
-- The claim's scan: waiting runs by priority, then age.
CREATE INDEX warden_runs_queue ON warden_runs (priority DESC, seq) WHERE status = 1;
-- Admitted runs: the gates' counts and the lease sweep.
CREATE INDEX warden_runs_admitted ON warden_runs (lease_until) WHERE status IN (2, 3);
-- Retry waits the sweeper returns to the queue.
CREATE INDEX warden_runs_retry ON warden_runs (retry_at) WHERE status = 4;
-- List by status.
CREATE INDEX warden_runs_status ON warden_runs (status, seq);

-- A pool's fixed-window rate: one counter row per pool and window start,
-- consumed at claim, refunded when a delivery never started.
CREATE TABLE warden_pool_windows (
    pool_id      text   NOT NULL,
    window_start bigint NOT NULL,
    count        integer NOT NULL,
    PRIMARY KEY (pool_id, window_start)
);

-- Named semaphore permits, leased: expires_at 0 while the owner delivers
-- the run (its run lease covers it), then heartbeat-renewed.
CREATE TABLE warden_permits (
    semaphore  text   NOT NULL,
    seq        bigint NOT NULL,
    holder     text   NOT NULL,
    expires_at bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (semaphore, seq)
);
CREATE INDEX warden_permits_seq ON warden_permits (seq);
