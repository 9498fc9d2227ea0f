"""What a crawl says when it ends: links it left out of its scope are counted and the way to
follow them named (a one-seed crawl of linked hosts must not end quietly with one host)."""

from __future__ import annotations

from pathlib import Path

from idemcrawl.engine.summary import CrawlSummary
from idemcrawl.lab.testsite.multihost import HostSpec, MultiHostServer

from ..helpers import run_cli


def test_scope_lines_name_the_count_and_the_flag() -> None:
    assert CrawlSummary().scope_lines("host") == []
    s = CrawlSummary(links_rejected={"out_of_scope": 7, "trap": 2})
    (line,) = s.scope_lines("host")
    assert "7 not followed" in line and "--scope host keeps to the seeds' hosts" in line
    assert "--scope any" in line
    assert "the seeds' sites" in s.scope_lines("domain")[0]
    assert "allowed_domains" in s.scope_lines("any")[0]


def test_a_one_seed_crawl_of_linked_hosts_says_what_it_left_out(tmp_path: Path) -> None:
    specs = [HostSpec("a", pages=3), HostSpec("b", pages=3)]
    with MultiHostServer(specs, cross_links=True) as site:
        args = ["crawl", site.seed_urls[0], "--db", str(tmp_path / "c.db"),
                "--allow-private", "127.0.0.1", "--delay", "0", "--no-warc"]  # fmt: skip
        res = run_cli(*args)
        assert res.returncode == 0, res.stderr
        assert "links out of scope:" in res.stdout and "--scope any" in res.stdout
        wide = run_cli(*args[:3], str(tmp_path / "any.db"), *args[4:], "--scope", "any")
        assert wide.returncode == 0, wide.stderr
        assert "links out of scope" not in wide.stdout
        hosts = {e["host"] for e in site.request_log()}
        assert hosts == set(site.base_urls)  # with --scope any both hosts were crawled
