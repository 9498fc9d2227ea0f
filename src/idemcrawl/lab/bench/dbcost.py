"""What the database itself spends on the frontier's work: server CPU, statements, round trips.

``bench frontier`` times the frontier from the client; this module measures the other side.

**Server CPU (PostgreSQL on this machine).** A PostgreSQL backend serves exactly one connection
and works only while its client waits for an answer (the frontier's calls are synchronous: the
client sends, then blocks until ``ReadyForQuery``). So reading the backend's CPU time just before
and just after each frontier call attributes that backend's CPU to that call *exactly*, with no
need for separate lease-only and complete-only phases, and with any number of client processes
running at once (each reads only its own backend). The backend is named by
``PostgresFrontier.backend_pid``; its CPU time is ``/proc/<pid>/schedstat``'s first field, the
kernel's ``sum_exec_runtime`` in nanoseconds (the same quantity ``/proc/<pid>/stat`` reports as
utime + stime, but in ns rather than 10 ms ticks, so one call's share is not rounded away); where
schedstat is missing, ``stat``'s utime + stime is used. ``pg_stat_statements`` would attribute
time per statement, but it only works when preloaded at server start
(``shared_preload_libraries``), which a benchmark cannot require of a shared server.

A pid could name another process when the server lives in another PID namespace (a container),
so the server counts as *local* only when ``/proc/<pid>`` is a ``postgres`` process that started
when ``pg_stat_activity`` says that backend started; otherwise server CPU is not reported.

The server's auxiliary processes (WAL writer, checkpointer, background writer, autovacuum, the
postmaster) work for every client of the server at once: their CPU over the measured phase is
reported beside the backends' as a server-wide figure, exact for the processes but shared with
any other client of the same server (and blind to processes that start during the phase, such
as autovacuum workers).

**Statements and round trips.** For PostgreSQL, the frontier's connection is traced with libpq's
``PQtrace`` (psycopg's ``PGconn.trace``) around one call, and the wire messages are counted: a
*statement* is an ``Execute`` (extended protocol) or a ``Query`` (simple protocol: psycopg's
BEGIN and COMMIT); a *round trip* is a ``ReadyForQuery`` from the server, the end of one request
cycle the client waited for (one per ``Sync`` or ``Query``, so a pipeline of several statements
is one). Counting on the wire sees whatever the frontier does (cursors, pipelines, executemany,
COPY) without knowing its code. Tracing prints every message, which is slow, so only a few calls
made after the timed phase are traced. The trace's timestamps also time each round trip (first
message out to ``ReadyForQuery``, as the client sees it) and charge it to the SQL of its first
statement: where a call's time goes, statement by statement, without ``pg_stat_statements``.
For SQLite (no server, no round trips) the statements are counted with ``sqlite3``'s trace
callback, which fires once per statement execution.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sqlite3
import struct
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

__all__ = [
    "CPU_SOURCE",
    "ServerCpu",
    "ServerProcesses",
    "WireCount",
    "count_pg_wire",
    "count_sqlite_statements",
    "cpu_ns",
    "find_connection",
    "parse_trace",
    "prepared_statements",
]

_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
#: A statement's SQL is named by its first this many characters.
_LABEL_CHARS = 90


def _schedstat_ns(pid: int) -> int:
    with open(f"/proc/{pid}/schedstat", "rb") as f:
        return int(f.read().split()[0])


def _stat_fields(pid: int) -> tuple[str, list[str]]:
    """The command name and the fields after it (the name may contain spaces and parentheses)."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        raw = f.read().decode(errors="replace")
    return raw[raw.index("(") + 1 : raw.rindex(")")], raw[raw.rindex(")") + 2 :].split()


def _cpu_fields(rest: list[str]) -> tuple[int, int, int]:
    """From ``_stat_fields``' fields: the process's start time (clock ticks since boot: with
    the pid, its identity), its own CPU and the CPU of the children it has reaped, in ns."""
    # rest[0] is field 3 (state): utime, stime, cutime, cstime are fields 14-17, starttime 22.
    own = (int(rest[11]) + int(rest[12])) * 1_000_000_000 // _CLK_TCK
    reaped = (int(rest[13]) + int(rest[14])) * 1_000_000_000 // _CLK_TCK
    return int(rest[19]), own, reaped


