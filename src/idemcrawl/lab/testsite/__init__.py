"""Built-in test site: a deterministic shop to crawl, count and verify against."""

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
