-- jobq schema 7: the task catalogue (each task's latest declaration as its workers published it,
-- a TaskInfo JSON document), and each run's attempt budget base (a redrive grants a fresh budget:
-- the attempts made before it). Additive: old rows get 0. (Number 6 is the daemon registry's.)

CREATE TABLE IF NOT EXISTS jobq_tasks (
    name         TEXT COLLATE "C" PRIMARY KEY,
    doc          TEXT NOT NULL,
    published_ms BIGINT NOT NULL
);

ALTER TABLE jobq_runs ADD COLUMN IF NOT EXISTS attempt_base INTEGER NOT NULL DEFAULT 0;
