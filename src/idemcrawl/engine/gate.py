"""The discovery gate as a crawl process keeps it: filter links, rebuild, save its counts.

:class:`~idemcrawl.discovery.DiscoveryGate` is the policy (Bloom filter of known URLs in front of
the template-growth limits, R10/R17). Here is its life in the engine: built at start-up from the
frontier, rebuilt bigger when its Bloom filter saturates, and its template counts saved in the
crawl's meta table every ten seconds and at the end, so that a restart resumes them.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import partial

from ..discovery import META_KEY, DiscoveryGate, KnownURLs
from ..frontier.base import Completion, Frontier, NewURL
from ..parse import LinkColumns
from ..traps import TrapLimits
from .calls import Call
from .clock import Clock
from .warmup import CHUNK, fill_bloom

#: Seconds between saves of the template counts (after a commit).
SAVE_EVERY = 10.0


@dataclass(slots=True)
class Gated:
    """A page's links after the gate: refused ones stay in ``links`` as ``rejected``."""

    links: list[NewURL]
    refused: dict[str, int]
    #: Templates this page's links paused.
    paused: int
    #: Links dropped because their URLs are known to be committed in the frontier already.
    known: int = 0


def load_gate(frontier: Frontier, limits: TrapLimits, *, warm: bool = True) -> DiscoveryGate:
    """A gate with the template counts the last run saved; its Bloom filter of known URLs is
    filled by ``warmup.py`` in the background (``warm=False``) or here (``warm=True``)."""
    gate = DiscoveryGate(limits)
    gate.restore(frontier.get_meta(META_KEY))
    if warm:
        for chunk in known_url_chunks(frontier):
            gate.bloom.add_many(chunk)
    else:
        gate.bloom.warming = True
    return gate


def known_url_chunks(frontier: Frontier, chunk: int = CHUNK) -> Iterator[list[str]]:
    """Every known URL, a page at a time (keyset by id)."""
    after = 0
    while rows := frontier.known_urls(after, chunk):
        after = rows[-1][0]
        yield [u for _, u in rows]


class LinkGate:
    """The discovery gate with the crawl process's cache of committed URLs in front of it.

    Most links a site has are links to pages the frontier has had for a while (~95 % of the
    benchmark's); each would cost a trip through the gate and a row in the completion's
    insert-if-absent that changes nothing. :meth:`remember` learns the links of every accepted
    completion once its transaction has committed, and :meth:`filter` drops links it knows.
    """

    def __init__(self, gate: DiscoveryGate, frontier: Frontier, call: Call, clock: Clock) -> None:
        self.gate = gate
        self.known = KnownURLs()
        self._frontier = frontier
        self._call = call
        self._clock = clock
        self._next_save = 0.0
        self._rebuilding = False

    async def filter(self, links: LinkColumns) -> Gated:
        """The page's links the frontier may not have yet, through the discovery gate; a known
        one is dropped on its URL string, before any object is built for it."""
        keep = self.known.unknown(links.urls)
        known = len(links) - len(keep)
        gate = self.gate
        pauses = gate.gate.pauses
        out, refused = gate.filter(links.pick(keep))
        paused = gate.gate.pauses - pauses
        if gate.needs_rebuild and not self._rebuilding:
            self._rebuilding = True
            try:
                await self._rebuild()
            finally:
                self._rebuilding = False
        return Gated(out, refused, paused, known)

    def remember(self, completions: Sequence[Completion], accepted: Sequence[bool]) -> None:
        """The links of the accepted completions are in the frontier now (inserted, or known
        before): their transaction has committed. A rejected completion inserted nothing."""
        self.known.add_committed(
            u.url for c, ok in zip(completions, accepted, strict=True) if ok for u in c.links
        )

    async def _rebuild(self) -> None:
        """A bigger Bloom filter from the frontier's URLs; the template counts carry over.

        Filled a page at a time on the frontier's thread; the current gate keeps filtering
        meanwhile, and the new one replaces it once whole."""
        old = self.gate
        gate = DiscoveryGate(old.limits, expected_urls=2 * old.bloom.expected_items)
        read = partial(self._call, self._frontier.known_urls)
        await fill_bloom(gate.bloom, read, 0, key=lambda row: row[0])
        gate.restore(self.gate.snapshot())
        self.gate = gate

    async def save(self) -> None:
        await self._call(self._frontier.set_meta, META_KEY, self.gate.snapshot())

    async def save_now_and_then(self) -> None:
        """Save at most every SAVE_EVERY seconds: a kill loses at most that much counting."""
        now = self._clock.monotonic()
        if now >= self._next_save:
            self._next_save = now + SAVE_EVERY
            await self.save()
