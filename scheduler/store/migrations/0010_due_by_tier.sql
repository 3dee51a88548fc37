-- jobq schema 10: beat reads due jobs tier by tier, CRITICAL first (one range scan per priority),
-- so a backlog of LOW jobs larger than its batch never delays a CRITICAL one. The index by fire
-- time alone is replaced; a beat of the previous version still works (its query is answered from
-- this index with a sort), only slower, until it is upgraded.

CREATE INDEX IF NOT EXISTS jobq_jobs_due_tier ON jobq_jobs (priority, next_fire_ms, job_id)
    WHERE status = 'ACTIVE' AND next_fire_ms IS NOT NULL;
DROP INDEX IF EXISTS jobq_jobs_due;
