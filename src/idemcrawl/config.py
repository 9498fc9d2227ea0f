"""Every crawl setting in one place, with its default and why (cf. Scrapy's default_settings)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from .fetch import IPNetwork


def default_parse_workers() -> int:
    """One parser process per spare core: the main process keeps one core for I/O and SQL."""
    return max(1, (os.cpu_count() or 2) - 1)


@dataclass(frozen=True)
class CrawlConfig:
    db: str
    seeds: tuple[str, ...] = ()
    spider: str | None = None
    #: Requests in flight across all hosts (one asyncio task each).
    concurrency: int = 16
    #: Politeness defaults (R6): one request in flight per host, one second between starts.
    host_concurrency: int = 1
    delay: float = 1.0
    #: A lease must outlive a whole fetch + parse; expiry is only for crashed owners.
    lease_seconds: float = 120.0
    #: host: same host_key as a seed; domain: same registrable-ish domain; any: everything.
    scope: str = "host"
    allow_private: tuple[IPNetwork, ...] = ()
    #: Stop leasing after this many fetches in this run (None: crawl to the end).
    max_pages: int | None = None
    #: Parser processes; 0 parses in the main process (tests, tiny crawls).
    parse_workers: int = field(default_factory=default_parse_workers)
    #: Group commit bounds (R5): at most this many completions per transaction …
    commit_batch: int = 64
    #: … and a batch lingers at most this long for more completions before it commits. The
    #: default 0 commits as soon as the previous commit ends (batches form while it runs), which
    #: keeps the work a kill can lose to what is in flight.
    commit_seconds: float = 0.0
    #: Transient errors (timeouts, 5xx, 429) are retried this many times before failing the URL.
    max_retries: int = 3
    retry_base: float = 2.0
    retry_cap: float = 600.0
    user_agent: str = "idemcrawl/0.1"
    connect_timeout: float = 10.0
    read_timeout: float = 20.0
    total_timeout: float = 60.0
    max_bytes: int = 10 * 1024 * 1024
    #: How long a parse may take before the URL is failed and the parser process replaced.
    parse_timeout: float = 60.0

    def validate(self) -> None:
        problems = []
        if self.concurrency < 1:
            problems.append("--concurrency must be >= 1")
        if self.host_concurrency < 1:
            problems.append("--host-concurrency must be >= 1")
        if self.delay < 0:
            problems.append("--delay must be >= 0")
        if self.lease_seconds <= 0:
            problems.append("--lease-seconds must be > 0")
        if self.scope not in ("host", "domain", "any"):
            problems.append("--scope must be host, domain or any")
        if self.max_pages is not None and self.max_pages < 1:
            problems.append("--max-pages must be >= 1")
        if self.parse_workers < 0:
            problems.append("--parse-workers must be >= 0")
        if not 1 <= self.commit_batch <= 10_000:
            problems.append("--commit-batch must be between 1 and 10000")
        if not 0 <= self.commit_seconds <= 1.0:
            problems.append("--commit-seconds must be between 0 and 1")
        if problems:
            raise ValueError("; ".join(problems))
