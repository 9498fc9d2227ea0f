"""The WARC store (R19, R20): every exchange as WARC/1.1 records, gzip per record, cut-safe.

Why it is shaped this way:

* **One gzip member per record**, so a pointer ``(file, offset, length)`` addresses exactly one
  record and :func:`read_response` decompresses only that member (reparse, R19). warcio and
  FastWARC both read such files and index them by member offset.
* **An exchange is one ``write``**: the request, response and metadata members are built and
  compressed *outside* the lock (zlib releases the GIL, so worker threads overlap), then appended
  to an ``O_APPEND`` descriptor with one unbuffered write. A SIGKILL can therefore damage only
  the last exchange of the last file, and only at its end; a failed write (disk full) is cut back
  at once so nothing is ever appended after a torn record.
* **The tail is repaired on open**: :func:`repair_tail` finds the last complete gzip member whose
  content is a complete WARC record, scanning *backwards* from the end so that opening a 1 GB
  file costs one member's decompression, not the whole file's; everything after it is cut.
* **Deterministic names** ``{prefix}-{seq:05d}.warc.gz``: one writer per prefix (the engine's
  flock'ed owner slot), so a restart continues the same file instead of inventing a new one.
* **Bodies are stored decoded** (the fetcher decompresses while reading). The stored HTTP
  headers therefore never announce an encoding: ``Content-Encoding``, ``Transfer-Encoding`` and
  ``Content-Length`` are renamed to ``X-Original-*`` and a true ``Content-Length`` is appended,
  and the metadata record repeats the originals under ``"original_headers"``. A body kept as
  received (a coding the fetcher cannot decode, ``decoded=False``) keeps its
  ``Content-Encoding``. ``WARC-Payload-Digest`` is the SHA-1 of the stored (decoded) body, which
  is what every reader recomputes.
* Records are written out **by hand** (:mod:`idemcrawl.warc_records`, which parser processes
  import to build a page's exchange themselves, issue 17) and each becomes one gzip member
  (ISA-L or zlib); files are verified with **both** FastWARC and warcio
  (:func:`verify_directory`).

Measured on this project's 2-core machine (loaded by other work): 0.13-0.25 ms CPU per exchange
(request + response + metadata) of a 15 KB body, about 40 % of it the response's compression
(``docs/warc.md``, :func:`write_cost`).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import random
import re
import tempfile
import threading
import time
import zlib
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from types import TracebackType
from typing import Any, BinaryIO, Final

import warcio.archiveiterator
from fastwarc.warc import ArchiveIterator, WarcRecordType

from .version import DEFAULT_USER_AGENT
from .warc_records import (
    COMPRESSION_LEVEL,
    ISAL_MAX_LEVEL,
    METADATA_CONTENT_TYPE,
    METADATA_FIELD,
    RENDERED_PREFIX,
    BuiltExchange,
    WarcError,
    build_exchange,
    check_uri,
    digest_of_sha1,
    field,
    gzip_member,
    http_head,
    metadata_fields,
    payload_digest,
    record,
    rendered_record,
    request_head,
    status_line,
    stored_headers,
    warc_date,
    warc_truncated,
)

__all__ = [
    "COMPRESSION_LEVEL",
    "ISAL_MAX_LEVEL",
    "METADATA_CONTENT_TYPE",
    "METADATA_FIELD",
    "RENDERED_PREFIX",
    "REVISIT_PROFILES",
    "BuiltExchange",
    "WarcError",
    "WarcPointer",
    "WarcStore",
    "build_exchange",
    "digest_of_sha1",
    "metadata_fields",
    "parse_metadata",
    "payload_digest",
    "read_response",
    "repair_tail",
    "store_download",
    "verify_directory",
    "warc_truncated",
    "write_cost",
]

#: Kept under its old name for callers of the store module (tests, tools).
_gzip_member = gzip_member

REVISIT_PROFILES: Final = {
    "server-not-modified": "http://netpreserve.org/warc/1.1/revisit/server-not-modified",
    "identical-payload-digest": "http://netpreserve.org/warc/1.1/revisit/identical-payload-digest",
}

_GZIP_MAGIC: Final = b"\x1f\x8b\x08"
_HEAD_LIMIT: Final = 1 << 20  # WARC header block we accept when checking a record's framing
_CHUNK: Final = 1 << 16
_SCAN_WINDOW: Final = 1 << 20
_NOT_A_WARC_LIMIT: Final = 1 << 16  # a file with no complete record is at most a torn warcinfo
_PREFIX_RE: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
_SUFFIX_RE: Final = re.compile(r"(\.[A-Za-z0-9_-]{1,16}){0,2}")
_CONFORMS_TO: Final = (
    "http://iipc.github.io/warc-specifications/specifications/warc-format/warc-1.1/"
)


@dataclass(frozen=True, slots=True)
class WarcPointer:
    """Where one record lives: the gzip member at ``offset`` (``length`` compressed bytes)."""

    file: str  # basename relative to the store directory
    offset: int  # byte offset of the gzip member holding the record
    length: int  # compressed length of that member
    payload_digest: str  # "sha1:<BASE32>" as in WARC-Payload-Digest


# --- record building --------------------------------------------------------------------------


def parse_metadata(body: bytes) -> dict[str, Any]:
    """The facts :func:`metadata_fields` wrote, with ``links`` rebuilt from the outlinks."""
    out: dict[str, Any] = {}
    links: list[str] = []
    for line in body.decode("utf-8").split("\r\n"):
        name, sep, value = line.partition(": ")
        if not sep:
            continue
        if name.lower() == "outlink":
            links.append(value)
        elif name.lower() == METADATA_FIELD:
            out.update(json.loads(value))
    out["links"] = links
    return out


# --- the store --------------------------------------------------------------------------------


def _write_all(fd: int, data: bytes) -> None:
    written = os.write(fd, data)  # all of it, but for a signal or a full disk
    if written < len(data):
        view = memoryview(data)[written:]
        while view:
            view = view[os.write(fd, view) :]


class WarcStore:
    """Appends exchanges to ``{prefix}-{seq:05d}.warc.gz`` files; thread-safe, restart-safe.

    One writer per prefix at a time (the caller guarantees it, e.g. with an flock'ed slot).
    Opening repairs the tail of the prefix's newest file (``repaired_bytes`` says how much was
    cut) and appends to it, or starts the next file once it is ``max_file_bytes`` long. Writes
    go straight to the OS (no user-space buffer), so a killed process loses at most the
    exchange being written, and that one is cut on the next open.
    """

    def __init__(
        self,
        directory: str,
        prefix: str,
        *,
        max_file_bytes: int = 1 << 30,
        software: str = DEFAULT_USER_AGENT,
        compression_level: int = COMPRESSION_LEVEL,
    ) -> None:
        if not _PREFIX_RE.fullmatch(prefix):
            raise WarcError(
                f"WARC prefix {prefix!r} must be 1-100 letters, digits, '.', '_' or '-' "
                "and start with a letter or digit"
            )
        if max_file_bytes < 1:
            raise WarcError(f"max_file_bytes must be positive, not {max_file_bytes}")
        if not 0 <= compression_level <= 9:
            raise WarcError(f"compression_level must be 0-9, not {compression_level}")
        self.compression_level = compression_level
        self.directory = os.path.abspath(directory)
        self.prefix = prefix
        self.max_file_bytes = max_file_bytes
        self.software = software
        self.repaired_bytes = 0
        self._lock = threading.Lock()
        self._name_re = re.compile(re.escape(prefix) + r"-(\d{5,})\.warc\.gz")
        try:
            os.makedirs(self.directory, exist_ok=True)
            seq = self._latest_seq()
        except OSError as exc:
            raise WarcError(f"cannot use WARC directory {self.directory}: {exc}") from exc
        if seq is None:
            seq = 0
        else:
            self.repaired_bytes = repair_tail(self._path(seq))
            if os.path.getsize(self._path(seq)) >= max_file_bytes:
                seq += 1
        self._fd: int | None = None
        self._current = ""  # the name of the file being appended to (set by _open)
        self._seq = seq
        self._size = 0
        self._open(seq)

    # -- files

    def _path(self, seq: int) -> str:
        return os.path.join(self.directory, self._name(seq))

    def _name(self, seq: int) -> str:
        return f"{self.prefix}-{seq:05d}.warc.gz"

    def _latest_seq(self) -> int | None:
        seqs = [
            int(m.group(1)) for n in os.listdir(self.directory) if (m := self._name_re.fullmatch(n))
        ]
        return max(seqs) if seqs else None

    def _open(self, seq: int) -> None:
        path = self._path(seq)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise WarcError(f"cannot open {path}: {exc}") from exc
        self._fd, self._seq, self._size = fd, seq, os.fstat(fd).st_size
        self._current = self._name(seq)
        if self._size == 0:
            try:
                self._append_locked(self._warcinfo(self._name(seq)))
            except WarcError:
                os.close(fd)
                self._fd = None
                raise

    def _warcinfo(self, filename: str) -> bytes:
        fields = {
            "software": self.software,
            "format": "WARC File Format 1.1",
            "conformsTo": _CONFORMS_TO,
            "isPartOf": self.prefix,
        }
        content = "".join(f"{k}: {field(v)}\r\n" for k, v in fields.items()).encode("utf-8")
        info, _ = record(
            "warcinfo",
            warc_date(time.time()),
            [("WARC-Filename", filename), ("Content-Type", "application/warc-fields")],
            content,
        )
        return gzip_member(info, self.compression_level)

    def _append_locked(self, blob: bytes) -> tuple[str, int]:
        """Append one exchange's members; returns (file, offset). Caller holds the lock."""
        if self._fd is None:
            raise WarcError(f"the WARC store {self.directory} ({self.prefix}) is closed")
        if self._size >= self.max_file_bytes and self._size > 0:
            os.close(self._fd)
            self._fd = None
            self._open(self._seq + 1)
            assert self._fd is not None
        offset = self._size
        try:
            _write_all(self._fd, blob)
        except OSError as exc:
            # Cut the torn bytes now, so the next exchange is not appended after them.
            with contextlib.suppress(OSError):  # else repair_tail cuts it on the next open
                os.ftruncate(self._fd, offset)
            raise WarcError(f"cannot write {self._path(self._seq)}: {exc}") from exc
        self._size += len(blob)
        return self._current, offset

    @property
    def current_file(self) -> str:
        """Basename of the file the next exchange goes to (before any rotation it triggers)."""
        return self._name(self._seq)

    # -- writing

    def write_exchange(
        self,
        *,
        url: str,
        fetched_at: float,
        request_headers: list[tuple[str, str]],
        status: int,
        reason: str,
        http_version: str,
        response_headers: list[tuple[str, str]],
        body: bytes,
        ip: str | None,
        metadata: dict[str, Any],
        decoded: bool = True,
        truncated: str | None = None,
        rendered: str | None = None,
        method: str = "GET",
        request_body: bytes = b"",
        body_sha1: bytes | None = None,
    ) -> WarcPointer:
        """Write request + response + metadata; return the pointer to the response record.

        ``rendered`` is the page's DOM after a browser ran its scripts (``render.py``): it is
        written with the exchange as a ``conversion`` record that refers to the response, under
        the URI ``RENDERED_PREFIX + url`` so that no replay tool mistakes it for the response.

        ``body`` is the decoded payload (``decoded=False``: kept as received, so its
        ``Content-Encoding`` stays). ``metadata`` (discovered links, fetch facts) must be
        JSON-serialisable; the key ``"original_headers"`` is added by the store. ``truncated``
        is the fetcher's cut reason (or a WARC-Truncated value) for a cut body. ``method`` and
        ``request_body`` are the request's (a spider's POST search, JSON API call).
        ``body_sha1`` is ``hashlib.sha1(body).digest()`` when the caller has computed it already
        (the archiver does, to find identical bodies), so that it is computed once.
        """
        built = build_exchange(
            url=url,
            fetched_at=fetched_at,
            request_headers=request_headers,
            status=status,
            reason=reason,
            http_version=http_version,
            response_headers=response_headers,
            body=body,
            ip=ip,
            metadata=metadata,
            decoded=decoded,
            truncated=truncated,
            rendered=rendered,
            method=method,
            request_body=request_body,
            body_sha1=body_sha1,
            level=self.compression_level,
        )
        return self.append_exchange(built)

    def append_exchange(self, built: BuiltExchange) -> WarcPointer:
        """Append an exchange built elsewhere (:func:`build_exchange`, in a parser process for
        a crawl's pages) with one ``write``; return the pointer to its response record.

        Only the append runs here, under the lock: no record building and no compression, so
        the caller (the crawl process's event loop) spends a few microseconds on it. The
        members were compressed at the level the builder was given (the crawl passes this
        store's ``compression_level``).
        """
        with self._lock:
            name, offset = self._append_locked(built.blob)
        return WarcPointer(
            name, offset + built.response_at, built.response_length, built.payload_digest
        )

    def write_revisit(
        self,
        *,
        url: str,
        fetched_at: float,
        request_headers: list[tuple[str, str]],
        status: int,
        reason: str,
        http_version: str,
        response_headers: list[tuple[str, str]],
        profile: str,
        refers_to: WarcPointer | None,
        refers_to_uri: str | None,
        refers_to_date: float | None,
        payload_digest: str | None,
        ip: str | None,
        rendered: str | None = None,
        method: str = "GET",
        request_body: bytes = b"",
    ) -> WarcPointer:
        """Write request + revisit (headers only); return the pointer to the revisit record.

        ``rendered``: the DOM a browser built from the body, as in :meth:`write_exchange`.

        ``profile`` is ``"server-not-modified"`` (a 304) or ``"identical-payload-digest"`` (a
        body byte-identical to the one ``refers_to`` points at). WARC-Refers-To (the earlier
        record's id) is read from ``refers_to`` when its file is still in the store directory;
        a file that was moved away (archived) only drops that optional field.
        """
        check_uri(url)
        if profile not in REVISIT_PROFILES:
            raise WarcError(f"unknown revisit profile {profile!r}: use {sorted(REVISIT_PROFILES)}")
        digest = payload_digest or (refers_to.payload_digest if refers_to else None)
        if profile == "identical-payload-digest" and not digest:
            raise WarcError("an identical-payload-digest revisit needs the payload digest")
        refers_id: str | None = None
        refers_date = warc_date(refers_to_date) if refers_to_date is not None else None
        if refers_to is not None and (head := _referenced_head(self.directory, refers_to)):
            refers_id = head.get("warc-record-id")
            refers_to_uri = refers_to_uri or head.get("warc-target-uri")
            refers_date = refers_date or head.get("warc-date")
        if refers_to_uri is not None:
            check_uri(refers_to_uri)

        date = warc_date(fetched_at)
        stored, _original = stored_headers(response_headers, None, keep_encoding=False)
        target = [("WARC-Target-URI", url)]
        if ip:
            target.append(("WARC-IP-Address", field(ip)))
        fields = [
            *target,
            ("Content-Type", "application/http; msgtype=response"),
            ("WARC-Profile", REVISIT_PROFILES[profile]),
        ]
        if refers_id:
            fields.append(("WARC-Refers-To", field(refers_id)))
        if refers_to_uri:
            fields.append(("WARC-Refers-To-Target-URI", refers_to_uri))
        if refers_date:
            fields.append(("WARC-Refers-To-Date", field(refers_date)))
        revisit, revisit_id = record(
            "revisit",
            date,
            fields,
            http_head(status_line(http_version, status, reason), stored),
            payload=digest,
        )
        request, _ = record(
            "request",
            date,
            [
                *target,
                ("Content-Type", "application/http; msgtype=request"),
                ("WARC-Concurrent-To", revisit_id),
            ],
            request_head(url, http_version, request_headers, method) + request_body,
        )
        level = self.compression_level
        members = [gzip_member(request, level), gzip_member(revisit, level)]
        if rendered is not None:
            members.append(gzip_member(rendered_record(url, date, revisit_id, rendered), level))
        with self._lock:
            name, offset = self._append_locked(b"".join(members))
        return WarcPointer(name, offset + len(members[0]), len(members[1]), digest or "")

    def flush(self) -> None:
        """Nothing to do, by construction: write_* hand every byte to the OS (one unbuffered
        ``write``) before returning, so data survives the process being killed. Kept so callers
        can flush at checkpoints without knowing that. There is deliberately no fsync: the
        store is built to survive process death, not power loss."""
        return None

    def close(self) -> None:
        """Close the current file; idempotent."""
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

    def __enter__(self) -> WarcStore:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


