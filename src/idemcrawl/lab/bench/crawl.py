"""``idemcrawl bench crawl``: crawl throughput side by side with Scrapy and a bare crawler.

Every tool crawls the same generated site (:mod:`idemcrawl.lab.bench.site`) as a separate
subprocess, in interleaved rounds (A B C, A B C, ...) so that a machine that slows down or warms
up over the benchmark affects every tool alike. What is reported comes from outside the tools:

* wall time and CPU time (user + sys) from a small launcher process between the benchmark and
  the tool. The launcher makes itself a Linux *child subreaper*, so the tool's orphaned
  descendants (idemcrawl's forkserver, which outlives the main process by a moment, and the
  parser processes it forks) are re-parented to it and reaped there; ``getrusage
  (RUSAGE_CHILDREN)`` in the launcher then counts the CPU time of the whole process tree and
  nothing else (not the launcher's own start-up).
* peak memory as the largest sum of the RSS of every process in the tool's tree, sampled every
  50 ms with psutil (RSS counts pages shared between processes once per process, so a
  multi-process tool is charged for its shared pages more than once). Without psutil, the
  largest single process's ``ru_maxrss``.
* pages fetched and duplicate fetches from the server's access log: a duplicate is a request
  for a port+URI already requested in the same run.
* "other CPU": what the rest of the machine (web server, this process, anyone else) used while
  the tool ran, from ``/proc/stat`` in the launcher. On a shared machine it says which wall
  times to distrust; the report warns when it exceeds a quarter of a CPU.
* with ``--instructions``, after the timed rounds: CPU instructions per page of each tool
  (:mod:`idemcrawl.lab.bench.instructions`), counted by perf or valgrind on a small and a large
  site of the same shape. CPU seconds move with the machine's load; instruction counts barely
  do, so a change of a few per cent can be judged on a shared machine.

Wall time includes interpreter start-up and imports for every tool, which matters only for tiny
sites. idemcrawl gets a fresh SQLite file per run (or a PostgreSQL database per run, see
:class:`BenchOptions`), the others have no state to reset.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib
import importlib.metadata
import importlib.util
import json
import os
import platform
import re
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from idemcrawl.frontier import split_schema
from idemcrawl.parse import Page, Record, Spider

from ..pgserver import drop_run_schema
from .instructions import COUNTERS as INSTRUCTION_COUNTERS
from .instructions import (
    BenchError,
    Counter,
    InstructionReport,
    detect_counter,
    measure_instructions,
)
from .reaper import killpg, reap_descendants, set_subreaper
from .site import SiteSpec, StaticSite

__all__ = [
    "COMPARATORS",
    "KNOWN_COMPARATORS",
    "BenchError",
    "BenchOptions",
    "BenchReport",
    "BenchSpider",
    "RunResult",
    "add_bench_crawl_arguments",
    "cmd_bench_crawl",
    "main",
    "options_from_args",
    "run_bench",
]

COMPARATORS: Final = ("scrapy", "bare")
#: ``--compare sqlite``: idemcrawl again, on a fresh SQLite file, beside a ``--db
#: postgresql://`` crawl. Its rounds interleave with the PostgreSQL ones, so the ratio
#: idemcrawl/sqlite (issue 14's line: >= 0.9x) compares crawls of the same minutes; runs made
#: as two invocations minutes apart differed by up to 20 % on this machine from its load alone.
SQLITE: Final = "sqlite"
KNOWN_COMPARATORS: Final = (*COMPARATORS, SQLITE)
TOOLS: Final = ("idemcrawl", SQLITE, *COMPARATORS)
#: The tools that are idemcrawl itself (its command, its output, its source fingerprint).
IDEMCRAWL_TOOLS: Final = ("idemcrawl", SQLITE)
#: Same caps for every tool: requests in flight overall and per host (host = host:port).
CONCURRENCY: Final = 64
HOST_CONCURRENCY: Final = 8
SAMPLE_SECONDS: Final = 0.05


class BenchSpider(Spider):
    """The idemcrawl side of the benchmark: one record per page keyed by its SKU, all links.

    It does what the Scrapy spider and the bare crawler do, so the three are comparable.
    """

    name = "bench"

    def parse(self, page: Page) -> Iterable[Record | str]:
        sku = page.css_first("span.sku")
        if sku is not None:
            price = page.css_first("span.price")
            yield Record(key=sku.text(), data={"price": price.text() if price else None})
        yield from page.links()


@dataclass(frozen=True)
class BenchOptions:
    """What to benchmark.

    ``db``: ``"sqlite"`` (a fresh file per run in a temp directory), an existing directory (a
    fresh file per run in it, to measure a particular disk), or a PostgreSQL URL: every run then
    gets a fresh schema in that database (``?schema=bench_crawl_...``, replacing any
    ``schema=`` given), dropped after the run. A fresh store per run matters: on a finished
    crawl's store idemcrawl resumes, has nothing to do and fetches nothing.
    """

    hosts: int = 50
    pages: int = 400
    page_kb: float = 15.0
    links: int = 40
    db: str = "sqlite"
    compare: tuple[str, ...] = COMPARATORS
    runs: int = 3
    server: str = "auto"
    #: Seconds before a run is killed and reported as failed.
    timeout: float = 3600.0
    #: Where the site, databases and outputs go (default: the system temp directory).
    workdir: str | None = None
    #: The command line shown in the report; rebuilt from the options when None.
    command: str | None = None
    #: Where bare_crawler.py and scrapy_spider.py are; default: the checkout's benchmarks/.
    benchmarks_dir: str | None = None
    #: Extra ``idemcrawl crawl`` flags (e.g. ``("--parse-workers", "2")``), for experiments;
    #: they are part of the reported command line.
    crawl_args: tuple[str, ...] = ()
    #: After the timed rounds, count each tool's instructions per page
    #: (:mod:`idemcrawl.lab.bench.instructions`) on ``instructions_hosts`` hosts x each of
    #: ``instructions_pages`` (small, large) pages per host, page size and links as above.
    instructions: bool = False
    instructions_hosts: int = 10
    instructions_pages: tuple[int, int] = (20, 200)
    #: Counts of each size per tool; 2 or more show the run-to-run spread of the counts.
    instructions_runs: int = 1
    #: "auto" (perf where it counts, else valgrind), "perf" or "valgrind".
    instructions_counter: str = "auto"

    def validate(self) -> None:
        problems = []
        if self.hosts < 1 or self.pages < 1 or self.links < 1 or self.page_kb <= 0:
            problems.append("--hosts, --pages, --links and --page-kb must be positive")
        if self.links < 2 and self.hosts > 1:
            problems.append("--links must be >= 2 with several hosts")
        if self.runs < 1:
            problems.append("--runs must be >= 1")
        unknown = [c for c in self.compare if c not in KNOWN_COMPARATORS]
        if unknown:
            problems.append(
                f"--compare: unknown {', '.join(unknown)} (known: {', '.join(KNOWN_COMPARATORS)})"
            )
        if SQLITE in self.compare and not _is_dsn(self.db):
            problems.append(
                "--compare sqlite runs the same crawl on SQLite beside a --db postgresql://... "
                "one; here --db is SQLite already"
            )
        if self.server not in ("auto", "nginx", "aiohttp"):
            problems.append("--server must be auto, nginx or aiohttp")
        if not _is_dsn(self.db) and self.db != "sqlite" and not os.path.isdir(self.db):
            problems.append("--db must be 'sqlite', an existing directory or postgresql://...")
        reserved = {"--db", "--spider", "--json", "--quiet"}
        if any(a.split("=", 1)[0] in reserved for a in self.crawl_args):
            problems.append(f"--crawl-args may not set {', '.join(sorted(reserved))}")
        if self.instructions:
            small, large = self.instructions_pages
            if self.instructions_hosts < 1 or self.instructions_runs < 1:
                problems.append("--instructions-hosts and --instructions-runs must be >= 1")
            if not 1 <= small < large:
                problems.append("--instructions-pages SMALL,LARGE needs 1 <= SMALL < LARGE")
            if self.links < 2 and self.instructions_hosts > 1:
                problems.append("--links must be >= 2 with several --instructions-hosts")
            if self.instructions_counter not in INSTRUCTION_COUNTERS:
                problems.append(f"--instructions-counter must be {', '.join(INSTRUCTION_COUNTERS)}")
        if problems:
            raise BenchError("; ".join(problems))

    def command_line(self) -> str:
        if self.command:
            return self.command
        parts = ["idemcrawl", "bench", "crawl"]
        parts += ["--hosts", str(self.hosts), "--pages", str(self.pages)]
        parts += ["--page-kb", f"{self.page_kb:g}", "--links", str(self.links)]
        if self.db != "sqlite":
            parts += ["--db", mask_dsn(self.db)]
        parts += ["--compare", ",".join(self.compare) or "none", "--runs", str(self.runs)]
        if self.server != "auto":
            parts += ["--server", self.server]
        if self.crawl_args:
            parts += ["--crawl-args", shlex.join(self.crawl_args)]
        if self.instructions:
            parts += ["--instructions"]
            defaults = BenchOptions()
            if self.instructions_hosts != defaults.instructions_hosts:
                parts += ["--instructions-hosts", str(self.instructions_hosts)]
            if self.instructions_pages != defaults.instructions_pages:
                parts += ["--instructions-pages", ",".join(map(str, self.instructions_pages))]
            if self.instructions_runs != defaults.instructions_runs:
                parts += ["--instructions-runs", str(self.instructions_runs)]
            if self.instructions_counter != defaults.instructions_counter:
                parts += ["--instructions-counter", self.instructions_counter]
        return shlex.join(parts)


def _is_dsn(db: str) -> bool:
    return db.startswith(("postgresql://", "postgres://"))


def mask_dsn(db: str) -> str:
    """The DSN without its password, for reports."""
    return re.sub(r"(://[^:/@]+):[^@/]*@", r"\1:***@", db)


@dataclass
class RunResult:
    """One tool's run: what the launcher measured and what the server saw."""

    tool: str
    round: int
    ok: bool
    error: str | None
    wall_s: float
    cpu_user_s: float
    cpu_sys_s: float
    peak_rss_mb: float | None
    #: "tree" (psutil sum over the process tree) or "maxrss" (largest single process).
    rss_source: str
    processes: int
    pages: int
    page_requests: int
    robots: int
    requests: int
    duplicates: int
    items: int | None
    exit_code: int | None
    #: CPU seconds the rest of the machine used during the run (server, sampler, anyone else);
    #: None where it cannot be measured. Large values mean the wall times are contaminated.
    other_cpu_s: float | None = None
    #: Of that, the CPU seconds of the PostgreSQL server's processes during the run (a crawl
    #: with ``--db postgresql://`` on a server of this machine; None otherwise).
    server_cpu_s: float | None = None
    #: Fingerprint of idemcrawl's source when an idemcrawl run started (see source_fingerprint).
    source: str | None = None

    @property
    def cpu_s(self) -> float:
        return self.cpu_user_s + self.cpu_sys_s

    @property
    def pages_per_s(self) -> float:
        """Distinct pages fetched per second of wall time."""
        return self.pages / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def cpu_ms_per_page(self) -> float | None:
        """CPU milliseconds (every process of the tool) per distinct page fetched: the unit of
        issue 17's acceptance lines, comparable between sites of different sizes."""
        return self.cpu_s * 1000 / self.pages if self.pages else None


