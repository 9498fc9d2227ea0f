"""JavaScript pages: render a fetched page in headless Chromium without letting it touch the net.

Why it is built this way:

* **The browser never opens a connection.** The page's own document is the response the crawl
  already fetched under the host's lease (the raw exchange is archived as for any page); every
  request the page then makes (scripts, XHR/fetch, stylesheets, frames) is intercepted and served
  through the crawl's own fetcher (``SubFetch``), so the SSRF guard, the byte and time limits and
  the User-Agent are the ones every other fetch obeys, and each exchange can be archived. As
  defence in depth Chromium starts with every host name mapped to "not found" and a proxy on a
  closed loopback port: a request that slipped past the interception could not reach anything.
* **Politeness of what a page asks for.** Requests to the page's own host run one at a time,
  each start at least ``gap`` (the host's delay) after the previous response ended, counting from
  the end of the document itself: the render holds the lease's in-flight slot throughout, and the
  completion that ends it comes after the last response, so the host's next grant is spaced from
  it too (I8). Other hosts are refused unless ``third_party`` is on (then they are paced the same
  way, per host, within the render). Images, media and fonts are never fetched: the DOM does not
  need them.
* **A hostile page is cut, not waited on.** A whole-render deadline (an endless script never
  fires "load"), a cap on requests and bytes per render, a cap on the serialised DOM, and memory
  caps per renderer process: V8's heap (``--max-old-space-size``) and the process's data segment
  (``RLIMIT_DATA``, set by a two-line wrapper around the browser, inherited by every renderer), so
  a page building an endless DOM crashes its own renderer within about a second instead of
  eating the machine. A cut render still returns whatever DOM could be read, with the reason.
* **A bounded pool.** At most ``contexts`` pages render at once, each in a fresh browser
  context (no cookie, cache or storage left behind between pages), closed afterwards; a crashed
  or unresponsive browser is replaced on the next render.

Playwright is an optional extra (``pip install 'idemcrawl[render]'``); the browser is the one
Playwright installed if any, else the system's Chromium (Debian's ``chromium`` package), or the
one ``IDEMCRAWL_CHROMIUM`` names.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import stat
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from . import url as urlmod
from .fetch import FetchError, FetchResult
from .version import DEFAULT_USER_AGENT

if TYPE_CHECKING:
    from playwright.async_api import Browser, Playwright, Request, Route

#: Fetches one request of a rendering page: (url, method, headers, body) -> the exchange.
SubFetch = Callable[[str, str, dict[str, str], bytes | None], Awaitable[FetchResult]]

#: Browsers tried, in order, when neither the settings nor ``IDEMCRAWL_CHROMIUM`` name one and
#: Playwright has no bundled browser installed.
SYSTEM_BROWSERS = ("chromium", "chromium-browser", "google-chrome-stable", "google-chrome")

#: Response headers that describe the wire form of a body we hand over decoded.
_WIRE_HEADERS = frozenset({"content-encoding", "content-length", "transfer-encoding", "connection"})

#: Chromium switches that stop background traffic of its own (updates, safe browsing, DNS
#: prefetch, pings) and confine name resolution and proxying to nothing (module doc).
_QUIET_SWITCHES = (
    "--host-resolver-rules=MAP * ~NOTFOUND",
    "--proxy-server=http://127.0.0.1:9",
    "--proxy-bypass-list=<-loopback>",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-domain-reliability",
    "--disable-sync",
    "--dns-prefetch-disable",
    "--no-pings",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--metrics-recording-only",
    "--no-first-run",
)


class RenderError(Exception):
    """Rendering cannot work here (Playwright or a browser missing, the browser will not start)."""


@dataclass(frozen=True, slots=True)
class RenderSettings:
    """Limits and choices of one :class:`Renderer`; every cap is per rendered page."""

    #: Browser executable; None finds one (:func:`find_browser`).
    executable: str | None = None
    #: Pages rendered at once (browser contexts alive at once).
    contexts: int = 2
    #: The whole render: document, what it loads, and the DOM read back.
    timeout: float = 30.0
    #: Requests the page may make (beyond its document) and the bytes they may bring.
    max_requests: int = 100
    max_bytes: int = 10 * 1024 * 1024
    #: Largest serialised DOM kept; a bigger one is cut to this size.
    max_dom_bytes: int = 10 * 1024 * 1024
    #: Per renderer process: V8 heap and data segment, in MB.
    heap_mb: int = 256
    memory_mb: int = 512
    #: Serve requests to hosts other than the page's (spaced per host within the render).
    third_party: bool = False
    #: Request types never fetched: the DOM does not depend on them.
    skip_types: frozenset[str] = frozenset({"image", "media", "font"})
    user_agent: str = DEFAULT_USER_AGENT

    def __post_init__(self) -> None:
        if self.contexts < 1:
            raise ValueError("render contexts must be >= 1")
        if not self.timeout > 0:
            raise ValueError("render timeout must be > 0")
        if self.max_requests < 0 or self.max_bytes < 0 or self.max_dom_bytes < 1:
            raise ValueError("render limits must be >= 0 (the DOM cap >= 1)")
        if self.heap_mb < 16 or self.memory_mb < 128:
            raise ValueError("render memory caps: heap >= 16 MB, memory >= 128 MB")


@dataclass(slots=True)
class SubExchange:
    """One request the page made and what became of it (for archiving and for the record)."""

    url: str
    method: str
    resource_type: str
    result: FetchResult | None = None
    #: Why it was not fetched or failed ("refused: other host", "fetch error: …").
    error: str | None = None


@dataclass(slots=True)
class RenderResult:
    """The DOM after scripts ran, and everything the page asked for on the way."""

    url: str
    html: str
    exchanges: list[SubExchange] = field(default_factory=list)
    #: Why the render was cut short ("render timeout after 30 s", "renderer crashed: …",
    #: "max_dom_bytes"); None when the page settled by itself.
    cut_reason: str | None = None
    elapsed: float = 0.0

    @property
    def fetched(self) -> list[SubExchange]:
        return [x for x in self.exchanges if x.result is not None]


def find_browser(explicit: str | None = None) -> str | None:
    """The Chromium to drive: ``explicit``, ``IDEMCRAWL_CHROMIUM``, Playwright's, the system's."""
    for candidate in (explicit, os.environ.get("IDEMCRAWL_CHROMIUM")):
        if candidate:
            return shutil.which(candidate) or (candidate if os.path.exists(candidate) else None)
    bundled = _playwright_chromium()
    if bundled:
        return bundled
    for name in SYSTEM_BROWSERS:
        found = shutil.which(name)
        if found:
            return found
    return None


def _playwright_chromium() -> str | None:
    """Playwright's downloaded Chromium, if ``playwright install chromium`` was run."""
    root = os.environ.get("PLAYWRIGHT_BROWSERS_PATH") or os.path.expanduser(
        "~/.cache/ms-playwright"
    )
    try:
        names = sorted(n for n in os.listdir(root) if n.startswith("chromium-"))
    except OSError:
        return None
    for name in reversed(names):
        for rel in ("chrome-linux/chrome", "chrome-linux64/chrome"):
            path = os.path.join(root, name, rel)
            if os.access(path, os.X_OK):
                return path
    return None


