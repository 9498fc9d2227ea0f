"""A deterministic, virtual-clock simulation of the scheduler (SPEC R26).

Why a simulation: politeness and exactly-once bugs show up at scale (thousands of hosts, one
host with a million URLs, faults at awkward moments) and after minutes of crawling, which no
test against a real server can afford. Here a REAL frontier backend (the in-memory one by
default; ``--backend sqlite`` or a ``postgresql://`` URL for the others), driven only through the
frontier contract, and the engine's REAL lease feeder (``engine.feeder.FeederCore``: how many to
lease, when to linger, when nothing is ready and when to look again) are run by a simulated
crawler whose clock is a number: a response "takes" 0.3 s by being scheduled 0.3 virtual seconds
later, so a long crawl runs in seconds of wall time, with no sleeping and no sockets.

The simulator plays the rest of the engine: the feeder asks for leases for the free workers
(at most ``lease_batch`` per call), each lease becomes an outcome drawn from the host's model
(latency, 429/503 answers, robots.txt answers), and completions and failures are delivered in
batches, injecting faults (crashed and lost completions, duplicate completions, a stalled parser
queue). Every grant is
also written to a server-side request log, so politeness is judged twice: from the frontier's
own lease log (``lease_audit``) and, independently, from what the "servers" saw
(``politeness_check.check_log``).

Determinism: every random draw comes from a ``random.Random`` seeded from ``(seed, URL, n-th
grant of that URL)``, so the outcome of a fetch does not depend on the order in which the
scheduler happened to grant it; the frontier's own generator (back-off jitter, lease tokens) is
seeded too. The same options give the same report, apart from wall-clock timings.

Events that fall within one ``tick`` of virtual time are handled together, like the engine's
group commit: a response is delivered at the first tick at or after it ends (never before, so
the frontier never frees a host slot before the server finished answering).
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import json
import math
import random
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from idemcrawl.engine.feeder import Action, FeederCore
from idemcrawl.frontier import MemoryFrontier, SQLiteFrontier
from idemcrawl.frontier.base import (
    DISALLOWED,
    DONE,
    PAGE,
    ROBOTS,
    Completion,
    Failure,
    Frontier,
    HostPolicy,
    Lease,
    NewURL,
    RecordWrite,
    RobotsFetch,
)
from idemcrawl.politeness import allowance
from idemcrawl.robots import RobotsCache, RobotsSettings

from . import politeness_check

__all__ = [
    "HOST_CLASSES",
    "HotHostComparison",
    "SimOptions",
    "SimReport",
    "compare_hot_host",
    "main",
    "run_sim",
]

#: Host classes, in the order of ``SimOptions.class_mix``; "hot" is the optional extra host.
HOST_CLASSES = ("default", "fast", "crawl_delay", "disallow")
HOT = "hot"
#: The hot host may raise the other hosts' p99 eligibility delay by at most 10 %.
HOT_HOST_TOLERANCE = 1.10

#: robots.txt behaviours of a host (see ``_Host.robots_answer``).
ROBOTS_KINDS = ("404", "rules", "500", "neterr", "blocked", "flaky")

_OWNER = "sim"
_UNREACHABLE_STATUS = (500, 503)


def _quiet(_: str) -> None:
    """Default log sink: a library call prints nothing unless asked to."""


@dataclass
class SimOptions:
    """Everything that shapes one simulated crawl; the defaults run in well under a minute."""

    hosts: int = 1000
    urls_per_host: int = 10
    #: One extra host with this many pending URLs (0 = none): the scheduler must not let it
    #: slow the other hosts down.
    hot_host_urls: int = 0
    #: Global leases outstanding at most (the engine's worker count).
    concurrency: int = 256
    lease_seconds: float = 60.0
    #: Most URLs asked for in one ``lease`` call, and most outcomes in one commit.
    lease_batch: int = 64
    commit_batch: int = 256
    #: Global politeness defaults (the "default" class uses them unchanged).
    delay: float = 1.0
    host_concurrency: int = 1
    #: The "fast" class: a per-host override.
    fast_delay: float = 0.2
    fast_concurrency: int = 2
    #: The "crawl_delay" class: robots.txt asks for this Crawl-delay.
    crawl_delay: float = 2.0
    #: Shares of default / fast / crawl_delay / disallow hosts (normalised).
    class_mix: tuple[float, float, float, float] = (0.6, 0.2, 0.1, 0.1)
    #: Share of a "disallow" host's URLs under its disallowed /private prefix.
    private_fraction: float = 0.2
    #: robots.txt behaviour of default/fast hosts: weights per kind in ``ROBOTS_KINDS`` order
    #: (404, 200 rules that allow our paths, always 500, always network error, blocked by the
    #: SSRF guard, unreachable once and then fine).
    robots_mix: tuple[float, float, float, float, float, float] = (
        0.70,
        0.15,
        0.04,
        0.03,
        0.03,
        0.05,
    )
    #: Chance that a re-fetch of a good robots.txt answers 500 (the cached copy must be kept).
    robots_refetch_error: float = 0.2
    #: Short robots.txt lifetimes so that copies expire and are re-fetched during the run.
    robots_max_age: float = 60.0
    robots_error_ttl: float = 15.0
    robots_max_attempts: int = 3
    #: Small parse cache, so that evicted rules are re-parsed during the run.
    robots_cache_entries: int = 500
    #: Share of hosts that sometimes answer 429 (with Retry-After) or 503 (half each).
    error_hosts: float = 0.2
    #: Per-request chance of that error on such a host.
    error_rate: float = 0.15
    retry_after_values: tuple[float, ...] = (1.0, 5.0, 30.0)
    #: A host's base latency is drawn from this range; each request varies it by +-30 %.
    latency_range: tuple[float, float] = (0.02, 0.8)
    #: The engine's URL retry policy (a final failure after ``max_retries`` attempts).
    max_retries: int = 3
    retry_base: float = 1.0
    retry_cap: float = 60.0
    #: Host back-off (HostPolicy); capped low so back-off shows up within a short run.
    backoff_cap: float = 60.0
    #: Faults, per request: the worker dies after the response, before committing (the lease
    #: must expire and the URL be retried); the completion is lost but the worker goes on;
    #: the same completion is sent twice (the second must be rejected).
    p_crash: float = 0.005
    p_lost: float = 0.005
    p_duplicate: float = 0.01
    #: The parser queue stalls for ``stall_seconds`` (page completions are held back and their
    #: workers stay busy). It starts ``stall_at`` virtual seconds in, or, when that is None, as
    #: soon as ``stall_after_done`` of the page URLs are done: early on a large crawl mostly
    #: fetches robots.txt, which is not parsed, so a fixed early stall could hold nothing.
    #: ``stall_seconds=0`` disables it.
    stall_at: float | None = None
    stall_after_done: float = 0.1
    stall_seconds: float = 10.0
    seed: int = 1
    max_virtual_seconds: float = 3600.0
    #: Virtual-time resolution: events within one tick are handled together.
    tick: float = 0.01
    #: Hot host politeness (one request at a time, one per second, allow-all robots.txt).
    hot_delay: float = 1.0
    hot_latency: float = 0.1
    #: The frontier backend: "memory" (default), "sqlite" (``db_path``, or a file in a
    #: temporary directory removed afterwards) or a ``postgresql://`` URL (``?schema=NAME``; the
    #: schema must be new).
    backend: str = "memory"
    db_path: str | None = None
    #: Negative control: False gives the frontier no RobotsCache, so it crawls without
    #: robots.txt while the simulated sites have rules; the checks must then fail.
    frontier_robots: bool = True
    start_time: float = 1_000_000.0
    #: Print a progress line every this many virtual seconds (0 = never).
    progress_every: float = 30.0

    def __post_init__(self) -> None:
        # Catch nonsense early: a zero tick or concurrency would loop forever or do nothing.
        if self.hosts < 0 or self.urls_per_host < 0 or self.hot_host_urls < 0:
            raise ValueError("hosts, urls_per_host and hot_host_urls must be >= 0")
        if self.concurrency < 1 or self.lease_batch < 1 or self.commit_batch < 1:
            raise ValueError("concurrency, lease_batch and commit_batch must be >= 1")
        if not (self.tick > 0 and self.lease_seconds > 0 and self.max_virtual_seconds > 0):
            raise ValueError("tick, lease_seconds and max_virtual_seconds must be > 0")
        if len(self.class_mix) != len(HOST_CLASSES) or sum(self.class_mix) <= 0:
            raise ValueError(f"class_mix needs {len(HOST_CLASSES)} weights with a positive sum")
        if len(self.robots_mix) != len(ROBOTS_KINDS) or sum(self.robots_mix) <= 0:
            raise ValueError(f"robots_mix needs {len(ROBOTS_KINDS)} weights with a positive sum")
        lo, hi = self.latency_range
        if not 0 < lo <= hi:
            raise ValueError("latency_range must be 0 < low <= high")
        if self.backend not in ("memory", "sqlite") and not self.backend.startswith(
            ("postgresql://", "postgres://")
        ):
            raise ValueError(
                f"backend must be memory, sqlite or a postgresql:// URL, got {self.backend!r}"
            )


# -- the simulated world -------------------------------------------------------------------------


@dataclass(slots=True)
class _Host:
    """One simulated site: its fixed model, and what the simulator knows about it so far."""

    key: str
    cls: str
    delay: float
    concurrency: int
    crawl_delay: float | None
    disallow: tuple[str, ...]
    robots_kind: str
    robots_body: bytes | None
    error_kind: str | None  # "429", "503" or None
    latency: float
    paths: list[str] = field(default_factory=list)
    # robots.txt as the simulator knows the frontier must see it (mirrors RFC 9309 handling).
    robots_mode: str | None = None  # None unknown, "rules", "allow", "disallow_all"
    robots_expires: float = 0.0
    robots_failures: int = 0
    deferred: bool = False
    robots_grants: int = 0
    robots_needed_since: float = 0.0
    # Host token state as last read from the frontier, and the simulator's in-flight count.
    gate: float = 0.0
    streak: int = 0
    queued: int = 0
    in_flight: int = 0
    slot_free_at: float = 0.0
    slot_free: bool = True
    #: Since when the host has had a queued URL, and its last robots.txt lease was over.
    work_since: float = 0.0
    robots_free_at: float = 0.0

    @property
    def min_gap(self) -> float:
        """Seconds between request starts the site may expect (delay or its Crawl-delay)."""
        return max(self.delay, self.crawl_delay or 0.0)

    def allowance(self) -> int:
        return allowance(self.concurrency, self.streak)

    def robots_answer(self, n: int, rng: random.Random, refetch_error: float) -> RobotsFetch:
        """The site's answer to its ``n``-th robots.txt request (1-based)."""
        kind = self.robots_kind
        if kind == "404":
            return RobotsFetch(404, b"not found")
        if kind == "500":
            return RobotsFetch(500, b"oops", error="HTTP 500")
        if kind == "neterr":
            return RobotsFetch(None, error="connect timeout")
        if kind == "blocked":
            # What the engine reports when the SSRF guard refuses the resolved address.
            return RobotsFetch(
                None, error="blocked: resolves to private address 10.0.0.7", permanent=True
            )
        if kind == "flaky" and n == 1:
            return RobotsFetch(503, b"busy", error="HTTP 503")
        if n > 1 and rng.random() < refetch_error:
            return RobotsFetch(500, b"oops", error="HTTP 500")
        return RobotsFetch(200, self.robots_body)