# --- reading ----------------------------------------------------------------------------------


def _member_bytes(directory: str, ptr: WarcPointer) -> bytes:
    if (
        not ptr.file
        or os.path.basename(ptr.file) != ptr.file
        or ptr.file in (".", "..")
        or ptr.offset < 0
        or ptr.length <= 0
    ):
        raise WarcError(f"invalid WARC pointer {ptr}")
    path = os.path.join(directory, ptr.file)
    try:
        with open(path, "rb") as f:
            data = os.pread(f.fileno(), ptr.length, ptr.offset)
    except OSError as exc:
        raise WarcError(f"cannot read {path}: {exc}") from exc
    if len(data) != ptr.length:
        raise WarcError(f"{ptr} reaches past the end of {path}")
    return data


def _inflate_one(data: bytes, ptr: WarcPointer) -> bytes:
    d = zlib.decompressobj(zlib.MAX_WBITS | 16)
    try:
        raw = d.decompress(data)
    except zlib.error as exc:
        raise WarcError(f"{ptr} does not start a gzip member: {exc}") from exc
    if not d.eof or d.unused_data:
        raise WarcError(f"{ptr} does not delimit exactly one gzip member")
    return raw


def _referenced_head(directory: str, ptr: WarcPointer) -> dict[str, str] | None:
    """WARC headers of the record ``ptr`` names, lower-cased; None if its file is gone."""
    if not os.path.exists(os.path.join(directory, os.path.basename(ptr.file))):
        return None
    data = _member_bytes(directory, ptr)
    d = zlib.decompressobj(zlib.MAX_WBITS | 16)
    try:
        head = d.decompress(data, _HEAD_LIMIT)
    except zlib.error as exc:
        raise WarcError(f"revisit refers to {ptr}, which is not a gzip member: {exc}") from exc
    end = head.find(b"\r\n\r\n")
    if not head.startswith(b"WARC/1.") or end < 0:
        raise WarcError(f"revisit refers to {ptr}, which is not a WARC record")
    fields: dict[str, str] = {}
    for line in head[:end].split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        fields[name.strip().lower().decode("latin-1")] = value.strip().decode("utf-8", "replace")
    if ptr.payload_digest and fields.get("warc-payload-digest") != ptr.payload_digest:
        raise WarcError(
            f"revisit refers to {ptr}, but that record's payload digest is "
            f"{fields.get('warc-payload-digest')!r}"
        )
    return fields


