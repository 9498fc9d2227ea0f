"""The C record builder (idemcrawl._warc) writes exactly the Python builder's bytes.

``warc_records.build_exchange`` takes its records from the extension when it is built; the
Python functions stay as the fallback and as the reference here: every exchange below is built
both ways with the same seeded record ids and compared byte for byte (the gzip members too),
and the head functions are compared on generated headers and URLs, including the inputs the
extension hands back to Python (None).
"""

from __future__ import annotations

import base64
import hashlib
import io
import random
import uuid
from collections.abc import Iterator
from types import ModuleType
from typing import Any
from urllib.parse import urlsplit

import pytest
import warcio.archiveiterator
from hypothesis import given, settings
from hypothesis import strategies as st

from idemcrawl import warc_records as wr

from .conftest import native_extension
from .frontier.conftest import in_ci
from .test_warc_records import members

URL = "http://127.0.0.1:8000/shop/p/7?colour=red"
REQUEST = [("User-Agent", "idemcrawl/0.1"), ("Accept-Encoding", "gzip, br")]
RESPONSE = [
    ("Server", "nginx/1.24.0"),
    ("Date", "Wed, 02 Dec 2026 18:00:00 GMT"),
    ("Content-Type", "text/html; charset=utf-8"),
    ("Content-Encoding", "gzip"),
    ("Transfer-Encoding", "chunked"),
    ("Content-Length", "99"),
    ("Connection", "keep-alive"),
]


BODY = b"<html>" + b"<p>caf\xc3\xa9</p>" * 400 + b"</html>"


@pytest.fixture(scope="module")
def native() -> ModuleType:
    return native_extension("_warc")


def test_extension_is_built_and_used_in_ci() -> None:
    """CI (CI=true) must not silently measure or test the slow path."""
    if not in_ci():
        pytest.skip("only CI requires the build; elsewhere the fallback is allowed")
    from idemcrawl import _warc

    assert wr._native is _warc
    assert wr.digest_of_sha1 is _warc.sha1_base32


def python_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(wr, "_native", None)
    monkeypatch.setattr(wr, "digest_of_sha1", wr._digest_of_sha1_py)


def both_ways(
    native: ModuleType, monkeypatch: pytest.MonkeyPatch, seed: int = 11, **kw: Any
) -> wr.BuiltExchange:
    """``build_exchange(**kw)`` natively and in Python with the same record ids: equal."""
    args: dict[str, Any] = dict(
        url=URL,
        fetched_at=1_700_000_000.25,
        request_headers=REQUEST,
        status=200,
        reason="OK",
        http_version="HTTP/1.1",
        response_headers=RESPONSE,
        body=BODY,
        ip="127.0.0.1",
        metadata={"url_version": 1, "status": 200, "links": [URL + "/a"]},
    )
    args.update(kw)
    assert wr._native is native
    wr._ids.seed(seed)
    fast = wr.build_exchange(**args)
    after_fast = wr._ids.getrandbits(32)  # the same number of ids drawn
    with monkeypatch.context() as m:
        python_only(m)
        wr._ids.seed(seed)
        slow = wr.build_exchange(**args)
        after_slow = wr._ids.getrandbits(32)
    assert members(fast.blob) == members(slow.blob)
    assert fast == slow
    assert after_fast == after_slow
    return fast


