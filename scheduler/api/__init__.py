"""The HTTP API (`jobq api`): FastAPI on uvicorn, `/v1` resources over the `Client`.

Modules: `app` (the app factory), `routes`, `auth` (bearer tokens to tenants), `tokens`
(issuing and hashing tokens; no web framework needed), `errors` (one JSON error shape),
`middleware` (request ids, size limits, content type, crash containment), `ratelimit`,
`schemas` (response models for the OpenAPI document), `state` (what the routes share) and
`server` (uvicorn glue).

Importing this package imports no web framework: `jobq tokens` works without the `api` extra.
"""
