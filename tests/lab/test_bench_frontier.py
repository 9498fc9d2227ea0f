"""`bench frontier` reports sane figures on a tiny run (a benchmark's own smoke test): one
process and several on SQLite and PostgreSQL, the database-cost figures, the process curve."""

from __future__ import annotations

import json

import pytest

from idemcrawl.cli import main
from idemcrawl.lab.bench import dbcost
from idemcrawl.lab.bench.frontier import (
    FrontierBenchOptions,
    FrontierBenchReport,
    run_frontier_bench,
)

from ..frontier.conftest import require_postgres


def test_frontier_bench_counts_and_sizes() -> None:
    r = run_frontier_bench(FrontierBenchOptions(hosts=20, urls_per_host=3, lease_batch=8))
    assert r.seeded_urls == 60
    assert r.grants == r.completions >= 60
    # every completion discovered 10 new URLs; nothing is lost or duplicated
    assert r.known_urls == 60 + 10 * r.completions
    assert r.grants_per_s > 0 and r.completions_per_s > 0
    assert 50 < r.bytes_per_url < 5000
    assert "lease grants" in r.text()
    # where the bytes go: the URL table, its unique key and its queue index among them
    names = {name for _, name, _ in r.relations}
    assert {"urls", "urls_queue", "hosts", "lease_log"} <= names
    assert any(t == "urls" and n.startswith("sqlite_autoindex_urls") for t, n, _ in r.relations)
    assert 0 < sum(b for _, _, b in r.relations) <= r.bytes_on_disk
    assert [b for _, _, b in r.relations] == sorted((b for _, _, b in r.relations), reverse=True)
    assert "urls_queue" in r.text()
    # one process: the aggregate is its lease+complete loop over the phase's wall clock
    assert r.processes == 1 and len(r.per_process) == 1
    assert 0 < r.aggregate_grants_per_s < r.grants_per_s
    assert r.concurrent_s <= r.wall_s


def test_sqlite_cost_counts_statements_not_round_trips() -> None:
    r = run_frontier_bench(
        FrontierBenchOptions(hosts=20, urls_per_host=3, completions=40, lease_batch=8)
    )
    c = r.cost
    assert c.server_cpu_source is None and c.server_ms_per_1k_grants is None
    assert c.client_ms_per_1k_grants > 0 and c.client_ms_per_1k_completions > 0
    assert (c.counted_lease_calls, c.counted_completion_batches) == (3, 3)
    assert c.counted_grants == c.counted_completions == 3 * 8
    # at least BEGIN, a read and COMMIT per call; each page's 10 links cost something
    assert c.statements_per_lease_call is not None and c.statements_per_lease_call >= 3
    assert c.statements_per_completion_batch is not None
    assert c.statements_per_completion_batch > c.statements_per_lease_call
    assert c.round_trips_per_page is None and c.wire_bytes_per_page is None
    assert "no round trips" in r.text()


def test_sqlite_processes_share_the_work_on_one_file() -> None:
    r = run_frontier_bench(
        FrontierBenchOptions(hosts=60, urls_per_host=3, completions=240, lease_batch=8, processes=3)
    )
    assert r.processes == 3 and r.seeded_urls == 180
    assert [p.share for p in r.per_process] == [80, 80, 80]
    # every process did exactly its share, all on the same file (seeded once)
    assert [p.completions for p in r.per_process] == [80, 80, 80]
    assert r.grants == r.completions == 240
    assert r.known_urls == 180 + 10 * 240
    assert all(p.grants_per_s > 0 and p.completions_per_s > 0 for p in r.per_process)
    assert r.aggregate_grants_per_s == pytest.approx(240 / r.concurrent_s)
    assert r.concurrent_s < r.wall_s
    text = r.text()
    assert "3 processes" in text and "empty leases" in text


def test_memory_frontier_runs_in_one_process_only() -> None:
    with pytest.raises(ValueError, match="one process"):
        run_frontier_bench(FrontierBenchOptions(db="memory:", processes=2))
    r = run_frontier_bench(FrontierBenchOptions(db="memory:", hosts=10, urls_per_host=2))
    assert r.backend == "memory" and r.completions == 20
    assert r.cost.statements_per_page is None  # nothing to count in memory


