"""The partition map: P partitions of one crawl spread over S PostgreSQL servers.

Why it looks like this:

* ``partition = stable_hash(host_key) mod P`` with blake2b (never Python's ``hash()``, which is
  salted per process): every process of every machine must route a host to the same partition,
  so all politeness state of a host lives in one partition and no politeness decision needs
  two databases.
* P is fixed when the crawl is made and P ≫ S, so a server is added by moving whole partitions
  (a schema each), never by re-hashing hosts.
* Partition ``p`` is the schema ``<crawl>_pNNN`` on server ``p mod S``: an ordinary
  PostgreSQL frontier, nothing special about it but its outbox (``partition.py``).
* The map itself is a row in the table ``fleet_map`` of the crawl's own schema (``<crawl>``,
  the ``schema=`` of the DSN) on **every** server, so ``crawl --db`` given any one DSN of the
  crawl finds the rest. A DSN whose schema has no ``fleet_map`` is an ordinary crawl.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..frontier.base import FrontierError

#: Bits of a partitioned crawl's url_id that hold the partition's own url_id; the partition
#: number sits above them (``docs/partitioning.md``), so a lease names its partition.
LOCAL_ID_BITS = 40
LOCAL_ID_MASK = (1 << LOCAL_ID_BITS) - 1
#: Upper bound on P: the partition number must fit beside the local id in a signed bigint.
MAX_PARTITIONS = 1 << 16
MAP_VERSION = 1

__all__ = [
    "LOCAL_ID_BITS",
    "PartitionMap",
    "global_id",
    "local_id",
    "partition_of",
    "stable_hash",
]


def stable_hash(key: str) -> int:
    """First 8 bytes of blake2b as an unsigned integer: the same on every process and machine."""
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big")


def partition_of(key: str, partitions: int) -> int:
    """The partition a host key (or a record id) belongs to."""
    return stable_hash(key) % partitions


def global_id(partition: int, local: int) -> int:
    """A partition's url_id (or event id) as the crawl-wide id: partition in the high bits."""
    if not 0 <= local <= LOCAL_ID_MASK:
        raise FrontierError(f"local id {local} does not fit in {LOCAL_ID_BITS} bits")
    return (partition << LOCAL_ID_BITS) | local


def local_id(gid: int) -> tuple[int, int]:
    """``(partition, local id)`` of a crawl-wide id."""
    return gid >> LOCAL_ID_BITS, gid & LOCAL_ID_MASK


class ServerUnreachable(FrontierError):
    """A server of the crawl did not accept a connection."""


def _check_schema_name(name: str) -> None:
    if not name or len(name.encode()) > 58 or not all(c.isalnum() or c == "_" for c in name):
        raise FrontierError(
            f"crawl name {name!r} must be 1-58 letters, digits or '_' (it prefixes the "
            "partition schemas)"
        )


@dataclass(frozen=True, slots=True)
class PartitionMap:
    """Which server holds which partition of crawl ``crawl`` (its schema name)."""

    crawl: str
    partitions: int
    servers: tuple[str, ...]

    def __post_init__(self) -> None:
        _check_schema_name(self.crawl)
        if not 1 <= self.partitions <= MAX_PARTITIONS:
            raise FrontierError(f"partitions must be 1..{MAX_PARTITIONS}, got {self.partitions}")
        if not self.servers:
            raise FrontierError("a partition map needs at least one server")
        if len(set(self.servers)) != len(self.servers):
            raise FrontierError("the same server is listed twice in the partition map")
        for dsn in self.servers:
            if not dsn.startswith(("postgresql://", "postgres://")):
                raise FrontierError(f"a fleet server must be a postgresql:// URL, got {dsn!r}")
            if "schema=" in dsn:
                raise FrontierError(f"give fleet servers without ?schema= (got {dsn!r})")

    def schema(self, partition: int) -> str:
        return f"{self.crawl}_p{partition:03d}"

    def server(self, partition: int) -> str:
        return self.servers[partition % len(self.servers)]

    def of_host(self, host_key: str) -> int:
        return partition_of(host_key, self.partitions)

    def of_record(self, rid: str) -> int:
        """Where a record lives: by its id, so one key yielded by two hosts is one row."""
        return partition_of(rid, self.partitions)

    def to_json(self) -> str:
        return json.dumps(
            {
                "version": MAP_VERSION,
                "crawl": self.crawl,
                "partitions": self.partitions,
                "servers": list(self.servers),
            },
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, text: str) -> PartitionMap:
        try:
            d = json.loads(text)
            if d.get("version") != MAP_VERSION:
                raise FrontierError(f"partition map version {d.get('version')} is not known")
            return cls(d["crawl"], int(d["partitions"]), tuple(d["servers"]))
        except (ValueError, KeyError, TypeError) as exc:
            raise FrontierError(f"unreadable partition map: {exc}") from exc


def connect(dsn: str) -> Any:
    """An autocommit connection for the map's own statements (errors name no password)."""
    import psycopg
    from psycopg.conninfo import conninfo_to_dict

    try:
        return psycopg.connect(dsn, connect_timeout=10, autocommit=True)
    except psycopg.Error as exc:
        try:
            params = conninfo_to_dict(dsn)
            where = f"{params.get('host', 'localhost')}:{params.get('port', 5432)}"
        except psycopg.Error:
            where = "the given address"
        raise ServerUnreachable(f"cannot connect to PostgreSQL at {where}: {exc}") from exc


def load_map(dsn: str, schema: str) -> PartitionMap | None:
    """The map stored in ``schema`` on the server of ``dsn``; None for an ordinary crawl."""
    with connect(dsn) as conn:
        found = conn.execute("SELECT to_regclass(%s)", (f'"{schema}".fleet_map',)).fetchone()
        if found is None or found[0] is None:
            return None
        row = conn.execute(
            f'SELECT value FROM "{schema}".fleet_map WHERE key = %s', ("map",)
        ).fetchone()
    if row is None:
        raise FrontierError(f"schema {schema} has a fleet_map table without a map")
    return PartitionMap.from_json(row[0])


#: Tables of the crawl's own schema (every server): the map; on the first server also the
#: members' heartbeats (``membership.py``).
MAP_TABLES = (
    "CREATE TABLE IF NOT EXISTS {s}.fleet_map (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS {s}.fleet_members (member TEXT PRIMARY KEY, "
    "joined_at DOUBLE PRECISION NOT NULL, heartbeat_at DOUBLE PRECISION NOT NULL, "
    "expires_at DOUBLE PRECISION NOT NULL, left_at DOUBLE PRECISION)",
)
#: Tables a partition's schema has beside the frontier's (``partition.py``).
PARTITION_TABLES = (
    "CREATE TABLE IF NOT EXISTS {s}.fleet_outbox (id BIGSERIAL PRIMARY KEY, "
    "target INTEGER NOT NULL, kind TEXT NOT NULL, payload TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS {s}.fleet_ownership (partition INTEGER NOT NULL, "
    "epoch BIGINT NOT NULL, owner TEXT NOT NULL, acquired_at DOUBLE PRECISION NOT NULL, "
    "expires_at DOUBLE PRECISION NOT NULL, released_at DOUBLE PRECISION, "
    "PRIMARY KEY (partition, epoch))",
)


def make_map(crawl: str, partitions: int, servers: Sequence[str]) -> PartitionMap:
    return PartitionMap(crawl, partitions, tuple(servers))
