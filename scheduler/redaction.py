"""Secrets are write-only: what jobq shows or logs never repeats one.

- Connection URLs: the password of `scheme://user:password@host` and the values of query
  parameters named like a secret (`aws_secret_access_key=`, `password=`, `token=`, `sig=`...)
  become `***` (`redact_url`, and `redact_text` for URLs inside free text such as an error
  message or a log line).
- Webhook headers: a value is shown only for headers that are public by nature (`Content-Type`,
  `Accept`, `User-Agent`...); every other value (`Authorization`, `X-Api-Key`, custom headers)
  is `***` (`redact_headers`). The worker still sends them; only views hide them.
- `ConfigError` messages, `repr(Settings)` and both log formats pass through these functions.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

# No jobq imports: `jobq.errors` uses this module, and everything imports `jobq.errors`.

REDACTED = "***"
# A name containing one of these (in any case) holds a secret: query parameters, config keys.
SECRET_WORDS = (
    "password",
    "passwd",
    "pwd",
    "secret",
    "token",
    "credential",
    "signature",
    "sig",
    "api_key",
    "apikey",
    "access_key",
    "private_key",
    "auth",
    "session",
    "cookie",
)
# Header values shown as they are: standard headers that describe the request, never a secret.
PUBLIC_HEADERS = frozenset(
    {"accept", "accept-charset", "accept-language", "content-language", "content-type", "user-agent"}
)

_WORDS = "|".join(re.escape(w) for w in SECRET_WORDS)
# scheme://user:password@  (the password runs to the last '@' before a '/' or whitespace)
_URL_PASSWORD = re.compile(r"(?P<head>\b[A-Za-z][A-Za-z0-9+.\-]*://[^\s:/@]*:)(?P<secret>[^\s/]*)@")
# name=value where the name contains a secret word (URL queries, libpq DSNs, logfmt fields)
_SECRET_PAIR = re.compile(rf"(?P<head>(?<![\w.\-])[\w.\-]*(?:{_WORDS})[\w.\-]*=)(?P<secret>[^&\s'\"]+)", re.IGNORECASE)


def is_secret_name(name: str) -> bool:
    lower = name.lower()
    return any(word in lower for word in SECRET_WORDS)


def redact_text(text: str) -> str:
    """`text` with URL passwords and `secret_name=value` values replaced by `***`."""
    if "=" not in text and "@" not in text:
        return text  # the common case, at no cost
    text = _URL_PASSWORD.sub(lambda m: f"{m['head']}{REDACTED}@", text)
    return _SECRET_PAIR.sub(lambda m: f"{m['head']}{REDACTED}", text)


def redact_url(url: str) -> str:
    """`url` without its password or secret query values; every other character is left as it is."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return redact_text(url)
    shown = url
    userinfo, at, _host = parts.netloc.rpartition("@")
    if at and ":" in userinfo:
        shown = shown.replace(f"{userinfo}@", f"{userinfo.partition(':')[0]}:{REDACTED}@", 1)
    if parts.query:
        query = "&".join(_redact_pair(pair) for pair in parts.query.split("&"))
        if query != parts.query:
            shown = shown.replace(f"?{parts.query}", f"?{query}", 1)
    return shown


def _redact_pair(pair: str) -> str:
    name, eq, _value = pair.partition("=")
    return f"{name}={REDACTED}" if eq and is_secret_name(name) else pair


def redact_value(key: str, value: Any) -> Any:
    """A configuration value fit for a message: all of it when `key` names a secret, else its text
    with URL passwords and secret parameters hidden."""
    if value is None:
        return None
    if is_secret_name(key.rpartition(".")[2]):
        return REDACTED
    if isinstance(value, str):
        return redact_url(value) if "://" in value else redact_text(value)
    text = repr(value)  # a list or mapping that holds a URL, say
    cleaned = redact_text(text)
    return value if cleaned == text else cleaned


def redact_headers(headers: Mapping[str, str]) -> dict[str, str]:
    return {name: value if name.lower() in PUBLIC_HEADERS else REDACTED for name, value in headers.items()}
