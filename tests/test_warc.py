"""Tests for idemcrawl.warc: records, pointers, rotation, revisits, tail repair, verification."""

from __future__ import annotations

import base64
import hashlib
import os
import random
import shutil
import signal
import threading
import time
import zlib
from pathlib import Path
from typing import Any

import pytest
import warcio.archiveiterator
from fastwarc.warc import ArchiveIterator as FastIterator

from idemcrawl import warc
from idemcrawl.warc import (
    RENDERED_PREFIX,
    WarcError,
    WarcPointer,
    WarcStore,
    metadata_fields,
    parse_metadata,
    payload_digest,
    read_response,
    repair_tail,
    store_download,
    verify_directory,
    write_cost,
)

from .helpers import spawn_python

URL = "http://127.0.0.1:8000/product/7?colour=red"
REQUEST = [("User-Agent", "idemcrawl/0.1"), ("Accept-Encoding", "gzip, br")]


def exchange(store: WarcStore, body: bytes, url: str = URL, **kw: Any) -> WarcPointer:
    args: dict[str, Any] = dict(
        url=url,
        fetched_at=1_700_000_000.123456,
        request_headers=REQUEST,
        status=200,
        reason="OK",
        http_version="HTTP/1.1",
        response_headers=[
            ("Content-Type", "text/html; charset=utf-8"),
            ("Content-Encoding", "gzip"),
            ("Content-Length", "321"),
            ("Transfer-Encoding", "chunked"),
        ],
        body=body,
        ip="127.0.0.1",
        metadata={"links": [f"{url}/a", f"{url}/b"], "elapsed": 0.25},
    )
    args.update(kw)
    return store.write_exchange(**args)


def revisit(store: WarcStore, **kw: Any) -> WarcPointer:
    args: dict[str, Any] = dict(
        url=URL,
        fetched_at=1_700_000_100.0,
        request_headers=[*REQUEST, ("If-None-Match", '"v1"')],
        status=304,
        reason="Not Modified",
        http_version="HTTP/1.1",
        response_headers=[("ETag", '"v1"')],
        profile="server-not-modified",
        refers_to=None,
        refers_to_uri=None,
        refers_to_date=None,
        payload_digest=None,
        ip="127.0.0.1",
    )
    args.update(kw)
    return store.write_revisit(**args)


def warcio_records(path: Path) -> list[tuple[str, int, int, Any]]:
    """(type, offset, length, record headers) of every record, digests checked, via warcio."""
    out = []
    with open(path, "rb") as f:
        it = warcio.archiveiterator.ArchiveIterator(f, check_digests="raise")
        for record in it:
            while record.raw_stream.read(1 << 16):
                pass
            out.append(
                (
                    record.rec_type,
                    it.get_record_offset(),
                    it.get_record_length(),
                    record.rec_headers,
                )
            )
    return out


def fastwarc_records(path: Path) -> list[tuple[str, int, bool]]:
    """(type, offset, block digest ok) of every record via FastWARC."""
    with open(path, "rb") as f:
        return [
            (str(r.record_type), r.stream_pos, r.verify_block_digest(consume=False))
            for r in FastIterator(f, parse_http=False)
        ]


def pages(n: int, seed: int = 1) -> list[bytes]:
    rng = random.Random(seed)
    return [
        rng.randbytes(rng.randint(0, 3000)) + b"<p>page</p>" * rng.randint(0, 500) for _ in range(n)
    ]


# --- format -----------------------------------------------------------------------------------


def test_payload_digest_is_base32_sha1() -> None:
    assert payload_digest(b"") == "sha1:3I42H3S6NNFQ2MSVX7XZKYAYSCX5QBYJ"
    sha1_abc = bytes.fromhex("a9993e364706816aba3e25717850c26c9cd0d89d")  # FIPS 180 vector
    assert payload_digest(b"abc") == "sha1:" + base64.b32encode(sha1_abc).decode()