def read_response(directory: str, ptr: WarcPointer) -> tuple[int, list[tuple[str, str]], bytes]:
    """(status, headers, body) of the response record at ``ptr``, for reparse (R19).

    The body's SHA-1 must equal both the pointer's and the record's payload digest; anything
    else raises :class:`WarcError`. Headers are as stored (see the module docstring), latin-1
    decoded like the fetcher's.
    """
    raw = _inflate_one(_member_bytes(directory, ptr), ptr)
    records = ArchiveIterator(io.BytesIO(raw), parse_http=True, stream_detect=False)
    record = next(iter(records), None)
    if record is None:
        raise WarcError(f"{ptr} holds no WARC record")
    if record.record_type != WarcRecordType.response:
        hint = (
            " (read the record it refers to)"
            if record.record_type == WarcRecordType.revisit
            else ""
        )
        raise WarcError(f"{ptr} is a {record.record_type} record, not a response{hint}")
    status = record.http_headers.status_code
    if status is None:
        raise WarcError(f"{ptr} has no HTTP status line")
    headers = [
        (k.decode("latin-1"), v.decode("latin-1")) for k, v in record.http_headers.items_bytes()
    ]
    body = record.reader.read()
    actual = payload_digest(body)
    stored = record.headers.get("WARC-Payload-Digest")
    if actual != ptr.payload_digest or actual != stored:
        raise WarcError(
            f"payload digest mismatch at {ptr}: body hashes to {actual}, "
            f"record says {stored}, pointer says {ptr.payload_digest}"
        )
    return status, headers, body