def _robots_body(cls: str, crawl_delay: float) -> bytes:
    """A robots.txt per class. A group for another bot makes sure groups are told apart."""
    other = b"User-agent: otherbot\nDisallow: /\n\n"
    if cls == "crawl_delay":
        return other + f"User-agent: *\nCrawl-delay: {crawl_delay:g}\n".encode()
    if cls == "disallow":
        return other + b"User-agent: *\nDisallow: /private\n"
    return other + b"User-agent: *\nDisallow: /nothing-here\n"


def _weighted(rng: random.Random, names: Sequence[str], weights: Sequence[float]) -> str:
    return rng.choices(list(names), weights=list(weights))[0]


def _build_hosts(opts: SimOptions) -> list[_Host]:
    """The simulated web. The hot host draws from its own stream, so adding it changes no
    other host's model (compare_hot_host relies on that)."""
    rng = random.Random(f"{opts.seed}:hosts")
    hosts: list[_Host] = []
    width = max(5, len(str(opts.hosts)))
    for i in range(opts.hosts):
        key = f"http://h{i:0{width}d}.test"
        cls = _weighted(rng, HOST_CLASSES, opts.class_mix)
        delay, conc, cd, disallow = opts.delay, opts.host_concurrency, None, ()
        if cls == "fast":
            delay, conc = opts.fast_delay, opts.fast_concurrency
        elif cls == "crawl_delay":
            cd = opts.crawl_delay
        elif cls == "disallow":
            disallow = ("/private",)
        robots_kind = (
            _weighted(rng, ROBOTS_KINDS, opts.robots_mix) if cls in ("default", "fast") else "rules"
        )
        body = _robots_body(cls, opts.crawl_delay) if robots_kind in ("rules", "flaky") else None
        err_draw = rng.random()
        error_kind = None
        if err_draw < opts.error_hosts:
            error_kind = "429" if err_draw < opts.error_hosts / 2 else "503"
        latency = rng.uniform(*opts.latency_range)
        h = _Host(key, cls, delay, conc, cd, disallow, robots_kind, body, error_kind, latency)
        for j in range(opts.urls_per_host):
            private = cls == "disallow" and rng.random() < opts.private_fraction
            h.paths.append(f"/private/p{j}" if private else f"/p{j}")
        hosts.append(h)
    return hosts


