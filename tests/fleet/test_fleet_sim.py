"""The fleet simulation (in memory, virtual time): members crash, restart, pause past their
TTL and join late; ownership stays single, nothing is granted under a stale epoch, and dead
members' partitions are owned again within the TTL. The one-seed shape: every page but the
seed is found through links from other partitions while servers crash; all of them end done,
once each, with no outbox row left."""

from __future__ import annotations

import pytest

from idemcrawl.cli import main as cli_main
from idemcrawl.frontier.memory import MemoryFrontier
from idemcrawl.lab import fleet_sim
from idemcrawl.lab.fleet_sim import FleetSimOptions, run_fleet_sim

from ..helpers import run_cli

SMALL = FleetSimOptions(
    members=12, partitions=48, seconds=300, crashes=3, pauses=2, late_joiners=2, seed=3,
    urls_per_host=20,
)  # fmt: skip


def test_a_small_fleet_keeps_single_ownership_through_crashes_and_pauses() -> None:
    r = run_fleet_sim(SMALL)
    assert r.ok, r.as_dict()
    assert r.double_grants == 0 and r.overlapping_terms == 0 and r.unowned_at_end == 0
    assert 0 < r.completed <= r.grants  # work went on throughout
    assert r.takeovers > 0  # crashed members' partitions were taken over ...
    assert r.max_reown_after_crash_s is not None
    assert r.max_reown_after_crash_s <= SMALL.ttl + SMALL.tick_every  # ... within the TTL
    assert r.stale_refusals > 0  # paused members woke up and were refused


ONE_SEED = FleetSimOptions(
    members=8, partitions=24, seconds=400, crashes=2, pauses=1, late_joiners=1, seed=5,
    urls_per_host=8, one_seed=True, servers=3, server_crashes=2, server_downtime=25,
)  # fmt: skip


def test_one_seed_is_crawled_whole_across_partitions_while_servers_crash() -> None:
    r = run_fleet_sim(ONE_SEED)
    assert r.ok, r.as_dict()
    assert r.reachable == r.done_at_end == 24 * 4 * 8
    assert r.completed_twice == 0 and r.outbox_left == 0
    assert r.double_grants == 0 and r.overlapping_terms == 0 and r.unowned_at_end == 0
    # the one seed is the only URL added directly: every other page came through links
    assert r.urls == r.reachable and r.grants >= r.reachable


def test_the_one_seed_check_catches_links_that_never_reach_their_partition(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = fleet_sim._Web.links

    def local_only(self, url):  # type: ignore[no-untyped-def]
        p = self.where(url)[0] % self.partitions
        return [(q, u) for q, u in real(self, url) if q == p]

    monkeypatch.setattr(fleet_sim._Web, "links", local_only)
    r = run_fleet_sim(ONE_SEED)
    assert r.done_at_end is not None and r.reachable is not None
    assert r.done_at_end < r.reachable and not r.ok


def test_the_double_grant_check_catches_a_frontier_that_ignores_fences(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = MemoryFrontier.lease

    def unfenced(self, owner, limit, now, lease_seconds, policy, fence=None):  # type: ignore[no-untyped-def]
        return real(self, owner, limit, now, lease_seconds, policy, None)

    monkeypatch.setattr(MemoryFrontier, "lease", unfenced)
    r = run_fleet_sim(SMALL)
    assert r.double_grants > 0 and not r.ok


def test_bad_options_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ValueError, match="ttl"):
        FleetSimOptions(ttl=1, tick_every=2)
    assert cli_main(["sim", "--fleet", "--members", "2", "--crashes", "5"]) == 2
    assert "more crashes" in capsys.readouterr().err


def test_the_command_runs_and_reports() -> None:
    res = run_cli(
        "sim", "--fleet", "--members", "4", "--partitions", "8", "--seconds", "120",
        "--crashes", "1", "--pauses", "1", "--late-joiners", "1", "--json",
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert '"double_grants": 0' in res.stdout
    res = run_cli(
        "sim", "--fleet", "--members", "4", "--partitions", "8", "--seconds", "200",
        "--crashes", "1", "--pauses", "1", "--late-joiners", "1", "--one-seed",
        "--servers", "2", "--server-crashes", "1", "--server-downtime", "20",
        "--urls-per-host", "5", "--json",
    )  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr
    assert '"outbox_left": 0' in res.stdout and '"completed_twice": 0' in res.stdout
