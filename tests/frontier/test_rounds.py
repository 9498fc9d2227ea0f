"""Contract: recrawl rounds, conditional revisits, content dedup, budgets, redirects, live
control — the parts of the frontier added for issues 4, 5, 6 and 9, on every backend."""

from __future__ import annotations

import pytest

from idemcrawl.frontier.base import Completion, Failure, Frontier, HostPolicy, NewURL

T0 = 1_000_000.0
FAST = HostPolicy(max_in_flight=8, delay=0.0)


def one(frontier: Frontier, now: float = T0, policy: HostPolicy = FAST) -> object:
    (lease,) = frontier.lease("w", 1, now, 30, policy)
    return lease


def test_round_bumps_version_and_carries_validators(frontier: Frontier) -> None:
    frontier.add([NewURL("http://a/p", "http://a")], T0)
    first = one(frontier)
    done = Completion(
        first, 200, T0, content_hash="h1", body_bytes=10, etag='"v1"',
        last_modified="Mon, 01 Jan 2024 00:00:00 GMT", next_fetch_at=T0 + 100,
        revisit_interval=100.0,
    )
    assert frontier.complete([done], T0, FAST) == [True]
    assert frontier.progress(T0).next_refetch_at == T0 + 100
    assert frontier.reschedule_due(T0 + 50, 10) == 0
    assert frontier.reschedule_due(T0 + 100, 10) == 1
    second = one(frontier, T0 + 100)
    assert second.version == first.version + 1
    assert (second.etag, second.prev_hash, second.prev_status) == ('"v1"', "h1", 200)
    assert second.interval == 100.0
    # The old round's completion can never be accepted for the new one (R4).
    assert frontier.complete([done], T0 + 100, FAST) == [False]
    # A 304 keeps status, hash and size, moves the schedule, and emits no event.
    nm = Completion(
        second, 304, T0 + 101, etag='"v1"', changed=False, next_fetch_at=T0 + 300,
        revisit_interval=200.0,
    )
    assert frontier.complete([nm], T0 + 101, FAST) == [True]
    s = frontier.stats()
    assert s.events == 1
    assert s.counters.get("status_304") == 1
    assert s.counters.get("status_2xx") == 1
    assert s.counters.get("revisits") == 1
    frontier.reschedule_due(T0 + 300, 10)
    third = one(frontier, T0 + 300)
    assert (third.prev_hash, third.prev_status, third.interval) == ("h1", 200, 200.0)
    changed = Completion(third, 200, T0 + 301, content_hash="h2", next_fetch_at=T0 + 400)
    assert frontier.complete([changed], T0 + 301, FAST) == [True]
    s = frontier.stats()
    assert s.events == 2
    assert s.counters.get("pages_changed") == 1


def test_bodies_are_remembered_once(frontier: Frontier) -> None:
    frontier.add([NewURL("http://a/1", "http://a"), NewURL("http://a/2", "http://a")], T0)
    a, b = frontier.lease("w", 2, T0, 30, FAST)
    full = Completion(
        a, 200, T0, content_hash="h", warc_file="f.warc.gz", warc_offset=0, warc_length=99,
        payload_digest="sha1:X", stored_body=True,
    )
    ref = Completion(
        b, 200, T0, content_hash="h", warc_file="f.warc.gz", warc_offset=0, warc_length=99,
        payload_digest="sha1:X", stored_body=False,
    )
    assert frontier.complete([full, ref], T0, FAST) == [True, True]
    assert frontier.find_bodies(["sha1:X", "sha1:none"]) == {
        "sha1:X": ("f.warc.gz", 0, 99, a.url)
    }
    assert list(frontier.body_digests()) == ["sha1:X"]
    assert frontier.stats().counters.get("content_duplicates") == 1


def test_simhashes_round_trip_unsigned(frontier: Frontier) -> None:
    frontier.add([NewURL("http://a/1", "http://a")], T0)
    lease = one(frontier)
    fp = (1 << 64) - 5
    frontier.complete([Completion(lease, 200, T0, simhash=fp, near_dup_of=7)], T0, FAST)
    assert list(frontier.simhashes()) == [(lease.url_id, fp, 7)]


