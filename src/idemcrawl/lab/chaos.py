"""The kill test (``idemcrawl chaos``): the article's experiment, reproducible with one command.

A crawl of the test shop is SIGKILLed (its whole process group, parser processes included) at a
uniform random moment in ``[min, max]`` seconds after its first request reaches the server,
``kills`` times, then left to finish. The same schedule is applied to a deliberately naive
scraper and to idemcrawl, ``runs`` times with seeded randomness, and both are checked against the
shop's known contents. The shop counts every request per path, so repeated requests are
measured at the server.

"In flight at a kill" is measured from the crawl database right after each kill: URLs that were
leased and not yet committed (fetching, parsing, or waiting in the group-commit batch). Those are
the only pages a restart may fetch again, so idemcrawl's guarantee is checked as
``repeated requests <= sum of in-flight-at-kill``.

With ``db`` a ``postgresql://`` URL, idemcrawl's crawls run on that server instead of an SQLite
file, one fresh schema per run (dropped once the run is scored), with the WARC store in the work
directory; the naive scraper keeps its own SQLite file.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any

from .pgserver import drop_run_schema
from .testsite import ShopConfig, ShopServer, expected_products

SPIDER = "idemcrawl.lab.testsite.shop_spider:ShopSpider"
NAIVE_LATENCY_MS = 25.0


@dataclass(frozen=True)
class ChaosOptions:
    runs: int = 5
    kills: int = 10
    min_s: float = 0.2
    max_s: float = 1.0
    seed: int = 1
    concurrency: int = 4
    vary_concurrency: bool = False
    latency_ms: float | None = None
    listings: int = 25
    per_page: int = 20
    naive: bool = True
    #: A single run's hard limit, so the command always ends.
    run_timeout: float = 600.0
    #: idemcrawl's database: "sqlite" (a file per run) or a postgresql:// URL (a schema per run).
    db: str = "sqlite"

    def __post_init__(self) -> None:
        if self.db != "sqlite" and not self.db.startswith(("postgresql://", "postgres://")):
            raise ValueError(f"--db must be 'sqlite' or a postgresql:// URL, got {self.db!r}")

    def idem_latency(self) -> float:
        """Enough latency that a full crawl takes ~13 s, so kills land mid-crawl."""
        if self.latency_ms is not None:
            return self.latency_ms
        return NAIVE_LATENCY_MS * (8 if self.vary_concurrency else self.concurrency)


@dataclass
class RunResult:
    crawler: str
    run: int
    rows: int = 0
    distinct: int = 0
    correct: int = 0
    missing: int = 0
    requests: int = 0
    repeated: int = 0
    in_flight_at_kills: list[int] = field(default_factory=list)
    kills_landed: int = 0
    concurrencies: list[int] = field(default_factory=list)
    wall_s: float = 0.0
    exit_code: int | None = None
    group_commit_max: int = 0
    #: R21: index events vs completed page versions, and events sharing a key (must be 0).
    events: int = 0
    completed_versions: int = 0
    duplicate_event_keys: int = 0
    #: R20: WARC records read back by both warcio and FastWARC, URL pointers checked.
    warc_records: int = 0
    warc_pointers_checked: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


@dataclass
class ChaosReport:
    options: ChaosOptions
    results: list[RunResult] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.results if r.crawler == "idemcrawl")

    def as_dict(self) -> dict[str, Any]:
        return {
            "options": asdict(self.options),
            "ok": self.ok,
            "results": [asdict(r) | {"ok": r.ok} for r in self.results],
        }

    def table(self) -> str:
        o = self.options
        expected = o.listings * o.per_page
        head = (
            f"kill test: {o.listings} listings x {o.per_page} products = {expected} products, "
            f"{expected + o.listings} requests for a full crawl; {o.kills} SIGKILLs per run at "
            f"U[{o.min_s}, {o.max_s}] s after the first request; seed {o.seed}\n"
            f"idemcrawl: concurrency {'varied 1-16' if o.vary_concurrency else o.concurrency}, "
            f"server latency {o.idem_latency():g} ms; naive: sequential, {NAIVE_LATENCY_MS:g} ms\n"
        )
        cols = (
            "crawler",
            "run",
            "rows",
            "correct",
            "distinct",
            "missing",
            "requests",
            "repeated",
            "in flight at kills",
            "kills",
            "events",
            "WARC records",
            "wall s",
            "verdict",
        )
        lines = [cols]
        for r in self.results:
            verdict = "ok" if r.ok else "; ".join(r.problems)
            if r.crawler == "naive":
                verdict = "baseline"
            lines.append(
                (
                    r.crawler,
                    str(r.run),
                    str(r.rows),
                    str(r.correct),
                    str(r.distinct),
                    str(r.missing),
                    str(r.requests),
                    str(r.repeated),
                    f"{sum(r.in_flight_at_kills)} {r.in_flight_at_kills}"
                    if r.crawler != "naive"
                    else "-",
                    str(r.kills_landed),
                    f"{r.events}/{r.completed_versions}" if r.crawler != "naive" else "-",
                    str(r.warc_records) if r.crawler != "naive" else "-",
                    f"{r.wall_s:.1f}",
                    verdict,
                )
            )
        widths = [max(len(row[i]) for row in lines) for i in range(len(cols))]
        out = [head]
        for i, row in enumerate(lines):
            out.append("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
            if i == 0:
                out.append("  ".join("-" * w for w in widths))
        gc = max((r.group_commit_max for r in self.results), default=0)
        out.append(
            f"\nidemcrawl group-commit bound: <= {gc} completions per transaction "
            "(included in 'in flight': leased and not yet committed at the kill)"
        )
        out.append(
            "RESULT: "
            + (
                "idemcrawl kept its guarantees in every run"
                if self.ok
                else "idemcrawl MISSED its guarantees"
            )
        )
        return "\n".join(out)


def _wait_first_request(
    server: ShopServer, before: int, proc: subprocess.Popen[bytes], timeout: float
) -> bool:
    """Block until the server has seen a request from this process (or the process ended)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if int(server.stats()["total"]) > before:  # type: ignore[call-overload]
            return True
        if proc.poll() is not None:
            return False
        time.sleep(0.002)
    return False


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


