"""Spider for the trap site: one record per real product."""

from __future__ import annotations

from collections.abc import Iterator

from ..parse import Page, Record, Spider


class TrapShopSpider(Spider):
    name = "trapshop"

    def parse(self, page: Page) -> Iterator[Record | str]:
        sku = page.css_first(".sku")
        price = page.css_first(".price")
        if sku is not None and price is not None:
            yield Record(key=sku.text(), data={"price": price.text()})
        yield from page.links()
