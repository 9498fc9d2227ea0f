"""Instructions per bench page of a parser process's whole per-page work, counted by valgrind.

    .venv/bin/python benchmarks/parser_page.py [--pages 500] [--tool cachegrind|callgrind]

What one parser process does for each page of a ``bench crawl`` (issue 17): unpickle the job
that came through the job pipe, ``parse_in_worker`` (the bench spider, link checks, SimHash),
pickle the result; and what the crawl process then does with it, unpickle the result (reported
apart: ``decode``). Each is run under valgrind twice (50 and 50 + N pages of the bench site, 3
hosts x 400 pages, ~15 KB and 40 links each) and the difference over N is printed: start-up
excluded, so the figure is the per-page cost, which the machine's load does not move.

``--tool callgrind`` keeps the larger run's profile (``callgrind_annotate`` reads it) in
``--keep DIR``.
"""

from __future__ import annotations

import argparse
import pickle
import shutil
import sys
import tempfile
from pathlib import Path

SIDES = ("worker", "decode")
#: Distinct bench pages parsed in turn (the trap cache then holds their links, as in a crawl).
JOBS = 200


def _jobs(n: int) -> list[bytes]:
    from idemcrawl.frontier.base import PAGE
    from idemcrawl.lab.bench.site import SiteSpec, page_html, page_url
    from idemcrawl.parse import ParseJob

    spec = SiteSpec(hosts=3, pages=400)
    ports = [40000, 40001, 40002]
    headers = {"content-type": "text/html; charset=utf-8"}
    out = []
    for i in range(n):
        host = i % 3
        job = ParseJob(page_url(ports[host], i), 200, headers,
                       page_html(spec, ports, host, i).encode(), 1, PAGE, None)  # fmt: skip
        out.append(pickle.dumps(job, pickle.HIGHEST_PROTOCOL))
    return out


def run_side(side: str, n: int) -> None:
    from idemcrawl import parse

    ports = [40000, 40001, 40002]
    scope = frozenset(f"http://127.0.0.1:{p}" for p in ports)
    parse.init_worker("idemcrawl.lab.bench.crawl:BenchSpider", scope, "host")
    jobs = _jobs(JOBS)  # the same number in both runs of a pair: only the loop differs
    dumps, loads = pickle.dumps, pickle.loads
    if side == "worker":
        for i in range(n):
            dumps(parse.parse_in_worker(loads(jobs[i % len(jobs)])), pickle.HIGHEST_PROTOCOL)
    else:
        results = [
            dumps(parse.parse_in_worker(loads(j)), pickle.HIGHEST_PROTOCOL) for j in jobs[:50]
        ]
        _ = [loads(results[0]) for _ in range(50)]  # warm-up in both runs of the pair
        for i in range(n):
            loads(results[i % 50])


def count(tool: str, side: str, n: int, workdir: Path) -> int:
    from idemcrawl.lab.bench.instructions import valgrind_count  # not in the counted runs

    argv = [sys.executable, __file__, "--side", side, "--n", str(n)]
    return valgrind_count(argv, workdir / f"{tool}.{side}.{n}", tool)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pages", type=int, default=500)
    ap.add_argument("--tool", choices=("cachegrind", "callgrind"), default="cachegrind")
    ap.add_argument("--keep", type=Path, help="directory to keep the valgrind files in")
    ap.add_argument("--sides", default=",".join(SIDES))
    ap.add_argument("--side", choices=SIDES, help=argparse.SUPPRESS)
    ap.add_argument("--n", type=int, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.side:
        run_side(a.side, a.n)
        return 0
    if shutil.which("valgrind") is None:
        print("valgrind is not installed (apt-get install valgrind)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        work = a.keep or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        for side in a.sides.split(","):
            base = count(a.tool, side, 50, work)
            more = count(a.tool, side, 50 + a.pages, work)
            print(f"{side:8s} {(more - base) / a.pages / 1e3:8.1f} k instructions per page")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
