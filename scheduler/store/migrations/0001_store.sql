-- jobq schema 1: jobs, runs, idempotency keys and workers.
--
-- Applied once by the migration runner in jobq.store.postgres, inside a transaction whose
-- search_path is the target schema, so names here are unqualified. Never edit an applied file:
-- the runner records each file's checksum and refuses a changed one; add a new file instead.
--
-- Ids, tenants and names use the "C" collation: ORDER BY and cursor comparisons then follow byte
-- order, the same order as the SQLite and in-memory stores, whatever the database's locale.

CREATE TABLE jobq_jobs (
    job_id       TEXT COLLATE "C" PRIMARY KEY,
    tenant_id    TEXT COLLATE "C" NOT NULL,
    name         TEXT COLLATE "C" NOT NULL,
    status       TEXT NOT NULL CHECK (status IN ('ACTIVE', 'PAUSED', 'COMPLETED', 'CANCELLED')),
    priority     SMALLINT NOT NULL CHECK (priority BETWEEN 0 AND 3),  -- Priority.rank: 0 is CRITICAL
    next_fire_ms BIGINT,
    version      BIGINT NOT NULL,
    doc          JSONB NOT NULL  -- the whole Job; the columns above are copies for queries
);
-- Beat: ACTIVE jobs whose next fire is due, earliest first.
CREATE INDEX jobq_jobs_due ON jobq_jobs (next_fire_ms, job_id) WHERE status = 'ACTIVE' AND next_fire_ms IS NOT NULL;
CREATE INDEX jobq_jobs_tenant ON jobq_jobs (tenant_id, job_id);

CREATE TABLE jobq_runs (
    run_id            TEXT COLLATE "C" PRIMARY KEY,
    job_id            TEXT COLLATE "C" NOT NULL,
    tenant_id         TEXT COLLATE "C" NOT NULL,
    nominal_ms        BIGINT NOT NULL,
    due_ms            BIGINT NOT NULL,
    priority          SMALLINT NOT NULL CHECK (priority BETWEEN 0 AND 3),
    state             TEXT NOT NULL
        CHECK (state IN ('SCHEDULED', 'CLAIMED', 'DISPATCHED', 'RUNNING', 'SUCCEEDED', 'FAILED', 'CANCELLED')),
    attempt           INTEGER NOT NULL,
    fence             BIGINT NOT NULL,
    version           BIGINT NOT NULL,
    lease_owner       TEXT,
    lease_expires_ms  BIGINT,
    last_heartbeat_ms BIGINT,
    last_error        TEXT,
    deadline_ms       BIGINT,
    prev_run_id       TEXT COLLATE "C",
    blocked_by        TEXT COLLATE "C",
    dead_letter       BOOLEAN NOT NULL DEFAULT FALSE,
    result            JSONB,
    created_ms        BIGINT NOT NULL,
    updated_ms        BIGINT NOT NULL,
    dispatched_ms     BIGINT,
    started_ms        BIGINT,
    finished_ms       BIGINT
) WITH (
    -- Every run is updated four or five times in its life; free space on each page keeps the new
    -- row version on the same page.
    fillfactor = 80,
    -- A queue table: vacuum after 2% dead rows rather than the default 20%, so the partial
    -- indexes below do not fill with dead entries that every claim has to step over.
    autovacuum_vacuum_scale_factor = 0.02,
    autovacuum_analyze_scale_factor = 0.02
);
-- The scanner's claim and beat's repair: due runs of one tier, earliest first (run_id breaks ties,
-- so the order is total and no sort is needed).
CREATE INDEX jobq_runs_due ON jobq_runs (priority, due_ms, run_id) WHERE state = 'SCHEDULED';
-- The reaper: leases that ran out, oldest first.
CREATE INDEX jobq_runs_lease ON jobq_runs (lease_expires_ms, run_id) WHERE state IN ('CLAIMED', 'DISPATCHED', 'RUNNING');
-- A job's runs, newest first (list_runs, run_counts, overlap checks).
CREATE INDEX jobq_runs_job ON jobq_runs (job_id, nominal_ms, run_id);
-- The dead-letter list, per tenant, newest first.
CREATE INDEX jobq_runs_dead ON jobq_runs (tenant_id, nominal_ms, run_id) WHERE dead_letter;

CREATE TABLE jobq_idempotency (
    tenant_id   TEXT COLLATE "C" NOT NULL,
    key         TEXT COLLATE "C" NOT NULL,
    fingerprint TEXT NOT NULL,
    job_id      TEXT COLLATE "C" NOT NULL,
    response    TEXT,
    created_ms  BIGINT NOT NULL,
    expires_ms  BIGINT NOT NULL,
    PRIMARY KEY (tenant_id, key)
);

CREATE TABLE jobq_workers (
    worker_id TEXT COLLATE "C" PRIMARY KEY,
    tasks     TEXT[] NOT NULL,
    queues    TEXT[] NOT NULL,
    seen_ms   BIGINT NOT NULL
);
