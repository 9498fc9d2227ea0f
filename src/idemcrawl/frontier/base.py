"""The frontier contract: what every backend (SQLite, PostgreSQL, …) must guarantee.

The frontier is the durable source of truth for which URLs exist, which are being fetched by whom,
and which are finished. Everything a crash could lose lives here, so the invariants below are the
whole of idemcrawl's restart-safety and politeness story. The shared contract tests in
``tests/frontier/test_contract.py`` check each of them against every backend.

Invariants
==========

I1  A URL is known at most once. ``add`` of a known URL (same normalised string) is a no-op; it
    never resets state, version, priority, depth or request (I11).                         (R2, R10)
I2  A URL is in exactly one state: ``queued`` (waiting; ``due_at`` says from when), ``leased``
    (granted to one owner until ``lease_expires_at``), ``done``, ``failed``, or set aside with a
    ``reason`` saying why (``out_of_scope``, ``disallowed``, ``rejected``; ``deferred`` until
    ``requeue_deferred``).
I3  A lease names ``(url_id, version, token)``. ``complete`` and ``fail`` act only when the URL is
    still ``leased`` with that same version *and* token; otherwise they change nothing and emit
    nothing. A stale lease, a duplicate completion or a completion after the lease expired is
    therefore harmless.                                                                    (R4)
I4  ``complete`` writes the page's records (upsert on the derived record id), its discovered links
    (insert-if-absent), its index event (unique per ``(url_id, version)``) and the URL's ``done``
    state in ONE transaction. A batch of completions may share the transaction; each one is still
    all-or-nothing, and a rejected one contributes nothing.                       (R1, R3, R21)
I5  A record write is an upsert keyed by ``record_id = H(source, key)``: unchanged content changes
    nothing; changed content updates ``data``, ``content_hash`` and ``last_changed``;
    ``first_seen`` never moves.                                                            (R1)
I6  A host's ``in_flight`` equals the number of its URLs in state ``leased``. Granting a lease,
    its completion, failure or expiry update that count in the same transaction (the SQL backends
    keep it with triggers, PostgreSQL's grant in the statement that writes the host's token, the
    memory one in its single state setter, so it cannot drift). A
    lease is granted only when ``in_flight`` is below the host's allowance and
    ``next_allowed_at`` has been reached; the grant moves
    ``next_allowed_at`` forward by the host's delay in the same atomic step, so concurrent
    leasers — threads, processes or machines — can never exceed a host's allowance together.
    When a host's only spacing is the latency-adaptive gap (no configured delay or
    Crawl-delay, so I8 asks nothing), one grant may give it several leases with promised starts
    ``start_at`` one gap apart, at most ``scheduler.SCHEDULE_AHEAD`` ahead; a request never starts
    before its ``start_at``, and the lease log records those starts. A lease of a host spaced by
    any gap is ``paced`` (its request must start as granted); ``lease(paced=k)`` grants at most
    k of those, so a crawler keeps in hand only leases whose start may wait.               (R6)
I7  An expired lease returns its URL to ``queued`` and its slot to the host; nothing needs to
    notice the crash that caused it.                                                       (R4)
I8  Completion/failure also push ``next_allowed_at`` to at least ``now + delay`` so the gap between
    the end of one response and the next request start honours the delay as well.
I9  Partition ownership is a lease with a fencing token: taking over an expired (or free)
    partition increments its ``epoch``; a grant presenting an older epoch, or an expired
    ownership, raises ``StaleEpoch`` and grants nothing, so a paused old owner that wakes up
    cannot hand out work the new owner also hands out.                                     (R25)
I10 robots.txt gates a host (R7): no page URL of a host is leased while its robots state is
    unknown or expired (only its robots.txt URL is); a URL the rules disallow becomes
    ``disallowed`` with the reason instead of being leased.
I11 A URL added with a :class:`RequestSpec` (method, headers, body, callback, context) keeps it
    from the transaction that inserted the URL on: every lease of the URL, in any process and
    after any crash, carries the same spec; a URL added without one never gains one later.
    A request's key is :func:`request_key` (a plain GET's is its URL).
I12 The cookies a completion carries are written (upserted by domain, path and name; one that
    has expired deletes the stored one) in the completion's transaction, and only if it is
    accepted: ``cookies`` read after that commit, from any process, return them.

Where they are kept
===================

The policy behind them is written once, in ``scheduler.py`` (:class:`~.scheduler.Scheduler`
implements this whole contract); a backend is a transaction and a store of rows:

* ``sqlite.py`` — one file, WAL; ``BEGIN IMMEDIATE`` serialises writers. The default.
* ``postgres.py`` — a schema on a server shared by many processes; row locks, ``SKIP LOCKED``.
* ``memory.py`` — Python structures in this process (``memory:``). **Not durable**: a crash or
  ``close`` loses everything, so I4's "one transaction" there means "under one lock" (the
  scheduler raises before its first write, never half-way). For the simulator and fast tests.

The SQL the two database backends run is written once in ``sql.py``. Backends expose the same
synchronous API; the engine calls it from one dedicated thread so the event loop never blocks on
the database. All times are UNIX seconds (float) passed in by the caller.

The contract is split by use: :class:`SchedulingCore` (what a crawler calls in its loop),
:class:`Fleet`, :class:`Control`, :class:`CrawlState`, :class:`Outputs` and :class:`Inspection`;
:class:`Frontier` is all of them.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from ..robots import RobotsCache

#: URL states. Terminal ones never return to the queue by themselves.
QUEUED = "queued"
LEASED = "leased"
DONE = "done"
FAILED = "failed"
OUT_OF_SCOPE = "out_of_scope"
DISALLOWED = "disallowed"
#: Set aside for a host-level reason (Crawl-delay above the cap, robots.txt still unreachable
#: after its retries); ``crawl --retry-deferred`` requeues them.
DEFERRED = "deferred"
#: Refused by a trap defence at discovery (template paused, budget), with the reason.
REJECTED = "rejected"
STATES = (QUEUED, LEASED, DONE, FAILED, OUT_OF_SCOPE, DISALLOWED, DEFERRED, REJECTED)
TERMINAL_STATES = (DONE, FAILED, OUT_OF_SCOPE, DISALLOWED, DEFERRED, REJECTED)

#: URL kinds: ordinary pages, each host's robots.txt (fetched before any page, R7), and
#: sitemaps (R12: their entries are discovered links; they emit no index event).
PAGE = "page"
ROBOTS = "robots"
SITEMAP = "sitemap"
#: A file a spider asked for (image, PDF…): fetched, stored by content hash, never parsed.
DOWNLOAD = "download"
#: What a page needs to render (stylesheet, script, image), fetched with ``--requisites`` for
#: crawls meant for replay: archived, never parsed, no index event.
REQUISITE = "requisite"


class FrontierError(RuntimeError):
    """The database behind the frontier is unusable (unreadable file, wrong schema, …)."""


class StaleEpoch(FrontierError):
    """A partition owner's fencing token is no longer current: it must not grant work (R25)."""


