"""The read side of the frontier contract, once for every backend: each method is one read
transaction of the backend's store (``Store``'s read operations), plus what is derived from the
rows (host report fields, lease-audit percentiles, keyset streams).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from typing import Any, TypeVar

from .base import FrontierStats, Progress
from .store import STREAMS

T = TypeVar("T")


#: Hosts read per round trip while looking for the next grantable moment.
_OPEN_HOSTS_PAGE = 64


def next_ready_at(store: Any, max_in_flight: int) -> float | None:
    """``Progress.next_ready_at``: min over open hosts of max(timer, back-off, first due URL).

    Hosts come in timer order, so the walk stops at the first host whose timer is already no
    earlier than the best moment found; usually that is the first host whose queue has a URL due
    by its timer, and no queue beyond it is read.
    """
    best = math.inf
    after: tuple[float, str] = (-math.inf, "")
    while True:
        rows = store.open_hosts(max_in_flight, after, _OPEN_HOSTS_PAGE)
        for host_key, timer, opens in rows:
            if timer >= best:
                return best
            if opens >= best:
                continue
            due = store.earliest_due(host_key, opens)
            if due is not None:
                best = min(best, max(opens, due))
        if len(rows) < _OPEN_HOSTS_PAGE:
            return None if best == math.inf else best
        after = (rows[-1][1], rows[-1][0])


class Reads:
    """Outputs, crawl state and inspection over ``_run``; ``Scheduler`` adds the writes."""

    def _run(
        self,
        fn: Callable[[Any], T],
        *,
        write: bool = True,
        snapshot: bool = False,
        retry: bool = True,
    ) -> T:
        """Run ``fn(store)`` as one transaction (``write=False``: a read; ``snapshot``: its
        statements see one state; ``retry=False``: a lost connection or a cancelled statement
        fails it at once instead of being retried, for upkeep that may simply wait for its next
        turn). Each backend provides it."""
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def migrate(self) -> int:
        """Bring the storage to the current schema; returns its version."""
        raise NotImplementedError

    # -- read side -----------------------------------------------------------------------------

    def _read(self, fn: Callable[[Any], T]) -> T:
        return self._run(fn, write=False)

    def progress(self, now: float, max_in_flight: int | None = None) -> Progress:
        if max_in_flight is None:
            return self._read(lambda s: s.progress(now))  # one statement: one snapshot

        def tx(s: Any) -> Progress:
            p = s.progress(now)
            if not p.queued or s.crawl_paused():  # paused: nothing is ready until resumed
                return p
            return replace(p, next_ready_at=next_ready_at(s, max_in_flight))

        return self._run(tx, write=False, snapshot=True)

    def stats(self) -> FrontierStats:
        return self._run(lambda s: s.stats(), write=False, snapshot=True)

    def aggregates(self) -> dict[str, Any]:
        """Recomputed from stored rows in one snapshot (R22: never per-fetch increments)."""
        return self._run(lambda s: s.aggregates(), write=False, snapshot=True)

    def hosts_report(self, now: float) -> list[dict[str, Any]]:
        out = []
        for r in self._read(lambda s: s.report_rows()):
            meta = json.loads(r.pop("robots_meta") or "{}")
            fetched = r.pop("robots_fetched_at")
            r["robots_age_s"] = None if fetched is None else round(now - fetched, 3)
            r["robots_last_error"] = meta.get("last_error")
            r["deferred_reason"] = meta.get("deferred_reason")
            r["in_backoff"] = r["backoff_until"] > now
            out.append(r)
        return out

    def lease_audit(self) -> dict[str, Any]:
        """Recheck every grant in the lease log against the allowance it was granted under."""
        gap_or_slot, delays, grants = self._run(
            lambda s: s.audit_facts(), write=False, snapshot=True
        )
        delays.sort()

        def pct(p: float) -> float | None:
            if not delays:
                return None
            return round(delays[min(len(delays) - 1, int(p * len(delays)))], 4)

        return {
            "grants": grants,
            "violations": sum(n for _, n in gap_or_slot),
            "violations_by_host": dict(gap_or_slot),
            "eligibility_delay_s": {"p50": pct(0.5), "p99": pct(0.99), "max": pct(1.0)},
        }

    def eligibility_delay_histogram(self, bounds: Sequence[float]) -> dict[str, Any]:
        finite = [float(b) for b in bounds if not math.isinf(b)]  # +inf is the total count
        return self._read(lambda s: s.delay_histogram(finite))

    def _keyset(self, table: str, batch: int) -> Iterator[dict[str, Any]]:
        """Page through a table by its key, one short read per batch: an export neither holds
        the database for its whole run nor keeps every row in memory. A row that changes while
        it runs appears once, as its batch saw it."""
        if batch <= 0:
            raise ValueError(f"batch must be positive, got {batch}")
        _, key, last = STREAMS[table]
        while True:
            rows = self._read(lambda s, after=last: s.page(table, after, batch))
            yield from rows
            if len(rows) < batch:
                return
            last = rows[-1][key]

    def iter_urls(self, batch: int = 1000) -> Iterator[dict[str, Any]]:
        return self._keyset("urls", batch)

    def iter_events(self, batch: int = 1000) -> Iterator[dict[str, Any]]:
        return self._keyset("events", batch)

    def iter_records(self, batch: int = 1000) -> Iterator[dict[str, Any]]:
        return self._keyset("records", batch)

    def events_after(self, cursor: int, limit: int) -> list[dict[str, Any]]:
        """Event ids follow commit order (see ``Store.insert_events``): nothing is skipped."""
        if limit <= 0:
            return []
        return self._read(lambda s: s.page("events", cursor, limit))

    def get_cursor(self, consumer: str) -> int:
        return self._read(lambda s: s.get_cursor(consumer))

    def known_urls(self, after_id: int = 0, limit: int | None = None) -> list[tuple[int, str]]:
        return self._read(lambda s: s.known_urls(after_id, limit))

    def existing_urls(self, candidates: Sequence[str]) -> set[str]:
        """Which of ``candidates`` are known: the durable-key look-up a Bloom filter saves."""
        return self._read(lambda s: s.existing_urls(candidates)) if candidates else set()

    def owners_with_leases(self) -> list[str]:
        return self._read(lambda s: s.lease_owners())

    def get_meta(self, key: str) -> str | None:
        return self._read(lambda s: s.get_meta(key))

    def seed_hosts(self) -> frozenset[str]:
        return self._read(lambda s: s.seed_hosts())

    def records(self) -> Iterator[dict[str, Any]]:
        """Every stored record, by source and key (read at once)."""
        return iter(self._read(lambda s: s.records()))

    def find_bodies(self, digests: Sequence[str]) -> dict[str, tuple[str, int, int, str]]:
        return self._read(lambda s: s.find_bodies(digests)) if digests else {}

    def body_digests(self, after: str = "", limit: int | None = None) -> list[str]:
        return self._read(lambda s: s.body_digests(after, limit))

    def simhashes(
        self, after_id: int = 0, limit: int | None = None
    ) -> list[tuple[int, int, int | None]]:
        return self._read(lambda s: s.simhashes(after_id, limit))

    def reparse_candidates(
        self, where_failed: bool, after_id: int, limit: int
    ) -> list[dict[str, Any]]:
        def read(s: Any) -> list[dict[str, Any]]:
            rows = s.reparse_candidates(where_failed, after_id, limit)
            specs = s.requests_of([r["url_id"] for r in rows]) if rows else {}
            for r in rows:  # parsed again by the callback it was fetched for (I11)
                r["request"] = specs.get(r["url_id"])
            return rows

        return self._read(read)

    def recent_errors(self, limit: int) -> list[dict[str, Any]]:
        return self._read(lambda s: s.recent_errors(limit))

    def failure_reasons(self, limit: int) -> list[dict[str, Any]]:
        return self._read(lambda s: s.failure_reasons(limit))

    def cookies(self, now: float) -> list[Any]:
        """The crawl's cookie jar (I12): every stored cookie not expired at ``now``."""
        return self._read(lambda s: s.cookie_rows(now))

    # -- inspection (tests, status, debugging) -------------------------------------------------

    def url_row(self, url: str) -> dict[str, Any] | None:
        """One URL's full row (``store.URL_COLUMNS``)."""
        return self._read(lambda s: s.url_row(url))

    def host_row(self, host_key: str) -> dict[str, Any] | None:
        """One host's full row (``store.HOST_COLUMNS``)."""
        return self._read(lambda s: s.host_row(host_key))

    def url_rows(self) -> list[dict[str, Any]]:
        """Every URL's full row by url_id (reads them all: small crawls, tests, debugging)."""
        return self._read(lambda s: s.url_rows())

    def host_rows(self) -> list[dict[str, Any]]:
        """Every host's full row by host key."""
        return self._read(lambda s: s.host_rows())
