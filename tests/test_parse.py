"""Tests for the parsing side: encoding detection, Page, the Spider API and the worker Parser.

The Spider subclasses below live at module level on purpose: the Parser loads its spider by
spec, and ``tests.test_parse:ShopSpider`` must resolve to the very class defined here (checked by
``test_module_spec_resolves_to_this_module``).
"""

from __future__ import annotations

import codecs
import json
import sys
import textwrap
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest

from idemcrawl.frontier.base import NewURL, RecordWrite, record_id, request_key
from idemcrawl.parse import (
    Link,
    LinkColumns,
    Node,
    Page,
    ParseJob,
    Parser,
    ParseResult,
    Record,
    Request,
    Spider,
    SpiderLoadError,
    detect_encoding,
    load_spider,
)

SHOP = "http://shop.test"
SCOPE = frozenset({SHOP})
HTML = {"content-type": "text/html; charset=utf-8"}

# -- spiders used through their "tests.test_parse:Name" spec -------------------------------------


class ShopSpider(Spider):
    """One record per page plus a mix of good, out-of-scope and invalid links."""

    name = "shop"

    def parse(self, page: Page) -> Iterator[Record | Link | str]:
        title = page.css_first("h1")
        assert title is not None
        yield Record("widget-1", {"title": title.text(), "price": 3})
        yield Record(7, {"n": 7})  # type: ignore[arg-type]  # key is coerced with str()
        yield Link("/b", priority=5)
        yield "/a#frag"
        yield "http://other.test/x"  # out of scope for scope "host"
        yield "javascript:alert(1)"  # not http(s): invalid
        yield Link("http://exa mple.test/", priority=9)  # unparseable: invalid


class RelativeSpider(Spider):
    name = "relative"

    def parse(self, page: Page) -> Iterator[str]:
        yield "rel"


class BoomSpider(Spider):
    """Yields good output, then raises: nothing of this page may survive."""

    name = "boom"

    def parse(self, page: Page) -> Iterator[Record | str]:
        yield Record("k", {"a": 1})
        yield "/b"
        raise RuntimeError("kaboom")


class WrongTypeSpider(Spider):
    name = "wrong"

    def parse(self, page: Page) -> Iterator[Any]:
        yield "/ok"
        yield 42


class BadDataSpider(Spider):
    name = "baddata"

    def parse(self, page: Page) -> Iterator[Record]:
        yield Record("k", ["not", "a", "dict"])  # type: ignore[arg-type]


class CircularDataSpider(Spider):
    name = "circular"

    def parse(self, page: Page) -> Iterator[Record]:
        data: dict[str, Any] = {}
        data["self"] = data
        yield Record("k", data)


class ListSpider(Spider):
    """``parse`` may return any iterable, not only be a generator."""

    name = "list"

    def parse(self, page: Page) -> Iterable[Record | Link | str]:
        return [Record("only", {"x": True})]


class JsonSpider(Spider):
    name = "json"
    parse_non_html = True

    def parse(self, page: Page) -> Iterator[Record]:
        yield Record("doc", json.loads(page.body))


class NotASpider:
    name = "plain"


class MixedLinksSpider(Spider):
    """Plain links of page.links() around links with fields of their own."""

    name = "mixed"

    def parse(self, page: Page):  # type: ignore[no-untyped-def]
        found = page.links()
        yield found[0]
        yield found[1]
        yield Link("/prio", priority=7)
        yield found[2]
        yield Request("/post", method="POST", body=b"x")
        yield found[3]


# -- helpers ----------------------------------------------------------------------------------


def job(
    body: bytes = b"",
    *,
    url: str = f"{SHOP}/dir/page",
    status: int = 200,
    headers: dict[str, str] | None = None,
    depth: int = 0,
) -> ParseJob:
    return ParseJob(url, status, dict(HTML if headers is None else headers), body, depth)


def parser(spec: str | None, scope: str = "host") -> Parser:
    return Parser(spec, SCOPE, scope)


ITEM_PAGE = b"<html><body><h1> Widget </h1><a href='/x'>x</a></body></html>"


# -- detect_encoding --------------------------------------------------------------------------


class TestDetectEncoding:
    def test_default_is_utf8(self) -> None:
        assert detect_encoding(b"<html><p>hi</p></html>", None) == "utf-8"
        assert detect_encoding(b"", "text/html") == "utf-8"

    @pytest.mark.parametrize(
        ("bom", "expected"),
        [
            (codecs.BOM_UTF8, "utf-8-sig"),
            (codecs.BOM_UTF16_LE, "utf-16-le"),
            (codecs.BOM_UTF16_BE, "utf-16-be"),
        ],
    )
    def test_bom_wins_over_header_and_meta(self, bom: bytes, expected: str) -> None:
        body = bom + b'<meta charset="iso-8859-1">'
        assert detect_encoding(body, "text/html; charset=koi8-r") == expected

    def test_header_charset(self) -> None:
        assert detect_encoding(b"x", "text/html; charset=ISO-8859-1") == "iso-8859-1"
        assert detect_encoding(b"x", 'text/html; Charset="windows-1252"; x=y') == "windows-1252"

    def test_header_charset_wins_over_meta(self) -> None:
        body = b'<meta charset="utf-8">'
        assert detect_encoding(body, "text/html; charset=koi8-r") == "koi8-r"

    def test_meta_charset(self) -> None:
        assert detect_encoding(b'<head><meta charset="Shift_JIS">', "text/html") == "shift_jis"
        http_equiv = b'<meta http-equiv="Content-Type" content="text/html; charset=windows-1252">'
        assert detect_encoding(http_equiv, None) == "windows-1252"

    def test_meta_only_looked_for_near_the_start(self) -> None:
        body = b" " * 5000 + b'<meta charset="iso-8859-1">'
        assert detect_encoding(body, None) == "utf-8"

    def test_unknown_header_charset_falls_back_to_meta(self) -> None:
        body = b'<meta charset="iso-8859-1">'
        assert detect_encoding(body, "text/html; charset=x-no-such-codec") == "iso-8859-1"

    def test_unknown_meta_charset_falls_back_to_utf8(self) -> None:
        assert detect_encoding(b'<meta charset="x-no-such-codec">', None) == "utf-8"
        assert detect_encoding(b"x", "text/html; charset=") == "utf-8"

    def test_non_text_codec_is_ignored(self) -> None:
        body = b'<meta charset="base64"><a href="/x">x</a>'
        assert detect_encoding(body, None) == "utf-8"
        assert Page(f"{SHOP}/", 200, {}, body).links() == [f"{SHOP}/x"]


