"""A tiny, deterministic web shop used as the crawler's test and benchmark target.

It reproduces the experiment from the article this project follows: ``listings`` listing
pages (25 by default) each linking ``per_page`` product pages (20 by default), so a full
crawl is exactly ``listings + listings * per_page`` requests (525 by default).  Everything a
verifier needs to know is computable without the server (:func:`sku_for`,
:func:`price_for`, :func:`expected_products`), so a test can check that every stored row
equals the page it came from, and that nothing was fetched twice.

The server also records what it was asked, because the properties we care about
(no duplicate fetches after a restart, bounded concurrency, politeness delays) are only
observable from the server side:

* ``GET /__stats``  -> ``{"total": N, "paths": {path_qs: count}, "in_flight": K}``
* ``GET /__log``    -> ``[[t_monotonic, path_qs], ...]`` request start times
* ``POST /__reset`` -> zero the counters and the log (for benchmarks reusing one server)

Control endpoints (``/__*``) are never counted, logged or included in ``in_flight``:
they are the observer, not crawl traffic, and counting them would make ``in_flight`` read
through ``/__stats`` never drop to zero.

``time.monotonic`` is used for the log because on Linux it is ``CLOCK_MONOTONIC``, which is
system-wide, so a crawler in another process can compare its own timestamps against it.
"""

from __future__ import annotations

import asyncio
import hashlib
import html
import re
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from aiohttp import web

from .server import ThreadedServer

__all__ = [
    "ShopConfig",
    "ShopServer",
    "ShopState",
    "expected_products",
    "make_app",
    "price_for",
    "serve_forever",
    "sku_for",
]

_CONTENT_TYPE = "text/html"
_CHARSET = "utf-8"
_CONTROL_PREFIX = "/__"
_SKU_RE = re.compile(r"SKU-(\d{5})")
_MIN_CENTS = 100
_MAX_CENTS = 99_999


@dataclass(frozen=True)
class ShopConfig:
    """Shape of the shop; frozen so a running server's catalogue cannot drift mid-test."""

    listings: int = 25
    per_page: int = 20
    latency_ms: float = 0.0

    def __post_init__(self) -> None:
        # Fail at construction rather than serving a silently empty or broken catalogue.
        if self.listings < 1 or self.per_page < 1:
            raise ValueError("listings and per_page must be >= 1")
        if self.listings * self.per_page > 99_999:
            raise ValueError("at most 99999 products fit the SKU-NNNNN format")
        if self.latency_ms < 0:
            raise ValueError("latency_ms must be >= 0")

    @property
    def products(self) -> int:
        """Total number of product pages."""
        return self.listings * self.per_page


def sku_for(i: int) -> str:
    """SKU of product number ``i`` (1-based); zero-padded so SKUs sort like their numbers."""
    return f"SKU-{i:05d}"


def price_for(sku: str) -> str:
    """Deterministic price for ``sku`` as ``"D.CC"``, derived from sha256 of the SKU.

    Hash-derived rather than e.g. ``i * 1.99`` so prices look arbitrary: a scraper that
    mixes up pages stores a visibly wrong price instead of a plausibly-right one.
    """
    digest = hashlib.sha256(sku.encode("utf-8")).digest()
    span = _MAX_CENTS - _MIN_CENTS + 1
    cents = _MIN_CENTS + int.from_bytes(digest[:8], "big") % span
    return f"{cents // 100}.{cents % 100:02d}"


def expected_products(cfg: ShopConfig) -> dict[str, str]:
    """Every SKU the shop serves mapped to its price: the ground truth for verifiers."""
    return {sku_for(i): price_for(sku_for(i)) for i in range(1, cfg.products + 1)}


def _listing_of(i: int, cfg: ShopConfig) -> int:
    """Listing page (1-based) on which product ``i`` appears."""
    return (i - 1) // cfg.per_page + 1


def _product_index(sku: str, cfg: ShopConfig) -> int | None:
    """Product number for a canonical in-range SKU, else None (so the route answers 404)."""
    m = _SKU_RE.fullmatch(sku)
    if m is None:
        return None
    i = int(m.group(1))
    return i if 1 <= i <= cfg.products else None


def _listing_number(raw: str, cfg: ShopConfig) -> int | None:
    """Listing number for a canonical in-range path segment (``"01"`` is not ``"1"``)."""
    if not raw.isascii() or not raw.isdigit() or str(int(raw)) != raw:
        return None
    n = int(raw)
    return n if 1 <= n <= cfg.listings else None