@dataclass
class BenchReport:
    options: BenchOptions
    command: str
    server: str
    environment: dict[str, str]
    runs: list[RunResult] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0
    #: Instructions per page (``--instructions``); None when not asked for.
    instructions: InstructionReport | None = None

    @property
    def expected_pages(self) -> int:
        return self.options.hosts * self.options.pages

    @property
    def tools(self) -> list[str]:
        return [t for t in TOOLS if any(r.tool == t for r in self.runs)]

    def tool_runs(self, tool: str) -> list[RunResult]:
        return [r for r in self.runs if r.tool == tool]

    def summary(self, tool: str) -> dict[str, Any]:
        """Medians over the tool's successful runs; worst case for duplicates and failures."""
        runs = self.tool_runs(tool)
        ok = [r for r in runs if r.ok]
        rss = [r.peak_rss_mb for r in ok if r.peak_rss_mb is not None]
        return {
            "runs": len(runs),
            "failed_runs": len(runs) - len(ok),
            "pages_per_s": _median([r.pages_per_s for r in ok]),
            "wall_s": _median([r.wall_s for r in ok]),
            "cpu_s": _median([r.cpu_s for r in ok]),
            "cpu_ms_per_page": _median(
                [r.cpu_ms_per_page for r in ok if r.cpu_ms_per_page is not None]
            ),
            "peak_rss_mb": _median(rss),
            "pages": _median([r.pages for r in ok]),
            "robots": _median([r.robots for r in ok]),
            "duplicates": max((r.duplicates for r in runs), default=None),
            "items": _median([r.items for r in ok if r.items is not None]),
            "complete": bool(ok) and all(r.pages == self.expected_pages for r in ok),
        }

    def ratio(self, other: str, metric: str) -> float | None:
        """Median over rounds of idemcrawl's ``metric`` divided by ``other``'s, same round."""
        values = []
        for mine in self.tool_runs("idemcrawl"):
            theirs = [r for r in self.tool_runs(other) if r.round == mine.round]
            if not (mine.ok and theirs and theirs[0].ok):
                continue
            a, b = self._metric(mine, metric), self._metric(theirs[0], metric)
            if a is not None and b:
                values.append(a / b)
        return _median(values)

    def ratios(self) -> dict[str, dict[str, float | None]]:
        metrics = (*_RATIO_METRICS, "cpu_with_db_s") if self._server_db else _RATIO_METRICS
        return {
            f"idemcrawl/{other}": {m: self.ratio(other, m) for m in metrics}
            for other in self.tools
            if other != "idemcrawl"
        }

    @property
    def _server_db(self) -> bool:
        """idemcrawl ran on a database server (``--db postgresql://``)."""
        return _is_dsn(self.options.db)

    def _metric(self, r: RunResult, name: str) -> float | None:
        if name == "pages_per_s":
            return r.pages_per_s
        if name == "cpu_s":
            return r.cpu_s
        if name == "cpu_ms_per_page":
            return r.cpu_ms_per_page
        if name == "cpu_with_db_s":
            # The CPU a page costs the machine: the tool's processes, and for idemcrawl on a
            # server the server's too (SQLite's engine runs inside the crawl; the comparators
            # keep no database). Unknown when that server's CPU could not be read (not this
            # machine's).
            if r.tool == "idemcrawl" and self._server_db:
                return None if r.server_cpu_s is None else r.cpu_s + r.server_cpu_s
            return r.cpu_s
        return r.peak_rss_mb

    def _warnings(self) -> list[str]:
        rounds: dict[str, list[str]] = {}
        for r in self.runs:
            if r.source:
                rounds.setdefault(r.source, []).append(str(r.round))
        notes = []
        if len(rounds) > 1:
            notes.append(
                "**Warning:** idemcrawl's crawl code changed during the benchmark ("
                + ", ".join(f"{fp} in round {', '.join(rs)}" for fp, rs in rounds.items())
                + "): its rounds measured different code."
            )
        elapsed = [r for r in self.runs if r.ok and r.other_cpu_s is not None and r.wall_s > 0]
        busy = [r for r in elapsed if r.other_cpu_s and r.other_cpu_s > 0.25 * r.wall_s]
        if busy:
            worst = max(busy, key=lambda r: r.other_cpu_s or 0.0)
            notes.append(
                f"**Warning:** the rest of the machine was busy during {len(busy)} of "
                f"{len(elapsed)} runs (up to {worst.other_cpu_s:.0f} CPU s during the "
                f"{worst.wall_s:.0f} s of round {worst.round} {worst.tool}; see 'other CPU s'), "
                "so wall times and pages/s are pessimistic; CPU s is less affected."
            )
        return [*(n + "\n" for n in notes)]

    def as_dict(self) -> dict[str, Any]:
        opts = asdict(self.options)
        opts["db"] = mask_dsn(self.options.db)
        opts["command"] = self.command
        return {
            "command": self.command,
            "options": opts,
            "server": self.server,
            "environment": self.environment,
            "expected_pages": self.expected_pages,
            "seconds": round(self.seconds, 1),
            "skipped": self.skipped,
            "tools": {t: self.summary(t) for t in self.tools},
            "ratios": self.ratios(),
            "runs": [
                asdict(r)
                | {
                    "cpu_s": r.cpu_s,
                    "pages_per_s": r.pages_per_s,
                    "cpu_ms_per_page": r.cpu_ms_per_page,
                }
                for r in self.runs
            ],
            "instructions": self.instructions.as_dict() if self.instructions else None,
        }

    def text(self) -> str:
        """Markdown for docs/benchmarks.md: setup, per-tool medians, ratios, every run."""
        o = self.options
        env = self.environment
        server = (
            f"nginx {env.get('nginx', '')} (1 worker process)".replace("  ", " ")
            if self.server == "nginx"
            else "the aiohttp fallback server (1 process)"
        )
        lines = [
            f"Command: `{self.command}`",
            "",
            f"Site: {o.hosts} hosts x {o.pages} pages = {self.expected_pages} pages of "
            f"~{o.page_kb:g} KB with {o.links} links each, one robots.txt per host, served by "
            f"{server} on 127.0.0.1 (one port per host). Every tool: {CONCURRENCY} requests "
            f"in flight, {HOST_CONCURRENCY} per host, no delay; idemcrawl and Scrapy obey "
            "robots.txt, the bare crawler does not fetch it.",
            "",
            "Machine: " + (", ".join(f"{k} {v}" for k, v in env.items()) or "unknown") + ".",
            "",
            f"{o.runs} round(s), tools interleaved within each round; medians over rounds; "
            f"benchmark wall time {self.seconds / 60:.1f} min.",
            "",
            *self._warnings(),
            "| tool | pages/s | wall s | CPU s | CPU ms/page | peak RSS MB | pages fetched "
            "| robots.txt | duplicates | items |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for tool in self.tools:
            s = self.summary(tool)
            name = tool + ("" if s["complete"] else " (incomplete)")
            if s["failed_runs"]:
                name += f" ({s['failed_runs']} failed run(s))"
            lines.append(
                f"| {name} | {_fmt(s['pages_per_s'], 0)} | {_fmt(s['wall_s'], 1)} "
                f"| {_fmt(s['cpu_s'], 1)} | {_fmt(s['cpu_ms_per_page'], 2)} "
                f"| {_fmt(s['peak_rss_mb'], 0)} | {_fmt(s['pages'], 0)} "
                f"| {_fmt(s['robots'], 0)} | {_fmt(s['duplicates'], 0)} | {_fmt(s['items'], 0)} |"
            )
        for tool, why in self.skipped.items():
            lines.append(f"| {tool} | {why} | | | | | | | | |")
        ratios = self.ratios()
        if ratios:
            db = self._server_db
            lines += [
                "",
                "| ratio (median of per-round ratios) | pages/s | CPU s | CPU ms/page | peak RSS |"
                + (" CPU s with the database server |" if db else ""),
                "|---|---:|---:|---:|---:|" + ("---:|" if db else ""),
            ]
            for name, r in ratios.items():
                lines.append(
                    f"| {name} | {_fmt(r['pages_per_s'], 2, 'x')} | {_fmt(r['cpu_s'], 2, 'x')} "
                    f"| {_fmt(r['cpu_ms_per_page'], 2, 'x')} | {_fmt(r['peak_rss_mb'], 2, 'x')} |"
                    + (f" {_fmt(r['cpu_with_db_s'], 2, 'x')} |" if db else "")
                )
        lines += [
            "",
            "| round | tool | wall s | pages/s | CPU s | CPU ms/page | other CPU s | peak RSS MB "
            "| processes | pages | duplicates | items | status |",
            "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
        ]
        for r in self.runs:
            status = "ok" if r.ok else f"failed: {r.error}"
            rss = _fmt(r.peak_rss_mb, 0) + ("" if r.rss_source == "tree" else " (max proc)")
            other = _fmt(r.other_cpu_s, 1)
            if r.server_cpu_s is not None:
                other += f" (db {r.server_cpu_s:.1f})"
            lines.append(
                f"| {r.round} | {r.tool} | {r.wall_s:.1f} | {r.pages_per_s:.0f} | {r.cpu_s:.1f} "
                f"| {_fmt(r.cpu_ms_per_page, 2)} | {other} | {rss} "
                f"| {r.processes} | {r.pages} | {r.duplicates} | {_fmt(r.items, 0)} | {status} |"
            )
        lines += [
            "",
            "pages/s: distinct pages fetched (server log) per second of wall time, process start "
            "to exit. CPU s: user + sys of the whole process tree; CPU ms/page: that over the "
            "pages fetched. Peak RSS: largest sum over "
            f"the process tree, sampled every {SAMPLE_SECONDS * 1000:.0f} ms (shared pages "
            "count once per process). Duplicates: requests beyond the first for a port+URI. "
            "Other CPU s: CPU time the rest of the machine (web server, benchmark, other "
            f"processes) used during the run, out of {os.cpu_count()} CPUs x wall time; "
            "(db N): of it, the whole PostgreSQL server (its backends and auxiliary "
            "processes, read from /proc at the start and the end of the run; a server of "
            "this machine only).",
        ]
        if self._server_db:
            lines[-1] += (
                " CPU s with the database server: idemcrawl's CPU s plus its PostgreSQL "
                "server's (db N), against the other tool's CPU s (SQLite's engine runs inside "
                "the crawl): what a page costs the machine."
            )
        if SQLITE in self.tools:
            lines[-1] += (
                " sqlite: idemcrawl again, on a fresh SQLite file, in every round beside the --db "
                "crawl; idemcrawl/sqlite compares the two backends in the same "
                "minutes."
            )
        if self.instructions is not None:
            lines += ["", *self.instructions.markdown()]
        return "\n".join(lines) + "\n"


_RATIO_METRICS: Final = ("pages_per_s", "cpu_s", "cpu_ms_per_page", "peak_rss_mb")


def _median(values: Sequence[float | int]) -> float | None:
    return float(statistics.median(values)) if values else None


def _fmt(value: float | int | None, digits: int, suffix: str = "") -> str:
    if value is None:
        return "-"
    return f"{value:,.{digits}f}{suffix}"


# -- the launcher (runs in its own process) -----------------------------------------------------


def _launch_main(argv: Sequence[str]) -> int:
    """``OUT.json TIMEOUT -- CMD...``: run CMD, reap its whole tree, write what it cost.

    Kept free of anything but the standard library at call time; the tool inherits stdout and
    stderr. The tool gets its own process group so a timeout can kill all of it.
    """
    out, timeout = argv[0], float(argv[1])
    cmd = list(argv[3:])
    subreaper = set_subreaper()
    timed_out = threading.Event()
    busy_start = machine_busy_seconds()
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, start_new_session=True)

    def expire() -> None:
        timed_out.set()
        killpg(proc.pid)

    timer = threading.Timer(timeout, expire)
    timer.daemon = True
    timer.start()
    _, status, _ = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    busy_end = machine_busy_seconds()
    proc.returncode = os.waitstatus_to_exitcode(status)
    # Reap every re-parented descendant: their CPU time joins RUSAGE_CHILDREN only when they
    # are waited for.
    reap_descendants(proc.pid, 15.0, 0.01)
    timer.cancel()
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    result = {
        "wall_s": wall,
        "exit_code": proc.returncode,
        "user_s": ru.ru_utime,
        "sys_s": ru.ru_stime,
        "maxrss_kb": ru.ru_maxrss,
        "subreaper": subreaper,
        "timed_out": timed_out.is_set(),
        "machine_busy_s": (
            None if busy_start is None or busy_end is None else busy_end - busy_start
        ),
    }
    Path(out).write_text(json.dumps(result), encoding="utf-8")
    return 0


