"""What a crawl is waiting for, per host: the answer to "why is it not done yet?".

A crawl that has queued URLs but nothing in flight is waiting for something: a host's politeness
timer, a back-off after errors (or an unreachable robots.txt, R7), a retry due later, an
operator's pause. The live display names those hosts while the crawl waits, and a crawl that
stops at its horizon lists them with the moment each could go on, so an operator can tell a
host that will be fine in a second from one that will not be touched for an hour.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any

from .frontier.base import Frontier


@dataclass(frozen=True, slots=True)
class Waiting:
    host: str
    queued: int
    #: When the host's timer and back-off allow a request again (None: not a matter of time).
    until: float | None
    reason: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def line(self, now: float) -> str:
        when = ""
        if self.until is not None:
            when = f" until {_clock(self.until)} ({_in(self.until - now)})"
        return f"{self.host}: {self.queued} queued, {self.reason}{when}"


def waiting_hosts(report: list[dict[str, Any]], now: float) -> list[Waiting]:
    """Hosts of ``Frontier.hosts_report`` with queued URLs that none of their slots is serving
    now, soonest first (those not waiting on a time last)."""
    out = []
    for h in report:
        if not h["queued"] or (h["in_flight"] and h["backoff_until"] <= now):
            continue
        until = max(h["next_allowed_at"], h["backoff_until"])
        if h["paused"]:
            out.append(Waiting(h["host_key"], h["queued"], None, "paused by the operator"))
        elif h["backoff_until"] > now:
            reason = h["backoff_reason"] or "backing off after errors"
            out.append(Waiting(h["host_key"], h["queued"], until, reason))
        elif h["robots_state"] == "disallow_all":
            err = h.get("robots_last_error") or "unreachable"
            out.append(Waiting(h["host_key"], h["queued"], until, f"robots.txt {err}"))
        elif until > now:
            out.append(Waiting(h["host_key"], h["queued"], until, "politeness delay"))
        else:
            out.append(Waiting(h["host_key"], h["queued"], None, "next URL due later (retry)"))
    out.sort(key=lambda w: (w.until is None, w.until or 0.0, w.host))
    return out


@dataclass(frozen=True, slots=True)
class WorkLeft:
    """What a run leaves behind: URLs still queued or leased, URLs set aside (deferred)."""

    queued: int
    leased: int
    deferred: int
    waiting: list[Waiting]
    #: Not work left: the crawl's URLs that failed for good (read with the rest).
    failed: int = 0

    @property
    def none(self) -> bool:
        return self.queued == 0 and self.leased == 0 and self.deferred == 0


def work_left(frontier: Frontier, now: float | None = None) -> WorkLeft:
    """Read once when a run ends (a GROUP BY over the URLs and a scan of the hosts)."""
    now = time.time() if now is None else now
    stats = frontier.stats()
    by_state = stats.urls_by_state
    waiting = waiting_hosts(frontier.hosts_report(now), now) if by_state.get("queued") else []
    return WorkLeft(
        by_state.get("queued", 0),
        by_state.get("leased", 0),
        by_state.get("deferred", 0),
        waiting,
        by_state.get("failed", 0),
    )


def _clock(ts: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(ts))


def _in(seconds: float) -> str:
    if seconds < 0:
        return "now"
    if seconds < 120:
        return f"in {seconds:.0f} s"
    if seconds < 7200:
        return f"in {seconds / 60:.0f} min"
    return f"in {seconds / 3600:.1f} h"


def work_left_lines(summary: Any, now: float | None = None, hosts: int = 10) -> list[str]:
    """The end of a run that left work, for a person: counts, then the waiting hosts."""
    left = summary.left
    if not any(left.values()):
        return []
    now = time.time() if now is None else now
    lines = [
        f"work left: {left.get('queued', 0)} queued, {left.get('leased', 0)} leased by other "
        f"processes, {left.get('deferred', 0)} deferred; run the same command again to go on"
        + (" (--retry-deferred to retry the deferred URLs)" if left.get("deferred") else "")
    ]
    waiting = [Waiting(**w) for w in summary.waiting]
    lines += [f"  waiting: {w.line(now)}" for w in waiting[:hosts]]
    if len(waiting) > hosts:
        lines.append(f"  … {len(waiting) - hosts} more hosts (status lists them all)")
    return lines
