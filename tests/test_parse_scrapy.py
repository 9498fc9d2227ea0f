"""parse.py's answers to Scrapy habits (issue: porting Scrapy spiders): each one is either
supported as a Scrapy user expects or refused with a message naming the idemcrawl way."""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import types
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from idemcrawl import url as urls
from idemcrawl.frontier.base import RequestSpec
from idemcrawl.parse import (
    Link,
    Matches,
    Page,
    ParseJob,
    Parser,
    Record,
    Request,
    Spider,
    SpiderLoadError,
    from_form,
    load_spider,
    split_context,
    start_links,
)

from .helpers import run_python

SCOPE = frozenset({"http://a.test"})


def _module_spiders(monkeypatch: pytest.MonkeyPatch, **classes: type) -> str:
    """Register spider classes under an importable module name; returns it."""
    mod = types.ModuleType("scrapy_habit_spiders")
    for name, cls in classes.items():
        setattr(mod, name, cls)
    monkeypatch.setitem(sys.modules, mod.__name__, mod)
    return mod.__name__


def _run(
    monkeypatch: pytest.MonkeyPatch,
    cls: type,
    body: str,
    *,
    url: str = "http://a.test/",
    request: RequestSpec | None = None,
    status: int = 200,
    headers: dict[str, str] | None = None,
    scope: str = "host",
) -> Any:
    module = _module_spiders(monkeypatch, S=cls)
    parser = Parser(f"{module}:S", SCOPE, scope, simhash=False)
    hdrs = {"content-type": "text/html", **(headers or {})}
    return parser.run(ParseJob(url, status, hdrs, body.encode(), 0, "page", request))


# -- 1. cb_kwargs= and meta= -------------------------------------------------------------------


class Kw(Spider):
    name = "kw"

    def parse(self, page: Page) -> Iterator[Any]:
        yield page.follow("/item", self.parse_item, cb_kwargs={"category": "books", "rank": 2})

    def parse_item(self, page: Page, category: str, rank: int) -> Iterator[Record]:
        yield Record(page.url, {"category": category, "rank": rank, "data": page.data})


def test_cb_kwargs_are_stored_with_the_request_and_given_to_the_callback(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    res = _run(monkeypatch, Kw, "<html></html>")
    assert res.error is None
    (link,) = list(res.links)
    spec = link.request
    assert spec is not None and spec.callback == "parse_item"
    # Stored as a JSON array next to data (an object): never confused with data alone.
    assert json.loads(spec.data) == [{}, {"category": "books", "rank": 2}]
    assert split_context(spec.data) == ({}, {"category": "books", "rank": 2})
    item = _run(monkeypatch, Kw, "<html></html>", url="http://a.test/item", request=spec)
    assert item.error is None
    assert json.loads(item.records[0].data_json) == {"category": "books", "rank": 2, "data": {}}


def test_cb_kwargs_with_data_and_meta() -> None:
    req = Request("http://a.test/", "cb", {"a": 1}, cb_kwargs={"b": 2})
    spec = req.spec()
    assert spec is not None and split_context(spec.data) == ({"a": 1}, {"b": 2})
    page = Page("http://a.test/", 200, {}, b"", request=spec)
    assert page.data == {"a": 1} and page.cb_kwargs == {"b": 2} and page.meta is page.data
    # meta= is the context (page.data), as a Scrapy spider carrying context in meta expects.
    meta = Request("http://a.test/", "cb", meta={"a": 1}).spec()
    assert meta is not None and json.loads(meta.data or "") == {"a": 1}
    assert Page("http://a.test/", 200, {}, b"", request=meta).meta == {"a": 1}
    # Without cb_kwargs nothing changes: data stays an object, a plain GET has no spec.
    plain = Request("http://a.test/", "cb", {"a": 1}).spec()
    assert plain is not None and plain.data == '{"a":1}'
    assert Request("http://a.test/", cb_kwargs={}).spec() is None


def test_bad_cb_kwargs_and_meta_are_refused_where_made() -> None:
    with pytest.raises(TypeError, match="must be JSON-serialisable"):
        Request("http://a.test/", "cb", cb_kwargs={"when": {1, 2}})
    with pytest.raises(TypeError, match="cb_kwargs must be a dict"):
        Request("http://a.test/", "cb", cb_kwargs=[("a", 1)])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="argument names"):
        Request("http://a.test/", "cb", cb_kwargs={"not a name": 1})
    with pytest.raises(ValueError, match="data= or meta="):
        Request("http://a.test/", "cb", {"a": 1}, meta={"b": 2})
    with pytest.raises(ValueError, match=r"'dont_redirect' is a Scrapy setting .*--max-redirects"):
        Request("http://a.test/", meta={"dont_redirect": True})
    with pytest.raises(ValueError, match=r"'playwright'.*render=True"):
        Request("http://a.test/", meta={"playwright": True})
    with pytest.raises(ValueError, match="at most"):
        Request("http://a.test/", "cb", cb_kwargs={"big": "x" * 70_000})


