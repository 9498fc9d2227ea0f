"""One URL's way through the pipeline, with canned responses, a real frontier and parser, a
virtual clock and (where it matters) a real WARC store: no sockets, no sleeps."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import os
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest
import xxhash
from warcio.archiveiterator import ArchiveIterator

import idemcrawl
from idemcrawl.config import CrawlConfig
from idemcrawl.dedup import BloomNegativeCache
from idemcrawl.engine import Archiver, CrawlSummary, Pipeline, inline
from idemcrawl.engine.gate import LinkGate, load_gate
from idemcrawl.engine.neardup import NearDuplicates
from idemcrawl.engine.parsing import ParseClient
from idemcrawl.fetch import FetchError
from idemcrawl.frontier.base import (
    DOWNLOAD,
    REJECTED,
    ROBOTS,
    Completion,
    Failure,
    HostPolicy,
    Lease,
    NewURL,
)
from idemcrawl.frontier.sqlite import SQLiteFrontier
from idemcrawl.parse import ParseJob, ParseResult
from idemcrawl.warc import WarcPointer, WarcStore, parse_metadata, read_response

from .conftest import HOST, add_pages, lease_all
from .fakes import FakeClock, FakeFetcher, response, settle

T = TypeVar("T")


class Boom(idemcrawl.Spider):
    name = "boom"

    def parse(self, page: idemcrawl.Page) -> Iterable[Any]:
        raise RuntimeError("spider bug")


@dataclass
class Rig:
    pipeline: Pipeline
    fetcher: FakeFetcher
    summary: CrawlSummary
    cfg: CrawlConfig
    store: WarcStore | None
    fatal: list[str] = field(default_factory=list)

    def run(self, lease: Lease) -> Completion | Failure | None:
        return asyncio.run(self.pipeline.process(lease))

    def records(self) -> list[tuple[str, str]]:
        """(WARC-Type, WARC-Target-URI) of every record archived so far, in order."""
        assert self.store is not None
        out = []
        directory = self.store.directory
        for name in sorted(os.listdir(directory)):
            if name.endswith(".warc.gz"):
                with open(os.path.join(directory, name), "rb") as fh:
                    for rec in ArchiveIterator(fh):
                        uri = rec.rec_headers.get_header("WARC-Target-URI") or ""
                        out.append((rec.rec_type, uri))
        return out


def rig(
    tmp_path: Path,
    frontier: SQLiteFrontier,
    clock: FakeClock,
    routes: dict[str, Any] | None = None,
    *,
    warc: bool = False,
    write: Any = inline,
    **cfg_kw: Any,
) -> Rig:
    cfg = CrawlConfig(
        db=str(tmp_path / "crawl.db"),
        seeds=(f"{HOST}/",),
        parse_workers=0,
        warc=warc,
        **cfg_kw,
    )
    summary = CrawlSummary()
    fatal: list[str] = []
    store = WarcStore(cfg.warc_directory(), "test") if warc else None
    archiver = Archiver(
        store,
        cfg.warc_directory(),
        write=write,
        call=inline,
        frontier=frontier,
        clock=clock,
        bodies=BloomNegativeCache(1000) if warc else None,
        on_fatal=fatal.append,
    )
    fetcher = FakeFetcher(routes)
    pipeline = Pipeline(
        cfg,
        fetcher=fetcher,
        parse=ParseClient(cfg, frozenset({HOST})).parse,
        archiver=archiver,
        gate=LinkGate(load_gate(frontier, cfg.trap_limits()), frontier, inline, clock),
        near=NearDuplicates(cfg.near_dup_distance),
        clock=clock,
        summary=summary,
        rng=random.Random(7),
    )
    return Rig(pipeline, fetcher, summary, cfg, store, fatal)


def html(*hrefs: str, text: str = "") -> str:
    links = "".join(f'<a href="{h}">{h}</a> ' for h in hrefs)
    return f"<html><body><p>{text}</p>{links}</body></html>"


def robots_lease(clock: FakeClock) -> Lease:
    return Lease(1, f"{HOST}/robots.txt", HOST, 1, 1, "me/0", clock.now + 60, 0, 0, kind=ROBOTS)


# -- pages ---------------------------------------------------------------------------------------


def test_a_page_becomes_a_completion_with_its_links_and_next_visit(
    tmp_path: Path, frontier: SQLiteFrontier, clock: FakeClock
) -> None:
    add_pages(frontier, clock, 1)
    (lease,) = lease_all(frontier, clock, 1)
    body = html("/p1", "/about", "http://elsewhere.test/x")
    r = rig(tmp_path, frontier, clock, {lease.url: response(lease.url, 200, body)})
    clock.now += 3.0
    out = r.run(lease)
    assert isinstance(out, Completion)
    assert out.status == 200 and out.fetched_at == clock.now and out.changed
    assert sorted(u.url for u in out.links) == [f"{HOST}/about", f"{HOST}/p1"]
    assert all(u.depth == 1 for u in out.links)
    # page.links() leaves the out-of-scope link out, and the page counts it (issue 36)
    assert out.rejections == {"out_of_scope": 1}
    assert out.content_hash == "x3:" + xxhash.xxh3_128_hexdigest(body.encode())
    assert out.revisit_interval is not None
    assert out.next_fetch_at == clock.now + out.revisit_interval
    assert out.warc_file is None  # WARC output off
    assert r.fetcher.calls == [(lease.url, None)]  # a first round: no conditional headers
    assert r.summary.fetched == 1 and r.summary.bytes == len(body)


@pytest.mark.parametrize("stored", ["new", "legacy", "other", "status"])
def test_a_revisit_is_changed_only_when_body_or_status_differ(
    tmp_path: Path, frontier: SQLiteFrontier, clock: FakeClock, stored: str
) -> None:
    """``changed`` (R13) compares the body with the digest the last round stored, in this
    version's form or the BLAKE2b one of crawls stored before it."""
    add_pages(frontier, clock, 1)
    (lease,) = lease_all(frontier, clock, 1)
    body = html("/p1", text="the same words")
    prev = {
        "new": "x3:" + xxhash.xxh3_128_hexdigest(body.encode()),
        "legacy": hashlib.blake2b(body.encode(), digest_size=16).hexdigest(),
        "other": hashlib.blake2b(b"an older body", digest_size=16).hexdigest(),
        "status": "x3:" + xxhash.xxh3_128_hexdigest(body.encode()),
    }[stored]
    lease = dataclasses.replace(
        lease, prev_hash=prev, prev_status=404 if stored == "status" else 200
    )
    r = rig(tmp_path, frontier, clock, {lease.url: response(lease.url, 200, body)})
    out = r.run(lease)
    assert isinstance(out, Completion)
    assert out.changed is (stored in ("other", "status"))


