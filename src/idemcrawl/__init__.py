"""idemcrawl: a web crawler that can be killed at any instant and never breaks politeness.

The public API for spider authors::

    import idemcrawl

    class Shop(idemcrawl.Spider):
        name = "shop"

        def parse(self, page):
            sku = page.css_first(".sku")
            if sku:
                price = page.css_first(".price").text()
                yield idemcrawl.Record(key=sku.text(), data={"price": price})
            yield from page.links()
"""

from .config import CrawlConfig
from .engine import CrawlSummary, Engine, run_crawl
from .parse import Download, Link, Node, Page, Record, Spider
from .version import __version__

__all__ = [
    "CrawlConfig",
    "CrawlSummary",
    "Download",
    "Engine",
    "Link",
    "Node",
    "Page",
    "Record",
    "Spider",
    "__version__",
    "run_crawl",
]
