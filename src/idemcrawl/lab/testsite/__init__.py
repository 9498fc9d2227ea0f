"""Built-in test sites: a deterministic shop to crawl, count and verify against, and more.

The shop's names are imported on first use (PEP 562): the spiders in this package
(``shop_spider``, ``page_spider``, ``trap_spider``) are loaded by parser processes, which must not
pay for the servers (aiohttp) just because a spider sits next to them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from idemcrawl.lab.testsite.shop import (
        ShopConfig,
        ShopServer,
        expected_products,
        make_app,
        price_for,
        serve_forever,
        sku_for,
    )

__all__ = [
    "ShopConfig",
    "ShopServer",
    "expected_products",
    "make_app",
    "price_for",
    "serve_forever",
    "sku_for",
]


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module("idemcrawl.lab.testsite.shop"), name)
    globals()[name] = value
    return value