def test_exchange_records_read_by_both_libraries(tmp_path: Path) -> None:
    body = b"<html>" + bytes(range(256)) * 40 + b"</html>"
    with WarcStore(str(tmp_path), "slot00") as store:
        ptr = exchange(store, body)
    path = tmp_path / "slot00-00000.warc.gz"
    assert ptr.file == path.name
    assert ptr.payload_digest == payload_digest(body)

    records = warcio_records(path)
    assert [r[0] for r in records] == ["warcinfo", "request", "response", "metadata"]
    assert [r[1] for r in records] == [r[1] for r in fastwarc_records(path)]
    assert all(ok for _, _, ok in fastwarc_records(path))
    _, offset, length, response = records[2]
    assert (offset, length) == (ptr.offset, ptr.length)
    assert response.protocol == "WARC/1.1"
    assert response.get_header("WARC-Date") == "2023-11-14T22:13:20.123456Z"
    assert response.get_header("WARC-IP-Address") == "127.0.0.1"
    assert response.get_header("WARC-Target-URI") == URL
    assert response.get_header("WARC-Payload-Digest") == ptr.payload_digest
    response_id = response.get_header("WARC-Record-ID")
    assert records[1][3].get_header("WARC-Concurrent-To") == response_id
    assert records[3][3].get_header("WARC-Concurrent-To") == response_id
    # Named fields, as Heritrix writes them: replay tools leave this type out of their index.
    assert records[3][3].get_header("Content-Type") == "application/warc-fields"
    assert records[0][3].get_header("WARC-Filename") == path.name

    # The request record: origin-form target, Host added, headers as sent.
    with open(path, "rb") as f:
        got = {
            r.rec_type: (r.http_headers, r.content_stream().read())
            for r in warcio.archiveiterator.ArchiveIterator(f)
        }
    req_headers, _ = got["request"]
    assert f"{req_headers.protocol} {req_headers.statusline}" == (
        "GET /product/7?colour=red HTTP/1.1"
    )
    assert req_headers.get_header("Host") == "127.0.0.1:8000"
    assert req_headers.get_header("Accept-Encoding") == "gzip, br"
    # The metadata record: the caller's facts plus the renamed originals.
    meta = parse_metadata(got["metadata"][1])
    assert meta["links"] == [f"{URL}/a", f"{URL}/b"]
    assert meta["elapsed"] == 0.25
    assert meta["original_headers"] == [
        ["Content-Encoding", "gzip"],
        ["Content-Length", "321"],
        ["Transfer-Encoding", "chunked"],
    ]
    # warcio's content_stream would decode a Content-Encoding: the body must come back as is.
    assert got["response"][1] == body


def test_rendered_dom_is_a_conversion_record_beside_the_raw_response(tmp_path: Path) -> None:
    body = b"<html><body><ul id=items></ul><script src=/app.js></script></body></html>"
    dom = "<html><head></head><body><ul id=\"items\"><li>caf\u00e9</li></ul></body></html>"
    with WarcStore(str(tmp_path), "slot00") as store:
        ptr = exchange(store, body, rendered=dom)
    path = tmp_path / "slot00-00000.warc.gz"
    records = warcio_records(path)
    assert [r[0] for r in records] == ["warcinfo", "request", "response", "metadata", "conversion"]
    assert all(ok for _, _, ok in fastwarc_records(path))
    response, conversion = records[2][3], records[4][3]
    assert conversion.get_header("WARC-Refers-To") == response.get_header("WARC-Record-ID")
    # Its own URI: replay tools keep serving the raw response for the page's URL.
    assert conversion.get_header("WARC-Target-URI") == RENDERED_PREFIX + URL
    assert (records[2][1], records[2][2]) == (ptr.offset, ptr.length)
    assert read_response(str(tmp_path), ptr)[2] == body
    with open(path, "rb") as f:
        got = [
            r.content_stream().read()
            for r in warcio.archiveiterator.ArchiveIterator(f)
            if r.rec_type == "conversion"
        ]
    assert got == [dom.encode()]
    assert verify_directory(str(tmp_path))["ok"]


def test_pointer_round_trip_and_header_rewrite(tmp_path: Path) -> None:
    bodies = [b"", b"x", bytes(range(256)) * 300, b"caf\xe9 \x00 \r\n\r\n WARC/1.1\r\n"]
    with WarcStore(str(tmp_path), "slot01") as store:
        ptrs = [
            exchange(
                store,
                body,
                url=f"{URL}&n={i}",
                response_headers=[("X-Name", "caf\xe9"), ("Content-Length", "999")],
                status=404 if i == 1 else 200,
                reason="" if i == 1 else "OK",
            )
            for i, body in enumerate(bodies)
        ]
    for i, (ptr, body) in enumerate(zip(ptrs, bodies, strict=True)):
        status, headers, got = read_response(str(tmp_path), ptr)
        assert got == body
        assert status == (404 if i == 1 else 200)
        assert headers == [
            ("X-Name", "caf\xe9"),  # latin-1 round trip, as the fetcher decodes headers
            ("X-Original-Content-Length", "999"),
            ("Content-Length", str(len(body))),
        ]


