"""Safe, streaming sitemap parsing (R12): XML urlsets and indexes, gzip, plain-text lists.

A sitemap is untrusted input that can be huge, compressed and hostile, so parsing is built to
keep time and memory bounded whatever arrives:

* **Streaming.** The body is read in 64 KiB chunks and fed to an incremental SAX parser
  (expat, through ``defusedxml``); no tree is built, and element text is kept only inside the
  few leaf elements we read, capped at :data:`~idemcrawl.url.MAX_URL_LENGTH` + 1 characters.
  Memory stays at a few chunks plus the collected entries, whatever the input size.
* **gzip** is recognised by its magic bytes (``1f 8b``), not by the file name or
  Content-Type, and decompressed incrementally by :class:`gzip.GzipFile`, which never inflates
  more than it is asked for. The ``max_bytes`` limit (50 MiB, the protocol's own) applies to
  the *decompressed* stream, so a gzip bomb stops at the limit with a recorded reason.
* **No entities, no DTD fetching.** ``defusedxml``'s expat reader raises at the first
  ``<!ENTITY`` declaration, before anything can be expanded, so "billion laughs" and
  external-entity (XXE) documents fail at once with an error naming the entity. External DTDs
  and parameter entities are never loaded. A plain ``<!DOCTYPE>`` without entities is allowed.
* **Limits are results, not exceptions.** More than ``max_urls`` entries, more than
  ``max_bytes``, malformed XML, refused entities: whatever was parsed before the problem is
  returned, with ``truncated_reason`` or ``errors`` saying why it stopped. Only an invalid
  ``base_url`` (a caller bug) raises.

Scope rules (sitemaps.org protocol):

* Every ``<loc>`` must be an absolute http(s) URL; it is normalised with
  :func:`idemcrawl.url.normalise`. Relative or unparseable ones are counted in ``invalid``
  (resolving them against the sitemap would turn junk text into crawlable URLs).
* **Host rule, enforced:** an entry whose host differs from the sitemap's own host is dropped
  and counted in ``cross_host``. The scheme and port may differ (http -> https migrations
  routinely leave ``http://`` sitemaps behind, and it is still the same authority).
  Cross-submission through robots.txt (host B's robots.txt names a sitemap on host A for
  B's URLs) is legitimate: the caller passes B in ``allowed_hosts``.
* **Path rule, not enforced by default:** the protocol says a sitemap at
  ``/catalog/sitemap.xml`` may only list URLs under ``/catalog/``. Search engines do not apply
  this to sitemaps found in robots.txt and real sites routinely keep sitemaps under
  ``/sitemaps/`` or ``/media/`` while listing the whole site, so enforcing it would drop most
  of many legitimate sitemaps. ``strict_path=True`` enforces it (dropped entries are counted in
  ``out_of_path``).
* Sitemap index entries (child sitemaps) obey the same rules.
"""

from __future__ import annotations

import gzip
import io
import math
import re
import zlib
from collections.abc import Generator, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, timezone
from typing import BinaryIO, Final, Literal, Protocol
from xml.sax import SAXException
from xml.sax.handler import (
    ContentHandler,
    LexicalHandler,
    feature_namespaces,
    property_lexical_handler,
)

from defusedxml.common import DefusedXmlException
from defusedxml.expatreader import DefusedExpatParser

from .url import MAX_URL_LENGTH, InvalidURL, hostname, normalise

__all__ = [
    "DEFAULT_MAX_BYTES",
    "DEFAULT_MAX_URLS",
    "ByteStream",
    "SitemapResult",
    "SitemapURL",
    "parse_lastmod",
    "parse_sitemap",
    "priority_for",
]

#: The protocol's per-file limits: 50,000 URLs and 50 MiB uncompressed.
DEFAULT_MAX_URLS: Final = 50_000
DEFAULT_MAX_BYTES: Final = 50 * 1024 * 1024

