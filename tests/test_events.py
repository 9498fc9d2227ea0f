"""Index events out of the crawl (R21): cursor reads and at-least-once webhook delivery.

The acceptance tests run the receiver (and in one test the deliverer) as real processes on
127.0.0.1 and SIGKILL them mid-delivery; the receiver dedups by ``Idempotency-Key`` in its own
SQLite file, as a real consumer would, so "processed exactly once" is checked on its side.
"""

from __future__ import annotations

import base64
import io
import json
import logging
import random
import signal
import sqlite3
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from idemcrawl.events import (
    DeliveryStats,
    WebhookError,
    backoff_delay,
    check_webhook_url,
    deliver_webhook,
    read_events,
    write_events,
)
from idemcrawl.frontier.base import Completion, HostPolicy, NewURL, RecordWrite
from idemcrawl.frontier.sqlite import SQLiteFrontier
from idemcrawl.lab.testsite.server import AppServer

from .helpers import run_python, spawn_python

T0 = 1_000_000.0
FAST = HostPolicy(max_in_flight=64, delay=0.0)
FAST_RETRY: dict[str, Any] = {"base_backoff": 0.01, "max_backoff": 0.1, "timeout": 10.0}


def add_events(db: SQLiteFrontier, n: int, start: int = 0) -> None:
    """Complete ``n`` fresh pages through the frontier API: one index event each."""
    db.add([NewURL(f"http://site/p{i}", "http://site") for i in range(start, start + n)], T0)
    made = 0
    while made < n:
        leases = db.lease("w", n - made, T0, 30, FAST)
        assert leases
        done = [
            Completion(ls, 200, T0, [RecordWrite.make("s", ls.url, {"u": ls.url})])
            for ls in leases
        ]
        assert all(db.complete(done, T0, FAST))
        made += len(leases)


def all_keys(db: SQLiteFrontier) -> list[str]:
    return [f"{e['url_id']}:{e['url_version']}" for e in db.iter_events()]


@pytest.fixture
def db(tmp_path: Path) -> Iterator[SQLiteFrontier]:
    f = SQLiteFrontier(str(tmp_path / "crawl.db"))
    yield f
    f.close()


# -- reading with a cursor ------------------------------------------------------------------------


def test_read_events_from_a_cursor_with_limit(db: SQLiteFrontier) -> None:
    add_events(db, 7)
    events = list(read_events(db, 0, batch=3))
    assert [e["cursor"] for e in events] == [e["event_id"] for e in events]
    assert [e["cursor"] for e in events] == sorted(e["cursor"] for e in events)
    assert [e["key"] for e in events] == all_keys(db)
    third = events[2]["cursor"]
    assert [e["cursor"] for e in read_events(db, third, limit=2)] == [
        events[3]["cursor"],
        events[4]["cursor"],
    ]
    assert list(read_events(db, events[-1]["cursor"])) == []


def test_follow_sees_events_committed_later_by_another_handle(
    db: SQLiteFrontier, tmp_path: Path
) -> None:
    add_events(db, 2)
    got: list[dict[str, Any]] = []
    reader = threading.Thread(
        target=lambda: got.extend(read_events(db, 0, limit=5, follow=True, poll=0.01))
    )
    reader.start()
    writer = SQLiteFrontier(str(tmp_path / "crawl.db"))
    time.sleep(0.1)
    add_events(writer, 3, start=100)
    writer.close()
    reader.join(10)
    assert not reader.is_alive()
    assert [e["key"] for e in got] == all_keys(db)


def test_follow_stops_when_asked(db: SQLiteFrontier) -> None:
    stop = threading.Event()
    got: list[dict[str, Any]] = []
    reader = threading.Thread(
        target=lambda: got.extend(read_events(db, 0, follow=True, poll=5, stop=stop))
    )
    reader.start()
    time.sleep(0.05)
    stop.set()
    reader.join(2)
    assert not reader.is_alive() and got == []


def test_write_events_prints_json_lines(db: SQLiteFrontier) -> None:
    add_events(db, 3)
    out = io.StringIO()
    assert write_events(db, out, after=0) == 3
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [e["key"] for e in lines] == all_keys(db)
    assert {"cursor", "key", "url", "status", "content_hash", "warc_file"} <= set(lines[0])


# -- the deliverer against an in-process receiver -------------------------------------------------


Responder = Callable[[int, dict[str, str], bytes], tuple[int, dict[str, str]]]


