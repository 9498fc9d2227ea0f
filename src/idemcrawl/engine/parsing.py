"""Where fetched pages are parsed: parser processes behind a bounded queue, or inline.

Parsing is CPU work, so it runs in ``parse_workers`` processes (R19) fed from the event loop
(:class:`~idemcrawl.parse_pool.ParserPool`: no helper threads; a timed-out or dead worker fails its
page only and is replaced). A bounded number of pages may wait per process; a worker that finds
no free slot waits before fetching more, so when parsers fall behind, fetching slows instead of
bodies piling up in memory. ``parse_workers = 0`` parses inline (tests, tiny crawls).
"""

from __future__ import annotations

import asyncio
import os

from ..config import CrawlConfig
from ..parse import ParseJob, Parser, ParseResult, load_spider
from ..parse_pool import ParserPool


def spider_spec(spec: str | None) -> str | None:
    """A ``FILE.py:Class`` spec with an absolute path: parser processes may run elsewhere."""
    if spec and ":" in spec:
        target, _, cls = spec.rpartition(":")
        if target.endswith(".py"):
            return f"{os.path.abspath(target)}:{cls}"
    return spec


#: Pages sent ahead to each parser process (see ParseClient.__init__).
PAGES_PER_PARSER = 16


class ParseClient:
    def __init__(self, cfg: CrawlConfig, scope_hosts: frozenset[str]) -> None:
        spec = spider_spec(cfg.spider)
        load_spider(spec)  # fail fast, in this process, with a clear message
        self._timeout = cfg.parse_timeout
        self._parser: Parser | None = None
        self._pool: ParserPool | None = None
        #: Fetched pages waiting for a parser (the parser backlog metric).
        self.waiting = 0
        if cfg.parse_workers == 0:
            self._parser = Parser(
                spec, scope_hosts, cfg.scope, cfg.trap_limits(), requisites=cfg.requisites
            )
            return
        limits = cfg.trap_limits()
        self._pool = ParserPool(
            cfg.parse_workers,
            (spec, scope_hosts, cfg.scope, limits, cfg.parse_memory_limit, cfg.requisites),
        )
        # Pages queued per parser process: enough that a worker always has its next page even
        # when the event loop answers late (it shares the GIL with the SQL and WARC threads,
        # and a thread holding it keeps it up to the 5 ms switch interval). With the native
        # SimHash a parse is ~0.5 ms, so 4 pages (the old depth, for ~1.3 ms parses) left the
        # parser idle during such a stall: 16 measured 603-1,089 pages/s against 535-717 in
        # three interleaved pairs on a loaded machine. Memory is not the bound here: a page
        # waiting for a slot holds its body all the same, and fetches are bounded by
        # ``concurrency``.
        self._slots = asyncio.Semaphore(cfg.parse_workers * PAGES_PER_PARSER)

    def start(self) -> None:
        """Start the parser processes (needs the running loop that will feed them)."""
        if self._pool is not None:
            self._pool.start()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()

    async def parse(self, job: ParseJob) -> ParseResult:
        if self._parser is not None:
            return self._parser.run(job)
        assert self._pool is not None
        self.waiting += 1
        try:
            async with self._slots:
                self.waiting -= 1
                try:
                    return await self._pool.parse(job, self._timeout)
                finally:
                    self.waiting += 1
        finally:
            self.waiting -= 1