def _hot_host(opts: SimOptions) -> _Host:
    h = _Host(
        "http://hot.test",
        HOT,
        opts.hot_delay,
        1,
        None,
        (),
        "rules",
        b"User-agent: *\nDisallow: /nothing-here\n",
        None,
        opts.hot_latency,
    )
    return h


# -- bookkeeping for leases in flight ---------------------------------------------------------


@dataclass(slots=True)
class _Pending:
    """A granted lease and what will become of it."""

    lease: Lease
    host: _Host
    outcome: Completion | Failure
    fault: str | None  # "crash", "lost" or None
    duplicate: bool
    end: float
    held: bool = False
    resolved: bool = False  # accepted by the frontier, or its lease reclaimed on expiry


def _pct(values: Sequence[float], p: float) -> float | None:
    """Nearest-rank percentile of sorted ``values`` (the same rule as ``lease_audit``)."""
    if not values:
        return None
    return values[min(len(values) - 1, int(p * len(values)))]


def _r(x: float | None, nd: int = 3) -> float | None:
    return None if x is None else round(x, nd)


# -- the report ---------------------------------------------------------------------------------


@dataclass
class SimReport:
    """Results and checks of one run; ``ok`` only when every check holds."""

    options: dict[str, Any]
    hosts: int
    page_urls: int
    hot_host_urls: int
    grants: dict[str, int]
    outcomes: dict[str, int]
    faults: dict[str, int]
    virtual_seconds: float
    stop_reason: str
    finished: bool
    audit: dict[str, Any]
    request_log: dict[str, Any]
    disallowed: dict[str, Any]
    events: dict[str, Any]
    backpressure: dict[str, Any]
    scheduler: dict[str, Any]
    eligibility: dict[str, dict[str, Any]]
    frontier: dict[str, Any]
    checks: dict[str, bool]
    wall: dict[str, float]

    @property
    def ok(self) -> bool:
        return all(self.checks.values())

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON-able data; everything but ``wall`` is a function of the options."""
        d = asdict(self)
        d["ok"] = self.ok
        return d

    def others_p99(self) -> float | None:
        """p99 eligibility delay over every host but the hot one (the hot-host criterion)."""
        return self.eligibility.get("others", {}).get("p99")

    def text(self) -> str:
        o = self.options
        lines = [
            f"idemcrawl sim: seed {o['seed']}, virtual clock, the engine's feeder, "
            f"real {o['backend'].split('://')[0]} frontier, no sockets",
            "",
        ]

        def row(label: str, value: object) -> None:
            lines.append(f"  {label:<34} {value}")

        hot = f" + 1 hot host with {self.hot_host_urls:,} URLs" if self.hot_host_urls else ""
        row("hosts", f"{self.hosts:,}{hot}")
        row("page URLs (other hosts)", f"{self.page_urls:,}")
        g = self.grants
        row(
            "grants",
            f"{g['total']:,} ({g['page']:,} pages, {g['robots']:,} robots.txt; "
            f"hot host {g['hot']:,})",
        )
        oc = self.outcomes
        row(
            "outcomes",
            f"{oc['pages_done']:,} pages done, {oc['failures']:,} failures "
            f"({oc['final_failures']:,} final), {oc['robots_done']:,} robots.txt, "
            f"{oc['rejected_stale']:,} stale rejected",
        )
        f = self.faults
        row(
            "faults injected",
            f"crash {f['crash']}, lost {f['lost']}, duplicate {f['duplicate']}, "
            f"429 {f['http_429']}, 503 {f['http_503']}, robots refetches {f['robots_refetches']}",
        )
        row("virtual seconds", f"{self.virtual_seconds:,.1f} ({self.stop_reason})")
        w = self.wall
        row(
            "wall seconds",
            f"{w['total']:.1f} (setup {w['setup']:.1f}, run {w['run']:.1f}, "
            f"checks {w['checks']:.1f})",
        )
        lines += ["", "checks"]
        a, rl, da, ev, bp, sc = (
            self.audit,
            self.request_log,
            self.disallowed,
            self.events,
            self.backpressure,
            self.scheduler,
        )
        detail = {
            "finished": f"{self.stop_reason}; {sc['unfinished_urls']} URLs not terminal",
            "audit_violations": f"{a['violations']} (lease_audit over {a['grants']:,} grants)",
            "request_log_violations": f"{rl['violations']} {rl['by_kind'] or ''}".rstrip(),
            "retry_after_respected": f"{rl['retry_after_violations']} early requests",
            "disallowed_leases": f"{da['leases']} {da['by_reason'] or ''}".rstrip(),
            "private_urls_disallowed": f"{da['private_not_disallowed']} /private URLs not "
            "in state disallowed",
            "duplicate_events": f"{ev['duplicate_events']} (events {ev['events']:,}, accepted "
            f"page completions {ev['accepted_page_completions']:,}, done page versions "
            f"{ev['done_page_versions']:,})",
            "duplicate_completions_rejected": (
                f"{ev['duplicates_rejected']}/{ev['duplicates_sent']}"
            ),
            "backpressure": f"stall {bp['window']}: held {bp['held_peak']}, max outstanding "
            f"{bp['max_outstanding']}/{bp['concurrency']}, grants {bp['grants']} "
            f"<= free {bp['free_at_start']} + freed {bp['freed']}; all workers busy: "
            f"{'yes' if bp['saturated'] else 'no'}",
            "no_double_lease": f"{sc['double_leases']} URLs leased twice at once",
            "lease_limit_respected": f"{sc['over_limit']} lease calls returned more than asked",
            "in_flight_consistent": f"{sc['in_flight_mismatches']} host in_flight mismatches",
            "no_early_grants": f"{sc['early_grants']} grants before the host was ready",
        }
        for name, ok in self.checks.items():
            lines.append(f"  [{'ok' if ok else 'FAIL'}] {name:<32} {detail.get(name, '')}")
        lines += [
            "",
            "eligibility delay (s): grant time - when URL, host slot and host timer allowed it",
            f"  {'class':<12} {'grants':>9} {'p50':>8} {'p99':>8} {'max':>8}",
        ]
        for cls, e in self.eligibility.items():
            lines.append(
                f"  {cls:<12} {e['grants']:>9,} {_fmt(e['p50'])} {_fmt(e['p99'])} {_fmt(e['max'])}"
            )
        qa = a.get("eligibility_delay_s", {})
        lines.append(
            f"  lease_log (granted_at - due_at, all hosts): p50 {qa.get('p50')} "
            f"p99 {qa.get('p99')} max {qa.get('max')}"
        )
        lines += ["", f"result: {'PASS' if self.ok else 'FAIL'}"]
        return "\n".join(lines)


def _fmt(x: float | None) -> str:
    return f"{'-':>8}" if x is None else f"{x:>8.3f}"


# -- the simulation -----------------------------------------------------------------------------


def open_backend(opts: SimOptions, db_path: str | None) -> Frontier:
    """A fresh frontier of the chosen backend; its generator (back-off jitter, lease tokens) is
    seeded, so the run is reproducible."""
    rng = random.Random(f"{opts.seed}:frontier")
    if opts.backend == "memory":
        return MemoryFrontier(rng=rng)
    if opts.backend == "sqlite":
        assert db_path is not None
        return SQLiteFrontier(db_path, rng=rng)
    from idemcrawl.frontier import split_schema
    from idemcrawl.frontier.postgres import PostgresFrontier

    dsn, schema = split_schema(opts.backend)
    f = PostgresFrontier(dsn, schema=schema, rng=rng)
    if f.progress(opts.start_time).queued or f.stats().hosts:
        f.close()
        raise ValueError(f"{opts.backend!r} holds a crawl; the simulation needs a fresh schema")
    return f


class _VirtualClock:
    """The feeder's clock: the simulation's virtual now."""

    def __init__(self, sim: _Sim) -> None:
        self._sim = sim

    def time(self) -> float:
        return self._sim.now


class _Sim:
    """One run. Kept as an object so that the event loop reads as a sequence of small steps."""

    def __init__(self, opts: SimOptions, log: Callable[[str], None], frontier: Frontier) -> None:
        self.o = opts
        self.log = log
        self.t0 = opts.start_time
        self.hosts = _build_hosts(opts)
        self.hot = _hot_host(opts) if opts.hot_host_urls else None
        self.by_key = {h.key: h for h in self.hosts}
        if self.hot is not None:
            self.by_key[self.hot.key] = self.hot
        settings = RobotsSettings(
            max_age=opts.robots_max_age, error_ttl=opts.robots_error_ttl, crawl_delay_cap=30.0
        )
        self.robots_settings = settings
        self.policy = HostPolicy(
            max_in_flight=opts.host_concurrency,
            delay=opts.delay,
            backoff_cap=opts.backoff_cap,
            robots=RobotsCache(settings, opts.robots_cache_entries)
            if opts.frontier_robots
            else None,
            robots_max_attempts=opts.robots_max_attempts,
        )
        self.frontier = frontier
        self.now = self.t0
        # The engine's own lease feeder, on the virtual clock: it decides how many URLs to ask
        # for, when to linger for more idle workers and when to look again (nothing granted).
        self.feeder = FeederCore(
            frontier,
            _VirtualClock(self),
            owner=_OWNER,
            policy=self.policy,
            lease_seconds=opts.lease_seconds,
            concurrency=opts.concurrency,
        )
        #: When the feeder asked to decide again (LINGER or IDLE), None when it waits for a
        #: worker or a commit; and whether it found the crawl finished.
        self.feeder_wake: float | None = self.t0
        self.feeder_finished = False
        #: A worker went idle or a commit landed since the feeder last decided (the engine's
        #: wake-up), and whether the feeder is lingering (a sleep no wake-up cuts short).
        self.woken = False
        self.lingering = False
        self.seq = itertools.count()
        self.heap: list[tuple[float, int, str, _Pending]] = []
        self.expiries: list[tuple[float, int, _Pending]] = []
        self.held: list[_Pending] = []
        self.active: dict[str, _Pending] = {}
        self.grant_no: Counter[str] = Counter()
        self.outstanding = 0
        self.pending_other = 0  # outstanding work on hosts other than the hot one
        self.step_i = 0
        self.request_log: list[dict[str, Any]] = []
        self.retry_after_marks: list[tuple[str, float, float]] = []
        self.lags: dict[str, list[float]] = {c: [] for c in (*HOST_CLASSES, HOT)}
        self.c: Counter[str] = Counter()
        self.disallowed_by_reason: Counter[str] = Counter()
        self.disallowed_examples: list[str] = []
        self.stall_start = math.inf
        self.stall_end = math.inf
        if opts.stall_seconds > 0 and opts.stall_at is not None:
            self._start_stall(self.t0 + opts.stall_at)
        self.bp: dict[str, Any] = {
            "held_peak": 0,
            "max_outstanding": 0,
            "grants": 0,
            "freed": 0,
            "free_at_start": None,
            "saturated": False,
        }

    def _start_stall(self, at: float) -> None:
        self.stall_start = at
        self.stall_end = at + self.o.stall_seconds

    # -- set-up -------------------------------------------------------------------------------

    def setup(self) -> None:
        f, o = self.frontier, self.o
        for h in self.hosts:
            if (h.delay, h.concurrency) != (o.delay, o.host_concurrency):
                f.set_host_overrides(h.key, delay=h.delay, max_in_flight=h.concurrency)
        batch: list[NewURL] = []
        for h in self.hosts:
            h.robots_needed_since = self.t0
            for p in h.paths:
                batch.append(NewURL(h.key + p, h.key))
                if len(batch) >= 50_000:
                    f.add(batch, self.t0)
                    batch = []
        if batch:
            f.add(batch, self.t0)
        if self.hot is not None:
            self.hot.robots_needed_since = self.t0
            t = time.perf_counter()
            for lo in range(0, o.hot_host_urls, 50_000):
                hi = min(o.hot_host_urls, lo + 50_000)
                f.add(
                    [NewURL(f"{self.hot.key}/item/{i}", self.hot.key) for i in range(lo, hi)],
                    self.t0,
                )
            self.log(f"added {o.hot_host_urls:,} hot-host URLs in {time.perf_counter() - t:.1f} s")
        self.refresh([h.key for h in self.by_key.values()])

    # -- the frontier's view of hosts ---------------------------------------------------------

    def refresh(self, keys: Iterable[str]) -> None:
        """Re-read token state of ``keys`` from the frontier (after it changed them), through
        the contract's inspection API, as any backend offers it."""
        for key in dict.fromkeys(keys):
            row = self.frontier.host_row(key)
            if row is None:
                continue
            h = self.by_key[key]
            h.gate = max(row["next_allowed_at"], row["backoff_until"])
            h.streak = row["error_streak"]
            h.queued = row["queued"]
            if row["in_flight"] != h.in_flight:
                self.c["in_flight_mismatches"] += 1
            self._slot_event(h, self.now)

    def _slot_event(self, h: _Host, at: float) -> None:
        free = h.in_flight < h.allowance()
        if free and not h.slot_free:
            h.slot_free_at = at
        h.slot_free = free

    # -- granting -----------------------------------------------------------------------------

    def lease_phase(self) -> None:
        """The engine's feeder deciding, as it would at this moment (``FeederCore``)."""
        now = self.now
        waiting = self.feeder_wake is not None and now < self.feeder_wake
        if waiting and (self.lingering or not self.woken):
            return  # lingering, or idle with nothing that would wake the feeder early
        self.woken = self.lingering = False
        self.feeder_wake = None
        feeder = self.feeder
        while True:
            # Idle workers arrive in batches of at most lease_batch (the engine's workers go
            # idle one by one; the feeder coalesces them).
            idle = min(self.o.concurrency - self.outstanding, self.o.lease_batch)
            step = feeder.plan(idle)
            if step.action is Action.LEASE:
                # The frontier returns expired leases inside lease(): mirror that first.
                self._expire_mirror(now)
                step = feeder.lease(step.want)
                feeder.record(step)
            self.c["feeder_steps"] += 1
            if step.action is Action.LEASED:
                if len(step.leases) > idle:
                    self.c["over_limit"] += 1
                for ls in step.leases:
                    self.grant(ls)
                self.refresh(ls.host_key for ls in step.leases)
                if step.timeout is None:
                    continue  # like the engine: decide again at once while leases come back
                self.feeder_wake = now + step.timeout  # hosts gave less: look again then
                self.lingering = False
                self.c["feeder_idle"] += 1
                return
            if step.action in (Action.LINGER, Action.IDLE):
                assert step.timeout is not None
                self.feeder_wake = now + step.timeout
                self.lingering = step.action is Action.LINGER
                self.c["feeder_linger" if self.lingering else "feeder_idle"] += 1
            elif step.action is Action.FINISHED:
                self.feeder_finished = True
            return  # WAIT: every worker is busy; a delivery wakes the feeder

    def _expire_mirror(self, now: float) -> None:
        while self.expiries and self.expiries[0][0] <= now:
            exp, _, p = heapq.heappop(self.expiries)
            if not p.resolved:
                p.resolved = True
                self.active.pop(p.lease.url, None)
                h = p.host
                h.in_flight -= 1
                self._slot_event(h, exp)
                if p.lease.kind == ROBOTS:
                    h.robots_free_at = exp
                if h.queued == 0:
                    h.work_since = exp
                h.queued += 1
                self.c["lease_expiries"] += 1

    def grant(self, ls: Lease) -> None:
        now, o = self.now, self.o
        h = self.by_key[ls.host_key]
        path = ls.url[len(h.key) :]
        n = self.grant_no[ls.url] = self.grant_no[ls.url] + 1
        rng = random.Random(f"{o.seed}|{ls.url}|{n}")
        self.c["grants"] += 1
        self.c["grants_hot" if h is self.hot else "grants_" + ls.kind] += 1
        if ls.url in self.active:
            self.c["double_leases"] += 1
        # Eligibility: when the URL was due, the host's timer had run out and a slot was free.
        # robots.txt is leased as soon as the host has queued work and its copy has expired.
        if ls.kind == ROBOTS:
            ready = max(
                h.robots_needed_since, h.work_since, h.robots_free_at, h.gate, h.slot_free_at
            )
        else:
            ready = max(ls.due_at, h.gate, h.slot_free_at)
        lag = now - ready
        if lag < -1e-6:
            self.c["early_grants"] += 1
        # Waiting out the deliberate parser stall is back-pressure, not scheduling delay.
        lag -= max(0.0, min(now, self.stall_end) - max(ready, self.stall_start))
        self.lags[h.cls].append(max(0.0, lag))
        if ls.kind == PAGE:
            self.check_robots(h, path)
        h.in_flight += 1
        h.queued = max(0, h.queued - 1)
        self._slot_event(h, now)
        # What happens to this request; it starts when its lease says (I6: start_at).
        latency = h.latency * rng.uniform(0.7, 1.3)
        start = max(now, ls.start_at)
        end = start + latency
        u = rng.random()
        fault = "crash" if u < o.p_crash else "lost" if u < o.p_crash + o.p_lost else None
        duplicate = fault is None and rng.random() < o.p_duplicate
        outcome: Completion | Failure
        status: int | None
        if ls.kind == ROBOTS:
            h.robots_grants += 1
            if h.robots_grants > 1:
                self.c["robots_refetches"] += 1
            answer = h.robots_answer(h.robots_grants, rng, o.robots_refetch_error)
            outcome = Completion(ls, answer.status or 0, end, latency=latency, robots=answer)
            status = answer.status
        else:
            outcome = self.page_outcome(ls, h, path, end, latency, rng)
            status = outcome.status
        p = _Pending(ls, h, outcome, fault, duplicate, end)
        self.active[ls.url] = p
        heapq.heappush(self.heap, (end, next(self.seq), "resp", p))
        heapq.heappush(self.expiries, (ls.expires_at, next(self.seq), p))
        self.outstanding += 1
        if h is not self.hot:
            self.pending_other += 1
        if fault is not None:
            self.c[fault] += 1
        blocked = (
            isinstance(outcome, Completion)
            and outcome.robots is not None
            and (outcome.robots.permanent)
        )
        if not blocked:  # the SSRF guard refused before connecting: the server saw nothing
            self.request_log.append(
                {"host": h.key, "path": path, "start": start, "end": end, "status": status}
            )
        if self.stall_start <= now < self.stall_end:
            self.bp["grants"] += 1

    def page_outcome(
        self, ls: Lease, h: _Host, path: str, end: float, latency: float, rng: random.Random
    ) -> Completion | Failure:
        o = self.o
        if h.error_kind is not None and rng.random() < o.error_rate:
            status = int(h.error_kind)
            after = rng.choice(o.retry_after_values) if status == 429 else None
            self.c[f"http_{status}"] += 1
            if after is not None:
                self.retry_after_marks.append((h.key, end, after))
            if ls.attempts >= o.max_retries:
                return Failure(
                    ls, f"HTTP {status}", None, status, host_error=True, retry_after=after
                )
            wait = rng.uniform(0, min(o.retry_cap, o.retry_base * 2**ls.attempts))
            return Failure(
                ls,
                f"HTTP {status}",
                end + max(wait, after or 0.0),
                status,
                host_error=True,
                retry_after=after,
            )
        rec = RecordWrite.make("sim", ls.url, {"host": h.key, "path": path})
        return Completion(
            ls, 200, end, [rec], [], rec.content_hash, 1000 + len(path), latency=latency
        )

    def check_robots(self, h: _Host, path: str) -> None:
        """(b): a page lease must be allowed by robots.txt as the site served it."""
        now = self.now
        reasons = []
        if h.robots_mode is None:
            reasons.append("before robots.txt known")
        elif h.deferred:
            reasons.append("host deferred (robots.txt blocked/unreachable)")
        elif h.robots_mode == "disallow_all":
            reasons.append("robots.txt unreachable")
        elif now >= h.robots_expires:
            reasons.append("robots.txt copy expired")
        if any(path.startswith(p) for p in h.disallow):
            reasons.append("disallowed path")
        if reasons:
            self.c["disallowed_leases"] += 1
            self.disallowed_by_reason.update(reasons)
            if len(self.disallowed_examples) < 5:
                self.disallowed_examples.append(f"{h.key}{path}: {', '.join(reasons)}")

    # -- delivering ---------------------------------------------------------------------------

    def deliver_phase(self) -> None:
        now = self.now
        completions: list[tuple[Completion, _Pending, bool]] = []
        failures: list[tuple[Failure, _Pending]] = []
        in_stall = self.stall_start <= now < self.stall_end
        while self.heap and self.heap[0][0] <= now:
            _, _, kind, p = heapq.heappop(self.heap)
            if kind == "dup":
                assert isinstance(p.outcome, Completion)
                completions.append((p.outcome, p, True))
                self.c["duplicate"] += 1
                continue
            if p.fault is not None:  # nothing reaches the frontier; the worker is free
                self._free_worker(p)
                if in_stall:
                    self.bp["freed"] += 1
                continue
            parsed = isinstance(p.outcome, Completion) and p.outcome.robots is None
            if in_stall and parsed and p.end >= self.stall_start:
                p.held = True  # the parser queue is stuck: the worker waits with its page
                self.held.append(p)
                continue
            self._free_worker(p)
            if in_stall:
                self.bp["freed"] += 1
            if isinstance(p.outcome, Completion):
                completions.append((p.outcome, p, False))
            else:
                failures.append((p.outcome, p))
        if self.held:
            self.bp["held_peak"] = max(self.bp["held_peak"], len(self.held))
            if not in_stall and now >= self.stall_end:
                for p in self.held:
                    self._free_worker(p)
                    assert isinstance(p.outcome, Completion)
                    completions.append((p.outcome, p, False))
                self.held = []
        touched: list[str] = []
        for lo in range(0, len(completions), self.o.commit_batch):
            chunk = completions[lo : lo + self.o.commit_batch]
            oks = self.frontier.complete([c for c, _, _ in chunk], now, self.policy)
            for (c, p, dup), ok in zip(chunk, oks, strict=True):
                touched.append(p.host.key)
                self.after_completion(c, p, dup, ok)
        for lo in range(0, len(failures), self.o.commit_batch):
            fchunk = failures[lo : lo + self.o.commit_batch]
            oks = self.frontier.fail([f for f, _ in fchunk], now, self.policy)
            for (f, p), ok in zip(fchunk, oks, strict=True):
                touched.append(p.host.key)
                self._accepted(p, ok)
                if ok:
                    self.c["failures"] += 1
                    if f.retry_at is None:
                        self.c["final_failures"] += 1
                    else:
                        if p.host.queued == 0:
                            p.host.work_since = now
                        p.host.queued += 1
        if touched:
            self.refresh(touched)

    def _free_worker(self, p: _Pending) -> None:
        """The worker is done with ``p`` (its outcome is about to commit, or was lost): the
        feeder counts one lease fewer in flight and, like the engine's, wakes up."""
        self.outstanding -= 1
        self.feeder.settled(1)
        self.woken = True
        if p.host is not self.hot:
            self.pending_other -= 1

    def _accepted(self, p: _Pending, ok: bool) -> None:
        if ok:
            if p.resolved:  # the simulator thought the frontier had reclaimed it
                self.c["in_flight_mismatches"] += 1
            p.resolved = True
            self.active.pop(p.lease.url, None)
            p.host.in_flight -= 1
            self._slot_event(p.host, self.now)
            if p.lease.kind == ROBOTS:
                p.host.robots_free_at = self.now
        else:
            self.c["rejected_stale"] += 1

    def after_completion(self, c: Completion, p: _Pending, dup: bool, ok: bool) -> None:
        if dup:
            self.c["duplicates_accepted" if ok else "duplicates_rejected"] += 1
            return
        self._accepted(p, ok)
        if not ok:
            return
        if p.duplicate:  # the committer will send it again shortly
            heapq.heappush(self.heap, (self.now + 0.5, next(self.seq), "dup", p))
        if c.robots is not None:
            self.c["robots_done"] += 1
            self.learn_robots(p.host, c.robots)
        else:
            self.c["pages_done"] += 1

    def learn_robots(self, h: _Host, rf: RobotsFetch) -> None:
        """Mirror of RFC 9309 handling: what the frontier must now believe about the host."""
        now, s = self.now, self.robots_settings
        good = rf.status is not None and 200 <= rf.status < 500 and rf.status != 429
        if good:
            assert rf.status is not None
            h.robots_mode = "rules" if rf.status < 300 else "allow"
            h.robots_expires = now + s.max_age
            h.robots_failures = 0
        else:
            h.robots_failures += 1
            if rf.permanent:
                h.robots_failures = max(h.robots_failures, self.o.robots_max_attempts)
            if h.robots_mode not in ("rules", "allow"):
                h.robots_mode = "disallow_all"
            h.robots_expires = now + s.error_ttl
            if h.robots_mode == "disallow_all" and h.robots_failures >= self.o.robots_max_attempts:
                h.deferred = True
        # When the copy expires the frontier leases robots.txt again (if the host still has
        # queued URLs). Progress does not announce that moment: the feeder finds it within its
        # idle poll (<= 1 s), as in the engine.
        h.robots_needed_since = h.robots_expires

    # -- the loop -----------------------------------------------------------------------------

    def next_step(self) -> int | None:
        """Index of the next tick at which something can change, or None when nothing will."""
        cands: list[float] = []
        if self.heap:
            cands.append(self.heap[0][0])
        if self.held:
            cands.append(self.stall_end)
        if self.feeder_wake is not None:
            cands.append(self.feeder_wake)
        if not cands:
            if self.feeder_finished:
                return None
            # The feeder waits for a worker, yet none is busy: cannot happen; look in 1 s.
            self.c["idle_polls"] += 1
            cands = [self.now + 1.0]
        target = min(cands)
        k = math.ceil((target - self.t0) / self.o.tick - 1e-9)
        return max(self.step_i + 1, k)

    def others_remaining(self) -> int:
        """Queued and leased URLs of every host but the hot one (contract: progress)."""
        prog = self.frontier.progress(self.now)
        n = prog.queued + prog.leased
        if self.hot is not None and (row := self.frontier.host_row(self.hot.key)) is not None:
            n -= row["queued"] + row["in_flight"]
        return n

    def run(self) -> str:
        o = self.o
        last_check = -math.inf
        next_progress = o.progress_every
        stall_after = math.ceil(o.stall_after_done * sum(len(h.paths) for h in self.hosts))
        while True:
            if (
                self.stall_start == math.inf
                and o.stall_seconds > 0
                and self.c["pages_done"] >= max(1, stall_after)
            ):
                self._start_stall(self.now)
            in_stall = self.stall_start <= self.now < self.stall_end
            if in_stall and self.bp["free_at_start"] is None:
                self.bp["free_at_start"] = o.concurrency - self.outstanding
            self.deliver_phase()
            self.lease_phase()
            if in_stall:
                self.bp["max_outstanding"] = max(self.bp["max_outstanding"], self.outstanding)
                if self.outstanding >= o.concurrency and self.held:
                    self.bp["saturated"] = True
            elapsed = self.now - self.t0
            if o.progress_every and elapsed >= next_progress:
                next_progress += o.progress_every
                self.log(
                    f"virtual {elapsed:8.1f} s  grants {self.c['grants']:,}  pages done "
                    f"{self.c['pages_done']:,}  outstanding {self.outstanding}"
                )
            if self.pending_other == 0 and not self.held and self.now - last_check >= 1.0:
                last_check = self.now
                if self.others_remaining() == 0:
                    return "finished"
            step = self.next_step()
            if step is None:
                return "finished"
            self.step_i = step
            self.now = self.t0 + step * o.tick
            if self.now - self.t0 > o.max_virtual_seconds:
                self.now = self.t0 + o.max_virtual_seconds
                return "virtual time limit"

    # -- checks -------------------------------------------------------------------------------

    def request_log_check(self) -> dict[str, Any]:
        allow = {
            h.key: politeness_check.Allowance(h.concurrency, h.min_gap)
            for h in self.by_key.values()
        }
        prefixes = {h.key: list(h.disallow) for h in self.by_key.values() if h.disallow}
        forbidden = {
            h.key for h in self.by_key.values() if h.robots_kind in ("500", "neterr", "blocked")
        }
        violations = politeness_check.check_log(
            self.request_log,
            allow,
            disallowed_prefixes=prefixes,
            only_robots_hosts=forbidden,
            tolerance=1e-6,
        )
        # Retry-After: no request to the host may start before the server's wait is over.
        starts: dict[str, list[float]] = {}
        for e in self.request_log:
            starts.setdefault(e["host"], []).append(e["start"])
        early = 0
        for key, end, after in self.retry_after_marks:
            early += sum(1 for s in starts.get(key, ()) if end < s < end + after - 1e-6)
        return {
            "entries": len(self.request_log),
            "violations": len(violations),
            "by_kind": dict(Counter(v.kind for v in violations)),
            "examples": [f"{v.host} {v.kind}: {v.detail}" for v in violations[:5]],
            "retry_after_marks": len(self.retry_after_marks),
            "retry_after_violations": early,
        }

    def events_check(self) -> dict[str, Any]:
        """Events read back through the contract's streams, one per (URL, version)."""
        per_version = Counter((e["url_id"], e["url_version"]) for e in self.frontier.iter_events())
        done = sum(
            1 for u in self.frontier.iter_urls() if u["state"] == DONE and u["kind"] == PAGE
        )
        return {
            "events": sum(per_version.values()),
            "duplicate_events": sum(1 for n in per_version.values() if n > 1),
            "accepted_page_completions": self.c["pages_done"],
            "done_page_versions": done,
            "duplicates_sent": self.c["duplicate"],
            "duplicates_rejected": self.c["duplicates_rejected"],
            "duplicates_accepted": self.c["duplicates_accepted"],
        }

    def private_check(self) -> int:
        """Every /private URL of a disallow host must end ``disallowed`` (never fetched)."""
        keys = {h.key for h in self.hosts if h.disallow and not h.deferred}
        return sum(
            1
            for u in self.frontier.iter_urls()
            if "/private/" in u["url"]
            and u["state"] != DISALLOWED
            and u["url"].split("/private/", 1)[0] in keys
        )

    def report(self, stop: str, wall: dict[str, float]) -> SimReport:
        t = time.perf_counter()
        o, c = self.o, self.c
        finished = stop == "finished"
        audit = self.frontier.lease_audit()
        audit.pop("violations_by_host", None)
        rl = self.request_log_check()
        ev = self.events_check()
        private_bad = self.private_check() if o.frontier_robots else -1
        unfinished = self.others_remaining()
        stats = self.frontier.stats()
        eligibility: dict[str, dict[str, Any]] = {}
        others: list[float] = []
        for cls, lags in self.lags.items():
            if cls != HOT:
                others.extend(lags)
            if lags:
                eligibility[cls] = _lag_stats(lags)
        eligibility["others"] = _lag_stats(others)
        bp = dict(self.bp)
        free0 = bp["free_at_start"] or 0
        stalled = self.stall_start != math.inf
        # Engaged: pages were held, and every grant during the stall went to a worker that was
        # free (at the start, or freed by a failure, robots.txt answer or fault), none to one
        # blocked in the parser queue. Whether every free worker also got a lease is the
        # scheduler's business (shown as "all workers busy"), not back-pressure's.
        bp_ok = o.stall_seconds <= 0 or (
            stalled
            and bp["held_peak"] > 0
            and bp["max_outstanding"] <= o.concurrency
            and bp["grants"] <= free0 + bp["freed"]
        )
        window = "never started"
        if stalled:
            window = f"[{self.stall_start - self.t0:.2f}, {self.stall_end - self.t0:.2f}) s"
        bp.update(
            window=window,
            concurrency=o.concurrency,
            free_at_start=free0,
        )
        scheduler = {
            "double_leases": c["double_leases"],
            "over_limit": c["over_limit"],
            "in_flight_mismatches": c["in_flight_mismatches"],
            "early_grants": c["early_grants"],
            "lease_expiries": c["lease_expiries"],
            "feeder_steps": c["feeder_steps"],
            "feeder_idle": c["feeder_idle"],
            "feeder_linger": c["feeder_linger"],
            "idle_polls": c["idle_polls"],
            "steps": self.step_i,
            "unfinished_urls": int(unfinished),
        }
        checks = {
            "finished": finished and unfinished == 0,
            "audit_violations": audit["violations"] == 0,
            "request_log_violations": rl["violations"] == 0,
            "retry_after_respected": rl["retry_after_violations"] == 0,
            "disallowed_leases": c["disallowed_leases"] == 0,
            "private_urls_disallowed": private_bad == 0,
            "duplicate_events": ev["duplicate_events"] == 0
            and ev["events"] == ev["accepted_page_completions"] == ev["done_page_versions"],
            "duplicate_completions_rejected": ev["duplicates_accepted"] == 0
            and ev["duplicates_rejected"] == ev["duplicates_sent"],
            "backpressure": bool(bp_ok),
            "no_double_lease": c["double_leases"] == 0,
            "lease_limit_respected": c["over_limit"] == 0,
            "in_flight_consistent": c["in_flight_mismatches"] == 0,
            "no_early_grants": c["early_grants"] == 0,
        }
        wall = dict(wall, checks=time.perf_counter() - t)
        wall["total"] = wall["setup"] + wall["run"] + wall["checks"]
        opts = asdict(o)
        opts.pop("db_path", None)
        return SimReport(
            options=opts,
            hosts=len(self.hosts),
            page_urls=sum(len(h.paths) for h in self.hosts),
            hot_host_urls=o.hot_host_urls,
            grants={
                "total": c["grants"],
                "page": c["grants_page"],
                "robots": c["grants_robots"],
                "hot": c["grants_hot"],
            },
            outcomes={
                "pages_done": c["pages_done"],
                "robots_done": c["robots_done"],
                "failures": c["failures"],
                "final_failures": c["final_failures"],
                "rejected_stale": c["rejected_stale"],
            },
            faults={
                "crash": c["crash"],
                "lost": c["lost"],
                "duplicate": c["duplicate"],
                "http_429": c["http_429"],
                "http_503": c["http_503"],
                "robots_refetches": c["robots_refetches"],
            },
            virtual_seconds=round(self.now - self.t0, 6),
            stop_reason=stop,
            finished=finished,
            audit=audit,
            request_log=rl,
            disallowed={
                "leases": c["disallowed_leases"],
                "by_reason": dict(self.disallowed_by_reason),
                "examples": self.disallowed_examples,
                "private_not_disallowed": private_bad,
            },
            events=ev,
            backpressure=bp,
            scheduler=scheduler,
            eligibility=eligibility,
            frontier={"urls_by_state": stats.urls_by_state, "counters": stats.counters},
            checks=checks,
            wall={k: round(v, 3) for k, v in wall.items()},
        )

    def close(self) -> None:
        self.frontier.close()


