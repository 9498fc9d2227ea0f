"""Array parameters in PostgreSQL's binary format, built by C-level loops.

Every set-based statement of the PostgreSQL frontier binds its batch as arrays (``unnest``), one
per column: a completion batch of 60 pages sends some 50 arrays, its links' insert arrays of
~600 elements. psycopg's own list dumper walks each list in Python, one element dumper call per
item, and chooses the element type by scanning the list again; in a replay of a crawl's batches
(docs/benchmarks.md, session 17) that was a quarter of the frontier's client CPU.

``FastListDumper`` takes over the binary dumping of ``list`` on the frontier's connection for
the lists it can encode exactly: one element type, ``int`` (as int8), ``float`` (float8) or
``str`` (text), with or without ``None``, and lists of ``None`` only (as text). The statements
cast each placeholder to the column's type (``%b::int[]``), so an int8 array bound where the
statement wants int4 is cast by the server, as psycopg's int2 or int4 arrays were. A column of
few distinct values (a state, a depth, mostly NULL) encodes each value once. Anything else
(empty lists, other or mixed element types, ints beyond int8, text with NUL characters) is
dumped by psycopg's own dumper, with its own result or error.
"""

from __future__ import annotations

import struct
from itertools import chain, repeat
from typing import Any

from psycopg import adapt, postgres
from psycopg.pq import Format
from psycopg.types.array import ListBinaryDumper

_HEAD = struct.Struct("!iiiii").pack  # dimensions, has-null flag, element oid, length, lower bound
_LENGTH = struct.Struct("!i").pack
_INT8 = struct.Struct("!iq").pack  # each element: its length, then its value
_FLOAT8 = struct.Struct("!id").pack
_NULL = _LENGTH(-1)
_INT8_MIN, _INT8_MAX = -(2**63), 2**63 - 1


def _oids(name: str) -> tuple[int, int]:
    info = postgres.types[name]
    return info.oid, info.array_oid


_INT8_OIDS = _oids("int8")
_FLOAT8_OIDS = _oids("float8")
_TEXT_OIDS = _oids("text")


def _few(values: list[Any], one: Any) -> bytes | None:
    """A column of few values (a state, a kind, a depth, NULLs): each value encoded once."""
    distinct = set(values)
    if len(distinct) * 4 > len(values):
        return None
    pieces = {v: _NULL if v is None else one(v) for v in distinct}
    return b"".join(map(pieces.__getitem__, values))


def _int8(v: int) -> bytes:
    return _INT8(8, v)


def _text(v: str) -> bytes:
    b = v.encode()
    return _LENGTH(len(b)) + b


def _ints(values: list[Any], has_null: bool) -> bytes:
    few = _few(values, _int8)
    if few is not None:
        return few
    if not has_null:
        return b"".join(map(_INT8, repeat(8), values))
    return b"".join([_NULL if v is None else _INT8(8, v) for v in values])


def _floats(values: list[Any], has_null: bool) -> bytes:
    # No encoding per distinct value: 0.0 and -0.0 are one key of a dict.
    if not has_null:
        return b"".join(map(_FLOAT8, repeat(8), values))
    return b"".join([_NULL if v is None else _FLOAT8(8, v) for v in values])


def _texts(values: list[Any], has_null: bool) -> bytes:
    few = _few(values, _text)
    if few is not None:
        return few
    if has_null:
        return b"".join([_NULL if v is None else _text(v) for v in values])
    encoded = list(map(str.encode, values))
    return b"".join(chain.from_iterable(zip(map(_LENGTH, map(len, encoded)), encoded, strict=True)))


def _nulls(values: list[Any], has_null: bool) -> bytes:
    return _NULL * len(values)


#: Element type -> (encoder, element oid, array oid).
_KINDS = {
    int: (_ints, *_INT8_OIDS),
    float: (_floats, *_FLOAT8_OIDS),
    str: (_texts, *_TEXT_OIDS),
    # All NULL: bound as text[], which the statement's cast turns into its type's array.
    type(None): (_nulls, *_TEXT_OIDS),
}


class FastListDumper(ListBinaryDumper):
    """psycopg's binary list dumper, with the common one-dimensional lists encoded here."""

    #: The list ``get_key`` last looked at and its kind: psycopg asks ``upgrade`` about the
    #: same list right after (once per cursor and kind), which then needs no second scan.
    _seen: tuple[Any, type | None] = (None, None)

    def get_key(self, obj: list[Any], format: adapt.PyFormat) -> Any:
        kind = _kind(obj)
        self._seen = (obj, kind)
        if kind is None:
            return super().get_key(obj, format)
        return (FastListDumper, kind)

    def upgrade(self, obj: list[Any], format: adapt.PyFormat) -> Any:
        seen, kind = self._seen
        if seen is not obj:
            kind = _kind(obj)
        self._seen = (None, None)
        if kind is None:
            return super().upgrade(obj, format)
        return _ArrayOf(kind, self._tx)


class _ArrayOf(adapt.Dumper):
    """Dumps a list that ``_kind`` found encodable as ``kind``."""

    format = Format.BINARY

    def __init__(self, kind: type, context: Any) -> None:
        super().__init__(list, context)
        self._encode, self._element_oid, self.oid = _KINDS[kind]

    def dump(self, obj: list[Any]) -> bytes:
        has_null = None in obj
        return _HEAD(1, has_null, self._element_oid, len(obj), 1) + self._encode(obj, has_null)


def _kind(values: Any) -> type | None:
    """The element type ``values`` can be encoded as here, or None for psycopg's dumper."""
    if type(values) is not list or not values:
        return None
    types = set(map(type, values))
    if len(types) > 1:
        types.discard(type(None))
    if len(types) != 1:
        return None
    (kind,) = types
    if kind is int:
        present = [v for v in values if v is not None] if None in values else values
        if min(present) < _INT8_MIN or max(present) > _INT8_MAX:
            return None
    elif kind is str:
        if "\x00" in "".join([v for v in values if v is not None] if None in values else values):
            return None
    elif kind is not float and kind is not type(None):
        return None
    return kind


def register(conn: Any) -> None:
    """Use ``FastListDumper`` for lists bound in binary on ``conn`` (a UTF-8 connection: the
    text encoder writes UTF-8)."""
    if conn.info.encoding.lower().replace("-", "").replace("_", "") != "utf8":
        return
    conn.adapters.register_dumper(list, FastListDumper)