@contextmanager
def receiver(respond: Responder) -> Iterator[tuple[str, list[tuple[dict[str, str], bytes]]]]:
    """An HTTP server on 127.0.0.1 answering POSTs with ``respond``; yields (url, requests)."""
    seen: list[tuple[dict[str, str], bytes]] = []

    async def handle(request: web.Request) -> web.Response:
        body = await request.read()
        headers = dict(request.headers.items())
        seen.append((headers, body))
        status, extra = respond(len(seen), headers, body)
        return web.Response(status=status, headers=extra)

    def app() -> web.Application:
        app = web.Application()
        app.router.add_post("/{tail:.*}", handle)
        return app

    with AppServer(app) as server:
        yield f"{server.base_url}/hook?x=1", seen


def test_delivery_posts_each_event_with_its_idempotency_key(db: SQLiteFrontier) -> None:
    add_events(db, 4)
    with receiver(lambda n, h, b: (204, {})) as (url, seen):
        stats = deliver_webhook(db, url, stop_when_idle=True, **FAST_RETRY)
    keys = all_keys(db)
    assert [h["Idempotency-Key"] for h, _ in seen] == keys
    bodies = [json.loads(b) for _, b in seen]
    assert [b["key"] for b in bodies] == keys
    assert all(h["Content-Type"] == "application/json" for h, _ in seen)
    assert stats.delivered == 4 and stats.failures == 0 and stats.resumed_from == 0
    assert stats.cursor == bodies[-1]["cursor"] == db.get_cursor("webhook")
    # Nothing new: a second run sends nothing and keeps the cursor.
    with receiver(lambda n, h, b: (200, {})) as (url, seen2):
        again = deliver_webhook(db, url, stop_when_idle=True, **FAST_RETRY)
    assert seen2 == [] and again.delivered == 0 and again.resumed_from == stats.cursor


def test_basic_auth_from_the_url(db: SQLiteFrontier) -> None:
    add_events(db, 1)
    with receiver(lambda n, h, b: (200, {})) as (url, seen):
        authed = url.replace("http://", "http://hook%40user:s%3Acret@")
        deliver_webhook(db, authed, stop_when_idle=True, **FAST_RETRY)
    creds = base64.b64decode(seen[0][0]["Authorization"].removeprefix("Basic ")).decode()
    assert creds == "hook@user:s:cret"


def test_failing_receiver_keeps_the_cursor_and_gives_up_when_told(db: SQLiteFrontier) -> None:
    add_events(db, 2)
    with (
        receiver(lambda n, h, b: (500, {})) as (url, seen),
        pytest.raises(WebhookError, match=r"after 3 attempts: HTTP 500.*stays at 0"),
    ):
        deliver_webhook(db, url, max_attempts=3, stop_when_idle=True, **FAST_RETRY)
    assert len(seen) == 3 and {h["Idempotency-Key"] for h, _ in seen} == {all_keys(db)[0]}
    assert db.get_cursor("webhook") == 0


def test_redirect_is_a_failure_not_followed(db: SQLiteFrontier) -> None:
    add_events(db, 1)
    with (
        receiver(lambda n, h, b: (200, {})) as (elsewhere, moved),
        receiver(lambda n, h, b: (307, {"Location": elsewhere})) as (url, _),
        pytest.raises(WebhookError, match="HTTP 307"),
    ):
        deliver_webhook(db, url, max_attempts=1, stop_when_idle=True, **FAST_RETRY)
    assert moved == []


def test_retry_after_is_honoured_up_to_the_cap(db: SQLiteFrontier) -> None:
    add_events(db, 1)
    answers = {1: (503, {"Retry-After": "0.3"}), 2: (200, {})}
    with receiver(lambda n, h, b: answers[n]) as (url, seen):
        started = time.monotonic()
        stats = deliver_webhook(
            db, url, stop_when_idle=True, base_backoff=0.001, max_backoff=1.0, timeout=5
        )
        elapsed = time.monotonic() - started
    assert len(seen) == 2 and stats.delivered == 1 and stats.failures == 1
    assert 0.3 <= elapsed < 2.0


