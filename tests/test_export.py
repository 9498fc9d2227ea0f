"""Exports (R22): every format x every export, read back and compared with what is stored."""

from __future__ import annotations

import csv
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from idemcrawl.export import (
    COLUMNS,
    FORMATS,
    PARQUET_MISSING,
    WHATS,
    ExportError,
    aggregate_rows,
    export,
    render_aggregates,
)
from idemcrawl.frontier.base import Completion, Failure, HostPolicy, NewURL, RecordWrite
from idemcrawl.frontier.sqlite import SQLiteFrontier

T0 = 1_000_000.0
FAST = HostPolicy(max_in_flight=64, delay=0.0)
PAGES = 5


def data_of(i: int) -> dict[str, Any]:
    return {"name": f"Café «{i}»", "price": i + 0.5, "tags": ["a", "b,c"], "note": None}


@pytest.fixture
def db(tmp_path: Path) -> Iterator[SQLiteFrontier]:
    f = SQLiteFrontier(str(tmp_path / "crawl.db"))
    f.add([NewURL(f"http://a/p{i}", "http://a") for i in range(PAGES)], T0)
    leases = sorted(f.lease("w", PAGES, T0, 30, FAST), key=lambda ls: ls.url)
    *ok, bad = leases
    done = []
    for ls in ok:
        i = int(ls.url.rsplit("p", 1)[1])
        recs = [RecordWrite.make("shop", f"k{i}", data_of(i))]
        links = [NewURL(f"http://b/x{i}", "http://b", state="out_of_scope", reason="offsite")]
        done.append(Completion(ls, 200, T0 + i, recs, links, f"h{i}", body_bytes=1000 + i))
    assert all(f.complete(done, T0 + 9, FAST))
    assert f.fail([Failure(bad, "HTTP 503", None, status=503)], T0 + 9, FAST) == [True]
    yield f
    f.close()


def expected(db: SQLiteFrontier, what: str) -> list[dict[str, Any]]:
    """What an export must contain, built from the frontier's own rows (not export.rows)."""
    if what == "records":
        return sorted(db.records(), key=lambda r: r["record_id"])
    if what == "urls":
        return list(db.iter_urls())
    if what == "events":
        return [{**e, "key": f"{e['url_id']}:{e['url_version']}"} for e in db.iter_events()]
    return list(aggregate_rows(db.aggregates()))


def read_back(path: Path, fmt: str) -> list[dict[str, Any]]:
    if fmt == "jsonl":
        return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    if fmt == "csv":
        with path.open(encoding="utf-8", newline="") as fh:
            return list(csv.DictReader(fh))
    return pq.read_table(path).to_pylist()


def as_csv_text(value: Any) -> str:
    return "" if value is None else str(value)


# Records in CSV and Parquet are flat (one column per data field): tested on their own below.
@pytest.mark.parametrize(
    ("fmt", "what"),
    [(f, w) for f in FORMATS for w in WHATS if w != "records" or f == "jsonl"],
)
def test_export_round_trips(db: SQLiteFrontier, tmp_path: Path, fmt: str, what: str) -> None:
    out = tmp_path / f"out.{fmt}"
    want = expected(db, what)
    assert want, "the fixture must give every export something to write"
    assert export(db, fmt, what, out, batch=2, row_group_rows=3) == len(want)
    got = read_back(out, fmt)
    cols = [name for name, _ in COLUMNS[what]]
    assert [list(r) for r in got] == [cols] * len(want)
    for g, w in zip(got, want, strict=True):
        for c in cols:
            if fmt == "csv":
                assert g[c] == as_csv_text(w[c]), c
            elif fmt == "jsonl" and c == "data":
                assert g[c] == json.loads(w[c])
            else:
                assert g[c] == w[c], c