# -- Page -------------------------------------------------------------------------------------

LINKS_HTML = b"""<!doctype html><html><head><title>Links</title></head><body>
<a href="/b">B</a>
<a href="/a#top">A</a>
<a href="http://SHOP.test:80/b">B again, spelled differently</a>
<a href="javascript:void(0)">js</a>
<a href="mailto:x@shop.test">mail</a>
<a href="http://other.test/x">other host</a>
<a href="">empty</a>
<a>no href</a>
<a href="https://shop.test/secure">other scheme, other origin</a>
<a href="sub/x?q=1#f">relative</a>
<map><area href="/c" alt="c"></map>
<a href="/a">A again</a>
</body></html>"""


class TestPage:
    def test_latin1_page_declared_in_meta(self) -> None:
        html = '<html><head><meta charset="iso-8859-1"><title>Café</title></head></html>'
        page = Page(f"{SHOP}/", 200, {"content-type": "text/html"}, html.encode("latin-1"))
        assert page.encoding == "iso-8859-1"
        assert "Café" in page.text
        title = page.css_first("title")
        assert title is not None
        assert title.text() == "Café"

    def test_windows1252_via_http_equiv(self) -> None:
        html = (
            '<meta http-equiv="Content-Type" content="text/html; charset=windows-1252">'
            "<p>5 \x80</p>"
        )
        page = Page(f"{SHOP}/", 200, {}, html.encode("latin-1"))
        p = page.css_first("p")
        assert p is not None
        assert p.text() == "5 €"

    def test_undecodable_bytes_are_replaced_not_fatal(self) -> None:
        page = Page(f"{SHOP}/", 200, HTML, b"<p>ok \xff\xfe</p>")
        assert page.text.startswith("<p>ok ")
        assert "\ufffd" in page.text

    def test_css_and_nodes(self) -> None:
        body = b"""<ul id="l"><li class="i" data-x="1"> one </li><li class="i">two</li></ul>
        <p>after</p>"""
        page = Page(f"{SHOP}/", 200, HTML, body)
        items = page.css("li.i")
        assert [n.text() for n in items] == ["one", "two"]
        assert all(isinstance(n, Node) for n in items)
        assert items[0].text(strip=False) == " one "
        assert items[0].attrs == {"class": "i", "data-x": "1"}
        assert items[0].tag == "li"
        assert "<li" in items[0].html
        ul = page.css_first("ul#l")
        assert isinstance(ul, Node)
        assert [n.text() for n in ul.css("li")] == ["one", "two"]
        first = ul.css_first("li")
        assert first is not None
        assert first.text() == "one"
        assert ul.css_first("p") is None
        assert page.css_first("table") is None
        assert page.css("table") == []

    def test_content_type_and_is_html(self) -> None:
        def page(ct: str | None) -> Page:
            return Page(f"{SHOP}/", 200, {} if ct is None else {"content-type": ct}, b"")

        assert page("Text/HTML; charset=utf-8").content_type == "text/html"
        assert page("text/html").is_html
        assert page("application/xhtml+xml").is_html
        assert page(None).is_html  # no content type: sniffed as HTML
        assert not page("application/json").is_html
        assert not page("image/png").is_html

    def test_links_absolute_normalised_deduplicated_in_order(self) -> None:
        page = Page(f"{SHOP}/dir/page", 200, HTML, LINKS_HTML, scope_hosts=SCOPE, scope="host")
        assert page.links() == [
            f"{SHOP}/b",
            f"{SHOP}/a",
            f"{SHOP}/dir/sub/x?q=1",
            f"{SHOP}/c",
        ]

    def test_links_scope_any_keeps_other_hosts(self) -> None:
        page = Page(f"{SHOP}/dir/page", 200, HTML, LINKS_HTML)  # default scope "any"
        assert page.links() == [
            f"{SHOP}/b",
            f"{SHOP}/a",
            "http://other.test/x",
            "https://shop.test/secure",
            f"{SHOP}/dir/sub/x?q=1",
            f"{SHOP}/c",
        ]

    def test_links_with_scope_host_and_no_seeds_is_empty(self) -> None:
        page = Page(f"{SHOP}/dir/page", 200, HTML, LINKS_HTML, scope="host")
        assert page.links() == []

    def test_links_honour_base_href(self) -> None:
        body = b"""<head><base href="http://shop.test/base/"></head>
        <a href="rel">r</a><a href="/abs">a</a><a href="?q=1">q</a>"""
        page = Page(f"{SHOP}/dir/page", 200, HTML, body)
        assert page.base_url == f"{SHOP}/base/"
        assert page.links() == [f"{SHOP}/base/rel", f"{SHOP}/abs", f"{SHOP}/base/?q=1"]

    def test_relative_base_href_is_resolved_against_the_url(self) -> None:
        body = b'<base href="../other/"><a href="x">x</a>'
        page = Page(f"{SHOP}/dir/sub/page", 200, HTML, body)
        assert page.links() == [f"{SHOP}/dir/other/x"]

    def test_invalid_base_href_is_ignored(self) -> None:
        body = b'<base href="javascript:void(0)"><a href="x">x</a>'
        page = Page(f"{SHOP}/dir/page", 200, HTML, body)
        assert page.base_url == f"{SHOP}/dir/page"
        assert page.links() == [f"{SHOP}/dir/x"]

    @pytest.mark.parametrize("ct", ["application/json", "image/png", "text/plain"])
    def test_links_of_non_html_is_empty(self, ct: str) -> None:
        page = Page(f"{SHOP}/", 200, {"content-type": ct}, b'<a href="/x">x</a>')
        assert page.links() == []
        assert page.base_url == f"{SHOP}/"

    def test_in_scope(self) -> None:
        page = Page(f"{SHOP}/", 200, HTML, b"", scope_hosts=SCOPE, scope="host")
        assert page.in_scope(f"{SHOP}/anything")
        assert not page.in_scope("http://other.test/")
        assert not page.in_scope("http://shop.test:8080/")


