"""Tests for idemcrawl.warc_records: records by hand, exchanges built in a parser process."""

from __future__ import annotations

import base64
import hashlib
import io
import os
import pickle
import random
import uuid
import zlib
from pathlib import Path
from typing import Any

import pytest
import warcio.archiveiterator
from fastwarc.warc import ArchiveIterator as FastIterator
from fastwarc.warc import WarcRecordType

from idemcrawl import warc_records as wr
from idemcrawl.parse import ParseJob, Parser, ParseResult
from idemcrawl.warc import WarcStore, parse_metadata, read_response, verify_directory

URL = "http://127.0.0.1:8000/shop/p/7?colour=red"
REQUEST = [("User-Agent", "idemcrawl/0.1"), ("Accept-Encoding", "gzip, br")]
RESPONSE = [
    ("Content-Type", "text/html; charset=utf-8"),
    ("Content-Encoding", "gzip"),
    ("Content-Length", "99"),
]


def spec(**kw: Any) -> wr.ExchangeSpec:
    args: dict[str, Any] = dict(
        fetched_at=1_700_000_000.5,
        request_headers=REQUEST,
        reason="OK",
        http_version="HTTP/1.1",
        response_headers=RESPONSE,
        ip="127.0.0.1",
        metadata={"url_version": 3, "status": 200, "elapsed_s": 0.01, "wire_bytes": 99},
        decoded=True,
        truncated=None,
        method="GET",
        request_body=b"",
        level=1,
        links_cut=False,
    )
    args.update(kw)
    return wr.ExchangeSpec(**args)


def members(blob: bytes) -> list[bytes]:
    """The gzip members of ``blob``, each decompressed (one WARC record each)."""
    out = []
    while blob:
        d = zlib.decompressobj(zlib.MAX_WBITS | 16)
        out.append(d.decompress(blob))
        assert d.eof
        blob = d.unused_data
    return out


def test_base32_digests_and_record_ids() -> None:
    rng = random.Random(3)
    for _ in range(500):
        raw = rng.randbytes(20)
        assert wr.digest_of_sha1(raw) == "sha1:" + base64.b32encode(raw).decode()
    with pytest.raises(ValueError):
        wr.digest_of_sha1(b"short")
    ids = {wr.new_record_id() for _ in range(2000)}
    assert len(ids) == 2000
    for rid in list(ids)[:50]:
        assert rid.startswith("<urn:uuid:") and rid.endswith(">")
        u = uuid.UUID(rid[10:-1])
        assert u.version == 4 and u.variant == uuid.RFC_4122
    # A spider that seeds the random module must not make record ids repeat.
    random.seed(7)
    a = wr.new_record_id()
    random.seed(7)
    assert wr.new_record_id() != a


def test_http_heads_keep_bytes_and_never_forge_lines() -> None:
    head = wr.http_head("HTTP/1.1 200 OK", [("X-A", "caf\xe9"), ("X-B", "snow \u2603")])
    # latin-1 as received where it fits, UTF-8 only for the field that does not
    assert head == b"HTTP/1.1 200 OK\r\nX-A: caf\xe9\r\nX-B: snow \xe2\x98\x83\r\n\r\n"
    forged = wr.http_head("HTTP/1.1 200 OK", [("X-A", "a\r\nSet-Cookie: x=1"), ("X\nB", "b")])
    assert forged == b"HTTP/1.1 200 OK\r\nX-A: a  Set-Cookie: x=1\r\nX B: b\r\n\r\n"
    assert wr.http_head("GET / HTTP/1.1", []) == b"GET / HTTP/1.1\r\n\r\n"


def test_a_built_exchange_reads_with_both_libraries(tmp_path: Path) -> None:
    body = b"<html>" + bytes(range(256)) * 30 + b"</html>"
    built = wr.build_page_exchange(
        spec(), URL, 200, body, links=[URL + "/a", URL + "/b"], records=2, parse_error=None
    )
    assert pickle.loads(pickle.dumps(built)) == built
    raw = members(built.blob)
    assert len(raw) == 3
    # the response member is where the exchange says
    response_member = built.blob[built.response_at : built.response_at + built.response_length]
    assert members(response_member) == [raw[1]]
    assert built.payload_digest == wr.payload_digest(body)

    it = warcio.archiveiterator.ArchiveIterator(io.BytesIO(built.blob), check_digests="raise")
    recs = [(r.rec_type, r.rec_headers, r.content_stream().read()) for r in it]
    assert [t for t, _, _ in recs] == ["request", "response", "metadata"]
    request, response, metadata = (h for _, h, _ in recs)
    assert response.get_header("WARC-Record-ID") == built.response_id
    assert request.get_header("WARC-Concurrent-To") == built.response_id
    assert metadata.get_header("WARC-Concurrent-To") == built.response_id
    assert response.get_header("WARC-Date") == "2023-11-14T22:13:20.500000Z"
    assert response.get_header("WARC-Payload-Digest") == built.payload_digest
    assert recs[1][2] == body  # the decoded body, its headers rewritten (no second decoding)
    assert parse_metadata(recs[2][2]) == {
        "url_version": 3,
        "status": 200,
        "elapsed_s": 0.01,
        "wire_bytes": 99,
        "parse_error": None,
        "records": 2,
        "links": [URL + "/a", URL + "/b"],
        "original_headers": [["Content-Encoding", "gzip"], ["Content-Length", "99"]],
    }
    fast = [
        (r.record_type, r.verify_block_digest(consume=False))
        for r in FastIterator(io.BytesIO(built.blob), parse_http=False)
    ]
    assert fast == [
        (WarcRecordType.request, True),
        (WarcRecordType.response, True),
        (WarcRecordType.metadata, True),
    ]

    # appended by the store: the pointer reads back, and the file verifies end to end
    with WarcStore(str(tmp_path), "slot00") as store:
        ptr = store.append_exchange(built)
    assert read_response(str(tmp_path), ptr)[2] == body
    report = verify_directory(str(tmp_path))
    assert report["ok"], report["errors"]
    assert report["responses_verified"] == 1


