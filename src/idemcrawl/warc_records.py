"""WARC/1.1 records built by hand: the bytes of an exchange, wherever it is built (issue 17).

Why this module exists apart from :mod:`idemcrawl.warc` (the store, readers, repair, verify):

* **Parser processes build a page's exchange.** They already hold the body, and they have CPU
  to spare while the crawl process, whose event loop shares one GIL with its SQL and WARC
  threads, is the crawl's bottleneck with the archive on. So a parser process builds and
  compresses the request, response and metadata members (:func:`build_exchange`) and hands
  back the bytes with the :class:`~idemcrawl.parse.ParseResult`; the crawl process keeps the
  dedup decision and only appends (``WarcStore.append_exchange``). A parser process imports
  this module, never ``warc`` (warcio, FastWARC and the store are the crawl process's).
* **By hand, not with FastWARC.** A record is a few header lines, the block, two CRLFs, and the
  SHA-1 digests; writing them out is cheaper than filling a FastWARC record and serialising it
  (which also digests the block while holding the GIL): a whole exchange (``write_cost``)
  measured 202-255 µs CPU against 315-367 with FastWARC records, interleaved on a loaded
  machine, and 1.23 M against 1.97 M instructions (docs/warc.md). The bytes follow FastWARC's
  layout (``WARC-Type``, ``WARC-Date``, ``WARC-Record-ID``, ``Content-Length``, the record's
  own fields, ``WARC-Payload-Digest``, ``WARC-Block-Digest``), and warcio and FastWARC read
  and verify them (tests/test_warc.py, tests/test_warc_records.py).
* Every record is **one gzip member** (ISA-L for levels 0-3, zlib above), so a pointer names
  exactly one record.
* **Natively where it counts.** The heads, digests and record ids of :func:`build_exchange` are
  written by ``idemcrawl._warc`` (C, src/idemcrawl/_warc.c) when it is built: the same bytes as
  the Python code here, which stays as the fallback and the reference the tests compare with
  (tests/test_warc_native.py; docs/benchmarks.md, "The archive's records in C", issue 17).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import zlib
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any, Final, NamedTuple
from urllib.parse import urlsplit

from isal import isal_zlib

#: The native record builder (src/idemcrawl/_warc.c), or None when ``pip install`` had no C
#: compiler: then the Python functions below build the same bytes.
_native: Any
try:
    from . import _warc as _native
except ImportError:  # pragma: no cover - depends on the build
    _native = None

COMPRESSION_LEVEL: Final = 1
"""Level of every gzip member (``crawl --warc-level``): 0-3 compress with ISA-L (its levels),
4-9 with zlib (its levels). Level 1 by default, because a crawl's archive is CPU-bound long
before it is disk-bound. Per 15 KB benchmark page (CPU µs / bytes): ISA-L 1 26 / 4,373, zlib 1
65 / 4,409, zlib 6 249 / 3,956, zlib 9 gains nothing over 6 (docs/warc.md, "Compression
level"). Pass 6 or 9 where disk is what is short. Every member is a standard gzip member
whichever compressor wrote it."""

#: The highest level ISA-L has; above it the members are compressed by zlib.
ISAL_MAX_LEVEL: Final = 3

#: The metadata record's content type: WARC named fields, as Heritrix writes them. Replay tools
#: (pywb, OpenWayback) leave ``application/warc-fields`` records out of their CDX index; a
#: metadata record with any other type has the response's URI and date, sorts before it and is
#: what replay would serve for the page.
METADATA_CONTENT_TYPE: Final = "application/warc-fields"
#: The named field that carries idemcrawl's own facts (JSON on one line).
METADATA_FIELD: Final = "idemcrawl-metadata"
#: URI prefix of a page's rendered DOM (a ``conversion`` record next to its response).
RENDERED_PREFIX: Final = "urn:rendered-dom:"

_REWRITTEN: Final = frozenset({"content-encoding", "transfer-encoding", "content-length"})
#: What a WARC-Target-URI or an outlink field cannot hold: it would break the header line.
_BAD_URI: Final = re.compile("[\r\n\x00 ]")
_END: Final = b"\r\n\r\n"


class WarcError(Exception):
    """A WARC file or pointer is unusable, or a write could not be completed."""


def gzip_member(data: bytes | memoryview, level: int) -> bytes:
    """One gzip member of ``data``; both compressors release the GIL while they work."""
    if level <= ISAL_MAX_LEVEL:
        return isal_zlib.compress(data, level, zlib.MAX_WBITS | 16)
    return zlib.compress(data, level, zlib.MAX_WBITS | 16)


#: Base32 (RFC 4648) letter of every 5-bit value, as a ``bytes.translate`` table.
_B32_TABLE: Final = bytes.maketrans(bytes(range(32)), b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567")


def _low_bits(bits: int, slot: int, count: int) -> int:
    """A mask of the low ``bits`` bits of each of ``count`` slots ``slot`` bits wide."""
    return sum(((1 << bits) - 1) << (i * slot) for i in range(count))


#: (high mask, shift, low mask) of each halving step of :func:`digest_of_sha1`: 2 x 80 bits in
#: 128-bit slots -> 4 x 40 in 64 -> 8 x 20 in 32 -> 16 x 10 in 16 -> 32 x 5 in 8.
_SPREAD: Final = tuple(
    (_low_bits(2 * half, slot * 2, count) ^ _low_bits(half, slot * 2, count), slot - half,
     _low_bits(half, slot * 2, count))
    for half, slot, count in ((40, 64, 2), (20, 32, 4), (10, 16, 8), (5, 8, 16))
)  # fmt: skip
_LOW80: Final = (1 << 80) - 1


def _digest_of_sha1_py(raw: bytes) -> str:
    """``sha1:<BASE32>`` from a SHA-1 (20 bytes): the form WARC digests take (natively
    ``_warc.sha1_base32``, which :data:`digest_of_sha1` is when the extension is built).

    160 bits are 32 Base32 letters without padding. The bits are spread five to a byte by
    halving steps on one integer (each step moves the high half of every slot up into a slot
    of its own), then one ``translate`` maps each byte to its letter: ~20 integer operations
    instead of 16 lookups in a list comprehension, 22 k -> ~10 k instructions, and an exchange
    has four (``base64.b32encode`` is Python code in 3.11, slower still).
    """
    if len(raw) != 20:
        raise ValueError(f"a SHA-1 digest is 20 bytes, not {len(raw)}")
    n = int.from_bytes(raw, "big")
    (h1, s1, l1), (h2, s2, l2), (h3, s3, l3), (h4, s4, l4) = _SPREAD
    x = ((n >> 80) << 128) | (n & _LOW80)
    x = ((x & h1) << s1) | (x & l1)
    x = ((x & h2) << s2) | (x & l2)
    x = ((x & h3) << s3) | (x & l3)
    x = ((x & h4) << s4) | (x & l4)
    return "sha1:" + x.to_bytes(32, "big").translate(_B32_TABLE).decode("ascii")


digest_of_sha1: Callable[[bytes], str] = (
    _digest_of_sha1_py if _native is None else _native.sha1_base32
)


def payload_digest(body: bytes) -> str:
    """``sha1:<BASE32>``, the form WARC-Payload-Digest uses and every reader recomputes."""
    return digest_of_sha1(hashlib.sha1(body).digest())


def warc_truncated(cut_reason: str | None) -> str | None:
    """WARC-Truncated value for the fetcher's ``cut_reason`` (None for a whole body)."""
    if not cut_reason:
        return None
    if cut_reason in ("max_bytes", "max_decompressed_bytes", "length"):
        return "length"
    if cut_reason in ("total_timeout", "read_timeout", "time"):
        return "time"
    if cut_reason == "disconnect":
        return "disconnect"
    return "unspecified"


def warc_date(ts: float) -> str:
    """WARC-Date with microseconds, UTC (``isoformat`` formats in C; ``strftime`` with ``%f``
    rewrote its format string on every call, and a record gets one date per exchange).
    ``_warc.warc_date`` writes the same for 1970-5138 in a tenth of the instructions."""
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="microseconds")[:-6] + "Z"


