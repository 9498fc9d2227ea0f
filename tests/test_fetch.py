"""Tests for fetching: the SSRF guard, the guarded resolver and the Fetcher on loopback.

Network rule for this module: only loopback is ever connected to. Non-loopback addresses are
only *classified*. Every end-to-end test runs with :class:`ConnectSpy` on its event loop, which
records each address a socket connects to and refuses anything that is not loopback, so even a
broken guard cannot reach the network; names are resolved by :class:`FakeResolver`, never DNS.
"""

from __future__ import annotations

import asyncio
import email.utils
import errno
import gzip
import ipaddress
import re
import socket
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import aiohttp
import pytest
from aiohttp import web
from aiohttp.abc import AbstractResolver, ResolveResult

from idemcrawl.fetch import (
    AddressPolicy,
    BlockedAddress,
    Fetcher,
    FetchError,
    FetchResult,
    FetchSettings,
    GuardedResolver,
    parse_allow_list,
    retry_after_seconds,
)

T = TypeVar("T")

LOOPBACK_ONLY = parse_allow_list(["127.0.0.1"])
ip = ipaddress.ip_address


# -- AddressPolicy ----------------------------------------------------------------------------

# (address, what the reason must name). The label ("private", "link-local"...) is not checked
# beyond loopback: which ``ipaddress`` flag fires first varies between Python releases.
FORBIDDEN = [
    ("127.0.0.1", "loopback address 127.0.0.1"),
    ("10.0.0.1", "10.0.0.1"),
    ("172.16.0.1", "172.16.0.1"),
    ("192.168.1.1", "192.168.1.1"),
    ("169.254.169.254", "169.254.169.254"),  # cloud metadata endpoint
    ("100.64.0.1", "special-purpose address 100.64.0.1"),  # CGNAT: only _EXTRA_FORBIDDEN
    ("224.0.0.1", "224.0.0.1"),
    ("0.0.0.0", "0.0.0.0"),
    ("240.0.0.1", "240.0.0.1"),
    ("192.0.0.8", "192.0.0.8"),
    ("198.18.0.1", "198.18.0.1"),
    ("::1", "loopback address ::1"),
    ("fe80::1", "fe80::1"),
    ("fc00::1", "fc00::1"),
    ("::", "address ::"),
    ("::ffff:127.0.0.1", "loopback address 127.0.0.1"),  # IPv4-mapped: judged as IPv4
    ("::ffff:10.0.0.1", "address 10.0.0.1"),
    ("::ffff:169.254.169.254", "address 169.254.169.254"),
    ("64:ff9b::a00:1", "64:ff9b::a00:1"),  # NAT64 of 10.0.0.1
]


@pytest.mark.parametrize(("address", "shown"), FORBIDDEN)
def test_forbidden_addresses(address: str, shown: str) -> None:
    reason = AddressPolicy().forbidden_reason(ip(address))
    assert reason is not None
    assert reason.endswith(shown)
    with pytest.raises(BlockedAddress, match=re.escape(shown)):
        AddressPolicy().check("evil.test", address)


@pytest.mark.parametrize("address", ["8.8.8.8", "1.1.1.1", "2001:4860:4860::8888"])
def test_global_addresses_are_allowed(address: str) -> None:
    # Classified only; nothing in this module ever connects to them.
    assert AddressPolicy().forbidden_reason(ip(address)) is None
    AddressPolicy().check("public.test", address)  # does not raise


def test_6to4_of_private_ipv4_is_forbidden() -> None:
    assert AddressPolicy().forbidden_reason(ip("2002:a00:1::")) is not None


def test_allow_list_single_address() -> None:
    policy = AddressPolicy(parse_allow_list(["127.0.0.1"]))
    assert policy.forbidden_reason(ip("127.0.0.1")) is None
    assert policy.forbidden_reason(ip("::ffff:127.0.0.1")) is None  # mapped form too
    assert policy.forbidden_reason(ip("127.0.0.2")) is not None
    assert policy.forbidden_reason(ip("10.0.0.1")) is not None
    assert policy.forbidden_reason(ip("::1")) is not None


