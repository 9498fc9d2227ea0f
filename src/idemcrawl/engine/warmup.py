"""What a restarted crawl knows of its past, loaded while it already crawls (issue 17).

Three in-memory summaries sit in front of the frontier: the Bloom filter of archived bodies
(body dedup, R11), the SimHash index of near-duplicates (R11) and the discovery gate's Bloom
filter of known URLs (R10). Loading them before the first request made start-up grow with the
crawl: 2.8 s and 142 MB before the first request at 10⁶ URLs with 10⁵ pages done, against 0.46 s
and 56 MB on an empty frontier (``idemcrawl bench startup``). Now the crawl starts at once and
:class:`Warmup` fills them a page of rows at a time on the frontier's thread, in between the
crawl's own calls. Until each is whole it answers conservatively, so nothing is decided wrongly:

* the body filter says "maybe" for every digest (``BloomNegativeCache.warming``): the archiver
  asks the frontier, which knows;
* the gate's filter says "maybe known" for every link: the frontier's unique key decides, and
  links are counted against their URL template only once the filter is whole;
* a page that needs its near-duplicate group waits for the index
  (``NearDuplicates.group_when_ready``), so it joins the group it would have joined before.

Fetching, parsing and committing go on meanwhile; only that one step of a page may wait.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

from ..dedup import BloomNegativeCache
from ..discovery import DiscoveryGate
from ..frontier.base import Frontier
from .calls import Call
from .neardup import NearDuplicates

#: Rows per frontier read: small enough that the crawl's own calls on the same thread wait
#: at most a few tens of milliseconds behind one.
CHUNK = 20_000
#: Bloom filters start sized for this many keys (as before this module) and grow 4x at a time.
MIN_BLOOM = 100_000


def _first(row: tuple[Any, ...]) -> Any:
    return row[0]


async def fill_bloom(
    bloom: BloomNegativeCache,
    read: Callable[[Any, int], Awaitable[list[Any]]],
    start: Any,
    *,
    key: Callable[[Any], Any] | None = None,
    chunk: int = CHUNK,
) -> int:
    """Every key ``read(after, limit)`` pages through, into ``bloom``; then it may say "surely
    not". Rows are keys, or ``(paging key, key)`` pairs with ``key`` giving the paging key. A
    filter the rows outgrow is re-sized four times larger and filled again from the start.
    Returns the rows read."""
    total = 0
    while True:
        after, added, fits = start, 0, True
        while rows := await read(after, chunk):
            after = rows[-1] if key is None else key(rows[-1])
            bloom.add_many(rows if key is None else [r[1] for r in rows])
            added += len(rows)
            total += len(rows)
            if added > 1.1 * bloom.expected_items:
                fits = False
                break
        if fits:
            bloom.warming = False
            return total
        bloom.rebuild([], 4 * bloom.expected_items)


class Warmup:
    def __init__(
        self,
        frontier: Frontier,
        call: Call,
        *,
        near: NearDuplicates,
        gate: DiscoveryGate,
        bodies: BloomNegativeCache | None,
        chunk: int = CHUNK,
    ) -> None:
        self._frontier = frontier
        self._call = call
        self.near = near
        self.gate = gate
        self.bodies = bodies
        self.chunk = chunk
        self.rows = 0

    async def run(self) -> None:
        """The near-duplicate index first (pages may be waiting for it), then the filters.

        Nothing here counts the frontier's rows first (a count is a scan): a filter starts at
        its current size and, when the rows outgrow it, is re-sized four times larger and
        filled again from the start, which reads at most about twice the rows in all.
        """
        f, call = self._frontier, self._call
        after = 0
        while rows := await call(self._load_simhashes, after):
            after = rows
        self.near.mark_ready()
        if self.bodies is not None:
            read = partial(call, f.body_digests)
            self.rows += await fill_bloom(self.bodies, read, "", chunk=self.chunk)
        self.rows += await fill_bloom(
            self.gate.bloom, partial(call, f.known_urls), 0, key=_first, chunk=self.chunk
        )

    def _load_simhashes(self, after: int) -> int:
        """One page into the index, on the frontier's thread; the last id read (0: done)."""
        rows = self._frontier.simhashes(after, self.chunk)
        self.near.load(rows)
        self.rows += len(rows)
        return rows[-1][0] if rows else 0