def test_body_kept_encoded_keeps_content_encoding_and_truncation_is_marked(
    tmp_path: Path,
) -> None:
    body = b"\x28\xb5\x2f\xfd not decoded"
    with WarcStore(str(tmp_path), "slot02") as store:
        ptr = exchange(
            store,
            body,
            response_headers=[("Content-Encoding", "x-unknown"), ("Content-Length", "20")],
            decoded=False,
            truncated="max_bytes",
        )
    _, headers, got = read_response(str(tmp_path), ptr)
    assert got == body
    assert ("Content-Encoding", "x-unknown") in headers
    assert ("Content-Length", str(len(body))) in headers
    response = next(r for r in warcio_records(tmp_path / ptr.file) if r[0] == "response")[3]
    assert response.get_header("WARC-Truncated") == "length"
    assert warc.warc_truncated("read_timeout") == "time"
    assert warc.warc_truncated("decode_error: gzip: bad") == "unspecified"
    assert warc.warc_truncated(None) is None


def test_bad_input_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    with WarcStore(str(tmp_path), "slot03") as store:
        exchange(store, b"first")
        path = tmp_path / store.current_file
        size = path.stat().st_size
        with pytest.raises(WarcError, match="JSON"):
            exchange(store, b"x", metadata={"when": object()})
        with pytest.raises(WarcError, match="reserved"):
            exchange(store, b"x", metadata={"original_headers": []})
        with pytest.raises(WarcError, match="WARC-Target-URI"):
            exchange(store, b"x", url="http://127.0.0.1/a b")
        with pytest.raises(WarcError, match="three-digit"):
            exchange(store, b"x", status=42)
        with pytest.raises(WarcError, match="profile"):
            revisit(store, profile="not-modified")
        with pytest.raises(WarcError, match="digest"):
            revisit(store, profile="identical-payload-digest")
        assert path.stat().st_size == size
    with pytest.raises(WarcError, match="closed"):
        exchange(store, b"late")
    store.close()  # idempotent
    for prefix in ("", "../x", "a/b", "-x", "x y"):
        with pytest.raises(WarcError, match="prefix"):
            WarcStore(str(tmp_path), prefix)
    assert verify_directory(str(tmp_path))["ok"]


def test_header_injection_cannot_forge_lines(tmp_path: Path) -> None:
    with WarcStore(str(tmp_path), "slot04") as store:
        ptr = exchange(store, b"ok", response_headers=[("X-Evil", "a\r\nSet-Cookie: b")])
    _, headers, body = read_response(str(tmp_path), ptr)
    assert body == b"ok"
    assert ("X-Evil", "a  Set-Cookie: b") in headers
    assert not any(name == "Set-Cookie" for name, _ in headers)


# --- pointers and digests ---------------------------------------------------------------------