class _TreeSampler(threading.Thread):
    """Samples the summed RSS of a process's descendants (not the process itself)."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid = pid
        self.peak_bytes = 0
        self.max_processes = 0
        self.available = importlib.util.find_spec("psutil") is not None
        self._stop_event = threading.Event()

    def run(self) -> None:
        if not self.available:
            return
        import psutil

        try:
            root = psutil.Process(self.pid)
        except psutil.NoSuchProcess:
            return
        while not self._stop_event.is_set():
            try:
                procs = root.children(recursive=True)
            except psutil.NoSuchProcess:
                return
            total = 0
            for p in procs:
                with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
                    total += p.memory_info().rss
            self.peak_bytes = max(self.peak_bytes, total)
            self.max_processes = max(self.max_processes, len(procs))
            self._stop_event.wait(SAMPLE_SECONDS)

    def stop(self) -> None:
        self._stop_event.set()
        self.join(5.0)


@dataclass
class _Measured:
    wall_s: float
    user_s: float
    sys_s: float
    peak_rss_mb: float | None
    rss_source: str
    processes: int
    exit_code: int | None
    timed_out: bool
    stdout: str
    stderr: str
    #: CPU seconds the whole machine was busy between the tool's start and its exit.
    machine_busy_s: float | None = None
    #: CPU seconds of the PostgreSQL server while the tool ran (``dbcost.ServerCpu``).
    server_cpu_s: float | None = None

    @property
    def other_cpu_s(self) -> float | None:
        """What the rest of the machine used while the tool ran (the tool's CPU time after its
        main process exited, when its pool shuts down, makes this a slight underestimate)."""
        if self.machine_busy_s is None:
            return None
        return max(0.0, self.machine_busy_s - self.user_s - self.sys_s)


def measure(
    cmd: Sequence[str], workdir: Path, name: str, timeout: float, server: str | None = None
) -> _Measured:
    """Run ``cmd`` under the launcher and sample its tree; outputs go to files in ``workdir``.
    ``server``: the PostgreSQL server (a DSN) whose CPU over the run is measured too."""
    out_json = workdir / f"{name}.rusage.json"
    out_path, err_path = workdir / f"{name}.stdout", workdir / f"{name}.stderr"
    launcher = [
        sys.executable,
        "-c",
        "import sys; from idemcrawl.lab.bench.crawl import _launch_main; "
        "sys.exit(_launch_main(sys.argv[1:]))",
        str(out_json),
        str(timeout),
        "--",
        *cmd,
    ]
    # No proxy variables: the site is on loopback and must be reached directly (Scrapy would
    # otherwise send every request through an http_proxy from the environment).
    env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
    with open(out_path, "wb") as so, open(err_path, "wb") as se:
        server_cpu = None
        if server is not None:
            from . import dbcost

            # Read before the tool starts: every connection it opens is then counted whole.
            server_cpu = dbcost.ServerCpu(server)
            server_cpu.start()
        lp = subprocess.Popen(
            launcher,
            stdin=subprocess.DEVNULL,
            stdout=so,
            stderr=se,
            env=env,
            start_new_session=True,
        )
        sampler = _TreeSampler(lp.pid)
        sampler.start()
        try:
            lp.wait(timeout + 60)
        except subprocess.TimeoutExpired:
            killpg(lp.pid)
            lp.wait()
        finally:
            sampler.stop()
            server_cpu_s = server_cpu.stop() if server_cpu is not None else None
    stdout = out_path.read_text(errors="replace")
    stderr = err_path.read_text(errors="replace")
    try:
        data = json.loads(out_json.read_text())
    except (OSError, ValueError):
        return _Measured(0.0, 0.0, 0.0, None, "none", 0, None, False, stdout, stderr)
    if sampler.available and sampler.peak_bytes:
        rss, source = sampler.peak_bytes / 2**20, "tree"
    else:
        rss, source = data["maxrss_kb"] / 1024, "maxrss"
    return _Measured(
        wall_s=data["wall_s"],
        user_s=data["user_s"],
        sys_s=data["sys_s"],
        peak_rss_mb=rss,
        rss_source=source,
        processes=sampler.max_processes,
        exit_code=data["exit_code"],
        timed_out=data["timed_out"],
        stdout=stdout,
        stderr=stderr,
        machine_busy_s=data.get("machine_busy_s"),
        server_cpu_s=server_cpu_s,
    )


# -- the benchmark ------------------------------------------------------------------------------


def crawl_source_files() -> list[Path]:
    """The crawler's own source: every ``.py`` file of the package outside ``lab/``.

    ``lab/`` is left out (the benchmark's own code, the simulator, the test sites), so that a
    change there does not make the rounds of a report look incomparable; it is the same set of
    files the git note of :func:`environment` calls "idemcrawl sources". Listed from disk rather
    than by importing the command line and reading ``sys.modules``: the lab sits below the CLI
    (the CLI runs the benchmark), so it must not import it back.
    """
    package = Path(__file__).resolve().parents[2]  # src/idemcrawl/lab/bench/crawl.py
    lab = package / "lab"
    return sorted(p for p in package.rglob("*.py") if lab not in p.parents)


def source_fingerprint(files: Sequence[Path]) -> str:
    """A short hash of ``files`` as they are now on disk, taken before each idemcrawl run.

    The benchmark can run for half an hour in a checkout others are editing; different
    fingerprints in one report mean its rounds measured different code.
    """
    digest = hashlib.sha256()
    for path in files:
        digest.update(str(path).encode() + b"\0")
        with contextlib.suppress(OSError):
            digest.update(path.read_bytes())
    return digest.hexdigest()[:10]


def machine_busy_seconds() -> float | None:
    """CPU seconds all CPUs have spent not idle since boot (Linux ``/proc/stat``).

    The difference over a run, minus the tool's own CPU time, is what everything else on the
    machine used meanwhile: on a shared machine, the number that says whether to trust a run.
    """
    try:
        with open("/proc/stat", encoding="ascii") as fh:
            fields = fh.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu":
        return None
    ticks = [int(x) for x in fields[1:9]]  # user nice system idle iowait irq softirq steal
    busy = sum(ticks) - ticks[3] - ticks[4]
    return busy / os.sysconf("SC_CLK_TCK")


def scrapy_available() -> bool:
    return importlib.util.find_spec("scrapy") is not None


def benchmarks_dir(opts: BenchOptions) -> Path:
    """Where the comparators' scripts are: they live in the checkout, not in the package.

    The option, then ``$IDEMCRAWL_BENCHMARKS_DIR``, then the checkout this module sits in (an
    editable install), then ``./benchmarks`` (a regular install run from the checkout, as CI
    does).
    """
    candidates = [
        opts.benchmarks_dir,
        os.environ.get("IDEMCRAWL_BENCHMARKS_DIR"),
        Path(__file__).resolve().parents[4] / "benchmarks",  # src/idemcrawl/lab/bench/crawl.py
        Path.cwd() / "benchmarks",
    ]
    found = [Path(c) for c in candidates if c]
    for path in found:
        if (path / "bare_crawler.py").is_file():
            return path
    return found[0]


def plan_tools(opts: BenchOptions) -> tuple[list[str], dict[str, str]]:
    """The tools to run, in round order, and the comparators skipped with the reason."""
    tools, skipped = ["idemcrawl"], {}
    scripts = {"bare": "bare_crawler.py", "scrapy": "scrapy_spider.py"}
    for name in dict.fromkeys(opts.compare):
        if name == SQLITE:
            tools.append(name)
            continue
        script = benchmarks_dir(opts) / scripts[name]
        if name == "scrapy" and not scrapy_available():
            skipped[name] = "scrapy not installed (pip install 'idemcrawl[bench]')"
        elif not script.is_file():
            skipped[name] = f"{script} not found (run from a source checkout)"
        else:
            tools.append(name)
    return tools, skipped


def _with_schema(dsn: str, schema: str) -> str:
    """``dsn`` with idemcrawl's ``schema=`` query parameter set to ``schema``."""
    parts = urlsplit(dsn)
    query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k != "schema"]
    return urlunsplit(parts._replace(query=urlencode([*query, ("schema", schema)])))


