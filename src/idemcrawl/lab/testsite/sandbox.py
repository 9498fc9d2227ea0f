"""A scraping sandbox: the patterns of a typical catalogue scrape, small and deterministic.

``idemcrawl testsite --site sandbox`` serves it; ``examples/`` has a spider for each part:

* ``/catalog?page=N`` — a paginated listing. Each item's **category** and **rank** are shown
  on the listing only; its detail page ``/item/ID`` has name and price but not those, so a
  spider must carry them from the listing to the detail page (``Request(data=…)``).
* ``/search`` — a search form that POSTs ``q`` (and a hidden ``form_id``) to
  ``/search``; results are only in the POST response, and a GET of ``/search`` shows the
  form alone.
* ``/login`` — a login form with a CSRF token (a hidden field, checked against a cookie the
  form page sets); a correct POST (user ``demo``, password ``demo``) sets a ``session``
  cookie and redirects to ``/members``, which lists members-only items and answers 403
  without a valid session.
* ``/api/items?offset=N`` — a JSON "load more" API: ``{"items": [...], "next": offset|null}``.
* ``/js?page=N`` — pages whose items exist only after their script runs: the HTML has an empty
  list, the script fills it from the JSON API and adds the link to the next page
  (``examples/js.py`` renders them).

Everything a verifier needs is computable without the server (:func:`expected_items`,
:func:`expected_search`, :func:`expected_members`, :func:`expected_api`), and the server logs
each request (method, path, body, cookie header) so a test can check how every URL was asked
for (:meth:`SandboxServer.requests`).
"""

from __future__ import annotations

import hashlib
import html
import threading
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs

from aiohttp import web

from .server import ThreadedServer

CATEGORIES = ("books", "garden", "kitchen", "toys")
USER, PASSWORD = "demo", "demo"
_CONTROL_PREFIX = "/__"


@dataclass(frozen=True)
class SandboxConfig:
    """Sizes of the sandbox (defaults: 4 listing pages of 5 items, 12 API items)."""

    pages: int = 4
    per_page: int = 5
    members: int = 3
    api_items: int = 12
    api_page: int = 5
    #: Seconds a session cookie stays valid.
    session_ttl: float = 3600.0
    #: Delay before each answer (ms), so kill tests can land mid-crawl.
    latency_ms: int = 0
    secret: str = "sandbox"


def item_name(i: int) -> str:
    return f"Item {i:03d}"


def item_price(i: int) -> str:
    h = int(hashlib.sha256(f"price:{i}".encode()).hexdigest()[:8], 16)
    return f"{1 + h % 9000 / 100:.2f}"


def item_category(i: int) -> str:
    return CATEGORIES[int(hashlib.sha256(f"cat:{i}".encode()).hexdigest()[:4], 16) % 4]


def expected_items(cfg: SandboxConfig) -> dict[str, dict[str, Any]]:
    """The catalogue spider's records: detail facts plus the listing's context."""
    out = {}
    for page in range(1, cfg.pages + 1):
        for rank in range(1, cfg.per_page + 1):
            i = (page - 1) * cfg.per_page + rank
            out[f"item-{i}"] = {
                "name": item_name(i),
                "price": item_price(i),
                "category": item_category(i),
                "listing_page": page,
                "rank": rank,
            }
    return out


def _search_hits(cfg: SandboxConfig, q: str) -> list[int]:
    q = q.strip().lower()
    n = cfg.pages * cfg.per_page
    return [i for i in range(1, n + 1) if q and q in item_category(i)]


def expected_search(cfg: SandboxConfig, queries: list[str]) -> dict[str, dict[str, Any]]:
    return {
        f"{q}:{i}": {"query": q, "name": item_name(i), "price": item_price(i)}
        for q in queries
        for i in _search_hits(cfg, q)
    }


def expected_members(cfg: SandboxConfig) -> dict[str, dict[str, Any]]:
    return {f"member-{i}": {"title": f"Members' deal {i}"} for i in range(1, cfg.members + 1)}


