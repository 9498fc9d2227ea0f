"""`idemcrawl bench frontier`: how fast the frontier grants and completes, what a URL costs, and
what the database spends on it.

The benchmark drives a frontier backend directly (no HTTP), with politeness on: one request in
flight per host, so a grant really runs the two-level schedule and the host token update. Each
completion carries one record and 10 newly discovered links (on the same host), as a real page
would, so completions/s includes the set-based insert-if-absent of its links and the event.

Reported: URLs added/s, lease grants/s, completions/s, bytes on disk per known URL, and the peak
RSS of the benchmark's processes. The per-process rates time only the frontier calls themselves
(a process's grants over the time spent inside its ``lease`` calls, likewise for ``complete``),
which is what one crawl process can get from the frontier.

**Several client processes** (``processes`` > 1): the frontier is seeded once, then that many
client processes (multiprocessing *spawn*: each a fresh interpreter with its own connection, as
separate crawl processes are) each lease and complete under its own owner id, for its own share
of the completions. They start together once all are connected, so neither seeding nor start-up
is timed; the aggregate rates are all grants and all completions over the wall clock of that
concurrent phase, i.e. what a fleet of crawl processes gets through one database. SQLite
processes serialise on the file's write lock, which is what the figure shows. The in-memory
backend lives inside one process and runs with one only. Every process's clock is the same
(the monotonic clock since the run began), so no process sees another's host tokens as future.

**The database's own cost** (see ``dbcost``): the CPU time of the PostgreSQL backends serving the
benchmark, attributed call by call to leasing and to completing, and the server's auxiliary
processes over the same phase; the client's own CPU in each kind of call (for SQLite that is
the database's whole cost); and, from a few calls traced after the timed phase, the statements
and round trips per lease call, per completion batch and per page.

``run_frontier_curve`` runs the benchmark once per process count (1, 2, 4, 8 by default, each on
a freshly seeded frontier) and tabulates grants/s against the number of crawl processes.
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import resource
import sqlite3
import sys
import tempfile
import time
import traceback
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from idemcrawl.frontier import open_frontier, split_schema
from idemcrawl.frontier.base import (
    Completion,
    Frontier,
    FrontierError,
    HostPolicy,
    Lease,
    NewURL,
    RecordWrite,
)

from . import dbcost
from .frontier_report import DbCost, FrontierBenchReport, FrontierCurveReport, ProcessFigures

T = TypeVar("T")

#: The process curve's default size (10^5 URLs, 20,000 completions): long enough to reach a
#: steady rate, short enough to run four times in a few minutes.
CURVE_SIZE: dict[str, int] = {"hosts": 10_000, "urls_per_host": 10, "completions": 20_000}
CURVE_PROCESSES: tuple[int, ...] = (1, 2, 4, 8)
#: Lease time-to-live: far beyond one lease-complete cycle, so no lease expires mid-benchmark.
_LEASE_TTL = 600.0
#: The clock every process passes the frontier starts here (the seeding's "now").
_EPOCH = 1_000_000.0
#: A process whose leases come back empty this long (others hold every ready host) stops.
_EMPTY_PATIENCE_S = 2.0
#: How long spawned processes may take to start and connect.
_START_TIMEOUT_S = 180.0


@dataclass(frozen=True)
class FrontierBenchOptions:
    db: str = "sqlite"
    hosts: int = 1000
    urls_per_host: int = 20
    #: Completions to measure (default: one per seeded URL), shared among the processes.
    completions: int | None = None
    lease_batch: int = 256
    links_per_page: int = 10
    #: Client processes leasing and completing at once on the same database.
    processes: int = 1
    #: Lease calls and completion batches traced after the timed phase to count statements and
    #: round trips (0: do not count).
    counted_calls: int = 3


# -- the database under test ------------------------------------------------------------------


@dataclass
class _Database:
    """Where the benchmark's crawl lives, how to open it again (in another process) and its size."""

    backend: str
    #: SQLite: the file; PostgreSQL: the DSN (its schema beside it); memory: the crawl's name.
    target: str
    schema: str | None = None

    def open(self, create: bool) -> Frontier:
        if self.backend == "postgresql":
            from idemcrawl.frontier.postgres import PostgresFrontier

            return PostgresFrontier(self.target, schema=self.schema, create=create)
        return open_frontier(self.target, create=create)


