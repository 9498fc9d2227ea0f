r"""Listing -> detail with context: the sandbox's catalogue (``testsite --site sandbox``).

The category and rank of an item are on the listing only, so the listing hands them to the
detail page's callback as ``data``; the frontier stores them with the detail URL, so a crawl
killed between the two pages still gives every record its category after the restart. The
sandbox runs on loopback, which a crawl refuses unless allowed:

    idemcrawl crawl 'http://127.0.0.1:8000/catalog?page=1' --db catalog.db \
        --allow-private 127.0.0.1 --spider examples/catalog.py:Catalog
"""

from __future__ import annotations

from collections.abc import Iterator
from urllib.parse import parse_qs, urlsplit

from idemcrawl.parse import Page, Record, Request, Spider


class Catalog(Spider):
    name = "catalog"

    def parse(self, page: Page) -> Iterator[Request]:
        listing = int(parse_qs(urlsplit(page.url).query).get("page", ["1"])[0])
        for li in page.css("li.item"):
            category = li.css_first(".category")
            yield page.follow(
                li.css_first("a.item-link"),  # type: ignore[arg-type]
                callback=self.parse_item,
                data={
                    "category": category.text() if category else None,
                    "rank": int(li.attrs.get("data-rank") or 0),
                    "listing_page": listing,
                },
            )
        for nxt in page.css("a.next"):
            yield page.follow(nxt, priority=1)

    def parse_item(self, page: Page) -> Iterator[Record]:
        name, price = page.css_first(".name"), page.css_first(".price")
        yield Record(
            key="item-" + page.url.rsplit("/", 1)[1],
            data={
                "name": name.text() if name else None,
                "price": price.text() if price else None,
                **page.data,
            },
        )
