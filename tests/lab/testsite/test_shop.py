"""Tests for the built-in test shop: content, 404s, accounting, latency and the CLI server.

Everything talks to 127.0.0.1 only, through an opener with proxies disabled so an
``http_proxy`` in the environment can never route test traffic off the machine.
"""

from __future__ import annotations

import json
import re
import selectors
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from idemcrawl.lab.testsite import (
    ShopConfig,
    ShopServer,
    expected_products,
    make_app,
    price_for,
    serve_forever,
    sku_for,
)

from ...helpers import spawn_python

CFG = ShopConfig(listings=3, per_page=4)
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def get(url: str, method: str = "GET") -> tuple[int, str, str]:
    """(status, content-type header, body) without raising on HTTP errors."""
    req = urllib.request.Request(url, method=method)
    try:
        with _OPENER.open(req, timeout=10) as resp:
            return resp.status, resp.headers.get("Content-Type", ""), resp.read().decode()
    except urllib.error.HTTPError as err:
        with err:
            return err.code, err.headers.get("Content-Type", ""), err.read().decode()


def get_json(url: str, method: str = "GET") -> object:
    status, _, body = get(url, method)
    assert status == 200, body
    return json.loads(body)


@pytest.fixture(scope="module")
def server() -> Iterator[ShopServer]:
    with ShopServer(CFG) as srv:
        yield srv


@pytest.fixture
def shop(server: ShopServer) -> ShopServer:
    """The shared server with counters zeroed, so each test sees only its own requests."""
    server.reset()
    return server


def test_base_url_is_loopback_with_real_port(shop: ShopServer) -> None:
    assert re.fullmatch(r"http://127\.0\.0\.1:\d+", shop.base_url)
    assert shop.port > 0
    assert shop.seed_url == shop.base_url + "/list/1"


def test_index_links_to_first_listing(shop: ShopServer) -> None:
    status, ctype, body = get(shop.base_url + "/")
    assert status == 200
    assert ctype == "text/html; charset=utf-8"
    assert 'href="/list/1"' in body


@pytest.mark.parametrize("n", [1, 2, 3])
def test_listing_has_products_next_and_back_links(shop: ShopServer, n: int) -> None:
    status, ctype, body = get(f"{shop.base_url}/list/{n}")
    assert status == 200
    assert ctype == "text/html; charset=utf-8"
    skus = re.findall(r'<a class="product" href="/product/(SKU-\d{5})">', body)
    first = (n - 1) * CFG.per_page + 1
    assert skus == [sku_for(i) for i in range(first, first + CFG.per_page)]
    nexts = re.findall(r'<a rel="next" href="([^"]+)">', body)
    assert nexts == ([f"/list/{n + 1}"] if n < CFG.listings else [])
    assert 'href="/list/1"' in body


@pytest.mark.parametrize("i", [1, 4, 5, 12])
def test_product_page_shows_sku_price_and_listing(shop: ShopServer, i: int) -> None:
    sku = sku_for(i)
    status, ctype, body = get(f"{shop.base_url}/product/{sku}")
    assert status == 200
    assert ctype == "text/html; charset=utf-8"
    assert f'<h1 class="name">Product {sku}</h1>' in body
    assert f'<span class="sku">{sku}</span>' in body
    assert f'<span class="price">{price_for(sku)}</span>' in body
    assert f'href="/list/{(i - 1) // CFG.per_page + 1}"' in body


@pytest.mark.parametrize(
    "path",
    [
        "/product/SKU-99999",
        "/product/SKU-00013",  # one past the last product of the small config
        "/product/SKU-00000",
        "/product/SKU-1",
        "/list/0",
        "/list/4",
        "/list/01",
        "/list/x",
        "/nope",
    ],
)
def test_unknown_or_out_of_range_is_404_and_counted(shop: ShopServer, path: str) -> None:
    status, _, _ = get(shop.base_url + path)
    assert status == 404
    assert shop.stats()["paths"] == {path: 1}


def test_wrong_method_is_405_and_counted(shop: ShopServer) -> None:
    status, _, _ = get(shop.base_url + "/list/1", method="POST")
    assert status == 405
    assert shop.stats()["total"] == 1


def test_stats_count_each_path_and_total(shop: ShopServer) -> None:
    base = shop.base_url
    for path in ["/list/1", "/list/1", "/product/SKU-00002", "/nope", "/list/1?page=2"]:
        get(base + path)
    stats = get_json(base + "/__stats")
    assert stats == {
        "total": 5,
        "paths": {"/list/1": 2, "/product/SKU-00002": 1, "/nope": 1, "/list/1?page=2": 1},
        "in_flight": 0,
    }
    # Reading /__stats is not itself counted, and the in-process view agrees.
    assert get_json(base + "/__stats") == stats
    assert shop.stats() == stats


