"""Requests as data on the spider side: Request, page.follow/follow_all, callbacks by name,
page.data, and what the parser hands the frontier (issue 16, deliverable 1)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from idemcrawl.frontier.base import RequestSpec, request_key
from idemcrawl.parse import Page, ParseJob, Parser, Record, Request, Spider

BASE = "http://shop.test"
LISTING = (
    b"<html><body><ul>"
    b"<li class='item' data-cat='books'><a class='p' href='/item/1'>one</a></li>"
    b"<li class='item' data-cat='toys'><a class='p' href='item/2'>two</a></li>"
    b"<li class='item'><a class='p'>no href</a></li>"
    b"</ul><a class='next' href='/list?page=2'>next</a></body></html>"
)
HTML = {"content-type": "text/html; charset=utf-8"}


class Shop(Spider):
    name = "shop"

    def parse(self, page: Page) -> Iterator[Any]:
        for li in page.css("li.item"):
            a = li.css_first("a.p")
            if a is not None and a.attrs.get("href"):
                yield page.follow(a, self.parse_item, data={"cat": li.attrs["data-cat"]})
        yield page.follow(page.css_first("a.next"))  # type: ignore[arg-type]
        yield Request(f"{BASE}/search", "parse_results", {"q": "tea"}, method="POST", body="q=tea")
        yield Request(f"{BASE}/api", "parse_api", json={"offset": 0})

    def parse_item(self, page: Page) -> Iterator[Record]:
        yield Record(page.url, {"cat": page.data["cat"], "callback": page.callback})

    def parse_results(self, page: Page) -> Iterator[Record]:
        yield Record("results", {"method": page.method, "data": page.data})

    def parse_api(self, page: Page) -> Iterator[Record]:
        yield Record("api", page.json())


class Bad(Spider):
    name = "bad"

    def parse(self, page: Page) -> Iterator[Any]:
        yield Request(f"{BASE}/x", callback=page.url.rsplit("/", 1)[1])

    def _private(self, page: Page) -> Iterator[Any]:
        yield from ()


def parser(spider: type[Spider]) -> Parser:
    p = Parser(None, frozenset({BASE}), "host")
    p.spider = spider()
    p.source = spider.name
    return p


def job(url: str, body: bytes, request: RequestSpec | None = None, **kw: Any) -> ParseJob:
    return ParseJob(url, kw.pop("status", 200), kw.pop("headers", HTML), body, 0, "page", request)


def test_listing_yields_requests_with_specs_and_keys() -> None:
    result = parser(Shop).run(job(f"{BASE}/list", LISTING))
    assert result.error is None
    links = {u.url: u for u in result.links}
    assert links[f"{BASE}/item/1"].request == RequestSpec(
        callback="parse_item", data='{"cat":"books"}'
    )
    assert links[f"{BASE}/item/2"].request == RequestSpec(
        callback="parse_item", data='{"cat":"toys"}'
    )
    # A plain GET for parse costs no spec at all.
    assert links[f"{BASE}/list?page=2"].request is None
    post = request_key(f"{BASE}/search", "POST", b"q=tea")
    assert links[post].request == RequestSpec(
        "POST", "parse_results", '{"q":"tea"}', None, b"q=tea"
    )
    api = request_key(f"{BASE}/api", "POST", b'{"offset":0}')
    spec = links[api].request
    assert spec is not None and spec.header_pairs() == [("Content-Type", "application/json")]
    assert all(u.host_key == BASE for u in result.links)


def test_callback_by_name_gets_its_context_back() -> None:
    spec = RequestSpec(callback="parse_item", data='{"cat":"books"}')
    result = parser(Shop).run(job(f"{BASE}/item/1", b"<p>x</p>", spec))
    assert result.error is None
    (rec,) = result.records
    assert json.loads(rec.data_json) == {"cat": "books", "callback": "parse_item"}
    post = RequestSpec("POST", "parse_results", '{"q":"tea"}', None, b"q=tea")
    (rec,) = parser(Shop).run(job(f"{BASE}/search", b"<p>r</p>", post)).records
    assert json.loads(rec.data_json) == {"method": "POST", "data": {"q": "tea"}}


def test_non_html_reaches_the_callback_that_asked_for_it() -> None:
    body = b'{"items": [1, 2]}'
    headers = {"content-type": "application/json"}
    spec = RequestSpec("POST", "parse_api", None, None, b"{}")
    (rec,) = parser(Shop).run(job(f"{BASE}/api", body, spec, headers=headers)).records
    assert json.loads(rec.data_json) == {"items": [1, 2]}
    # parse() still only sees HTML unless the spider asks for more (unchanged behaviour).
    assert parser(Shop).run(job(f"{BASE}/api", body, headers=headers)).records == []


@pytest.mark.parametrize("name", ["parse_nothing", "_private", "name"])
def test_unknown_callback_fails_the_page_that_yields_it(name: str) -> None:
    result = parser(Bad).run(job(f"{BASE}/{name}", b"<p>x</p>"))
    assert result.error is not None
    assert f"unknown callback {name!r}" in result.error and "Bad" in result.error
    assert list(result.links) == []


def test_unknown_callback_of_a_stored_request_fails_its_url() -> None:
    """A spider renamed its callback after the URL was stored: that URL fails with the name."""
    result = parser(Shop).run(job(f"{BASE}/x", b"<p/>", RequestSpec(callback="gone")))
    assert result.error is not None and "unknown callback 'gone'" in result.error


def test_request_refuses_what_could_not_be_stored_or_sent() -> None:
    with pytest.raises(TypeError, match="Request data must be JSON-serialisable"):
        Request(f"{BASE}/x", "parse_item", {"when": {1, 2}})
    with pytest.raises(TypeError, match="JSON-serialisable"):
        Request(f"{BASE}/x", data={"x": float("nan")})
    with pytest.raises(TypeError, match="must be a dict"):
        Request(f"{BASE}/x", data=[1, 2])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="Request json must be JSON-serialisable"):
        Request(f"{BASE}/x", json=object())
    with pytest.raises(ValueError, match="not one of"):
        Request(f"{BASE}/x", method="BREW")
    with pytest.raises(ValueError, match="set by the HTTP client"):
        Request(f"{BASE}/x", headers={"Content-Length": "3"})
    with pytest.raises(ValueError, match="line break"):
        Request(f"{BASE}/x", headers={"X-A": "a\r\nX-B: b"})
    with pytest.raises(ValueError, match="not both"):
        Request(f"{BASE}/x", body=b"a", json={})
    with pytest.raises(TypeError, match="spider method or its name"):
        Request(f"{BASE}/x", callback=print)
    with pytest.raises(ValueError, match=r"Request data is 70,0\d\d bytes; at most 65,536"):
        Request(f"{BASE}/x", data={"page": "x" * 70_000})
    with pytest.raises(ValueError, match="Request body is 1,048,577 bytes"):
        Request(f"{BASE}/x", method="POST", body=b"x" * (1024 * 1024 + 1))
    with pytest.raises(ValueError, match=r"Request headers is 20,0\d\d bytes"):
        Request(f"{BASE}/x", headers={"X-Big": "y" * 20_000})


def test_non_json_data_is_refused_when_yielded() -> None:
    class Sloppy(Spider):
        def parse(self, page: Page) -> Iterator[Any]:
            req = Request(f"{BASE}/x", "parse")
            req.data = {"t": object()}  # changed after it was made
            yield req

    result = parser(Sloppy).run(job(f"{BASE}/", b"<p/>"))
    assert result.error is not None and "JSON-serialisable" in result.error


def test_follow_all_by_css_and_by_hrefs() -> None:
    page = Page(f"{BASE}/list", 200, HTML, LISTING)
    reqs = page.follow_all(css="a.p", callback="parse_item", data={"from": "list"})
    assert [r.url for r in reqs] == [f"{BASE}/item/1", f"{BASE}/item/2"]
    assert all(r.callback == "parse_item" and r.data == {"from": "list"} for r in reqs)
    reqs = page.follow_all(["/a", "/a", "b", "http://[bad"])
    assert [r.url for r in reqs] == [f"{BASE}/a", f"{BASE}/b"]
    with pytest.raises(ValueError, match="exactly one"):
        page.follow_all()
    assert page.data == {} and page.callback == "parse" and page.method == "GET"


def test_page_json_says_why_it_is_not_json() -> None:
    assert Page(f"{BASE}/j", 200, {}, b'{"a": [1]}').json() == {"a": [1]}
    with pytest.raises(ValueError, match="body is not JSON"):
        Page(f"{BASE}/j", 200, {}, b"<html>").json()


@pytest.mark.parametrize(
    ("status", "method", "body"), [(302, "GET", None), (303, "GET", None), (307, "POST", b"q=1")]
)
def test_redirect_of_a_request_keeps_callback_and_context(
    status: int, method: str, body: bytes | None
) -> None:
    spec = RequestSpec(
        "POST", "parse_results", '{"q":"1"}', '[["Content-Type","text/plain"],["X-A","1"]]', b"q=1"
    )
    headers = {"location": "/results?id=7"}
    result = parser(Shop).run(job(f"{BASE}/search", b"", spec, status=status, headers=headers))
    (link,) = result.links
    target = f"{BASE}/results?id=7"
    assert link.url == request_key(target, method, body)
    assert link.request is not None
    assert (link.request.method, link.request.body) == (method, body)
    assert (link.request.callback, link.request.data) == ("parse_results", '{"q":"1"}')
    expected = (
        [("Content-Type", "text/plain"), ("X-A", "1")] if method == "POST" else [("X-A", "1")]
    )
    assert link.request.header_pairs() == expected


def test_plain_redirect_is_unchanged() -> None:
    result = parser(Shop).run(job(f"{BASE}/old", b"", status=301, headers={"location": "/new"}))
    (link,) = result.links
    assert link.url == f"{BASE}/new" and link.request is None


def test_out_of_scope_request_is_counted_not_followed() -> None:
    class Out(Spider):
        def parse(self, page: Page) -> Iterator[Any]:
            yield Request("http://elsewhere.test/x", "parse", {"a": 1})

    result = parser(Out).run(job(f"{BASE}/", b"<p/>"))
    assert list(result.links) == [] and result.rejected == {"out_of_scope": 1}


XDOC = (
    b"<?xml version='1.0' encoding='utf-8'?>\n<html><body><div id='a'>"
    b"<a class='p' href='/x'>X  one</a><a class='p' href='/y'>Y</a></div>"
    b"<p>caf\xc3\xa9</p></body></html>"
)


def test_xpath_gives_elements_strings_and_clear_errors() -> None:
    page = Page(f"{BASE}/doc", 200, HTML, XDOC)
    links = page.xpath("//a[@class='p']")
    assert [n.text() for n in links] == ["X one", "Y"]  # type: ignore[union-attr]
    assert links[0].attrs == {"class": "p", "href": "/x"}  # type: ignore[union-attr]
    assert page.xpath("//a/@href") == ["/x", "/y"]
    assert page.xpath("//p/text()") == ["café"]
    assert page.xpath("count(//a)") == ["2.0"]
    div = page.xpath_first("//div[@id='a']")
    assert div is not None and div.xpath(".//a/@href") == ["/x", "/y"]  # type: ignore[union-attr]
    assert page.xpath_first("//table") is None
    reqs = page.follow_all(page.xpath("//a"), callback="parse_item")  # type: ignore[arg-type]
    assert [r.url for r in reqs] == [f"{BASE}/x", f"{BASE}/y"]
    with pytest.raises(ValueError, match="invalid XPath"):
        page.xpath("//a[")
    assert Page(f"{BASE}/e", 200, HTML, b"").xpath("//a") == []


class Starts(Spider):
    start_urls = ("http://a.test/b/../c#frag",)

    def start_requests(self) -> Iterator[Any]:
        yield from super().start_requests()
        yield Request("http://b.test/login", self.login, {"user": "u"}, method="POST", body="x")

    def login(self, page: Page) -> Iterator[Any]:
        yield from ()


def test_start_requests_become_keyed_urls_with_specs() -> None:
    from idemcrawl.parse import start_links

    first, login = start_links(Starts())
    assert (first.url, first.host_key, first.priority, first.request) == (
        "http://a.test/c", "http://a.test", 1, None,
    )  # fmt: skip
    assert login.url == request_key("http://b.test/login", "POST", b"x")
    assert login.request == RequestSpec("POST", "login", '{"user":"u"}', None, b"x")

    class Wrong(Spider):
        start_urls = ("http://a.test/",)

        def start_requests(self) -> Iterator[Any]:
            yield Request("http://a.test/", "nope")

    with pytest.raises(ValueError, match="unknown callback 'nope'"):
        start_links(Wrong())
    assert start_links(Spider()) == []


FORM = b"""<html><body>
<form id='other' action='/elsewhere'><input name='x' value='1'></form>
<form id='login' method='post' action='/login?next=%2Fhome'>
  <input type='hidden' name='csrf' value='tok123'>
  <input name='user' value='prefilled'>
  <input type='password' name='password'>
  <input type='checkbox' name='remember' checked>
  <input type='checkbox' name='spam' value='yes'>
  <input type='radio' name='plan' value='a'><input type='radio' name='plan' value='b' checked>
  <input name='off' value='x' disabled>
  <select name='lang'><option value='en'>English</option><option value='fr'>French</option></select>
  <select name='tags' multiple>
    <option selected>t1</option><option>t2</option><option selected>t3</option></select>
  <textarea name='note'>hello
