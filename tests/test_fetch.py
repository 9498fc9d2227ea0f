"""Tests for the Fetcher on loopback: results, limits, content decoding and timeouts.

SSRF tests live in test_ssrf.py, hostile-site tests in testsite/test_hostile.py; both reuse the
helpers defined here. Network rule: only loopback is ever connected to. Every end-to-end test
runs with :class:`ConnectSpy` on its event loop, which records each address a socket connects to
and refuses anything that is not loopback, so even a broken guard cannot reach the network;
names are resolved by :class:`FakeResolver`, never DNS.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import errno
import gzip
import ipaddress
import socket
import time
import zlib
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import aiohttp
import brotli
import pytest
import zstandard
from aiohttp import web
from aiohttp.abc import AbstractResolver, ResolveResult

from idemcrawl.fetch import (
    Fetcher,
    FetchError,
    FetchResult,
    FetchSettings,
    _decoder_for,
    accept_encoding,
    parse_allow_list,
    retry_after_seconds,
)
from idemcrawl.lab.testsite.hostile import bomb_blob
from idemcrawl.lab.testsite.server import serving

T = TypeVar("T")

LOOPBACK_ONLY = parse_allow_list(["127.0.0.1"])


# -- a fake resolver -------------------------------------------------------------------------


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


PLAIN = b"<p>compressible</p>" * 4000  # 76,000 bytes


def _raw_deflate(data: bytes) -> bytes:
    c = zlib.compressobj(6, zlib.DEFLATED, -zlib.MAX_WBITS)
    return c.compress(data) + c.flush()


# variant -> (Content-Encoding header, body). Every body decodes to PLAIN.
ENCODED: dict[str, tuple[str, bytes]] = {
    "gzip": ("gzip", gzip.compress(PLAIN)),
    "x-gzip": ("x-gzip", gzip.compress(PLAIN)),
    "gzip-members": ("gzip", gzip.compress(PLAIN[:30_000]) + gzip.compress(PLAIN[30_000:])),
    "zlib-as-gzip": ("gzip", zlib.compress(PLAIN)),
    "deflate": ("deflate", zlib.compress(PLAIN)),
    "deflate-raw": ("deflate", _raw_deflate(PLAIN)),
    "br": ("br", brotli.compress(PLAIN)),
    "zstd": ("zstd", zstandard.ZstdCompressor().compress(PLAIN)),
    "zstd-frames": (
        "zstd",
        zstandard.ZstdCompressor().compress(PLAIN[:30_000])
        + zstandard.ZstdCompressor().compress(PLAIN[30_000:]),
    ),
    "identity": ("identity", PLAIN),
    "upper-case": ("GZIP", gzip.compress(PLAIN)),
}


class LoopbackServer:
    """A tiny aiohttp.web app on 127.0.0.1 with a few behaviours, logging what it receives.

    Served on the test's own event loop (not in a thread), so the scenario, the spy and the
    server share one loop and the order of events is deterministic.
    """

    def __init__(self) -> None:
        self.requests: list[tuple[str, dict[str, str]]] = []
        self.release = asyncio.Event()  # lets /slow and /stall finish so shutdown is immediate
        self.port = 0
        self._stack = contextlib.AsyncExitStack()

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
        if path.startswith("/enc/"):
            coding, body = ENCODED[path.removeprefix("/enc/")]
            headers = {"Content-Encoding": coding, "Content-Type": "text/html"}
            return web.Response(body=body, headers=headers)
        if path == "/bad-gzip":
            headers = {"Content-Encoding": "gzip", "Content-Type": "text/html"}
            return web.Response(body=b"this is not gzip at all" * 10, headers=headers)
        if path == "/cut-gzip":  # a whole HTTP message, but the gzip stream inside ends early
            headers = {"Content-Encoding": "gzip", "Content-Type": "text/html"}
            return web.Response(body=gzip.compress(PLAIN)[:-20], headers=headers)
        if path == "/compress":
            headers = {"Content-Encoding": "compress", "Content-Type": "text/html"}
            return web.Response(body=b"\x1f\x9d raw lzw", headers=headers)
        if path == "/stacked":
            headers = {"Content-Encoding": "gzip, br", "Content-Type": "text/html"}
            return web.Response(body=brotli.compress(gzip.compress(PLAIN)), headers=headers)
        if path == "/huge-header":
            return web.Response(text="x", headers={"X-Big": "h" * 100_000})
        if path == "/slow":
            await asyncio.wait_for(self.release.wait(), 5)
            return web.Response(text="late")
        if path == "/stall":  # the head and a few bytes, then nothing
            resp = web.StreamResponse(headers={"Content-Type": "text/html"})
            await resp.prepare(request)
            await resp.write(b"partial")
            await asyncio.wait_for(self.release.wait(), 5)
            return resp
        if path == "/drip":  # a byte every 50 ms, for a second at most
            resp = web.StreamResponse(headers={"Content-Type": "text/html"})
            await resp.prepare(request)
            for _ in range(20):
                await resp.write(b".")
                await asyncio.sleep(0.05)
            return resp
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
        self.port = await self._stack.enter_async_context(serving(app, "127.0.0.1"))
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.release.set()
        await self._stack.aclose()


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


def fetch_one(path: str, **settings: Any) -> FetchResult:
    """Fetch one loopback path with the given settings (loopback allowed)."""

    async def scenario(server: LoopbackServer, spy: ConnectSpy) -> FetchResult:
        async with fetcher(allow_private=LOOPBACK_ONLY, **settings) as f:
            return await f.fetch(server.url(path))

    return run(scenario)[0]


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
    assert res.cut_reason is None
    assert res.elapsed >= 0
    assert server.paths == ["/page?x=1"]
    assert server.requests[0][1]["User-Agent"] == "ua-test/1"
    assert spy.addresses == [("127.0.0.1", server.port)]


def test_result_records_the_exchange_for_warc() -> None:
    async def scenario(server: LoopbackServer, spy: ConnectSpy) -> FetchResult:
        async with fetcher(allow_private=LOOPBACK_ONLY, user_agent="ua-test/1") as f:
            return await f.fetch(server.url("/page"), headers={"If-None-Match": '"old"'})

    res, server, _ = run(scenario)
    assert res.reason == "OK"
    assert res.http_version == "HTTP/1.1"
    assert res.ip == "127.0.0.1"
    assert res.wire_bytes == len(res.body) == len(b"<h1>hello</h1>")
    assert res.content_encoding is None
    assert res.notes == ()
    # response headers as received: original case, order kept, nothing lower-cased; decoded
    # from the bytes on the wire only when read (most fetches never read them)
    assert res._raw_headers is None
    assert (b"ETag", b'"abc"') in res.wire_headers
    names = [k for k, _ in res.raw_headers]
    assert res.raw_headers is res._raw_headers  # decoded once
    assert names.index("X-Custom-Header") < names.index("ETag")
    assert ("ETag", '"abc"') in res.raw_headers
    assert ("Content-Length", "14") in res.raw_headers
    # request headers as sent, matching what the server got
    sent = dict(res.request_headers)
    assert sent["User-Agent"] == "ua-test/1"
    assert sent["If-None-Match"] == '"old"'
    assert sent["Host"] == f"127.0.0.1:{server.port}"
    assert sent["Accept-Encoding"] == accept_encoding()
    got = server.requests[0][1]
    assert all(got[k] == v for k, v in res.request_headers)


def test_raw_headers_are_latin1_and_a_hand_built_result_may_give_them_decoded() -> None:
    wire = FetchResult("u", 200, {}, b"", 0.0, wire_headers=((b"X-A", b"caf\xe9"),))
    assert wire.raw_headers == [("X-A", "café")]
    given = FetchResult("u", 200, {}, b"", 0.0, raw_headers=[("X-B", "1")])
    assert given.raw_headers == [("X-B", "1")]
    assert FetchResult("u", 200, {}, b"", 0.0).raw_headers == []


def test_accept_encoding_lists_every_decoder() -> None:
    assert accept_encoding() == "gzip, deflate, br, zstd"  # brotli and zstandard installed


def test_request_headers_are_sent() -> None:
    async def scenario(server: LoopbackServer, spy: ConnectSpy) -> FetchResult:
        async with fetcher(allow_private=LOOPBACK_ONLY) as f:
            return await f.fetch(server.url(), headers={"If-None-Match": '"abc"'})

    _, server, _ = run(scenario)
    assert server.requests[0][1]["If-None-Match"] == '"abc"'


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


def test_max_bytes_exact_is_not_a_cut() -> None:
    res = fetch_one("/big", max_bytes=200_000, max_decompressed_bytes=200_000)
    assert res.cut_reason is None
    assert res.wire_bytes == 200_000


def test_identity_body_over_the_decoded_limit() -> None:
    res = fetch_one("/big", max_decompressed_bytes=1000)
    assert res.cut_reason == "max_decompressed_bytes"
    assert res.body == (b"0123456789" * 20_000)[:1000]


# -- content decoding -------------------------------------------------------------------------


@pytest.mark.parametrize("variant", sorted(ENCODED))
def test_every_content_coding_is_decoded(variant: str) -> None:
    coding, wire = ENCODED[variant]
    res = fetch_one(f"/enc/{variant}")
    assert res.status == 200
    assert res.body == PLAIN
    assert res.cut_reason is None
    assert res.wire_bytes == len(wire)
    assert res.content_encoding == coding.lower()
    assert res.headers["content-encoding"] == coding  # headers are kept as received
    assert res.notes == ()


@pytest.mark.parametrize("variant", ["gzip", "deflate", "deflate-raw", "br", "zstd", "identity"])
def test_decoded_limit_is_exact(variant: str) -> None:
    whole = fetch_one(f"/enc/{variant}", max_decompressed_bytes=len(PLAIN))
    assert whole.cut_reason is None
    assert whole.body == PLAIN
    cut = fetch_one(f"/enc/{variant}", max_decompressed_bytes=len(PLAIN) - 1)
    assert cut.cut_reason == "max_decompressed_bytes"
    assert cut.truncated
    assert cut.body == PLAIN[:-1]
    small = fetch_one(f"/enc/{variant}", max_decompressed_bytes=5000)
    assert small.cut_reason == "max_decompressed_bytes"
    assert small.body == PLAIN[:5000]


@pytest.mark.parametrize("variant", ["gzip", "deflate", "br", "zstd"])
def test_wire_limit_counts_compressed_bytes(variant: str) -> None:
    _, wire = ENCODED[variant]
    exact = fetch_one(f"/enc/{variant}", max_bytes=len(wire))
    assert exact.cut_reason is None
    assert exact.body == PLAIN
    one_short = fetch_one(f"/enc/{variant}", max_bytes=len(wire) - 1)
    assert one_short.cut_reason == "max_bytes"  # even if only a checksum byte is missing
    assert one_short.wire_bytes == len(wire) - 1
    half = fetch_one(f"/enc/{variant}", max_bytes=len(wire) // 2)
    assert half.cut_reason == "max_bytes"
    assert half.wire_bytes == len(wire) // 2
    assert PLAIN.startswith(half.body)  # what the partial stream decodes to, nothing invented
    assert len(half.body) < len(PLAIN)


def test_broken_gzip_is_a_decode_error_not_a_crash() -> None:
    res = fetch_one("/bad-gzip")
    assert res.status == 200
    assert res.cut_reason is not None
    assert res.cut_reason.startswith("decode_error: gzip: ")
    assert res.body == b""


def test_gzip_stream_ending_early_is_recorded() -> None:
    res = fetch_one("/cut-gzip")
    assert res.cut_reason == "decode_error: gzip: stream ends before its end marker"
    assert PLAIN.startswith(res.body)
    assert len(res.body) > len(PLAIN) // 2


def test_unknown_coding_is_kept_as_received() -> None:
    res = fetch_one("/compress")
    assert res.cut_reason is None
    assert res.body == b"\x1f\x9d raw lzw"
    assert res.content_encoding == "compress"
    assert res.notes == ("content-encoding 'compress' not decoded: body as received",)


def test_stacked_codings_are_kept_as_received() -> None:
    res = fetch_one("/stacked")
    assert res.cut_reason is None
    assert res.body == brotli.compress(gzip.compress(PLAIN))
    assert res.notes and "stacked" in res.notes[0]


@pytest.mark.parametrize("step", [1, 2, 7, 4096])
@pytest.mark.parametrize("variant", sorted(set(ENCODED) - {"identity"}))
def test_decoders_accept_any_split_of_the_input(variant: str, step: int) -> None:
    coding, wire = ENCODED[variant]
    decoder, _ = _decoder_for(coding)
    assert decoder is not None
    out = b"".join(
        b"".join(decoder.feed(wire[i : i + step], 1 << 30)) for i in range(0, len(wire), step)
    )
    assert out == PLAIN
    assert not decoder.incomplete()


def test_bytes_after_the_last_gzip_member_are_ignored() -> None:
    decoder, _ = _decoder_for("gzip")
    assert decoder is not None
    assert b"".join(decoder.feed(gzip.compress(b"abc") + b"\x00\x00junk", 100)) == b"abc"
    assert b"".join(decoder.feed(b"more junk", 100)) == b""
    assert not decoder.incomplete()


# One step of each decoder is bounded even when a single input chunk holds a whole bomb.
@pytest.mark.parametrize("coding", ["gzip", "deflate", "br", "zstd"])
def test_decoder_output_is_bounded_per_call(coding: str) -> None:
    blob = bomb_blob(coding, 64 << 20)
    decoder, note = _decoder_for(coding)
    assert decoder is not None and note is None
    room = 1 << 20
    out = decoder.feed(blob, room)
    produced = sum(len(p) for p in out)
    assert room <= produced <= room + 256 * 1024
    assert all(not any(p) for p in out)  # zeros, as the bomb says


def test_header_too_large_is_a_protocol_error() -> None:
    async def scenario(server: LoopbackServer, spy: ConnectSpy) -> FetchError:
        return await fetch_error(fetcher(allow_private=LOOPBACK_ONLY), server.url("/huge-header"))

    err, _, _ = run(scenario)
    assert err.kind == "protocol"
    assert "response head" in str(err)
    assert "16384 bytes" in str(err)


# -- timeouts ---------------------------------------------------------------------------------


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


def test_read_timeout_after_the_head_keeps_the_partial_body() -> None:
    t0 = time.monotonic()
    res = fetch_one("/stall", read_timeout=0.3)
    assert res.cut_reason == "read_timeout"
    assert res.body == b"partial"
    assert res.status == 200
    assert time.monotonic() - t0 < 3


def test_total_timeout_after_the_head_keeps_the_partial_body() -> None:
    t0 = time.monotonic()
    res = fetch_one("/drip", total_timeout=0.4)
    assert res.cut_reason == "total_timeout"
    assert 0 < len(res.body) < 20
    assert set(res.body) == {ord(".")}
    assert time.monotonic() - t0 < 2  # cut early: the drip alone takes a second


def test_total_timeouts_of_staggered_fetches_each_fire_at_their_own_deadline() -> None:
    # One timer serves every fetch of a fetcher (fetch._Deadlines): a fetch that ends early
    # leaves its deadline behind, and a later fetch must neither be cut at that earlier
    # deadline nor outlive its own.
    async def scenario(server: LoopbackServer, spy: ConnectSpy) -> list[tuple[str, float]]:
        async with fetcher(allow_private=LOOPBACK_ONLY, total_timeout=0.6) as f:
            t0 = time.monotonic()

            async def timed(path: str, after: float) -> tuple[str, float]:
                await asyncio.sleep(after)
                start = time.monotonic()
                try:
                    res = await f.fetch(server.url(path))
                    outcome = res.cut_reason or str(res.status)
                except FetchError as exc:
                    outcome = exc.kind
                return outcome, time.monotonic() - start

            got = await asyncio.gather(
                timed("/", 0.0), timed("/drip", 0.3), timed("/slow", 0.45), timed("/", 0.5)
            )
            assert not f._deadlines._live  # nothing left behind
            assert time.monotonic() - t0 < 3
            return got

    (ok, drip, slow, ok2), _, _ = run(scenario)
    assert ok[0] == ok2[0] == "200"
    assert drip[0] == "total_timeout"
    assert slow[0] == "timeout"
    # started 0.3 s after the first fetch's deadline was set: cut at its own 0.6 s, not at 0.3
    assert 0.55 <= drip[1] < 2.0
    assert 0.55 <= slow[1] < 2.0


def test_a_fetch_cancelled_from_outside_is_cancelled_not_timed_out() -> None:
    async def scenario(server: LoopbackServer, spy: ConnectSpy) -> int:
        async with fetcher(allow_private=LOOPBACK_ONLY, total_timeout=0.3) as f:
            task = asyncio.ensure_future(f.fetch(server.url("/slow")))
            await asyncio.sleep(0.1)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            # cancelled from outside in the same step as the deadline fires: still cancelled
            task = asyncio.ensure_future(f.fetch(server.url("/slow")))
            await asyncio.sleep(0.1)
            (ex,) = f._deadlines._live
            ex.deadline = 0.0  # due now
            task.cancel()
            f._deadlines._fire()
            assert ex.expired
            with pytest.raises(asyncio.CancelledError):
                await task
            assert ex.task is task and task.cancelling() == 1  # the timeout's taken back
            return len(f._deadlines._live)

    live, _, _ = run(scenario)
    assert live == 0


def test_a_fired_deadline_whose_cancellation_was_swallowed_is_taken_back_on_exit() -> None:
    from idemcrawl.fetch import _Deadlines, _Exchange

    async def body() -> tuple[int, int]:
        deadlines = _Deadlines(60.0)
        ex = _Exchange()
        deadlines.enter(ex)
        (first,) = deadlines._live
        first.deadline = 0.0  # due now
        deadlines._fire()
        with contextlib.suppress(asyncio.CancelledError):  # something on the way swallows it
            await asyncio.sleep(0)
        task = asyncio.current_task()
        assert task is not None
        pending = task.cancelling()
        deadlines.exit(ex)
        return pending, task.cancelling()

    async def main() -> tuple[int, int]:
        return await asyncio.create_task(body())

    assert asyncio.run(main()) == (1, 0)


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