#: Record ids come from a generator of this module's own, seeded from the OS: a spider that
#: seeds ``random`` in its parser process must not make ids repeat. Reseeded in a forked child.
_ids = random.Random()
os.register_at_fork(after_in_child=_ids.seed)
_V4: Final = ~(0xF000 << 64) & ~(0xC000 << 48)
_V4_BITS: Final = (0x4000 << 64) | (0x8000 << 48)


def new_record_id() -> str:
    """``<urn:uuid:…>``, a random (version 4) UUID; cheaper than ``uuid.uuid4()`` (no system
    call and no UUID object: three ids per exchange)."""
    h = f"{_ids.getrandbits(128) & _V4 | _V4_BITS:032x}"
    return f"<urn:uuid:{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}>"


def field(text: str) -> str:
    """A header value on one line: a CR or LF inside it would forge header lines."""
    if "\r" in text or "\n" in text:
        return text.replace("\r", " ").replace("\n", " ")
    return text


def latin1(text: str) -> bytes:
    """The fetcher hands headers over latin-1 decoded (as HTTP defines them): this restores the
    received bytes exactly. Anything beyond latin-1 was not received; store it as UTF-8."""
    try:
        return text.encode("latin-1")
    except UnicodeEncodeError:
        return text.encode("utf-8")


