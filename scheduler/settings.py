"""One frozen settings object, built once at the edge from a file, `JOBQ_*` variables and flags.

Precedence, lowest first: defaults, the TOML file (`--config` or `JOBQ_CONFIG`), environment
variables, explicit overrides (command-line flags). Backends are chosen by URL; the index,
broker and history default to the store's own database when the store is SQLite or memory.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from jobq.errors import ConfigError
from jobq.redaction import redact_url

# Short names accepted in files and variables for the four backend URLs.
_ALIASES = {"store": "store_url", "index": "index_url", "broker": "broker_url", "history": "history_url"}


class Settings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    store_url: str = "sqlite:///jobq.db"
    index_url: str | None = None  # default: the store's own (a view of its runs)
    broker_url: str | None = None  # default: the store's database (a queue table)
    history_url: str | None = None  # default: the store's database

    horizon_s: float = Field(default=60.0, gt=0, description="runs are materialised this far ahead")
    beat_interval_s: float = Field(default=1.0, gt=0)
    repair_interval_s: float = Field(default=5.0, gt=0)
    scan_interval_s: float = Field(default=0.25, gt=0)
    scan_batch: int = Field(default=500, ge=1, le=5000)
    dispatch_lookahead_s: float = Field(
        default=0.3, ge=0, le=2.0, description="runs due this soon are claimed and handed to a worker, held until due"
    )
    claim_lease_s: float = Field(default=10.0, gt=0)
    schedule_to_start_s: float = Field(default=300.0, gt=0)
    lease_s: float = Field(default=30.0, gt=0)
    heartbeat_s: float = Field(default=10.0, gt=0)
    registry_heartbeat_s: float = Field(
        default=5.0, ge=0, description="daemon registry heartbeat (entries live 3 of them); 0 turns it off"
    )
    reaper_interval_s: float = Field(default=1.0, gt=0)
    visibility_timeout_s: float = Field(default=60.0, gt=0)
    misfire_threshold_s: float = Field(default=60.0, ge=0)
    overlap_hold_s: float = Field(default=1.0, gt=0)
    max_payload_bytes: int = Field(default=256 * 1024, gt=0)
    shutdown_grace_s: float = Field(default=30.0, ge=0)
    idempotency_ttl_s: int = Field(default=86_400, gt=0)
    group_commit: bool = Field(
        default=True, description="concurrent submissions in one process share one store transaction"
    )
    result_ttl_s: int = Field(default=86_400, gt=0, description="a finished run's result is kept this long")
    history_flush_s: float = Field(default=0.2, ge=0, description="0 writes history synchronously")

    unknown_tasks: str = Field(
        default="warn",
        pattern="^(warn|refuse)$",
        description="a submission naming a task no worker has published: warn (it waits for one) or refuse",
    )

    concurrency: int = Field(default=4, ge=1, le=10_000)
    queues: tuple[str, ...] = ("critical", "high", "default", "low")
    # Worker execution (docs/workers.md). None: the command's default (`jobq worker`: prefork;
    # `jobq dev` and `Worker(...)` in Python: threads).
    pool: str | None = Field(default=None, pattern="^(prefork|threads|gevent|asyncio|solo)$")
    time_limit_s: float | None = Field(default=None, gt=0, description="hard limit for tasks with no timeout_s")
    soft_time_limit_s: float | None = Field(default=None, gt=0, description="SoftTimeLimitExceeded raised in the task")
    max_tasks_per_child: int | None = Field(default=None, ge=1, description="prefork: recycle a child after N tasks")
    max_memory_per_child_kib: int | None = Field(default=None, ge=1, description="prefork: recycle above this RSS")
    autoscale: tuple[int, int] | None = Field(default=None, description="(max, min) pool size, from `MAX,MIN`")

    # HTTP API (`jobq api`, `jobq dev`)
    api_host: str = "127.0.0.1"
    api_port: int = Field(default=8080, ge=0, le=65535)
    api_workers: int = Field(default=1, ge=1, le=64)
    api_max_body_bytes: int = Field(default=1024 * 1024, gt=0)
    api_max_header_bytes: int = Field(default=16 * 1024, gt=0)
    # Believe a proxy's `X-Forwarded-Proto: https` (the dashboard's cookies are then `Secure`).
    api_trust_forwarded_proto: bool = False
    ui_session_ttl_s: int = Field(default=12 * 3600, ge=60, le=30 * 86_400, description="dashboard sign-in")
    rate_limit_per_s: float = Field(default=100.0, gt=0, description="submissions per tenant per second")
    rate_limit_burst: int = Field(default=200, ge=1)
    # Webhook targets: private, loopback, link-local and metadata addresses are refused unless
    # a CIDR here allows them (`jobq dev` allows loopback so the examples work).
    webhook_allow_cidrs: tuple[str, ...] = ()
    webhook_resolve_at_submit: bool = Field(
        default=False, description="resolve and check a webhook's host when the job is submitted, not only at each call"
    )
    webhook_max_headers: int = Field(default=20, ge=0, le=100)
    webhook_response_bytes: int = Field(default=4096, ge=0, le=1024 * 1024)

    metrics_port: int | None = None
    log_level: str = "INFO"
    log_format: str = Field(default="text", pattern="^(text|json)$")
    # OpenTelemetry (`jobq.tracing`): auto uses the application's tracer provider, if any;
    # console and otlp install the SDK's (extra `otel`); off makes no spans.
    tracing: str = Field(default="auto", pattern="^(auto|console|otlp|off)$")

    @field_validator("autoscale", mode="before")
    @classmethod
    def _autoscale_pair(cls, value: Any) -> Any:
        """`"8,2"` (flag, variable, file) or `[8, 2]` (file) into (max, min)."""
        if isinstance(value, str):
            parts = [p.strip() for p in value.split(",")]
            if len(parts) != 2 or not all(p.isdigit() for p in parts):
                raise ValueError("use MAX,MIN with two whole numbers, e.g. 8,2")
            return (int(parts[0]), int(parts[1]))
        return value

    @field_validator("autoscale", mode="after")
    @classmethod
    def _autoscale_range(cls, value: tuple[int, int] | None) -> tuple[int, int] | None:
        if value is not None and not 1 <= value[1] <= value[0] <= 10_000:
            raise ValueError("need 1 <= MIN <= MAX <= 10000 in MAX,MIN")
        return value

    @model_validator(mode="after")
    def _soft_below_hard(self) -> Settings:
        soft, hard = self.soft_time_limit_s, self.time_limit_s
        if soft is not None and hard is not None and soft >= hard:
            # Raised as is (pydantic wraps only ValueError), so the message names the key.
            raise ConfigError("soft_time_limit_s", soft, f"must be below time_limit_s ({hard:g})")
        return self

    @model_validator(mode="after")
    def _consistent(self) -> Settings:
        """Refuse settings that contradict each other, with one line naming both (a ConfigError,
        which pydantic lets through unwrapped)."""
        if self.heartbeat_s >= self.lease_s:
            raise ConfigError(
                "heartbeat_s",
                self.heartbeat_s,
                f"must be shorter than lease_s={self.lease_s:g} (a run's lease would expire between heartbeats)",
            )
        if self.claim_lease_s > self.lease_s:
            raise ConfigError(
                "claim_lease_s",
                self.claim_lease_s,
                f"must not be longer than lease_s={self.lease_s:g} (a scanner's claim would outlive a worker's lease)",
            )
        return self

    def __repr_args__(self) -> Iterator[tuple[str | None, Any]]:
        """`repr(settings)` (and `str`) shows URLs without their passwords or secret parameters."""
        for name, value in super().__repr_args__():
            yield name, redact_url(value) if isinstance(value, str) and "://" in value else value

    @property
    def index(self) -> str:
        return self.index_url or _same_database(self.store_url, "index", sql_servers=True)

    @property
    def broker(self) -> str:
        return self.broker_url or _same_database(self.store_url, "broker", sql_servers=False)

    @property
    def history(self) -> str:
        return self.history_url or _same_database(self.store_url, "history", sql_servers=True)

    @classmethod
    def load(
        cls,
        overrides: Mapping[str, Any] | None = None,
        *,
        env: Mapping[str, str] | None = None,
        config_file: str | os.PathLike[str] | None = None,
    ) -> Settings:
        """Build settings from (lowest first) defaults, a TOML file, `JOBQ_*` variables, overrides.

        Raises `ConfigError` naming the key and the bad value."""
        env = os.environ if env is None else env
        values: dict[str, Any] = {}
        path = config_file or env.get("JOBQ_CONFIG")
        if path:
            values.update(_from_file(Path(path)))
        values.update(_from_env(env))
        values.update({_ALIASES.get(k, k): v for k, v in (overrides or {}).items() if v is not None})
        try:
            return cls.model_validate(values)
        except ValidationError as exc:
            error = exc.errors()[0]
            key = ".".join(str(p) for p in error["loc"]) or "settings"
            raise ConfigError(key, error.get("input"), error["msg"]) from None

    def with_overrides(self, **overrides: Any) -> Settings:
        merged = self.model_dump()
        merged.update({_ALIASES.get(k, k): v for k, v in overrides.items() if v is not None})
        return Settings.model_validate(merged)


def _same_database(store_url: str, role: str, *, sql_servers: bool) -> str:
    """The store's own URL where the store can play `role`: SQLite and memory play every role;
    PostgreSQL is also the time index and the history, but not a broker."""
    if store_url.startswith(("sqlite:", "memory:")):
        return store_url
    if sql_servers and store_url.startswith(("postgresql:", "postgres:")):
        return store_url
    raise ConfigError(role, None, f"this store cannot be the {role}: give --{role} (JOBQ_{role.upper()})")


def _from_file(path: Path) -> dict[str, Any]:
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError("config", str(path), "no such file") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError("config", str(path), f"not valid TOML: {exc}") from None
    section: dict[str, Any] = dict(data.get("jobq", data))
    # A `[jobq.worker]` (or `[worker]`) table holds the worker's own keys: pool, concurrency, limits.
    worker = section.pop("worker", None)
    if isinstance(worker, dict):
        section.update(worker)
    return {_ALIASES.get(k, k): v for k, v in section.items()}


def _from_env(env: Mapping[str, str]) -> dict[str, Any]:
    fields = set(Settings.model_fields)
    out: dict[str, Any] = {}
    for name, value in env.items():
        if not name.startswith("JOBQ_") or name == "JOBQ_CONFIG":
            continue
        key = name[5:].lower()
        key = _ALIASES.get(key, key)
        if key not in fields:
            continue
        is_list = key in ("queues", "webhook_allow_cidrs")
        out[key] = tuple(q.strip() for q in value.split(",") if q.strip()) if is_list else value
    return out