def _db_for(opts: BenchOptions, scratch: Path, run_id: str, tool: str = "idemcrawl") -> str:
    """A fresh store for one run: a new schema on ``--db``'s server, or a new SQLite file (in
    ``--db``'s directory, else in ``scratch``; always in ``scratch`` for the sqlite tool)."""
    db = "sqlite" if tool == SQLITE else opts.db
    if _is_dsn(db):
        return _with_schema(db, f"bench_crawl_{uuid.uuid4().hex[:8]}_{run_id}")
    base = scratch if db == "sqlite" else Path(db)
    path = base / f"idemcrawl-{run_id}.db"
    for suffix in ("", "-wal", "-shm", ".lock"):
        with contextlib.suppress(FileNotFoundError):
            os.remove(f"{path}{suffix}")
    return str(path)


def tool_command(
    tool: str, seeds: Sequence[str], opts: BenchOptions, db: str, out: Path
) -> list[str]:
    if tool in IDEMCRAWL_TOOLS:
        return [
            sys.executable, "-m", "idemcrawl", "crawl", *seeds,
            "--db", db,
            "--spider", "idemcrawl.lab.bench.crawl:BenchSpider",
            "--concurrency", str(CONCURRENCY),
            "--host-concurrency", str(HOST_CONCURRENCY),
            "--delay", "0",
            "--latency-factor", "0",
            "--allow-private", "127.0.0.1",
            # Like for like: neither Scrapy nor the bare loop archives responses. Measure the
            # archive's cost with --crawl-args=--warc (docs/benchmarks.md has both figures).
            "--no-warc",
            "--quiet",
            "--json",
            *opts.crawl_args,  # later flags win: an experiment can override the caps above
        ]  # fmt: skip
    script = benchmarks_dir(opts) / ("bare_crawler.py" if tool == "bare" else "scrapy_spider.py")
    if tool == "bare":
        return [sys.executable, str(script), *seeds]
    return [sys.executable, str(script), "--items", str(out), *seeds]


