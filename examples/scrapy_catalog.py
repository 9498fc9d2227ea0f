"""The Scrapy spider ``examples/catalog.py`` ports (docs/scrapy.md shows them side by side).

    SANDBOX=http://127.0.0.1:8000 scrapy runspider examples/scrapy_catalog.py -O items.json
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any
from urllib.parse import parse_qs, urlsplit

import scrapy

SANDBOX = os.environ.get("SANDBOX", "http://127.0.0.1:8000")


class Catalog(scrapy.Spider):
    name = "catalog"
    start_urls = [f"{SANDBOX}/catalog?page=1"]

    def parse(self, response: Any) -> Iterator[Any]:
        listing = int(parse_qs(urlsplit(response.url).query).get("page", ["1"])[0])
        for li in response.css("li.item"):
            yield response.follow(
                li.css("a.item-link")[0],
                callback=self.parse_item,
                cb_kwargs={
                    "category": li.css(".category::text").get(),
                    "rank": int(li.attrib.get("data-rank") or 0),
                    "listing_page": listing,
                },
            )
        for nxt in response.css("a.next"):
            yield response.follow(nxt, priority=1)

    def parse_item(
        self, response: Any, category: str, rank: int, listing_page: int
    ) -> Iterator[dict[str, Any]]:
        yield {
            "key": "item-" + response.url.rsplit("/", 1)[1],
            "name": response.css(".name::text").get(),
            "price": response.css(".price::text").get(),
            "category": category,
            "rank": rank,
            "listing_page": listing_page,
        }