# -- Parser.run -------------------------------------------------------------------------------


class TestParser:
    def test_module_spec_resolves_to_this_module(self) -> None:
        assert load_spider("tests.test_parse:ShopSpider") is ShopSpider

    def test_records_and_links(self) -> None:
        p = parser("tests.test_parse:ShopSpider")
        assert p.source == "shop"
        result = p.run(job(ITEM_PAGE, depth=2))
        assert result.error is None
        assert result.records == [
            RecordWrite.make("shop", "widget-1", {"title": "Widget", "price": 3}),
            RecordWrite.make("shop", "7", {"n": 7}),
        ]
        rec = result.records[0]
        assert rec.source == "shop"
        assert rec.key == "widget-1"
        assert rec.record_id == record_id("shop", "widget-1")
        assert json.loads(rec.data_json) == {"title": "Widget", "price": 3}
        assert result.records[1].record_id == record_id("shop", "7")
        assert list(result.links) == [
            NewURL(f"{SHOP}/b", SHOP, priority=5, depth=3),
            NewURL(f"{SHOP}/a", SHOP, priority=0, depth=3),
        ]
        # other.test is out of scope; javascript: and an unparseable href are invalid
        assert result.rejected == {"out_of_scope": 1, "invalid_url": 2}

    def test_scope_any_keeps_other_hosts(self) -> None:
        result = parser("tests.test_parse:ShopSpider", scope="any").run(job(ITEM_PAGE))
        assert [(n.url, n.host_key) for n in result.links] == [
            (f"{SHOP}/b", SHOP),
            (f"{SHOP}/a", SHOP),
            ("http://other.test/x", "http://other.test"),
        ]
        assert result.rejected == {"invalid_url": 2}

    def test_spider_links_resolve_against_base_href(self) -> None:
        body = b'<base href="http://shop.test/base/"><p>x</p>'
        result = parser("tests.test_parse:RelativeSpider").run(job(body))
        assert list(result.links) == [NewURL(f"{SHOP}/base/rel", SHOP, depth=1)]

    def test_spider_exception_fails_the_page(self) -> None:
        result = parser("tests.test_parse:BoomSpider").run(job(ITEM_PAGE))
        assert result.error is not None
        assert "RuntimeError" in result.error
        assert "kaboom" in result.error
        assert result.records == []
        assert list(result.links) == []
        assert result.rejected == {}

    def test_wrong_item_type_is_an_error(self) -> None:
        result = parser("tests.test_parse:WrongTypeSpider").run(job(ITEM_PAGE))
        assert result.error is not None
        assert "TypeError" in result.error
        assert "int" in result.error
        assert list(result.links) == []

    def test_non_dict_record_data_is_an_error(self) -> None:
        result = parser("tests.test_parse:BadDataSpider").run(job(ITEM_PAGE))
        assert result.error is not None
        assert "Record.data must be a dict" in result.error
        assert "list" in result.error
        assert result.records == []

    def test_unserialisable_record_data_is_an_error(self) -> None:
        result = parser("tests.test_parse:CircularDataSpider").run(job(ITEM_PAGE))
        assert result.error is not None
        assert result.error.startswith("parse error: ValueError")
        assert result.records == []

    def test_parse_may_return_a_list(self) -> None:
        result = parser("tests.test_parse:ListSpider").run(job(ITEM_PAGE))
        assert result.error is None
        assert [r.key for r in result.records] == ["only"]

    @pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
    def test_redirect_yields_only_the_location(self, status: int) -> None:
        # BoomSpider would turn any spider call into an error.
        p = parser("tests.test_parse:BoomSpider")
        result = p.run(
            job(
                ITEM_PAGE,
                url=f"{SHOP}/a/c",
                status=status,
                headers={"location": "../b?x=1#frag", "content-type": "text/html"},
                depth=4,
            )
        )
        assert result == ParseResult(links=LinkColumns.of([NewURL(f"{SHOP}/b?x=1", SHOP, depth=5)]))

    def test_redirect_out_of_scope_is_rejected(self) -> None:
        result = parser("tests.test_parse:BoomSpider").run(
            job(status=302, headers={"location": "http://other.test/"})
        )
        assert result == ParseResult(rejected={"out_of_scope": 1})

    def test_redirect_to_invalid_url_is_rejected(self) -> None:
        result = parser("tests.test_parse:BoomSpider").run(
            job(status=301, headers={"location": "javascript:alert(1)"})
        )
        assert result == ParseResult(rejected={"invalid_url": 1})

    @pytest.mark.parametrize("status", [302, 304])
    def test_3xx_without_location_yields_nothing(self, status: int) -> None:
        result = parser("tests.test_parse:BoomSpider").run(job(ITEM_PAGE, status=status))
        assert result == ParseResult()

    @pytest.mark.parametrize("status", [400, 403, 404, 410, 500])
    def test_error_statuses_yield_nothing(self, status: int) -> None:
        result = parser("tests.test_parse:BoomSpider").run(job(ITEM_PAGE, status=status))
        assert result == ParseResult()
        result = parser(None).run(job(ITEM_PAGE, status=status))
        assert result == ParseResult()

    def test_non_html_is_not_parsed_by_default(self) -> None:
        result = parser("tests.test_parse:BoomSpider").run(
            job(b'{"a": 1}', headers={"content-type": "application/json"})
        )
        assert result == ParseResult()

    def test_parse_non_html_opt_in(self) -> None:
        result = parser("tests.test_parse:JsonSpider").run(
            job(b'{"a": [1, 2]}', headers={"content-type": "application/json"})
        )
        assert result.error is None
        assert result.records == [RecordWrite.make("json", "doc", {"a": [1, 2]})]

    def test_default_spider_follows_links_and_stores_nothing(self) -> None:
        p = parser(None)
        assert type(p.spider) is Spider
        assert p.source == "default"
        result = p.run(job(LINKS_HTML, depth=1))
        assert result.error is None
        assert result.records == []
        assert list(result.links) == [
            NewURL(f"{SHOP}/b", SHOP, depth=2),
            NewURL(f"{SHOP}/a", SHOP, depth=2),
            NewURL(f"{SHOP}/dir/sub/x?q=1", SHOP, depth=2),
            NewURL(f"{SHOP}/c", SHOP, depth=2),
        ]
        # Page.links filtered scope and counted what it left out (two other hosts' links)
        assert result.rejected == {"out_of_scope": 2}


