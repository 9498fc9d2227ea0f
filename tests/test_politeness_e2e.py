"""Politeness measured from the server's side: several crawl processes, kills, robots, 429."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from idemcrawl.engine import run_crawl
from idemcrawl.lab.politeness_check import Allowance, check_log, summarize
from idemcrawl.lab.testsite.multihost import HostSpec, MultiHostServer

from .conftest import crawl_config
from .helpers import DEVNULL, spawn_cli


def _crawl(seeds: list[str], db: Path, cfg: Path) -> subprocess.Popen[str]:
    return spawn_cli(
        "crawl",
        *seeds,
        "--db",
        str(db),
        "--config",
        str(cfg),
        "--quiet",
        new_session=True,
        stdout=DEVNULL,
    )


@pytest.mark.slow
def test_three_processes_with_kills_never_break_any_host_allowance(tmp_path: Path) -> None:
    specs = [
        HostSpec("a", pages=14),
        HostSpec("b", pages=8),
        HostSpec("c", pages=5, crawl_delay=1),
        HostSpec("d", pages=5, robots="error"),
    ]
    with MultiHostServer(specs) as site:
        a, b, c, d = site.base_urls
        cfg = tmp_path / "crawl.toml"
        cfg.write_text(
            'allow_private = ["127.0.0.1"]\n'
            "delay = 0.1\n"
            "lease_seconds = 30\n"
            "robots_error_ttl = 1.0\n"
            "robots_max_attempts = 2\n"
            "parse_workers = 0\n"
            f'[hosts."{a}"]\ndelay = 0.2\n'
            f'[hosts."{b}"]\ndelay = 0.5\n'
        )
        db = tmp_path / "crawl.db"
        procs = [_crawl(site.seed_urls, db, cfg) for _ in range(3)]
        time.sleep(2.0)
        for p in procs[:2]:  # kill two of the three mid-crawl, then restart them
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        procs[:2] = [_crawl(site.seed_urls, db, cfg) for _ in range(2)]
        for p in procs:
            _, err = p.communicate(timeout=90)
            # 3: the run ended with work left, d's pages deferred (robots.txt unreachable).
            assert p.returncode == 3, err
        log = site.request_log()
        disallowed = site.disallowed_prefixes()
        robots_only = site.robots_only_hosts()
    allowance = {
        a: Allowance(1, 0.2),
        b: Allowance(1, 0.5),
        c: Allowance(1, 1.0),
        d: Allowance(1, 0.1),
    }
    violations = check_log(
        log, allowance, disallowed_prefixes=disallowed, only_robots_hosts=robots_only
    )
    assert violations == [], summarize(violations)
    fetched = {(e["host"], e["path"]) for e in log}
    for host, spec in ((a, specs[0]), (b, specs[1]), (c, specs[2])):
        for n in range(spec.pages):
            assert (host, f"/p/{n}") in fetched
    assert {p for h, p in fetched if h == d} == {"/robots.txt"}
    assert sum(1 for e in log if e["host"] == d) == 2  # robots.txt tried twice, then deferred


@pytest.mark.slow
def test_retry_after_spaces_the_next_request(tmp_path: Path) -> None:
    spec = HostSpec("a", pages=3, status_pages=True)
    with MultiHostServer([spec]) as site:
        run_crawl(
            crawl_config(
                tmp_path / "c.db", site.seed_urls[0], spider=None, delay=0.0, host_concurrency=1
            )
        )
        log = sorted(site.request_log(), key=lambda e: e["start"])
    limited = [i for i, e in enumerate(log) if e["path"] == "/limited" and e["status"] == 429]
    assert limited, "the 429 page was not fetched"
    i = limited[0]
    assert i + 1 < len(log)
    assert log[i + 1]["start"] - log[i]["end"] >= 2.0 - 0.01
    assert any(e["path"] == "/limited" and e["status"] == 200 for e in log)
