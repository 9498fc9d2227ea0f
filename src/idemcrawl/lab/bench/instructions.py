"""Instructions per page: a CPU cost of a crawl that does not depend on how busy the machine is.

CPU seconds per page move with everything else the machine does (cache and memory-bandwidth
contention, frequency scaling, a neighbour's test suite), so on a shared 2-core machine a 10 %
change cannot be told from noise. The number of instructions a tool executes for the same crawl
barely moves. This module counts them for a tool's whole process tree (the crawl process, the
forkserver, the parser processes...) with one of two counters:

* ``perf stat -e instructions`` (the CPU's hardware counter) where the kernel and the machine
  support it; on a VM without a PMU it answers ``<not supported>``, which is detected;
* else valgrind's cachegrind (``--cache-sim=no``, ``Ir`` of every traced process, one output file
  per process, summed): a simulated count of user-space instructions, some 20-50x slower than the
  tool alone, but exact and independent of the machine's load.

A crawl's count is dominated by start-up (imports, the parser pool, the store), so a single
count says little about the cost of a page. The figure reported is the difference between two
crawls of sites of the same shape and different sizes:
``(Ir(large) - Ir(small)) / (pages(large) - pages(small))``, what one more page costs.

``crawl.py`` (the benchmark) drives this module and gives it each tool's command line; nothing
here imports it, so the counting can be tested and reused without the benchmark.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final

from .reaper import killpg, reap_descendants, set_subreaper
from .site import SiteSpec, StaticSite

__all__ = [
    "COUNTERS",
    "BenchError",
    "Count",
    "Counter",
    "InstructionReport",
    "ToolInstructions",
    "count_run",
    "detect_counter",
    "measure_instructions",
    "parse_cachegrind",
    "parse_perf_stat",
    "per_page_instructions",
    "sum_cachegrind",
]

#: ``auto`` takes perf when its instructions counter works here, else valgrind.
COUNTERS: Final = ("auto", "perf", "valgrind")
#: After the tool's main process exits, how long its descendants (the forkserver, parser
#: processes) get to exit and write their counts before they are killed and the run fails.
#: Generous: under valgrind a process's exit (and cachegrind's dump) takes seconds.
DESCENDANT_GRACE_S: Final = 120.0
#: Exit statuses of the reaper when it, not the tool, ended the run.
_EXIT_TIMEOUT: Final = 124
_EXIT_STRAGGLERS: Final = 125


class BenchError(Exception):
    """The benchmark cannot run as asked (bad options, nothing to compare, a counter missing...).

    Defined here rather than in ``crawl.py`` because ``crawl.py`` imports this module (and
    re-exports the class), not the other way round.
    """


# -- the counters -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Counter:
    """An instruction counter found on this machine: how to wrap a command and read its count."""

    #: ``"perf"`` or ``"valgrind"``.
    kind: str
    binary: str
    version: str

    def describe(self) -> str:
        """What the report says about the counter: the figures of two counters differ."""
        if self.kind == "perf":
            return (
                f"{self.version}: `perf stat -e instructions`, the CPU's hardware counter, "
                "every process of the tool (user and kernel, as the kernel allows)"
            )
        return (
            f"{self.version}: cachegrind (`--cache-sim=no`), simulated user-space instructions "
            "(Ir) of every process of the tool, summed"
        )

    def command(
        self, cmd: Sequence[str], outdir: Path, grace_s: float, timeout: float
    ) -> list[str]:
        """``cmd`` run under the counter and under the reaper (see :func:`_reap_main`).

        valgrind goes inside the reaper (the reaper itself is not counted); perf goes outside it
        so that its inherited counters are read only after every descendant has exited (perf
        would otherwise print when the main process exits and lose the forkserver's count).
        The reaper is the same Python process in the small and the large run, so its own
        instructions cancel out of the per-page difference.
        """
        if self.kind == "perf":
            counted = _reaper_command(list(cmd), grace_s, timeout)
            return [
                self.binary, "stat", "-e", "instructions", "-x,",
                "-o", str(outdir / "perf.csv"), "--", *counted,
            ]  # fmt: skip
        valgrind = [
            self.binary,
            "--tool=cachegrind",
            "--cache-sim=no",
            "--trace-children=yes",
            f"--cachegrind-out-file={outdir}/cg.%p",
            f"--log-file={outdir}/valgrind.%p.log",
            *cmd,
        ]
        return _reaper_command(valgrind, grace_s, timeout)

    def read(self, outdir: Path) -> tuple[int, int | None]:
        """Instructions of the run whose outputs are in ``outdir``, and processes counted
        (None where the counter does not say)."""
        if self.kind == "perf":
            try:
                text = (outdir / "perf.csv").read_text(errors="replace")
            except OSError as exc:
                raise BenchError(f"perf stat wrote no output: {exc}") from None
            return parse_perf_stat(text), None
        return sum_cachegrind(outdir)


def _version(binary: str) -> str:
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        r = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=10)
        if r.returncode == 0 and r.stdout.strip():
            return r.stdout.strip().splitlines()[0]
    return Path(binary).name


def perf_instructions_supported(perf: str) -> tuple[bool, str]:
    """Whether ``perf stat -e instructions`` counts here, and if not what it answered.

    A VM without a PMU answers ``<not supported>``; a kernel that forbids it
    (``perf_event_paranoid``) fails; both mean: use valgrind.
    """
    try:
        r = subprocess.run(
            [perf, "stat", "-e", "instructions", "-x,", "--", "true"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return False, str(exc)
    if r.returncode != 0:
        return False, (r.stderr.strip().splitlines() or [f"exit status {r.returncode}"])[-1]
    try:
        parse_perf_stat(r.stderr)
    except BenchError as exc:
        return False, str(exc)
    return True, ""


def detect_counter(choice: str = "auto") -> Counter:
    """The counter to use: ``perf`` when it counts here, else ``valgrind``; or the one asked for.

    Raises BenchError naming what is missing, before any crawl has run.
    """
    if choice not in COUNTERS:
        raise BenchError(f"--instructions-counter must be one of {', '.join(COUNTERS)}")
    perf_note = ""
    if choice in ("auto", "perf"):
        perf = shutil.which("perf")
        if perf is None:
            perf_note = "perf is not installed"
        else:
            ok, why = perf_instructions_supported(perf)
            if ok:
                return Counter("perf", perf, _version(perf))
            perf_note = f"perf stat -e instructions does not count here ({why})"
        if choice == "perf":
            raise BenchError(f"--instructions-counter perf: {perf_note}")
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        prefix = f"{perf_note} and " if perf_note else ""
        raise BenchError(
            f"--instructions: {prefix}valgrind is not installed (apt-get install valgrind)"
        )
    return Counter("valgrind", valgrind, _version(valgrind))


# -- reading what the counters wrote ------------------------------------------------------------


def parse_cachegrind(text: str, name: str = "cachegrind output") -> int:
    """``Ir`` of one cachegrind output file: its ``summary:`` line, in the ``events:`` order.

    A file without a summary is from a process that did not finish writing it; its count would
    be wrong, so it is an error rather than a zero.
    """
    events: list[str] | None = None
    for line in text.splitlines():
        if line.startswith("events:"):
            events = line.split()[1:]
        elif line.startswith(("summary:", "totals:")):
            values = line.split()[1:]
            index = events.index("Ir") if events and "Ir" in events else 0
            try:
                return int(values[index])
            except (IndexError, ValueError):
                raise BenchError(f"{name}: unreadable summary line {line!r}") from None
    raise BenchError(f"{name}: no summary line (did the process exit normally?)")


def valgrind_count(argv: Sequence[str], out: Path, tool: str = "cachegrind") -> int:
    """Instructions (``Ir``) of one run of ``argv`` under valgrind's ``tool`` (cachegrind or
    callgrind), its output file kept at ``out`` for a closer look. The benchmark scripts run
    themselves this way, twice with different sizes, and take the difference per page."""
    extra = ["--cache-sim=no"] if tool == "cachegrind" else []
    subprocess.run(
        ["valgrind", f"--tool={tool}", *extra, f"--{tool}-out-file={out}", *argv],
        check=True,
        capture_output=True,
    )
    return parse_cachegrind(out.read_text(), out.name)


def sum_cachegrind(outdir: Path) -> tuple[int, int]:
    """Instructions of every process of a run (one ``cg.PID`` file each) and how many there were."""
    files = sorted(outdir.glob("cg.*"))
    if not files:
        raise BenchError(f"cachegrind wrote no output in {outdir}")
    total = 0
    for path in files:
        total += parse_cachegrind(path.read_text(errors="replace"), path.name)
    return total, len(files)


_PERF_VALUE = re.compile(r"^\s*([0-9][0-9.,]*|<[^>]+>)\s*$")


def parse_perf_stat(text: str) -> int:
    """The instructions count of ``perf stat -e instructions -x,`` output.

    Lines are ``value,unit,event,...``; the event may carry a modifier (``instructions:u``).
    ``<not supported>`` and ``<not counted>`` are errors, not zeros.
    """
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        fields = line.split(",")
        if len(fields) < 3 or not fields[2].startswith("instructions"):
            continue
        value = fields[0].strip()
        if value.startswith("<"):
            raise BenchError(f"perf stat: instructions {value}")
        if not _PERF_VALUE.match(value):
            raise BenchError(f"perf stat: unreadable count {value!r}")
        return int(float(value))
    raise BenchError("perf stat: no instructions line in its output")


# -- running a tool under a counter -------------------------------------------------------------


def _reaper_command(cmd: list[str], grace_s: float, timeout: float) -> list[str]:
    return [
        sys.executable,
        "-c",
        "import sys; from idemcrawl.lab.bench.instructions import _reap_main; "
        "sys.exit(_reap_main(sys.argv[1:]))",
        f"{grace_s:g}",
        f"{timeout:g}",
        "--",
        *cmd,
    ]


def _reap_main(argv: Sequence[str]) -> int:
    """``GRACE TIMEOUT -- CMD...``: run CMD and wait until every process it started has exited.

    A process's count is written (cachegrind) or folded into its parent's (perf) only when it
    exits, and idemcrawl's forkserver outlives the main process by a moment, so the reaper
    makes itself a child subreaper, waits for CMD, then reaps the orphans re-parented to it.
    Exits with CMD's status; 124 when CMD ran past TIMEOUT, 125 when a descendant was still
    running GRACE seconds after CMD exited (both killed: their counts are missing, and the run
    must not pass for complete). Standard library only at call time.
    """
    grace, timeout = float(argv[0]), float(argv[1])
    cmd = list(argv[3:])
    set_subreaper()
    timed_out = threading.Event()
    proc = subprocess.Popen(cmd, start_new_session=True)

    def expire() -> None:
        timed_out.set()
        killpg(proc.pid)

    timer = threading.Timer(timeout, expire)
    timer.daemon = True
    timer.start()
    proc.wait()
    killed = reap_descendants(proc.pid, grace, 0.02)
    timer.cancel()
    if timed_out.is_set():
        print(f"instruction count: timed out after {timeout:g} s", file=sys.stderr)
        return _EXIT_TIMEOUT
    if killed:
        print(
            f"instruction count: a descendant of the tool was still running {grace:g} s after "
            "it exited and was killed; its instructions are not counted",
            file=sys.stderr,
        )
        return _EXIT_STRAGGLERS
    return proc.returncode


def _last_line(*texts: str) -> str:
    for text in texts:
        lines = [ln for ln in text.strip().splitlines() if ln.strip()]
        if lines:
            return lines[-1][:300]
    return ""


@dataclass
class Count:
    """One counted crawl: a tool on one site."""

    tool: str
    hosts: int
    pages_per_host: int
    #: Distinct pages the server saw fetched (must be every page of the site).
    pages: int
    duplicates: int
    instructions: int
    #: Processes counted (cachegrind output files); None for perf, which does not say.
    processes: int | None
    #: Wall time of the counted run (the counter slows the tool down: not a speed figure).
    seconds: float


def count_run(
    cmd: Sequence[str],
    counter: Counter,
    workdir: Path,
    name: str,
    timeout: float,
    grace_s: float = DESCENDANT_GRACE_S,
) -> tuple[int, int | None, float]:
    """Run ``cmd`` under ``counter``: (instructions, processes counted, wall seconds).

    Raises BenchError with the tool's last stderr line when the run fails or times out. Outputs
    go to ``workdir/name.*`` and the counter's files are removed afterwards (cachegrind's are a
    megabyte per process).
    """
    outdir = workdir / f"{name}.counts"
    shutil.rmtree(outdir, ignore_errors=True)
    outdir.mkdir(parents=True)
    full = counter.command(cmd, outdir, grace_s, timeout)
    out_path, err_path = workdir / f"{name}.stdout", workdir / f"{name}.stderr"
    # No proxy variables: the site is on loopback and must be reached directly.
    env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
    started = time.perf_counter()
    try:
        with open(out_path, "wb") as so, open(err_path, "wb") as se:
            proc = subprocess.Popen(
                full, stdin=subprocess.DEVNULL, stdout=so, stderr=se, env=env,
                start_new_session=True,
            )  # fmt: skip
            try:
                code = proc.wait(timeout + grace_s + 60)
            except subprocess.TimeoutExpired:  # the reaper itself hangs: end everything
                killpg(proc.pid)
                proc.wait()
                raise BenchError(f"{name}: the counted run did not end; killed") from None
        seconds = time.perf_counter() - started
        if code != 0:
            stderr = err_path.read_text(errors="replace")
            logs = "\n".join(
                p.read_text(errors="replace") for p in sorted(outdir.glob("valgrind.*.log"))
            )
            tail = _last_line(stderr, logs) or "no error output"
            raise BenchError(f"{name}: exit status {code} under {counter.kind}: {tail}")
        instructions, processes = counter.read(outdir)
    finally:
        shutil.rmtree(outdir, ignore_errors=True)
    return instructions, processes, seconds


# -- per page -----------------------------------------------------------------------------------


def per_page_instructions(small: Count, large: Count) -> float:
    """What one more page costs: the difference of two crawls over the difference of pages.

    Refuses a pair that cannot give it: a "large" run that fetched no more pages than the
    small one (division by zero or a sign flip), or one that took no more instructions (a run
    lost part of its count, e.g. a process that died without writing it).
    """
    if large.pages <= small.pages:
        raise BenchError(
            f"{large.tool}: the large run fetched {large.pages} pages, not more than the small "
            f"run's {small.pages}: no per-page figure"
        )
    if large.instructions <= small.instructions:
        raise BenchError(
            f"{large.tool}: the large run counted {large.instructions:,} instructions, not more "
            f"than the small run's {small.instructions:,}: part of a count is missing"
        )
    return (large.instructions - small.instructions) / (large.pages - small.pages)


@dataclass
class ToolInstructions:
    """A tool's counts on the small and the large site, ``repeats`` of each."""

    tool: str
    small: list[Count] = field(default_factory=list)
    large: list[Count] = field(default_factory=list)
    error: str | None = None

    def pair_figures(self) -> list[float]:
        """Instructions per page of each (small, large) pair of the same repeat; a pair that
        gives none (see :func:`per_page_instructions`) is left out, the median figure says so."""
        figures = []
        for small, large in zip(self.small, self.large, strict=False):
            with contextlib.suppress(BenchError):
                figures.append(per_page_instructions(small, large))
        return figures

    @property
    def per_page(self) -> float | None:
        """From the median counts of each size: the figure the report gives."""
        if self.error or not self.small or not self.large:
            return None
        small = _median_count(self.small)
        large = _median_count(self.large)
        return per_page_instructions(small, large)

    def spread(self) -> float | None:
        """Largest relative distance of a count from its size's median (0.001 = 0.1 %)."""
        worst = None
        for counts in (self.small, self.large):
            if len(counts) < 2:
                continue
            mid = statistics.median(c.instructions for c in counts)
            for c in counts:
                d = abs(c.instructions - mid) / mid
                worst = d if worst is None else max(worst, d)
        return worst


