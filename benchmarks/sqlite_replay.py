"""Instructions per SQLite lease call and per completion batch, separately (issue 14).

``bench frontier`` on this shared machine reports CPU time that moves 20 % between runs of the
same code; this replays its loop (lease 256, complete them with 10 links, 1 record, 1 event
each) on a copy of a seeded file, deterministically (a fixed virtual clock, a seeded rng), so
that valgrind can count the instructions of each phase:

    python benchmarks/sqlite_replay.py seed /tmp/x/seed.db --hosts 20000 --urls-per-host 10
    valgrind --tool=callgrind --separate-threads=yes --dump-before=getppid \\
        --callgrind-out-file=/tmp/x/cg.%p python benchmarks/sqlite_replay.py run \\
        /tmp/x/seed.db --cycles 20
    python benchmarks/sqlite_replay.py sum /tmp/x/cg.<pid>

``run`` calls ``os.getppid()`` (the marker: callgrind dumps the counts gathered since the last
dump just before it) before and after each lease call and each completion call, so dump parts
alternate lease / between / complete / between; ``sum`` adds the main thread's parts per phase
(the checkpoint thread runs in its own file, as does whatever it does).
"""

from __future__ import annotations

import argparse
import glob
import os
import random
import re
import shutil
import sys
import tempfile

from idemcrawl.frontier.base import HostPolicy
from idemcrawl.frontier.sqlite import SQLiteFrontier
from idemcrawl.lab.bench.frontier import _EPOCH as EPOCH
from idemcrawl.lab.bench.frontier import _completions as bench_completions
from idemcrawl.lab.bench.frontier import _seed as bench_seed

LEASE_TTL = 600.0


def seed(path: str, hosts: int, per_host: int) -> None:
    f = SQLiteFrontier(path)
    bench_seed(f, hosts, per_host)  # the URLs bench frontier seeds, at the same clock
    f._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    f.close()


def run(path: str, cycles: int, batch: int, links: int, lease_only: bool) -> None:
    tmp = tempfile.mkdtemp(prefix="sqlite-replay-")
    copy = os.path.join(tmp, "r.db")
    shutil.copyfile(path, copy)
    f = SQLiteFrontier(copy, rng=random.Random(7))
    policy = HostPolicy(max_in_flight=1, delay=0.0)
    now = EPOCH + 1.0
    grants = done = 0
    try:
        for _ in range(cycles):
            os.getppid()
            leases = f.lease("bench-0", batch, now, LEASE_TTL, policy)
            os.getppid()
            grants += len(leases)
            now += 0.01
            if lease_only:
                continue
            out = bench_completions(leases, now, links)  # what bench frontier completes
            os.getppid()
            ok = f.complete(out, now, policy)
            os.getppid()
            done += sum(ok)
            now += 0.01
    finally:
        f.close()
        shutil.rmtree(tmp)
    print(f"grants {grants} completions {done}", file=sys.stderr)


def total(path: str) -> int:
    with open(path) as fh:
        for line in fh:
            if line.startswith("summary:") or line.startswith("totals:"):
                return int(line.split()[1])
    return 0


def sum_parts(prefix: str, cycles: int, lease_only: bool) -> None:
    """Callgrind names the dumps PREFIX.N (and -01 for the main thread with
    --separate-threads): part 1 is start-up, then per cycle lease, between, [complete, between]."""
    parts = sorted(
        (p for p in glob.glob(prefix + ".*") if re.search(r"\.\d+-01$", p)),
        key=lambda p: int(re.search(r"\.(\d+)-01$", p).group(1)),  # type: ignore[union-attr]
    )
    costs = [total(p) for p in parts]
    step = 2 if lease_only else 4
    body = costs[1 : 1 + step * cycles]
    lease = body[0::step]
    complete = [] if lease_only else body[2::step]
    print(f"parts {len(costs)}; lease calls {len(lease)}, completion calls {len(complete)}")
    if lease:
        print(f"per lease call: {sum(lease) / len(lease) / 1e6:.2f} M instructions")
        print("  each:", " ".join(f"{c / 1e6:.1f}" for c in lease))
    if complete:
        print(f"per completion batch: {sum(complete) / len(complete) / 1e6:.2f} M instructions")
        print("  each:", " ".join(f"{c / 1e6:.1f}" for c in complete))


def main() -> None:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("seed")
    s.add_argument("path")
    s.add_argument("--hosts", type=int, default=20_000)
    s.add_argument("--urls-per-host", type=int, default=10)
    r = sub.add_parser("run")
    r.add_argument("path")
    r.add_argument("--cycles", type=int, default=20)
    r.add_argument("--batch", type=int, default=256)
    r.add_argument("--links", type=int, default=10)
    r.add_argument("--lease-only", action="store_true")
    m = sub.add_parser("sum")
    m.add_argument("prefix")
    m.add_argument("--cycles", type=int, default=20)
    m.add_argument("--lease-only", action="store_true")
    a = ap.parse_args()
    if a.cmd == "seed":
        seed(a.path, a.hosts, a.urls_per_host)
    elif a.cmd == "run":
        run(a.path, a.cycles, a.batch, a.links, a.lease_only)
    else:
        sum_parts(a.prefix, a.cycles, a.lease_only)


if __name__ == "__main__":
    main()
