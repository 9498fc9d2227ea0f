"""HTTP fetching: an SSRF-checked connection, no automatic redirects, bounded bodies.

aiohttp is the client (see docs/decisions.md): it streams, it lets us plug in our own resolver,
and it is the fastest mature asyncio client on this machine. Redirects are *not* followed here:
the crawler turns a 3xx into a new URL that goes through discovery (scope, dedup, politeness).

The address check sits in the resolver, i.e. on the very addresses aiohttp then connects to, so a
name that resolves to a private address (or re-resolves to one: DNS rebinding) is refused. IP
literals bypass aiohttp's resolver, so they are checked before the request.
"""

from __future__ import annotations

import ipaddress
import socket
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import ThreadedResolver

from . import url as urls

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

# Ranges the default guard refuses beyond what ``ipaddress`` flags (CGNAT, NAT64 etc.).
_EXTRA_FORBIDDEN: tuple[IPNetwork, ...] = (
    ipaddress.ip_network("100.64.0.0/10"),  # CGNAT
    ipaddress.ip_network("192.0.0.0/24"),  # IETF protocol assignments
    ipaddress.ip_network("198.18.0.0/15"),  # benchmarking
    ipaddress.ip_network("64:ff9b::/96"),  # NAT64 can reach IPv4-private space
)


class BlockedAddress(OSError):
    """The target resolves to an address the SSRF guard refuses (R18)."""