@dataclass(frozen=True)
class _CrawlDB:
    """Where one run keeps its crawl: ``db`` is the crawl's ``--db`` (an SQLite file, or a
    PostgreSQL URL naming the run's own schema), read back here with plain SQL either way."""

    db: str
    warc_dir: str
    #: PostgreSQL: the server's URL without the schema parameter, and the schema.
    dsn: str | None = None
    schema: str | None = None

    @classmethod
    def make(cls, opts: ChaosOptions, workdir: str, name: str) -> _CrawlDB:
        path = os.path.join(workdir, f"{name}.db")
        if opts.db == "sqlite" or name.startswith("naive"):
            return cls(path, path + ".warc")
        from idemcrawl.frontier import split_schema

        dsn, _ = split_schema(opts.db)
        schema = f"chaos_{name.replace('-', '_')}_{uuid.uuid4().hex[:8]}"
        sep = "&" if "?" in dsn else "?"
        return cls(f"{dsn}{sep}schema={schema}", path + ".warc", dsn, schema)

    def exists(self) -> bool:
        return self.dsn is not None or os.path.exists(self.db)

    @contextmanager
    def connect(self) -> Iterator[Any]:
        """A connection whose ``execute`` reads the crawl's tables (unqualified names)."""
        if self.dsn is None:
            con = sqlite3.connect(self.db, timeout=30)
            try:
                yield con
            finally:
                con.close()
            return
        import psycopg

        with psycopg.connect(self.dsn, autocommit=True) as pg:
            pg.execute(f'SET search_path TO "{self.schema}"')
            yield pg

    def drop(self) -> None:
        if self.dsn is not None:
            drop_run_schema(self.db)  # as the benchmarks do: catalogs vacuumed, slots forgotten


