"""The engine: one crawl process as a pipeline of small parts (lease → fetch → parse → commit).

Structure (each arrow is bounded, so a slow stage slows the one before it)::

    feeder ──leases──▶ workers (``concurrency`` tasks) ──▶ parser processes ──▶ committer
       ▲                     fetch, bounded body          ``parse_slots``        group commit
       └──────────── wake-ups after each commit / idle worker ◀────────────────────┘

The parts, one job each:

* ``startup``   — the reconciliation before leasing (dead owners, seeds, in-memory indexes);
* ``feeder``    — how many URLs to lease and when; a synchronous core the simulator drives too;
* ``pipeline``  — one lease's way: fetch, retry policy, 304, download, parse, redirect, archive,
  discovery gate, near-duplicates → a Completion or a Failure;
* ``parsing``   — parser processes behind a bounded queue (or inline);
* ``archiver``  — WARC records on their own thread, body dedup, archive failure → clean stop;
* ``gate``/``neardup`` — the discovery gate's and the SimHash index's life in the process;
* ``committer`` — group commit: a batch is what arrived while the previous transaction ran;
* ``reporter``  — progress snapshots and the live metric gauges;
* ``engine``    — owns the resources and the TaskGroup and wires the parts; ``runner`` runs it
  from synchronous code with signal handling.

The frontier, the fetcher and the clock are injected (``clock``, ``calls``), so each part can be
tested without sockets or sleeps.
"""

from __future__ import annotations

from .archiver import RECENT_BODIES, Archived, ArchiveFailed, Archiver
from .calls import Call, inline, on_thread
from .clock import Clock, SystemClock, WallClock
from .committer import Committer
from .engine import Engine, fetch_settings, warc_prefix
from .feeder import (
    AHEAD_RETRY,
    COALESCE_SECONDS,
    Action,
    Feeder,
    FeederCore,
    Step,
    idle_timeout,
)
from .pipeline import (
    MAX_ROBOTS_REDIRECTS,
    PageFetcher,
    Pipeline,
    RetryPolicy,
    conditional_headers,
    download_suffix,
)
from .runner import loop_factory, run_crawl
from .summary import CrawlSummary, Outcome

__all__ = [
    "AHEAD_RETRY",
    "COALESCE_SECONDS",
    "MAX_ROBOTS_REDIRECTS",
    "RECENT_BODIES",
    "Action",
    "ArchiveFailed",
    "Archived",
    "Archiver",
    "Call",
    "Clock",
    "Committer",
    "CrawlSummary",
    "Engine",
    "Feeder",
    "FeederCore",
    "Outcome",
    "PageFetcher",
    "Pipeline",
    "RetryPolicy",
    "Step",
    "SystemClock",
    "WallClock",
    "conditional_headers",
    "download_suffix",
    "fetch_settings",
    "idle_timeout",
    "inline",
    "loop_factory",
    "on_thread",
    "run_crawl",
    "warc_prefix",
]