CASES: dict[str, dict[str, Any]] = {
    "plain": {},
    "no ip": {"ip": None},
    "empty ip": {"ip": ""},
    "ip with a line break": {"ip": "127.0.0.1\r\nX-Forged: 1"},
    "latin-1 and wider header text": {
        "response_headers": [
            *RESPONSE,
            ("X-Caf\xe9", "na\xefve \xff"),
            ("X-Snow", "\u2603 \U0001f600"),
        ],
        "request_headers": [*REQUEST, ("X-Who", "J\xf6rg \u2603")],
    },
    "CR and LF inside fields": {
        "response_headers": [
            ("X-A", "a\r\nSet-Cookie: x=1"),
            ("X\nB", "b\r"),
            ("Content\rType", "x"),
        ],
        "request_headers": [("X-A", "1\n2"), ("Cookie\r", "c")],
        "reason": "O\r\nK",
    },
    "bytes headers as received": {
        "response_headers": (
            *((k.encode(), v.encode()) for k, v in [*RESPONSE, ("X-Raw", "\r\n")]),
            (b"X-High", b"\xe9\xff\x00"),
            (b"CONTENT-length", b"5"),
        ),
    },
    "no headers at all": {"response_headers": [], "request_headers": []},
    "kept encoding": {"decoded": False},
    "case of the rewritten names": {
        "response_headers": [
            ("content-ENCODING", "br"),
            ("TRANSFER-encoding", "x"),
            ("Content-Lengthy", "1"),
            ("X-Content-Length", "2"),
        ],
    },
    "truncated body": {"truncated": "max_bytes", "body": b"<p>cut"},
    "truncated by time": {"truncated": "read_timeout"},
    "odd truncation": {"truncated": "something else"},
    "empty body": {"body": b"", "status": 204, "reason": "No Content"},
    "POST with a body": {
        "method": "POST",
        "request_body": b'{"q": "caf\xc3\xa9"}',
        "request_headers": [*REQUEST, ("Content-Type", "application/json")],
    },
    "Host given": {"request_headers": [("host", "example.org:81"), *REQUEST]},
    "bare HTTP version": {"http_version": "1.0"},
    "lower-case HTTP version": {"http_version": "http/1.1"},
    "non-ASCII URL": {"url": "http://127.0.0.1:8000/caf\xe9?q=\u2603"},
    "URL with a fragment and an empty query": {"url": "http://h.test/a/b?#frag"},
    "URL with only a host": {"url": "https://h.test"},
    "URL with a query and no path": {"url": "https://h.test?x=1#y"},
    "IPv6 host": {"url": "http://[::1]:8080/x?y"},
    "URL with odd scheme": {"url": "git+ssh://h.test/x"},
    "non-URL target": {"url": "urn:isbn:123"},
    "a known SHA-1": {"body_sha1": hashlib.sha1(BODY).digest()},
    "a rendered DOM": {"rendered": "<html>\u2603</html>"},
    "non-ASCII method": {"method": "G\xc9T"},
    "non-text header value": {"request_headers": [("X-N", 5)]},
    "status 999": {"status": 999, "reason": ""},
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_native_exchange_is_the_python_one(
    native: ModuleType, monkeypatch: pytest.MonkeyPatch, case: str
) -> None:
    built = both_ways(native, monkeypatch, **CASES[case])
    if not CASES[case].get("url", URL).startswith("http"):
        return  # warcio reads no HTTP head in a record of another scheme (nor its payload)
    # and warcio reads it, digests checked
    it = warcio.archiveiterator.ArchiveIterator(io.BytesIO(built.blob), check_digests="raise")
    types = [r.rec_type for r in it if r.content_stream().read() is not None]
    want = ["request", "response", "metadata"] + (
        ["conversion"] if "rendered" in CASES[case] else []
    )
    assert types == want


@pytest.mark.parametrize("level", [0, 1, 3, 6, 9])
def test_every_level_gives_the_same_members(
    native: ModuleType, monkeypatch: pytest.MonkeyPatch, level: int
) -> None:
    both_ways(native, monkeypatch, level=level, seed=level)


def test_page_exchanges_from_a_spec_match(
    native: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a parser process builds (``build_page_exchange`` from the crawl's spec)."""
    spec = wr.ExchangeSpec(
        fetched_at=1_700_000_123.000001,
        request_headers=REQUEST,
        reason="OK",
        http_version="HTTP/1.1",
        response_headers=tuple((k.encode(), v.encode()) for k, v in RESPONSE),
        ip="127.0.0.1",
        metadata={"url_version": 3, "status": 200, "elapsed_s": 0.01, "wire_bytes": 99},
        decoded=True,
        truncated=None,
        method="GET",
        request_body=b"",
        level=1,
        links_cut=False,
    )
    body = random.Random(1).randbytes(3000) + b"<a href=x>" * 200
    links = [f"{URL}/{i}" for i in range(40)]
    built = []
    for python in (False, True):
        with monkeypatch.context() as m:
            if python:
                python_only(m)
            wr._ids.seed(2)
            built.append(
                wr.build_page_exchange(
                    spec, URL, 200, body, links=links, records=1, parse_error=None
                )
            )
    assert built[0] == built[1]


def test_errors_are_the_python_errors(native: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    for kw in (
        {"response_headers": [("X-Bad", "\udcff")]},  # a lone surrogate is not UTF-8
        {"request_headers": [("X-Bad", "\ud800")]},
        {"url": "http://h.test/\udcff"},
    ):
        for python in (False, True):
            with monkeypatch.context() as m:
                if python:
                    python_only(m)
                with pytest.raises(UnicodeEncodeError):
                    wr.build_exchange(
                        url=kw.get("url", URL), fetched_at=0.0,
                        request_headers=kw.get("request_headers", REQUEST), status=200,
                        reason="OK", http_version="HTTP/1.1",
                        response_headers=kw.get("response_headers", RESPONSE), body=b"x",
                        ip=None, metadata={},
                    )  # fmt: skip
    for python in (False, True):
        with monkeypatch.context() as m:
            if python:
                python_only(m)
            with pytest.raises(wr.WarcError):
                wr.build_exchange(
                    url=URL, fetched_at=0.0, request_headers=REQUEST, status=20, reason="",
                    http_version="HTTP/1.1", response_headers=RESPONSE, body=b"", ip=None,
                    metadata={},
                )  # fmt: skip


def test_record_ids_are_random_version_4_uuids(native: ModuleType) -> None:
    ids = set()
    for _ in range(300):
        built = wr.build_exchange(
            url=URL, fetched_at=0.0, request_headers=REQUEST, status=200, reason="OK",
            http_version="HTTP/1.1", response_headers=RESPONSE, body=b"x", ip=None, metadata={},
        )  # fmt: skip
        for rec in members(built.blob):
            rid = rec.split(b"WARC-Record-ID: ", 1)[1].split(b"\r\n", 1)[0].decode()
            u = uuid.UUID(rid[10:-1])
            assert rid == f"<urn:uuid:{u}>" and u.version == 4 and u.variant == uuid.RFC_4122
            ids.add(rid)
    assert len(ids) == 900


def test_sha1_base32(native: ModuleType) -> None:
    rng = random.Random(4)
    for raw in (bytes(20), b"\xff" * 20, *(rng.randbytes(20) for _ in range(300))):
        want = "sha1:" + base64.b32encode(raw).decode()
        assert native.sha1_base32(raw) == want == wr._digest_of_sha1_py(raw)
    with pytest.raises(ValueError):
        native.sha1_base32(b"short")


def test_warc_date(native: ModuleType) -> None:
    rng = random.Random(6)
    values: list[float] = [0.0, 0, 1, 1.5, 1_700_000_000, 1_700_000_000.000001, 2e9 + 0.25]
    values += [1_796_000_000.9999996, 5e-7, 1.5e-6, 2.5e-6, 99_999_999_999.9999]
    values += [rng.uniform(0, 4e9) for _ in range(2000)]
    values += [rng.randrange(10**16) / 2_000_000 for _ in range(2000)]  # near half microseconds
    values += [rng.randrange(10**10) for _ in range(200)]
    for ts in values:
        assert native.warc_date(ts) == wr.warc_date(ts), ts
    for odd in (-1.0, -5, float("nan"), float("inf"), 1e12, 10**12, "1", True):
        assert native.warc_date(odd) is None


# --- the heads on generated input --------------------------------------------------------------

TEXT = st.text(st.sampled_from("aZ09-;:= \r\n\t\xe9\xff\u0100\u2603\U0001f600"), max_size=12)
NAMES = st.one_of(
    TEXT,
    st.sampled_from(["Content-Length", "content-encoding", "TRANSFER-ENCODING", "Host", "hOsT"]),
)


def python_response_head(
    start: str, headers: list[Any], length: int, keep: bool
) -> tuple[bytes, list[list[str]]]:
    if headers and isinstance(headers[0][0], bytes):
        headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in headers]
    stored, original = wr.stored_headers(headers, length, keep_encoding=keep)
    return wr.http_head(start, stored), original


@settings(max_examples=300, deadline=None)
@given(
    headers=st.lists(st.tuples(NAMES, TEXT), max_size=6),
    as_bytes=st.booleans(),
    length=st.integers(0, 10**9),
    keep=st.booleans(),
    start=TEXT,
)
def test_response_heads(
    native: ModuleType,
    headers: list[tuple[str, str]],
    as_bytes: bool,
    length: int,
    keep: bool,
    start: str,
) -> None:
    pairs: list[Any] = headers
    if as_bytes:
        pairs = [(k.encode("utf-8"), v.encode("utf-8")) for k, v in headers]
    assert native.response_head(start, pairs, length, keep) == python_response_head(
        start, pairs, length, keep
    )


URL_CHARS = st.sampled_from("ab/?#:[]@.%;=&+- \t\xe9~")


def urls() -> st.SearchStrategy[str]:
    return st.builds(
        lambda scheme, rest: scheme + rest,
        st.sampled_from(["http://", "https://", "HTTP://", "h2c+x://", "x:", "1a://", "", "//"]),
        st.text(URL_CHARS, max_size=20),
    )


@settings(max_examples=500, deadline=None)
@given(
    url=urls(),
    version=st.sampled_from(["HTTP/1.1", "1.1", "http/2", "HTTP/", "Http", "HTTP/\r\n"]),
    method=st.sampled_from(["GET", "POST", "M\nX"]),
    headers=st.lists(st.tuples(NAMES, TEXT), max_size=4),
)
def test_request_heads(
    native: ModuleType, url: str, version: str, method: str, headers: list[tuple[str, str]]
) -> None:
    got = native.request_head(url, version, headers, method)
    try:
        want = wr.request_head(url, version, headers, method)
    except (ValueError, UnicodeEncodeError):
        assert got is None  # urlsplit refused it: the extension left it to Python
        return
    assert got is None or got == want


def plain_urls() -> Iterator[str]:
    yield URL
    yield "https://h.test"
    yield "http://h.test:81/a;b?c=d&e#f"
    yield "http://user@h.test/%20x?"


@pytest.mark.parametrize("url", list(plain_urls()))
def test_plain_urls_are_taken_natively(native: ModuleType, url: str) -> None:
    head = native.request_head(url, "HTTP/1.1", REQUEST, "GET")
    assert head is not None and head == wr.request_head(url, "HTTP/1.1", REQUEST, "GET")
    parts = urlsplit(url)
    assert head.startswith(f"GET {parts.path or '/'}".encode())
