"""Secrets are write-only (issue 9, item 12): configuration errors, reprs of settings and log lines
never repeat a password or a secret parameter. (Webhook header values in the API:
tests/api/test_http.py::test_webhook_header_values_are_write_only.)"""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator

import pytest

from jobq import logs
from jobq.errors import ConfigError
from jobq.settings import Settings
from jobq.wiring import connect

SECRET = "hunter2"


@pytest.mark.parametrize(
    ("setting", "url"),
    [
        ("store", f"mysql://jobq:{SECRET}@db.internal/jobs"),
        ("index", f"memcached://jobq:{SECRET}@cache.internal:11211"),
        ("broker", f"kafka://jobq:{SECRET}@bus.internal:9092"),
        ("history", f"ftp://jobq:{SECRET}@files.internal/history"),
        ("store", f"dynamo://jobs?region=eu-west-1&aws_secret_access_key={SECRET}"),
    ],
)
def test_a_misconfigured_url_is_named_without_its_secret(setting: str, url: str) -> None:
    overrides = {"store": "memory://", setting: url, "history_flush_s": 0}
    with pytest.raises(ConfigError) as raised:
        connect(Settings.load(overrides, env={})).close()
    message = str(raised.value)
    assert SECRET not in message and SECRET not in repr(raised.value.value)
    assert message.startswith(f"{setting}=") and "***" in message


def test_a_setting_that_fails_validation_is_named_without_its_secret() -> None:
    with pytest.raises(ConfigError) as raised:
        Settings.load({"store_url": ["not", "a", f"postgresql://u:{SECRET}@h/db"]}, env={})
    assert SECRET not in str(raised.value)


def test_the_repr_of_settings_hides_url_passwords() -> None:
    settings = Settings.load(
        {"store": f"postgresql://jobq:{SECRET}@db/jobs", "broker": f"amqp://jobq:{SECRET}@mq//"}, env={}
    )
    for text in (repr(settings), str(settings)):
        assert SECRET not in text
        assert "postgresql://jobq:***@db/jobs" in text and "amqp://jobq:***@mq//" in text
    assert settings.store_url == f"postgresql://jobq:{SECRET}@db/jobs"  # the value itself is intact


@pytest.fixture
def captured() -> Iterator[dict[str, io.StringIO]]:
    streams = {"text": io.StringIO(), "json": io.StringIO()}
    logger = logging.getLogger("jobq.test-redaction")
    handlers = []
    for fmt, stream in streams.items():
        handler = logging.StreamHandler(stream)
        handler.setFormatter(logs.JsonFormatter() if fmt == "json" else logs.LogfmtFormatter())
        logger.addHandler(handler)
        handlers.append(handler)
    logger.setLevel(logging.INFO)
    yield streams
    for handler in handlers:
        logger.removeHandler(handler)


def test_log_lines_never_carry_a_url_password_or_secret_parameter(captured: dict[str, io.StringIO]) -> None:
    log = logging.getLogger("jobq.test-redaction")
    log.warning("cannot reach redis://:%s@cache:6379/0", SECRET, extra={"store": f"postgresql://u:{SECRET}@db/x"})
    try:
        raise RuntimeError(f"connect failed: host=db password={SECRET} sslmode=require")
    except RuntimeError:
        log.exception("pass failed for sqs://key:%s@sqs.eu-west-1?token=%s", SECRET, SECRET)
    for fmt, stream in captured.items():
        text = stream.getvalue()
        assert SECRET not in text, (fmt, text)
        assert "redis://:***@cache:6379/0" in text and "password=***" in text, (fmt, text)