def _lag_stats(lags: list[float]) -> dict[str, Any]:
    s = sorted(lags)
    return {
        "grants": len(s),
        "p50": _r(_pct(s, 0.5)),
        "p99": _r(_pct(s, 0.99)),
        "max": _r(s[-1] if s else None),
    }


def run_sim(opts: SimOptions, log: Callable[[str], None] = _quiet) -> SimReport:
    """Run one simulated crawl against a fresh frontier of ``opts.backend`` and check it."""
    with ExitStack() as stack:
        path = opts.db_path
        if opts.backend == "sqlite" and path is None:
            tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="idemcrawl-sim-"))
            path = str(Path(tmp) / "sim.db")
        elif path is not None and Path(path).exists():
            raise ValueError(f"{path!r} exists; the simulation needs a fresh database")
        t = time.perf_counter()
        frontier = open_backend(opts, path)
        sim = _Sim(opts, log, frontier)
        stack.callback(sim.close)
        sim.setup()
        setup = time.perf_counter() - t
        log(f"set up {len(sim.hosts):,} hosts in {setup:.1f} s")
        t = time.perf_counter()
        stop = sim.run()
        run = time.perf_counter() - t
        log(f"ran {sim.now - sim.t0:,.1f} virtual s in {run:.1f} s ({stop})")
        return sim.report(stop, {"setup": setup, "run": run})


