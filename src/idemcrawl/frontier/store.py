"""What a backend provides to the scheduler: one transaction's primitive, batch-shaped operations.

``scheduler.py`` decides (which host is ready, how many URLs to take, what a robots.txt answer
does to its host, when a host backs off); a :class:`Store` only reads and writes rows. Each
backend hands the scheduler a fresh store inside each transaction it runs (``Scheduler._run``):

* ``sqlite.py`` and ``postgres.py`` use the SQL written once in ``sql.py`` (``SQLStore``), in their
  dialect, and override the few operations PostgreSQL does set-based (``unnest``) or with row
  locks;
* ``memory.py`` keeps the same rows in indexed Python structures.

Every operation works on a batch where a caller can have more than one (URLs, leases,
completions, hosts), so that doing more per statement is a change inside a store, not in the
scheduler. All operations of one store run in one transaction: on the SQL engines a failure rolls
the whole of it back. Rows are the schema's rows: :data:`HOST_COLUMNS`, :data:`URL_COLUMNS`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

from .base import Completion, Cookie, FrontierStats, Lease, NewURL, Progress, RequestSpec

#: Bumped with the schema, on every backend alike (``migrate`` returns it).
SCHEMA_VERSION = 13

#: The columns of ``urls``, in table order (what ``url_row`` returns).
URL_COLUMNS = (
    "url_id", "url", "host_key", "state", "reason", "version", "priority", "depth", "due_at",
    "discovered_at", "lease_owner", "lease_token", "lease_expires_at", "leased_at", "attempts",
    "last_error", "status_code", "fetched_at", "body_bytes", "content_hash", "simhash", "etag",
    "last_modified", "next_fetch_at", "revisit_interval", "canonical_hint", "warc_file",
    "warc_offset", "warc_length", "payload_digest", "kind", "hops", "redirect_to", "near_dup_of",
    "stored_file",
)  # fmt: skip


class HostRow(NamedTuple):
    """One row of ``hosts``, in table order: level 1 of the schedule reads all of it."""

    host_key: str
    next_allowed_at: float
    in_flight: int
    queued: int
    max_in_flight: int | None
    delay: float | None
    backoff_until: float
    error_streak: int
    latency_ewma: float | None
    paused: int
    pause_reason: str | None
    robots_state: str | None
    robots_body: bytes | None
    robots_fetched_at: float | None
    robots_expires_at: float | None
    crawl_delay: float | None
    budget_day: str | None
    budget_used: int
    robots_meta: str | None
    robots_failures: int
    backoff_reason: str | None
    budget: int | None


HOST_COLUMNS: tuple[str, ...] = HostRow._fields

#: What a lease is made of, in this order (``lease_from_row``): the row ``pick_urls`` returns.
PICK_COLUMNS = (
    "url_id", "url", "version", "depth", "attempts", "due_at", "kind", "etag", "last_modified",
    "content_hash", "status_code", "revisit_interval", "hops",
)  # fmt: skip

#: What reparse needs of a URL (``reparse_candidates``).
REPARSE_COLUMNS = (
    "url_id", "url", "version", "depth", "kind", "state", "status_code", "last_error",
    "warc_file", "warc_offset", "warc_length", "payload_digest",
)  # fmt: skip

#: What the streamed exports carry (``iter_urls``, ``iter_events``, ``iter_records``).
URL_EXPORT_COLUMNS = (
    "url_id", "url", "state", "reason", "kind", "version", "status_code", "fetched_at",
    "body_bytes", "content_hash", "depth", "next_fetch_at",
)  # fmt: skip
EVENT_COLUMNS = (
    "event_id", "url_id", "url_version", "url", "status", "fetched_at", "content_hash", "records",
    "links", "warc_file", "warc_offset", "warc_length", "payload_digest", "created_at",
)  # fmt: skip
RECORD_COLUMNS = (
    "record_id", "source", "key", "url", "data", "content_hash", "first_seen", "last_changed",
)  # fmt: skip
#: Keyset streams: table -> (columns, key, first key).
STREAMS: dict[str, tuple[tuple[str, ...], str, Any]] = {
    "urls": (URL_EXPORT_COLUMNS, "url_id", 0),
    "events": (EVENT_COLUMNS, "event_id", 0),
    "records": (RECORD_COLUMNS, "record_id", ""),
}
#: The host columns ``hosts_report`` shows (before the scheduler derives its fields).
REPORT_COLUMNS = (
    "host_key", "queued", "in_flight", "max_in_flight", "delay", "next_allowed_at",
    "backoff_until", "backoff_reason", "error_streak", "latency_ewma", "paused", "robots_state",
    "robots_fetched_at", "robots_expires_at", "crawl_delay", "robots_meta", "robots_failures",
)  # fmt: skip
#: ``recent_errors`` rows.
ERROR_COLUMNS = ("url", "host_key", "state", "status_code", "last_error", "fetched_at")
#: ``failure_reasons`` rows: a reason, the URLs failed for it, and the first of them to fail.
FAILURE_COLUMNS = ("reason", "urls", "url", "trace", "failed_at")

#: Fetch facts a completion sets on its URL (``done_values`` order); ``keep`` ones fall back to
#: their old value when None, so a 304 keeps status, hash, size and archive pointer (R13).
DONE_COLUMNS: tuple[tuple[str, bool], ...] = (
    ("status_code", True),
    ("fetched_at", False),
    ("content_hash", True),
    ("body_bytes", True),
    ("last_error", False),
    ("etag", False),
    ("last_modified", False),
    ("next_fetch_at", False),
    ("revisit_interval", False),
    ("warc_file", True),
    ("warc_offset", True),
    ("warc_length", True),
    ("payload_digest", True),
    ("simhash", True),
    ("near_dup_of", False),
    ("canonical_hint", False),
    ("redirect_to", False),
    ("stored_file", True),
)

#: Columns of a failed lease's update (``FailRow`` order, then the fence).
FAIL_COLUMNS = (
    "state", "due_at", "last_error", "reason", "status_code", "warc_file", "warc_offset",
    "warc_length", "payload_digest",
)  # fmt: skip


def signed64(value: int | None) -> int | None:
    """SimHashes are unsigned 64-bit; the databases store signed BIGINT."""
    if value is None:
        return None
    return value - (1 << 64) if value >= 1 << 63 else value


def done_values(c: Completion) -> tuple[Any, ...]:
    """A completion's new fetch facts, in ``DONE_COLUMNS`` order (a 304 changes no content)."""
    not_modified = c.status == 304
    return (
        None if not_modified else c.status,
        c.fetched_at,
        None if not_modified else c.content_hash,
        None if not_modified else c.body_bytes,
        c.error,
        c.etag,
        c.last_modified,
        c.next_fetch_at,
        c.revisit_interval,
        c.warc_file,
        c.warc_offset,
        c.warc_length,
        c.payload_digest,
        signed64(c.simhash),
        c.near_dup_of,
        c.canonical_hint,
        c.redirect_to,
        c.stored_file,
    )