class PartitionBusy(FrontierError):
    """Another owner holds the partition's ownership lease."""


@dataclass(frozen=True, slots=True)
class Fence:
    """Proof of partition ownership presented with every grant: (partition, epoch)."""

    partition: int
    epoch: int


def record_id(source: str, key: str) -> str:
    """128-bit id derived from what the record *is*, so a rewrite is an update, not a copy (R1)."""
    return hashlib.blake2b(f"{source}\x1f{key}".encode(), digest_size=16).hexdigest()


def canonical_json(data: Any) -> str:
    """One text per value, so equal data always hashes equal regardless of key order."""
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def content_hash(text: str) -> str:
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


#: HTTP methods a spider's request may use (``parse.Request`` refuses others).
METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")


@dataclass(frozen=True, slots=True)
class RequestSpec:
    """How a URL is to be fetched and parsed, when that is not a plain GET for ``parse``.

    Stored in the sparse ``requests`` side table (one row per URL that has one, written in the
    transaction that inserts the URL) and carried on its :class:`Lease`, so after any crash the
    URL is fetched with the same method, headers and body and parsed by the same callback with
    the same context. ``data`` and ``headers`` are JSON text (``headers`` a list of
    ``[name, value]`` pairs), ``body`` raw bytes.
    """

    method: str = "GET"
    callback: str | None = None
    data: str | None = None
    headers: str | None = None
    body: bytes | None = None
    #: Run the response in headless Chromium before parsing (``render.py``).
    render: bool = False

    def header_pairs(self) -> list[tuple[str, str]]:
        """The extra request headers, in the order the spider gave them."""
        if not self.headers:
            return []
        return [(str(k), str(v)) for k, v in json.loads(self.headers)]


