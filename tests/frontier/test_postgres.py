"""PostgreSQL-specific behaviour: migrations, schema isolation, connection loss, heavy concurrency.

The shared contract suite (``test_contract.py``) already runs against this backend; these tests
cover what only a client/server database has. They need the server named by
``IDEMCRAWL_TEST_PG_DSN`` and fail (in CI) or skip (elsewhere) without it, see ``conftest.py``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import math
import re
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest

from idemcrawl.frontier.base import (
    Completion,
    FrontierError,
    HostPolicy,
    Lease,
    NewURL,
    RecordWrite,
)

from .conftest import drop_pg_schema, require_postgres

T0 = 1_000_000.0
FAST = HostPolicy(max_in_flight=8, delay=0.0)


def _urls(host: str, n: int, start: int = 0) -> list[NewURL]:
    return [NewURL(f"{host}/p{i}", host) for i in range(start, start + n)]


@pytest.fixture
def dsn() -> str:
    return require_postgres()


@pytest.fixture
def new_schema(dsn: str) -> Iterator[Callable[[], str]]:
    """Fresh schema names for a test; all of them are dropped afterwards."""
    made: list[str] = []

    def make() -> str:
        name = "t_" + uuid.uuid4().hex[:20]
        made.append(name)
        return name

    yield make
    for name in made:
        drop_pg_schema(name)


@pytest.fixture
def admin(dsn: str) -> Iterator[Any]:
    """A separate autocommit connection: another client of the same server."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        yield conn


def _open(dsn: str, schema: str, **kw: Any) -> Any:
    from idemcrawl.frontier.postgres import PostgresFrontier

    return PostgresFrontier(dsn, schema=schema, **kw)


def _versions(admin: Any, schema: str) -> list[int]:
    from psycopg import sql

    rows = admin.execute(
        sql.SQL("SELECT version FROM {}.schema_version ORDER BY version").format(
            sql.Identifier(schema)
        )
    ).fetchall()
    return [r[0] for r in rows]


def _url_indexes(admin: Any, schema: str) -> set[str]:
    """The names of the indexes on ``schema``'s ``urls`` table."""
    rows = admin.execute(
        "SELECT indexname FROM pg_indexes WHERE schemaname = %s AND tablename = 'urls'",
        (schema,),
    ).fetchall()
    return {r[0] for r in rows}


# -- migrations and schemas ---------------------------------------------------------------------


def test_migrations_are_versioned_and_idempotent(dsn: str, new_schema, admin) -> None:  # type: ignore[no-untyped-def]
    from idemcrawl.frontier.postgres import SCHEMA_VERSION

    schema = new_schema()
    f = _open(dsn, schema)
    assert f.migrate() == SCHEMA_VERSION
    f.add(_urls("http://a", 2), T0)
    f.close()
    g = _open(dsn, schema)
    assert g.migrate() == SCHEMA_VERSION
    assert g.stats().urls_by_state["queued"] == 2  # reopening kept the data
    g.close()
    assert _versions(admin, schema) == list(range(1, SCHEMA_VERSION + 1))


def _schema_at_version(admin: Any, schema: str, version: int, *, start: int = 1) -> None:
    """Apply migrations ``start``..``version`` in ``schema`` (created, with its version table,
    when ``start`` is 1), as an older idemcrawl left it; ``search_path`` stays on ``schema``."""
    from psycopg import sql

    from idemcrawl.frontier.postgres_schema import MIGRATIONS

    if start == 1:
        admin.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    admin.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
    if start == 1:
        admin.execute(
            "CREATE TABLE schema_version (version INTEGER PRIMARY KEY, "
            "applied_at TIMESTAMPTZ NOT NULL DEFAULT now())"
        )
    for v in range(start, version + 1):
        for stmt in MIGRATIONS[v - 1]:
            admin.execute(stmt)
        admin.execute("INSERT INTO schema_version (version) VALUES (%s)", (v,))


def _catalog(admin: Any, schema: str) -> dict[str, list[tuple[Any, ...]]]:
    """What a schema is made of, with its own name taken out: columns (type, default,
    nullability, position), indexes, constraints, triggers and functions."""
    queries = {
        "columns": (
            "SELECT table_name, column_name, ordinal_position, data_type, column_default, "
            "is_nullable, is_generated, generation_expression FROM information_schema.columns "
            "WHERE table_schema = %s"
        ),
        "indexes": "SELECT tablename, indexname, indexdef FROM pg_indexes WHERE schemaname = %s",
        "constraints": (
            "SELECT conrelid::regclass::text, conname, pg_get_constraintdef(c.oid) "
            "FROM pg_constraint c JOIN pg_namespace n ON n.oid = c.connamespace "
            "WHERE n.nspname = %s"
        ),
        "triggers": (
            "SELECT tgname, pg_get_triggerdef(t.oid) FROM pg_trigger t "
            "JOIN pg_class c ON c.oid = t.tgrelid JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = %s AND NOT t.tgisinternal"
        ),
        "functions": (
            "SELECT proname, pg_get_functiondef(p.oid) FROM pg_proc p "
            "JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = %s"
        ),
        "relations": (
            "SELECT relname, relkind, reloptions FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s"
        ),
    }
    out = {}
    for name, query in queries.items():
        rows = admin.execute(query, (schema,)).fetchall()
        out[name] = sorted(
            tuple(str(v).replace(schema, "<schema>") if v is not None else None for v in row)
            for row in rows
        )
    return out


def test_a_new_crawl_s_schema_is_the_one_its_migrations_build(dsn: str, new_schema, admin) -> None:  # type: ignore[no-untyped-def]
    """A new crawl runs every migration in one transaction (``_create_fresh``); an older
    crawl's upgrade runs them one by one. Both must end at the same schema, or a crawl created
    today and one upgraded to today would behave differently."""
    from idemcrawl.frontier.store import SCHEMA_VERSION

    chained, fresh = new_schema(), new_schema()
    _schema_at_version(admin, chained, SCHEMA_VERSION)
    admin.execute("RESET search_path")
    _open(dsn, fresh).close()
    assert _versions(admin, fresh) == list(range(1, SCHEMA_VERSION + 1))
    built, created = _catalog(admin, chained), _catalog(admin, fresh)
    assert len(created["columns"]) > 100 and len(created["functions"]) >= 4
    for part in built:
        assert created[part] == built[part], part


def test_a_version_5_schema_migrates_in_place(dsn: str, new_schema, admin) -> None:  # type: ignore[no-untyped-def]
    """Version 6 in place on a version-5 schema: URL rows get their host's id instead of its
    key, the state index goes, per-state totals start from a count; rows, host counts and
    leases survive, and the new triggers keep counting."""
    from idemcrawl.frontier.store import SCHEMA_VERSION

    from .v5_crawl import check_migrated, write_v5_rows

    schema = new_schema()
    _schema_at_version(admin, schema, 5)
    write_v5_rows(admin.execute, "%s")  # version 5's triggers count the hosts
    admin.execute("RESET search_path")
    f = _open(dsn, schema)
    try:
        assert _versions(admin, schema) == list(range(1, SCHEMA_VERSION + 1))
        indexes = _url_indexes(admin, schema)
        assert not {"urls_state", "urls_due"} & indexes
        assert {"urls_queue", "urls_deferred"} <= indexes
        check_migrated(f)
    finally:
        f.close()


def test_a_version_6_schema_migrates_in_place(dsn: str, new_schema, admin) -> None:  # type: ignore[no-untyped-def]
    """Version 7 on a real version-6 schema (a version-5 crawl that migration 6 carried over,
    then a URL added and a lease granted by version 6's triggers): the count triggers keep to
    index probes of hosts, rows, counts and leases survive, and the triggers keep counting."""
    from idemcrawl.frontier.store import SCHEMA_VERSION

    from .v5_crawl import T0 as V5_T0
    from .v5_crawl import URLS as V5_URLS
    from .v5_crawl import expected_states, write_v5_rows

    schema = new_schema()
    _schema_at_version(admin, schema, 5)
    write_v5_rows(admin.execute, "%s")  # version 5's triggers count the hosts
    _schema_at_version(admin, schema, 6, start=6)
    # Version 6 at work: a URL on a new host, then a lease of it, counted by its triggers.
    admin.execute("INSERT INTO hosts (host_key) VALUES ('http://e')")
    admin.execute(
        "INSERT INTO urls (url, host_id, due_at) "
        "SELECT 'http://e/1', host_id, %s FROM hosts WHERE host_key = 'http://e'",
        (V5_T0,),
    )
    admin.execute(
        "UPDATE urls SET state = 'leased', lease_owner = 'w', lease_token = 9, "
        "lease_expires_at = %s WHERE url = 'http://e/1'",
        (V5_T0 + 5,),
    )
    assert admin.execute(
        "SELECT queued, in_flight FROM hosts WHERE host_key = 'http://e'"
    ).fetchone() == (0, 1)
    admin.execute("RESET search_path")
    f = _open(dsn, schema)
    try:
        assert _versions(admin, schema) == list(range(1, SCHEMA_VERSION + 1))
        configs = {
            name: set(config)
            for name, config in admin.execute(
                "SELECT p.proname, p.proconfig FROM pg_proc p JOIN pg_namespace n "
                "ON n.oid = p.pronamespace WHERE n.nspname = %s AND p.proname LIKE 'urls_count_%%'",
                (schema,),
            ).fetchall()
        }
        assert configs == {
            fn: {f"search_path={schema}", "enable_hashjoin=off", "enable_mergejoin=off"}
            for fn in ("urls_count_insert", "urls_count_update", "urls_count_delete")
        }
        rows = {r["url"]: r for r in f.url_rows()}
        assert {u: (r["host_key"], r["state"]) for u, r in rows.items()} == {
            **{u[0]: (u[1], u[2]) for u in V5_URLS},
            "http://e/1": ("http://e", "leased"),
        }
        assert (rows["http://a/4"]["lease_token"], rows["http://e/1"]["lease_token"]) == (7, 9)
        expected = expected_states()
        expected["leased"] += 1
        assert f.stats().urls_by_state == expected

        def host_counts() -> dict[str, tuple[int, int]]:
            return {h["host_key"]: (h["queued"], h["in_flight"]) for h in f.host_rows()}

        assert host_counts() == {
            "http://a": (3, 1), "http://b": (0, 0), "http://c": (0, 0), "http://e": (0, 1),
        }  # fmt: skip
        # The migrated triggers keep counting: expiries, an add, a lease.
        assert f.expire(V5_T0 + 10) == 2
        added = [NewURL("http://e/2", "http://e"), NewURL("http://a/1", "http://a")]
        assert f.add(added, V5_T0) == 1
        leased = f.lease("w2", 10, V5_T0, 30, FAST)
        # (the expired ones wait out their retry delay, queued)
        assert sorted(ls.url for ls in leased) == [
            "http://a/1", "http://a/2", "http://a/3", "http://e/2",
        ]  # fmt: skip
        assert host_counts() == {
            "http://a": (1, 3), "http://b": (0, 0), "http://c": (0, 0), "http://e": (1, 1),
        }  # fmt: skip
        counted = dict.fromkeys(expected, 0)
        for r in f.url_rows():
            counted[r["state"]] += 1
        assert f.stats().urls_by_state == counted
    finally:
        f.close()


