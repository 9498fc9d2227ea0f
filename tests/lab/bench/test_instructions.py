"""Tests for instructions per page (``bench crawl --instructions``): reading the counters'
outputs, the per-page arithmetic and its refusals, the reaper, the reports, and one real count.

The real counts need valgrind (skipped without it, except in CI); everything runs on 127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from idemcrawl.lab.bench import crawl as bench
from idemcrawl.lab.bench import instructions as instr
from idemcrawl.lab.bench.instructions import (
    BenchError,
    Count,
    Counter,
    InstructionReport,
    ToolInstructions,
    count_run,
    measure_instructions,
    parse_cachegrind,
    parse_perf_stat,
    per_page_instructions,
    sum_cachegrind,
)
from idemcrawl.lab.bench.site import SiteSpec

from ...helpers import ROOT

#: CI installs valgrind (.ci/run): there a missing one fails instead of skipping.
needs_valgrind = pytest.mark.skipif(
    shutil.which("valgrind") is None and not os.environ.get("CI"), reason="no valgrind"
)


def _cachegrind(ir: int, events: str = "Ir") -> str:
    """A cachegrind output file as valgrind 3.19 writes it with --cache-sim=no."""
    values = {"Ir": ir, "Dr": 7, "Dw": 3}
    summary = " ".join(str(values[e]) for e in events.split())
    return (
        "desc: I1 cache:         65536 B, 64 B, 16-way associative\n"
        "cmd: /usr/bin/python3 -c pass\n"
        f"events: {events}\n"
        "fl=./csu/../csu/libc-start.c\n"
        "fn=__libc_start_main@@GLIBC_2.34\n"
        "128 2\n"
        f"summary: {summary}\n"
    )


def test_cachegrind_summary_is_read_in_the_events_order() -> None:
    assert parse_cachegrind(_cachegrind(1_140_478_676)) == 1_140_478_676
    assert parse_cachegrind(_cachegrind(42, events="Dr Ir Dw")) == 42
    with pytest.raises(BenchError, match="no summary line"):
        parse_cachegrind(_cachegrind(5).replace("summary: 5\n", ""), "cg.9")
    with pytest.raises(BenchError, match="unreadable summary"):
        parse_cachegrind(_cachegrind(5).replace("summary: 5", "summary: lots"))


def test_cachegrind_files_are_summed_over_processes(tmp_path: Path) -> None:
    with pytest.raises(BenchError, match="no output"):
        sum_cachegrind(tmp_path)
    (tmp_path / "cg.100").write_text(_cachegrind(3_000_000_000))
    (tmp_path / "cg.101").write_text(_cachegrind(500))
    (tmp_path / "cg.102").write_text(_cachegrind(1))
    (tmp_path / "valgrind.100.log").write_text("==100== I   refs: 3,000,000,000\n")
    assert sum_cachegrind(tmp_path) == (3_000_000_501, 3)
    (tmp_path / "cg.103").write_text("events: Ir\n")  # a process that never finished its file
    with pytest.raises(BenchError, match=r"cg\.103: no summary"):
        sum_cachegrind(tmp_path)


def test_perf_stat_csv_is_read_and_unsupported_is_an_error() -> None:
    out = "# started on Tue Dec  1 22:00:00 2026\n\n1234567,,instructions:u,1000,100.00,,\n"
    assert parse_perf_stat(out) == 1234567
    assert parse_perf_stat("5,,cycles,1,100.00,,\n987,,instructions,1,100.00,,\n") == 987
    with pytest.raises(BenchError, match="not supported"):
        parse_perf_stat("<not supported>,,instructions,0,100.00,,\n")  # this VM's answer
    with pytest.raises(BenchError, match="no instructions line"):
        parse_perf_stat("5,,cycles,1,100.00,,\n")


def test_counter_detection_falls_back_and_names_what_is_missing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    installed = {"perf": "/usr/bin/perf", "valgrind": "/usr/bin/valgrind"}
    monkeypatch.setattr(instr.shutil, "which", lambda name: installed.get(name))
    monkeypatch.setattr(instr, "_version", lambda binary: Path(binary).name + " 1.0")
    monkeypatch.setattr(
        instr, "perf_instructions_supported", lambda perf: (False, "<not supported>")
    )
    assert instr.detect_counter("auto").kind == "valgrind"
    with pytest.raises(BenchError, match="perf stat -e instructions does not count here"):
        instr.detect_counter("perf")
    monkeypatch.setattr(instr, "perf_instructions_supported", lambda perf: (True, ""))
    assert instr.detect_counter("auto").kind == "perf"
    assert instr.detect_counter("valgrind").kind == "valgrind"
    installed.clear()
    with pytest.raises(BenchError, match="perf is not installed and valgrind is not installed"):
        instr.detect_counter("auto")
    with pytest.raises(BenchError, match="must be one of"):
        instr.detect_counter("rdtsc")


def test_counters_wrap_the_command_on_the_right_side_of_the_reaper(tmp_path: Path) -> None:
    cmd = ["python", "crawl.py"]
    valgrind = Counter("valgrind", "/usr/bin/valgrind", "valgrind-3.19.0")
    wrapped = valgrind.command(cmd, tmp_path, grace_s=5, timeout=60)
    assert wrapped[0] == sys.executable and "_reap_main" in wrapped[2]
    assert wrapped[3:6] == ["5", "60", "--"], "the reaper runs valgrind, uncounted"
    assert wrapped[6] == "/usr/bin/valgrind" and wrapped[-2:] == cmd
    assert (
        "--trace-children=yes" in wrapped and f"--cachegrind-out-file={tmp_path}/cg.%p" in wrapped
    )
    perf = Counter("perf", "/usr/bin/perf", "perf version 6.1")
    wrapped = perf.command(cmd, tmp_path, grace_s=5, timeout=60)
    assert wrapped[:5] == ["/usr/bin/perf", "stat", "-e", "instructions", "-x,"]
    assert wrapped.index("--") < wrapped.index(sys.executable), "perf counts the reaper's tree"
    assert wrapped[-2:] == cmd


def _count(tool: str, pages: int, instructions: int, seconds: float = 1.0) -> Count:
    return Count(tool, 1, pages, pages, 0, instructions, 3, seconds)


def test_per_page_is_the_difference_over_the_extra_pages() -> None:
    small, large = _count("bare", 200, 6_000_000_000), _count("bare", 2000, 9_600_000_000)
    assert per_page_instructions(small, large) == pytest.approx(2_000_000)
    with pytest.raises(BenchError, match="not more than the small run's 2000"):
        per_page_instructions(large, small)
    with pytest.raises(BenchError, match="fetched 200 pages"):
        per_page_instructions(small, _count("bare", 200, 7_000_000_000))
    with pytest.raises(BenchError, match="part of a count is missing"):
        per_page_instructions(small, _count("bare", 2000, 5_000_000_000))


def test_repeated_counts_give_median_figure_pairs_and_spread() -> None:
    ti = ToolInstructions(
        "idemcrawl",
        small=[_count("idemcrawl", 100, 1_000), _count("idemcrawl", 100, 1_010)],
        large=[_count("idemcrawl", 1100, 11_000), _count("idemcrawl", 1100, 10_990)],
    )
    assert ti.per_page == pytest.approx((10_995 - 1_005) / 1000)
    assert ti.pair_figures() == pytest.approx([10.0, 9.98])
    assert ti.spread() == pytest.approx(5 / 1005)
    assert ToolInstructions("bare", small=ti.small[:1], large=ti.large[:1]).spread() is None
    assert ToolInstructions("bare", error="boom", small=ti.small, large=ti.large).per_page is None


def _report() -> InstructionReport:
    report = InstructionReport("valgrind-3.19.0: cachegrind", hosts=10, small_pages=20,
                               large_pages=200, repeats=2)  # fmt: skip
    report.tools["idemcrawl"] = ToolInstructions(
        "idemcrawl",
        small=[_count("idemcrawl", 200, 7_000_000_000), _count("idemcrawl", 200, 7_010_000_000)],
        large=[_count("idemcrawl", 2000, 16_000_000_000)] * 2,
    )
    report.tools["bare"] = ToolInstructions(
        "bare",
        small=[_count("bare", 200, 1_300_000_000)] * 2,
        large=[_count("bare", 2000, 3_100_000_000)] * 2,
    )
    report.tools["broken"] = ToolInstructions("broken", error="exit status 1: Traceback")
    report.skipped["scrapy"] = "not asked"
    return report


def test_instruction_report_renders_figures_ratio_and_failures() -> None:
    report = _report()
    assert report.ratio("bare") == pytest.approx((16_000_000_000 - 7_005_000_000) / 1800 / 1e6)
    assert report.ratio("broken") is None and report.failed == ["broken"]
    text = "\n".join(report.markdown())
    assert "10 hosts x 20 and x 200 pages, 2 count(s) of each" in text
    assert "Counter: valgrind-3.19.0: cachegrind." in text
    assert "| instructions, 200 pages | instructions, 2,000 pages |" in text
    assert "| idemcrawl | 7.000 G, 7.010 G | 16.000 G, 16.000 G | 5.00 M (4.99 M - 5.00 M) " in text
    assert "| 0.07 % | - |" in text
    assert (
        "| bare | 1.300 G, 1.300 G | 3.100 G, 3.100 G | 1.00 M (1.00 M - 1.00 M) | 0.00 % " in text
    )
    assert "| 5.00x |" in text
    assert "| broken | failed: exit status 1: Traceback |" in text
    assert "| scrapy | not counted: not asked |" in text
    data = json.loads(json.dumps(report.as_dict()))
    assert data["ratios"]["idemcrawl/bare"] == pytest.approx(report.ratio("bare"))
    assert data["tools"]["bare"]["per_page"] == pytest.approx(1_000_000)
    assert data["tools"]["idemcrawl"]["small"][1]["instructions"] == 7_010_000_000
    assert data["tools"]["broken"]["error"].startswith("exit status 1")


def test_bench_report_has_cpu_ms_per_page_and_the_instructions_section() -> None:
    from .test_bench import _run

    opts = bench.BenchOptions(hosts=2, pages=20, compare=("bare",), runs=1, instructions=True)
    report = bench.BenchReport(opts, opts.command_line(), "aiohttp", {"CPUs": "2"})
    report.runs = [_run("idemcrawl", 1, cpu_user_s=1.5, cpu_sys_s=0.5), _run("bare", 1)]
    assert report.runs[0].cpu_ms_per_page == pytest.approx(50.0)  # 2 CPU s over 40 pages
    assert bench.RunResult(**{**report.runs[1].__dict__, "pages": 0}).cpu_ms_per_page is None
    assert report.ratio("bare", "cpu_ms_per_page") == pytest.approx(2 / 9)
    text = report.text()
    assert "| tool | pages/s | wall s | CPU s | CPU ms/page |" in text
    assert "| idemcrawl | 4 | 10.0 | 2.0 | 50.00 | 100 |" in text
    assert "| idemcrawl/bare | 1.00x | 0.22x | 0.22x | 1.00x |" in text
    assert "Instructions per page" not in text, "not counted: no section"
    report.instructions = _report()
    text = report.text()
    assert text.endswith("figure is that of the figures of each (small, large) pair.\n")
    assert "| bare | 1.300 G, 1.300 G |" in text
    data = json.loads(json.dumps(report.as_dict()))
    assert data["tools"]["idemcrawl"]["cpu_ms_per_page"] == pytest.approx(50.0)
    assert data["runs"][0]["cpu_ms_per_page"] == pytest.approx(50.0)
    assert data["ratios"]["idemcrawl/bare"]["cpu_ms_per_page"] == pytest.approx(2 / 9)
    assert data["instructions"]["tools"]["bare"]["per_page"] == pytest.approx(1e6)
    assert opts.command_line().endswith("--runs 1 --instructions")


def test_instruction_options_parse_validate_and_show_in_the_command() -> None:
    p = argparse.ArgumentParser()
    bench.add_bench_crawl_arguments(p)
    argv = ["--instructions", "--instructions-pages", "5,25", "--instructions-runs", "2"]
    opts = bench.options_from_args(p.parse_args(argv))
    assert (opts.instructions, opts.instructions_pages, opts.instructions_runs) == (
        True, (5, 25), 2,
    )  # fmt: skip
    assert (opts.instructions_hosts, opts.instructions_counter) == (10, "auto")
    opts.validate()
    assert opts.command_line().endswith(
        "--instructions --instructions-pages 5,25 --instructions-runs 2"
    )
    assert not bench.options_from_args(p.parse_args([])).instructions, "off by default"
    with pytest.raises(SystemExit):
        p.parse_args(["--instructions-pages", "25"])
    with pytest.raises(BenchError, match="SMALL < LARGE"):
        bench.BenchOptions(instructions=True, instructions_pages=(25, 5)).validate()
    with pytest.raises(BenchError, match="--instructions-runs must be >= 1"):
        bench.BenchOptions(instructions=True, instructions_runs=0).validate()
    bench.BenchOptions(instructions_pages=(25, 5)).validate()  # ignored when not counting


def _reap(grace: float, timeout: float, script: str) -> subprocess.CompletedProcess[str]:
    cmd = instr._reaper_command([sys.executable, "-c", script], grace, timeout)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="child subreaper is Linux-only")
def test_reaper_waits_for_orphans_and_fails_on_stragglers_and_timeouts(tmp_path: Path) -> None:
    done = tmp_path / "done"
    orphan = f"import time, pathlib; time.sleep(0.4); pathlib.Path({str(done)!r}).touch()"
    spawn = f"import subprocess, sys; subprocess.Popen([sys.executable, '-c', {orphan!r}])"
    r = _reap(30, 30, spawn + "; sys.exit(3)")
    assert r.returncode == 3, "the tool's own status"
    assert done.exists(), "the reaper returned only after the orphan exited"
    straggler = "import subprocess, sys; subprocess.Popen(['sleep', '30'])"
    r = _reap(0.3, 30, straggler)
    assert r.returncode == instr._EXIT_STRAGGLERS
    assert "still running 0.3 s after it exited" in r.stderr
    r = _reap(30, 0.3, "import time; time.sleep(30)")
    assert r.returncode == instr._EXIT_TIMEOUT and "timed out after 0.3 s" in r.stderr


@pytest.mark.slow
@needs_valgrind
def test_valgrind_counts_every_process_and_a_failure_says_why(tmp_path: Path) -> None:
    counter = instr.detect_counter("valgrind")
    child = "import subprocess, sys; subprocess.run([sys.executable, '-c', 'pass'], check=True)"
    ir, processes, seconds = count_run([sys.executable, "-c", child], counter, tmp_path, "two", 60)
    alone, one, _ = count_run([sys.executable, "-c", "pass"], counter, tmp_path, "one", 60)
    assert (processes, one) == (2, 1)
    assert ir > alone > 1_000_000 and seconds > 0
    assert not list(tmp_path.glob("*.counts")), "cachegrind's files are removed"
    failing = "import sys; print('boom: no such site', file=sys.stderr); sys.exit(3)"
    with pytest.raises(BenchError, match="exit status 3 under valgrind: boom: no such site"):
        count_run([sys.executable, "-c", failing], counter, tmp_path, "fails", 60)


def _bare_command(
    tool: str, seeds: Sequence[str], run_id: str
) -> tuple[list[str], Callable[[], None]]:
    assert tool == "bare"
    return [sys.executable, str(ROOT / "benchmarks" / "bare_crawler.py"), *seeds], lambda: None


@pytest.mark.slow
@needs_valgrind
def test_bare_crawler_instructions_per_page_on_a_tiny_site() -> None:
    lines: list[str] = []
    report = measure_instructions(
        ["bare"],
        SiteSpec(hosts=1, pages=5, page_kb=4, links=10),
        (5, 25),
        _bare_command,
        instr.detect_counter("valgrind"),
        timeout=300,
        log=lines.append,
    )
    bare = report.tools["bare"]
    assert bare.error is None, bare.error
    assert [c.pages for c in bare.small + bare.large] == [5, 25], "every page, under valgrind"
    assert 0 < bare.small[0].instructions < bare.large[0].instructions
    assert bare.per_page is not None and math.isfinite(bare.per_page) and bare.per_page > 0
    assert lines[-1].startswith("instructions bare: ") and lines[-1].endswith(" M per page")
