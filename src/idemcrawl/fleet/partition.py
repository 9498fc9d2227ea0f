"""One partition of a partitioned crawl: a PostgreSQL frontier plus its transactional outbox.

A completion commits in its URL's partition. Its links whose hosts live in other partitions, and
its records whose home (chosen by record id, ``PartitionMap.of_record``) is another partition,
cannot be written there in the same transaction, so they go into this partition's
``fleet_outbox`` **in the completion's own transaction** (records, event, URL state and outbox
rows commit or vanish together, I4). A forwarder (``PartitionedFrontier.forward``) later copies
outbox rows into their partitions with insert-if-absent (links) or the record upsert (records)
and only then deletes them, so a crash in between repeats a forward, which changes nothing.

This class is the one place the fleet reaches below the frontier contract: it runs the
scheduler's completion (``Scheduler._complete``) inside ``PostgresFrontier._run`` and adds its
own statements on the same cursor. Everything else of the fleet uses the public contract.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from ..frontier.base import Completion, HostPolicy, NewURL, RecordWrite, RequestSpec
from ..frontier.postgres import PostgresFrontier
from .partition_map import PARTITION_TABLES, partition_of

#: Outbox row kinds.
LINK = "link"
RECORD = "record"


def url_payload(u: NewURL) -> str:
    """A link for another partition, as its outbox row keeps it: with its request spec (I11),
    so a link forwarded across partitions is fetched and parsed as the spider asked."""
    r = u.request
    spec = None
    if r is not None:
        body = None if r.body is None else base64.b64encode(r.body).decode("ascii")
        spec = [r.method, r.callback, r.data, r.headers, body, r.render]
    return json.dumps(
        [u.url, u.host_key, u.priority, u.depth, u.state, u.reason, u.kind, u.hops, spec]
    )


def url_from_payload(text: str) -> NewURL:
    url, host_key, priority, depth, state, reason, kind, hops, *rest = json.loads(text)
    request = None
    if rest and rest[0] is not None:
        method, callback, data, headers, body, render = rest[0]
        raw = None if body is None else base64.b64decode(body)
        request = RequestSpec(method, callback, data, headers, raw, bool(render))
    return NewURL(url, host_key, priority, depth, state, reason, kind, hops, request)


class PartitionFrontier(PostgresFrontier):
    """Partition ``partition`` of ``partitions``: routes what a completion produced for others
    into its outbox in the completion's transaction."""

    def __init__(
        self,
        dsn: str,
        partition: int,
        *,
        schema: str,
        partitions: int | None = None,
        create: bool = False,
        retry_seconds: float = 60.0,
    ) -> None:
        self.partition = partition
        #: The server (without schema), to tell which partitions share an outage.
        self.dsn = dsn
        #: None only while ``init_map`` creates the schema (no routing then).
        self.partitions = partitions
        super().__init__(dsn, schema=schema, create=create, retry_seconds=retry_seconds)
        if create:
            self._run(self._create_tables)

    def _create_tables(self, s: Any) -> None:
        self._lock_migrations(s)  # the same advisory lock as migrations: no CREATE race
        quoted = '"' + self.schema.replace('"', '""') + '"'
        for ddl in PARTITION_TABLES:
            s.cur.execute(ddl.format(s=quoted))

    # -- completions with an outbox ------------------------------------------------------------

    def _split(self, c: Completion, now: float) -> tuple[Completion, list[tuple[int, str, str]]]:
        """The completion as this partition stores it, and its outbox rows for the others."""
        assert self.partitions is not None, "a routing partition knows the partition count"
        out: list[tuple[int, str, str]] = []
        links: list[NewURL] = []
        for u in c.links:
            target = partition_of(u.host_key, self.partitions)
            if target == self.partition:
                links.append(u)
            else:
                out.append((target, LINK, url_payload(u)))
        records: list[RecordWrite] = []
        for r in c.records:
            target = partition_of(r.record_id, self.partitions)
            if target == self.partition:
                records.append(r)
            else:
                row = [r.record_id, r.source, r.key, c.lease.url, r.data_json, r.content_hash, now]
                out.append((target, RECORD, json.dumps(row)))
        if not out:
            return c, out
        return replace(c, links=links, records=records), out

    def complete(
        self, completions: Sequence[Completion], now: float, policy: HostPolicy
    ) -> list[bool]:
        if not completions:
            return []
        split = [self._split(c, now) for c in completions]

        def tx(s: Any) -> list[bool]:
            accepted = self._complete(s, [c for c, _ in split], now, policy)
            rows = [row for (_, out), ok in zip(split, accepted, strict=True) if ok for row in out]
            if rows:
                s.cur.executemany(
                    "INSERT INTO fleet_outbox (target, kind, payload) VALUES (%s, %s, %s)", rows
                )
            return accepted

        return self._run(tx)

    # -- the forwarder's side ------------------------------------------------------------------

    def outbox_batch(self, limit: int) -> list[tuple[int, int, str, str]]:
        """The oldest ``limit`` outbox rows: (id, target partition, kind, payload)."""
        return self._run(
            lambda s: s.cur.execute(
                "SELECT id, target, kind, payload FROM fleet_outbox ORDER BY id LIMIT %s",
                (limit,),
            ).fetchall(),
            write=False,
        )

    def outbox_delete(self, ids: Sequence[int]) -> None:
        if ids:
            self._run(
                lambda s: s.cur.execute(
                    "DELETE FROM fleet_outbox WHERE id = ANY(%s::bigint[])", (list(ids),)
                )
            )

    def outbox_count(self) -> int:
        row = self._run(
            lambda s: s.cur.execute("SELECT count(*) FROM fleet_outbox").fetchone(), write=False
        )
        return int(row[0]) if row else 0

    def upsert_records(self, rows: Sequence[Sequence[Any]]) -> int:
        """Forwarded records, with the same upsert as a completion's (I5): unchanged content
        changes nothing, ``first_seen`` never moves. Returns rows inserted or changed."""
        if not rows:
            return 0

        def tx(s: Any) -> int:
            n = 0
            for rid, source, key, url, data, chash, now in rows:
                s.cur.execute(
                    "INSERT INTO records (record_id, source, key, url, data, content_hash, "
                    "first_seen, last_changed) VALUES (%s, %s, %s, %s, %s, %s, %s, %s) "
                    "ON CONFLICT (record_id) DO UPDATE SET data = excluded.data, "
                    "content_hash = excluded.content_hash, last_changed = excluded.last_changed, "
                    "url = excluded.url "
                    "WHERE records.content_hash IS DISTINCT FROM excluded.content_hash",
                    (rid, source, key, url, data, chash, now, now),
                )
                n += max(s.cur.rowcount, 0)
            return n

        return self._run(tx)

    # -- the ownership log ---------------------------------------------------------------------

    def log_ownership(self, owner: str, epoch: int, acquired_at: float, expires_at: float) -> None:
        """Record (or extend) an ownership term after the frontier granted or renewed it, so
        the log never claims more than the frontier's own ``partitions`` row allowed."""
        self._run(
            lambda s: s.cur.execute(
                "INSERT INTO fleet_ownership (partition, epoch, owner, acquired_at, expires_at) "
                "VALUES (%s, %s, %s, %s, %s) ON CONFLICT (partition, epoch) DO UPDATE SET "
                "expires_at = GREATEST(fleet_ownership.expires_at, excluded.expires_at)",
                (self.partition, epoch, owner, acquired_at, expires_at),
            )
        )

    def log_release(self, epoch: int, released_at: float) -> None:
        self._run(
            lambda s: s.cur.execute(
                "UPDATE fleet_ownership SET released_at = %s WHERE partition = %s AND epoch = %s",
                (released_at, self.partition, epoch),
            )
        )

    def ownership_log(self) -> list[dict[str, Any]]:
        rows = self._run(
            lambda s: s.cur.execute(
                "SELECT partition, epoch, owner, acquired_at, expires_at, released_at "
                "FROM fleet_ownership ORDER BY epoch"
            ).fetchall(),
            write=False,
        )
        keys = ("partition", "epoch", "owner", "acquired_at", "expires_at", "released_at")
        return [dict(zip(keys, r, strict=True)) for r in rows]

    def owner_row(self) -> tuple[str | None, int, float] | None:
        """The frontier's own ownership row of this partition: (owner, epoch, expires_at)."""
        row = self._run(
            lambda s: s.cur.execute(
                "SELECT owner, epoch, expires_at FROM partitions WHERE partition = %s",
                (self.partition,),
            ).fetchone(),
            write=False,
        )
        return None if row is None else (row[0], int(row[1]), float(row[2]))