def test_stop_interrupts_the_back_off(db: SQLiteFrontier) -> None:
    add_events(db, 1)
    stop = threading.Event()
    result: list[DeliveryStats] = []
    with receiver(lambda n, h, b: (500, {})) as (url, seen):
        t = threading.Thread(
            target=lambda: result.append(
                deliver_webhook(db, url, stop=stop, base_backoff=30, max_backoff=60)
            )
        )
        t.start()
        deadline = time.monotonic() + 5
        while not seen and time.monotonic() < deadline:
            time.sleep(0.01)
        stop.set()
        t.join(5)
    assert not t.is_alive()
    assert result[0].delivered == 0 and result[0].failures == 1
    assert db.get_cursor("webhook") == 0


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("ftp://127.0.0.1/hook", "must start with http:// or https://"),
        ("file:///etc/passwd", "must start with http:// or https://"),
        ("127.0.0.1:8000/hook", "must start with http:// or https://"),
        ("hook", "no scheme"),
        ("http:///hook", "has no host"),
        ("http://127.0.0.1:99999/hook", "invalid webhook URL"),
    ],
)
def test_refuses_what_is_not_an_http_url(db: SQLiteFrontier, url: str, why: str) -> None:
    add_events(db, 1)
    with pytest.raises(WebhookError, match=why):
        deliver_webhook(db, url, stop_when_idle=True)
    assert db.get_cursor("webhook") == 0


def test_check_webhook_url_accepts_http_and_https() -> None:
    assert check_webhook_url("https://127.0.0.1/x").hostname == "127.0.0.1"
    assert check_webhook_url("http://[::1]:8080/x").port == 8080


def test_backoff_grows_with_jitter_and_is_capped() -> None:
    rng = random.Random(7)
    for attempt in range(1, 12):
        step = min(5.0, 0.1 * 2 ** (attempt - 1))
        samples = [backoff_delay(attempt, 0.1, 5.0, rng) for _ in range(50)]
        assert all(step / 2 <= s <= step for s in samples)
        assert len(set(samples)) > 1  # jittered
    assert backoff_delay(1000, 0.1, 5.0, rng) <= 5.0


# -- acceptance: receiver and deliverer as processes, killed mid-run -----------------------------

RECEIVER = r"""
import json, os, sqlite3, sys, threading, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

port, state, fail_first, hang_after, release = sys.argv[1:6]
fail_first, hang_after = int(fail_first), int(hang_after)
db = sqlite3.connect(state, isolation_level=None, check_same_thread=False)
db.execute("PRAGMA journal_mode=WAL")
db.execute("CREATE TABLE IF NOT EXISTS deliveries (n INTEGER PRIMARY KEY, key TEXT, answer INT)")
db.execute("CREATE TABLE IF NOT EXISTS processed (key TEXT PRIMARY KEY, cursor INT, body TEXT)")
lock = threading.Lock()

class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        key = self.headers["Idempotency-Key"]
        event = json.loads(body)
        assert event["key"] == key
        with lock:  # the consumer: count the delivery, fail the first ones, dedup by key
            n = db.execute("SELECT count(*) FROM deliveries").fetchone()[0] + 1
            answer = 500 if n <= fail_first else 200
            db.execute("INSERT INTO deliveries VALUES (?, ?, ?)", (n, key, answer))
            new = answer == 200 and db.execute(
                "INSERT OR IGNORE INTO processed VALUES (?, ?, ?)",
                (key, event["cursor"], body.decode()),
            ).rowcount == 1
            done = db.execute("SELECT count(*) FROM processed").fetchone()[0]
        if new and done == hang_after:  # processed, but the answer is held back
            while not os.path.exists(release):
                time.sleep(0.01)
        self.send_response(answer)
        self.send_header("Content-Length", "0")
        self.end_headers()

srv = ThreadingHTTPServer(("127.0.0.1", int(port)), Handler)
srv.daemon_threads = True
print(srv.server_address[1], flush=True)
srv.serve_forever()
"""

DELIVERER = r"""
import json, sys
from idemcrawl.events import deliver_webhook
from idemcrawl.frontier.sqlite import SQLiteFrontier

db = SQLiteFrontier(sys.argv[1], create=False)
stats = deliver_webhook(
    db, sys.argv[2], stop_when_idle=True, base_backoff=0.01, max_backoff=0.1, timeout=30
)
print(json.dumps(stats.as_dict()), flush=True)
"""