def test_a_version_7_schema_migrates_to_the_btree_url_key(dsn: str, new_schema, admin) -> None:  # type: ignore[no-untyped-def]
    """Version 9 on a version-7 crawl (8 changes SQLite only): the hash exclusion constraint
    goes, every row gets its ``url_key`` and the b-tree ``urls_key``; known URLs stay known (an
    add of one inserts nothing), new ones are inserted, and a URL's row is found by its text."""
    from idemcrawl.frontier.store import SCHEMA_VERSION

    schema = new_schema()
    _schema_at_version(admin, schema, 7)
    admin.execute("INSERT INTO hosts (host_key) VALUES ('http://a'), ('http://b')")
    admin.execute(
        "INSERT INTO urls (url, host_id, due_at) SELECT h.host_key || '/p' || i, h.host_id, %s "
        "FROM hosts h, generate_series(0, 9) i",
        (T0,),
    )
    admin.execute(
        "UPDATE urls SET state = 'leased', lease_owner = 'w', lease_token = 5, "
        "lease_expires_at = %s WHERE url = 'http://a/p3'",
        (T0 + 5,),
    )
    admin.execute("RESET search_path")
    f = _open(dsn, schema)
    try:
        assert _versions(admin, schema) == list(range(1, SCHEMA_VERSION + 1))
        admin.execute(f"SET search_path TO {schema}")
        indexes = _url_indexes(admin, schema)
        assert "urls_key" in indexes and "urls_url" not in indexes
        assert admin.execute(
            "SELECT count(*) FROM pg_constraint WHERE conrelid = 'urls'::regclass AND contype = 'x'"
        ).fetchone() == (0,)
        assert admin.execute(
            "SELECT count(*), count(*) FILTER (WHERE url_key = url_key_of(url)) FROM urls"
        ).fetchone() == (20, 20)
        # a host's URLs share the key's high half
        assert admin.execute(
            "SELECT count(DISTINCT url_key >> 32) FROM urls GROUP BY host_id"
        ).fetchall() == [(1,), (1,)]
        admin.execute("RESET search_path")
        assert f.add(_urls("http://a", 12), T0) == 2  # p10, p11
        assert f.add(_urls("http://b", 10), T0) == 0
        row = f.url_row("http://a/p3")
        assert row is not None and (row["state"], row["lease_token"]) == ("leased", 5)
        assert f.url_row("http://a/p11") is not None and f.url_row("http://a/p12") is None
        states = f.stats().urls_by_state
        assert (states["queued"], states["leased"], sum(states.values())) == (21, 1, 22)
    finally:
        f.close()


def test_version_10_samples_only_the_columns_plans_use(dsn: str, new_schema, admin) -> None:  # type: ignore[no-untyped-def]
    """Version 10 on a version-9 crawl: ANALYZE keeps statistics of the columns the
    scheduling statements plan on (state, host_id, due_at, ...) and skips the URL's text, its
    fetch facts and the record bodies, whose sorting was most of an ANALYZE's cost."""
    from idemcrawl.frontier.store import SCHEMA_VERSION

    schema = new_schema()
    _schema_at_version(admin, schema, 9)
    admin.execute("INSERT INTO hosts (host_key) VALUES ('http://a'), ('http://b')")
    admin.execute(
        "INSERT INTO urls (url, host_id, due_at, etag) SELECT h.host_key || '/p' || i, "
        "h.host_id, %s, 'e' || i FROM hosts h, generate_series(0, 99) i",
        (T0,),
    )
    admin.execute("RESET search_path")
    f = _open(dsn, schema)
    try:
        assert _versions(admin, schema) == list(range(1, SCHEMA_VERSION + 1))
        assert f.add(_urls("http://a", 102), T0) == 2  # known URLs stay known
        admin.execute(f"ANALYZE {schema}.urls")
        analyzed = {
            r[0]
            for r in admin.execute(
                "SELECT attname FROM pg_stats WHERE schemaname = %s AND tablename = 'urls'",
                (schema,),
            ).fetchall()
        }
        assert {"url_id", "url_key", "host_id", "state", "priority", "due_at", "kind"} <= analyzed
        assert not analyzed & {"url", "etag", "content_hash", "lease_token"}, analyzed
    finally:
        f.close()


def test_version_11_indexes_only_urls_with_a_refetch_time(dsn: str, new_schema, admin) -> None:  # type: ignore[no-untyped-def]
    """Version 11 on a version-10 crawl: ``urls_refetch`` holds only done URLs that have a
    refetch time (a crawl without recrawl gave it an entry per page that nothing read); the
    rounds and ``progress`` still find the due ones through it."""
    from idemcrawl.frontier.store import SCHEMA_VERSION

    schema = new_schema()
    _schema_at_version(admin, schema, 10)
    admin.execute("INSERT INTO hosts (host_key) VALUES ('http://a')")
    admin.execute(
        "INSERT INTO urls (url, host_id, state, due_at, next_fetch_at) "
        "SELECT 'http://a/p' || i, host_id, 'done', %s, "
        "CASE WHEN i %% 10 = 0 THEN %s + i END FROM hosts, generate_series(0, 99) i",
        (T0, T0),
    )
    admin.execute("RESET search_path")
    f = _open(dsn, schema)
    try:
        assert _versions(admin, schema) == list(range(1, SCHEMA_VERSION + 1))
        (definition,) = admin.execute(
            "SELECT indexdef FROM pg_indexes WHERE schemaname = %s AND indexname = 'urls_refetch'",
            (schema,),
        ).fetchone()
        assert "next_fetch_at IS NOT NULL" in definition
        # CREATE INDEX counts the entries it wrote: 10 URLs of 100 have a refetch time.
        assert admin.execute(
            "SELECT reltuples FROM pg_class WHERE relname = 'urls_refetch' "
            "AND relnamespace = %s::regnamespace",
            (schema,),
        ).fetchone() == (10,)
        admin.execute(f"SET search_path TO {schema}")
        with admin.transaction():
            admin.execute("SET LOCAL enable_seqscan = off")
            admin.execute("SET LOCAL enable_bitmapscan = off")
            plan = "\n".join(
                r[0]
                for r in admin.execute(
                    "EXPLAIN SELECT url_id FROM urls WHERE state = 'done' "
                    "AND next_fetch_at <= 1e12 ORDER BY next_fetch_at LIMIT 5"
                ).fetchall()
            )
        assert "urls_refetch" in plan, plan
        admin.execute("RESET search_path")
        assert f.progress(T0).next_refetch_at == T0
        assert f.reschedule_due(T0 + 25, 100) == 3  # p0, p10, p20
        assert f.progress(T0).next_refetch_at == T0 + 30
        assert f.stats().urls_by_state["queued"] == 3
    finally:
        f.close()


def test_version_13_lists_the_urls_a_crawl_failed_before(dsn: str, new_schema, admin) -> None:  # type: ignore[no-untyped-def]
    """Version 13 on a version-12 crawl: its failed URLs are copied into ``failures`` by
    their reason (or their last error, when an older version kept no reason), failed at their
    due time, without a traceback; URLs in other states are not."""
    from idemcrawl.frontier.store import SCHEMA_VERSION

    schema = new_schema()
    _schema_at_version(admin, schema, 12)
    admin.execute("INSERT INTO hosts (host_key) VALUES ('http://a')")
    admin.execute(
        "INSERT INTO urls (url, host_id, state, reason, last_error, due_at) "
        "SELECT 'http://a/p' || i, host_id, CASE WHEN i < 3 THEN 'failed' ELSE 'done' END, "
        "CASE WHEN i > 0 THEN 'HTTP 500' END, 'boom', %s + i "
        "FROM hosts, generate_series(0, 4) i",
        (T0,),
    )
    admin.execute("RESET search_path")
    f = _open(dsn, schema)
    try:
        assert _versions(admin, schema) == list(range(1, SCHEMA_VERSION + 1))
        assert f.failure_reasons(5) == [
            {"reason": "HTTP 500", "urls": 2, "url": "http://a/p1", "trace": None,
             "failed_at": T0 + 1},
            {"reason": "boom", "urls": 1, "url": "http://a/p0", "trace": None, "failed_at": T0},
        ]  # fmt: skip
    finally:
        f.close()


def test_urls_with_the_same_key_are_two_urls(dsn: str, new_schema, admin) -> None:  # type: ignore[no-untyped-def]
    """``url_key`` is a hash: two URLs of a host may share it. Each is still its own URL
    (inserted once, found by its text), because the key only narrows the search."""
    schema = new_schema()
    f = _open(dsn, schema)
    try:
        # two paths of one host whose keys collide, found among 300,000 candidates
        pair = admin.execute(
            "SELECT min(u), max(u) FROM (SELECT 'http://c/x' || i AS u "
            "FROM generate_series(1, 300000) i) AS t "
            "GROUP BY hashtext(u) HAVING count(*) > 1 ORDER BY 1 LIMIT 1"
        ).fetchone()
        assert pair is not None
        a, b = pair
        assert admin.execute(
            f"SELECT {schema}.url_key_of(%s) = {schema}.url_key_of(%s)", (a, b)
        ).fetchone() == (True,)
        assert f.add([NewURL(a, "http://c")], T0) == 1
        assert f.add([NewURL(a, "http://c"), NewURL(b, "http://c")], T0) == 1
        assert f.add([NewURL(b, "http://c"), NewURL(a, "http://c")], T0) == 0
        assert {u["url"] for u in f.url_rows()} == {a, b}
        ra, rb = f.url_row(a), f.url_row(b)
        assert ra is not None and rb is not None and ra["url_id"] != rb["url_id"]
        assert (ra["url"], rb["url"]) == (a, b)
        assert f.existing_urls([a, b, "http://c/none"]) == {a, b}
    finally:
        f.close()


