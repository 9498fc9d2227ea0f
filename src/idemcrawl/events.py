"""Index events for consumers (R21): a cursor reader and an at-least-once webhook deliverer.

The completion transaction already writes exactly one outbox event per ``(url_id, version)``;
what remains is getting them out without losing any. Both consumers here are driven by the
event id as a cursor:

* ``read_events`` streams events after a cursor (``idemcrawl events --after N``); a consumer
  that stores the last cursor it processed resumes exactly there.
* ``deliver_webhook`` POSTs each event with an ``Idempotency-Key`` header and advances the
  stored cursor of its consumer only after a 2xx answer. A crash between the answer and the
  cursor write redelivers that one event, never skips one: delivery is at-least-once and the
  receiver makes it exactly-once by ignoring a key it has processed.

The deliverer uses the standard library's ``http.client`` on purpose: one POST at a time over a
kept-alive connection needs nothing more, and it never follows redirects (a 3xx is a failed
delivery, not a reason to send the event to another address).
"""

from __future__ import annotations

import base64
import http.client
import json
import logging
import random
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TextIO
from urllib.parse import SplitResult, unquote, urlsplit

from .frontier.base import Frontier
from .version import DEFAULT_USER_AGENT

log = logging.getLogger(__name__)

#: Errors of a reused keep-alive connection that the server closed while it sat idle: the
#: request is retried at once on a new connection instead of counting as a failed delivery.
_STALE_CONNECTION = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError)


class WebhookError(Exception):
    """The webhook cannot be used as given (bad URL) or delivery gave up; printed as one line."""


def event_key(event: dict[str, Any]) -> str:
    """The idempotency key: one per URL version, so a redelivery carries the same key."""
    return f"{event['url_id']}:{event['url_version']}"


def _decorate(row: dict[str, Any]) -> dict[str, Any]:
    return {"cursor": row["event_id"], "key": event_key(row), **row}


def read_events(
    db: Frontier,
    after: int = 0,
    limit: int | None = None,
    follow: bool = False,
    poll: float = 0.5,
    *,
    batch: int = 500,
    stop: threading.Event | None = None,
) -> Iterator[dict[str, Any]]:
    """Events with a cursor above ``after``, in cursor order, each with ``cursor`` and ``key``.

    ``limit`` caps how many are yielded in total (None: all). Without ``follow`` the stream ends
    at the newest event; with it, it polls every ``poll`` seconds for new ones until ``limit``
    is reached or ``stop`` is set.
    """
    if batch <= 0:
        raise ValueError(f"batch must be positive, got {batch}")
    cursor = max(0, after)
    left = limit
    while left is None or left > 0:
        if stop is not None and stop.is_set():
            return
        rows = db.events_after(cursor, batch if left is None else min(batch, left))
        for row in rows:
            yield _decorate(row)
        if rows:
            cursor = rows[-1]["event_id"]
            if left is not None:
                left -= len(rows)
            continue
        if not follow:
            return
        if stop is not None:
            stop.wait(poll)
        else:
            time.sleep(poll)


def write_events(
    db: Frontier,
    out: TextIO,
    after: int = 0,
    limit: int | None = None,
    follow: bool = False,
    poll: float = 0.5,
    *,
    stop: threading.Event | None = None,
) -> int:
    """Print events as JSON lines, flushed per line so a piped ``--follow`` consumer sees each
    event as soon as it exists. Returns how many were written."""
    n = 0
    for event in read_events(db, after, limit, follow, poll, stop=stop):
        out.write(json.dumps(event, ensure_ascii=False, separators=(",", ":")) + "\n")
        out.flush()
        n += 1
    return n


@dataclass(slots=True)
class DeliveryStats:
    """What one deliverer run did; ``cursor`` is the last event id the receiver acknowledged."""

    delivered: int = 0
    attempts: int = 0
    failures: int = 0
    resumed_from: int = 0
    cursor: int = 0

    def as_dict(self) -> dict[str, int]:
        return {
            "delivered": self.delivered,
            "attempts": self.attempts,
            "failures": self.failures,
            "resumed_from": self.resumed_from,
            "cursor": self.cursor,
        }


