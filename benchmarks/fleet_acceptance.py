"""Issue 15's acceptance run: a crawl partitioned over three PostgreSQL servers under chaos.

Three throw-away servers (``lab/pgserver.py``), ``idemcrawl db init --partitions 16``, a
multi-host test site, and ``crawl`` processes each given a different server URL of the crawl:
five start together, two are SIGKILLed and restarted, one server is stopped for 10 s and started
again, and a sixth member joins late. Then:

* the site's own request log: zero politeness violations, nothing disallowed fetched, and how
  many pages were fetched more than once (only those in flight at a kill may be);
* the crawl, read through any one server URL: exactly one correct record per page, one event
  per completed URL version;
* the ownership log: terms of a partition never overlap (at most one owner at every moment),
  and the longest time a partition had no unexpired owner between two terms. A SIGKILLed
  member restarted on the same machine takes its owner slot back (``owner.py``), so it resumes
  its own partitions under the same owner id and epoch; the partitions of a member that does not
  come back wait for its ownership TTL (``tests/fleet``, ``idemcrawl sim --fleet``).

    python benchmarks/fleet_acceptance.py [--hosts 16] [--pages 40] [--partitions 16]

Prints a JSON summary; exits 1 when a check fails.
"""

from __future__ import annotations

import argparse
import collections
import itertools
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from idemcrawl.fleet.frontier import PartitionedFrontier
from idemcrawl.frontier import open_frontier
from idemcrawl.lab.pgserver import PgServer
from idemcrawl.lab.politeness_check import Allowance, check_log, summarize
from idemcrawl.lab.testsite.multihost import HostSpec, MultiHostServer

CONCURRENCY = 4


def crawl(seeds: list[str], db: str, cfg: Path, log: Path) -> subprocess.Popen[bytes]:
    cmd = [
        sys.executable, "-m", "idemcrawl", "crawl", *seeds, "--db", db, "--config", str(cfg),
        "--spider", "idemcrawl.lab.testsite.page_spider:PageSpider",
        "--warc-dir", str(cfg.parent / "warc"), "--concurrency", str(CONCURRENCY), "--quiet",
    ]  # fmt: skip
    with log.open("ab") as out:
        return subprocess.Popen(cmd, stdout=out, stderr=out, start_new_session=True)


def ownership_report(log: list[dict[str, Any]]) -> dict[str, Any]:
    """Overlaps between terms (must be 0: at most one owner at every moment) and the longest
    time a partition had no unexpired owner between two terms."""
    by_part: dict[int, list[dict[str, Any]]] = collections.defaultdict(list)
    for t in log:
        by_part[t["partition"]].append(t)
    overlaps = 0
    worst_gap = 0.0
    for terms in by_part.values():
        terms.sort(key=lambda t: t["epoch"])
        for a, b in itertools.pairwise(terms):
            end = a["released_at"] if a["released_at"] is not None else a["expires_at"]
            if b["acquired_at"] < end:
                overlaps += 1
            worst_gap = max(worst_gap, b["acquired_at"] - end)
    return {
        "partitions_logged": len(by_part),
        "terms": len(log),
        "overlapping_terms": overlaps,
        "max_seconds_unowned_between_terms": round(worst_gap, 2),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hosts", type=int, default=16)
    ap.add_argument("--pages", type=int, default=40)
    ap.add_argument("--partitions", type=int, default=16)
    ap.add_argument("--delay", type=float, default=0.25)
    a = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="idemcrawl-fleet-"))
    print(f"work directory (crawl log, WARC files): {work}", file=sys.stderr)
    servers = [PgServer().start() for _ in range(3)]
    result: dict[str, Any] = {}
    try:
        dbs = [f"{s.dsn}?schema=fleet" for s in servers]
        init = subprocess.run(
            [sys.executable, "-m", "idemcrawl", "db", "init", "--partitions", str(a.partitions),
             *(x for d in dbs for x in ("--db", d))],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        print(init.stdout.strip(), file=sys.stderr)
        specs = [HostSpec(f"h{i:02d}", pages=a.pages) for i in range(a.hosts)]
        with MultiHostServer(specs) as site:
            cfg = work / "crawl.toml"
            cfg.write_text(
                f'allow_private = ["127.0.0.1"]\ndelay = {a.delay}\nlease_seconds = 20\n'
                "parse_workers = 0\n"
            )
            logs = work / "crawl.log"
            t0 = time.monotonic()
            timeline: list[tuple[float, str]] = []

            def note(what: str) -> None:
                timeline.append((round(time.monotonic() - t0, 1), what))

            procs = [crawl(site.seed_urls, dbs[i % 3], cfg, logs) for i in range(5)]
            note("5 members started")
            pids_killed: list[int] = []
            time.sleep(5)
            for p in procs[:2]:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
                pids_killed.append(p.pid)
            note("2 members SIGKILLed")
            time.sleep(2)
            # A starting member reads the map from the server it is given, so members that
            # (re)start around the outage are given the servers that stay up; the members
            # already running on server 1 ride the outage out.
            procs[:2] = [crawl(site.seed_urls, dbs[i * 2], cfg, logs) for i in range(2)]
            note("2 members restarted")
            time.sleep(2)
            servers[1].pause()
            note("server 1 stopped")
            resume = threading.Timer(10.0, servers[1].resume)
            resume.start()
            time.sleep(3)
            procs.append(crawl(site.seed_urls, dbs[2], cfg, logs))
            note("late member joined")
            resume.join()
            note("server 1 started again")
            codes = [p.wait(timeout=600) for p in procs]
            note(f"all members exited {codes}")
            log = site.request_log()
            violations = check_log(
                log,
                {base: Allowance(1, a.delay) for base in site.base_urls},
                disallowed_prefixes=site.disallowed_prefixes(),
            )
            expected = {
                f"{base}/p/{n}": f"{spec.name}: page {n}"
                for base, spec in zip(site.base_urls, specs, strict=True)
                for n in range(spec.pages)
            }
        fetched = collections.Counter((e["host"], e["path"]) for e in log)
        f = open_frontier(dbs[0], create=False)
        assert isinstance(f, PartitionedFrontier)
        try:
            records = {r["key"]: json.loads(r["data"])["title"] for r in f.records()}
            events = list(f.iter_events())
            done_pages = sum(
                1 for r in f.iter_urls() if r["state"] == "done" and r["kind"] == "page"
            )
            own = f.ownership_log()
            members = f.members_table.rows()
        finally:
            f.close()
        result = {
            "timeline": timeline,
            "exit_codes": codes,
            "pages": len(expected),
            "requests": len(log),
            "politeness_violations": len(violations),
            "violations_summary": summarize(violations) if violations else "",
            "pages_fetched_more_than_once": sum(1 for n in fetched.values() if n > 1),
            "allowed_refetches (in flight at the kills)": CONCURRENCY * len(pids_killed),
            "records": len(records),
            "records_correct": records == expected,
            "events": len(events),
            "distinct_event_keys": len({(e["url_id"], e["url_version"]) for e in events}),
            "done_pages": done_pages,
            "members_seen": len(members),
            "members": sorted(m["member"] for m in members),
            **ownership_report(own),
        }
    finally:
        for s in servers:
            s.stop()
    print(json.dumps(result, indent=2))
    ok = (
        result.get("politeness_violations") == 0
        and result.get("records_correct") is True
        and result.get("events") == result.get("distinct_event_keys") == result.get("done_pages")
        and result.get("overlapping_terms") == 0
        and result["pages_fetched_more_than_once"] <= CONCURRENCY * 2
        and all(c == 0 for c in result.get("exit_codes", [1]))
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