def _items(tool: str, stdout: str) -> int | None:
    """Items the tool says it stored: the last JSON line of its stdout."""
    for line in reversed(stdout.strip().splitlines()):
        with contextlib.suppress(ValueError):
            data = json.loads(line)
            value = data.get("records" if tool in IDEMCRAWL_TOOLS else "items")
            return int(value) if value is not None else None
    return None


def environment(server: str) -> dict[str, str]:
    env = {
        "CPUs": str(os.cpu_count()),
        "OS": platform.platform(terse=True),
        "Python": platform.python_version(),
    }
    for dist in ("idemcrawl", "scrapy", "aiohttp", "selectolax"):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            env[dist] = importlib.metadata.version(dist)
    commit = _git_commit()
    if commit:
        env["commit"] = commit
    if server == "nginx":
        from .site import nginx_path

        binary = nginx_path()
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            r = subprocess.run([str(binary), "-v"], capture_output=True, text=True, timeout=5)
            env["nginx"] = r.stderr.strip().rpartition("/")[2]
    return env


def _git_commit() -> str | None:
    """The checkout's commit, plus whether idemcrawl's sources differ from it.

    Read-only: ``GIT_OPTIONAL_LOCKS=0`` keeps ``git diff`` from refreshing the index. Without
    the "modified" note a report would pin code that was not what ran.
    """
    repo = Path(__file__).resolve().parents[4]
    if not (repo / ".git").exists():
        return None

    def git(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["git", "-C", str(repo), *args],
            capture_output=True,
            text=True,
            timeout=10,
            env={**os.environ, "GIT_OPTIONAL_LOCKS": "0"},
        )

    with contextlib.suppress(OSError, subprocess.SubprocessError):
        head = git("rev-parse", "--short", "HEAD")
        if head.returncode != 0:
            return None
        dirty = git("diff", "--quiet", "HEAD", "--", "src/idemcrawl", ":!src/idemcrawl/lab")
        note = " (idemcrawl sources modified)" if dirty.returncode == 1 else ""
        return head.stdout.strip() + note
    return None


