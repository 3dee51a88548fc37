"""Dashboard sessions: an API token is exchanged once for a signed, expiring session cookie.

The cookie holds the token's SHA-256 (never the token), an expiry and a random nonce, signed with
HMAC-SHA256. Every request looks the token up again by that hash, so revoking the token ends its
sessions at once. The signing key is random, made once per deployment and kept in the store as the
secret of the name `#ui-session` (`TenantStore.tenant_secret`; `#` cannot be in a tenant id), so
every API process and worker shares it and sessions survive restarts.

CSRF: every form that changes something carries a token derived from the session's nonce
(HMAC of it), checked on every POST; the cookie itself is HttpOnly and SameSite=Strict. Sign-in
(where there is no session yet) uses a double-submit cookie instead.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import threading
from dataclasses import dataclass

from jobq.ports import TenantStore

COOKIE = "jobq_session"
LOGIN_COOKIE = "jobq_signin"
CSRF_FIELD = "csrf_token"
KEY_NAME = "#ui-session"  # not a tenant id (they cannot hold '#'): the deployment's signing key


@dataclass(frozen=True, slots=True)
class Session:
    token_hash: str
    nonce: str
    expires_ms: int


class Sessions:
    """Issues and reads session cookies for one deployment."""

    def __init__(self, tenants: TenantStore, ttl_s: int) -> None:
        self.tenants = tenants
        self.ttl_ms = ttl_s * 1000
        self._key: bytes | None = None
        self._lock = threading.Lock()

    @property
    def key(self) -> bytes:
        with self._lock:
            if self._key is None:
                stored = self.tenants.tenant_secret(KEY_NAME, secrets.token_urlsafe(32))
                self._key = stored.encode()
            return self._key

    @staticmethod
    def new_nonce() -> str:
        """A random value for the sign-in form's double-submit cookie."""
        return secrets.token_urlsafe(16)

    def _sign(self, body: str) -> str:
        return hmac.new(self.key, body.encode(), hashlib.sha256).hexdigest()

    def issue(self, token_hash: str, now_ms: int) -> tuple[str, Session]:
        """A cookie value for a session of the token with this hash, and the session."""
        session = Session(token_hash, secrets.token_urlsafe(16), now_ms + self.ttl_ms)
        payload = {"h": session.token_hash, "n": session.nonce, "e": session.expires_ms}
        body = base64.urlsafe_b64encode(json.dumps(payload, separators=(",", ":")).encode()).decode().rstrip("=")
        return f"{body}.{self._sign(body)}", session

    def read(self, value: str | None, now_ms: int) -> Session | None:
        """The session a cookie value holds, or None when it is missing, forged, garbled or expired."""
        if not value or value.count(".") != 1 or len(value) > 1024:
            return None
        body, signature = value.split(".")
        if not hmac.compare_digest(signature, self._sign(body)):
            return None
        try:
            payload = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
            session = Session(str(payload["h"]), str(payload["n"]), int(payload["e"]))
        except (ValueError, KeyError, TypeError):
            return None
        return session if session.expires_ms > now_ms else None

    def csrf(self, session: Session) -> str:
        """The CSRF token of a session: forms that change something must send it back."""
        return self._sign("csrf:" + session.nonce)

    def csrf_ok(self, session: Session, given: str | None) -> bool:
        return given is not None and hmac.compare_digest(given, self.csrf(session))
