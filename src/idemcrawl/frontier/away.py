"""A database server that is away: how opening a crawl waits for it.

A server that refuses connections or is going down or coming up (a restart, a crash's
recovery) is waited for, with a growing pause, up to a deadline; one that answers no (a wrong
password or database) is not. ``open_frontier`` (a starting crawl, ``--db-wait``) and a fleet's
partition opening wait this way; below both, so neither imports the other for it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from .base import FrontierError

T = TypeVar("T")

#: SQLSTATEs of a server going down or coming up (57P01-57P03), and None: no answer at all.
_AWAY_STATES = frozenset({None, "57P01", "57P02", "57P03"})


def retry_while_away(
    attempt: Callable[[], T],
    deadline: float,
    waiting: Callable[[FrontierError], None] | None = None,
) -> T:
    """``attempt()`` again, with a growing pause (0.25 s to 2 s), while it fails because a
    database server is away (:func:`server_away`) and ``deadline`` (monotonic) allows;
    ``waiting`` hears the first such failure, once. Anything else is raised at once: opening
    a crawl (``open_frontier``) and opening a fleet's partitions both wait this way."""
    pause = 0.25
    while True:
        try:
            return attempt()
        except FrontierError as exc:
            if not server_away(exc) or time.monotonic() + pause > deadline:
                raise
            if waiting is not None and pause == 0.25:
                waiting(exc)
        time.sleep(pause)
        pause = min(pause * 2, 2.0)


def server_away(exc: BaseException) -> bool:
    """A server that did not accept the connection (refused, unreachable) or is going down or
    coming up (PostgreSQL's 57P01-57P03: shut down, crashed, "starting up" / "in recovery"),
    as opposed to one that answered no (any other SQLSTATE: a password, a database)."""
    cause = exc.__cause__
    if cause is None or type(cause).__module__.split(".")[0] != "psycopg":
        return False
    import psycopg

    return isinstance(cause, psycopg.OperationalError) and cause.sqlstate in _AWAY_STATES
