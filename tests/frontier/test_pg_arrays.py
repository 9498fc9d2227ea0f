"""``pg_arrays.FastListDumper``: the arrays it encodes are the values psycopg's own dumper would
bind, as the server reads them back; what it does not encode gets psycopg's own result or error.
Needs the server named by ``IDEMCRAWL_TEST_PG_DSN`` (fails in CI without it, see conftest.py)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import pytest

from .conftest import require_postgres

INT8_MAX = 2**63 - 1


@pytest.fixture
def conns() -> Iterator[tuple[Any, Any]]:
    """A connection with the fast dumper and one with psycopg's own, on the test server."""
    dsn = require_postgres()
    import psycopg

    from idemcrawl.frontier import pg_arrays

    with (
        psycopg.connect(dsn, autocommit=True) as fast,
        psycopg.connect(dsn, autocommit=True) as own,
    ):
        pg_arrays.register(fast)
        yield fast, own


def _back(conn: Any, values: Any, cast: str) -> Any:
    return conn.execute(f"SELECT %b::{cast}[]", (values,)).fetchone()[0]


CASES = [
    ([1, 2, 3], "int"),
    ([0, -1, INT8_MAX, -INT8_MAX - 1], "bigint"),
    ([5, None, 7, None], "bigint"),
    ([1.5, -0.0, math.inf, -math.inf, 1e300, 5e-324], "float8"),
    ([0.25, None], "float8"),
    ([0.0, -0.0, None] * 10, "float8"),  # the sign of zero kept
    (["http://a.test/p?q=1", "", "é", "日本語", "emoji \U0001f600", "x" * 5000], "text"),
    (["queued"] * 40 + [None] * 20, "text"),  # few distinct values: each encoded once
    ([None, "leased", "queued", "leased"] * 10, "text"),
    ([f"http://h{i}.test/p/{i}" for i in range(600)], "text"),
    ([f"u{i}" if i % 3 else None for i in range(100)], "text"),
    ([3, 3, 3, 3, 1, None, 3, 3], "int"),  # few distinct ints
    ([None] * 5, "bigint"),  # only NULLs: bound as text[], cast by the statement
    ([None] * 5, "float8"),
    ([None, None], "text"),
    ([None], "bytea"),
]


@pytest.mark.parametrize(("values", "cast"), CASES)
def test_encoded_arrays_read_back_as_psycopg_s(conns, values: list[Any], cast: str) -> None:  # type: ignore[no-untyped-def]
    from idemcrawl.frontier.pg_arrays import _kind

    fast, own = conns
    assert _kind(values) is not None, "the fast path encodes this list"
    got = _back(fast, values, cast)
    assert got == _back(own, values, cast) == values
    assert [repr(v) for v in got] == [repr(v) for v in values]  # -0.0 is not 0.0


def test_nan_reads_back_as_nan(conns) -> None:  # type: ignore[no-untyped-def]
    fast, _ = conns
    (back,) = _back(fast, [math.nan], "float8")
    assert math.isnan(back)


def test_unnest_of_several_encoded_arrays_lines_the_columns_up(conns) -> None:  # type: ignore[no-untyped-def]
    fast, _ = conns
    rows = fast.execute(
        "SELECT * FROM unnest(%b::bigint[], %b::text[], %b::float8[], %b::int[])",
        ([1, 2, None], ["a", None, "c"], [0.5, None, 2.0], [7, 8, 9]),
    ).fetchall()
    assert rows == [(1, "a", 0.5, 7), (2, None, None, 8), (None, "c", 2.0, 9)]


@pytest.mark.parametrize(
    ("values", "cast"),
    [
        ([], "bigint"),
        ([2**64, 1], "numeric"),  # beyond int8: psycopg's numeric array
        ([True, False], "bool"),
        ([b"\x00\x01", b"x"], "bytea"),
        ([[1, 2], [3, 4]], "int"),  # two dimensions
    ],
)
def test_other_lists_are_left_to_psycopg(conns, values: list[Any], cast: str) -> None:  # type: ignore[no-untyped-def]
    from idemcrawl.frontier.pg_arrays import _kind

    fast, own = conns
    assert _kind(values) is None
    assert _back(fast, values, cast) == _back(own, values, cast) == values


def test_mixed_lists_and_nul_characters_fail_as_with_psycopg(conns) -> None:  # type: ignore[no-untyped-def]
    import psycopg

    fast, own = conns
    for values, cast in (([1, 2.5], "float8"), (["a\x00b"], "text")):
        errors = []
        for conn in (fast, own):
            with pytest.raises(psycopg.Error) as caught:
                _back(conn, values, cast)
            errors.append(type(caught.value))
        assert errors[0] is errors[1], values


def test_the_frontier_s_connection_encodes_its_lists_here(tmp_path) -> None:  # type: ignore[no-untyped-def]
    dsn = require_postgres()
    from psycopg.adapt import PyFormat

    from idemcrawl.frontier.pg_arrays import FastListDumper
    from idemcrawl.frontier.postgres import PostgresFrontier

    from .conftest import drop_pg_schema, pg_schema_for

    schema = pg_schema_for(tmp_path)
    f = PostgresFrontier(dsn, schema=schema)
    try:
        conn = f._ensure_connection()
        assert conn.adapters.get_dumper(list, PyFormat.BINARY) is FastListDumper
    finally:
        f.close()
        drop_pg_schema(schema)