def test_digest_mismatch_and_bad_pointers_are_detected(tmp_path: Path) -> None:
    body = b"<html>the real body</html>" * 20
    with WarcStore(str(tmp_path), "slot05") as store:
        ptr = exchange(store, body)
        other = exchange(store, b"another page")
    d = str(tmp_path)
    wrong = WarcPointer(ptr.file, ptr.offset, ptr.length, payload_digest(b"something else"))
    with pytest.raises(WarcError, match="digest mismatch"):
        read_response(d, wrong)
    with pytest.raises(WarcError, match="gzip member"):
        read_response(d, WarcPointer(ptr.file, ptr.offset + 1, ptr.length, ptr.payload_digest))
    with pytest.raises(WarcError, match="gzip member"):
        read_response(d, WarcPointer(ptr.file, ptr.offset, ptr.length + 5, ptr.payload_digest))
    with pytest.raises(WarcError, match="past the end"):
        read_response(d, WarcPointer(ptr.file, ptr.offset, 10**9, ptr.payload_digest))
    with pytest.raises(WarcError, match="invalid WARC pointer"):
        read_response(d, WarcPointer("../etc/passwd", 0, 10, ptr.payload_digest))
    with pytest.raises(WarcError, match="cannot read"):
        read_response(d, WarcPointer("missing.warc.gz", 0, 10, ptr.payload_digest))
    records = warcio_records(tmp_path / ptr.file)
    request_offset = next(r[1] for r in records if r[0] == "request")
    request_len = ptr.offset - request_offset
    with pytest.raises(WarcError, match="request record, not a response"):
        read_response(d, WarcPointer(ptr.file, request_offset, request_len, ptr.payload_digest))

    # Tamper with the stored body (a valid gzip member whose content no longer matches its
    # digests): read_response and both libraries in verify_directory must notice.
    path = tmp_path / ptr.file
    data = path.read_bytes()
    raw = zlib.decompress(data[ptr.offset : ptr.offset + ptr.length], 31)
    tampered = raw.replace(b"the real body", b"the fake body")
    assert tampered != raw
    member = zlib.compressobj(6, zlib.DEFLATED, 31)
    new_member = member.compress(tampered) + member.flush()
    path.write_bytes(data[: ptr.offset] + new_member + data[ptr.offset + ptr.length :])
    moved = WarcPointer(ptr.file, ptr.offset, len(new_member), ptr.payload_digest)
    with pytest.raises(WarcError, match="digest mismatch"):
        read_response(d, moved)
    report = verify_directory(d)
    assert not report["ok"]
    assert any("warcio" in e and "digest failed" in e for e in report["errors"])
    assert any("FastWARC" in e and "digest failed" in e for e in report["errors"])
    assert report["responses_verified"] == 1  # the untouched one
    shifted = len(new_member) - ptr.length
    good = WarcPointer(other.file, other.offset + shifted, other.length, other.payload_digest)
    assert read_response(d, good)[2] == b"another page"
    with pytest.raises(WarcError, match="verification failed"):
        verify_directory(d, strict=True)


# --- revisits ---------------------------------------------------------------------------------


def test_revisit_records(tmp_path: Path) -> None:
    body = b"<html>same</html>" * 50
    d = str(tmp_path)
    with WarcStore(d, "slot06") as store:
        original = exchange(store, body)
        not_modified = revisit(store, refers_to=original)
        identical = revisit(
            store,
            status=200,
            reason="OK",
            response_headers=[("Content-Length", "850"), ("Content-Encoding", "gzip")],
            profile="identical-payload-digest",
            refers_to=original,
            refers_to_uri="http://127.0.0.1:8000/elsewhere",
            refers_to_date=1_600_000_000.5,
        )
        # The referenced file was archived away: the optional WARC-Refers-To is dropped.
        gone = WarcPointer("slot99-00000.warc.gz", 0, 100, original.payload_digest)
        orphan = revisit(store, refers_to=gone, refers_to_uri=URL, refers_to_date=1.0)
        bare = revisit(store)
    assert identical.payload_digest == original.payload_digest == not_modified.payload_digest
    assert bare.payload_digest == ""
    with pytest.raises(WarcError, match="revisit record, not a response"):
        read_response(d, not_modified)

    records = warcio_records(tmp_path / original.file)
    by_offset = {r[1]: r for r in records}
    response_id = by_offset[original.offset][3].get_header("WARC-Record-ID")
    nm = by_offset[not_modified.offset]
    assert nm[0] == "revisit" and nm[2] == not_modified.length
    h = nm[3]
    assert h.get_header("WARC-Profile").endswith("/warc/1.1/revisit/server-not-modified")
    assert h.get_header("WARC-Refers-To") == response_id
    assert h.get_header("WARC-Refers-To-Target-URI") == URL
    assert h.get_header("WARC-Refers-To-Date") == "2023-11-14T22:13:20.123456Z"
    assert h.get_header("WARC-Payload-Digest") == original.payload_digest
    h = by_offset[identical.offset][3]
    assert h.get_header("WARC-Profile").endswith("/revisit/identical-payload-digest")
    assert h.get_header("WARC-Refers-To") == response_id
    assert h.get_header("WARC-Refers-To-Target-URI") == "http://127.0.0.1:8000/elsewhere"
    assert h.get_header("WARC-Refers-To-Date") == "2020-09-13T12:26:40.500000Z"
    h = by_offset[orphan.offset][3]
    assert h.get_header("WARC-Refers-To") is None
    assert h.get_header("WARC-Refers-To-Date") == "1970-01-01T00:00:01.000000Z"
    assert by_offset[bare.offset][3].get_header("WARC-Payload-Digest") is None
    # A revisit's request names the revisit.
    revisit_ids = {r[3].get_header("WARC-Record-ID") for r in records if r[0] == "revisit"}
    concurrent = {r[3].get_header("WARC-Concurrent-To") for r in records if r[0] == "request"}
    assert revisit_ids < concurrent

    with open(tmp_path / original.file, "rb") as f:
        stored = {
            r.rec_headers.get_header("WARC-Record-ID"): r.http_headers
            for r in warcio.archiveiterator.ArchiveIterator(f)
            if r.rec_type == "revisit"
        }
    headers = stored[by_offset[identical.offset][3].get_header("WARC-Record-ID")]
    assert headers.get_header("Content-Encoding") is None  # never announce an encoding
    assert headers.get_header("X-Original-Content-Encoding") == "gzip"

    report = verify_directory(d)
    assert report["ok"], report["errors"]
    assert report["records"] == {
        "metadata": 1,
        "request": 5,
        "response": 1,
        "revisit": 4,
        "warcinfo": 1,
    }

    wrong = WarcPointer(original.file, original.offset, original.length, payload_digest(b"no"))
    with WarcStore(d, "slot06") as store, pytest.raises(WarcError, match="payload digest"):
        revisit(store, refers_to=wrong)