# --- tail repair ------------------------------------------------------------------------------


@dataclass(slots=True)
class _Member:
    end: int
    is_record: bool


def _read_member(f: BinaryIO, start: int) -> _Member | None:
    """The gzip member at ``start``: its end and whether it holds one whole WARC record.

    None when no complete member starts there (not gzip, corrupt, or cut before its trailer).
    Streams with bounded output, so a huge member never sits in memory.
    """
    f.seek(start)
    d = zlib.decompressobj(zlib.MAX_WBITS | 16)
    head = bytearray()
    total = 0
    tail = b""
    pos = start
    while True:
        chunk = f.read(_CHUNK)
        if not chunk:
            return None
        data = chunk
        try:
            while data:
                out = d.decompress(data, _CHUNK * 4)
                total += len(out)
                if len(head) < _HEAD_LIMIT:
                    head += out[: _HEAD_LIMIT - len(head)]
                tail = (tail + out[-4:])[-4:]
                if d.eof:
                    break
                data = d.unconsumed_tail
        except zlib.error:
            return None
        if d.eof:
            end = pos + len(chunk) - len(d.unused_data)
            return _Member(end, _is_whole_record(bytes(head), total, tail))
        pos += len(chunk)


def _is_whole_record(head: bytes, total: int, tail: bytes) -> bool:
    """A WARC header, a Content-Length block and the closing CRLF CRLF, nothing more or less."""
    if not head.startswith((b"WARC/1.0\r\n", b"WARC/1.1\r\n")):
        return False
    end = head.find(b"\r\n\r\n")
    if end < 0:
        return False
    length = None
    for line in head[:end].split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            try:
                length = int(value.strip())
            except ValueError:
                return False
    return length is not None and total == end + 4 + length + 4 and tail == b"\r\n\r\n"


