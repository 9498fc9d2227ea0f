"""Frontier backends behind one contract (see ``base.py`` for the invariants)."""

from __future__ import annotations

from .base import Frontier, FrontierError
from .sqlite import SQLiteFrontier


def open_frontier(db: str, *, create: bool = True) -> Frontier:
    """Open the crawl database named by ``db``: a file path (SQLite) or a server URL."""
    if db.startswith(("postgresql://", "postgres://")):
        # Imported here: psycopg is the optional "postgres" extra (FrontierError if missing).
        from .postgres import PostgresFrontier

        return PostgresFrontier(db, create=create)
    return SQLiteFrontier(db, create=create)


__all__ = ["Frontier", "FrontierError", "SQLiteFrontier", "open_frontier"]
