"""WARC archiving with body dedup (R11, R20): each exchange written before its page commits.

* A parsed page's exchange is built and compressed by the parser process (``ParseJob.warc``
  from :meth:`Archiver.exchange_spec`, ``ParseResult.warc`` back): the crawl process only
  decides full copy or revisit and appends the bytes (``append``, one ``write(2)``), so its
  event loop, which shares one GIL with the SQL thread, no longer builds records (issue 17).
* Everything else (robots.txt hops, downloads, requisites, 304s, revisits, rendered pages, and
  a page whose parser gave no exchange: a timeout, a dead parser) is built and written on the
  store's own thread (``write``); the store has one writer per file prefix, this process's
  owner slot.
* A body byte-identical to one already archived becomes a ``revisit`` record pointing at the
  first copy: stored once, referenced after. "Already archived" covers three cases: bodies the
  frontier knows (a Bloom filter answers "surely not" without a query), bodies this process
  archived whose pages have not committed yet (the frontier learns them only at commit), and a
  body another worker is writing at this very moment (wait for it, then refer to it).
* When the store cannot take a body (disk full, unwritable), completing the page without it
  would break the promise that every committed page is archived: the archiver reports why
  (``on_fatal``: the engine stops cleanly) and raises :class:`ArchiveFailed`; the page is not
  committed and a restart fetches it.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

from ..dedup import BloomNegativeCache
from ..fetch import FetchResult
from ..frontier.base import Frontier, Lease
from ..parse import ParseResult
from ..render import RenderResult
from ..warc import (
    WarcError,
    WarcPointer,
    WarcStore,
    digest_of_sha1,
    payload_digest,
    store_download,
)
from ..warc_records import BuiltExchange, ExchangeSpec, with_parse_facts
from .calls import Call, inline
from .clock import Clock

T = TypeVar("T")

#: Bodies this process archived, remembered until their pages have surely committed.
RECENT_BODIES = 4096


def _request_of(lease: Lease) -> dict[str, Any]:
    """The request's method and body for the WARC request record (a plain GET: nothing)."""
    spec = lease.request
    if spec is None:
        return {}
    return {"method": spec.method, "request_body": spec.body or b""}


def _decoded(res: FetchResult) -> bool:
    """False when the fetcher kept a body as received (an encoding it could not decode): its
    Content-Encoding is then still true and stays in the stored headers. Most responses carry
    no notes at all: that case costs no generator (it runs for every archived page)."""
    return not res.notes or not any("not decoded" in n for n in res.notes)


def _headers_as_received(res: FetchResult) -> Sequence[tuple[Any, Any]]:
    """The response headers for a parser process to build the exchange with: the bytes pairs
    as received when nothing decoded them yet (the parser process decodes them, so the crawl
    process, the busier one, saves building 2 strings and a tuple per header), else the
    decoded pairs (a result built by hand, or read by the cookie jar already)."""
    return res.headers_at_hand  # type: ignore[attr-defined,no-any-return]


class ArchiveFailed(Exception):
    """The store refused a write; the crawl is stopping, and this page must not commit."""


@dataclass(frozen=True, slots=True)
class Archived:
    """Where a page's response is archived (all None when WARC output is off)."""

    file: str | None = None
    offset: int | None = None
    length: int | None = None
    digest: str | None = None
    stored: bool = False


