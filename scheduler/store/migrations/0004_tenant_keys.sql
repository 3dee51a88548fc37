-- jobq schema 4: job ids are scoped by tenant, and a job can be quarantined.
--
-- A job is keyed by (tenant_id, job_id): two tenants may hold the same job id, and neither can
-- see or take the other's. Runs keep their primary key (run ids stay globally unique: runs of the
-- tenant "default" keep the form job_id:ms, others are tenant/job_id:ms; runs written before
-- this migration keep the ids they have). A job's runs, its history and its lookups go through
-- (tenant_id, job_id).
--
-- QUARANTINED: a daemon met the job's record and it did not decode; it creates no runs.
--
-- Every statement can run again on a schema that has it already (IF EXISTS / IF NOT EXISTS).

ALTER TABLE jobq_jobs DROP CONSTRAINT IF EXISTS jobq_jobs_pkey;
ALTER TABLE jobq_jobs ADD CONSTRAINT jobq_jobs_pkey PRIMARY KEY (tenant_id, job_id);
-- The primary key serves a tenant's listing now; listings across tenants go by id, then tenant.
DROP INDEX IF EXISTS jobq_jobs_tenant;
CREATE INDEX IF NOT EXISTS jobq_jobs_id ON jobq_jobs (job_id, tenant_id);

ALTER TABLE jobq_jobs DROP CONSTRAINT IF EXISTS jobq_jobs_status_check;
ALTER TABLE jobq_jobs ADD CONSTRAINT jobq_jobs_status_check
    CHECK (status IN ('ACTIVE', 'PAUSED', 'COMPLETED', 'CANCELLED', 'QUARANTINED'));

-- A job's runs, newest first (list_runs, run_counts, cancel).
DROP INDEX IF EXISTS jobq_runs_job;
CREATE INDEX jobq_runs_job ON jobq_runs (tenant_id, job_id, nominal_ms, run_id);

-- A job's history, in the order recorded.
DROP INDEX IF EXISTS jobq_run_events_job;
CREATE INDEX jobq_run_events_job ON jobq_run_events (tenant_id, job_id, id);
