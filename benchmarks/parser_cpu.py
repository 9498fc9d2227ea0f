"""Run one ``idemcrawl bench crawl`` and report the CPU time of its parser processes.

    .venv/bin/python benchmarks/parser_cpu.py --compare none --runs 1

The arguments go to ``bench crawl``, run by this interpreter (so main's venv measures main).
The bench reports the CPU of the whole process tree only; the parser processes are the
forkserver's children, whose CPU nobody collects, so this reads ``utime + stime`` of every
forkserver process below the bench from ``/proc`` every 0.25 s and keeps the last value seen of
each (at most 0.25 s of a process's CPU is missed at its exit). Prints the bench's own output
too. Needs psutil (the ``bench`` extra).
"""

from __future__ import annotations

import subprocess
import sys
import time

import psutil

FORKSERVER = "multiprocessing.forkserver"


def main(args: list[str]) -> int:
    bench = subprocess.Popen([sys.executable, "-m", "idemcrawl", "bench", "crawl", *args])
    root = psutil.Process(bench.pid)
    #: (pid, start time) -> (CPU seconds, parent pid), of every forkserver process seen.
    seen: dict[tuple[int, float], tuple[float, int]] = {}
    while bench.poll() is None:
        try:
            procs = root.children(recursive=True)
        except psutil.Error:
            procs = []
        for proc in procs:
            try:
                if FORKSERVER in " ".join(proc.cmdline()):
                    cpu = proc.cpu_times()
                    seen[(proc.pid, proc.create_time())] = (cpu.user + cpu.system, proc.ppid())
            except psutil.Error:
                continue  # exited between the listing and the read
        time.sleep(0.25)
    servers = {pid for pid, _ in seen}
    workers = [cpu for cpu, parent in seen.values() if parent in servers]
    server = sum(cpu for cpu, parent in seen.values() if parent not in servers)
    print(
        f"parser processes: {len(workers)}, CPU {sum(workers):.2f} s; forkserver {server:.2f} s",
        flush=True,
    )
    return bench.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