# --- rotation ---------------------------------------------------------------------------------


def test_rotation_names_and_reopen(tmp_path: Path) -> None:
    d = str(tmp_path)
    (tmp_path / "slot1-other.warc.gz").write_bytes(b"not ours")  # other names are ignored
    with WarcStore(d, "slot10", max_file_bytes=4000) as store:
        ptrs = [exchange(store, body) for body in pages(12)]
    names = sorted(p.name for p in tmp_path.glob("slot10-*.warc.gz"))
    assert len(names) >= 3
    assert names == [f"slot10-{i:05d}.warc.gz" for i in range(len(names))]
    assert {p.file for p in ptrs} == set(names)
    for ptr, body in zip(ptrs, pages(12), strict=True):
        assert read_response(d, ptr)[2] == body
    (tmp_path / "slot1-other.warc.gz").unlink()
    report = verify_directory(d)
    assert report["ok"], report["errors"]
    assert all(f["records"]["warcinfo"] == 1 for f in report["files"])
    assert report["records"]["response"] == 12

    # Reopen: a last file below the limit is continued, one at the limit is rolled over.
    last = tmp_path / names[-1]
    with WarcStore(d, "slot10", max_file_bytes=10**6) as store:
        assert store.current_file == names[-1]
        size = last.stat().st_size
        ptr = exchange(store, b"appended")
        assert ptr.file == names[-1] and ptr.offset > size
    with WarcStore(d, "slot10", max_file_bytes=last.stat().st_size) as store:
        assert store.current_file == f"slot10-{len(names):05d}.warc.gz"
    # A new prefix in the same directory starts its own sequence.
    with WarcStore(d, "slot1") as store:
        assert store.current_file == "slot1-00000.warc.gz"
    report = verify_directory(d)
    assert report["ok"], report["errors"]
    assert report["records"]["warcinfo"] == len(names) + 2


# --- tail repair ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sample_file(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[int]]:
    """A WARC file with small, large (multi-chunk) and incompressible members; its boundaries."""
    d = tmp_path_factory.mktemp("sample")
    rng = random.Random(5)
    with WarcStore(str(d), "sample") as store:
        for i, body in enumerate(pages(10, seed=2)):
            exchange(store, body, url=f"{URL}&p={i}")
            if i == 3:
                exchange(store, rng.randbytes(200_000), url=f"{URL}&big")  # > one read chunk
            if i == 6:
                revisit(store)
    path = d / "sample-00000.warc.gz"
    boundaries = [r[1] for r in warcio_records(path)] + [path.stat().st_size]
    return path, boundaries


def check_clean(path: Path, expected_records: int) -> None:
    """Both libraries read the file to its end; every record's digests verify."""
    records = warcio_records(path)  # check_digests="raise"
    fast = fastwarc_records(path)
    assert len(records) == len(fast) == expected_records
    assert [r[1] for r in records] == [r[1] for r in fast]
    assert all(ok for _, _, ok in fast)
    if records:
        assert records[-1][1] + records[-1][2] == path.stat().st_size


