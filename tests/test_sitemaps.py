"""Tests for idemcrawl.sitemaps: formats, limits, hostile input and scope rules."""

from __future__ import annotations

import gzip
import io
import time
import tracemalloc
from datetime import UTC, datetime

import pytest

from idemcrawl.sitemaps import (
    SitemapURL,
    parse_lastmod,
    parse_sitemap,
    priority_for,
)
from idemcrawl.url import InvalidURL

NS = "http://www.sitemaps.org/schemas/sitemap/0.9"
BASE = "https://ex.com/sitemap.xml"


def urlset(*entries: str, extra_ns: str = "") -> bytes:
    body = "".join(f"<url>{e}</url>" for e in entries)
    head = f'<?xml version="1.0" encoding="UTF-8"?>\n<urlset xmlns="{NS}"{extra_ns}>'
    return f"{head}{body}</urlset>".encode()


def epoch(year: int, month: int, day: int, hour: int = 0, minute: int = 0, sec: int = 0) -> float:
    return datetime(year, month, day, hour, minute, sec, tzinfo=UTC).timestamp()


class Unseekable(io.RawIOBase):
    """A response-body-like stream: short reads, no seek."""

    def __init__(self, data: bytes, step: int = 1000) -> None:
        self._data = memoryview(data)
        self._pos = 0
        self._step = step

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        if size < 0:
            size = len(self._data)
        n = min(size, self._step)
        chunk = self._data[self._pos : self._pos + n].tobytes()
        self._pos += len(chunk)
        return chunk


# --- urlset, index, text ----------------------------------------------------------------------


def test_urlset_with_all_fields() -> None:
    doc = urlset(
        "<loc>https://ex.com/a?x=1&amp;y=2</loc><lastmod>2024-05-01T10:00:00+02:00</lastmod>"
        "<changefreq> Daily </changefreq><priority>0.8</priority>",
        "<loc>  https://EX.com/b/../c  </loc><lastmod>2024-05-02</lastmod>",
        "<loc>https://ex.com/d</loc>",
    )
    result = parse_sitemap(doc, base_url=BASE)
    assert result.kind == "urlset"
    assert result.format == "xml"
    assert result.errors == []
    assert result.truncated_reason is None
    assert result.urls == [
        SitemapURL("https://ex.com/a?x=1&y=2", epoch(2024, 5, 1, 8), "daily", 0.8),
        SitemapURL("https://ex.com/c", epoch(2024, 5, 2), None, 0.5),
        SitemapURL("https://ex.com/d", None, None, 0.5),
    ]
    assert (result.invalid, result.cross_host, result.bad_fields) == (0, 0, 0)


def test_extension_locs_are_not_pages() -> None:
    doc = urlset(
        "<loc>https://ex.com/p</loc><image:image><image:loc>https://ex.com/i.jpg</image:loc>"
        "</image:image>",
        extra_ns=' xmlns:image="http://www.google.com/schemas/sitemap-image/1.1"',
    )
    assert [u.url for u in parse_sitemap(doc, base_url=BASE).urls] == ["https://ex.com/p"]


def test_sitemap_without_namespace_is_accepted() -> None:
    doc = b"<urlset><url><loc>https://ex.com/x</loc></url></urlset>"
    assert [u.url for u in parse_sitemap(doc, base_url=BASE).urls] == ["https://ex.com/x"]


def test_sitemap_index_and_gzipped_child() -> None:
    index = (
        f'<sitemapindex xmlns="{NS}">'
        "<sitemap><loc>https://ex.com/s1.xml.gz</loc><lastmod>2024-01-01</lastmod></sitemap>"
        "<sitemap><loc>https://ex.com/s2.xml</loc></sitemap>"
        "<sitemap><loc>https://evil.example/s3.xml</loc></sitemap>"
        "</sitemapindex>"
    ).encode()
    result = parse_sitemap(index, base_url="https://ex.com/sitemap_index.xml")
    assert result.kind == "index"
    assert result.sitemaps == ["https://ex.com/s1.xml.gz", "https://ex.com/s2.xml"]
    assert result.cross_host == 1
    assert result.urls == []

    child = gzip.compress(urlset("<loc>https://ex.com/from-gzip</loc>"))
    assert child[:2] == b"\x1f\x8b"
    result = parse_sitemap(Unseekable(child, step=7), base_url=result.sitemaps[0])
    assert result.compressed
    assert [u.url for u in result.urls] == ["https://ex.com/from-gzip"]