def _has_bad_uri_char(text: str) -> bool:
    # Four memchr-speed scans: the regex's character class measured ~4x slower on a page's
    # ~1.5 KB of outlinks (it runs once per page).
    return " " in text or "\r" in text or "\n" in text or "\x00" in text


def check_uri(url: str) -> str:
    if not url or _BAD_URI.search(url):
        raise WarcError(f"cannot store {url!r}: a WARC-Target-URI has no spaces or line breaks")
    return url


def http_head(start_line: str, headers: list[tuple[str, str]]) -> bytes:
    """An HTTP message head: the start line, the header lines, the blank line."""
    lines = [start_line, *(f"{name}: {value}" for name, value in headers), "", ""]
    text = "\r\n".join(lines)
    seps = len(lines) - 1
    if text.isascii() and text.count("\r") == seps and text.count("\n") == seps:
        return text.encode("ascii")  # the usual head: no CR or LF inside a field, all ASCII
    # A CR or LF inside a field (it becomes a space, so no header line can be forged) or a
    # character beyond ASCII (each field on its own: latin-1, else UTF-8).
    parts = [latin1(field(start_line)), b"\r\n"]
    for name, value in headers:
        parts += [latin1(field(name)), b": ", latin1(field(value)), b"\r\n"]
    parts.append(b"\r\n")
    return b"".join(parts)


def status_line(http_version: str, status: int, reason: str) -> str:
    version = http_version if http_version.upper().startswith("HTTP/") else f"HTTP/{http_version}"
    if not 100 <= status <= 999:
        raise WarcError(f"HTTP status {status!r} is not a three-digit code")
    return f"{version} {status} {reason}"


def request_head(
    url: str, http_version: str, headers: list[tuple[str, str]], method: str = "GET"
) -> bytes:
    parts = urlsplit(url)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    version = http_version if http_version.upper().startswith("HTTP/") else f"HTTP/{http_version}"
    if not any(name.lower() == "host" for name, _ in headers):
        headers = [("Host", parts.netloc), *headers]
    return http_head(f"{method} {target} {version}", headers)


def stored_headers(
    headers: list[tuple[str, str]], body_length: int | None, *, keep_encoding: bool
) -> tuple[list[tuple[str, str]], list[list[str]]]:
    """Headers as stored next to a decoded body, and the originals that were renamed."""
    stored: list[tuple[str, str]] = []
    original: list[list[str]] = []
    for name, value in headers:
        low = name.lower()
        if low in _REWRITTEN and not (keep_encoding and low == "content-encoding"):
            original.append([name, value])
            stored.append((f"X-Original-{name}", value))
        else:
            stored.append((name, value))
    if body_length is not None:
        stored.append(("Content-Length", str(body_length)))
    return stored, original


#: One encoder for every metadata record: ``json.dumps`` with these options built a new one per
#: call. Compact, sorted keys, UTF-8 text as is, NaN refused (it is not JSON).
_METADATA_JSON: Final = json.JSONEncoder(
    ensure_ascii=False, separators=(",", ":"), sort_keys=True, allow_nan=False
)


def metadata_fields(url: str, metadata: dict[str, Any]) -> bytes:
    """The body of a metadata record: ``outlink: URL`` per discovered link (the field other
    tools read), then every other fact as JSON in one ``idemcrawl-metadata`` field."""
    links = metadata.get("links") or []
    rest = {k: v for k, v in metadata.items() if k != "links"}
    try:
        text = _METADATA_JSON.encode(rest)
        outlinks = list(links)
        try:
            joined = "".join(outlinks)
        except TypeError:  # not all text: ``map(str)`` only then (it was 4.6 µs for 40 links)
            outlinks = list(map(str, outlinks))
            joined = "".join(outlinks)
        if "" in outlinks or _has_bad_uri_char(joined):  # one scan; culprit after
            for link in outlinks:
                check_uri(link)
    except (TypeError, ValueError, WarcError) as exc:
        raise WarcError(f"metadata for {url} is not serialisable: {exc}") from exc
    head = "outlink: " + "\r\noutlink: ".join(outlinks) + "\r\n" if outlinks else ""
    return f"{head}{METADATA_FIELD}: {text}\r\n".encode()


