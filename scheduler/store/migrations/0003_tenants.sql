-- jobq schema 3: HTTP API tokens (only their SHA-256 is stored) and per-tenant webhook secrets.

CREATE TABLE jobq_tokens (
    token_id   TEXT COLLATE "C" PRIMARY KEY,
    tenant_id  TEXT COLLATE "C" NOT NULL,
    name       TEXT NOT NULL,
    token_hash TEXT COLLATE "C" NOT NULL UNIQUE,
    created_ms BIGINT NOT NULL,
    revoked_ms BIGINT
);
CREATE INDEX jobq_tokens_tenant ON jobq_tokens (tenant_id, created_ms);

CREATE TABLE jobq_tenants (
    tenant_id      TEXT COLLATE "C" PRIMARY KEY,
    webhook_secret TEXT NOT NULL
);
