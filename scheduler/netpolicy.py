"""Which network addresses a webhook may reach: the SSRF guard, applied at submit time and at call time.

An endpoint is refused when its scheme is not http or https, when it carries credentials
(`user:pass@`), or when *any* address its host resolves to is not a public unicast address:
loopback, private (RFC 1918, ULA fc00::/7), shared CGNAT space (100.64.0.0/10), link-local,
unspecified, multicast, reserved or documentation ranges, and cloud metadata addresses
(169.254.169.254, fd00:ec2::254, ...). IPv4 addresses embedded in IPv6 (mapped, NAT64, 6to4)
are judged by the IPv4 address they carry.

`webhook_allow_cidrs` lets chosen networks through (`jobq dev` allows 127.0.0.0/8 and ::1). A
metadata address passes only when an allowed network names exactly that host (/32 or /128), so
allowing 169.254.0.0/16 for a sidecar does not open the instance's credentials endpoint.

At submission (`check_submitted`) an endpoint is checked without DNS: its form, its port, an IP
literal, and names that always mean this machine (`localhost`, `*.localhost`); a name is
resolved and checked when the webhook is called, because a job may fire months later and the
API host may not resolve today what the worker resolves then. `webhook_resolve_at_submit`
makes submission resolve and check too (the stricter choice).

The call-time check resolves the host once and requires every address to pass; the webhook caller then
connects to an address it checked (`jobq.webhooks`), so a DNS answer that changes between the
check and the connection (rebinding) cannot steer a call to a refused address.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from jobq.errors import ConfigError, EndpointRefused
from jobq.settings import Settings

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network
#: host, port -> the IP addresses (as text) the host resolves to; raises OSError when it does not.
Resolver = Callable[[str, int], Sequence[str]]

SCHEMES = {"http": 80, "https": 443}
METADATA_ADDRESSES = frozenset(
    ipaddress.ip_address(a)
    for a in (
        "169.254.169.254",  # AWS, GCP, Azure, OpenStack, DigitalOcean instance metadata
        "169.254.170.2",  # AWS ECS task metadata and credentials
        "fd00:ec2::254",  # AWS instance metadata over IPv6
        "100.100.100.200",  # Alibaba Cloud metadata
    )
)
_CGNAT = ipaddress.ip_network("100.64.0.0/10")
_NAT64 = ipaddress.ip_network("64:ff9b::/96")


@dataclass(frozen=True, slots=True)
class Endpoint:
    scheme: str
    host: str  # lower case; an IPv6 literal without brackets
    port: int


#: What `localhost` always means (RFC 6761), checked at submission without a lookup.
LOCALHOST_ADDRESSES: tuple[Address, ...] = (ipaddress.ip_address("127.0.0.1"), ipaddress.ip_address("::1"))


def _literal(host: str) -> Address | None:
    """The address `host` spells, or None for a name: IP literals, and the numeric IPv4 forms the
    system resolver reads without DNS (`0x7f.1`, `2130706433`)."""
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        pass
    if not _NUMERIC_HOST.fullmatch(host):
        return None
    try:
        return ipaddress.IPv4Address(socket.inet_aton(host))
    except OSError:
        return None


_NUMERIC_HOST = re.compile(r"[0-9a-fA-FxX.]+")


def system_resolver(host: str, port: int) -> list[str]:
    """Every address `getaddrinfo` gives for a TCP connection to host:port (IPv4 and IPv6)."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def refusal_reason(address: Address) -> str | None:
    """Why `address` is not a public unicast address, or None when it is one."""
    if isinstance(address, ipaddress.IPv6Address):
        embedded = _embedded_ipv4(address)
        if embedded is not None:
            reason = refusal_reason(embedded)
            return f"{reason} (IPv4 {embedded} inside IPv6)" if reason else None
    if address in METADATA_ADDRESSES:
        return "a cloud metadata address"
    checks: tuple[tuple[bool, str], ...] = (
        (address.is_loopback, "loopback"),
        (address.is_unspecified, "unspecified"),
        (address.is_link_local, "link-local"),
        (address.is_multicast, "multicast"),
        (isinstance(address, ipaddress.IPv4Address) and address in _CGNAT, "shared address space (CGNAT)"),
        (address.is_private, "private"),
        (address.is_reserved, "reserved"),
        (not address.is_global, "not globally routable"),
    )
    return next((reason for refused, reason in checks if refused), None)


