"""``idemcrawl serve``: a read-only dashboard page for a crawl database, on loopback only.

The page is one self-contained HTML document (inline CSS and JS, no CDN, no font or image
fetched from anywhere) that polls ``/api/status`` every 2 s. The numbers come from the frontier
through :func:`idemcrawl.status.status_dict`, the same function behind ``status --json``, so the
page agrees with the command line and is true across every process crawling the database. The
throughput chart needs history a database read does not give, so the server samples the
frontier's counters every 2 s into a ring buffer and serves the rates with each status.

Safety, because the page shows text that crawled servers chose (error messages, host names):
everything is inserted with ``textContent``, never as HTML; a Content-Security-Policy allows only
the page's own inline script and style (by hash) and requests to itself; and requests whose
``Host`` header is not a loopback name are refused, so a web page that rebinds its DNS name to
127.0.0.1 cannot read the crawl's state through the visitor's browser.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import ipaddress
import itertools
import json
import math
import signal
import sys
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from .frontier import FrontierError, open_frontier
from .status import status_dict

__all__ = [
    "DashboardState",
    "make_app",
    "read_dashboard",
    "serve",
]

SAMPLE_SECONDS = 2.0
#: 30 minutes of 2-second samples: the chart's time span, and a bounded memory cost.
HISTORY = 900
#: How many rows the host and error tables show (the page must stay small for 100k hosts).
TOP = 10
STATUS_CLASSES = ("2xx", "3xx", "304", "4xx", "429", "5xx")
_LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})


def _is_loopback(host: str) -> bool:
    if host.lower() in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _host_of(header: str) -> str:
    """The host name of a ``Host`` header: ``[::1]:80`` -> ``::1``, ``a:80`` -> ``a``."""
    if header.startswith("["):
        return header[1:].partition("]")[0]
    return header.rpartition(":")[0] if header.count(":") == 1 else header


def _finite(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def read_dashboard(db: str, now: float | None = None) -> dict[str, Any]:
    """One read of everything the page shows (blocking: call it from a thread).

    ``status`` is ``status_dict(db)`` minus ``host_states`` (which may list 100k hosts); the
    hosts the page shows are picked here: the slowest by ``latency_ewma`` and those in back-off.
    """
    now = time.time() if now is None else now
    f = open_frontier(db, create=False)
    try:
        status = status_dict(f, db)  # the same numbers as `status --json`
        stats = f.stats()
        recent_fn = getattr(f, "recent_errors", None)
        recent = list(recent_fn(TOP)) if recent_fn is not None else None
    finally:
        f.close()
    counters = {k: int(v) for k, v in stats.counters.items()}
    hosts: list[dict[str, Any]] = status.pop("host_states")
    slim = [
        "host_key",
        "queued",
        "in_flight",
        "latency_ewma",
        "delay",
        "error_streak",
        "backoff_until",
        "backoff_reason",
        "robots_state",
        "robots_age_s",
    ]
    timed = [h for h in hosts if h.get("latency_ewma") is not None]
    slowest = sorted(timed, key=lambda h: h["latency_ewma"], reverse=True)[:TOP]
    backoff = sorted(
        (h for h in hosts if h.get("in_backoff")), key=lambda h: h["backoff_until"], reverse=True
    )
    host_errors = [
        {
            "host_key": h["host_key"],
            "error": h.get("robots_last_error") or h.get("backoff_reason") or "",
            "deferred": h.get("deferred_reason"),
        }
        for h in hosts
        if h.get("robots_last_error") or h.get("deferred_reason") or h.get("backoff_reason")
    ][:TOP]
    return {
        "generated_at": now,
        "status": status,
        "host_states_total": len(hosts),
        "counters": counters,
        # A list, not an object: JavaScript orders integer-like keys ("304") first.
        "status_classes": [[c, counters.get(f"status_{c}", 0)] for c in STATUS_CLASSES],
        "status_classes_counted": any(f"status_{c}" in counters for c in STATUS_CLASSES),
        "paused": stats.meta.get("paused") == "1",
        "traps": {
            "budget_exhausted": counters.get("budget_exhausted", 0),
            "template_paused": counters.get("template_paused", 0),
            "urls_rejected": status["urls"].get("rejected", 0),
            "links_rejected": status["links_rejected"],
        },
        "slowest_hosts": [{k: _finite(h.get(k)) for k in slim} for h in slowest],
        "backoff_hosts": [{k: _finite(h.get(k)) for k in slim} for h in backoff[:TOP]],
        "backoff_hosts_total": len(backoff),
        "recent_errors": recent,
        "host_errors": host_errors,
    }


@dataclass(slots=True)
class DashboardState:
    """The server's memory: the counter samples for the chart and the last read, shared."""

    db: str
    sample_seconds: float = SAMPLE_SECONDS
    cache_seconds: float = 1.0
    samples: deque[tuple[float, int, int]] = field(default_factory=lambda: deque(maxlen=HISTORY))
    last: dict[str, Any] | None = None
    last_at: float = -math.inf
    error: str | None = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    async def read(self, *, force: bool = False) -> dict[str, Any]:
        """The latest read, at most ``cache_seconds`` old (many tabs cost one read)."""
        async with self.lock:
            if force or self.last is None or time.monotonic() - self.last_at >= self.cache_seconds:
                try:
                    self.last = await asyncio.to_thread(read_dashboard, self.db)
                    self.error = None
                except Exception as exc:  # shown on the page; the next poll tries again
                    self.error = f"cannot read {self.db}: {' '.join(str(exc).split())}"
                    self.last = None
                self.last_at = time.monotonic()
            if self.last is None:
                raise FrontierError(self.error or "no data")
            return self.last

    def add_sample(self, data: Mapping[str, Any]) -> None:
        c = data["counters"]
        self.samples.append(
            (float(data["generated_at"]), c.get("fetches", 0), c.get("bytes_fetched", 0))
        )

    def series(self) -> list[dict[str, float]]:
        """Rates between consecutive samples (a counter reset, e.g. a new database, is 0)."""
        out = []
        pts = list(self.samples)
        for (t0, f0, b0), (t1, f1, b1) in itertools.pairwise(pts):
            dt = t1 - t0
            if dt <= 0:
                continue
            out.append(
                {
                    "t": t1,
                    "fetches_per_s": max(0, f1 - f0) / dt,
                    "bytes_per_s": max(0, b1 - b0) / dt,
                }
            )
        return out