# -- load_spider ------------------------------------------------------------------------------


@pytest.fixture
def clean_modules() -> Iterator[None]:
    """load_spider registers user files in sys.modules; do not leak them between tests."""
    before = set(sys.modules)
    yield
    for name in set(sys.modules) - before:
        if name.startswith("idemcrawl_user_spider_"):
            del sys.modules[name]


def write(path: Path, source: str) -> Path:
    path.write_text(textwrap.dedent(source), encoding="utf-8")
    return path


GOOD_SPIDER = """\
from idemcrawl.parse import Record, Spider

class Mine(Spider):
    name = "mine"

    def parse(self, page):
        yield Record(page.url, {"ok": True})
"""


@pytest.mark.usefixtures("clean_modules")
class TestLoadSpider:
    def test_none_gives_default(self) -> None:
        assert load_spider(None) is Spider
        assert load_spider("") is Spider

    def test_file_spec_works(self, tmp_path: Path) -> None:
        path = write(tmp_path / "mine.py", GOOD_SPIDER)
        cls = load_spider(f"{path}:Mine")
        assert issubclass(cls, Spider)
        assert cls.name == "mine"
        assert load_spider(f"{path}:Mine") is cls  # loaded once per process

    def test_file_spider_runs_in_parser(self, tmp_path: Path) -> None:
        path = write(tmp_path / "mine.py", GOOD_SPIDER)
        result = Parser(f"{path}:Mine", SCOPE, "host").run(job(ITEM_PAGE))
        assert result.error is None
        assert result.records == [RecordWrite.make("mine", f"{SHOP}/dir/page", {"ok": True})]

    def test_relative_file_spec(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        write(tmp_path / "mine.py", GOOD_SPIDER)
        monkeypatch.chdir(tmp_path)
        assert load_spider("mine.py:Mine").name == "mine"

    def test_missing_file(self, tmp_path: Path) -> None:
        with pytest.raises(SpiderLoadError, match=r"spider file not found: .*nope\.py"):
            load_spider(f"{tmp_path / 'nope.py'}:Mine")

    def test_file_without_the_class(self, tmp_path: Path) -> None:
        path = write(tmp_path / "mine.py", GOOD_SPIDER)
        with pytest.raises(SpiderLoadError, match=r"mine\.py has no attribute 'Missing'"):
            load_spider(f"{path}:Missing")

    def test_class_not_a_spider_subclass(self, tmp_path: Path) -> None:
        path = write(tmp_path / "plain.py", "class Plain:\n    name = 'plain'\n")
        with pytest.raises(SpiderLoadError, match=r"'Plain' .* not an idemcrawl\.Spider subclass"):
            load_spider(f"{path}:Plain")

    def test_attribute_that_is_not_a_class(self, tmp_path: Path) -> None:
        path = write(tmp_path / "obj.py", "from idemcrawl.parse import Spider\nInst = Spider()\n")
        with pytest.raises(SpiderLoadError, match=r"not an idemcrawl\.Spider subclass"):
            load_spider(f"{path}:Inst")

    def test_module_class_not_a_spider(self) -> None:
        with pytest.raises(SpiderLoadError, match=r"'NotASpider' in tests\.test_parse is not"):
            load_spider("tests.test_parse:NotASpider")

    @pytest.mark.parametrize("spec", ["nocolon", "spider.py", "spider.py:", ":Mine", ":"])
    def test_bad_spec_format(self, spec: str) -> None:
        with pytest.raises(SpiderLoadError, match=r"must look like FILE\.py:Class"):
            load_spider(spec)

    def test_file_raising_at_import(self, tmp_path: Path) -> None:
        path = write(tmp_path / "broken.py", "raise RuntimeError('boom at import')\n")
        with pytest.raises(SpiderLoadError, match=r"cannot import spider .*broken\.py") as info:
            load_spider(f"{path}:Mine")
        assert "RuntimeError: boom at import" in str(info.value)
        assert isinstance(info.value.__cause__, RuntimeError)

    def test_file_with_syntax_error(self, tmp_path: Path) -> None:
        path = write(tmp_path / "syntax.py", "class Mine(:\n")
        with pytest.raises(SpiderLoadError, match="SyntaxError"):
            load_spider(f"{path}:Mine")

    def test_missing_module(self) -> None:
        with pytest.raises(SpiderLoadError, match="ModuleNotFoundError"):
            load_spider("idemcrawl_no_such_module_xyz:Mine")

    def test_parser_propagates_load_errors(self, tmp_path: Path) -> None:
        with pytest.raises(SpiderLoadError):
            Parser(f"{tmp_path / 'nope.py'}:Mine", SCOPE, "host")

    def test_failed_import_is_not_cached(self, tmp_path: Path) -> None:
        path = write(tmp_path / "late.py", GOOD_SPIDER + "\nraise RuntimeError('late failure')\n")
        for _ in range(2):
            with pytest.raises(SpiderLoadError, match="late failure"):
                load_spider(f"{path}:Mine")

    def test_distinct_files_get_distinct_modules(self, tmp_path: Path) -> None:
        a = write(tmp_path / "my-spider.py", GOOD_SPIDER.replace('"mine"', '"dash"'))
        b = write(tmp_path / "my_spider.py", GOOD_SPIDER.replace('"mine"', '"underscore"'))
        assert load_spider(f"{a}:Mine").name == "dash"
        assert load_spider(f"{b}:Mine").name == "underscore"


class TestTrapChecks:
    def test_trap_limits_reject_links_by_reason(self) -> None:
        from idemcrawl.traps import TrapLimits

        limits = TrapLimits(
            max_url_length=60, max_query_params=2, max_repeated_segment=2, max_depth=3
        )
        p = Parser(None, frozenset({SHOP}), "host", limits)
        body = (
            b'<a href="/a/a/a">loop</a><a href="/x?a=1&b=2&c=3">facets</a>'
            b'<a href="/' + b"l" * 80 + b'">long</a><a href="/ok">ok</a>'
        )
        result = p.run(job(body, depth=1))
        assert [n.url for n in result.links] == [f"{SHOP}/ok"]
        assert result.rejected == {"repeated_segment": 1, "query_params": 1, "url_length": 1}
        deep = p.run(job(b'<a href="/ok">ok</a>', depth=3))
        assert list(deep.links) == [] and deep.rejected == {"depth": 1}

    def test_cached_verdicts_give_the_same_links_and_rejections(self) -> None:
        """The second page with the same links takes the parser's cached path (the verdicts of
        the first): the same links accepted, the same ones rejected, depth still checked."""
        from idemcrawl.traps import TrapLimits

        limits = TrapLimits(max_url_length=60, max_repeated_segment=2, max_depth=3)
        p = Parser(None, frozenset({SHOP}), "host", limits)
        body = (
            b'<a href="/a/a/a">loop</a><a href="/ok">ok</a><a href="/' + b"l" * 80 + b'">long</a>'
            b'<a href="/ok2">ok</a><a href="/a/a/a">loop again</a>'
        )
        first = p.run(job(body, depth=1))
        second = p.run(job(body, url=f"{SHOP}/other", depth=1))
        for result in (first, second):
            assert [(n.url, n.host_key, n.depth) for n in result.links] == [
                (f"{SHOP}/ok", SHOP, 2),
                (f"{SHOP}/ok2", SHOP, 2),
            ]
            assert result.rejected == {"repeated_segment": 1, "url_length": 1}
        deep = p.run(job(body, depth=3))
        assert list(deep.links) == []
        assert deep.rejected == {"repeated_segment": 1, "url_length": 1, "depth": 2}


# -- the parser pool and the wire format ------------------------------------------------------

POOL_SPIDER = """
import os, time
import idemcrawl


class Moody(idemcrawl.Spider):
    name = "moody"

    def parse(self, page):
        if page.url.endswith("/slow"):
            time.sleep(30)
        if page.url.endswith("/crash"):
            os._exit(3)  # a crash that no try/except in the worker can catch
        yield idemcrawl.Record(page.url, {"pid": os.getpid()})
        yield from page.links()
"""


def pool_job(path: str) -> ParseJob:
    return job(b"<a href='/next'>n</a>", url=f"{SHOP}{path}")


class TestParserPool:
    def run_pool(self, tmp_path: Path, workers: int, paths: list[str]) -> list[ParseResult]:
        import asyncio

        from idemcrawl.parse_pool import ParserPool

        spider = write(tmp_path / "moody.py", POOL_SPIDER)
        pool = ParserPool(workers, (f"{spider}:Moody", SCOPE, "host", None, None))

        async def main() -> list[ParseResult]:
            pool.start()
            try:
                return list(await asyncio.gather(*(pool.parse(pool_job(p), 1.0) for p in paths)))
            finally:
                self.restarts, self.pids = pool.restarts, pool.pids
                pool.close()

        results = asyncio.run(main())
        self.closed_ok = not any(_alive(pid) for pid in self.pids)
        return results

    def test_results_match_their_jobs(self, tmp_path: Path) -> None:
        paths = [f"/p{i}" for i in range(8)]
        results = self.run_pool(tmp_path, 2, paths)
        assert [r.records[0].key for r in results] == [f"{SHOP}{p}" for p in paths]
        assert all(list(r.links) == [NewURL(f"{SHOP}/next", SHOP, depth=1)] for r in results)
        assert len({r.records[0].content_hash for r in results}) == 2  # both workers served
        assert self.restarts == 0 and self.closed_ok

    @pytest.mark.slow
    def test_timeout_fails_only_the_slow_page(self, tmp_path: Path) -> None:
        # One worker: the pages queued behind the slow one never started, so they are moved to
        # the replacement worker instead of failing with it.
        results = self.run_pool(tmp_path, 1, ["/a", "/slow", "/b", "/c"])
        assert [r.error for r in results] == [None, "parse timeout after 1.0 s", None, None]
        assert results[2].records[0].key == f"{SHOP}/b"
        assert self.restarts == 1 and self.closed_ok

    def test_dead_worker_fails_only_its_page(self, tmp_path: Path) -> None:
        results = self.run_pool(tmp_path, 1, ["/crash", "/b", "/crash", "/c"])
        assert [r.error for r in results] == [
            "parser process died",
            None,
            "parser process died",
            None,
        ]
        assert [r.records[0].key for r in results if not r.error] == [f"{SHOP}/b", f"{SHOP}/c"]
        assert self.restarts == 2 and self.closed_ok

    @pytest.mark.slow
    def test_slow_start_is_not_a_parse_timeout(self, tmp_path: Path) -> None:
        import asyncio

        from idemcrawl.parse_pool import ParserPool

        spider = write(tmp_path / "sleepy.py", "import time\ntime.sleep(1.5)\n" + POOL_SPIDER)
        pool = ParserPool(1, (f"{spider}:Moody", SCOPE, "host", None, None))

        async def main() -> ParseResult:
            try:
                return await pool.parse(pool_job("/a"), 1.0)  # the start alone takes longer
            finally:
                pool.close()

        result = asyncio.run(main())
        assert result.error is None and result.records[0].key == f"{SHOP}/a"

    def test_a_backlog_bigger_than_the_pipe_arrives_whole_and_in_order(
        self, tmp_path: Path
    ) -> None:
        """Jobs the job pipe cannot take at once wait in the pool's queue, partial writes
        included (here ~6 MB for one worker, several times a widened pipe)."""
        import asyncio

        from idemcrawl.parse_pool import PIPE_BYTES, ParserPool

        spider = write(tmp_path / "moody.py", POOL_SPIDER)
        pool = ParserPool(1, (f"{spider}:Moody", SCOPE, "host", None, None))
        filler = b"<p>" + b"x" * 199_993 + b"</p>"  # 200,000 bytes, not a multiple of 4 KiB

        def big(i: int) -> ParseJob:
            return job(filler + f"<a href='/n{i}'>n</a>".encode(), url=f"{SHOP}/p{i}")

        async def main() -> list[ParseResult]:
            try:
                return list(await asyncio.gather(*(pool.parse(big(i), 30.0) for i in range(30))))
            finally:
                pool.close()

        results = asyncio.run(main())
        assert 30 * len(filler) > 4 * PIPE_BYTES
        assert [r.error for r in results] == [None] * 30
        assert [r.records[0].key for r in results] == [f"{SHOP}/p{i}" for i in range(30)]
        assert [r.links[0].url for r in results] == [f"{SHOP}/n{i}" for i in range(30)]

    def test_results_split_and_packed_across_reads_all_arrive_in_order(self) -> None:
        """Frames as the worker writes them (multiprocessing's, the 8-byte form for the big
        one), several to a read and one cut across reads: each result reaches its job."""
        import asyncio
        import os
        import pickle

        from idemcrawl.parse_pool import ParserPool, _frame, _PendingJob, _Worker

        sent = [ParseResult(error=f"page {i}", canonical="x" * (i * 5000)) for i in range(6)]
        payloads = [pickle.dumps(r) for r in sent]
        big = b"\xff\xff\xff\xff" + len(payloads[5]).to_bytes(8, "big") + payloads[5]
        wire = b"".join(_frame(p) for p in payloads[:5]) + big

        async def main() -> list[ParseResult]:
            pool = ParserPool(1, ())
            pool._loop = asyncio.get_running_loop()
            rfd, wfd = os.pipe()
            w = _Worker(None, rfd, wfd, ready=True)  # type: ignore[arg-type]
            items = [_PendingJob(b"", pool._loop.create_future(), 60.0) for _ in sent]
            w.pending.extend(items)
            try:
                for chunk in (wire[:10], wire[10:30000], wire[30000:]):  # cut mid-frame
                    os.write(wfd, chunk)
                    pool._on_readable(w)
            finally:
                if w.timer is not None:
                    w.timer.cancel()
                os.close(rfd)
                os.close(wfd)
            assert not w.inbuf and not w.pending
            return [i.future.result() for i in items]

        got = asyncio.run(main())
        assert [(r.error, r.canonical) for r in got] == [(r.error, r.canonical) for r in sent]

    def test_needs_a_worker(self) -> None:
        from idemcrawl.parse_pool import ParserPool

        with pytest.raises(ValueError, match="at least one worker"):
            ParserPool(0, ())


def _alive(pid: int) -> bool:
    import os

    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0): look at its state.
    with open(f"/proc/{pid}/stat") as fh:
        return fh.read().rsplit(")", 1)[1].split()[0] != "Z"


