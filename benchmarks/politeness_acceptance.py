"""Issue 3's acceptance run: three crawl processes on one SQLite file against the 4-host site.

Hosts: a (delay 0.2 s, also serves 429/503/500 pages), b (delay 0.5 s), c (robots.txt
Crawl-delay 1), d (robots.txt answers 500). Two of the three processes are SIGKILLed and restarted
mid-crawl. The server's own request log (host, path, start, end) is then checked for any
violation of a host's allowance, any disallowed path, and anything but /robots.txt on d.

    python benchmarks/politeness_acceptance.py [--kills 2] [--pages 20]

Prints the per-host request counts, the violations found in the server log and the frontier's
own lease-log audit (``idemcrawl status``). Exits 1 on any violation.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from idemcrawl.lab.politeness_check import Allowance, check_log, summarize
from idemcrawl.lab.testsite.multihost import HostSpec, MultiHostServer


def crawl(seeds: list[str], db: Path, cfg: Path) -> subprocess.Popen[bytes]:
    cmd = [
        sys.executable,
        "-m",
        "idemcrawl",
        "crawl",
        *seeds,
        "--db",
        str(db),
        "--config",
        str(cfg),
        "--quiet",
    ]
    return subprocess.Popen(
        cmd, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pages", type=int, default=20)
    ap.add_argument("--kill-after", type=float, default=4.0)
    args = ap.parse_args()
    specs = [
        HostSpec("a", pages=args.pages, status_pages=True),
        HostSpec("b", pages=args.pages),
        HostSpec("c", pages=args.pages, crawl_delay=1),
        HostSpec("d", pages=args.pages, robots="error"),
    ]
    with tempfile.TemporaryDirectory() as tmp, MultiHostServer(specs) as site:
        a, b, c, d = site.base_urls
        cfg = Path(tmp) / "crawl.toml"
        cfg.write_text(
            'allow_private = ["127.0.0.1"]\ndelay = 0.1\nlease_seconds = 30\n'
            "robots_error_ttl = 2.0\nrobots_max_attempts = 2\nmax_retries = 3\n"
            f'[hosts."{a}"]\ndelay = 0.2\n[hosts."{b}"]\ndelay = 0.5\n'
        )
        db = Path(tmp) / "crawl.db"
        t0 = time.monotonic()
        procs = [crawl(site.seed_urls, db, cfg) for _ in range(3)]
        time.sleep(args.kill_after)
        for p in procs[:2]:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        print(f"killed 2 of 3 processes at {args.kill_after:.1f} s; restarting them")
        procs[:2] = [crawl(site.seed_urls, db, cfg) for _ in range(2)]
        for p in procs:
            _, err = p.communicate(timeout=600)
            if p.returncode != 0:
                print(err.decode(), file=sys.stderr)
                return 1
        wall = time.monotonic() - t0
        log = site.request_log()
        disallowed = site.disallowed_prefixes()
        robots_only = site.robots_only_hosts()
        status = subprocess.run(
            [sys.executable, "-m", "idemcrawl", "status", "--db", str(db), "--json"],
            capture_output=True,
            text=True,
            check=True,
        )
    allowance = {
        a: Allowance(1, 0.2),
        b: Allowance(1, 0.5),
        c: Allowance(1, 1.0),
        d: Allowance(1, 0.1),
    }
    violations = check_log(
        log, allowance, disallowed_prefixes=disallowed, only_robots_hosts=robots_only
    )
    names = dict(zip(site_urls := [a, b, c, d], "abcd", strict=True))
    per_host = Counter(names[e["host"]] for e in log)
    statuses = Counter((names[e["host"]], e["status"]) for e in log)
    print(f"wall {wall:.1f} s; requests per host: {dict(sorted(per_host.items()))}")
    print("status codes per host:", dict(sorted(statuses.items())))
    print("paths fetched on d:", sorted({e["path"] for e in log if e["host"] == d}))
    private = [e for e in log if e["path"].startswith("/private")]
    print(f"disallowed (/private) paths fetched: {len(private)}")
    print("server-log check:", summarize(violations))
    st = json.loads(status.stdout)
    print("frontier lease-log audit:", json.dumps(st["politeness"]))
    print("urls by state:", st["urls"])
    del site_urls
    return 1 if violations or st["politeness"]["violations"] else 0


if __name__ == "__main__":
    sys.exit(main())