FLAT_META = ["record_id", "source", "key", "url", "content_hash", "first_seen", "last_changed"]


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_records_are_flat_in_csv_and_parquet(db: SQLiteFrontier, tmp_path: Path, fmt: str) -> None:
    out = tmp_path / f"r.{fmt}"
    want = expected(db, "records")
    assert export(db, fmt, "records", out, batch=2, row_group_rows=3) == len(want) == 4
    got = read_back(out, fmt)
    # The metadata columns, then one column per top-level data field (sorted).
    assert list(got[0]) == [*FLAT_META, "name", "note", "price", "tags"]
    for g, w in zip(got, want, strict=True):
        data = json.loads(w["data"])
        for c in FLAT_META:
            assert g[c] == (as_csv_text(w[c]) if fmt == "csv" else w[c]), c
        if fmt == "csv":
            assert g["name"] == data["name"] and g["price"] == str(data["price"])
            assert g["note"] == ""  # null
        else:
            assert g["name"] == data["name"] and g["price"] == data["price"]
            assert g["note"] is None
        # Nested values are JSON text in both formats.
        assert json.loads(g["tags"]) == ["a", "b,c"]
    if fmt == "parquet":
        schema = pq.read_schema(out)
        assert schema.field("price").type == pa.float64()
        assert schema.field("name").type == pa.string()
        assert schema.field("tags").type == pa.string()


def test_flat_records_type_each_field_and_rename_clashes(tmp_path: Path) -> None:
    f = SQLiteFrontier(str(tmp_path / "c.db"))
    f.add([NewURL(f"http://a/p{i}", "http://a") for i in range(3)], T0)
    leases = sorted(f.lease("w", 3, T0, 30, FAST), key=lambda ls: ls.url)
    datas = [
        {"n": 1, "ok": True, "mixed": 1, "key": "clash", "only": "x"},
        {"n": 2, "ok": False, "mixed": "two", "key": "k2"},
        {"n": None, "ok": None, "mixed": [3], "big": 2**70},
    ]
    done = [
        Completion(ls, 200, T0, [RecordWrite.make("s", f"r{i}", d)], [], f"h{i}")
        for i, (ls, d) in enumerate(zip(leases, datas, strict=True))
    ]
    assert all(f.complete(done, T0, FAST))
    out = tmp_path / "r.parquet"
    export(f, "parquet", "records", out)
    table = pq.read_table(out)
    types = {name: str(table.schema.field(name).type) for name in table.schema.names}
    assert types["n"] == "int64" and types["ok"] == "bool" and types["mixed"] == "string"
    assert types["big"] == "string" and types["only"] == "string"
    assert types["data.key"] == "string" and types["key"] == "string"  # metadata key kept
    rows = sorted(table.to_pylist(), key=lambda r: r["key"])
    assert [r["data.key"] for r in rows] == ["clash", "k2", None]
    assert [r["mixed"] for r in rows] == ["1", "two", "[3]"]
    assert rows[2]["big"] == str(2**70)
    out_csv = tmp_path / "r.csv"
    export(f, "csv", "records", out_csv)
    with out_csv.open(encoding="utf-8", newline="") as fh:
        by_key = {r["key"]: r for r in csv.DictReader(fh)}
    assert by_key["r0"]["ok"] == "true" and by_key["r1"]["ok"] == "false"
    assert by_key["r2"]["ok"] == "" and by_key["r0"]["data.key"] == "clash"
    f.close()


def test_csv_header_and_quoted_nested_json(db: SQLiteFrontier, tmp_path: Path) -> None:
    out = tmp_path / "r.csv"
    export(db, "csv", "urls", out)
    with out.open(encoding="utf-8", newline="") as fh:
        header, *body = list(csv.reader(fh))
    assert header == [name for name, _ in COLUMNS["urls"]]
    out = tmp_path / "rec.csv"
    export(db, "csv", "records", out)
    with out.open(encoding="utf-8", newline="") as fh:
        header, *body = list(csv.reader(fh))
    assert json.loads(body[0][header.index("tags")]) == ["a", "b,c"]


