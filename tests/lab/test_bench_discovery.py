"""`bench discovery` on a small run: the Bloom filter saves look-ups, nothing is lost."""

from __future__ import annotations

from idemcrawl.lab.bench.discovery import run_discovery_bench


def test_discovery_bench_counts() -> None:
    r = run_discovery_bench(n=3000, repeat_fraction=0.4, seed=3, batch=200)
    assert r.inserted == 1800  # every distinct link stored once, whichever path
    assert r.lookups_without_bloom == 3000
    assert r.lookups_with_bloom < 3000 * 0.5  # only repeats (+ rare false positives) looked up
    assert r.with_bloom_per_s > 0 and r.without_bloom_per_s > 0
