"""Checks made before a crawl starts, so a setting the operator forgot is not a crawl failure.

A seed whose every address the SSRF guard refuses (R18) would otherwise be leased, fail (or
have its robots.txt fail) and be remembered as a failure: the run ends "finished, fetched 0",
and a rerun with the right flag finds the host deferred. That is a configuration error, so it is
reported before anything is written, in one line that names the flag that would allow it.

DNS failures are not configuration errors (the name may resolve in a minute): they are left to
the crawl's own retry and back-off.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

from aiohttp.abc import AbstractResolver
from aiohttp.resolver import ThreadedResolver

from . import url as urls
from .fetch import AddressPolicy, IPNetwork


@dataclass(frozen=True, slots=True)
class Refused:
    """A seed host the SSRF guard refuses at every address it resolves to."""

    host: str
    seeds: tuple[str, ...]
    #: Each refused address with why (``loopback address 127.0.0.1``).
    reasons: tuple[str, ...]
    addresses: tuple[str, ...]

    def message(self) -> str:
        allow = " ".join(f"--allow-private {a}" for a in self.addresses)
        more = f" (and {len(self.seeds) - 1} more seed(s) on it)" if len(self.seeds) > 1 else ""
        why = "; ".join(self.reasons)
        if self.addresses != (self.host.strip("[]"),):
            why = f"{self.host} resolves only to refused addresses: {why}"
        return f"seed {self.seeds[0]}{more}: {why} is refused by default; to crawl it, add {allow}"


def refused_seeds(
    seeds: Iterable[str],
    allow: tuple[IPNetwork, ...],
    resolver: AbstractResolver | None = None,
    timeout: float = 10.0,
) -> list[Refused]:
    """Seed hosts the crawl could never connect to with this allow-list, one entry per host.

    Resolves each distinct host once with the resolver the fetcher would use (``resolver``, or
    the system's), in parallel, bounded by ``timeout``. A host that does not resolve is not
    reported here.
    """
    by_host: dict[tuple[str, int], list[str]] = {}
    for seed in seeds:
        u = urls.normalise(seed)
        by_host.setdefault((urls.hostname(u), _port_of(u)), []).append(u)
    if not by_host:
        return []
    policy = AddressPolicy(allow)
    return asyncio.run(_check(by_host, policy, resolver, timeout))


async def _check(
    by_host: dict[tuple[str, int], list[str]],
    policy: AddressPolicy,
    resolver: AbstractResolver | None,
    timeout: float,
) -> list[Refused]:
    inner = resolver or ThreadedResolver()
    try:
        answers = await asyncio.gather(
            *(_addresses(inner, host, port, timeout) for host, port in by_host),
        )
    finally:
        if resolver is None:
            await inner.close()
    out = []
    for ((host, _), seeds), addresses in zip(by_host.items(), answers, strict=True):
        if not addresses:
            continue  # did not resolve: a network problem, not a setting
        reasons = [policy.forbidden_reason(ipaddress.ip_address(a)) for a in addresses]
        if all(reasons):
            out.append(
                Refused(
                    host,
                    tuple(seeds),
                    tuple(dict.fromkeys(r for r in reasons if r)),
                    tuple(dict.fromkeys(addresses)),
                )
            )
    return out


async def _addresses(
    resolver: AbstractResolver, host: str, port: int, timeout: float
) -> list[str]:
    literal = host.strip("[]")
    try:
        ipaddress.ip_address(literal.split("%", 1)[0])
    except ValueError:
        pass
    else:
        return [literal.split("%", 1)[0]]
    try:
        found = await asyncio.wait_for(
            resolver.resolve(host, port, socket.AF_UNSPEC), timeout=timeout
        )
    except (OSError, TimeoutError):
        return []
    return [str(r["host"]).split("%", 1)[0] for r in found]


def _port_of(u: str) -> int:
    parts = urlsplit(u)
    return parts.port or (443 if parts.scheme == "https" else 80)
