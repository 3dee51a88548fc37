-- jobq schema 6: the daemon registry. Every api, beat, scanner, reaper and worker process writes
-- its record here every few seconds; an entry counts as live until expires_ms. Additive: processes
-- of earlier versions never read it.

CREATE TABLE IF NOT EXISTS jobq_daemons (
    daemon_id  TEXT COLLATE "C" PRIMARY KEY,
    role       TEXT NOT NULL,
    expires_ms BIGINT NOT NULL,
    doc        TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS jobq_daemons_expires ON jobq_daemons (expires_ms);