def _page(title: str, body: str) -> str:
    return (
        "<!DOCTYPE html>\n"
        f'<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
        f"</head>\n<body>\n{body}\n</body></html>\n"
    )


def render_index() -> str:
    """Home page; the crawl seed is ``/list/1``, this only points there."""
    return _page("Shop", '<h1>Shop</h1>\n<a href="/list/1">Browse products</a>')


def render_listing(n: int, cfg: ShopConfig) -> str:
    """Listing page ``n``: its products, a link back to page 1 and (unless last) rel=next.

    The link back to ``/list/1`` is deliberate: a crawler keeps rediscovering a URL it has
    already fetched and must not fetch it again.
    """
    first = (n - 1) * cfg.per_page + 1
    items = "\n".join(
        f'<li><a class="product" href="/product/{sku_for(i)}">Product {sku_for(i)}</a></li>'
        for i in range(first, first + cfg.per_page)
    )
    nav = ['<a class="first" href="/list/1">first page</a>']
    if n < cfg.listings:
        nav.append(f'<a rel="next" href="/list/{n + 1}">next</a>')
    body = (
        f"<h1>Products, page {n} of {cfg.listings}</h1>\n"
        f'<ul class="products">\n{items}\n</ul>\n'
        f"<nav>{' '.join(nav)}</nav>"
    )
    return _page(f"Products page {n}", body)


def render_product(i: int, cfg: ShopConfig) -> str:
    """Product page ``i`` with name, SKU, price and a link back to its listing page."""
    sku = sku_for(i)
    listing = _listing_of(i, cfg)
    body = (
        f'<h1 class="name">Product {sku}</h1>\n'
        f'<p>SKU: <span class="sku">{sku}</span></p>\n'
        f'<p>Price: <span class="price">{price_for(sku)}</span></p>\n'
        f'<a class="back" href="/list/{listing}">back to page {listing}</a>'
    )
    return _page(f"Product {sku}", body)