def request_key(url: str, method: str = "GET", body: bytes | None = None) -> str:
    """A request's identity in the frontier (its ``urls.url``): method + URL + body digest.

    A plain GET (no body) is its URL, unchanged. Anything else is the URL with a fragment
    ``#METHOD:<digest of the body>``: normalised URLs never have a fragment, so such a key
    can never equal a GET's, two POSTs with different bodies stay apart, and the same POST
    yielded twice is one URL (I1). :func:`request_url` gives the URL to fetch back.
    """
    if method == "GET" and not body:
        return url
    digest = hashlib.blake2b(body or b"", digest_size=12).hexdigest()
    return f"{url}#{method}:{digest}"


def request_url(key: str) -> str:
    """The URL to fetch for a frontier key (:func:`request_key`): the key without its
    ``#METHOD:digest`` part."""
    return key.partition("#")[0]


@dataclass(frozen=True, slots=True)
class Cookie:
    """One cookie of the crawl's jar (``idemcrawl.cookies``): the frontier's ``cookies`` row,
    keyed by (domain, path, name). ``expires`` None: until the crawl ends."""

    domain: str
    path: str
    name: str
    value: str
    expires: float | None = None
    secure: bool = False
    host_only: bool = True


@dataclass(slots=True, unsafe_hash=True)
class NewURL:
    """A URL entering the frontier; ``url`` is already normalised and scope-checked.

    A value: never change one, make a new one (``dataclasses.replace``). It is not declared
    frozen only for speed: a page yields ~40, built once in the parser process and once more
    in the crawl process, and a frozen dataclass's ``__init__`` measured 2.1 µs against 0.3.
    """

    url: str
    host_key: str
    priority: int = 0
    depth: int = 0
    state: str = QUEUED
    reason: str | None = None
    kind: str = PAGE
    #: Redirect hops that led here (R14): a redirect target is hops + 1 of its source.
    hops: int = 0
    #: How to fetch and parse it, when not a plain GET for ``parse`` (stored only if the URL
    #: is new: the first request for a key wins, like the URL itself, I1).
    request: RequestSpec | None = None


@dataclass(frozen=True, slots=True)
class HostPolicy:
    """Global politeness settings; a host's own row overrides delay and concurrency (R6-R8).

    The formulas that use these live in ``idemcrawl.politeness``.
    """

    max_in_flight: int = 1
    delay: float = 1.0
    #: Adaptive delay: at least this multiple of the host's recent response time (0 = off).
    latency_factor: float = 0.0
    #: Only the part of the response time above this counts for the adaptive delay.
    fast_latency: float = 0.0
    max_adaptive_delay: float = 60.0
    #: Host back-off after an error: full jitter over base * 2**streak, capped.
    backoff_base: float = 1.0
    backoff_cap: float = 600.0
    retry_after_cap: float = 3600.0
    #: After this many consecutive errors the host's circuit opens for ``breaker_seconds``.
    breaker_threshold: int = 8
    breaker_seconds: float = 300.0
    #: robots.txt enforcement; None crawls without it (contract tests, --ignore-robots).
    robots: RobotsCache | None = None
    #: Per-host fetch budget per UTC day (R17); None = unlimited. A host that spends it has its
    #: queued URLs deferred with the reason, so the crawl can end (``--retry-deferred`` or the
    #: next day's recrawl picks them up again).
    daily_budget: int | None = None
    #: Consecutive unreachable robots.txt answers (each after its error TTL) before the host's
    #: pages are deferred for this run.
    robots_max_attempts: int = 3


