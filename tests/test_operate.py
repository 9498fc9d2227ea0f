"""A crawl of the multi-host site as an operator sees it: live progress lines and a Prometheus
endpoint scraped while the crawl runs (issue 9)."""

from __future__ import annotations

import json
import socket
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from idemcrawl.lab.testsite.multihost import HostSpec, MultiHostServer
from idemcrawl.metrics import METRICS

from .helpers import spawn_cli


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
def test_live_progress_and_metrics_during_a_crawl(tmp_path: Path) -> None:
    specs = [
        HostSpec("a", pages=40, latency_ms=30, status_pages=True),
        HostSpec("b", pages=40, latency_ms=30),
        HostSpec("c", pages=30, latency_ms=30, robots="none"),
    ]
    port = _free_port()
    with MultiHostServer(specs) as site:
        proc = spawn_cli(
            "crawl",
            *site.seed_urls,
            "--db",
            str(tmp_path / "c.db"),
            "--spider",
            "idemcrawl.lab.testsite.page_spider:PageSpider",
            "--delay",
            "0.05",
            "--allow-private",
            "127.0.0.1",
            "--metrics-port",
            str(port),
        )
        families: dict[str, object] = {}
        samples: dict[str, float] = {}
        deadline = time.monotonic() + 60
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(1.0)
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                    text = r.read().decode()
            except OSError:
                continue
            for fam in text_string_to_metric_families(text):
                families[fam.name] = fam
                for s in fam.samples:
                    samples[s.name + json.dumps(s.labels, sort_keys=True)] = s.value
        out, err = proc.communicate(timeout=60)
    # Finished, but /always500 failed for good after its retries: exit status 4, and the end
    # of the run says so, with the URL (a fetch error: no traceback).
    assert proc.returncode == 4, err
    report = out.splitlines()
    at = report.index("failed URLs      1 (failed for good; by reason, most URLs first):")
    assert report[at + 1].split(maxsplit=1) == ["1", "HTTP 500 (after 4 attempts)"]
    assert report[at + 2].endswith("/always500") and len(report) == at + 3
    # Not a TTY: progress is JSON lines on stderr, with the live numbers.
    lines = [json.loads(x) for x in err.splitlines() if x.startswith("{")]
    progress = [x for x in lines if x.get("type") == "progress"]
    assert progress, err
    last = progress[-1]
    assert last["urls"].get("done", 0) > 0 and "pages_per_s" in last and "hosts_ready" in last
    assert any(p["pages_per_s"] > 0 for p in progress)
    # Every documented metric was exposed during the run (the live gauges too).
    exposed = {name.removesuffix("_total") for name in families}
    missing = [m.name for m in METRICS if m.name.removesuffix("_total") not in exposed]
    # The histogram appears under its own family name; quantiles likewise.
    assert not missing, missing
    assert samples['idemcrawl_politeness_violations{}'] == 0
    assert samples['idemcrawl_fetches_total{}'] > 0
    assert samples['idemcrawl_responses_total{"class": "2xx"}'] > 0
    assert samples['idemcrawl_responses_total{"class": "429"}'] > 0
    assert samples['idemcrawl_responses_total{"class": "5xx"}'] > 0
    assert samples['idemcrawl_url_duplicates_total{}'] > 0
    assert samples['idemcrawl_requests_per_record{}'] > 0
