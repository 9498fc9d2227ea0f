"""The engine end to end against the in-process test shop."""

from __future__ import annotations

import itertools
import json
import time
from pathlib import Path

import pytest

from idemcrawl.engine import run_crawl
from idemcrawl.frontier.sqlite import SQLiteFrontier
from idemcrawl.lab.testsite import ShopConfig, ShopServer, expected_products

from ..conftest import crawl_config


def stored(db: Path) -> dict[str, str]:
    f = SQLiteFrontier(str(db))
    try:
        return {r["key"]: json.loads(r["data"])["price"] for r in f.records()}
    finally:
        f.close()


def test_full_crawl_stores_every_product_once(shop: ShopServer, tmp_path: Path) -> None:
    db = tmp_path / "c.db"
    summary = run_crawl(crawl_config(db, shop.seed_url))
    assert summary.finished
    assert stored(db) == expected_products(shop.cfg)
    stats = shop.stats()
    assert stats["total"] == 1 + 4 + 20  # robots.txt, listings, products: each exactly once
    assert max(stats["paths"].values()) == 1  # type: ignore[attr-defined]


def test_parse_in_worker_processes(shop: ShopServer, tmp_path: Path) -> None:
    db = tmp_path / "c.db"
    summary = run_crawl(crawl_config(db, shop.seed_url, parse_workers=1))
    assert summary.finished
    assert stored(db) == expected_products(shop.cfg)


def test_rerun_on_finished_db_makes_no_request(shop: ShopServer, tmp_path: Path) -> None:
    db = tmp_path / "c.db"
    run_crawl(crawl_config(db, shop.seed_url))
    shop.reset()
    summary = run_crawl(crawl_config(db, shop.seed_url))
    assert summary.finished and summary.fetched == 0
    assert shop.stats()["total"] == 0


def test_max_pages_stops_and_resume_finishes(shop: ShopServer, tmp_path: Path) -> None:
    db = tmp_path / "c.db"
    first = run_crawl(crawl_config(db, shop.seed_url, max_pages=5))
    assert first.stopped_by == "max-pages" and first.fetched == 5
    second = run_crawl(crawl_config(db, shop.seed_url, seeds=()))
    assert second.finished
    assert stored(db) == expected_products(shop.cfg)
    assert max(shop.stats()["paths"].values()) == 1  # type: ignore[attr-defined]


def test_politeness_delay_between_request_starts(tmp_path: Path) -> None:
    with ShopServer(ShopConfig(listings=1, per_page=4)) as server:
        run_crawl(
            crawl_config(
                tmp_path / "c.db", server.seed_url, concurrency=8, host_concurrency=1, delay=0.2
            )
        )
        starts = sorted(t for t, _ in server.request_log())  # type: ignore[misc]
    assert len(starts) == 6  # robots.txt + listing + 4 products
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    assert min(gaps) >= 0.19, gaps


@pytest.mark.slow
def test_host_concurrency_is_never_exceeded(tmp_path: Path) -> None:
    with ShopServer(ShopConfig(listings=3, per_page=10, latency_ms=30)) as server:
        cfg = crawl_config(tmp_path / "c.db", server.seed_url, concurrency=16, host_concurrency=2)
        run_crawl(cfg)
        log = sorted(t for t, _ in server.request_log())  # type: ignore[misc]
    # Each request lasts >= 30 ms; with at most 2 in flight, no 3 starts fit in 30 ms.
    assert len(log) == 34
    windows = [log[i + 2] - log[i] for i in range(len(log) - 2)]
    assert min(windows) >= 0.029, min(windows)


def test_blocked_address_fails_url_without_request(shop: ShopServer, tmp_path: Path) -> None:
    db = tmp_path / "c.db"
    summary = run_crawl(crawl_config(db, shop.seed_url, allow_private=()))
    assert summary.finished
    assert shop.stats()["total"] == 0
    f = SQLiteFrontier(str(db))
    row = f.url_row(shop.seed_url)
    f.close()
    # robots.txt could not be fetched (refused address), so the host's pages are deferred.
    assert row is not None and row["state"] == "deferred" and "refused" in row["reason"]
    assert summary.failed == 0