class WrongKw(Spider):
    name = "wrong"

    def parse(self, page: Page) -> Iterator[Any]:
        yield page.follow("/item", self.parse_item, cb_kwargs={"colour": "red"})

    def parse_item(self, page: Page, category: str) -> Iterator[Record]:
        yield Record(page.url, {"category": category})


def test_cb_kwargs_the_callback_cannot_take_fail_the_page_that_yields_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    res = _run(monkeypatch, WrongKw, "<html></html>")
    assert res.error is not None
    assert "callback parse_item cannot take cb_kwargs colour" in res.error
    assert not res.links


def test_start_requests_with_cb_kwargs_are_checked_too() -> None:
    class Start(Kw):
        def start_requests(self) -> Iterator[Request]:
            yield Request("http://a.test/1", "parse_item", cb_kwargs={"category": "x", "rank": 1})

    (link,) = start_links(Start())
    assert link.request is not None
    assert split_context(link.request.data)[1] == {"category": "x", "rank": 1}

    class BadStart(Kw):
        def start_requests(self) -> Iterator[Request]:
            yield Request("http://a.test/1", "parse_item", cb_kwargs={"nope": 1})

    with pytest.raises(TypeError, match="cannot take cb_kwargs nope"):
        start_links(BadStart())


def test_from_form_takes_cb_kwargs_and_meta() -> None:
    page = Page(
        "http://a.test/s", 200, {}, b"<form action=/q><input name=q value=x></form>"
    )
    req = from_form(page, callback="cb", cb_kwargs={"k": 1}, meta={"m": 2})
    assert req.cb_kwargs == {"k": 1} and req.data == {"m": 2}


# -- 2. allowed_domains ------------------------------------------------------------------------


def test_in_domains_is_scrapys_rule() -> None:
    domains = frozenset({"example.org", "www.b.test"})
    assert urls.in_domains("https://example.org/", domains)
    assert urls.in_domains("http://shop.example.org:8080/x", domains)
    assert urls.in_domains("http://a.www.b.test/", domains)
    assert not urls.in_domains("http://b.test/", domains)
    assert not urls.in_domains("http://www2.b.test/", domains)
    assert not urls.in_domains("http://notexample.org/", domains)
    assert not urls.in_domains("http://example.org.evil.test/", domains)


class Offsite(Spider):
    name = "offsite"
    allowed_domains = ["A.test", "b.test"]

    def parse(self, page: Page) -> Iterator[Any]:
        yield from page.links()
        yield Request("http://c.test/api", "parse", method="POST", body="x")
        yield Link("http://shop.b.test/l")
        yield "http://evil.test/s"


LINKS = """<a href="/in">in</a> <a href="https://sub.a.test:8443/x">sub</a>
<a href="http://b.test/y">b</a> <a href="http://c.test/z">c</a> <a href="http://aa.test/">aa</a>"""