class Receiver:
    """The consumer process; its state file outlives a SIGKILL, like a real consumer's store."""

    def __init__(self, tmp: Path, *, fail_first: int = 0) -> None:
        self.state = tmp / "receiver.db"
        self.release = tmp / "release"
        self.fail_first = fail_first
        self.port = 0
        self.proc: subprocess.Popen[str] | None = None

    def start(self, *, hang_after: int = 0) -> None:
        self.proc = spawn_python(
            RECEIVER,
            str(self.port),
            str(self.state),
            str(self.fail_first),
            str(hang_after),
            str(self.release),
            stderr=None,
        )
        assert self.proc.stdout is not None
        self.port = int(self.proc.stdout.readline())

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/events"

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def query(self, sql: str) -> list[tuple[Any, ...]]:
        with sqlite3.connect(self.state) as conn:
            return conn.execute(sql).fetchall()

    def wait_processed(self, n: int, timeout: float = 20) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.state.exists() and self.query("SELECT count(*) FROM processed")[0][0] >= n:
                return
            time.sleep(0.01)
        raise AssertionError(f"receiver did not process {n} events in {timeout} s")


@pytest.fixture
def consumer(tmp_path: Path) -> Iterator[Receiver]:
    r = Receiver(tmp_path, fail_first=3)
    yield r
    if r.proc is not None and r.proc.poll() is None:
        r.kill()


def test_webhook_receiver_failing_and_killed_processes_every_event_once(
    db: SQLiteFrontier, consumer: Receiver, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 6 acceptance: 500 to the first 3 deliveries, SIGKILL mid-run, exactly once by key."""
    add_events(db, 30)
    consumer.start(hang_after=10)  # the 10th event is processed, then the receiver dies
    result: list[DeliveryStats] = []
    deliverer = threading.Thread(
        target=lambda: result.append(
            deliver_webhook(db, consumer.url, stop_when_idle=True, **FAST_RETRY)
        )
    )
    caplog.set_level(logging.WARNING, logger="idemcrawl.events")
    deliverer.start()
    consumer.wait_processed(10)
    consumer.kill()  # its answer for event 10 never leaves
    deadline = time.monotonic() + 10
    while "ConnectionRefusedError" not in caplog.text:  # it retries against the closed port
        assert time.monotonic() < deadline, caplog.text
        time.sleep(0.01)
    consumer.start()  # same port, same store, no more hanging
    deliverer.join(30)
    assert not deliverer.is_alive()
    (stats,) = result

    keys = all_keys(db)
    processed = consumer.query("SELECT key, cursor FROM processed ORDER BY cursor")
    assert [k for k, _ in processed] == keys  # every event, once, in cursor order
    deliveries = consumer.query("SELECT key, answer FROM deliveries ORDER BY n")
    assert [a for _, a in deliveries[:3]] == [500, 500, 500]
    assert {k for k, _ in deliveries[:3]} == {keys[0]}
    accepted = Counter(k for k, a in deliveries if a == 200)
    assert accepted == Counter({**dict.fromkeys(keys, 1), keys[9]: 2})  # one duplicate, ignored
    assert stats.delivered == 30 and stats.failures >= 3 + 1 + 1  # 500s, the kill, refused
    assert stats.cursor == db.get_cursor("webhook") == processed[-1][1]


def test_deliverer_killed_mid_delivery_resumes_from_its_cursor(
    db: SQLiteFrontier, tmp_path: Path
) -> None:
    add_events(db, 20)
    events = list(db.iter_events())
    receiver_ = Receiver(tmp_path)
    receiver_.start(hang_after=8)  # holds back the answer to the 8th event
    try:
        args = (str(tmp_path / "crawl.db"), receiver_.url)
        first = spawn_python(DELIVERER, *args, stderr=None)
        receiver_.wait_processed(8)
        assert db.get_cursor("webhook") == events[6]["event_id"]  # acknowledged: 7 events
        first.send_signal(signal.SIGKILL)
        first.wait(10)
        receiver_.release.touch()
        second = run_python(DELIVERER, *args)
        assert second.returncode == 0, second.stderr
    finally:
        receiver_.kill()
    stats = json.loads(second.stdout)
    assert stats["resumed_from"] == events[6]["event_id"]
    assert stats["delivered"] == 13 and stats["failures"] == 0
    keys = all_keys(db)
    assert [k for (k,) in receiver_.query("SELECT key FROM processed ORDER BY cursor")] == keys
    per_key = Counter(k for (k,) in receiver_.query("SELECT key FROM deliveries"))
    assert per_key == Counter({**dict.fromkeys(keys, 1), keys[7]: 2})  # only the in-flight one
    assert db.get_cursor("webhook") == events[-1]["event_id"]