@contextmanager
def _database(db: str, tmp: str) -> Iterator[_Database]:
    """A fresh crawl for one run, removed afterwards (a temp file, or a schema then dropped)."""
    if db == "sqlite":
        yield _Database("sqlite", os.path.join(tmp, "bench.db"))
    elif db.startswith(("postgresql://", "postgres://")):
        where = _Database("postgresql", *bench_schema(db))
        try:
            yield where
        finally:
            _drop(where)
    elif db.startswith("memory:"):
        # Nothing on disk: its cost is the process's memory (peak RSS).
        yield _Database("memory", "memory:bench-" + uuid.uuid4().hex[:10])
    else:
        raise ValueError(f"--db must be 'sqlite', 'memory:' or a postgresql:// URL, got {db!r}")


def bench_schema(db: str) -> tuple[str, str]:
    """The DSN and a fresh schema of the benchmark's own for ``db``. The benchmark never runs
    in the schema ``db`` names (it drops its schema afterwards): the name is its prefix
    (``?schema=pgc_a`` gives ``pgc_a_<hex>``), so that users sharing a database, who each own
    schemas of one prefix, can run it; without one the prefix is ``bench``."""
    dsn, schema = split_schema(db)
    return dsn, f"{schema or 'bench'}_{uuid.uuid4().hex[:10]}"


def _drop(where: _Database) -> None:
    from idemcrawl.frontier.postgres import PostgresFrontier

    pg = PostgresFrontier(where.target, schema=where.schema)
    try:
        pg.drop_schema()
        try:
            pg.vacuum_catalogs()  # the server may run without autovacuum
        except FrontierError as exc:  # the figures stand; the catalogs are only slower
            print(f"bench frontier: {exc}", file=sys.stderr)
    finally:
        pg.close()


def _bytes_on_disk(where: _Database, frontier: Frontier) -> int:
    if where.backend == "sqlite":
        return sum(
            os.path.getsize(where.target + suffix)
            for suffix in ("", "-wal")
            if os.path.exists(where.target + suffix)
        )
    if where.backend == "postgresql":
        return int(frontier.schema_bytes())  # type: ignore[attr-defined]
    return 0


def _relation_bytes(where: _Database, frontier: Frontier) -> list[tuple[str, str, int]]:
    """(table, relation, bytes) for every table and index of the crawl, largest first: where a
    URL's bytes go (its heap row, each index, the lease log, records, events).

    SQLite: the ``dbstat`` table (pages of each b-tree; the WAL is not in it). PostgreSQL: each
    relation's size (a table with its TOAST data, each index on its own). The memory backend
    has no disk: nothing."""
    if where.backend == "sqlite":
        con = sqlite3.connect(where.target)
        try:
            rows = con.execute(
                "SELECT d.name, COALESCE(m.tbl_name, d.name), SUM(d.pgsize) FROM dbstat d "
                "LEFT JOIN sqlite_schema m ON m.name = d.name GROUP BY d.name"
            ).fetchall()
        finally:
            con.close()
        out = [(tbl, name, int(n)) for name, tbl, n in rows]
    elif where.backend == "postgresql":
        out = frontier.relation_bytes()  # type: ignore[attr-defined]
    else:
        return []
    return sorted(out, key=lambda r: (-r[2], r[1]))


# -- one client process's loop ----------------------------------------------------------------


@dataclass(frozen=True)
class _Job:
    """What one client process is asked to do (pickled to spawned processes)."""

    index: int
    share: int
    lease_batch: int
    links_per_page: int
    #: The ``time.monotonic()`` that maps to the frontier clock's ``_EPOCH``.
    clock0: float
    #: Keep asking when a lease comes back empty (others may hold the ready hosts).
    wait_when_empty: bool
    #: Read the PostgreSQL backend's CPU (the server's processes are visible here).
    server_local: bool


def _now(job: _Job) -> float:
    return _EPOCH + (time.monotonic() - job.clock0)


def _completions(leases: Sequence[Lease], now: float, links_per_page: int) -> list[Completion]:
    batch = []
    for ls in leases:
        links = [
            NewURL(f"{ls.host_key}/n/{ls.url_id}/{k}", ls.host_key, depth=ls.depth + 1)
            for k in range(links_per_page)
        ]
        rec = RecordWrite.make("bench", str(ls.url_id), {"url": ls.url, "n": 1})
        batch.append(Completion(ls, 200, now, [rec], links, "h", 15_000))
    return batch