def _median_count(counts: Sequence[Count]) -> Count:
    """A Count with the median instructions of ``counts`` (same site, so the same pages)."""
    first = counts[0]
    instructions = round(statistics.median(c.instructions for c in counts))
    return Count(
        first.tool, first.hosts, first.pages_per_host, first.pages, first.duplicates,
        instructions, first.processes, statistics.median(c.seconds for c in counts),
    )  # fmt: skip


@dataclass
class InstructionReport:
    """Every tool's instructions per page, for the benchmark's markdown and JSON reports."""

    counter: str
    hosts: int
    small_pages: int
    large_pages: int
    repeats: int
    tools: dict[str, ToolInstructions] = field(default_factory=dict)
    #: Comparators not counted and why (e.g. too slow under valgrind).
    skipped: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def failed(self) -> list[str]:
        return [t for t, ti in self.tools.items() if ti.error]

    def ratio(self, other: str) -> float | None:
        """idemcrawl's instructions per page over ``other``'s."""
        mine, theirs = self.tools.get("idemcrawl"), self.tools.get(other)
        if mine is None or theirs is None:
            return None
        a, b = mine.per_page, theirs.per_page
        return a / b if a is not None and b else None

    def as_dict(self) -> dict[str, Any]:
        tools: dict[str, Any] = {}
        for name, ti in self.tools.items():
            tools[name] = {
                "per_page": ti.per_page,
                "pair_per_page": ti.pair_figures() if not ti.error else [],
                "spread": ti.spread(),
                "error": ti.error,
                "small": [asdict(c) for c in ti.small],
                "large": [asdict(c) for c in ti.large],
            }
        return {
            "counter": self.counter,
            "hosts": self.hosts,
            "small_pages_per_host": self.small_pages,
            "large_pages_per_host": self.large_pages,
            "repeats": self.repeats,
            "seconds": round(self.seconds, 1),
            "tools": tools,
            "skipped": self.skipped,
            "ratios": {f"idemcrawl/{t}": self.ratio(t) for t in self.tools if t != "idemcrawl"},
        }

    def markdown(self) -> list[str]:
        """The report's "instructions per page" section, as lines."""
        small_total = self.hosts * self.small_pages
        large_total = self.hosts * self.large_pages
        lines = [
            "Instructions per page (what one more page costs, from two crawls of the same "
            f"shape: {self.hosts} hosts x {self.small_pages} and x {self.large_pages} pages, "
            f"{self.repeats} count(s) of each, {self.seconds / 60:.1f} min): "
            f"(Ir({large_total:,} pages) - Ir({small_total:,} pages)) / "
            f"{large_total - small_total:,}. Counter: {self.counter}.",
            "",
            f"| tool | instructions, {small_total:,} pages | instructions, {large_total:,} pages "
            "| instructions/page | spread of the counts | idemcrawl/tool |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        for name, ti in self.tools.items():
            if ti.error:
                lines.append(f"| {name} | failed: {ti.error} | | | | |")
                continue
            small = ", ".join(_giga(c.instructions) for c in ti.small)
            large = ", ".join(_giga(c.instructions) for c in ti.large)
            per_page = _mega(ti.per_page)
            pairs = ti.pair_figures()
            if len(pairs) > 1:
                per_page += f" ({_mega(min(pairs))} - {_mega(max(pairs))})"
            spread = ti.spread()
            ratio = self.ratio(name) if name != "idemcrawl" else None
            lines.append(
                f"| {name} | {small} | {large} | {per_page} "
                f"| {'-' if spread is None else f'{spread * 100:.2f} %'} "
                f"| {'-' if ratio is None else f'{ratio:.2f}x'} |"
            )
        for name, why in self.skipped.items():
            lines.append(f"| {name} | not counted: {why} | | | | |")
        lines += [
            "",
            "G = 10^9, M = 10^6 instructions. Spread: largest distance of one count from the "
            "median of its size (only with several counts); the range after a per-page figure "
            "is that of the figures of each (small, large) pair.",
        ]
        return lines


def _giga(n: int) -> str:
    return f"{n / 1e9:.3f} G"


def _mega(x: float | None) -> str:
    return "-" if x is None else f"{x / 1e6:.2f} M"


# -- the measurement ----------------------------------------------------------------------------

#: ``(tool, seeds, run_id) -> (command, cleanup)``: the benchmark's command for a tool on a site,
#: and what to do after the run (drop a PostgreSQL schema...).
CommandFor = Callable[[str, Sequence[str], str], tuple[list[str], Callable[[], None]]]


def measure_instructions(
    tools: Sequence[str],
    spec: SiteSpec,
    sizes: tuple[int, int],
    command_for: CommandFor,
    counter: Counter,
    *,
    repeats: int = 1,
    server: str = "auto",
    workdir: str | None = None,
    timeout: float = 3600.0,
    log: Callable[[str], None] | None = None,
) -> InstructionReport:
    """Count every tool on a small and a large site of ``spec``'s shape (``sizes`` = pages per
    host), ``repeats`` times each, and check every counted run fetched every page.

    A tool whose run fails is reported with its error and counted no further; the others go on.
    """
    small_pages, large_pages = sizes
    if not 1 <= small_pages < large_pages:
        raise BenchError(f"instruction sizes must be 1 <= small < large, not {sizes}")
    say = log or (lambda _line: None)
    report = InstructionReport(
        counter=counter.describe(),
        hosts=spec.hosts,
        small_pages=small_pages,
        large_pages=large_pages,
        repeats=repeats,
        tools={t: ToolInstructions(t) for t in tools},
    )
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="idemcrawl-instr-", dir=workdir) as tmp:
        scratch = Path(tmp)
        for size, pages in (("small", small_pages), ("large", large_pages)):
            site_spec = SiteSpec(
                hosts=spec.hosts, pages=pages, page_kb=spec.page_kb, links=spec.links,
                cross_links=spec.cross_links, seed=spec.seed,
            )  # fmt: skip
            with StaticSite(site_spec, server=server, workdir=workdir) as site:
                for rep in range(1, repeats + 1):
                    for tool in tools:
                        ti = report.tools[tool]
                        if ti.error:
                            continue
                        run_id = f"instr_{size}{rep}_{tool}"
                        cmd, cleanup = command_for(tool, site.seeds, run_id)
                        site.reset_log()
                        try:
                            ir, procs, secs = count_run(cmd, counter, scratch, run_id, timeout)
                        except BenchError as exc:
                            ti.error = str(exc)
                            say(f"instructions {tool}: FAILED: {exc}")
                            continue
                        finally:
                            cleanup()
                        stats = site.log_stats()
                        count = Count(
                            tool, spec.hosts, pages, stats.unique_pages, stats.duplicates,
                            ir, procs, secs,
                        )  # fmt: skip
                        if count.pages != site_spec.total_pages:
                            ti.error = (
                                f"{run_id}: fetched {count.pages} of {site_spec.total_pages} "
                                "pages under the counter"
                            )
                            say(f"instructions {tool}: FAILED: {ti.error}")
                            continue
                        getattr(ti, size).append(count)
                        say(
                            f"instructions {tool} {size} site #{rep}: {ir:,} in {count.pages} "
                            f"pages ({_processes(procs)}, {secs:.0f} s)"
                        )
    for name, ti in report.tools.items():
        if ti.error is None:
            try:
                figure = ti.per_page
            except BenchError as exc:
                ti.error = str(exc)
                say(f"instructions {name}: FAILED: {exc}")
            else:
                say(f"instructions {name}: {_mega(figure)} per page")
    report.seconds = time.perf_counter() - started
    return report


def _processes(n: int | None) -> str:
    return "processes not counted" if n is None else f"{n} process(es)"