def test_a_redirect_past_the_limit_lists_no_links() -> None:
    built = wr.build_page_exchange(
        spec(links_cut=True), URL, 302, b"", links=[URL + "/a"], records=0, parse_error=None
    )
    assert "outlink" not in members(built.blob)[2].decode()


def test_the_parser_builds_the_exchange_with_its_links() -> None:
    parser = Parser(None, frozenset({"http://127.0.0.1:8000"}), "host")
    body = b'<html><body><a href="/a">a</a><a href="/b">b</a></body></html>'
    headers = {"content-type": "text/html"}
    job = ParseJob(URL, 200, headers, body, 0, warc=spec())
    result = parser.run(job)
    assert result.warc is not None
    again = pickle.loads(pickle.dumps(result))  # as it crosses the process boundary
    assert again.warc == result.warc and [u.url for u in again.links] == [
        u.url for u in result.links
    ]
    meta = parse_metadata(members(result.warc.blob)[2].split(b"\r\n\r\n", 1)[1][:-4])
    assert meta["links"] == [u.url for u in result.links] and len(meta["links"]) == 2
    assert parser.run(ParseJob(URL, 200, headers, body, 0)).warc is None


def test_an_exchange_the_parser_cannot_build_is_left_to_the_crawl_process() -> None:
    parser = Parser(None, frozenset({"http://127.0.0.1:8000"}), "host")
    body = b'<html><body><a href="/a">a</a></body></html>'
    bad = spec(metadata={"not json": object()})
    result = parser.run(ParseJob(URL, 200, {"content-type": "text/html"}, body, 0, warc=bad))
    assert result.warc is None and result.error is None and len(result.links) == 1
    assert isinstance(pickle.loads(pickle.dumps(result)), ParseResult)


@pytest.mark.parametrize("level", [0, 1, 3, 4, 9])
def test_members_are_compressed_at_the_given_level(level: int) -> None:
    body = os.urandom(100) + b"<p>text</p>" * 300
    built = wr.build_page_exchange(
        spec(level=level), URL, 200, body, links=[], records=0, parse_error=None
    )
    raw = members(built.blob)
    assert b"".join(wr.gzip_member(r, level) for r in raw) == built.blob
    assert hashlib.sha1(raw[1]).digest()  # each member decompressed on its own


def test_base32_digest_of_the_extreme_values() -> None:
    # Every bit of the spread reaches its own letter: all zeros, all ones, one bit at a time.
    for raw in (bytes(20), b"\xff" * 20, *((1 << i).to_bytes(20, "big") for i in range(160))):
        assert wr.digest_of_sha1(raw) == "sha1:" + base64.b32encode(raw).decode()


def test_warc_date_is_the_strftime_form_with_microseconds() -> None:
    from datetime import UTC, datetime

    for ts in (0.0, 1.5, 1_700_000_000.0, 1_700_000_000.000001, 1_796_000_000.9999996, 2e9 + 0.25):
        want = datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        assert wr.warc_date(ts) == want


def test_the_spec_may_carry_the_headers_as_received_bytes() -> None:
    """The crawl process hands the fetcher's header bytes over undecoded; the exchange is the
    same as with the decoded pairs (latin-1, so any received byte comes back as it was)."""
    received = [*RESPONSE, ("X-Caf\xe9", "na\xefve \xff")]
    wire = tuple((k.encode("latin-1"), v.encode("latin-1")) for k, v in received)
    body = b"<p>x</p>" * 50
    built = []
    for headers in (received, wire):
        wr._ids.seed(5)
        built.append(
            wr.build_page_exchange(
                spec(response_headers=headers),
                URL,
                200,
                body,
                links=[],
                records=0,
                parse_error=None,
            )
        )
    assert built[0] == built[1]
    assert b"X-Caf\xe9: na\xefve \xff\r\n" in members(built[1].blob)[1]


def test_outlinks_that_are_not_text_are_written_as_text() -> None:
    fields = wr.metadata_fields(URL, {"links": (x for x in [URL + "/a", 7])})
    assert fields.startswith(f"outlink: {URL}/a\r\noutlink: 7\r\n".encode())
    with pytest.raises(wr.WarcError):
        wr.metadata_fields(URL, {"links": [URL, "http://x/ y"]})
