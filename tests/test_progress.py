"""Progress display: JSON lines off a terminal, a rich table on one, silence when quiet."""

from __future__ import annotations

import io
import json
import math
from typing import Any

import pytest

from idemcrawl.progress import ProgressDisplay, RateMeter, TaskProgress, task_progress


class FakeClock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


class BrokenStream(io.StringIO):
    """A pipe whose reader went away."""

    def isatty(self) -> bool:
        return False

    def write(self, s: str) -> int:
        raise BrokenPipeError(32, "Broken pipe")


SNAP: dict[str, Any] = {
    "elapsed_s": 12.5,
    "pages_per_s": 12.25,
    "bytes_per_s": 1536.0,
    "urls": {"queued": 3, "leased": 2, "done": 40, "failed": 0},
    "hosts_ready": 4,
    "hosts_backoff": 1,
    "parser_backlog": 7,
    "records": 20,
    "requests_per_record": 2.0,
    "errors": {"http_500": 2, "timeout": 1},
}


def lines(out: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.getvalue().splitlines()]


def test_non_tty_writes_json_lines_at_most_every_2_s_and_the_last_on_close() -> None:
    out, clock = io.StringIO(), FakeClock()
    with ProgressDisplay("auto", out, clock=clock) as p:  # StringIO is not a TTY -> json
        assert p.mode == "json"
        p.update({**SNAP, "records": 1})
        clock.t += 1.0
        p.update({**SNAP, "records": 2})  # held back: < 2 s since the last line
        clock.t += 1.5
        p.update({**SNAP, "records": 3})  # 2.5 s: written
        clock.t += 0.5
        p.update({**SNAP, "records": 4, "pages_per_s": math.nan})  # held, written by close
    got = lines(out)
    assert [g["records"] for g in got] == [1, 3, 4]
    assert all(g["type"] == "progress" and isinstance(g["time"], float) for g in got)
    assert got[0]["urls"] == SNAP["urls"] and got[0]["errors"] == SNAP["errors"]
    assert got[-1]["pages_per_s"] is None  # NaN is not JSON; it becomes null
    assert "NaN" not in out.getvalue()


def test_json_message_lines_and_idempotent_close() -> None:
    out = io.StringIO()
    p = ProgressDisplay("json", out)
    p.message("returned 3 leases of a dead crawl process")
    p.close()
    p.close()
    p.update(SNAP)  # after close: ignored
    (got,) = lines(out)
    assert got["type"] == "message"
    assert got["message"] == "returned 3 leases of a dead crawl process"


def test_tty_mode_renders_a_live_table() -> None:
    out = io.StringIO()
    p = ProgressDisplay("tty", out)
    p.update(SNAP)
    p.update({**SNAP, "records": 21, "custom_gauge": 5})
    p.message("resumed from an earlier run")
    p.close()
    text = out.getvalue()
    assert "\x1b[" in text  # terminal control sequences: redrawn in place
    for needle in (
        "pages/s",
        "12.2",
        "1.5 KiB/s",
        "queued 3",
        "leased 2",
        "done 40",
        "hosts in back-off",
        "parser backlog",
        "http_500 2",
        "records stored",
        "21",
        "custom_gauge",
        "resumed from an earlier run",
    ):
        assert needle in text, needle
    assert not text.lstrip().startswith("{")  # not JSON


def test_quiet_writes_nothing() -> None:
    out = io.StringIO()
    with ProgressDisplay("quiet", out) as p:
        p.update(SNAP)
        p.message("hello")
    with TaskProgress(3, "export", mode="quiet", stream=out) as t:
        t.advance(3)
    assert out.getvalue() == ""


def test_bad_mode_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="progress mode must be one of auto, tty, json, quiet"):
        ProgressDisplay("fancy", io.StringIO())


def test_a_broken_stream_never_stops_the_work() -> None:
    p = ProgressDisplay("auto", BrokenStream())
    for _ in range(3):
        p.update(SNAP)
    p.message("x")
    p.close()
    with task_progress(10, "reparse", stream=BrokenStream()) as t:
        t.advance(10)


def test_task_progress_json_lines_end_with_a_final_line() -> None:
    out, clock = io.StringIO(), FakeClock()
    with TaskProgress(10, "reparse", mode="auto", stream=out, clock=clock) as t:
        for _ in range(10):
            clock.t += 0.5
            t.advance()
    got = lines(out)
    assert all(g["type"] == "task" and g["task"] == "reparse" and g["total"] == 10 for g in got)
    assert [g["done"] for g in got] == [1, 5, 9, 10]  # every 2 s, then the final line
    assert [g["final"] for g in got] == [False, False, False, True]
    assert got[-1]["rate_per_s"] == pytest.approx(2.0)


def test_task_progress_on_a_tty_draws_a_bar() -> None:
    out = io.StringIO()
    with task_progress(10, "export", mode="tty", stream=out) as t:
        t.advance(4)
        t.update(10)
    text = out.getvalue()
    assert "export" in text and "10/10" in text and "\x1b[" in text


def test_task_progress_without_total() -> None:
    out = io.StringIO()
    with task_progress(None, "chaos", mode="json", stream=out) as t:
        t.advance(2)
    last = lines(out)[-1]
    assert (last["done"], last["total"], last["final"]) == (2, None, True)


def test_a_task_that_raises_leaves_no_final_line() -> None:
    """Its error is then the last (and, before any progress, the only) line a command says."""
    out = io.StringIO()
    with pytest.raises(RuntimeError), task_progress(None, "reparse", mode="json", stream=out):
        raise RuntimeError("no WARC store")
    assert out.getvalue() == ""


def test_rate_meter_uses_a_sliding_window() -> None:
    m = RateMeter(window_s=10.0)
    assert m.add(0, 0.0) == 0.0
    assert m.add(50, 5.0) == pytest.approx(10.0)
    assert m.add(100, 10.0) == pytest.approx(10.0)
    # A burst after a pause: the window forgets samples older than 10 s.
    m.add(100, 20.0)
    assert m.add(400, 25.0) == pytest.approx(300 / 15.0)
