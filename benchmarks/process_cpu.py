"""Run one ``idemcrawl bench crawl`` and report the CPU of each of idemcrawl's processes.

    .venv/bin/python benchmarks/process_cpu.py --compare none --runs 1 --crawl-args=--warc

The arguments go to ``bench crawl``, run by this interpreter (so a worktree's venv measures that
worktree). The bench reports the CPU of idemcrawl's whole process tree; this splits it: the crawl
process (``idemcrawl crawl``) with each of its threads, and the parser processes (``python -c
... worker_main``), read from ``/proc`` every 0.2 s (the last value seen of each; at most 0.2 s
of a process's CPU is missed at its exit). Per page figures use the pages the crawl reports.
Needs psutil (the ``bench`` extra). Written for issue 17 (the archive's cost in the crawl
process against the parser process).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil

WORKER = "worker_main"
TICK = os.sysconf("SC_CLK_TCK")


def _threads(pid: int) -> dict[int, float]:
    """CPU seconds of each thread of ``pid`` (utime + stime from /proc/PID/task/TID/stat)."""
    out: dict[int, float] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                fields = f.read().rpartition(")")[2].split()
        except OSError:
            continue
        out[int(tid)] = (int(fields[11]) + int(fields[12])) / TICK
    return out


def main(args: list[str]) -> int:
    bench = subprocess.Popen([sys.executable, "-m", "idemcrawl", "bench", "crawl", *args])
    root = psutil.Process(bench.pid)
    crawl: dict[int, dict[int, float]] = {}  # crawl pid -> thread -> CPU s
    workers: dict[tuple[int, float], float] = {}
    while bench.poll() is None:
        try:
            procs = root.children(recursive=True)
        except psutil.Error:
            procs = []
        for proc in procs:
            try:
                cmdline = proc.cmdline()
                if WORKER in " ".join(cmdline):
                    cpu = proc.cpu_times()
                    workers[(proc.pid, proc.create_time())] = cpu.user + cpu.system
                elif "crawl" in cmdline and "idemcrawl" in cmdline and "bench" not in cmdline:
                    crawl.setdefault(proc.pid, {}).update(_threads(proc.pid))
            except psutil.Error:
                continue
        time.sleep(0.2)
    for pid, threads in crawl.items():
        total = sum(threads.values())
        parts = ", ".join(f"{t:.2f}" for t in sorted(threads.values(), reverse=True) if t >= 0.05)
        print(f"crawl process {pid}: CPU {total:.2f} s (threads: {parts})", flush=True)
    print(f"parser processes: {len(workers)}, CPU {sum(workers.values()):.2f} s", flush=True)
    return bench.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
