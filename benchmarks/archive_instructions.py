"""Instructions the WARC archive costs per page, in each process of a crawl (load-proof).

    .venv/bin/python benchmarks/archive_instructions.py [--hosts 10] [--pages 20,200]

Crawls the ``bench crawl`` site (``--hosts`` hosts, a small and a large number of pages per
host) with ``--no-warc`` and with ``--warc``, each under ``valgrind --tool=cachegrind
--cache-sim=no --trace-children=yes``, with ``bench crawl``'s own command line. Every
process's ``Ir`` is read from its cachegrind file and put under its role from the command line
cachegrind records (the crawl process, the parser processes); the per-page figure of a role is
the difference of the large and the small crawl over the difference of pages, so start-up
cancels out. Prints, per role, no archive, archive, and the archive's share. Written for issue
17 (the archive's cost per page, per process). valgrind hides SHA-NI and AVX-512 from OpenSSL
and ISA-L, so their counts are those of their generic code: compare like with like.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from idemcrawl.lab.bench.crawl import BenchOptions, tool_command
from idemcrawl.lab.bench.instructions import parse_cachegrind
from idemcrawl.lab.bench.site import SiteSpec, StaticSite

ROLES = ("crawl", "parser")


def role_of(text: str) -> str | None:
    """The role of a cachegrind file, from its ``cmd:`` line (None: not one of ours)."""
    for line in text.splitlines():
        if line.startswith("cmd:"):
            if "worker_main" in line:
                return "parser"
            if " crawl " in line:
                return "crawl"
            return None
    return None


def count(seeds: list[str], warc: bool, scratch: Path, name: str) -> dict[str, int]:
    """Instructions of each role in one crawl of ``seeds``."""
    out = scratch / name
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    opts = BenchOptions(crawl_args=("--warc",) if warc else ())
    cmd = tool_command("idemcrawl", seeds, opts, str(out / "crawl.db"), out)
    subprocess.run(
        [
            "valgrind", "--tool=cachegrind", "--cache-sim=no", "--trace-children=yes",
            f"--cachegrind-out-file={out}/cg.%p", f"--log-file={out}/vg.%p.log", *cmd,
        ],
        check=True, stdout=subprocess.DEVNULL,
    )  # fmt: skip
    totals = dict.fromkeys(ROLES, 0)
    processes = dict.fromkeys(ROLES, 0)
    for path in out.glob("cg.*"):
        text = path.read_text(errors="replace")
        role = role_of(text)
        if role is not None:
            totals[role] += parse_cachegrind(text, path.name)
            processes[role] += 1
    if processes["parser"] > 1:  # a replaced parser's start-up is in this crawl only
        print(f"{name}: {processes['parser']} parser processes (one timed out under valgrind?): "
              "its figures are not comparable", file=sys.stderr)
    return totals


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", type=int, default=10)
    ap.add_argument("--pages", default="20,200", help="small,large pages per host")
    ap.add_argument("--only", choices=("warc", "nowarc"), help="count one variant only")
    a = ap.parse_args()
    if shutil.which("valgrind") is None:
        print("valgrind is not installed (apt-get install valgrind)", file=sys.stderr)
        return 2
    small, large = (int(x) for x in a.pages.split(","))
    variants = [v for v in (False, True) if a.only is None or a.only == ("warc" if v else "nowarc")]
    counts: dict[tuple[bool, int], dict[str, int]] = {}
    with tempfile.TemporaryDirectory(prefix="archive-instr-") as tmp:
        for pages in (small, large):
            with StaticSite(SiteSpec(hosts=a.hosts, pages=pages)) as site:
                for warc in variants:
                    name = f"{'warc' if warc else 'nowarc'}-{pages}"
                    counts[(warc, pages)] = count(site.seeds, warc, Path(tmp), name)
    n = a.hosts * (large - small)
    per_page = {
        warc: {r: (counts[(warc, large)][r] - counts[(warc, small)][r]) / n for r in ROLES}
        for warc in variants
    }
    for warc in variants:
        figures = ", ".join(f"{r} {per_page[warc][r] / 1e6:.3f} M" for r in ROLES)
        total = sum(per_page[warc].values()) / 1e6
        print(f"{'--warc   ' if warc else '--no-warc'}: {figures}, total {total:.3f} M per page")
    if len(variants) == 2:
        extra = {r: per_page[True][r] - per_page[False][r] for r in ROLES}
        figures = ", ".join(f"{r} {extra[r] / 1e6:+.3f} M" for r in ROLES)
        print(f"archive  : {figures}, total {sum(extra.values()) / 1e6:+.3f} M per page")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