def test_concurrent_adds_of_the_same_urls_insert_each_once(dsn: str, new_schema) -> None:  # type: ignore[no-untyped-def]
    """I1 without a unique constraint (schema 9): the URL key is not unique, so the frontier
    keeps each URL once through the host locks its inserts hold. Four processes' connections
    add the same URLs at the same moment, on hosts that exist and on hosts none of them has
    created yet (the case the lock taken with the new host's id is for), round after round:
    every URL is inserted once, and the adds' counts of new URLs sum to the URLs."""
    schema = new_schema()
    frontiers = [_open(dsn, schema) for _ in range(4)]
    try:
        frontiers[0].add(_urls("http://old", 1), T0)
        total = 0

        def add(f: Any, urls: list[NewURL], gate: threading.Barrier, out: list[Any]) -> None:
            try:
                gate.wait()
                out.append(f.add(list(reversed(urls)) if len(out) % 2 else urls, T0))
            except BaseException as exc:
                out.append(exc)

        for rnd in range(12):
            batch = _urls("http://old", 30, start=1 + 30 * rnd) + [
                u for h in range(6) for u in _urls(f"http://new{rnd}-{h}", 5)
            ]
            total += len(batch)
            gate = threading.Barrier(len(frontiers))
            out: list[Any] = []
            threads = [threading.Thread(target=add, args=(f, batch, gate, out)) for f in frontiers]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert all(isinstance(n, int) for n in out), out
            assert sum(out) == len(batch), (rnd, out)
        rows = frontiers[0].url_rows()
        assert len(rows) == len({r["url"] for r in rows}) == total + 1
    finally:
        for f in frontiers:
            f.close()


def test_inserters_waiting_on_a_new_host_insert_its_urls_once(dsn: str, new_schema) -> None:  # type: ignore[no-untyped-def]
    """The interleaving I1 needs the host lock of ``_HOST_IDS`` for (schema 9's URL key is not
    unique): two transactions find no row to lock for a host a third is creating, so both wait
    on its insert of the host; once it commits, each must take the host's lock before its
    ``NOT EXISTS`` insert, or both insert the same new URL."""
    import psycopg
    from psycopg import sql

    from idemcrawl.frontier.postgres_store import PgStore

    schema = new_schema()
    _open(dsn, schema).close()  # the schema, migrated

    def store() -> tuple[Any, PgStore]:
        conn = psycopg.connect(dsn, autocommit=False)
        conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
        conn.commit()
        return conn, PgStore(conn.cursor(), pipelines=False)

    (c1, s1), (c2, s2), (c3, s3) = store(), store(), store()
    try:
        assert s1.lock_hosts({"http://n"}) == {}
        assert s1.insert_urls([NewURL("http://n/first", "http://n")], T0) == 1  # not committed
        out: list[Any] = []

        def insert(conn: Any, s: PgStore) -> None:
            try:
                s.lock_hosts({"http://n"})  # nothing to lock yet: the host is not committed
                out.append(s.insert_urls([NewURL("http://n/second", "http://n")], T0))
                conn.commit()
            except BaseException as exc:
                out.append(exc)

        threads = [threading.Thread(target=insert, args=a) for a in ((c2, s2), (c3, s3))]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 20
        with psycopg.connect(dsn, autocommit=True) as watch:
            while time.monotonic() < deadline:
                (waiting,) = watch.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                    "AND pid = ANY(%s)",
                    ([c2.info.backend_pid, c3.info.backend_pid],),
                ).fetchone()
                if waiting == 2:
                    break
                time.sleep(0.02)
        assert waiting == 2  # both wait on the first transaction's new host
        c1.commit()
        for t in threads:
            t.join(timeout=30)
        assert sorted(out) == [0, 1], out
        rows = c1.execute("SELECT url FROM urls ORDER BY url").fetchall()
        assert rows == [("http://n/first",), ("http://n/second",)]
    finally:
        for c in (c1, c2, c3):
            c.close()


def test_count_triggers_probe_hosts_by_id_after_a_large_first_batch(  # type: ignore[no-untyped-def]
    dsn: str, new_schema, admin
) -> None:
    """A server process plans its count triggers' statements once, on the first batch it
    writes; a 20,000-URL add planned "UPDATE hosts ... FROM (the batch's hosts)" as a hash join
    over every host, and each later small insert of that process then read the whole hosts
    table (schema 7 keeps them to index probes). Counted in the frontier's own server process,
    in an insert it rolls back: its transaction's sequential scans of hosts."""
    f = _open(dsn, new_schema())
    try:
        hosts = [f"http://h{i:05d}" for i in range(20_000)]
        f.add([NewURL(f"{h}/p", h) for h in hosts], T0)  # the triggers' first, large batch
        conn = f._conn  # the frontier's connection: its server process holds the trigger plans
        assert conn is not None
        host_id = conn.execute(
            "SELECT host_id FROM hosts WHERE host_key = %s", (hosts[7],)
        ).fetchone()[0]
        conn.rollback()
        # The xact view shows the backend's counts not yet flushed to the shared statistics,
        # which on PostgreSQL 15 may include the add's own transactions (flushed at most once a
        # second): count the insert's scans as a difference within its transaction.
        seq_scans = "SELECT seq_scan FROM pg_stat_xact_user_tables WHERE relid = 'hosts'::regclass"
        try:
            before = conn.execute(seq_scans).fetchone()[0]
            conn.execute(
                "INSERT INTO urls (url, host_id, due_at) VALUES (%s, %s, %s)",
                (f"{hosts[7]}/q", host_id, T0),
            )
            scans = conn.execute(seq_scans).fetchone()[0] - before
            queued = conn.execute(
                "SELECT queued FROM hosts WHERE host_id = %s", (host_id,)
            ).fetchone()[0]
        finally:
            conn.rollback()
        assert queued == 2  # the trigger did count it
        assert scans == 0
    finally:
        f.close()


_OPEN_AT = (
    "import sys, time\n"
    "from idemcrawl.frontier.postgres import PostgresFrontier\n"
    "time.sleep(max(0.0, float(sys.argv[3]) - time.time()))\n"
    "f = PostgresFrontier(sys.argv[1], schema=sys.argv[2])\n"
    "print(f.migrate())\n"
    "f.close()\n"
)


def test_concurrent_first_open_from_four_processes(dsn: str, new_schema, admin) -> None:  # type: ignore[no-untyped-def]
    from idemcrawl.frontier.postgres import SCHEMA_VERSION

    for _ in range(3):
        schema = new_schema()
        start_at = f"{time.time() + 1.0:.3f}"  # all four past their imports, then at once
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", _OPEN_AT, dsn, schema, start_at],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for _ in range(4)
        ]
        outs = [p.communicate(timeout=60) for p in procs]
        assert [p.returncode for p in procs] == [0, 0, 0, 0], [err for _, err in outs]
        assert [out.strip() for out, _ in outs] == [str(SCHEMA_VERSION)] * 4
        assert _versions(admin, schema) == list(range(1, SCHEMA_VERSION + 1))


def test_schemas_isolate_crawls(dsn: str, new_schema, admin) -> None:  # type: ignore[no-untyped-def]
    one, two = new_schema(), new_schema()
    f, g = _open(dsn, one), _open(dsn, two)
    f.add(_urls("http://a", 3), T0)
    f.set_meta("k", "one")
    assert g.stats().urls_by_state["queued"] == 0
    assert g.get_meta("k") is None
    assert g.lease("w", 5, T0, 30, FAST) == []
    assert len(f.lease("w", 5, T0, 30, FAST)) == 3
    f.close()
    g.close()
    tables = admin.execute(
        "SELECT table_schema, count(*) FROM information_schema.tables "
        "WHERE table_name = 'urls' AND table_schema = ANY(%s) GROUP BY 1",
        ([one, two, "public"],),
    ).fetchall()
    assert dict(tables) == {one: 1, two: 1}


def test_refuses_newer_schema(dsn: str, new_schema, admin) -> None:  # type: ignore[no-untyped-def]
    from psycopg import sql

    from idemcrawl.frontier.postgres import SCHEMA_VERSION

    schema = new_schema()
    _open(dsn, schema).close()
    admin.execute(
        sql.SQL("INSERT INTO {}.schema_version (version) VALUES (%s)").format(
            sql.Identifier(schema)
        ),
        (SCHEMA_VERSION + 1,),
    )
    with pytest.raises(FrontierError, match="newer than this idemcrawl"):
        _open(dsn, schema)


def test_refuses_foreign_schema_and_missing_crawl(dsn: str, new_schema, admin) -> None:  # type: ignore[no-untyped-def]
    from psycopg import sql

    schema = new_schema()
    admin.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    admin.execute(sql.SQL("CREATE TABLE {}.t (x int)").format(sql.Identifier(schema)))
    with pytest.raises(FrontierError, match="not an idemcrawl crawl"):
        _open(dsn, schema)
    missing = new_schema()
    with pytest.raises(FrontierError, match="no crawl in schema"):
        _open(dsn, missing, create=False)
    _open(dsn, missing).close()
    _open(dsn, missing, create=False).close()


def test_unreachable_server_fails_fast_with_a_clear_error() -> None:
    require_postgres()  # psycopg must be importable
    t = time.monotonic()
    expected = re.escape("cannot connect to PostgreSQL at 127.0.0.1:1/test")
    with pytest.raises(FrontierError, match=expected):
        _open("postgresql://postgres@127.0.0.1:1/test", "t_unused")
    assert time.monotonic() - t < 10