def test_links_known_to_be_committed_skip_the_frontier_but_still_count(
    tmp_path: Path, frontier: SQLiteFrontier, clock: FakeClock
) -> None:
    add_pages(frontier, clock, 2)
    a, b = lease_all(frontier, clock, 2)
    body = html("/x", "/y")
    r = rig(tmp_path, frontier, clock, {ls.url: response(ls.url, 200, body) for ls in (a, b)})
    policy = HostPolicy(max_in_flight=10, delay=0.0)
    first = r.run(a)
    assert isinstance(first, Completion) and len(first.links) == 2 and first.known_links == 0
    # Not committed yet: the gate must not trust these URLs, a kill could still lose them.
    second = r.run(b)
    assert isinstance(second, Completion) and len(second.links) == 2
    gate = r.pipeline.gate
    gate.remember([first, second], [True, False])  # the second's transaction was refused
    assert {f"{HOST}/x", f"{HOST}/y"} <= set(gate.known._new)
    assert frontier.complete([first], clock.now, policy) == [True]
    third = r.run(b)  # b's lease is still held: the refused commit wrote nothing
    assert isinstance(third, Completion)
    assert third.links == [] and third.known_links == 2
    before = frontier.stats().counters.get("url_duplicates", 0)
    assert frontier.complete([third], clock.now, policy) == [True]
    assert frontier.stats().counters["url_duplicates"] == before + 2
    events = frontier.events_after(0, 10)
    assert [e["links"] for e in events] == [2, 2]  # the page's links, known or not


