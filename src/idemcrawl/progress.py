"""Live progress for long commands: a rich table on a terminal, JSON lines for machines.

An operator watching a crawl wants a screen that redraws in place; a log collector or a script
wants one self-describing line at a steady, low rate. The same ``update(snapshot)`` call serves
both, so the engine and the long commands (reparse, export, bench, chaos) never care where their
output goes. Progress output must never stop the work it describes: a closed or broken stream
turns the display off instead of raising into the crawl.
"""

from __future__ import annotations

import contextlib
import json
import math
import sys
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any, Literal, TextIO, TypedDict

from rich.console import Console
from rich.live import Live
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table
from rich.text import Text

__all__ = [
    "MODES",
    "Mode",
    "ProgressDisplay",
    "RateMeter",
    "Snapshot",
    "TaskProgress",
    "task_progress",
]

Mode = Literal["auto", "tty", "json", "quiet"]
MODES: tuple[str, ...] = ("auto", "tty", "json", "quiet")

#: JSON lines come at most this often: enough to follow a crawl, few enough to keep in a log.
JSON_INTERVAL_S = 2.0


class Snapshot(TypedDict, total=False):
    """What the crawl display shows. Every key is optional; unknown keys are shown as well."""

    elapsed_s: float
    pages_per_s: float
    bytes_per_s: float
    urls: dict[str, int]  # URLs by state (frontier: all processes)
    hosts_ready: int
    hosts_backoff: int
    in_flight: int
    parser_backlog: int
    records: int
    requests_per_record: float | None
    errors: dict[str, int]  # errors by class, e.g. {"http_500": 3, "timeout": 1}
    waiting: list[str]  # hosts the crawl waits for, why and until when (when nothing runs)


def _resolve_mode(mode: str, stream: TextIO) -> str:
    if mode not in MODES:
        raise ValueError(f"progress mode must be one of {', '.join(MODES)}, not {mode!r}")
    if mode != "auto":
        return mode
    try:
        return "tty" if stream.isatty() else "json"
    except (AttributeError, ValueError, OSError):  # closed or exotic stream: be machine-friendly
        return "json"


def _clean(value: Any) -> Any:
    """JSON-safe and short: floats rounded, NaN/inf as null (strict JSON has neither)."""
    if isinstance(value, float):
        return round(value, 3) if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


def human_bytes(n: float | None) -> str:
    """1536 -> '1.5 KiB': byte rates are read at a glance, not digit by digit."""
    if n is None or not math.isfinite(n):
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"  # pragma: no cover - loop always returns


def _number(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.1f}" if math.isfinite(v) else "-"
    return str(v)


def _pairs(d: Mapping[str, Any], *, skip_zero: bool = True) -> str:
    items = [f"{k} {_number(v)}" for k, v in d.items() if not (skip_zero and v == 0)]
    return ", ".join(items) or "none"


_LABELS: dict[str, str] = {
    "elapsed_s": "elapsed",
    "pages_per_s": "pages/s",
    "bytes_per_s": "bytes/s",
    "urls": "URLs",
    "hosts_ready": "hosts ready",
    "hosts_backoff": "hosts in back-off",
    "in_flight": "in flight",
    "parser_backlog": "parser backlog",
    "records": "records stored",
    "requests_per_record": "requests/record",
    "errors": "errors",
    "waiting": "waiting for",
}


def render_table(snapshot: Mapping[str, Any]) -> Table:
    """The crawl snapshot as a two-column table (label, value), known keys first."""
    table = Table(title="idemcrawl", show_header=False, box=None, pad_edge=False)
    table.add_column("what", style="bold")
    table.add_column("value")
    for key, label in _LABELS.items():
        if key not in snapshot:
            continue
        v = snapshot[key]
        if key == "elapsed_s":
            text = f"{_number(v)} s"
        elif key == "bytes_per_s":
            text = human_bytes(v) + "/s"
        elif key in ("urls", "errors"):
            text = _pairs(v)
        elif key == "waiting":
            text = "\n".join(v)
        else:
            text = _number(v)
        table.add_row(label, text)
    for key, v in snapshot.items():
        if key not in _LABELS:
            table.add_row(key, _pairs(v) if isinstance(v, Mapping) else _number(v))
    return table


