"""Live control (issue 9): pause/resume/set-delay reach three running crawl processes through
the frontier, checked against the server's own request log; and the library behind the command
(``idemcrawl.control``): what it refuses, in which words, and what it writes."""

from __future__ import annotations

import itertools
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from idemcrawl.control import ACTIONS, ControlError, ControlRequest, apply_control, parse_control
from idemcrawl.frontier import SQLiteFrontier
from idemcrawl.lab.testsite.multihost import HostSpec, MultiHostServer
from idemcrawl.url import InvalidURL

from .helpers import run_cli as _cli

ROOT = Path(__file__).resolve().parent.parent


def _starts(site: MultiHostServer, host: str, after: float) -> list[float]:
    log = site.request_log()
    return sorted(e["start"] for e in log if e["host"] == host and e["start"] > after)


@pytest.mark.slow
def test_pause_resume_and_set_delay_across_three_processes(tmp_path: Path) -> None:
    db = str(tmp_path / "c.db")
    specs = [HostSpec("a", pages=2000, latency_ms=20), HostSpec("b", pages=2000, latency_ms=20)]
    with MultiHostServer(specs) as site:
        a, b = site.base_urls
        cmd = [
            sys.executable,
            "-m",
            "idemcrawl",
            "crawl",
            *site.seed_urls,
            "--db",
            db,
            "--spider",
            "idemcrawl.lab.testsite.page_spider:PageSpider",
            "--delay",
            "0.05",
            "--host-concurrency",
            "2",
            "--allow-private",
            "127.0.0.1",
            "--no-warc",
            "--quiet",
        ]
        procs = [
            subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            for _ in range(3)
        ]
        try:
            deadline = time.monotonic() + 30
            while len(_starts(site, a, 0)) < 20 and time.monotonic() < deadline:
                time.sleep(0.2)
            assert len(_starts(site, a, 0)) >= 20, "the crawl did not start"

            assert _cli("control", "--db", db, "pause", a).returncode == 0
            paused_at = time.monotonic()  # committed by now (see set-delay below)
            time.sleep(6)
            assert _starts(site, a, paused_at + 5) == []  # no new request to a within 5 s
            assert len(_starts(site, b, paused_at + 1)) > 10  # b is not affected

            resumed_at = time.monotonic()
            assert _cli("control", "--db", db, "resume", a).returncode == 0
            time.sleep(3)
            assert len(_starts(site, a, resumed_at)) > 5

            set_at = time.monotonic()
            res = _cli("control", "--db", db, "set-delay", b, "0.5")
            assert res.returncode == 0, res.stderr
            # The change is committed when the command returns, which on a loaded machine is
            # seconds after it started (a Python start-up and the crawl's imports): leases
            # granted before the commit settle within 1.5 s of it, not of the command's start.
            applied_at = time.monotonic()
            before = _starts(site, b, set_at - 2.0)
            time.sleep(5)
            after = _starts(site, b, applied_at + 1.5)
            assert len(after) >= 4
            gaps = [y - x for x, y in itertools.pairwise(after)]
            assert min(gaps) >= 0.5 - 0.02, gaps
            old_gaps = [y - x for x, y in itertools.pairwise(before) if y < set_at]
            assert old_gaps and min(old_gaps) < 0.3  # the gap really changed
            assert all(p.poll() is None for p in procs)  # nobody restarted
        finally:
            for p in procs:
                if p.poll() is None:
                    p.send_signal(signal.SIGTERM)
            for p in procs:
                try:
                    p.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    p.kill()


