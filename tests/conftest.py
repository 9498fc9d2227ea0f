"""Shared fixtures (a running test shop on loopback, crawl configs that may reach it) and tiers.

Tiers (see docs/testing.md): the marks ``slow``, ``postgres`` and ``browser`` are registered in
pyproject.toml; ``pytest --fast`` runs what carries none of them. ``slow`` and ``browser`` are
written on the tests; ``postgres`` is applied here at collection, from what a test uses, so a
new PostgreSQL test cannot be forgotten (see :func:`needs_postgres`).
"""

from __future__ import annotations

import importlib
import inspect
import types
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


#: The marker expression ``--fast`` selects: everything that is neither slow nor needs a server.
FAST_TIER = "not slow and not postgres and not browser"
#: A test (or a fixture it uses) that names one of these needs the PostgreSQL server: these are
#: the ways into it (tests/frontier/conftest.py), and each one fails in CI without the server.
_POSTGRES_NAMES = frozenset({"require_postgres", "PG_DSN"})
#: A parametrised test whose parameter is this backend name runs against the server.
_POSTGRES_PARAM = "postgres"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--fast",
        action="store_true",
        help=f"run the fast tier only: -m '{FAST_TIER}' (combined with any -m given)",
    )


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("--fast"):
        given = config.option.markexpr
        config.option.markexpr = f"({given}) and ({FAST_TIER})" if given else FAST_TIER


def _global_names(code: types.CodeType) -> set[str]:
    """Global and attribute names ``code`` (and every function nested in it) refers to."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _global_names(const)
    return names


def _refers_to(obj: object, names: frozenset[str]) -> bool:
    code = getattr(inspect.unwrap(obj), "__code__", None) if callable(obj) else None
    return code is not None and not names.isdisjoint(_global_names(code))


def needs_postgres(item: pytest.Item) -> bool:
    """Whether ``item`` runs against the PostgreSQL server.

    True when a parameter of it is the ``"postgres"`` backend (the contract suite), or when
    the test function or any fixture it uses names ``require_postgres`` or ``PG_DSN``.
    """
    callspec = getattr(item, "callspec", None)
    if callspec is not None and _POSTGRES_PARAM in callspec.params.values():
        return True
    if _refers_to(getattr(item, "function", None), _POSTGRES_NAMES):
        return True
    fixture_info = getattr(item, "_fixtureinfo", None)
    defs = fixture_info.name2fixturedefs if fixture_info is not None else {}
    return any(_refers_to(d.func, _POSTGRES_NAMES) for ds in defs.values() for d in ds)


@pytest.hookimpl(tryfirst=True)  # before -m deselects by mark
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if needs_postgres(item):
            item.add_marker(pytest.mark.postgres)


def native_extension(name: str) -> types.ModuleType:
    """``idemcrawl.<name>``, one of the C extensions; outside CI a checkout built without a C
    compiler skips the test (CI never does: there the extension must be built)."""
    from .frontier.conftest import in_ci

    try:
        return importlib.import_module(f"idemcrawl.{name}")
    except ImportError:
        if in_ci():
            raise
        pytest.skip(f"idemcrawl.{name} was not built (no C compiler?)")
