"""SQLite-specific behaviour: opening, migrating, refusing files that are not crawls."""

from __future__ import annotations

import multiprocessing
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest

from idemcrawl.frontier import sqlite as sqlite_mod
from idemcrawl.frontier.base import Completion, Failure, FrontierError, HostPolicy, NewURL
from idemcrawl.frontier.sqlite import SCHEMA_VERSION, SQLiteFrontier

from .conftest import queued_and_leased_by_host


def _open_close(path: str) -> None:
    SQLiteFrontier(path).close()


@pytest.mark.slow
def test_concurrent_first_open_migrates_once(tmp_path: Path) -> None:
    # spawn, not fork: forking a multi-threaded test process can inherit a held lock.
    ctx = multiprocessing.get_context("spawn")
    for k in range(3):
        path = str(tmp_path / f"c{k}.db")
        procs = [ctx.Process(target=_open_close, args=(path,)) for _ in range(4)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(60)
        assert [p.exitcode for p in procs] == [0, 0, 0, 0]
        con = sqlite3.connect(path)
        assert con.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        con.close()


def test_refuses_foreign_sqlite_file_without_changing_it(tmp_path: Path) -> None:
    path = tmp_path / "other.db"
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE t (x)")
    con.commit()
    con.close()
    before = path.read_bytes()
    with pytest.raises(FrontierError, match="not an idemcrawl crawl"):
        SQLiteFrontier(str(path))
    # Someone else's database: not switched to WAL mode (a header write), no -wal/-shm files.
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other.db"]


def test_refuses_a_directory_with_a_frontier_error(tmp_path: Path) -> None:
    """The failed open closes its own connection: it used to reach for ``self._db``, which
    ``sqlite3.connect`` had not yet set, and raise AttributeError instead."""
    with pytest.raises(FrontierError, match="is a directory, not a database file"):
        SQLiteFrontier(str(tmp_path))
    with pytest.raises(FrontierError, match="is a directory"):
        SQLiteFrontier(str(tmp_path), create=False)
    assert list(tmp_path.iterdir()) == []


def test_refuses_newer_schema(tmp_path: Path) -> None:
    path = tmp_path / "new.db"
    SQLiteFrontier(str(path)).close()
    con = sqlite3.connect(path)
    con.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
    con.close()
    with pytest.raises(FrontierError, match="newer than this idemcrawl"):
        SQLiteFrontier(str(path))


def test_refuses_garbage_and_missing(tmp_path: Path) -> None:
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"\x00garbage" * 1000)
    with pytest.raises(FrontierError, match="cannot open crawl database"):
        SQLiteFrontier(str(junk))
    with pytest.raises(FrontierError, match="no crawl database"):
        SQLiteFrontier(str(tmp_path / "none.db"), create=False)
    with pytest.raises(FrontierError, match="directory"):
        SQLiteFrontier(str(tmp_path / "no" / "dir.db"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["junk.db"]


def test_reopen_keeps_state(tmp_path: Path) -> None:
    from idemcrawl.frontier.base import NewURL

    path = str(tmp_path / "c.db")
    f = SQLiteFrontier(path)
    f.add([NewURL("http://a/x", "http://a")], 1.0)
    f.close()
    g = SQLiteFrontier(path)
    assert g.stats().urls_by_state["queued"] == 1
    g.close()


def test_a_version_4_crawl_migrates_and_keeps_counting_its_hosts(tmp_path: Path) -> None:
    """Version 5 drops the per-row insert trigger; the insert counts its hosts itself (I6)."""
    from idemcrawl.frontier.base import HostPolicy, NewURL
    from idemcrawl.frontier.sqlite import MIGRATIONS

    path = tmp_path / "v4.db"
    con = sqlite3.connect(path)
    for script in MIGRATIONS[:4]:
        con.executescript(script)
    con.execute("PRAGMA user_version=4")
    con.execute(
        "INSERT INTO urls(url, host_key, state) VALUES ('http://a/1', 'http://a', 'queued')"
    )
    con.commit()
    assert con.execute("SELECT queued FROM hosts").fetchone() == (1,)  # the old trigger
    con.close()
    f = SQLiteFrontier(str(path))
    try:
        triggers = f._db.execute(
            "SELECT name FROM sqlite_master WHERE type = 'trigger' ORDER BY name"
        ).fetchall()
        assert triggers == []  # none since version 8
        new = [NewURL(f"http://a/{i}", "http://a") for i in range(5)]
        new += [NewURL("http://b/x", "http://b", state="rejected", reason="trap")]
        assert f.add(new, 1.0) == 5  # http://a/1 was there
        assert len(f.lease("w", 1, 2.0, 30, HostPolicy(delay=0.0))) == 1
        rows = {h["host_key"]: (h["queued"], h["in_flight"]) for h in f.host_rows()}
        assert rows == {"http://a": (4, 1), "http://b": (0, 0)}
    finally:
        f.close()


def test_a_version_5_crawl_migrates_to_host_ids_and_state_totals(tmp_path: Path) -> None:
    """Version 6 rebuilds hosts and urls (host ids instead of host keys in URL rows, no state
    index, per-state totals): every row, count and lease survives, in place."""
    from idemcrawl.frontier.sqlite import MIGRATIONS

    from .v5_crawl import check_migrated, write_v5_rows

    path = tmp_path / "v5.db"
    con = sqlite3.connect(path)
    for script in MIGRATIONS[:5]:
        con.executescript(script)
    con.execute("PRAGMA user_version=5")
    write_v5_rows(con.execute, "?")
    # version 5 counted inserted URLs in the insert statement: set what it would have
    con.execute(
        "UPDATE hosts SET queued = (SELECT count(*) FROM urls u WHERE u.host_key = "
        "hosts.host_key AND u.state = 'queued'), in_flight = (SELECT count(*) FROM urls u "
        "WHERE u.host_key = hosts.host_key AND u.state = 'leased')"
    )
    con.commit()
    con.close()
    f = SQLiteFrontier(str(path))
    try:
        assert f._db.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,)
        indexes = {
            r[0]
            for r in f._db.execute(
                "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'urls'"
            )
        }
        assert not {"urls_state", "urls_due"} & indexes
        assert {"urls_queue", "urls_deferred"} <= indexes
        check_migrated(f)
    finally:
        f.close()


def test_a_version_7_crawl_migrates_to_counting_grants_and_completions(tmp_path: Path) -> None:
    """Version 8 drops the row triggers on urls.state (the statements count every move): a
    crawl written by version 7 keeps its rows and counts, and every move after the upgrade
    keeps them equal to the rows (I6)."""
    from idemcrawl.frontier.base import Completion, HostPolicy
    from idemcrawl.frontier.sqlite import MIGRATIONS, _split_sql

    from .v5_crawl import T0, check_migrated, write_v5_rows

    path = tmp_path / "v7.db"
    con = sqlite3.connect(path, isolation_level=None)
    for script in MIGRATIONS[:5]:
        con.executescript(script)
    write_v5_rows(con.execute, "?")
    con.execute(
        "UPDATE hosts SET queued = (SELECT count(*) FROM urls u WHERE u.host_key = "
        "hosts.host_key AND u.state = 'queued'), in_flight = (SELECT count(*) FROM urls u "
        "WHERE u.host_key = hosts.host_key AND u.state = 'leased')"
    )
    for script in MIGRATIONS[5:7]:
        for stmt in _split_sql(script):
            con.execute(stmt)
    con.execute("PRAGMA user_version=7")
    triggers = con.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'").fetchall()
    assert sorted(triggers) == [("urls_state",), ("urls_state_total",)]
    con.close()
    f = SQLiteFrontier(str(path))
    try:
        assert f._db.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,)
        assert SCHEMA_VERSION >= 8  # version 8 dropped the triggers (9 is PostgreSQL's)
        assert (
            f._db.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'").fetchall() == []
        )
        check_migrated(f)  # leases, expiry, requeue, add: counts equal the rows
        fast = HostPolicy(max_in_flight=8, delay=0.0)
        leases = f.lease("w3", 10, T0 + 20, 30, fast)
        assert leases
        assert f.complete([Completion(ls, 200, T0 + 21) for ls in leases], T0 + 21, fast)
        counted, kept = queued_and_leased_by_host(f)
        assert {k: kept[k] for k in counted} == counted
        by_state = dict(f._db.execute("SELECT state, n FROM url_states").fetchall())
        for state, n in f.stats().urls_by_state.items():
            assert by_state.get(state, 0) == n == sum(r["state"] == state for r in f.url_rows())
    finally:
        f.close()


