"""One URL's way through the engine: lease → fetch → parse → archive → gate → an outcome.

:meth:`Pipeline.process` turns a lease into a :class:`~idemcrawl.frontier.base.Completion` or a
:class:`~idemcrawl.frontier.base.Failure` for the committer, or into None when the lease must be
dropped (it is about to expire, or the archive failed and the crawl is stopping). The steps:

* a lease within a second of its expiry is not fetched: someone else may hold the URL by then,
  and fetching would break the host's limits;
* robots.txt leases are fetched following up to five redirects, each hop SSRF-checked (R7);
* transient errors (timeouts, connection errors, 408/425/429/5xx) retry with full-jitter back-off,
  never before Retry-After, up to ``max_retries``; the SSRF guard's refusal is final (R8, R18);
* a 304 to a conditional request keeps the stored copy (R13); a download is archived and kept as
  a file, never parsed;
* a page is rendered first when the crawl asks for it (``--render``: a 2xx HTML page runs in
  headless Chromium, its scripts' requests served by the same fetcher and spaced by the host's
  delay; the DOM they build is what gets parsed and archived beside the raw response);
* a page is parsed, its redirect target becomes a URL of its own one hop further (R14), it is
  archived, its links pass the discovery gate (R17) and its SimHash joins a near-duplicate
  group (R11); the recrawl policy sets the next visit (R16).
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from .. import url as urls
from ..config import CrawlConfig
from ..cookies import CookieJar, cookies_from
from ..dedup import body_hash, same_body
from ..fetch import RETRYABLE_STATUS, FetchError, FetchResult, retry_after_seconds
from ..frontier.base import (
    DOWNLOAD,
    PAGE,
    REQUISITE,
    ROBOTS,
    Completion,
    Failure,
    Lease,
    RobotsFetch,
)
from ..parse import LinkColumns, ParseJob, ParseResult
from ..render import Renderer, RenderError, RenderResult
from .archiver import Archived, ArchiveFailed, Archiver
from .clock import Clock
from .gate import LinkGate
from .neardup import NearDuplicates
from .rendering import HostRules
from .summary import CrawlSummary, Outcome

MAX_ROBOTS_REDIRECTS = 5


class PageFetcher(Protocol):
    """What the engine needs of a fetcher (:class:`idemcrawl.fetch.Fetcher` is one): a
    response as data, redirects not followed; FetchError when there is no HTTP response."""

    async def fetch(
        self,
        url: str,
        headers: dict[str, str] | list[tuple[str, str]] | None = None,
        *,
        method: str = "GET",
        body: bytes | None = None,
    ) -> FetchResult: ...


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


class RetryPolicy:
    """A transient error: the host backs off (in the frontier, R8) and the URL retries, capped."""

    def __init__(self, cfg: CrawlConfig, clock: Clock, rng: random.Random | None = None) -> None:
        self.max_retries = cfg.max_retries
        self.base = cfg.retry_base
        self.cap = cfg.retry_cap
        self._clock = clock
        self._rng = rng or random.Random()

    def failure(self, lease: Lease, error: str, status: int | None, after: float | None) -> Failure:
        if lease.attempts >= self.max_retries:
            return Failure(
                lease,
                f"{error} (after {lease.attempts + 1} attempts)",
                None,
                status,
                host_error=True,
                retry_after=after,
            )
        # The URL's own retry: exponential back-off with full jitter; never before Retry-After.
        wait = self._rng.uniform(0, min(self.cap, self.base * 2**lease.attempts))
        return Failure(
            lease,
            error,
            self._clock.time() + max(wait, after or 0.0),
            status,
            host_error=True,
            retry_after=after,
        )


class Pipeline:
    def __init__(
        self,
        cfg: CrawlConfig,
        *,
        fetcher: PageFetcher,
        parse: Callable[[ParseJob], Awaitable[ParseResult]],
        archiver: Archiver,
        gate: LinkGate,
        near: NearDuplicates,
        clock: Clock,
        summary: CrawlSummary,
        rng: random.Random | None = None,
        renderer: Renderer | None = None,
        render_all: bool = False,
        rules_for: Callable[[str], Awaitable[HostRules]] | None = None,
        cookies: CookieJar | None = None,
    ) -> None:
        self.cfg = cfg
        self.renderer = renderer
        #: Every HTML page is rendered (``--render``, the spider's ``render``); otherwise only
        #: those whose request asks for it.
        self.render_all = render_all
        #: A host's robots.txt and spacing, which rendering pages' own requests obey.
        self.rules_for = rules_for
        #: The crawl's cookie jar (spiders with ``keep_cookies``), loaded by the feeder.
        self.cookies = cookies
        self.fetcher = fetcher
        self._parse = parse
        self.archiver = archiver
        self.gate = gate
        self.near = near
        self.clock = clock
        self.summary = summary
        self.recrawl = cfg.recrawl_policy()
        self.retry = RetryPolicy(cfg, clock, rng)

    async def process(self, lease: Lease) -> Outcome | None:
        wait = lease.start_at - self.clock.time()
        if wait > 0:  # a start promised one adaptive gap after the previous one (I6)
            await self.clock.sleep(wait)
        if self.clock.time() >= lease.expires_at - 1.0:
            return None  # someone else may hold it by now; fetching would break the host limits
        if lease.kind == ROBOTS:
            try:
                return await self.fetch_robots(lease)
            except ArchiveFailed:
                return None  # the crawl is stopping; the lease returns and a restart refetches
        s = self.summary
        conditional = conditional_headers(lease)
        spec = lease.request
        cookie = None
        if self.cookies is not None:
            cookie = self.cookies.header_for(lease.fetch_url, self.clock.time())
        try:
            if spec is None and cookie is None:
                res = await self.fetcher.fetch(lease.url, conditional or None)
            else:
                # A spider's request: its method, headers and body, the same after any restart
                # (I11), and the crawl's cookies (I12). Validators only make sense for a GET.
                method = spec.method if spec else "GET"
                headers = [*conditional.items()] if method == "GET" else []
                if spec is not None:
                    headers += spec.header_pairs()
                if cookie is not None and not any(k.lower() == "cookie" for k, _ in headers):
                    headers.append(("Cookie", cookie))
                res = await self.fetcher.fetch(
                    lease.fetch_url,
                    headers or None,
                    method=method,
                    body=spec.body if spec else None,
                )
        except FetchError as exc:
            s.count_error(exc.kind)
            if exc.kind == "blocked":
                return Failure(lease, str(exc), retry_at=None)
            return self.retry.failure(lease, str(exc), None, None)
        s.fetched += 1
        s.bytes += len(res.body)
        if res.status in RETRYABLE_STATUS:
            s.count_error(f"http_{res.status}")
            after = retry_after_seconds(
                res.headers.get("retry-after"), self.clock.time(), self.cfg.retry_after_cap
            )
            return self.retry.failure(lease, f"HTTP {res.status}", res.status, after)
        try:
            if res.status == 304 and conditional:
                return await self._not_modified(lease, res)
            if lease.kind == DOWNLOAD:
                return await self._download(lease, res)
            if lease.kind == REQUISITE:
                return await self._requisite(lease, res)
            return await self._page(lease, res)
        except ArchiveFailed:
            return None  # the crawl is stopping; the lease returns and a restart refetches

    async def _page(self, lease: Lease, res: FetchResult) -> Outcome:
        try:
            rendered = await self._render(lease, res)
        except RenderError as exc:  # no browser for this request: fixable, so not retried
            self.summary.count_error("render")
            return Failure(lease, f"render: {exc}", retry_at=None, status=res.status)
        body = res.body if rendered is None else rendered.html.encode("utf-8")
        headers = res.headers
        if rendered is not None:  # the DOM is UTF-8 text now, whatever the page declared
            headers = {**headers, "content-type": "text/html; charset=utf-8"}
        location = res.headers.get("location") if 300 <= res.status < 400 else None
        # The parser process builds the page's WARC exchange too (it holds the body and has CPU
        # to spare); a rendered page's job carries the DOM, so its exchange is built here.
        spec = None
        if rendered is None:
            links_cut = bool(location) and lease.hops + 1 > self.cfg.max_redirects
            spec = self.archiver.exchange_spec(lease, res, links_cut=links_cut)
        job = ParseJob(
            lease.fetch_url,
            res.status,
            headers,
            body,
            lease.depth,
            lease.kind,
            lease.request,
            spec,
        )
        result = await self._parse(job)
        links = result.links
        counters: dict[str, int] = {}
        error = f"cut: {res.cut_reason}" if res.cut_reason else None
        if res.cut_reason:
            counters[f"cut_{res.cut_reason.split(':')[0]}"] = 1
        redirect_to = None
        if location:
            redirect_to, links, error = self._redirect(lease, location, links)
            if error:
                counters["redirects_too_long"] = 1
        archived = await self.archiver.archive(lease, res, result, links.urls, rendered)
        if rendered is not None:
            counters["rendered"] = 1
            if rendered.cut_reason:
                counters["render_cut"] = 1
        if result.error:
            self.summary.count_error("parse")
            return Failure(
                lease,
                result.error,
                retry_at=None,
                status=res.status,
                warc_file=archived.file,
                warc_offset=archived.offset,
                warc_length=archived.length,
                payload_digest=archived.digest,
                trace=result.trace,
            )
        gated = await self.gate.filter(links)
        if gated.paused:
            counters["template_paused"] = gated.paused
        rejections = dict(result.rejected)
        for reason, n in gated.refused.items():
            rejections[reason] = rejections.get(reason, 0) + n
        rejected = self.summary.links_rejected
        for reason, n in rejections.items():
            rejected[reason] = rejected.get(reason, 0) + n
        near = await self.near.group_when_ready(lease.url_id, result.simhash)
        return self._round(
            lease,
            res,
            archived,
            error,
            counters,
            near=near,
            records=result.records,
            links=gated.links,
            known_links=gated.known,
            rejections=rejections,
            simhash=result.simhash,
            near_dup_of=near,
            canonical_hint=result.canonical,
            redirect_to=redirect_to,
            cookies=(
                cookies_from(res.raw_headers, lease.fetch_url, self.clock.time())
                if self.cookies is not None
                else ()
            ),
        )

    async def _render(self, lease: Lease, res: FetchResult) -> RenderResult | None:
        """The page's DOM after its scripts ran, when rendering is asked for and the page is
        HTML."""
        wanted = self.render_all or (lease.request is not None and lease.request.render)
        if self.renderer is None or not wanted or lease.kind != PAGE:
            return None
        if not 200 <= res.status < 300:
            return None
        ctype = res.headers.get("content-type", "text/html").split(";", 1)[0].strip().lower()
        if ctype not in ("text/html", "application/xhtml+xml") or res.cut_reason:
            return None
        host = lease.host_key
        rules = None if self.rules_for is None else await self.rules_for(host)
        gap = self.cfg.delay if rules is None else rules.gap
        allowed = None if rules is None else rules.allowed

        async def fetch(url: str, method: str, headers: dict[str, str], body: Any) -> FetchResult:
            # A page's script is held to the rules its own page was: robots.txt (R7), the
            # crawl's cookies (I12), the fetcher's guard and limits.
            if allowed is not None and urls.host_key(url) == host and not allowed(url):
                raise FetchError("refused", "disallowed by robots.txt")
            pairs = list(headers.items())
            if self.cookies is not None:
                cookie = self.cookies.header_for(url, self.clock.time())
                if cookie is not None:
                    pairs.append(("Cookie", cookie))
            return await self.fetcher.fetch(url, pairs or None, method=method, body=body or None)

        return await self.renderer.render(res, fetch, gap=gap)

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
        digest = body_hash(res.body)
        changed = lease.prev_status != res.status or not same_body(
            lease.prev_hash, res.body, digest
        )
        now = self.clock.time()
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

    async def _download(self, lease: Lease, res: FetchResult) -> Completion:
        """A file a spider asked for: archived, kept under ``files/`` by content hash."""
        archived = await self.archiver.archive(lease, res, ParseResult(), ())
        stored = None
        if 200 <= res.status < 300 and not res.cut_reason:
            stored = await self.archiver.keep_file(res.body, download_suffix(lease.url))
        error = f"cut: {res.cut_reason}" if res.cut_reason else None
        counters = {"downloads": 1} if stored else {}
        return self._round(lease, res, archived, error, counters, stored_file=stored)

    async def _requisite(self, lease: Lease, res: FetchResult) -> Completion:
        """A stylesheet, script or image a page needs (``--requisites``): archived for replay,
        never parsed, no file copy, no index event."""
        archived = await self.archiver.archive(lease, res, ParseResult(), ())
        error = f"cut: {res.cut_reason}" if res.cut_reason else None
        return self._round(lease, res, archived, error, {"requisites": 1})

    async def _not_modified(self, lease: Lease, res: FetchResult) -> Completion:
        """A 304 (R13): no body to store or parse; the schedule lengthens; no index event."""
        await self.archiver.not_modified(lease, res)
        now = self.clock.time()
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
        self, lease: Lease, location: str, links: LinkColumns
    ) -> tuple[str | None, LinkColumns, str | None]:
        """R14: the target is a URL of its own (scope, robots, SSRF and dedup apply to it as to
        any link) one hop further; past ``max_redirects`` hops the chain is cut and recorded."""
        try:
            target: str | None = urls.normalise(location, lease.fetch_url)
        except urls.InvalidURL:
            target = None
        hops = lease.hops + 1
        if hops > self.cfg.max_redirects:
            error = f"redirect chain longer than {self.cfg.max_redirects} hops"
            return target, LinkColumns(), error
        return target, links.with_hops(hops), None

    async def fetch_robots(self, lease: Lease) -> Completion:
        """Fetch robots.txt, following up to 5 redirects (RFC 9309 2.3.1.2), each SSRF-checked."""
        url = lease.url
        t0 = self.clock.monotonic()
        outcome = RobotsFetch(None, error="not fetched")
        archived = Archived()
        for hop in range(MAX_ROBOTS_REDIRECTS + 1):
            try:
                res = await self.fetcher.fetch(url)
            except FetchError as exc:
                self.summary.count_error(exc.kind)
                outcome = RobotsFetch(None, error=str(exc), permanent=exc.kind == "blocked")
                break
            self.summary.fetched += 1
            archived = await self.archiver.robots_hop(url, hop, res)
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
            self.clock.time(),
            latency=self.clock.monotonic() - t0,
            robots=outcome,
            warc_file=archived.file,
            warc_offset=archived.offset,
            warc_length=archived.length,
            payload_digest=archived.digest,
        )