def test_wire_format_round_trips() -> None:
    import pickle

    result = ParseResult(
        records=[RecordWrite.make("s", "k", {"a": 1})],
        links=LinkColumns.of(
            [NewURL(f"{SHOP}/x", SHOP, priority=3, depth=2, kind="sitemap", hops=1)]
        ),
        rejected={"depth": 2},
        error=None,
        simhash=2**63 + 5,
    )
    assert pickle.loads(pickle.dumps(result, pickle.HIGHEST_PROTOCOL)) == result
    j = ParseJob(f"{SHOP}/p", 200, dict(HTML), b"<p>x</p>", 4, "sitemap")
    assert pickle.loads(pickle.dumps(j, pickle.HIGHEST_PROTOCOL)) == j


def test_parser_fingerprints_html_pages_only() -> None:
    from idemcrawl.dedup import simhash64, visible_text

    body = b"<html><body><p>Widget one, widget two</p><script>x()</script></body></html>"
    html = parser(None).run(job(body))
    assert html.simhash == simhash64(visible_text(body.decode())) != 0
    json_page = job(b"{}", headers={"content-type": "application/json"})
    assert parser(None).run(json_page).simhash is None
    assert Parser(None, SCOPE, "host", simhash=False).run(job(body)).simhash is None


def test_canonical_is_a_normalised_hint_and_survives_the_process_boundary() -> None:
    import pickle

    from idemcrawl.parse import ParseJob, Parser

    body = (
        b'<html><head><link rel="canonical" href="/p/1?ref=x#top"></head>'
        b'<body><a href="/p/2">x</a></body></html>'
    )
    parser = Parser(None, frozenset({"http://a.example"}), "host")
    res = parser.run(
        ParseJob("http://a.example/p/1?utm=1", 200, {"content-type": "text/html"}, body, 0)
    )
    assert res.canonical == "http://a.example/p/1?ref=x"
    assert [u.url for u in res.links] == ["http://a.example/p/2"]  # the URL itself is kept
    assert pickle.loads(pickle.dumps(res)).canonical == res.canonical


