"""Stopping a crawl: SIGINT exits 130, SIGTERM 143, no traceback from any process (#18)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from idemcrawl.lab.testsite import ShopServer

from .conftest import SHOP_SPIDER
from .helpers import run_cli, spawn_cli


def _crawl_args(shop: ShopServer, db: Path, *more: str) -> list[str]:
    return [
        "crawl",
        shop.seed_url,
        "--db",
        str(db),
        "--spider",
        SHOP_SPIDER,
        "--allow-private",
        "127.0.0.1",
        "--parse-workers",
        "1",
        *more,
    ]


@pytest.mark.slow
@pytest.mark.parametrize(("sig", "status"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_to_the_process_group_stops_cleanly(
    shop: ShopServer, tmp_path: Path, sig: signal.Signals, status: int
) -> None:
    # Default politeness (1 s between requests): the crawl is surely running when hit.
    proc = spawn_cli(*_crawl_args(shop, tmp_path / "c.db"), new_session=True)
    deadline = time.monotonic() + 20
    while shop.stats()["total"] < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    os.killpg(proc.pid, sig)  # what Ctrl-C or a service manager does: every process
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == status, err
    assert "Traceback" not in err and "Error" not in err, err
    assert out.startswith(sig.name), out
    # The same command resumes and ends the crawl.
    res = run_cli(*_crawl_args(shop, tmp_path / "c.db", "--delay", "0"), timeout=60)
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr


def test_rerunning_a_finished_crawl_is_quiet(shop: ShopServer, tmp_path: Path) -> None:
    args = _crawl_args(shop, tmp_path / "c.db", "--delay", "0", "--host-concurrency", "4")
    assert run_cli(*args, timeout=60).returncode == 0
    requests = shop.stats()["total"]
    for _ in range(3):  # parser processes still starting when the crawl ends at once
        res = run_cli(*args, "--quiet", timeout=60)
        assert res.returncode == 0 and res.stderr == "", res.stderr
    assert shop.stats()["total"] == requests
