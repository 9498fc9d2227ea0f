"""Issue 16's acceptance run: each example spider under 10 SIGKILLs, then a final run.

For each spider of ``examples/`` (and the catalogue with a POST search per category, the mix
``tests/sandbox_spiders.py`` uses), against the scraping sandbox with 30 ms per answer:
start the crawl, SIGKILL its process group after a few more requests reached the server, ten
times (a kill that would land after the crawl ended is not counted), then run it to the end.
Then check, from the server's own request log and the stored records:

* the records are exactly the expected ones (callback and context right for every page);
* every request was made the way the spider asked: searches and the login as POST with the
  form's fields, everything else as GET without a body, members pages with the session;
* one login in all (the first kill lands after it committed).

    python benchmarks/sandbox_acceptance.py [--kills 10]

Prints one line per spider; exits 1 on any mismatch.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

from idemcrawl.lab.testsite.sandbox import (
    SandboxConfig,
    SandboxServer,
    expected_api,
    expected_items,
    expected_js,
    expected_members,
    expected_search,
    item_category,
)

ROOT = Path(__file__).resolve().parents[1]


def crawl_cmd(db: Path, spider: str, seeds: list[str]) -> list[str]:
    return [
        sys.executable, "-m", "idemcrawl", "crawl", *seeds, "--db", str(db), "--spider", spider,
        "--concurrency", "2", "--host-concurrency", "2", "--delay", "0",
        "--latency-factor", "0", "--allow-private", "127.0.0.1", "--quiet",
    ]  # fmt: skip


def env_for(server: SandboxServer) -> dict[str, str]:
    path = os.pathsep.join([str(ROOT), str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "SANDBOX": server.base_url, "PYTHONPATH": path}


def kill_after(server: SandboxServer, cmd: list[str], env: dict[str, str], until: Any) -> bool:
    """Run ``cmd``; SIGKILL its group once ``until(log)`` holds. False if it ended first."""
    proc = subprocess.Popen(
        cmd, env=env, cwd=ROOT, start_new_session=True,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while proc.poll() is None and time.monotonic() < deadline:
        if until(server.requests()):
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return True
        time.sleep(0.002)
    proc.wait()
    return False


def records(db: Path) -> dict[str, Any]:
    con = sqlite3.connect(db)
    try:
        return {k: json.loads(d) for k, d in con.execute("SELECT key, data FROM records")}
    finally:
        con.close()


def form(entry: dict[str, Any]) -> dict[str, str]:
    return {k: v[0] for k, v in parse_qs(entry["body"]).items()}


def wrong_requests(name: str, log: list[dict[str, Any]]) -> list[str]:
    """Requests not made the way the spider asked."""
    bad = []
    for e in log:
        path, method = e["path"], e["method"]
        if path in ("/search", "/login") and method == "POST":
            f = form(e)
            if path == "/search" and (f.get("form_id") != "search-v1" or "q" not in f):
                bad.append(f"{method} {path} {e['body']}")
            if path == "/login" and (f.get("user") != "demo" or len(f.get("csrf", "")) != 24):
                bad.append(f"{method} {path} {e['body']}")
        elif method != "GET" or e["body"]:
            bad.append(f"{method} {path} {e['body']}")
        if path == "/search" and method == "GET" and name != "search":
            bad.append(f"GET {path}")
        if path.startswith("/members") and "session=" not in e["cookie"]:
            bad.append(f"{method} {path} without the session")
    return bad


def run_one(name: str, spider: str, kills: int, tmp: Path) -> bool:
    cfg = SandboxConfig(pages=6, per_page=5, members=30, api_items=45, api_page=3, latency_ms=30)
    db = tmp / f"{name}.db"
    with SandboxServer(cfg) as server:
        env = env_for(server)
        seeds = [f"{server.base_url}/catalog?page=1"] if name.startswith("catalog") else []
        cmd = crawl_cmd(db, spider, seeds)
        landed = 0
        t0 = time.monotonic()
        for i in range(kills):
            if name == "login" and i == 0:  # right after the login committed
                ok = kill_after(
                    server, cmd, env, lambda log: any(e["path"] == "/members" for e in log)
                )
            else:
                n0 = len(server.requests())
                need = 2 + i % 3
                ok = kill_after(server, cmd, env, lambda log, n0=n0, k=need: len(log) >= n0 + k)
            landed += ok
        final = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True)
        seconds = time.monotonic() - t0
        log = server.requests()
        logins = server.state.logins
    n = cfg.pages * cfg.per_page
    queries = sorted({item_category(i) for i in range(1, n + 1)})
    expected = {
        "catalog": expected_items(cfg),
        "catalog+search": {**expected_items(cfg), **expected_search(cfg, queries)},
        "api": expected_api(cfg),
        "search": expected_search(cfg, ["books", "toys"]),
        "login": expected_members(cfg),
        "js": expected_js(cfg),
    }[name]
    got = records(db)
    paths = Counter((e["method"], e["path"], e["body"]) for e in log)
    repeated = sum(c - 1 for c in paths.values())
    bad = wrong_requests(name, log)
    ok = final.returncode == 0 and got == expected and not bad and (name != "login" or logins == 1)
    print(
        f"{name:15s} kills landed {landed:2d}/{kills}  requests {len(log):3d} "
        f"(distinct {len(paths):3d}, repeated {repeated:2d})  records {len(got):3d}/"
        f"{len(expected):3d} {'exact' if got == expected else 'MISMATCH'}  "
        f"wrong-way requests {len(bad)}"
        + (f"  logins {logins}" if name == "login" else "")
        + f"  {seconds:.1f} s  {'ok' if ok else 'FAIL'}"
    )
    for b in bad[:5]:
        print("    ", b)
    if final.returncode != 0:
        print("    final run:", final.stderr.strip()[-300:])
    return ok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kills", type=int, default=10)
    a = ap.parse_args()
    spiders = {
        "catalog": "examples/catalog.py:Catalog",
        "catalog+search": "tests.sandbox_spiders:CatalogSearch",
        "api": "examples/api.py:LoadMore",
        "search": "examples/search.py:Search",
        "login": "examples/login.py:Members",
        "js": "examples/js.py:Rendered",
    }
    with tempfile.TemporaryDirectory() as d:
        results = [run_one(name, spec, a.kills, Path(d)) for name, spec in spiders.items()]
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