def _walk(f: BinaryIO, start: int, size: int) -> tuple[list[int], int]:
    """Starts of the whole-record members chained from ``start``, and where the chain ends."""
    starts: list[int] = []
    pos = start
    while pos < size:
        member = _read_member(f, pos)
        if member is None or not member.is_record:
            break
        starts.append(pos)
        pos = member.end
    return starts, pos


def _candidates_backward(f: BinaryIO, size: int) -> Iterator[int]:
    """Positions of the gzip magic, last first, read in windows from the end."""
    hi = size
    while hi > 0:
        lo = max(0, hi - _SCAN_WINDOW)
        f.seek(lo)
        window = f.read(hi - lo + len(_GZIP_MAGIC) - 1)
        at = len(window)
        while (at := window.rfind(_GZIP_MAGIC, 0, at)) >= 0:
            if lo + at < hi:
                yield lo + at
        hi = lo


def _clean_length(f: BinaryIO, size: int) -> int:
    """Length of the longest prefix that ends with a whole-record member.

    The first magic (from the end) that starts a valid chain is a real member boundary: a false
    match inside compressed data would also need a valid deflate stream, CRC-32, length and
    WARC framing. A clean file therefore costs one member's decompression.
    """
    for start in _candidates_backward(f, size):
        starts, end = _walk(f, start, size)
        if starts:
            return end
    return 0