def expected_api(cfg: SandboxConfig) -> dict[str, dict[str, Any]]:
    return {
        f"api-{i}": {"name": f"API item {i}", "offset": (i - 1) // cfg.api_page * cfg.api_page}
        for i in range(1, cfg.api_items + 1)
    }


def expected_js(cfg: SandboxConfig) -> dict[str, dict[str, Any]]:
    """What the JavaScript pages show once their scripts ran, all pages followed: every API
    item, each with the page that showed it."""
    return {
        f"js-{i}": {"title": f"API item {i}", "page": (i - 1) // cfg.api_page + 1}
        for i in range(1, cfg.api_items + 1)
    }


@dataclass
class SandboxState:
    """What the server was asked, shared by every app it serves (it outlives a restart)."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    log: list[dict[str, Any]] = field(default_factory=list)
    in_flight: int = 0
    max_in_flight: int = 0
    #: session id -> expiry (time.time()).
    sessions: dict[str, float] = field(default_factory=dict)
    logins: int = 0

    def snapshot(self) -> list[dict[str, Any]]:
        with self.lock:
            return [dict(r) for r in self.log]


def _page(title: str, body: str, head: str = "") -> web.Response:
    doc = (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"{head}</head><body><h1>{html.escape(title)}</h1>{body}</body></html>"
    )
    return web.Response(text=doc, content_type="text/html", charset="utf-8")


def _token(cfg: SandboxConfig, nonce: str) -> str:
    return hashlib.sha256(f"{cfg.secret}:csrf:{nonce}".encode()).hexdigest()[:24]


def make_app(cfg: SandboxConfig, state: SandboxState | None = None) -> web.Application:
    """The sandbox as an aiohttp app (see the module doc for what it serves)."""
    st = state if state is not None else SandboxState()
    n_items = cfg.pages * cfg.per_page
    counter = iter(range(1, 1 << 62))

    @web.middleware
    async def observe(request: web.Request, handler: Any) -> web.StreamResponse:
        if request.path.startswith(_CONTROL_PREFIX):
            return await handler(request)
        body = await request.read()
        with st.lock:
            st.log.append(
                {
                    "t": time.monotonic(),
                    "method": request.method,
                    "path": request.path_qs,
                    "body": body.decode("utf-8", "replace"),
                    "cookie": request.headers.get("Cookie", ""),
                    "content_type": request.headers.get("Content-Type", ""),
                }
            )
            st.in_flight += 1
            st.max_in_flight = max(st.max_in_flight, st.in_flight)
        try:
            if cfg.latency_ms:
                import asyncio

                await asyncio.sleep(cfg.latency_ms / 1000)
            return await handler(request)
        finally:
            with st.lock:
                st.in_flight -= 1

    async def robots(_: web.Request) -> web.Response:
        return web.Response(text="User-agent: *\nAllow: /\n")

    async def index(_: web.Request) -> web.Response:
        links = "".join(
            f"<li><a href='{h}'>{t}</a></li>"
            for h, t in (
                ("/catalog?page=1", "Catalogue"),
                ("/search", "Search"),
                ("/login", "Log in"),
                ("/api/items?offset=0", "Load-more API"),
                ("/js", "JavaScript page"),
            )
        )
        return _page("Scraping sandbox", f"<ul>{links}</ul>")

    async def catalog(request: web.Request) -> web.Response:
        try:
            page = int(request.query.get("page", "1"))
        except ValueError:
            raise web.HTTPNotFound() from None
        if not 1 <= page <= cfg.pages:
            raise web.HTTPNotFound()
        rows = []
        for rank in range(1, cfg.per_page + 1):
            i = (page - 1) * cfg.per_page + rank
            rows.append(
                f"<li class='item' data-rank='{rank}'><a class='item-link' href='/item/{i}'>"
                f"{item_name(i)}</a> <span class='category'>{item_category(i)}</span></li>"
            )
        nav = (
            f"<a rel='next' class='next' href='/catalog?page={page + 1}'>Next</a>"
            if (page < cfg.pages)
            else ""
        )
        return _page(f"Catalogue page {page}", f"<ul class='items'>{''.join(rows)}</ul>{nav}")

    async def item(request: web.Request) -> web.Response:
        i = int(request.match_info["id"])
        if not 1 <= i <= n_items:
            raise web.HTTPNotFound()
        return _page(
            item_name(i),
            f"<div class='product'><span class='name'>{item_name(i)}</span>"
            f"<span class='price'>{item_price(i)}</span></div>",
        )

    async def search_form(_: web.Request) -> web.Response:
        return _page(
            "Search",
            "<form id='search' method='post' action='/search'>"
            "<input type='hidden' name='form_id' value='search-v1'>"
            "<input type='text' name='q' value=''><button>Search</button></form>",
        )

    async def search(request: web.Request) -> web.Response:
        form = await request.post()
        if form.get("form_id") != "search-v1":
            return _page("Search", "<p class='error'>stale form</p>")
        q = str(form.get("q", ""))
        hits = "".join(
            f"<li class='hit'><span class='name'>{item_name(i)}</span>"
            f"<span class='price'>{item_price(i)}</span></li>"
            for i in _search_hits(cfg, q)
        )
        return _page(f"Results for {q}", f"<ul class='hits'>{hits}</ul>")

    def session_ok(request: web.Request) -> bool:
        sid = request.cookies.get("session")
        with st.lock:
            exp = st.sessions.get(sid or "")
        return exp is not None and exp > time.time()

    async def login_form(_: web.Request) -> web.Response:
        nonce = f"n{next(counter)}"
        resp = _page(
            "Log in",
            "<form id='login' method='post' action='/login'>"
            f"<input type='hidden' name='csrf' value='{_token(cfg, nonce)}'>"
            "<input type='text' name='user'><input type='password' name='password'>"
            "<button>Log in</button></form>",
        )
        resp.set_cookie("csrf_nonce", nonce, path="/")
        return resp

    async def login(request: web.Request) -> web.Response:
        form = await request.post()
        nonce = request.cookies.get("csrf_nonce", "")
        if not nonce or form.get("csrf") != _token(cfg, nonce):
            return _page("Log in", "<p class='error'>CSRF check failed</p>")
        if form.get("user") != USER or form.get("password") != PASSWORD:
            return _page("Log in", "<p class='error'>wrong user or password</p>")
        sid = hashlib.sha256(f"{cfg.secret}:session:{next(counter)}:{time.time()}".encode())
        session = sid.hexdigest()[:32]
        with st.lock:
            st.sessions[session] = time.time() + cfg.session_ttl
            st.logins += 1
        resp = web.HTTPFound("/members")
        resp.set_cookie("session", session, path="/", max_age=int(cfg.session_ttl))
        raise resp

    async def members(request: web.Request) -> web.Response:
        if not session_ok(request):
            return web.Response(status=403, text="log in first", content_type="text/plain")
        rows = "".join(
            f"<li class='deal'><a href='/members/deal/{i}'>Members' deal {i}</a></li>"
            for i in range(1, cfg.members + 1)
        )
        return _page("Members", f"<ul class='deals'>{rows}</ul>")

    async def deal(request: web.Request) -> web.Response:
        i = int(request.match_info["id"])
        if not session_ok(request):
            return web.Response(status=403, text="log in first", content_type="text/plain")
        if not 1 <= i <= cfg.members:
            raise web.HTTPNotFound()
        return _page(f"Members' deal {i}", f"<p class='deal-title'>Members' deal {i}</p>")

    async def api(request: web.Request) -> web.Response:
        try:
            offset = int(request.query.get("offset", "0"))
        except ValueError:
            return web.json_response({"error": "bad offset"}, status=400)
        stop = min(offset + cfg.api_page, cfg.api_items)
        items = [{"id": i, "name": f"API item {i}"} for i in range(offset + 1, stop + 1)]
        nxt = stop if stop < cfg.api_items else None
        return web.json_response({"items": items, "next": nxt})

    async def js(request: web.Request) -> web.Response:
        # The list and the link to the next page are not in the HTML: the script asks the JSON
        # API for this page's items and adds the link when the API says there are more.
        try:
            page = max(1, int(request.query.get("page", "1")))
        except ValueError:
            return web.Response(status=400, text="bad page")
        offset = (page - 1) * cfg.api_page
        script = (
            f"<script>fetch('/api/items?offset={offset}').then(r => r.json()).then(batch => {{"
            "const ul = document.getElementById('items');"
            "batch.items.forEach(it => { const li = document.createElement('li');"
            "li.className = 'item'; li.dataset.id = it.id; li.textContent = it.name;"
            " ul.appendChild(li); });"
            "if (batch.next !== null) { const a = document.createElement('a');"
            f"a.className = 'next'; a.href = '/js?page={page + 1}'; a.textContent = 'next';"
            " document.body.appendChild(a); } });</script>"
        )
        return _page(f"Rendered list, page {page}", "<ul id='items'></ul>" + script)

    async def log(_: web.Request) -> web.Response:
        return web.json_response(st.snapshot())

    app = web.Application(middlewares=[observe])
    app.router.add_get("/robots.txt", robots)
    app.router.add_get("/", index)
    app.router.add_get("/catalog", catalog)
    app.router.add_get("/item/{id:\\d+}", item)
    app.router.add_get("/search", search_form)
    app.router.add_post("/search", search)
    app.router.add_get("/login", login_form)
    app.router.add_post("/login", login)
    app.router.add_get("/members", members)
    app.router.add_get("/members/deal/{id:\\d+}", deal)
    app.router.add_get("/api/items", api)
    app.router.add_get("/js", js)
    app.router.add_get("/__log", log)
    return app


class SandboxServer(ThreadedServer):
    """The sandbox in a background thread; its request log outlives a stop/start."""

    label = "sandbox server"

    def __init__(
        self, cfg: SandboxConfig | None = None, host: str = "127.0.0.1", port: int = 0
    ) -> None:
        super().__init__(host, port)
        self.cfg = cfg if cfg is not None else SandboxConfig()
        self.state = SandboxState()

    def make_app(self) -> web.Application:
        return make_app(self.cfg, self.state)

    def requests(self) -> list[dict[str, Any]]:
        """Every request so far: method, path (with query), body, cookie header, time."""
        return self.state.snapshot()

    def form(self, entry: dict[str, Any]) -> dict[str, str]:
        """A logged request's urlencoded body as a dict (one value per name)."""
        return {k: v[0] for k, v in parse_qs(entry["body"], keep_blank_values=True).items()}
