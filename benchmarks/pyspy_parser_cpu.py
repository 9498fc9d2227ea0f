"""CPU per page of the parser processes in a py-spy ``--format raw`` profile, and SimHash's part.

    py-spy record --subprocesses -r 100 -f raw -o crawl.raw -- \\
        idemcrawl bench crawl --compare none --runs 1
    python benchmarks/pyspy_parser_cpu.py crawl.raw --pages 20000

A parser process's sample is one whose stack has the pool worker (``_pool_worker`` in
idemcrawl/parse.py), whatever processes are above it (under ``bench crawl`` the crawl is a
grandchild, which pyspy_summary.py's role test, the first process of the stack, does not see).
Samples whose innermost frame is a wait (pyspy_summary.IDLE_LEAVES) are idle. Busy samples /
rate = CPU seconds, approximately: py-spy counts a thread in a system call as running.
"""

from __future__ import annotations

import argparse
import sys

from pyspy_summary import _LINE, IDLE_LEAVES

WORKER = "_pool_worker (idemcrawl/parse.py)"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("raw", help="py-spy record --format raw output")
    p.add_argument("--pages", type=int, required=True, help="pages the crawl parsed")
    p.add_argument("--rate", type=int, default=100, help="py-spy's -r (samples per second)")
    a = p.parse_args()
    busy = simhash = 0
    with open(a.raw, encoding="utf-8", errors="replace") as fh:
        for line in fh:
            stack, _, count = line.rstrip("\n").rpartition(" ")
            if not count.isdigit():
                continue
            code = [_LINE.sub(")", f) for f in stack.split(";") if not f.startswith("process ")]
            if WORKER not in code or code[-1].startswith(IDLE_LEAVES):
                continue
            busy += int(count)
            if any(f.startswith("page_simhash (") for f in code):
                simhash += int(count)
    ms = 1000 / a.rate / a.pages
    print(f"parser busy: {busy} samples = {busy * ms:.3f} ms CPU per page")
    print(f"  page_simhash (inclusive): {simhash} samples = {simhash * ms:.3f} ms per page")
    return 0


if __name__ == "__main__":
    sys.exit(main())
