"""Shared fixtures: a running test shop on loopback and crawl configs that may reach it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from idemcrawl.config import CrawlConfig
from idemcrawl.fetch import parse_allow_list
from idemcrawl.lab.testsite import ShopConfig, ShopServer

LOOPBACK = parse_allow_list(["127.0.0.1"])
SHOP_SPIDER = "idemcrawl.lab.testsite.shop_spider:ShopSpider"


@pytest.fixture
def shop() -> Iterator[ShopServer]:
    with ShopServer(ShopConfig(listings=4, per_page=5)) as server:
        yield server


def crawl_config(db: Path | str, seed: str, **kw: object) -> CrawlConfig:
    base: dict[str, object] = dict(
        db=str(db),
        seeds=(seed,),
        spider=SHOP_SPIDER,
        concurrency=4,
        host_concurrency=4,
        delay=0.0,
        allow_private=LOOPBACK,
        parse_workers=0,
    )
    base.update(kw)
    return CrawlConfig(**base)  # type: ignore[arg-type]
