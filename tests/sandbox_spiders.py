"""Spiders the sandbox crawl tests run in crawl processes (``tests.sandbox_spiders:Class``)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, urlsplit

from examples.catalog import Catalog
from examples.login import Members
from idemcrawl.parse import Page, Record, Request, Spider


class CatalogSearch(Catalog):
    """The catalogue, plus a POST search for each category a listing shows: the same query
    from two listings is one request (same method, URL and body)."""

    name = "catalog"

    def parse(self, page: Page) -> Iterator[Any]:
        yield from super().parse(page)
        for cat in sorted({n.text() for n in page.css("li.item .category")}):
            yield Request(
                page.follow("/search").url,
                self.parse_results,
                data={"query": cat},
                method="POST",
                body=f"form_id=search-v1&q={cat}",
                headers={"Content-Type": "application/x-www-form-urlencoded"},
            )

    def parse_results(self, page: Page) -> Iterator[Record]:
        q = page.data["query"]
        for hit in page.css("li.hit"):
            name, price = hit.css_first(".name"), hit.css_first(".price")
            assert name is not None and price is not None
            n = int(name.text().split()[-1])
            yield Record(f"{q}:{n}", {"query": q, "name": name.text(), "price": price.text()})


@dataclass
class Item:
    name: str
    price: float
    category: str
    listing_page: int
    rank: int
    currency: str = "EUR"


class StrictCatalog(Catalog):
    """The catalogue with a record schema its records do not fit (price is text)."""

    record_schema = Item


class CleanCatalog(StrictCatalog):
    """The fix: ``process_record`` turns the price into a number before validation."""

    def process_record(self, record: Record) -> Record | None:
        return Record(record.key, {**record.data, "price": float(record.data["price"])})


class ScrapyHabits(Spider):
    """examples/scrapy_catalog.py with its Scrapy habits kept: ``cb_kwargs``, ``::text`` and
    ``.get()``, an ``async def`` callback, ``allowed_domains``, ``custom_settings`` and
    ``self.logger`` (the sandbox listens on 127.0.0.1)."""

    name = "catalog"
    allowed_domains = ("127.0.0.1",)
    custom_settings = {"ROBOTSTXT_OBEY": True, "DOWNLOAD_DELAY": 0, "DEPTH_LIMIT": 10}

    def parse(self, page: Page) -> Iterator[Any]:
        listing = int(parse_qs(urlsplit(page.url).query).get("page", ["1"])[0])
        for li in page.css("li.item"):
            yield page.follow(
                li.css("a.item-link")[0],
                callback=self.parse_item,
                cb_kwargs={
                    "category": li.css(".category::text").get(),
                    "rank": int(li.attrs.get("data-rank") or 0),
                    "listing_page": listing,
                },
            )
        for href in page.css("a.next::attr(href)").getall():
            yield page.follow(href, priority=1)

    async def parse_item(
        self, page: Page, category: str, rank: int, listing_page: int
    ) -> AsyncIterator[Record]:
        await asyncio.sleep(0)
        self.logger.debug("item %s", page.url)
        yield Record(
            "item-" + page.url.rsplit("/", 1)[1],
            {
                "name": page.css(".name::text").get(),
                "price": page.css(".price::text").get(),
                "category": category,
                "rank": rank,
                "listing_page": listing_page,
            },
        )


class MembersWithoutCookies(Members):
    """The login spider with its cookie jar turned off (Scrapy's ``COOKIES_ENABLED = False``):
    the login's CSRF check fails, so there is no session and no members' deal."""

    keep_cookies = False


class BuggyCatalog(Catalog):
    """The catalogue with two bugs a Scrapy user makes: a context key the listing never sent
    (even items: a KeyError), and an item yielded as a plain dict (odd items)."""

    def parse_item(self, page: Page) -> Iterator[Any]:
        n = int(page.url.rsplit("/", 1)[1])
        if n % 2 == 0:
            colour = page.data["colour"]
            yield Record(f"item-{n}", {"colour": colour})
        else:
            yield {"item": n}