class _Calls:
    """Times one process's frontier calls: wall clock, the process's CPU and, on a local
    PostgreSQL server, its backend's CPU (read just before and after the call).

    The backend's CPU over the whole run minus what the calls were charged is kept as a check
    (``server_cpu_between_calls_s``): near zero, it shows the backend works only inside calls,
    so attributing by call is exact.
    """

    def __init__(self, frontier: Frontier, fig: ProcessFigures, server_local: bool) -> None:
        self._frontier = frontier
        self._fig = fig
        self._server = server_local and getattr(frontier, "backend_pid", None) is not None
        if self._server:
            fig.server_cpu_lease_s = fig.server_cpu_complete_s = 0.0
        #: The backend and its CPU when the first call began, and the ns charged to calls.
        self._first: tuple[int, int] | None = None
        self._charged_ns = 0

    def _pid(self) -> int | None:
        pid = getattr(self._frontier, "backend_pid", None) if self._server else None
        if pid is not None and pid not in self._fig.backend_pids:
            self._fig.backend_pids.append(pid)
        return pid

    def run(self, lease: bool, fn: Callable[..., T], *args: Any) -> T:
        pid = self._pid()
        s0 = dbcost.cpu_ns(pid) if pid is not None else None
        if self._first is None and pid is not None and s0 is not None:
            self._first = (pid, s0)
        c0 = time.process_time()
        t0 = time.perf_counter()
        result = fn(*args)
        wall = time.perf_counter() - t0
        cpu = time.process_time() - c0
        server: float | None = None
        if pid is not None and s0 is not None:
            s1 = dbcost.cpu_ns(pid) if self._pid() == pid else None
            if s1 is None:
                self._fig.server_cpu_lost_calls += 1
            else:
                self._charged_ns += s1 - s0
                server = (s1 - s0) / 1e9
        fig = self._fig
        if lease:
            fig.lease_calls += 1
            fig.lease_s += wall
            fig.client_cpu_lease_s += cpu
            if server is not None and fig.server_cpu_lease_s is not None:
                fig.server_cpu_lease_s += server
        else:
            fig.complete_calls += 1
            fig.complete_s += wall
            fig.client_cpu_complete_s += cpu
            if server is not None and fig.server_cpu_complete_s is not None:
                fig.server_cpu_complete_s += server
        return result

    def finish(self) -> None:
        """Record the backend's CPU between calls (only when one backend served every call)."""
        if self._first is None or len(self._fig.backend_pids) != 1:
            return
        pid, first_ns = self._first
        now_ns = dbcost.cpu_ns(pid)
        if now_ns is not None and not self._fig.server_cpu_lost_calls:
            self._fig.server_cpu_between_calls_s = (now_ns - first_ns - self._charged_ns) / 1e9


def _drive(
    frontier: Frontier, job: _Job, log: Callable[[str], None] = lambda s: None
) -> ProcessFigures:
    """Lease and complete until this process's share is done (or nothing more is granted)."""
    fig = ProcessFigures(index=job.index, share=job.share)
    calls = _Calls(frontier, fig, job.server_local)
    owner = f"bench-{job.index}"
    policy = HostPolicy(max_in_flight=1, delay=0.0)
    started = time.perf_counter()
    empty_since: float | None = None
    next_log = 20_000
    while fig.completions < job.share:
        want = min(job.lease_batch, job.share - fig.completions)
        now = _now(job)
        leases = calls.run(True, frontier.lease, owner, want, now, _LEASE_TTL, policy)
        if not leases:
            fig.empty_leases += 1
            if not job.wait_when_empty:
                break
            if empty_since is None:
                empty_since = time.monotonic()
            elif time.monotonic() - empty_since > _EMPTY_PATIENCE_S:
                break
            time.sleep(0.001)
            continue
        empty_since = None
        fig.grants += len(leases)
        now = _now(job)
        batch = _completions(leases, now, job.links_per_page)
        calls.run(False, frontier.complete, batch, now, policy)
        fig.completions += len(batch)
        if fig.completions >= next_log:
            log(f"{fig.completions} completions")
            next_log += 20_000
    fig.wall_s = time.perf_counter() - started
    fig.ended_at = time.monotonic()
    calls.finish()
    fig.grants_per_s = fig.grants / fig.lease_s if fig.lease_s else 0.0
    fig.completions_per_s = fig.completions / fig.complete_s if fig.complete_s else 0.0
    fig.peak_rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return fig


def _worker_main(
    job: _Job,
    where: _Database,
    ready: multiprocessing.Queue[tuple[int, str | None]],
    go: Any,
    results: multiprocessing.Queue[tuple[int, ProcessFigures | None, str | None]],
) -> None:
    """A spawned client process: connect, say so, wait for the start, run its share."""
    try:
        frontier = where.open(create=False)
    except BaseException:
        ready.put((job.index, traceback.format_exc()))
        return
    try:
        ready.put((job.index, None))
        go.wait()
        try:
            results.put((job.index, _drive(frontier, job), None))
        except BaseException:
            results.put((job.index, None, traceback.format_exc()))
    finally:
        frontier.close()