def test_daily_budget_defers_the_host_only(frontier: Frontier) -> None:
    policy = HostPolicy(max_in_flight=8, delay=0.0, daily_budget=3)
    frontier.add([NewURL(f"http://a/{i}", "http://a") for i in range(10)], T0)
    frontier.add([NewURL("http://b/1", "http://b")], T0)
    leases = frontier.lease("w", 20, T0, 30, policy)
    assert sorted(ls.host_key for ls in leases) == ["http://a"] * 3 + ["http://b"]
    frontier.complete([Completion(ls, 200, T0) for ls in leases], T0, policy)
    assert frontier.lease("w", 20, T0 + 1, 30, policy) == []
    s = frontier.stats()
    assert s.urls_by_state["deferred"] == 7
    assert s.counters.get("budget_exhausted") == 1
    assert frontier.progress(T0 + 1).finished  # the crawl can end
    assert frontier.url_row("http://a/9")["reason"] == "daily fetch budget exhausted"


def test_redirect_hops_and_loops(frontier: Frontier) -> None:
    frontier.add([NewURL("http://a/x", "http://a")], T0)
    x = one(frontier)
    link = NewURL("http://a/y", "http://a", hops=1)
    frontier.complete(
        [Completion(x, 301, T0, links=[link], redirect_to="http://a/y")], T0, FAST
    )
    y = one(frontier)
    assert y.hops == 1
    back = NewURL("http://a/x", "http://a", hops=2)
    frontier.complete(
        [Completion(y, 302, T0, links=[back], redirect_to="http://a/x")], T0, FAST
    )
    assert frontier.stats().counters.get("redirect_loops") == 1
    assert "redirect loop" in frontier.url_row("http://a/y")["last_error"]


def test_failure_status_classes_and_retries(frontier: Frontier) -> None:
    frontier.add([NewURL("http://a/1", "http://a")], T0)
    lease = one(frontier)
    frontier.fail([Failure(lease, "HTTP 503", T0 + 5, 503, host_error=True)], T0, FAST)
    c = frontier.stats().counters
    assert c.get("status_5xx") == 1
    assert c.get("retries") == 1


def test_control_pause_resume_block_and_delay(frontier: Frontier) -> None:
    frontier.add([NewURL(f"http://a/{i}", "http://a") for i in range(3)], T0)
    frontier.add([NewURL("http://b/1", "http://b")], T0)
    frontier.control("pause", "http://a")
    assert [ls.host_key for ls in frontier.lease("w", 9, T0, 30, FAST)] == ["http://b"]
    frontier.control("resume", "http://a")
    frontier.control("pause")
    assert frontier.lease("w", 9, T0, 30, FAST) == []
    frontier.control("resume")
    frontier.control("set-delay", "http://a", 5)
    assert frontier.host_row("http://a")["delay"] == 5.0
    (ls,) = frontier.lease("w", 9, T0, 30, FAST)
    assert frontier.host_row("http://a")["next_allowed_at"] == pytest.approx(T0 + 5)
    frontier.control("block", "http://a")
    assert frontier.stats().urls_by_state["deferred"] == 2
    assert frontier.lease("w", 9, T0 + 10, 30, FAST) == []
    frontier.control("unblock", "http://a")
    assert frontier.stats().urls_by_state["queued"] == 2
    with pytest.raises(ValueError, match="unknown control action"):
        frontier.control("explode", "http://a")
    with pytest.raises(ValueError, match="seconds >= 0"):
        frontier.control("set-delay", "http://a", -1)
    del ls