def test_plain_text_sitemap() -> None:
    doc = (
        "\ufeffhttps://ex.com/1\nhttps://ex.com/2\r\n\n   \n"
        "not a url\nhttps://other.example/3\nhttps://ex.com/caf\u00e9\n"
    ).encode()
    result = parse_sitemap(doc, base_url="https://ex.com/sitemap.txt")
    assert result.kind == "urlset"
    assert result.format == "text"
    assert [u.url for u in result.urls] == [
        "https://ex.com/1",
        "https://ex.com/2",
        "https://ex.com/caf%C3%A9",
    ]
    assert result.invalid == 1
    assert result.cross_host == 1


@pytest.mark.parametrize("step", [1, 3, 100_000])
def test_bom_and_short_reads_do_not_confuse_format_sniffing(step: int) -> None:
    xml = b"\xef\xbb\xbf" + urlset("<loc>https://ex.com/x</loc>")
    result = parse_sitemap(Unseekable(xml, step=step), base_url=BASE)
    assert (result.format, [u.url for u in result.urls]) == ("xml", ["https://ex.com/x"])
    text = b"\xef\xbb\xbfhttps://ex.com/t\n"
    result = parse_sitemap(Unseekable(gzip.compress(text), step=step), base_url=BASE)
    assert (result.format, [u.url for u in result.urls]) == ("text", ["https://ex.com/t"])


def test_utf16_xml_sitemap() -> None:
    doc = urlset("<loc>https://ex.com/u</loc>").decode().replace("UTF-8", "UTF-16")
    result = parse_sitemap(doc.encode("utf-16"), base_url=BASE)
    assert [u.url for u in result.urls] == ["https://ex.com/u"]


def test_plain_text_gzipped_without_trailing_newline() -> None:
    result = parse_sitemap(gzip.compress(b"https://ex.com/only"), base_url=BASE)
    assert [u.url for u in result.urls] == ["https://ex.com/only"]
    assert result.compressed and result.format == "text"


# --- tolerance of bad values ------------------------------------------------------------------


def test_bad_priorities_and_lastmods_are_tolerated() -> None:
    doc = urlset(
        "<loc>https://ex.com/1</loc><priority>high</priority><lastmod>yesterday</lastmod>",
        "<loc>https://ex.com/2</loc><priority>7</priority><lastmod>2024-13-45</lastmod>",
        "<loc>https://ex.com/3</loc><priority>-0.3</priority><changefreq>sometimes</changefreq>",
        "<loc>https://ex.com/4</loc><priority>nan</priority><lastmod>2024</lastmod>",
        "<loc>https://ex.com/5</loc><priority></priority>",
        "<lastmod>2024-01-01</lastmod>",  # no loc at all
        "<loc>/relative/path</loc>",
        "<loc>javascript:alert(1)</loc>",
        "<loc>https://ex.com/" + "x" * 10_000 + "</loc>",
    )
    result = parse_sitemap(doc, base_url=BASE)
    assert result.errors == []
    got = {u.url: u for u in result.urls}
    assert [u.url for u in result.urls] == [f"https://ex.com/{i}" for i in range(1, 6)]
    assert got["https://ex.com/1"].priority == 0.5 and got["https://ex.com/1"].lastmod is None
    assert got["https://ex.com/2"].priority == 1.0 and got["https://ex.com/2"].lastmod is None
    assert got["https://ex.com/3"].priority == 0.0 and got["https://ex.com/3"].changefreq is None
    assert got["https://ex.com/4"].priority == 0.5
    assert got["https://ex.com/4"].lastmod == epoch(2024, 1, 1)
    assert result.bad_fields == 8  # clamped priorities count too
    assert result.invalid == 4


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2024", epoch(2024, 1, 1)),
        ("2024-05", epoch(2024, 5, 1)),
        ("2024-05-12", epoch(2024, 5, 12)),
        ("2024-05-12T10:30Z", epoch(2024, 5, 12, 10, 30)),
        ("2024-05-12T10:30:15+01:00", epoch(2024, 5, 12, 9, 30, 15)),
        ("2024-05-12T10:30:15.5-0130", epoch(2024, 5, 12, 12, 0, 15) + 0.5),
        ("2024-05-12 10:30:15", epoch(2024, 5, 12, 10, 30, 15)),
        (" 2024-05-12T10:30:15.250Z ", epoch(2024, 5, 12, 10, 30, 15) + 0.25),
        ("2024-02-30", None),
        ("12/05/2024", None),
        ("2024-05-12T25:00Z", None),
        ("", None),
    ],
)
def test_parse_lastmod(text: str, expected: float | None) -> None:
    assert parse_lastmod(text) == expected