def test_a_lease_about_to_expire_is_dropped_unfetched(
    tmp_path: Path, frontier: SQLiteFrontier, clock: FakeClock
) -> None:
    add_pages(frontier, clock, 2)
    first, second = lease_all(frontier, clock, 2, lease_seconds=10.0)
    r = rig(tmp_path, frontier, clock)
    clock.now += 8.9
    assert r.run(first) is not None  # 1.1 s left: fetched
    clock.now += 0.2
    assert r.run(second) is None  # 0.9 s left: someone else may hold it by the time it runs
    assert r.fetcher.urls == [first.url]


def test_a_promised_start_is_waited_for_before_fetching(
    tmp_path: Path, frontier: SQLiteFrontier, clock: FakeClock
) -> None:
    """A lease granted one adaptive gap ahead (``start_at``) is not fetched before it (I6)."""
    add_pages(frontier, clock, 1)
    (lease,) = lease_all(frontier, clock, 1)
    later = dataclasses.replace(lease, start_at=clock.now + 0.0025)
    r = rig(tmp_path, frontier, clock, {lease.url: response(lease.url, 200, html())})

    async def main() -> None:
        task = asyncio.create_task(r.pipeline.process(later))
        await clock.advance(0.002)
        assert r.fetcher.calls == []  # not yet
        await clock.advance(0.0005)
        assert isinstance(await asyncio.wait_for(task, 1), Completion)
        assert r.fetcher.urls == [lease.url]
        assert clock.waits == [pytest.approx(0.0025)]

    asyncio.run(main())


def test_a_parse_error_fails_the_url_and_keeps_the_archived_body(
    tmp_path: Path, frontier: SQLiteFrontier, clock: FakeClock
) -> None:
    add_pages(frontier, clock, 1)
    (lease,) = lease_all(frontier, clock, 1)
    routes = {lease.url: response(lease.url, 200, html("/p1"))}
    r = rig(tmp_path, frontier, clock, routes, warc=True, spider="tests.engine.test_pipeline:Boom")
    out = r.run(lease)
    assert isinstance(out, Failure) and out.retry_at is None
    assert "spider bug" in out.error
    assert out.warc_file is not None and out.warc_offset is not None  # reparse can retry it
    assert r.summary.errors == {"parse": 1}


def test_template_growth_is_paused_by_the_discovery_gate(
    tmp_path: Path, frontier: SQLiteFrontier, clock: FakeClock
) -> None:
    add_pages(frontier, clock, 1)
    (lease,) = lease_all(frontier, clock, 1)
    hrefs = [f"/item/{n}" for n in range(10)]
    routes = {lease.url: response(lease.url, 200, html(*hrefs))}
    r = rig(tmp_path, frontier, clock, routes, template_growth_limit=4, template_sample_every=50)
    out = r.run(lease)
    assert isinstance(out, Completion)
    assert len(out.links) == 10  # refused links are still recorded, as rejected
    assert [u.state for u in out.links].count(REJECTED) == 6
    assert out.counters["template_paused"] == 1
    assert out.rejections == {"template_paused": 6}
    assert r.summary.links_rejected == {"template_paused": 6}


