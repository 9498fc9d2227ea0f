"""Parse archived bodies again, without the network (R19): ``idemcrawl reparse``.

Fetching and parsing are separate steps with the WARC store between them, so a spider bug (or a
parser crash) costs a re-parse, not a re-crawl. Reparse walks the URLs that have an archived
response, reads each body back from its WARC record (the payload digest is checked), runs the
spider on it and writes records and links through the frontier in batches, in one transaction
per batch. Records are upserts on their derived ids (R1), links insert-if-absent (R10), so
running it twice changes nothing the second time. It makes no request to any site: only the
store and the database are read.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from .frontier import open_frontier
from .frontier.base import Reparsed, request_url
from .parse import ParseJob, Parser
from .traps import TrapLimits
from .warc import WarcError, WarcPointer, read_response


@dataclass
class ReparseSummary:
    pages: int = 0
    records: int = 0
    failed: int = 0
    missing: int = 0
    links: int = 0
    seconds: float = 0.0
    errors: dict[str, int] = field(default_factory=dict)


def default_warc_dir(db: str) -> str:
    return "idemcrawl-warc" if "://" in db else db + ".warc"


def reparse(
    db: str,
    *,
    spider: str | None = None,
    where_failed: bool = False,
    warc_dir: str | None = None,
    scope: str = "host",
    limits: TrapLimits | None = None,
    batch: int = 200,
    progress: Callable[[ReparseSummary], None] | None = None,
) -> ReparseSummary:
    """Re-parse every archived page (or only those whose parse failed) into the database."""
    f = open_frontier(db, create=False)  # a crawl it cannot use is said before the WARC store
    try:
        directory = warc_dir or default_warc_dir(db)
        if not os.path.isdir(directory):
            raise FileNotFoundError(f"no WARC store at {directory!r} (use --warc-dir)")
        summary = ReparseSummary()
        t0 = time.monotonic()
        parser = Parser(spider, f.seed_hosts(), scope, limits or TrapLimits())
        after = 0
        while True:
            rows = f.reparse_candidates(where_failed, after, batch)
            if not rows:
                break
            after = rows[-1]["url_id"]
            done: list[Reparsed] = []
            for row in rows:
                item = _reparse_one(parser, directory, row, summary)
                if item is not None:
                    done.append(item)
            summary.records += f.apply_reparse(done, time.time())
            if progress is not None:
                progress(summary)
    finally:
        f.close()
    summary.seconds = time.monotonic() - t0
    return summary


def _reparse_one(
    parser: Parser, directory: str, row: dict, summary: ReparseSummary
) -> Reparsed | None:
    ptr = WarcPointer(
        row["warc_file"], int(row["warc_offset"]), int(row["warc_length"]), row["payload_digest"]
    )
    try:
        status, headers, body = read_response(directory, ptr)
    except (OSError, WarcError) as exc:
        summary.missing += 1
        kind = type(exc).__name__
        summary.errors[kind] = summary.errors.get(kind, 0) + 1
        return None
    hdrs = {k.lower(): v for k, v in headers}
    job = ParseJob(
        request_url(row["url"]), status, hdrs, body, int(row["depth"] or 0), row["kind"],
        row.get("request"),
    )  # fmt: skip
    result = parser.run(job)
    summary.pages += 1
    if result.error:
        summary.failed += 1
        summary.errors["parse"] = summary.errors.get("parse", 0) + 1
        return Reparsed(row["url_id"], row["url"], error=result.error, trace=result.trace)
    summary.links += len(result.links)
    return Reparsed(row["url_id"], row["url"], result.records, list(result.links))
