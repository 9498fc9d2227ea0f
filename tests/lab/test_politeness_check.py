"""Tests for the server-side politeness checker, on synthetic logs with known answers."""

from __future__ import annotations

from typing import Any

import pytest

from idemcrawl.lab.politeness_check import Allowance, Violation, check_log, summarize

A = "http://127.0.0.1:1001"
B = "http://127.0.0.1:1002"


def req(host: str, path: str, start: float, end: float, status: int = 200) -> dict[str, Any]:
    return {"host": host, "path": path, "start": start, "end": end, "status": status}


def kinds(violations: list[Violation]) -> list[str]:
    return [v.kind for v in violations]


def test_clean_log_has_no_violations() -> None:
    log = [
        req(A, "/robots.txt", 0.0, 0.1),
        req(A, "/p/0", 1.0, 1.2),
        req(A, "/p/1", 2.0, 2.5),
        req(B, "/p/0", 0.0, 3.0),  # other host: overlaps A freely
    ]
    allowance = {A: Allowance(), B: Allowance()}
    assert check_log(log, allowance, disallowed_prefixes={A: ["/private"]}) == []
    assert summarize([]) == "no violations"


def test_overlap_detected_for_one_but_allowed_for_two() -> None:
    log = [
        req(A, "/p/0", 0.0, 2.0),
        req(A, "/p/1", 1.0, 3.0),  # overlaps /p/0
        req(A, "/p/2", 5.0, 6.0),
    ]
    found = check_log(log, {A: Allowance(max_in_flight=1, min_gap=0)})
    assert kinds(found) == ["concurrency"]
    assert found[0].host == A
    assert found[0].at == 1.0
    assert "2 in flight" in found[0].detail and "/p/1" in found[0].detail
    assert check_log(log, {A: Allowance(max_in_flight=2, min_gap=0)}) == []


def test_three_way_overlap_is_one_episode_and_exceeds_two() -> None:
    log = [req(A, f"/p/{i}", i * 0.1, 10.0) for i in range(3)]
    found = check_log(log, {A: Allowance(max_in_flight=2, min_gap=0)})
    assert kinds(found) == ["concurrency"]
    assert found[0].detail.startswith("3 in flight (max 2)")
    one = check_log(log, {A: Allowance(max_in_flight=1, min_gap=0)})
    assert kinds(one) == ["concurrency"]  # one episode, reported once
    assert one[0].detail.startswith("3 in flight")


def test_back_to_back_requests_do_not_overlap() -> None:
    # [start, end) is half-open: the next request may start the instant one ends.
    log = [req(A, "/p/0", 0.0, 1.0), req(A, "/p/1", 1.0, 2.0), req(A, "/p/2", 2.0, 3.0)]
    assert check_log(log, {A: Allowance(max_in_flight=1, min_gap=1.0)}) == []


def test_missing_end_counts_as_in_flight() -> None:
    log = [
        {"host": A, "path": "/robots.txt", "start": 0.0, "end": None, "status": 0},
        req(A, "/p/0", 5.0, 5.1),
    ]
    assert kinds(check_log(log, {A: Allowance(min_gap=0)})) == ["concurrency"]


def test_gap_violation_detected_and_tolerance_respected() -> None:
    log = [
        req(A, "/robots.txt", 0.0, 0.01),  # robots fetches count as requests
        req(A, "/p/0", 0.5, 0.6),  # too soon
        req(A, "/p/1", 1.497, 1.5),  # 0.997 s: within default 5 ms tolerance
    ]
    found = check_log(log, {A: Allowance(min_gap=1.0)})
    assert kinds(found) == ["gap"]
    assert found[0].at == 0.5
    assert "/robots.txt -> /p/0" in found[0].detail
    strict = check_log(log, {A: Allowance(min_gap=1.0)}, tolerance=0.0)
    assert kinds(strict) == ["gap", "gap"]
    assert strict[1].at == 1.497


def test_unsorted_log_is_sorted_per_host() -> None:
    log = [req(A, "/p/1", 2.0, 2.1), req(B, "/p/0", 0.0, 0.1), req(A, "/p/0", 0.0, 0.1)]
    assert check_log(log, {A: Allowance(min_gap=2.0)}) == []
    assert kinds(check_log(log, {A: Allowance(min_gap=2.5)})) == ["gap"]


def test_default_allowance_and_unlisted_hosts() -> None:
    log = [req(B, "/p/0", 0.0, 1.0), req(B, "/p/1", 0.5, 1.0)]
    assert check_log(log, {A: Allowance()}) == []  # B unchecked without a default
    found = check_log(log, {A: Allowance()}, default=Allowance())
    assert sorted(kinds(found)) == ["concurrency", "gap"]
    assert {v.host for v in found} == {B}


def test_disallowed_prefix_detected() -> None:
    log = [
        req(A, "/robots.txt", 0.0, 0.1),
        req(A, "/p/0", 1.0, 1.1),
        req(A, "/private/3", 2.0, 2.1),
        req(B, "/private/3", 0.0, 0.1),  # B has no rules
    ]
    found = check_log(log, {}, disallowed_prefixes={A: ["/admin", "/private"]})
    assert kinds(found) == ["disallowed"]
    assert (found[0].host, found[0].at) == (A, 2.0)
    assert "/private/3" in found[0].detail and "/private" in found[0].detail


def test_forbidden_host_detected() -> None:
    log = [
        req(A, "/robots.txt", 0.0, 0.1, status=500),
        req(A, "/p/0", 1.0, 1.1),
        req(A, "/robots.txt", 3.0, 3.1, status=500),
        req(B, "/p/0", 0.0, 0.1),
    ]
    found = check_log(log, {}, only_robots_hosts={A})
    assert kinds(found) == ["forbidden-host"]
    assert (found[0].host, found[0].at) == (A, 1.0)


def test_host_keys_tolerate_trailing_slash() -> None:
    log = [req(A + "/", "/p/0", 0.0, 1.0), req(A, "/p/1", 0.5, 1.0)]
    found = check_log(log, {A: Allowance(min_gap=0)}, only_robots_hosts={A + "/"})
    assert sorted(kinds(found)) == ["concurrency", "forbidden-host", "forbidden-host"]


def test_violations_sorted_and_summarized() -> None:
    log = [
        req(A, "/p/0", 0.0, 1.0),
        req(A, "/private/1", 0.2, 0.3),
        req(B, "/p/0", 0.1, 0.2),
        req(B, "/p/1", 0.15, 0.2),
    ]
    found = check_log(log, {}, default=Allowance(), disallowed_prefixes={A: ["/private"]})
    assert [v.at for v in found] == sorted(v.at for v in found)
    text = summarize(found)
    assert text.splitlines() == [
        f"concurrency: 2 ({A} x1, {B} x1)",
        f"gap: 2 ({A} x1, {B} x1)",
        f"disallowed: 1 ({A} x1)",
    ]


@pytest.mark.parametrize("kwargs", [{"max_in_flight": 0}, {"min_gap": -1.0}])
def test_allowance_validation(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        Allowance(**kwargs)
