"""Failures a user can see: where a spider's exception rose, and a crawl's failed URLs by reason.

A crawl whose callbacks fail must say so where its user looks: the end of ``crawl``, ``status``
and ``parse``, not only a count. :func:`trace_tail` cuts a traceback to the few frames that
locate the bug, the spider author's own code first (a parser process computes it; the
frontier keeps it with the URL's final failure); :func:`failure_lines` turns the frontier's
``failure_reasons`` into text. ``crawl``'s exit statuses are here too, so the command line and
the summary that computes them say the same.
"""

from __future__ import annotations

import os
import sysconfig
import traceback
from collections.abc import Mapping, Sequence
from types import FrameType, TracebackType
from typing import Any

#: Frames kept of a traceback for the crawl database (the innermost ones).
TRACE_FRAMES = 4
#: Characters kept of one source line, and of a whole traceback tail.
LINE_CHARS = 200
TRACE_CHARS = 2000
#: Reasons the end of ``crawl`` and ``status`` show (most URLs first).
REASONS_SHOWN = 5

#: ``crawl``'s exit status when it finished but some URLs failed for good.
EXIT_FAILED_URLS = 4
#: ``crawl``'s exit statuses (``CrawlSummary.exit_status``), for ``crawl --help``.
CRAWL_EXIT_STATUSES = (
    "Exit status: 0 finished, every URL done; 4 finished, but some URLs failed for good (the "
    "top reasons are printed; 'status' lists them too); 3 stopped with work left (the "
    "horizon, --max-pages, deferred URLs): run it again to go on; 1 the crawl had to stop "
    "(the archive failed): run it again to resume; 2 bad usage or settings, nothing crawled; "
    "130 / 143 stopped by SIGINT / SIGTERM."
)

_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep
#: Where code that is not the spider author's lives: idemcrawl, the standard library,
#: installed packages.
_LIBRARY = tuple(
    {_PACKAGE}
    | {
        os.path.abspath(p) + os.sep
        for name in ("stdlib", "platstdlib", "purelib", "platlib")
        if (p := sysconfig.get_paths().get(name))
    }
)


def _is_library(filename: str) -> bool:
    return filename.startswith("<") or os.path.abspath(filename).startswith(_LIBRARY)


def _shown_path(filename: str) -> str:
    """A path under the working directory relative to it (what the user typed), else as is."""
    if filename.startswith("<"):
        return filename
    try:
        rel = os.path.relpath(filename)
    except ValueError:  # another drive (Windows)
        return filename
    return filename if rel.startswith(os.pardir) else rel


def _format(frames: Sequence[traceback.FrameSummary], gap_after: int | None = None) -> str:
    lines = []
    for i, f in enumerate(frames):
        lines.append(f'File "{_shown_path(f.filename)}", line {f.lineno}, in {f.name}')
        if f.line:
            lines.append("  " + f.line.strip()[:LINE_CHARS])
        if i == gap_after:
            lines.append("…")
    return "\n".join(lines)[:TRACE_CHARS]


def trace_tail(tb: TracebackType | None, frames: int | None = TRACE_FRAMES) -> str | None:
    """The innermost ``frames`` frames of ``tb`` (every frame with None), each as ``File "…",
    line N, in name`` and its source line. When none of them is the spider author's (the
    exception rose inside a library the spider called), the author's innermost frame comes
    first, then "…": that is the line to fix. None when ``tb`` has no frame."""
    summary = traceback.extract_tb(tb)
    if not summary:
        return None
    if frames is None or len(summary) <= frames:
        return _format(summary)
    shown = summary[-frames:]
    if all(_is_library(f.filename) for f in shown):
        own = [f for f in summary[:-frames] if not _is_library(f.filename)]
        if own:
            return _format([own[-1], *summary[-(frames - 1) :]], gap_after=0)
    return _format(shown)


def frame_line(frame: FrameType) -> str:
    """Where a frame is now (a suspended generator: the ``yield`` it stopped at)."""
    return _format(traceback.extract_stack(frame, limit=1))


def spider_trace(
    exc: BaseException, produced: object, frames: int | None = TRACE_FRAMES
) -> str | None:
    """The traceback tail of an exception caught by the parser around a spider callback.

    The parser's own frame (where it was caught) is left out. An exception that did not rise
    in the author's code — a yielded ``dict``, a record that does not fit ``record_schema``,
    raised by the parser about an item — points at the ``yield`` that produced the item,
    when the callback is a generator stopped there."""
    tb = exc.__traceback__
    inner = tb.tb_next if tb is not None else None
    summary = traceback.extract_tb(inner)
    if not any(not _is_library(f.filename) for f in summary):
        frame = getattr(produced, "gi_frame", None)
        if frame is not None and not getattr(produced, "gi_running", False):
            return frame_line(frame)
    return trace_tail(inner, frames)


def failure_lines(
    failed: int, reasons: Sequence[Mapping[str, Any]], shown: int = REASONS_SHOWN
) -> list[str]:
    """A crawl's failed URLs for a person: how many, then per reason (``failure_reasons``
    rows, most URLs first) the count, the first URL that failed for it and where a spider's
    exception rose. Nothing when no URL failed."""
    if not failed:
        return []
    lines = [f"failed URLs      {failed} (failed for good; by reason, most URLs first):"]
    for r in reasons[:shown]:
        lines.append(f"  {r['urls']:>7}  {r['reason']}")
        lines.append(f"           first: {r['url']}")
        if r.get("trace"):
            lines += ["             " + line for line in str(r["trace"]).splitlines()]
    rest = failed - sum(int(r["urls"]) for r in reasons[:shown])
    if rest > 0:
        lines.append(f"  {rest:>7}  for other reasons (status --json lists more reasons)")
    return lines
