-- jobq schema 8: results are kept for `result_ttl_s` after a run finishes; the reaper clears the
-- oldest first. Additive: an index, no column.

CREATE INDEX IF NOT EXISTS jobq_runs_result ON jobq_runs (finished_ms)
    WHERE result IS NOT NULL AND state IN ('SUCCEEDED', 'FAILED', 'CANCELLED');