def test_near_duplicates_join_the_first_pages_group(
    tmp_path: Path, frontier: SQLiteFrontier, clock: FakeClock
) -> None:
    add_pages(frontier, clock, 3)
    a, b, c = lease_all(frontier, clock, 3)
    words = " ".join(f"word{n}" for n in range(300))
    routes = {
        a.url: response(a.url, 200, html(text=words)),
        b.url: response(b.url, 200, html(text=words + " extra")),
        c.url: response(c.url, 200, html(text="something else entirely, nothing alike")),
    }
    r = rig(tmp_path, frontier, clock, routes)
    outs = [r.run(ls) for ls in (a, b, c)]
    assert all(isinstance(o, Completion) for o in outs)
    first, second, third = outs
    assert isinstance(first, Completion) and first.near_dup_of is None
    assert isinstance(second, Completion) and second.near_dup_of == a.url_id
    assert isinstance(third, Completion) and third.near_dup_of is None


# -- fetch outcomes: retries, 304, redirects, downloads ---------------------------------------


def test_retry_after_is_honoured_and_counted(
    tmp_path: Path, frontier: SQLiteFrontier, clock: FakeClock
) -> None:
    add_pages(frontier, clock, 1)
    (lease,) = lease_all(frontier, clock, 1)
    busy = response(lease.url, 503, "busy", {"Retry-After": "120"})
    r = rig(tmp_path, frontier, clock, {lease.url: busy})
    out = r.run(lease)
    assert isinstance(out, Failure) and out.host_error and out.status == 503
    assert out.retry_after == 120
    assert out.retry_at is not None and out.retry_at >= clock.now + 120
    assert r.summary.errors == {"http_503": 1} and r.summary.fetched == 1


def test_transient_errors_back_off_with_jitter_then_fail_for_good(
    tmp_path: Path, frontier: SQLiteFrontier, clock: FakeClock
) -> None:
    add_pages(frontier, clock, 1)
    (lease,) = lease_all(frontier, clock, 1)
    r = rig(tmp_path, frontier, clock, {lease.url: FetchError("connect", "refused")})
    retries = []
    for attempts in range(3):
        out = r.run(dataclasses.replace(lease, attempts=attempts))
        assert isinstance(out, Failure) and out.host_error and out.retry_at is not None
        retries.append(out.retry_at - clock.now)
    # Full jitter under base * 2**attempts (retry_base 2 s by default).
    assert all(0 <= wait <= 2.0 * 2**n for n, wait in enumerate(retries)), retries
    last = r.run(dataclasses.replace(lease, attempts=3))  # max_retries = 3
    assert isinstance(last, Failure) and last.retry_at is None
    assert last.error == "connect: refused (after 4 attempts)"
    assert r.summary.errors == {"connect": 4} and r.summary.fetched == 0


def test_a_refused_address_fails_at_once(
    tmp_path: Path, frontier: SQLiteFrontier, clock: FakeClock
) -> None:
    add_pages(frontier, clock, 1)
    (lease,) = lease_all(frontier, clock, 1)
    r = rig(tmp_path, frontier, clock, {lease.url: FetchError("blocked", "private address")})
    out = r.run(lease)
    assert isinstance(out, Failure) and out.retry_at is None and not out.host_error


def test_not_modified_keeps_the_stored_copy_and_archives_a_revisit(
    tmp_path: Path, frontier: SQLiteFrontier, clock: FakeClock
) -> None:
    add_pages(frontier, clock, 1)
    (lease,) = lease_all(frontier, clock, 1)
    lease = dataclasses.replace(
        lease, etag='"v1"', last_modified="Mon, 01 Jan 2024 00:00:00 GMT", prev_status=200
    )
    r = rig(tmp_path, frontier, clock, {lease.url: response(lease.url, 304)}, warc=True)
    out = r.run(lease)
    assert r.fetcher.calls == [
        (
            lease.url,
            {"If-None-Match": '"v1"', "If-Modified-Since": "Mon, 01 Jan 2024 00:00:00 GMT"},
        )
    ]
    assert isinstance(out, Completion) and out.status == 304 and not out.changed
    assert out.etag == '"v1"' and out.content_hash is None and out.warc_file is None
    assert out.revisit_interval is not None
    assert out.next_fetch_at == clock.now + out.revisit_interval
    assert [t for t, _ in r.records()] == ["warcinfo", "request", "revisit"]


