"""Summarise a py-spy ``--format raw`` profile of a crawl: where the CPU goes, per thread role.

    py-spy record --subprocesses --threads -r 100 --format raw -o crawl.raw -- \\
        python -m idemcrawl crawl SEEDS... --db crawl.db [flags]
    python benchmarks/pyspy_summary.py crawl.raw [--top 25]

Samples are grouped by role, recognised from the stack: the crawl process's event loop, its
SQL thread (the engine's one-thread executor), any other thread of the crawl process, and the
parser processes (``python -c ... worker_main``; before 2026-12-01 multiprocessing's
forkserver). Samples whose innermost frame is a known wait (a selector, a condition, a
blocking pipe read) are counted as idle; py-spy reports a
thread blocked in a system call as active, so without this the waiting would look like work.
For each role: the busy share, the functions with the most self samples, and the most inclusive
ones (a function and everything it calls).
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter
from dataclasses import dataclass, field

#: Innermost frames that mean "waiting", not computing.
IDLE_LEAVES = (
    "select (selectors.py",
    "EpollSelector.select (selectors.py",
    "_PollLikeSelector.select (selectors.py",
    "Condition.wait (threading.py",
    "_worker (concurrent/futures/thread.py",
    "Connection._recv (multiprocessing/connection.py",
    "wait (multiprocessing/connection.py",
    # With uvloop the loop runs in C: a sample whose innermost Python frame is the runner is
    # in uvloop's own code, mostly epoll_wait (plus socket I/O that cannot be told apart).
    "Runner.run (asyncio/runners.py",
)
_LINE = re.compile(r":\d+\)$")


@dataclass
class Role:
    samples: int = 0
    idle: int = 0
    self_counts: Counter[str] = field(default_factory=Counter)
    inclusive: Counter[str] = field(default_factory=Counter)


def role_of(process: str, stack: str) -> str:
    if "forkserver" in process or "worker_main" in process:
        return "parser process"
    if "concurrent/futures/thread.py" in stack and "Thread._bootstrap" in stack:
        return "crawl: SQL thread"
    if "Thread._bootstrap" in stack:
        return "crawl: other threads"
    return "crawl: event loop"


def summarise(lines: list[str]) -> dict[str, Role]:
    roles: dict[str, Role] = {}
    for line in lines:
        stack, _, count = line.rstrip("\n").rpartition(" ")
        if not count.isdigit():
            continue
        n = int(count)
        frames = stack.split(";")
        process = next((f for f in frames if f.startswith("process ")), "")
        code = [_LINE.sub(")", f) for f in frames if not f.startswith(("process ", "thread ("))]
        if not code:
            continue
        role = roles.setdefault(role_of(process, ";".join(code)), Role())
        role.samples += n
        leaf = code[-1]
        if leaf.startswith(IDLE_LEAVES):
            role.idle += n
            continue
        role.self_counts[leaf] += n
        for frame in set(code):
            role.inclusive[frame] += n
    return roles


def report(roles: dict[str, Role], top: int) -> str:
    out = []
    for name, r in sorted(roles.items()):
        busy = r.samples - r.idle
        out.append(f"== {name}: {r.samples} samples, {busy} busy ({100 * busy / r.samples:.0f}%)")
        if not busy:
            continue
        out.append("   self (share of busy samples)")
        out += [f"   {100 * c / busy:5.1f}%  {f}" for f, c in r.self_counts.most_common(top)]
        out.append("   inclusive")
        out += [f"   {100 * c / busy:5.1f}%  {f}" for f, c in r.inclusive.most_common(top)]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("raw", help="py-spy record --format raw output")
    p.add_argument("--top", type=int, default=25)
    a = p.parse_args(argv)
    try:
        with open(a.raw, encoding="utf-8", errors="replace") as fh:
            lines = fh.readlines()
    except OSError as exc:
        print(f"pyspy_summary: cannot read {a.raw}: {exc.strerror}", file=sys.stderr)
        return 2
    print(report(summarise(lines), a.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
