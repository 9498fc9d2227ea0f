"""CPU time of the parser's SimHash on the bench site's pages (issue 17, docs/benchmarks.md).

Runs with whatever idemcrawl the interpreter imports, so the same file measures main and a
branch (``/work/main/.venv/bin/python benchmarks/simhash_page.py`` against
``.venv/bin/python benchmarks/simhash_page.py``); run them interleaved, the machine is shared.

Reported, per page, in CPU microseconds (``time.process_time``, best of ``--rounds``):

* ``page_simhash``: what a parser process runs per HTML page, on an already parsed tree
  (the trees are parsed before the clock starts, one per call since the call strips them);
* ``simhash64``: the fingerprint of the page's visible text alone (no tree work);
* ``native``: whether ``idemcrawl._simhash`` was imported.
"""

from __future__ import annotations

import argparse
import time

from selectolax.lexbor import LexborHTMLParser

from idemcrawl import dedup
from idemcrawl.lab.bench.site import SiteSpec, page_html


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pages", type=int, default=200, help="distinct bench pages")
    parser.add_argument("--rounds", type=int, default=5, help="best of this many rounds")
    args = parser.parse_args()
    spec = SiteSpec()
    ports = list(range(20000, 20000 + spec.hosts))
    pages = [page_html(spec, ports, i % spec.hosts, i // spec.hosts) for i in range(args.pages)]
    texts = [" ".join(dedup._raw_visible_text(html).split()) for html in pages]
    best_page = best_text = float("inf")
    for _ in range(args.rounds):
        trees = [LexborHTMLParser(html) for html in pages]
        start = time.process_time()
        for tree in trees:
            dedup.page_simhash(tree)
        best_page = min(best_page, time.process_time() - start)
        start = time.process_time()
        for text in texts:
            dedup.simhash64(text)
        best_text = min(best_text, time.process_time() - start)
    words = sum(len(t.split()) for t in texts) / len(texts)
    print(
        f"pages={len(pages)} bytes/page={sum(map(len, pages)) // len(pages)} "
        f"words/page={words:.0f} native={getattr(dedup, '_native', None) is not None}"
    )
    print(f"page_simhash {1e6 * best_page / len(pages):.1f} us/page (CPU, best of {args.rounds})")
    print(f"simhash64    {1e6 * best_text / len(texts):.1f} us/page (CPU, best of {args.rounds})")


if __name__ == "__main__":
    main()