def test_a_version_12_crawl_lists_the_urls_it_failed_before(tmp_path: Path) -> None:
    """Version 13 keeps why URLs failed in a table of its own; a crawl that failed URLs under
    version 12 gets them listed by reason (no traceback: none was kept; the failure time is
    the URL's due time), and its new failures join them."""
    path = str(tmp_path / "v12.db")
    t0, fast = 1_000_000.0, HostPolicy(max_in_flight=8, delay=0.0)
    f = SQLiteFrontier(path)
    f.add([NewURL(f"http://a/{i}", "http://a") for i in range(3)], t0)
    a, b, c = f.lease("w", 3, t0, 30, fast)
    f.fail([Failure(b, "HTTP 500 (after 4 attempts)", None, 500)], t0 + 2, fast)
    f.fail([Failure(a, "HTTP 500 (after 4 attempts)", None, 500)], t0 + 1, fast)
    f.close()
    con = sqlite3.connect(path)  # what version 12 left: no failures table
    con.execute("DROP TABLE failures")
    con.execute("PRAGMA user_version=12")
    con.commit()
    con.close()
    f = SQLiteFrontier(path)
    try:
        assert f._db.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,)
        old = {"reason": "HTTP 500 (after 4 attempts)", "urls": 2, "url": a.url, "trace": None}
        assert f.failure_reasons(5) == [{**old, "failed_at": t0 + 1}]
        f.fail([Failure(c, "parse error: KeyError: 'x'", None, 200, trace="tb")], t0 + 3, fast)
        assert [r["trace"] for r in f.failure_reasons(5)] == [None, "tb"]
    finally:
        f.close()


