"""A hostile (and a merely changing) web site for fetch-limit, recrawl and SSRF tests (#5).

Everything a crawler must survive or handle politely, on one loopback port:

* ``/changing/<n>``: a body that changes every ``period`` seconds, with a strong ETag and a
  Last-Modified derived from the current period; ``/static/<n>`` never changes. Both answer
  If-None-Match / If-Modified-Since with 304, and 200s and 304s are counted apart, so a
  recrawl test can prove that unchanged pages cost no body;
* ``/redirect/chain/7`` -> ``/6`` ... -> ``/1`` -> ``/redirect/end`` (7 hops, every 3xx
  flavour) and ``/redirect/loop/a`` <-> ``/redirect/loop/b``;
* ``/gone/404``, ``/gone/410``;
* decompression bombs (``/bomb.html`` gzip, ``/bomb-deflate.html``, ``/bomb-br.html``,
  ``/bomb-zstd.html`` when the libraries are installed), each >= 1 GiB decoded;
* ``/big.html``: 100 MB of HTML, streamed from one reused chunk, never held in memory;
* ``/trickle.html``: one byte per second, forever (a slow-loris response);
* ``/garbage.html``: random bytes labelled text/html;
* ``/huge-header`` (one 1 MB header) and ``/many-headers`` (10,000 small ones);
* links to ``http://127.0.0.2:<port>/x`` (also served, best effort, so a guard failure shows
  in the counters) and to ``http://metadata.test/`` / ``http://internal.test/``, names that
  :func:`hostile_resolver` maps to 169.254.169.254 / 10.0.0.1.

The bombs are built once per process, lazily, off the event loop, and cheaply: a deflate
segment for 1 MiB of zeros ends with a full flush (byte-aligned, no back-references across it),
so the same segment repeated 1024 times is a valid stream for 1 GiB; only the trailer checksum
needs the real data (CRC-32 of 1 GiB of zeros, ~0.8 s once; Adler-32 has a closed form).

Counters: ``GET /__counters`` (and :meth:`HostileSite.counters`) return
``{path: {status: count}}`` counted when a response head is sent; ``POST /__reset`` clears
them. Control endpoints (``/__*``) are not counted.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import functools
import html
import json
import random
import socket
import struct
import threading
import time
import zlib
from collections.abc import Callable
from typing import Final

from aiohttp import web
from aiohttp.abc import AbstractResolver, ResolveResult

from .server import ThreadedServer, bind, start_app

__all__ = [
    "CHAIN_HOPS",
    "HOSTILE_NAMES",
    "HostileSite",
    "bomb_blob",
    "bomb_encodings",
    "hostile_resolver",
    "serve_forever",
]

#: Names the injected resolver maps to forbidden addresses (the SSRF bait on the index page).
HOSTILE_NAMES: Final = {"metadata.test": "169.254.169.254", "internal.test": "10.0.0.1"}
#: Redirect hops from ``/redirect/chain/{CHAIN_HOPS}`` to ``/redirect/end``.
CHAIN_HOPS: Final = 7
_CHAIN_STATUSES: Final = (301, 302, 303, 307, 308)
_MIB: Final = 1 << 20
_CONTROL_PREFIX: Final = "/__"
_SHUTDOWN_TIMEOUT: Final = 0.5
_STATIC_LAST_MODIFIED: Final = 1_700_000_000.0  # a fixed instant: the page never changes
_GARBAGE_BYTES: Final = 256 * 1024
_HUGE_HEADER_BYTES: Final = 1_000_000
_MANY_HEADERS: Final = 10_000


# -- bombs ------------------------------------------------------------------------------------


def bomb_encodings() -> list[str]:
    """Content-codings a bomb can be served in here (br / zstd need their libraries)."""
    codings = ["gzip", "deflate"]
    with contextlib.suppress(ImportError):
        import brotli  # noqa: F401

        codings.append("br")
    with contextlib.suppress(ImportError):
        import zstandard  # noqa: F401

        codings.append("zstd")
    return codings


def _zero_segment() -> bytes:
    """Raw deflate of 1 MiB of zeros ending in a full flush, so copies can be concatenated."""
    c = zlib.compressobj(9, zlib.DEFLATED, -zlib.MAX_WBITS)
    return c.compress(bytes(_MIB)) + c.flush(zlib.Z_FULL_FLUSH)


_FINAL_EMPTY_BLOCK: Final = b"\x03\x00"  # BFINAL=1, fixed Huffman, end-of-block


@functools.lru_cache(maxsize=8)
def bomb_blob(encoding: str, size: int = 1 << 30) -> bytes:
    """The compressed form of ``size`` zero bytes (rounded up to whole MiB) in ``encoding``.

    Cached: tests and servers in one process pay for each bomb once. Memory while building
    is one MiB of zeros plus the (small) output.
    """
    mib = max(1, -(-size // _MIB))
    n = mib * _MIB
    if encoding == "gzip":
        crc = 0
        zeros = bytes(_MIB)
        for _ in range(mib):
            crc = zlib.crc32(zeros, crc)
        header = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\xff"  # no name, no mtime, max level
        trailer = struct.pack("<II", crc, n & 0xFFFFFFFF)
        return header + _zero_segment() * mib + _FINAL_EMPTY_BLOCK + trailer
    if encoding == "deflate":  # zlib-wrapped, as RFC 9110 defines "deflate"
        adler = ((n % 65521) << 16) | 1  # Adler-32 of n zeros: s1 stays 1, s2 grows by 1
        return b"\x78\xda" + _zero_segment() * mib + _FINAL_EMPTY_BLOCK + struct.pack(">I", adler)
    zeros = bytes(_MIB)
    if encoding == "br":
        import brotli

        br = brotli.Compressor(quality=5)  # ~0.9 s for 1 GiB -> 1.6 KB; quality 11 takes 60 s
        return b"".join(br.process(zeros) for _ in range(mib)) + br.finish()
    if encoding == "zstd":
        import zstandard

        zc = zstandard.ZstdCompressor(level=1).compressobj()  # no content size in the frame
        return b"".join(zc.compress(zeros) for _ in range(mib)) + zc.flush()
    raise ValueError(f"no bomb for content-coding {encoding!r}")


# -- the resolver -----------------------------------------------------------------------------


class _HostileResolver(AbstractResolver):
    """Maps the bait names to forbidden addresses and every other name to loopback.

    Never consults DNS, so a crawl using it cannot reach beyond this machine whatever links it
    follows; ``calls`` records each lookup for tests.
    """

    def __init__(self, mapping: dict[str, str]) -> None:
        self.mapping = mapping
        self.calls: list[str] = []

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        self.calls.append(host)
        address = self.mapping.get(host.rstrip(".").lower())
        if address is None:
            address = "::1" if family == socket.AF_INET6 else "127.0.0.1"
        return [
            ResolveResult(
                hostname=host,
                host=address,
                port=port,
                family=socket.AF_INET6 if ":" in address else socket.AF_INET,
                proto=0,
                flags=socket.AI_NUMERICHOST,
            )
        ]

    async def close(self) -> None:
        return None


def hostile_resolver(extra: dict[str, str] | None = None) -> AbstractResolver:
    """Resolver for tests and ``idemcrawl testsite --site hostile`` crawls.

    ``metadata.test`` -> 169.254.169.254, ``internal.test`` -> 10.0.0.1 (plus ``extra``
    names -> addresses), anything else -> 127.0.0.1 (``::1`` when IPv6 is asked for).
    """
    return _HostileResolver({**HOSTILE_NAMES, **{k.lower(): v for k, v in (extra or {}).items()}})


# -- the site ---------------------------------------------------------------------------------


def _http_date(ts: float) -> str:
    return email.utils.formatdate(ts, usegmt=True)


def _parse_http_date(value: str) -> float | None:
    try:
        return email.utils.parsedate_to_datetime(value).timestamp()
    except (TypeError, ValueError, IndexError, OverflowError):
        return None


def _etag_matches(if_none_match: str, etag: str) -> bool:
    """RFC 9110 weak comparison, which If-None-Match uses: W/ prefixes are ignored."""
    if if_none_match.strip() == "*":
        return True
    tags = (t.strip().removeprefix("W/") for t in if_none_match.split(","))
    return etag.removeprefix("W/") in tags


def _not_modified(request: web.Request, etag: str, last_modified: float) -> bool:
    """If-None-Match wins over If-Modified-Since when both are sent (RFC 9110 13.2.2)."""
    inm = request.headers.get("If-None-Match")
    if inm is not None:
        return _etag_matches(inm, etag)
    ims = request.headers.get("If-Modified-Since")
    if ims is not None:
        since = _parse_http_date(ims)
        return since is not None and int(last_modified) <= since
    return False


def _page(title: str, body: str) -> str:
    return (
        "<!DOCTYPE html>\n"
        f'<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
        f"</head>\n<body>\n{body}\n</body></html>\n"
    )


def _html(text: str, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(
        text=text, status=status, content_type="text/html", charset="utf-8", headers=headers
    )


class HostileSite(ThreadedServer):
    """The hostile site; serve it from a background thread or use :meth:`app` directly.

    ``period``: seconds between changes of ``/changing/<n>``; ``clock`` lets a test move time
    instead of sleeping. ``bomb_bytes``/``big_bytes``/``trickle_interval`` scale the hostile
    pages (defaults: 1 GiB, 100 MB, 1 s). Trickling responses are cut after a short grace
    period when it stops.
    """

    label = "hostile site"
    shutdown_timeout = _SHUTDOWN_TIMEOUT

    def __init__(
        self,
        *,
        period: float = 60.0,
        changing: int = 3,
        static: int = 3,
        bomb_bytes: int = 1 << 30,
        big_bytes: int = 100 * 1000 * 1000,
        trickle_interval: float = 1.0,
        clock: Callable[[], float] = time.time,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        if period <= 0:
            raise ValueError("period must be > 0")
        if changing < 0 or static < 0 or bomb_bytes < 1 or big_bytes < 0:
            raise ValueError("page counts and sizes must not be negative")
        if trickle_interval <= 0:
            raise ValueError("trickle_interval must be > 0")
        super().__init__(host, port)
        self.period = period
        self.changing = changing
        self.static = static
        self.bomb_bytes = bomb_bytes
        self.big_bytes = big_bytes
        self.trickle_interval = trickle_interval
        self.clock = clock
        #: True when the 127.0.0.2 canary listener is up (so a guard failure is visible).
        self.canary_bound = False
        self._counts: dict[str, dict[str, int]] = {}
        self._lock = threading.Lock()
        self._bomb_locks: dict[str, asyncio.Lock] = {}

    # -- addresses ----------------------------------------------------------------------------

    @property
    def seed_url(self) -> str:
        return f"{self.base_url}/"

    # -- pages --------------------------------------------------------------------------------

    def version(self) -> int:
        """Which version every ``/changing/<n>`` serves now (changes every ``period`` s)."""
        return int(self.clock() // self.period)

    def changing_etag(self, n: int, version: int | None = None) -> str:
        v = self.version() if version is None else version
        return f'"c{n}-v{v}"'

    def index_links(self, port: int | None = None) -> list[str]:
        """Every link on ``/``: what a crawl from the index can reach (or must refuse)."""
        port = self.port if port is None else port
        links = [f"/changing/{n}" for n in range(self.changing)]
        links += [f"/static/{n}" for n in range(self.static)]
        links += [f"/redirect/chain/{CHAIN_HOPS}", "/redirect/loop/a", "/gone/404", "/gone/410"]
        links += [f"/{name}" for name in self._bomb_pages()]
        links += ["/big.html", "/trickle.html", "/garbage.html", "/huge-header", "/many-headers"]
        links += [f"http://127.0.0.2:{port}/x", "http://metadata.test/", "http://internal.test/"]
        return links

    @staticmethod
    def _bomb_pages() -> dict[str, str]:
        names = {"gzip": "bomb.html", "deflate": "bomb-deflate.html"}
        names |= {"br": "bomb-br.html", "zstd": "bomb-zstd.html"}
        return {names[e]: e for e in bomb_encodings()}

    async def _index(self, request: web.Request) -> web.StreamResponse:
        port = request.url.port or self.port
        items = "\n".join(
            f'<li><a href="{html.escape(u)}">{html.escape(u)}</a></li>'
            for u in self.index_links(port)
        )
        return _html(_page("Hostile site", f"<h1>Hostile site</h1>\n<ul>\n{items}\n</ul>"))

    async def _robots(self, request: web.Request) -> web.StreamResponse:
        return web.Response(text="User-agent: *\nAllow: /\n")

    def _page_number(self, request: web.Request, count: int) -> int | None:
        raw = request.match_info["n"]
        if not raw.isascii() or not raw.isdigit() or str(int(raw)) != raw:
            return None
        n = int(raw)
        return n if n < count else None

    async def _changing(self, request: web.Request) -> web.StreamResponse:
        n = self._page_number(request, self.changing)
        if n is None:
            raise web.HTTPNotFound()
        version = self.version()
        etag = self.changing_etag(n, version)
        last_modified = version * self.period
        headers = {"ETag": etag, "Last-Modified": _http_date(last_modified)}
        if _not_modified(request, etag, last_modified):
            return web.Response(status=304, headers=headers)
        body = (
            f"<h1>Changing page {n}</h1>\n<p class=version>version {version}</p>\n"
            f'<p>changes every {self.period:g} s</p>\n<a href="/">home</a>'
        )
        return _html(_page(f"changing {n} v{version}", body), headers=headers)

    async def _static(self, request: web.Request) -> web.StreamResponse:
        n = self._page_number(request, self.static)
        if n is None:
            raise web.HTTPNotFound()
        etag = f'"s{n}"'
        headers = {"ETag": etag, "Last-Modified": _http_date(_STATIC_LAST_MODIFIED)}
        if _not_modified(request, etag, _STATIC_LAST_MODIFIED):
            return web.Response(status=304, headers=headers)
        body = f'<h1>Static page {n}</h1>\n<p>never changes</p>\n<a href="/">home</a>'
        return _html(_page(f"static {n}", body), headers=headers)

    async def _chain(self, request: web.Request) -> web.StreamResponse:
        raw = request.match_info["k"]
        if not raw.isascii() or not raw.isdigit() or str(int(raw)) != raw:
            raise web.HTTPNotFound()
        k = int(raw)
        if not 1 <= k <= CHAIN_HOPS:
            raise web.HTTPNotFound()
        target = f"/redirect/chain/{k - 1}" if k > 1 else "/redirect/end"
        status = _CHAIN_STATUSES[k % len(_CHAIN_STATUSES)]
        return web.Response(status=status, headers={"Location": target})

    async def _chain_end(self, request: web.Request) -> web.StreamResponse:
        return _html(_page("end", "<h1>End of the redirect chain</h1>"))

    async def _loop_hop(self, request: web.Request) -> web.StreamResponse:
        side = request.match_info["side"]
        if side not in ("a", "b"):
            raise web.HTTPNotFound()
        other = "b" if side == "a" else "a"
        return web.Response(status=302, headers={"Location": f"/redirect/loop/{other}"})

    async def _gone(self, request: web.Request) -> web.StreamResponse:
        code = request.match_info["code"]
        if code == "404":
            return _html(_page("Not found", "<h1>404</h1>"), status=404)
        if code == "410":
            return _html(_page("Gone", "<h1>410 Gone</h1>"), status=410)
        raise web.HTTPNotFound()

    async def _bomb(self, request: web.Request) -> web.StreamResponse:
        encoding = self._bomb_pages().get(request.match_info["name"])
        if encoding is None:
            raise web.HTTPNotFound()
        # Built in a thread (seconds of CPU for 1 GiB) so other pages keep being served;
        # the lock stops concurrent first requests from building it twice.
        lock = self._bomb_locks.setdefault(encoding, asyncio.Lock())
        async with lock:
            blob = await asyncio.get_running_loop().run_in_executor(
                None, bomb_blob, encoding, self.bomb_bytes
            )
        return web.Response(
            body=blob,
            headers={"Content-Type": "text/html; charset=utf-8", "Content-Encoding": encoding},
        )

    async def _big(self, request: web.Request) -> web.StreamResponse:
        head = b"<!DOCTYPE html>\n<html><head><title>big</title></head><body>\n"
        tail = b"</body></html>\n"
        line = b"<p>All work and no play makes a very big page. " + b"x" * 60 + b"</p>\n"
        chunk = line * (64 * 1024 // len(line))
        total = max(self.big_bytes, len(head) + len(tail))
        resp = web.StreamResponse(headers={"Content-Type": "text/html; charset=utf-8"})
        resp.content_length = total
        await resp.prepare(request)
        remaining = total - len(head) - len(tail)
        with contextlib.suppress(ConnectionError):  # the client cut us off: expected
            await resp.write(head)
            while remaining > 0:
                piece = chunk if remaining >= len(chunk) else chunk[:remaining]
                await resp.write(piece)  # waits for the client: one chunk in memory
                remaining -= len(piece)
            await resp.write(tail)
            await resp.write_eof()
        return resp

    async def _trickle(self, request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/html; charset=utf-8"})
        await resp.prepare(request)  # chunked: no Content-Length, no end
        payload = b"<html><body>" + b"." * 1_000_000
        with contextlib.suppress(ConnectionError):
            for i in range(len(payload)):
                transport = request.transport
                if transport is None or transport.is_closing():
                    break
                await resp.write(payload[i : i + 1])
                await asyncio.sleep(self.trickle_interval)
        return resp

    async def _garbage(self, request: web.Request) -> web.StreamResponse:
        body = random.Random(5).randbytes(_GARBAGE_BYTES)
        return web.Response(body=body, headers={"Content-Type": "text/html; charset=utf-8"})

    async def _huge_header(self, request: web.Request) -> web.StreamResponse:
        huge = {"X-Huge": "a" * _HUGE_HEADER_BYTES}
        return _html(_page("huge", "<p>huge header</p>"), headers=huge)

    async def _many_headers(self, request: web.Request) -> web.StreamResponse:
        resp = _html(_page("many", "<p>many headers</p>"))
        for i in range(_MANY_HEADERS):
            resp.headers.add(f"X-Many-{i}", "b" * 80)
        return resp

    async def _canary(self, request: web.Request) -> web.StreamResponse:
        return _html(_page("canary", "<p>reached through a forbidden address</p>"))

    async def _counters(self, request: web.Request) -> web.StreamResponse:
        return web.Response(text=json.dumps(self.counters()), content_type="application/json")

    async def _reset(self, request: web.Request) -> web.StreamResponse:
        self.reset()
        return web.Response(text="ok\n")

    async def _count(self, request: web.Request, response: web.StreamResponse) -> None:
        """``on_response_prepare``: a response counts when its head is sent, streams too."""
        if request.path.startswith(_CONTROL_PREFIX):
            return
        key = str(response.status)
        with self._lock:
            per_path = self._counts.setdefault(request.path, {})
            per_path[key] = per_path.get(key, 0) + 1

    def counters(self) -> dict[str, dict[str, int]]:
        """``{path: {status: count}}``, e.g. ``{"/static/0": {"200": 1, "304": 2}}``."""
        with self._lock:
            return {path: dict(c) for path, c in self._counts.items()}

    def count(self, path: str, status: int | None = None) -> int:
        """Responses sent for ``path`` (with ``status`` when given)."""
        per_path = self.counters().get(path, {})
        if status is not None:
            return per_path.get(str(status), 0)
        return sum(per_path.values())

    def reset(self) -> None:
        with self._lock:
            self._counts.clear()

    def app(self) -> web.Application:
        app = web.Application()
        app.on_response_prepare.append(self._count)
        r = app.router
        r.add_get("/", self._index)
        r.add_get("/robots.txt", self._robots)
        r.add_get("/changing/{n}", self._changing)
        r.add_get("/static/{n}", self._static)
        r.add_get("/redirect/chain/{k}", self._chain)
        r.add_get("/redirect/end", self._chain_end)
        r.add_get("/redirect/loop/{side}", self._loop_hop)
        r.add_get("/gone/{code}", self._gone)
        r.add_get("/{name:bomb[a-z-]*\\.html}", self._bomb)
        r.add_get("/big.html", self._big)
        r.add_get("/trickle.html", self._trickle)
        r.add_get("/garbage.html", self._garbage)
        r.add_get("/huge-header", self._huge_header)
        r.add_get("/many-headers", self._many_headers)
        r.add_get("/x", self._canary)
        r.add_get("/__counters", self._counters)
        r.add_post("/__reset", self._reset)
        return app

    # -- serving ------------------------------------------------------------------------------

    def make_app(self) -> web.Application:
        return self.app()

    async def open(self) -> list[web.AppRunner]:
        """The site on ``host:port``, plus the canary: the same port on 127.0.0.2.

        The canary is best effort (``canary_bound`` says whether it is up): a guarded crawler
        never reaches it, so it only exists to make a guard failure visible in the counters.
        """
        app = self.app()
        sock = bind(self.host, self._requested_port)
        port = int(sock.getsockname()[1])
        socks = [sock]
        try:
            socks.append(bind("127.0.0.2", port))
            self.canary_bound = True
        except OSError:
            self.canary_bound = False
        self._bound(port)
        return [await start_app(app, socks, shutdown_timeout=self.shutdown_timeout)]


def serve_forever(host: str = "127.0.0.1", port: int = 0, period: float = 60.0) -> None:
    """Serve the hostile site in the foreground until SIGINT/SIGTERM (``idemcrawl testsite``).

    Prints one line with the real seed URL, flushed, so ``port=0`` works for scripts, and
    returns normally on a signal so the process exits 0 without a traceback.
    """
    site = HostileSite(period=period, host=host, port=port)
    site.serve_until_signal(
        lambda: print(
            f"serving hostile site at {site.seed_url} (crawl it with the hostile resolver "
            "and --allow-private 127.0.0.1)",
            flush=True,
        )
    )