def _embedded_ipv4(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address in _NAT64:
        return ipaddress.IPv4Address(int(address) & 0xFFFF_FFFF)
    return address.sixtofour


class NetPolicy:
    """Decides whether a webhook URL (and each address behind it) may be called.

    Thread-safe and cheap to share: it holds only the parsed allow-list and a resolver."""

    def __init__(self, allow_cidrs: Iterable[str] = (), resolver: Resolver | None = None) -> None:
        allowed: list[Network] = []
        for cidr in allow_cidrs:
            try:
                allowed.append(ipaddress.ip_network(cidr.strip(), strict=False))
            except ValueError:
                raise ConfigError(
                    "webhook_allow_cidrs", cidr, "not an IP network (e.g. 10.1.0.0/16 or ::1/128)"
                ) from None
        self.allowed = tuple(allowed)
        self.resolver: Resolver = resolver or system_resolver

    @classmethod
    def from_settings(cls, settings: Settings, resolver: Resolver | None = None) -> NetPolicy:
        return cls(settings.webhook_allow_cidrs, resolver)

    def parse(self, url: str) -> Endpoint:
        """The scheme, host and port of `url`; raises `EndpointRefused` for anything but a plain
        http(s) URL with a host and no credentials. Does no I/O."""
        try:
            parts = urlsplit(url)
            port = parts.port
        except ValueError as exc:
            raise EndpointRefused(f"endpoint {url!r} is not a valid URL: {exc}") from None
        scheme = parts.scheme.lower()
        if scheme not in SCHEMES:
            raise EndpointRefused(f"endpoint scheme {parts.scheme or '(none)'!r} is not allowed; use http or https")
        if parts.username is not None or parts.password is not None:
            raise EndpointRefused("endpoint must not carry credentials; send them in target.headers")
        host = (parts.hostname or "").rstrip(".")
        if not host:
            raise EndpointRefused(f"endpoint {url!r} has no host")
        if port == 0:
            raise EndpointRefused(f"endpoint {url!r} names port 0, which nothing listens on")
        return Endpoint(scheme, host, port if port is not None else SCHEMES[scheme])

    def refusal(self, address: Address) -> str | None:
        """Why a call to `address` is refused under this policy, or None when it is allowed."""
        reason = refusal_reason(address)
        if reason is None:
            return None
        candidates = [address]
        if isinstance(address, ipaddress.IPv6Address):
            embedded = _embedded_ipv4(address)
            if embedded is not None:
                candidates.append(embedded)
        for candidate in candidates:
            for network in self.allowed:
                if candidate.version != network.version or candidate not in network:
                    continue
                exact = network.prefixlen == network.max_prefixlen
                if candidate not in METADATA_ADDRESSES or exact:
                    return None
        return reason

    def resolve(self, host: str, port: int) -> list[Address]:
        """The addresses of `host`, each one checked; raises `EndpointRefused` when the host does not
        resolve or when any of its addresses is refused (a mixed answer is refused as a whole)."""
        try:
            literal: Address | None = ipaddress.ip_address(host)
        except ValueError:
            literal = None
        if literal is not None:
            addresses = [literal]
        else:
            try:
                found = self.resolver(host, port)
            except (OSError, UnicodeError) as exc:
                raise EndpointRefused(f"endpoint host {host!r} does not resolve: {exc}") from None
            try:
                addresses = [ipaddress.ip_address(a) for a in found]
            except ValueError as exc:
                raise EndpointRefused(f"endpoint host {host!r} resolved to a bad address: {exc}") from None
            if not addresses:
                raise EndpointRefused(f"endpoint host {host!r} has no addresses")
        for address in addresses:
            reason = self.refusal(address)
            if reason is not None:
                shown = host if literal is not None else f"{host} ({address})"
                raise EndpointRefused(
                    f"endpoint address {shown} is {reason}; webhooks may only call public addresses "
                    "(an operator can allow networks with webhook_allow_cidrs)"
                )
        return addresses

    def check_submitted(self, url: str, *, resolve: bool = False) -> Endpoint:
        """The submit-time check (module docstring): the URL's form and port, an IP literal's
        address, and `localhost` names, with no DNS lookup unless `resolve`. Raises `EndpointRefused`."""
        if resolve:
            return self.check(url)[0]
        endpoint = self.parse(url)
        host = endpoint.host.lower()
        if host == "localhost" or host.endswith(".localhost"):
            for loopback in LOCALHOST_ADDRESSES:
                reason = self.refusal(loopback)
                if reason is not None:
                    raise EndpointRefused(
                        f"endpoint host {endpoint.host!r} is this machine ({reason}); webhooks may only call "
                        "public addresses (an operator can allow networks with webhook_allow_cidrs)"
                    )
            return endpoint
        literal = _literal(host)
        if literal is None:
            return endpoint  # a name: resolved and checked at call time
        self.resolve(str(literal), endpoint.port)  # a literal: checked without a lookup
        return endpoint

    def check(self, url: str) -> tuple[Endpoint, list[Address]]:
        """Parse `url`, resolve its host and check every address. Raises `EndpointRefused`.

        Opens no connection: the only I/O is the name lookup (none for an IP literal)."""
        endpoint = self.parse(url)
        return endpoint, self.resolve(endpoint.host, endpoint.port)