def test_plain_links_keep_their_order_among_links_with_other_fields() -> None:
    """Plain links are appended straight to the columns while they share one set of fields;
    once another link differs, each link keeps its own fields, in the order yielded."""
    body = b"".join(b"<a href='/p/%d'>p</a>" % i for i in range(4))
    res = parser("tests.test_parse:MixedLinksSpider").run(job(body))
    got = [(u.url, u.priority, u.request is not None) for u in res.links]
    assert got == [
        (f"{SHOP}/p/0", 0, False),
        (f"{SHOP}/p/1", 0, False),
        (f"{SHOP}/prio", 7, False),
        (f"{SHOP}/p/2", 0, False),
        (request_key(f"{SHOP}/post", "POST", b"x"), 0, True),
        (f"{SHOP}/p/3", 0, False),
    ]
    assert res.links == LinkColumns.of(list(res.links))

@pytest.mark.parametrize(
    ("head", "expected"),
    [
        ('<link rel="canonical" href="HTTP://Other.Example:80/a/../b">', "http://other.example/b"),
        ('<link rel="canonical" href="https://other.example/x#y">', "https://other.example/x"),
        ('<base href="/dir/"><link rel="canonical" href="c">', "http://a.example/dir/c"),
        ('<link rel="canonical" href="mailto:x@a.example">', None),
        ('<link rel="canonical" href="">', "http://a.example/p/1?utm=1"),
        ('<link rel="canonical" href=" http://a.example/q ">', "http://a.example/q"),
    ],
)
def test_canonical_is_normalise_of_its_href_against_the_base(head: str, expected: str) -> None:
    """The hint is resolved by the page's resolver: normalise(href, base_url), same errors."""
    from idemcrawl.parse import ParseJob, Parser

    body = f"<html><head>{head}</head><body>x</body></html>".encode()
    parser = Parser(None, frozenset({"http://a.example"}), "host")
    res = parser.run(
        ParseJob("http://a.example/p/1?utm=1", 200, {"content-type": "text/html"}, body, 0)
    )
    assert res.canonical == expected