def test_blocked_address_with_robots_ignored_fails_url(shop: ShopServer, tmp_path: Path) -> None:
    db = tmp_path / "c.db"
    cfg = crawl_config(db, shop.seed_url, allow_private=(), ignore_robots=True)
    summary = run_crawl(cfg)
    assert summary.finished and summary.failed == 1
    assert shop.stats()["total"] == 0
    f = SQLiteFrontier(str(db))
    row = f.url_row(shop.seed_url)
    f.close()
    assert row is not None and row["state"] == "failed" and "blocked" in row["reason"]


def test_server_errors_are_retried_then_failed(tmp_path: Path) -> None:
    # A closed port: connection refused on every attempt.
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    db = tmp_path / "c.db"
    t = time.monotonic()
    summary = run_crawl(
        crawl_config(
            db,
            f"http://127.0.0.1:{port}/",
            max_retries=2,
            retry_base=0.05,
            ignore_robots=True,
            backoff_base=0.05,
        )
    )
    assert time.monotonic() - t < 20
    assert summary.finished and summary.failed == 1
    f = SQLiteFrontier(str(db))
    row = f.url_row(f"http://127.0.0.1:{port}/")
    f.close()
    assert row is not None and row["state"] == "failed" and row["attempts"] == 3


def test_dead_local_owner_leases_are_reclaimed_at_once(shop: ShopServer, tmp_path: Path) -> None:
    db = tmp_path / "c.db"
    f = SQLiteFrontier(str(db))
    from idemcrawl.frontier.base import HostPolicy, NewURL

    f.add([NewURL(shop.seed_url, shop.base_url)], time.time())
    f.add_seeds([shop.base_url])
    # A lease held by a dead process of this machine (its slot file is not locked).
    import socket

    (lease,) = f.lease(f"{socket.gethostname()}/7", 1, time.time(), 3600, HostPolicy(1, 0))
    f.close()
    t = time.monotonic()
    summary = run_crawl(crawl_config(db, shop.seed_url, lease_seconds=3600))
    assert summary.finished and time.monotonic() - t < 20
    assert stored(db) == expected_products(shop.cfg)
    del lease


@pytest.mark.slow
def test_foreign_lease_is_waited_for_until_expiry(shop: ShopServer, tmp_path: Path) -> None:
    db = tmp_path / "c.db"
    f = SQLiteFrontier(str(db))
    from idemcrawl.frontier.base import HostPolicy, NewURL

    f.add([NewURL(shop.seed_url, shop.base_url)], time.time())
    f.add_seeds([shop.base_url])
    f.lease("other-machine/0", 1, time.time(), 1.5, HostPolicy(1, 0))
    f.close()
    t = time.monotonic()
    summary = run_crawl(crawl_config(db, shop.seed_url))
    waited = time.monotonic() - t
    assert summary.finished
    assert waited >= 1.0
    assert stored(db) == expected_products(shop.cfg)


@pytest.mark.parametrize("workers", [0, 1])
def test_spider_errors_fail_the_url_not_the_crawl(tmp_path: Path, workers: int) -> None:
    spider = tmp_path / "bad.py"
    spider.write_text(
        "import idemcrawl\n"
        "class Bad(idemcrawl.Spider):\n"
        "    name = 'bad'\n"
        "    def parse(self, page):\n"
        "        if '/product/' in page.url:\n"
        "            raise RuntimeError('boom')\n"
        "        yield from page.links()\n"
    )
    with ShopServer(ShopConfig(listings=1, per_page=3)) as server:
        db = tmp_path / "c.db"
        summary = run_crawl(
            crawl_config(db, server.seed_url, spider=f"{spider}:Bad", parse_workers=workers)
        )
    assert summary.finished and summary.failed == 3
    f = SQLiteFrontier(str(db))
    st = f.stats()
    f.close()
    assert st.urls_by_state["failed"] == 3 and st.urls_by_state["done"] == 2  # + robots.txt


