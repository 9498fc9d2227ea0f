"""Judge a server-side request log against each host's politeness allowance.

A crawler's own account of its politeness is exactly what is under test, so this checker
only looks at what the servers saw: the log of
:class:`~idemcrawl.lab.testsite.multihost.MultiHostServer` (or ``GET /__log``), whose entries
are ``{"host", "path", "start", "end", "status"}`` with ``time.monotonic`` seconds.

Rules, per host:

* ``concurrency`` - more than ``max_in_flight`` requests overlapping in time.  Intervals
  are half-open ``[start, end)``: a request that starts the instant another ends does not
  overlap it, since a crawler reusing a keep-alive connection does exactly that.
* ``gap`` - two consecutive request *starts* closer than ``min_gap - tolerance``.
  robots.txt fetches count: they are requests the host has to serve like any other.
* ``disallowed`` - a path starting with one of the host's disallowed prefixes.
* ``forbidden-host`` - on a host whose robots.txt forbids everything, any path but
  ``/robots.txt``.

Each violation is reported once per offending request (or, for concurrency, once per
episode of over-limit overlap) so counts in :func:`summarize` are meaningful.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["KINDS", "Allowance", "Violation", "check_log", "summarize"]

#: Violation kinds in the order :func:`summarize` reports them.
KINDS = ("concurrency", "gap", "disallowed", "forbidden-host")
_ROBOTS_PATH = "/robots.txt"


@dataclass(frozen=True)
class Allowance:
    """What one host tolerates: parallel requests and seconds between request starts."""

    max_in_flight: int = 1
    min_gap: float = 1.0

    def __post_init__(self) -> None:
        # A zero limit would flag every request; that is a mistake in the test, not the crawl.
        if self.max_in_flight < 1:
            raise ValueError("max_in_flight must be >= 1")
        if self.min_gap < 0:
            raise ValueError("min_gap must be >= 0")


@dataclass
class Violation:
    """One breach of politeness; ``at`` is the monotonic time it happened."""

    host: str
    kind: str
    detail: str
    at: float


@dataclass(frozen=True)
class _Req:
    start: float
    end: float
    path: str


def _host_key(url: str) -> str:
    # Tolerate "http://h:p/" vs "http://h:p" between the log and the caller's dicts.
    return url.rstrip("/")


def check_log(
    log: Iterable[Mapping[str, Any]],
    allowance: Mapping[str, Allowance],
    *,
    default: Allowance | None = None,
    disallowed_prefixes: Mapping[str, list[str]] | None = None,
    only_robots_hosts: set[str] | None = None,
    tolerance: float = 0.005,
) -> list[Violation]:
    """Every violation in ``log``, sorted by time then host.

    Hosts missing from ``allowance`` are judged by ``default``; with ``default=None`` their
    timing is not checked (robots rules still are), so a test can restrict timing checks
    to the hosts it configured.  ``tolerance`` absorbs clock-read jitter in the gap rule.
    An entry without an ``end`` is treated as still in flight.
    """
    allow = {_host_key(h): a for h, a in allowance.items()}
    prefixes = {_host_key(h): list(p) for h, p in (disallowed_prefixes or {}).items()}
    robots_only = {_host_key(h) for h in (only_robots_hosts or set())}

    by_host: dict[str, list[_Req]] = defaultdict(list)
    for entry in log:
        end = entry.get("end")
        req = _Req(
            start=float(entry["start"]),
            end=math.inf if end is None else float(end),
            path=str(entry["path"]),
        )
        by_host[_host_key(str(entry["host"]))].append(req)

    violations: list[Violation] = []
    for host, reqs in by_host.items():
        reqs.sort(key=lambda r: (r.start, r.end))
        rule = allow.get(host, default)
        if rule is not None:
            violations += _concurrency(host, reqs, rule.max_in_flight)
            violations += _gaps(host, reqs, rule.min_gap, tolerance)
        violations += _robots(host, reqs, prefixes.get(host, []), host in robots_only)
    violations.sort(key=lambda v: (v.at, v.host))
    return violations


def _concurrency(host: str, reqs: list[_Req], limit: int) -> list[Violation]:
    """One violation per episode where overlapping requests exceed ``limit``.

    Sweep over start/end events; at equal times ends sort first (``0 < 1`` on the second
    key), which is what makes the intervals half-open.  The detail shows the episode's
    worst moment, which is what someone debugging a limiter wants to see.
    """
    events = sorted(
        [(r.start, 1, i) for i, r in enumerate(reqs)] + [(r.end, 0, i) for i, r in enumerate(reqs)]
    )
    out: list[Violation] = []
    active: dict[int, _Req] = {}
    episode: Violation | None = None
    worst = 0
    for t, is_start, i in events:
        if not is_start:
            del active[i]
            if len(active) <= limit:
                episode = None
            continue
        active[i] = reqs[i]
        if len(active) <= limit:
            continue
        if episode is None:
            episode = Violation(host, "concurrency", "", t)
            out.append(episode)
            worst = 0
        if len(active) > worst:
            worst = len(active)
            paths = ", ".join(r.path for r in active.values())
            episode.detail = f"{worst} in flight (max {limit}): {paths}"
    return out


def _gaps(host: str, reqs: list[_Req], min_gap: float, tolerance: float) -> list[Violation]:
    out: list[Violation] = []
    for prev, cur in itertools.pairwise(reqs):
        gap = cur.start - prev.start
        if gap < min_gap - tolerance:
            detail = f"{gap:.3f} s after previous start (min {min_gap:g} s)"
            detail += f": {prev.path} -> {cur.path}"
            out.append(Violation(host, "gap", detail, cur.start))
    return out


def _robots(host: str, reqs: list[_Req], prefixes: list[str], robots_only: bool) -> list[Violation]:
    out: list[Violation] = []
    for r in reqs:
        if robots_only and r.path != _ROBOTS_PATH:
            detail = f"{r.path} fetched although robots.txt forbids the whole host"
            out.append(Violation(host, "forbidden-host", detail, r.start))
            continue
        hit = next((p for p in prefixes if r.path.startswith(p)), None)
        if hit is not None:
            out.append(Violation(host, "disallowed", f"{r.path} matches Disallow: {hit}", r.start))
    return out


def summarize(violations: Iterable[Violation]) -> str:
    """One ``kind: count (host xN, ...)`` line per kind, known kinds first; or "no violations"."""
    counts: Counter[str] = Counter()
    per_host: dict[str, Counter[str]] = defaultdict(Counter)
    for v in violations:
        counts[v.kind] += 1
        per_host[v.kind][v.host] += 1
    if not counts:
        return "no violations"
    order = [k for k in KINDS if k in counts] + sorted(k for k in counts if k not in KINDS)
    lines = []
    for kind in order:
        hosts = ", ".join(f"{h} x{n}" for h, n in sorted(per_host[kind].items()))
        lines.append(f"{kind}: {counts[kind]} ({hosts})")
    return "\n".join(lines)
