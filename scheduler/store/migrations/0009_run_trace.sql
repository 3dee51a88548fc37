-- jobq schema 9: the W3C trace context (traceparent) a run's spans continue. Additive: old rows
-- have none, and nothing traced them.

ALTER TABLE jobq_runs ADD COLUMN IF NOT EXISTS trace TEXT;