def test_allowed_domains_filter_links_requests_and_redirects(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    res = _run(monkeypatch, Offsite, LINKS, scope="any")
    assert res.error is None
    assert [u.url for u in res.links] == [
        "http://a.test/in",
        "https://sub.a.test:8443/x",
        "http://b.test/y",
        "http://shop.b.test/l",
    ]
    # c.test/z and aa.test that links() left out, then the request and the str
    assert res.rejected == {"out_of_scope": 4}
    # The crawl's own scope still applies on top: host scope keeps only a.test here.
    host = _run(monkeypatch, Offsite, LINKS, scope="host")
    assert [u.url for u in host.links] == ["http://a.test/in"]
    moved = _run(
        monkeypatch, Offsite, "", status=301, headers={"location": "http://c.test/"}, scope="any"
    )
    assert not moved.links and moved.rejected == {"out_of_scope": 1}
    page = Page("http://a.test/", 200, {}, b"", allowed_domains=frozenset({"a.test"}))
    assert page.in_scope("http://x.a.test/") and not page.in_scope("http://b.test/")


@pytest.mark.parametrize(
    ("domains", "message"),
    [
        ("example.org", "must be a list of domains"),
        (["https://example.org/"], "is not a domain name"),
        (["example.org:8080"], "is not a domain name"),
        ([".example.org"], "is not a domain name"),
        ([""], "is not a domain name"),
        ([42], "is not a domain name"),
    ],
)
def test_bad_allowed_domains_do_not_load(
    monkeypatch: pytest.MonkeyPatch, domains: Any, message: str
) -> None:
    cls = type("Bad", (Spider,), {"allowed_domains": domains})
    module = _module_spiders(monkeypatch, Bad=cls)
    with pytest.raises(SpiderLoadError, match=message):
        load_spider(f"{module}:Bad")


# -- 4. async def callbacks --------------------------------------------------------------------


class Async(Spider):
    name = "async"

    async def parse(self, page: Page) -> list[Any]:  # type: ignore[override]
        await asyncio.sleep(0)
        return [Record("c", {"n": len(page.css("a"))}), page.follow("/gen", "parse_gen")]

    async def parse_gen(self, page: Page) -> AsyncIterator[Any]:
        for i in range(3):
            await asyncio.sleep(0)
            yield Record(f"g{i}", {"url": page.url})

    async def parse_fail(self, page: Page) -> AsyncIterator[Any]:
        yield Record("first", {})
        raise RuntimeError("boom")


def test_async_callbacks_run_to_completion(monkeypatch: pytest.MonkeyPatch) -> None:
    res = _run(monkeypatch, Async, "<a href=/x>x</a>")
    assert res.error is None
    assert [(r.key, json.loads(r.data_json)) for r in res.records] == [("c", {"n": 1})]
    assert [u.url for u in res.links] == ["http://a.test/gen"]
    gen = _run(monkeypatch, Async, "", request=RequestSpec(callback="parse_gen"))
    assert [r.key for r in gen.records] == ["g0", "g1", "g2"]
    fail = _run(monkeypatch, Async, "", request=RequestSpec(callback="parse_fail"))
    assert fail.error == "parse error: RuntimeError: boom" and not fail.records


def test_async_callbacks_inside_a_running_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """parse_workers = 0 parses on the crawl's own event loop: the coroutine runs on a helper
    thread's loop instead of failing with 'this event loop is already running'."""
    module = _module_spiders(monkeypatch, S=Async)
    parser = Parser(f"{module}:S", SCOPE, "host", simhash=False)
    job = ParseJob("http://a.test/", 200, {}, b"", 0, "page", RequestSpec(callback="parse_gen"))

    async def inline() -> Any:
        return parser.run(job), parser.run(job)

    first, second = asyncio.run(inline())
    assert first.error is None and [r.key for r in first.records] == ["g0", "g1", "g2"]
    assert second.records == first.records
    assert parser.run(job).records == first.records  # and again without a loop


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("async def start(self):\n        yield 'http://a.test/'", r"start\(\): .*start_requests"),
        (
            "async def start_requests(self):\n        yield 'http://a.test/'",
            "start_requests must be a plain",
        ),
        ("async def process_record(self, r):\n        return r", "process_record must be a"),
    ],
)
def test_async_methods_idemcrawl_calls_synchronously_do_not_load(
    monkeypatch: pytest.MonkeyPatch, body: str, message: str
) -> None:
    namespace: dict[str, Any] = {"Spider": Spider}
    exec(f"class S(Spider):\n    {body}\n", namespace)
    module = _module_spiders(monkeypatch, S=namespace["S"])
    with pytest.raises(SpiderLoadError, match=message):
        load_spider(f"{module}:S")