@dataclass(frozen=True, slots=True)
class Lease:
    url_id: int
    url: str
    host_key: str
    version: int
    token: int
    owner: str
    expires_at: float
    depth: int
    attempts: int
    kind: str = PAGE
    due_at: float = 0.0
    #: What the previous round of this URL learnt (R13, R16): validators for a conditional
    #: request, the content hash and status to tell a change, the revisit interval to adapt.
    etag: str | None = None
    last_modified: str | None = None
    prev_hash: str | None = None
    prev_status: int | None = None
    interval: float | None = None
    hops: int = 0
    #: When the request may start (0: at once). A host whose only spacing is the
    #: latency-adaptive gap gets several grants per lease call, each promised its own start a
    #: gap after the previous one; the lease log records that start (I6).
    start_at: float = 0.0
    #: The request's method, headers, body, callback and context (None: a plain GET).
    request: RequestSpec | None = None
    #: The grant spaced this start from the host's previous one (a delay, Crawl-delay or
    #: adaptive gap: I6): the request must start when it was granted (or at ``start_at``),
    #: so it goes to a worker that is waiting, never into a crawler's buffer of leases taken
    #: ahead (``lease(paced=...)``). False: the host only limits how many are in flight.
    paced: bool = False

    @property
    def fetch_url(self) -> str:
        """The URL to request (``url`` is the frontier key, which for a non-GET request
        carries the method and body digest: :func:`request_key`)."""
        return request_url(self.url)


@dataclass(frozen=True, slots=True)
class RecordWrite:
    """A record ready to store: id and content hash are computed where the record is made."""

    record_id: str
    source: str
    key: str
    data_json: str
    content_hash: str

    @classmethod
    def make(cls, source: str, key: str, data: Any) -> RecordWrite:
        text = canonical_json(data)
        return cls(record_id(source, key), source, key, text, content_hash(text))


@dataclass(slots=True)
class Completion:
    """Everything a fetched page produced; committed all together or not at all (R3)."""

    lease: Lease
    status: int
    fetched_at: float
    records: Sequence[RecordWrite] = ()
    links: Sequence[NewURL] = ()
    content_hash: str | None = None
    body_bytes: int = 0
    error: str | None = None
    #: Response time of the fetch, for the host's adaptive delay.
    latency: float | None = None
    #: For a robots.txt lease: the raw outcome, turned into host state in the same transaction.
    robots: RobotsFetch | None = None
    #: Links the page had that discovery refused, by reason (counted with the completion).
    rejections: dict[str, int] = field(default_factory=dict)
    #: Validators to send on the next round (R13).
    etag: str | None = None
    last_modified: str | None = None
    #: True when this round found new content (or a new status): only then is an index event
    #: emitted (R21). A 304 or an identical body is a round without a change.
    changed: bool = True
    #: Recrawl schedule (R16); None = never revisit.
    next_fetch_at: float | None = None
    revisit_interval: float | None = None
    #: Where the exchange is archived (R20): the WARC response (or revisit) record.
    warc_file: str | None = None
    warc_offset: int | None = None
    warc_length: int | None = None
    payload_digest: str | None = None
    #: True when the body was archived as a full response record (not a revisit): the frontier
    #: then remembers it under ``payload_digest`` so later identical bodies reference it (R11).
    stored_body: bool = False
    #: 64-bit SimHash of the visible text and the near-duplicate group it joined (R11).
    simhash: int | None = None
    near_dup_of: int | None = None
    canonical_hint: str | None = None
    #: Where a redirect points (R14), for loop detection and the URL's record.
    redirect_to: str | None = None
    #: For a download: the file it was stored as (named by content hash, so repeats overwrite).
    stored_file: str | None = None
    #: Extra named counters to add in the same transaction (e.g. redirect_loops).
    counters: dict[str, int] = field(default_factory=dict)
    #: Cookies the response set (spiders with ``keep_cookies``): stored with the completion,
    #: so a login's session commits with the login (I12).
    cookies: Sequence[Cookie] = ()
    #: Links of the page left out of ``links`` because the crawl process knew them to be in
    #: the frontier already (``discovery.KnownURLs``): inserting them would change nothing, but
    #: they still count as the page's links (its event) and as ``url_duplicates``.
    known_links: int = 0


@dataclass(slots=True)
class Reparsed:
    """What parsing an archived body again produced (R19): written without a new fetch round."""

    url_id: int
    url: str
    records: Sequence[RecordWrite] = ()
    links: Sequence[NewURL] = ()
    error: str | None = None
    #: The traceback's last frames when ``error`` is a spider's exception (see ``Failure``).
    trace: str | None = None


@dataclass(frozen=True, slots=True)
class RobotsFetch:
    """What fetching robots.txt gave (after following redirects); None status = network error."""

    status: int | None
    body: bytes | None = None
    error: str | None = None
    too_many_redirects: bool = False
    #: Retrying cannot help (the SSRF guard refused the address): defer the host right away.
    permanent: bool = False


