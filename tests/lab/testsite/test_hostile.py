"""The hostile test site, and the Fetcher's limits proven against it (#5, R13-R18).

Only loopback is contacted. Names are resolved by :func:`hostile_resolver` (never DNS); the
bait names and 127.0.0.2 must be refused, which tests/test_ssrf.py checks with a connect spy.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import signal
import socket
import struct
import textwrap
import time
import urllib.request
import zlib
from collections.abc import Iterator
from typing import Any

import brotli
import pytest
import zstandard

from idemcrawl.fetch import Fetcher, FetchError, FetchResult, FetchSettings, parse_allow_list
from idemcrawl.lab.testsite.hostile import (
    CHAIN_HOPS,
    HostileSite,
    bomb_blob,
    bomb_encodings,
    hostile_resolver,
)

from ...helpers import run_python, spawn_python

LOOPBACK = parse_allow_list(["127.0.0.1"])
MIB = 1 << 20
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class Clock:
    """A clock the test moves, so "changes every period" needs no sleeping."""

    def __init__(self, now: float = 1_800_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture(scope="module")
def site() -> Iterator[HostileSite]:
    with HostileSite() as s:
        yield s


def fetch_all(
    site: HostileSite, requests: list[tuple[str, dict[str, str] | None]], **settings: Any
) -> list[FetchResult | FetchError]:
    """Fetch ``(path, headers)`` in order through one Fetcher; errors are returned, not raised."""

    async def main() -> list[FetchResult | FetchError]:
        out: list[FetchResult | FetchError] = []
        cfg = FetchSettings(allow_private=LOOPBACK, **settings)
        async with Fetcher(cfg, 2, hostile_resolver()) as f:
            for path, headers in requests:
                try:
                    out.append(await f.fetch(site.base_url + path, headers=headers))
                except FetchError as exc:
                    out.append(exc)
        return out

    return asyncio.run(main())


def fetch(site: HostileSite, path: str, **settings: Any) -> FetchResult:
    (res,) = fetch_all(site, [(path, None)], **settings)
    assert isinstance(res, FetchResult), res
    return res


def fetch_error(site: HostileSite, path: str, **settings: Any) -> FetchError:
    (res,) = fetch_all(site, [(path, None)], **settings)
    assert isinstance(res, FetchError), res
    return res


# -- the site ---------------------------------------------------------------------------------


def test_index_links_everything(site: HostileSite) -> None:
    res = fetch(site, "/")
    text = res.body.decode()
    links = site.index_links()
    for link in links:
        assert f'href="{link}"' in text
    assert f"http://127.0.0.2:{site.port}/x" in links
    assert {"http://metadata.test/", "http://internal.test/"} <= set(links)
    assert "/bomb.html" in links and "/big.html" in links and "/trickle.html" in links
    assert len([x for x in links if x.startswith("/bomb")]) == len(bomb_encodings()) == 4


def test_changing_page_revalidation_and_counters() -> None:
    clock = Clock()
    with HostileSite(period=10, clock=clock) as s:
        first = fetch(s, "/changing/1")
        etag, lm = first.headers["etag"], first.headers["last-modified"]
        assert first.status == 200
        assert etag == s.changing_etag(1) and etag.startswith('"')  # strong
        clock.now += 5  # same period: unchanged
        same = fetch_all(
            s,
            [
                ("/changing/1", {"If-None-Match": etag}),
                ("/changing/1", {"If-Modified-Since": lm}),
                ("/changing/1", {"If-None-Match": '"other"', "If-Modified-Since": lm}),
            ],
        )
        assert [r.status for r in same if isinstance(r, FetchResult)] == [304, 304, 200]
        assert all(isinstance(r, FetchResult) and r.body == b"" for r in same[:2])
        clock.now += 10  # next period: changed
        changed = fetch_all(
            s,
            [("/changing/1", {"If-None-Match": etag}), ("/changing/1", {"If-Modified-Since": lm})],
        )
        assert [r.status for r in changed if isinstance(r, FetchResult)] == [200, 200]
        new = changed[0]
        assert isinstance(new, FetchResult)
        assert new.headers["etag"] != etag
        assert new.body != first.body
        assert new.headers["last-modified"] != lm
        assert s.counters()["/changing/1"] == {"200": 4, "304": 2}
        assert s.count("/changing/1", 304) == 2


def test_static_page_never_changes() -> None:
    clock = Clock()
    with HostileSite(period=1, clock=clock) as s:
        first = fetch(s, "/static/0")
        clock.now += 10_000
        again = fetch_all(
            s,
            [
                ("/static/0", {"If-None-Match": first.headers["etag"]}),
                ("/static/0", {"If-None-Match": f'W/{first.headers["etag"]}'}),
                ("/static/0", {"If-Modified-Since": first.headers["last-modified"]}),
                ("/static/0", None),
            ],
        )
        statuses = [r.status for r in again if isinstance(r, FetchResult)]
        assert statuses == [304, 304, 304, 200]
        assert isinstance(again[0], FetchResult) and again[0].ip == "127.0.0.1"  # 304 has no body
        assert isinstance(again[-1], FetchResult) and again[-1].body == first.body
        assert s.counters()["/static/0"] == {"200": 2, "304": 3}


def test_redirect_chain_and_loop(site: HostileSite) -> None:
    hops, path = [], f"/redirect/chain/{CHAIN_HOPS}"
    while path != "/redirect/end":
        res = fetch(site, path)
        assert 300 <= res.status < 400
        hops.append(res.status)
        path = res.headers["location"]
    assert len(hops) == CHAIN_HOPS == 7
    assert set(hops) == {301, 302, 303, 307, 308}
    assert fetch(site, "/redirect/end").status == 200
    a, b = fetch_all(site, [("/redirect/loop/a", None), ("/redirect/loop/b", None)])
    assert isinstance(a, FetchResult) and a.headers["location"] == "/redirect/loop/b"
    assert isinstance(b, FetchResult) and b.headers["location"] == "/redirect/loop/a"


def test_gone_and_unknown(site: HostileSite) -> None:
    statuses = [
        r.status if isinstance(r, FetchResult) else r
        for r in fetch_all(
            site,
            [("/gone/404", None), ("/gone/410", None), ("/changing/99", None), ("/nope", None)],
        )
    ]
    assert statuses == [404, 410, 404, 404]


def test_counters_endpoint_and_reset() -> None:
    with HostileSite() as s:
        fetch_all(s, [("/", None), ("/gone/410", None), ("/gone/410", None)])
        with _OPENER.open(s.base_url + "/__counters", timeout=5) as r:
            data = json.loads(r.read())
        assert data == {"/": {"200": 1}, "/gone/410": {"410": 2}}  # /__counters not counted
        req = urllib.request.Request(s.base_url + "/__reset", method="POST")
        with _OPENER.open(req, timeout=5):
            pass
        assert s.counters() == {}


def test_hostile_resolver_maps_bait_and_loopback(monkeypatch: pytest.MonkeyPatch) -> None:
    connects: list[object] = []
    real_connect = socket.socket.connect

    def spy(self: socket.socket, address: object) -> None:
        connects.append(address)
        real_connect(self, address)

    # Resolving a bait name must never touch the network, let alone the address it maps to.
    monkeypatch.setattr(socket.socket, "connect", spy)

    async def main() -> list[list[str]]:
        r = hostile_resolver({"extra.test": "192.168.1.1"})
        out = []
        for name in ("metadata.test", "INTERNAL.test.", "extra.test", "anything.example"):
            out.append([a["host"] for a in await r.resolve(name, 80)])
        out.append([a["host"] for a in await r.resolve("v6.example", 80, family=10)])
        return out

    assert asyncio.run(main()) == [
        ["169.254.169.254"],
        ["10.0.0.1"],
        ["192.168.1.1"],
        ["127.0.0.1"],
        ["::1"],
    ]
    assert connects == []


# -- the bombs are what they claim ------------------------------------------------------------


def test_small_bombs_decode_exactly() -> None:
    n = 3 * MIB
    assert gzip.decompress(bomb_blob("gzip", n)) == bytes(n)  # CRC-32 and ISIZE checked
    assert zlib.decompress(bomb_blob("deflate", n)) == bytes(n)  # Adler-32 checked
    assert brotli.decompress(bomb_blob("br", n)) == bytes(n)
    assert zstandard.ZstdDecompressor().decompressobj().decompress(bomb_blob("zstd", n)) == bytes(
        n
    )


def test_gzip_bomb_is_a_gibibyte() -> None:
    blob = bomb_blob("gzip")
    _crc, isize = struct.unpack("<II", blob[-8:])
    assert isize == 1 << 30  # the 1 GiB the trailer promises (checked for real above, at 3 MiB)
    assert len(blob) < 2 * MIB  # ...from about a megabyte on the wire
    d = zlib.decompressobj(31)
    assert d.decompress(blob[: 64 * 1024], 8 * MIB) == bytes(8 * MIB)


# -- fetch limits against the site ------------------------------------------------------------


@pytest.mark.parametrize("coding", ["gzip", "deflate", "br", "zstd"])
def test_bomb_is_cut_at_the_decoded_limit(site: HostileSite, coding: str) -> None:
    page = {"gzip": "/bomb.html"}.get(coding, f"/bomb-{coding}.html")
    res = fetch(site, page, max_decompressed_bytes=2 * MIB)
    assert res.status == 200
    assert res.content_encoding == coding
    assert res.cut_reason == "max_decompressed_bytes"
    assert res.truncated
    assert res.body == bytes(2 * MIB)
    assert res.wire_bytes < 2 * MIB  # a fraction of the blob was needed


def test_big_page_is_cut_at_max_bytes(site: HostileSite) -> None:
    res = fetch(site, "/big.html", max_bytes=3 * MIB)
    assert res.cut_reason == "max_bytes"
    assert res.wire_bytes == len(res.body) == 3 * MIB
    assert res.body.startswith(b"<!DOCTYPE html>")
    assert res.headers["content-length"] == str(100_000_000)


def test_big_page_is_exactly_its_size_when_read_whole() -> None:
    with HostileSite(big_bytes=1_000_000) as s:
        res = fetch(s, "/big.html")
    assert res.cut_reason is None
    assert len(res.body) == res.wire_bytes == 1_000_000
    assert res.body.endswith(b"</body></html>\n")


@pytest.mark.slow
def test_trickle_is_cut_at_the_total_timeout(site: HostileSite) -> None:
    t0 = time.monotonic()
    res = fetch(site, "/trickle.html", total_timeout=1.5)
    elapsed = time.monotonic() - t0
    assert res.cut_reason == "total_timeout"
    assert res.status == 200
    assert 1.4 <= elapsed < 3.0
    assert 1 <= len(res.body) <= 3  # one byte per second
    assert b"<html>".startswith(res.body)


def test_garbage_does_not_crash(site: HostileSite) -> None:
    res = fetch(site, "/garbage.html")
    assert res.status == 200
    assert res.cut_reason is None
    assert len(res.body) == 256 * 1024
    assert res.headers["content-type"].startswith("text/html")
    with pytest.raises(UnicodeDecodeError):
        res.body.decode("utf-8")  # it really is binary


@pytest.mark.parametrize(
    ("path", "message"),
    [("/huge-header", "more than 16384 bytes"), ("/many-headers", "Too many headers")],
)
def test_oversized_response_head_is_refused(site: HostileSite, path: str, message: str) -> None:
    err = fetch_error(site, path)
    assert err.kind == "protocol"
    assert str(err).startswith("protocol: malformed or oversized response head: ")
    assert message in str(err)
    assert len(str(err)) < 400  # a readable message, not a megabyte of header


# The fetch runs in a fresh interpreter, measured with /proc's VmHWM (peak RSS of this address
# space). Not ru_maxrss: Linux keeps that across fork+exec, so a child of pytest starts at
# pytest's peak. Writing "5" to clear_refs resets VmHWM to the current RSS after the warm-up.
_RSS_PROBE = textwrap.dedent(
    """
    import asyncio, json, sys
    from idemcrawl.fetch import Fetcher, FetchSettings, parse_allow_list

    def status_mb(field):
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024
        raise LookupError(field)

    async def main(base, path):
        cfg = FetchSettings(allow_private=parse_allow_list(["127.0.0.1"]))
        async with Fetcher(cfg, 2) as f:
            await f.fetch(base + "/")  # warm up: imports, session, first connection
            try:
                with open("/proc/self/clear_refs", "w") as fh:
                    fh.write("5")
            except OSError:
                pass  # then VmHWM may still hold an earlier (import-time) peak: safe side
            before = status_mb("VmRSS")
            res = await f.fetch(base + path)
            after = status_mb("VmHWM")
        print(json.dumps({"before": before, "after": after, "cut": res.cut_reason,
                          "body": len(res.body), "wire": res.wire_bytes}))

    asyncio.run(main(sys.argv[1], sys.argv[2]))
    """
)


@pytest.mark.parametrize("path", ["/bomb.html", "/big.html"])
def test_peak_rss_stays_bounded(site: HostileSite, path: str) -> None:
    """Default limits (10 MiB wire, 10 MiB decoded) against a 1 GiB bomb / a 100 MB page."""
    if path == "/bomb.html":
        bomb_blob("gzip", site.bomb_bytes)  # build it here, outside the measured process
    out = run_python(_RSS_PROBE, site.base_url, path)
    assert out.returncode == 0, out.stderr
    m = json.loads(out.stdout)
    delta = m["after"] - m["before"]
    print(f"{path}: peak RSS {m['before']:.1f} -> {m['after']:.1f} MB (+{delta:.1f}); {m}")
    assert m["body"] == 10 * MIB
    assert m["cut"] == ("max_decompressed_bytes" if path == "/bomb.html" else "max_bytes")
    assert delta < 64  # body (10 MiB) + one join copy + buffers; a bomb would be 1024 MB


def test_serve_forever_prints_url_and_stops_cleanly() -> None:
    proc = spawn_python(
        "from idemcrawl.lab.testsite.hostile import serve_forever; serve_forever('127.0.0.1', 0)"
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("serving hostile site at http://127.0.0.1:")
        url = line.split()[4]
        with _OPENER.open(url, timeout=5) as r:
            assert b"Hostile site" in r.read()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.stderr is not None
    assert "Traceback" not in proc.stderr.read()


def test_bad_constructor_arguments() -> None:
    with pytest.raises(ValueError, match="period"):
        HostileSite(period=0)
    with pytest.raises(ValueError, match="trickle_interval"):
        HostileSite(trickle_interval=0)
    with pytest.raises(ValueError, match="no bomb"):
        bomb_blob("compress", MIB)