_CHUNK: Final = 64 * 1024
_GZIP_MAGIC: Final = b"\x1f\x8b"
_UTF8_BOM: Final = b"\xef\xbb\xbf"
_UTF16_BOMS: Final = (b"\xff\xfe", b"\xfe\xff")
_BLANK: Final = b" \t\r\n\f\v"
#: Enough bytes to see past a BOM before deciding the format.
_SNIFF_BYTES: Final = 4
_BYTES: Final = (bytes, bytearray, memoryview)
#: Leaf text beyond this is useless (normalise rejects longer URLs), so it is not buffered.
_MAX_FIELD_CHARS: Final = MAX_URL_LENGTH + 1
#: Input without a single parse event beyond this is refused (see ``_parse_xml``).
_MAX_STALL_BYTES: Final = 1024 * 1024
_CHANGEFREQS: Final = frozenset(
    {"always", "hourly", "daily", "weekly", "monthly", "yearly", "never"}
)
_DEFAULT_PRIORITY: Final = 0.5

Kind = Literal["urlset", "index", "unknown"]


@dataclass(frozen=True, slots=True)
class SitemapURL:
    """One ``<url>`` entry: normalised URL, lastmod as UNIX seconds, changefreq, priority."""

    url: str
    lastmod: float | None = None
    changefreq: str | None = None
    priority: float = _DEFAULT_PRIORITY


@dataclass(slots=True)
class SitemapResult:
    """What one sitemap document yielded, and why it stopped if it did not reach its end.

    ``kind`` is ``"urlset"`` (XML ``<urlset>`` or a plain-text list: see ``format``),
    ``"index"`` (``<sitemapindex>``: children in ``sitemaps``) or ``"unknown"`` (empty, not a
    sitemap, or refused before the root element). ``invalid`` counts entries without a usable
    absolute URL, ``bad_fields`` unusable lastmod/changefreq/priority values (the entry is
    kept with the default), ``bytes_read`` the decompressed bytes consumed.
    """

    kind: Kind = "unknown"
    urls: list[SitemapURL] = field(default_factory=list)
    sitemaps: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    truncated_reason: str | None = None
    invalid: int = 0
    cross_host: int = 0
    out_of_path: int = 0
    bad_fields: int = 0
    format: Literal["xml", "text"] = "xml"
    compressed: bool = False
    bytes_read: int = 0


# --------------------------------------------------------------------------------------------
# Field parsing

_W3C_DATETIME: Final = re.compile(
    r"""(?x)
    (\d{4})                                     # YYYY
    (?:-(\d{2})                                 # -MM
      (?:-(\d{2})                               # -DD
        (?:[Tt\ ](\d{2}):(\d{2})                # Thh:mm
          (?::(\d{2})(?:[.,](\d+))?)?           # :ss(.s+)
          \s*(Z|z|[+-]\d{2}(?::?\d{2})?)?       # TZD (absent: taken as UTC)
        )?
      )?
    )?
    """
)


def parse_lastmod(text: str) -> float | None:
    """Parse a W3C Datetime (the ISO 8601 profile sitemaps use) to UNIX seconds, or None.

    Accepts ``YYYY``, ``YYYY-MM``, ``YYYY-MM-DD`` and date-times with minutes, seconds and
    fractions, with ``Z`` or ``±hh:mm`` (also ``±hhmm``/``±hh``). Being lenient where it costs
    nothing, a space instead of ``T`` and a missing zone (read as UTC) are accepted too.
    Anything else, including impossible dates, gives None rather than an exception.
    """
    m = _W3C_DATETIME.fullmatch(text.strip())
    if m is None:
        return None
    year, month, day, hour, minute, second, frac, tzd = m.groups()
    tz = UTC
    if tzd and tzd not in ("Z", "z"):
        sign = -1 if tzd[0] == "-" else 1
        digits = tzd[1:].replace(":", "")
        offset = timedelta(hours=int(digits[:2]), minutes=int(digits[2:4] or 0))
        if offset >= timedelta(hours=24):
            return None
        tz = timezone(sign * offset)
    try:
        moment = datetime(
            int(year),
            int(month or 1),
            int(day or 1),
            int(hour or 0),
            int(minute or 0),
            int(second or 0),
            tzinfo=tz,
        )
    except ValueError:
        return None
    stamp = moment.timestamp()
    if frac:
        stamp += int(frac[:6].ljust(6, "0")) / 1_000_000
    return stamp