def test_parse_trace_counts_statements_round_trips_and_bytes() -> None:
    trace = [
        'F\t10\tQuery\t "BEGIN"',
        'B\t10\tCommandComplete\t "BEGIN"',
        "B\t5\tReadyForQuery\t T",
        'F\t16\tParse\t "" "select 1" 0',
        'F\t14\tBind\t "" "" 0 0 1 0',
        'F\t9\tExecute\t "" 0',
        'F\t16\tParse\t "" "select 2" 0',
        'F\t14\tBind\t "" "" 0 0 1 0',
        'F\t9\tExecute\t "" 0',
        "F\t4\tSync",
        "F\t4\tFlush",
        "B\t4\tParseComplete",
        'B\t13\tCommandComplete\t "SELECT 1"',
        'B\t13\tCommandComplete\t "SELECT 1"',
        "B\t5\tReadyForQuery\t T",
        'F\t11\tQuery\t "COMMIT"',
        "B\t5\tReadyForQuery\t I",
    ]
    c = dbcost.parse_trace(trace)
    # BEGIN, two pipelined statements, COMMIT; one round trip each for BEGIN, the pipeline
    # (one Sync) and COMMIT
    assert (c.statements, c.round_trips) == (4, 3)
    assert c.bytes_sent == 10 + 16 + 14 + 9 + 16 + 14 + 9 + 4 + 4 + 11
    assert c.bytes_received == 10 + 5 + 4 + 13 + 13 + 5 + 5


def test_tcp_data_segments_count_writes_to_a_socket_and_nothing_else() -> None:
    """The counter behind ``WireCount.sends``: each ``send()`` on a loopback TCP socket is one
    data segment; reading, and an empty socket, add none; a Unix socket has no count."""
    import socket

    with socket.create_server(("127.0.0.1", 0)) as server:
        client = socket.create_connection(server.getsockname())
        peer, _ = server.accept()
        with client, peer:
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            before = dbcost.tcp_data_segments_sent(client.fileno())
            if before is None:
                pytest.skip("this kernel does not report TCP data segments")
            for chunk in (b"a", b"bb", b"ccc"):
                client.sendall(chunk)
                assert peer.recv(16) == chunk
            peer.sendall(b"answer")
            assert client.recv(16) == b"answer"
            assert dbcost.tcp_data_segments_sent(client.fileno()) == before + 3
    left, right = socket.socketpair()
    with left, right:
        assert dbcost.tcp_data_segments_sent(left.fileno()) is None


def test_parse_trace_times_round_trips_by_statement() -> None:
    trace = [
        '2026-01-01 10:00:00.000000\tF\t10\tQuery\t "BEGIN"',
        "2026-01-01 10:00:00.001000\tB\t5\tReadyForQuery\t T",
        # a statement prepared before the trace began: only its name travels
        '2026-01-01 10:00:00.002000\tF\t28\tBind\t "" "_pg3_1" 1 1 1 2 \'\\x00\\x05\' 1 0',
        '2026-01-01 10:00:00.002000\tF\t9\tExecute\t "" 0',
        "2026-01-01 10:00:00.002000\tF\t4\tSync",
        "2026-01-01 10:00:00.032000\tB\t5\tReadyForQuery\t T",
        # prepared now, inside the trace; libpq prints the SQL's own quotes as they are
        '2026-01-01 10:00:00.040000\tF\t40\tParse\t "_pg3_2" "UPDATE "h" SET a = $1" 1 NNNN',
        '2026-01-01 10:00:00.040000\tF\t28\tBind\t "" "_pg3_2" 1 1 1 2 \'\\x00\\x05\' 1 0',
        '2026-01-01 10:00:00.040000\tF\t9\tExecute\t "" 0',
        "2026-01-01 10:00:00.040000\tF\t4\tSync",
        "2026-01-01 10:00:00.045000\tB\t5\tReadyForQuery\t T",
    ]
    c = dbcost.parse_trace(trace, {"_pg3_1": "SELECT   host_key\n FROM hosts"})
    assert (c.statements, c.round_trips) == (3, 3)
    slowest = c.slowest()
    assert [(sql, n) for sql, n, _ in slowest] == [
        ("SELECT host_key FROM hosts", 1),
        ('UPDATE "h" SET a = $1', 1),
        ("BEGIN", 1),
    ]
    assert [round(ms) for _, _, ms in slowest] == [30, 5, 1]


