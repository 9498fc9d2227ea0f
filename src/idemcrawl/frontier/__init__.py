"""Frontier backends behind one contract (see ``base.py`` for the invariants).

``open_frontier`` picks the backend from the database name: a file path (SQLite, the default),
a ``postgresql://`` URL, or ``memory:`` / ``memory:NAME`` (in this process only, not durable).
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .base import Frontier, FrontierError

if TYPE_CHECKING:
    from .memory import MemoryFrontier
    from .sqlite import SQLiteFrontier
    from .store import SCHEMA_VERSION

#: Backends are imported on first use (PEP 562): ``frontier.base`` (the contract's data types)
#: is what parser processes need, and importing a package runs its ``__init__``.
_LAZY = {"MemoryFrontier": "memory", "SQLiteFrontier": "sqlite", "SCHEMA_VERSION": "store"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def split_schema(dsn: str) -> tuple[str, str | None]:
    """Take idemcrawl's own ``schema=NAME`` query parameter out of a PostgreSQL URL.

    One database can hold several crawls, one schema each (default ``idemcrawl``):
    ``postgresql://host/db?schema=shop``. libpq does not know the parameter, so it is removed
    before connecting.
    """
    from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

    parts = urlsplit(dsn)
    query = parse_qsl(parts.query, keep_blank_values=True)
    schema = next((v for k, v in query if k == "schema"), None)
    rest = [(k, v) for k, v in query if k != "schema"]
    return urlunsplit(parts._replace(query=urlencode(rest))), schema


def open_frontier(
    db: str,
    *,
    create: bool = True,
    wait: float = 0.0,
    say: Callable[[str], None] | None = None,
) -> Frontier:
    """Open the crawl database named by ``db``: a file path (SQLite), a server URL, or
    ``memory:[NAME]`` (handles opened with the same NAME share one crawl while any is open).
    A server URL whose schema holds a partition map (``idemcrawl db init --partitions``) opens
    the whole partitioned crawl (``fleet.frontier.PartitionedFrontier``).

    ``wait``: seconds to keep trying a database server that refuses connections or is still
    starting up (a restart, a crash's recovery), saying so once through ``say``; a crawl
    member started during its server's outage then starts when the server is back instead of
    exiting. Anything else (a wrong address's name, password or database, a schema from a
    newer idemcrawl) fails at once, as does everything with ``wait = 0``."""

    def waiting(exc: FrontierError) -> None:
        if say is not None:
            say(f"waiting up to {wait:g} s for the database server: {exc}")

    from .away import retry_while_away  # on first use: parser processes import this package

    return retry_while_away(lambda: _open(db, create), time.monotonic() + wait, waiting)


def _open(db: str, create: bool) -> Frontier:
    if db.startswith(("postgresql://", "postgres://")):
        # Imported here: psycopg is the optional "postgres" extra (FrontierError if missing,
        # before the fleet layer, which imports it outright).
        from .postgres import PostgresFrontier, require_driver

        require_driver()
        dsn, schema = split_schema(db)
        # A schema holding a partition map is a crawl over several servers (issue 15): the
        # fleet layer routes the same contract over its partitions. Anything else is as before.
        from ..fleet.frontier import open_partitioned

        fleet = open_partitioned(dsn, schema)
        if fleet is not None:
            return fleet  # type: ignore[return-value]
        return PostgresFrontier(dsn, schema=schema, create=create)
    from .memory import MemoryFrontier
    from .sqlite import SQLiteFrontier

    if db.startswith(MemoryFrontier.PREFIX):
        return MemoryFrontier(db[len(MemoryFrontier.PREFIX) :] or None, create=create)
    return SQLiteFrontier(db, create=create)


__all__ = [
    "SCHEMA_VERSION",
    "Frontier",
    "FrontierError",
    "MemoryFrontier",
    "SQLiteFrontier",
    "open_frontier",
    "split_schema",
]