def _parse_priority(text: str) -> tuple[float, bool]:
    """``(priority, valid)``: out-of-range numbers are clamped to [0, 1], non-numbers (and NaN)
    give the default 0.5; either way ``valid`` is False so the caller can count it."""
    try:
        value = float(text.strip())
    except ValueError:
        return _DEFAULT_PRIORITY, False
    if math.isnan(value):
        return _DEFAULT_PRIORITY, False
    clamped = min(1.0, max(0.0, value))
    return clamped, clamped == value


def priority_for(entry: SitemapURL, now: float) -> int:
    """An integer frontier priority (higher = fetched sooner within its host) in ``0..100``.

    ``round(60 * priority + 40 * recency)`` where ``recency = 0.5 ** (age_days / 30)``
    (modified now: 1, a month ago: 0.5, a year ago: ~0; a lastmod in the future counts as
    now) and 0 without lastmod. The site's own priority dominates because it is the only
    ranking a site gives us; recency breaks ties in favour of pages that changed, which are
    the ones most worth (re)fetching. A default entry (0.5, no lastmod) gets 30, so sitemap
    URLs come before ordinary discovered links (priority 0) of the same host.
    """
    recency = 0.0
    if entry.lastmod is not None:
        age_days = max(0.0, now - entry.lastmod) / 86_400.0
        recency = 0.5 ** (age_days / 30.0)
    priority = min(1.0, max(0.0, entry.priority))
    return round(60.0 * priority + 40.0 * recency)


# --------------------------------------------------------------------------------------------
# Byte streams: prefix, gzip, size limit


class ByteStream(Protocol):
    """Anything with a blocking ``read(size) -> bytes``: files, ``BytesIO``, ``BinaryIO``..."""

    def read(self, size: int = -1, /) -> bytes: ...


class _Prefixed:
    """A stream with some already-read bytes put back in front (for magic-byte sniffing)."""

    def __init__(self, head: bytes, rest: ByteStream) -> None:
        self._head = head
        self._rest = rest

    def read(self, size: int = -1) -> bytes:
        head = self._head
        if not head:
            return self._rest.read(size)
        if 0 <= size < len(head):
            self._head = head[size:]
            return head[:size]
        self._head = b""
        return head + self._rest.read(-1 if size < 0 else size - len(head))

    def seek(self, offset: int, whence: int = 0, /) -> int:
        """Refused: reading is strictly sequential (``GzipFile`` only seeks to rewind)."""
        raise io.UnsupportedOperation("sitemap streams are read sequentially")


class _Bounded:
    """Reads at most ``limit`` bytes from ``source``; notices when there would be more."""

    def __init__(self, source: ByteStream, limit: int) -> None:
        self._source = source
        self._remaining = limit
        self.exceeded = False
        self.consumed = 0

    def read(self, size: int) -> bytes:
        if self._remaining <= 0:
            if not self.exceeded and self._source.read(1):
                self.exceeded = True
            return b""
        data = self._source.read(min(size, self._remaining))
        self._remaining -= len(data)
        self.consumed += len(data)
        return data


def _read_head(stream: ByteStream, size: int) -> bytes:
    """Read up to ``size`` bytes, tolerating short reads from pipes and sockets."""
    head = b""
    while len(head) < size:
        data = stream.read(size - len(head))
        if not data:
            break
        head += data
    return head


class _Stop(Exception):
    """Raised from inside the parser callbacks to stop at a limit."""


class _NotSitemap(Exception):
    """The root element is neither ``urlset`` nor ``sitemapindex``."""


# --------------------------------------------------------------------------------------------
# Entry collection (shared by the XML and text readers)