def test_reset_zeroes_counts_and_log(shop: ShopServer) -> None:
    get(shop.base_url + "/list/2")
    assert shop.stats()["total"] == 1
    assert get_json(shop.base_url + "/__reset", method="POST") == {"ok": True}
    assert get_json(shop.base_url + "/__stats") == {"total": 0, "paths": {}, "in_flight": 0}
    assert get_json(shop.base_url + "/__log") == []
    get(shop.base_url + "/list/2")
    shop.reset()
    assert shop.stats() == {"total": 0, "paths": {}, "in_flight": 0}


def test_log_records_monotonic_start_times_in_order(shop: ShopServer) -> None:
    t0 = time.monotonic()
    paths = ["/list/1", "/product/SKU-00001", "/nope"]
    for path in paths:
        get(shop.base_url + path)
    t1 = time.monotonic()
    log = get_json(shop.base_url + "/__log")
    assert isinstance(log, list)
    assert [p for _, p in log] == paths
    times = [t for t, _ in log]
    assert times == sorted(times)
    assert t0 <= times[0] and times[-1] <= t1
    assert shop.request_log() == log


def test_expected_products_is_complete_and_deterministic() -> None:
    products = expected_products(CFG)
    assert len(products) == CFG.listings * CFG.per_page == 12
    assert list(products) == [sku_for(i) for i in range(1, 13)]
    assert products == expected_products(ShopConfig(listings=3, per_page=4))
    assert len(expected_products(ShopConfig())) == 500
    for sku, price in products.items():
        assert price == price_for(sku)
        assert re.fullmatch(r"\d{1,3}\.\d{2}", price)
        assert 100 <= round(float(price) * 100) <= 99_999
    # Hash-derived prices: not all the same, and stable across calls.
    assert len(set(products.values())) > 1
    assert price_for("SKU-00001") == price_for("SKU-00001")


def test_sku_format() -> None:
    assert sku_for(1) == "SKU-00001"
    assert sku_for(500) == "SKU-00500"


def test_make_app_returns_application() -> None:
    from aiohttp import web

    assert isinstance(make_app(CFG), web.Application)


def test_invalid_config_is_rejected() -> None:
    with pytest.raises(ValueError):
        ShopConfig(listings=0)
    with pytest.raises(ValueError):
        ShopConfig(latency_ms=-1)


def test_latency_applies_and_in_flight_tracks_requests() -> None:
    with ShopServer(ShopConfig(listings=1, per_page=1, latency_ms=200)) as srv:
        result: dict[str, float] = {}

        def fetch() -> None:
            start = time.monotonic()
            status, _, _ = get(srv.base_url + "/list/1")
            result["elapsed"] = time.monotonic() - start
            result["status"] = status

        worker = threading.Thread(target=fetch)
        worker.start()
        # The request is counted before the latency sleep, so it shows as in flight.
        deadline = time.monotonic() + 2
        while srv.stats()["in_flight"] != 1 and time.monotonic() < deadline:
            time.sleep(0.005)
        assert srv.stats()["in_flight"] == 1
        assert srv.stats()["total"] == 1
        worker.join(5)
        assert result["status"] == 200
        assert result["elapsed"] >= 0.2
        assert srv.stats()["in_flight"] == 0


def test_stop_is_prompt_and_idempotent() -> None:
    srv = ShopServer(CFG).start()
    url = srv.base_url
    assert get(url + "/")[0] == 200
    start = time.monotonic()
    srv.stop()
    srv.stop()
    assert time.monotonic() - start < 3
    with pytest.raises(urllib.error.URLError):
        _OPENER.open(url + "/", timeout=2)
    # Restartable (fresh port, same counters) so benchmarks can reuse one object.
    with srv:
        assert get(srv.base_url + "/list/1")[0] == 200
        assert srv.stats()["total"] == 2


def _read_line(proc: subprocess.Popen[str], timeout: float) -> str:
    assert proc.stdout is not None
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        if not sel.select(timeout):
            raise AssertionError(f"no output within {timeout} s")
    return proc.stdout.readline()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_serve_forever_prints_bound_url_and_exits_cleanly(sig: signal.Signals) -> None:
    assert callable(serve_forever)
    code = (
        "from idemcrawl.lab.testsite import ShopConfig, serve_forever; "
        "serve_forever('127.0.0.1', 0, ShopConfig(listings=2, per_page=3))"
    )
    proc = spawn_python(code)
    try:
        line = _read_line(proc, timeout=10)
        m = re.fullmatch(
            r"serving shop at (http://127\.0\.0\.1:(\d+))/list/1 \(6 products\)\n", line
        )
        assert m, line
        assert int(m.group(2)) > 0
        status, _, body = get(m.group(1) + "/list/2")
        assert status == 200 and "SKU-00006" in body
        # It must keep serving until signalled, not merely start and exit.
        time.sleep(0.3)
        assert proc.poll() is None
        assert get(m.group(1) + "/list/1")[0] == 200
        proc.send_signal(sig)
        rc = proc.wait(timeout=10)
        _, err = proc.communicate(timeout=5)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert rc == 0, err
    assert "Traceback" not in err
