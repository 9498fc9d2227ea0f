"""The discovery gate's known-URL cache: exact, bounded, and only fed committed URLs."""

from __future__ import annotations

import dataclasses

import pytest

from idemcrawl.discovery import KnownURLs
from idemcrawl.frontier.base import NewURL

H = "http://h.test"


def links(*paths: str) -> list[str]:
    return [f"{H}{p}" for p in paths]


def test_only_committed_urls_are_dropped() -> None:
    known = KnownURLs()
    assert known.unknown(links("/a", "/b")) == [0, 1]
    known.add_committed([f"{H}/a"])
    assert known.unknown(links("/a", "/b", "/a")) == [1]  # indexes of the unknown, in order
    assert f"{H}/a" in known and f"{H}/b" not in known


def test_memory_is_bounded_by_two_generations() -> None:
    known = KnownURLs(cap=10)
    known.add_committed(f"{H}/{i}" for i in range(6))  # over half: becomes the old generation
    assert len(known) == 6 and f"{H}/0" in known
    known.add_committed(f"{H}/{i}" for i in range(6, 12))  # rotates again: 0..5 forgotten
    assert f"{H}/0" not in known and f"{H}/11" in known and len(known) == 6
    assert known.unknown(links("/0", "/11")) == [0]  # a miss just inserts again


def test_cap_must_hold_something() -> None:
    with pytest.raises(ValueError, match="at least 2"):
        KnownURLs(cap=1)


def test_a_new_url_is_a_value_equal_and_hashable_by_its_fields() -> None:
    a, b = (
        NewURL("http://a.test/x", "a.test", depth=1),
        NewURL("http://a.test/x", "a.test", depth=1),
    )
    assert a == b and hash(a) == hash(b) and len({a, b}) == 1
    assert dataclasses.replace(a, hops=1) != a
