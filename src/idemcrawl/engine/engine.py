"""The engine: owns a crawl process's resources and tasks, and wires the pipeline's parts."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
from collections.abc import Callable
from functools import partial
from typing import Any

from aiohttp.abc import AbstractResolver

from .. import owner as owners
from ..config import CrawlConfig
from ..cookies import CookieJar
from ..failures import REASONS_SHOWN
from ..fetch import Fetcher, FetchSettings
from ..frontier import Frontier, open_frontier
from ..parse import load_spider
from ..waiting import work_left
from ..warc import WarcStore
from .archiver import Archiver
from .calls import Call, inline, on_thread
from .clock import Clock, SystemClock
from .committer import Committer
from .feeder import Feeder, FeederCore
from .gate import LinkGate
from .parsing import ParseClient, spider_spec
from .pipeline import PageFetcher, Pipeline
from .rendering import host_rules, open_renderer
from .reporter import Reporter
from .startup import reclaim_dead_owners, reconcile
from .summary import CrawlSummary
from .warmup import Warmup


def warc_prefix(owner: str) -> str:
    """A WARC file prefix per owner slot: one writer per prefix, deterministic names."""
    cleaned = "".join(ch if ch.isalnum() or ch in "._-" else "-" for ch in owner)
    return f"idemcrawl-{cleaned}"[:100]


def fetch_settings(cfg: CrawlConfig) -> FetchSettings:
    return FetchSettings(
        user_agent=cfg.user_agent,
        connect_timeout=cfg.connect_timeout,
        read_timeout=cfg.read_timeout,
        total_timeout=cfg.total_timeout,
        max_bytes=cfg.max_bytes,
        max_decompressed_bytes=cfg.max_decompressed_bytes,
        allow_private=cfg.allow_private,
    )


class Engine:
    """One crawl process: opens what it needs, runs the parts as tasks, closes it all.

    Injected parts are used as given and left open for their owner to close: ``frontier`` (its
    calls run on a dedicated thread, or inline with ``inline_frontier`` when it never blocks),
    ``fetcher`` (anything with :class:`~idemcrawl.fetch.Fetcher`'s ``fetch``) and ``clock``.
    Without them the engine opens ``config.db`` with its own database thread, an SSRF-guarded
    :class:`~idemcrawl.fetch.Fetcher` (``resolver`` goes to it) and the system clock.

    Every task belongs to a TaskGroup that waits for it; :meth:`stop` (a signal, ``max_pages``,
    an archive failure) ends leasing, lets the workers finish and commit, and :meth:`run` returns.
    """

    def __init__(
        self,
        config: CrawlConfig,
        *,
        frontier: Frontier | None = None,
        fetcher: PageFetcher | None = None,
        clock: Clock | None = None,
        resolver: AbstractResolver | None = None,
        progress: Callable[[str], None] | None = None,
        snapshot: Callable[[dict[str, Any]], None] | None = None,
        inline_frontier: bool = False,
    ) -> None:
        config.validate()
        if inline_frontier and frontier is None:
            raise ValueError("inline_frontier is for an injected frontier that never blocks")
        self.cfg = config
        self.policy = config.host_policy()
        self.summary = CrawlSummary()
        self.clock: Clock = clock or SystemClock()
        self._given_frontier = frontier
        self._inline = inline_frontier
        self._given_fetcher = fetcher
        self._resolver = resolver
        self._progress = progress
        self._snapshot = snapshot
        self._frontier: Frontier | None = None
        self._feeder: Feeder | None = None
        self._stop_reason = ""

    @property
    def frontier(self) -> Frontier:
        assert self._frontier is not None
        return self._frontier

    def stop(self, reason: str = "stopped") -> None:
        """Stop leasing; in-flight pages finish and are committed."""
        if not self._stop_reason:
            self._stop_reason = reason
        if self._feeder is not None:
            self._feeder.wake()

    def _fatal(self, reason: str) -> None:
        if self.summary.fatal is None:
            self.summary.fatal = reason
            self.stop("archive-error")

    async def run(self) -> CrawlSummary:
        t0 = self.clock.monotonic()
        async with contextlib.AsyncExitStack() as resources:  # closed in reverse order
            try:
                await self._crawl(resources, t0)
            finally:
                self.summary.seconds = self.clock.monotonic() - t0
        return self.summary

    async def _open_frontier(self, resources: contextlib.AsyncExitStack) -> Call:
        """The frontier and where its calls run (one dedicated thread unless inline)."""
        if self._inline:
            self._frontier = self._given_frontier
            return inline
        db_thread = concurrent.futures.ThreadPoolExecutor(1, "idemcrawl-db")
        resources.callback(db_thread.shutdown, wait=True)
        call = on_thread(db_thread)
        if self._given_frontier is not None:
            self._frontier = self._given_frontier
        else:
            self._frontier = await call(
                partial(open_frontier, wait=self.cfg.db_wait, say=self._say),
                self.cfg.db,
            )
            resources.push_async_callback(call, self._frontier.close)
        return call

    def _open_archive(
        self, resources: contextlib.AsyncExitStack, owner: str
    ) -> tuple[WarcStore | None, Call]:
        """The WARC store (None when off) and its writer thread (downloads use it too)."""
        cfg = self.cfg
        if not cfg.warc:
            return None, on_thread(None)
        # The slot's flock makes this process the prefix's only writer; opening cuts a record a
        # killed predecessor left half-written.
        store = WarcStore(
            cfg.warc_directory(),
            warc_prefix(owner),
            max_file_bytes=cfg.warc_max_file_bytes,
            compression_level=cfg.warc_level,
        )
        resources.callback(store.close)
        self.summary.warc_repaired_bytes = store.repaired_bytes
        warc_thread = concurrent.futures.ThreadPoolExecutor(1, "idemcrawl-warc")
        resources.callback(warc_thread.shutdown, wait=True)
        return store, on_thread(warc_thread)

    def _serve_metrics(self, resources: contextlib.AsyncExitStack) -> Any:
        """The Prometheus endpoint and the gauges only this process knows (None when off)."""
        if self.cfg.metrics_port is None:
            return None
        from ..metrics import LiveGauges, start_metrics_server

        live = LiveGauges()
        server = start_metrics_server(self.cfg.db, self.cfg.metrics_port, live)
        resources.callback(server.close)
        self._say(f"metrics at {server.url}")
        return live

    def _say(self, message: str) -> None:
        if self._progress is not None:
            self._progress(message)

    async def _crawl(self, resources: contextlib.AsyncExitStack, t0: float) -> None:
        cfg, clock, summary = self.cfg, self.clock, self.summary
        renderer, render_all = await open_renderer(cfg, resources)
        call = await self._open_frontier(resources)
        frontier = self.frontier
        # The crawl's identity for owner slots: its db string, or for a partitioned crawl the
        # map's own name, so processes given different server URLs of one crawl still get
        # distinct owner ids (and WARC prefixes) on one machine.
        identity = getattr(frontier, "crawl_identity", cfg.db)
        slot = owners.acquire(identity)
        resources.callback(slot.close)
        owner = slot.owner
        store, write = self._open_archive(resources, owner)
        archive = store is not None
        start = await call(partial(reconcile, frontier, cfg, owner, clock, archive=archive))
        if start.reclaimed:
            self._say(f"returned {start.reclaimed} leases of a dead crawl process")
        if start.requeued:
            self._say(f"requeued {start.requeued} deferred URLs")
        live = self._serve_metrics(resources)
        parsing = ParseClient(cfg, start.scope_hosts)
        resources.callback(parsing.close)
        parsing.start()
        fetcher = self._given_fetcher or await resources.enter_async_context(
            Fetcher(fetch_settings(cfg), cfg.concurrency, self._resolver)
        )

        # A spider keeps cookies unless it says otherwise; the plain crawl without a spider
        # keeps none (the base Spider's default is a spider author's, not an operator's).
        keep_cookies = bool(cfg.spider) and load_spider(spider_spec(cfg.spider)).keep_cookies
        jar = CookieJar() if keep_cookies else None
        if jar is not None:
            jar.load(await call(partial(frontier.cookies, clock.time())))
        core = FeederCore(
            frontier,
            clock,
            owner=owner,
            policy=self.policy,
            lease_seconds=cfg.lease_seconds,
            concurrency=cfg.concurrency,
            max_pages=cfg.max_pages,
            horizon=cfg.horizon or None,
            recrawl=cfg.recrawl,
            reclaim=partial(reclaim_dead_owners, frontier, identity, owner),
            cookies=jar,
            ahead=cfg.leases_ahead(),
        )
        feeder = self._feeder = Feeder(
            core,
            call,
            clock,
            workers=cfg.concurrency,
            summary=summary,
            stopped=lambda: bool(self._stop_reason),
            stop=self.stop,
            progress=self._progress,
        )
        gate = LinkGate(start.gate, frontier, call, clock)
        archiver = Archiver(
            store,
            cfg.warc_directory(),
            write=write,
            call=call,
            frontier=frontier,
            clock=clock,
            bodies=start.bodies,
            on_fatal=self._fatal,
            append=inline,
        )
        pipeline = Pipeline(
            cfg,
            fetcher=fetcher,
            parse=parsing.parse,
            archiver=archiver,
            gate=gate,
            near=start.near,
            clock=clock,
            summary=summary,
            renderer=renderer,
            render_all=render_all,
            rules_for=partial(host_rules, self.policy, call, frontier),
            cookies=jar,
        )
        committer = Committer(
            frontier,
            call,
            clock,
            self.policy,
            summary,
            batch=cfg.commit_batch,
            linger=cfg.commit_seconds,
            queue_size=max(cfg.commit_batch, cfg.concurrency) * 2,
            busy=lambda: core.busy,
            settled=feeder.settled,
            checkpoint=gate.save_now_and_then,
            committed=gate.remember,
        )
        reporter = None
        if self._progress or self._snapshot or live is not None:
            reporter = Reporter(
                frontier,
                call,
                clock,
                summary,
                started=t0,
                in_flight=lambda: core.in_flight,
                backlog=lambda: parsing.waiting,
                progress=self._progress,
                snapshot=self._snapshot,
                live=live,
            )
        warmup = Warmup(frontier, call, near=start.near, gate=start.gate, bodies=start.bodies)
        await self._run_tasks(feeder, pipeline, committer, reporter, warmup)
        await gate.save()
        summary.stopped_by = self._stop_reason or "finished"
        summary.finished = not self._stop_reason
        if not cfg.recrawl and summary.fatal is None:
            left = await call(work_left, frontier, clock.time())
            summary.left = {"queued": left.queued, "leased": left.leased, "deferred": left.deferred}
            summary.waiting = [w.as_dict() for w in left.waiting]
            summary.failed_urls = left.failed
            if left.failed:  # read only then: a crawl without failures pays nothing for it
                summary.failures = await call(frontier.failure_reasons, REASONS_SHOWN)

    async def _run_tasks(
        self,
        feeder: Feeder,
        pipeline: Pipeline,
        committer: Committer,
        reporter: Reporter | None,
        warmup: Warmup,
    ) -> None:
        """Workers and the feeder end first; the committer then drains what they produced.
        The warm-up runs beside them and is cancelled if the crawl ends before it does."""
        async with asyncio.TaskGroup() as outer:
            warming = outer.create_task(warmup.run(), name="warmup")
            outer.create_task(committer.run(), name="committer")
            reporting = None
            if reporter is not None:
                reporting = outer.create_task(reporter.run(), name="reporter")
            async with asyncio.TaskGroup() as tg:
                tg.create_task(feeder.run(), name="feeder")
                for i in range(self.cfg.concurrency):
                    tg.create_task(_work(feeder, pipeline, committer), name=f"worker-{i}")
            await committer.close()
            warming.cancel()
            if reporting is not None:
                reporting.cancel()


async def _work(feeder: Feeder, pipeline: Pipeline, committer: Committer) -> None:
    """A worker: lease → outcome → committer, until the feeder says stop."""
    while (lease := await feeder.next_lease()) is not None:
        outcome = await pipeline.process(lease)
        if outcome is None:
            feeder.core.settled(1)  # dropped; its lease expires or is reclaimed
        else:
            await committer.put(outcome)
