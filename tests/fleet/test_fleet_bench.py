"""``bench frontier --partitions``: a partitioned crawl's grant rate and server CPU per grant."""

from __future__ import annotations

import pytest

from idemcrawl.lab.bench.fleet import run_fleet_bench
from idemcrawl.lab.pgserver import find_bin_dir

from ..frontier.conftest import in_ci
from ..helpers import run_cli


@pytest.mark.slow
def test_the_fleet_bench_measures_every_partition() -> None:
    if find_bin_dir() is None:
        if in_ci():
            pytest.fail("CI must run the fleet tests: no PostgreSQL server binaries", pytrace=False)
        pytest.skip("no PostgreSQL server binaries (initdb, pg_ctl) on this machine")
    r = run_fleet_bench(3, 2, hosts=60, urls_per_host=5, completions=300)
    assert r.completions == 300 and r.grants >= 300
    assert r.min_grants_per_partition > 0  # every partition granted
    assert r.grants_per_s > 0 and r.completions_per_s > 0
    # Local servers: their backends' CPU is readable and attributed to the calls.
    assert r.server_cpu_ms_per_1000_grants is not None and r.server_cpu_ms_per_1000_grants > 0
    assert r.server_cpu_ms_per_1000_completions is not None


def test_more_servers_than_partitions_is_refused() -> None:
    res = run_cli("bench", "frontier", "--partitions", "2", "--servers", "3", "--json")
    assert res.returncode == 2 and "--servers" in res.stderr
    assert res.stdout == ""