@pytest.mark.slow
def test_control_errors_are_clear(tmp_path: Path) -> None:
    missing = _cli("control", "--db", str(tmp_path / "none.db"), "pause")
    assert missing.returncode == 2 and "no crawl database" in missing.stderr
    db = str(tmp_path / "c.db")
    assert _cli("db", "migrate", "--db", db).returncode == 0
    for args, needle in (
        (("set-delay", "a.example"), "takes HOST SECONDS"),
        (("set-delay", "a.example", "x"), "not a number"),
        (("set-delay", "a.example", "-1"), "out of range"),
        (("block",), "takes HOST"),
        (("add",), "at least one URL"),
        (("add", "not a url"), "error"),
    ):
        res = _cli("control", "--db", db, *args)
        assert res.returncode == 2 and needle in res.stderr, (args, res.stderr)
        assert "Traceback" not in res.stderr
    ok = _cli("control", "--db", db, "add", "http://127.0.0.1:9/new")
    assert ok.returncode == 0 and "added 1" in ok.stdout


# -- the library side: parse_control / apply_control --------------------------------------------


@pytest.mark.parametrize(
    ("action", "args", "message"),
    [
        ("set-delay", ["a.example"], "control set-delay takes HOST SECONDS"),
        ("set-budget", ["a.example", "1", "2"], "control set-budget takes HOST N"),
        ("block", [], "control block takes HOST"),
        ("pause", ["a.example", "b.example"], "control pause takes HOST"),
        ("set-delay", ["a.example", "x"], "control set-delay: 'x' is not a number"),
        ("set-budget", ["a.example", "1.5"], "control set-budget: '1.5' is not a number"),
        ("set-delay", ["a.example", "-1"], "control set-delay: '-1' is out of range"),
        ("set-delay", ["a.example", "nan"], "control set-delay: 'nan' is out of range"),
        ("set-budget", ["a.example", "0"], "control set-budget: '0' is out of range"),
        ("add", [], "control add needs at least one URL"),
        ("block", ["a b"], "bad host 'a b'"),
        ("shout", [], "unknown control action 'shout'"),
    ],
)
def test_parse_control_refuses_with_one_line(action: str, args: list[str], message: str) -> None:
    with pytest.raises(ControlError) as exc:
        parse_control(action, args)
    assert message in str(exc.value) and "\n" not in str(exc.value)


def test_parse_control_requests() -> None:
    assert parse_control("pause", []) == ControlRequest("pause")
    assert parse_control("block", ["a.example:8080"]) == ControlRequest(
        "block", ("http://a.example:8080", "https://a.example:8080")
    )
    assert parse_control("set-delay", ["https://A.example", "0.5"]) == ControlRequest(
        "set-delay", ("https://a.example",), 0.5
    )
    assert parse_control("set-budget", ["http://a.example", "10"]).value == 10
    add = parse_control("add", ["HTTP://A.example/x#frag", "http://b.example"])
    assert add.urls == ("http://a.example/x", "http://b.example/")
    with pytest.raises(InvalidURL):
        parse_control("add", ["not a url"])
    assert set(ACTIONS) == {"pause", "resume", "block", "unblock", "set-delay", "set-budget", "add"}


def test_apply_control_writes_the_database(tmp_path: Path) -> None:
    f = SQLiteFrontier(str(tmp_path / "c.db"))
    try:
        assert apply_control(f, parse_control("add", ["http://a.example/1"]), now=1.0) == (
            "added 1 new URL(s) of 1"
        )
        again = parse_control("add", ["http://a.example/1", "http://a.example/2"])
        assert apply_control(f, again, now=2.0) == "added 1 new URL(s) of 2"
        line = apply_control(f, parse_control("set-delay", ["http://a.example", "2.5"]))
        assert line == "set-delay http://a.example = 2.5"
        assert apply_control(f, parse_control("pause", ["http://a.example"])) == (
            "pause http://a.example"
        )
        host = f.host_row("http://a.example")
        assert host is not None and host["delay"] == 2.5 and host["paused"] == 1
        assert apply_control(f, parse_control("pause", [])) == "paused the whole crawl"
        assert f.stats().meta.get("paused") == "1"
        assert apply_control(f, parse_control("resume", [])) == "resumed the whole crawl"
        assert f.stats().meta.get("paused") == "0"
    finally:
        f.close()