def test_allow_list_cidr() -> None:
    policy = AddressPolicy(parse_allow_list(["127.0.0.0/8", " fd00::/8 "]))
    assert policy.forbidden_reason(ip("127.0.0.2")) is None
    assert policy.forbidden_reason(ip("127.255.255.254")) is None
    assert policy.forbidden_reason(ip("fd12::1")) is None
    assert policy.forbidden_reason(ip("10.0.0.1")) is not None


def test_parse_allow_list_values() -> None:
    assert parse_allow_list([]) == ()
    assert parse_allow_list(["127.0.0.1"]) == (ipaddress.ip_network("127.0.0.1/32"),)
    # Host bits are tolerated (strict=False): the network is what counts.
    assert parse_allow_list(["10.1.2.3/8"]) == (ipaddress.ip_network("10.0.0.0/8"),)


@pytest.mark.parametrize("bad", ["nope", "10.0.0.0/33", "", "localhost"])
def test_parse_allow_list_rejects_garbage(bad: str) -> None:
    with pytest.raises(ValueError, match=f"--allow-private: {bad!r} is not an address or CIDR"):
        parse_allow_list(["127.0.0.1", bad])


def test_check_raises_blocked_address_and_handles_scope_id() -> None:
    with pytest.raises(BlockedAddress, match=r"evil\.test -> private address 10\.0\.0\.1"):
        AddressPolicy().check("evil.test", "10.0.0.1")
    with pytest.raises(BlockedAddress, match="address fe80::1 refused"):
        AddressPolicy().check("evil.test", "fe80::1%eth0")
    assert issubclass(BlockedAddress, OSError)  # aiohttp wraps OSErrors from resolvers


# -- a fake resolver and GuardedResolver ------------------------------------------------------


class FakeResolver(AbstractResolver):
    """Maps names to fixed addresses and records every call; unknown names fail like DNS."""

    def __init__(self, mapping: dict[str, list[str]] | None = None) -> None:
        self.mapping = dict(mapping or {})
        self.calls: list[tuple[str, int, int]] = []
        self.closed = False

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        self.calls.append((host, port, family))
        if host not in self.mapping:
            raise OSError(socket.EAI_NONAME, f"fake resolver: unknown name {host}")
        return [
            ResolveResult(
                hostname=host,
                host=addr,
                port=port,
                family=socket.AF_INET6 if ":" in addr else socket.AF_INET,
                proto=0,
                flags=socket.AI_NUMERICHOST,
            )
            for addr in self.mapping[host]
        ]

    async def close(self) -> None:
        self.closed = True


def test_guarded_resolver_drops_forbidden_addresses() -> None:
    inner = FakeResolver({"mixed.test": ["10.0.0.1", "8.8.8.8", "::1", "2001:4860:4860::8888"]})
    guard = GuardedResolver(AddressPolicy(), inner)
    got = asyncio.run(guard.resolve("mixed.test", 8080, socket.AF_UNSPEC))
    assert [r["host"] for r in got] == ["8.8.8.8", "2001:4860:4860::8888"]
    assert all(r["port"] == 8080 for r in got)
    assert inner.calls == [("mixed.test", 8080, socket.AF_UNSPEC)]


def test_guarded_resolver_respects_allow_list() -> None:
    inner = FakeResolver({"shop.test": ["10.0.0.1", "127.0.0.1", "127.0.0.2"]})
    guard = GuardedResolver(AddressPolicy(LOOPBACK_ONLY), inner)
    got = asyncio.run(guard.resolve("shop.test", 80))
    assert [r["host"] for r in got] == ["127.0.0.1"]


def test_guarded_resolver_raises_when_nothing_is_left() -> None:
    inner = FakeResolver({"evil.test": ["10.0.0.1", "169.254.169.254"]})
    guard = GuardedResolver(AddressPolicy(), inner)
    with pytest.raises(BlockedAddress, match=r"evil\.test -> .*refused"):
        asyncio.run(guard.resolve("evil.test", 80))
    assert [c[0] for c in inner.calls] == ["evil.test"]


