"""Exports of what a crawl stored (R22): records, URL states, index events and aggregates.

Every export streams: rows come from the frontier's keyset-paged iterators and go out as they
arrive (Parquet in row groups of ``row_group_rows``), so memory stays bounded however large the
crawl. Records are flat in CSV and Parquet: one column per top-level field of the records' data
(a first pass over the records finds the fields and their Parquet types), nested values as JSON
text; JSONL keeps each record's ``data`` as one object. Aggregates are recomputed by the
frontier with GROUP BY over the stored rows at export time; nothing keeps running totals that a
crash or a duplicate fetch could skew.

A file export is written to a temporary name next to the target and renamed into place only
when complete, so a failed or interrupted export never leaves a truncated file under the real
name, nor destroys the previous export.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import secrets
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any

from .events import event_key
from .frontier.base import Frontier

FORMATS = ("jsonl", "csv", "parquet")
WHATS = ("records", "urls", "events", "aggregates")

#: Column order and Parquet type of each export. Types are named, not pyarrow objects, so that
#: JSONL and CSV exports work without pyarrow installed.
COLUMNS: dict[str, tuple[tuple[str, str], ...]] = {
    "records": (
        ("record_id", "string"),
        ("source", "string"),
        ("key", "string"),
        ("url", "string"),
        ("data", "string"),  # canonical JSON text (JSONL exports it as an object)
        ("content_hash", "string"),
        ("first_seen", "float64"),
        ("last_changed", "float64"),
    ),
    "urls": (
        ("url_id", "int64"),
        ("url", "string"),
        ("state", "string"),
        ("reason", "string"),
        ("kind", "string"),
        ("version", "int64"),
        ("status_code", "int64"),
        ("fetched_at", "float64"),
        ("body_bytes", "int64"),
        ("content_hash", "string"),
        ("depth", "int64"),
        ("next_fetch_at", "float64"),
    ),
    "events": (
        ("event_id", "int64"),
        ("key", "string"),
        ("url_id", "int64"),
        ("url_version", "int64"),
        ("url", "string"),
        ("status", "int64"),
        ("fetched_at", "float64"),
        ("content_hash", "string"),
        ("records", "int64"),
        ("links", "int64"),
        ("warc_file", "string"),
        ("warc_offset", "int64"),
        ("warc_length", "int64"),
        ("payload_digest", "string"),
        ("created_at", "float64"),
    ),
    "aggregates": (
        ("metric", "string"),
        ("key", "string"),
        ("value", "int64"),
    ),
}

PARQUET_MISSING = (
    "Parquet export needs pyarrow, which is not installed: pip install 'idemcrawl[parquet]' "
    "(or export --format jsonl / csv)"
)


class ExportError(Exception):
    """An export that cannot be done as asked (unknown format, no pyarrow, bad output path)."""


def aggregate_rows(agg: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Aggregates as flat (metric, key, value) rows: the one shape all three formats can hold."""
    for metric, value in agg.items():
        if isinstance(value, dict):
            for key, n in value.items():
                yield {"metric": metric, "key": str(key), "value": int(n)}
        else:
            yield {"metric": metric, "key": None, "value": int(value)}


def render_aggregates(agg: dict[str, Any]) -> str:
    """Aggregates for a person (``status`` or ``export --what aggregates`` on a terminal)."""
    lines = [f"urls              {agg['urls']}"]
    lines += [f"  {state:<15} {n}" for state, n in agg["urls_by_state"].items() if n]
    lines.append(f"fetched           {agg['fetched']}")
    codes = "  ".join(f"{code}: {n}" for code, n in agg["status_codes"].items())
    lines.append(f"status codes      {codes or '-'}")
    lines.append(f"body bytes        {agg['body_bytes']} ({_human_bytes(agg['body_bytes'])})")
    lines.append(f"records           {agg['records']}")
    lines += [f"  {source:<15} {n}" for source, n in agg["records_by_source"].items()]
    lines.append(f"events            {agg['events']}")
    return "\n".join(lines)