def record(
    rtype: str,
    date: str,
    fields: list[tuple[str, str]],
    block: bytes,
    *,
    rest: bytes = b"",
    payload: str | None = None,
    record_id: str | None = None,
) -> tuple[bytes, str]:
    """One WARC record (uncompressed) and its record id.

    The block is ``block + rest`` (a response's HTTP head and its body, so the body is not
    copied to be digested); ``payload`` is the WARC-Payload-Digest value, if any. ``fields``
    are the record's own header fields after the four every record has, written as given
    (values the caller checked: URIs by :func:`check_uri`, the rest constants or ours).
    """
    rid = record_id or new_record_id()
    digest = hashlib.sha1(block)
    if rest:
        digest.update(rest)
    # One f-string, not a list of lines joined: three records per exchange.
    own = "".join([f"{name}: {value}\r\n" for name, value in fields])
    if payload is not None:
        own += f"WARC-Payload-Digest: {payload}\r\n"
    head = (
        f"WARC/1.1\r\nWARC-Type: {rtype}\r\nWARC-Date: {date}\r\nWARC-Record-ID: {rid}\r\n"
        f"Content-Length: {len(block) + len(rest)}\r\n{own}"
        f"WARC-Block-Digest: {digest_of_sha1(digest.digest())}\r\n\r\n"
    )
    return b"".join((head.encode(), block, rest, _END)), rid


class BuiltExchange(NamedTuple):
    """One exchange's gzip members in file order (request, response, metadata, then a rendered
    DOM if any), ready to append: where the response member sits in ``blob``, its record id
    (a revisit's WARC-Refers-To) and the body's payload digest (the dedup key, R11)."""

    blob: bytes
    response_at: int
    response_length: int
    response_id: str
    payload_digest: str


def rendered_record(url: str, date: str, refers_to: str, html: str) -> bytes:
    """The DOM a browser built from a response, as a ``conversion`` record referring to it."""
    rec, _ = record(
        "conversion",
        date,
        [
            ("WARC-Target-URI", RENDERED_PREFIX + url),
            ("Content-Type", "text/html; charset=utf-8"),
            ("WARC-Refers-To", refers_to),
        ],
        html.encode("utf-8", "replace"),
    )
    return rec


def build_exchange(
    *,
    url: str,
    fetched_at: float,
    request_headers: list[tuple[str, str]],
    status: int,
    reason: str,
    http_version: str,
    response_headers: Sequence[tuple[str, str]] | Sequence[tuple[bytes, bytes]],
    body: bytes,
    ip: str | None,
    metadata: dict[str, Any],
    decoded: bool = True,
    truncated: str | None = None,
    rendered: str | None = None,
    method: str = "GET",
    request_body: bytes = b"",
    body_sha1: bytes | None = None,
    level: int = COMPRESSION_LEVEL,
) -> BuiltExchange:
    """Request + response + metadata (+ the rendered DOM) as gzip members, nothing written.

    The arguments are :meth:`idemcrawl.warc.WarcStore.write_exchange`'s (which calls this),
    plus the compression ``level``; ``response_headers`` are text pairs, or bytes pairs as
    received (read as latin-1). Input is checked before anything is built (WarcError). The
    records come from ``idemcrawl._warc`` when it is built and takes the input (plain
    headers), else from :func:`_python_records`: the same bytes either way.
    """
    check_uri(url)
    if "original_headers" in metadata:
        raise WarcError("metadata key 'original_headers' is reserved for the WARC store")
    built: tuple[bytes, bytes, bytes, str, str] | None = None
    if _native is None:
        date = warc_date(fetched_at)
    else:
        date = _native.warc_date(fetched_at) or warc_date(fetched_at)
        heads = _native.response_head(
            status_line(http_version, status, reason), response_headers, len(body), not decoded
        )
        if heads is not None:
            meta_fields = metadata_fields(url, {**metadata, "original_headers": heads[1]})
            request = _native.request_head(url, http_version, request_headers, method)
            if request is None:  # a URL urlsplit has to read (or unusual headers)
                request = request_head(url, http_version, request_headers, method)
            built = _native.records(
                url, date, _ids.randbytes(48), ip or None, warc_truncated(truncated), heads[0],
                body, body_sha1, request, request_body, meta_fields,
            )  # fmt: skip
    if built is None:
        built = _python_records(
            url, date, request_headers, status, reason, http_version, response_headers, body, ip,
            metadata, decoded, truncated, method, request_body, body_sha1,
        )  # fmt: skip
    request, response, meta, response_id, digest = built
    members = [gzip_member(request, level), gzip_member(response, level), gzip_member(meta, level)]
    if rendered is not None:
        members.append(gzip_member(rendered_record(url, date, response_id, rendered), level))
    return BuiltExchange(b"".join(members), len(members[0]), len(members[1]), response_id, digest)