def test_guarded_resolver_empty_answer_is_retryable() -> None:
    guard = GuardedResolver(AddressPolicy(), FakeResolver({"empty.test": []}))
    with pytest.raises(OSError, match="no address") as info:
        asyncio.run(guard.resolve("empty.test", 80))
    assert not isinstance(info.value, BlockedAddress)  # a DNS failure is retryable


def test_guarded_resolver_passes_inner_errors_and_close() -> None:
    inner = FakeResolver()
    guard = GuardedResolver(AddressPolicy(), inner)
    with pytest.raises(OSError, match="unknown name") as info:
        asyncio.run(guard.resolve("unknown.test", 80))
    assert not isinstance(info.value, BlockedAddress)
    asyncio.run(guard.close())
    assert inner.closed


# -- loopback server, connection spy and runner -----------------------------------------------


class ConnectSpy:
    """Replaces the loop's socket connects: records addresses and refuses non-loopback ones."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.addresses: list[tuple[str, int]] = []
        self.refused: list[tuple[str, int]] = []
        self._sock_connect = loop.sock_connect
        self._create_connection = loop.create_connection
        loop.sock_connect = self._guarded_sock_connect  # type: ignore[method-assign]
        loop.create_connection = self._guarded_create_connection  # type: ignore[method-assign]

    def _allow(self, host: str, port: int) -> None:
        try:
            loopback = ipaddress.ip_address(host.split("%", 1)[0]).is_loopback
        except ValueError:
            loopback = False
        if not loopback:
            self.refused.append((host, port))
            raise OSError(errno.ENETUNREACH, f"test refused a non-loopback connect to {host}")

    async def _guarded_sock_connect(self, sock: socket.socket, address: Any) -> None:
        self.addresses.append((address[0], address[1]))
        self._allow(address[0], address[1])
        await self._sock_connect(sock, address)

    async def _guarded_create_connection(self, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("sock") is None:  # aiohttp passes an already-connected socket
            host = kwargs.get("host", args[1] if len(args) > 1 else "")
            port = kwargs.get("port", args[2] if len(args) > 2 else 0)
            self._allow(str(host), int(port))
        return await self._create_connection(*args, **kwargs)


class LoopbackServer:
    """A tiny aiohttp.web app on 127.0.0.1 with a few behaviours, logging what it receives."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, dict[str, str]]] = []
        self.release = asyncio.Event()  # lets /slow finish so shutdown is immediate
        self.port = 0
        self._runner: web.AppRunner | None = None

    @property
    def paths(self) -> list[str]:
        return [p for p, _ in self.requests]

    def url(self, path: str = "/", host: str = "127.0.0.1") -> str:
        return f"http://{host}:{self.port}{path}"

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        self.requests.append((request.path_qs, dict(request.headers)))
        path = request.path
        if path == "/redirect":
            return web.Response(status=302, headers={"Location": "/target"})
        if path == "/big":
            return web.Response(body=b"0123456789" * 20_000, content_type="text/plain")
        if path == "/gzip":
            body = gzip.compress(GZIP_PLAIN)
            return web.Response(
                body=body, headers={"Content-Encoding": "gzip", "Content-Type": "text/html"}
            )
        if path == "/slow":
            await asyncio.wait_for(self.release.wait(), 5)
            return web.Response(text="late")
        if path == "/close":
            resp = web.Response(text="closing")
            resp.force_close()
            return resp
        return web.Response(
            text="<h1>hello</h1>",
            content_type="text/html",
            headers={"X-Custom-Header": "Value", "ETag": '"abc"'},
        )

    async def __aenter__(self) -> LoopbackServer:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        assert self._runner.addresses
        self.port = self._runner.addresses[0][1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.release.set()
        assert self._runner is not None
        await self._runner.cleanup()


GZIP_PLAIN = b"<p>compressible</p>" * 4000


def run(
    scenario: Callable[[LoopbackServer, ConnectSpy], Awaitable[T]],
) -> tuple[T, LoopbackServer, ConnectSpy]:
    """Run ``scenario`` in a fresh loop with the spy installed and the server up."""

    async def main() -> tuple[T, LoopbackServer, ConnectSpy]:
        spy = ConnectSpy(asyncio.get_running_loop())
        async with LoopbackServer() as server:
            result = await scenario(server, spy)
        return result, server, spy

    return asyncio.run(main())


def fetcher(resolver: AbstractResolver | None = None, **settings: Any) -> Fetcher:
    # Always a fake resolver: real DNS is never consulted by these tests.
    return Fetcher(FetchSettings(**settings), concurrency=4, resolver=resolver or FakeResolver())


async def fetch_error(f: Fetcher, url: str) -> FetchError:
    async with f:
        try:
            await f.fetch(url)
        except FetchError as exc:
            return exc
    raise AssertionError(f"fetching {url} did not raise FetchError")


# -- Fetcher end to end -----------------------------------------------------------------------


def test_get_with_allow_list() -> None:
    async def scenario(server: LoopbackServer, spy: ConnectSpy) -> FetchResult:
        async with fetcher(allow_private=LOOPBACK_ONLY, user_agent="ua-test/1") as f:
            return await f.fetch(server.url("/page?x=1"))

    res, server, spy = run(scenario)
    assert res.status == 200
    assert res.body == b"<h1>hello</h1>"
    assert res.url == server.url("/page?x=1")
    assert res.headers["x-custom-header"] == "Value"
    assert res.headers["etag"] == '"abc"'
    assert res.headers["content-type"].startswith("text/html")
    assert all(k == k.lower() for k in res.headers)
    assert not res.truncated
    assert res.elapsed >= 0
    assert server.paths == ["/page?x=1"]
    assert server.requests[0][1]["User-Agent"] == "ua-test/1"
    assert spy.addresses == [("127.0.0.1", server.port)]


def test_request_headers_are_sent() -> None:
    async def scenario(server: LoopbackServer, spy: ConnectSpy) -> FetchResult:
        async with fetcher(allow_private=LOOPBACK_ONLY) as f:
            return await f.fetch(server.url(), headers={"If-None-Match": '"abc"'})

    _, server, _ = run(scenario)
    assert server.requests[0][1]["If-None-Match"] == '"abc"'


@pytest.mark.parametrize("host", ["127.0.0.1", "[::1]", "127.0.0.2"])
def test_loopback_literal_blocked_without_allow_list(host: str) -> None:
    async def scenario(server: LoopbackServer, spy: ConnectSpy) -> FetchError:
        return await fetch_error(fetcher(), server.url(host=host))

    err, server, spy = run(scenario)
    assert err.kind == "blocked"
    assert "loopback" in str(err)
    assert str(err).startswith("blocked: ")
    assert server.requests == []
    assert spy.addresses == []


def test_private_literal_blocked_before_connecting() -> None:
    async def scenario(server: LoopbackServer, spy: ConnectSpy) -> FetchError:
        return await fetch_error(fetcher(allow_private=LOOPBACK_ONLY), "http://10.0.0.1:9/")

    err, _, spy = run(scenario)
    assert err.kind == "blocked"
    assert "private address 10.0.0.1" in str(err)
    assert spy.addresses == []


def test_name_resolving_to_private_address_is_blocked() -> None:
    resolver = FakeResolver({"evil.test": ["10.0.0.1"]})

    async def scenario(server: LoopbackServer, spy: ConnectSpy) -> FetchError:
        # The allow-list admits loopback only; evil.test's sole address is private.
        f = fetcher(resolver, allow_private=LOOPBACK_ONLY)
        return await fetch_error(f, f"http://evil.test:{server.port}/")

    err, server, spy = run(scenario)
    assert err.kind == "blocked"
    assert "evil.test" in str(err)
    assert "10.0.0.1" in str(err)
    assert [c[:2] for c in resolver.calls] == [("evil.test", server.port)]
    assert spy.addresses == []  # refused in the resolver: no socket ever connected
    assert server.requests == []


def test_name_resolving_to_metadata_address_is_blocked() -> None:
    resolver = FakeResolver({"meta.test": ["169.254.169.254", "::ffff:169.254.169.254"]})

    async def scenario(server: LoopbackServer, spy: ConnectSpy) -> FetchError:
        return await fetch_error(fetcher(resolver), "http://meta.test/latest/meta-data/")

    err, _, spy = run(scenario)
    assert err.kind == "blocked"
    assert "169.254.169.254" in str(err)
    assert resolver.calls
    assert spy.addresses == []


def test_resolved_address_is_what_gets_connected() -> None:
    resolver = FakeResolver({"shop.test": ["10.0.0.1", "127.0.0.1"]})

    async def scenario(server: LoopbackServer, spy: ConnectSpy) -> FetchResult:
        async with fetcher(resolver, allow_private=LOOPBACK_ONLY) as f:
            return await f.fetch(f"http://shop.test:{server.port}/item")

    res, server, spy = run(scenario)
    assert res.status == 200
    assert res.body == b"<h1>hello</h1>"
    assert server.paths == ["/item"]
    assert server.requests[0][1]["Host"] == f"shop.test:{server.port}"
    assert [c[0] for c in resolver.calls] == ["shop.test"]
    assert spy.addresses == [("127.0.0.1", server.port)]  # never 10.0.0.1


def test_every_new_connection_is_resolved_and_checked_again() -> None:
    """No DNS cache: a name that re-resolves to a private address (rebinding) is refused."""
    resolver = FakeResolver({"rebind.test": ["127.0.0.1"]})

    async def scenario(server: LoopbackServer, spy: ConnectSpy) -> tuple[int, FetchError | None]:
        url = f"http://rebind.test:{server.port}/close"  # server closes: no connection reuse
        async with fetcher(resolver, allow_private=LOOPBACK_ONLY) as f:
            first = await f.fetch(url)
            resolver.mapping["rebind.test"] = ["10.0.0.1"]
            try:
                await f.fetch(url)
            except FetchError as exc:
                return first.status, exc
        return first.status, None

    (status, err), server, spy = run(scenario)
    assert status == 200
    assert err is not None
    assert err.kind == "blocked"
    assert len(resolver.calls) == 2
    assert server.paths == ["/close"]
    assert spy.addresses == [("127.0.0.1", server.port)]


def test_unknown_name_is_a_connect_error() -> None:
    async def scenario(server: LoopbackServer, spy: ConnectSpy) -> FetchError:
        return await fetch_error(fetcher(allow_private=LOOPBACK_ONLY), "http://nowhere.test/")

    err, _, spy = run(scenario)
    assert err.kind == "connect"
    assert spy.addresses == []


def test_redirect_is_not_followed() -> None:
    async def scenario(server: LoopbackServer, spy: ConnectSpy) -> FetchResult:
        async with fetcher(allow_private=LOOPBACK_ONLY) as f:
            return await f.fetch(server.url("/redirect"))

    res, server, _ = run(scenario)
    assert res.status == 302
    assert res.headers["location"] == "/target"
    assert server.paths == ["/redirect"]


def test_max_bytes_truncates() -> None:
    async def scenario(server: LoopbackServer, spy: ConnectSpy) -> FetchResult:
        async with fetcher(allow_private=LOOPBACK_ONLY, max_bytes=100_001) as f:
            return await f.fetch(server.url("/big"))

    res, _, _ = run(scenario)
    assert res.status == 200
    assert res.truncated
    assert len(res.body) == 100_001
    assert res.body == (b"0123456789" * 20_000)[:100_001]


@pytest.mark.parametrize("limit", [200_000, 200_001])
def test_body_within_max_bytes_is_not_truncated(limit: int) -> None:
    async def scenario(server: LoopbackServer, spy: ConnectSpy) -> FetchResult:
        async with fetcher(allow_private=LOOPBACK_ONLY, max_bytes=limit) as f:
            return await f.fetch(server.url("/big"))

    res, _, _ = run(scenario)
    assert not res.truncated
    assert res.body == b"0123456789" * 20_000


def test_gzip_is_decompressed() -> None:
    async def scenario(server: LoopbackServer, spy: ConnectSpy) -> FetchResult:
        async with fetcher(allow_private=LOOPBACK_ONLY) as f:
            return await f.fetch(server.url("/gzip"))

    res, _, _ = run(scenario)
    assert res.status == 200
    assert res.headers["content-encoding"] == "gzip"
    assert res.body == GZIP_PLAIN
    assert not res.truncated


def test_max_bytes_counts_decompressed_bytes() -> None:
    async def scenario(server: LoopbackServer, spy: ConnectSpy) -> FetchResult:
        async with fetcher(allow_private=LOOPBACK_ONLY, max_bytes=5000) as f:
            return await f.fetch(server.url("/gzip"))

    res, _, _ = run(scenario)
    assert res.truncated
    assert res.body == GZIP_PLAIN[:5000]


def test_total_timeout() -> None:
    async def scenario(server: LoopbackServer, spy: ConnectSpy) -> tuple[FetchError, float]:
        t0 = time.monotonic()
        err = await fetch_error(
            fetcher(allow_private=LOOPBACK_ONLY, total_timeout=0.3), server.url("/slow")
        )
        return err, time.monotonic() - t0

    (err, elapsed), server, _ = run(scenario)
    assert err.kind == "timeout"
    assert elapsed < 3
    assert server.paths == ["/slow"]


def test_connection_refused() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        closed_port = s.getsockname()[1]  # nothing listens here once the socket is closed

    async def scenario(server: LoopbackServer, spy: ConnectSpy) -> FetchError:
        return await fetch_error(
            fetcher(allow_private=LOOPBACK_ONLY), f"http://127.0.0.1:{closed_port}/"
        )

    err, _, spy = run(scenario)
    assert err.kind in ("connect", "network")
    assert spy.addresses == [("127.0.0.1", closed_port)]


def test_fetch_error_str_has_kind() -> None:
    err = FetchError("timeout", "took too long")
    assert err.kind == "timeout"
    assert str(err) == "timeout: took too long"


def test_fetcher_session_is_closed_on_exit() -> None:
    async def scenario(server: LoopbackServer, spy: ConnectSpy) -> bool:
        f = fetcher(allow_private=LOOPBACK_ONLY)
        async with f:
            session = f._session
            assert isinstance(session, aiohttp.ClientSession)
        return session.closed and f._session is None

    closed, _, _ = run(scenario)
    assert closed


# -- retry_after_seconds ----------------------------------------------------------------------

NOW = 1_700_000_000.0


def http_date(ts: float) -> str:
    return email.utils.formatdate(ts, usegmt=True)


@pytest.mark.parametrize(
    ("value", "cap", "expected"),
    [
        ("120", 600.0, 120.0),
        ("120", 60.0, 60.0),
        (" 30 ", 600.0, 30.0),
        ("0", 600.0, 0.0),
        ("9" * 400, 600.0, 600.0),
    ],
)
def test_retry_after_delta_seconds(value: str, cap: float, expected: float) -> None:
    assert retry_after_seconds(value, NOW, cap) == expected


def test_retry_after_http_date() -> None:
    assert retry_after_seconds(http_date(NOW + 90), NOW, 600.0) == pytest.approx(90.0)
    assert retry_after_seconds(http_date(NOW + 9000), NOW, 600.0) == 600.0
    assert retry_after_seconds(http_date(NOW - 90), NOW, 600.0) == 0.0
    real = retry_after_seconds(http_date(time.time() + 120), time.time(), 600.0)
    assert real is not None
    assert 100 < real <= 120


@pytest.mark.parametrize("value", [None, "", "   ", "garbage", "-5", "1.5", "soon, maybe"])
def test_retry_after_invalid(value: str | None) -> None:
    assert retry_after_seconds(value, NOW, 600.0) is None


def test_retry_after_superscript_digit() -> None:
    assert retry_after_seconds("²", NOW, 600.0) is None