def test_triggers_keep_host_counts_exact(dsn: str, new_schema, admin) -> None:  # type: ignore[no-untyped-def]
    from psycopg import sql

    schema = new_schema()
    f = _open(dsn, schema)
    f.add(_urls("http://a", 5) + _urls("http://b", 3), T0)
    f.add([NewURL("http://c/x", "http://c", state="out_of_scope", reason="scope")], T0)
    leases = f.lease("w", 4, T0, 30, FAST)
    f.complete([Completion(leases[0], 200, T0)], T0, FAST)
    ident = sql.Identifier(schema)
    admin.execute(sql.SQL("DELETE FROM {}.urls WHERE url = 'http://b/p2'").format(ident))
    rows = admin.execute(
        sql.SQL(
            "SELECT h.host_key, h.queued, h.in_flight, "
            "(SELECT count(*) FROM {s}.urls u WHERE u.host_id = h.host_id "
            "AND u.state = 'queued'), "
            "(SELECT count(*) FROM {s}.urls u WHERE u.host_id = h.host_id "
            "AND u.state = 'leased') FROM {s}.hosts h ORDER BY 1"
        ).format(s=ident)
    ).fetchall()
    assert [r[0] for r in rows] == ["http://a", "http://b", "http://c"]
    for host, queued, in_flight, queued_n, leased_n in rows:
        assert (queued, in_flight) == (queued_n, leased_n), host
    # ... and so do the per-state totals, the delete included (schema 6)
    counted = admin.execute(
        sql.SQL("SELECT state, count(*) FROM {}.urls GROUP BY state").format(ident)
    ).fetchall()
    assert {k: v for k, v in f.stats().urls_by_state.items() if v} == dict(counted)
    f.close()


@pytest.mark.parametrize("by_id", [True, False])
def test_grants_write_the_same_rows_by_host_id_or_by_key(  # type: ignore[no-untyped-def]
    dsn: str, new_schema, admin, monkeypatch: pytest.MonkeyPatch, by_id: bool
) -> None:
    # A lease call finds its hosts by the ids level 1 read (PgStore._ids); without them (any
    # other caller of grant) by key. Both write the same lease log, tokens and budgets.
    from psycopg import sql

    from idemcrawl.frontier.postgres_store import PgStore

    seen: list[list[int] | None] = []
    real = PgStore._ids

    def ids(self: PgStore, keys: Any) -> list[int] | None:
        seen.append(real(self, keys) if by_id else None)
        return seen[-1]

    monkeypatch.setattr(PgStore, "_ids", ids)
    schema = new_schema()
    f = _open(dsn, schema)
    f.add(_urls("http://a", 2) + _urls("http://b", 2), T0)
    leases = f.lease("w", 4, T0, 30, HostPolicy(max_in_flight=1, delay=5.0))
    assert sorted(ls.host_key for ls in leases) == ["http://a", "http://b"]
    assert seen and all((s is not None) == by_id for s in seen)
    for host in ("http://a", "http://b"):
        row = f.host_row(host)
        assert row is not None
        assert (row["next_allowed_at"], row["budget_used"]) == (T0 + 5.0, 1)
    logged = admin.execute(
        sql.SQL(
            "SELECT h.host_key, l.url_id FROM {s}.lease_log l "
            "JOIN {s}.hosts h ON h.host_id = l.host_id ORDER BY 1"
        ).format(s=sql.Identifier(schema))
    ).fetchall()
    assert logged == sorted((ls.host_key, ls.url_id) for ls in leases)
    f.close()


def test_a_grant_writes_each_host_once_and_counts_its_urls(dsn: str, new_schema) -> None:  # type: ignore[no-untyped-def]
    """Schema 9: the grant writes its hosts' counts with their tokens, and the count trigger
    skips the grant's UPDATE of urls (it wrote each granted host a second time): one update
    per granted host, counts and per-state totals exact, and the trigger still counts the
    transaction's later updates of urls."""
    from idemcrawl.frontier.store import Grant

    schema = new_schema()
    f = _open(dsn, schema)
    try:
        f.add(_urls("http://a", 3) + _urls("http://b", 2) + _urls("http://c", 1), T0)
        policy = HostPolicy(max_in_flight=2, delay=0.0)
        upd = "SELECT n_tup_upd FROM pg_stat_xact_user_tables WHERE relid = 'hosts'::regclass"

        def tx(s: Any) -> tuple[list[Lease], int]:
            before = s.cur.execute(upd).fetchone()[0]
            leases = f._lease(s, "w", 10, T0, T0 + 30, policy, None)
            return leases, s.cur.execute(upd).fetchone()[0] - before

        leases, updates = f._run(tx)
        assert sorted(ls.url for ls in leases) == [
            "http://a/p0", "http://a/p1", "http://b/p0", "http://b/p1", "http://c/p0",
        ]  # fmt: skip
        assert updates == 3  # one write per granted host
        counts = {h["host_key"]: (h["queued"], h["in_flight"]) for h in f.host_rows()}
        assert counts == {"http://a": (1, 2), "http://b": (0, 2), "http://c": (0, 1)}
        states = f.stats().urls_by_state
        assert (states["queued"], states["leased"]) == (1, 5)

        # After the grant's statement the trigger counts again, in the same transaction.
        def grant_then_requeue(s: Any) -> None:
            got = f._lease(s, "w", 10, T0 + 1, T0 + 31, HostPolicy(max_in_flight=3), None)
            assert [ls.url for ls in got] == ["http://a/p2"]
            s.cur.execute("UPDATE urls SET state = 'queued' WHERE url_id = %s", (got[0].url_id,))

        f._run(grant_then_requeue)
        row = f.host_row("http://a")
        assert row is not None and (row["queued"], row["in_flight"]) == (1, 2)
        states = f.stats().urls_by_state
        assert (states["queued"], states["leased"]) == (1, 5)

        # A grant of a URL that is not queued would count wrongly: refused, nothing written
        # (the grant is one statement with the lease log, the hosts and the counters).
        logged = "SELECT count(*) FROM lease_log"
        before = f._run(lambda s: s.cur.execute(logged).fetchone()[0], write=False)
        counters = f.stats().counters
        g = Grant("http://a", [leases[0]], 0.0, 2, 0, T0, "1970-01-12", 1)

        def bad_grant(s: Any) -> None:
            s.bump("leases_granted", 1)
            s.grant([g], "w", T0, T0 + 30)

        with pytest.raises(FrontierError, match="found 0 of its 1 URLs queued"):
            f._run(bad_grant)
        row = f.host_row("http://a")
        assert row is not None and (row["queued"], row["in_flight"]) == (1, 2)
        assert f._run(lambda s: s.cur.execute(logged).fetchone()[0], write=False) == before
        assert f.stats().counters == counters
        states = f.stats().urls_by_state
        assert (states["queued"], states["leased"]) == (1, 5)
        # ... and so is a grant of two URLs of which one is not queued any more
        (fresh,) = f.lease("w", 1, T0 + 5, 30, HostPolicy(max_in_flight=3, delay=0.0))
        g2 = Grant("http://a", [fresh, leases[1]], 0.0, 3, 2, T0, "1970-01-12", 2)
        f._run(
            lambda s: s.cur.execute(
                "UPDATE urls SET state = 'queued' WHERE url_id = %s", (fresh.url_id,)
            )
        )
        with pytest.raises(FrontierError, match="found 1 of its 2 URLs queued"):
            f._run(lambda s: s.grant([g2], "w", T0 + 5, T0 + 35))
        assert f.url_row(fresh.url)["state"] == "queued"
    finally:
        f.close()


def test_a_lease_call_is_five_statements_in_three_round_trips(  # type: ignore[no-untyped-def]
    dsn: str, new_schema, monkeypatch
) -> None:
    """A lease call on PostgreSQL: BEGIN with the expiry check, the pause flag, level 1 and
    the transaction id (one statement); level 2; the grant with its counters and its own
    check (one statement) and COMMIT (the count trigger's setting ends with the transaction):
    five statements in three round trips (13 in 9 in session 9, 6 in 5 in session 10).
    Request specs are read only for URLs that have one."""
    from idemcrawl.frontier.sql import SQLStore
    from idemcrawl.lab.bench.dbcost import count_pg_wire

    f = _open(dsn, new_schema())
    try:
        f._stats_due_at = math.inf  # no statistics check in the traced calls
        f.add(_urls("http://a", 3) + _urls("http://b", 3), T0)
        asked: list[list[int]] = []
        real = SQLStore.requests_of

        def requests_of(self: Any, ids: Sequence[int]) -> Any:
            asked.append(list(ids))
            return real(self, ids)

        monkeypatch.setattr(SQLStore, "requests_of", requests_of)
        assert f._conn is not None
        two = HostPolicy(max_in_flight=2, delay=0.0)  # two URLs of each host: one level 2
        with count_pg_wire(f._conn) as wire:
            leases = f.lease("w", 4, T0, 30, two)
        assert len(leases) == 4 and all(ls.request is None for ls in leases)
        assert (wire.statements, wire.round_trips) == (5, 3)
        # One write to the socket per round trip (``pipeline_sending_once``): psycopg alone
        # sends after every statement it queues (8 sends here, 11 and 17 below).
        assert wire.sends in (None, 3)  # None: the kernel does not count (not TCP on Linux)
        assert asked == []
        assert f.stats().counters["leases_granted"] == 4
        # A URL with a spec: its spec (and only its) is read, in one more round trip.
        from idemcrawl.frontier.base import RequestSpec

        spec = RequestSpec(callback="parse_item")
        f.add([NewURL("http://c/item", "http://c", request=spec)], T0)
        three = HostPolicy(max_in_flight=3, delay=0.0)  # one URL of each of the three hosts
        with count_pg_wire(f._conn) as wire:
            got = {ls.url: ls for ls in f.lease("w", 8, T0, 30, three)}
        assert got["http://c/item"].request == spec
        assert [ls.request for u, ls in got.items() if u != "http://c/item"] == [None] * 2
        assert asked == [[got["http://c/item"].url_id]]
        assert (wire.statements, wire.round_trips) == (6, 4)
        assert wire.sends in (None, 4)
        assert f.stats().counters["leases_granted"] == 7
    finally:
        f.close()