@dataclass(slots=True)
class Failure:
    """A fetch that produced nothing to keep. ``retry_at`` None means give up (state failed)."""

    lease: Lease
    error: str
    retry_at: float | None
    status: int | None = None
    #: The host misbehaved (timeout, connection error, 5xx, 429): back it off (R8).
    host_error: bool = False
    #: Retry-After in seconds, when the server sent one.
    retry_after: float | None = None
    #: The archived response, when there was one (a parse failure keeps its body so that
    #: ``idemcrawl reparse --where-failed`` can retry it without the network, R19).
    warc_file: str | None = None
    warc_offset: int | None = None
    warc_length: int | None = None
    payload_digest: str | None = None
    #: The last frames of the traceback of a spider's exception (``failures.trace_tail``): kept
    #: with a final failure, so ``crawl`` and ``status`` can show where a callback broke.
    trace: str | None = None


@dataclass(frozen=True, slots=True)
class Progress:
    """Enough to decide whether a crawl is finished or must wait for someone else's leases."""

    queued: int
    leased: int
    #: The earliest due time of a queued URL, or earlier: the SQL backends keep a per-host hint
    #: that each URL entering a host's queue lowers and that is exact again whenever the host's
    #: queue restarts from empty (schema 6, instead of an index of every queued URL by due
    #: time); a host whose earliest URL left the queue keeps the lower value meanwhile.
    #: None when nothing is queued.
    next_due_at: float | None
    next_lease_expiry: float | None
    next_host_ready_at: float | None
    #: Earliest ``next_fetch_at`` of a finished URL (what a ``--recrawl`` run waits for).
    next_refetch_at: float | None = None
    #: The earliest moment a queued URL could be granted on a host that is not paused and has
    #: a free slot: the latest of its timer, its back-off and its first due URL. None when no
    #: such host exists (every host with work is paused or at its allowance, whose slots come
    #: back when a lease ends). This, not ``next_due_at`` or ``next_host_ready_at`` alone, is
    #: when a process with nothing granted should look again: a URL due long ago on a host
    #: whose timer runs for another second is not grantable now.
    next_ready_at: float | None = None

    @property
    def finished(self) -> bool:
        return self.queued == 0 and self.leased == 0


@dataclass(slots=True)
class FrontierStats:
    urls_by_state: dict[str, int] = field(default_factory=dict)
    hosts: int = 0
    records: int = 0
    events: int = 0
    counters: dict[str, int] = field(default_factory=dict)
    meta: dict[str, str] = field(default_factory=dict)


#: The live-control actions (R23) :meth:`Control.control` accepts.
CONTROL_ACTIONS = ("pause", "resume", "block", "unblock", "set-delay", "set-budget")


def control_value(action: str, host_key: str | None, value: Any) -> Any:
    """Check a live-control request (what :meth:`Control.control` accepts) before anything is
    touched; the value to store (delay seconds, budget) or None. ``idemcrawl control`` checks
    with it too, so the command line and every backend refuse alike."""
    if action not in CONTROL_ACTIONS:
        raise ValueError(f"unknown control action {action!r}")
    if host_key is None and action not in ("pause", "resume"):
        raise ValueError(f"control {action} needs a host")
    if action == "set-delay":
        delay = float(value)
        if not delay >= 0:
            raise ValueError(f"set-delay needs seconds >= 0, got {value!r}")
        return delay
    if action == "set-budget":
        return None if value is None else int(value)
    return None