def test_unreachable_robots_defers_host_after_retries(tmp_path: Path) -> None:
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    db = tmp_path / "c.db"
    t = time.monotonic()
    summary = run_crawl(
        crawl_config(db, f"http://127.0.0.1:{port}/", robots_error_ttl=0.2, robots_max_attempts=3)
    )
    assert summary.finished and time.monotonic() - t < 20
    f = SQLiteFrontier(str(db))
    page = f.url_row(f"http://127.0.0.1:{port}/")
    robots = f.url_row(f"http://127.0.0.1:{port}/robots.txt")
    stats = f.stats()
    f.close()
    assert page is not None and page["state"] == "deferred"
    assert "robots.txt unreachable after 3 attempts" in page["reason"]
    assert robots is not None and robots["version"] == 3  # fetched three times, one round each
    assert stats.counters["robots_fetches"] == 3


def test_paused_partition_owner_cannot_grant_after_takeover(tmp_path: Path) -> None:
    """A real pause (thread sleep) past the ownership lease, while another owner takes over."""
    import threading

    from idemcrawl.frontier.base import HostPolicy, NewURL, StaleEpoch

    db = str(tmp_path / "p.db")
    a, b = SQLiteFrontier(db), SQLiteFrontier(db)
    a.add([NewURL(f"http://h/{i}", "http://h") for i in range(10)], time.time())
    policy = HostPolicy(max_in_flight=10, delay=0.0)
    fence_a = a.acquire_partition(0, "A", time.time(), ttl=0.3)
    outcome: list[object] = []

    def paused_owner() -> None:
        time.sleep(0.6)  # e.g. a long GC pause or a stopped VM
        try:
            outcome.append(a.lease("A", 5, time.time(), 30, policy, fence=fence_a))
        except StaleEpoch as exc:
            outcome.append(exc)

    t = threading.Thread(target=paused_owner)
    t.start()
    time.sleep(0.4)
    fence_b = b.acquire_partition(0, "B", time.time(), ttl=5)
    granted_b = b.lease("B", 5, time.time(), 30, policy, fence=fence_b)
    t.join()
    assert fence_b.epoch == fence_a.epoch + 1
    assert len(granted_b) == 5
    assert len(outcome) == 1 and isinstance(outcome[0], StaleEpoch)
    assert b.progress(time.time()).leased == 5
    a.close()
    b.close()


def test_parser_memory_limit_fails_the_url_not_the_crawl(tmp_path: Path) -> None:
    spider = tmp_path / "hog.py"
    spider.write_text(
        "import idemcrawl\n"
        "class Hog(idemcrawl.Spider):\n"
        "    name = 'hog'\n"
        "    def parse(self, page):\n"
        "        if '/product/' in page.url:\n"
        "            hog = bytearray(1024 * 1024 * 1024)  # 1 GiB: over the cap below\n"
        "            del hog\n"
        "        yield from page.links()\n"
    )
    with ShopServer(ShopConfig(listings=1, per_page=2)) as server:
        db = tmp_path / "c.db"
        summary = run_crawl(
            crawl_config(
                db,
                server.seed_url,
                spider=f"{spider}:Hog",
                parse_workers=1,
                parse_memory_limit=600 * 1024**2,
            )
        )
        product = f"{server.base_url}/product/SKU-00001"
    assert summary.finished and summary.failed == 2
    f = SQLiteFrontier(str(db))
    row = f.url_row(product)
    f.close()
    assert row is not None and "memory limit" in row["reason"]


def test_freeze_startup_objects_takes_them_out_of_the_collectors_walks() -> None:
    import gc

    from idemcrawl.engine.runner import freeze_startup_objects

    before = gc.get_freeze_count()
    try:
        freeze_startup_objects()
        # this test process's modules, classes and functions
        assert gc.get_freeze_count() > before + 1000
    finally:
        gc.unfreeze()


def test_the_crawl_command_freezes_start_up_and_a_library_call_does_not(
    shop: ShopServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from idemcrawl.cli import main
    from idemcrawl.engine import runner

    frozen: list[bool] = []
    monkeypatch.setattr(runner, "freeze_startup_objects", lambda: frozen.append(True))
    assert run_crawl(crawl_config(tmp_path / "lib.db", shop.seed_url)).finished
    assert frozen == []
    db = str(tmp_path / "cli.db")
    flags = ["--quiet", "--parse-workers", "0", "--allow-private", "127.0.0.1", "--delay", "0"]
    rc = main(["crawl", shop.seed_url, "--db", db, *flags])
    assert rc == 0
    assert frozen == [True]