def _human_bytes(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


#: The record columns that are not data fields, in order, for flat (CSV, Parquet) exports.
RECORD_META = tuple(c for c in COLUMNS["records"] if c[0] != "data")


def record_fields(db: Frontier, *, batch: int = 1000) -> list[tuple[str, str, str]]:
    """(field, column name, Parquet type) of every top-level data field any record has.

    Fields are sorted by name. A field named like a metadata column (``key``, ``url``…) gets
    the column ``data.<field>``. The type is what every non-null value fits: int64, float64
    (ints and floats mixed), bool, string; nested or mixed values are JSON text (string).
    """
    kinds: dict[str, set[str]] = {}
    for r in db.iter_records(batch):
        for name, value in _fields(r["data"]).items():
            seen = kinds.setdefault(name, set())
            if value is not None:
                seen.add(_kind(value))
    meta = {name for name, _ in RECORD_META}
    out = []
    for name in sorted(kinds):
        kind = kinds[name]
        if kind <= {"int"} and kind:
            arrow = "int64"
        elif kind <= {"int", "float"} and kind:
            arrow = "float64"
        elif kind == {"bool"}:
            arrow = "bool_"
        else:
            arrow = "string"
        out.append((name, f"data.{name}" if name in meta else name, arrow))
    return out


def _fields(data_json: str) -> dict[str, Any]:
    data = json.loads(data_json)
    return data if isinstance(data, dict) else {"data": data}


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int" if -(2**63) <= value < 2**63 else "big"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "str"
    return "nested"


def flat_record_rows(
    db: Frontier, fields: list[tuple[str, str, str]], *, batch: int = 1000
) -> Iterator[dict[str, Any]]:
    """Records with one column per data field (``record_fields``), values typed for Parquet:
    a string column holds non-string values as JSON text."""
    known = {name for name, _, _ in fields}
    for r in db.iter_records(batch):
        data = _fields(r["data"])
        extra = set(data) - known
        if extra:
            # The header is already written: refusing keeps the export whole (the file export
            # replaces its target only on success) instead of silently dropping the value.
            raise ExportError(
                f"record {r['key']!r} ({r['source']}) gained field(s) {sorted(extra)} while the "
                "export ran; run the export again"
            )
        row = {name: r.get(name) for name, _ in RECORD_META}
        for name, column, arrow in fields:
            value = data.get(name)
            if value is not None and arrow == "string" and not isinstance(value, str):
                value = json.dumps(value, ensure_ascii=False, separators=(",", ":"), sort_keys=True)
            elif value is not None and arrow == "float64":
                value = float(value)
            row[column] = value
        yield row


def rows(db: Frontier, what: str, *, batch: int = 1000) -> Iterator[dict[str, Any]]:
    """The rows of one export, each with exactly the columns of ``COLUMNS[what]``, streamed."""
    cols = [name for name, _ in COLUMNS[what]]
    if what == "records":
        source: Iterable[dict[str, Any]] = db.iter_records(batch)
    elif what == "urls":
        source = db.iter_urls(batch)
    elif what == "events":
        source = ({**e, "key": event_key(e)} for e in db.iter_events(batch))
    else:
        source = aggregate_rows(db.aggregates())
    for row in source:
        yield {c: row.get(c) for c in cols}


def export(
    db: Frontier,
    fmt: str,
    what: str,
    out: str | os.PathLike[str] = "-",
    *,
    batch: int = 1000,
    row_group_rows: int = 10_000,
) -> int:
    """Write one export to ``out`` (a path, or "-" for stdout); returns the rows written.

    JSONL: one object per line (a record's ``data`` as a JSON object). CSV: a header row, then
    one row per item, NULL as an empty field. Parquet: typed columns (``COLUMNS``), written in
    row groups of ``row_group_rows``. In CSV and Parquet, records are flat: the metadata
    columns, then one column per data field (``record_fields``); nested values as JSON text.
    """
    if fmt not in FORMATS:
        raise ExportError(f"unknown export format {fmt!r} (choose from {', '.join(FORMATS)})")
    if what not in WHATS:
        raise ExportError(f"unknown export {what!r} (choose from {', '.join(WHATS)})")
    if row_group_rows <= 0 or batch <= 0:
        raise ExportError("batch and row_group_rows must be positive")
    pq_mod = _pyarrow() if fmt == "parquet" else None
    columns = COLUMNS[what]
    if what == "records" and fmt != "jsonl":
        fields = record_fields(db, batch=batch)
        columns = RECORD_META + tuple((column, arrow) for _, column, arrow in fields)
        items = flat_record_rows(db, fields, batch=batch)
    else:
        items = rows(db, what, batch=batch)
    if str(out) == "-":
        if fmt == "parquet":
            if sys.stdout.isatty():
                raise ExportError("refusing to write Parquet to a terminal: use -o FILE")
            sys.stdout.flush()
            return _write_parquet(pq_mod, items, columns, sys.stdout.buffer, row_group_rows)
        return _write_text(items, fmt, what, columns, sys.stdout)
    with _replace_on_success(Path(out)) as fh:
        if fmt == "parquet":
            return _write_parquet(pq_mod, items, columns, fh, row_group_rows)
        text = io.TextIOWrapper(fh, encoding="utf-8", newline="")
        try:
            return _write_text(items, fmt, what, columns, text)
        finally:
            text.flush()
            text.detach()


def _pyarrow() -> Any:
    try:
        import pyarrow
        import pyarrow.parquet
    except ImportError:
        raise ExportError(PARQUET_MISSING) from None
    return pyarrow


@contextlib.contextmanager
def _replace_on_success(target: Path) -> Iterator[IO[bytes]]:
    """A binary file that becomes ``target`` only if the block completes without error."""
    parent = target.parent if str(target.parent) else Path(".")
    if not parent.is_dir():
        raise ExportError(f"cannot write {str(target)!r}: directory {str(parent)!r} does not exist")
    if target.is_dir():
        raise ExportError(f"cannot write {str(target)!r}: it is a directory")
    tmp = parent / f".{target.name}.{os.getpid()}.{secrets.token_hex(4)}.part"
    try:
        # os.open with 0o666 lets the umask decide the final file's mode, as for a plain open.
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    except OSError as exc:
        raise ExportError(f"cannot write in {str(parent)!r}: {exc.strerror or exc}") from None
    try:
        with os.fdopen(fd, "wb") as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _write_text(
    items: Iterator[dict[str, Any]],
    fmt: str,
    what: str,
    columns: tuple[tuple[str, str], ...],
    out: IO[str],
) -> int:
    n = 0
    if fmt == "csv":
        w = csv.writer(out)
        w.writerow([name for name, _ in columns])
        for row in items:
            w.writerow(_csv_cell(v) for v in row.values())
            n += 1
        return n
    for row in items:
        if what == "records":
            row["data"] = json.loads(row["data"])
        out.write(json.dumps(row, ensure_ascii=False, separators=(",", ":")) + "\n")
        n += 1
    return n


def _csv_cell(value: Any) -> Any:
    """Booleans as JSON spells them (``true``), so a CSV cell reads the same as in JSONL."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return value


def _write_parquet(
    pa: Any,
    items: Iterator[dict[str, Any]],
    columns: tuple[tuple[str, str], ...],
    sink: IO[bytes],
    group: int,
) -> int:
    schema = pa.schema([(name, getattr(pa, kind)()) for name, kind in columns])
    names = schema.names
    n = 0
    with pa.parquet.ParquetWriter(sink, schema) as writer:
        columns: dict[str, list[Any]] = {c: [] for c in names}
        pending = 0
        for row in items:
            for c in names:
                columns[c].append(row[c])
            pending += 1
            if pending == group:
                writer.write_table(pa.Table.from_pydict(columns, schema=schema))
                n += pending
                columns = {c: [] for c in names}
                pending = 0
        if pending:
            writer.write_table(pa.Table.from_pydict(columns, schema=schema))
            n += pending
    return n