class HotHostComparison(NamedTuple):
    """The same seed with and without the hot host (unpacks as ``(with_hot, without_hot)``)."""

    with_hot: SimReport
    without_hot: SimReport

    @property
    def tolerance(self) -> float:
        """Largest acceptable ratio of the other hosts' p99 eligibility delay."""
        return HOT_HOST_TOLERANCE

    @property
    def ratio(self) -> float | None:
        a, b = self.with_hot.others_p99(), self.without_hot.others_p99()
        if a is None or b is None:
            return None
        # A p99 of zero on both sides is equality; one tick of slack avoids dividing by zero.
        tick = self.with_hot.options["tick"]
        return (a + tick) / (b + tick)

    @property
    def ok(self) -> bool:
        r = self.ratio
        return self.with_hot.ok and self.without_hot.ok and r is not None and r <= self.tolerance

    def text(self) -> str:
        r = self.ratio
        a, b = self.with_hot, self.without_hot
        return "\n".join(
            [
                "=== with the hot host ===",
                a.text(),
                "",
                "=== without the hot host ===",
                b.text(),
                "",
                f"other hosts' p99 eligibility delay: {a.others_p99()} s with the hot host, "
                f"{b.others_p99()} s without; ratio {'-' if r is None else f'{r:.3f}'} "
                f"(must be <= {self.tolerance:.2f})",
                f"hot-host comparison: {'PASS' if self.ok else 'FAIL'}",
            ]
        )