class SchedulingCore(Protocol):
    """The small core a crawler calls in its loop: I1-I8 and I10 are its promises."""

    def add(self, urls: Iterable[NewURL], now: float) -> int:
        """Insert-if-absent (I1); returns how many were new."""
        ...

    def lease(
        self,
        owner: str,
        limit: int,
        now: float,
        lease_seconds: float,
        policy: HostPolicy,
        fence: Fence | None = None,
        paced: int | None = None,
    ) -> list[Lease]:
        """Expire stale leases, then grant up to ``limit`` leases on ready hosts (I6, I10).

        ``paced``: at most this many of them may be :attr:`Lease.paced` (None: no bound). A
        crawler that takes leases ahead of its workers asks for its waiting workers' number
        here: a host spaced by a gap then gives leases only for requests that start now, and
        the rest of the call comes from hosts that only limit what is in flight.

        With a ``fence``, the grant first checks in the same transaction that the fence's epoch
        is still the partition's current one and its ownership lease unexpired, and raises
        :class:`StaleEpoch` otherwise (I9).
        """
        ...

    def complete(
        self, completions: Sequence[Completion], now: float, policy: HostPolicy
    ) -> list[bool]:
        """Commit a batch in one transaction (I4); returns, per completion, whether its lease
        was still live and it was accepted (I3)."""
        ...

    def fail(self, failures: Sequence[Failure], now: float, policy: HostPolicy) -> list[bool]:
        """Retry later or give up; accepted per failure like ``complete`` (I3, I8)."""
        ...

    def expire(self, now: float) -> int:
        """Return expired leases to the queue (I7); returns how many."""
        ...

    def release_owner(self, owner: str) -> int:
        """Return every lease of ``owner`` (known dead) to the queue at once."""
        ...

    def progress(self, now: float, max_in_flight: int | None = None) -> Progress:
        """Counts and the moments something changes. With ``max_in_flight`` (the policy's
        global allowance) ``next_ready_at`` is computed too: it leaves out hosts at their
        allowance, so it needs to know it."""
        ...

    def reschedule_due(self, now: float, limit: int) -> int:
        """Start a new round for up to ``limit`` finished URLs whose ``next_fetch_at`` has come.

        They go back to ``queued`` with ``version + 1`` (R4, R16), so the old round's
        completion can never be accepted for the new one.
        """
        ...

    def requeue_deferred(self) -> int:
        """Give deferred URLs another chance (called when a crawl run starts)."""
        ...


class Fleet(Protocol):
    """Several crawl processes on one frontier (R25, I9)."""

    def acquire_partition(self, partition: int, owner: str, now: float, ttl: float) -> Fence:
        """Become (or stay) the partition's owner; a new owner gets a higher epoch."""
        ...

    def renew_partition(self, fence: Fence, owner: str, now: float, ttl: float) -> None:
        """Extend ownership; raises StaleEpoch if someone took over meanwhile."""
        ...

    def owners_with_leases(self) -> list[str]:
        """Owner ids that currently hold leases (to find dead local processes)."""
        ...


class Control(Protocol):
    """Politeness settings and live control (R23): every process sees them at its next lease."""

    def control(self, action: str, host_key: str | None = None, value: Any = None) -> int:
        """pause/resume/block/unblock a host or the whole crawl, set a host's delay or budget.
        Returns rows hit. An unknown action or a bad value raises ValueError, changing nothing."""
        ...

    def set_host_overrides(
        self, host_key: str, *, delay: float | None, max_in_flight: int | None
    ) -> None:
        """Per-host politeness settings that take precedence over the global policy."""
        ...


class CrawlState(Protocol):
    """What a crawl run keeps beside the schedule and reads back when it starts."""

    def get_meta(self, key: str) -> str | None: ...

    def set_meta(self, key: str, value: str) -> None: ...

    def add_seeds(self, host_keys: Iterable[str]) -> None:
        """Remember the seed hosts that define the crawl's scope."""
        ...

    def seed_hosts(self) -> frozenset[str]: ...

    def known_urls(self, after_id: int = 0, limit: int | None = None) -> list[tuple[int, str]]:
        """Known ``(url_id, url)`` with an id above ``after_id``, by id, at most ``limit``
        (None: all). The discovery Bloom filter is rebuilt from these, a page at a time, so a
        crawl of millions of URLs never holds them all at once."""
        ...

    def find_bodies(self, digests: Sequence[str]) -> dict[str, tuple[str, int, int, str]]:
        """Archived full bodies by payload digest: (warc_file, offset, length, first url)."""
        ...

    def cookies(self, now: float) -> list[Cookie]:
        """The crawl's cookie jar: every stored cookie not expired at ``now`` (I12)."""
        ...

    def body_digests(self, after: str = "", limit: int | None = None) -> list[str]:
        """Archived payload digests above ``after``, in order, at most ``limit`` (None: all),
        to rebuild the body Bloom filter a page at a time."""
        ...

    def simhashes(
        self, after_id: int = 0, limit: int | None = None
    ) -> list[tuple[int, int, int | None]]:
        """(url_id, simhash, near_dup_of) of pages with a SimHash and an id above
        ``after_id``, by id, at most ``limit`` (None: all): the near-duplicate index."""
        ...

    def reparse_candidates(
        self, where_failed: bool, after_id: int, limit: int
    ) -> list[dict[str, Any]]:
        """Archived pages to parse again, by url_id order from ``after_id`` (batched)."""
        ...

    def apply_reparse(self, items: Sequence[Reparsed], now: float) -> int:
        """Upsert the records and insert the links of re-parsed pages; a page whose parse
        failed before and succeeds now becomes ``done``. Returns records written."""
        ...


