"""The engine: owns every task and queue of a crawl process (lease → fetch → parse → commit).

Structure (each arrow is bounded, so a slow stage slows the one before it):

    feeder ──leases──▶ workers (``concurrency`` tasks) ──▶ parser processes ──▶ committer
       ▲                     fetch, bounded body          ``parse_slots``        group commit
       └──────────── wake-ups after each commit / idle worker ◀────────────────────┘

* The **feeder** leases only as many URLs as there are idle workers, so a lease is granted right
  before its request starts (the host delay is measured between grants) and a kill strands at
  most the fetches really in flight.
* **Workers** fetch and then wait for a parser slot; when parsers fall behind, workers stop
  fetching (back-pressure) instead of piling bodies up in memory.
* The **committer** writes completions in batches: a batch is what arrived while the previous
  transaction ran (≤ ``commit_batch``, lingering ≤ ``commit_seconds``), so under load commits are
  amortised and at low load every page is committed on its own.
* All database calls run on one dedicated thread so the event loop never blocks on SQL.

Every task belongs to a TaskGroup that waits for it; stopping (signal, ``--max-pages``) drains the
workers, commits what they produced and returns.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import hashlib
import multiprocessing
import os
import random
import signal
import sys
import time
from collections.abc import Callable
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from functools import partial
from typing import Any, TypeVar

from aiohttp.abc import AbstractResolver

from . import owner as owners
from . import url as urls
from .config import CrawlConfig
from .discovery import META_KEY as GATE_META_KEY
from .discovery import DiscoveryGate
from .fetch import RETRYABLE_STATUS, Fetcher, FetchError, FetchSettings, retry_after_seconds
from .frontier import Frontier, open_frontier
from .frontier.base import ROBOTS, SITEMAP, Completion, Failure, Lease, NewURL, RobotsFetch
from .parse import ParseJob, Parser, ParseResult, init_worker, load_spider, parse_in_worker, warm_up

T = TypeVar("T")
MAX_ROBOTS_REDIRECTS = 5
Outcome = Completion | Failure


@dataclass
class CrawlSummary:
    fetched: int = 0
    committed: int = 0
    rejected_completions: int = 0
    records: int = 0
    failed: int = 0
    links_rejected: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    finished: bool = False
    stopped_by: str = ""
    commit_batches: int = 0
    commit_max_batch: int = 0
    commit_max_seconds: float = 0.0
    errors: dict[str, int] = field(default_factory=dict)


class Engine:
    def __init__(
        self,
        config: CrawlConfig,
        *,
        resolver: AbstractResolver | None = None,
        progress: Callable[[str], None] | None = None,
    ) -> None:
        config.validate()
        self.cfg = config
        self.policy = config.host_policy()
        self.summary = CrawlSummary()
        self._resolver = resolver
        self._progress = progress
        self._db_exec: concurrent.futures.ThreadPoolExecutor | None = None
        self._frontier: Frontier | None = None
        self._pool: concurrent.futures.ProcessPoolExecutor | None = None
        self._parser: Parser | None = None
        self._owner = ""
        self._stop_reason = ""
        self._idle = 0
        self._in_flight = 0  # leases handed out by this process and not yet committed/dropped
        self._granted = 0
        self._next_reclaim = 0.0
        self._gate: DiscoveryGate | None = None
        self._next_gate_save = 0.0
        self._rng = random.Random()

    # -- helpers --------------------------------------------------------------------------------

    async def _db(self, fn: Callable[..., T], *args: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._db_exec, fn, *args)

    @property
    def frontier(self) -> Frontier:
        assert self._frontier is not None
        return self._frontier

    def stop(self, reason: str = "stopped") -> None:
        """Stop leasing; in-flight pages finish and are committed."""
        if not self._stop_reason:
            self._stop_reason = reason
        self._wake.set()

    # -- lifecycle ------------------------------------------------------------------------------

    async def run(self) -> CrawlSummary:
        cfg = self.cfg
        t0 = time.monotonic()
        self._wake = asyncio.Event()
        self._work: asyncio.Queue[Lease | None] = asyncio.Queue()
        self._commit_q: asyncio.Queue[Outcome | None] = asyncio.Queue(
            maxsize=max(cfg.commit_batch, cfg.concurrency) * 2
        )
        self._db_exec = concurrent.futures.ThreadPoolExecutor(1, "idemcrawl-db")
        slot: owners.OwnerSlot | None = None
        try:
            self._frontier = await self._db(open_frontier, cfg.db)
            slot = owners.acquire(cfg.db)
            self._owner = slot.owner
            await self._prepare()
            scope_hosts = await self._db(self.frontier.seed_hosts)
            self._start_parsers(scope_hosts)
            fetch_settings = FetchSettings(
                user_agent=cfg.user_agent,
                connect_timeout=cfg.connect_timeout,
                read_timeout=cfg.read_timeout,
                total_timeout=cfg.total_timeout,
                max_bytes=cfg.max_bytes,
                allow_private=cfg.allow_private,
            )
            async with Fetcher(fetch_settings, cfg.concurrency, self._resolver) as fetcher:
                self._fetcher = fetcher
                async with asyncio.TaskGroup() as outer:
                    outer.create_task(self._committer(), name="committer")
                    if self._progress:
                        reporter = outer.create_task(self._reporter(t0), name="reporter")
                    async with asyncio.TaskGroup() as tg:
                        tg.create_task(self._feeder(), name="feeder")
                        for i in range(cfg.concurrency):
                            tg.create_task(self._worker(), name=f"worker-{i}")
                    await self._commit_q.put(None)
                    if self._progress:
                        reporter.cancel()
            await self._save_gate()
            self.summary.stopped_by = self._stop_reason or "finished"
            self.summary.finished = not self._stop_reason
            return self.summary
        finally:
            self.summary.seconds = time.monotonic() - t0
            if self._pool is not None:
                self._pool.shutdown(wait=True, cancel_futures=True)
            if self._frontier is not None:
                await self._db(self._frontier.close)
            self._db_exec.shutdown(wait=True)
            if slot is not None:
                slot.close()

    async def _prepare(self) -> None:
        """Reclaim leases of dead local owners, add the seeds, publish the commit bound."""
        f = self.frontier
        await self._db(f.release_owner, self._owner)  # this slot's previous holder is dead
        await self._reclaim_dead()
        requeued = await self._db(f.requeue_deferred) if self.cfg.retry_deferred else 0
        if requeued and self._progress:
            self._progress(f"requeued {requeued} deferred URLs")
        for host, delay, concurrency in self.cfg.host_overrides:
            await self._db(
                partial(f.set_host_overrides, host, delay=delay, max_in_flight=concurrency)
            )
        seeds: list[NewURL] = []
        for raw in self.cfg.seeds:
            u = urls.normalise(raw)
            seeds.append(NewURL(u, urls.host_key(u), priority=1))
        for raw in self.cfg.sitemaps:
            u = urls.normalise(raw)
            seeds.append(NewURL(u, urls.host_key(u), priority=5, kind=SITEMAP))
        if seeds:
            await self._db(f.add_seeds, [s.host_key for s in seeds])
            await self._db(f.add, seeds, time.time())
        await self._rebuild_gate()
        await self._db(f.set_meta, "group_commit_max", str(self.cfg.commit_batch))
        await self._db(f.set_meta, "group_commit_linger_s", str(self.cfg.commit_seconds))

    async def _rebuild_gate(self) -> None:
        """(Re)build the discovery Bloom filter from the frontier; restore template counts."""
        f = self.frontier
        known = await self._db(f.known_urls)
        snapshot = await self._db(f.get_meta, GATE_META_KEY)
        gate = DiscoveryGate(self.cfg.trap_limits())
        gate.load(known, snapshot if self._gate is None else self._gate.snapshot())
        self._gate = gate

    async def _save_gate(self) -> None:
        if self._gate is not None:
            await self._db(self.frontier.set_meta, GATE_META_KEY, self._gate.snapshot())

    async def _reclaim_dead(self) -> None:
        f = self.frontier
        holders = await self._db(f.owners_with_leases)
        n = await self._db(
            owners.reclaim_dead_local_owners, self.cfg.db, holders, self._owner, f.release_owner
        )
        if n and self._progress:
            self._progress(f"returned {n} leases of a dead crawl process")

    def _start_parsers(self, scope_hosts: frozenset[str]) -> None:
        spec = self.cfg.spider
        if spec and ":" in spec:
            target, _, cls = spec.rpartition(":")
            if target.endswith(".py"):
                spec = f"{os.path.abspath(target)}:{cls}"
        load_spider(spec)  # fail fast, in this process, with a clear message
        self._spider_spec = spec
        self._scope_hosts = scope_hosts
        if self.cfg.parse_workers == 0:
            self._parser = Parser(spec, scope_hosts, self.cfg.scope, self.cfg.trap_limits())
            return
        self._new_pool()
        self._parse_slots = asyncio.Semaphore(self.cfg.parse_workers * 2)

    def _new_pool(self) -> None:
        ctx = multiprocessing.get_context("forkserver" if sys.platform != "win32" else "spawn")
        self._pool = concurrent.futures.ProcessPoolExecutor(
            self.cfg.parse_workers,
            mp_context=ctx,
            initializer=init_worker,
            initargs=(
                self._spider_spec,
                self._scope_hosts,
                self.cfg.scope,
                self.cfg.trap_limits(),
                self.cfg.parse_memory_limit,
            ),
        )
        for _ in range(self.cfg.parse_workers):
            self._pool.submit(warm_up)

    def _kill_pool(self) -> None:
        pool = self._pool
        if pool is None:
            return
        for proc in list(getattr(pool, "_processes", {}).values()):
            proc.kill()
        pool.shutdown(wait=False, cancel_futures=True)
        self._new_pool()

    # -- tasks ----------------------------------------------------------------------------------

    async def _feeder(self) -> None:
        cfg = self.cfg
        try:
            while not self._stop_reason:
                want = self._idle - self._work.qsize()
                if cfg.max_pages is not None:
                    if self._granted >= cfg.max_pages:
                        self.stop("max-pages")
                        break
                    want = min(want, cfg.max_pages - self._granted)
                if want <= 0:
                    await self._wait_wake(None)
                    continue
                now = time.time()
                leases = await self._db(
                    self.frontier.lease, self._owner, want, now, cfg.lease_seconds, self.policy
                )
                if leases:
                    self._granted += len(leases)
                    self._in_flight += len(leases)
                    for lease in leases:
                        self._work.put_nowait(lease)
                    continue
                prog = await self._db(self.frontier.progress, now)
                if prog.finished and self._in_flight == 0:
                    break
                if prog.leased > self._in_flight and now >= self._next_reclaim:
                    # Someone else holds leases: if it was a process of this machine that died,
                    # return its work now instead of waiting for the leases to expire.
                    self._next_reclaim = now + 2.0
                    await self._reclaim_dead()
                wake_at = min(
                    (
                        t
                        for t in (prog.next_due_at, prog.next_lease_expiry, prog.next_host_ready_at)
                        if t is not None
                    ),
                    default=now + 1.0,
                )
                await self._wait_wake(min(max(wake_at - time.time(), 0.005), 1.0))
        finally:
            for _ in range(cfg.concurrency):
                self._work.put_nowait(None)

    async def _wait_wake(self, timeout: float | None) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), timeout)
        self._wake.clear()

    async def _worker(self) -> None:
        while True:
            self._idle += 1
            self._wake.set()
            lease = await self._work.get()
            self._idle -= 1
            if lease is None:
                return
            outcome = await self._process(lease)
            if outcome is None:
                self._in_flight -= 1  # dropped; its lease expires or is reclaimed
                continue
            await self._commit_q.put(outcome)

    async def _process(self, lease: Lease) -> Outcome | None:
        if time.time() >= lease.expires_at - 1.0:
            return None  # someone else may hold it by now; fetching would break the host limits
        if lease.kind == ROBOTS:
            return await self._fetch_robots(lease)
        try:
            res = await self._fetcher.fetch(lease.url)
        except FetchError as exc:
            self._count_error(exc.kind)
            if exc.kind == "blocked":
                return Failure(lease, str(exc), retry_at=None)
            return self._retry(lease, str(exc), None, None)
        self.summary.fetched += 1
        if res.status in RETRYABLE_STATUS:
            self._count_error(f"http_{res.status}")
            ra = retry_after_seconds(
                res.headers.get("retry-after"), time.time(), self.cfg.retry_after_cap
            )
            return self._retry(lease, f"HTTP {res.status}", res.status, ra)
        job = ParseJob(lease.url, res.status, res.headers, res.body, lease.depth, lease.kind)
        result = await self._parse(job)
        if result.error:
            self._count_error("parse")
            return Failure(lease, result.error, retry_at=None, status=res.status)
        assert self._gate is not None
        links, refused = self._gate.filter(result.links)
        if self._gate.needs_rebuild:
            await self._rebuild_gate()
        rejections = dict(result.rejected)
        for reason, n in refused.items():
            rejections[reason] = rejections.get(reason, 0) + n
        for reason, n in rejections.items():
            self.summary.links_rejected[reason] = self.summary.links_rejected.get(reason, 0) + n
        return Completion(
            lease,
            res.status,
            time.time(),
            result.records,
            links,
            hashlib.blake2b(res.body, digest_size=16).hexdigest(),
            len(res.body),
            "truncated at max bytes" if res.truncated else None,
            latency=res.elapsed,
            rejections=rejections,
        )

    async def _fetch_robots(self, lease: Lease) -> Completion:
        """Fetch robots.txt, following up to 5 redirects (RFC 9309 2.3.1.2), each SSRF-checked."""
        url = lease.url
        t0 = time.monotonic()
        outcome = RobotsFetch(None, error="not fetched")
        for hop in range(MAX_ROBOTS_REDIRECTS + 1):
            try:
                res = await self._fetcher.fetch(url)
            except FetchError as exc:
                self._count_error(exc.kind)
                outcome = RobotsFetch(None, error=str(exc), permanent=exc.kind == "blocked")
                break
            self.summary.fetched += 1
            location = res.headers.get("location")
            if 300 <= res.status < 400 and location:
                if hop == MAX_ROBOTS_REDIRECTS:
                    outcome = RobotsFetch(res.status, too_many_redirects=True)
                    break
                try:
                    url = urls.normalise(location, url)
                except urls.InvalidURL as exc:
                    outcome = RobotsFetch(None, error=f"bad redirect: {exc}")
                    break
                continue
            error = f"HTTP {res.status}" if res.status >= 500 or res.status == 429 else None
            outcome = RobotsFetch(res.status, res.body, error)
            break
        return Completion(
            lease,
            outcome.status or 0,
            time.time(),
            latency=time.monotonic() - t0,
            robots=outcome,
        )

    def _retry(self, lease: Lease, error: str, status: int | None, after: float | None) -> Failure:
        """A transient error: the host backs off (frontier, R8) and the URL retries, capped."""
        if lease.attempts >= self.cfg.max_retries:
            return Failure(
                lease,
                f"{error} (after {lease.attempts + 1} attempts)",
                None,
                status,
                host_error=True,
                retry_after=after,
            )
        # The URL's own retry: exponential back-off with full jitter; never before Retry-After.
        wait = self._rng.uniform(
            0, min(self.cfg.retry_cap, self.cfg.retry_base * 2**lease.attempts)
        )
        return Failure(
            lease,
            error,
            time.time() + max(wait, after or 0.0),
            status,
            host_error=True,
            retry_after=after,
        )

    def _count_error(self, kind: str) -> None:
        self.summary.errors[kind] = self.summary.errors.get(kind, 0) + 1

    async def _parse(self, job: ParseJob) -> ParseResult:
        if self._parser is not None:
            return self._parser.run(job)
        loop = asyncio.get_running_loop()
        async with self._parse_slots:
            pool = self._pool
            try:
                fut = loop.run_in_executor(pool, parse_in_worker, job)
                return await asyncio.wait_for(fut, self.cfg.parse_timeout)
            except TimeoutError:
                if pool is self._pool:
                    self._kill_pool()
                return ParseResult(error=f"parse timeout after {self.cfg.parse_timeout} s")
            except BrokenProcessPool:
                if pool is self._pool:
                    self._kill_pool()
                return ParseResult(error="parser process died")

    async def _committer(self) -> None:
        cfg = self.cfg
        done = False
        while not done:
            first = await self._commit_q.get()
            if first is None:
                break
            batch: list[Outcome] = [first]
            deadline = time.monotonic() + cfg.commit_seconds
            while len(batch) < cfg.commit_batch:
                if self._commit_q.empty():
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    try:
                        nxt = await asyncio.wait_for(self._commit_q.get(), left)
                    except TimeoutError:
                        break
                else:
                    nxt = self._commit_q.get_nowait()
                if nxt is None:
                    done = True
                    break
                batch.append(nxt)
            await self._commit(batch)

    async def _commit(self, batch: list[Outcome]) -> None:
        completions = [o for o in batch if isinstance(o, Completion)]
        failures = [o for o in batch if isinstance(o, Failure)]
        t = time.monotonic()

        def write() -> tuple[list[bool], list[bool]]:
            now = time.time()
            return (
                self.frontier.complete(completions, now, self.policy),
                self.frontier.fail(failures, now, self.policy),
            )

        ok_c, ok_f = await self._db(write)
        s = self.summary
        s.commit_batches += 1
        s.commit_max_batch = max(s.commit_max_batch, len(batch))
        s.commit_max_seconds = max(s.commit_max_seconds, time.monotonic() - t)
        s.committed += sum(ok_c) + sum(ok_f)
        s.rejected_completions += ok_c.count(False) + ok_f.count(False)
        s.records += sum(len(c.records) for c, ok in zip(completions, ok_c, strict=True) if ok)
        s.failed += sum(
            1 for f, ok in zip(failures, ok_f, strict=True) if ok and f.retry_at is None
        )
        self._in_flight -= len(batch)
        self._wake.set()
        if time.monotonic() >= self._next_gate_save:
            self._next_gate_save = time.monotonic() + 10.0
            await self._save_gate()

    async def _reporter(self, t0: float) -> None:
        assert self._progress is not None
        while True:
            await asyncio.sleep(2.0)
            s = self.summary
            el = time.monotonic() - t0
            self._progress(
                f"{el:7.1f}s  fetched {s.fetched}  ({s.fetched / el:.1f}/s)  committed "
                f"{s.committed}  records {s.records}  in flight {self._in_flight}  "
                f"errors {sum(s.errors.values())}"
            )


def run_crawl(
    config: CrawlConfig,
    *,
    resolver: AbstractResolver | None = None,
    progress: Callable[[str], None] | None = None,
    handle_signals: bool = False,
) -> CrawlSummary:
    """Run one crawl process to its end (or until a signal / ``max_pages``)."""
    engine = Engine(config, resolver=resolver, progress=progress)

    async def main() -> CrawlSummary:
        if handle_signals:
            loop = asyncio.get_running_loop()
            task = asyncio.current_task()
            hits = {"n": 0}

            def on_signal(name: str) -> None:
                hits["n"] += 1
                if hits["n"] == 1:
                    engine.stop(name)
                elif task is not None:
                    task.cancel()

            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, on_signal, sig.name)
        return await engine.run()

    return asyncio.run(main())