def test_a_lease_call_after_an_expiry_or_a_pause_takes_the_steps_one_by_one(  # type: ignore[no-untyped-def]
    dsn: str, new_schema, monkeypatch
) -> None:
    """When the lease call's first statement finds an expired lease (or the pause flag), it
    locks and reads no host: the call expires the leases, checks the flag, then reads level 1,
    and its grants and counts are those of the steps one by one."""
    from idemcrawl.frontier.postgres_store import PgStore

    f = _open(dsn, new_schema())
    try:
        f.add(_urls("http://a", 2), T0)
        assert len(f.lease("dead", 1, T0, 10, HostPolicy(max_in_flight=1, delay=0.0))) == 1
        f.add(_urls("http://b", 1), T0)
        firsts: list[list[Any] | None] = []
        real = PgStore.first_ready_hosts

        def first(self: PgStore, now: float, mif: int, limit: int) -> Any:
            rows = real(self, now, mif, limit)
            firsts.append(rows)
            return rows

        monkeypatch.setattr(PgStore, "first_ready_hosts", first)
        got = f.lease("w", 10, T0 + 11, 300, HostPolicy(max_in_flight=1, delay=0.0))
        assert firsts == [None]
        assert sorted(ls.host_key for ls in got) == ["http://a", "http://b"]
        s = f.stats()
        assert s.counters["lease_expiries"] == 1 and s.counters["leases_granted"] == 3
        f.control("pause")
        assert f.lease("w", 10, T0 + 50, 30, FAST) == []
        assert firsts[-1] is None
        f.control("resume")
        assert len(f.lease("w", 10, T0 + 50, 30, FAST)) == 1
        assert firsts[-1] is not None and [h.host_key for h in firsts[-1]] == ["http://a"]
        counted: dict[str, list[int]] = {}
        for row in f.url_rows():
            c = counted.setdefault(row["host_key"], [0, 0])
            c[0] += row["state"] == "queued"
            c[1] += row["state"] == "leased"
        kept = {h["host_key"]: [h["queued"], h["in_flight"]] for h in f.host_rows()}
        assert counted == kept
    finally:
        f.close()


def test_a_completion_counts_its_own_urls_exactly(dsn: str, new_schema) -> None:  # type: ignore[no-untyped-def]
    """The completion counts the URLs its fenced update moved (schema 9's skip, as the grant
    does): each completed host is written once, its in_flight lowered with its politeness
    state, and the counts stay exact with a duplicate completion, a fenced-out one, one
    completed twice and a transaction that writes no host state (``precommit`` then lowers
    the in_flight); the trigger still counts the links' insert."""
    from .conftest import queued_and_leased_by_host

    schema = new_schema()
    f = _open(dsn, schema)
    try:
        f.add(_urls("http://a", 4) + _urls("http://b", 3) + _urls("http://c", 2), T0)
        policy = HostPolicy(max_in_flight=4, delay=0.0)
        leases = f.lease("w", 20, T0, 30, policy)
        assert len(leases) == 9
        by_host: dict[str, list[Lease]] = {}
        for ls in leases:
            by_host.setdefault(ls.host_key, []).append(ls)
        a, b, c = by_host["http://a"], by_host["http://b"], by_host["http://c"]
        stale = dataclasses.replace(a[1], token=a[1].token + 1)
        link = NewURL("http://c/new", "http://c")
        batch = [
            Completion(a[0], 200, T0 + 1, latency=0.1),
            Completion(a[0], 200, T0 + 1, latency=0.1),  # the same lease again
            Completion(stale, 200, T0 + 1),  # fenced out
            Completion(b[0], 200, T0 + 1, links=[link], latency=0.2),
            Completion(b[1], 200, T0 + 1, latency=0.2),
        ]
        upd = "SELECT n_tup_upd FROM pg_stat_xact_user_tables WHERE relid = 'hosts'::regclass"

        def tx(s: Any) -> tuple[list[bool], int]:
            before = s.cur.execute(upd).fetchone()[0]
            got = f._complete(s, batch, T0 + 1, policy)
            return got, s.cur.execute(upd).fetchone()[0] - before

        accepted, updates = f._run(tx)
        assert accepted == [True, False, False, True, True]
        # a and b once each (politeness state and in_flight), c by the links' insert trigger
        assert updates == 3

        def check(done: int, leased: int, queued: int) -> None:
            counted, kept = queued_and_leased_by_host(f)
            assert counted == kept
            by_state = {r["state"]: 0 for r in f.url_rows()}
            for r in f.url_rows():
                by_state[r["state"]] += 1
            assert {k: v for k, v in f.stats().urls_by_state.items() if v} == by_state
            assert (by_state.get("done"), by_state.get("leased"), by_state.get("queued")) == (
                done, leased, queued,
            )  # fmt: skip

        check(done=3, leased=6, queued=1)
        # Completed again (and the stale token once more): rejected, nothing counted.
        assert f.complete([Completion(a[0], 200, T0 + 2), Completion(stale, 200, T0 + 2)],
                          T0 + 2, policy) == [False, False]  # fmt: skip
        check(done=3, leased=6, queued=1)

        # No host write in the transaction: precommit lowers the in_flight itself.
        def finish_only(s: Any) -> list[bool]:
            s.lock_hosts(["http://c"], read=["http://c"])
            return s.finish([Completion(c[0], 200, T0 + 3), Completion(c[0], 200, T0 + 3)])

        assert f._run(finish_only) == [True, False]
        check(done=4, leased=5, queued=1)
        row = f.host_row("http://c")
        assert row is not None and (row["queued"], row["in_flight"]) == (1, 1)
    finally:
        f.close()


def test_a_completion_reads_its_hosts_once_and_updates_them_by_id(  # type: ignore[no-untyped-def]
    dsn: str, new_schema, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The completion's lock of its hosts (and its links' hosts) keeps their ids: the links'
    # insert does not read them again, and the hosts' new state is written by id.
    import psycopg

    from idemcrawl.frontier import postgres_store

    f = _open(dsn, new_schema())
    f.add(_urls("http://a", 2) + _urls("http://b", 2), T0)
    leases = f.lease("w", 2, T0, 30, HostPolicy(max_in_flight=1, delay=0.0))
    assert len(leases) == 2
    sent: list[str] = []
    real = psycopg.Cursor.execute

    def execute(self: Any, query: Any, *args: Any, **kw: Any) -> Any:
        sent.append(str(query))
        return real(self, query, *args, **kw)

    monkeypatch.setattr(psycopg.Cursor, "execute", execute)
    links = [NewURL("http://a/new", "http://a"), NewURL("http://b/new", "http://b")]
    done = [Completion(ls, 200, T0 + 1, links=links, latency=0.5) for ls in leases]
    assert f.complete(done, T0 + 1, FAST) == [True, True]
    assert postgres_store._HOST_IDS not in sent
    assert any("WHERE h.host_id = v.host" in q for q in sent)
    for host in ("http://a", "http://b"):
        row = f.host_row(host)
        assert row is not None and row["latency_ewma"] == pytest.approx(0.5), host
    assert f.url_row("http://a/new") is not None and f.url_row("http://b/new") is not None
    f.close()


def test_a_commit_sends_its_writes_with_the_statements_that_need_answers(  # type: ignore[no-untyped-def]
    dsn: str, new_schema
) -> None:
    """A completion batch with records, links and events is 3 round trips (9 in session 9,
    5 in session 10) and 11 statements (13 in session 11): BEGIN with the lock of its hosts
    and the fence (which sets the count trigger's switch and returns the transaction's id);
    the links' insert (with the hosts' state and the records before it); the counters (with
    the events' lock and insert before them) and COMMIT; and every write landed."""
    import psycopg

    from idemcrawl.lab.bench import dbcost

    if not psycopg.Pipeline.is_supported():
        pytest.skip("libpq without pipeline mode: statements run one by one")
    f = _open(dsn, new_schema())
    try:
        f.add(_urls("http://a", 3) + _urls("http://b", 3), T0)
        leases = f.lease("w", 6, T0, 30, FAST)
        assert len(leases) == 6
        batch = [_page(ls, T0 + 1) for ls in leases]
        with dbcost.count_pg_wire(f._conn) as seen:
            assert f.complete(batch, T0 + 1, FAST) == [True] * 6
        assert (seen.statements, seen.round_trips) == (11, 3)
        assert seen.sends in (None, 3)  # 17 without ``pipeline_sending_once``
        s = f.stats()
        assert (s.urls_by_state["done"], s.urls_by_state["queued"]) == (6, 12)
        assert (s.events, s.records) == (6, 6)
        assert (s.counters["fetches"], s.counters["links_new"]) == (6, 12)
        for host in ("http://a", "http://b"):
            row = f.host_row(host)
            assert row is not None and (row["queued"], row["in_flight"]) == (6, 0), host
            assert row["next_allowed_at"] >= T0 + 1
    finally:
        f.close()


# -- connection loss ----------------------------------------------------------------------------


def _page(lease: Lease, now: float, n_links: int = 2) -> Completion:
    rec = RecordWrite.make("s", lease.url, {"url": lease.url})
    links = [NewURL(f"{lease.url}/l{i}", lease.host_key) for i in range(n_links)]
    return Completion(lease, 200, now, [rec], links, "h", 10)


def test_connection_killed_between_operations_is_survived(dsn: str, new_schema, admin) -> None:  # type: ignore[no-untyped-def]
    f = _open(dsn, new_schema())
    f.add(_urls("http://a", 3), T0)
    leases = f.lease("w", 3, T0, 30, FAST)
    assert len(leases) == 3
    for i, lease in enumerate(leases):
        pid = f.backend_pid
        admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        assert f.complete([_page(lease, T0 + i)], T0 + i, FAST) == [True]
        assert f.backend_pid != pid  # it reconnected
    admin.execute("SELECT pg_terminate_backend(%s)", (f.backend_pid,))
    s = f.stats()
    assert s.urls_by_state["done"] == 3
    assert s.urls_by_state["queued"] == 6  # the links
    assert (s.events, s.records) == (3, 3)
    assert s.counters["fetches"] == 3
    assert s.counters["links_new"] == 6
    assert "completions_rejected" not in s.counters
    p = f.progress(T0 + 5)
    assert (p.queued, p.leased) == (6, 0)
    f.close()


