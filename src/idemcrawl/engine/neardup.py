"""Near-duplicate groups (R11): which earlier page a page's SimHash says it nearly repeats.

Each group is named by its first page (the root), so a chain of pages that each differ a little
from the previous still forms one group. The index is the permuted-table SimHash index
(:class:`~idemcrawl.dedup.SimHashIndex`), rebuilt at start from the frontier, never a scan.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from ..dedup import SimHashIndex


class NearDuplicates:
    """The index and the group roots; filled in the background at start (``warmup.py``), and
    a page asking for its group waits until it is complete (:meth:`group_when_ready`)."""

    def __init__(self, distance: int, *, ready: bool = True) -> None:
        self.distance = distance
        self._index = SimHashIndex(3)
        self._root: dict[int, int] = {}
        self._ready = asyncio.Event()
        if ready:
            self._ready.set()

    def mark_ready(self) -> None:
        self._ready.set()

    async def group_when_ready(self, url_id: int, fp: int | None) -> int | None:
        """:meth:`group` once the index holds every page the frontier knows."""
        if fp is not None and not self._ready.is_set():
            await self._ready.wait()
        return self.group(url_id, fp)

    def load(self, rows: Iterable[tuple[int, int, int | None]]) -> None:
        """``(url_id, simhash, near_dup_of)`` rows as the frontier keeps them."""
        for url_id, fp, near in rows:
            self._index.add(fp, url_id)
            self._root[url_id] = near if near is not None else url_id

    def group(self, url_id: int, fp: int | None) -> int | None:
        """The group root this page joins, or None; a page seen for the first time is added."""
        if fp is None:
            return None
        # A recrawled page finds itself at distance 0: it is never its own match.
        nearest = self._index.nearest(fp, self.distance, exclude=url_id)
        match = None if nearest is None else nearest[0]
        root = None if match is None else self._root.get(match, match)
        if url_id not in self._root:
            self._index.add(fp, url_id)
            self._root[url_id] = root if root is not None else url_id
        return root