@dataclass
class ShopState:
    """Request accounting shared between the server loop and observers in other threads.

    A lock guards it because :class:`ShopServer` reads it from the test's thread while the
    server's event loop thread mutates it; the critical sections are tiny.
    """

    total: int = 0
    in_flight: int = 0
    paths: dict[str, int] = field(default_factory=dict)
    log: list[tuple[float, str]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def started(self, path: str) -> None:
        """Record a request start (before any latency, so it counts even if aborted)."""
        now = time.monotonic()
        with self.lock:
            self.total += 1
            self.paths[path] = self.paths.get(path, 0) + 1
            self.in_flight += 1
            self.log.append((now, path))

    def finished(self) -> None:
        """Record that a request's response has been fully handed to the transport."""
        with self.lock:
            self.in_flight -= 1

    def snapshot(self) -> dict[str, object]:
        """Copy of the counters in the ``/__stats`` JSON shape."""
        with self.lock:
            return {"total": self.total, "paths": dict(self.paths), "in_flight": self.in_flight}

    def log_snapshot(self) -> list[list[float | str]]:
        """Copy of the request log in the ``/__log`` JSON shape."""
        with self.lock:
            return [[t, p] for t, p in self.log]

    def reset(self) -> None:
        """Zero counts and log; ``in_flight`` is live state, not history, so it is kept."""
        with self.lock:
            self.total = 0
            self.paths.clear()
            self.log.clear()


CONFIG_KEY = web.AppKey("shop_config", ShopConfig)
STATE_KEY = web.AppKey("shop_state", ShopState)

_Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _html(text: str, status: int = 200) -> web.Response:
    return web.Response(text=text, status=status, content_type=_CONTENT_TYPE, charset=_CHARSET)


def _not_found() -> web.Response:
    return _html(_page("Not found", "<h1>404 Not Found</h1>"), status=404)


@web.middleware
async def _accounting(request: web.Request, handler: _Handler) -> web.StreamResponse:
    """Count, log, delay, then answer; ``in_flight`` drops only once the body is sent.

    The response is prepared and finished here (aiohttp's own later prepare/write_eof are
    no-ops then) so ``in_flight`` means "started and not yet finished sending", which is
    what a concurrency-limit check needs.  Errors raised by routing (404/405) are turned
    into plain responses here for the same reason.
    """
    if request.path.startswith(_CONTROL_PREFIX):
        return await handler(request)
    state = request.app[STATE_KEY]
    cfg = request.app[CONFIG_KEY]
    state.started(request.path_qs)
    try:
        if cfg.latency_ms > 0:
            await asyncio.sleep(cfg.latency_ms / 1000)
        try:
            response = await handler(request)
        except web.HTTPException as exc:
            if exc.status == 404:
                response = _not_found()
            else:
                response = web.Response(
                    status=exc.status, reason=exc.reason, text=exc.text, headers=exc.headers
                )
        await response.prepare(request)
        await response.write_eof()
        return response
    finally:
        state.finished()


async def _index(request: web.Request) -> web.StreamResponse:
    return _html(render_index())


async def _listing(request: web.Request) -> web.StreamResponse:
    cfg = request.app[CONFIG_KEY]
    n = _listing_number(request.match_info["n"], cfg)
    return _not_found() if n is None else _html(render_listing(n, cfg))


async def _product(request: web.Request) -> web.StreamResponse:
    cfg = request.app[CONFIG_KEY]
    i = _product_index(request.match_info["sku"], cfg)
    return _not_found() if i is None else _html(render_product(i, cfg))


async def _stats(request: web.Request) -> web.StreamResponse:
    return web.json_response(request.app[STATE_KEY].snapshot())


async def _log(request: web.Request) -> web.StreamResponse:
    return web.json_response(request.app[STATE_KEY].log_snapshot())


async def _reset(request: web.Request) -> web.StreamResponse:
    request.app[STATE_KEY].reset()
    return web.json_response({"ok": True})


def make_app(cfg: ShopConfig | None = None, *, state: ShopState | None = None) -> web.Application:
    """Build the shop application, with a fresh :class:`ShopState` unless one is given.

    ``state`` lets :class:`ShopServer` keep its counters across a stop/start: an aiohttp
    app is bound to the loop it first ran on, so a restart needs a new app.
    """
    app = web.Application(middlewares=[_accounting])
    app[CONFIG_KEY] = cfg if cfg is not None else ShopConfig()
    app[STATE_KEY] = state if state is not None else ShopState()
    app.router.add_get("/", _index)
    app.router.add_get("/list/{n}", _listing)
    app.router.add_get("/product/{sku}", _product)
    app.router.add_get("/__stats", _stats)
    app.router.add_get("/__log", _log)
    app.router.add_post("/__reset", _reset)
    return app


# Short: tests and benchmarks stop servers often, and shop handlers never run long.
_SHUTDOWN_TIMEOUT = 2.0


class ShopServer(ThreadedServer):
    """The shop running in a background thread with its own event loop (see ThreadedServer).

    Its counters outlive a stop/start (each start serves a fresh app over the same state), so
    a test can restart the server and still see every request.
    """

    label = "shop server"
    shutdown_timeout = _SHUTDOWN_TIMEOUT

    def __init__(
        self, cfg: ShopConfig | None = None, host: str = "127.0.0.1", port: int = 0
    ) -> None:
        super().__init__(host, port)
        self.cfg = cfg if cfg is not None else ShopConfig()
        self._state = ShopState()

    def make_app(self) -> web.Application:
        return make_app(self.cfg, state=self._state)

    @property
    def seed_url(self) -> str:
        """The crawl seed, ``{base_url}/list/1``."""
        return f"{self.base_url}/list/1"

    def stats(self) -> dict[str, object]:
        """Same as ``GET /__stats`` but without an HTTP request (so it does not disturb timing).

        Read on the server's loop (see :meth:`~ThreadedServer.on_loop`) so it is as consistent
        as ``/__stats``: once a client has its full response, ``in_flight`` no longer counts it.
        """
        return self.on_loop(self._state.snapshot)

    def request_log(self) -> list[list[float | str]]:
        """Same as ``GET /__log``."""
        return self.on_loop(self._state.log_snapshot)

    def reset(self) -> None:
        """Same as ``POST /__reset``."""
        self._state.reset()


def serve_forever(host: str, port: int, cfg: ShopConfig) -> None:
    """Run the shop in the foreground until SIGINT/SIGTERM, for ``idemcrawl testsite``.

    Prints exactly one line with the real seed URL (so ``port=0`` is usable by scripts that
    read it) and returns normally on a signal so the process exits 0 without a traceback.
    """
    server = ShopServer(cfg, host, port)
    server.serve_until_signal(
        lambda: print(f"serving shop at {server.seed_url} ({cfg.products} products)", flush=True)
    )