MODULES_SPIDER = """
import sys
from idemcrawl.parse import Record, Spider

class Modules(Spider):
    name = "modules"

    def parse(self, page):
        heavy = ("aiohttp", "asyncio", "idemcrawl.engine", "idemcrawl.cli",
                 "idemcrawl.frontier.sqlite", "idemcrawl.fetch", "idemcrawl.parse_pool", "pytest",
                 "_pytest")
        loaded = sorted(m for m in sys.modules if m.split(".")[0] in heavy or m.startswith(heavy))
        yield Record(key=page.url, data={"loaded": loaded})
"""


def test_a_parser_process_imports_only_what_parsing_needs(tmp_path: Path) -> None:
    """Neither the engine, aiohttp, asyncio, the pool nor the parent's main script (pytest here,
    the ``idemcrawl`` console script in a crawl) is imported by a parser process: each costs a
    few MB, not 50."""
    import asyncio

    from idemcrawl.parse_pool import ParserPool

    spider = write(tmp_path / "modules.py", MODULES_SPIDER)
    pool = ParserPool(1, (f"{spider}:Modules", SCOPE, "host", None, None))

    async def main() -> ParseResult:
        pool.start()
        try:
            return await pool.parse(pool_job("/p0"), 5.0)
        finally:
            pool.close()

    result = asyncio.run(main())
    assert result.error is None, result.error
    assert json.loads(result.records[0].data_json)["loaded"] == []


def test_page_requisites_are_what_it_renders_with() -> None:
    body = (
        b'<html><head><base href="https://cdn.example/base/">'
        b'<link rel="stylesheet" href="a.css"><link rel="alternate" href="/feed">'
        b'<link rel="icon shortcut" href="/favicon.ico"><script src="app.js"></script>'
        b"<script>inline()</script></head><body>"
        b'<img src="x.png" srcset="x.png 1x, x2.png 2x,  x3.png 3x">'
        b'<picture><source srcset="y.webp"></picture><video poster="p.jpg" src="v.mp4"></video>'
        b'<img src="data:image/png;base64,AAAA"><a href="/page">a link</a></body></html>'
    )
    page = Page("https://shop.example/p", 200, {"content-type": "text/html"}, body)
    got = page.requisites()
    base = "https://cdn.example/base/"
    assert got == [
        f"{base}a.css",
        "https://cdn.example/favicon.ico",
        f"{base}app.js",
        f"{base}x.png",
        f"{base}x2.png",
        f"{base}x3.png",
        f"{base}y.webp",
        f"{base}v.mp4",
        f"{base}p.jpg",
    ]
    many = b"".join(b'<img src="/i%d.png">' % i for i in range(500))
    assert len(Page("https://a.example/", 200, {}, many).requisites()) == 200


