"""Several small sites served at once, one loopback port each, for politeness tests.

Politeness is a per-host property (one request in flight, a gap between requests, obey
robots.txt, back off on 429/503), so testing it needs more than one host.  The crawler's
``host_key`` includes the port, so each port on 127.0.0.1 is a distinct host and no DNS or
extra interfaces are needed.

Each host is described by a :class:`HostSpec`: a ring of pages ``/p/0 .. /p/{pages-1}``, a
``/private/{n}`` page per page (disallowed by the ``"rules"`` robots.txt, so fetching it is
a visible violation), a robots.txt behaviour chosen from :data:`ROBOTS_MODES`, and optional
rate-limit / error pages.  Every host is served from ONE background event loop (a
:class:`~idemcrawl.lab.testsite.server.ThreadedServer`) so a single request log with one clock
covers them all, and a hanging handler on one host cannot delay another.

The request log is what :mod:`idemcrawl.lab.politeness_check` judges.  Politeness can only be
observed from the server side, so every request (errors included) is logged with the
``time.monotonic`` instant it arrived and the instant its response was fully written.  The
log is readable in-process (:meth:`MultiHostServer.request_log`) and, for a crawler running
in another process, as JSON from ``GET /__log`` on any host.  ``time.monotonic`` is
``CLOCK_MONOTONIC`` on Linux, which is system-wide, so other processes can compare against
it.  Control endpoints (``/__*``) are never logged or counted: they are the observer.
"""

from __future__ import annotations

import asyncio
import html
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, TypedDict

from aiohttp import web

from .server import ThreadedServer, bind, cleanup, start_app, url_host

__all__ = [
    "NO_RESPONSE",
    "PRIVATE_PREFIX",
    "ROBOTS_MODES",
    "HostSpec",
    "LogEntry",
    "MultiHostServer",
    "cross_host_links",
    "default_hosts",
    "page_links",
    "robots_txt",
    "serve_multihost",
]

#: Every robots.txt behaviour a host can have; see :class:`HostSpec`.
ROBOTS_MODES: Final = (
    "rules",
    "none",
    "error",
    "hang",
    "redirect",
    "redirect-loop",
    "forbidden",
)

_CONTROL_PREFIX = "/__"
_CHARSET = "utf-8"
#: Disallowed by the "rules" robots.txt; every page links into it so obeying it is tested.
PRIVATE_PREFIX: Final = "/private"
#: /r1 .. /r{N} then back to /robots.txt: longer than the 5 hops RFC 9309 asks crawlers to
#: follow, and a true cycle, so a crawler without a hop limit never terminates.
_REDIRECT_LOOP_LEN = 8
_LIMITED_RETRY_AFTER = 2
_UNAVAILABLE_RETRY_AFTER = 1
#: Status recorded for a request whose handler ended without any response being sent
#: (cancelled at server shutdown, for instance); no real HTTP status is 0.
NO_RESPONSE: Final = 0
# Short because tests stop servers often; a hanging robots.txt must not stall stop().
_SHUTDOWN_TIMEOUT = 0.5