class FetchError(Exception):
    """A fetch that produced no usable HTTP response; ``kind`` classifies it for retry logic."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind

    def __str__(self) -> str:
        return f"{self.kind}: {super().__str__()}"


def parse_allow_list(items: Iterable[str]) -> tuple[IPNetwork, ...]:
    """``--allow-private`` values: addresses or CIDRs. Raises ValueError with the bad item."""
    nets = []
    for item in items:
        try:
            nets.append(ipaddress.ip_network(item.strip(), strict=False))
        except ValueError as exc:
            raise ValueError(f"--allow-private: {item!r} is not an address or CIDR") from exc
    return tuple(nets)


@dataclass(frozen=True, slots=True)
class AddressPolicy:
    """Which resolved addresses may be connected to."""

    allow: tuple[IPNetwork, ...] = ()

    def forbidden_reason(self, ip: IPAddress) -> str | None:
        mapped = getattr(ip, "ipv4_mapped", None)
        if mapped is not None:
            ip = mapped
        if any(ip in net for net in self.allow):
            return None
        teredo = getattr(ip, "teredo", None)
        embedded = getattr(ip, "sixtofour", None) or (teredo[1] if teredo else None)
        if embedded is not None and self.forbidden_reason(embedded):
            return f"6to4/teredo address {ip} embeds {embedded}"
        checks = (
            ("loopback", ip.is_loopback),
            ("unspecified", ip.is_unspecified),
            ("link-local", ip.is_link_local),
            ("multicast", ip.is_multicast),
            ("reserved", ip.is_reserved),
            ("private", ip.is_private),
            ("special-purpose", any(ip in n for n in _EXTRA_FORBIDDEN if n.version == ip.version)),
        )
        for name, hit in checks:
            if hit:
                return f"{name} address {ip}"
        if not ip.is_global:
            return f"non-global address {ip}"
        return None

    def check(self, host: str, address: str) -> None:
        reason = self.forbidden_reason(ipaddress.ip_address(address.split("%", 1)[0]))
        if reason:
            raise BlockedAddress(f"{host} -> {reason} refused (use --allow-private to permit)")


class GuardedResolver(AbstractResolver):
    """Resolves once and drops forbidden addresses; aiohttp connects only to what we return."""

    def __init__(self, policy: AddressPolicy, inner: AbstractResolver | None = None) -> None:
        self.policy = policy
        self.inner = inner or ThreadedResolver()

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        results = await self.inner.resolve(host, port, family)
        allowed: list[ResolveResult] = []
        last: BlockedAddress | None = None
        for r in results:
            try:
                self.policy.check(host, r["host"])
            except BlockedAddress as exc:
                last = exc
                continue
            allowed.append(r)
        if not allowed:
            if last is None:  # an empty answer is a DNS failure, worth retrying
                raise OSError(f"{host}: no address")
            raise last
        return allowed

    async def close(self) -> None:
        await self.inner.close()


@dataclass(slots=True)
class FetchResult:
    url: str
    status: int
    headers: dict[str, str]
    body: bytes
    elapsed: float
    truncated: bool = False


@dataclass(frozen=True, slots=True)
class FetchSettings:
    user_agent: str = "idemcrawl/0.1 (+https://example.invalid/idemcrawl)"
    connect_timeout: float = 10.0
    read_timeout: float = 20.0
    total_timeout: float = 60.0
    max_bytes: int = 10 * 1024 * 1024
    allow_private: tuple[IPNetwork, ...] = ()


class Fetcher:
    """Owns one aiohttp session; use as an async context manager."""

    def __init__(
        self,
        settings: FetchSettings,
        concurrency: int,
        resolver: AbstractResolver | None = None,
    ) -> None:
        self.settings = settings
        self.policy = AddressPolicy(settings.allow_private)
        self._resolver = GuardedResolver(self.policy, resolver)
        self._concurrency = concurrency
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> Fetcher:
        connector = aiohttp.TCPConnector(
            limit=self._concurrency,
            limit_per_host=0,
            resolver=self._resolver,
            ttl_dns_cache=None,
            use_dns_cache=False,  # never reuse a resolution past its check
        )
        self._session = aiohttp.ClientSession(
            connector=connector,
            timeout=aiohttp.ClientTimeout(
                total=self.settings.total_timeout,
                sock_connect=self.settings.connect_timeout,
                sock_read=self.settings.read_timeout,
            ),
            headers={"User-Agent": self.settings.user_agent},
            auto_decompress=True,
            max_line_size=16 * 1024,
            max_field_size=16 * 1024,
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def fetch(self, url: str, headers: dict[str, str] | None = None) -> FetchResult:
        assert self._session is not None, "use Fetcher as an async context manager"
        host = urls.hostname(url)
        try:
            ipaddress.ip_address(host)
        except ValueError:
            pass
        else:
            try:
                self.policy.check(host, host)
            except BlockedAddress as exc:
                raise FetchError("blocked", str(exc)) from None
        t0 = time.monotonic()
        try:
            async with self._session.get(
                url, allow_redirects=False, headers=headers, max_redirects=0
            ) as resp:
                body, truncated = await self._read(resp)
                hdrs = {k.lower(): v for k, v in resp.headers.items()}
                return FetchResult(url, resp.status, hdrs, body, time.monotonic() - t0, truncated)
        except FetchError:
            raise
        except aiohttp.ClientConnectorError as exc:
            if isinstance(exc.os_error, BlockedAddress):
                raise FetchError("blocked", str(exc.os_error)) from None
            raise FetchError("connect", str(exc)) from None
        except BlockedAddress as exc:
            raise FetchError("blocked", str(exc)) from None
        except TimeoutError as exc:
            raise FetchError("timeout", str(exc) or "timed out") from None
        except aiohttp.ClientResponseError as exc:
            raise FetchError("protocol", str(exc)) from None
        except (aiohttp.ClientError, OSError, ValueError) as exc:
            raise FetchError("network", f"{type(exc).__name__}: {exc}") from None

    async def _read(self, resp: aiohttp.ClientResponse) -> tuple[bytes, bool]:
        """Stream the (decompressed) body, stopping at the byte limit instead of buffering it."""
        limit = self.settings.max_bytes
        chunks: list[bytes] = []
        size = 0
        async for chunk in resp.content.iter_chunked(64 * 1024):
            size += len(chunk)
            if size > limit:
                chunks.append(chunk[: len(chunk) - (size - limit)])
                return b"".join(chunks), True
            chunks.append(chunk)
        return b"".join(chunks), False


RETRYABLE_STATUS = frozenset({408, 425, 429, 500, 502, 503, 504})


def retry_after_seconds(value: str | None, now: float, cap: float) -> float | None:
    """``Retry-After`` as delta-seconds or an HTTP date, capped; None when absent or invalid."""
    if not value:
        return None
    value = value.strip()
    if value.isascii() and value.isdigit():
        return min(float(value), cap)
    from email.utils import parsedate_to_datetime

    try:
        when = parsedate_to_datetime(value).timestamp()
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    return max(0.0, min(when - now, cap))


def lower_headers(pairs: Sequence[tuple[str, str]] | dict[str, Any]) -> dict[str, str]:
    items = pairs.items() if isinstance(pairs, dict) else pairs
    return {str(k).lower(): str(v) for k, v in items}
