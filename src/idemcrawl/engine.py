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
import dataclasses
import hashlib
import os
import random
import signal
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, TypeVar

from aiohttp.abc import AbstractResolver

from . import owner as owners
from . import url as urls
from .config import CrawlConfig
from .dedup import BloomNegativeCache, SimHashIndex
from .discovery import META_KEY as GATE_META_KEY
from .discovery import DiscoveryGate
from .fetch import (
    RETRYABLE_STATUS,
    Fetcher,
    FetchError,
    FetchResult,
    FetchSettings,
    retry_after_seconds,
)
from .frontier import Frontier, open_frontier
from .frontier.base import (
    DOWNLOAD,
    ROBOTS,
    SITEMAP,
    Completion,
    Failure,
    Lease,
    NewURL,
    RobotsFetch,
)
from .parse import ParseJob, Parser, ParseResult, ParserPool, load_spider
from .warc import WarcError, WarcPointer, WarcStore, payload_digest, store_download

T = TypeVar("T")
MAX_ROBOTS_REDIRECTS = 5
#: Under load, the feeder waits this long for more idle workers before a lease call, and the
#: committer this long for more completions before a commit (when ``commit_seconds`` is 0): one
#: transaction then serves several pages instead of one (docs/benchmarks.md, profile).
COALESCE_SECONDS = 0.01
#: Bodies this process archived, remembered until their pages have surely committed.
RECENT_BODIES = 4096
Outcome = Completion | Failure


@dataclass(frozen=True, slots=True)
class Archived:
    """Where a page's response is archived (all None when WARC output is off)."""

    file: str | None = None
    offset: int | None = None
    length: int | None = None
    digest: str | None = None
    stored: bool = False


def conditional_headers(lease: Lease) -> dict[str, str]:
    """If-None-Match / If-Modified-Since from the previous round's validators (R13)."""
    headers = {}
    if lease.etag:
        headers["If-None-Match"] = lease.etag
    if lease.last_modified:
        headers["If-Modified-Since"] = lease.last_modified
    return headers


def download_suffix(url: str) -> str:
    """The file extension a download keeps (``.pdf``), when the URL path has a plain one."""
    path = url.split("?", 1)[0].split("#", 1)[0].rsplit("/", 1)[-1]
    _, dot, ext = path.rpartition(".")
    if dot and 0 < len(ext) <= 8 and ext.isascii() and ext.isalnum():
        return "." + ext.lower()
    return ""


def warc_prefix(owner: str) -> str:
    """A WARC file prefix per owner slot: one writer per prefix, deterministic names."""
    cleaned = "".join(ch if ch.isalnum() or ch in "._-" else "-" for ch in owner)
    return f"idemcrawl-{cleaned}"[:100]


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
    #: Why the crawl had to stop on its own (the archive failed, …); None when it did not.
    fatal: str | None = None
    commit_batches: int = 0
    commit_max_batch: int = 0
    commit_max_seconds: float = 0.0
    errors: dict[str, int] = field(default_factory=dict)
    bytes: int = 0
    revisits_started: int = 0
    warc_repaired_bytes: int = 0


