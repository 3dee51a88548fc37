-- jobq schema 2: the run history written by jobq.history.postgres (every attempt's start and
-- outcome). Append-only; `id` orders a job's events as they were recorded.

CREATE TABLE jobq_run_events (
    id          BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id      TEXT COLLATE "C" NOT NULL,
    run_id      TEXT COLLATE "C" NOT NULL,
    tenant_id   TEXT COLLATE "C" NOT NULL,
    attempt     INTEGER NOT NULL,
    fence       BIGINT NOT NULL,
    kind        TEXT NOT NULL,
    at_ms       BIGINT NOT NULL,
    worker      TEXT,
    error       TEXT,
    duration_ms BIGINT
);
CREATE INDEX jobq_run_events_job ON jobq_run_events (job_id, id);