def _limited_launcher(directory: str, browser: str, memory_mb: int) -> str:
    """A wrapper that caps each browser process's data segment, then runs the browser.

    ``RLIMIT_DATA`` is per process and inherited, so every renderer gets its own cap; a page that
    grows its DOM without end crashes its renderer instead of the machine. (``RLIMIT_AS`` would
    not do: Chromium reserves terabytes of address space it never uses.)
    """
    path = os.path.join(directory, "browser")
    kb = memory_mb * 1024
    with open(path, "w", encoding="utf-8") as f:
        f.write(f'#!/bin/sh\nulimit -d {kb}\nexec "{browser}" "$@"\n')
    os.chmod(path, stat.S_IRWXU)
    return path


def _response_headers(result: FetchResult) -> dict[str, str]:
    """The headers Chromium should see: the body comes decoded, so no wire framing headers."""
    out: dict[str, str] = {}
    pairs: Sequence[tuple[str, str]] = result.raw_headers or list(result.headers.items())
    for name, value in pairs:
        low = name.lower()
        if low in _WIRE_HEADERS:
            continue
        out[low] = f"{out[low]}, {value}" if low in out and low != "set-cookie" else value
    return out


class _Pacer:
    """Per-host spacing of a page's requests within one render (module doc)."""

    def __init__(self, gap: float, first_host: str, started: float) -> None:
        self.gap = gap
        self._locks: dict[str, asyncio.Lock] = {}
        # The document itself ended just now: the first request waits a gap after it.
        self._ends: dict[str, float] = {first_host: started}

    @contextlib.asynccontextmanager
    async def turn(self, host: str) -> Any:
        lock = self._locks.setdefault(host, asyncio.Lock())
        async with lock:
            last = self._ends.get(host)
            if last is not None:
                wait = last + self.gap - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
            try:
                yield
            finally:
                self._ends[host] = time.monotonic()


