"""A crawl's state in one dictionary: what ``status``, ``status --json`` and the dashboard show.

Everything is read from the crawl database, never from a running process, so the answer covers
every process and machine sharing the crawl, and a finished or killed crawl reports the same as
a live one (R24). One function builds it, so the command line and the dashboard cannot disagree.
"""

from __future__ import annotations

import time
from typing import Any

from .export import render_aggregates
from .failures import failure_lines
from .frontier import open_frontier
from .frontier.base import Frontier

__all__ = ["HOSTS_SHOWN", "status_dict", "status_lines"]

#: Hosts listed by the text form; ``status --json`` lists them all.
HOSTS_SHOWN = 20
#: Failure reasons read (``status --json`` has them all; the text form shows the first few).
REASONS_READ = 20


def status_dict(source: str | Frontier, db: str | None = None) -> dict[str, Any]:
    """Counts, politeness audit, aggregates and per-host state of one crawl.

    ``source`` is a crawl database (path or URL, opened read-only and closed again) or an open
    frontier, so a caller that already holds one (the dashboard) reads through it instead of
    opening a second connection. ``db`` is the name reported as ``"db"``; it defaults to
    ``source`` when that is a database name.
    """
    if isinstance(source, str):
        f = open_frontier(source, create=False)
        try:
            return status_dict(f, source if db is None else db)
        finally:
            f.close()
    s = source.stats()
    hosts = source.hosts_report(time.time())
    audit = source.lease_audit()
    aggregates = source.aggregates()
    fetches = s.counters.get("fetches", 0)
    failed = s.urls_by_state.get("failed", 0)
    return {
        "db": db,
        "urls": s.urls_by_state,
        "urls_total": sum(s.urls_by_state.values()),
        "hosts": s.hosts,
        "records": s.records,
        "events": s.events,
        "requests": fetches,
        "requests_per_record": round(fetches / s.records, 3) if s.records else None,
        "fetch_errors": s.counters.get("fetch_errors", 0),
        "lease_expiries": s.counters.get("lease_expiries", 0),
        "leases_reclaimed": s.counters.get("leases_reclaimed", 0),
        "completions_rejected": s.counters.get("completions_rejected", 0),
        "links_rejected": {
            k.removeprefix("links_rejected_"): v
            for k, v in sorted(s.counters.items())
            if k.startswith("links_rejected_")
        },
        "robots_fetches": s.counters.get("robots_fetches", 0),
        "robots_disallowed": s.counters.get("robots_disallowed", 0),
        "urls_deferred": s.counters.get("urls_deferred", 0),
        "host_backoffs": s.counters.get("host_backoffs", 0),
        "breaker_trips": s.counters.get("breaker_trips", 0),
        "politeness": audit,
        "aggregates": aggregates,
        "counters": s.counters,
        # Why URLs failed for good, most URLs first (read only when some did).
        "failure_reasons": source.failure_reasons(REASONS_READ) if failed else [],
        "hosts_in_backoff": sum(1 for h in hosts if h["in_backoff"]),
        "host_states": hosts,
        "group_commit": {
            "max_completions": int(s.meta.get("group_commit_max", "0") or 0),
            "linger_seconds": float(s.meta.get("group_commit_linger_s", "0") or 0),
        },
    }


def status_lines(d: dict[str, Any]) -> list[str]:
    """The text form of :func:`status_dict` for a person at a terminal, one string per line."""
    rpr = d["requests_per_record"]
    pol = d["politeness"]
    ed = pol["eligibility_delay_s"]
    gc = d["group_commit"]
    urls = ", ".join(f"{k} {v}" for k, v in d["urls"].items())
    refused = ", ".join(f"{k} {v}" for k, v in d["links_rejected"].items()) or "none"
    lines = [
        f"crawl database   {d['db']}",
        f"urls             {urls} (total {d['urls_total']})",
        f"hosts            {d['hosts']}",
        f"records          {d['records']}    events {d['events']}",
        f"requests         {d['requests']} committed ({d['fetch_errors']} errors); "
        f"per stored record {rpr if rpr is not None else '-'}",
        f"leases           {d['lease_expiries']} expired, {d['leases_reclaimed']} reclaimed "
        f"from dead processes, {d['completions_rejected']} stale completions rejected",
        f"links refused    {refused}",
        f"politeness       {pol['violations']} violations in {pol['grants']} grants (lease log); "
        f"eligibility delay p50 {ed['p50']} s, p99 {ed['p99']} s; "
        f"{d['hosts_in_backoff']} hosts backing off, {d['breaker_trips']} breaker trips",
        f"robots.txt       {d['robots_fetches']} fetches, {d['robots_disallowed']} URLs "
        f"disallowed, {d['urls_deferred']} URLs deferred",
    ]
    lines += failure_lines(d["urls"].get("failed", 0), d["failure_reasons"])
    hosts = d["host_states"]
    lines += [_host_line(h) for h in hosts[:HOSTS_SHOWN]]
    if len(hosts) > HOSTS_SHOWN:
        lines.append(f"  … {len(hosts) - HOSTS_SHOWN} more hosts (status --json lists all)")
    lines += render_aggregates(d["aggregates"]).split("\n")
    lines.append(
        f"group commit     <= {gc['max_completions']} completions per transaction, lingering "
        f"<= {gc['linger_seconds']} s (a kill can repeat at most the fetches in flight plus "
        "one such batch)"
    )
    return lines


def _host_line(h: dict[str, Any]) -> str:
    notes = [f"robots {h['robots_state'] or 'unknown'}"]
    if h["robots_age_s"] is not None:
        notes.append(f"age {h['robots_age_s']:.0f} s")
    if h["in_backoff"]:
        notes.append(f"backing off: {h['backoff_reason']}")
    if h["deferred_reason"]:
        notes.append(f"deferred: {h['deferred_reason']}")
    return (
        f"  {h['host_key']:<40} queued {h['queued']:<6} in flight {h['in_flight']:<3} "
        + ", ".join(notes)
    )
