"""A hostile site full of crawler traps, with 20 real products hidden among them (R17).

* ``/cal/Y/M/D``: an infinite calendar (every day links the next and the previous day);
* ``/shop?…``: faceted navigation whose links add one more facet (5 facets x 4 values, in any
  order), so the number of distinct URLs is practically unbounded;
* ``/s;jsessionid=…``: a fresh session id in every link;
* ``/a/``: a relative link ``a/`` that builds ``/a/a/a/…``;
* ``/dup/N``: pages with the same text, ``/same/N`` pages whose bodies are byte-identical,
  and ``/near/N`` pages that differ by one sentence (each with one unique link to ``/leaf/N``);
* ``/p/N``: the 20 real products (``span.sku``, ``span.price``), linked from the home page and
  from the trap pages.

A crawl of it must end on its own with every product stored and every trap cut at its limit.
:class:`TrapServer` serves it from a background thread.
"""

from __future__ import annotations

import hashlib
import random
import threading
from collections import Counter
from datetime import date, timedelta

from aiohttp import web

from .server import ThreadedServer

PRODUCTS = 20
FACETS = {
    "color": ["red", "blue", "green", "black"],
    "size": ["s", "m", "l", "xl"],
    "brand": ["acme", "globex", "initech", "umbrella"],
    "price": ["lo", "mid", "hi", "lux"],
    "sort": ["asc", "desc", "new", "top"],
}


def product_price(n: int) -> str:
    cents = 100 + int(hashlib.sha256(f"trap-{n}".encode()).hexdigest(), 16) % 90_000
    return f"{cents // 100}.{cents % 100:02d}"


def _html(body: str) -> web.Response:
    return web.Response(
        text=f"<!doctype html><html><body>{body}</body></html>", content_type="text/html"
    )


_WORDS = [
    *("amber", "basil", "cedar", "delta", "ember", "fjord"),
    *("garnet", "harbor", "indigo", "juniper", "kestrel", "lagoon"),
]
#: A long article: 80 different sentences, so one changed sentence is a small change.
_NEAR_TEXT = " ".join(
    f"Section {i} explains how the {_WORDS[i % 12]} {_WORDS[(i * 5 + 3) % 12]} "
    f"meets the {_WORDS[(i * 7 + 1) % 12]} near mile {i * 13 % 97}."
    for i in range(80)
)


_PDF = b"%PDF-1.4\n% idemcrawl test document\n" + bytes(range(256)) * 8 + b"\n%%EOF\n"


def _products(k: int = 3, start: int = 0) -> str:
    return "".join(f'<a href="/p/{(start + i) % PRODUCTS + 1}">p</a>' for i in range(k))