class _Render:
    """The state of one page's render: counts, caps and the request handler."""

    def __init__(
        self, settings: RenderSettings, page: FetchResult, fetch: SubFetch, gap: float
    ) -> None:
        self.settings = settings
        self.page = page
        self.fetch = fetch
        self.host = urlmod.host_key(page.url)
        self.pacer = _Pacer(gap, self.host, time.monotonic())
        self.exchanges: list[SubExchange] = []
        self.bytes = 0
        self.served_document = False

    async def handle(self, route: Route, request: Request) -> None:
        try:
            await self._handle(route, request)
        except Exception:
            # The page went away mid-request (render cut, context closed): nothing to serve.
            with contextlib.suppress(Exception):
                await route.abort("failed")

    async def _handle(self, route: Route, request: Request) -> None:
        url = request.url
        if (
            not self.served_document
            and request.is_navigation_request()
            and request.frame.parent_frame is None
        ):
            self.served_document = True
            await route.fulfill(
                status=self.page.status or 200,
                headers=_response_headers(self.page),
                body=self.page.body,
            )
            return
        kind = request.resource_type
        x = SubExchange(url, request.method, kind)
        refusal = self._refusal(request, url, kind)
        if refusal is not None:
            x.error = refusal
            if refusal != "skipped: not needed for the DOM":
                self.exchanges.append(x)
            await route.abort("blockedbyclient")
            return
        self.exchanges.append(x)
        host = urlmod.host_key(url)
        headers = {
            k: v for k, v in request.headers.items() if k.lower() not in ("user-agent", "cookie")
        }
        try:
            async with self.pacer.turn(host):
                result = await self.fetch(url, request.method, headers, request.post_data_buffer)
        except FetchError as exc:
            x.error = f"fetch error: {exc}"
            await route.abort("failed")
            return
        x.result = result
        self.bytes += len(result.body)
        if self.bytes > self.settings.max_bytes:
            x.error = f"refused: the page's requests passed {self.settings.max_bytes} bytes"
            await route.abort("blockedbyclient")
            return
        await route.fulfill(
            status=result.status, headers=_response_headers(result), body=result.body
        )

    def _refusal(self, request: Request, url: str, kind: str) -> str | None:
        if kind in self.settings.skip_types:
            return "skipped: not needed for the DOM"
        if request.is_navigation_request() and request.frame.parent_frame is None:
            return "refused: the page navigated away"
        try:
            normal = urlmod.normalise(url)
        except urlmod.InvalidURL as exc:
            return f"refused: {exc}"
        if urlmod.host_key(normal) != self.host and not self.settings.third_party:
            return "refused: other host (render third_party is off)"
        if len(self.exchanges) >= self.settings.max_requests:
            return f"refused: more than {self.settings.max_requests} requests"
        return None