class _Sink:
    """Writes lines to a stream until the stream fails, then goes quiet."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.broken = False

    def line(self, obj: Mapping[str, Any]) -> None:
        if self.broken:
            return
        try:
            self.stream.write(json.dumps(_clean(obj), sort_keys=True, allow_nan=False) + "\n")
            self.stream.flush()
        except (OSError, ValueError):  # closed pipe or closed file: never stop the work
            self.broken = True


class ProgressDisplay:
    """The crawl's live progress: ``update`` often, ``close`` once.

    ``tty`` redraws a rich table in place; ``json`` writes ``{"type": "progress", ...}`` lines,
    at most one per ``min_interval`` seconds (the latest snapshot wins; ``close`` writes the
    last one held back, so the final state is always in the log); ``quiet`` writes nothing.
    ``auto`` picks ``tty`` when ``stream`` is a terminal and ``json`` otherwise.
    """

    def __init__(
        self,
        mode: Mode | str = "auto",
        stream: TextIO | None = None,
        *,
        min_interval: float = JSON_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
        console: Console | None = None,
    ) -> None:
        self.stream: TextIO = sys.stderr if stream is None else stream
        self.mode = _resolve_mode(mode, self.stream)
        self._min_interval = min_interval
        self._clock = clock
        self._sink = _Sink(self.stream)
        self._last_emit: float | None = None
        self._pending: dict[str, Any] | None = None
        self._closed = False
        self._live: Live | None = None
        self._console: Console | None = None
        if self.mode == "tty":
            self._console = console or Console(file=self.stream, force_terminal=True)
            # stdout is left alone: `crawl --json > out` must not get progress in its output.
            self._live = Live(
                console=self._console,
                auto_refresh=False,
                redirect_stdout=False,
                redirect_stderr=self.stream is sys.stderr,
            )

    def update(self, snapshot: Mapping[str, Any]) -> None:
        if self._closed or self.mode == "quiet":
            return
        if self._live is not None:
            try:
                if not self._live.is_started:
                    self._live.start()
                self._live.update(render_table(snapshot), refresh=True)
            except (OSError, ValueError):
                self._live = None
                self.mode = "quiet"
            return
        line = {"type": "progress", "time": time.time(), **snapshot}
        now = self._clock()
        if self._last_emit is None or now - self._last_emit >= self._min_interval:
            self._sink.line(line)
            self._last_emit = now
            self._pending = None
        else:
            self._pending = line

    def message(self, text: str) -> None:
        """A one-off event (resumed, leases reclaimed …) shown above the live table."""
        if self._closed or self.mode == "quiet":
            return
        if self._console is not None:
            try:
                self._console.print(text, markup=False, highlight=False)
            except (OSError, ValueError):
                self.mode = "quiet"
            return
        self._sink.line({"type": "message", "time": time.time(), "message": text})

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._pending is not None:
            self._sink.line(self._pending)
            self._pending = None
        if self._live is not None and self._live.is_started:
            with contextlib.suppress(OSError, ValueError):
                self._live.stop()

    def __enter__(self) -> ProgressDisplay:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class RateMeter:
    """Per-second rate of a growing total over a sliding window (pages/s, bytes/s).

    A window instead of the last two samples keeps the figure steady when completions arrive in
    group-commit bursts.
    """

    def __init__(self, window_s: float = 10.0) -> None:
        self.window_s = window_s
        self._samples: deque[tuple[float, float]] = deque()

    def add(self, total: float, now: float) -> float:
        """Record ``total`` at ``now`` and return the rate over the window (0 until 2 samples)."""
        self._samples.append((now, total))
        while len(self._samples) > 2 and now - self._samples[1][0] >= self.window_s:
            self._samples.popleft()
        t0, v0 = self._samples[0]
        return (total - v0) / (now - t0) if now > t0 else 0.0


class _RateColumn(ProgressColumn):
    """Items per second; rich's own speed column is for bytes."""

    def render(self, task: Task) -> Text:
        speed = task.finished_speed or task.speed
        return Text("-/s" if speed is None else f"{speed:.1f}/s")


class TaskProgress:
    """Progress of one bounded job (reparse, export, bench, chaos): a bar or JSON lines."""

    def __init__(
        self,
        total: int | None,
        description: str,
        *,
        mode: Mode | str = "auto",
        stream: TextIO | None = None,
        min_interval: float = JSON_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
        console: Console | None = None,
    ) -> None:
        self.stream: TextIO = sys.stderr if stream is None else stream
        self.mode = _resolve_mode(mode, self.stream)
        self.total = total
        self.description = description
        self.completed = 0
        self._clock = clock
        self._t0 = clock()
        self._min_interval = min_interval
        self._last_emit: float | None = None
        self._sink = _Sink(self.stream)
        self._closed = False
        self._bar: Progress | None = None
        self._task: TaskID | None = None
        if self.mode == "tty":
            self._bar = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                _RateColumn(),
                TimeElapsedColumn(),
                TimeRemainingColumn(),
                console=console or Console(file=self.stream, force_terminal=True),
                redirect_stdout=False,
                redirect_stderr=self.stream is sys.stderr,
            )
            self._task = self._bar.add_task(description, total=total)
            self._bar.start()

    def advance(self, n: int = 1) -> None:
        self.update(self.completed + n)

    def update(self, completed: int) -> None:
        if self._closed:
            return
        self.completed = completed
        if self._bar is not None and self._task is not None:
            try:
                self._bar.update(self._task, completed=completed)
            except (OSError, ValueError):
                self._bar = None
            return
        if self.mode != "json":
            return
        now = self._clock()
        if self._last_emit is None or now - self._last_emit >= self._min_interval:
            self._emit(now, final=False)

    def _emit(self, now: float, *, final: bool) -> None:
        elapsed = now - self._t0
        self._sink.line(
            {
                "type": "task",
                "task": self.description,
                "done": self.completed,
                "total": self.total,
                "elapsed_s": elapsed,
                "rate_per_s": self.completed / elapsed if elapsed > 0 else None,
                "final": final,
            }
        )
        self._last_emit = now

    def close(self, *, finished: bool = True) -> None:
        """End the display; a task that did not finish (it raised) leaves no ``final`` line,
        so its error is the last thing said (one line, as every command's error is)."""
        if self._closed:
            return
        self._closed = True
        if self._bar is not None:
            with contextlib.suppress(OSError, ValueError):
                self._bar.stop()
        elif self.mode == "json" and finished:
            self._emit(self._clock(), final=True)

    def __enter__(self) -> TaskProgress:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc_info: object) -> None:
        self.close(finished=exc_type is None)


def task_progress(
    total: int | None,
    description: str,
    *,
    mode: Mode | str = "auto",
    stream: TextIO | None = None,
) -> TaskProgress:
    """``with task_progress(n, "reparse") as p: ... p.advance()`` — a bar or JSON lines."""
    return TaskProgress(total, description, mode=mode, stream=stream)
