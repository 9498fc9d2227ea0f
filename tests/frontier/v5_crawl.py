"""A crawl as schema version 5 left it, for the migration tests of both SQL backends.

Rows are written with version 5's columns (``urls.host_key``), in every kind of state, so a
test can open the crawl with today's backend (which migrates it in place) and check that the
rows, the host counts and the per-state totals came through.
"""

from __future__ import annotations

from typing import Any

from idemcrawl.frontier.base import STATES

T0 = 1_000_000.0

#: (url, host_key, state, lease_owner, lease_token, lease_expires_at)
URLS: list[tuple[str, str, str, str | None, int | None, float | None]] = [
    ("http://a/1", "http://a", "queued", None, None, None),
    ("http://a/2", "http://a", "queued", None, None, None),
    ("http://a/3", "http://a", "queued", None, None, None),
    ("http://a/4", "http://a", "leased", "w", 7, T0 + 5),
    ("http://a/5", "http://a", "done", None, None, None),
    ("http://b/1", "http://b", "deferred", None, None, None),
    ("http://b/2", "http://b", "rejected", None, None, None),
]
#: hosts without a URL keep their row
EMPTY_HOSTS = ["http://c"]


def write_v5_rows(execute: Any, mark: str) -> None:
    """Insert the rows through ``execute(sql, params)`` (``mark``: the driver's placeholder)."""
    for host in sorted({u[1] for u in URLS} | set(EMPTY_HOSTS)):
        execute(f"INSERT INTO hosts (host_key) VALUES ({mark})", (host,))
    for url, host, state, owner, token, expires in URLS:
        execute(
            "INSERT INTO urls (url, host_key, state, lease_owner, lease_token, "
            f"lease_expires_at) VALUES ({', '.join([mark] * 6)})",
            (url, host, state, owner, token, expires),
        )
    # two grants on http://a: the second one broke its allowance (1 in flight before, of 1)
    for granted_at, in_flight in ((T0 - 10, 0), (T0 - 5, 1)):
        execute(
            "INSERT INTO lease_log (host_key, url_id, kind, granted_at, eligible_at, min_gap, "
            f"allowance, in_flight_before) VALUES ({', '.join([mark] * 8)})",
            ("http://a", 4, "page", granted_at, granted_at, 0.0, 1, in_flight),
        )


def expected_states() -> dict[str, int]:
    out = dict.fromkeys(STATES, 0)
    for row in URLS:
        out[row[2]] += 1
    return out


def check_migrated(f: Any) -> None:
    """What version 6 must show of a migrated version-5 crawl, and that it keeps working."""
    from idemcrawl.frontier.base import HostPolicy

    rows = {r["url"]: r for r in f.url_rows()}
    assert {u: (r["host_key"], r["state"]) for u, r in rows.items()} == {
        u[0]: (u[1], u[2]) for u in URLS
    }
    assert rows["http://a/4"]["lease_token"] == 7
    assert f.stats().urls_by_state == expected_states()
    assert f.progress(T0).next_due_at == 0.0  # the hosts' due hints, set by the migration
    audit = f.lease_audit()  # the lease log, by host id now
    assert (audit["grants"], audit["violations_by_host"]) == (2, {"http://a": 1})
    hosts = {h["host_key"]: (h["queued"], h["in_flight"]) for h in f.host_rows()}
    assert hosts == {"http://a": (3, 1), "http://b": (0, 0), "http://c": (0, 0)}
    fast = HostPolicy(max_in_flight=8, delay=0.0)
    assert sorted(ls.url for ls in f.lease("w2", 10, T0, 30, fast)) == [
        "http://a/1", "http://a/2", "http://a/3",
    ]  # fmt: skip
    assert f.expire(T0 + 10) == 1  # the lease version 5 had granted
    assert f.requeue_deferred() == 1
    from idemcrawl.frontier.base import NewURL

    assert f.add([NewURL("http://a/1", "http://a"), NewURL("http://d/1", "http://d")], T0) == 1
    counted = dict.fromkeys(STATES, 0)
    for r in f.url_rows():
        counted[r["state"]] += 1
    assert f.stats().urls_by_state == counted
    assert counted["leased"] == 3 and counted["queued"] == 3
    hosts = {h["host_key"]: (h["queued"], h["in_flight"]) for h in f.host_rows()}
    assert hosts == {
        "http://a": (1, 3), "http://b": (1, 0), "http://c": (0, 0), "http://d": (1, 0),
    }  # fmt: skip
