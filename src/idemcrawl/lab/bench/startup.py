"""``idemcrawl bench startup``: how long a crawl takes to send its first request, and its RSS then.

A crawl's start-up should not grow with the crawl (issue 17): reconciling a frontier of a million
URLs must not mean loading every body digest and SimHash it ever stored. This benchmark builds an
SQLite frontier through the public contract only (``add``, ``lease``, ``complete``), so it keeps
measuring whatever the schema becomes: ``--urls`` URLs on one loopback host, ``--done`` of them
completed with a stored body (payload digest, WARC pointer, SimHash), the rest queued. It then
starts ``idemcrawl crawl`` on that database against a loopback server that notes the moment the
first request arrives and reads the crawl process's RSS (and its children's) from ``/proc`` right
then; the crawl is stopped there. The same is measured on an empty frontier for reference.

Figures are wall seconds from spawning the process (interpreter start and imports included) and
MB of resident memory.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from aiohttp import web

from ...frontier import open_frontier
from ...frontier.base import Completion, HostPolicy, NewURL
from ..testsite.server import AppServer

#: URLs added (and leases completed) per frontier call while building.
BUILD_BATCH = 20_000


@dataclass
class StartupFigures:
    urls: int
    done: int
    build_seconds: float
    db_mb: float
    first_request_s: float
    rss_mb: float
    rss_with_children_mb: float

    def text(self) -> str:
        return (
            f"{self.urls:>10,} URLs ({self.done:,} done): first request after "
            f"{self.first_request_s:.2f} s, RSS {self.rss_mb:.0f} MB "
            f"({self.rss_with_children_mb:.0f} MB with its parser processes); "
            f"database {self.db_mb:.0f} MB, built in {self.build_seconds:.0f} s"
        )


def _rss_kb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _children(pid: int) -> list[int]:
    out: list[int] = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(entry))
    return out


class FirstRequest:
    """A site that answers everything with a small page and notes the first request."""

    def __init__(self) -> None:
        self.pid: int | None = None
        self.at: float | None = None
        self.rss_kb = 0
        self.rss_tree_kb = 0
        self.seen = threading.Event()

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.handle)
        return app

    async def handle(self, request: web.Request) -> web.Response:
        if not self.seen.is_set() and self.pid is not None:
            self.at = time.monotonic()
            pid = self.pid
            self.rss_kb = _rss_kb(pid)
            self.rss_tree_kb = self.rss_kb + sum(_rss_kb(c) for c in _children(pid))
            self.seen.set()
        if request.path == "/robots.txt":
            return web.Response(text="User-agent: *\nAllow: /\n")
        return web.Response(text="<html><body>page</body></html>", content_type="text/html")


def build(db: str, host: str, urls: int, done: int, log: Callable[[str], None]) -> float:
    """An SQLite frontier of ``urls`` URLs on ``host``, ``done`` of them completed with bodies."""
    t0 = time.monotonic()
    rng = random.Random(17)
    frontier = open_frontier(db)
    try:
        now = time.time()
        for start in range(0, urls, BUILD_BATCH):
            end = min(urls, start + BUILD_BATCH)
            frontier.add([NewURL(f"{host}/p{i}", host) for i in range(start, end)], now)
        policy = HostPolicy(max_in_flight=10**9, delay=0.0)
        completed = 0
        while completed < done:
            leases = frontier.lease("build", min(BUILD_BATCH, done - completed), now, 3600, policy)
            if not leases:
                break
            batch = [
                Completion(
                    ls, 200, now, content_hash=f"{ls.url_id:032x}", body_bytes=15_000,
                    next_fetch_at=None, warc_file="build-00000.warc.gz",
                    warc_offset=ls.url_id * 1000, warc_length=900,
                    payload_digest=f"sha1:{ls.url_id:032X}", stored_body=True,
                    simhash=rng.getrandbits(64), latency=0.01,
                )
                for ls in leases
            ]  # fmt: skip
            frontier.complete(batch, now, policy)
            completed += len(batch)
            log(f"built: {completed:,} of {done:,} completed")
    finally:
        frontier.close()
    return time.monotonic() - t0


def measure(db: str, urls: int, done: int, log: Callable[[str], None]) -> StartupFigures:
    site = FirstRequest()
    with AppServer(site.app) as server:
        host = server.base_url
        build_s = build(db, host, urls, done, log) if urls else 0.0
        db_mb = sum(p.stat().st_size for p in Path(db).parent.glob(Path(db).name + "*")) / 2**20
        cmd = [sys.executable, "-m", "idemcrawl", "crawl", f"{host}/", "--db", db,
               "--allow-private", "127.0.0.1", "--quiet"]  # fmt: skip
        t0 = time.monotonic()
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        site.pid = proc.pid
        try:
            if not site.seen.wait(120):
                raise RuntimeError("the crawl sent no request within 120 s")
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    assert site.at is not None
    return StartupFigures(
        urls, done, round(build_s, 1), round(db_mb, 1), round(site.at - t0, 3),
        round(site.rss_kb / 1024, 1), round(site.rss_tree_kb / 1024, 1),
    )  # fmt: skip


def run_startup_bench(
    urls: int, done: int, log: Callable[[str], None] = lambda _: None
) -> list[StartupFigures]:
    """An empty frontier, then one of ``urls`` URLs with ``done`` completed."""
    if not 0 <= done <= urls:
        raise ValueError("--done must be between 0 and --urls")
    out = []
    with tempfile.TemporaryDirectory(prefix="idemcrawl-startup-") as tmp:
        for n, d in ((0, 0), (urls, done)):
            out.append(measure(os.path.join(tmp, f"f{n}.db"), n, d, log))
    return out


def report(figures: list[StartupFigures], as_json: bool) -> str:
    if as_json:
        return json.dumps([asdict(f) for f in figures])
    return "\n".join(f.text() for f in figures)