def test_a_thread_checkpoints_the_wal_outside_the_commits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Write commits wake the frontier's checkpoint thread (its own connection); once it saw a
    large WAL the next write copies what was committed since, so the WAL can restart; the
    connection itself checkpoints only past the backstop size, and close() ends the thread."""
    monkeypatch.setattr(sqlite_mod, "_RESTART_PAGES", 1)  # every WAL is large
    path = str(tmp_path / "c.db")
    f = SQLiteFrontier(path)
    assert f._db.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == sqlite_mod._BACKSTOP_PAGES
    f.add([NewURL(f"http://h/{i}", "http://h") for i in range(500)], 1.0)
    deadline = time.monotonic() + 30
    while f._checkpointer.checkpoints == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert f._checkpointer.checkpoints >= 1 and f._checkpointer.restart_due
    f.add([NewURL("http://h/last", "http://h")], 1.0)
    assert f._checkpointer.catch_ups == 1
    thread = f._checkpointer._thread
    assert thread is not None and thread.is_alive()
    f.close()
    assert not thread.is_alive()


def test_a_failed_catch_up_checkpoint_does_not_fail_the_committed_write(tmp_path: Path) -> None:
    """The catch-up checkpoint runs after COMMIT: its failure is logged, and the committed call
    returns its result (raising would report a committed write as failed)."""
    f = SQLiteFrontier(str(tmp_path / "c.db"))
    real = f._db

    class FailingCheckpoints:
        def __getattr__(self, name: str) -> Any:
            return getattr(real, name)

        def execute(self, sql: str, *args: Any) -> Any:
            if "wal_checkpoint" in sql:
                raise sqlite3.OperationalError("disk I/O error")
            return real.execute(sql, *args)

    f._db = FailingCheckpoints()  # type: ignore[assignment]
    f._checkpointer.restart_due = True
    try:
        assert f.add([NewURL("http://h/x", "http://h")], 1.0) == 1
        assert f._checkpointer.catch_ups == 1
    finally:
        f._db = real
        f.close()
    assert SQLiteFrontier(str(tmp_path / "c.db")).stats().urls_by_state["queued"] == 1


def test_none_is_bound_as_null_through_a_registered_adapter(tmp_path: Path) -> None:
    """The backend registers an adapter for None (the sqlite3 module otherwise looks up and
    fails two protocol attributes per None bound); the value stored is still NULL, on every
    statement shape the frontier uses (single, executemany, multi-row VALUES)."""
    assert (type(None), sqlite3.PrepareProtocol) in sqlite3.adapters
    con = sqlite3.connect(tmp_path / "n.db")
    con.execute("CREATE TABLE t (a INTEGER, b TEXT)")
    con.execute("INSERT INTO t VALUES (?, ?)", (1, None))
    con.executemany("INSERT INTO t VALUES (?, ?)", [(2, None), (3, "x")])
    con.execute("INSERT INTO t VALUES (?, ?), (?, ?)", (4, None, None, None))
    rows = con.execute("SELECT a, b, typeof(b) FROM t ORDER BY a IS NULL, a").fetchall()
    assert rows == [
        (1, None, "null"), (2, None, "null"), (3, "x", "text"), (4, None, "null"),
        (None, None, "null"),
    ]  # fmt: skip
    con.close()
    f = SQLiteFrontier(str(tmp_path / "c.db"))
    try:
        f.add([NewURL("http://a/x", "http://a")], 1.0)
        assert f.url_row("http://a/x")["reason"] is None  # type: ignore[index]
    finally:
        f.close()


def test_store_writes_by_host_id_and_by_key_alike(tmp_path: Path) -> None:
    """A transaction finds the hosts level 1 or ``lock_hosts`` read by their ids; any other
    caller of ``pick_urls``, ``grant`` and ``update_hosts`` goes by the host key. Both write
    the same rows."""
    from idemcrawl.frontier.scheduler import lease_from_row
    from idemcrawl.frontier.store import Grant

    results = []
    for by_id in (True, False):
        f = SQLiteFrontier(str(tmp_path / f"s{by_id}.db"))
        try:
            f.add([NewURL(f"http://{h}/{i}", f"http://{h}") for h in "ab" for i in range(3)], 1.0)

            def tx(s: Any, by_id: bool = by_id) -> Any:
                if by_id:
                    assert len(s.ready_hosts(2.0, 8, 10)) == 2
                else:
                    assert s._host_id == {}
                picks = s.pick_urls([("http://a", 2, []), ("http://b", 1, [])], 2.0)
                grants = [
                    Grant(k, [lease_from_row(r, k, 7, "w", 30.0, "page") for r in rows], 0.0, 8,
                          0, 2.5, "1970-01-01", len(rows))
                    for k, rows in sorted(picks.items())
                ]  # fmt: skip
                s.grant(grants, "w", 2.0, 30.0)
                s.update_hosts(("latency_ewma",), [(0.5, "http://a"), (0.25, "http://b")])
                return picks

            picks = f._run(tx)
            log = f._db.execute(
                "SELECT h.host_key, l.url_id, l.in_flight_before FROM lease_log l "
                "JOIN hosts h USING (host_id) ORDER BY l.id"
            ).fetchall()
            hosts = [(h["host_key"], h["queued"], h["in_flight"], h["latency_ewma"],
                      h["next_allowed_at"]) for h in f.host_rows()]  # fmt: skip
            results.append((picks, log, hosts))
        finally:
            f.close()
    assert results[0] == results[1]
    picks, log, hosts = results[0]
    assert [len(picks["http://a"]), len(picks["http://b"])] == [2, 1]
    assert [(k, i) for k, _, i in log] == [("http://a", 0), ("http://a", 1), ("http://b", 0)]
    assert hosts == [("http://a", 1, 2, 0.5, 2.5), ("http://b", 2, 1, 0.25, 2.5)]


def test_the_statement_cache_holds_every_statement_of_a_crawl(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Leases and completions of every batch size run more distinct statements than Python's
    default cache of 128 holds (an ``IN (...)`` list of each length is a statement of its own):
    the frontier's connection keeps them all, so none is evicted and prepared again."""
    seen: set[str] = set()

    class Cursor(sqlite3.Cursor):
        def execute(self, sql: str, *args: Any) -> Any:
            seen.add(sql)
            return super().execute(sql, *args)

        def executemany(self, sql: str, *args: Any) -> Any:
            seen.add(sql)
            return super().executemany(sql, *args)

    class Connection(sqlite3.Connection):
        def cursor(self, factory: Any = Cursor) -> Any:
            return super().cursor(factory)

        def execute(self, sql: str, *args: Any) -> Any:
            seen.add(sql)
            return super().execute(sql, *args)

    connect = sqlite3.connect
    caches: list[int | None] = []

    def connecting(*args: Any, **kw: Any) -> sqlite3.Connection:
        caches.append(kw.get("cached_statements"))
        return connect(*args, factory=Connection, **kw)

    monkeypatch.setattr(sqlite_mod.sqlite3, "connect", connecting)
    f = SQLiteFrontier(str(tmp_path / "c.db"))
    try:
        policy = HostPolicy(max_in_flight=8, delay=0.0)
        hosts = [f"http://h{h}.example" for h in range(12)]
        f.add([NewURL(f"{h}/p/{n}", h) for h in hosts for n in range(80)], 0.0)
        now = 1.0
        for want in [*range(1, 65), *range(64, 0, -3)]:
            now += 1.0
            leases = f.lease("w", want, now, 60, policy)
            links = [NewURL(f"{ls.url}/x", ls.host_key) for ls in leases[: want % 5]]
            done = [Completion(ls, 200, now, links=links if i == 0 else []) for i, ls in
                    enumerate(leases)]  # fmt: skip
            assert all(f.complete(done, now, policy))
    finally:
        f.close()
    assert sqlite_mod._CACHED_STATEMENTS in caches
    assert 128 < len(seen) <= sqlite_mod._CACHED_STATEMENTS
