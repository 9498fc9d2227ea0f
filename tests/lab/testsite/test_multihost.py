"""Tests for the multi-host politeness site: robots variants, status pages, log, CLI server.

Everything talks to 127.0.0.1 only, through openers with proxies disabled so an
``http_proxy`` in the environment can never route test traffic off the machine.
"""

from __future__ import annotations

import json
import os
import re
import selectors
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from email.message import Message
from typing import Any

import pytest

from idemcrawl.lab.testsite.multihost import (
    NO_RESPONSE,
    HostSpec,
    MultiHostServer,
    default_hosts,
    page_links,
    robots_txt,
    serve_multihost,
)

from ...helpers import spawn_python


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """Surface 3xx as responses so each hop can be inspected (urllib raises HTTPError)."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))
_RAW_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}), _NoRedirect())

SPECS = [
    HostSpec("rules", pages=5, links_per_page=2, crawl_delay=1.5, status_pages=True),
    HostSpec("none", pages=2, robots="none"),
    HostSpec("error", pages=2, robots="error"),
    HostSpec("hang", pages=2, robots="hang", hang_seconds=1.5),
    HostSpec("redirect", pages=2, robots="redirect"),
    HostSpec("loop", pages=2, robots="redirect-loop"),
    HostSpec("forbidden", pages=2, robots="forbidden"),
    HostSpec("slowpoke", pages=2, latency_ms=100, slow_seconds=0.2),
]


def get(url: str, *, follow: bool = True, method: str = "GET") -> tuple[int, Message, str]:
    """(status, headers, body) without raising on HTTP errors or redirects."""
    opener = _OPENER if follow else _RAW_OPENER
    req = urllib.request.Request(url, method=method)
    try:
        with opener.open(req, timeout=10) as resp:
            return resp.status, resp.headers, resp.read().decode()
    except urllib.error.HTTPError as err:
        with err:
            return err.code, err.headers, err.read().decode()


@pytest.fixture(scope="module")
def server() -> Iterator[MultiHostServer]:
    with MultiHostServer(SPECS) as srv:
        yield srv


@pytest.fixture
def site(server: MultiHostServer) -> MultiHostServer:
    """The shared server with log cleared and once-only pages re-armed.

    Waits for requests left over from the previous test (a client that timed out on /slow or a
    hanging robots.txt) to finish first, or they would be logged into this test's log.
    """
    deadline = time.monotonic() + 40
    while any(h["in_flight"] for h in server.stats().values()) and time.monotonic() < deadline:
        time.sleep(0.02)
    server.reset()
    return server


def url(site: MultiHostServer, name: str, path: str) -> str:
    return site.base_url_for(name) + path


def test_urls_are_distinct_loopback_ports_in_spec_order(site: MultiHostServer) -> None:
    assert len(site.base_urls) == len(SPECS)
    assert len(set(site.base_urls)) == len(SPECS)
    for base, spec in zip(site.base_urls, SPECS, strict=True):
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+", base)
        assert site.spec_for(base) is spec
        assert site.spec_for(base + "/") is spec
    assert site.seed_urls == [b + "/p/0" for b in site.base_urls]
    with pytest.raises(KeyError):
        site.spec_for("http://127.0.0.1:1")


def test_rules_robots_with_crawl_delay(site: MultiHostServer) -> None:
    status, headers, body = get(url(site, "rules", "/robots.txt"))
    assert status == 200
    assert headers["Content-Type"].startswith("text/plain")
    assert body == "User-agent: *\nDisallow: /private\nCrawl-delay: 1.5\n"
    assert robots_txt(HostSpec("x")) == "User-agent: *\nDisallow: /private\n"


@pytest.mark.parametrize(("name", "code"), [("none", 404), ("error", 500), ("forbidden", 403)])
def test_robots_status_variants(site: MultiHostServer, name: str, code: int) -> None:
    assert get(url(site, name, "/robots.txt"))[0] == code


def test_robots_redirect_serves_rules_and_logs_both(site: MultiHostServer) -> None:
    status, headers, _ = get(url(site, "redirect", "/robots.txt"), follow=False)
    assert status == 301
    assert headers["Location"] == "/robots-real.txt"
    status, _, body = get(url(site, "redirect", "/robots.txt"))
    assert (status, body) == (200, "User-agent: *\nDisallow: /private\n")
    paths = [e["path"] for e in site.request_log()]
    assert paths == ["/robots.txt", "/robots.txt", "/robots-real.txt"]
    # Only the redirect host serves the real file.
    assert get(url(site, "rules", "/robots-real.txt"))[0] == 404


def test_robots_redirect_loop_exceeds_five_hops_and_cycles(site: MultiHostServer) -> None:
    path, seen = "/robots.txt", []
    for _ in range(20):
        status, headers, _ = get(url(site, "loop", path), follow=False)
        assert status == 301, (path, status)
        seen.append(path)
        path = headers["Location"]
        if path == "/robots.txt":
            break
    assert len(seen) > 5
    assert path == "/robots.txt", "the chain should come back round: a real loop"
    assert len(set(seen)) == len(seen)
    # Hop pages exist only on the redirect-loop host.
    assert get(url(site, "rules", "/r1"), follow=False)[0] == 404


@pytest.mark.slow
def test_hang_does_not_block_other_hosts(site: MultiHostServer) -> None:
    hang_url = url(site, "hang", "/robots.txt")
    hang_base = site.base_url_for("hang")
    result: list[tuple[int, float]] = []

    def fetch_hang() -> None:
        t0 = time.monotonic()
        status = get(hang_url)[0]
        result.append((status, time.monotonic() - t0))

    thread = threading.Thread(target=fetch_hang)
    thread.start()
    try:
        deadline = time.monotonic() + 5
        while site.stats()[hang_base]["in_flight"] == 0:
            assert time.monotonic() < deadline, "hang request never arrived"
            time.sleep(0.01)
        t0 = time.monotonic()
        assert get(url(site, "none", "/p/1"))[0] == 200
        assert get(url(site, "hang", "/p/0"))[0] == 200  # not even its own host is blocked
        assert time.monotonic() - t0 < 0.5
        assert site.stats()[hang_base]["in_flight"] == 1
    finally:
        thread.join(10)
    assert result and result[0][0] == 500
    assert result[0][1] >= 1.4


def test_stop_does_not_wait_for_a_hanging_request() -> None:
    srv = MultiHostServer([HostSpec("h", robots="hang", hang_seconds=30)]).start()
    errors: list[BaseException] = []

    def fetch() -> None:
        try:
            get(srv.base_urls[0] + "/robots.txt")
        except OSError as exc:  # connection dropped at shutdown: expected
            errors.append(exc)

    base = srv.base_urls[0]
    thread = threading.Thread(target=fetch, daemon=True)
    thread.start()
    deadline = time.monotonic() + 5
    while srv.stats()[base]["in_flight"] == 0:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    t0 = time.monotonic()
    srv.stop()
    assert time.monotonic() - t0 < 4
    thread.join(5)
    assert not thread.is_alive()
    # The cancelled request is still logged, with the "no response" status.
    (entry,) = srv.request_log()
    assert entry["path"] == "/robots.txt"
    assert entry["status"] == NO_RESPONSE


def test_pages_link_ring_private_and_status_pages(site: MultiHostServer) -> None:
    status, _, body = get(url(site, "rules", "/p/0"))
    assert status == 200
    hrefs = re.findall(r'href="([^"]+)"', body)
    assert hrefs == page_links(site.specs[0], 0)
    assert hrefs == [
        "/p/1",
        "/p/2",
        "/private/0",
        "/limited",
        "/limited-nora",
        "/unavailable",
        "/always500",
    ]
    hrefs = re.findall(r'href="([^"]+)"', get(url(site, "rules", "/p/4"))[2])
    assert hrefs == ["/p/0", "/p/1", "/private/4", "/limited"]
    # Plain hosts link neither status pages nor /slow, and do not serve them.
    hrefs = re.findall(r'href="([^"]+)"', get(url(site, "none", "/p/0"))[2])
    assert hrefs == ["/p/1", "/p/0", "/p/1", "/private/0"]  # the ring wraps; dups are fine
    for path in ("/limited", "/always500", "/slow"):
        assert get(url(site, "none", path))[0] == 404
    assert get(url(site, "rules", "/private/3"))[0] == 200
    for bad in ("/p/5", "/p/01", "/private/9", "/nope"):
        assert get(url(site, "rules", bad))[0] == 404


def test_limited_429_with_retry_after_then_200(site: MultiHostServer) -> None:
    status, headers, _ = get(url(site, "rules", "/limited"))
    assert (status, headers["Retry-After"]) == (429, "2")
    assert get(url(site, "rules", "/limited"))[0] == 200
    assert get(url(site, "rules", "/limited"))[0] == 200


def test_limited_nora_429_without_retry_after_then_200(site: MultiHostServer) -> None:
    status, headers, _ = get(url(site, "rules", "/limited-nora"))
    assert status == 429
    assert headers["Retry-After"] is None
    assert get(url(site, "rules", "/limited-nora"))[0] == 200


def test_unavailable_503_then_200_and_reset_rearms(site: MultiHostServer) -> None:
    status, headers, _ = get(url(site, "rules", "/unavailable"))
    assert (status, headers["Retry-After"]) == (503, "1")
    assert get(url(site, "rules", "/unavailable"))[0] == 200
    site.reset()
    assert get(url(site, "rules", "/unavailable"))[0] == 503


def test_always500(site: MultiHostServer) -> None:
    assert [get(url(site, "rules", "/always500"))[0] for _ in range(3)] == [500, 500, 500]


def test_request_log_entries(site: MultiHostServer) -> None:
    before = time.monotonic()
    get(url(site, "rules", "/p/1?x=1"))
    get(url(site, "error", "/robots.txt"))
    get(url(site, "none", "/missing"))
    get(url(site, "slowpoke", "/p/0"))
    get(url(site, "slowpoke", "/slow"))
    log = site.request_log()
    assert [(e["host"], e["path"], e["status"]) for e in log] == [
        (site.base_url_for("rules"), "/p/1?x=1", 200),
        (site.base_url_for("error"), "/robots.txt", 500),
        (site.base_url_for("none"), "/missing", 404),
        (site.base_url_for("slowpoke"), "/p/0", 200),
        (site.base_url_for("slowpoke"), "/slow", 200),
    ]
    for entry in log:
        assert set(entry) == {"host", "path", "start", "end", "status"}
        assert before <= entry["start"] <= entry["end"] <= time.monotonic()
    # Latency falls between start and end, because start is taken on arrival.
    assert log[3]["end"] - log[3]["start"] >= 0.1
    assert log[4]["end"] - log[4]["start"] >= 0.3
    # Starts are in order across hosts: one clock for the whole site.
    starts = [e["start"] for e in log]
    assert starts == sorted(starts)
    # The returned log is a copy.
    log[0]["status"] = 999
    assert site.request_log()[0]["status"] == 200


def test_control_log_is_site_wide_and_not_logged(site: MultiHostServer) -> None:
    get(url(site, "rules", "/p/0"))
    get(url(site, "forbidden", "/robots.txt"))
    for name in ("rules", "hang"):
        status, _, body = get(url(site, name, "/__log"))
        assert status == 200
        remote = json.loads(body)
        assert [(e["host"], e["path"]) for e in remote] == [
            (site.base_url_for("rules"), "/p/0"),
            (site.base_url_for("forbidden"), "/robots.txt"),
        ]
    get(url(site, "rules", "/__stats"))
    assert not any(e["path"].startswith("/__") for e in site.request_log())
    assert len(site.request_log()) == 2
    stats = site.stats()
    assert stats[site.base_url_for("rules")]["total"] == 1
    assert stats[site.base_url_for("rules")]["paths"] == {"/p/0": 1}
    assert stats[site.base_url_for("none")]["total"] == 0
    assert get(url(site, "none", "/__reset"), method="POST")[0] == 200
    assert site.request_log() == []


def test_default_hosts_shape() -> None:
    hosts = default_hosts()
    assert [h.name for h in hosts] == ["a", "b", "c", "d"]
    assert [h.robots for h in hosts] == ["rules", "rules", "rules", "error"]
    assert [h.crawl_delay for h in hosts] == [None, None, 1, None]
    assert [h.status_pages for h in hosts] == [True, False, False, False]


def test_default_hosts_expectations() -> None:
    with MultiHostServer() as srv:
        a, b, c, d = srv.base_urls
        assert srv.disallowed_prefixes() == {a: ["/private"], b: ["/private"], c: ["/private"]}
        assert srv.robots_only_hosts() == {d}
        assert "Crawl-delay: 1\n" in get(c + "/robots.txt")[2]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"name": ""},
        {"name": "x", "pages": 0},
        {"name": "x", "robots": "sometimes"},
        {"name": "x", "latency_ms": -1},
        {"name": "x", "crawl_delay": -1},
    ],
)
def test_hostspec_validation(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        HostSpec(**kwargs)


def test_duplicate_names_rejected() -> None:
    with pytest.raises(ValueError):
        MultiHostServer([HostSpec("x"), HostSpec("x")])


def _read_lines(proc: subprocess.Popen[str], n: int, timeout: float) -> list[str]:
    """First ``n`` stdout lines, read from the raw fd so no line hides in a Python buffer."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    data = b""
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        while data.count(b"\n") < n:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not sel.select(remaining):
                raise AssertionError(f"no {n} lines within {timeout} s: {data!r}")
            chunk = os.read(fd, 4096)
            if not chunk:
                raise AssertionError(f"stdout closed early: {data!r}")
            data += chunk
    return [line + "\n" for line in data.decode().split("\n")[:n]]