def check_webhook_url(url: str) -> SplitResult:
    """Refuse what cannot be a webhook before any event is read or the cursor touched."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise WebhookError(f"invalid webhook URL {url!r}: {exc}") from None
    if parts.scheme not in ("http", "https"):
        raise WebhookError(
            f"webhook URL {url!r} must start with http:// or https:// "
            f"(got {parts.scheme + ':' if parts.scheme else 'no scheme'})"
        )
    if not parts.hostname:
        raise WebhookError(f"webhook URL {url!r} has no host")
    if port == 0:
        raise WebhookError(f"webhook URL {url!r} has port 0")
    return parts


def backoff_delay(attempt: int, base: float, cap: float, rng: random.Random) -> float:
    """Exponential back-off with equal jitter: at least half the step, so a down receiver is
    retried ever more slowly, and randomised, so many deliverers do not retry in lock-step."""
    step = min(cap, base * 2 ** min(attempt - 1, 30))
    return step / 2 + rng.uniform(0, step / 2)


class _Poster:
    """One kept-alive connection to the receiver, reopened after any error."""

    def __init__(self, parts: SplitResult, timeout: float) -> None:
        self._parts = parts
        self._timeout = timeout
        self._conn: http.client.HTTPConnection | None = None
        self._used = False
        path = parts.path or "/"
        self._target = f"{path}?{parts.query}" if parts.query else path
        self._headers = {
            "Content-Type": "application/json",
            "User-Agent": f"{DEFAULT_USER_AGENT} (webhook)",
        }
        if parts.username is not None:
            creds = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
            self._headers["Authorization"] = "Basic " + base64.b64encode(creds.encode()).decode()

    def _connection(self) -> http.client.HTTPConnection:
        if self._conn is None:
            host, port = self._parts.hostname or "", self._parts.port
            if self._parts.scheme == "https":
                self._conn = http.client.HTTPSConnection(host, port, timeout=self._timeout)
            else:
                self._conn = http.client.HTTPConnection(host, port, timeout=self._timeout)
            self._used = False
        return self._conn

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def post(self, body: bytes, key: str) -> tuple[int, str | None]:
        """(status, Retry-After header); raises OSError/HTTPException when no answer came."""
        headers = {**self._headers, "Idempotency-Key": key}
        for fresh_retry in (False, True):
            conn = self._connection()
            reused = self._used
            try:
                conn.request("POST", self._target, body=body, headers=headers)
                resp = conn.getresponse()
                resp.read()
            except _STALE_CONNECTION:
                self.close()
                if reused and not fresh_retry:
                    continue  # the server dropped an idle keep-alive connection: retry now
                raise
            except BaseException:
                self.close()
                raise
            self._used = True
            if resp.will_close:
                self.close()
            return resp.status, resp.getheader("Retry-After")
        raise AssertionError("unreachable")


def _retry_after(value: str | None, cap: float) -> float | None:
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        return None  # an HTTP date: the exponential back-off is good enough
    return min(max(seconds, 0.0), cap)


def deliver_webhook(
    db: Frontier,
    url: str,
    consumer: str = "webhook",
    *,
    batch: int = 100,
    timeout: float = 10.0,
    max_backoff: float = 60.0,
    base_backoff: float = 0.5,
    stop_when_idle: bool = False,
    poll: float = 0.5,
    max_attempts: int | None = None,
    stop: threading.Event | None = None,
    rng: random.Random | None = None,
    on_event: Callable[[dict[str, Any], DeliveryStats], None] | None = None,
) -> DeliveryStats:
    """POST every event after ``consumer``'s stored cursor to ``url``, in cursor order.

    Each event is retried (exponential back-off with jitter up to ``max_backoff``, honouring a
    numeric Retry-After up to the same cap) until the receiver answers 2xx; only then does the
    cursor move past it, so events are never skipped or reordered. Runs until ``stop`` is set,
    or — with ``stop_when_idle`` — until no event is left. ``max_attempts`` (None: forever) makes
    a persistently failing receiver end the run with :class:`WebhookError`; the cursor still
    points before the undelivered event, so the next run starts with it.
    """
    parts = check_webhook_url(url)
    if batch <= 0:
        raise ValueError(f"batch must be positive, got {batch}")
    rng = rng or random.Random()
    poster = _Poster(parts, timeout)
    where = f"{parts.scheme}://{parts.hostname}{':' + str(parts.port) if parts.port else ''}"

    def wait(seconds: float) -> bool:
        """Sleep; True if asked to stop meanwhile."""
        if stop is not None:
            return stop.wait(seconds)
        time.sleep(seconds)
        return False

    cursor = db.get_cursor(consumer)
    stats = DeliveryStats(resumed_from=cursor, cursor=cursor)
    try:
        while not (stop is not None and stop.is_set()):
            events = db.events_after(cursor, batch)
            if not events:
                if stop_when_idle or wait(poll):
                    break
                continue
            for row in events:
                event = _decorate(row)
                body = json.dumps(event, ensure_ascii=False, separators=(",", ":")).encode()
                attempt = 0
                while True:
                    if stop is not None and stop.is_set():
                        return stats
                    attempt += 1
                    stats.attempts += 1
                    try:
                        status, retry_after = poster.post(body, event["key"])
                    except (OSError, http.client.HTTPException) as exc:
                        status, retry_after, problem = None, None, f"{type(exc).__name__}: {exc}"
                    else:
                        if 200 <= status < 300:
                            break
                        problem = f"HTTP {status}"
                    stats.failures += 1
                    if max_attempts is not None and attempt >= max_attempts:
                        raise WebhookError(
                            f"webhook {where} did not accept event {event['cursor']} "
                            f"(key {event['key']}) after {attempt} attempts: {problem}; "
                            f"the cursor of {consumer!r} stays at {cursor}"
                        )
                    delay = backoff_delay(attempt, base_backoff, max_backoff, rng)
                    hinted = _retry_after(retry_after, max_backoff)
                    if hinted is not None:
                        delay = max(delay, hinted)
                    log.warning(
                        "webhook %s: event %s (key %s) attempt %d failed (%s); retrying in %.2f s",
                        where,
                        event["cursor"],
                        event["key"],
                        attempt,
                        problem,
                        delay,
                    )
                    if wait(delay):
                        return stats
                cursor = event["cursor"]
                db.set_cursor(consumer, cursor)
                stats.delivered += 1
                stats.cursor = cursor
                if on_event is not None:
                    on_event(event, stats)
    finally:
        poster.close()
    return stats