class Renderer:
    """Headless Chromium behind a bounded pool of contexts; use as an async context manager."""

    def __init__(self, settings: RenderSettings | None = None) -> None:
        self.settings = settings or RenderSettings()
        self._slots = asyncio.Semaphore(self.settings.contexts)
        self._playwright: Playwright | None = None
        self._manager: Any = None
        self._browser: Browser | None = None
        self._launch_lock = asyncio.Lock()
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self.renders = 0
        self.browser_restarts = 0
        #: Why the browser cannot be started, once known: asked again, the answer is the same.
        self._unusable: RenderError | None = None

    async def __aenter__(self) -> Renderer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def start(self) -> None:
        """Start Playwright and the browser now, so a missing one is reported before crawling.

        Without it the first :meth:`render` starts them (a crawl whose spider asks for rendering
        only on some requests); a browser that cannot start fails each such render with the
        same :class:`RenderError`.
        """
        if self._unusable is not None:
            raise self._unusable
        try:
            await self._start()
        except RenderError as exc:
            self._unusable = exc
            raise

    async def _start(self) -> None:
        try:
            from playwright.async_api import async_playwright
        except ImportError as exc:
            raise RenderError(
                "rendering JavaScript pages needs Playwright: pip install 'idemcrawl[render]'"
            ) from exc
        browser = find_browser(self.settings.executable)
        if browser is None:
            raise RenderError(
                "no Chromium found for rendering: install Debian's 'chromium' package, run "
                "'playwright install chromium', or set IDEMCRAWL_CHROMIUM to a browser executable"
            )
        self._tmp = tempfile.TemporaryDirectory(prefix="idemcrawl-render-")
        self._executable = _limited_launcher(self._tmp.name, browser, self.settings.memory_mb)
        self._manager = async_playwright()
        self._playwright = await self._manager.start()
        await self._launch()

    async def _launch(self) -> Browser:
        assert self._playwright is not None
        args = [*_QUIET_SWITCHES, f"--js-flags=--max-old-space-size={self.settings.heap_mb}"]
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            args.append("--no-sandbox")  # Chromium refuses to sandbox as root
        try:
            self._browser = await self._playwright.chromium.launch(
                executable_path=self._executable, args=args, timeout=30_000
            )
        except Exception as exc:
            raise RenderError(f"the browser would not start: {exc}") from exc
        return self._browser

    async def _live_browser(self) -> Browser:
        async with self._launch_lock:
            if self._playwright is None:
                await self.start()
                assert self._browser is not None
                return self._browser
            if self._browser is None or not self._browser.is_connected():
                if self._browser is not None:
                    self.browser_restarts += 1
                    with contextlib.suppress(Exception):
                        await self._browser.close()
                return await self._launch()
            return self._browser

    async def close(self) -> None:
        browser, self._browser = self._browser, None
        if browser is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(browser.close(), 10)
        manager, self._manager, self._playwright = self._manager, None, None
        if manager is not None:
            with contextlib.suppress(Exception):
                await manager.__aexit__(None, None, None)
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    async def render(
        self,
        page: FetchResult,
        fetch: SubFetch,
        *,
        gap: float = 0.0,
        cookies: Sequence[dict[str, Any]] = (),
    ) -> RenderResult:
        """Run ``page`` (an HTML response already fetched) in the browser; its DOM afterwards.

        ``fetch`` serves the page's own requests, ``gap`` spaces those on one host, ``cookies``
        (Playwright cookie dicts) are set in the page's fresh context first.
        """
        async with self._slots:
            started = time.monotonic()
            browser = await self._live_browser()
            state = _Render(self.settings, page, fetch, gap)
            context = await browser.new_context(
                service_workers="block", user_agent=self.settings.user_agent, accept_downloads=False
            )
            self.renders += 1
            try:
                if cookies:
                    await context.add_cookies(list(cookies))
                await context.route("**/*", state.handle)
                tab = await context.new_page()
                crashed: list[str] = []
                tab.on("crash", lambda _p: crashed.append("renderer crashed"))
                html, cut = await self._run(tab, page.url, started, crashed)
            finally:
                await self._dispose(context)
        limit = self.settings.max_dom_bytes
        if len(html) > limit // 4 and len(html.encode("utf-8", "replace")) > limit:
            html = html.encode("utf-8", "replace")[:limit].decode("utf-8", "ignore")
            cut = cut or "max_dom_bytes"
        return RenderResult(page.url, html, state.exchanges, cut, time.monotonic() - started)

    async def _run(
        self, tab: Any, url: str, started: float, crashed: list[str]
    ) -> tuple[str, str | None]:
        timeout = self.settings.timeout
        cut: str | None = None
        try:
            async with asyncio.timeout(timeout):
                await tab.goto(url, wait_until="load")
                # Scripts that fetch after "load" (the usual "load more"): wait until no request
                # has been in flight for half a second, as Playwright's "networkidle" does.
                await tab.wait_for_load_state("networkidle")
        except TimeoutError:
            cut = f"render timeout after {timeout:g} s"
        except Exception as exc:  # Playwright's own errors: a crash, a closed target
            cut = crashed[0] if crashed else f"render failed: {str(exc).splitlines()[0]}"
        if crashed:
            caps = f"heap {self.settings.heap_mb} MB, process {self.settings.memory_mb} MB"
            return "", f"{crashed[0]} (out of memory? caps: {caps})"
        # An endless script keeps the renderer busy: the DOM can then not be read at all, and
        # after a timeout that is the likely case, so it gets one second.
        left = 1.0 if cut else max(1.0, min(5.0, started + timeout + 5.0 - time.monotonic()))
        try:
            html = await asyncio.wait_for(tab.content(), left)
        except Exception:
            return "", cut or "the DOM could not be read"
        return html, cut

    async def _dispose(self, context: Any) -> None:
        """Close a page's context; a browser that cannot do it in time is replaced."""
        try:
            await asyncio.wait_for(context.close(), 10)
        except Exception:
            browser, self._browser = self._browser, None
            if browser is not None:
                self.browser_restarts += 1
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(browser.close(), 10)