class Archiver:
    """``store`` None: WARC output is off (downloads are still kept under ``directory``).

    ``bodies`` holds the payload digests the frontier knows (required with a store);
    ``on_fatal`` receives the reason the crawl must stop, once. ``write`` runs what builds
    records (the store's thread); ``append`` what only appends an exchange a parser built
    (default: ``write``; the engine appends inline, a few microseconds of ``write(2)``).
    """

    def __init__(
        self,
        store: WarcStore | None,
        directory: str,
        *,
        write: Call,
        call: Call,
        frontier: Frontier,
        clock: Clock,
        bodies: BloomNegativeCache | None,
        on_fatal: Callable[[str], None],
        append: Call | None = None,
    ) -> None:
        if store is not None and bodies is None:
            raise ValueError("an archive needs the Bloom filter of archived bodies")
        self.store = store
        self._directory = directory
        self._write = write
        self._append = append or write
        self._call = call
        self._frontier = frontier
        self._clock = clock
        self._bodies = bodies
        self._on_fatal = on_fatal
        self._failed = False
        self._recent: OrderedDict[str, tuple[str, int, int, str]] = OrderedDict()
        self._writing: dict[str, asyncio.Future[None]] = {}

    async def _store(self, fn: Callable[[], T], call: Call | None = None) -> T:
        """Run a write on the store's thread (or ``call``); a refused write stops the crawl
        (once)."""
        try:
            return await (call or self._write)(fn)
        except (WarcError, OSError) as exc:
            raise self._refused(exc) from exc

    def _refused(self, exc: Exception) -> ArchiveFailed:
        """The store refused a write: stop the crawl (once); the page must not commit."""
        if not self._failed:
            self._failed = True
            self._on_fatal(f"WARC store failed: {exc}")
        return ArchiveFailed(str(exc))

    def _append_now(self, store: WarcStore, built: BuiltExchange) -> WarcPointer:
        """Append a built exchange on the event loop's thread (the engine's ``append`` is
        :func:`~.calls.inline`: a few microseconds of ``write(2)``), with no coroutine, partial
        or future around it: nothing awaits between the dedup check and the append, so no
        other page can see this body as being written (``_writing``)."""
        try:
            return store.append_exchange(built)
        except (WarcError, OSError) as exc:
            raise self._refused(exc) from exc

    def exchange_spec(
        self, lease: Lease, res: FetchResult, *, links_cut: bool
    ) -> ExchangeSpec | None:
        """What a parser process needs to build this page's exchange (None: no archive).

        ``links_cut``: the pipeline will drop the page's links (a redirect past the hop
        limit), so its metadata record lists none, as :meth:`archive` would write it."""
        store = self.store
        if store is None:
            return None
        spec = lease.request  # the request's method and body (a plain GET: None)
        return ExchangeSpec(
            self._clock.time() - res.elapsed,
            res.request_headers,
            res.reason,
            res.http_version,
            _headers_as_received(res),
            res.ip,
            self._metadata(lease, res),
            _decoded(res),
            res.cut_reason,
            "GET" if spec is None else spec.method,
            b"" if spec is None else spec.body or b"",
            store.compression_level,
            links_cut,
        )

    def _metadata(self, lease: Lease, res: FetchResult) -> dict[str, Any]:
        """The metadata record's facts that the crawl process knows (the parse adds its own:
        ``parse_error``, ``links``, ``records``)."""
        metadata: dict[str, Any] = {
            "url_version": lease.version,
            "status": res.status,
            "elapsed_s": round(res.elapsed, 6),
            "wire_bytes": res.wire_bytes,
            "cut_reason": res.cut_reason,
        }
        if lease.request is not None:  # how it was asked for, as the frontier keeps it
            metadata["request_key"] = lease.url
            metadata["callback"] = lease.request.callback
            metadata["data"] = lease.request.data
        return metadata

    async def archive(
        self,
        lease: Lease,
        res: FetchResult,
        result: ParseResult,
        link_urls: Sequence[str],
        rendered: RenderResult | None = None,
    ) -> Archived:
        """Archive a parsed exchange (R19, R20); ArchiveFailed when the store refuses it.

        Written once the page is parsed so the metadata record can list the discovered links; a
        page whose parse failed or timed out is archived all the same (reparse reads it back).
        The parser process built the exchange when the job carried :meth:`exchange_spec`
        (``result.warc``): only the append is left. A page rendered in a browser also gets its
        DOM beside the response and every exchange its scripts made
        (:meth:`_rendered_exchanges`), so a replay has what the page loaded.
        """
        store = self.store
        if store is None:
            return Archived()
        dom = None
        built: BuiltExchange | None = result.warc
        if rendered is not None:
            built = None  # the parser saw the DOM, not the response: build it here
            dom = rendered.html
            await self._rendered_exchanges(store, lease, rendered)
        body_sha1 = None
        if built is not None:
            body_digest = built.payload_digest
        else:
            body_sha1 = hashlib.sha1(res.body).digest()  # once: the store reuses it
            body_digest = digest_of_sha1(body_sha1)
        pending = self._writing.get(body_digest)
        if pending is not None:  # the same body is being archived by another worker right now
            await asyncio.shield(pending)
        first = self._recent.get(body_digest)
        assert self._bodies is not None
        if first is None and self._bodies.might_contain(body_digest):
            found = await self._call(self._frontier.find_bodies, [body_digest])
            # Archived by this process while the frontier was asked, or known to the frontier.
            first = self._recent.get(body_digest) or found.get(body_digest)
        if first is not None:
            ref = WarcPointer(first[0], first[1], first[2], body_digest)
            await self._write_revisit(
                store, lease.fetch_url, res, "identical-payload-digest", ref, first[3],
                body_digest, rendered=dom, **_request_of(lease),
            )  # fmt: skip
            # The URL points at the full copy, so reparse and readers get the body.
            return Archived(ref.file, ref.offset, ref.length, body_digest, stored=False)
        if built is not None and self._append is inline:
            ptr = self._append_now(store, built)
            self._bodies.add(body_digest)
            self._remember(body_digest, ptr, lease.url)
            return Archived(ptr.file, ptr.offset, ptr.length, body_digest, stored=True)
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._writing[body_digest] = done
        try:
            if built is not None:
                ptr = await self._store(partial(store.append_exchange, built), self._append)
            else:
                ptr = await self._write_exchange(
                    store, lease.fetch_url, res, self._page_metadata(lease, res, result, link_urls,
                    rendered), rendered=dom, body_sha1=body_sha1, **_request_of(lease),
                )  # fmt: skip
        finally:
            del self._writing[body_digest]
            done.set_result(None)
        self._bodies.add(body_digest)
        self._remember(body_digest, ptr, lease.url)
        return Archived(ptr.file, ptr.offset, ptr.length, body_digest, stored=True)

    def _page_metadata(
        self,
        lease: Lease,
        res: FetchResult,
        result: ParseResult,
        link_urls: Sequence[str],
        rendered: RenderResult | None,
    ) -> dict[str, Any]:
        """The metadata record of a page built here (a parser process builds the same
        record in ``warc_records.build_page_exchange``)."""
        metadata = with_parse_facts(
            self._metadata(lease, res),
            parse_error=result.error,
            links=link_urls,
            records=len(result.records),
        )
        if rendered is not None:
            metadata["rendered"] = {
                "cut_reason": rendered.cut_reason,
                "elapsed_s": round(rendered.elapsed, 6),
                "requests": [[x.method, x.url, x.error] for x in rendered.exchanges],
            }
        return metadata

    async def robots_hop(self, url: str, hop: int, res: FetchResult) -> Archived:
        """One answer on the way to a robots.txt (each redirect hop too): archived like any
        exchange, so a replay and an audit see what the crawler was told (R7, R20)."""
        store = self.store
        if store is None:
            return Archived()
        metadata = {"robots_txt": True, "hop": hop, "status": res.status}
        ptr = await self._write_exchange(store, url, res, metadata)
        return Archived(ptr.file, ptr.offset, ptr.length, ptr.payload_digest, stored=False)

    async def not_modified(self, lease: Lease, res: FetchResult) -> None:
        """A 304 (R13) is archived as a revisit record without a body."""
        store = self.store
        if store is not None:
            await self._write_revisit(
                store, lease.fetch_url, res, "server-not-modified", None, lease.url, None,
                **_request_of(lease),
            )  # fmt: skip

    async def keep_file(self, body: bytes, suffix: str) -> str:
        """A download kept under ``files/`` by content hash (on the store's thread)."""
        return await self._store(partial(store_download, self._directory, body, suffix))

    def _exchange_fields(self, res: FetchResult) -> dict[str, Any]:
        """What every record of ``res`` says of the exchange (WARC-Date: when it was sent)."""
        return {
            "fetched_at": self._clock.time() - res.elapsed,
            "request_headers": res.request_headers,
            "status": res.status,
            "reason": res.reason,
            "http_version": res.http_version,
            "response_headers": res.raw_headers,
            "ip": res.ip,
        }

    async def _write_exchange(
        self, store: WarcStore, url: str, res: FetchResult, metadata: dict[str, Any], **extra: Any
    ) -> WarcPointer:
        """Request + response + metadata of ``res`` (``extra``: the request's method and body,
        the rendered DOM)."""
        return await self._store(
            partial(
                store.write_exchange,
                url=url,
                **self._exchange_fields(res),
                body=res.body,
                metadata=metadata,
                truncated=res.cut_reason,
                decoded=_decoded(res),
                **extra,
            )
        )

    async def _write_revisit(
        self,
        store: WarcStore,
        url: str,
        res: FetchResult,
        profile: str,
        refers_to: WarcPointer | None,
        refers_to_uri: str | None,
        digest: str | None,
        **extra: Any,
    ) -> WarcPointer:
        """Request + revisit of ``res`` (``extra`` as for :meth:`_write_exchange`)."""
        return await self._store(
            partial(
                store.write_revisit,
                url=url,
                **self._exchange_fields(res),
                profile=profile,
                refers_to=refers_to,
                refers_to_uri=refers_to_uri,
                refers_to_date=None,
                payload_digest=digest,
                **extra,
            )
        )

    def _remember(self, digest: str, ptr: WarcPointer, url: str) -> None:
        """A body this process archived in full, for revisits before its page commits."""
        self._recent[digest] = (ptr.file, ptr.offset, ptr.length, url)
        if len(self._recent) > RECENT_BODIES:
            self._recent.popitem(last=False)

    async def _rendered_exchanges(
        self, store: WarcStore, lease: Lease, rendered: RenderResult
    ) -> None:
        """What a rendering page fetched (its scripts, API calls): archived as exchanges of
        their own, a body this process archived before (the same script on every page) as a
        revisit. They are not URLs of the crawl: no frontier row, no event."""
        for x in rendered.fetched:
            res = x.result
            assert res is not None
            digest = payload_digest(res.body)
            first = self._recent.get(digest)
            if first is not None:
                ref = WarcPointer(first[0], first[1], first[2], digest)
                await self._write_revisit(
                    store, res.url, res, "identical-payload-digest", ref, first[3], digest
                )
                continue
            metadata = {"rendered_for": lease.url, "method": x.method, "type": x.resource_type}
            ptr = await self._write_exchange(store, res.url, res, metadata)
            self._remember(digest, ptr, res.url)