_STATE = web.AppKey("dashboard", DashboardState)


async def _sample_forever(state: DashboardState) -> None:
    while True:
        with contextlib.suppress(FrontierError):
            state.add_sample(await state.read(force=True))
        await asyncio.sleep(state.sample_seconds)


async def _sampler(app: web.Application) -> AsyncIterator[None]:
    task = asyncio.create_task(_sample_forever(app[_STATE]))
    yield
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


@web.middleware
async def _loopback_only(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """Refuse a Host header that is not loopback (DNS rebinding) and any writing method."""
    if not _is_loopback(_host_of(request.host)):
        return web.Response(status=403, text="this dashboard answers only to loopback names\n")
    if request.method not in ("GET", "HEAD"):
        return web.Response(status=405, text="the dashboard is read-only\n")
    return await handler(request)


async def _index(request: web.Request) -> web.Response:
    return web.Response(text=PAGE, content_type="text/html", headers=_PAGE_HEADERS)


async def _api_status(request: web.Request) -> web.Response:
    state = request.app[_STATE]
    try:
        data = await state.read()
    except FrontierError as exc:
        body = {"error": str(exc), "samples": state.series()}
        return web.json_response(body, status=503, headers={"Cache-Control": "no-store"})
    body = {**data, "samples": state.series(), "sample_seconds": state.sample_seconds}
    return web.Response(
        text=json.dumps(body, allow_nan=False, default=str),
        content_type="application/json",
        headers={"Cache-Control": "no-store"},
    )


async def make_app(db: str, *, sample_seconds: float = SAMPLE_SECONDS) -> web.Application:
    """The dashboard application for crawl ``db``; raises FrontierError if there is no crawl."""

    def check() -> None:
        open_frontier(db, create=False).close()

    await asyncio.to_thread(check)
    app = web.Application(middlewares=[_loopback_only])
    app[_STATE] = DashboardState(db, sample_seconds=sample_seconds)
    app.router.add_get("/", _index)
    app.router.add_get("/api/status", _api_status)
    app.cleanup_ctx.append(_sampler)
    return app


def serve(
    db: str,
    port: int,
    host: str = "127.0.0.1",
    *,
    ready: Callable[[str], None] | None = None,
) -> None:
    """Serve the dashboard until SIGINT/SIGTERM; ``ready`` gets the page URL once listening.

    Only loopback addresses are accepted: the page is unauthenticated and shows what the
    crawl is doing, which is nobody else's business.
    """
    if not _is_loopback(host):
        raise ValueError(f"the dashboard listens on loopback only, not {host!r}")
    if not 0 <= port <= 65535:
        raise ValueError(f"port must be 0..65535, not {port}")
    announce = ready or (lambda url: print(f"dashboard at {url} (Ctrl-C stops)", file=sys.stderr))
    asyncio.run(_serve(db, port, host, announce))


async def _serve(db: str, port: int, host: str, ready: Callable[[str], None]) -> None:
    runner = web.AppRunner(await make_app(db), access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port)
        try:
            await site.start()
        except OSError as exc:
            raise OSError(f"cannot serve the dashboard on {host}:{port}: {exc.strerror}") from exc
        bound = runner.addresses[0][1]
        name = f"[{host}]" if ":" in host else host
        ready(f"http://{name}:{bound}/")
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.add_signal_handler(sig, stop.set)
        await stop.wait()
    finally:
        await runner.cleanup()


_CSS = """
*{box-sizing:border-box}
body{margin:0;font:14px/1.4 system-ui,-apple-system,"Segoe UI",sans-serif;background:#f4f5f7;
color:#1d2330}
header{display:flex;align-items:center;gap:14px;padding:10px 18px;background:#1d2330;color:#fff}
header h1{font-size:17px;margin:0;font-weight:600}
header .db{opacity:.75;font-family:ui-monospace,monospace;font-size:12px}
header .right{margin-left:auto;font-size:12px;opacity:.85}
.pill{padding:2px 9px;border-radius:10px;font-size:12px;font-weight:600;background:#6b7280}
.pill.running{background:#2563eb}.pill.finished{background:#16a34a}
.pill.paused{background:#d97706}.pill.error{background:#dc2626}
main{padding:12px 18px;display:grid;gap:12px}
.tiles{display:grid;grid-template-columns:repeat(8,1fr);gap:8px}
.tile{background:#fff;border-radius:6px;padding:7px 10px;box-shadow:0 1px 2px #0001}
.tile .v{font-size:19px;font-weight:600;font-variant-numeric:tabular-nums}
.tile .l{font-size:11px;color:#5b6475;text-transform:uppercase;letter-spacing:.03em}
.tile.bad .v{color:#dc2626}.tile.good .v{color:#16a34a}
.row{display:grid;gap:12px}.r3{grid-template-columns:1fr 1fr 1fr}.r2{grid-template-columns:1fr 1fr}
.card{background:#fff;border-radius:6px;padding:9px 12px;box-shadow:0 1px 2px #0001;min-width:0}
.card h2{font-size:13px;margin:0 0 6px;color:#394154}
table{border-collapse:collapse;width:100%;font-size:12px;font-variant-numeric:tabular-nums}
td,th{padding:2px 6px;text-align:left;border-bottom:1px solid #eef0f3;white-space:nowrap;
overflow:hidden;text-overflow:ellipsis;max-width:380px}
th{color:#5b6475;font-weight:500}td.n{text-align:right}
.bar{height:9px;background:#2563eb;border-radius:2px;min-width:1px}
.charts{display:grid;grid-template-columns:1fr 1fr;gap:12px}
svg{width:100%;height:120px;display:block}
.muted{color:#7b8494;font-size:12px}
#banner{display:none;background:#fee2e2;color:#991b1b;padding:6px 18px}
"""

_JS = """
"use strict";
const nf = new Intl.NumberFormat("en-US");
const $ = (id) => document.getElementById(id);
function fmt(v, digits) {
  if (v === null || v === undefined) return "-";
  if (typeof v === "number") {
    return digits === undefined ? nf.format(v) : v.toFixed(digits);
  }
  return String(v);
}
function bytes(n) {
  const u = ["B", "KiB", "MiB", "GiB"];
  let i = 0;
  while (n >= 1024 && i < u.length - 1) { n /= 1024; i++; }
  return (i ? n.toFixed(1) : n.toFixed(0)) + " " + u[i];
}
function setK(key, value, digits) {
  for (const el of document.querySelectorAll('[data-k="' + key + '"]')) {
    el.textContent = fmt(value, digits);
    el.dataset.v = value === null || value === undefined ? "" : String(value);
  }
}
function el(tag, text, cls) {
  const e = document.createElement(tag);
  if (text !== undefined) e.textContent = text;
  if (cls) e.className = cls;
  return e;
}
function table(id, head, rows, empty) {
  const t = $(id);
  t.replaceChildren();
  const tr = el("tr");
  for (const h of head) tr.append(el("th", h));
  t.append(tr);
  if (!rows.length) {
    const r = el("tr"); const c = el("td", empty, "muted"); c.colSpan = head.length;
    r.append(c); t.append(r); return;
  }
  for (const row of rows) {
    const r = el("tr");
    for (const cell of row) {
      const c = el("td", typeof cell === "number" ? fmt(cell) : (cell ?? "-"));
      if (typeof cell === "number") c.className = "n";
      r.append(c);
    }
    t.append(r);
  }
}
function chart(id, pts, key, label, fmtv) {
  const svg = $(id);
  svg.replaceChildren();
  const W = 600, H = 120, P = 4;
  const NS = "http://www.w3.org/2000/svg";
  const vals = pts.map((p) => p[key]);
  const max = Math.max(1e-9, ...vals);
  const t0 = pts.length ? pts[0].t : 0, t1 = pts.length ? pts[pts.length - 1].t : 1;
  const x = (t) => P + ((t - t0) / Math.max(1e-9, t1 - t0)) * (W - 2 * P);
  const y = (v) => H - P - (v / max) * (H - 2 * P - 14);
  const grid = document.createElementNS(NS, "line");
  for (const [a, b] of [["x1", P], ["x2", W - P], ["y1", H - P], ["y2", H - P]]) {
    grid.setAttribute(a, b);
  }
  grid.setAttribute("stroke", "#c9ced8");
  svg.append(grid);
  if (pts.length > 1) {
    const line = document.createElementNS(NS, "polyline");
    line.setAttribute("points", pts.map((p) => x(p.t).toFixed(1) + "," + y(p[key]).toFixed(1))
      .join(" "));
    line.setAttribute("fill", "none");
    line.setAttribute("stroke", key === "bytes_per_s" ? "#9333ea" : "#2563eb");
    line.setAttribute("stroke-width", "2");
    svg.append(line);
  }
  const txt = document.createElementNS(NS, "text");
  txt.setAttribute("x", P + 2); txt.setAttribute("y", 13);
  txt.setAttribute("font-size", "12"); txt.setAttribute("fill", "#394154");
  const last = vals.length ? vals[vals.length - 1] : 0;
  const span = pts.length > 1 ? Math.round(t1 - t0) + " s" : "collecting samples";
  txt.textContent = label + ": now " + fmtv(last) + ", peak " + fmtv(vals.length ? max : 0) +
    " (last " + span + ")";
  svg.append(txt);
}
function render(d) {
  const s = d.status;
  const u = s.urls;
  const active = (u.queued || 0) + (u.leased || 0);
  const pill = $("state");
  const st = d.paused ? "paused" : active ? "running" : "finished";
  pill.textContent = st; pill.className = "pill " + st;
  $("db").textContent = s.db;
  $("updated").textContent = "updated " + new Date(d.generated_at * 1000).toLocaleTimeString();
  setK("urls_total", s.urls_total);
  for (const k of Object.keys(u)) setK("urls." + k, u[k]);
  setK("records", s.records);
  setK("events", s.events);
  setK("requests", s.requests);
  setK("requests_per_record", s.requests_per_record, 2);
  setK("fetch_errors", s.fetch_errors);
  setK("hosts", s.hosts);
  setK("hosts_in_backoff", s.hosts_in_backoff);
  setK("politeness.violations", s.politeness.violations);
  setK("politeness.grants", s.politeness.grants);
  const ed = s.politeness.eligibility_delay_s;
  setK("politeness.eligibility_delay_s.p50", ed.p50, 3);
  setK("politeness.eligibility_delay_s.p99", ed.p99, 3);
  $("viol").className = "tile " + (s.politeness.violations ? "bad" : "good");
  setK("lease_expiries", s.lease_expiries);
  setK("counters.bytes_fetched", d.counters.bytes_fetched ?? 0);
  $("bytes").textContent = bytes(d.counters.bytes_fetched ?? 0);
  const pts = d.samples || [];
  chart("chart-f", pts, "fetches_per_s", "fetches/s", (v) => v.toFixed(1));
  chart("chart-b", pts, "bytes_per_s", "bytes/s", (v) => bytes(v) + "/s");
  const sc = d.status_classes;
  const total = Math.max(1, ...sc.map((p) => p[1]));
  const rows = $("classes"); rows.replaceChildren();
  for (const [k, v] of sc) {
    const r = el("tr"); r.append(el("th", k));
    const n = el("td", fmt(v), "n"); n.dataset.k = "status_classes." + k; n.dataset.v = v;
    r.append(n);
    const b = el("td"); const bar = el("div", undefined, "bar");
    bar.style.width = (100 * v / total).toFixed(1) + "%"; b.append(bar); b.style.width = "60%";
    r.append(b); rows.append(r);
  }
  $("classes-note").textContent = d.status_classes_counted ? "" :
    "this database does not count status classes yet";
  table("states", ["state", "URLs"], Object.entries(u), "no URLs");
  const tr = d.traps;
  const trapRows = [["daily budget triggers", tr.budget_exhausted],
    ["template pauses", tr.template_paused], ["URLs rejected", tr.urls_rejected]];
  for (const [k, v] of Object.entries(tr.links_rejected)) trapRows.push(["links refused: " + k, v]);
  table("traps", ["trigger", "count"], trapRows, "none");
  table("slow", ["host", "latency ms", "queued", "in flight"],
    d.slowest_hosts.map((h) => [h.host_key, Math.round(h.latency_ewma * 1000), h.queued,
      h.in_flight]), "no host answered yet");
  const now = d.generated_at;
  table("backoff", ["host", "reason", "for s", "errors"],
    d.backoff_hosts.map((h) => [h.host_key, h.backoff_reason || "-",
      Math.max(0, Math.round(h.backoff_until - now)), h.error_streak]), "no host backing off");
  if (d.recent_errors) {
    table("errors", ["when", "URL", "status", "error"], d.recent_errors.map((e) => [
      e.fetched_at ? new Date(e.fetched_at * 1000).toLocaleTimeString() : "-", e.url,
      e.status_code ?? "-", e.last_error ?? "-"]), "no errors");
    $("errors-note").textContent = "";
  } else {
    table("errors", ["host", "error", "deferred"], d.host_errors.map((e) => [e.host_key,
      e.error || "-", e.deferred || "-"]), "no host errors");
    $("errors-note").textContent =
      "per-URL errors need a newer frontier; showing host-level errors";
  }
}
async function poll() {
  try {
    const r = await fetch("/api/status", {cache: "no-store"});
    const d = await r.json();
    if (!r.ok) throw new Error(d.error || r.statusText);
    render(d);
    $("banner").style.display = "none";
  } catch (e) {
    $("banner").textContent = "cannot read the crawl: " + e.message;
    $("banner").style.display = "block";
    $("state").textContent = "error"; $("state").className = "pill error";
  }
  setTimeout(poll, 2000);
}
poll();
"""

_BODY = """
<header><h1>idemcrawl</h1><span class="db" id="db"></span>
<span class="pill" id="state">loading</span><span class="right" id="updated"></span></header>
<div id="banner"></div>
<main>
<div class="tiles">
<div class="tile"><div class="v" data-k="urls_total">-</div><div class="l">URLs known</div></div>
<div class="tile"><div class="v" data-k="urls.done">-</div><div class="l">done</div></div>
<div class="tile"><div class="v" data-k="urls.queued">-</div><div class="l">queued</div></div>
<div class="tile"><div class="v" data-k="urls.leased">-</div><div class="l">in flight</div></div>
<div class="tile"><div class="v" data-k="records">-</div><div class="l">records</div></div>
<div class="tile"><div class="v" data-k="requests">-</div><div class="l">requests</div></div>
<div class="tile"><div class="v" data-k="requests_per_record">-</div>
<div class="l">requests / record</div></div>
<div class="tile"><div class="v" id="bytes" data-k="counters.bytes_fetched">-</div>
<div class="l">body bytes</div></div>
<div class="tile" id="viol"><div class="v" data-k="politeness.violations">-</div>
<div class="l">politeness violations</div></div>
<div class="tile"><div class="v" data-k="politeness.grants">-</div><div class="l">leases</div></div>
<div class="tile"><div class="v" data-k="politeness.eligibility_delay_s.p50">-</div>
<div class="l">eligibility delay p50 s</div></div>
<div class="tile"><div class="v" data-k="politeness.eligibility_delay_s.p99">-</div>
<div class="l">eligibility delay p99 s</div></div>
<div class="tile"><div class="v" data-k="hosts">-</div><div class="l">hosts</div></div>
<div class="tile"><div class="v" data-k="hosts_in_backoff">-</div>
<div class="l">hosts backing off</div></div>
<div class="tile"><div class="v" data-k="fetch_errors">-</div>
<div class="l">fetch errors</div></div>
<div class="tile"><div class="v" data-k="lease_expiries">-</div>
<div class="l">lease expiries</div></div>
</div>
<div class="card"><h2>Throughput (all crawl processes)</h2><div class="charts">
<svg id="chart-f" viewBox="0 0 600 120" preserveAspectRatio="none"></svg>
<svg id="chart-b" viewBox="0 0 600 120" preserveAspectRatio="none"></svg></div></div>
<div class="row r3">
<div class="card"><h2>Status classes</h2><table id="classes"></table>
<div class="muted" id="classes-note"></div></div>
<div class="card"><h2>URLs by state</h2><table id="states"></table></div>
<div class="card"><h2>Trap triggers</h2><table id="traps"></table></div>
</div>
<div class="row r2">
<div class="card"><h2>Slowest hosts</h2><table id="slow"></table></div>
<div class="card"><h2>Hosts in back-off</h2><table id="backoff"></table></div>
</div>
<div class="card"><h2>Recent errors</h2><table id="errors"></table>
<div class="muted" id="errors-note"></div></div>
</main>
"""


def _csp_hash(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


PAGE = (
    '<!doctype html>\n<html lang="en"><head><meta charset="utf-8">\n'
    '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
    "<title>idemcrawl dashboard</title>\n"
    f"<style>{_CSS}</style></head>\n<body>{_BODY}<script>{_JS}</script></body></html>\n"
)

_PAGE_HEADERS = {
    # Only this page's own script and style run, and it may talk to no one but this server.
    "Content-Security-Policy": (
        f"default-src 'none'; script-src {_csp_hash(_JS)}; style-src {_csp_hash(_CSS)}; "
        "connect-src 'self'; img-src 'self' data:; base-uri 'none'; "
        "form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
