"""A partitioned crawl where every host but the seed's is found through links from other
partitions, run by ``crawl`` processes while one is SIGKILLed, a server crashes (``pg_ctl
stop -m immediate`` on a durable server) and a member joins late (``lab/fleet_chaos.py``, the
small shape of ``idemcrawl chaos --fleet``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from idemcrawl.lab.fleet_chaos import FleetChaosOptions, run_fleet_chaos
from idemcrawl.lab.pgserver import find_bin_dir
from idemcrawl.lab.testsite.multihost import HostSpec, cross_host_links

from ..frontier.conftest import in_ci


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"outage": "reboot"}, "--outage must be one of"),
        ({"servers": 1, "outage_server": 1}, "--outage-server must be 0..0"),
        ({"kills": 5, "members": 4}, "--kills must be between 0 and --members"),
        ({"durable": False}, "a server crash needs durable servers"),
        ({"partitions": 2, "servers": 3}, "--partitions must be at least --servers"),
    ],
)
def test_bad_options_are_refused_before_any_server_starts(
    kw: dict[str, object], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from idemcrawl.cli import main

    with pytest.raises(ValueError, match=message):
        FleetChaosOptions(**kw)  # type: ignore[arg-type]
    assert main(["chaos", "--fleet", "--kills", "9"]) == 2
    assert "--kills must be between" in capsys.readouterr().err


def test_cross_host_links_reach_every_host_from_one_seed() -> None:
    bases = [f"http://127.0.0.1:{9000 + i}" for i in range(7)]
    specs = [HostSpec(f"h{i}", pages=3 + i % 2) for i in range(7)]
    seen, todo = set(), [(0, 0)]
    while todo:
        i, n = todo.pop()
        if (i, n) in seen:
            continue
        seen.add((i, n))
        todo += [(i, (n + k) % specs[i].pages) for k in (1, 2, 3)]
        for url in cross_host_links(bases, specs, i, n):
            base, _, page = url.rpartition("/p/")
            todo.append((bases.index(base), int(page)))
    assert seen == {(i, n) for i, s in enumerate(specs) for n in range(s.pages)}
    assert cross_host_links(bases[:1], specs[:1], 0, 0) == []


@pytest.mark.slow
def test_one_seed_crawl_across_partitions_survives_kills_and_a_server_crash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if find_bin_dir() is None:
        if in_ci():
            pytest.fail("CI must run the fleet tests: no PostgreSQL server binaries", pytrace=False)
        pytest.skip("no PostgreSQL server binaries (initdb, pg_ctl) on this machine")
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # the crawls' owner slots: none left in /tmp
    opts = FleetChaosOptions(
        partitions=6, hosts=8, pages=5, members=3, kills=1, kill_at=1.5,
        outage="crash", outage_server=0, outage_at=2.5, outage_seconds=4.0, late_join_at=4.0,
        crawl_delay=0.4, crawl_delay_every=3, concurrency=3, scope="any", timeout=240,
    )  # fmt: skip
    report = run_fleet_chaos(opts, workdir=tmp_path)
    # The server that held partition 0 and the members table crashed and came back.
    assert [t for _, t in report.timeline if "crashed" in t] == ["server 0 crashed"]
    assert report.exit_codes == [0, 0, 0, 0], report.as_dict()
    assert report.rerun_exit_code == 0 and report.rerun_requests == 0
    assert report.politeness_violations == 0, report.violations_summary
    assert report.records_by_server == [report.pages] * 3
    assert report.records_correct_through_every_server
    assert report.events == report.distinct_event_keys == report.done_pages == report.pages
    assert report.outbox_rows_left == 0 and report.overlapping_terms == 0
    assert report.pages_fetched_more_than_once <= report.allowed_refetches
    assert report.ok
