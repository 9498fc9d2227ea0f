"""A crawl without --recrawl always ends: what only waits past the horizon is left, named (#18)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from idemcrawl.lab.politeness_check import Allowance, check_log, summarize
from idemcrawl.lab.testsite.multihost import HostSpec, MultiHostServer

from .helpers import run_cli


@pytest.mark.slow
def test_robots_error_host_is_left_waiting_and_named(tmp_path: Path) -> None:
    specs = [
        HostSpec("a", pages=6),
        HostSpec("c", pages=4, crawl_delay=0.5),
        HostSpec("d", pages=4, robots="error"),
    ]
    with MultiHostServer(specs) as site:
        a, c, d = site.base_urls
        db = str(tmp_path / "c.db")
        flags = ["--db", db, "--allow-private", "127.0.0.1", "--delay", "0.1", "--horizon", "5"]
        t0 = time.monotonic()
        res = run_cli("crawl", *site.seed_urls, *flags, timeout=90)
        took = time.monotonic() - t0
        assert res.returncode == 3, res.stderr  # stopped with work left
        assert "Traceback" not in res.stderr
        assert took < 45
        assert "horizon:" in res.stdout
        waiting = [ln for ln in res.stdout.splitlines() if "waiting:" in ln]
        assert len(waiting) == 1 and d in waiting[0], res.stdout
        assert "robots.txt unreachable: HTTP 500" in waiting[0] and "until" in waiting[0]
        # A rerun makes no request (the error TTL is an hour) and says the same at once.
        before = len(site.request_log())
        again = run_cli("crawl", *flags, "--json", timeout=60)
        assert again.returncode == 3, again.stderr
        summary = json.loads(again.stdout.splitlines()[-1])
        assert summary["stopped_by"] == "horizon" and summary["complete"] is False
        assert [w["host"] for w in summary["waiting"]] == [d]
        assert len(site.request_log()) == before
        # --retry-deferred lifts the robots.txt error: asked again once, then left again.
        retry = run_cli("crawl", *flags, "--retry-deferred", timeout=60)
        assert retry.returncode == 3, retry.stderr
        log = site.request_log()
    assert [e["path"] for e in log[before:]] == ["/robots.txt"]
    assert sum(1 for e in log if e["host"] == d) == 2
    fetched = {(e["host"], e["path"]) for e in log}
    for host, spec in ((a, specs[0]), (c, specs[1])):
        assert all((host, f"/p/{n}") in fetched for n in range(spec.pages))
    allowance = {a: Allowance(1, 0.1), c: Allowance(1, 0.5), d: Allowance(1, 0.1)}
    violations = check_log(log, allowance, only_robots_hosts={d})
    assert violations == [], summarize(violations)


def test_a_complete_crawl_exits_zero_and_leaves_nothing(tmp_path: Path) -> None:
    with MultiHostServer([HostSpec("a", pages=3)]) as site:
        res = run_cli(
            "crawl",
            *site.seed_urls,
            "--db",
            str(tmp_path / "c.db"),
            "--allow-private",
            "127.0.0.1",
            "--delay",
            "0",
            "--json",
            timeout=60,
        )
    assert res.returncode == 0, res.stderr
    summary = json.loads(res.stdout.splitlines()[-1])
    assert summary["complete"] is True and summary["waiting"] == []
    assert summary["left"] == {"queued": 0, "leased": 0, "deferred": 0}
