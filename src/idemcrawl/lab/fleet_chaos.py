"""``idemcrawl chaos --fleet``: a partitioned crawl run by ``crawl`` processes under faults.

Throw-away PostgreSQL servers (``lab/pgserver.py``), ``db init --partitions P`` over them, a
multi-host test site, and ``crawl`` processes each given a server URL of the crawl. The
faults: members SIGKILLed and restarted, one server stopped for a while (``--outage crash``:
``pg_ctl stop -m immediate``, a crash with recovery at restart; ``stop``: a clean shutdown)
and a member that joins late. The default shape is the hard one for the cross-partition flow:
ONE seed on a cross-linked site (``MultiHostServer(cross_links=True)``), so every other host is
found only through links from pages in other partitions (the completion's outbox and the
forwarder), with servers that keep PostgreSQL's default durability (a crash must not lose
what a client was told was committed). Then:

* every member exits 0, and a ``crawl`` re-run on the finished crawl makes no request;
* the crawl, read through EVERY server URL: exactly one correct record per page, one event per
  completed URL version, every outbox empty;
* the site's own request log: no host over its concurrency, its delay or Crawl-delay kept,
  nothing robots-disallowed fetched, and only pages in flight at a kill fetched twice;
* the ownership log: terms of a partition never overlap.

The report is a dict (``--json``) and ``ok``; the command exits 1 when a check fails.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from idemcrawl.fleet.frontier import PartitionedFrontier
from idemcrawl.frontier import open_frontier
from idemcrawl.lab.fleet_sim import check_terms
from idemcrawl.lab.pgserver import PgServer
from idemcrawl.lab.politeness_check import Allowance, check_log, summarize
from idemcrawl.lab.testsite.multihost import HostSpec, MultiHostServer

SPIDER = "idemcrawl.lab.testsite.page_spider:PageSpider"
OUTAGES = ("crash", "stop", "none")


@dataclass
class FleetChaosOptions:
    servers: int = 3
    partitions: int = 12
    hosts: int = 20
    #: Pages per host; host ``i`` has ``pages + i % 3`` so hosts differ in size.
    pages: int = 20
    #: ``crawl`` processes at the start, each given server ``i mod servers``.
    members: int = 4
    #: Of those, how many are SIGKILLed at ``kill_at`` s and restarted at once.
    kills: int = 2
    kill_at: float = 3.0
    outage: str = "crash"
    #: Which server is crashed or stopped, at ``outage_at`` s, for ``outage_seconds``.
    outage_server: int = 1
    outage_at: float = 5.0
    outage_seconds: float = 8.0
    #: A member joining this many seconds after the start (0: none).
    late_join_at: float = 8.0
    #: One seed on a cross-linked site (the default) or every host's /p/0 on separate hosts.
    one_seed: bool = True
    delay: float = 0.2
    #: Every ``crawl_delay_every``-th host's robots.txt asks for this Crawl-delay.
    crawl_delay: float = 0.5
    crawl_delay_every: int = 4
    concurrency: int = 4
    #: ``--scope`` given to the crawls (None: the crawl's own default).
    scope: str | None = None
    #: Durable servers (PostgreSQL's default fsync and synchronous commit); a crash needs it.
    durable: bool = True
    timeout: float = 600.0

    def __post_init__(self) -> None:
        if self.outage not in OUTAGES:
            raise ValueError(f"--outage must be one of {', '.join(OUTAGES)}")
        if self.servers < 1 or self.partitions < self.servers:
            raise ValueError("--partitions must be at least --servers (and --servers >= 1)")
        if self.members < 1 or not 0 <= self.kills <= self.members:
            raise ValueError("--kills must be between 0 and --members (>= 1)")
        if self.hosts < 2 or self.pages < 1:
            raise ValueError("--hosts must be at least 2 and --pages at least 1")
        if self.outage != "none" and not 0 <= self.outage_server < self.servers:
            raise ValueError(f"--outage-server must be 0..{self.servers - 1}")
        if self.outage == "crash" and not self.durable:
            raise ValueError(
                "a server crash needs durable servers: without synchronous commit a crash "
                "loses commits the crawl was told succeeded"
            )


@dataclass
class FleetChaosReport:
    options: dict[str, Any]
    timeline: list[tuple[float, str]]
    exit_codes: list[int]
    rerun_exit_code: int
    rerun_requests: int
    pages: int
    requests: int
    politeness_violations: int
    violations_summary: str
    pages_fetched_more_than_once: int
    allowed_refetches: int
    records_by_server: list[int]
    records_correct_through_every_server: bool
    events: int
    distinct_event_keys: int
    done_pages: int
    outbox_rows_left: int
    members_seen: int
    ownership_terms: int
    overlapping_terms: int

    @property
    def ok(self) -> bool:
        return (
            all(c == 0 for c in self.exit_codes)
            and self.rerun_exit_code == 0
            and self.rerun_requests == 0
            and self.politeness_violations == 0
            and self.records_correct_through_every_server
            and self.events == self.distinct_event_keys == self.done_pages == self.pages
            and self.outbox_rows_left == 0
            and self.overlapping_terms == 0
            and self.pages_fetched_more_than_once <= self.allowed_refetches
        )

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok}


def host_specs(opts: FleetChaosOptions) -> list[HostSpec]:
    every = opts.crawl_delay_every
    return [
        HostSpec(
            f"h{i:02d}",
            pages=opts.pages + i % 3,
            crawl_delay=opts.crawl_delay if every and i % every == 0 else None,
        )
        for i in range(opts.hosts)
    ]


def run_fleet_chaos(
    opts: FleetChaosOptions,
    log: Callable[[str], None] = lambda _s: None,
    workdir: Path | None = None,
) -> FleetChaosReport:
    """Run the scenario; the crawl log and WARC files stay in ``workdir`` (default a new
    temporary directory, named in the log)."""
    work = workdir or Path(tempfile.mkdtemp(prefix="idemcrawl-fleet-chaos-"))
    log(f"work directory (crawl log, WARC files): {work}")
    servers: list[PgServer] = []
    try:
        for _ in range(opts.servers):
            servers.append(PgServer(durable=opts.durable).start())
        return _run(opts, servers, work, log)
    finally:
        for s in servers:
            s.stop()


def _run(
    opts: FleetChaosOptions, servers: list[PgServer], work: Path, log: Callable[[str], None]
) -> FleetChaosReport:
    dbs = [f"{s.dsn}?schema=chaos" for s in servers]
    init = subprocess.run(
        [sys.executable, "-m", "idemcrawl", "db", "init", "--partitions", str(opts.partitions),
         *(x for d in dbs for x in ("--db", d))],
        capture_output=True, text=True,
    )  # fmt: skip
    if init.returncode != 0:
        raise RuntimeError(f"db init failed: {init.stderr.strip()}")
    log(init.stdout.strip())
    specs = host_specs(opts)
    cfg = work / "crawl.toml"
    cfg.write_text(
        f'allow_private = ["127.0.0.1"]\ndelay = {opts.delay}\nlease_seconds = 20\n'
        "parse_workers = 0\n"
    )
    out_log = work / "crawl.log"
    # The members' owner slots (owner.py, under TMPDIR) stay in the work directory.
    child_env = {**os.environ, "TMPDIR": str(work)}
    with MultiHostServer(specs, cross_links=opts.one_seed) as site:
        seeds = site.seed_urls[:1] if opts.one_seed else site.seed_urls
        extra = ["--scope", opts.scope] if opts.scope else []

        def crawl(server: int) -> subprocess.Popen[bytes]:
            cmd = [
                sys.executable, "-m", "idemcrawl", "crawl", *seeds, "--db", dbs[server],
                "--config", str(cfg), "--spider", SPIDER, "--warc-dir", str(work / "warc"),
                "--concurrency", str(opts.concurrency), "--quiet", *extra,
            ]  # fmt: skip
            with out_log.open("ab") as out:
                return subprocess.Popen(
                    cmd, stdout=out, stderr=out, start_new_session=True, env=child_env
                )

        t0 = time.monotonic()
        timeline: list[tuple[float, str]] = []

        def note(what: str) -> None:
            timeline.append((round(time.monotonic() - t0, 1), what))
            log(f"{timeline[-1][0]:6.1f} s  {what}")

        def up_server(i: int) -> int:
            """Member ``i``'s server, or the next one while it is down: a starting member
            reads the map from the server it is given (running members ride an outage out)."""
            s = i % opts.servers
            return (s + 1) % opts.servers if outage_on.is_set() and s == opts.outage_server else s

        outage_on = threading.Event()
        procs = [crawl(i % opts.servers) for i in range(opts.members)]
        note(f"{opts.members} members started, seeds: {len(seeds)}")
        events: list[tuple[float, Callable[[], None]]] = []
        if opts.kills:
            def kill() -> None:
                for i in range(opts.kills):
                    os.killpg(procs[i].pid, signal.SIGKILL)
                    procs[i].wait()
                note(f"{opts.kills} members SIGKILLed")
                for i in range(opts.kills):
                    procs[i] = crawl(up_server(i))
                note(f"{opts.kills} members restarted")
            events.append((opts.kill_at, kill))
        if opts.outage != "none":
            server = servers[opts.outage_server]

            def outage() -> None:
                outage_on.set()
                (server.crash if opts.outage == "crash" else server.pause)()
                how = "crashed" if opts.outage == "crash" else "stopped"
                note(f"server {opts.outage_server} {how}")

            def back() -> None:
                server.resume()
                outage_on.clear()
                note(f"server {opts.outage_server} started again")

            events.append((opts.outage_at, outage))
            events.append((opts.outage_at + opts.outage_seconds, back))
        if opts.late_join_at > 0:
            def join() -> None:
                procs.append(crawl(up_server(len(procs))))
                note("a late member joined")
            events.append((opts.late_join_at, join))
        try:
            for at, action in sorted(events, key=lambda e: e[0]):
                time.sleep(max(0.0, at - (time.monotonic() - t0)))
                action()
            deadline = t0 + opts.timeout
            codes = [p.wait(timeout=max(1.0, deadline - time.monotonic())) for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()
        note(f"every member exited: {codes}")
        before = len(site.request_log())
        rerun = crawl(0)
        rerun_code = rerun.wait(timeout=opts.timeout)
        request_log = site.request_log()
        note(f"re-run exited {rerun_code}")
        allowance = {
            base: Allowance(1, max(opts.delay, spec.crawl_delay or 0.0))
            for base, spec in zip(site.base_urls, specs, strict=True)
        }
        violations = check_log(
            request_log, allowance, disallowed_prefixes=site.disallowed_prefixes()
        )
        expected = {
            f"{base}/p/{n}": f"{spec.name}: page {n}"
            for base, spec in zip(site.base_urls, specs, strict=True)
            for n in range(spec.pages)
        }
    fetched = collections.Counter(
        (e["host"], e["path"]) for e in request_log if e["path"].startswith("/p/")
    )
    records_by_server: list[int] = []
    correct = True
    events_: list[dict[str, Any]] = []
    terms: list[dict[str, Any]] = []
    done = outbox = members = 0
    for i, db in enumerate(dbs):
        f = open_frontier(db, create=False)
        try:
            assert isinstance(f, PartitionedFrontier)
            titles = {r["key"]: json.loads(r["data"]).get("title") for r in f.records()}
            records_by_server.append(len(titles))
            correct = correct and titles == expected
            if i == 0:
                events_ = list(f.iter_events())
                done = sum(
                    1 for r in f.iter_urls() if r["state"] == "done" and r["kind"] == "page"
                )
                outbox = sum(p.outbox_count() for p in f.parts.values())
                terms = f.ownership_log()
                members = len(f.members_table.rows())
        finally:
            f.close()
    return FleetChaosReport(
        options=asdict(opts),
        timeline=timeline,
        exit_codes=codes,
        rerun_exit_code=rerun_code,
        rerun_requests=len(request_log) - before,
        pages=len(expected),
        requests=len(request_log),
        politeness_violations=len(violations),
        violations_summary=summarize(violations) if violations else "",
        pages_fetched_more_than_once=sum(1 for n in fetched.values() if n > 1),
        allowed_refetches=opts.concurrency * opts.kills,
        records_by_server=records_by_server,
        records_correct_through_every_server=correct,
        events=len(events_),
        distinct_event_keys=len({(e["url_id"], e["url_version"]) for e in events_}),
        done_pages=done,
        outbox_rows_left=outbox,
        members_seen=members,
        ownership_terms=len(terms),
        overlapping_terms=check_terms(terms, {})[0],
    )


def _parser() -> argparse.ArgumentParser:
    d = FleetChaosOptions()
    p = argparse.ArgumentParser(
        prog="idemcrawl chaos --fleet",
        description="A partitioned crawl on throw-away PostgreSQL servers run by crawl "
        "processes while members are SIGKILLed and restarted, a server crashes and a member "
        "joins late; then checks exact records through every server, politeness from the "
        "site's log, a re-run that makes no request and single ownership. Exit status 1 "
        "when a check fails.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    for name, help_ in (
        ("servers", "throw-away PostgreSQL servers"),
        ("partitions", "partitions (db init --partitions)"),
        ("hosts", "hosts of the test site"),
        ("pages", "pages per host (host i has pages + i mod 3)"),
        ("members", "crawl processes at the start"),
        ("kills", "members SIGKILLed and restarted"),
        ("kill-at", "seconds after the start of the kills"),
        ("outage-server", "the server that crashes or stops"),
        ("outage-at", "seconds after the start of the outage"),
        ("outage-seconds", "how long the server stays down"),
        ("late-join-at", "seconds after the start a member joins (0: none)"),
        ("delay", "the crawl's per-host delay"),
        ("crawl-delay", "the Crawl-delay of every --crawl-delay-every-th host's robots.txt"),
        ("crawl-delay-every", "which hosts ask for a Crawl-delay (0: none)"),
        ("concurrency", "--concurrency of each crawl process"),
        ("timeout", "seconds to wait for the members"),
    ):
        dest = name.replace("-", "_")
        kind = int if isinstance(getattr(d, dest), int) else float
        p.add_argument(f"--{name}", dest=dest, type=kind, default=getattr(d, dest), help=help_)
    p.add_argument("--outage", choices=OUTAGES, default=d.outage,
                   help="crash: pg_ctl stop -m immediate; stop: a clean shutdown")  # fmt: skip
    p.add_argument("--all-seeds", dest="one_seed", action="store_false",
                   help="seed every host (no cross-host links) instead of one seed")  # fmt: skip
    p.add_argument("--scope", default=None, help="--scope for the crawls (default: theirs)")
    p.add_argument("--json", action="store_true")
    return p


def main(argv: Sequence[str]) -> int:
    a = vars(_parser().parse_args(argv))
    as_json = a.pop("json")
    report = run_fleet_chaos(FleetChaosOptions(**a), log=lambda s: print(s, file=sys.stderr))
    if as_json:
        print(json.dumps(report.as_dict(), indent=2, sort_keys=True))
    else:
        for k, v in report.as_dict().items():
            if k not in ("options", "timeline"):
                print(f"{k:38} {v}")
        print("kept its guarantees" if report.ok else "FAILED: a check above did not hold")
    return 0 if report.ok else 1