def _leased_now(where: _CrawlDB) -> int:
    if not where.exists():
        return 0
    try:
        with where.connect() as con:
            return int(
                con.execute("SELECT count(*) FROM urls WHERE state = 'leased'").fetchone()[0]
            )
    except Exception:  # not created yet (either engine): nothing leased
        return 0


def idem_crawl_command(
    seed_url: str, db: str, concurrency: int, warc_dir: str | None = None
) -> list[str]:
    """The shop crawl the kill test runs: no delay, all slots on the one host (reused by tests).
    ``warc_dir``: where the archive goes when ``db`` is not a file (PostgreSQL)."""
    return [
        sys.executable,
        "-m",
        "idemcrawl",
        "crawl",
        seed_url,
        "--db",
        db,
        "--spider",
        SPIDER,
        "--concurrency",
        str(concurrency),
        "--host-concurrency",
        str(concurrency),
        "--delay",
        "0",
        "--latency-factor",
        "0",
        "--allow-private",
        "127.0.0.1",
        "--quiet",
    ] + (["--warc-dir", warc_dir] if warc_dir is not None else [])


def _naive_cmd(seed_url: str, db: str) -> list[str]:
    return [sys.executable, "-m", "idemcrawl.lab.naive", seed_url, db]


def _one_run(
    crawler: str, run: int, opts: ChaosOptions, workdir: str, log: Callable[[str], None]
) -> RunResult:
    rng = random.Random(f"{opts.seed}:{run}:{crawler}")
    latency = NAIVE_LATENCY_MS if crawler == "naive" else opts.idem_latency()
    shop = ShopConfig(opts.listings, opts.per_page, latency)
    where = _CrawlDB.make(opts, workdir, f"{crawler}-{run}")
    db = where.db
    res = RunResult(crawler, run)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    with ShopServer(shop) as server:
        t0 = time.monotonic()
        for _ in range(opts.kills + 1):
            final = len(res.concurrencies) == opts.kills
            conc = rng.choice((1, 2, 4, 8, 16)) if opts.vary_concurrency else opts.concurrency
            cmd = (
                _naive_cmd(server.seed_url, db)
                if crawler == "naive"
                else idem_crawl_command(
                    server.seed_url, db, conc, where.warc_dir if where.dsn else None
                )
            )
            res.concurrencies.append(conc)
            before = int(server.stats()["total"])  # type: ignore[call-overload]
            proc = subprocess.Popen(
                cmd,
                start_new_session=True,
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
            )
            if final:
                try:
                    _, err = proc.communicate(timeout=opts.run_timeout)
                except subprocess.TimeoutExpired:
                    _kill_group(proc)
                    res.problems.append("final run timed out")
                    err = b""
                res.exit_code = proc.returncode
                if proc.returncode != 0:
                    res.problems.append(
                        f"final run exited {proc.returncode}: "
                        f"{err.decode(errors='replace').strip()[-300:]}"
                    )
                break
            if not _wait_first_request(server, before, proc, timeout=60):
                if proc.poll() is None:
                    _kill_group(proc)
                continue  # finished (or never started) before we could kill it
            time.sleep(rng.uniform(opts.min_s, opts.max_s))
            if proc.poll() is None:
                _kill_group(proc)
                res.kills_landed += 1
                if crawler != "naive":
                    res.in_flight_at_kills.append(_leased_now(where))
            else:
                proc.wait()
        res.wall_s = time.monotonic() - t0
        stats = server.stats()
    paths: dict[str, int] = stats["paths"]  # type: ignore[assignment]
    res.requests = int(stats["total"])  # type: ignore[call-overload]
    res.repeated = sum(n - 1 for n in paths.values() if n > 1)
    try:
        _score(res, crawler, where, shop)
    finally:
        where.drop()
    if crawler != "naive":
        bound = sum(res.in_flight_at_kills)
        if res.repeated > bound:
            res.problems.append(f"{res.repeated} repeated requests > {bound} in flight at kills")
    log(
        f"run {run} {crawler}: rows {res.rows} correct {res.correct} requests {res.requests} "
        f"repeated {res.repeated} in {res.wall_s:.1f} s"
    )
    return res