def test_reparse_candidates_and_apply(frontier: Frontier) -> None:
    from idemcrawl.frontier.base import RecordWrite, Reparsed

    frontier.add([NewURL(f"http://a/{i}", "http://a") for i in range(3)], T0)
    a, b, c = frontier.lease("w", 3, T0, 30, FAST)
    ptr = {"warc_file": "f.warc.gz", "warc_offset": 5, "warc_length": 50}
    frontier.complete([Completion(a, 200, T0, **ptr, payload_digest="sha1:A")], T0, FAST)
    frontier.fail(
        [Failure(b, "parse error: boom", None, 200, **ptr, payload_digest="sha1:B")], T0, FAST
    )
    frontier.fail([Failure(c, "timeout", None)], T0, FAST)  # nothing archived
    every = frontier.reparse_candidates(False, 0, 10)
    assert [r["url"] for r in every] == [a.url, b.url]
    failed = frontier.reparse_candidates(True, 0, 10)
    assert [(r["url"], r["warc_offset"]) for r in failed] == [(b.url, 5)]
    assert frontier.reparse_candidates(False, every[0]["url_id"], 10)[0]["url"] == b.url
    rec = RecordWrite.make("s", "k", {"x": 1})
    link = NewURL("http://a/new", "http://a")
    n = frontier.apply_reparse([Reparsed(b.url_id, b.url, [rec], [link])], T0 + 1)
    assert n == 1
    assert frontier.url_row(b.url)["state"] == "done"
    assert frontier.url_row("http://a/new")["state"] == "queued"
    assert frontier.stats().records == 1
    assert frontier.reparse_candidates(True, 0, 10) == []


def test_eligibility_histogram_and_recent_errors(frontier: Frontier) -> None:
    frontier.add([NewURL(f"http://a/{i}", "http://a") for i in range(3)], T0)
    a, b, c = frontier.lease("w", 3, T0 + 2, 30, FAST)  # eligible at T0, granted 2 s later
    h = frontier.eligibility_delay_histogram([1.0, 5.0])
    assert h["counts"] == [0, 3, 3]
    assert h["sum"] == pytest.approx(6.0)
    frontier.fail([Failure(a, "timeout", None)], T0 + 3, FAST)
    frontier.complete([Completion(b, 200, T0 + 4, error="cut: max_bytes")], T0 + 4, FAST)
    errs = frontier.recent_errors(10)
    assert [e["last_error"] for e in errs][:1] == ["cut: max_bytes"]
    assert {e["url"] for e in errs} == {a.url, b.url}
    del c


def test_failure_reasons_group_final_failures_with_the_first_one_s_trace(
    frontier: Frontier,
) -> None:
    """Only URLs that failed for good count (not a retry, not a page done with an error);
    each reason shows its first failure's URL and traceback tail; a reparse that fixes a
    page takes it out, one that fails again moves it to its new reason."""
    from idemcrawl.frontier.base import Reparsed

    frontier.add([NewURL(f"http://a/{i}", "http://a") for i in range(6)], T0)
    a, b, c, d, e, g = frontier.lease("w", 6, T0, 30, FAST)
    key_error = "parse error: KeyError: 'x'"
    frontier.fail([Failure(b, key_error, None, 200, trace="at b")], T0 + 2, FAST)
    frontier.fail([Failure(a, key_error, None, 200, trace="at a")], T0 + 1, FAST)
    frontier.fail([Failure(c, key_error, None, 200, trace="at c")], T0 + 3, FAST)
    frontier.fail([Failure(d, "HTTP 503 (after 4 attempts)", None, 503)], T0 + 4, FAST)
    frontier.fail([Failure(e, "timeout", T0 + 100, trace="not kept")], T0 + 5, FAST)
    frontier.complete([Completion(g, 200, T0 + 6, error="cut: max_bytes")], T0 + 6, FAST)
    got = frontier.failure_reasons(10)
    http = "HTTP 503 (after 4 attempts)"
    assert got == [
        {"reason": key_error, "urls": 3, "url": a.url, "trace": "at a", "failed_at": T0 + 1},
        {"reason": http, "urls": 1, "url": d.url, "trace": None, "failed_at": T0 + 4},
    ]
    assert frontier.failure_reasons(1) == got[:1]
    value_error = "parse error: ValueError: y"
    fixed = Reparsed(a.url_id, a.url)
    again = Reparsed(b.url_id, b.url, error=value_error, trace="at b, again")
    frontier.apply_reparse([fixed, again], T0 + 10)
    rows = frontier.failure_reasons(10)
    assert [(r["reason"], r["urls"], r["url"], r["trace"]) for r in rows] == [
        (http, 1, d.url, None),
        (key_error, 1, c.url, "at c"),
        (value_error, 1, b.url, "at b, again"),
    ]
    # A reparse of a page that is done changes no failure, even when it fails.
    frontier.apply_reparse([Reparsed(g.url_id, g.url, error="parse error: boom")], T0 + 11)
    assert len(frontier.failure_reasons(10)) == 3