world</textarea>
  <input type='submit' name='go' value='Log in'>
</form>
<form id='find' action='/search?old=1'>
  <input name='q'><input type='hidden' name='f' value='v1'></form>
<form id='upload' method='post' enctype='multipart/form-data' action='/up'></form>
</body></html>"""


def test_from_form_keeps_hidden_fields_and_fills_in_data() -> None:
    from urllib.parse import parse_qsl

    from idemcrawl.parse import from_form

    page = Page(f"{BASE}/login", 200, HTML, FORM)
    req = from_form(
        page,
        "#login",
        {"user": "demo", "password": "pw", "tags": ["a", "b"]},
        callback="after_login",
        context={"who": "demo"},
    )
    assert (req.method, req.url, req.callback, req.data) == (
        "POST", f"{BASE}/login?next=%2Fhome", "after_login", {"who": "demo"},
    )  # fmt: skip
    assert ("Content-Type", "application/x-www-form-urlencoded") in req.headers
    assert req.body is not None
    assert parse_qsl(req.body.decode()) == [
        ("csrf", "tok123"),
        ("user", "demo"),
        ("password", "pw"),
        ("remember", "on"),
        ("plan", "b"),
        ("lang", "en"),
        ("tags", "a"),
        ("tags", "b"),
        ("note", "hello\nworld"),
    ]
    get = from_form(page, "#find", {"q": "tea pot"})
    assert (get.method, get.url, get.body) == ("GET", f"{BASE}/search?q=tea+pot&f=v1", None)
    assert from_form(page).url == f"{BASE}/elsewhere?x=1"  # the first form
    with pytest.raises(ValueError, match="no form matching '#nope'"):
        from_form(page, "#nope")
    with pytest.raises(ValueError, match="multipart/form-data forms are not supported"):
        from_form(page, "#upload")


def test_record_schema_validates_after_process_record() -> None:
    from dataclasses import dataclass, field

    from idemcrawl.parse import InvalidRecord, validate_record

    @dataclass
    class Thing:
        name: str
        price: float
        tags: list[str] = field(default_factory=list)
        note: str | None = None

        def __post_init__(self) -> None:
            if self.price < 0:
                raise ValueError("price must not be negative")

    assert validate_record(Thing, {"name": "a", "price": 2}) == {
        "name": "a", "price": 2, "tags": [], "note": None,
    }  # fmt: skip
    cases = {
        "unexpected field(s) colour": {"name": "a", "price": 1, "colour": "red"},
        "missing field(s) price": {"name": "a"},
        "field price is str '1.50', expected <class 'float'>": {"name": "a", "price": "1.50"},
        "field note is int": {"name": "a", "price": 1, "note": 3},
        "field price is bool": {"name": "a", "price": True},
        "price must not be negative": {"name": "a", "price": -1},
    }
    for message, data in cases.items():
        with pytest.raises(InvalidRecord, match=message.replace("(", r"\(").replace(")", r"\)")):
            validate_record(Thing, data)

    class Typed(Spider):
        name = "typed"
        record_schema = Thing

        def parse(self, page: Page) -> Iterator[Any]:
            yield Record("keep", {"name": " a ", "price": "3"})
            yield Record("drop", {"name": "x", "price": "1"})

        def process_record(self, record: Record) -> Record | None:
            if record.key == "drop":
                return None
            return Record(record.key, {"name": record.data["name"].strip(), "price": 3.0})

    (rec,) = parser(Typed).run(job(f"{BASE}/", b"<p/>")).records
    assert json.loads(rec.data_json) == {"name": "a", "price": 3.0, "tags": [], "note": None}

    class Untyped(Typed):
        def process_record(self, record: Record) -> Record | None:
            return record

    result = parser(Untyped).run(job(f"{BASE}/", b"<p/>"))
    assert result.records == [] and result.error is not None
    assert "record 'keep' does not fit Thing: field price is str" in result.error


def test_a_record_schema_must_be_a_dataclass_or_a_model(tmp_path: Any) -> None:
    from idemcrawl.parse import SpiderLoadError, load_spider

    path = tmp_path / "s.py"
    path.write_text("from idemcrawl import Spider\nclass S(Spider):\n    record_schema = dict\n")
    with pytest.raises(SpiderLoadError, match="must be a dataclass or a pydantic model"):
        load_spider(f"{path}:S")


def test_a_pydantic_style_schema_is_used_through_model_validate() -> None:
    from idemcrawl.parse import InvalidRecord, validate_record

    class Model:  # what pydantic v2 offers: model_validate(data).model_dump(mode="json")
        def __init__(self, data: dict[str, Any]) -> None:
            if not isinstance(data.get("n"), int):
                raise ValueError("1 validation error for Model\nn: Input should be an integer")
            self.data = {"n": data["n"], "kind": "model"}

        @classmethod
        def model_validate(cls, data: dict[str, Any]) -> Model:
            return cls(data)

        def model_dump(self, mode: str) -> dict[str, Any]:
            assert mode == "json"
            return self.data

    assert validate_record(Model, {"n": 2}) == {"n": 2, "kind": "model"}
    with pytest.raises(InvalidRecord, match="does not fit Model: 1 validation error"):
        validate_record(Model, {"n": "x"})


def test_render_alone_makes_a_request_worth_storing() -> None:
    from idemcrawl.parse import Request

    assert Request("http://a/p").spec() is None
    spec = Request("http://a/p", render=True).spec()
    assert spec is not None and spec.render and spec.method == "GET" and spec.callback is None
