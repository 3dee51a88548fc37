"""Identifiers: time-ordered, collision-free job ids and worker ids."""

from __future__ import annotations

import os
import secrets
import socket

_ALPHABET = "0123456789abcdefghjkmnpqrstvwxyz"  # Crockford base32, lower case


def _base32(value: int, length: int) -> str:
    chars = []
    for _ in range(length):
        value, digit = divmod(value, 32)
        chars.append(_ALPHABET[digit])
    return "".join(reversed(chars))


def new_job_id(now_ms: int) -> str:
    """`job_` + 26 characters: 48 bits of milliseconds then 80 random bits, so ids sort by creation."""
    return "job_" + _base32((now_ms << 80) | secrets.randbits(80), 26)


def new_worker_id(role: str) -> str:
    """`<role>-<host>-<pid>-<random>`: unique per process start, readable in lease listings."""
    host = socket.gethostname().split(".")[0][:24] or "host"
    return f"{role}-{host}-{os.getpid()}-{secrets.token_hex(2)}"