def _score(res: RunResult, crawler: str, where: _CrawlDB, shop: ShopConfig) -> None:
    expected = expected_products(shop)
    with where.connect() as con:
        if crawler == "naive":
            rows = con.execute("SELECT sku, price FROM products").fetchall()
        else:
            rows = [
                (k, json.loads(d).get("price"))
                for k, d in con.execute("SELECT key, data FROM records WHERE source = 'shop'")
            ]
            res.group_commit_max = int(
                con.execute("SELECT value FROM meta WHERE key = 'group_commit_max'").fetchone()[0]
            )
            res.events = con.execute("SELECT count(*) FROM events").fetchone()[0]
            res.duplicate_event_keys = res.events - con.execute(
                "SELECT count(*) FROM (SELECT DISTINCT url_id, url_version FROM events) AS k"
            ).fetchone()[0]
            res.completed_versions = con.execute(
                "SELECT count(*) FROM urls WHERE kind = 'page' AND state = 'done'"
            ).fetchone()[0]
            pointers = con.execute(
                "SELECT warc_file, warc_offset, warc_length, payload_digest FROM urls "
                "WHERE warc_file IS NOT NULL"
            ).fetchall()
    if crawler != "naive":
        _check_archive(res, where.warc_dir, pointers)
    res.rows = len(rows)
    res.correct = sum(1 for sku, price in rows if expected.get(sku) == price)
    res.distinct = len({sku for sku, _ in rows})
    res.missing = len(set(expected) - {sku for sku, _ in rows})
    if crawler != "naive":
        if res.rows != len(expected):
            res.problems.append(f"{res.rows} rows, expected {len(expected)}")
        if res.correct != res.rows:
            res.problems.append(f"{res.rows - res.correct} rows differ from the page")
        if res.missing:
            res.problems.append(f"{res.missing} products missing")


def _check_archive(res: RunResult, directory: str, pointers: list[tuple[Any, ...]]) -> None:
    """Every WARC file reads end to end (both libraries); every URL's pointer leads to a
    response whose payload digest matches the one stored with the URL."""
    from idemcrawl.warc import WarcError, WarcPointer, read_response, verify_directory

    if res.events != res.completed_versions:
        res.problems.append(
            f"{res.events} index events for {res.completed_versions} completed versions"
        )
    if res.duplicate_event_keys:
        res.problems.append(f"{res.duplicate_event_keys} duplicate event keys")
    try:
        report = verify_directory(directory)
    except WarcError as exc:
        res.problems.append(f"WARC store unreadable: {exc}")
        return
    res.warc_records = sum(report["records"].values())
    for err in report["errors"][:5]:
        res.problems.append(f"WARC: {err}")
    for file, offset, length, digest in pointers:
        try:
            read_response(directory, WarcPointer(file, offset, length, digest))
        except (OSError, WarcError) as exc:
            res.problems.append(f"WARC pointer {file}@{offset}: {exc}")
            continue
        res.warc_pointers_checked += 1


def run_chaos(opts: ChaosOptions, log: Callable[[str], None] = lambda s: None) -> ChaosReport:
    report = ChaosReport(opts)
    # A killed client makes the shop's aiohttp server log a traceback per aborted response.
    logging.getLogger("aiohttp.server").setLevel(logging.CRITICAL)
    with tempfile.TemporaryDirectory(prefix="idemcrawl-chaos-") as workdir:
        for run in range(1, opts.runs + 1):
            crawlers = ("naive", "idemcrawl") if opts.naive else ("idemcrawl",)
            for crawler in crawlers:
                report.results.append(_one_run(crawler, run, opts, workdir, log))
    return report
