"""How the Redis time index writes a run: its member in a bucket, its score, the hash and tag of
its entry in the id directory, and the minute label of its bucket. Pure functions, no I/O.

Memory decides the encoding (the capacity plan budgets 64 B per indexed run; see
`jobq.timeindex.redis`):

* Compact members. A `jobq.ids` run id (`job_<26 base32>:<ms>`, 44 characters) is stored in 22
  bytes: 16 for the 128-bit job id, 6 for the fire time. A run of another tenant than `default`
  (`<tenant>/job_<26 base32>:<ms>`) is stored as 0xFF 0xFE, the tenant's length and bytes, then
  the same 22 bytes. Any other id is stored verbatim behind a 0xFF byte, which never starts a
  compact member; UTF-8 never holds 0xFE, so no verbatim id starts 0xFF 0xFE either, and every id
  round-trips exactly.
* Small scores. A score is `due_ms - (minute start + 30 s)`, which fits the listpack's 16-bit
  integer encoding; `base_ms` is a bucket's origin.
* The id directory's field is a 63-bit hash of the run id and its value a 31-bit tag of the run's
  one live copy (bucket and score): both are integers in a listpack.
"""

from __future__ import annotations

import hashlib
import re
from datetime import UTC, datetime
from functools import lru_cache

MINUTE_MS = 60_000
BIAS_MS = 30_000  # score = due - (minute start + 30 s): within ±30,000, a 16-bit listpack integer

CROCKFORD = "0123456789abcdefghjkmnpqrstvwxyz"  # jobq.ids' alphabet
_TO_PYTHON_BASE32 = str.maketrans(CROCKFORD, "0123456789abcdefghijklmnopqrstuv")  # int(x, 32) digits
_DIGIT_PAIRS = [a + b for a in CROCKFORD for b in CROCKFORD]  # 10 bits -> two digits
_COMPACT_ID = re.compile(r"job_([0-7][0-9a-hjkmnp-tv-z]{25}):(0|[1-9][0-9]{0,14})", re.ASCII)
_TENANT_ID = re.compile(  # Run.make_id of a tenant other than `default`: `<tenant>/<job_id>:<ms>`
    r"([A-Za-z0-9_.\-]{1,128})/(job_[0-7][0-9a-hjkmnp-tv-z]{25}:(?:0|[1-9][0-9]{0,14}))", re.ASCII
)
_VERBATIM = 0xFF  # first byte of a member holding the id as UTF-8; compact members start lower
_TENANT = 0xFE  # second byte (after 0xFF) of a compact member of a tenant's run: never UTF-8


def encode_member(run_id: str) -> bytes:
    """The sorted-set member for `run_id`: 22 bytes for a `jobq.ids` run id (plus 3 and the tenant's
    length for another tenant's), else 0xFF + UTF-8.

    Deterministic, so adding a run again to the same bucket moves it instead of copying it."""
    compact = _compact(run_id)
    if compact is not None and compact[0] != _VERBATIM:
        return compact
    tenant = _TENANT_ID.fullmatch(run_id)
    if tenant is not None:
        compact = _compact(tenant.group(2))
        if compact is not None:
            name = tenant.group(1).encode("ascii")
            return bytes([_VERBATIM, _TENANT, len(name)]) + name + compact
    return bytes([_VERBATIM]) + run_id.encode("utf-8", "surrogatepass")


def _compact(run_id: str) -> bytes | None:
    """22 bytes for `job_<26 base32>:<ms>` (those of a job id whose first byte is 0xFF too: the
    caller decides), else None."""
    match = _COMPACT_ID.fullmatch(run_id)
    if match is None:
        return None
    job = int(match.group(1).translate(_TO_PYTHON_BASE32), 32)  # < 2**128: the first digit is 0-7
    fire_ms = int(match.group(2))
    if fire_ms >= 1 << 48:
        return None
    return job.to_bytes(16, "big") + fire_ms.to_bytes(6, "big")


def decode_member(member: bytes) -> str:
    """The run id `encode_member` was given."""
    if member[0] != _VERBATIM:
        return _expand(member)
    if len(member) > 2 and member[1] == _TENANT:
        end = 3 + member[2]
        return f"{member[3:end].decode('ascii')}/{_expand(member[end:])}"
    return member[1:].decode("utf-8", "surrogatepass")


def _expand(compact: bytes) -> str:
    job = int.from_bytes(compact[:16], "big")
    digits = "".join([_DIGIT_PAIRS[(job >> shift) & 1023] for shift in range(120, -1, -10)])  # 26 digits
    return f"job_{digits}:{int.from_bytes(compact[16:], 'big')}"


def id_hash(run_id: str) -> int:
    """63 bits, so Redis stores the directory field as an integer (10 bytes in a listpack)."""
    return int.from_bytes(hashlib.blake2b(run_id.encode("utf-8", "surrogatepass"), digest_size=8).digest()) >> 1


def copy_tag(priority: str, suffix: str, score: int) -> int:
    """31 bits naming one copy of a run (its bucket and score); an int32 in the listpack."""
    return int.from_bytes(hashlib.blake2b(f"{priority}:{suffix}:{score}".encode(), digest_size=4).digest()) >> 1


@lru_cache(maxsize=8192)
def minute_label(minute: int) -> str:
    return datetime.fromtimestamp(minute * 60, UTC).strftime("%Y%m%d%H%M")


@lru_cache(maxsize=8192)
def label_minute(label: str) -> int:
    return int(datetime.strptime(label, "%Y%m%d%H%M").replace(tzinfo=UTC).timestamp()) // 60


def base_ms(suffix: str) -> int:
    """The score origin of the bucket `<M>:<sub>`: its minute's start plus the bias."""
    return label_minute(suffix[:12]) * MINUTE_MS + BIAS_MS
