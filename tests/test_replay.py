"""Archives that replay (#18, R20): pywb indexes a crawl's WARC files and serves each page's own
response for its URL; robots.txt is archived too; ``--requisites`` archives what pages render
with. pywb runs as its own server process on a loopback port, as an operator would run it."""

from __future__ import annotations

import functools
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from aiohttp import web
from warcio.archiveiterator import ArchiveIterator

from idemcrawl.engine import run_crawl
from idemcrawl.fetch import parse_allow_list
from idemcrawl.frontier import open_frontier
from idemcrawl.lab.testsite import ShopConfig, ShopServer
from idemcrawl.lab.testsite.server import AppServer

from .conftest import crawl_config
from .frontier.conftest import in_ci

#: pywb lives in a virtual environment of its own: it needs ``brotlipy``, whose ``brotli`` module
#: would shadow the ``brotli`` the crawler decodes with. Made once per machine (the first run
#: installs it from PyPI, ~30 s), reused after; ``IDEMCRAWL_PYWB_VENV`` names another place.
PYWB_VENV = Path(
    os.environ.get("IDEMCRAWL_PYWB_VENV") or Path(tempfile.gettempdir()) / "idemcrawl-pywb-venv"
)


@functools.cache
def _pywb_bin() -> Path | str:
    """The pywb venv's bin directory, or why it could not be made."""
    bin_dir = PYWB_VENV / "bin"
    if (bin_dir / "wayback").exists() and (bin_dir / "wb-manager").exists():
        return bin_dir
    try:
        subprocess.run(
            [sys.executable, "-m", "venv", "--clear", str(PYWB_VENV)], check=True, timeout=120
        )
        subprocess.run(
            [str(bin_dir / "pip"), "install", "-q", "pywb>=2.8"],
            check=True,
            timeout=900,
            capture_output=True,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return f"could not install pywb into {PYWB_VENV}: {exc}"
    return bin_dir


def pywb_bin() -> Path:
    found = _pywb_bin()
    if isinstance(found, Path):
        return found
    if in_ci():
        pytest.fail(f"CI must run the replay tests: {found}", pytrace=False)
    pytest.skip(found)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def pywb(warcs: list[Path], work: Path) -> Iterator[str]:
    """A pywb collection of ``warcs`` served on a loopback port; yields the collection URL."""
    bin_dir = pywb_bin()
    manager, wayback = bin_dir / "wb-manager", bin_dir / "wayback"
    subprocess.run([str(manager), "init", "crawl"], cwd=work, check=True, capture_output=True)
    subprocess.run(
        [str(manager), "add", "crawl", *map(str, warcs)],
        cwd=work,
        check=True,
        capture_output=True,
    )
    port = _free_port()
    proc = subprocess.Popen(
        [str(wayback), "-p", str(port), "-b", "127.0.0.1"],
        cwd=work,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    base = f"http://127.0.0.1:{port}/crawl"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2).close()
                break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                if time.monotonic() > deadline or proc.poll() is not None:
                    err = proc.stderr.read().decode() if proc.stderr else ""
                    pytest.fail(f"pywb did not start: {err[-2000:]}")
                time.sleep(0.1)
        yield base
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def replay(base: str, url: str, fetched_at: float) -> tuple[int, bytes, str]:
    stamp = time.strftime("%Y%m%d%H%M%S", time.gmtime(fetched_at))
    try:
        with urllib.request.urlopen(f"{base}/{stamp}id_/{url}", timeout=10) as resp:
            return resp.status, resp.read(), resp.headers.get("content-type", "")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(), ""


def warc_records(directory: Path) -> list[tuple[str, str]]:
    out = []
    for path in sorted(directory.glob("*.warc.gz")):
        with path.open("rb") as fh:
            for rec in ArchiveIterator(fh):
                out.append((rec.rec_type, rec.rec_headers.get_header("WARC-Target-URI") or ""))
    return out


@pytest.mark.slow
def test_pywb_replays_every_sampled_page_and_robots_txt(tmp_path: Path) -> None:
    with ShopServer(ShopConfig(listings=4, per_page=10)) as shop:
        db = tmp_path / "c.db"
        summary = run_crawl(crawl_config(db, shop.seed_url))
        assert summary.finished and summary.complete
        f = open_frontier(str(db))
        pages = [u for u in f.url_rows() if u["kind"] == "page" and u["state"] == "done"]
        robots = next(u for u in f.url_rows() if u["kind"] == "robots")
        f.close()
        live = {u["url"]: urllib.request.urlopen(u["url"]).read() for u in pages}
    warc_dir = Path(f"{db}.warc")
    records = warc_records(warc_dir)
    assert ("response", robots["url"]) in records  # robots.txt is archived like any exchange
    assert len(pages) == 44
    sample = random.Random(18).sample(pages, 20)
    with pywb(sorted(warc_dir.glob("*.warc.gz")), tmp_path) as base:
        for u in sample:
            status, body, ctype = replay(base, u["url"], u["fetched_at"])
            assert status == 200, (u["url"], body[:300])
            assert body == live[u["url"]], u["url"]  # the page, not its metadata record
            assert ctype.startswith("text/html")
        # robots.txt replays as the crawler was answered (the shop has none: 404).
        status, body, _ = replay(base, robots["url"], robots["fetched_at"])
        assert status == robots["status_code"] == 404


ASSETS = {
    "/style.css": (b"body { color: #333 }\n", "text/css"),
    "/app.js": (b"console.log('hi')\n", "application/javascript"),
    "/logo.png": (b"\x89PNG\r\n\x1a\nfake", "image/png"),
    "/big.png": (b"\x89PNG\r\n\x1a\nbig", "image/png"),
}


def _site(cdn: str) -> web.Application:
    async def page(request: web.Request) -> web.Response:
        n = int(request.match_info["n"])
        nxt = f'<a href="/p/{n + 1}">next</a>' if n < 3 else ""
        html = (
            '<html><head><link rel="stylesheet" href="/style.css">'
            '<link rel="alternate" href="/feed.xml"><script src="/app.js"></script></head>'
            f'<body><img src="/logo.png" srcset="/logo.png 1x, /big.png 2x">'
            f'<img src="{cdn}/shared.png"><p>page {n}</p>{nxt}</body></html>'
        )
        return web.Response(text=html, content_type="text/html")

    async def asset(request: web.Request) -> web.Response:
        body, ctype = ASSETS[request.path]
        return web.Response(body=body, content_type=ctype)

    app = web.Application()
    app.router.add_get("/p/{n}", page)
    for path in ASSETS:
        app.router.add_get(path, asset)
    return app


def _cdn() -> web.Application:
    async def shared(request: web.Request) -> web.Response:
        return web.Response(body=b"\x89PNG\r\n\x1a\ncdn", content_type="image/png")

    app = web.Application()
    app.router.add_get("/shared.png", shared)
    return app


@pytest.mark.slow
def test_requisites_are_fetched_archived_and_replayed_only_when_asked(tmp_path: Path) -> None:
    with AppServer(_cdn, host="127.0.0.2") as cdn, AppServer(lambda: _site(cdn.base_url)) as site:
        plain = tmp_path / "plain.db"
        run_crawl(crawl_config(plain, f"{site.base_url}/p/0", spider=None))
        with_req = tmp_path / "req.db"
        cfg = crawl_config(
            with_req,
            f"{site.base_url}/p/0",
            spider=None,
            requisites=True,
            allow_private=parse_allow_list(["127.0.0.1", "127.0.0.2"]),
        )
        summary = run_crawl(cfg)
        assert summary.complete
        site_url, cdn_url = site.base_url, cdn.base_url
    plain_uris = {u for t, u in warc_records(Path(f"{plain}.warc")) if t == "response"}
    assert not any(u.endswith((".css", ".js", ".png")) for u in plain_uris)
    uris = {u for t, u in warc_records(Path(f"{with_req}.warc")) if t == "response"}
    for path in ASSETS:
        assert f"{site_url}{path}" in uris, path
    assert f"{cdn_url}/shared.png" in uris  # another host, under its own robots.txt
    assert f"{cdn_url}/robots.txt" in uris
    assert f"{site_url}/feed.xml" not in uris  # rel=alternate is a link, not a requisite
    f = open_frontier(str(with_req))
    rows = {u["url"]: u for u in f.url_rows()}
    f.close()
    assert rows[f"{site_url}/style.css"]["kind"] == "requisite"
    assert {rows[f"{site_url}/p/{n}"]["state"] for n in range(4)} == {"done"}
    with pywb(sorted(Path(f"{with_req}.warc").glob("*.warc.gz")), tmp_path) as base:
        css = rows[f"{site_url}/style.css"]
        status, body, ctype = replay(base, css["url"], css["fetched_at"])
        assert status == 200 and body == ASSETS["/style.css"][0] and "css" in ctype