def _kill_then(admin: Any, f: Any, real: Callable[[Any], None], *, commit_first: bool):  # type: ignore[no-untyped-def]
    """A COMMIT that loses its connection once: before the server gets it, or after it
    committed but before the acknowledgement arrives."""
    import psycopg

    fired: list[bool] = []

    def commit(conn: Any) -> None:
        if fired:
            real(conn)
            return
        fired.append(True)
        if commit_first:
            real(conn)
        admin.execute("SELECT pg_terminate_backend(%s)", (f.backend_pid,))
        if commit_first:
            raise psycopg.OperationalError("simulated: acknowledgement of COMMIT lost")
        time.sleep(0.1)  # let the server end the backend before COMMIT reaches it
        real(conn)

    return commit, fired


@pytest.mark.parametrize("commit_first", [False, True], ids=["lost-before", "ack-lost-after"])
def test_commit_interrupted_by_connection_loss_applies_once(  # type: ignore[no-untyped-def]
    dsn: str, new_schema, admin, monkeypatch: pytest.MonkeyPatch, commit_first: bool
) -> None:
    f = _open(dsn, new_schema())
    f.add(_urls("http://a", 2), T0)
    a, b = f.lease("w", 2, T0, 30, FAST)
    commit, fired = _kill_then(admin, f, f._commit, commit_first=commit_first)
    monkeypatch.setattr(f, "_commit", commit)
    # Retried or recognised as committed, the batch is accepted and counted exactly once.
    assert f.complete([_page(a, T0 + 1), _page(b, T0 + 1)], T0 + 1, FAST) == [True, True]
    assert fired == [True]
    monkeypatch.undo()
    s = f.stats()
    assert (s.events, s.records, s.urls_by_state["done"]) == (2, 2, 2)
    assert s.counters["fetches"] == 2
    assert s.counters["links_new"] == 4
    assert "completions_rejected" not in s.counters
    # The same for a lease: the grant is returned, not granted a second time.
    commit, fired = _kill_then(admin, f, f._commit, commit_first=commit_first)
    monkeypatch.setattr(f, "_commit", commit)
    got = f.lease("w", 10, T0 + 2, 30, FAST)
    assert fired == [True]
    monkeypatch.undo()
    assert len(got) == 4
    assert f.stats().counters["leases_granted"] == 6
    assert f.progress(T0 + 2).leased == 4
    f.close()


