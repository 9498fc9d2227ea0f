"""The read side of the in-memory backend (``memory.py``): what its ``MemoryStore`` answers to
``Reads`` and the inspection API. A part of that one backend, kept in its own file so each stays
readable; it reads the store's rows and indexes and writes nothing.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

from ..politeness import allowance
from . import base, store
from .base import DONE, FAILED, LEASED, QUEUED, STATES


class MemoryReads:
    """Mixed into ``MemoryStore``: every method reads ``self``'s rows and indexes."""

    # The store's state (``memory.MemoryStore.__init__`` sets it).
    urls: list[Any]
    by_url: dict[str, Any]
    hosts: dict[str, Any]
    by_state: Counter[str]
    due: list[tuple[float, int, int]]
    leases: list[tuple[float, int, int]]
    refetch: list[tuple[float, int, int]]
    failures: dict[int, tuple[str, str | None, float]]

    # -- read side -----------------------------------------------------------------------------

    def progress(self, now: float) -> base.Progress:
        queued, leased = self.by_state[QUEUED], self.by_state[LEASED]
        ready = min(
            (max(h.next_allowed_at, h.backoff_until) for h in self.hosts.values() if h.queued),
            default=None,
        )
        due = self._live(self.due, QUEUED) if queued else None
        exp = self._live(self.leases, LEASED) if leased else None
        refetch = self._live(self.refetch, DONE)
        return base.Progress(
            queued,
            leased,
            None if due is None else due[0],
            None if exp is None else exp[0],
            ready,
            None if refetch is None else refetch[0],
        )

    def open_hosts(
        self, max_in_flight: int, after: tuple[float, str], limit: int
    ) -> list[tuple[str, float, float]]:
        # A scan of the hosts: progress is read when nothing could be granted, not per page.
        rows = sorted(
            (h.next_allowed_at, h.host_key, max(h.next_allowed_at, h.backoff_until))
            for h in self.hosts.values()
            if h.queued
            and not h.paused
            and h.in_flight
            < allowance(
                h.max_in_flight if h.max_in_flight is not None else max_in_flight, h.error_streak
            )
            and (h.next_allowed_at, h.host_key) > after
        )
        return [(key, timer, opens) for timer, key, opens in rows[:limit]]

    def earliest_due(self, host_key: str, by: float) -> float | None:
        h = self.hosts.get(host_key)
        due = math.inf if h is None else self._min_due(h)
        if due == math.inf:
            return None
        return by if due <= by else due

    def stats(self) -> base.FrontierStats:
        return base.FrontierStats(
            urls_by_state={s: self.by_state[s] for s in STATES},
            hosts=len(self.hosts),
            records=len(self.record_rows),
            events=len(self.events),
            counters={k: v for k, v in self.counters.items() if v},
            meta=dict(self.meta),
        )

    def _all_urls(self) -> Iterable[Any]:
        return itertools.islice(self.urls, 1, None)

    def aggregates(self) -> dict[str, Any]:
        by_status = Counter(u.status_code for u in self._all_urls() if u.status_code is not None)
        by_source = Counter(r[1] for r in self.record_rows.values())
        return {
            "urls": len(self.by_url),
            "urls_by_state": {s: self.by_state[s] for s in STATES},
            "fetched": sum(1 for u in self._all_urls() if u.fetched_at is not None),
            "status_codes": dict(sorted(by_status.items())),
            "body_bytes": sum(u.body_bytes or 0 for u in self._all_urls()),
            "records": len(self.record_rows),
            "records_by_source": dict(sorted(by_source.items())),
            "events": len(self.events),
        }

    def report_rows(self) -> list[dict[str, Any]]:
        return [
            {c: getattr(self.hosts[k], c) for c in store.REPORT_COLUMNS} for k in sorted(self.hosts)
        ]

    def audit_facts(self) -> tuple[list[tuple[str, int]], list[float], int]:
        by_host: dict[str, list[tuple[Any, ...]]] = {}
        for row in self.lease_log:
            by_host.setdefault(row[1], []).append(row)
        bad: list[tuple[str, int]] = []
        for host, rows in sorted(by_host.items()):
            rows.sort(key=lambda r: (r[4], r[0]))
            # (id, host, url_id, kind, granted_at, eligible_at, min_gap, allowance, in_flight):
            # a grant with no free slot, or sooner after the previous one than it promised.
            n = sum(
                1
                for i, r in enumerate(rows)
                if r[8] >= r[7] or (i > 0 and r[4] < rows[i - 1][4] + rows[i - 1][6] - 1e-6)
            )
            if n:
                bad.append((host, n))
        delays = [max(0.0, r[4] - r[5]) for r in self.lease_log[-100_000:]]
        return bad, delays, len(self.lease_log)

    def delay_histogram(self, bounds: Sequence[float]) -> dict[str, Any]:
        delays = [max(0.0, r[4] - r[5]) for r in self.lease_log]
        counts = [sum(1 for d in delays if d <= b) for b in bounds]
        return {"counts": [*counts, len(delays)], "sum": float(sum(delays))}

    def page(self, table: str, after: Any, limit: int) -> list[dict[str, Any]]:
        names = store.STREAMS[table][0]
        if table == "urls":
            start = max(after, 0) + 1
            return [u.as_dict(names) for u in itertools.islice(self.urls, start, start + limit)]
        if table == "events":
            rows: Iterable[Any] = self.events[max(after, 0) : max(after, 0) + limit]
        else:
            if self._record_keys is None:
                self._record_keys = sorted(self.record_rows)
            i = bisect.bisect_right(self._record_keys, after)
            rows = (self.record_rows[k] for k in self._record_keys[i : i + limit])
        return [dict(zip(names, r, strict=True)) for r in rows]

    def known_urls(self, after_id: int, limit: int | None) -> list[tuple[int, str]]:
        rows = sorted((u.url_id, u.url) for u in self._all_urls() if u.url_id > after_id)
        return rows if limit is None else rows[:limit]

    def existing_urls(self, candidates: Sequence[str]) -> set[str]:
        return {c for c in candidates if c in self.by_url}

    def lease_owners(self) -> list[str]:
        return sorted({u.lease_owner for u in self._leased() if u.lease_owner})

    def get_meta(self, key: str) -> str | None:
        return self.meta.get(key)

    def seed_hosts(self) -> frozenset[str]:
        return frozenset(self.seeds)

    def get_cursor(self, consumer: str) -> int:
        return self.deliveries.get(consumer, 0)

    def records(self) -> list[dict[str, Any]]:
        rows = sorted(self.record_rows.values(), key=lambda r: (r[1], r[2]))
        return [dict(zip(store.RECORD_COLUMNS, r, strict=True)) for r in rows]

    def find_bodies(self, digests: Sequence[str]) -> dict[str, tuple[str, int, int, str]]:
        return {d: (b[3], b[4], b[5], b[2]) for d in digests if (b := self.bodies.get(d))}

    def body_digests(self, after: str, limit: int | None) -> list[str]:
        digests = sorted(d for d in self.bodies if d > after)
        return digests if limit is None else digests[:limit]

    def simhashes(self, after_id: int, limit: int | None) -> list[tuple[int, int, int | None]]:
        hashed = sorted(
            (u.url_id, u.simhash & 0xFFFFFFFFFFFFFFFF, u.near_dup_of)
            for u in self._all_urls()
            if u.simhash is not None and u.url_id > after_id
        )
        return hashed if limit is None else hashed[:limit]

    def reparse_candidates(
        self, where_failed: bool, after_id: int, limit: int
    ) -> list[dict[str, Any]]:
        def wanted(u: Any) -> bool:
            if u.warc_file is None or u.kind != "page":
                return False
            if where_failed:
                return u.state == FAILED and (u.last_error or "").startswith("parse")
            return u.state in (DONE, FAILED)

        rest = itertools.islice(self.urls, max(after_id, 0) + 1, None)
        hits = itertools.islice((u for u in rest if wanted(u)), limit)
        return [u.as_dict(store.REPARSE_COLUMNS) for u in hits]

    def recent_errors(self, limit: int) -> list[dict[str, Any]]:
        errs = [u for u in self._all_urls() if u.last_error is not None]
        errs.sort(key=lambda u: u.fetched_at if u.fetched_at is not None else u.due_at)
        return [u.as_dict(store.ERROR_COLUMNS) for u in errs[::-1][:limit]]

    def failure_reasons(self, limit: int) -> list[dict[str, Any]]:
        groups: dict[str, list[Any]] = {}
        for uid, (reason, trace, at) in self.failures.items():
            u = self.urls[uid]
            if u.state != FAILED:
                continue
            g = groups.get(reason)
            if g is None:
                groups[reason] = [reason, 1, u.url, trace, at, uid]
            else:
                g[1] += 1
                if (at, uid) < (g[4], g[5]):
                    g[2:] = [u.url, trace, at, uid]
        rows = sorted(groups.values(), key=lambda g: (-g[1], g[0]))[:limit]
        return [dict(zip(store.FAILURE_COLUMNS, g, strict=False)) for g in rows]

    def url_row(self, url: str) -> dict[str, Any] | None:
        u = self.by_url.get(url)
        return None if u is None else u.as_dict()

    def host_row(self, host_key: str) -> dict[str, Any] | None:
        h = self.hosts.get(host_key)
        return None if h is None else h.row()._asdict()

    def url_rows(self) -> list[dict[str, Any]]:
        return [u.as_dict() for u in self._all_urls()]

    def host_rows(self) -> list[dict[str, Any]]:
        return [self.hosts[k].row()._asdict() for k in sorted(self.hosts)]