class Engine:
    def __init__(
        self,
        config: CrawlConfig,
        *,
        resolver: AbstractResolver | None = None,
        progress: Callable[[str], None] | None = None,
        snapshot: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        config.validate()
        self.cfg = config
        self.policy = config.host_policy()
        self.summary = CrawlSummary()
        self._resolver = resolver
        self._progress = progress
        self._snapshot = snapshot
        self._live: Any = None  # metrics.LiveGauges when --metrics-port is set
        self._parse_waiting = 0
        self._db_exec: concurrent.futures.ThreadPoolExecutor | None = None
        self._frontier: Frontier | None = None
        self._pool: ParserPool | None = None
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
        self.recrawl = config.recrawl_policy()
        self._warc: WarcStore | None = None
        self._warc_exec: concurrent.futures.ThreadPoolExecutor | None = None
        self._bodies: BloomNegativeCache | None = None
        self._simhash: SimHashIndex | None = None
        self._dup_root: dict[int, int] = {}
        self._recent_bodies: OrderedDict[str, tuple[str, int, int, str]] = OrderedDict()
        self._body_writes: dict[str, asyncio.Future[None]] = {}
        self._next_reschedule = 0.0
        #: Idle workers worth one lease transaction without waiting (see COALESCE_SECONDS).
        self._lease_chunk = max(2, config.concurrency // 8)

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
        metrics_server: Any = None
        try:
            self._frontier = await self._db(open_frontier, cfg.db)
            slot = owners.acquire(cfg.db)
            self._owner = slot.owner
            if cfg.warc:
                # The slot's flock makes this process the prefix's only writer; opening cuts a
                # record a killed predecessor left half-written.
                self._warc = WarcStore(
                    cfg.warc_directory(),
                    warc_prefix(self._owner),
                    max_file_bytes=cfg.warc_max_file_bytes,
                )
                self.summary.warc_repaired_bytes = self._warc.repaired_bytes
                self._warc_exec = concurrent.futures.ThreadPoolExecutor(1, "idemcrawl-warc")
            await self._prepare()
            if cfg.metrics_port is not None:
                from .metrics import LiveGauges, start_metrics_server

                self._live = LiveGauges()
                metrics_server = start_metrics_server(cfg.db, cfg.metrics_port, self._live)
                if self._progress:
                    self._progress(f"metrics at {metrics_server.url}")
            scope_hosts = await self._db(self.frontier.seed_hosts)
            self._start_parsers(scope_hosts)
            fetch_settings = FetchSettings(
                user_agent=cfg.user_agent,
                connect_timeout=cfg.connect_timeout,
                read_timeout=cfg.read_timeout,
                total_timeout=cfg.total_timeout,
                max_bytes=cfg.max_bytes,
                max_decompressed_bytes=cfg.max_decompressed_bytes,
                allow_private=cfg.allow_private,
            )
            async with Fetcher(fetch_settings, cfg.concurrency, self._resolver) as fetcher:
                self._fetcher = fetcher
                async with asyncio.TaskGroup() as outer:
                    outer.create_task(self._committer(), name="committer")
                    report = bool(self._progress or self._snapshot or self._live)
                    if report:
                        reporter = outer.create_task(self._reporter(t0), name="reporter")
                    async with asyncio.TaskGroup() as tg:
                        tg.create_task(self._feeder(), name="feeder")
                        for i in range(cfg.concurrency):
                            tg.create_task(self._worker(), name=f"worker-{i}")
                    await self._commit_q.put(None)
                    if report:
                        reporter.cancel()
            await self._save_gate()
            self.summary.stopped_by = self._stop_reason or "finished"
            self.summary.finished = not self._stop_reason
            return self.summary
        finally:
            self.summary.seconds = time.monotonic() - t0
            if self._pool is not None:
                self._pool.close()
            if metrics_server is not None:
                metrics_server.close()
            if self._warc_exec is not None:
                self._warc_exec.shutdown(wait=True)
            if self._warc is not None:
                self._warc.close()
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
        for host, budget in self.cfg.host_budgets:
            await self._db(f.control, "set-budget", host, budget)
        if self._warc is not None:
            digests = list(await self._db(f.body_digests))
            self._bodies = BloomNegativeCache(max(100_000, 2 * len(digests)))
            self._bodies.add_many(digests)
        self._simhash = SimHashIndex(3)
        for url_id, fp, near in await self._db(f.simhashes):
            self._simhash.add(fp, url_id)
            self._dup_root[url_id] = near if near is not None else url_id
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
        # Parser processes fed from the event loop (parse.ParserPool): no helper threads; a
        # timed-out or dead worker fails its page only and is replaced.
        self._pool = ParserPool(
            self.cfg.parse_workers,
            (
                self._spider_spec,
                self._scope_hosts,
                self.cfg.scope,
                self.cfg.trap_limits(),
                self.cfg.parse_memory_limit,
            ),
        )
        self._pool.start()
        # Pages queued per parser process: enough that a worker always has its next page even
        # when the event loop answers late (it shares the GIL with the SQL thread, whose
        # switch interval is 5 ms, against ~1.3 ms per parse).
        self._parse_slots = asyncio.Semaphore(self.cfg.parse_workers * 4)

    # -- tasks ----------------------------------------------------------------------------------

    async def _feeder(self) -> None:
        cfg = self.cfg
        lingered = False
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
                busy = self._in_flight >= self._lease_chunk
                if want < self._lease_chunk and busy and not lingered:
                    # Busy: let a few more workers become idle so that one lease transaction
                    # serves them all (a lease per page made the lease path the top SQL cost).
                    lingered = True
                    await asyncio.sleep(COALESCE_SECONDS)
                    continue
                lingered = False
                now = time.time()
                if cfg.recrawl and now >= self._next_reschedule:
                    # R16: start a new round (version + 1) for URLs whose next_fetch_at came.
                    self._next_reschedule = now + 1.0
                    self.summary.revisits_started += await self._db(
                        self.frontier.reschedule_due, now, 1000
                    )
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
                if prog.finished and self._in_flight == 0 and not cfg.recrawl:
                    break
                if prog.leased > self._in_flight and now >= self._next_reclaim:
                    # Someone else holds leases: if it was a process of this machine that died,
                    # return its work now instead of waiting for the leases to expire.
                    self._next_reclaim = now + 2.0
                    await self._reclaim_dead()
                wake_at = min(
                    (
                        t
                        for t in (
                            prog.next_due_at,
                            prog.next_lease_expiry,
                            prog.next_host_ready_at,
                            prog.next_refetch_at if cfg.recrawl else None,
                        )
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
        conditional = conditional_headers(lease)
        try:
            res = await self._fetcher.fetch(lease.url, conditional or None)
        except FetchError as exc:
            self._count_error(exc.kind)
            if exc.kind == "blocked":
                return Failure(lease, str(exc), retry_at=None)
            return self._retry(lease, str(exc), None, None)
        self.summary.fetched += 1
        self.summary.bytes += len(res.body)
        if res.status in RETRYABLE_STATUS:
            self._count_error(f"http_{res.status}")
            ra = retry_after_seconds(
                res.headers.get("retry-after"), time.time(), self.cfg.retry_after_cap
            )
            return self._retry(lease, f"HTTP {res.status}", res.status, ra)
        if res.status == 304 and conditional:
            return await self._not_modified(lease, res)
        if lease.kind == DOWNLOAD:
            return await self._download(lease, res)
        job = ParseJob(lease.url, res.status, res.headers, res.body, lease.depth, lease.kind)
        result = await self._parse(job)
        links = result.links
        counters: dict[str, int] = {}
        error = f"cut: {res.cut_reason}" if res.cut_reason else None
        if res.cut_reason:
            counters[f"cut_{res.cut_reason.split(':')[0]}"] = 1
        redirect_to = None
        if 300 <= res.status < 400 and res.headers.get("location"):
            redirect_to, links, error = self._redirect(lease, res.headers["location"], links)
            if error:
                counters["redirects_too_long"] = 1
        try:
            archived = await self._archive(lease, res, result, links)
        except (WarcError, OSError) as exc:
            return self._archive_failed(exc)
        if result.error:
            self._count_error("parse")
            return Failure(
                lease,
                result.error,
                retry_at=None,
                status=res.status,
                warc_file=archived.file,
                warc_offset=archived.offset,
                warc_length=archived.length,
                payload_digest=archived.digest,
            )
        assert self._gate is not None
        pauses = self._gate.gate.pauses
        links, refused = self._gate.filter(links)
        if self._gate.gate.pauses > pauses:
            counters["template_paused"] = self._gate.gate.pauses - pauses
        if self._gate.needs_rebuild:
            await self._rebuild_gate()
        rejections = dict(result.rejected)
        for reason, n in refused.items():
            rejections[reason] = rejections.get(reason, 0) + n
        for reason, n in rejections.items():
            self.summary.links_rejected[reason] = self.summary.links_rejected.get(reason, 0) + n
        near = self._near_duplicate(lease, result.simhash)
        return self._round(
            lease,
            res,
            archived,
            error,
            counters,
            near=near,
            records=result.records,
            links=links,
            rejections=rejections,
            simhash=result.simhash,
            near_dup_of=near,
            canonical_hint=result.canonical,
            redirect_to=redirect_to,
        )

    def _round(
        self,
        lease: Lease,
        res: FetchResult,
        archived: Archived,
        error: str | None,
        counters: dict[str, int],
        near: int | None = None,
        **extra: Any,
    ) -> Completion:
        """The completion of one fetched round: content hash, change, next revisit, archive."""
        digest = hashlib.blake2b(res.body, digest_size=16).hexdigest()
        changed = lease.prev_hash != digest or lease.prev_status != res.status
        now = time.time()
        interval = self.recrawl.next_interval(
            lease.url,
            lease.interval,
            changed=changed,
            status=res.status,
            near_duplicate=near is not None,
        )
        return Completion(
            lease,
            res.status,
            now,
            content_hash=digest,
            body_bytes=len(res.body),
            error=error,
            latency=res.elapsed,
            etag=res.headers.get("etag"),
            last_modified=res.headers.get("last-modified"),
            changed=changed,
            next_fetch_at=now + interval,
            revisit_interval=interval,
            warc_file=archived.file,
            warc_offset=archived.offset,
            warc_length=archived.length,
            payload_digest=archived.digest,
            stored_body=archived.stored,
            counters=counters,
            **extra,
        )

    async def _download(self, lease: Lease, res: FetchResult) -> Completion | None:
        """A file a spider asked for: archived, kept under ``files/`` by content hash."""
        stored = None
        try:
            archived = await self._archive(lease, res, ParseResult(), [])
            if 200 <= res.status < 300 and not res.cut_reason:
                suffix = download_suffix(lease.url)
                directory = self.cfg.warc_directory()
                stored = await self._in_warc_thread(
                    partial(store_download, directory, res.body, suffix)
                )
        except (WarcError, OSError) as exc:
            return self._archive_failed(exc)
        error = f"cut: {res.cut_reason}" if res.cut_reason else None
        counters = {"downloads": 1} if stored else {}
        return self._round(lease, res, archived, error, counters, stored_file=stored)

    async def _not_modified(self, lease: Lease, res: FetchResult) -> Completion:
        """A 304 (R13): no body to store or parse; the schedule lengthens; no index event."""
        if self._warc is not None:
            await self._write_revisit(
                self._warc, lease, res, "server-not-modified", None, lease.url, None
            )
        now = time.time()
        interval = self.recrawl.next_interval(
            lease.url, lease.interval, changed=False, status=lease.prev_status or 200
        )
        return Completion(
            lease,
            304,
            now,
            latency=res.elapsed,
            etag=res.headers.get("etag") or lease.etag,
            last_modified=res.headers.get("last-modified") or lease.last_modified,
            changed=False,
            next_fetch_at=now + interval,
            revisit_interval=interval,
        )

    def _redirect(
        self, lease: Lease, location: str, links: list[NewURL]
    ) -> tuple[str | None, list[NewURL], str | None]:
        """R14: the target is a URL of its own (scope, robots, SSRF and dedup apply to it as to
        any link) one hop further; past ``max_redirects`` hops the chain is cut and recorded."""
        try:
            target: str | None = urls.normalise(location, lease.url)
        except urls.InvalidURL:
            target = None
        hops = lease.hops + 1
        if hops > self.cfg.max_redirects:
            return target, [], f"redirect chain longer than {self.cfg.max_redirects} hops"
        return target, [dataclasses.replace(u, hops=hops) for u in links], None

    async def _archive(
        self, lease: Lease, res: FetchResult, result: ParseResult, links: list[NewURL]
    ) -> Archived:
        """Write the exchange to the WARC store before the completion commits (R19, R20).

        It is written once the page is parsed so the metadata record can list the discovered
        links; a page whose parse fails or times out is archived all the same (reparse reads it
        back). A body byte-identical to one already archived becomes a ``revisit`` record that
        points at the first copy (R11): stored once, referenced after.
        """
        if self._warc is None:
            return Archived()
        store = self._warc
        body_digest = payload_digest(res.body)
        assert self._bodies is not None
        pending = self._body_writes.get(body_digest)
        if pending is not None:  # the same body is being archived by another worker right now
            await asyncio.shield(pending)
        # Bodies this process archived are known here before their pages commit (the bodies
        # table only learns them at commit), so concurrent copies still become revisits.
        first = self._recent_bodies.get(body_digest)
        if first is None and self._bodies.might_contain(body_digest):
            found = await self._db(self.frontier.find_bodies, [body_digest])
            first = found.get(body_digest)
        if first is not None:
            ref = WarcPointer(first[0], first[1], first[2], body_digest)
            await self._write_revisit(
                store, lease, res, "identical-payload-digest", ref, first[3], body_digest
            )
            # The URL points at the full copy, so reparse and readers get the body.
            return Archived(ref.file, ref.offset, ref.length, body_digest, stored=False)
        metadata = {
            "url_version": lease.version,
            "status": res.status,
            "elapsed_s": round(res.elapsed, 6),
            "wire_bytes": res.wire_bytes,
            "cut_reason": res.cut_reason,
            "parse_error": result.error,
            "links": [u.url for u in links],
            "records": len(result.records),
        }
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._body_writes[body_digest] = done
        try:
            ptr = await self._write_exchange(store, lease, res, metadata)
        finally:
            del self._body_writes[body_digest]
            done.set_result(None)
        self._bodies.add(body_digest)
        self._recent_bodies[body_digest] = (ptr.file, ptr.offset, ptr.length, lease.url)
        if len(self._recent_bodies) > RECENT_BODIES:
            self._recent_bodies.popitem(last=False)
        return Archived(ptr.file, ptr.offset, ptr.length, body_digest, stored=True)

    async def _write_revisit(
        self,
        store: WarcStore,
        lease: Lease,
        res: FetchResult,
        profile: str,
        refers_to: WarcPointer | None,
        refers_to_uri: str | None,
        digest: str | None,
    ) -> WarcPointer:
        """A revisit record (a 304, or a body identical to one already archived)."""
        return await self._in_warc_thread(
            partial(
                store.write_revisit,
                url=lease.url,
                fetched_at=time.time() - res.elapsed,  # WARC-Date: when the request went out
                request_headers=res.request_headers,
                status=res.status,
                reason=res.reason,
                http_version=res.http_version,
                response_headers=res.raw_headers,
                profile=profile,
                refers_to=refers_to,
                refers_to_uri=refers_to_uri,
                refers_to_date=None,
                payload_digest=digest,
                ip=res.ip,
            )
        )

    async def _write_exchange(
        self, store: WarcStore, lease: Lease, res: FetchResult, metadata: dict[str, Any]
    ) -> WarcPointer:
        return await self._in_warc_thread(
            partial(
                store.write_exchange,
                url=lease.url,
                fetched_at=time.time() - res.elapsed,
                request_headers=res.request_headers,
                status=res.status,
                reason=res.reason,
                http_version=res.http_version,
                response_headers=res.raw_headers,
                body=res.body,
                ip=res.ip,
                metadata=metadata,
                truncated=res.cut_reason,
                # An encoding the fetcher could not decode is archived as received.
                decoded=not any("not decoded" in n for n in res.notes),
            )
        )

    def _archive_failed(self, exc: Exception) -> None:
        """The store cannot take the body (disk full, unwritable): completing without it would
        break the promise that every committed page is archived, so stop the crawl cleanly.
        The page is not committed; its lease returns and a restart fetches it again."""
        if self.summary.fatal is None:
            self.summary.fatal = f"WARC store failed: {exc}"
            self.stop("archive-error")
        return None

    async def _in_warc_thread(self, fn: Callable[[], T]) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._warc_exec, fn)

    def _near_duplicate(self, lease: Lease, fp: int | None) -> int | None:
        """The near-duplicate group this page joins (R11), via the permuted-table index."""
        index = self._simhash
        if fp is None or index is None:
            return None
        # near() lists the nearest first; a recrawled page finds itself at distance 0.
        match = next(
            (
                doc
                for doc, dist in index.near(fp)
                if doc != lease.url_id and dist <= self.cfg.near_dup_distance
            ),
            None,
        )
        root = None if match is None else self._dup_root.get(match, match)
        if lease.url_id not in self._dup_root:
            index.add(fp, lease.url_id)
            self._dup_root[lease.url_id] = root if root is not None else lease.url_id
        return root

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
        assert self._pool is not None
        self._parse_waiting += 1  # parser backlog: fetched pages waiting for a parser
        try:
            async with self._parse_slots:
                self._parse_waiting -= 1
                try:
                    return await self._pool.parse(job, self.cfg.parse_timeout)
                finally:
                    self._parse_waiting += 1
        finally:
            self._parse_waiting -= 1

    async def _committer(self) -> None:
        cfg = self.cfg
        done = False
        while not done:
            first = await self._commit_q.get()
            if first is None:
                break
            batch: list[Outcome] = [first]
            linger = cfg.commit_seconds
            if not linger and self._in_flight > self._lease_chunk:
                linger = COALESCE_SECONDS  # busy: more completions are moments away
            deadline = time.monotonic() + linger
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
        """Every 2 s: this process's rates and the crawl-wide state (frontier, all processes)
        for the progress display and the live metrics gauges."""
        from .metrics import host_summary
        from .progress import RateMeter

        pages, nbytes = RateMeter(), RateMeter()
        urls: dict[str, int] = {}
        hosts: dict[str, int] = {}
        requests = records = 0
        next_frontier_read = 0.0
        while True:
            await asyncio.sleep(2.0)
            s = self.summary
            now = time.monotonic()
            if now >= next_frontier_read:
                next_frontier_read = now + 10.0  # O(URLs) counts: not every tick
                stats = await self._db(self.frontier.stats)
                urls = {k: v for k, v in stats.urls_by_state.items() if v}
                requests, records = stats.counters.get("fetches", 0), stats.records
                hosts = host_summary(await self._db(self.frontier.hosts_report, time.time()))
            snap = {
                "elapsed_s": round(now - t0, 1),
                "pages_per_s": round(pages.add(s.fetched, now), 1),
                "bytes_per_s": round(nbytes.add(s.bytes, now)),
                "urls": urls,
                "hosts_ready": hosts.get("ready", 0),
                "hosts_backoff": hosts.get("backoff", 0),
                "in_flight": self._in_flight,
                "parser_backlog": self._parse_waiting,
                "records": records,
                "requests_per_record": round(requests / records, 3) if records else None,
                "errors": dict(s.errors),
            }
            live = self._live
            if live is not None:
                live.parser_backlog = self._parse_waiting
                live.in_flight = self._in_flight
                live.pages_per_second = snap["pages_per_s"]
                live.bytes_per_second = snap["bytes_per_s"]
            if self._snapshot is not None:
                self._snapshot(snap)
            elif self._progress is not None:
                self._progress(
                    f"{snap['elapsed_s']:7.1f}s  fetched {s.fetched}  "
                    f"({snap['pages_per_s']}/s)  committed {s.committed}  records {s.records}  "
                    f"in flight {self._in_flight}  errors {sum(s.errors.values())}"
                )


def run_crawl(
    config: CrawlConfig,
    *,
    resolver: AbstractResolver | None = None,
    progress: Callable[[str], None] | None = None,
    snapshot: Callable[[dict[str, Any]], None] | None = None,
    handle_signals: bool = False,
) -> CrawlSummary:
    """Run one crawl process to its end (or until a signal / ``max_pages``).

    ``progress`` receives one-off messages (and, without ``snapshot``, a status line every
    2 s); ``snapshot`` receives the live numbers every 2 s (``progress.ProgressDisplay.update``).
    """
    engine = Engine(config, resolver=resolver, progress=progress, snapshot=snapshot)

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

    with asyncio.Runner(loop_factory=_loop_factory()) as runner:
        return runner.run(main())


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop when installed (optional ``fast`` extra): less CPU per request and callback.

    ``IDEMCRAWL_UVLOOP=0`` keeps the standard loop (for comparisons and debugging).
    """
    if os.environ.get("IDEMCRAWL_UVLOOP", "1") == "0":
        return None
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop
