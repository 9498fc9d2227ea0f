"""A finite crawl ends on its own: the four-host politeness site, default settings.

Host ``d`` answers 500 for its robots.txt, which RFC 9309 says means "disallow all" until it is
fetched again after the error TTL (an hour). The crawl, with every setting at its default, must
finish the other three hosts and then stop by itself within the horizon plus a minute, name the
waiting host in its summary, exit 3 (work left), and break no host's allowance (checked on the
servers' own request log). A second run of the same command must say the same at once and send
no request. Run from the checkout::

    python benchmarks/horizon_acceptance.py
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from idemcrawl.config import CrawlConfig
from idemcrawl.lab.politeness_check import Allowance, check_log, summarize
from idemcrawl.lab.testsite.multihost import MultiHostServer, default_hosts


def main() -> int:
    horizon = CrawlConfig(db="-").horizon
    with tempfile.TemporaryDirectory() as tmp, MultiHostServer(default_hosts()) as site:
        db = Path(tmp) / "crawl.db"
        cmd = [
            sys.executable, "-m", "idemcrawl", "crawl", *site.seed_urls, "--db", str(db),
            "--allow-private", "127.0.0.1",
        ]  # fmt: skip
        t0 = time.monotonic()
        first = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        ended = time.monotonic()
        log = site.request_log()
        rerun = subprocess.run([*cmd, "--json"], capture_output=True, text=True, timeout=120)
        rerun_requests = len(site.request_log()) - len(log)
        specs = {url: site.spec_for(url) for url in site.base_urls}
        disallowed = site.disallowed_prefixes()
        robots_only = site.robots_only_hosts()
    last_end = max(e["end"] for e in log)
    allowance = {
        url: Allowance(1, max(1.0, spec.crawl_delay or 0.0)) for url, spec in specs.items()
    }
    violations = check_log(
        log, allowance, disallowed_prefixes=disallowed, only_robots_hosts=robots_only
    )
    waiting = [line.strip() for line in first.stdout.splitlines() if "waiting:" in line]
    summary = json.loads(rerun.stdout.splitlines()[-1])
    print(first.stdout.strip())
    if "Traceback" in first.stderr + rerun.stderr:
        print(first.stderr + rerun.stderr)
    report = {
        "exit_status": first.returncode,
        "seconds": round(ended - t0, 1),
        "seconds_after_last_response": round(ended - last_end, 1),
        "horizon_s": horizon,
        "requests": len(log),
        "politeness_violations": len(violations),
        "waiting": waiting,
        "rerun": {
            "exit_status": rerun.returncode,
            "stopped_by": summary["stopped_by"],
            "waiting_hosts": [w["host"] for w in summary["waiting"]],
            "requests": rerun_requests,
        },
    }
    print(json.dumps(report, indent=2))
    if violations:
        print(summarize(violations))
    ok = (
        first.returncode == 3
        and ended - last_end <= horizon + 60
        and not violations
        and len(waiting) == 1
        and rerun.returncode == 3
        and rerun_requests == 0
        and "Traceback" not in first.stderr + rerun.stderr
    )
    print("result:", "PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