def _python_records(
    url: str,
    date: str,
    request_headers: list[tuple[str, str]],
    status: int,
    reason: str,
    http_version: str,
    response_headers: Sequence[tuple[str, str]] | Sequence[tuple[bytes, bytes]],
    body: bytes,
    ip: str | None,
    metadata: dict[str, Any],
    decoded: bool,
    truncated: str | None,
    method: str,
    request_body: bytes,
    body_sha1: bytes | None,
) -> tuple[bytes, bytes, bytes, str, str]:
    """:func:`build_exchange`'s request, response and metadata records (uncompressed), the
    response's record id and the payload digest, in Python: the fallback without the C
    extension (or for headers it does not take) and the reference its tests compare with.
    The record ids are drawn response first, then request, then metadata."""
    if response_headers and isinstance(response_headers[0][0], bytes):
        response_headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in response_headers]
    stored, original = stored_headers(
        response_headers,  # type: ignore[arg-type]
        len(body),
        keep_encoding=not decoded,
    )
    meta_fields = metadata_fields(url, {**metadata, "original_headers": original})
    digest = digest_of_sha1(hashlib.sha1(body).digest() if body_sha1 is None else body_sha1)
    response_head = http_head(status_line(http_version, status, reason), stored)
    request_block = request_head(url, http_version, request_headers, method) + request_body
    target = [("WARC-Target-URI", url)]
    if ip:
        target.append(("WARC-IP-Address", field(ip)))
    response_fields = [*target, ("Content-Type", "application/http; msgtype=response")]
    cut = warc_truncated(truncated)
    if cut:
        response_fields.append(("WARC-Truncated", cut))
    response, response_id = record(
        "response", date, response_fields, response_head, rest=body, payload=digest
    )
    concurrent = ("WARC-Concurrent-To", response_id)
    request, _ = record(
        "request",
        date,
        [*target, ("Content-Type", "application/http; msgtype=request"), concurrent],
        request_block,
    )
    meta, _ = record(
        "metadata",
        date,
        [("WARC-Target-URI", url), ("Content-Type", METADATA_CONTENT_TYPE), concurrent],
        meta_fields,
    )
    return request, response, meta, response_id, digest


class ExchangeSpec(NamedTuple):
    """What a parser process needs, besides the job's URL, status and body, to build a page's
    exchange (:func:`build_page_exchange`): the fetch facts the crawl process has, and the
    metadata facts only it knows (``url_version``, ``elapsed_s``, ``wire_bytes``, a spider
    request's key, callback and data). The parser adds what only it knows: the links, the
    record count and the parse error. ``links_cut``: the page is a redirect one hop past the
    crawl's limit, whose links the crawl drops (pipeline's redirect rule), so the metadata
    record lists none."""

    fetched_at: float
    request_headers: list[tuple[str, str]]
    reason: str
    http_version: str
    #: As received: the fetcher's ``wire_headers`` (bytes pairs, decoded here as latin-1, so the
    #: crawl process never decodes them) or already decoded ``(name, value)`` text pairs.
    response_headers: Sequence[tuple[str, str]] | Sequence[tuple[bytes, bytes]]
    ip: str | None
    metadata: dict[str, Any]
    decoded: bool
    truncated: str | None
    method: str
    request_body: bytes
    level: int
    links_cut: bool


def with_parse_facts(
    metadata: dict[str, Any], *, parse_error: str | None, links: Sequence[str], records: int
) -> dict[str, Any]:
    """A page's metadata fields: the fetch facts ``metadata`` plus what its parse found. One
    function for both builders (a parser process's :func:`build_page_exchange`, the crawl
    process's archiver for the pages it builds itself), so their records cannot drift."""
    return {**metadata, "parse_error": parse_error, "links": list(links), "records": records}


def build_page_exchange(
    spec: ExchangeSpec,
    url: str,
    status: int,
    body: bytes,
    *,
    links: list[str],
    records: int,
    parse_error: str | None,
) -> BuiltExchange:
    """A parsed page's exchange, with the metadata record the crawl process would write."""
    metadata = with_parse_facts(
        spec.metadata,
        parse_error=parse_error,
        links=() if spec.links_cut else links,
        records=records,
    )
    return build_exchange(
        url=url,
        fetched_at=spec.fetched_at,
        request_headers=spec.request_headers,
        status=status,
        reason=spec.reason,
        http_version=spec.http_version,
        response_headers=spec.response_headers,
        body=body,
        ip=spec.ip,
        metadata=metadata,
        decoded=spec.decoded,
        truncated=spec.truncated,
        method=spec.method,
        request_body=spec.request_body,
        level=spec.level,
    )