def test_cli_process_curve_prints_one_row_per_count(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["bench", "frontier", "--hosts", "40", "--urls-per-host", "2", "--completions", "60"]
    assert main([*argv, "--processes", "1,2", "--json"]) == 0
    curve = json.loads(capsys.readouterr().out)["curve"]
    assert [r["processes"] for r in curve] == [1, 2]
    assert [r["completions"] for r in curve] == [60, 60]
    assert all(r["aggregate_grants_per_s"] > 0 for r in curve)
    assert [len(r["per_process"]) for r in curve] == [1, 2]
    assert main([*argv, "--processes", "1,2"]) == 0
    table = capsys.readouterr().out
    assert "| processes | grants/s (all)" in table
    assert [line.split("|")[1].strip() for line in table.splitlines()[3:]] == ["1", "2"]


def test_cli_rejects_bad_process_counts(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["bench", "frontier", "--processes", "0"])
    assert "at least 1" in capsys.readouterr().err
    assert main(["bench", "frontier", "--db", "memory:", "--processes", "2"]) == 2
    assert "one process" in capsys.readouterr().err


# -- PostgreSQL --------------------------------------------------------------------------------


@pytest.fixture
def pg_dsn() -> str:
    """The test server (naming ``require_postgres`` marks these tests ``postgres``)."""
    return require_postgres()


def _pg_run(dsn: str, processes: int) -> tuple[FrontierBenchReport, list[str]]:
    logged: list[str] = []
    r = run_frontier_bench(
        FrontierBenchOptions(
            db=dsn, hosts=60, urls_per_host=3, completions=120, lease_batch=8, processes=processes
        ),
        log=logged.append,
    )
    return r, logged


def _assert_schema_dropped(dsn: str, logged: list[str]) -> None:
    import psycopg

    schema = next(line.split()[2] for line in logged if line.startswith("PostgreSQL schema "))
    with psycopg.connect(dsn) as con:
        row = con.execute("SELECT count(*) FROM pg_namespace WHERE nspname = %s", (schema,))
        assert row.fetchone() == (0,), "the run's schema is dropped after it"


def test_postgres_cost_from_the_server_processes_and_the_wire(pg_dsn: str) -> None:
    r, logged = _pg_run(pg_dsn, 1)
    assert r.backend == "postgresql" and r.grants == r.completions == 120
    assert r.known_urls == 180 + 10 * 120
    c = r.cost
    # this machine runs the server: its backend's CPU is read call by call
    assert c.server_cpu_source == dbcost.CPU_SOURCE
    assert c.server_cpu_lease_s is not None and c.server_cpu_lease_s > 0
    assert c.server_cpu_complete_s is not None and c.server_cpu_complete_s > 0
    assert c.server_ms_per_1k_pages == pytest.approx(
        (c.server_ms_per_1k_grants or 0) + (c.server_ms_per_1k_completions or 0)
    )
    # the backend works only while a call waits for it: what falls outside the calls is tiny
    assert c.server_cpu_between_calls_s is not None
    assert abs(c.server_cpu_between_calls_s) < 0.05 + 0.1 * (
        c.server_cpu_lease_s + c.server_cpu_complete_s
    )
    assert c.server_aux_cpu_s is not None and c.server_aux_cpu_s >= 0
    assert "postmaster" in c.server_aux_processes
    # every call is at least BEGIN + COMMIT: two round trips, two statements
    assert (c.counted_lease_calls, c.counted_completion_batches) == (3, 3)
    assert c.round_trips_per_lease_call is not None and c.round_trips_per_lease_call >= 2
    assert c.round_trips_per_completion_batch is not None
    assert c.round_trips_per_completion_batch >= 2
    assert c.statements_per_completion_batch is not None
    assert c.statements_per_completion_batch >= 2
    assert c.round_trips_per_page == pytest.approx(
        c.round_trips_per_lease_call / 8 + c.round_trips_per_completion_batch / 8
    )
    assert c.wire_bytes_per_page is not None and c.wire_bytes_per_page > 100
    # writes to the socket: one per round trip, but for a statement larger than libpq's 8 kB
    assert c.sends_per_lease_call is not None and c.sends_per_completion_batch is not None
    assert c.round_trips_per_lease_call <= c.sends_per_lease_call
    assert c.sends_per_lease_call <= c.round_trips_per_lease_call + 1
    assert c.round_trips_per_completion_batch <= c.sends_per_completion_batch
    assert c.sends_per_completion_batch <= c.round_trips_per_completion_batch + 1
    assert "/ sends" in r.text()
    # the statements the calls' time went to, by their SQL (prepared ones too)
    assert c.slowest_in_lease and c.slowest_in_completion
    assert all(
        sql.split()[0] in ("SELECT", "UPDATE", "INSERT", "WITH", "BEGIN", "COMMIT", "DELETE", "SET")
        for sql, _, _ in c.slowest_in_lease
    )
    assert "server CPU" in r.text() and "round trips" in r.text()
    # the per-relation breakdown adds up to the schema's size (tables with TOAST, each index)
    assert ("urls", "urls_key") in {(t, n) for t, n, _ in r.relations}
    assert sum(b for _, _, b in r.relations) == r.bytes_on_disk
    _assert_schema_dropped(pg_dsn, logged)


def test_postgres_processes_each_have_their_own_backend(pg_dsn: str) -> None:
    r, logged = _pg_run(pg_dsn, 2)
    assert [p.completions for p in r.per_process] == [60, 60]
    pids = [p.backend_pids for p in r.per_process]
    assert all(len(p) == 1 for p in pids) and pids[0] != pids[1]
    for p in r.per_process:
        assert p.server_cpu_lease_s is not None and p.server_cpu_lease_s > 0
        assert p.server_cpu_complete_s is not None and p.server_cpu_complete_s > 0
    total = sum((p.server_cpu_lease_s or 0) for p in r.per_process)
    assert r.cost.server_cpu_lease_s == pytest.approx(total)
    assert r.aggregate_completions_per_s == pytest.approx(120 / r.concurrent_s)
    _assert_schema_dropped(pg_dsn, logged)


def test_cli_sizes_default_to_the_curve_size_for_a_curve(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from idemcrawl.lab.bench import frontier as bench_frontier

    seen: list[tuple[FrontierBenchOptions, tuple[int, ...]]] = []

    def fake_curve(opts: FrontierBenchOptions, processes: tuple[int, ...], log: object) -> object:
        seen.append((opts, processes))
        return bench_frontier.FrontierCurveReport([])

    def fake_bench(opts: FrontierBenchOptions, log: object) -> object:
        seen.append((opts, (opts.processes,)))
        return bench_frontier.FrontierCurveReport([])

    monkeypatch.setattr(bench_frontier, "run_frontier_curve", fake_curve)
    monkeypatch.setattr(bench_frontier, "run_frontier_bench", fake_bench)
    assert main(["bench", "frontier", "--processes", "1,2,4,8"]) == 0
    assert main(["bench", "frontier", "--processes", "1,2", "--hosts", "7"]) == 0
    assert main(["bench", "frontier", "--processes", "3"]) == 0
    capsys.readouterr()
    curve, curve_hosts, single = seen
    assert (curve[0].hosts, curve[0].urls_per_host, curve[0].completions) == (10_000, 10, 20_000)
    assert curve[1] == (1, 2, 4, 8)
    assert (curve_hosts[0].hosts, curve_hosts[0].urls_per_host) == (7, 10)
    assert single[0] == FrontierBenchOptions(processes=3)  # the benchmark's own defaults


def test_bench_schema_takes_the_given_schema_as_its_prefix() -> None:
    # Users sharing a database own schemas of one prefix: the benchmark's throw-away schema
    # starts with the one the URL names, and is never that schema itself (it is dropped).
    from idemcrawl.lab.bench.frontier import bench_schema

    dsn, schema = bench_schema("postgresql://127.0.0.1/test?schema=pgc_a")
    assert dsn == "postgresql://127.0.0.1/test"
    assert schema.startswith("pgc_a_") and len(schema) > len("pgc_a_")
    assert bench_schema("postgresql://127.0.0.1/test?schema=pgc_a")[1] != schema
    assert bench_schema("postgresql://127.0.0.1/test")[1].startswith("bench_")