def run_bench(opts: BenchOptions, log: Callable[[str], None] | None = None) -> BenchReport:
    """Generate the site, serve it, run every tool ``opts.runs`` times interleaved, report;
    then, with ``opts.instructions``, count every tool's instructions per page."""

    opts.validate()
    say = log or (lambda _line: None)
    tools, skipped = plan_tools(opts)
    for tool, why in skipped.items():
        say(f"skipping {tool}: {why}")
    spec = SiteSpec(hosts=opts.hosts, pages=opts.pages, page_kb=opts.page_kb, links=opts.links)
    # Before the timed rounds: a missing counter must not be found out half an hour later.
    counter = detect_counter(opts.instructions_counter) if opts.instructions else None
    started = time.perf_counter()
    sources = crawl_source_files()
    with tempfile.TemporaryDirectory(prefix="idemcrawl-bench-", dir=opts.workdir) as tmp:
        scratch = Path(tmp)
        report = _timed_rounds(opts, spec, tools, skipped, scratch, sources, say)
        if counter is not None:
            say(f"counting instructions with {counter.describe()}")
            report.instructions = _count_instructions(opts, tools, counter, scratch, say)
        report.seconds = time.perf_counter() - started
    return report


def _timed_rounds(
    opts: BenchOptions,
    spec: SiteSpec,
    tools: Sequence[str],
    skipped: dict[str, str],
    scratch: Path,
    sources: Sequence[Path],
    say: Callable[[str], None],
) -> BenchReport:
    """The interleaved rounds on the benchmark site: the report without instructions."""

    with StaticSite(spec, server=opts.server, workdir=opts.workdir) as site:
        report = BenchReport(
            options=opts,
            command=opts.command_line(),
            server=site.kind,
            environment={
                **environment(site.kind),
                "crawl code": source_fingerprint(sources),
            },
            skipped=skipped,
        )
        say(f"site: {spec.total_pages} pages on {spec.hosts} hosts, served by {site.kind}")
        for rnd in range(1, opts.runs + 1):
            for tool in tools:
                run_id = f"r{rnd}_{tool}"
                db = _db_for(opts, scratch, run_id, tool)
                items_out = scratch / f"{run_id}.items.jsonl"
                cmd = tool_command(tool, site.seeds, opts, db, items_out)
                source = source_fingerprint(sources)
                site.reset_log()
                server = split_schema(db)[0] if _is_dsn(db) else None
                m = measure(cmd, scratch, run_id, opts.timeout, server)
                stats = site.log_stats()
                if _is_dsn(db):
                    try:
                        drop_run_schema(db)
                    except Exception as exc:  # a leftover schema must not lose the results
                        say(f"could not drop {mask_dsn(db)}: {exc}")
                error = None
                if m.timed_out:
                    error = f"timed out after {opts.timeout:g} s"
                elif m.exit_code != 0:
                    tail = m.stderr.strip().splitlines()[-1:] or [""]
                    error = f"exit status {m.exit_code}: {tail[0][:200]}"
                result = RunResult(
                    tool=tool,
                    round=rnd,
                    ok=error is None,
                    error=error,
                    wall_s=m.wall_s,
                    cpu_user_s=m.user_s,
                    cpu_sys_s=m.sys_s,
                    peak_rss_mb=m.peak_rss_mb,
                    rss_source=m.rss_source,
                    processes=m.processes,
                    pages=stats.unique_pages,
                    page_requests=stats.page_requests,
                    robots=stats.robots,
                    requests=stats.requests,
                    duplicates=stats.duplicates,
                    items=_items(tool, m.stdout),
                    exit_code=m.exit_code,
                    other_cpu_s=m.other_cpu_s,
                    server_cpu_s=m.server_cpu_s,
                    source=source if tool in IDEMCRAWL_TOOLS else None,
                )
                report.runs.append(result)
                rss = _fmt(result.peak_rss_mb, 0)
                say(
                    f"round {rnd}/{opts.runs} {tool}: {result.pages} pages in "
                    f"{result.wall_s:.1f} s ({result.pages_per_s:.0f}/s), CPU "
                    f"{result.cpu_s:.1f} s (rest of machine {_fmt(result.other_cpu_s, 1)} s"
                    + (
                        ""
                        if result.server_cpu_s is None
                        else f", of it the PostgreSQL server {result.server_cpu_s:.1f} s"
                    )
                    + "), "
                    f"peak RSS {rss} MB, {result.duplicates} duplicates"
                    + ("" if result.ok else f" - FAILED: {error}")
                )
                with contextlib.suppress(FileNotFoundError):
                    items_out.unlink()
    return report


