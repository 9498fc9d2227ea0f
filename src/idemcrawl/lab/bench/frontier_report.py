"""The figures ``bench frontier`` reports: per client process, the database's cost, the run,
and the curve over process counts; as JSON (``as_dict``) and as text for a reader (``text``).

How each figure is measured is told in ``frontier`` (rates) and ``dbcost`` (the database's cost).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from . import dbcost

__all__ = ["DbCost", "FrontierBenchReport", "FrontierCurveReport", "ProcessFigures"]


@dataclass
class ProcessFigures:
    """One client process's work; its rates time only its own frontier calls."""

    index: int
    share: int
    grants: int = 0
    completions: int = 0
    lease_calls: int = 0
    #: Lease calls that granted nothing (other processes held every ready host).
    empty_leases: int = 0
    complete_calls: int = 0
    lease_s: float = 0.0
    complete_s: float = 0.0
    grants_per_s: float = 0.0
    completions_per_s: float = 0.0
    client_cpu_lease_s: float = 0.0
    client_cpu_complete_s: float = 0.0
    #: CPU of this process's PostgreSQL backend inside its lease / complete calls (None: not
    #: PostgreSQL, or the server's processes are not visible from here).
    server_cpu_lease_s: float | None = None
    server_cpu_complete_s: float | None = None
    #: Calls during which the connection was replaced (a reconnect): their server CPU is lost.
    server_cpu_lost_calls: int = 0
    #: The backend's CPU outside this process's calls (a check: ~0 when attribution is exact).
    server_cpu_between_calls_s: float | None = None
    backend_pids: list[int] = field(default_factory=list)
    wall_s: float = 0.0
    #: ``time.monotonic()`` when the process finished (one clock for all processes on Linux).
    ended_at: float = 0.0
    peak_rss_mb: float = 0.0