class _Proxy:
    """A TCP relay to the server that can be switched off, to play a server outage."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        probe = socket.socket()
        probe.bind(("127.0.0.1", 0))
        self.port = probe.getsockname()[1]
        probe.close()
        self._listener: socket.socket | None = None
        self._socks: list[socket.socket] = []
        self._lock = threading.Lock()

    def start(self) -> None:
        ls = socket.socket()
        ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        ls.bind(("127.0.0.1", self.port))
        ls.listen(16)
        ls.settimeout(0.05)
        self._listener = ls
        threading.Thread(target=self._accept, args=(ls,), daemon=True).start()

    def _accept(self, ls: socket.socket) -> None:
        while self._listener is ls:
            try:
                client, _ = ls.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            client.settimeout(None)
            upstream = socket.create_connection(self.target)
            with self._lock:
                self._socks += [client, upstream]
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def stop(self) -> None:
        ls, self._listener = self._listener, None
        if ls is not None:
            ls.close()
        with self._lock:
            socks, self._socks = self._socks, []
        for s in socks:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()


@pytest.fixture
def proxy(dsn: str) -> Iterator[_Proxy]:
    from psycopg.conninfo import conninfo_to_dict

    params = conninfo_to_dict(dsn)
    p = _Proxy((str(params.get("host") or "127.0.0.1"), int(params.get("port") or 5432)))
    p.start()
    yield p
    p.stop()


def _via(dsn: str, port: int) -> str:
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    params = conninfo_to_dict(dsn)
    params.update(host="127.0.0.1", port=str(port))
    return make_conninfo(**params)


def test_server_outage_is_waited_out(dsn: str, new_schema, proxy: _Proxy) -> None:  # type: ignore[no-untyped-def]
    f = _open(_via(dsn, proxy.port), new_schema(), retry_seconds=30)
    f.add(_urls("http://a", 1), T0)
    (lease,) = f.lease("w", 1, T0, 30, FAST)
    proxy.stop()  # the server "goes away": connection cut, new connections refused
    threading.Timer(1.0, proxy.start).start()
    t = time.monotonic()
    assert f.complete([_page(lease, T0 + 1)], T0 + 1, FAST) == [True]
    assert time.monotonic() - t >= 0.9
    s = f.stats()
    assert (s.events, s.counters["fetches"], s.counters["links_new"]) == (1, 1, 2)
    f.close()


def test_server_that_stays_away_raises_frontier_error(dsn: str, new_schema, proxy: _Proxy) -> None:  # type: ignore[no-untyped-def]
    f = _open(_via(dsn, proxy.port), new_schema(), retry_seconds=1.0)
    f.add(_urls("http://a", 1), T0)
    proxy.stop()
    t = time.monotonic()
    with pytest.raises(FrontierError, match=r"kept failing .* giving up"):
        f.stats()
    assert time.monotonic() - t < 5
    proxy.start()
    assert f.stats().urls_by_state["queued"] == 1  # and it recovers once the server is back
    f.close()


# -- heavy concurrency --------------------------------------------------------------------------


def test_eight_leasers_never_exceed_a_hosts_allowance(dsn: str, new_schema) -> None:  # type: ignore[no-untyped-def]
    """Eight threads, each with its own connection, lease and complete until the crawl is done.

    A shared tally counts what each host has out (raised after a grant commits, lowered before
    its completion is sent, so it can only under-count); it must never pass the allowance. Each
    completion links to other hosts' pages and to brand-new hosts, so completions also contend
    on host rows the triggers update.
    """
    schema = new_schema()
    hosts = [f"http://h{i}.test" for i in range(6)]
    per_host = 25
    slow = {hosts[0]: 0.01, hosts[1]: 0.01}  # a delay on two hosts: starts must be spaced too
    setup = _open(dsn, schema)
    for h in hosts:
        setup.add(_urls(h, per_host), T0)
    for h, d in slow.items():
        setup.set_host_overrides(h, delay=d, max_in_flight=2)
    policy = HostPolicy(max_in_flight=2, delay=0.0)
    lock = threading.Lock()
    out: dict[str, int] = dict.fromkeys(hosts, 0)
    worst: dict[str, int] = dict.fromkeys(hosts, 0)
    granted: list[Lease] = []
    errors: list[BaseException] = []

    def worker(name: str) -> None:
        f = _open(dsn, schema)
        try:
            while True:
                now = time.time()
                leases = f.lease(name, 4, now, 60, policy)
                with lock:
                    for ls in leases:
                        out[ls.host_key] += 1
                        worst[ls.host_key] = max(worst[ls.host_key], out[ls.host_key])
                    granted.extend(leases)
                if not leases:
                    if f.progress(time.time()).finished:
                        return
                    time.sleep(0.002)
                    continue
                time.sleep(0.003)  # "fetching"
                with lock:
                    for ls in leases:
                        out[ls.host_key] -= 1
                done = []
                for ls in leases:
                    k = int(hashlib.sha1(ls.url.encode()).hexdigest(), 16)
                    other = hosts[k % len(hosts)]
                    new = f"http://new{k % 7}.test"
                    links = [
                        NewURL(f"{other}/p{k % per_host}", other),
                        NewURL(f"{new}/x", new, state="out_of_scope", reason="scope"),
                    ]
                    done.append(Completion(ls, 200, time.time(), links=links))
                assert f.complete(done, time.time(), policy) == [True] * len(done)
        except BaseException as exc:
            errors.append(exc)
        finally:
            f.close()

    threads = [threading.Thread(target=worker, args=(f"w{i}",)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    assert all(v <= 2 for v in worst.values()), worst
    total = len(hosts) * per_host
    assert len(granted) == total
    assert len({ls.url_id for ls in granted}) == total  # nobody got a URL twice
    s = setup.stats()
    assert s.urls_by_state["done"] == total
    assert s.events == total
    assert s.counters["fetches"] == s.counters["leases_granted"] == total
    audit = setup.lease_audit()
    assert audit["grants"] == total
    assert audit["violations"] == 0, audit
    report = {r["host_key"]: r for r in setup.hosts_report(time.time())}
    assert all(r["in_flight"] == 0 and r["queued"] == 0 for r in report.values())
    setup.close()


# -- set-based leasing and completion -----------------------------------------------------------


def test_level_one_probes_each_host_instead_of_joining_every_due_url(dsn: str, new_schema) -> None:  # type: ignore[no-untyped-def]
    """The ready-hosts query keeps its "something is due" EXISTS a per-host subplan: joined, the
    planner hashes every due URL of the crawl before the first host comes out, a lease call
    whose cost grows with the frontier (690-950 ms at 10^6 URLs)."""
    from idemcrawl.frontier.postgres import PostgresFrontier
    from idemcrawl.frontier.sql_dialect import POSTGRES, READY_HOSTS

    schema = new_schema()
    f: PostgresFrontier = _open(dsn, schema)
    f.add([NewURL(f"http://h{h}/p{i}", f"http://h{h}") for h in range(50) for i in range(200)], T0)

    def plan(s: Any) -> str:
        s.cur.execute("ANALYZE urls")
        s.cur.execute("ANALYZE hosts")
        rows = s.cur.execute(
            "EXPLAIN " + POSTGRES.sql(READY_HOSTS), (T0, T0, 1, 10, T0, 100)
        ).fetchall()
        return "\n".join(r[0] for r in rows)

    text = f._run(plan)
    assert "SubPlan" in text, text
    assert "Semi Join" not in text and "HashAggregate" not in text, text
    # ... and the probe goes through the host's queue index, not a scan of urls betting on an
    # early due row (11,800 rows read per host with a bare LIMIT 1, at 50 hosts x 400 URLs)
    assert "using urls_queue on urls" in text and "Seq Scan on urls" not in text, text
    # The same inside the lease call's start statement (expiry check and pause flag first),
    # in the generic plan psycopg ends up preparing.
    from idemcrawl.frontier.postgres_store import _LEASE_START

    start = f._run(
        lambda s: _generic_plan(
            s,
            _LEASE_START,
            [T0, T0, T0, 1, 10, T0, 100],
            ["float8", "float8", "float8", "int", "int", "float8", "int"],
        ),
        write=False,
    )
    assert "SubPlan" in start and "Semi Join" not in start, start
    assert "using urls_queue on urls" in start and "Seq Scan on urls" not in start, start
    assert "hosts_ready" in start and "Seq Scan on hosts" not in start, start
    # The expiry and pause probes run once, not copied into level 1's gate as well.
    assert start.count("urls_leases") == 1 and start.count("meta_pkey") == 1, start
    # Level 2 is planned generic too (its arrays hidden from every plan, so the plan is not
    # made again on each call), and that plan walks each host's queue index.
    from idemcrawl.frontier.postgres_store import _PICK_URLS_BY_ID

    pick = f._run(
        lambda s: _generic_plan(
            s, _PICK_URLS_BY_ID, [[1, 2], [8, 8], T0], ["int[]", "int[]", "float8"]
        ),
        write=False,
    )
    assert "using urls_queue on urls" in pick and "Seq Scan on urls" not in pick, pick
    assert "InitPlan" in pick, pick
    f.close()


def _generic_plan(s: Any, text: str, params: Sequence[Any], types: Sequence[str]) -> str:
    """The plan psycopg's prepared statement ends up with for ``text`` (``%s``/``%b``
    placeholders of ``types``): generic, every array of unknown length (10 rows)."""
    import psycopg

    n = iter(range(1, len(params) + 1))
    numbered = re.sub("%%|%[sb]", lambda m: "%" if m[0] == "%%" else f"${next(n)}", text)
    s.cur.execute("SET LOCAL plan_cache_mode = force_generic_plan")
    # (the simple query protocol: through the extended one $n would be PREPARE's own)
    s.cur.connection.pgconn.exec_(f"PREPARE plan_q AS {numbered}".encode())
    args = ", ".join(f"%s::{t}" for t in types)
    # bound client-side: a utility statement's parameters get no types from their casts
    with psycopg.ClientCursor(s.cur.connection) as cur:
        rows = cur.execute(f"EXPLAIN EXECUTE plan_q({args})", params).fetchall()
    s.cur.execute("DEALLOCATE plan_q")
    return "\n".join(r[0] for r in rows)


def _done_plan(s: Any, leases: Sequence[Lease]) -> str:
    from idemcrawl.frontier.postgres_store import _DONE_SQL, _DONE_TYPES, done_params
    from idemcrawl.frontier.store import DONE_COLUMNS

    params = done_params([_page(ls, T0 + 1) for ls in leases])
    types = ["bigint", "int", "bigint"] + [_DONE_TYPES[c] for c, _ in DONE_COLUMNS] + ["bigint"]
    return _generic_plan(s, _DONE_SQL, params, [f"{t}[]" for t in types])


def test_completion_looks_leases_up_by_key_after_an_analyze_without_leases(  # type: ignore[no-untyped-def]
    dsn: str, new_schema
) -> None:
    """Statistics taken while no URL was leased (the frontier analyzes a fresh seed) make the
    planner expect one leased row: the fenced completion update must still probe the batch's
    URLs by key, not walk ``urls_leases`` and unnest the whole batch again per leased row
    (115 ms for 256 pages at 10^5 URLs)."""
    from idemcrawl.frontier.postgres import PostgresFrontier

    f: PostgresFrontier = _open(dsn, new_schema())
    f.add([NewURL(f"http://h{h}/p{i}", f"http://h{h}") for h in range(300) for i in range(20)], T0)
    f._run(lambda s: s.cur.execute("ANALYZE urls"))
    leases = f.lease("w", 256, T0, 60, FAST)
    assert len(leases) == 256
    text = f._run(lambda s: _done_plan(s, leases), write=False)
    assert "urls_pkey" in text and "urls_leases" not in text, text
    f.close()


def test_grant_and_completion_find_their_urls_by_key_on_a_smaller_crawls_statistics(  # type: ignore[no-untyped-def]
    dsn: str, new_schema
) -> None:
    """A crawl grows from its seeds, so its statistics describe a smaller, older frontier:
    here analyzed when its only URLs were done, then grown to 6,000 queued. The grant's
    update of its URL rows must still find them by key, not walk every queued URL through
    ``urls_queue`` and hash them against the batch, and the completion's must not read every
    URL row (`bench crawl`: 3-11 ms a call, 40 % of the server's time, before)."""
    from idemcrawl.frontier.postgres import PostgresFrontier
    from idemcrawl.frontier.postgres_store import _GRANT_BY_ID

    f: PostgresFrontier = _open(dsn, new_schema())
    f.add(_urls("http://seed", 50), T0)
    f._run(lambda s: s.cur.execute("UPDATE urls SET state = 'done'"))
    f._run(lambda s: s.cur.execute("ANALYZE urls"))
    f.add([NewURL(f"http://h{h}/p{i}", f"http://h{h}") for h in range(300) for i in range(20)], T0)
    leases = f.lease("w", 40, T0, 60, FAST)
    assert len(leases) == 40
    ids = [ls.url_id for ls in leases]
    n = len(leases)
    # The grant's whole statement (its UPDATE of urls is one of its CTEs), planned generic.
    grant = f._run(
        lambda s: _generic_plan(
            s,
            _GRANT_BY_ID,
            ["w", T0 + 60, T0, ids, [ls.token for ls in leases], ids,
             [T0] * n, [1] * n, ids, ["page"] * n, [T0] * n, [0.0] * n, [8] * n, [0] * n,
             [1], [T0], [n], ["1970-01-12"], [n], n, -n, ["leases_granted"], [n], n, n],
            ["text", "float8", "float8", "bigint[]", "bigint[]", "bigint[]",
             "float8[]", "int[]", "bigint[]", "text[]", "float8[]", "float8[]", "int[]",
             "int[]", "int[]", "float8[]", "int[]", "text[]", "int[]", "bigint", "bigint",
             "text[]", "bigint[]", "bigint", "bigint"],
        ),
        write=False,
    )  # fmt: skip
    assert "urls_pkey" in grant and "urls_queue" not in grant, grant
    # Both scans of urls are bounded by the batch's ids themselves, whichever join the
    # planner then picks (a plan cached while the crawl was small picked a hash join over a
    # sequential scan of every URL for the completion).
    assert "Index Cond: (url_id = ANY (" in grant, grant
    done = f._run(lambda s: _done_plan(s, leases), write=False)
    assert "urls_pkey" in done and "Seq Scan on urls" not in done, done
    assert "Index Cond: (url_id = ANY (" in done, done
    f.close()


def test_progress_reads_no_refetch_entry_of_a_crawl_without_refetch_times(  # type: ignore[no-untyped-def]
    dsn: str, new_schema
) -> None:
    """Statistics taken before any URL was done: ``progress`` must not walk every done URL's
    ``urls_refetch`` entry (all NULL without recrawl) for the earliest refetch time, as the
    aggregate over the whole index did (2.6 ms a call after 11,000 pages of bench crawl)."""
    from idemcrawl.frontier.postgres import PostgresFrontier
    from idemcrawl.frontier.sql import PROGRESS
    from idemcrawl.frontier.sql_dialect import POSTGRES

    f: PostgresFrontier = _open(dsn, new_schema())
    f.add([NewURL(f"http://h{h}/p{i}", f"http://h{h}") for h in range(100) for i in range(10)], T0)
    f._run(lambda s: s.cur.execute("ANALYZE urls"))
    leases = f.lease("w", 800, T0, 60, FAST)
    assert len(leases) == 800
    assert all(f.complete([_page(ls, T0 + 1, 0) for ls in leases], T0 + 1, FAST))
    assert f.progress(T0 + 2).next_refetch_at is None

    def plan(s: Any) -> str:
        rows = s.cur.execute(
            "EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF) " + POSTGRES.sql(PROGRESS)
        ).fetchall()
        return "\n".join(r[0] for r in rows)

    text = f._run(plan, write=False)
    refetch = [ln for ln in text.splitlines() if "urls_refetch" in ln]
    assert refetch and all("actual rows=0 " in ln for ln in refetch), text
    f.close()


def test_set_based_completion_matches_sqlite(dsn: str, new_schema, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """One batch over several hosts, with a record written twice in it (the row-by-row path)
    and once more in the next batch (the one-statement upsert): PostgreSQL's set-based host
    updates, record upserts and events leave what SQLite's one statement per row leaves."""
    import random

    from idemcrawl.frontier.sqlite import SQLiteFrontier

    pg = _open(dsn, new_schema(), rng=random.Random(7))
    lite = SQLiteFrontier(str(tmp_path / "f.db"), rng=random.Random(7))
    policy = HostPolicy(max_in_flight=2, delay=0.0)
    results = []
    for f in (pg, lite):
        for h in "abc":
            f.add(_urls(f"http://{h}", 4), T0)
        for rnd in range(2):
            now = T0 + rnd
            leases = sorted(f.lease("w", 6, now, 30, policy), key=lambda ls: ls.url)
            assert len(leases) == 6
            batch = []
            for i, ls in enumerate(leases):
                # Two pages of a batch write the same record (a duplicate key in one upsert).
                key = "shared" if rnd == 0 and i < 2 else f"{ls.url}-{rnd}"
                data = {"v": i if rnd == 0 else 99}
                rec = RecordWrite.make("s", key, data)
                batch.append(
                    Completion(ls, 200, now, [rec], [], f"hash{i}", 10, latency=0.01 * (i + 1))
                )
            assert f.complete(batch, now, policy) == [True] * 6
        hosts = [
            {k: v for k, v in r.items() if k in ("host_key", "latency_ewma", "error_streak",
                                                 "next_allowed_at", "queued", "in_flight")}
            for r in f.host_rows()
        ]  # fmt: skip
        records = [(r["key"], r["data"], r["url"], r["first_seen"]) for r in f.records()]
        events = [(e["url"], e["url_version"]) for e in f.iter_events()]
        results.append((hosts, records, events))
        f.close()
    assert results[0] == results[1]
    hosts, records, events = results[0]
    assert all(h["latency_ewma"] is not None for h in hosts)
    assert len(events) == 12 and len(records) == 11


# -- planner statistics ---------------------------------------------------------------------------


def _stat(admin: Any, schema: str, column: str) -> dict[str, int]:
    """A ``pg_stat_user_tables`` column for each table of ``schema`` (``analyze_count`` counts
    the ANALYZE commands run on a table: the frontier's, not autovacuum's)."""
    rows = admin.execute(
        f"SELECT relname, {column} FROM pg_stat_user_tables WHERE schemaname = %s", (schema,)
    ).fetchall()
    return {str(r): int(n) for r, n in rows}


def _counted(f: Any, admin: Any, schema: str, table: str, changes: int) -> None:
    """Wait until the server's counters show ``changes`` rows of ``table`` changed since its
    last analyze: a backend reports its counts when idle, at most once a second. The wait is
    PostgreSQL's own bound: a backend that cannot take the shared statistics' lock at once keeps
    its counts pending and retries, at the latest after 60 s (``PGSTAT_MAX_INTERVAL``), which a
    heavily loaded machine reached (20 s was seen to pass with no count at load average 20)."""
    if admin.info.server_version >= 150000:
        f._run(lambda s: s.cur.execute("SELECT pg_stat_force_next_flush()"), write=False)
    deadline = time.monotonic() + 65
    while (seen := _stat(admin, schema, "n_mod_since_analyze").get(table, 0)) < changes:
        assert time.monotonic() < deadline, f"{table}: {seen} changes counted, not {changes}"
        time.sleep(0.05)


def _analyzed(admin: Any, schema: str, expected: dict[str, int]) -> dict[str, int]:
    """The analyze counts of the tables in ``expected``, once they reach it (PostgreSQL 13-14
    report them through the statistics collector, a moment later)."""
    deadline = time.monotonic() + 5
    while True:
        counts = _stat(admin, schema, "analyze_count")
        seen = {t: counts.get(t, 0) for t in expected}
        if seen == expected or time.monotonic() > deadline:
            return seen
        time.sleep(0.05)


def test_a_frontier_that_grows_several_fold_is_analyzed_and_one_that_does_not_is_not(  # type: ignore[no-untyped-def]
    dsn: str, new_schema, admin, monkeypatch
) -> None:
    """Nothing else analyzes the frontier on a server without autovacuum: the frontier runs
    ANALYZE on a table once the server counts it changed several-fold since the last one, so
    the first lease after a seed plans level 1 on statistics, and a crawl changing its tables a
    little at a time is not analyzed again and again."""
    from idemcrawl.frontier import scheduler

    monkeypatch.setattr(scheduler, "STATS_CHECK_SECONDS", 0.0)  # check at every lease call
    schema = new_schema()
    f = _open(dsn, schema)
    f.add([NewURL(f"http://h{h}/p{i}", f"http://h{h}") for h in range(500) for i in range(10)], T0)
    _counted(f, admin, schema, "urls", 5_000)
    leases = f.lease("w", 50, T0, 60, FAST)
    assert len(leases) == 50
    # The seed (5,000 URLs, 500 hosts) is analyzed before level 1 runs (after the add, once
    # the server counted its rows, else before the lease).
    assert _analyzed(admin, schema, {"urls": 1, "hosts": 1}) == {"urls": 1, "hosts": 1}
    reltuples = admin.execute(
        "SELECT c.reltuples FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = %s AND c.relname = 'urls'",
        (schema,),
    ).fetchone()
    assert reltuples is not None and reltuples[0] == 5_000
    # A crawl's steady trickle (leases, completions with a link each): far below four times
    # the tables' sizes, so every call checks and none analyzes them again.
    now = T0
    for _ in range(10):
        now += 1
        f.complete([_page(ls, now, n_links=1) for ls in leases], now, FAST)
        leases = f.lease("w", 50, now, 60, FAST)
        assert leases
    _counted(f, admin, schema, "urls", 1_000)
    f.lease("w", 1, now, 60, FAST)
    assert _analyzed(admin, schema, {"urls": 1}) == {"urls": 1}
    # Five times the size (20,000 more URLs, added by another process, which does not analyze
    # them: the server's counters count them for every process).
    monkeypatch.setattr(scheduler, "STATS_CHECK_SECONDS", 3600.0)
    g = _open(dsn, schema)
    g._stats_due_at = math.inf  # a process that has just checked
    g.add([NewURL(f"http://h{h}/q{i}", f"http://h{h}") for h in range(500) for i in range(40)], T0)
    _counted(g, admin, schema, "urls", 20_000)
    g.close()
    monkeypatch.setattr(scheduler, "STATS_CHECK_SECONDS", 0.0)
    f.lease("w", 1, now, 60, FAST)
    assert _analyzed(admin, schema, {"urls": 2}) == {"urls": 2}
    f.close()


def test_statistics_are_checked_at_most_once_a_minute_or_after_a_bulk_insert(  # type: ignore[no-untyped-def]
    dsn: str, new_schema, monkeypatch
) -> None:
    """The check is one read of the server's counters, not one per lease call: the first lease
    of a process, then once STATS_CHECK_SECONDS passed or this process offered
    STATS_CHECK_URLS URLs."""
    from idemcrawl.frontier import scheduler
    from idemcrawl.frontier.postgres_store import PgStore

    checks: list[list[str]] = []
    real = PgStore.stale_tables

    def counting(self: PgStore, min_changes: int, factor: float) -> list[str]:
        out = real(self, min_changes, factor)
        checks.append(out)
        return out

    monkeypatch.setattr(PgStore, "stale_tables", counting)
    monkeypatch.setattr(scheduler, "STATS_CHECK_URLS", 300)
    clock = [1000.0]
    monkeypatch.setattr(scheduler.time, "monotonic", lambda: clock[0])
    f = _open(dsn, new_schema())
    f.add(_urls("http://a", 100), T0)  # the process's first call checks
    for i in range(20):
        f.lease("w", 1, T0 + i, 60, FAST)
    assert len(checks) == 1
    clock[0] += scheduler.STATS_CHECK_SECONDS
    f.lease("w", 1, T0 + 30, 60, FAST)
    assert len(checks) == 2
    f.add(_urls("http://b", 200), T0)
    f.lease("w", 1, T0 + 31, 60, FAST)
    assert len(checks) == 2
    f.add(_urls("http://c", 100), T0)  # 300 URLs offered since the last check
    assert len(checks) == 3
    f.close()


@pytest.mark.parametrize("how", ["cancelled", "connection-lost"])
def test_a_failed_analyze_fails_no_lease_or_completion(  # type: ignore[no-untyped-def]
    dsn: str, new_schema, admin, monkeypatch, caplog, how: str
) -> None:
    """An ANALYZE cancelled by its timeout, or whose connection is lost, is logged and tried
    again later; the lease call around it grants as if nothing happened."""
    from idemcrawl.frontier import scheduler
    from idemcrawl.frontier.postgres_store import PgStore

    tries: list[float] = []
    clock = [1000.0]
    monkeypatch.setattr(scheduler.time, "monotonic", lambda: clock[0])

    def failing(self: PgStore, tables: Any, timeout: float) -> None:
        tries.append(clock[0])
        if how == "cancelled":
            self.cur.execute("SET LOCAL statement_timeout = 50")
            self.cur.execute("SELECT pg_sleep(5)")
        else:
            admin.execute("SELECT pg_terminate_backend(%s)", (f.backend_pid,))
            self.cur.execute("SELECT 1")

    monkeypatch.setattr(PgStore, "analyze", failing)
    schema = new_schema()
    g = _open(dsn, schema)  # the seeding process, which does not check
    g._stats_due_at = math.inf
    g.add([NewURL(f"http://h{h}/p{i}", f"http://h{h}") for h in range(200) for i in range(10)], T0)
    _counted(g, admin, schema, "urls", 2_000)
    g.close()
    f = _open(dsn, schema)
    with caplog.at_level("WARNING", logger="idemcrawl.frontier.scheduler"):
        leases = f.lease("w", 20, T0, 60, FAST)
    assert len(leases) == 20 and len(tries) == 1
    assert "planner statistics failed" in caplog.text
    assert f.complete([_page(ls, T0 + 1) for ls in leases], T0 + 1, FAST) == [True] * 20
    # Not tried again at every call, nor after the usual minute: after the retry pause.
    clock[0] += scheduler.STATS_CHECK_SECONDS
    assert f.lease("w", 20, T0 + 2, 60, FAST)
    assert len(tries) == 1
    clock[0] += scheduler.STATS_RETRY_SECONDS
    assert f.lease("w", 20, T0 + 3, 60, FAST)
    assert len(tries) == 2
    f.close()


def test_vacuum_catalogs_after_drop_schema_vacuums_every_churned_catalog(  # type: ignore[no-untyped-def]
    dsn: str, new_schema, admin
) -> None:
    """Benchmarks drop their schema, then ``vacuum_catalogs``: the schema is gone and every
    catalog in CHURNED_CATALOGS has been vacuumed since (a server without autovacuum keeps
    the dead rows of every schema made and dropped)."""
    from idemcrawl.frontier.postgres import CHURNED_CATALOGS

    schema = new_schema()
    f = _open(dsn, schema)
    f.add(_urls("http://a", 2), T0)
    before = admin.execute("SELECT clock_timestamp()").fetchone()[0]
    f.drop_schema()
    f.vacuum_catalogs()
    f.close()
    gone = admin.execute("SELECT count(*) FROM pg_namespace WHERE nspname = %s", (schema,))
    assert gone.fetchone()[0] == 0
    rows = admin.execute(
        "SELECT relname, last_vacuum FROM pg_stat_sys_tables "
        "WHERE schemaname = 'pg_catalog' AND relname = ANY(%s)",
        (list(CHURNED_CATALOGS),),
    ).fetchall()
    assert {r[0] for r in rows} == set(CHURNED_CATALOGS)
    stale = [name for name, at in rows if at is None or at < before]
    assert stale == []
    with pytest.raises(FrontierError, match="closed"):
        f.vacuum_catalogs()