def test_repair_tail_at_many_offsets(sample_file: tuple[Path, list[int]], tmp_path: Path) -> None:
    path, boundaries = sample_file
    size = boundaries[-1]
    data = path.read_bytes()
    rng = random.Random(11)
    cuts = {0, 1, 2, 9, 10, size - 1, size - 4, size - 8, size - 9}
    for b in boundaries[1:-1]:
        cuts |= {b - 9, b - 8, b - 1, b, b + 1, b + 3, b + 10}
    cuts |= {rng.randrange(size) for _ in range(60)}
    target = tmp_path / "cut.warc.gz"
    for cut in sorted(c for c in cuts if 0 <= c <= size):
        target.write_bytes(data[:cut])
        expected = max(b for b in [0, *boundaries] if b <= cut)
        assert repair_tail(str(target)) == cut - expected, cut
        assert target.stat().st_size == expected, cut
        check_clean(target, boundaries.index(expected) if expected else 0)
        assert repair_tail(str(target)) == 0  # idempotent
    assert repair_tail(str(path)) == 0


def test_store_reopens_after_cut_and_keeps_every_complete_record(
    sample_file: tuple[Path, list[int]], tmp_path: Path
) -> None:
    path, boundaries = sample_file
    data = path.read_bytes()
    rng = random.Random(3)
    for n, cut in enumerate(rng.sample(range(1, len(data)), 6)):
        d = tmp_path / f"d{n}"
        d.mkdir()
        (d / "sample-00000.warc.gz").write_bytes(data[:cut])
        kept = max(b for b in [0, *boundaries] if b <= cut)
        with WarcStore(str(d), "sample") as store:
            assert store.repaired_bytes == cut - kept
            ptr = exchange(store, b"after the crash")
        assert read_response(str(d), ptr)[2] == b"after the crash"
        report = verify_directory(str(d))
        assert report["ok"], report["errors"]
        kept_records = boundaries.index(kept) if kept else 0
        # warcinfo is rewritten only when the cut emptied the file.
        assert sum(report["records"].values()) == max(kept_records, 1) + 3


def test_repair_tail_cuts_garbage_but_refuses_foreign_files(
    sample_file: tuple[Path, list[int]], tmp_path: Path
) -> None:
    path, _ = sample_file
    data = path.read_bytes()
    target = tmp_path / "x.warc.gz"
    # Garbage, a complete gzip member that is not a WARC record, a member with a wrong length.
    not_warc = zlib.compressobj(6, zlib.DEFLATED, 31)
    member = not_warc.compress(b"hello, not a WARC record") + not_warc.flush()
    short = zlib.compressobj(6, zlib.DEFLATED, 31)
    lying = short.compress(b"WARC/1.1\r\nContent-Length: 50\r\n\r\nshort\r\n\r\n") + short.flush()
    for tail in (b"\x1f\x8b\x08garbage", os.urandom(5000), member, lying, member + member):
        target.write_bytes(data + tail)
        assert repair_tail(str(target)) == len(tail)
        check_clean(target, len(warcio_records(path)))
    foreign = tmp_path / "foreign.warc.gz"
    foreign.write_bytes(b"not a warc" * 10_000)
    with pytest.raises(WarcError, match="no complete"):
        repair_tail(str(foreign))
    assert foreign.stat().st_size == 100_000
    small = tmp_path / "small.warc.gz"
    small.write_bytes(data[:50])  # a torn warcinfo
    assert repair_tail(str(small)) == 50
    with pytest.raises(WarcError, match="cannot repair"):
        repair_tail(str(tmp_path / "missing.warc.gz"))


_KILL_WRITER = """
import os, random, sys, time
from idemcrawl import warc
real_write = os.write
def slow_write(fd, data):  # a slow disk: short writes (legal for write(2)) with pauses
    time.sleep(0.002)
    return real_write(fd, bytes(data[:4096]))
warc.os.write = slow_write
store = warc.WarcStore(sys.argv[1], "killed", max_file_bytes=300_000)
i = 0
while True:
    body = random.Random(i).randbytes(1000 + (i * 7919) % 20000) + str(i).encode()
    p = store.write_exchange(url=f"http://127.0.0.1:9/{i}", fetched_at=time.time(),
        request_headers=[], status=200, reason="OK", http_version="HTTP/1.1",
        response_headers=[], body=body, ip=None, metadata={"i": i})
    # one write(2) of < PIPE_BUF bytes: a kill never tears the line (print issues one write
    # per piece when stdout is unbuffered, e.g. PYTHONUNBUFFERED=1 in CI's environment)
    real_write(1, f"{p.file} {p.offset} {p.length} {p.payload_digest} {i}\\n".encode())
    i += 1
"""


