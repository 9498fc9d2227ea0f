"""What one crawl process reports when it ends, and what a processed URL turns into."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..failures import EXIT_FAILED_URLS
from ..frontier.base import Completion, Failure

#: What the pipeline hands the committer for one lease.
Outcome = Completion | Failure


@dataclass
class CrawlSummary:
    fetched: int = 0
    committed: int = 0
    #: Of ``committed``: the completions (URLs done), the rest being failures and retries.
    completed: int = 0
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
    #: What the run leaves (without --recrawl): URLs still queued, leased by other processes,
    #: deferred; and the hosts that wait, why and until when (``waiting.Waiting.as_dict``).
    left: dict[str, int] = field(default_factory=dict)
    waiting: list[dict[str, Any]] = field(default_factory=list)
    #: URLs of the whole crawl (every run and process, not only this run's ``failed``) that
    #: failed for good, and the top reasons (``Frontier.failure_reasons``): read at the end
    #: of a run without ``--recrawl``, with ``left``.
    failed_urls: int = 0
    failures: list[dict[str, Any]] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        """Finished with nothing left anywhere: the crawl is done, not just this run."""
        return self.finished and not any(self.left.values())

    def exit_status(self) -> int:
        """``crawl``'s exit status (``failures.CRAWL_EXIT_STATUSES``): 0 complete, every URL
        done; 4 complete, but URLs of the crawl failed for good (counted over the whole crawl,
        so a crawl killed and resumed ends as one run in one go would); 3 stopped with work
        left (the horizon, ``--max-pages``, deferred URLs); 1 the crawl had to stop (archive
        failure); 130 / 143 stopped by SIGINT / SIGTERM (what a shell reports for a process
        those signals end). 2, bad usage, is the command line's."""
        if self.fatal:
            return 1
        if self.stopped_by in SIGNAL_STATUS:
            return SIGNAL_STATUS[self.stopped_by]
        if not self.complete:
            return 3
        return EXIT_FAILED_URLS if self.failed_urls else 0

    def scope_lines(self, scope: str) -> list[str]:
        """Links this run left out of the crawl's scope, and how to follow them: a crawl
        from one seed of a site that links to other hosts must not end quietly with a
        fraction of what the user meant (issue 36)."""
        n = self.links_rejected.get("out_of_scope", 0)
        if not n:
            return []
        if scope == "any":  # only a spider's allowed_domains leave links out then
            return [f"links out of scope: {n} not followed (outside the spider's allowed_domains)"]
        kept = {"host": "the seeds' hosts", "domain": "the seeds' sites"}.get(scope, scope)
        wider = "--scope domain or --scope any" if scope == "host" else "--scope any"
        return [
            f"links out of scope: {n} not followed (--scope {scope} keeps to {kept}); "
            f"{wider} follows links to other hosts"
        ]

    def count_error(self, kind: str) -> None:
        self.errors[kind] = self.errors.get(kind, 0) + 1


#: Exit statuses of a crawl stopped by a signal: 128 + the signal number, as shells report.
SIGNAL_STATUS = {"SIGINT": 130, "SIGTERM": 143}