def test_a_redirect_target_is_a_url_of_its_own_one_hop_further(
    tmp_path: Path, frontier: SQLiteFrontier, clock: FakeClock
) -> None:
    add_pages(frontier, clock, 2)
    a, b = lease_all(frontier, clock, 2)
    moved = {"Location": "/new?x=1"}
    routes = {a.url: response(a.url, 301, "", moved), b.url: response(b.url, 301, "", moved)}
    r = rig(tmp_path, frontier, clock, routes)
    out = r.run(dataclasses.replace(a, hops=2))
    assert isinstance(out, Completion) and out.redirect_to == f"{HOST}/new?x=1"
    assert [(u.url, u.hops) for u in out.links] == [(f"{HOST}/new?x=1", 3)]
    assert out.error is None
    cut = r.run(dataclasses.replace(b, hops=5))  # max_redirects = 5
    assert isinstance(cut, Completion) and cut.links == []
    assert cut.error == "redirect chain longer than 5 hops"
    assert cut.counters == {"redirects_too_long": 1}


def test_a_download_is_archived_and_kept_by_content(
    tmp_path: Path, frontier: SQLiteFrontier, clock: FakeClock
) -> None:
    url = f"{HOST}/files/Report.PDF"
    frontier.add([NewURL(url, HOST, kind=DOWNLOAD)], clock.now)
    (lease,) = lease_all(frontier, clock, 1)
    body = b"%PDF-1.4 not really"
    pdf = response(url, 200, body, {"Content-Type": "application/pdf"})
    r = rig(tmp_path, frontier, clock, {url: pdf}, warc=True)
    out = r.run(lease)
    assert isinstance(out, Completion) and out.counters == {"downloads": 1}
    expected = os.path.join(r.cfg.warc_directory(), "files", hashlib.sha256(body).hexdigest())
    assert out.stored_file == expected + ".pdf"
    with open(expected + ".pdf", "rb") as fh:
        assert fh.read() == body
    assert not out.links and out.stored_body  # never parsed; archived in full
    assert ("response", url) in r.records()


# -- robots.txt ----------------------------------------------------------------------------------


def test_robots_txt_follows_up_to_five_redirects(
    tmp_path: Path, frontier: SQLiteFrontier, clock: FakeClock
) -> None:
    routes: dict[str, Any] = {f"{HOST}/robots.txt": response("", 301, "", {"Location": "/r1"})}
    for n in range(1, 5):
        routes[f"{HOST}/r{n}"] = response("", 302, "", {"Location": f"/r{n + 1}"})
    rules = "User-agent: *\nDisallow: /private\n"
    routes[f"{HOST}/r5"] = response("", 200, rules, {"Content-Type": "text/plain"})
    r = rig(tmp_path, frontier, clock, routes)
    out = r.run(robots_lease(clock))
    assert isinstance(out, Completion) and out.robots is not None
    assert out.robots.status == 200 and out.robots.body == rules.encode()
    assert not out.robots.too_many_redirects
    assert r.fetcher.urls[-1] == f"{HOST}/r5" and r.summary.fetched == 6
    assert out.fetched_at == clock.now

    routes[f"{HOST}/r5"] = response("", 302, "", {"Location": "/r6"})  # a sixth hop
    r = rig(tmp_path, frontier, clock, routes)
    out = r.run(robots_lease(clock))
    assert isinstance(out, Completion) and out.robots is not None
    assert out.robots.too_many_redirects and out.robots.status == 302
    assert f"{HOST}/r6" not in r.fetcher.urls


@pytest.mark.parametrize(
    ("kind", "permanent"), [("timeout", False), ("connect", False), ("blocked", True)]
)
def test_an_unreachable_robots_txt_is_reported_as_such(
    tmp_path: Path, frontier: SQLiteFrontier, clock: FakeClock, kind: str, permanent: bool
) -> None:
    r = rig(tmp_path, frontier, clock, {f"{HOST}/robots.txt": FetchError(kind, "no")})
    out = r.run(robots_lease(clock))
    assert isinstance(out, Completion) and out.robots is not None
    assert out.robots.status is None and out.robots.error == f"{kind}: no"
    assert out.robots.permanent is permanent
    assert r.summary.errors == {kind: 1}