# -- 5. ::text and ::attr() --------------------------------------------------------------------

HTML = """<html><body><div id=d class=y> lead &amp; <p class=x>Hello <b>world</b> tail<!-- c -->
</p><p class=x>two</p><a href='/a' data-k>A</a><a>noh</a><div class=in>inner <i>it</i></div>
</div><h2>h2</h2><h1 title="t">h1</h1></body></html>"""
SELECTORS = [
    "p::text", "p ::text", "p *::text", "::text", "*::text", "a::attr(href)", "div > ::text",
    "#d::text", "p.x::text, a::text", "a::attr(data-k)", "div::attr(class)",
    "div ::attr(class)", "::attr(class)", "h1::text, h2::text", "div *::attr(class)",
    "p>*::text", "a::attr('href')", "a::attr(href), h1::attr(href)", "li::text",
]  # fmt: skip
NODE_SELECTORS = ["::text", "p::text", " ::text", "*::text", "::attr(id)", "i::text", "b::text"]


def test_pseudo_elements_give_what_parsel_gives() -> None:
    parsel = pytest.importorskip("parsel")
    page = Page("http://a.test/", 200, {}, HTML.encode())
    sel = parsel.Selector(HTML)
    for q in SELECTORS:
        assert page.css(q) == sel.css(q).getall(), q
        assert page.css_first(q) == sel.css(q).get(), q
    node, node_sel = page.css_first("div"), sel.css("div")[0]
    for q in NODE_SELECTORS:
        assert node.css(q) == node_sel.css(q).getall(), q
        assert node.css_first(q) == node_sel.css(q).get(), q


def test_pseudo_elements_without_parsel() -> None:
    page = Page("http://a.test/", 200, {}, HTML.encode())
    assert page.css("p::text") == ["Hello ", " tail", "\n", "two"]
    # An element matched inside another: its text comes after all of the outer one's
    # (parsel interleaves them in document order: ' lead & ', 'inner ', '\n').
    assert page.css("div::text") == [" lead & ", "\n", "inner "]
    # Groups with different pseudo-elements: group by group (parsel: ['/a', 't']).
    assert page.css("h1::attr(title), a::attr(href)") == ["t", "/a"]
    assert page.css("a::attr(href)") == ["/a"]
    assert page.css_first("h3::text") is None
    li = page.css_first("p")
    assert li is not None and li.css("b::text") == ["world"]


