"""The AWS edge shared by the DynamoDB store and the S3 and Firehose history sinks.

One place owns what every AWS backend does alike, so the same URL means the same thing in
``dynamodb://``, ``s3://`` and ``firehose://``:

- `UrlOptions` reads a backend URL's query, option by option, and refuses what is left (a typo
  fails at startup instead of being ignored); every error names the key and the bad value.
- `AwsOptions` are the options common to every AWS URL:

  =========================  ======================================================================
  ``region``                 else the AWS chain (``AWS_REGION``, ``AWS_DEFAULT_REGION``, ~/.aws/config)
  ``endpoint``               a local or compatible server (moto, DynamoDB Local, LocalStack, MinIO);
                             absent for AWS itself
  ``aws_access_key_id``,     only together with ``endpoint``: credentials for the local server.
  ``aws_secret_access_key``  Against AWS the boto3 chain supplies them (environment, profile, SSO,
                             instance or task role): secrets in URLs end up in shell history and logs
  =========================  ======================================================================

- `aws_client` imports boto3 lazily (`MissingExtra` names the ``aws`` extra) and builds a client
  with bounded timeouts, botocore's "standard" retries and a sized connection pool.
- `translate_aws_error` turns a botocore (or socket) exception into jobq's: `StoreUnavailable`
  (retryable: throttling, 5xx, no connection, timeouts) or `StoreError` (missing resources, access
  denied, no credentials, invalid requests). Backends add their own meanings on top (DynamoDB's
  failed conditions and cancelled transactions) and pass the rest through here.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from jobq.errors import ConfigError, StoreError, StoreUnavailable

# Codes that mean "try again later", across services: throttling, capacity and transient server
# trouble (S3's SlowDown, DynamoDB's ProvisionedThroughputExceeded, Firehose's ServiceUnavailable).
TRANSIENT_CODES = frozenset(
    {
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "ProvisionedThroughputExceededException",
        "RequestLimitExceeded",
        "RequestTimeout",
        "LimitExceededException",
        "InternalError",
        "InternalFailure",
        "InternalServerError",
        "ServiceUnavailable",
        "ServiceUnavailableException",
    }
)
# Codes that mean the credentials are missing, wrong, expired or not allowed to do this.
_CREDENTIAL_CODES = frozenset(
    {
        "UnrecognizedClientException",
        "InvalidSignatureException",
        "SignatureDoesNotMatch",
        "InvalidAccessKeyId",
        "AccessDenied",
        "AccessDeniedException",
        "ExpiredToken",
        "ExpiredTokenException",
        "MissingAuthenticationTokenException",
    }
)
_SECRET_WORDS = ("secret", "password", "token")


def require_aws(module: str, feature: str) -> ModuleType:
    """`module` (boto3, botocore.*), or `MissingExtra` naming the ``aws`` extra and `feature`."""
    from jobq.extras import require

    return require(module, "aws", feature)


# -- URL options ----------------------------------------------------------------------------------


class UrlOptions:
    """A backend URL's query, read option by option. Errors are `ConfigError`s whose key is
    ``<scope>.<option>`` (``store.threads``, ``history.flush_s``); `done` refuses every option
    not read, so call it once all are. A repeated option counts once: the last value wins."""

    def __init__(self, url: str, scope: str) -> None:
        self.scope = scope
        self._values = dict(parse_qsl(urlsplit(url).query, keep_blank_values=True))
        self._known: list[str] = []

    def key(self, name: str) -> str:
        """The `ConfigError` key of option `name`."""
        return f"{self.scope}.{name}"

    def text(self, name: str, default: str | None = None) -> str | None:
        """The option as given (blank included), or `default` when absent."""
        self._known.append(name)
        return self._values.pop(name, default)

    def number(self, name: str, default: float, *, minimum: float = 0.0, maximum: float | None = None) -> float:
        raw = self.text(name)
        if raw is None:
            return default
        try:
            value = float(raw)
        except ValueError:
            raise ConfigError(self.key(name), raw, "not a number") from None
        if maximum is not None and not minimum <= value <= maximum:
            raise ConfigError(self.key(name), raw, f"must be between {minimum:g} and {maximum:g}")
        if not value >= minimum:  # also refuses nan
            raise ConfigError(self.key(name), raw, f"must be at least {minimum:g}")
        return value

    def integer(self, name: str, default: int, *, minimum: int = 0, maximum: int | None = None) -> int:
        value = self.number(name, default, minimum=minimum, maximum=maximum)
        if not math.isfinite(value) or value != int(value):
            raise ConfigError(self.key(name), value, "must be a whole number")
        return int(value)

    def done(self) -> None:
        """Raise `ConfigError` naming the first option no reader asked for (values of secrets hidden)."""
        if self._values:
            name = sorted(self._values)[0]
            value = "***" if any(word in name.lower() for word in _SECRET_WORDS) else self._values[name]
            raise ConfigError(self.key(name), value, f"unknown option; use {', '.join(sorted(set(self._known)))}")


@dataclass(frozen=True, slots=True)
class AwsOptions:
    """The options every AWS URL takes (module docstring), and the clients they make."""

    region: str | None = None
    endpoint: str | None = None
    access_key_id: str | None = None
    secret_access_key: str | None = field(default=None, repr=False)  # never in logs

    @classmethod
    def read(cls, options: UrlOptions) -> AwsOptions:
        """Read ``region``, ``endpoint`` and the credential pair; `ConfigError` for credentials
        without an endpoint, or one of the pair without the other."""
        region = options.text("region") or None
        endpoint = options.text("endpoint") or None
        key_id = options.text("aws_access_key_id") or None
        secret = options.text("aws_secret_access_key") or None
        if (key_id or secret) and endpoint is None:
            # Secrets in a URL end up in shell history and logs; AWS has better places for them.
            raise ConfigError(
                options.key("aws_access_key_id"),
                "***",
                "credentials in the URL are for a local endpoint only; "
                "use the AWS credential chain (environment, profile or role)",
            )
        if (key_id or secret) and not (key_id and secret):
            raise ConfigError(options.key("aws_secret_access_key"), "***", "give both the key id and the secret")
        return cls(region, endpoint, key_id, secret)

    def client(self, service: str, *, feature: str, scope: str, **kwargs: Any) -> Any:
        """`aws_client` for `service` with these options; `kwargs` as `aws_client` takes them."""
        if self.access_key_id is not None:
            kwargs.setdefault("aws_access_key_id", self.access_key_id)
            kwargs.setdefault("aws_secret_access_key", self.secret_access_key)
        return aws_client(service, region=self.region, endpoint=self.endpoint, feature=feature, scope=scope, **kwargs)


# -- clients --------------------------------------------------------------------------------------


def aws_client(
    service: str,
    *,
    region: str | None,
    endpoint: str | None,
    feature: str = "jobq's AWS backends",
    scope: str = "aws",
    connect_timeout_s: float = 5.0,
    read_timeout_s: float = 30.0,
    max_attempts: int = 3,
    max_pool_connections: int | None = None,
    **kwargs: Any,
) -> Any:
    """A boto3 client for `service` in a session of its own (creating clients from a shared
    session is not thread-safe; clients themselves are). Timeouts are bounded so a dead endpoint
    cannot hang a caller for long, and botocore's "standard" mode retries throttling, 5xx and
    connection errors with jittered backoff, `max_attempts` tries in all. `kwargs` go to
    `Session.client` (credentials, ``region_name``); a ``config`` among them is merged over ours.

    Raises `MissingExtra` without boto3, and `ConfigError` (key ``<scope>.region`` or `scope`)
    when the client cannot be built: no region, a malformed endpoint."""
    boto3 = require_aws("boto3", feature)
    botocore_config = require_aws("botocore.config", feature)
    errors = require_aws("botocore.exceptions", feature)
    settings: dict[str, Any] = {
        "connect_timeout": connect_timeout_s,
        "read_timeout": read_timeout_s,
        "retries": {"mode": "standard", "max_attempts": max_attempts},
        "user_agent_extra": "jobq",
    }
    if max_pool_connections is not None:
        settings["max_pool_connections"] = max_pool_connections
    if service == "s3" and endpoint:
        # Emulators and S3-compatible stores (moto, MinIO) answer on one host: no bucket subdomains.
        settings["s3"] = {"addressing_style": "path"}
    config = botocore_config.Config(**settings)
    if "config" in kwargs:
        config = config.merge(kwargs.pop("config"))
    if endpoint is not None:
        kwargs.setdefault("endpoint_url", endpoint)
    try:
        return boto3.session.Session(region_name=region).client(service, config=config, **kwargs)
    except errors.NoRegionError:
        raise ConfigError(f"{scope}.region", None, "no AWS region: add ?region=... or set AWS_REGION") from None
    except (errors.BotoCoreError, ValueError) as exc:
        raise ConfigError(scope, endpoint or region, f"cannot build a {service} client: {exc}") from None


# -- errors ---------------------------------------------------------------------------------------


def aws_error_code(exc: BaseException) -> str | None:
    """The service's error code of a botocore `ClientError` (``NoSuchBucket``, ``SlowDown``, ...);
    None for any other exception."""
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        code = response.get("Error", {}).get("Code")
        return str(code) if code else None
    return None


def is_transient(exc: BaseException, also: Collection[str] = ()) -> bool:
    """True when the same call may succeed later: throttling, a 5xx, a code in `also`, or no
    answer at all (no connection, a timeout, a broken response)."""
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        status = int(response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
        code = aws_error_code(exc)
        return status >= 500 or code in TRANSIENT_CODES or code in also
    errors = require_aws("botocore.exceptions", "jobq's AWS backends")
    refused = errors.NoCredentialsError | errors.PartialCredentialsError | errors.ParamValidationError
    return isinstance(exc, errors.BotoCoreError | OSError) and not isinstance(exc, refused)


def translate_aws_error(
    exc: BaseException, doing: str, *, where: str | None = None, transient: Collection[str] = ()
) -> StoreError:
    """`exc` as jobq's error, its message starting with `doing` ("DynamoDB query", "reading
    history of 'job_1' from s3://b/p/"): `StoreUnavailable` when trying again may help (see
    `is_transient`; `transient` adds the caller's codes), else `StoreError`. `where` (an endpoint
    or region) is added to failures that had no answer, where it is what to check."""
    code = aws_error_code(exc)
    if code is not None:
        error = getattr(exc, "response", {}).get("Error", {})
        message = f"{doing}: {code}: {error.get('Message', '')}"
        if is_transient(exc, transient):
            return StoreUnavailable(message)
        if code in _CREDENTIAL_CODES:
            return StoreError(f"{doing}: {code}: check the AWS credentials ({error.get('Message', '')})")
        return StoreError(message)
    errors = require_aws("botocore.exceptions", "jobq's AWS backends")
    if isinstance(exc, errors.NoCredentialsError | errors.PartialCredentialsError):
        return StoreError(f"{doing}: no AWS credentials found ({exc})")
    if isinstance(exc, errors.ParamValidationError):
        return StoreError(f"{doing}: invalid request: {exc}")
    place = f" ({where})" if where else ""
    kind = StoreUnavailable if is_transient(exc) else StoreError
    return kind(f"{doing}{place}: {type(exc).__name__}: {exc}")