def _stat_cpu_ns(pid: int) -> int:
    return _cpu_fields(_stat_fields(pid)[1])[1]


def _pick_source() -> tuple[str, Callable[[int], int]]:
    try:
        _schedstat_ns(os.getpid())
        return "/proc/<pid>/schedstat", _schedstat_ns
    except (OSError, ValueError, IndexError):
        return "/proc/<pid>/stat utime+stime", _stat_cpu_ns


#: Where CPU times are read on this machine.
CPU_SOURCE, _read_cpu = _pick_source()


def cpu_ns(pid: int) -> int | None:
    """CPU time (user + system) process ``pid`` has used, in ns; None once it is gone."""
    try:
        return _read_cpu(pid)
    except (OSError, ValueError, IndexError):
        return None


def _started_at(pid: int) -> float | None:
    """When process ``pid`` started (Unix time, about 1 s precision: ``btime`` is whole)."""
    try:
        _, rest = _stat_fields(pid)
        with open("/proc/stat", "rb") as f:
            btime = next(int(line.split()[1]) for line in f if line.startswith(b"btime "))
    except (OSError, ValueError, IndexError, StopIteration):
        return None
    return btime + int(rest[19]) / _CLK_TCK


def _parent(pid: int) -> int | None:
    try:
        return int(_stat_fields(pid)[1][1])
    except (OSError, ValueError, IndexError):
        return None


class ServerProcesses:
    """The PostgreSQL server's processes as seen from this machine, through one own connection.

    ``local`` is False (and every figure None) when the server's processes are not visible
    here: another machine, another PID namespace, or no ``/proc``.
    """

    def __init__(self, dsn: str, backend_pid: int | None) -> None:
        import psycopg

        self._conn = psycopg.connect(dsn, autocommit=True, application_name="idemcrawl-bench")
        self.local = backend_pid is not None and self.is_local(backend_pid)
        self.postmaster = _parent(backend_pid) if self.local and backend_pid is not None else None

    def backend_pid(self) -> int:
        """The pid of the backend serving this object's own connection."""
        return int(self._conn.info.backend_pid)

    def is_local(self, pid: int) -> bool:
        """Whether backend ``pid`` is a process of this machine (see the module doc)."""
        row = self._conn.execute(
            "SELECT backend_start FROM pg_stat_activity WHERE pid = %s", (pid,)
        ).fetchone()
        if row is None or not isinstance(row[0], datetime):
            return False
        try:
            name, _ = _stat_fields(pid)
        except (OSError, ValueError):
            return False
        started = _started_at(pid)
        return (
            name in ("postgres", "postmaster")
            and started is not None
            and abs(started - row[0].timestamp()) < 2.0
        )

    def auxiliary(self) -> dict[int, str]:
        """pid -> kind of every server process that is not a client backend (and the
        postmaster): the ones that work for all clients at once."""
        if not self.local:
            return {}
        rows = self._conn.execute(
            "SELECT pid, backend_type FROM pg_stat_activity WHERE backend_type <> 'client backend'"
        ).fetchall()
        aux = {int(pid): str(kind) for pid, kind in rows if pid is not None}
        if self.postmaster is not None:
            aux[self.postmaster] = "postmaster"
        return aux

    def cpu(self, pids: dict[int, str]) -> dict[int, int]:
        """CPU ns of each of ``pids`` still alive."""
        out: dict[int, int] = {}
        for pid in pids:
            ns = cpu_ns(pid)
            if ns is not None:
                out[pid] = ns
        return out

    def close(self) -> None:
        self._conn.close()


