"""Specs for the wire envelope: versioned, round-trips, inlines only small payloads."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from jobq.codec import INLINE_PAYLOAD_MAX_BYTES, VERSION, Envelope, UndecodableMessage, decode, encode
from jobq.errors import JobqError, TransportError
from jobq.models import Priority

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**53), 2**53)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)


def envelope(**overrides: Any) -> Envelope:
    fields: dict[str, Any] = {
        "run_id": "job_9847291048:1790834400000",
        "job_id": "job_9847291048",
        "fence": 104,
        "task": "billing.aggregate",
        "priority": Priority.HIGH,
        "attempt": 1,
    }
    fields.update(overrides)
    return Envelope(**fields)


def json_string_of_size(n_bytes: int) -> str:
    """A string whose compact JSON encoding is exactly `n_bytes` long (the quotes included)."""
    return "x" * (n_bytes - 2)


envelopes = st.builds(
    Envelope,
    run_id=st.text(min_size=1, max_size=60),
    job_id=st.text(min_size=1, max_size=40),
    fence=st.integers(0, 2**63),
    task=st.text(min_size=1, max_size=200),
    priority=st.sampled_from(list(Priority)),
    attempt=st.integers(1, 1001),
    payload=json_values,
    trace=st.none() | st.text(min_size=1, max_size=60),
    tenant_id=st.just("default") | st.from_regex(r"[A-Za-z0-9_.\-]{1,128}", fullmatch=True),
)


@given(original=envelopes)
def test_envelope_round_trips(original: Envelope) -> None:
    assert decode(encode(original)) == original


def test_envelope_without_payload_round_trips_as_not_inlined() -> None:
    decoded = decode(encode(envelope()))

    assert decoded == envelope()
    assert not decoded.payload_inline


def test_encoded_envelope_carries_the_version() -> None:
    doc = json.loads(encode(envelope()))

    assert doc["v"] == VERSION == 1


def test_encoded_envelope_holds_the_design_fields() -> None:
    doc = json.loads(encode(envelope(trace="00-abc-01")))

    assert doc == {
        "v": 1,
        "run_id": "job_9847291048:1790834400000",
        "job_id": "job_9847291048",
        "fence": 104,
        "task": "billing.aggregate",
        "priority": "HIGH",
        "attempt": 1,
        "trace": "00-abc-01",
    }


def test_the_tenant_travels_with_the_envelope_and_default_is_left_out() -> None:
    theirs = envelope(run_id="acme/job_9847291048:1790834400000", tenant_id="acme")
    doc = json.loads(encode(theirs))
    assert doc["tenant_id"] == "acme"
    assert decode(encode(theirs)).job_key == ("acme", "job_9847291048")
    assert "tenant_id" not in json.loads(encode(envelope()))  # messages of `default` are as they were
    assert decode(encode(envelope())).tenant_id == "default"


def test_small_payload_is_inlined() -> None:
    payload = {"billing_cycle": "2026-09", "dry_run": False}

    decoded = decode(encode(envelope(payload=payload)))

    assert decoded.payload_inline
    assert decoded.payload == payload


def test_null_payload_is_inlined_as_null() -> None:
    decoded = decode(encode(envelope(payload=None)))

    assert decoded.payload_inline
    assert decoded.payload is None


def test_payload_of_exactly_the_inline_limit_is_inlined() -> None:
    payload = json_string_of_size(INLINE_PAYLOAD_MAX_BYTES)

    decoded = decode(encode(envelope(payload=payload)))

    assert decoded.payload_inline
    assert decoded.payload == payload


def test_payload_over_the_inline_limit_is_left_in_the_store() -> None:
    body = encode(envelope(payload=json_string_of_size(INLINE_PAYLOAD_MAX_BYTES + 1)))

    assert "payload" not in json.loads(body)
    assert not decode(body).payload_inline
    assert len(body) < 1024


def test_inline_limit_counts_bytes_of_non_ascii_payloads() -> None:
    payload = "é" * INLINE_PAYLOAD_MAX_BYTES  # fewer characters than the limit would allow for ASCII

    body = encode(envelope(payload=payload))

    assert "payload" not in json.loads(body)
    assert len(body) < 1024


def test_undecodable_message_is_a_transport_error() -> None:
    assert issubclass(UndecodableMessage, TransportError)
    assert issubclass(UndecodableMessage, JobqError)


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"not json",
        b"\xff\xfe\x00",
        b"null",
        b"[]",
        b"42",
        b'"a string"',
        b"{}",
        b'{"v": 1}',
        b'{"v": 1, "run_id": "r", "job_id": "j", "fence": "many", "task": "t", "priority": "HIGH", "attempt": 1}',
        b'{"v": 1, "run_id": "r", "job_id": "j", "fence": 1, "task": "t", "priority": "URGENT", "attempt": 1}',
        b'{"v": 1, "run_id": "r", "job_id": "j", "fence": 1, "task": "t", "priority": "HIGH"}',
    ],
)
def test_garbage_raises_undecodable_message(body: bytes) -> None:
    with pytest.raises(UndecodableMessage):
        decode(body)


@pytest.mark.parametrize("version", [0, 2, "1", None])
def test_other_envelope_version_raises_undecodable_message_naming_it(version: object) -> None:
    doc = json.loads(encode(envelope()))
    doc["v"] = version

    with pytest.raises(UndecodableMessage, match="version"):
        decode(json.dumps(doc).encode())


def test_envelope_without_version_raises_undecodable_message() -> None:
    doc = json.loads(encode(envelope()))
    del doc["v"]

    with pytest.raises(UndecodableMessage):
        decode(json.dumps(doc).encode())


@given(body=st.binary(max_size=200))
def test_decoding_arbitrary_bytes_either_succeeds_or_raises_undecodable_message(body: bytes) -> None:
    try:
        decoded = decode(body)
    except UndecodableMessage:
        return
    assert isinstance(decoded, Envelope)
