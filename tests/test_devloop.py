"""The spider author's loop: ``idemcrawl parse``, ``shell`` and ``new`` (issue 16)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from idemcrawl.devloop import DevLoopError, new_spider, spider_class_name
from idemcrawl.lab.testsite.sandbox import SandboxServer, item_category, item_name, item_price
from idemcrawl.parse import Page, ParseJob, Parser, load_spider

from .helpers import run_cli

CATALOG = f"{Path(__file__).resolve().parents[1] / 'examples' / 'catalog.py'}:Catalog"
LOOPBACK = ("--allow-private", "127.0.0.1")


def test_parse_prints_the_requests_a_listing_yields_and_stores_nothing(tmp_path: Path) -> None:
    with SandboxServer() as server:
        base = server.base_url
        url = f"{base}/catalog?page=2"
        done = run_cli("parse", url, "--spider", CATALOG, *LOOPBACK, cwd=tmp_path)
        log = server.requests()
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == f"200 {url} -> parse"
    assert "records (0):" in lines and "requests (6):" in lines
    cat = item_category(6)
    assert (
        f'  GET {base}/item/6 -> parse_item data={{"category": "{cat}", '
        f'"listing_page": 2, "rank": 1}}'
    ) in lines
    assert f"  GET {base}/catalog?page=3 -> parse" in lines
    assert [(e["method"], e["path"]) for e in log] == [("GET", "/catalog?page=2")]
    assert list(tmp_path.iterdir()) == []


def test_parse_prints_cb_kwargs() -> None:
    with SandboxServer() as server:
        base = server.base_url
        url = f"{base}/catalog?page=2"
        done = run_cli("parse", url, "--spider", "tests.sandbox_spiders:ScrapyHabits", *LOOPBACK)
    assert done.returncode == 0, done.stderr
    cat = item_category(6)
    assert (
        f"  GET {base}/item/6 -> parse_item "
        f'cb_kwargs={{"category": "{cat}", "listing_page": 2, "rank": 1}}'
    ) in done.stdout.splitlines()


def test_parse_passes_cb_kwargs_to_the_callback() -> None:
    """``parse --cb-kwargs`` (Scrapy's ``--cbkwargs``): the async callback of ScrapyHabits
    gets its keyword arguments; ones it cannot take are refused before any request."""
    kwargs = {"category": "toys", "rank": 2, "listing_page": 9}
    spider = "tests.sandbox_spiders:ScrapyHabits"
    with SandboxServer() as server:
        url = f"{server.base_url}/item/7"
        done = run_cli(
            "parse", url, "--spider", spider, "--callback", "parse_item",
            "--cb-kwargs", json.dumps(kwargs), "--json", *LOOPBACK,
        )  # fmt: skip
        fetched = len(server.requests())
        wrong = run_cli(
            "parse", url, "--spider", spider, "--callback", "parse_item",
            "--cb-kwargs", '{"colour": "red"}', *LOOPBACK,
        )  # fmt: skip
        not_object = run_cli("parse", url, "--spider", spider, "--cb-kwargs", "[1]", *LOOPBACK)
        assert len(server.requests()) == fetched + 1  # the wrong one fetched, then refused
    assert done.returncode == 0, done.stderr
    (record,) = json.loads(done.stdout)["records"]
    assert {k: record["data"][k] for k in kwargs} == kwargs
    assert wrong.returncode == 2 and "cannot take cb_kwargs colour" in wrong.stderr
    assert not_object.returncode == 2 and "--cb-kwargs must be a JSON object" in not_object.stderr


def test_parse_runs_the_named_callback_with_its_context() -> None:
    data = {"category": "toys", "rank": 2, "listing_page": 9}
    with SandboxServer() as server:
        url = f"{server.base_url}/item/7"
        done = run_cli(
            "parse", url, "--spider", CATALOG, "--callback", "parse_item",
            "--data", json.dumps(data), "--json", *LOOPBACK,
        )  # fmt: skip
        bad = run_cli("parse", url, "--spider", CATALOG, "--callback", "nope", *LOOPBACK)
        not_json = run_cli("parse", url, "--spider", CATALOG, "--data", "[1", *LOOPBACK)
        fetched = len(server.requests())
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["callback"] == "parse_item" and out["error"] is None
    assert out["records"] == [
        {
            "source": "catalog",
            "key": "item-7",
            "data": {"name": item_name(7), "price": item_price(7), **data},
        }
    ]
    assert bad.returncode == 2
    assert "unknown callback 'nope': Catalog has no such method" in bad.stderr
    assert not_json.returncode == 2 and "--data is not JSON" in not_json.stderr
    assert fetched == 1  # the bad callback and the bad data were refused before any request


def test_parse_shows_the_traceback_of_a_callback_that_raises() -> None:
    from .sandbox_spiders import BuggyCatalog

    spider = "tests.sandbox_spiders:BuggyCatalog"
    with SandboxServer() as server:
        url = f"{server.base_url}/item/2"
        args = ("parse", url, "--spider", spider, "--callback", "parse_item", *LOOPBACK)
        done = run_cli(*args)
        as_json = run_cli(*args, "--json")
    assert done.returncode == 1 == as_json.returncode, done.stderr
    line_no = BuggyCatalog.parse_item.__code__.co_firstlineno + 3
    lines = done.stdout.splitlines()
    at = lines.index("error: parse error: KeyError: 'colour'")
    assert lines[at + 1 : at + 4] == [
        "traceback (most recent call last):",
        f'  File "tests/sandbox_spiders.py", line {line_no}, in parse_item',
        '    colour = page.data["colour"]',
    ]
    assert json.loads(as_json.stdout)["trace"].endswith('colour = page.data["colour"]')


def test_parse_refuses_loopback_without_allow_private() -> None:
    with SandboxServer() as server:
        done = run_cli("parse", f"{server.base_url}/", "--spider", CATALOG)
        assert server.requests() == []
    assert done.returncode == 2 and "error:" in done.stderr


def test_shell_opens_a_prompt_with_the_page() -> None:
    code = "print(page.css_first('h1').text()); print(len(page.xpath('//li')))\n"
    code += "print(spider.name, len(list(spider.parse(page))))\n"
    with SandboxServer() as server:
        done = run_cli(
            "shell", f"{server.base_url}/catalog", "--spider", CATALOG, *LOOPBACK, input=code
        )
    assert done.returncode == 0, done.stderr
    # The prompt (on stdout when stdin is not a terminal) prefixes each command's output.
    out = [line.removeprefix(">>> ") for line in done.stdout.splitlines()]
    assert out[:3] == ["Catalogue page 1", "5", "catalog 6"]
    assert "idemcrawl shell: 200" in done.stderr


def test_new_writes_a_starter_that_loads_and_runs(tmp_path: Path) -> None:
    done = run_cli("new", "my_shop", "--dir", str(tmp_path))
    assert done.returncode == 0, done.stderr
    path = tmp_path / "my_shop.py"
    assert path.exists() and spider_class_name("my_shop") == "MyShop"
    cls = load_spider(f"{path}:MyShop")
    assert cls.start_urls == ("https://example.com/",)
    parser = Parser(f"{path}:MyShop", frozenset({"https://example.com"}), "host")
    body = b"<a class='item' href='/p/1'>One</a><a rel='next' href='/?page=2'>n</a>"
    result = parser.run(ParseJob("https://example.com/", 200, {}, body, 0))
    assert [u.url for u in result.links] == [
        "https://example.com/p/1",
        "https://example.com/?page=2",
    ]
    assert result.links[0].request is not None and result.links[0].request.callback == "parse_item"
    page = Page("https://example.com/p/1", 200, {}, b"<p class='price'>3</p>")
    assert [r.data for r in cls().parse_item(page)] == [{"title": None, "price": "3"}]
    again = run_cli("new", "my_shop", "--dir", str(tmp_path))
    assert again.returncode == 2 and "exists already" in again.stderr
    bad = run_cli("new", "class", "--dir", str(tmp_path))
    assert bad.returncode == 2 and "must be a Python identifier" in bad.stderr
    with pytest.raises(DevLoopError, match="identifier"):
        new_spider("1x", tmp_path)