def _children(ppid: int) -> dict[tuple[int, int], int]:
    """(pid, start time) -> CPU ns of every live process whose parent is ``ppid``."""
    out: dict[tuple[int, int], int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        try:
            _, rest = _stat_fields(pid)
            if int(rest[1]) != ppid:
                continue
            started, own, _ = _cpu_fields(rest)
        except (OSError, ValueError, IndexError):
            continue  # gone while we looked: its CPU is in the parent's reaped time
        out[(pid, started)] = own
    return out


@dataclass(frozen=True)
class _ServerSnapshot:
    postmaster_own_ns: int
    postmaster_reaped_ns: int
    children: dict[tuple[int, int], int]


class ServerCpu:
    """The CPU time the whole PostgreSQL server used between :meth:`start` and :meth:`stop`,
    read from ``/proc`` at those two instants only, while a crawl runs in another process.

    The server is a tree: the postmaster forks one backend per connection and its auxiliary
    processes (WAL writer, checkpointer, ...), and it reaps each child that exits, at which
    point the kernel adds the child's CPU time to the postmaster's ``cutime`` + ``cstime``. So
    the CPU of every server process over the interval — however short-lived its connection —
    is exactly: the change in the postmaster's own and reaped time, plus the change of each
    child alive at both ends, plus the whole time of each child born since, minus the time
    before the start of each child that has since been reaped. Nothing polls while the crawl
    runs: an earlier sampler listed the crawl's backends every 50 ms through a connection of
    its own, CPU that fell on a PostgreSQL run only (about 3 % of the machine in session 14's
    profile) and that missed up to one period of each backend.

    The figure is the server's, not one application's: it includes the auxiliary processes
    (which work for the crawl) and any other client of the server during the run (a benchmark
    runs alone). Resolution is the kernel's clock tick (10 ms) per process. ``seconds`` is None
    when the server's processes are not visible here (another machine, another PID namespace:
    the check of ``ServerProcesses``) or could not be read; ``error`` says why.
    """

    def __init__(self, dsn: str) -> None:
        self._dsn = dsn
        self._postmaster: int | None = None
        self._start: _ServerSnapshot | None = None
        self.seconds: float | None = None
        self.error: str | None = None

    def _snapshot(self, postmaster: int) -> _ServerSnapshot:
        _, own, reaped = _cpu_fields(_stat_fields(postmaster)[1])
        return _ServerSnapshot(own, reaped, _children(postmaster))

    def start(self) -> None:
        import psycopg

        try:
            watch = ServerProcesses(self._dsn, None)
            try:
                pid = watch.backend_pid()
                if watch.is_local(pid):
                    self._postmaster = _parent(pid)
            finally:
                watch.close()  # this backend's exit is counted too (a few ms)
        except psycopg.Error as exc:
            self.error = str(exc)
            return
        if self._postmaster is None:
            self.error = "the server's processes are not visible from this machine"
            return
        try:
            self._start = self._snapshot(self._postmaster)
        except (OSError, ValueError, IndexError) as exc:
            self.error = f"cannot read the server's processes: {exc}"

    def stop(self) -> float | None:
        """The server's CPU seconds since :meth:`start` (None: not measurable here)."""
        if self._start is None or self._postmaster is None:
            return None
        try:
            end = self._snapshot(self._postmaster)
        except (OSError, ValueError, IndexError) as exc:
            self.error = f"cannot read the server's processes: {exc}"
            return None
        before = self._start
        ns = end.postmaster_own_ns - before.postmaster_own_ns
        ns += end.postmaster_reaped_ns - before.postmaster_reaped_ns
        for key, was in before.children.items():
            ns += end.children[key] - was if key in end.children else -was
        ns += sum(now for key, now in end.children.items() if key not in before.children)
        self.seconds = max(0, ns) / 1e9
        return self.seconds


def cpu_delta_ns(before: dict[int, int], after: dict[int, int]) -> int:
    """CPU used between two ``cpu`` readings by the processes present in both."""
    return sum(after[pid] - ns for pid, ns in before.items() if pid in after)


def find_connection(obj: object, kind: type) -> Any:
    """The ``kind`` connection an object holds in one of its attributes, or None.

    A frontier keeps its connection private; looking it up by type rather than by attribute
    name keeps the benchmark working while the frontier's internals change.
    """
    for value in vars(obj).values():
        if isinstance(value, kind):
            return value
    return None


@dataclass
class WireCount:
    """Protocol messages of the traced calls (PostgreSQL) or statements run (SQLite)."""

    calls: int = 0
    #: What the calls handled (grants for lease calls, pages for completion batches).
    items: int = 0
    statements: int = 0
    #: None for SQLite: it runs in the process, nothing travels.
    round_trips: int | None = None
    bytes_sent: int | None = None
    bytes_received: int | None = None
    #: Writes to the socket that carried them (``tcp_data_segments_sent``); None where the
    #: kernel does not say (not Linux, a Unix socket).
    sends: int | None = None
    #: Round trips and their milliseconds, keyed by the first statement each carried (its
    #: SQL, whitespace collapsed, cut short): where the calls' time goes, statement by statement.
    by_statement: dict[str, list[float]] = field(default_factory=dict)

    def add(self, other: WireCount) -> None:
        self.calls += other.calls
        self.items += other.items
        self.statements += other.statements
        if other.round_trips is not None:
            self.round_trips = (self.round_trips or 0) + other.round_trips
            self.bytes_sent = (self.bytes_sent or 0) + (other.bytes_sent or 0)
            self.bytes_received = (self.bytes_received or 0) + (other.bytes_received or 0)
        if other.sends is not None:
            self.sends = (self.sends or 0) + other.sends
        for label, (n, ms) in other.by_statement.items():
            mine = self.by_statement.setdefault(label, [0, 0.0])
            mine[0] += n
            mine[1] += ms

    def slowest(self, n: int = 3) -> list[tuple[str, float, float]]:
        """The ``n`` statements taking most time: (SQL, round trips per call, ms per call)."""
        calls = max(self.calls, 1)
        ranked = sorted(self.by_statement.items(), key=lambda kv: -kv[1][1])[:n]
        return [(label, count / calls, ms / calls) for label, (count, ms) in ranked]


def _sql_label(sql: str, more: int) -> str:
    text = " ".join(sql.split())
    text = text if len(text) <= _LABEL_CHARS else text[: _LABEL_CHARS - 1] + "…"
    return text + (f" (+{more} more in the round trip)" if more else "")


def _parse_sql(kind: str, content: str) -> tuple[str | None, str | None]:
    """(prepared name, SQL) of a Parse message, (None, SQL) of a Query, else (None, None).

    The contents read ``"name" "sql" nparams oids…`` (a Parse) or ``"sql"`` (a Query); the
    name never holds a quote, the SQL may, so the SQL runs to the last quote.
    """
    if kind == "Parse":
        parts = content.split('"', 3)
        if len(parts) == 4:
            return parts[1], parts[3].rsplit('"', 1)[0]
    elif kind == "Query":
        return None, content.strip().removeprefix('"').removesuffix('"')
    return None, None


def _timestamp(text: str) -> float | None:
    try:
        return datetime.strptime(text, "%Y-%m-%d %H:%M:%S.%f").timestamp()
    except ValueError:
        return None


def parse_trace(lines: list[str], prepared: dict[str, str] | None = None) -> WireCount:
    """Count statements, round trips and bytes in a libpq trace (one message per line: an
    optional timestamp, direction, length, message type, contents; see the module doc).

    With timestamps, each round trip is timed from its first message out to the server's
    ``ReadyForQuery`` and charged to the first statement it carried (a prepared statement's
    later ``Bind`` is known by its name, from ``prepared`` or a ``Parse`` seen before).
    """
    count = WireCount(calls=1, round_trips=0, bytes_sent=0, bytes_received=0)
    prepared = dict(prepared or {})
    cycle_start: float | None = None
    cycle_sql: list[str] = []
    for line in lines:
        parts = line.split("\t", 4)
        stamp = None
        if parts and parts[0] not in ("F", "B"):
            stamp = _timestamp(parts[0])
            parts = parts[1:]
        if len(parts) < 3 or parts[0] not in ("F", "B"):
            continue
        direction, size, kind = parts[0], parts[1], parts[2].split(" ", 1)[0]
        content = parts[3] if len(parts) > 3 else ""
        nbytes = int(size) if size.isdigit() else 0
        if direction == "F":
            count.bytes_sent = (count.bytes_sent or 0) + nbytes
            if cycle_start is None:
                cycle_start = stamp
            if kind in ("Execute", "Query"):
                count.statements += 1
            name, sql = _parse_sql(kind, content)
            if sql is not None:
                if name:
                    prepared[name] = sql
                cycle_sql.append(sql)
            elif kind == "Bind":
                bound = content.split('"', 4)
                if len(bound) >= 4 and bound[3] in prepared:
                    cycle_sql.append(prepared[bound[3]])
            continue
        count.bytes_received = (count.bytes_received or 0) + nbytes
        if kind != "ReadyForQuery":
            continue
        count.round_trips = (count.round_trips or 0) + 1
        if cycle_start is not None and stamp is not None and cycle_sql:
            unique = list(dict.fromkeys(cycle_sql))
            label = _sql_label(unique[0], len(unique) - 1)
            entry = count.by_statement.setdefault(label, [0, 0.0])
            entry[0] += 1
            entry[1] += (stamp - cycle_start) * 1e3
        cycle_start, cycle_sql = None, []
    return count


def prepared_statements(conn: Any) -> dict[str, str]:
    """The session's prepared statements (name -> SQL), read on ``conn`` between two calls.

    psycopg prepares a statement once it has run a few times, and from then on only binds it
    by name: a trace taken later sees the name, not the SQL.
    """
    rows = conn.execute("SELECT name, statement FROM pg_prepared_statements", prepare=False)
    names = {str(name): str(sql) for name, sql in rows.fetchall()}
    conn.rollback()  # the frontier's connection is left as it was: outside a transaction
    return names


@contextlib.contextmanager
def count_pg_wire(conn: Any) -> Iterator[WireCount]:
    """Trace ``conn`` (a psycopg connection, between two transactions) for the duration of the
    block; the yielded count is filled in when the block ends."""
    from psycopg import pq

    result = WireCount()
    prepared = prepared_statements(conn)
    with tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace") as f:
        pgconn = conn.pgconn
        sent_before = tcp_data_segments_sent(pgconn.socket)
        pgconn.trace(f.fileno())
        pgconn.set_trace_flags(pq.Trace.REGRESS_MODE)  # timestamps kept: they time statements
        try:
            yield result
        finally:
            pgconn.untrace()  # flushes what libpq buffered
            sent_after = tcp_data_segments_sent(pgconn.socket)
            f.seek(0)
            counted = parse_trace(f.read().splitlines(), prepared)
    if sent_before is not None and sent_after is not None:
        counted.sends = sent_after - sent_before
    result.add(counted)


#: ``struct tcp_info``'s ``tcpi_data_segs_out`` (Linux 4.6+): segments that carried data.
_TCPI_DATA_SEGS_OUT = 156


def tcp_data_segments_sent(fd: int) -> int | None:
    """How many data segments the TCP socket ``fd`` has sent (Linux), or None.

    A client's ``send()`` of up to 64 kB is one segment on loopback (libpq sets TCP_NODELAY,
    and loopback's MSS is 64 kB), so the difference over a call counts its writes to the
    socket: what the server process is woken by and what the client spends a system call on.
    """
    try:
        probe = socket.socket(fileno=os.dup(fd))
    except OSError:
        return None
    with probe:
        if probe.family not in (socket.AF_INET, socket.AF_INET6):
            return None
        try:
            info = probe.getsockopt(socket.IPPROTO_TCP, getattr(socket, "TCP_INFO", 11), 256)
        except OSError:
            return None
    if len(info) < _TCPI_DATA_SEGS_OUT + 4:
        return None
    return int(struct.unpack_from("I", info, _TCPI_DATA_SEGS_OUT)[0])


@contextlib.contextmanager
def count_sqlite_statements(conn: sqlite3.Connection) -> Iterator[WireCount]:
    """Count the statements ``conn`` runs during the block (its trace callback)."""
    result = WireCount(calls=1)

    def seen(_statement: str) -> None:
        result.statements += 1

    conn.set_trace_callback(seen)
    try:
        yield result
    finally:
        conn.set_trace_callback(None)
