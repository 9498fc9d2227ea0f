"""What one crawl process reports when it ends, and what a processed URL turns into."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..frontier.base import Completion, Failure

#: What the pipeline hands the committer for one lease.
Outcome = Completion | Failure


@dataclass
class CrawlSummary:
    fetched: int = 0
    committed: int = 0
    rejected_completions: int = 0
    records: int = 0
    failed: int = 0
    links_rejected: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    finished: bool = False
    stopped_by: str = ""
    #: Why the crawl had to stop on its own (the archive failed, …); None when it did not.
    fatal: str | None = None
    commit_batches: int = 0
    commit_max_batch: int = 0
    commit_max_seconds: float = 0.0
    errors: dict[str, int] = field(default_factory=dict)
    bytes: int = 0
    revisits_started: int = 0
    warc_repaired_bytes: int = 0

    def count_error(self, kind: str) -> None:
        self.errors[kind] = self.errors.get(kind, 0) + 1