class Outputs(Protocol):
    """The read side (R21, R22, R24). Streams page through a primary key in bounded batches (one
    short read each), so an export never holds every row in memory nor the database for its
    whole run."""

    def stats(self) -> FrontierStats: ...

    def hosts_report(self, now: float) -> list[dict[str, Any]]:
        """Per-host token, back-off and robots state (for status and metrics)."""
        ...

    def lease_audit(self) -> dict[str, Any]:
        """Politeness violations recomputed from the lease log, and eligibility delays."""
        ...

    def eligibility_delay_histogram(self, bounds: Sequence[float]) -> dict[str, Any]:
        """Lease-log eligibility delays (due → granted) as a cumulative histogram (R24):
        ``counts[i]`` grants with delay <= ``bounds[i]`` (finite bounds) then the total as the +inf
        bucket, and ``sum``."""
        ...

    def recent_errors(self, limit: int) -> list[dict[str, Any]]:
        """URLs with a ``last_error``, newest fetch first (dashboard)."""
        ...

    def failure_reasons(self, limit: int) -> list[dict[str, Any]]:
        """Why URLs failed for good, grouped by reason, most URLs first (then by reason), at
        most ``limit`` groups: ``FAILURE_COLUMNS`` — the reason, how many failed URLs give
        it, and the first of them to fail (its URL, traceback tail, time)."""
        ...

    def records(self) -> Iterable[dict[str, Any]]:
        """Every stored record, ordered by source and key (for export)."""
        ...

    def events_after(self, cursor: int, limit: int) -> list[dict[str, Any]]:
        """Up to ``limit`` index events with ``event_id > cursor``, in id (= commit) order."""
        ...

    def get_cursor(self, consumer: str) -> int:
        """The last event id ``consumer`` acknowledged (0 if none)."""
        ...

    def set_cursor(self, consumer: str, cursor: int) -> None:
        """Record an acknowledgement; keeps the maximum, so a late or repeated one cannot rewind."""
        ...

    def iter_urls(self, batch: int = 1000) -> Iterable[dict[str, Any]]:
        """Every URL's state and last fetch facts, by url_id, streamed in batches."""
        ...

    def iter_events(self, batch: int = 1000) -> Iterable[dict[str, Any]]:
        """Every index event by event_id, streamed in batches."""
        ...

    def iter_records(self, batch: int = 1000) -> Iterable[dict[str, Any]]:
        """Every record by record_id, streamed in batches (``records()`` reads all at once)."""
        ...

    def aggregates(self) -> dict[str, Any]:
        """Counts by state, status code and source plus body bytes, recomputed over stored rows
        in one snapshot (R22: never kept as per-fetch increments)."""
        ...


class Inspection(Protocol):
    """Stored rows as they are, for tests, status and debugging. Every backend returns the same
    keys: the schema's column names (``store.URL_COLUMNS``, ``store.HOST_COLUMNS``)."""

    def url_row(self, url: str) -> dict[str, Any] | None: ...

    def host_row(self, host_key: str) -> dict[str, Any] | None: ...

    def url_rows(self) -> list[dict[str, Any]]:
        """Every URL's row by url_id (reads them all: small crawls only)."""
        ...

    def host_rows(self) -> list[dict[str, Any]]:
        """Every host's row by host key."""
        ...

    def existing_urls(self, candidates: Sequence[str]) -> set[str]:
        """Which of ``candidates`` are known: the durable-key look-up a Bloom filter saves."""
        ...


class Frontier(SchedulingCore, Fleet, Control, CrawlState, Outputs, Inspection, Protocol):
    """The one frontier contract: every backend implements all of it."""

    def migrate(self) -> int:
        """Bring the storage to the current schema; returns its version (``SCHEMA_VERSION``)."""
        ...

    def close(self) -> None: ...
