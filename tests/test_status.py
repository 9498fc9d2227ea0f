"""``idemcrawl.status``: the dictionary behind ``status``, ``status --json`` and the dashboard,
and its text lines."""

from __future__ import annotations

from pathlib import Path

import pytest

from idemcrawl.frontier import FrontierError, SQLiteFrontier
from idemcrawl.frontier.base import Failure, HostPolicy, NewURL
from idemcrawl.status import HOSTS_SHOWN, status_dict, status_lines

KEYS = {
    "db",
    "urls",
    "urls_total",
    "hosts",
    "records",
    "events",
    "requests",
    "requests_per_record",
    "fetch_errors",
    "lease_expiries",
    "leases_reclaimed",
    "completions_rejected",
    "links_rejected",
    "robots_fetches",
    "robots_disallowed",
    "urls_deferred",
    "host_backoffs",
    "breaker_trips",
    "politeness",
    "aggregates",
    "counters",
    "failure_reasons",
    "hosts_in_backoff",
    "host_states",
    "group_commit",
}


def _crawl_db(path: Path, hosts: int) -> str:
    f = SQLiteFrontier(str(path))
    try:
        urls = [
            NewURL(f"http://h{i:02d}.example/p{j}", f"http://h{i:02d}.example")
            for i in range(hosts)
            for j in range(2)
        ]
        f.add_seeds({u.host_key for u in urls})
        f.add(urls, 1.0)
    finally:
        f.close()
    return str(path)


def test_status_dict_keys_and_counts(tmp_path: Path) -> None:
    db = _crawl_db(tmp_path / "c.db", hosts=3)
    d = status_dict(db)
    assert set(d) == KEYS
    assert d["db"] == db
    assert d["urls"]["queued"] == 6 and d["urls_total"] == 6 and d["hosts"] == 3
    assert d["records"] == 0 and d["requests"] == 0 and d["requests_per_record"] is None
    assert [h["host_key"] for h in d["host_states"]] == [
        "http://h00.example",
        "http://h01.example",
        "http://h02.example",
    ]
    assert d["politeness"]["violations"] == 0 and d["hosts_in_backoff"] == 0
    assert d["links_rejected"] == {}
    assert set(d["group_commit"]) == {"max_completions", "linger_seconds"}
    assert d["failure_reasons"] == []


def test_status_dict_from_an_open_frontier_leaves_it_open(tmp_path: Path) -> None:
    db = _crawl_db(tmp_path / "c.db", hosts=2)
    f = SQLiteFrontier(db)
    try:
        from_frontier = status_dict(f, db)
        assert status_dict(f)["db"] is None  # no name given for an open frontier
        assert f.stats().urls_by_state["queued"] == 4  # still open and usable
    finally:
        f.close()
    assert from_frontier == status_dict(db)


def test_status_of_a_missing_database_is_a_frontier_error(tmp_path: Path) -> None:
    with pytest.raises(FrontierError, match="no crawl database"):
        status_dict(str(tmp_path / "none.db"))
    assert not (tmp_path / "none.db").exists()  # read-only: nothing was created


def test_status_lines(tmp_path: Path) -> None:
    db = _crawl_db(tmp_path / "c.db", hosts=HOSTS_SHOWN + 5)
    lines = status_lines(status_dict(db))
    assert lines[0] == f"crawl database   {db}"
    assert lines[1].startswith("urls             queued 50,") and lines[1].endswith("(total 50)")
    assert "links refused    none" in lines
    host_lines = [ln for ln in lines if ln.startswith("  http://h")]
    assert len(host_lines) == HOSTS_SHOWN
    assert host_lines[0].split()[:3] == ["http://h00.example", "queued", "2"]
    assert "  … 5 more hosts (status --json lists all)" in lines
    assert lines[-1].startswith("group commit     <= ")
    assert all("\n" not in ln for ln in lines)


def test_status_shows_why_urls_failed(tmp_path: Path) -> None:
    db = _crawl_db(tmp_path / "c.db", hosts=1)
    f = SQLiteFrontier(db)
    try:
        a, b = f.lease("w", 2, 2.0, 30, HostPolicy(max_in_flight=2, delay=0.0))
        trace = 'File "spider.py", line 9, in parse_item\n  price = data["price"]'
        boom = "parse error: KeyError: 'price'"
        f.fail(
            [Failure(a, boom, None, 200, trace=trace), Failure(b, boom, None, 200)],
            3.0,
            HostPolicy(),
        )
    finally:
        f.close()
    d = status_dict(db)
    assert [(r["reason"], r["urls"]) for r in d["failure_reasons"]] == [(boom, 2)]
    lines = status_lines(d)
    at = lines.index("failed URLs      2 (failed for good; by reason, most URLs first):")
    assert lines[at + 1 : at + 5] == [
        f"        2  {boom}",
        f"           first: {a.url}",
        '             File "spider.py", line 9, in parse_item',
        '               price = data["price"]',
    ]