def _count_instructions(
    opts: BenchOptions,
    tools: Sequence[str],
    counter: Counter,
    scratch: Path,
    say: Callable[[str], None],
) -> InstructionReport:
    """Every tool's instructions per page, each run with the same command as its timed rounds
    (a fresh store for idemcrawl, schema dropped after a PostgreSQL run)."""

    def command_for(
        tool: str, seeds: Sequence[str], run_id: str
    ) -> tuple[list[str], Callable[[], None]]:
        db = _db_for(opts, scratch, run_id, tool)
        items_out = scratch / f"{run_id}.items.jsonl"

        def cleanup() -> None:
            with contextlib.suppress(FileNotFoundError):
                items_out.unlink()
            if _is_dsn(db):
                try:
                    drop_run_schema(db)
                except Exception as exc:  # a leftover schema must not lose the counts
                    say(f"could not drop {mask_dsn(db)}: {exc}")

        return tool_command(tool, seeds, opts, db, items_out), cleanup

    shape = SiteSpec(
        hosts=opts.instructions_hosts,
        pages=opts.instructions_pages[0],
        page_kb=opts.page_kb,
        links=opts.links,
    )
    return measure_instructions(
        tools,
        shape,
        opts.instructions_pages,
        command_for,
        counter,
        repeats=opts.instructions_runs,
        server=opts.server,
        workdir=opts.workdir,
        timeout=opts.timeout,
        log=say,
    )


