"""Spider for the trap site: one record per real product."""

from __future__ import annotations

from collections.abc import Iterator

from idemcrawl.parse import Download, Page, Record, Spider


class TrapShopSpider(Spider):
    """Products become records; PDF links are downloads (kept by content hash)."""

    name = "trapshop"

    def parse(self, page: Page) -> Iterator[Record | str | Download]:
        sku = page.css_first(".sku")
        price = page.css_first(".price")
        if sku is not None and price is not None:
            yield Record(key=sku.text(), data={"price": price.text()})
        for link in page.links():
            yield Download(link) if link.endswith(".pdf") else link
