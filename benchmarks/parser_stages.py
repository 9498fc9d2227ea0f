"""Instructions per bench page of each stage of the parser, counted by valgrind (load-proof).

    .venv/bin/python benchmarks/parser_stages.py [--pages 500]

Runs each stage under ``valgrind --tool=cachegrind --cache-sim=no`` twice (50 and 50 + N
pages of the ``bench crawl`` site) and prints the difference over N: the instructions one page
costs in that stage, start-up excluded. Stages are cumulative from a fresh ``Page``:

* ``tree``: the lexbor tree of the page;
* ``css``: + the bench spider's two ``css_first``;
* ``links``: the tree + ``Page.links()``;
* ``spider``: the bench spider's whole ``parse`` (tree, ``css_first``, links);
* ``run``: ``Parser.run``, what a parser process does per page (spider, link checks, SimHash);
* ``run_nosim``: the same without SimHash;
* ``wire``: ``run`` + the result pickled and unpickled (the two ends of the result pipe).
"""

from __future__ import annotations

import argparse
import pickle
import shutil
import sys
import tempfile
from pathlib import Path

STAGES = ("tree", "css", "links", "spider", "run_nosim", "run", "wire")


def run_stage(stage: str, n: int) -> None:
    from idemcrawl.frontier.base import PAGE
    from idemcrawl.lab.bench.crawl import BenchSpider
    from idemcrawl.lab.bench.site import SiteSpec, page_html, page_url
    from idemcrawl.parse import Page, ParseJob, Parser

    spec = SiteSpec(hosts=3, pages=400)
    ports = [40000, 40001, 40002]
    pages = [
        (page_url(ports[i % 3], i), page_html(spec, ports, i % 3, i).encode()) for i in range(50)
    ]
    scope = frozenset(f"http://127.0.0.1:{p}" for p in ports)
    parser = Parser(
        "idemcrawl.lab.bench.crawl:BenchSpider", scope, "host", simhash=stage != "run_nosim"
    )
    headers = {"content-type": "text/html; charset=utf-8"}
    for i in range(n):
        url, body = pages[i % 50]
        if stage in ("tree", "css", "links", "spider"):
            page = Page(url, 200, headers, body, depth=1, scope_hosts=scope, scope="host")
            if stage == "tree":
                _ = page._tree
            elif stage == "css":
                page.css_first("span.sku")
                page.css_first("span.price")
            elif stage == "links":
                page.links()
            else:
                list(BenchSpider().parse(page))
        else:
            result = parser.run(ParseJob(url, 200, headers, body, 1, PAGE, None))
            if stage == "wire":
                pickle.loads(pickle.dumps(result, pickle.HIGHEST_PROTOCOL))


def count(stage: str, n: int, workdir: Path) -> int:
    from idemcrawl.lab.bench.instructions import valgrind_count  # not in the counted runs

    argv = [sys.executable, __file__, "--stage", stage, "--n", str(n)]
    return valgrind_count(argv, workdir / f"cg.{stage}.{n}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pages", type=int, default=500)
    ap.add_argument("--stage", choices=STAGES, help=argparse.SUPPRESS)
    ap.add_argument("--n", type=int, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.stage:
        run_stage(a.stage, a.n)
        return 0
    if shutil.which("valgrind") is None:
        print("valgrind is not installed (apt-get install valgrind)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        for stage in STAGES:
            base = count(stage, 50, Path(tmp))
            more = count(stage, 50 + a.pages, Path(tmp))
            print(f"{stage:10s} {(more - base) / a.pages / 1e6:6.2f} M instructions per page")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