class TrapSite:
    """The trap site's pages and its request counters (serve :meth:`app`, or use TrapServer)."""

    def __init__(self) -> None:
        self.hits: Counter[str] = Counter()
        #: Requests per exact path and query (to prove one URL was fetched once).
        self.paths: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._rng = random.Random(7)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("GET", "/{tail:.*}", self.handle)
        return app

    def family(self, path: str) -> str:
        families = (
            *("/cal/", "/shop", "/s;", "/a/", "/dup/", "/same/", "/near/", "/leaf/", "/p/"),
            "/files/",
        )
        for prefix in families:
            if path.startswith(prefix):
                return prefix
        return path

    async def handle(self, request: web.Request) -> web.StreamResponse:
        path = request.path_qs
        raw_path = request.rel_url.raw_path  # the path without the query
        with self._lock:
            self.hits[self.family(raw_path)] += 1
            self.paths[path] += 1
        if path == "/robots.txt":
            return web.Response(text="User-agent: *\nAllow: /\n")
        if path == "/":
            links = "".join(f'<a href="/p/{n}">product {n}</a>' for n in range(1, PRODUCTS + 1))
            return _html(
                links + '<a href="/cal/2024/01/01">calendar</a><a href="/shop">shop</a>'
                '<a href="/s;jsessionid=0000">session</a><a href="/a/">a</a>'
                '<a href="/dup/1">dup</a><a href="/near/1">near</a>'
                + "".join(f'<a href="/same/{k}">same {k}</a>' for k in range(1, 4))
                + '<a href="/files/manual.pdf">manual</a><a href="/files/copy.pdf">copy</a>'
                # One product under four spellings (one URL), and two query orders (two URLs).
                + '<a href="/p/1#reviews">r</a><a href="/x/../p/1">x</a>'
                + f'<a href="HTTP://{request.host}/p/1">upper</a>'
                + '<a href="/p/2?a=1&amp;b=2">ab</a><a href="/p/2?b=2&amp;a=1">ba</a>'
            )
        if raw_path in ("/files/manual.pdf", "/files/copy.pdf"):
            # The same document under two names: a download is kept once, by content hash.
            return web.Response(body=_PDF, content_type="application/pdf")
        if raw_path.startswith("/p/"):
            n = int(raw_path[3:]) if raw_path[3:].isdigit() else 0
            if not 1 <= n <= PRODUCTS:
                return web.Response(status=404)
            return _html(
                f'<h1>Product {n}</h1><span class="sku">T-{n:03d}</span>'
                f'<span class="price">{product_price(n)}</span><a href="/">home</a>'
            )
        if raw_path.startswith("/cal/"):
            try:
                y, m, d = (int(x) for x in raw_path[5:].strip("/").split("/"))
                day = date(y, m, d)
            except ValueError:
                return web.Response(status=404)
            nxt, prv = day + timedelta(days=1), day - timedelta(days=1)
            return _html(
                f'<a href="/cal/{nxt:%Y/%m/%d}">next</a>'
                f'<a href="/cal/{prv:%Y/%m/%d}">prev</a>' + _products(1, d)
            )
        if raw_path == "/shop":
            chosen = list(request.query.items())
            links = []
            for facet, values in FACETS.items():
                for v in values:
                    q = "&".join(f"{k}={val}" for k, val in [*chosen, (facet, v)])
                    links.append(f'<a href="/shop?{q}">{facet}={v}</a>')
            return _html("".join(links) + _products(2, len(chosen)))
        if raw_path.startswith("/s;jsessionid="):
            with self._lock:
                sid = f"{self._rng.getrandbits(64):016x}"
            return _html(f'<a href="/s;jsessionid={sid}">again</a>' + _products(1, 5))
        if raw_path.startswith("/a/"):
            return _html('<a href="a/">deeper</a>' + _products(1, 7))
        if raw_path.startswith("/dup/"):
            n = raw_path[5:]
            nxt = int(n) + 1 if n.isdigit() and int(n) < 5 else 1
            return _html(f'<p>The very same page body.</p><a href="/dup/{nxt}">more</a>')
        if raw_path.startswith("/same/"):
            return _html("<p>Byte for byte the same page under three URLs.</p>" + _products(2, 3))
        if raw_path.startswith("/near/"):
            n = raw_path[6:]
            k = int(n) if n.isdigit() else 1
            nxt = k + 1 if k < 5 else 1
            text = _NEAR_TEXT
            return _html(
                f"<p>{text}</p><p>Changed sentence number {k}.</p>"
                f'<a href="/near/{nxt}">more</a><a href="/leaf/{k}">unique</a>'
            )
        if raw_path.startswith("/leaf/"):
            # Reachable only from one near-duplicate page: proof its links were followed.
            return _html(f"<p>Leaf {raw_path[6:]}</p>")
        return web.Response(status=404)


class TrapServer(ThreadedServer):
    """A :class:`TrapSite` served from a background thread; ``site`` holds its counters.

    Counters live on the site, not the app, so they outlive a stop/start like the shop's.
    """

    label = "trap server"

    def __init__(
        self, site: TrapSite | None = None, host: str = "127.0.0.1", port: int = 0
    ) -> None:
        super().__init__(host, port)
        self.site = site if site is not None else TrapSite()

    def make_app(self) -> web.Application:
        return self.site.app()

    @property
    def seed_url(self) -> str:
        """The home page, which links every product and every trap."""
        return f"{self.base_url}/"
