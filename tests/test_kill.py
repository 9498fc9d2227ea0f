"""SIGKILL in the middle of a crawl, in the normal suite (bounded: a small shop, 3 kills)."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from idemcrawl.lab.chaos import idem_crawl_command
from idemcrawl.lab.testsite import ShopConfig, ShopServer, expected_products

from .helpers import DEVNULL, run, spawn


def _crawl_cmd(seed: str, db: Path, concurrency: int) -> list[str]:
    """The very command line ``idemcrawl chaos`` kills, so this test attacks the same crawl."""
    return idem_crawl_command(seed, str(db), concurrency)


def _kill_after_requests(server: ShopServer, cmd: list[str], n: int) -> int:
    """Start a crawl, SIGKILL its process group once the server saw ``n`` more requests."""
    before = int(server.stats()["total"])  # type: ignore[call-overload]
    proc = spawn(cmd, new_session=True, stdout=DEVNULL, stderr=DEVNULL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and proc.poll() is None:
        if int(server.stats()["total"]) >= before + n:  # type: ignore[call-overload]
            break
        time.sleep(0.002)
    assert proc.poll() is None, "crawl ended before it could be killed"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    return proc.returncode


def _rows(db: Path) -> list[tuple[str, str]]:
    con = sqlite3.connect(db)
    try:
        return [
            (k, json.loads(d)["price"]) for k, d in con.execute("SELECT key, data FROM records")
        ]
    finally:
        con.close()


def _leased(db: Path) -> int:
    con = sqlite3.connect(db)
    try:
        return con.execute("SELECT count(*) FROM urls WHERE state='leased'").fetchone()[0]
    finally:
        con.close()


@pytest.mark.slow
def test_sigkill_and_restart_with_other_concurrency(tmp_path: Path) -> None:
    cfg = ShopConfig(listings=6, per_page=10, latency_ms=40)
    db = tmp_path / "kill.db"
    in_flight = 0
    with ShopServer(cfg) as server:
        for i, conc in enumerate((8, 2, 5)):
            code = _kill_after_requests(server, _crawl_cmd(server.seed_url, db, conc), 8 + 4 * i)
            assert code == -signal.SIGKILL
            in_flight += _leased(db)
        done = run(_crawl_cmd(server.seed_url, db, 3), timeout=120)
        assert done.returncode == 0, done.stderr
        paths: dict[str, int] = server.stats()["paths"]  # type: ignore[assignment]
    rows = _rows(db)
    assert sorted(rows) == sorted(expected_products(cfg).items())  # one correct row each
    repeated = sum(n - 1 for n in paths.values())
    assert len(paths) == 1 + 6 + 60  # robots.txt, listings, products
    assert repeated <= in_flight, (repeated, in_flight)


def _unrequested(db: Path, server: ShopServer) -> int:
    """Leased URLs the server has not been asked for yet: beyond the workers' own (each between
    its lease and its request), those are leases in hand. The server is read after the
    database, so a request racing the two reads only lowers the count."""
    con = sqlite3.connect(db)
    try:
        leased = [r[0] for r in con.execute("SELECT url FROM urls WHERE state='leased'")]
    finally:
        con.close()
    seen: dict[str, int] = server.stats()["paths"]  # type: ignore[assignment]
    return sum(1 for u in leased if urlsplit(u)._replace(scheme="", netloc="").geturl() not in seen)


def _kill_with_leases_in_hand(server: ShopServer, cmd: list[str], db: Path, workers: int) -> int:
    """Start a crawl, SIGKILL its process group once more leased URLs wait unrequested than it
    has workers (leases in hand), and return how many were leased then."""
    proc = spawn(cmd, new_session=True, stdout=DEVNULL, stderr=DEVNULL)
    waiting = 0
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and proc.poll() is None and waiting <= workers:
        time.sleep(0.005)
        try:
            waiting = _unrequested(db, server)
        except sqlite3.Error:
            continue  # not created yet, or busy
    assert proc.poll() is None, "crawl ended before it held leases in hand"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    return _leased(db)


@pytest.mark.slow
def test_sigkill_with_leases_in_hand_loses_and_repeats_nothing_more(tmp_path: Path) -> None:
    """With host slots to spare, the feeder keeps leases in hand beyond its workers
    (``--lease-ahead``); a kill strands them with the fetches in flight. The restart returns
    them at once (the owner slot's previous holder is dead), nothing is lost, and the fetches
    repeated stay within what was leased at the kills."""
    cfg = ShopConfig(listings=20, per_page=20, latency_ms=40)
    db = tmp_path / "kill.db"
    ahead = ["--host-concurrency", "16", "--lease-ahead", "8"]
    in_flight = 0
    with ShopServer(cfg) as server:
        for _ in range(3):
            cmd = _crawl_cmd(server.seed_url, db, 4) + ahead
            in_flight += _kill_with_leases_in_hand(server, cmd, db, 4)
        done = run(_crawl_cmd(server.seed_url, db, 4) + ahead, timeout=120)
        assert done.returncode == 0, done.stderr
        paths: dict[str, int] = server.stats()["paths"]  # type: ignore[assignment]
    assert sorted(_rows(db)) == sorted(expected_products(cfg).items())
    assert len(paths) == 1 + 20 + 400
    assert sum(n - 1 for n in paths.values()) <= in_flight