def test_parquet_is_typed_and_written_in_row_groups(db: SQLiteFrontier, tmp_path: Path) -> None:
    out = tmp_path / "urls.parquet"
    n = export(db, "parquet", "urls", out, batch=2, row_group_rows=3)
    f = pq.ParquetFile(out)
    assert f.metadata.num_rows == n == 9  # 5 pages + 4 offsite links
    assert f.metadata.num_row_groups == 3
    assert [f.metadata.row_group(i).num_rows for i in range(3)] == [3, 3, 3]
    schema = f.schema_arrow
    assert schema.field("url_id").type == pa.int64()
    assert schema.field("fetched_at").type == pa.float64()
    assert schema.field("url").type == pa.string()
    table = f.read()
    assert table.column("status_code").null_count == 4  # the links were never fetched
    assert sorted(s for s in table.column("status_code").to_pylist() if s) == [200] * 4 + [503]


@pytest.mark.parametrize("fmt", FORMATS)
def test_empty_crawl_exports_headers_only(tmp_path: Path, fmt: str) -> None:
    empty = SQLiteFrontier(str(tmp_path / "empty.db"))
    out = tmp_path / f"e.{fmt}"
    assert export(empty, fmt, "events", out) == 0
    empty.close()
    if fmt == "parquet":
        table = pq.read_table(out)
        assert table.num_rows == 0 and table.schema.names == [n for n, _ in COLUMNS["events"]]
    elif fmt == "csv":
        assert out.read_text().splitlines() == [",".join(n for n, _ in COLUMNS["events"])]
    else:
        assert out.read_text() == ""


def test_export_to_stdout(db: SQLiteFrontier, capsys: pytest.CaptureFixture[str]) -> None:
    assert export(db, "jsonl", "events", "-") == 4
    lines = capsys.readouterr().out.splitlines()
    assert [json.loads(line)["key"] for line in lines] == [e["key"] for e in expected(db, "events")]


def test_parquet_to_a_terminal_is_refused(
    db: SQLiteFrontier, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    with pytest.raises(ExportError, match="terminal"):
        export(db, "parquet", "records", "-")


def test_failed_export_keeps_the_previous_file_and_leaves_no_part(
    db: SQLiteFrontier, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "records.jsonl"
    out.write_text("previous export\n")

    def broken(batch: int = 1000) -> Iterator[dict[str, Any]]:
        yield from list(db.records())[:1]
        raise OSError("disk went away")

    monkeypatch.setattr(db, "iter_records", broken)
    with pytest.raises(OSError, match="disk went away"):
        export(db, "jsonl", "records", out)
    assert out.read_text() == "previous export\n"
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".part")] == []


def test_bad_requests_are_clear_errors(db: SQLiteFrontier, tmp_path: Path) -> None:
    with pytest.raises(ExportError, match="unknown export format 'xml'"):
        export(db, "xml", "records", tmp_path / "x")
    with pytest.raises(ExportError, match="unknown export 'hosts'"):
        export(db, "jsonl", "hosts", tmp_path / "x")
    with pytest.raises(ExportError, match="does not exist"):
        export(db, "csv", "records", tmp_path / "missing" / "out.csv")
    with pytest.raises(ExportError, match="is a directory"):
        export(db, "csv", "records", tmp_path)
    assert not (tmp_path / "x").exists()


def test_parquet_without_pyarrow_says_how_to_get_it(
    db: SQLiteFrontier, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(ExportError) as err:
        export(db, "parquet", "records", tmp_path / "r.parquet")
    assert str(err.value) == PARQUET_MISSING and "idemcrawl[parquet]" in PARQUET_MISSING
    assert not (tmp_path / "r.parquet").exists()
    assert export(db, "csv", "records", tmp_path / "r.csv") == 4  # the others still work


def test_aggregates_rows_and_text(db: SQLiteFrontier) -> None:
    agg = db.aggregates()
    flat = {(r["metric"], r["key"]): r["value"] for r in aggregate_rows(agg)}
    assert flat[("status_codes", "200")] == 4 and flat[("status_codes", "503")] == 1
    assert flat[("records_by_source", "shop")] == 4
    assert flat[("body_bytes", None)] == 1000 + 1001 + 1002 + 1003
    assert flat[("urls_by_state", "out_of_scope")] == 4
    text = render_aggregates(agg)
    assert "200: 4  503: 1" in text
    assert "4006 (3.9 KiB)" in text
    assert "shop" in text and "failed" in text and "queued" not in text