def event_values(c: Completion, now: float) -> tuple[Any, ...]:
    """One index event row (R21), ``EVENT_COLUMNS`` without the id."""
    ls = c.lease
    return (
        ls.url_id,
        ls.version,
        ls.url,
        c.status,
        c.fetched_at,
        c.content_hash,
        len(c.records),
        len(c.links) + c.known_links,
        c.warc_file,
        c.warc_offset,
        c.warc_length,
        c.payload_digest,
        now,
    )


@dataclass(slots=True)
class Grant:
    """One host's share of a lease call, decided by the scheduler, written by ``Store.grant``.

    The lease rows, one lease-log row per lease (what the grant saw and promised: ``min_gap``,
    ``allowance``, ``in_flight`` before it), and the host's new token and budget state.
    Not frozen: it lives inside one lease call, and a frozen dataclass's ``__init__`` sets each
    field through ``object.__setattr__`` (1.3 against 0.16 us per grant, 256 per lease call).
    """

    host_key: str
    leases: Sequence[Lease]
    min_gap: float
    allowance: int
    in_flight: int
    next_allowed_at: float
    budget_day: str
    budget_used: int


#: (state, due_at, last_error, reason, status_code, warc_file, warc_offset, warc_length,
#: payload_digest, url_id, version, token): a failed lease's new facts, then its fence.
FailRow = tuple[Any, ...]
#: A URL row in ``PICK_COLUMNS`` order.
PickRow = tuple[Any, ...]