# --- limits -----------------------------------------------------------------------------------


def test_more_than_max_urls_truncates_with_reason() -> None:
    doc = urlset(*(f"<loc>https://ex.com/p{i}</loc>" for i in range(120)))
    result = parse_sitemap(doc, base_url=BASE, max_urls=100)
    assert len(result.urls) == 100
    assert result.urls[-1].url == "https://ex.com/p99"
    assert result.truncated_reason is not None
    assert "more than 100 entries" in result.truncated_reason
    assert result.errors == []

    exactly = parse_sitemap(doc, base_url=BASE, max_urls=120)
    assert len(exactly.urls) == 120 and exactly.truncated_reason is None


def test_text_sitemap_max_urls() -> None:
    doc = "".join(f"https://ex.com/{i}\n" for i in range(60)).encode()
    result = parse_sitemap(doc, base_url=BASE, max_urls=50)
    assert len(result.urls) == 50
    assert result.truncated_reason is not None


def test_gzip_bomb_of_zeros_stops_at_limit_with_low_memory() -> None:
    bomb = gzip.compress(bytes(60 * 1024 * 1024), compresslevel=9)
    assert len(bomb) < 200_000
    tracemalloc.start()
    try:
        result = parse_sitemap(io.BytesIO(bomb), base_url=BASE)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert result.compressed
    assert result.truncated_reason is not None
    assert "52428800 bytes uncompressed" in result.truncated_reason
    assert result.bytes_read == 50 * 1024 * 1024
    assert result.urls == []
    assert peak < 4 * 1024 * 1024, peak


def test_gzip_bomb_inside_xml_stops_at_limit_with_low_memory() -> None:
    head = urlset("<loc>https://ex.com/before</loc>")[: -len(b"</urlset>")]
    bomb = gzip.compress(head + b" " * (60 * 1024 * 1024), compresslevel=9)
    tracemalloc.start()
    try:
        result = parse_sitemap(bomb, base_url=BASE, max_bytes=20 * 1024 * 1024)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert result.truncated_reason == (
        f"more than {20 * 1024 * 1024} bytes uncompressed: stopped at the limit"
    )
    assert [u.url for u in result.urls] == ["https://ex.com/before"]
    assert result.errors == []
    assert peak < 4 * 1024 * 1024, peak


def test_giant_xml_token_is_refused_quickly() -> None:
    doc = b'<urlset xmlns="' + NS.encode() + b'" a="' + b"x" * (8 * 1024 * 1024)
    started = time.perf_counter()
    result = parse_sitemap(gzip.compress(doc), base_url=BASE)
    assert time.perf_counter() - started < 2.0
    assert result.errors and "no parse progress" in result.errors[0]


def test_corrupt_gzip_is_an_error_not_an_exception() -> None:
    data = gzip.compress(urlset("<loc>https://ex.com/x</loc>"))
    result = parse_sitemap(data[:-12], base_url=BASE)
    assert result.errors
    assert "gzip" in result.errors[-1]


def test_malformed_xml_keeps_what_was_parsed() -> None:
    doc = urlset("<loc>https://ex.com/ok</loc>")[: -len(b"</urlset>")] + b"<url><loc>oops</url>"
    result = parse_sitemap(doc, base_url=BASE)
    assert [u.url for u in result.urls] == ["https://ex.com/ok"]
    assert result.errors and result.errors[0].startswith("XML error")


def test_not_a_sitemap_and_empty() -> None:
    html = parse_sitemap(b"<html><body>hi</body></html>", base_url=BASE)
    assert html.kind == "unknown"
    assert html.errors == ["not a sitemap: root element <html>"]
    empty = parse_sitemap(b"  \n ", base_url=BASE)
    assert empty.kind == "unknown" and empty.errors == ["empty document"]


# --- hostile XML ------------------------------------------------------------------------------