def test_results_read_like_parsel_selector_lists() -> None:
    page = Page("http://a.test/", 200, {}, HTML.encode())
    found = page.css("p.x::text")
    assert isinstance(found, Matches) and isinstance(found, list)
    assert found.get() == "Hello " and found.getall() == ["Hello ", " tail", "\n", "two"]
    assert found.extract_first() == "Hello " and found.extract() == found.getall()
    assert page.css("h3::text").get() is None and page.css("h3::text").get("-") == "-"
    # Elements read as their HTML, as parsel's .get() gives it.
    assert page.css("b").get() == "<b>world</b>" and page.css("i").getall() == ["<i>it</i>"]
    assert page.xpath("//a/@href").get() == "/a"
    assert page.xpath("//i").get() == "<i>it</i>"
    assert page.xpath("//nothing").get() is None
    assert page.css_first("p").css("b").get() == "<b>world</b>"  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("selector", "message"),
    [
        ("p::before", "supported are ::text and ::attr"),
        ("p::text b", "supported are ::text and ::attr"),
        ("p, a::attr(href)", "with and without ::text"),
    ],
)
def test_unsupported_pseudo_elements_are_refused(selector: str, message: str) -> None:
    page = Page("http://a.test/", 200, {}, HTML.encode())
    with pytest.raises(ValueError, match=message):
        page.css(selector)


# -- 6. self.logger ----------------------------------------------------------------------------


def test_spider_logger_is_named_after_the_spider(caplog: pytest.LogCaptureFixture) -> None:
    spider = Kw()
    assert isinstance(spider.logger, logging.Logger) and spider.logger.name == "kw"
    with caplog.at_level(logging.INFO, logger="kw"):
        spider.logger.info("parsed %d items", 3)
    assert [(r.name, r.getMessage()) for r in caplog.records] == [("kw", "parsed 3 items")]


_LOG_SCRIPT = """
import logging
from idemcrawl.parse import Spider, load_spider
class Chatty(Spider):
    name = "chatty"
    custom_settings = SETTINGS
spider = Chatty()
spider.logger.debug("a detail")
spider.logger.info("parsed %d items", 3)
spider.logger.warning("a gap")
"""


@pytest.mark.parametrize(
    ("settings", "shown"),
    [
        (None, ["[chatty] INFO: parsed 3 items", "[chatty] WARNING: a gap"]),
        ({"LOG_LEVEL": "DEBUG"}, ["[chatty] DEBUG: a detail", "[chatty] INFO: parsed 3 items",
                                  "[chatty] WARNING: a gap"]),
        ({"LOG_LEVEL": "WARNING"}, ["[chatty] WARNING: a gap"]),
        ({"LOG_ENABLED": False}, []),
    ],
)  # fmt: skip
def test_spider_logs_reach_stderr_from_info_as_in_scrapy(
    settings: dict[str, Any] | None, shown: list[str]
) -> None:
    """Where nothing set up logging (a crawl's parser process), ``self.logger.info`` is
    shown, named after the spider; LOG_LEVEL / LOG_ENABLED in custom_settings change it."""
    code = _LOG_SCRIPT.replace("SETTINGS", repr(settings))
    done = run_python(code)
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines() == shown


def test_a_bad_log_level_stops_the_spider_at_load(monkeypatch: pytest.MonkeyPatch) -> None:
    cls = type("Loud", (Spider,), {"custom_settings": {"LOG_LEVEL": "LOUD"}})
    module = _module_spiders(monkeypatch, Loud=cls)
    with pytest.raises(SpiderLoadError, match="LOG_LEVEL'\\] must be one of DEBUG"):
        load_spider(f"{module}:Loud")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"dont_filter": True}, "dont_filter=: a request's identity is method \\+ URL \\+ body"),
        ({"errback": print}, "errback=: a request that fails for good is recorded"),
        ({"cookies": {"a": "1"}}, "cookies=: cookies come from the crawl's jar"),
        ({"formdata": {"q": "x"}}, "formdata=: from_form"),
        ({"colback": "parse_item"}, "unexpected keyword argument\\(s\\) colback; it takes"),
    ],
)
def test_scrapy_request_arguments_are_refused_with_the_idemcrawl_way(
    kwargs: dict[str, Any], message: str
) -> None:
    with pytest.raises(TypeError, match=message):
        Request("http://a.test/", **kwargs)
    page = Page("http://a.test/", 200, {"content-type": "text/html"}, b"<a href='/x'>x</a>")
    with pytest.raises(TypeError, match=message):
        page.follow("/x", **kwargs)