class Store(Protocol):
    """The primitives one transaction offers the scheduler (write and read side).

    Row locks: PostgreSQL locks the rows it will change; the other engines serialise whole
    transactions, for which every ``lock``-type operation is a plain read (or nothing).
    """

    # -- transaction-wide ------------------------------------------------------------------------

    def bump(self, name: str, n: int) -> None:
        """Add to a named counter; counters are written last, in name order, before COMMIT."""
        ...

    def lock_hosts(
        self, keys: Iterable[str], *, read: Iterable[str] = (), skip_locked: bool = False
    ) -> dict[str, HostRow]:
        """Take the rows of the hosts ``keys`` for this transaction and return the current rows
        of those in ``read`` (a subset) that exist. Engines with row locks lock them now, in key
        order (every writer locks its hosts first, so writers queue instead of deadlocking);
        ``skip_locked`` leaves out rows another transaction holds instead of waiting."""
        ...

    def ensure_hosts(self, keys: Iterable[str]) -> None:
        """Create missing host rows (with the defaults)."""
        ...

    def update_hosts(self, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
        """Set ``columns`` of hosts; each row is the values, then the host key."""
        ...

    # -- level 1 and 2 of the schedule, grants -------------------------------------------------

    def crawl_paused(self) -> bool: ...

    def first_ready_hosts(self, now: float, max_in_flight: int, limit: int) -> list[HostRow] | None:
        """The start of a lease call in one read, where the engine can: ``ready_hosts(now,
        max_in_flight, limit)`` if no lease has expired at ``now`` and the crawl is not paused;
        None when one of those holds, or when the store reads them one by one anyway (the
        caller then expires, checks the pause flag and reads level 1 itself)."""
        ...

    def ready_hosts(self, now: float, max_in_flight: int, limit: int) -> list[HostRow]:
        """Up to ``limit`` hosts by ``next_allowed_at`` that may be granted a lease now (the
        predicate is ``scheduler.host_ready`` plus: some queued URL is due); with row locks, the
        rows are locked and hosts another leaser holds are skipped."""
        ...

    def pick_urls(
        self, wants: Sequence[tuple[str, int, Sequence[int]]], now: float
    ) -> dict[str, list[PickRow]]:
        """For each (host, n, exclude): the host's due queued page URLs (not robots.txt) by
        priority then due time, the first ``n`` not in ``exclude`` (with row locks: locked,
        skipping rows another transaction holds)."""
        ...

    def mark_disallowed(self, url_ids: Sequence[int], reason: str) -> None: ...

    def defer_queued(self, host_key: str, reason: str, *, robots_too: bool = False) -> int:
        """Set the host's queued URLs aside (``deferred``); its robots.txt URL only if asked."""
        ...

    def claim_url(self, url: str) -> tuple[int, str, str] | None:
        """(url_id, state, kind) of a URL; with row locks it is locked, and a row another
        transaction holds reads as None."""
        ...

    def make_robots(self, url_id: int, now: float, *, new_round: bool) -> None:
        """Mark a URL as its host's robots.txt; ``new_round`` queues it again as a new version."""
        ...

    def pick_row(self, url_id: int) -> PickRow: ...

    def grant(self, grants: Sequence[Grant], owner: str, now: float, expires: float) -> None:
        """Lease the URLs, log each grant, and move each host's token and budget."""
        ...

    def expired_leases(self, now: float) -> list[tuple[int, str]]:
        """(url_id, host_key) of the leases that expired at ``now``."""
        ...

    def requeue_leases(self, url_ids: Sequence[int], now: float) -> int:
        """Return those of ``url_ids`` still leased and expired at ``now`` to the queue."""
        ...

    def leased_hosts(self, owner: str) -> list[str]: ...

    def release_owner(self, owner: str) -> int:
        """Return every lease of ``owner`` to the queue (keeping its due time)."""
        ...

    # -- completion and failure ----------------------------------------------------------------

    def finish(self, completions: Sequence[Completion]) -> list[bool]:
        """Fenced ``done`` updates: per completion, whether its URL was still leased with that
        version and token (of identical leases in one batch only the first can be)."""
        ...

    def lock_and_finish(
        self, keys: Iterable[str], read: Iterable[str], completions: Sequence[Completion]
    ) -> tuple[dict[str, HostRow], list[bool]]:
        """``lock_hosts(keys, read=read)`` then ``finish(completions)``, as one call: a store
        may send both at once (PostgreSQL: one round trip), the lock still first."""
        ...

    def live_leases(self, leases: Sequence[Lease]) -> list[bool]:
        """Per lease, whether its URL is still leased with that version and token (with row
        locks: the URL row is locked); of identical leases only the first counts."""
        ...

    def fail_leases(self, rows: Sequence[FailRow]) -> None:
        """Fenced updates of failed leases (``FailRow``): queued again or failed, attempts + 1."""
        ...

    def insert_urls(self, urls: Sequence[NewURL], now: float) -> int:
        """Insert-if-absent (I1); returns how many were new."""
        ...

    def insert_requests(self, rows: Sequence[tuple[str, RequestSpec]]) -> None:
        """(url key, spec): the side-table rows of URLs this transaction has just inserted
        (I11); a URL that already has one keeps it."""
        ...

    def requests_of(self, url_ids: Sequence[int]) -> dict[int, RequestSpec]:
        """The stored request specs of those of ``url_ids`` that have one."""
        ...

    def upsert_records(self, rows: Sequence[tuple[Any, ...]]) -> None:
        """(record_id, source, key, url, data, content_hash, now, now): I5's upsert."""
        ...

    def set_cookies(self, cookies: Sequence[Cookie], now: float) -> None:
        """Upsert by (domain, path, name) in order; then drop every cookie expired at ``now``."""
        ...

    def cookie_rows(self, now: float) -> list[Cookie]:
        """Stored cookies not expired at ``now``."""
        ...

    def insert_bodies(self, rows: Sequence[tuple[Any, ...]]) -> None:
        """(payload_digest, url_id, url, warc_file, warc_offset, warc_length, now), if absent."""
        ...

    def insert_events(self, rows: Sequence[tuple[Any, ...]]) -> None:
        """Index events (``event_values``), unique per (url_id, version). Called last among the
        writes of a transaction: PostgreSQL holds a lock from here to COMMIT so that event ids
        follow commit order."""
        ...

    def redirect_target(self, url: str) -> str | None: ...

    def set_last_error(self, rows: Sequence[tuple[str, int]]) -> None:
        """(message, url_id) pairs."""
        ...

    def reparse_outcome(self, rows: Sequence[tuple[str | None, int]]) -> None:
        """(error, url_id): a failed page whose re-parse succeeded becomes ``done``."""
        ...

    def record_failures(self, rows: Sequence[tuple[int, str, str | None, float]]) -> None:
        """(url_id, reason, trace, failed_at) of URLs that failed for good: kept (replacing
        an older failure of the URL) for those whose state is ``failed``, for
        ``failure_reasons``. Written on the failure path only, never by a completion."""
        ...

    # -- rounds, deferral ----------------------------------------------------------------------

    def due_rounds(self, now: float, limit: int) -> list[tuple[int, str]]:
        """(url_id, host_key) of finished non-robots URLs whose ``next_fetch_at`` has come."""
        ...

    def start_rounds(self, url_ids: Sequence[int]) -> int:
        """Queue finished URLs again as a new version, due at their ``next_fetch_at``."""
        ...

    def deferred_hosts(self) -> list[str]:
        """Hosts with deferred URLs or robots.txt failures (what ``requeue_deferred`` touches)."""
        ...

    def requeue_deferred(self, host_key: str | None = None, reason: str | None = None) -> int:
        """Deferred URLs back to the queue: all, or the host's set aside for ``reason``."""
        ...

    def reset_robots_failures(self) -> None:
        """Every host's robots.txt gets its full count of attempts again, and a host that has
        no usable copy (unreachable: disallow all) fetches it at its next lease instead of
        after the error TTL, its robots back-off lifted (``crawl --retry-deferred``)."""
        ...

    # -- partitions, meta, seeds, cursors ------------------------------------------------------

    def partition(self, partition: int, *, create: bool) -> tuple[str | None, int, float] | None:
        """(owner, epoch, expires_at); ``create`` adds a free row first and locks it for update
        (otherwise it is locked against a concurrent takeover only)."""
        ...

    def set_partition(self, partition: int, owner: str, epoch: int, expires_at: float) -> None: ...

    def renew_partition(
        self, partition: int, owner: str, epoch: int, expires_at: float
    ) -> bool: ...

    def set_meta(self, key: str, value: str) -> None: ...

    def add_seeds(self, host_keys: Sequence[str]) -> None: ...

    def set_cursor(self, consumer: str, cursor: int) -> None:
        """Keeps the maximum: a late or repeated acknowledgement cannot rewind."""
        ...

    # -- planner statistics ----------------------------------------------------------------------

    def stale_tables(self, min_changes: int, factor: float) -> list[str]:
        """The crawl's tables whose rows changed since their last analyze (the engine's own
        counters, whichever process changed them) at least ``min_changes`` times and ``factor``
        times their size then; [] on an engine that keeps no statistics the frontier's plans
        depend on."""
        ...

    def analyze(self, tables: Sequence[str], timeout: float) -> None:
        """Refresh the planner statistics of ``tables``, cancelled after ``timeout`` seconds;
        a table another session is analyzing is skipped."""
        ...

    # -- read side -----------------------------------------------------------------------------

    def progress(self, now: float) -> Progress: ...

    def open_hosts(
        self, max_in_flight: int, after: tuple[float, str], limit: int
    ) -> list[tuple[str, float, float]]:
        """Hosts with queued URLs, not paused, below their allowance: ``(host_key,
        next_allowed_at, max(next_allowed_at, backoff_until))`` in (next_allowed_at, host_key)
        order after ``after`` (keyset paging), at most ``limit``."""
        ...

    def earliest_due(self, host_key: str, by: float) -> float | None:
        """``by`` when a queued URL of the host is due by then, else its earliest due time
        (None: nothing queued)."""
        ...

    def stats(self) -> FrontierStats: ...

    def aggregates(self) -> dict[str, Any]: ...

    def report_rows(self) -> list[dict[str, Any]]:
        """Every host's ``REPORT_COLUMNS``, by host key."""
        ...

    def audit_facts(self) -> tuple[list[tuple[str, int]], list[float], int]:
        """From the lease log: (host, grants that broke the slot or gap they were granted
        under), the newest 100,000 eligibility delays, and the number of grants."""
        ...

    def delay_histogram(self, bounds: Sequence[float]) -> dict[str, Any]: ...

    def page(self, table: str, after: Any, limit: int) -> list[dict[str, Any]]:
        """Up to ``limit`` rows of a ``STREAMS`` table with a key above ``after``, by key."""
        ...

    def known_urls(self, after_id: int, limit: int | None) -> list[tuple[int, str]]: ...

    def existing_urls(self, candidates: Sequence[str]) -> set[str]: ...

    def lease_owners(self) -> list[str]: ...

    def get_meta(self, key: str) -> str | None: ...

    def seed_hosts(self) -> frozenset[str]: ...

    def get_cursor(self, consumer: str) -> int: ...

    def records(self) -> list[dict[str, Any]]:
        """Every record, by source and key."""
        ...

    def find_bodies(self, digests: Sequence[str]) -> dict[str, tuple[str, int, int, str]]: ...

    def body_digests(self, after: str, limit: int | None) -> list[str]: ...

    def simhashes(self, after_id: int, limit: int | None) -> list[tuple[int, int, int | None]]:
        """(url_id, unsigned simhash, near_dup_of)."""
        ...

    def reparse_candidates(
        self, where_failed: bool, after_id: int, limit: int
    ) -> list[dict[str, Any]]: ...

    def recent_errors(self, limit: int) -> list[dict[str, Any]]: ...

    def failure_reasons(self, limit: int) -> list[dict[str, Any]]:
        """``Frontier.failure_reasons``: the kept failures of URLs still ``failed``."""
        ...

    def url_row(self, url: str) -> dict[str, Any] | None: ...

    def host_row(self, host_key: str) -> dict[str, Any] | None: ...

    def url_rows(self) -> list[dict[str, Any]]:
        """Every URL's full row, by url_id."""
        ...

    def host_rows(self) -> list[dict[str, Any]]:
        """Every host's full row, by host key."""
        ...


def first_live(leases: Sequence[Lease], live: dict[int, tuple[int, int]]) -> list[bool]:
    """Per lease, whether ``live`` (url_id -> (version, token) of leased URLs) holds it; of
    identical leases in one batch only the first, as if they were applied one by one."""
    seen: set[tuple[int, int, int]] = set()
    out = []
    for ls in leases:
        key = (ls.url_id, ls.version, ls.token)
        out.append(key not in seen and live.get(ls.url_id) == (ls.version, ls.token))
        seen.add(key)
    return out
