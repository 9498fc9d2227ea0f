"""The crawl process's link gate: known links are dropped on their URL strings."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

import idemcrawl.parse
from idemcrawl.discovery import DiscoveryGate
from idemcrawl.engine.calls import inline
from idemcrawl.engine.clock import SystemClock
from idemcrawl.engine.gate import LinkGate
from idemcrawl.frontier.base import NewURL
from idemcrawl.frontier.sqlite import SQLiteFrontier
from idemcrawl.parse import LinkColumns
from idemcrawl.traps import TrapLimits

HOST = "http://shop.test"


def test_known_links_are_dropped_before_any_object_is_built(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    frontier = SQLiteFrontier(str(tmp_path / "f.db"))
    try:
        gate = LinkGate(DiscoveryGate(TrapLimits()), frontier, inline, SystemClock())
        known = [f"{HOST}/k{i}" for i in range(38)]
        gate.known.add_committed(known)
        urls = [*known[:19], f"{HOST}/new1", *known[19:], f"{HOST}/new2"]
        page = LinkColumns.of(NewURL(u, HOST, 0, 1) for u in urls)
        built: list[str] = []
        real = idemcrawl.parse.NewURL

        def counting(*args: Any) -> NewURL:
            built.append(args[0])
            return real(*args)

        monkeypatch.setattr(idemcrawl.parse, "NewURL", counting)
        gated = asyncio.run(gate.filter(page))
        assert built == [f"{HOST}/new1", f"{HOST}/new2"]  # none for the 38 known links
        assert gated.links == [real(f"{HOST}/new1", HOST, 0, 1), real(f"{HOST}/new2", HOST, 0, 1)]
        assert gated.known == 38 and len(gated.links) + gated.known == len(page)
    finally:
        frontier.close()
