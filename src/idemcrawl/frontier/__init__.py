"""Frontier backends behind one contract (see ``base.py`` for the invariants)."""

from __future__ import annotations

from .base import Frontier, FrontierError
from .sqlite import SQLiteFrontier


def open_frontier(db: str, *, create: bool = True) -> Frontier:
    """Open the crawl database named by ``db``: a file path (SQLite) or a server URL."""
    if db.startswith(("postgresql://", "postgres://")):
        raise FrontierError("the PostgreSQL frontier is not available in this version")
    return SQLiteFrontier(db, create=create)


__all__ = ["Frontier", "FrontierError", "SQLiteFrontier", "open_frontier"]