def test_serve_multihost_prints_hosts_and_exits_cleanly_on_sigterm() -> None:
    assert callable(serve_multihost)
    code = (
        "from idemcrawl.lab.testsite.multihost import HostSpec, serve_multihost; "
        "serve_multihost([HostSpec('a', pages=3), HostSpec('d', robots='error')])"
    )
    proc = spawn_python(code)
    try:
        lines = _read_lines(proc, 2, timeout=10)
        pattern = r"(\w+) (http://127\.0\.0\.1:\d+)/p/0 robots=(\S+)\n"
        matches = [re.fullmatch(pattern, line) for line in lines]
        assert all(matches), lines
        parsed = [m.groups() for m in matches if m]
        assert [(n, r) for n, _, r in parsed] == [("a", "rules"), ("d", "error")]
        a_url, d_url = parsed[0][1], parsed[1][1]
        assert get(a_url + "/p/2")[0] == 200
        assert get(d_url + "/robots.txt")[0] == 500
        remote = json.loads(get(d_url + "/__log")[2])
        assert [(e["host"], e["path"]) for e in remote] == [
            (a_url, "/p/2"),
            (d_url, "/robots.txt"),
        ]
        time.sleep(0.2)
        assert proc.poll() is None, "must keep serving until signalled"
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=10)
        _, err = proc.communicate(timeout=5)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert rc == 0, err
    assert "Traceback" not in err