@dataclass(frozen=True)
class HostSpec:
    """One host of the multi-host site; frozen so a running host cannot change under a test.

    ``robots`` modes: ``"rules"`` (``Disallow: /private`` plus ``Crawl-delay`` when
    ``crawl_delay`` is set), ``"none"`` (404), ``"error"`` (500), ``"hang"`` (sleeps
    ``hang_seconds`` then 500, without blocking anything else), ``"redirect"`` (301 to
    ``/robots-real.txt`` which serves the rules), ``"redirect-loop"`` (a cycle of more than
    5 redirects) and ``"forbidden"`` (403).

    ``status_pages`` adds ``/limited`` (429 + ``Retry-After: 2`` once, then 200),
    ``/limited-nora`` (429 without Retry-After once, then 200), ``/unavailable`` (503 +
    ``Retry-After: 1`` once, then 200) and ``/always500``.  ``slow_seconds > 0`` adds
    ``/slow``, which takes that long; it exists to give a crawler a long in-flight request
    on which a concurrency limit can be seen to hold.
    """

    name: str
    pages: int = 20
    links_per_page: int = 3
    latency_ms: float = 0
    robots: str = "rules"
    crawl_delay: float | None = None
    hang_seconds: float = 30
    status_pages: bool = False
    slow_seconds: float = 0

    def __post_init__(self) -> None:
        # Fail at construction: a typo'd mode would otherwise silently serve 404 robots.
        if not self.name:
            raise ValueError("name must be non-empty")
        if self.pages < 1:
            raise ValueError("pages must be >= 1")
        if self.links_per_page < 0:
            raise ValueError("links_per_page must be >= 0")
        if self.robots not in ROBOTS_MODES:
            raise ValueError(f"robots must be one of {ROBOTS_MODES}, not {self.robots!r}")
        if self.crawl_delay is not None and self.crawl_delay < 0:
            raise ValueError("crawl_delay must be >= 0")
        for attr in ("latency_ms", "hang_seconds", "slow_seconds"):
            if getattr(self, attr) < 0:
                raise ValueError(f"{attr} must be >= 0")


def default_hosts() -> list[HostSpec]:
    """The four-host site of the politeness acceptance test.

    ``a`` and ``b`` have plain rules (``a`` also has the 429/503/500 pages), ``c`` asks for
    a 1 s crawl delay, and ``d``'s robots.txt answers 500, which RFC 9309 says means "assume
    everything is disallowed", so only its robots.txt may be fetched.
    """
    return [
        HostSpec("a", robots="rules", status_pages=True),
        HostSpec("b", robots="rules"),
        HostSpec("c", robots="rules", crawl_delay=1),
        HostSpec("d", robots="error"),
    ]


def robots_txt(spec: HostSpec) -> str:
    """The rules text served by ``"rules"`` and ``"redirect"`` hosts."""
    text = f"User-agent: *\nDisallow: {PRIVATE_PREFIX}\n"
    if spec.crawl_delay is not None:
        text += f"Crawl-delay: {spec.crawl_delay:g}\n"
    return text


def page_links(spec: HostSpec, n: int) -> list[str]:
    """Paths linked from ``/p/{n}``; public so a test can compute the expected crawl offline.

    The ring (next ``links_per_page`` pages mod ``pages``) means every page is rediscovered
    several times, and the ``/private`` link on every page means a crawler that ignores
    robots.txt is caught on its first page.
    """
    links = [f"/p/{(n + k) % spec.pages}" for k in range(1, spec.links_per_page + 1)]
    links.append(f"{PRIVATE_PREFIX}/{n}")
    if spec.slow_seconds > 0:
        links.append("/slow")
    if spec.status_pages:
        links.append("/limited")
        if n == 0:
            links += ["/limited-nora", "/unavailable", "/always500"]
    return links