@dataclass
class DbCost:
    """What the database spent (see ``dbcost`` for how each figure is read)."""

    #: Where server CPU was read, None when it was not (SQLite, memory, a remote server).
    server_cpu_source: str | None = None
    server_cpu_lease_s: float | None = None
    server_cpu_complete_s: float | None = None
    server_ms_per_1k_grants: float | None = None
    server_ms_per_1k_completions: float | None = None
    #: Lease + complete backend CPU per 1,000 pages (one grant and one completion each).
    server_ms_per_1k_pages: float | None = None
    #: The backends' CPU outside the benchmark's calls, all processes (a check: ~0).
    server_cpu_between_calls_s: float | None = None
    #: Auxiliary server processes (WAL writer, checkpointer, ...) over the concurrent phase:
    #: server-wide, so shared with any other client of the same server.
    server_aux_cpu_s: float | None = None
    server_aux_ms_per_1k_pages: float | None = None
    server_aux_processes: list[str] = field(default_factory=list)
    client_ms_per_1k_grants: float = 0.0
    client_ms_per_1k_completions: float = 0.0
    #: The traced calls: what they handled and what went over the wire for them.
    counted_lease_calls: int = 0
    counted_grants: int = 0
    counted_completion_batches: int = 0
    counted_completions: int = 0
    statements_per_lease_call: float | None = None
    round_trips_per_lease_call: float | None = None
    statements_per_completion_batch: float | None = None
    round_trips_per_completion_batch: float | None = None
    #: Writes to the socket (``dbcost.tcp_data_segments_sent``): one per round trip is the aim.
    sends_per_lease_call: float | None = None
    sends_per_completion_batch: float | None = None
    sends_per_page: float | None = None
    #: Per page = the lease call's share per grant + the batch's share per completion.
    statements_per_page: float | None = None
    round_trips_per_page: float | None = None
    wire_bytes_per_page: float | None = None
    #: The statements that took most of the traced calls' time, per call: [SQL, round trips,
    #: milliseconds] (PostgreSQL; client-side wall time of each round trip, from the trace).
    slowest_in_lease: list[tuple[str, float, float]] = field(default_factory=list)
    slowest_in_completion: list[tuple[str, float, float]] = field(default_factory=list)

    @classmethod
    def of(cls, figures: list[ProcessFigures], aux_s: float | None, aux_kinds: list[str]) -> DbCost:
        """The CPU figures of a run from its processes' own (and the auxiliary processes')."""
        grants = sum(f.grants for f in figures)
        completions = sum(f.completions for f in figures)
        cost = cls(
            client_ms_per_1k_grants=_per_1k(sum(f.client_cpu_lease_s for f in figures), grants)
            or 0.0,
            client_ms_per_1k_completions=_per_1k(
                sum(f.client_cpu_complete_s for f in figures), completions
            )
            or 0.0,
        )
        lease = [f.server_cpu_lease_s for f in figures]
        done = [f.server_cpu_complete_s for f in figures]
        if any(v is None for v in lease + done):
            return cost
        cost.server_cpu_source = dbcost.CPU_SOURCE
        cost.server_cpu_lease_s = sum(v for v in lease if v is not None)
        cost.server_cpu_complete_s = sum(v for v in done if v is not None)
        cost.server_ms_per_1k_grants = _per_1k(cost.server_cpu_lease_s, grants)
        cost.server_ms_per_1k_completions = _per_1k(cost.server_cpu_complete_s, completions)
        if (
            cost.server_ms_per_1k_grants is not None
            and cost.server_ms_per_1k_completions is not None
        ):
            cost.server_ms_per_1k_pages = (
                cost.server_ms_per_1k_grants + cost.server_ms_per_1k_completions
            )
        between = [f.server_cpu_between_calls_s for f in figures]
        if all(v is not None for v in between):
            cost.server_cpu_between_calls_s = sum(v for v in between if v is not None)
        if aux_s is not None:
            cost.server_aux_cpu_s = aux_s
            cost.server_aux_processes = aux_kinds
            cost.server_aux_ms_per_1k_pages = _per_1k(aux_s, completions)
        return cost

    def add_wire(self, leased: dbcost.WireCount, completed: dbcost.WireCount) -> None:
        """Statements and round trips per call and per page from the traced calls."""
        if not leased.calls or not completed.calls or not leased.items or not completed.items:
            return
        self.counted_lease_calls, self.counted_grants = leased.calls, leased.items
        self.counted_completion_batches = completed.calls
        self.counted_completions = completed.items
        self.statements_per_lease_call = leased.statements / leased.calls
        self.statements_per_completion_batch = completed.statements / completed.calls
        self.statements_per_page = (
            leased.statements / leased.items + completed.statements / completed.items
        )
        if leased.round_trips is not None and completed.round_trips is not None:
            self.round_trips_per_lease_call = leased.round_trips / leased.calls
            self.round_trips_per_completion_batch = completed.round_trips / completed.calls
            self.round_trips_per_page = (
                leased.round_trips / leased.items + completed.round_trips / completed.items
            )
            lease_bytes = (leased.bytes_sent or 0) + (leased.bytes_received or 0)
            done_bytes = (completed.bytes_sent or 0) + (completed.bytes_received or 0)
            self.wire_bytes_per_page = lease_bytes / leased.items + done_bytes / completed.items
            if leased.sends is not None and completed.sends is not None:
                self.sends_per_lease_call = leased.sends / leased.calls
                self.sends_per_completion_batch = completed.sends / completed.calls
                self.sends_per_page = (
                    leased.sends / leased.items + completed.sends / completed.items
                )
            self.slowest_in_lease = leased.slowest()
            self.slowest_in_completion = completed.slowest()


