"""Failures a user can see (``idemcrawl.failures``): where a spider's exception rose, kept by
the parser with the failure, and a crawl's failed URLs by reason as text."""

from __future__ import annotations

import json
import pickle
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from idemcrawl.failures import failure_lines, trace_tail
from idemcrawl.parse import Page, ParseJob, Parser, ParseResult, Record, Spider

SHOP = "http://shop.test"
HTML = {"content-type": "text/html; charset=utf-8"}
PAGE = b"<html><body><p class='price'>9.99</p></body></html>"


def run(spec: str, *, frames: int | None = 4) -> ParseResult:
    parser = Parser(spec, frozenset({SHOP}), "host", trace_frames=frames)
    return parser.run(ParseJob(f"{SHOP}/item/1", 200, HTML, PAGE, 0, "page"))


class MissingKey(Spider):
    def parse(self, page: Page) -> Iterator[Record]:
        data: dict[str, str] = {}
        yield Record(page.url, {"price": data["price"]})  # the bug: a KeyError here


class ScrapyItems(Spider):
    def parse(self, page: Page) -> Iterator[Any]:
        yield {"price": "9.99"}  # a Scrapy habit: an item as a plain dict


class DeepLibraryError(Spider):
    def parse(self, page: Page) -> Iterator[Record]:
        yield Record(page.url, self.decode("{not json"))

    def decode(self, text: str) -> dict[str, Any]:
        return json.loads(text)  # type: ignore[no-any-return]


@dataclass
class Item:
    price: float


class StrictItems(Spider):
    record_schema = Item

    def parse(self, page: Page) -> Iterator[Record]:
        yield Record(page.url, {"price": "9.99"})  # text, not a float


def test_a_callback_exception_keeps_the_line_that_raised() -> None:
    result = run("tests.test_failures:MissingKey")
    assert result.error == "parse error: KeyError: 'price'"
    assert result.trace is not None
    assert result.trace.splitlines() == [
        f'File "tests/test_failures.py", line {MissingKey.parse.__code__.co_firstlineno + 2}, '
        "in parse",
        '  yield Record(page.url, {"price": data["price"]})  # the bug: a KeyError here',
    ]
    # It reaches the crawl process from a parser process.
    assert pickle.loads(pickle.dumps(result, pickle.HIGHEST_PROTOCOL)).trace == result.trace


def test_a_yielded_dict_points_at_the_yield_and_says_what_to_yield() -> None:
    result = run("tests.test_failures:ScrapyItems")
    assert result.error is not None
    assert "spider yielded dict" in result.error
    assert "Record(key, data)" in result.error
    assert result.trace is not None
    assert "in parse" in result.trace
    assert 'yield {"price": "9.99"}' in result.trace


def test_a_record_that_does_not_fit_points_at_its_yield() -> None:
    result = run("tests.test_failures:StrictItems")
    assert result.error is not None and "InvalidRecord" in result.error
    assert result.trace is not None
    assert 'yield Record(page.url, {"price": "9.99"})' in result.trace


def test_an_error_inside_a_library_leads_with_the_spider_s_own_line() -> None:
    full = run("tests.test_failures:DeepLibraryError", frames=None).trace
    assert full is not None
    assert full.count('File "') >= 4  # parse, decode, then json's own frames
    tail = run("tests.test_failures:DeepLibraryError", frames=2).trace
    assert tail is not None
    lines = tail.splitlines()
    assert lines[0].endswith("in decode") and "tests/test_failures.py" in lines[0]
    assert lines[1] == "  return json.loads(text)  # type: ignore[no-any-return]"
    assert lines[2] == "…"
    assert lines[3].startswith('File "') and "json" in lines[3]
    # Within the frames kept, the spider's own frame needs no gap.
    assert "…" not in (run("tests.test_failures:DeepLibraryError", frames=20).trace or "")


def test_trace_tail_of_nothing_is_none() -> None:
    assert trace_tail(None) is None


def test_failure_lines_show_count_first_url_and_trace() -> None:
    reasons = [
        {"reason": "parse error: KeyError: 'price'", "urls": 18, "url": f"{SHOP}/item/1",
         "trace": 'File "spider.py", line 9, in parse_item\n  price = data["price"]',
         "failed_at": 1.0},
        {"reason": "HTTP 503 (after 4 attempts)", "urls": 2, "url": f"{SHOP}/x", "trace": None,
         "failed_at": 2.0},
    ]  # fmt: skip
    lines = failure_lines(21, reasons)
    assert lines == [
        "failed URLs      21 (failed for good; by reason, most URLs first):",
        "       18  parse error: KeyError: 'price'",
        f"           first: {SHOP}/item/1",
        '             File "spider.py", line 9, in parse_item',
        '               price = data["price"]',
        "        2  HTTP 503 (after 4 attempts)",
        f"           first: {SHOP}/x",
        "        1  for other reasons (status --json lists more reasons)",
    ]
    assert failure_lines(0, []) == []
    assert len(failure_lines(20, reasons, shown=1)) == 1 + 4 + 1