BILLION_LAUGHS = b"""<?xml version="1.0"?>
<!DOCTYPE urlset [
 <!ENTITY lol "lol">
 <!ENTITY lol1 "&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;">
 <!ENTITY lol2 "&lol1;&lol1;&lol1;&lol1;&lol1;&lol1;&lol1;&lol1;&lol1;&lol1;">
 <!ENTITY lol3 "&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;">
 <!ENTITY lol4 "&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;">
 <!ENTITY lol5 "&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;">
 <!ENTITY lol6 "&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;">
 <!ENTITY lol7 "&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;">
 <!ENTITY lol8 "&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;">
 <!ENTITY lol9 "&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;">
]>
<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">
<url><loc>https://ex.com/&lol9;</loc></url>
</urlset>"""


def test_billion_laughs_is_refused_without_expansion() -> None:
    tracemalloc.start()
    started = time.perf_counter()
    try:
        result = parse_sitemap(BILLION_LAUGHS, base_url=BASE)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert time.perf_counter() - started < 1.0
    assert peak < 1024 * 1024
    assert result.urls == []
    assert len(result.errors) == 1
    assert "unsafe XML refused (EntitiesForbidden)" in result.errors[0]
    assert "name='lol'" in result.errors[0]


@pytest.mark.parametrize(
    "doctype",
    [
        b'<!DOCTYPE urlset [<!ENTITY xxe SYSTEM "file:///etc/passwd">]>',
        b'<!DOCTYPE urlset [<!ENTITY % pe SYSTEM "http://127.0.0.1:9/x.dtd"> %pe;]>',
    ],
)
def test_external_entities_are_refused(doctype: bytes) -> None:
    doc = doctype + b"<urlset><url><loc>https://ex.com/&xxe;</loc></url></urlset>"
    result = parse_sitemap(doc, base_url=BASE)
    assert result.urls == []
    assert result.errors and result.errors[0].startswith("unsafe XML refused")


def test_plain_doctype_without_entities_is_harmless() -> None:
    doc = b"<!DOCTYPE urlset><urlset><url><loc>https://ex.com/x</loc></url></urlset>"
    assert [u.url for u in parse_sitemap(doc, base_url=BASE).urls] == ["https://ex.com/x"]


# --- scope ------------------------------------------------------------------------------------


def test_cross_host_entries_are_dropped_and_counted() -> None:
    doc = urlset(
        "<loc>https://ex.com/same</loc>",
        "<loc>http://ex.com/other-scheme</loc>",
        "<loc>https://www.ex.com/subdomain</loc>",
        "<loc>https://evil.example/x</loc>",
        "<loc>https://ex.com.evil.example/y</loc>",
    )
    result = parse_sitemap(doc, base_url=BASE)
    assert [u.url for u in result.urls] == ["https://ex.com/same", "http://ex.com/other-scheme"]
    assert result.cross_host == 3

    allowed = parse_sitemap(doc, base_url=BASE, allowed_hosts=["www.ex.com"])
    assert "https://www.ex.com/subdomain" in [u.url for u in allowed.urls]
    assert allowed.cross_host == 2


def test_path_rule_only_when_strict() -> None:
    doc = urlset("<loc>https://ex.com/catalog/a</loc>", "<loc>https://ex.com/images/b</loc>")
    base = "https://ex.com/catalog/sitemap.xml"
    assert len(parse_sitemap(doc, base_url=base).urls) == 2
    strict = parse_sitemap(doc, base_url=base, strict_path=True)
    assert [u.url for u in strict.urls] == ["https://ex.com/catalog/a"]
    assert strict.out_of_path == 1


def test_invalid_base_url_raises() -> None:
    with pytest.raises(InvalidURL):
        parse_sitemap(b"", base_url="not a url")


# --- priority ---------------------------------------------------------------------------------


def test_priority_for() -> None:
    now = epoch(2024, 6, 1)
    day = 86_400.0
    assert priority_for(SitemapURL("u"), now) == 30
    assert priority_for(SitemapURL("u", priority=1.0), now) == 60
    assert priority_for(SitemapURL("u", lastmod=now, priority=1.0), now) == 100
    assert priority_for(SitemapURL("u", lastmod=now - 30 * day), now) == 50
    assert priority_for(SitemapURL("u", lastmod=now - 365 * day, priority=0.0), now) == 0
    assert priority_for(SitemapURL("u", lastmod=now + 10 * day), now) == 70  # future = now
    fresh = priority_for(SitemapURL("u", lastmod=now - day), now)
    stale = priority_for(SitemapURL("u", lastmod=now - 90 * day), now)
    assert fresh > stale > priority_for(SitemapURL("u"), now)
