"""The warm-up: what start-up used to load first is filled while the crawl runs (``warmup.py``)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from idemcrawl.dedup import BloomNegativeCache
from idemcrawl.discovery import DiscoveryGate
from idemcrawl.engine.calls import inline
from idemcrawl.engine.neardup import NearDuplicates
from idemcrawl.engine.warmup import Warmup
from idemcrawl.frontier.base import Completion, HostPolicy, NewURL
from idemcrawl.frontier.sqlite import SQLiteFrontier
from idemcrawl.parse import LinkColumns
from idemcrawl.traps import TrapLimits

T0 = 1_000_000.0
HOST = "http://shop.test"


def test_a_page_waits_for_its_group_until_the_index_is_whole() -> None:
    async def go() -> list[object]:
        near = NearDuplicates(3, ready=False)
        seen: list[object] = []
        assert await near.group_when_ready(9, None) is None  # no SimHash: nothing to wait for
        waiting = asyncio.create_task(near.group_when_ready(2, 0xF0F1))
        await asyncio.sleep(0.01)
        seen.append(waiting.done())
        near.load([(1, 0xF0F0, None)])  # the warm-up's page of rows
        near.mark_ready()
        seen.append(await waiting)
        return seen

    assert asyncio.run(go()) == [False, 1]


def test_warmup_fills_everything_a_page_at_a_time(tmp_path: Path) -> None:
    frontier = SQLiteFrontier(str(tmp_path / "f.db"))
    try:
        frontier.add([NewURL(f"{HOST}/p{i}", HOST) for i in range(9)], T0)
        policy = HostPolicy(max_in_flight=10, delay=0.0)
        leases = frontier.lease("w", 5, T0, 60, policy)
        frontier.complete(
            [
                Completion(ls, 200, T0, warc_file="f", warc_offset=i, warc_length=1,
                           payload_digest=f"sha1:{i}", stored_body=True, simhash=1 << i)
                for i, ls in enumerate(leases)
            ],
            T0,
            policy,
        )  # fmt: skip
        bodies = BloomNegativeCache(1000)
        bodies.warming = True
        gate = DiscoveryGate(TrapLimits())
        gate.bloom = BloomNegativeCache(2)  # 9 URLs outgrow it twice: 2 -> 8 -> 32
        gate.bloom.warming = True
        near = NearDuplicates(3, ready=False)
        warmup = Warmup(frontier, inline, near=near, gate=gate, bodies=bodies, chunk=2)

        # While warming, every link is "maybe known": none is counted against its template.
        out, _ = gate.filter([NewURL(f"{HOST}/new", HOST)])
        assert gate.lookups_saved == 0 and out[0].url == f"{HOST}/new"

        asyncio.run(warmup.run())
        # SimHashes, digests, then URLs: 4 read into the filter sized 2 (over 2.2 after two
        # pages), all 9 into the one sized 8 (over 8.8 at the last page), 9 into the one sized 32.
        assert gate.bloom.expected_items == 32
        assert warmup.rows == 5 + 5 + 4 + 9 + 9
        assert all(bodies.might_contain(f"sha1:{i}") for i in range(5))
        assert not bodies.might_contain("sha1:nope")
        assert all(gate.bloom.might_contain(f"{HOST}/p{i}") for i in range(9))
        assert near.group(999, 1 << 3) == leases[3].url_id
        gate.filter([NewURL(f"{HOST}/new", HOST)])
        assert gate.lookups_saved == 1  # whole now: a new link is known to be new
    finally:
        frontier.close()


def test_a_saturated_gate_is_rebuilt_bigger_from_the_frontier(tmp_path: Path) -> None:
    from idemcrawl.engine.clock import SystemClock
    from idemcrawl.engine.gate import LinkGate

    frontier = SQLiteFrontier(str(tmp_path / "f.db"))
    try:
        frontier.add([NewURL(f"{HOST}/k{i}", HOST) for i in range(30)], T0)
        gate = DiscoveryGate(TrapLimits())
        gate.bloom = BloomNegativeCache(10)  # saturates after 11 definitely-new links
        link_gate = LinkGate(gate, frontier, inline, SystemClock())
        fresh = [NewURL(f"{HOST}/new{i}", HOST) for i in range(20)]
        asyncio.run(link_gate.filter(LinkColumns.of(fresh)))
        rebuilt = link_gate.gate
        assert rebuilt is not gate and rebuilt.bloom.expected_items >= 100_000
        assert all(rebuilt.bloom.might_contain(f"{HOST}/k{i}") for i in range(30))
        assert rebuilt.snapshot() == gate.snapshot()  # template counts carried over
    finally:
        frontier.close()