def compare_hot_host(opts: SimOptions, log: Callable[[str], None] = _quiet) -> HotHostComparison:
    """Run ``opts`` (which should have ``hot_host_urls``) and the same seed without the hot
    host: a scheduler with host-level fairness keeps the other hosts' delays unchanged."""
    if opts.hot_host_urls <= 0:
        raise ValueError("compare_hot_host needs hot_host_urls > 0")
    log("run 1/2: with the hot host")
    with_hot = run_sim(opts, log)
    log("run 2/2: without the hot host")
    base = SimOptions(**{**asdict(opts), "hot_host_urls": 0})
    without = run_sim(base, log)
    return HotHostComparison(with_hot, without)


# -- command line ----------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    d = SimOptions()
    p = argparse.ArgumentParser(
        prog="idemcrawl sim",
        description="Deterministic virtual-clock simulation of the engine's lease feeder and a "
        "real frontier backend; checks politeness, robots.txt, exactly-once events and "
        "back-pressure.",
    )
    p.add_argument("--hosts", type=int, default=d.hosts)
    p.add_argument("--urls-per-host", type=int, default=d.urls_per_host)
    p.add_argument("--hot-host-urls", type=int, default=d.hot_host_urls)
    p.add_argument("--concurrency", type=int, default=d.concurrency)
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument(
        "--backend",
        default=d.backend,
        help="frontier backend: memory, sqlite, or postgresql://…?schema=NEW (default %(default)s)",
    )
    p.add_argument("--max-virtual-seconds", type=float, default=d.max_virtual_seconds)
    p.add_argument("--tick", type=float, default=d.tick)
    p.add_argument("--no-faults", action="store_true", help="no crashes, losses, duplicates")
    p.add_argument(
        "--compare-hot-host",
        action="store_true",
        help="also run without the hot host and compare the other hosts' p99 delay",
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--quiet", action="store_true")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """``idemcrawl sim``: exit status 0 when every check passes, 1 otherwise."""
    ns = _parser().parse_args(argv)
    opts = SimOptions(
        hosts=ns.hosts,
        urls_per_host=ns.urls_per_host,
        hot_host_urls=ns.hot_host_urls,
        concurrency=ns.concurrency,
        seed=ns.seed,
        backend=ns.backend,
        max_virtual_seconds=ns.max_virtual_seconds,
        tick=ns.tick,
    )
    if ns.no_faults:
        opts.p_crash = opts.p_lost = opts.p_duplicate = 0.0

    def log(msg: str) -> None:
        if not ns.quiet:
            print(msg, file=sys.stderr, flush=True)

    if ns.compare_hot_host:
        cmp = compare_hot_host(opts, log)
        if ns.json:
            print(
                json.dumps(
                    {
                        "with_hot": cmp.with_hot.as_dict(),
                        "without_hot": cmp.without_hot.as_dict(),
                        "ratio": cmp.ratio,
                        "ok": cmp.ok,
                    },
                    indent=2,
                )
            )
        else:
            print(cmp.text())
        return 0 if cmp.ok else 1
    report = run_sim(opts, log)
    print(json.dumps(report.as_dict(), indent=2) if ns.json else report.text())
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