def test_requisites_are_discovered_only_when_asked() -> None:
    body = b'<html><body><img src="https://img.example/i.png"><a href="/n">n</a></body></html>'
    job = ParseJob("https://shop.example/", 200, {"content-type": "text/html"}, body, 0, "page")
    plain = Parser(None, frozenset({"https://shop.example"}), "host").run(job)
    assert [u.url for u in plain.links] == ["https://shop.example/n"]
    asked = Parser(None, frozenset({"https://shop.example"}), "host", requisites=True).run(job)
    kinds = {u.url: (u.kind, u.priority) for u in asked.links}
    # On another host (out of the crawl's scope), a requisite still comes: it is part of the page.
    assert kinds["https://img.example/i.png"] == ("requisite", 2)
    assert kinds["https://shop.example/n"] == ("page", 0)


# -- links as columns across the process boundary ------------------------------------------------


def _mixed_links() -> list[NewURL]:
    """Links whose fields differ after two that share them: a priority, kinds, a request with
    a spec, a rejected one with its reason, redirect hops."""
    from idemcrawl.frontier.base import REJECTED, REQUISITE, SITEMAP, RequestSpec, request_key

    post = RequestSpec("POST", "parse_item", '{"id": 7}', '[["x-a", "1"]]', b"q=1")
    return [
        NewURL(f"{SHOP}/a", SHOP, 0, 3),
        NewURL(f"{SHOP}/b", SHOP, 0, 3),
        NewURL(f"{SHOP}/c", SHOP, 5, 3),
        NewURL(f"{SHOP}/map.xml", SHOP, 5, 3, kind=SITEMAP),
        NewURL("http://cdn.test/s.css", "http://cdn.test", 2, 2, kind=REQUISITE),
        NewURL(request_key(f"{SHOP}/f", "POST", b"q=1"), SHOP, 1, 3, request=post),
        NewURL(f"{SHOP}/d", SHOP, 0, 3, REJECTED, "template_paused", hops=2),
        NewURL(f"{SHOP}/a", SHOP, 0, 3),  # a URL twice stays twice
    ]


@pytest.mark.parametrize(
    "links",
    [
        [],
        [NewURL(f"{SHOP}/p{i}", SHOP, 0, 1) for i in range(40)],
        _mixed_links(),
        _mixed_links()[2:],  # the first link already differs from the second
    ],
    ids=["none", "common", "mixed", "mixed-from-first"],
)
def test_link_columns_round_trip_through_pickle(links: list[NewURL]) -> None:
    import dataclasses
    import pickle

    cols = LinkColumns.of(links)
    assert list(cols) == links and len(cols) == len(links)
    assert [cols[i] for i in range(len(links))] == links
    assert cols.urls == [u.url for u in links] and cols.hosts == [u.host_key for u in links]
    assert cols.pick(range(len(links) - 1, -1, -2)) == links[::-1][::2]
    sent = ParseResult(links=cols, rejected={"depth": 1}, simhash=5)
    again = pickle.loads(pickle.dumps(sent, pickle.HIGHEST_PROTOCOL))
    assert again == sent and list(again.links) == links
    # A redirect's links, one hop further (the pipeline's rule, as dataclasses.replace did).
    assert list(again.links.with_hops(4)) == [dataclasses.replace(u, hops=4) for u in links]
    assert list(again.links) == links  # with_hops made new columns


def test_link_columns_know_every_field_of_a_new_url() -> None:
    """LinkColumns lays a link out by position: a field added to NewURL must be added there."""
    import dataclasses

    from idemcrawl.parse import LINK_REST_FIELDS

    names = tuple(f.name for f in dataclasses.fields(NewURL))
    assert names == ("url", "host_key", *LINK_REST_FIELDS)


def test_link_columns_send_shared_fields_once() -> None:
    same = LinkColumns.of(NewURL(f"{SHOP}/p{i}", SHOP, 0, 1) for i in range(40))
    assert same._wire()[2:] == ((0, 1, "queued", None, "page", 0, None), None)
    mixed = LinkColumns.of(_mixed_links())
    common, per_link = mixed._wire()[2:]
    assert common is None and per_link is not None and len(per_link) == len(_mixed_links())
    with pytest.raises(IndexError):
        LinkColumns()[0]


def test_parser_links_survive_the_process_boundary_unchanged() -> None:
    """Each kind of discovered link, as the parser adds it, comes back out of the pickle with
    the fields it went in with."""
    import pickle

    from idemcrawl.frontier.base import DOWNLOAD, RequestSpec, request_key
    from idemcrawl.parse import Download, Request

    class Mixed(Spider):
        name = "mixed"

        def parse(self, page: Page) -> Iterator[Any]:
            yield "/plain"
            yield from page.links()
            yield Link("/hi", priority=4)
            yield Download("/f.pdf", priority=1)
            yield Request("/api", method="POST", body=b"k=v", callback="parse", data={"n": 1})

    p = Parser(None, SCOPE, "host")
    p.spider = Mixed()
    result = p.run(job(ITEM_PAGE, depth=2))
    spec = RequestSpec("POST", None, '{"n":1}', None, b"k=v")
    assert result.error is None
    assert list(result.links) == [
        NewURL(f"{SHOP}/plain", SHOP, 0, 3),
        NewURL(f"{SHOP}/x", SHOP, 0, 3),
        NewURL(f"{SHOP}/hi", SHOP, 4, 3),
        NewURL(f"{SHOP}/f.pdf", SHOP, 1, 3, kind=DOWNLOAD),
        NewURL(request_key(f"{SHOP}/api", "POST", b"k=v"), SHOP, 0, 3, request=spec),
    ]
    again = pickle.loads(pickle.dumps(result, pickle.HIGHEST_PROTOCOL))
    assert list(again.links) == list(result.links)
    redirect = p.run(job(b"", status=301, headers={"location": "/moved"}, depth=2))
    moved = pickle.loads(pickle.dumps(redirect, pickle.HIGHEST_PROTOCOL)).links
    assert list(moved.with_hops(1)) == [NewURL(f"{SHOP}/moved", SHOP, 0, 3, hops=1)]
