"""The frontier's output side (R21/R22): event cursor reads, delivery cursors, streamed exports and
aggregates, for every backend."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from idemcrawl.frontier.base import (
    STATES,
    Completion,
    Failure,
    Frontier,
    HostPolicy,
    NewURL,
    RecordWrite,
)

T0 = 1_000_000.0
FAST = HostPolicy(max_in_flight=8, delay=0.0)

EVENT_KEYS = {
    "event_id",
    "url_id",
    "url_version",
    "url",
    "status",
    "fetched_at",
    "content_hash",
    "records",
    "links",
    "warc_file",
    "warc_offset",
    "warc_length",
    "payload_digest",
    "created_at",
}
URL_KEYS = {
    "url_id",
    "url",
    "state",
    "reason",
    "kind",
    "version",
    "status_code",
    "fetched_at",
    "body_bytes",
    "content_hash",
    "depth",
    "next_fetch_at",
}
RECORD_KEYS = {
    "record_id",
    "source",
    "key",
    "url",
    "data",
    "content_hash",
    "first_seen",
    "last_changed",
}


def crawl_pages(frontier: Frontier, host: str, n: int, *, status: int = 200) -> list[str]:
    """Add and complete ``n`` pages of ``host`` (one record each, 100+i bytes); their URLs."""
    pages = [NewURL(f"{host}/p{i}", host) for i in range(n)]
    frontier.add(pages, T0)
    done: list[str] = []
    while len(done) < n:
        leases = frontier.lease("w", n, T0, 30, FAST)
        assert leases
        completions = []
        for ls in leases:
            i = int(ls.url.rsplit("p", 1)[1])
            rec = RecordWrite.make(host.split("//")[1], f"k{i}", {"i": i})
            links = [NewURL(f"{host}/x{i}", host, state="out_of_scope", reason="test")]
            completions.append(
                Completion(ls, status, T0 + 1, [rec], links, f"h{i}", body_bytes=100 + i)
            )
            done.append(ls.url)
        assert all(frontier.complete(completions, T0 + 1, FAST))
    return done


def test_events_after_pages_in_id_order(frontier: Frontier) -> None:
    done = crawl_pages(frontier, "http://a", 5)
    events = frontier.events_after(0, 100)
    assert [set(e) for e in events] == [EVENT_KEYS] * 5
    ids = [e["event_id"] for e in events]
    assert ids == sorted(ids) and len(set(ids)) == 5
    assert sorted(e["url"] for e in events) == sorted(done)
    e = events[0]
    i = int(e["url"].rsplit("p", 1)[1])
    assert (e["status"], e["records"], e["links"], e["content_hash"]) == (200, 1, 1, f"h{i}")
    assert e["url_version"] == 1 and e["fetched_at"] == T0 + 1
    assert frontier.events_after(ids[1], 2) == events[2:4]
    assert frontier.events_after(ids[-1], 10) == []
    assert frontier.events_after(0, 0) == []


def test_rejected_completion_adds_no_event(frontier: Frontier) -> None:
    frontier.add([NewURL("http://a/p0", "http://a")], T0)
    (ls,) = frontier.lease("w", 1, T0, 30, FAST)
    assert frontier.complete([Completion(ls, 200, T0)], T0, FAST) == [True]
    assert frontier.complete([Completion(ls, 200, T0)], T0, FAST) == [False]
    assert len(frontier.events_after(0, 10)) == 1


def test_delivery_cursor_never_moves_back_and_survives_reopen(frontier: Frontier, reopen) -> None:  # type: ignore[no-untyped-def]
    assert frontier.get_cursor("hook") == 0
    frontier.set_cursor("hook", 5)
    frontier.set_cursor("hook", 3)  # a late acknowledgement of an older event
    assert frontier.get_cursor("hook") == 5
    frontier.set_cursor("hook", 9)
    frontier.set_cursor("other", 1)
    assert (frontier.get_cursor("hook"), frontier.get_cursor("other")) == (9, 1)
    assert reopen().get_cursor("hook") == 9


@pytest.mark.parametrize("n", [4, 5])  # a multiple of the batch, and one with a partial batch
def test_iter_urls_pages_through_every_url(frontier: Frontier, n: int) -> None:
    frontier.add([NewURL(f"http://a/u{i}", "http://a", depth=i) for i in range(n)], T0)
    rows = list(frontier.iter_urls(batch=2))
    assert [set(r) for r in rows] == [URL_KEYS] * n
    ids = [r["url_id"] for r in rows]
    assert ids == sorted(ids) and len(set(ids)) == n
    assert {r["url"]: r["depth"] for r in rows} == {f"http://a/u{i}": i for i in range(n)}
    assert {r["state"] for r in rows} == {"queued"}


def test_iter_urls_reads_in_batches_not_all_at_once(frontier: Frontier) -> None:
    frontier.add([NewURL(f"http://a/u{i}", "http://a") for i in range(3)], T0)
    it = iter(frontier.iter_urls(batch=2))
    first = next(it)
    frontier.add([NewURL("http://a/late", "http://a")], T0)  # lands after the first batch
    rest = list(it)
    assert [r["url"] for r in [first, *rest]][-1] == "http://a/late"
    assert len(rest) == 3


def test_iter_urls_reports_fetch_facts(frontier: Frontier) -> None:
    crawl_pages(frontier, "http://a", 2)
    fetched = {r["url"]: r for r in frontier.iter_urls() if r["state"] == "done"}
    assert set(fetched) == {"http://a/p0", "http://a/p1"}
    r = fetched["http://a/p1"]
    assert (r["status_code"], r["body_bytes"], r["content_hash"]) == (200, 101, "h1")
    assert (r["kind"], r["version"], r["fetched_at"]) == ("page", 1, T0 + 1)


def test_iter_events_and_iter_records_stream_everything(frontier: Frontier) -> None:
    crawl_pages(frontier, "http://a", 3)
    crawl_pages(frontier, "http://b", 2)
    assert list(frontier.iter_events(batch=2)) == frontier.events_after(0, 100)
    records = list(frontier.iter_records(batch=2))
    assert [set(r) for r in records] == [RECORD_KEYS] * 5
    ids = [r["record_id"] for r in records]
    assert ids == sorted(ids)
    assert sorted(records, key=lambda r: (r["source"], r["key"])) == list(frontier.records())
    assert {(r["source"], json.loads(r["data"])["i"]) for r in records} == {
        ("a", 0),
        ("a", 1),
        ("a", 2),
        ("b", 0),
        ("b", 1),
    }


def test_streams_of_an_empty_crawl_are_empty(frontier: Frontier) -> None:
    assert list(frontier.iter_urls()) == []
    assert list(frontier.iter_events()) == []
    assert list(frontier.iter_records()) == []
    with pytest.raises(ValueError, match="batch"):
        list(frontier.iter_urls(batch=0))


def test_aggregates_recomputed_from_stored_rows(frontier: Frontier) -> None:
    crawl_pages(frontier, "http://a", 3)
    crawl_pages(frontier, "http://b", 2, status=404)
    frontier.add([NewURL("http://c/p0", "http://c"), NewURL("http://c/p1", "http://c")], T0)
    (ls,) = frontier.lease("w", 1, T0, 30, FAST)
    assert frontier.fail([Failure(ls, "server error", None, status=503)], T0, FAST) == [True]
    agg = frontier.aggregates()
    states = Counter(r["state"] for r in frontier.iter_urls())
    assert agg["urls_by_state"] == {s: states.get(s, 0) for s in STATES}
    assert agg["urls"] == 12  # 5 pages + their 5 out-of-scope links + 2 on c
    assert agg["urls_by_state"]["done"] == 5 and agg["urls_by_state"]["failed"] == 1
    assert agg["status_codes"] == {200: 3, 404: 2, 503: 1}
    assert agg["fetched"] == 5
    assert agg["body_bytes"] == (100 + 101 + 102) + (100 + 101)
    assert agg["records_by_source"] == {"a": 3, "b": 2}
    assert (agg["records"], agg["events"]) == (5, 5)
    # A rejected duplicate completion changes no stored row, so no aggregate either.
    (c1,) = frontier.lease("w", 1, T0 + 1, 30, FAST)
    assert frontier.complete([Completion(c1, 200, T0 + 2, body_bytes=7)], T0 + 2, FAST) == [True]
    before = frontier.aggregates()
    assert frontier.complete([Completion(c1, 200, T0 + 3, body_bytes=7)], T0 + 3, FAST) == [False]
    assert frontier.aggregates() == before
    assert before["body_bytes"] == agg["body_bytes"] + 7


def test_events_carry_the_storage_pointer(frontier: Frontier) -> None:
    frontier.add([NewURL("http://a/p0", "http://a")], T0)
    (ls,) = frontier.lease("w", 1, T0, 30, FAST)
    c = Completion(
        ls,
        200,
        T0,
        content_hash="h",
        warc_file="crawl-00001.warc.gz",
        warc_offset=4096,
        warc_length=777,
        payload_digest="sha1:ABC",
    )
    assert frontier.complete([c], T0, FAST) == [True]
    (e,) = frontier.events_after(0, 10)
    assert (e["warc_file"], e["warc_offset"], e["warc_length"], e["payload_digest"]) == (
        "crawl-00001.warc.gz",
        4096,
        777,
        "sha1:ABC",
    )
    assert list(frontier.iter_events()) == [e]
