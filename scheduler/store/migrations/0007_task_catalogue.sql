-- jobq schema 7: the task catalogue, each task's latest declaration as its workers published it
-- (a TaskInfo JSON document). Additive. (Number 6 is reserved for the daemon registry.)

CREATE TABLE IF NOT EXISTS jobq_tasks (
    name         TEXT COLLATE "C" PRIMARY KEY,
    doc          TEXT NOT NULL,
    published_ms BIGINT NOT NULL
);
