"""The politeness formulas (``idemcrawl.politeness``): the latency-adaptive gap and allowance."""

from __future__ import annotations

import pytest

from idemcrawl.frontier.base import HostPolicy
from idemcrawl.politeness import allowance, effective_delay

ADAPTIVE = HostPolicy(latency_factor=2.0, max_adaptive_delay=60.0)


def test_adaptive_gap_is_factor_times_latency_over_allowance() -> None:
    assert effective_delay(0.0, None, 30.0, 0.010, ADAPTIVE, allowance=1) == pytest.approx(0.020)
    assert effective_delay(0.0, None, 30.0, 0.010, ADAPTIVE, allowance=8) == pytest.approx(0.0025)


def test_a_slow_host_is_still_slowed_down() -> None:
    # 1 s answers with 8 allowed: a start every 0.25 s (4/s), not the 8/s eight slots allow.
    assert effective_delay(0.0, None, 30.0, 1.0, ADAPTIVE, allowance=8) == pytest.approx(0.25)
    # An erring host has its allowance halved per error, and the gap grows with it.
    halved = allowance(8, 1)
    assert halved == 4
    assert effective_delay(0.0, None, 30.0, 1.0, ADAPTIVE, allowance=halved) == pytest.approx(0.5)


FAST = HostPolicy(latency_factor=2.0, fast_latency=0.1, max_adaptive_delay=60.0)


def test_a_fast_host_adds_no_adaptive_gap() -> None:
    # Answers within fast_latency: the host is not straining; only concurrency limits it.
    assert effective_delay(0.0, None, 30.0, 0.010, FAST, allowance=8) == 0.0
    assert effective_delay(0.0, None, 30.0, 0.100, FAST, allowance=1) == 0.0


def test_only_the_slowness_above_fast_latency_counts() -> None:
    # 1.1 s answers: 1 s of slowness, times 2, over the allowance.
    assert effective_delay(0.0, None, 30.0, 1.1, FAST, allowance=1) == pytest.approx(2.0)
    assert effective_delay(0.0, None, 30.0, 1.1, FAST, allowance=8) == pytest.approx(0.25)
    assert effective_delay(0.0, None, 30.0, 1.1, FAST, allowance=allowance(8, 1)) == (
        pytest.approx(0.5)
    )
    # Continuous at the threshold: just above it, just above zero.
    assert 0 < effective_delay(0.0, None, 30.0, 0.101, FAST, allowance=1) < 0.01


def test_configured_delay_and_crawl_delay_are_floors_and_the_cap_holds() -> None:
    assert effective_delay(1.0, None, 30.0, 0.010, ADAPTIVE, allowance=8) == 1.0
    assert effective_delay(0.0, 5.0, 30.0, 0.010, ADAPTIVE, allowance=8) == 5.0
    assert effective_delay(0.0, 50.0, 30.0, None, ADAPTIVE) == 0.0  # above the cap: not obeyed
    capped = HostPolicy(latency_factor=2.0, max_adaptive_delay=3.0)
    assert effective_delay(0.0, None, 30.0, 100.0, capped, allowance=1) == 3.0
    off = HostPolicy(latency_factor=0.0)
    assert effective_delay(0.0, None, 30.0, 1.0, off, allowance=1) == 0.0