# -- archiving -----------------------------------------------------------------------------------


def test_identical_bodies_are_archived_once_then_referenced(
    tmp_path: Path, frontier: SQLiteFrontier, clock: FakeClock
) -> None:
    add_pages(frontier, clock, 2)
    a, b = lease_all(frontier, clock, 2)
    body = html(text="the same page under two URLs")
    routes = {u.url: response(u.url, 200, body) for u in (a, b)}
    r = rig(tmp_path, frontier, clock, routes, warc=True)
    first, second = r.run(a), r.run(b)
    assert isinstance(first, Completion) and first.stored_body
    assert isinstance(second, Completion) and not second.stored_body
    assert (second.warc_file, second.warc_offset) == (first.warc_file, first.warc_offset)
    assert second.payload_digest == first.payload_digest
    types = [t for t, _ in r.records()]
    assert types.count("response") == 1 and types.count("revisit") == 1


def test_identical_bodies_in_flight_together_are_archived_once(
    tmp_path: Path, frontier: SQLiteFrontier, clock: FakeClock
) -> None:
    add_pages(frontier, clock, 2)
    a, b = lease_all(frontier, clock, 2)
    body = html(text="fetched twice at the same moment")
    routes = {u.url: response(u.url, 200, body) for u in (a, b)}
    writes: list[str] = []
    disk = asyncio.Event()

    async def slow_disk(fn: Callable[..., T], /, *args: Any) -> T:
        writes.append(getattr(fn, "func", fn).__name__)
        await disk.wait()
        return fn(*args)

    r = rig(tmp_path, frontier, clock, routes, warc=True, write=slow_disk)

    async def main() -> list[Any]:
        disk.clear()
        tasks = [asyncio.create_task(r.pipeline.process(ls)) for ls in (a, b)]
        await settle()
        # The parser built the exchange; the second waits for the first's append.
        assert writes == ["append_exchange"]
        disk.set()
        return await asyncio.gather(*tasks)

    first, second = asyncio.run(main())
    assert writes == ["append_exchange", "write_revisit"]
    assert isinstance(first, Completion) and first.stored_body
    assert isinstance(second, Completion) and not second.stored_body
    assert second.warc_offset == first.warc_offset


def test_an_archive_failure_stops_the_crawl_once_and_commits_nothing(
    tmp_path: Path, frontier: SQLiteFrontier, clock: FakeClock
) -> None:
    add_pages(frontier, clock, 2)
    a, b = lease_all(frontier, clock, 2)
    routes = {u.url: response(u.url, 200, html(text=u.url)) for u in (a, b)}
    r = rig(tmp_path, frontier, clock, routes, warc=True)
    assert r.store is not None
    r.store.close()  # from now on every write fails, like a full disk
    assert r.run(a) is None and r.run(b) is None
    assert len(r.fatal) == 1 and r.fatal[0].startswith("WARC store failed: ")
    assert r.summary.fetched == 2


def _metadata_records(store: WarcStore) -> list[dict[str, Any]]:
    out = []
    for name in sorted(os.listdir(store.directory)):
        if name.endswith(".warc.gz"):
            with open(os.path.join(store.directory, name), "rb") as fh:
                for rec in ArchiveIterator(fh):
                    if rec.rec_type == "metadata":
                        out.append(parse_metadata(rec.content_stream().read()))
    return out