class _Collector:
    """Validates entries, applies the scope rules and limits, and fills the result."""

    def __init__(
        self,
        result: SitemapResult,
        base_url: str,
        max_urls: int,
        allowed_hosts: Iterable[str],
        strict_path: bool,
    ) -> None:
        self.result = result
        self.max_urls = max_urls
        self.entries = 0
        self.hosts = {hostname(base_url)} | {h.lower().rstrip(".") for h in allowed_hosts}
        self.path_prefix: str | None = None
        if strict_path:
            after_host = base_url.find("/", base_url.find("://") + 3)
            path = base_url[after_host:].split("?", 1)[0]
            self.path_prefix = path[: path.rfind("/") + 1]

    def _url(self, loc: str | None) -> str | None:
        """The normalised, in-scope URL of ``loc``, or None after counting why not."""
        result = self.result
        if not loc or not loc.strip():
            result.invalid += 1
            return None
        try:
            url = normalise(loc)
        except InvalidURL:
            result.invalid += 1
            return None
        if hostname(url) not in self.hosts:
            result.cross_host += 1
            return None
        if self.path_prefix is not None:
            after_host = url.find("/", url.find("://") + 3)
            if not url.startswith(self.path_prefix, after_host):
                result.out_of_path += 1
                return None
        return url

    def _count_entry(self) -> None:
        self.entries += 1
        if self.entries > self.max_urls:
            self.result.truncated_reason = (
                f"more than {self.max_urls} entries: stopped at the limit"
            )
            raise _Stop

    def url_entry(self, fields: dict[str, str]) -> None:
        self._count_entry()
        url = self._url(fields.get("loc"))
        if url is None:
            return
        result = self.result
        lastmod: float | None = None
        if "lastmod" in fields:
            lastmod = parse_lastmod(fields["lastmod"])
            if lastmod is None:
                result.bad_fields += 1
        changefreq: str | None = None
        if "changefreq" in fields:
            changefreq = fields["changefreq"].strip().lower()
            if changefreq not in _CHANGEFREQS:
                changefreq = None
                result.bad_fields += 1
        priority = _DEFAULT_PRIORITY
        if "priority" in fields:
            priority, valid = _parse_priority(fields["priority"])
            if not valid:
                result.bad_fields += 1
        result.urls.append(SitemapURL(url, lastmod, changefreq, priority))

    def sitemap_entry(self, fields: dict[str, str]) -> None:
        self._count_entry()
        url = self._url(fields.get("loc"))
        if url is not None:
            self.result.sitemaps.append(url)


# --------------------------------------------------------------------------------------------
# XML


class _SitemapHandler(ContentHandler, LexicalHandler):
    """SAX callbacks that turn ``<urlset>``/``<sitemapindex>`` into collector calls.

    Only direct children of the root in the root's namespace count as entries, and only their
    direct children in that namespace as fields, so extension elements such as
    ``<image:image><image:loc>`` or ``<xhtml:link>`` can never pass for a page ``<loc>``. Any
    namespace (or none) is accepted for the root itself: sitemaps in the wild use the
    sitemaps.org one, Google's old one, or forget it.

    ``events`` counts callbacks so the feeder can tell when expat stops making progress.
    """

    _FIELDS: Final = frozenset({"loc", "lastmod", "changefreq", "priority"})

    def __init__(self, collector: _Collector) -> None:
        super().__init__()
        self._collector = collector
        self._depth = 0
        self._ns: str | None = None
        self._entry_tag = ""
        self._fields: dict[str, str] | None = None
        self._field: str | None = None
        self._buf: list[str] = []
        self._buf_len = 0
        self.events = 0

    def startElementNS(
        self, name: tuple[str | None, str], qname: str | None, attrs: object
    ) -> None:
        self.events += 1
        uri, local = name
        self._depth += 1
        depth = self._depth
        if depth == 1:
            self._ns = uri
            if local == "urlset":
                self._collector.result.kind = "urlset"
                self._entry_tag = "url"
            elif local == "sitemapindex":
                self._collector.result.kind = "index"
                self._entry_tag = "sitemap"
            else:
                raise _NotSitemap(local)
        elif depth == 2:
            if uri == self._ns and local == self._entry_tag:
                self._fields = {}
        elif (
            depth == 3
            and self._fields is not None
            and uri == self._ns
            and local in self._FIELDS
            and local not in self._fields
        ):
            self._field = local
            self._buf = []
            self._buf_len = 0

    def characters(self, content: str) -> None:
        self.events += 1
        if self._field is not None and self._buf_len < _MAX_FIELD_CHARS:
            self._buf.append(content)
            self._buf_len += len(content)

    def endElementNS(self, name: tuple[str | None, str], qname: str | None) -> None:
        self.events += 1
        depth = self._depth
        self._depth -= 1
        if depth == 3 and self._field is not None and self._fields is not None:
            self._fields[self._field] = "".join(self._buf)[:_MAX_FIELD_CHARS]
            self._field = None
            self._buf = []
        elif depth == 2 and self._fields is not None:
            fields, self._fields = self._fields, None
            if self._entry_tag == "url":
                self._collector.url_entry(fields)
            else:
                self._collector.sitemap_entry(fields)

    def processingInstruction(self, target: str, data: str) -> None:
        self.events += 1

    def comment(self, content: str) -> None:  # lexical handler: comments are progress too
        self.events += 1


