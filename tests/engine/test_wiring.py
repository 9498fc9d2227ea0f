"""The whole Engine with an injected frontier and fetcher: no sockets, nothing to wait for.

Politeness delays are 0 here, so the crawl never has to wait for time to pass; the system clock
is used only to stamp what happened.
"""

from __future__ import annotations

import asyncio
import os
import threading
import zlib
from pathlib import Path
from typing import Any

import pytest

from idemcrawl import owner as owners
from idemcrawl import warc
from idemcrawl.config import CrawlConfig
from idemcrawl.engine import Engine
from idemcrawl.fetch import FetchResult
from idemcrawl.frontier.sqlite import SQLiteFrontier

from .conftest import HOST
from .fakes import FakeFetcher, response


def site() -> FakeFetcher:
    """robots.txt is a 404 (allow all); four pages linking each other."""
    pages = {
        "/": ["/a", "/b"],
        "/a": ["/b", "/c", "/"],
        "/b": ["/c"],
        "/c": [],
    }
    routes: dict[str, Any] = {}
    for path, links in pages.items():
        body = "".join(f'<a href="{h}">{h}</a>' for h in links) + f"<p>page {path}</p>"
        routes[HOST + path] = response(HOST + path, 200, f"<html><body>{body}</body></html>")
    return FakeFetcher(routes)


def config(tmp_path: Path, **kw: Any) -> CrawlConfig:
    base: dict[str, Any] = dict(
        db=str(tmp_path / "crawl.db"),
        seeds=(f"{HOST}/",),
        concurrency=4,
        host_concurrency=4,
        delay=0.0,
        parse_workers=0,
    )
    base.update(kw)
    return CrawlConfig(**base)


@pytest.mark.parametrize("level", [None, 2, 9])
def test_the_archive_compresses_at_the_configured_level(tmp_path: Path, level: int | None) -> None:
    cfg = config(tmp_path) if level is None else config(tmp_path, warc_level=level)
    asyncio.run(Engine(cfg, fetcher=site()).run())
    (name,) = [n for n in os.listdir(cfg.warc_directory()) if n.endswith(".warc.gz")]
    data = (Path(cfg.warc_directory()) / name).read_bytes()
    want = warc.COMPRESSION_LEVEL if level is None else level
    other = 9 if level is None or level < 9 else 1
    kinds = []
    while data:  # every member: the warcinfo, and exchanges built by the parser or the store
        d = zlib.decompressobj(zlib.MAX_WBITS | 16)
        raw = d.decompress(data)
        member = data[: len(data) - len(d.unused_data)]
        data = d.unused_data
        kinds.append(raw.split(b"\r\n", 2)[1])
        # Both compressors are deterministic: the member is what the configured level writes.
        assert warc.gzip_member(raw, want) == member
        assert warc.gzip_member(raw, other) != member
    assert kinds.count(b"WARC-Type: response") > 1


@pytest.mark.parametrize("inline", [False, True])
def test_a_crawl_through_injected_parts(tmp_path: Path, inline: bool) -> None:
    cfg = config(tmp_path)
    frontier = SQLiteFrontier(cfg.db)
    fetcher = site()
    engine = Engine(cfg, frontier=frontier, fetcher=fetcher, inline_frontier=inline)
    summary = asyncio.run(engine.run())
    try:
        assert summary.finished and summary.stopped_by == "finished"
        assert fetcher.urls[0] == f"{HOST}/robots.txt"  # before any page of the host
        assert sorted(fetcher.urls[1:]) == [f"{HOST}/{p}" for p in ("", "a", "b", "c")]
        assert summary.fetched == 5 and summary.committed == 5
        # The injected frontier is the caller's: still open, and it holds the crawl.
        assert frontier.stats().urls_by_state["done"] == 5
        assert frontier.owners_with_leases() == []
    finally:
        frontier.close()
    warcs = [n for n in os.listdir(cfg.warc_directory()) if n.endswith(".warc.gz")]
    assert len(warcs) == 1


def test_inline_calls_need_an_injected_frontier(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="inline_frontier"):
        Engine(config(tmp_path), inline_frontier=True)


class Hanging(FakeFetcher):
    """Every page fetch waits until the test lets it answer."""

    def __init__(self) -> None:
        super().__init__(site().routes)
        self.started = asyncio.Event()
        self.answer = asyncio.Event()

    async def fetch(self, url: str, headers: Any = None, **kw: Any) -> FetchResult:
        self.started.set()
        await self.answer.wait()
        return await super().fetch(url, headers, **kw)


def test_stop_lets_the_pages_in_flight_finish_and_commit(tmp_path: Path) -> None:
    cfg = config(tmp_path, ignore_robots=True)

    async def main() -> Any:
        fetcher = Hanging()
        engine = Engine(cfg, fetcher=fetcher)
        run = asyncio.create_task(engine.run())
        await asyncio.wait_for(fetcher.started.wait(), 10)
        engine.stop("SIGTERM")
        fetcher.answer.set()
        return await asyncio.wait_for(run, 10), fetcher

    summary, fetcher = asyncio.run(main())
    assert summary.stopped_by == "SIGTERM" and not summary.finished
    assert fetcher.urls == [f"{HOST}/"]  # leased before the stop: fetched; nothing after it
    assert summary.committed == 1
    f = SQLiteFrontier(cfg.db)
    try:
        assert f.url_row(f"{HOST}/")["state"] == "done"  # type: ignore[index]
        assert f.owners_with_leases() == []
    finally:
        f.close()


def test_cancelling_a_run_leaves_no_task_thread_or_lock_behind(tmp_path: Path) -> None:
    cfg = config(tmp_path, ignore_robots=True)

    async def main() -> list[asyncio.Task[Any]]:
        fetcher = Hanging()
        run = asyncio.create_task(Engine(cfg, fetcher=fetcher).run())
        await asyncio.wait_for(fetcher.started.wait(), 10)
        run.cancel()  # what a second Ctrl-C does
        with pytest.raises(asyncio.CancelledError):
            await run
        return [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]

    assert asyncio.run(main()) == []
    assert not [t for t in threading.enumerate() if t.name.startswith("idemcrawl-")]
    slot = owners.acquire(cfg.db)  # the crawl's owner slot was released: slot 0 is free
    try:
        assert slot.owner.endswith("/0")
    finally:
        slot.close()
    f = SQLiteFrontier(cfg.db)
    try:
        # The lease it held simply stays until it expires (or the next run reclaims it).
        assert f.owners_with_leases() == [slot.owner]
    finally:
        f.close()