@pytest.mark.slow
def test_sigkill_mid_write_leaves_readable_files(tmp_path: Path) -> None:
    """A real SIGKILL during a (slow, short-writing) append: the next open cuts the torn
    exchange, every pointer the writer returned still reads back, and all files verify."""
    d = str(tmp_path)
    cut = []
    for _ in range(4):
        proc = spawn_python(_KILL_WRITER, d, stderr=None)
        assert proc.stdout is not None
        lines = [proc.stdout.readline() for _ in range(10)]
        time.sleep(random.uniform(0.0, 0.02))
        os.kill(proc.pid, signal.SIGKILL)
        rest, _ = proc.communicate()
        lines += rest.splitlines()
        with WarcStore(d, "killed", max_file_bytes=300_000) as store:  # repairs the tail
            cut.append(store.repaired_bytes)
        for line in filter(None, (ln.strip() for ln in lines)):
            file, offset, length, digest, i = line.split()
            body = read_response(d, WarcPointer(file, int(offset), int(length), digest))[2]
            assert body.endswith(i.encode())
    assert any(cut), cut  # the kills did land inside writes (almost all of the time is there)
    report = verify_directory(d)
    assert report["ok"], report["errors"]
    assert len(report["files"]) >= 2


def test_failed_write_is_cut_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with WarcStore(str(tmp_path), "slot07") as store:
        exchange(store, b"one")
        path = tmp_path / store.current_file
        size = path.stat().st_size
        real_write = os.write

        def half_then_fail(fd: int, data: Any) -> int:
            real_write(fd, bytes(data[: len(data) // 2]))
            raise OSError(28, "No space left on device")

        monkeypatch.setattr(warc.os, "write", half_then_fail)
        with pytest.raises(WarcError, match="No space left"):
            exchange(store, b"two" * 1000)
        monkeypatch.undo()
        assert path.stat().st_size == size
        ptr = exchange(store, b"three")
    assert read_response(str(tmp_path), ptr)[2] == b"three"
    assert verify_directory(str(tmp_path))["ok"]


# --- threads ----------------------------------------------------------------------------------


def test_four_threads_write_concurrently(tmp_path: Path) -> None:
    d = str(tmp_path)
    results: dict[int, list[tuple[WarcPointer, bytes]]] = {}
    barrier = threading.Barrier(4)

    with WarcStore(d, "slot08", max_file_bytes=60_000) as store:

        def work(t: int) -> None:
            barrier.wait()
            mine = []
            for i, body in enumerate(pages(30, seed=100 + t)):
                body += f"thread {t} page {i}".encode()
                mine.append((exchange(store, body, url=f"{URL}&t={t}&i={i}"), body))
            results[t] = mine

        threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    pointers = [p for mine in results.values() for p, _ in mine]
    assert len(pointers) == 120
    assert len({(p.file, p.offset) for p in pointers}) == 120
    for mine in results.values():
        for ptr, body in mine:
            assert read_response(d, ptr)[2] == body
    report = verify_directory(d)
    assert report["ok"], report["errors"]
    assert report["records"]["response"] == report["responses_verified"] == 120
    files = sorted(f["file"] for f in report["files"])
    assert files == [f"slot08-{i:05d}.warc.gz" for i in range(len(files))]


# --- downloads and measurement ----------------------------------------------------------------


def test_store_download_is_content_addressed(tmp_path: Path) -> None:
    d = str(tmp_path)
    first = store_download(d, b"%PDF-1.7 ...", ".pdf")
    again = store_download(d, b"%PDF-1.7 ...", ".pdf")
    other = store_download(d, b"\x89PNG...", ".png")
    assert first == again != other
    assert Path(first).name == hashlib.sha256(b"%PDF-1.7 ...").hexdigest() + ".pdf"
    assert Path(first).read_bytes() == b"%PDF-1.7 ..."
    assert sorted(os.listdir(tmp_path / "files")) == sorted([Path(first).name, Path(other).name])
    assert Path(store_download(d, b"", "")).name == hashlib.sha256(b"").hexdigest()
    for bad in ("pdf", "/x", ".a/b", "..", ".x\x00", "." + "a" * 40):
        with pytest.raises(WarcError, match="suffix"):
            store_download(d, b"x", bad)


def test_write_cost_measures_a_real_store(tmp_path: Path) -> None:
    result = write_cost(str(tmp_path), exchanges=20, body_bytes=4000)
    assert result["exchanges"] == 20
    assert result["cpu_us_per_exchange"] > 0
    assert 500 < result["stored_bytes_per_exchange"] < 4000 + 2000
    assert verify_directory(str(tmp_path))["ok"]


def test_verify_directory_flags_a_torn_tail(tmp_path: Path) -> None:
    with WarcStore(str(tmp_path), "slot09") as store:
        exchange(store, b"a" * 5000)
        exchange(store, b"b" * 5000)
    path = tmp_path / "slot09-00000.warc.gz"
    data = path.read_bytes()
    path.write_bytes(data[:-7])
    report = verify_directory(str(tmp_path))
    assert not report["ok"]
    assert any("not whole gzip-per-record" in e for e in report["errors"])
    shutil.copy(path, tmp_path / "copy.bin")  # not a *.warc.gz: ignored
    repair_tail(str(path))
    assert verify_directory(str(tmp_path))["ok"]
    (tmp_path / "slot09-00001.warc.gz").write_bytes(b"")  # killed before its warcinfo: readable
    assert verify_directory(str(tmp_path))["ok"]
    warcinfo_end = warcio_records(path)[1][1]
    (tmp_path / "headless.warc.gz").write_bytes(path.read_bytes()[warcinfo_end:])
    report = verify_directory(str(tmp_path))
    assert report["errors"] == ["headless.warc.gz: the file does not start with a warcinfo record"]


@pytest.mark.parametrize("bad", ["http://a.test/x y", "http://a.test/x\r\nWARC-Type: forged", ""])
def test_an_outlink_that_would_break_its_field_line_is_refused(bad: str) -> None:
    good = ["http://a.test/1", "http://a.test/2"]
    assert parse_metadata(metadata_fields("http://a.test/", {"links": good}))["links"] == good
    with pytest.raises(WarcError, match="not serialisable"):
        metadata_fields("http://a.test/", {"links": [*good, bad]})


def test_the_digest_is_rfc_4648_base32_of_the_sha1() -> None:
    rng = random.Random(5)
    for body in [b"", b"x", *(rng.randbytes(rng.randrange(1, 4000)) for _ in range(200))]:
        raw = hashlib.sha1(body).digest()
        expected = "sha1:" + base64.b32encode(raw).decode("ascii")
        assert warc.digest_of_sha1(raw) == payload_digest(body) == expected
    with pytest.raises(ValueError, match="20 bytes"):
        warc.digest_of_sha1(b"short")


def test_a_given_body_sha1_writes_the_same_records(tmp_path: Path) -> None:
    body = b"<html>same</html>"
    ptrs = []
    for name, given in (("a", None), ("b", hashlib.sha1(body).digest())):
        with WarcStore(str(tmp_path / name), "slot00") as store:
            ptrs.append(
                store.write_exchange(
                    url="http://a.test/", fetched_at=0.0, request_headers=[], status=200,
                    reason="OK", http_version="HTTP/1.1", response_headers=[], body=body,
                    ip=None, metadata={}, body_sha1=given,
                )
            )  # fmt: skip
        assert read_response(str(tmp_path / name), ptrs[-1])[2] == body
    assert ptrs[0].payload_digest == ptrs[1].payload_digest == payload_digest(body)


@pytest.mark.parametrize("level", [0, 1, 3, 4, 9])
def test_every_level_writes_members_every_reader_takes(tmp_path: Path, level: int) -> None:
    """0-3 are ISA-L's levels, 4-9 zlib's: either way standard gzip members."""
    body = b"<html>" + b"some words repeated " * 500 + b"</html>"
    with WarcStore(str(tmp_path), "slot00", compression_level=level) as store:
        ptr = store.write_exchange(
            url="http://a.test/", fetched_at=0.0, request_headers=[], status=200,
            reason="OK", http_version="HTTP/1.1", response_headers=[], body=body,
            ip=None, metadata={"links": ["http://a.test/b"]},
        )  # fmt: skip
    assert read_response(str(tmp_path), ptr)[2] == body
    report = verify_directory(str(tmp_path), strict=True)
    assert report["ok"], report