def repair_tail(path: str) -> int:
    """Cut an incomplete tail (a torn gzip member or a record that does not parse); bytes cut.

    Refuses (WarcError) to cut a file with no whole record at all that is too long to be a
    torn warcinfo: that is not a tail of ours, and cutting it would lose data.
    """
    try:
        with open(path, "r+b") as f:
            size = os.fstat(f.fileno()).st_size
            clean = _clean_length(f, size)
            if clean == size:
                return 0
            if clean == 0 and size > _NOT_A_WARC_LIMIT:
                raise WarcError(
                    f"{path} holds no complete gzip-per-record WARC record; not cutting "
                    f"{size} bytes (move the file away if it is not a WARC file)"
                )
            f.truncate(clean)
            return size - clean
    except OSError as exc:
        raise WarcError(f"cannot repair {path}: {exc}") from exc


# --- verification -----------------------------------------------------------------------------


def _check_warcio(f: BinaryIO, file_report: dict[str, Any]) -> tuple[list[int], set[int]]:
    """Read with warcio, checking block and payload digests; record starts and verified ones."""
    offsets: list[int] = []
    verified: set[int] = set()
    f.seek(0)
    it = warcio.archiveiterator.ArchiveIterator(f, check_digests=True)
    try:
        for record in it:
            stream = record.raw_stream
            while stream.read(_CHUNK):
                pass
            offset = it.get_record_offset()
            offsets.append(offset)
            problems = record.digest_checker.problems
            if problems:
                file_report["errors"].append(f"warcio: record at {offset}: {'; '.join(problems)}")
            elif record.rec_type == "response":
                if record.rec_headers.get_header("WARC-Payload-Digest"):
                    verified.add(offset)
                else:
                    file_report["errors"].append(f"warcio: response at {offset} has no digest")
    except Exception as exc:  # warcio raises assorted types on malformed input
        file_report["errors"].append(f"warcio: {type(exc).__name__}: {exc}")
    return offsets, verified


