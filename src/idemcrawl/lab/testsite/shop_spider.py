"""The spider for the built-in shop: one record per product, keyed by SKU."""

from __future__ import annotations

from collections.abc import Iterator

from idemcrawl.parse import Link, Page, Record, Spider


class ShopSpider(Spider):
    name = "shop"

    def parse(self, page: Page) -> Iterator[Record | Link | str]:
        sku = page.css_first(".sku")
        if sku is not None:
            price = page.css_first(".price")
            title = page.css_first(".name")
            yield Record(
                key=sku.text(),
                data={
                    "sku": sku.text(),
                    "name": title.text() if title else None,
                    "price": price.text() if price else None,
                },
            )
        # The next listing first: the listings are a chain (each names the next), so fetching
        # it early lets the crawl fan out instead of waiting at every page for the products
        # found so far.
        for node in page.css("a.product[href], a[rel=next][href]"):
            yield Link(
                str(node.attrs["href"]),
                priority=0 if "product" in node.attrs.get("class", "") else 1,
            )