def _parse_xml(chunks: Iterator[bytes], collector: _Collector) -> None:
    """Feed the chunks to a defused expat SAX parser, stopping at limits and stalls.

    A stall is input that produces no parse event at all: one start tag, attribute value,
    comment or DOCTYPE bigger than :data:`_MAX_STALL_BYTES`. expat must buffer such a token
    whole and (expat < 2.6) re-scans it on every feed, which measured 36 s and 100 MB for a
    50 MB attribute value; no legitimate sitemap has a token anywhere near 1 MiB.
    """
    result = collector.result
    handler = _SitemapHandler(collector)
    parser = DefusedExpatParser(forbid_dtd=False, forbid_entities=True, forbid_external=True)
    parser.setFeature(feature_namespaces, True)
    parser.setContentHandler(handler)
    parser.setProperty(property_lexical_handler, handler)
    stalled = 0
    try:
        for chunk in chunks:
            before = handler.events
            parser.feed(chunk)
            if handler.events != before:
                stalled = 0
                continue
            stalled += len(chunk)
            if stalled > _MAX_STALL_BYTES:
                result.errors.append(
                    f"XML token larger than {_MAX_STALL_BYTES} bytes (no parse progress): refused"
                )
                return
        if result.truncated_reason is None:
            parser.close()
    except _Stop:
        pass
    except _NotSitemap as exc:
        result.kind = "unknown"
        result.errors.append(f"not a sitemap: root element <{exc}>")
    except DefusedXmlException as exc:
        result.errors.append(
            f"unsafe XML refused ({type(exc).__name__}): entity declarations and external "
            f"references are not allowed in sitemaps: {exc}"
        )
    except SAXException as exc:
        if result.truncated_reason is None:  # cut off by the size limit: that is the reason
            result.errors.append(f"XML error: {exc}")


# --------------------------------------------------------------------------------------------
# Plain text


def _parse_text(chunks: Iterator[bytes], collector: _Collector) -> None:
    """One URL per line (UTF-8). Over-long lines are skipped without being buffered."""
    result = collector.result
    result.kind = "urlset"
    result.format = "text"
    carry = b""
    overlong = False
    first = True
    try:
        for chunk in chunks:
            if first:
                chunk = chunk.removeprefix(_UTF8_BOM)
                first = False
            lines = (carry + chunk).split(b"\n")
            carry = lines.pop()
            for line in lines:
                if overlong:  # the tail of a line already rejected as too long
                    overlong = False
                    continue
                _text_line(line, collector)
            if len(carry) > _MAX_FIELD_CHARS * 4:  # UTF-8: at most 4 bytes per character
                if not overlong:
                    overlong = True
                    collector.url_entry({"loc": ""})  # counts as an invalid entry
                carry = b""
        if carry and not overlong:
            _text_line(carry, collector)
    except _Stop:
        pass


def _text_line(line: bytes, collector: _Collector) -> None:
    line = line.strip()
    if not line:
        return
    try:
        loc = line.decode("utf-8")
    except UnicodeDecodeError:
        loc = ""  # counted as invalid
    collector.url_entry({"loc": loc})


# --------------------------------------------------------------------------------------------
# Entry point