# -- command line -------------------------------------------------------------------------------


def add_bench_crawl_arguments(p: argparse.ArgumentParser) -> None:
    """The ``bench crawl`` flags; shared by the idemcrawl CLI and ``python -m``."""
    p.add_argument("--hosts", type=int, default=50, help="hosts (ports) in the site (default 50)")
    p.add_argument("--pages", type=int, default=400, help="pages per host (default 400)")
    p.add_argument("--page-kb", type=float, default=15.0, help="page size in KB (default 15)")
    p.add_argument("--links", type=int, default=40, help="links per page (default 40)")
    p.add_argument(
        "--db",
        default="sqlite",
        help="idemcrawl's database: 'sqlite' (fresh temp file per run), a directory for those "
        "files, or a postgresql:// URL (a fresh schema per run, dropped afterwards)",
    )
    p.add_argument(
        "--compare",
        default="scrapy,bare",
        help="comparators, comma-separated: scrapy, bare, sqlite (with --db postgresql://...: "
        "the same crawl on SQLite, interleaved; idemcrawl/sqlite is the backends' ratio), or "
        "'none' (default scrapy,bare)",
    )
    p.add_argument("--runs", type=int, default=3, help="interleaved rounds (default 3)")
    p.add_argument(
        "--server",
        choices=("auto", "nginx", "aiohttp"),
        default="auto",
        help="static server: nginx when installed (auto), else aiohttp",
    )
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds per run (default 3600)")
    p.add_argument("--workdir", default=None, help="where the site and databases go")
    p.add_argument(
        "--crawl-args",
        default="",
        help="extra flags for idemcrawl's crawl command, one shell-quoted string "
        "(e.g. --crawl-args '--parse-workers 2')",
    )
    p.add_argument(
        "--instructions",
        action="store_true",
        help="after the timed rounds, count each tool's CPU instructions per page (perf stat "
        "where it counts, else valgrind): a figure the machine's load does not move",
    )
    p.add_argument(
        "--instructions-hosts",
        type=int,
        default=10,
        help="hosts of the sites counted with --instructions (default 10)",
    )
    p.add_argument(
        "--instructions-pages",
        type=_size_pair,
        default=(20, 200),
        metavar="SMALL,LARGE",
        help="pages per host of the small and the large counted site; instructions per page "
        "is the difference of the two counts over the difference of pages (default 20,200)",
    )
    p.add_argument(
        "--instructions-runs",
        type=int,
        default=1,
        help="counts of each site per tool; 2 or more report their spread (default 1)",
    )
    p.add_argument(
        "--instructions-counter",
        choices=INSTRUCTION_COUNTERS,
        default="auto",
        help="perf, valgrind, or auto: perf when its instructions counter works here",
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("-o", "--output", default=None, help="also write the markdown report here")


def _size_pair(text: str) -> tuple[int, int]:
    """``SMALL,LARGE`` for --instructions-pages."""
    parts = text.split(",")
    if len(parts) != 2:
        raise argparse.ArgumentTypeError("expected SMALL,LARGE (e.g. 20,200)")
    try:
        return int(parts[0]), int(parts[1])
    except ValueError:
        raise argparse.ArgumentTypeError("expected two integers, SMALL,LARGE") from None


def options_from_args(a: argparse.Namespace, argv: Sequence[str] | None = None) -> BenchOptions:
    compare = tuple(c.strip() for c in a.compare.split(",") if c.strip() and c != "none")
    command = None
    if argv is not None:
        command = shlex.join(["idemcrawl", "bench", "crawl", *argv])
    return BenchOptions(
        hosts=a.hosts,
        pages=a.pages,
        page_kb=a.page_kb,
        links=a.links,
        db=a.db,
        compare=compare,
        runs=a.runs,
        server=a.server,
        timeout=a.timeout,
        workdir=a.workdir,
        command=command,
        crawl_args=tuple(shlex.split(a.crawl_args)),
        instructions=a.instructions,
        instructions_hosts=a.instructions_hosts,
        instructions_pages=a.instructions_pages,
        instructions_runs=a.instructions_runs,
        instructions_counter=a.instructions_counter,
    )


def cmd_bench_crawl(a: argparse.Namespace, argv: Sequence[str] | None = None) -> int:
    """Run the benchmark, print the report; 2 on a usage error (or no instruction counter), 1
    if any run failed (a timed one or an instruction count)."""
    try:
        opts = options_from_args(a, argv)
        opts.validate()
        report = run_bench(opts, log=lambda line: print(line, file=sys.stderr, flush=True))
    except (BenchError, ValueError) as exc:
        print(f"idemcrawl bench crawl: error: {exc}", file=sys.stderr)
        return 2
    text = report.text()
    if a.output:
        Path(a.output).write_text(text, encoding="utf-8")
    print(json.dumps(report.as_dict(), indent=2) if a.json else text)
    failed = not all(r.ok for r in report.runs)
    failed |= report.instructions is not None and bool(report.instructions.failed)
    return 1 if failed else 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m idemcrawl.lab.bench.crawl [flags]``, the same as ``idemcrawl bench crawl``."""
    args = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(
        prog="idemcrawl bench crawl",
        description="Crawl a generated site with idemcrawl, Scrapy and a bare aiohttp crawler.",
    )
    add_bench_crawl_arguments(p)
    return cmd_bench_crawl(p.parse_args(args), args)


if __name__ == "__main__":
    sys.exit(main())