def _check_fastwarc(
    f: BinaryIO, file_report: dict[str, Any], counts: Counter[str]
) -> tuple[list[int], set[int], str | None]:
    """Read with FastWARC, checking block digests and (non-revisit) payload digests.

    Returns the record offsets, the responses whose digests verified, and the first type."""
    offsets: list[int] = []
    verified: set[int] = set()
    first: str | None = None
    f.seek(0)
    try:
        for record in ArchiveIterator(f, parse_http=False):
            offset = record.stream_pos
            offsets.append(offset)
            rtype = record.record_type
            counts[str(rtype)] += 1
            first = first or str(rtype)
            bad: list[str] = []
            if record.headers.get("WARC-Block-Digest") is None:
                bad.append("no block digest")
            elif not record.verify_block_digest(consume=False):
                bad.append("block digest failed")
            has_payload = record.headers.get("WARC-Payload-Digest") is not None
            if rtype == WarcRecordType.response or (
                has_payload and rtype != WarcRecordType.revisit
            ):
                record.parse_http()
                if not has_payload:
                    bad.append("no payload digest")
                elif not record.verify_payload_digest(consume=False):
                    bad.append("payload digest failed")
            if bad:
                file_report["errors"].append(f"FastWARC: record at {offset}: {', '.join(bad)}")
            elif rtype == WarcRecordType.response:
                verified.add(offset)
    except Exception as exc:  # FastWARC raises OSError/ValueError on malformed input
        file_report["errors"].append(f"FastWARC: {type(exc).__name__}: {exc}")
    return offsets, verified, first