def test_the_parser_built_exchange_says_what_the_crawl_process_would(
    tmp_path: Path, frontier: SQLiteFrontier, clock: FakeClock
) -> None:
    """A page's exchange is built by the parser (``ParseResult.warc``); when the parser gives
    none (a timeout, a dead parser process), the crawl process builds it: the same records and
    the same metadata either way, and the pointer reads the body back."""
    add_pages(frontier, clock, 2)
    a, b = lease_all(frontier, clock, 2)
    routes = {u.url: response(u.url, 200, html("/x", "/y", text=u.url)) for u in (a, b)}
    r = rig(tmp_path, frontier, clock, routes, warc=True)
    parse = r.pipeline._parse
    built: list[bool] = []

    async def without_warc(job: ParseJob) -> ParseResult:
        result = await parse(job)
        built.append(result.warc is not None)
        if job.url == b.fetch_url:
            result.warc = None  # as after a parse timeout
        return result

    r.pipeline._parse = without_warc
    first, second = r.run(a), r.run(b)
    assert built == [True, True]
    assert isinstance(first, Completion) and isinstance(second, Completion)
    assert [t for t, _ in r.records()][1:] == ["request", "response", "metadata"] * 2
    meta_a, meta_b = _metadata_records(r.store)  # type: ignore[arg-type]
    assert meta_a.keys() == meta_b.keys()
    assert [len(m["links"]) for m in (meta_a, meta_b)] == [2, 2]
    assert meta_a["url_version"] == a.version and meta_a["records"] == meta_b["records"]
    for out, lease in ((first, a), (second, b)):
        ptr = WarcPointer(out.warc_file, out.warc_offset, out.warc_length, out.payload_digest)
        assert read_response(r.store.directory, ptr)[2] == routes[lease.url].body  # type: ignore[union-attr]


@pytest.mark.parametrize(("hops", "listed"), [(2, [f"{HOST}/new?x=1"]), (5, [])])
def test_the_metadata_record_lists_the_links_the_redirect_rule_keeps(
    tmp_path: Path, frontier: SQLiteFrontier, clock: FakeClock, hops: int, listed: list[str]
) -> None:
    """The parser process builds the metadata record before the pipeline applies the redirect
    rule (R14): a redirect past ``max_redirects`` (5) lists no links there either."""
    add_pages(frontier, clock, 1)
    (a,) = lease_all(frontier, clock, 1)
    routes = {a.url: response(a.url, 301, "", {"Location": "/new?x=1"})}
    r = rig(tmp_path, frontier, clock, routes, warc=True)
    out = r.run(dataclasses.replace(a, hops=hops))
    assert isinstance(out, Completion) and [u.url for u in out.links] == listed
    (meta,) = _metadata_records(r.store)  # type: ignore[arg-type]
    assert meta["links"] == listed


def test_the_exchange_spec_hands_over_the_headers_as_received(
    tmp_path: Path, frontier: SQLiteFrontier, clock: FakeClock
) -> None:
    """The crawl process does not decode a fetch's response headers for the parser process
    (it hands over the bytes pairs); once something decoded them, the decoded pairs go. The
    exchange built from either is the same."""
    from idemcrawl import warc_records as wr
    from idemcrawl.fetch import FetchResult

    add_pages(frontier, clock, 1)
    (a,) = lease_all(frontier, clock, 1)
    r = rig(tmp_path, frontier, clock, {}, warc=True)
    wire = ((b"Content-Type", b"text/html"), (b"X-Caf\xe9", b"\xff"))
    res = FetchResult(a.fetch_url, 200, {"content-type": "text/html"}, b"<p>x</p>", 0.5,
                      wire_headers=wire)  # fmt: skip
    archiver = r.pipeline.archiver
    undecoded = archiver.exchange_spec(a, res, links_cut=False)
    assert undecoded is not None and undecoded.response_headers is wire
    decoded_pairs = res.raw_headers  # e.g. the cookie jar read them
    decoded = archiver.exchange_spec(a, res, links_cut=False)
    assert decoded is not None and decoded.response_headers is decoded_pairs
    built = []
    for spec in (undecoded, decoded._replace(fetched_at=undecoded.fetched_at)):
        wr._ids.seed(1)
        built.append(
            wr.build_page_exchange(
                spec, a.fetch_url, 200, res.body, links=[], records=0, parse_error=None
            )
        )
    assert built[0] == built[1]
