"""End to end: conditional recrawl (R13, R16), redirects (R14), tombstones (R15) and hostile
responses (R17, R18) against the hostile test site, with WARC output checked by both readers."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest

from idemcrawl import Spider
from idemcrawl.engine import Engine, run_crawl
from idemcrawl.frontier.sqlite import SQLiteFrontier
from idemcrawl.lab.testsite.hostile import CHAIN_HOPS, HostileSite
from idemcrawl.warc import verify_directory

from .conftest import crawl_config
from .helpers import spawn_python


class NoLinks(Spider):
    """Stores nothing and follows nothing: the seeds are the whole crawl."""

    name = "nolinks"

    def parse(self, page: object) -> list[object]:
        return []


NO_LINKS = "tests.test_recrawl_crawl:NoLinks"


class FakeClock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def _run_for(cfg: object, seconds: float) -> object:
    engine = Engine(cfg)  # type: ignore[arg-type]

    async def main() -> object:
        asyncio.get_running_loop().call_later(seconds, engine.stop, "test")
        return await engine.run()

    return asyncio.run(main())


@pytest.mark.slow
def test_recrawl_sends_conditional_requests_and_indexes_only_changes(tmp_path: Path) -> None:
    clock = FakeClock()
    with HostileSite(period=100, changing=3, static=3, clock=clock) as site:
        seeds = [f"{site.base_url}/changing/{n}" for n in range(3)]
        seeds += [f"{site.base_url}/static/{n}" for n in range(3)]
        db = tmp_path / "c.db"
        cfg = crawl_config(
            db, seeds[0], seeds=tuple(seeds), spider=NO_LINKS, recrawl_min=0.4, recrawl_max=3.0
        )
        first = run_crawl(cfg)
        assert first.finished and first.fetched == 7  # robots.txt + 6 pages
        f = SQLiteFrontier(str(db))
        assert f.stats().events == 6
        f.close()
        clock.now += 100  # every /changing page has a new version now
        second_cfg = crawl_config(
            db,
            seeds[0],
            seeds=tuple(seeds),
            spider=NO_LINKS,
            recrawl=True,
            recrawl_min=0.4,
            recrawl_max=3.0,
        )
        _run_for(second_cfg, 4.0)
        counts = site.counters()
    f = SQLiteFrontier(str(db))
    stats = f.stats()
    rows = {u: f.url_row(u) for u in seeds}
    f.close()
    for n in range(3):
        static = counts[f"/static/{n}"]
        assert static.get("200") == 1, static  # one body, then only revalidations
        assert static.get("304", 0) >= 2, static
        changing = counts[f"/changing/{n}"]
        assert changing.get("200") == 2, changing  # the first fetch and the changed version
    # Exactly one new index event per changed page, none for the 304s.
    assert stats.events == 6 + 3
    assert stats.counters["status_304"] >= 6
    assert stats.counters["pages_changed"] == 3
    for u in seeds:
        row = rows[u]
        assert row["version"] >= 3  # several rounds, each a new version
        assert row["etag"]
        assert row["status_code"] == 200  # a 304 keeps the stored status and hash
    # Unchanged pages back off towards the maximum; changed ones were pulled back to the floor.
    static_interval = rows[seeds[3]]["revisit_interval"]
    assert static_interval >= 1.6
    # 304s stored no body: the archive holds 10 response records (robots.txt, 6 pages and 3
    # changes) and revisits.
    report = verify_directory(str(db) + ".warc")
    assert report["errors"] == []
    assert report["records"]["response"] == 10
    assert report["records"]["revisit"] >= 6


_CRAWL_HOSTILE = """
import json, sys
from idemcrawl.config import CrawlConfig
from idemcrawl.engine import run_crawl
from idemcrawl.fetch import parse_allow_list
from idemcrawl.lab.testsite.hostile import hostile_resolver
cfg = CrawlConfig(
    db=sys.argv[1], seeds=(sys.argv[2],), concurrency=8, host_concurrency=4, delay=0.0,
    allow_private=parse_allow_list(["127.0.0.1"]), parse_workers=1, total_timeout=3.0,
    read_timeout=2.0, max_retries=0, scope="any",
)
s = run_crawl(cfg, resolver=hostile_resolver())
print(json.dumps({"finished": s.finished, "fetched": s.fetched}))
"""


def _peak_rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return 0.0


@pytest.mark.slow
def test_hostile_site_is_crawled_with_every_cut_recorded(tmp_path: Path) -> None:
    db = tmp_path / "h.db"
    with HostileSite(trickle_interval=0.5) as site:
        proc = spawn_python(
            _CRAWL_HOSTILE, str(db), site.seed_url, env={"PYTHONUNBUFFERED": "1"}
        )
        peak = 0.0
        deadline = time.monotonic() + 90
        while proc.poll() is None and time.monotonic() < deadline:
            try:
                peak = max(peak, _peak_rss_mb(proc.pid))
            except OSError:
                break
            time.sleep(0.05)
        out, err = proc.communicate(timeout=30)
        counts = site.counters()
        base = site.base_url
        port = site.port
    assert proc.returncode == 0, err
    assert json.loads(out.strip().splitlines()[-1])["finished"]
    # The crawler's own peak (1 GiB bombs, a 100 MB page) stays far below 300 MB.
    assert 0 < peak < 300, peak
    f = SQLiteFrontier(str(db))
    row = f.url_row
    assert row(f"{base}/bomb.html")["last_error"] == "cut: max_decompressed_bytes"
    assert row(f"{base}/big.html")["last_error"] == "cut: max_bytes"
    assert row(f"{base}/trickle.html")["last_error"].startswith("cut: ")
    # The 7-hop chain is followed for 5 hops, then cut and recorded.
    assert counts.get(f"/redirect/chain/{CHAIN_HOPS - 5}") is not None
    assert f"/redirect/chain/{CHAIN_HOPS - 6}" not in counts
    assert "/redirect/end" not in counts
    cut = row(f"{base}/redirect/chain/{CHAIN_HOPS - 5}")
    assert cut["last_error"] == "redirect chain longer than 5 hops"
    assert row(f"{base}/redirect/chain/{CHAIN_HOPS}")["redirect_to"].endswith(
        f"/redirect/chain/{CHAIN_HOPS - 1}"
    )
    # The loop: each side fetched once, the loop recorded.
    assert sum(counts["/redirect/loop/a"].values()) == 1
    assert sum(counts["/redirect/loop/b"].values()) == 1
    assert "redirect loop" in row(f"{base}/redirect/loop/b")["last_error"]
    # Tombstones wait the long interval.
    for code in (404, 410):
        r = row(f"{base}/gone/{code}")
        assert r["state"] == "done" and r["status_code"] == code
        assert r["revisit_interval"] == 30 * 86_400
    # SSRF bait (scope "any" lets the crawl try): refused without a connection; the hosts'
    # robots.txt cannot be fetched, so their pages are deferred with the reason.
    for bait in ("http://metadata.test/", "http://internal.test/", f"http://127.0.0.2:{port}/x"):
        r = row(bait)
        assert r is not None and r["state"] in ("deferred", "failed"), r
        assert "refused" in (r["reason"] or r["last_error"] or ""), r
    assert not any(p == "/x" for p in counts)  # nothing reached the 127.0.0.2 listener
    stats = f.stats()
    f.close()
    assert stats.counters["redirect_loops"] == 1
    assert stats.counters["redirects_too_long"] == 1
    assert stats.counters["cut_max_decompressed_bytes"] >= 1
    assert verify_directory(str(db) + ".warc")["errors"] == []
