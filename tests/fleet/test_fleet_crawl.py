"""``crawl`` processes on a partitioned crawl (3 servers, 8 partitions), end to end: each
given a different server URL of the crawl, one SIGKILLed and restarted. Politeness holds,
every page is fetched once (but those in flight at the kill), one correct record per page,
one event per completed URL version, ownership terms never overlap, and the whole crawl reads
through ``status``, ``export``, ``events``, ``reparse``, ``control``, the dashboard and
the metrics given any one server URL."""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from idemcrawl.fleet.frontier import PartitionedFrontier, init_crawl
from idemcrawl.frontier import open_frontier
from idemcrawl.lab.politeness_check import Allowance, check_log, summarize
from idemcrawl.lab.testsite.multihost import HostSpec, MultiHostServer
from idemcrawl.metrics import read_frontier
from idemcrawl.serve import read_dashboard

from ..helpers import DEVNULL, run_cli, spawn_cli
from .test_partitioned import check_ownership_log

pytestmark = pytest.mark.slow

CONCURRENCY = 4


def _crawl(seeds: list[str], db: str, cfg: Path) -> subprocess.Popen[str]:
    return spawn_cli(
        "crawl",
        *seeds,
        "--db",
        db,
        "--config",
        str(cfg),
        "--spider",
        "idemcrawl.lab.testsite.page_spider:PageSpider",
        "--warc-dir",
        str(cfg.parent / "warc"),
        "--concurrency",
        str(CONCURRENCY),
        "--quiet",
        new_session=True,
        stdout=DEVNULL,
    )


def test_crawl_processes_share_a_partitioned_crawl(
    fleet_servers: list[Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # the crawls' owner slots: none left in /tmp
    dbs = [f"{s.dsn}?schema=fleet_e2e" for s in fleet_servers]
    init = run_cli("db", "init", "--partitions", "8", *(x for d in dbs for x in ("--db", d)))
    assert init.returncode == 0, init.stderr
    assert "8 partitions over 3 servers" in init.stdout
    specs = [HostSpec(name, pages=8) for name in "abcdef"]
    with MultiHostServer(specs) as site:
        cfg = tmp_path / "crawl.toml"
        cfg.write_text(
            'allow_private = ["127.0.0.1"]\ndelay = 0.2\nlease_seconds = 20\nparse_workers = 0\n'
        )
        procs = [_crawl(site.seed_urls, dbs[i], cfg) for i in range(2)]
        time.sleep(1.5)
        os.killpg(procs[0].pid, signal.SIGKILL)
        procs[0].wait()
        procs[0] = _crawl(site.seed_urls, dbs[2], cfg)
        for p in procs:
            _, err = p.communicate(timeout=120)
            assert p.returncode == 0, err
        log = site.request_log()
        allowance = {base: Allowance(1, 0.2) for base in site.base_urls}
        violations = check_log(log, allowance, disallowed_prefixes=site.disallowed_prefixes())
        expected = {
            f"{base}/p/{n}": f"{spec.name}: page {n}"
            for base, spec in zip(site.base_urls, specs, strict=True)
            for n in range(spec.pages)
        }
    assert violations == [], summarize(violations)
    fetched = collections.Counter((e["host"], e["path"]) for e in log)
    twice = sum(n - 1 for n in fetched.values() if n > 1)
    assert twice <= CONCURRENCY  # only what the killed process had in flight
    f = open_frontier(dbs[1], create=False)
    try:
        assert isinstance(f, PartitionedFrontier)
        titles = {r["key"]: json.loads(r["data"])["title"] for r in f.records()}
        assert titles == expected  # exactly one correct record per page, across partitions
        events = list(f.iter_events())
        assert len({(e["url_id"], e["url_version"]) for e in events}) == len(events)
        done_pages = [r for r in f.iter_urls() if r["state"] == "done" and r["kind"] == "page"]
        assert len(events) == len(done_pages) == len(expected)
        assert all(p.outbox_count() == 0 for p in f.parts.values())
        log_rows = f.ownership_log()
        check_ownership_log(log_rows)
        assert len({r["owner"] for r in log_rows}) >= 2  # distinct owner ids per process
    finally:
        f.close()
    # WARC files are per owner slot in the shared directory, and reparse reads them all back.
    warcs = sorted(p.name for p in (tmp_path / "warc").iterdir())
    assert len({w.rsplit("-", 1)[0] for w in warcs}) >= 2, warcs
    reparse = run_cli(
        "reparse",
        "--db",
        dbs[0],
        "--spider",
        "idemcrawl.lab.testsite.page_spider:PageSpider",
        "--warc-dir",
        str(tmp_path / "warc"),
        "--json",
        "--quiet",
    )
    assert reparse.returncode == 0, reparse.stderr
    assert json.loads(reparse.stdout)["pages"] == len(expected)
    status = run_cli("status", "--db", dbs[2], "--json")
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["records"] == len(expected)
    events = run_cli("events", "--db", dbs[1])
    assert events.returncode == 0, events.stderr
    keys = [json.loads(line)["key"] for line in events.stdout.splitlines()]
    assert len(keys) == len(set(keys)) == len(expected)
    dash = read_dashboard(dbs[2])  # serve's page and metrics read the whole crawl too
    assert dash["status"]["records"] == len(expected)
    f = open_frontier(dbs[0], create=False)
    try:
        view = read_frontier(f)
        assert view.audit["violations"] == 0 and view.audit["grants"] >= len(expected)
        assert view.histogram is not None and view.histogram["counts"][-1] == view.audit["grants"]
    finally:
        f.close()
    paused = run_cli("control", "--db", dbs[1], "pause")
    assert paused.returncode == 0, paused.stderr
    resumed = run_cli("control", "--db", dbs[2], "resume")
    assert resumed.returncode == 0, resumed.stderr
    export = run_cli("export", "--db", dbs[0], "--format", "jsonl")
    assert export.returncode == 0, export.stderr
    assert len(export.stdout.splitlines()) == len(expected)


def test_init_crawl_refuses_what_is_not_a_fleet() -> None:
    from idemcrawl.frontier.base import FrontierError

    with pytest.raises(FrontierError, match="PostgreSQL servers"):
        init_crawl(["crawl.db"], 4)
    with pytest.raises(FrontierError, match="different crawls"):
        init_crawl(["postgresql://h:1/d?schema=a", "postgresql://h:2/d?schema=b"], 4)