def cross_host_links(bases: Sequence[str], specs: Sequence[HostSpec], i: int, n: int) -> list[str]:
    """Absolute URLs linked from host ``i``'s ``/p/{n}`` on a cross-linked site.

    Page ``n`` links to page ``n`` of the next host (when it has one), and each host's home
    (``/p/0``) also to the home of the host half-way round: with one seed, every other host is
    found only through links from other hosts, which in a partitioned crawl live in other
    partitions. Public so a test can compute the expected crawl offline.
    """
    count = len(bases)
    if count < 2:
        return []
    nxt = (i + 1) % count
    links = [f"{bases[nxt]}/p/{n}"] if n < specs[nxt].pages else []
    far = (i + count // 2) % count
    if n == 0 and far not in (i, nxt):
        links.append(f"{bases[far]}/p/0")
    return links


class LogEntry(TypedDict):
    """One logged request; ``start``/``end`` are ``time.monotonic()`` seconds."""

    host: str
    path: str
    start: float
    end: float
    status: int


@dataclass
class _SiteState:
    """Log, counters and status-page memory shared by every host of one site.

    A lock guards it because the server's loop thread mutates it while observers in the
    test's thread read it; the critical sections are tiny.
    """

    log: list[LogEntry] = field(default_factory=list)
    hosts: dict[str, str] = field(default_factory=dict)  # base_url -> name
    totals: dict[str, int] = field(default_factory=dict)
    in_flight: dict[str, int] = field(default_factory=dict)
    paths: dict[str, dict[str, int]] = field(default_factory=dict)
    hits: dict[tuple[str, str], int] = field(default_factory=dict)
    #: Set once every host is bound, for a cross-linked site: base URLs and specs in order.
    cross: tuple[list[str], list[HostSpec]] | None = None
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def register(self, base_url: str, name: str) -> None:
        """Make a host appear in :meth:`stats` even before its first request."""
        with self.lock:
            self.hosts[base_url] = name
            self.totals.setdefault(base_url, 0)
            self.in_flight.setdefault(base_url, 0)
            self.paths.setdefault(base_url, {})

    def started(self, base_url: str, path: str) -> float:
        """Count a request as it arrives; returns its start time for :meth:`finished`."""
        now = time.monotonic()
        with self.lock:
            self.totals[base_url] = self.totals.get(base_url, 0) + 1
            self.in_flight[base_url] = self.in_flight.get(base_url, 0) + 1
            per_host = self.paths.setdefault(base_url, {})
            per_host[path] = per_host.get(path, 0) + 1
        return now

    def finished(self, base_url: str, path: str, start: float, status: int) -> None:
        """Log a request once its response is written (so every entry has an ``end``)."""
        end = time.monotonic()
        entry = LogEntry(host=base_url, path=path, start=start, end=end, status=status)
        with self.lock:
            self.in_flight[base_url] = self.in_flight.get(base_url, 0) - 1
            self.log.append(entry)

    def first_hit(self, base_url: str, path: str) -> bool:
        """True only for the first request to ``path`` on this host since the last reset."""
        key = (base_url, path)
        with self.lock:
            seen = self.hits.get(key, 0)
            self.hits[key] = seen + 1
        return seen == 0

    def log_snapshot(self) -> list[LogEntry]:
        """Copy of the log; entries are copied too so callers cannot corrupt it."""
        with self.lock:
            return [LogEntry(**e) for e in self.log]

    def snapshot(self) -> dict[str, dict[str, Any]]:
        """Per-host counters, keyed by base URL."""
        with self.lock:
            return {
                url: {
                    "name": name,
                    "total": self.totals.get(url, 0),
                    "in_flight": self.in_flight.get(url, 0),
                    "paths": dict(self.paths.get(url, {})),
                }
                for url, name in self.hosts.items()
            }

    def reset(self) -> None:
        """Forget history and re-arm the once-only 429/503 pages, for a reused server.

        ``in_flight`` is live state rather than history, so it is kept.
        """
        with self.lock:
            self.log.clear()
            self.hits.clear()
            for url in self.totals:
                self.totals[url] = 0
            for per_host in self.paths.values():
                per_host.clear()


@dataclass(frozen=True)
class _Host:
    spec: HostSpec
    base_url: str


HOST_KEY = web.AppKey("multihost_host", _Host)
STATE_KEY = web.AppKey("multihost_state", _SiteState)

_Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _page(title: str, body: str) -> str:
    return (
        "<!DOCTYPE html>\n"
        f'<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
        f"</head>\n<body>\n{body}\n</body></html>\n"
    )


def _html(text: str, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(
        text=text, status=status, content_type="text/html", charset=_CHARSET, headers=headers
    )


def _text(text: str, status: int = 200) -> web.Response:
    return web.Response(text=text, status=status, content_type="text/plain", charset=_CHARSET)


def _redirect(location: str) -> web.Response:
    # Returned rather than raised so the middleware sees an ordinary response to finish.
    return web.Response(status=301, headers={"Location": location})


def _not_found() -> web.Response:
    return _html(_page("Not found", "<h1>404 Not Found</h1>"), status=404)


def _page_number(raw: str, spec: HostSpec) -> int | None:
    """Number for a canonical in-range segment (``"01"`` is not ``"1"``), else None."""
    if not raw.isascii() or not raw.isdigit() or str(int(raw)) != raw:
        return None
    n = int(raw)
    return n if n < spec.pages else None


@web.middleware
async def _accounting(request: web.Request, handler: _Handler) -> web.StreamResponse:
    """Log every non-control request from arrival to fully-written response, errors too.

    The response is prepared and finished here (aiohttp's later prepare/write_eof are then
    no-ops) so ``end`` is when the last byte was handed to the transport, which is what a
    concurrency check needs.  Routing errors and handler crashes become plain responses
    here for the same reason; the ``finally`` logs even a cancelled request.
    """
    if request.path.startswith(_CONTROL_PREFIX):
        return await handler(request)
    host = request.app[HOST_KEY]
    state = request.app[STATE_KEY]
    path = request.path_qs
    start = state.started(host.base_url, path)
    response: web.StreamResponse | None = None
    try:
        if host.spec.latency_ms > 0:
            await asyncio.sleep(host.spec.latency_ms / 1000)
        try:
            response = await handler(request)
        except web.HTTPException as exc:
            response = (
                _not_found()
                if exc.status == 404
                else web.Response(
                    status=exc.status, reason=exc.reason, text=exc.text, headers=exc.headers
                )
            )
        except Exception:
            response = _text("internal error\n", status=500)
        await response.prepare(request)
        await response.write_eof()
        return response
    finally:
        status = response.status if response is not None else NO_RESPONSE
        state.finished(host.base_url, path, start, status)


async def _robots(request: web.Request) -> web.StreamResponse:
    spec = request.app[HOST_KEY].spec
    mode = spec.robots
    if mode == "rules":
        return _text(robots_txt(spec))
    if mode == "none":
        return _not_found()
    if mode == "error":
        return _text("robots.txt is broken\n", status=500)
    if mode == "hang":
        # asyncio.sleep, not time.sleep: other requests (and hosts) keep being served.
        await asyncio.sleep(spec.hang_seconds)
        return _text("robots.txt timed out\n", status=500)
    if mode == "redirect":
        return _redirect("/robots-real.txt")
    if mode == "redirect-loop":
        return _redirect("/r1")
    if mode == "forbidden":
        return _text("forbidden\n", status=403)
    raise AssertionError(f"unhandled robots mode {mode!r}")  # HostSpec validated it


async def _robots_real(request: web.Request) -> web.StreamResponse:
    spec = request.app[HOST_KEY].spec
    return _text(robots_txt(spec)) if spec.robots == "redirect" else _not_found()


async def _redirect_hop(request: web.Request) -> web.StreamResponse:
    spec = request.app[HOST_KEY].spec
    raw = request.match_info["n"]
    if spec.robots != "redirect-loop" or str(int(raw)) != raw:
        return _not_found()
    n = int(raw)
    if not 1 <= n <= _REDIRECT_LOOP_LEN:
        return _not_found()
    return _redirect(f"/r{n + 1}" if n < _REDIRECT_LOOP_LEN else "/robots.txt")


async def _ring_page(request: web.Request) -> web.StreamResponse:
    spec = request.app[HOST_KEY].spec
    n = _page_number(request.match_info["n"], spec)
    if n is None:
        return _not_found()
    hrefs = page_links(spec, n)
    cross = request.app[STATE_KEY].cross
    if cross is not None:
        bases, specs = cross
        hrefs += cross_host_links(bases, specs, bases.index(request.app[HOST_KEY].base_url), n)
    items = "\n".join(
        f'<li><a href="{html.escape(p)}">{html.escape(p)}</a></li>' for p in hrefs
    )
    body = f"<h1>{html.escape(spec.name)}: page {n}</h1>\n<ul>\n{items}\n</ul>"
    return _html(_page(f"{spec.name} page {n}", body))


async def _private(request: web.Request) -> web.StreamResponse:
    spec = request.app[HOST_KEY].spec
    n = _page_number(request.match_info["n"], spec)
    if n is None:
        return _not_found()
    return _html(_page("Private", f"<h1>{html.escape(spec.name)}: private {n}</h1>"))


async def _slow(request: web.Request) -> web.StreamResponse:
    spec = request.app[HOST_KEY].spec
    if spec.slow_seconds <= 0:
        return _not_found()
    await asyncio.sleep(spec.slow_seconds)
    return _html(_page("Slow", "<h1>slow page</h1>"))


def _once_then_ok(status: int, retry_after: int | None) -> _Handler:
    """Handler answering ``status`` to the first request since reset and 200 afterwards."""

    async def handle(request: web.Request) -> web.StreamResponse:
        host = request.app[HOST_KEY]
        if not host.spec.status_pages:
            return _not_found()
        if request.app[STATE_KEY].first_hit(host.base_url, request.path):
            headers = {} if retry_after is None else {"Retry-After": str(retry_after)}
            return _html(_page("Try later", f"<h1>{status}</h1>"), status, headers)
        return _html(_page("OK", f"<h1>{html.escape(request.path)} ok</h1>"))

    return handle


async def _always500(request: web.Request) -> web.StreamResponse:
    if not request.app[HOST_KEY].spec.status_pages:
        return _not_found()
    return _html(_page("Error", "<h1>500</h1>"), status=500)


async def _log(request: web.Request) -> web.StreamResponse:
    return web.json_response(request.app[STATE_KEY].log_snapshot())


async def _stats(request: web.Request) -> web.StreamResponse:
    return web.json_response(request.app[STATE_KEY].snapshot())


async def _reset(request: web.Request) -> web.StreamResponse:
    request.app[STATE_KEY].reset()
    return web.json_response({"ok": True})


def _make_app(host: _Host, state: _SiteState) -> web.Application:
    app = web.Application(middlewares=[_accounting])
    app[HOST_KEY] = host
    app[STATE_KEY] = state
    app.router.add_get("/robots.txt", _robots)
    app.router.add_get("/robots-real.txt", _robots_real)
    app.router.add_get(r"/r{n:\d+}", _redirect_hop)
    app.router.add_get("/p/{n}", _ring_page)
    app.router.add_get(PRIVATE_PREFIX + "/{n}", _private)
    app.router.add_get("/slow", _slow)
    app.router.add_get("/limited", _once_then_ok(429, _LIMITED_RETRY_AFTER))
    app.router.add_get("/limited-nora", _once_then_ok(429, None))
    app.router.add_get("/unavailable", _once_then_ok(503, _UNAVAILABLE_RETRY_AFTER))
    app.router.add_get("/always500", _always500)
    app.router.add_get("/__log", _log)
    app.router.add_get("/__stats", _stats)
    app.router.add_post("/__reset", _reset)
    return app


class MultiHostServer(ThreadedServer):
    """All hosts of a multi-host site, served by one background thread and event loop.

    One loop (see :class:`~idemcrawl.lab.testsite.server.ThreadedServer`) gives one clock and
    one log for every host; each host has its own port. Stopping never blocks longer than its
    timeout: hanging handlers (``robots="hang"``) are cancelled after a short grace period and
    logged with status :data:`NO_RESPONSE`.
    """

    label = "multi-host server"
    shutdown_timeout = _SHUTDOWN_TIMEOUT

    def __init__(
        self,
        specs: Sequence[HostSpec] | None = None,
        host: str = "127.0.0.1",
        *,
        cross_links: bool = False,
    ) -> None:
        specs = tuple(specs if specs is not None else default_hosts())
        if not specs:
            raise ValueError("at least one HostSpec is required")
        names = [s.name for s in specs]
        if len(set(names)) != len(names):
            raise ValueError(f"host names must be unique: {names}")
        super().__init__(host, 0)
        self.specs: tuple[HostSpec, ...] = specs
        self.cross_links = cross_links
        self._state = _SiteState()

    async def open(self) -> list[web.AppRunner]:
        """Bind and serve every host on its own port; on failure undo what was started.

        Each socket is bound before its app is built so the app knows its own base URL (port 0
        means the port is only known after binding, and a running app is frozen).
        """
        runners: list[web.AppRunner] = []
        try:
            for spec in self.specs:
                sock = bind(self.host, 0)
                port = int(sock.getsockname()[1])
                base_url = f"http://{url_host(self.host)}:{port}"
                try:
                    app = _make_app(_Host(spec, base_url), self._state)
                except BaseException:
                    sock.close()
                    raise
                runners.append(await start_app(app, [sock], shutdown_timeout=self.shutdown_timeout))
                self._state.register(base_url, spec.name)
                self._bound(port)
            if self.cross_links:
                bases = list(self._state.hosts)
                self._state.cross = (bases, list(self.specs))
        except BaseException:
            await cleanup(runners)
            raise
        return runners

    @property
    def base_urls(self) -> list[str]:
        """``http://HOST:PORT`` per host, in spec order; only valid while started."""
        return [f"http://{url_host(self.host)}:{port}" for port in self.ports]

    @property
    def seed_urls(self) -> list[str]:
        """Each host's ``/p/0``, in spec order."""
        return [url + "/p/0" for url in self.base_urls]

    def spec_for(self, base_url: str) -> HostSpec:
        """The spec served at ``base_url`` (a trailing slash is tolerated)."""
        key = base_url.rstrip("/")
        for url, spec in zip(self.base_urls, self.specs, strict=True):
            if url == key:
                return spec
        raise KeyError(base_url)

    def base_url_for(self, name: str) -> str:
        """Base URL of the host called ``name``; tests think in names, logs in URLs."""
        for url, spec in zip(self.base_urls, self.specs, strict=True):
            if spec.name == name:
                return url
        raise KeyError(name)

    def disallowed_prefixes(self) -> dict[str, list[str]]:
        """Per host, the path prefixes its robots.txt (as a crawler can read it) disallows.

        Only hosts whose rules are reachable: ``"rules"`` and ``"redirect"`` (RFC 9309 asks
        crawlers to follow up to five redirects).
        """
        return {
            url: [PRIVATE_PREFIX]
            for url, spec in zip(self.base_urls, self.specs, strict=True)
            if spec.robots in ("rules", "redirect")
        }

    def robots_only_hosts(self) -> set[str]:
        """Hosts on which nothing but robots.txt may be fetched.

        RFC 9309 2.3.1.4: a 5xx or unreachable robots.txt means "assume complete
        disallow", so ``"error"`` and ``"hang"`` (which a crawler must time out) qualify.
        4xx (``"none"``, ``"forbidden"``) and an over-long redirect chain mean "no rules".
        """
        return {
            url
            for url, spec in zip(self.base_urls, self.specs, strict=True)
            if spec.robots in ("error", "hang")
        }

    def request_log(self) -> list[LogEntry]:
        """Copy of the whole site's request log, like ``GET /__log`` on any host."""
        return self.on_loop(self._state.log_snapshot)

    def stats(self) -> dict[str, dict[str, Any]]:
        """Per host (keyed by base URL): name, total, in_flight and per-path counts."""
        return self.on_loop(self._state.snapshot)

    def reset(self) -> None:
        """Clear log and counts and re-arm the once-only 429/503 pages."""
        self._state.reset()


def serve_multihost(specs: list[HostSpec], host: str = "127.0.0.1") -> None:
    """Serve ``specs`` in the foreground until SIGINT/SIGTERM, for the CLI.

    Prints one ``NAME http://HOST:PORT/p/0 robots=MODE`` line per host, in spec order and
    flushed, so a script can read the real ports; returns normally on a signal so the
    process exits 0 without a traceback.
    """
    if not specs:
        raise ValueError("at least one HostSpec is required")
    server = MultiHostServer(specs, host)

    def announce() -> None:
        for spec, url in zip(specs, server.base_urls, strict=True):
            print(f"{spec.name} {url}/p/0 robots={spec.robots}")
        sys.stdout.flush()

    server.serve_until_signal(announce)