def _shares(total: int, processes: int) -> list[int]:
    return [total // processes + (1 if i < total % processes else 0) for i in range(processes)]


def _run_spawned(
    where: _Database, jobs: list[_Job], start: Callable[[], None]
) -> list[ProcessFigures]:
    """Start one process per job, call ``start`` once all are connected, then let them go."""
    ctx = multiprocessing.get_context("spawn")
    ready: multiprocessing.Queue[tuple[int, str | None]] = ctx.Queue()
    results: multiprocessing.Queue[tuple[int, ProcessFigures | None, str | None]] = ctx.Queue()
    go = ctx.Event()
    procs = [
        ctx.Process(
            target=_worker_main,
            args=(job, where, ready, go, results),
            name=f"bench-frontier-{job.index}",
            daemon=True,
        )
        for job in jobs
    ]
    for p in procs:
        p.start()
    try:
        deadline = time.monotonic() + _START_TIMEOUT_S
        for _ in procs:
            index, error = _get(ready, procs, deadline, "start")
            if error is not None:
                raise RuntimeError(f"client process {index} could not open the frontier:\n{error}")
        start()
        go.set()
        figures: list[ProcessFigures] = []
        for _ in procs:
            index, fig, error = _get(results, procs, None, "finish")
            if error is not None or fig is None:
                raise RuntimeError(f"client process {index} failed:\n{error}")
            figures.append(fig)
        for p in procs:
            p.join(timeout=30)
        return sorted(figures, key=lambda f: f.index)
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
                p.join(timeout=5)


def _get(q: multiprocessing.Queue[Any], procs: list[Any], deadline: float | None, what: str) -> Any:
    """The next message on ``q``, failing if a process died without one or time ran out."""
    while True:
        try:
            return q.get(timeout=0.5)
        except queue.Empty:
            dead = [p for p in procs if p.exitcode not in (None, 0)]
            if dead:
                raise RuntimeError(
                    f"client process {dead[0].name} exited with {dead[0].exitcode} "
                    f"before it could {what}"
                ) from None
            if deadline is not None and time.monotonic() > deadline:
                raise RuntimeError(f"client processes did not {what} in time") from None


# -- statements and round trips ---------------------------------------------------------------


def _count_calls(
    frontier: Frontier, backend: str, opts: FrontierBenchOptions
) -> tuple[dbcost.WireCount, dbcost.WireCount] | None:
    """Trace a few lease calls and completion batches (after the timed phase: tracing is slow)."""
    if backend == "postgresql":
        import psycopg

        kind: type = psycopg.Connection
        counter: Callable[[Any], Any] = dbcost.count_pg_wire
    elif backend == "sqlite":
        kind, counter = sqlite3.Connection, dbcost.count_sqlite_statements
    else:
        return None
    if dbcost.find_connection(frontier, kind) is None:
        return None
    policy = HostPolicy(max_in_flight=1, delay=0.0)
    leased, completed = dbcost.WireCount(), dbcost.WireCount()
    clock = _EPOCH + 1e6  # after anything the timed phase granted
    for _ in range(opts.counted_calls):
        clock += 1.0
        conn = dbcost.find_connection(frontier, kind)
        with counter(conn) as seen:
            leases = frontier.lease("bench-count", opts.lease_batch, clock, _LEASE_TTL, policy)
        if not leases:
            break
        if dbcost.find_connection(frontier, kind) is conn:  # not reconnected mid-call
            seen.items = len(leases)
            leased.add(seen)
        batch = _completions(leases, clock, opts.links_per_page)
        conn = dbcost.find_connection(frontier, kind)
        with counter(conn) as seen:
            frontier.complete(batch, clock, policy)
        if dbcost.find_connection(frontier, kind) is conn:
            seen.items = len(batch)
            completed.add(seen)
    return leased, completed


# -- the run ----------------------------------------------------------------------------------


def _seed(frontier: Frontier, hosts: int, urls_per_host: int) -> float:
    """Add hosts x urls_per_host URLs (host-interleaved, in chunks); returns the seconds taken."""
    host_keys = [f"http://h{h:06d}.bench.invalid" for h in range(hosts)]
    t = time.perf_counter()
    chunk: list[NewURL] = []
    for i in range(urls_per_host):
        for hk in host_keys:
            chunk.append(NewURL(f"{hk}/p/{i}", hk))
            if len(chunk) >= 20_000:
                frontier.add(chunk, _EPOCH)
                chunk = []
    if chunk:
        frontier.add(chunk, _EPOCH)
    return time.perf_counter() - t


class _Phase:
    """The concurrent phase's start, and the CPU the server's auxiliary processes spend in it."""

    def __init__(self, server: dbcost.ServerProcesses | None) -> None:
        self._server = server if server is not None and server.local else None
        self._aux = self._server.auxiliary() if self._server is not None else {}
        self.aux_kinds = sorted(set(self._aux.values()))
        self._before: dict[int, int] = {}
        self.started = 0.0

    def start(self) -> None:
        if self._server is not None:
            self._before = self._server.cpu(self._aux)
        self.started = time.monotonic()

    def aux_cpu_s(self) -> float | None:
        if self._server is None:
            return None
        return dbcost.cpu_delta_ns(self._before, self._server.cpu(self._aux)) / 1e9


def run_frontier_bench(
    opts: FrontierBenchOptions, log: Callable[[str], None] = lambda s: None
) -> FrontierBenchReport:
    if opts.processes < 1:
        raise ValueError("--processes must be at least 1")
    if opts.processes > 1 and opts.db.startswith("memory:"):
        raise ValueError("the in-memory frontier lives in one process: use --processes 1")
    t_start = time.perf_counter()
    with (
        tempfile.TemporaryDirectory(prefix="idemcrawl-bench-") as tmp,
        _database(opts.db, tmp) as where,
    ):
        frontier = where.open(create=True)
        if where.schema is not None:
            log(f"PostgreSQL schema {where.schema} (dropped after the run)")
        server: dbcost.ServerProcesses | None = None
        try:
            seeded = opts.hosts * opts.urls_per_host
            add_s = _seed(frontier, opts.hosts, opts.urls_per_host)
            log(f"added {seeded} URLs in {add_s:.1f} s")
            if where.backend == "postgresql":
                server = dbcost.ServerProcesses(
                    where.target,
                    frontier.backend_pid,  # type: ignore[attr-defined]
                )
            local = server is not None and server.local
            target = opts.completions if opts.completions is not None else seeded
            clock0 = time.monotonic()
            jobs = [
                _Job(i, share, opts.lease_batch, opts.links_per_page, clock0,
                     opts.processes > 1, local)
                for i, share in enumerate(_shares(target, opts.processes))
            ]  # fmt: skip
            phase = _Phase(server)
            if opts.processes == 1:
                phase.start()
                figures = [_drive(frontier, jobs[0], log)]
            else:
                log(f"starting {opts.processes} client processes")
                figures = _run_spawned(where, jobs, phase.start)
            concurrent_s = max(f.ended_at for f in figures) - phase.started
            aux_s = phase.aux_cpu_s()
            known = sum(frontier.stats().urls_by_state.values())
            on_disk = _bytes_on_disk(where, frontier)
            relations = _relation_bytes(where, frontier)
            counted = _count_calls(frontier, where.backend, opts) if opts.counted_calls else None
        finally:
            if server is not None:
                server.close()
            frontier.close()
    wall = time.perf_counter() - t_start
    grants = sum(f.grants for f in figures)
    completions = sum(f.completions for f in figures)
    lease_s = sum(f.lease_s for f in figures)
    complete_s = sum(f.complete_s for f in figures)
    cost = DbCost.of(figures, aux_s, phase.aux_kinds)
    if counted is not None:
        cost.add_wire(*counted)
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return FrontierBenchReport(
        backend=where.backend,
        hosts=opts.hosts,
        seeded_urls=seeded,
        add_per_s=seeded / add_s if add_s else 0.0,
        grants=grants,
        grants_per_s=grants / lease_s if lease_s else 0.0,
        completions=completions,
        completions_per_s=completions / complete_s if complete_s else 0.0,
        known_urls=known,
        bytes_on_disk=on_disk,
        bytes_per_url=on_disk / known if known else 0.0,
        relations=relations,
        peak_rss_mb=max([rss_mb] + [f.peak_rss_mb for f in figures]),
        wall_s=wall,
        processes=opts.processes,
        concurrent_s=concurrent_s,
        aggregate_grants_per_s=grants / concurrent_s if concurrent_s > 0 else 0.0,
        aggregate_completions_per_s=completions / concurrent_s if concurrent_s > 0 else 0.0,
        cost=cost,
        per_process=figures,
    )


def run_frontier_curve(
    opts: FrontierBenchOptions,
    processes: Sequence[int] = CURVE_PROCESSES,
    log: Callable[[str], None] = lambda s: None,
) -> FrontierCurveReport:
    """The benchmark once per process count, each on a freshly seeded frontier."""
    runs = []
    for n in processes:
        log(f"-- {n} process{'es' if n != 1 else ''}")
        runs.append(run_frontier_bench(replace(opts, processes=n), log))
    return FrontierCurveReport(runs)