@dataclass
class FrontierBenchReport:
    backend: str
    hosts: int
    seeded_urls: int
    add_per_s: float
    grants: int
    #: One process's rate inside its lease calls (all grants over all lease-call time).
    grants_per_s: float
    completions: int
    completions_per_s: float
    known_urls: int
    bytes_on_disk: int
    bytes_per_url: float
    peak_rss_mb: float
    wall_s: float
    processes: int = 1
    #: Wall clock of the concurrent lease/complete phase and the rates of all processes over it.
    concurrent_s: float = 0.0
    aggregate_grants_per_s: float = 0.0
    aggregate_completions_per_s: float = 0.0
    cost: DbCost = field(default_factory=DbCost)
    per_process: list[ProcessFigures] = field(default_factory=list)
    #: (table, relation, bytes) of every table and index, largest first (deliverable: where a
    #: URL's bytes go).
    relations: list[tuple[str, str, int]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def relation_lines(self, top: int = 12) -> list[str]:
        """The largest tables and indexes in bytes per known URL (the rest summed)."""
        if not self.relations or not self.known_urls:
            return []
        n = self.known_urls
        lines = ["  bytes per known URL by table and index:"]
        for table, name, size in self.relations[:top]:
            what = name if name == table else f"{table}.{name}"
            lines.append(f"    {size / n:>8,.1f}  {what}")
        rest = sum(size for _, _, size in self.relations[top:])
        if rest:
            lines.append(f"    {rest / n:>8,.1f}  ({len(self.relations) - top} smaller ones)")
        return lines

    def text(self) -> str:
        procs = f"{self.processes} process" + ("es" if self.processes != 1 else "")
        lines = [
            f"backend {self.backend}: {self.hosts} hosts, {self.seeded_urls} seeded URLs, {procs}",
            f"  add              {self.add_per_s:,.0f} URLs/s",
            f"  lease grants     {self.grants_per_s:,.0f}/s inside one process's lease calls "
            f"({self.grants} grants, 1 in flight per host)",
            f"  completions      {self.completions_per_s:,.0f}/s inside one process's complete "
            f"calls ({self.completions}, each with 1 record + 10 new links + 1 event)",
            f"  all processes    {self.aggregate_grants_per_s:,.0f} grants/s and "
            f"{self.aggregate_completions_per_s:,.0f} completions/s over the "
            f"{self.concurrent_s:.1f} s of leasing and completing",
        ]
        lines += _cost_lines(self.cost)
        lines += [
            f"  on disk          {self.bytes_per_url:,.0f} bytes per known URL "
            f"({self.known_urls} URLs, {self.bytes_on_disk / 1e6:,.1f} MB)",
            f"  peak RSS         {self.peak_rss_mb:,.0f} MB; wall {self.wall_s:.1f} s",
        ]
        lines[-1:-1] = self.relation_lines()
        if self.processes > 1:
            lines.append(
                "  process  share  grants/s  completions/s  empty leases  server ms/1k grants"
                "  server ms/1k completions"
            )
            for p in self.per_process:
                lines.append(
                    f"  {p.index:>7}  {p.share:>5}  {p.grants_per_s:>8,.0f}  "
                    f"{p.completions_per_s:>13,.0f}  {p.empty_leases:>12}  "
                    f"{_fmt(_per_1k(p.server_cpu_lease_s, p.grants)):>19}  "
                    f"{_fmt(_per_1k(p.server_cpu_complete_s, p.completions)):>24}"
                )
        return "\n".join(lines)


def _per_1k(cpu_s: float | None, n: int) -> float | None:
    """Seconds of CPU spent on ``n`` things as milliseconds per 1,000 of them."""
    return None if cpu_s is None or not n else cpu_s * 1e6 / n


def _fmt(value: float | None, spec: str = ",.1f") -> str:
    return "-" if value is None else format(value, spec)


def _cost_lines(c: DbCost) -> list[str]:
    lines = []
    if c.server_cpu_source is not None:
        lines.append(
            f"  server CPU       {_fmt(c.server_ms_per_1k_grants)} ms per 1,000 grants, "
            f"{_fmt(c.server_ms_per_1k_completions)} ms per 1,000 completions "
            f"({_fmt(c.server_ms_per_1k_pages)} ms per 1,000 pages; the benchmark's backends, "
            f"{c.server_cpu_source}, {_fmt(c.server_cpu_between_calls_s, ',.3f')} s of theirs "
            "outside the calls)"
        )
        if c.server_aux_cpu_s is not None:
            lines.append(
                f"                   + auxiliary processes {c.server_aux_cpu_s:,.2f} s = "
                f"{_fmt(c.server_aux_ms_per_1k_pages)} ms per 1,000 pages (server-wide: "
                f"{', '.join(c.server_aux_processes) or 'none seen'})"
            )
    lines.append(
        f"  client CPU       {c.client_ms_per_1k_grants:,.1f} ms per 1,000 grants, "
        f"{c.client_ms_per_1k_completions:,.1f} ms per 1,000 completions (inside the calls)"
    )
    if c.statements_per_page is not None:
        trips = c.round_trips_per_page is not None
        sends = c.sends_per_lease_call is not None
        what = "statements / round trips" if trips else "statements (SQLite: no round trips)"
        what += " / sends" if sends else ""

        def pair(stmts: float | None, rts: float | None, sent: float | None = None) -> str:
            if not trips:
                return _fmt(stmts)
            return f"{_fmt(stmts)} / {_fmt(rts)}" + (f" / {_fmt(sent)}" if sends else "")

        lease_call = pair(
            c.statements_per_lease_call, c.round_trips_per_lease_call, c.sends_per_lease_call
        )
        batch = pair(
            c.statements_per_completion_batch,
            c.round_trips_per_completion_batch,
            c.sends_per_completion_batch,
        )
        lines.append(
            f"  {what}: per lease call {lease_call} "
            f"({c.counted_grants / max(c.counted_lease_calls, 1):,.0f} grants), per completion "
            f"batch {batch}"
            f" ({c.counted_completions / max(c.counted_completion_batches, 1):,.0f} pages), "
            f"per page {pair(c.statements_per_page, c.round_trips_per_page, c.sends_per_page)}"
            + (
                f", {c.wire_bytes_per_page:,.0f} bytes on the wire per page"
                if c.wire_bytes_per_page is not None
                else ""
            )
            + f" ({c.counted_lease_calls} + {c.counted_completion_batches} calls traced)"
        )
    for what, slowest in (("lease call", c.slowest_in_lease), ("batch", c.slowest_in_completion)):
        if slowest:
            lines.append(f"  slowest statements per {what} (round trips, ms):")
            lines += [f"    {n:>6,.1f} {ms:>9,.1f} ms  {sql}" for sql, n, ms in slowest]
    return lines


@dataclass
class FrontierCurveReport:
    """Grants/s against the number of crawl processes on one database."""

    runs: list[FrontierBenchReport]

    def as_dict(self) -> dict[str, Any]:
        return {"curve": [r.as_dict() for r in self.runs]}

    def text(self) -> str:
        if not self.runs:
            return "no runs"
        first = self.runs[0]
        head = (
            f"backend {first.backend}: {first.hosts} hosts x "
            f"{first.seeded_urls // max(first.hosts, 1)} URLs, {first.completions} completions "
            "per run (a fresh frontier each)"
        )
        rows = [
            head,
            "| processes | grants/s (all) | completions/s (all) | x 1 process | grants/s per "
            "process in lease | completions/s per process in complete | server ms/1k grants | "
            "server ms/1k completions | client ms/1k pages | empty leases |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        base = first.aggregate_grants_per_s
        for r in self.runs:
            ratio = r.aggregate_grants_per_s / base if base else 0.0
            rows.append(
                f"| {r.processes} | {r.aggregate_grants_per_s:,.0f} | "
                f"{r.aggregate_completions_per_s:,.0f} | {ratio:.2f} | {r.grants_per_s:,.0f} | "
                f"{r.completions_per_s:,.0f} | {_fmt(r.cost.server_ms_per_1k_grants)} | "
                f"{_fmt(r.cost.server_ms_per_1k_completions)} | "
                f"{r.cost.client_ms_per_1k_grants + r.cost.client_ms_per_1k_completions:,.1f} | "
                f"{sum(p.empty_leases for p in r.per_process)} |"
            )
        return "\n".join(rows)
