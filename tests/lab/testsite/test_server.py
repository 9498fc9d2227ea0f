"""The shared test-site plumbing: binding, start-up errors, bounded shutdown, the server loop."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
import urllib.error
import urllib.request

import aiohttp
import pytest
from aiohttp import web

from idemcrawl.lab.testsite.server import AppServer, ThreadedServer, bind, serving
from idemcrawl.lab.testsite.traps import PRODUCTS, TrapServer, TrapSite

_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _hello_app() -> web.Application:
    async def hello(request: web.Request) -> web.Response:
        return web.Response(text=f"hello {request.path}")

    async def forever(request: web.Request) -> web.Response:
        await asyncio.Event().wait()  # never set: only shutdown ends it
        raise AssertionError("unreachable")

    app = web.Application()
    app.router.add_get("/hang", forever)
    app.router.add_get("/{tail:.*}", hello)
    return app


def _get(url: str, timeout: float = 5) -> str:
    with _OPENER.open(url, timeout=timeout) as resp:
        return resp.read().decode()


def _refused(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as s:
        s.settimeout(2)
        return s.connect_ex((host, port)) != 0


def _free_port() -> int:
    with bind("127.0.0.1") as sock:
        return int(sock.getsockname()[1])


def test_serves_on_an_ephemeral_loopback_port_and_frees_it_on_stop() -> None:
    with AppServer(_hello_app) as server:
        port = server.port
        assert port > 0 and server.ports == [port]
        assert server.base_url == f"http://127.0.0.1:{port}"
        assert server.running
        assert _get(server.base_url + "/x") == "hello /x"
    assert not server.running
    assert _refused(port)
    with pytest.raises(RuntimeError, match="AppServer is not running"):
        _ = server.port


def test_binds_the_requested_port() -> None:
    wanted = _free_port()
    with AppServer(_hello_app, port=wanted) as server:
        assert server.port == wanted
        assert _get(f"http://127.0.0.1:{wanted}/") == "hello /"


def test_a_busy_port_is_a_start_error_with_the_cause() -> None:
    with AppServer(_hello_app) as first:
        second = AppServer(_hello_app, port=first.port)
        with pytest.raises(RuntimeError, match="app server failed to start") as exc:
            second.start()
        assert isinstance(exc.value.__cause__, OSError)
        assert not second.running
        assert _get(first.base_url + "/") == "hello /"  # the first one is untouched


def test_start_twice_is_refused_and_a_stopped_server_starts_again() -> None:
    server = AppServer(_hello_app).start()
    try:
        with pytest.raises(RuntimeError, match="already started"):
            server.start()
    finally:
        server.stop()
    server.stop()  # stopping a stopped server is a no-op
    with server:  # a fresh app on a fresh loop
        assert _get(server.base_url + "/again") == "hello /again"


def test_a_server_must_say_what_it_serves() -> None:
    with pytest.raises(RuntimeError, match="failed to start") as exc:
        ThreadedServer().start()
    assert isinstance(exc.value.__cause__, NotImplementedError)


def test_stop_is_bounded_by_the_grace_period_even_with_a_hanging_handler() -> None:
    server = AppServer(_hello_app, shutdown_timeout=0.2).start()
    errors: list[BaseException] = []

    def client() -> None:
        try:
            _get(server.base_url + "/hang", timeout=10)
        except (urllib.error.URLError, ConnectionError, OSError) as exc:
            errors.append(exc)

    t = threading.Thread(target=client, daemon=True)
    t.start()
    time.sleep(0.2)  # the request is being handled
    started = time.monotonic()
    server.stop()
    elapsed = time.monotonic() - started
    t.join(5)
    assert elapsed < 2.0, elapsed
    assert not t.is_alive() and errors, "the hanging request ends with the server"


def test_on_loop_runs_on_the_server_thread_while_running() -> None:
    server = AppServer(_hello_app, port=0)
    with server:
        ran_on = server.on_loop(threading.current_thread)
        assert ran_on is not threading.current_thread()
        assert ran_on.daemon and ran_on.name == "app-server"
        with pytest.raises(ZeroDivisionError):
            server.on_loop(lambda: 1 // 0)  # errors come back to the caller
    assert server.on_loop(threading.current_thread) is threading.current_thread()


def test_serving_runs_on_the_callers_loop() -> None:
    async def main() -> tuple[int, str]:
        async with (
            serving(_hello_app(), "127.0.0.1") as port,
            aiohttp.ClientSession() as session,
            session.get(f"http://127.0.0.1:{port}/in-loop") as resp,
        ):
            return port, await resp.text()

    port, text = asyncio.run(main())
    assert text == "hello /in-loop"
    assert _refused(port)


def test_ipv6_loopback_is_bracketed_in_urls() -> None:
    try:
        bind("::1").close()
    except OSError:
        pytest.skip("no IPv6 loopback on this machine")
    with AppServer(_hello_app, host="::1") as server:
        assert server.base_url == f"http://[::1]:{server.port}"
        assert _get(server.base_url + "/six") == "hello /six"


def test_trap_server_serves_the_trap_site_and_counts_on_it() -> None:
    site = TrapSite()
    with TrapServer(site) as server:
        assert server.site is site and server.seed_url == server.base_url + "/"
        home = _get(server.seed_url)
        assert home.count('href="/p/') >= PRODUCTS
        assert _get(server.base_url + "/p/3").count("T-003") == 1
    assert site.paths["/"] == 1 and site.hits["/p/"] == 1