def verify_directory(directory: str, *, strict: bool = False) -> dict[str, Any]:
    """Read every ``*.warc.gz`` end to end with warcio and with FastWARC; a report.

    Per file: the record count by type, and errors from three independent checks that must
    agree: the member walk (every byte belongs to a whole-record gzip member), warcio (block
    and payload digests) and FastWARC (the same digests, its own parser). ``ok`` is False on
    any error; ``strict=True`` raises :class:`WarcError` instead.
    """
    report: dict[str, Any] = {
        "directory": os.path.abspath(directory),
        "files": [],
        "records": {},
        "responses_verified": 0,
        "errors": [],
    }
    totals: Counter[str] = Counter()
    try:
        names = sorted(n for n in os.listdir(directory) if n.endswith(".warc.gz"))
    except OSError as exc:
        raise WarcError(f"cannot list {directory}: {exc}") from exc
    for name in names:
        path = os.path.join(directory, name)
        counts: Counter[str] = Counter()
        file_report: dict[str, Any] = {"file": name, "bytes": 0, "records": {}, "errors": []}
        try:
            with open(path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                file_report["bytes"] = size
                starts, end = _walk(f, 0, size)
                if end != size:
                    file_report["errors"].append(
                        f"bytes {end}..{size} are not whole gzip-per-record WARC records"
                    )
                wa_offsets, wa_ok = _check_warcio(f, file_report)
                fw_offsets, fw_ok, first = _check_fastwarc(f, file_report, counts)
        except OSError as exc:
            file_report["errors"].append(f"cannot read: {exc}")
            starts, wa_offsets, fw_offsets, wa_ok, fw_ok, first = [], [], [], set(), set(), None
        if not file_report["errors"] and not (starts == wa_offsets == fw_offsets):
            file_report["errors"].append(
                f"readers disagree: {len(starts)} members, warcio {len(wa_offsets)} records, "
                f"FastWARC {len(fw_offsets)} records"
            )
        if file_report["bytes"] and not file_report["errors"] and first != "warcinfo":
            # (An empty file is a store killed between creating a file and its warcinfo.)
            file_report["errors"].append("the file does not start with a warcinfo record")
        file_report["records"] = dict(sorted(counts.items()))
        totals.update(counts)
        report["responses_verified"] += len(wa_ok & fw_ok)
        report["files"].append(file_report)
        report["errors"] += [f"{name}: {e}" for e in file_report["errors"]]
    report["records"] = dict(sorted(totals.items()))
    report["ok"] = not report["errors"]
    if strict and report["errors"]:
        shown = "; ".join(report["errors"][:5])
        more = len(report["errors"]) - 5
        raise WarcError(
            f"WARC verification failed: {shown}" + (f" (+{more} more)" if more > 0 else "")
        )
    return report


# --- downloaded files (issue #6 item 5) -------------------------------------------------------


def store_download(directory: str, body: bytes, suffix: str = "") -> str:
    """Store a downloaded file as ``directory/files/<sha256 hex><suffix>``; return its path.

    Named by content, written to a temporary file and renamed over the name, so a repeated
    download replaces itself instead of adding a copy, and a reader never sees half a file.
    """
    if not _SUFFIX_RE.fullmatch(suffix):
        raise WarcError(
            f"file suffix {suffix!r} must look like '.pdf' or '.tar.gz' (letters, digits, _ -)"
        )
    target_dir = os.path.join(directory, "files")
    target = os.path.join(target_dir, hashlib.sha256(body).hexdigest() + suffix)
    try:
        os.makedirs(target_dir, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target_dir, prefix=".part-")
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(body)
            os.replace(tmp, target)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
    except OSError as exc:
        raise WarcError(f"cannot store download in {target_dir}: {exc}") from exc
    return target


# --- measurement ------------------------------------------------------------------------------


def _sample_page(seq: int, size: int) -> bytes:
    """HTML-like body that compresses about as well as real pages (~3x with zlib)."""
    rng = random.Random(seq)
    words = [
        "".join(rng.choices("abcdefghijklmnopqrstuvwxyz", k=rng.randint(2, 10))) for _ in range(400)
    ]
    parts = [f"<!doctype html><html><head><title>Page {seq}</title></head><body><main>"]
    length = len(parts[0])
    while length < size:
        part = (
            f'<div class="product-card"><a href="/product/SKU-{rng.randint(0, 99999):05d}">'
            f'{" ".join(rng.choices(words, k=3))}</a><span class="price">'
            f"{rng.randint(1, 999)}.99</span><p>{' '.join(rng.choices(words, k=8))}</p></div>\n"
        )
        parts.append(part)
        length += len(part)
    return "".join(parts).encode()[:size]


def write_cost(
    directory: str,
    *,
    exchanges: int = 2000,
    body_bytes: int = 15 * 1024,
    pages: int = 50,
    compression_level: int = COMPRESSION_LEVEL,
) -> dict[str, float]:
    """Time :meth:`WarcStore.write_exchange` (request + response + metadata) per exchange.

    Writes ``exchanges`` exchanges of ``body_bytes`` HTML-like bodies (``pages`` distinct ones)
    into a fresh prefix under ``directory``; returns wall and CPU microseconds per exchange and
    the compressed bytes per exchange. For ``idemcrawl bench`` and docs/warc.md.
    """
    bodies = [_sample_page(i, body_bytes) for i in range(pages)]
    request = [("User-Agent", DEFAULT_USER_AGENT), ("Accept-Encoding", "gzip, br")]
    response = [
        ("Content-Type", "text/html; charset=utf-8"),
        ("Content-Encoding", "gzip"),
        ("Content-Length", "5123"),
    ]
    prefix = f"bench-{os.getpid()}-{time.monotonic_ns()}"
    with WarcStore(directory, prefix, compression_level=compression_level) as store:
        wall, cpu = time.perf_counter(), time.process_time()
        for i in range(exchanges):
            url = f"http://127.0.0.1:8000/product/{i}"
            store.write_exchange(
                url=url,
                fetched_at=time.time(),
                request_headers=request,
                status=200,
                reason="OK",
                http_version="HTTP/1.1",
                response_headers=response,
                body=bodies[i % pages],
                ip="127.0.0.1",
                metadata={"links": [f"{url}/{j}" for j in range(20)], "elapsed": 0.01},
            )
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        size = sum(
            os.path.getsize(os.path.join(directory, n))
            for n in os.listdir(directory)
            if n.startswith(prefix)
        )
    return {
        "exchanges": exchanges,
        "body_bytes": body_bytes,
        "compression_level": compression_level,
        "wall_us_per_exchange": wall / exchanges * 1e6,
        "cpu_us_per_exchange": cpu / exchanges * 1e6,
        "stored_bytes_per_exchange": size / exchanges,
    }
