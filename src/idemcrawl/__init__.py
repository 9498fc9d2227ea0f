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

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .version import __version__

if TYPE_CHECKING:
    from .config import CrawlConfig
    from .engine import CrawlSummary, Engine, run_crawl
    from .parse import Download, Link, Node, Page, Record, Request, Spider, from_form

#: Where each public name lives. Imported on first use (PEP 562), so that a process that only
#: parses (a parser worker imports ``idemcrawl.parse``) does not pay for the engine, aiohttp and
#: the frontier backends: ~0.24 s and tens of MB per parser process.
_LAZY = {
    "CrawlConfig": "config",
    "CrawlSummary": "engine",
    "Engine": "engine",
    "run_crawl": "engine",
    "Download": "parse",
    "Link": "parse",
    "Node": "parse",
    "Page": "parse",
    "Record": "parse",
    "Request": "parse",
    "Spider": "parse",
    "from_form": "parse",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'idemcrawl' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])


__all__ = [
    "CrawlConfig",
    "CrawlSummary",
    "Download",
    "Engine",
    "Link",
    "Node",
    "Page",
    "Record",
    "Request",
    "Spider",
    "__version__",
    "from_form",
    "run_crawl",
]
