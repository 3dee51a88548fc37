-- jobq schema 5: how many times a run was given back without using an attempt (a worker shut
-- down while it ran, or no worker that took it served its task). Additive: old rows count 0.

ALTER TABLE jobq_runs ADD COLUMN IF NOT EXISTS handbacks INTEGER NOT NULL DEFAULT 0;
