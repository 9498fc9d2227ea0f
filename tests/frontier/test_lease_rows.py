"""``scheduler.lease_from_row`` builds a Lease without the frozen dataclass's ``__init__``:
the result must be the very Lease the constructor makes, and as immutable."""

from __future__ import annotations

import dataclasses
import pickle

import pytest

from idemcrawl.frontier.base import Lease
from idemcrawl.frontier.scheduler import lease_from_row


def test_a_lease_from_a_row_is_the_constructors_lease() -> None:
    row = (5, "http://a/x", 2, 1, 0, 3.0, "page", "e", "lm", "h", 200, 60.0, None)
    got = lease_from_row(row, "http://a", 77, "w", 9.0, "page", 1.5)
    want = Lease(5, "http://a/x", "http://a", 2, 77, "w", 9.0, 1, 0, "page", 3.0, "e", "lm",
                 "h", 200, 60.0, 0, 1.5, None)  # fmt: skip
    assert type(got) is Lease
    assert got == want and hash(got) == hash(want) and repr(got) == repr(want)
    assert {got: 1}[want] == 1
    with pytest.raises(dataclasses.FrozenInstanceError):
        got.url = "http://a/y"  # type: ignore[misc]
    assert pickle.loads(pickle.dumps(got)) == want
    assert dataclasses.replace(got, token=1) == dataclasses.replace(want, token=1)
    robots = lease_from_row(row, "http://a", 1, "w", 9.0, "robots")
    assert (robots.kind, robots.start_at) == ("robots", 0.0)
