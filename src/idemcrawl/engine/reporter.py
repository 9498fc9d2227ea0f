"""Progress while crawling: this process's rates and the crawl-wide state, every 2 s.

The snapshot feeds the live display (``snapshot``) or a status line (``progress``), and the live
Prometheus gauges only this process knows (in flight, parser backlog, rates). The crawl-wide part
(URLs by state, ready hosts, requests per record: every process of the crawl) is read in full from
the frontier only every 10 s, since those counts cost O(URLs); in between, queued and leased come
from the frontier's cheap progress read and done/records move with this process's own commits,
so the numbers follow the crawl as pages commit. While this process has nothing in flight and
URLs are queued, the snapshot names the hosts the crawl waits for, why and until when.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..frontier.base import Frontier
from ..waiting import waiting_hosts
from .calls import Call
from .clock import Clock
from .summary import CrawlSummary

#: Seconds between snapshots, and between full reads of the crawl-wide counts.
TICK = 2.0
FRONTIER_EVERY = 10.0
#: Waiting hosts named in a snapshot.
WAITING_SHOWN = 3


class Reporter:
    """``in_flight`` and ``backlog`` read this process's gauges; ``live`` is a
    :class:`~idemcrawl.metrics.LiveGauges` when a metrics endpoint is served."""

    def __init__(
        self,
        frontier: Frontier,
        call: Call,
        clock: Clock,
        summary: CrawlSummary,
        *,
        started: float,
        in_flight: Callable[[], int],
        backlog: Callable[[], int],
        progress: Callable[[str], None] | None = None,
        snapshot: Callable[[dict[str, Any]], None] | None = None,
        live: Any = None,
    ) -> None:
        from ..progress import RateMeter

        self._frontier = frontier
        self._call = call
        self._clock = clock
        self._summary = summary
        self._started = started
        self._in_flight = in_flight
        self._backlog = backlog
        self._progress = progress
        self._snapshot = snapshot
        self._live = live
        self._pages, self._bytes = RateMeter(), RateMeter()
        self._urls: dict[str, int] = {}
        self._hosts: dict[str, int] = {}
        self._requests = self._records = 0
        self._next_frontier_read = 0.0
        #: This process's commits, completions, final failures and records at the last full
        #: read (what moved since).
        self._base: tuple[int, int, int, int] = (0, 0, 0, 0)

    async def run(self) -> None:
        while True:
            await self._clock.sleep(TICK)
            await self.tick()

    async def tick(self) -> dict[str, Any]:
        """One snapshot, delivered; returned for tests."""
        from ..metrics import host_summary

        s, clock = self._summary, self._clock
        now = clock.monotonic()
        report = None
        if now >= self._next_frontier_read:
            self._next_frontier_read = now + FRONTIER_EVERY  # the host report: O(hosts)
            stats = await self._call(self._frontier.stats)
            self._urls = {k: v for k, v in stats.urls_by_state.items() if v}
            self._requests, self._records = stats.counters.get("fetches", 0), stats.records
            self._base = (s.committed, s.completed, s.failed, s.records)
            report = await self._call(self._frontier.hosts_report, clock.time())
            self._hosts = host_summary(report)
        in_flight = self._in_flight()
        prog = await self._call(self._frontier.progress, clock.time())
        committed, completed, failed, records_before = self._base
        urls = dict(self._urls)
        urls["done"] = urls.get("done", 0) + s.completed - completed
        urls["failed"] = urls.get("failed", 0) + s.failed - failed
        urls.update(queued=prog.queued, leased=prog.leased)
        urls = {k: v for k, v in urls.items() if v}
        requests = self._requests + s.committed - committed
        records = self._records + s.records - records_before
        snap = {
            "elapsed_s": round(now - self._started, 1),
            "pages_per_s": round(self._pages.add(s.fetched, now), 1),
            "bytes_per_s": round(self._bytes.add(s.bytes, now)),
            "urls": urls,
            "hosts_ready": self._hosts.get("ready", 0),
            "hosts_backoff": self._hosts.get("backoff", 0),
            "in_flight": in_flight,
            "parser_backlog": self._backlog(),
            "records": records,
            "requests_per_record": round(requests / records, 3) if records else None,
            "errors": dict(s.errors),
        }
        if in_flight == 0 and prog.queued and prog.leased == 0:
            if report is None:
                report = await self._call(self._frontier.hosts_report, clock.time())
            now_wall = clock.time()
            waiting = waiting_hosts(report, now_wall)
            snap["waiting"] = [w.line(now_wall) for w in waiting[:WAITING_SHOWN]]
            if len(waiting) > WAITING_SHOWN:
                snap["waiting"].append(f"… {len(waiting) - WAITING_SHOWN} more hosts")
        live = self._live
        if live is not None:
            live.parser_backlog = snap["parser_backlog"]
            live.in_flight = in_flight
            live.pages_per_second = snap["pages_per_s"]
            live.bytes_per_second = snap["bytes_per_s"]
        if self._snapshot is not None:
            self._snapshot(snap)
        elif self._progress is not None:
            self._progress(
                f"{snap['elapsed_s']:7.1f}s  fetched {s.fetched}  "
                f"({snap['pages_per_s']}/s)  committed {s.committed}  records {s.records}  "
                f"in flight {in_flight}  errors {sum(s.errors.values())}"
            )
        return snap