def _chunks(
    reader: _Bounded, first: bytes, result: SitemapResult, max_bytes: int
) -> Generator[bytes, None, None]:
    """Yield ``first`` then the rest of ``reader``; record why reading stopped early."""
    try:
        if first:
            yield first
        while True:
            data = reader.read(_CHUNK)
            if not data:
                break
            yield data
    except (OSError, EOFError, zlib.error) as exc:  # BadGzipFile is an OSError
        result.errors.append(f"cannot read {'gzip ' if result.compressed else ''}body: {exc}")
    finally:
        result.bytes_read = reader.consumed
    if reader.exceeded and result.truncated_reason is None:
        result.truncated_reason = f"more than {max_bytes} bytes uncompressed: stopped at the limit"


def _content_start(data: bytes) -> bytes:
    """``data`` without a leading UTF-8 BOM and blanks: its first byte decides the format."""
    return data.removeprefix(_UTF8_BOM).lstrip(_BLANK)


def parse_sitemap(
    stream: BinaryIO | ByteStream | bytes,
    *,
    base_url: str,
    max_urls: int = DEFAULT_MAX_URLS,
    max_bytes: int = DEFAULT_MAX_BYTES,
    allowed_hosts: Iterable[str] = (),
    strict_path: bool = False,
) -> SitemapResult:
    """Parse one sitemap document (XML urlset or index, optionally gzipped, or plain text).

    ``base_url`` is the URL the sitemap was fetched from (after redirects): it decides which
    host the entries may belong to. ``allowed_hosts`` adds hosts (bare names as
    :func:`~idemcrawl.url.hostname` returns them, i.e. punycode) whose URLs
    are also accepted, for robots.txt cross-submission. ``stream`` is read sequentially and
    never seeked, so a response body stream can be passed as is; it is not closed.

    ``max_urls`` caps the entries of either kind (``<url>`` or child ``<sitemap>``, valid or
    not, and lines of a text sitemap); ``max_bytes`` caps the decompressed size.

    The format is sniffed, not taken from headers: gzip by its magic bytes, then XML if the
    first non-blank byte (after an optional UTF-8 BOM) is ``<``, otherwise plain text.

    Raises :class:`~idemcrawl.url.InvalidURL` only for an invalid ``base_url``; every problem
    with the document itself is reported in the result.
    """
    base = normalise(base_url)
    result = SitemapResult()
    collector = _Collector(result, base, max_urls, allowed_hosts, strict_path)
    raw: ByteStream = io.BytesIO(bytes(stream)) if isinstance(stream, _BYTES) else stream
    magic = _read_head(raw, len(_GZIP_MAGIC))
    prefixed = _Prefixed(magic, raw)
    source: ByteStream = prefixed
    if magic == _GZIP_MAGIC:
        result.compressed = True
        source = gzip.GzipFile(fileobj=prefixed)  # read mode: ``prefixed`` has no ``mode``
    reader = _Bounded(source, max_bytes)

    # Sniff the format from the first non-blank byte, reading on while the start is all blank.
    first = b""
    try:
        while True:
            data = reader.read(_CHUNK)
            if not data:
                break
            first += data
            if len(first) >= _SNIFF_BYTES and _content_start(first):
                break
            if len(first) > _CHUNK:  # all blank so far: keep only what sniffing needs
                first = b""
    except (OSError, EOFError, zlib.error) as exc:
        result.errors.append(f"cannot read {'gzip ' if result.compressed else ''}body: {exc}")
        result.bytes_read = reader.consumed
        return result
    start = _content_start(first)
    chunks = _chunks(reader, first, result, max_bytes)
    if not start:
        for _ in chunks:  # only blank bytes: drain to learn whether the limit was hit
            pass
        result.errors.append("empty document")
    elif start.startswith(b"<") or first.startswith(_UTF16_BOMS):
        _parse_xml(chunks, collector)
    else:
        _parse_text(chunks, collector)
    chunks.close()
    if reader.exceeded and result.truncated_reason is None:
        result.truncated_reason = f"more than {max_bytes} bytes uncompressed: stopped at the limit"
    result.bytes_read = reader.consumed
    return result
