"""Run one ``idemcrawl bench crawl`` and report the CPU time of its parser processes.

    .venv/bin/python benchmarks/parser_cpu.py --compare none --runs 1

The arguments go to ``bench crawl``, run by this interpreter (so main's venv measures main).
The bench reports the CPU of the whole process tree only, so this reads ``utime + stime`` of
every parser process below the bench (``python -c ... worker_main``; before 2026-12-01 the
children of multiprocessing's forkserver, also recognised) from ``/proc`` every 0.25 s and keeps
the last value seen of each (at most 0.25 s of a process's CPU is missed at its exit). Prints
the bench's own output too. Needs psutil (the ``bench`` extra).
"""

from __future__ import annotations

import subprocess
import sys
import time

import psutil

FORKSERVER = "multiprocessing.forkserver"
#: How a parser process started by parse_pool (a plain ``python -c``) shows in its command line.
WORKER = "worker_main"


def main(args: list[str]) -> int:
    bench = subprocess.Popen([sys.executable, "-m", "idemcrawl", "bench", "crawl", *args])
    root = psutil.Process(bench.pid)
    #: (pid, start time) -> (CPU seconds, parent pid, a worker_main process), of every
    #: forkserver or parser process seen.
    seen: dict[tuple[int, float], tuple[float, int, bool]] = {}
    while bench.poll() is None:
        try:
            procs = root.children(recursive=True)
        except psutil.Error:
            procs = []
        for proc in procs:
            try:
                cmdline = " ".join(proc.cmdline())
                if FORKSERVER in cmdline or WORKER in cmdline:
                    cpu = proc.cpu_times()
                    seen[(proc.pid, proc.create_time())] = (
                        cpu.user + cpu.system,
                        proc.ppid(),
                        WORKER in cmdline,
                    )
            except psutil.Error:
                continue  # exited between the listing and the read
        time.sleep(0.25)
    servers = {pid for (pid, _), (_, _, worker) in seen.items() if not worker}
    # A forkserver's children are its workers; a worker_main process is one itself.
    workers = [cpu for cpu, parent, worker in seen.values() if worker or parent in servers]
    server = sum(
        cpu for cpu, parent, worker in seen.values() if not worker and parent not in servers
    )
    print(
        f"parser processes: {len(workers)}, CPU {sum(workers):.2f} s; forkserver {server:.2f} s",
        flush=True,
    )
    return bench.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
