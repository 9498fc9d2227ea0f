"""Four crawl processes sharing one PostgreSQL frontier, two of them killed and restarted."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from idemcrawl import owner
from idemcrawl.lab.politeness_check import Allowance, check_log, summarize
from idemcrawl.lab.testsite.multihost import HostSpec, MultiHostServer

from .frontier.conftest import PG_DSN, require_postgres
from .helpers import DEVNULL, run_cli, spawn_cli


def _crawl(seeds: list[str], db: str, cfg: Path) -> subprocess.Popen[str]:
    return spawn_cli(
        "crawl",
        *seeds,
        "--db",
        db,
        "--config",
        str(cfg),
        "--spider",
        "idemcrawl.lab.testsite.page_spider:PageSpider",
        "--warc-dir",
        str(cfg.parent / "warc"),
        "--quiet",
        new_session=True,
        stdout=DEVNULL,
    )


def test_four_processes_on_postgres_with_kills(tmp_path: Path) -> None:
    require_postgres()  # skips locally without a server; fails in CI
    import psycopg

    schema = "t_crawl_" + uuid.uuid4().hex[:10]
    db = f"{PG_DSN}?schema={schema}"
    specs = [
        HostSpec("a", pages=12),
        HostSpec("b", pages=10),
        HostSpec("c", pages=8),
        HostSpec("d", pages=8),
    ]
    try:
        with MultiHostServer(specs) as site:
            cfg = tmp_path / "crawl.toml"
            cfg.write_text(
                'allow_private = ["127.0.0.1"]\ndelay = 0.2\nlease_seconds = 20\n'
                "parse_workers = 0\n"
            )
            procs = [_crawl(site.seed_urls, db, cfg) for _ in range(4)]
            time.sleep(2.5)
            for p in procs[:2]:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
            procs[:2] = [_crawl(site.seed_urls, db, cfg) for _ in range(2)]
            for p in procs:
                _, err = p.communicate(timeout=120)
                assert p.returncode == 0, err
            log = site.request_log()
            disallowed = site.disallowed_prefixes()
            expected = {
                f"{base}/p/{n}": f"{spec.name}: page {n}"
                for base, spec in zip(site.base_urls, specs, strict=True)
                for n in range(spec.pages)
            }
            allowance = {base: Allowance(1, 0.2) for base in site.base_urls}
        violations = check_log(log, allowance, disallowed_prefixes=disallowed)
        assert violations == [], summarize(violations)
        with psycopg.connect(PG_DSN) as con:
            con.execute(f'SET search_path TO "{schema}"')
            rows = con.execute("SELECT key, data FROM records").fetchall()
            events = con.execute(
                "SELECT count(*), count(DISTINCT (url_id, url_version)) FROM events"
            ).fetchone()
            done_pages = con.execute(
                "SELECT count(*) FROM urls WHERE state = 'done' AND kind = 'page'"
            ).fetchone()
        titles = {k: (json.loads(d) if isinstance(d, str) else d)["title"] for k, d in rows}
        assert titles == expected  # one correct row per page
        assert len(rows) == len(expected)
        assert events is not None and done_pages is not None
        assert events[0] == events[1] == done_pages[0]  # one event per completed URL version
    finally:
        with psycopg.connect(PG_DSN, autocommit=True) as con:
            con.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        # the crawls have exited: their owner slots in the temp directory go with the schema
        owner.forget(db)
    assert not os.path.exists(owner.lock_dir_for(db)), "no slot directory is left behind"


@pytest.mark.slow
def test_chaos_on_postgres_is_exact_and_drops_its_schemas(tmp_path: Path) -> None:
    """``idemcrawl chaos --db postgresql://…``: the kill test's crawls on the server, each run in
    a schema of its own that is dropped once scored, with the crawls' owner slots in the temp
    directory, and the catalogs its DDL churned are vacuumed after it (a server without
    autovacuum keeps their dead rows)."""
    require_postgres()
    import psycopg

    vacuumed = "SELECT last_vacuum FROM pg_stat_sys_tables WHERE relname = 'pg_attribute'"
    with psycopg.connect(PG_DSN, autocommit=True) as con:
        started = con.execute("SELECT now()").fetchone()[0]
    res = run_cli(
        "chaos", "--runs", "1", "--kills", "2", "--listings", "3", "--per-page", "10",
        "--latency-ms", "60", "--min", "0.1", "--max", "0.3", "--skip-naive", "--json",
        "--db", PG_DSN, timeout=180, env={"TMPDIR": str(tmp_path)},
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert not list(tmp_path.glob("idemcrawl-owners-*"))
    report = json.loads(res.stdout)
    (idem,) = report["results"]
    assert report["ok"] and report["options"]["db"] == PG_DSN
    assert idem["rows"] == idem["correct"] == 30 and idem["missing"] == 0
    assert idem["events"] == idem["completed_versions"] > 0 and idem["warc_pointers_checked"] > 0
    with psycopg.connect(PG_DSN, autocommit=True) as con:
        left = con.execute("SELECT count(*) FROM pg_namespace WHERE nspname LIKE 'chaos\\_%'")
        assert left.fetchone()[0] == 0
        last = con.execute(vacuumed).fetchone()[0]
        assert last is not None and last >= started


def test_chaos_refuses_an_unknown_database() -> None:
    res = run_cli("chaos", "--db", "mysql://x", "--runs", "1", timeout=60)
    assert res.returncode == 2 and "--db must be" in res.stderr


@pytest.mark.slow
def test_a_crawl_started_while_its_server_is_down_waits_for_it(tmp_path: Path) -> None:
    """A fleet member (re)started during its server's outage (a restart, a crash's recovery)
    says it waits and crawls once the server is back, instead of exiting (issue 36)."""
    from idemcrawl.lab.pgserver import PgServer, find_bin_dir

    from .frontier.conftest import in_ci

    if find_bin_dir() is None:
        if in_ci():
            pytest.fail("CI must run this test: no PostgreSQL server binaries", pytrace=False)
        pytest.skip("no PostgreSQL server binaries (initdb, pg_ctl) on this machine")
    with PgServer() as server, MultiHostServer([HostSpec("a", pages=3)]) as site:
        server.pause()
        proc = spawn_cli(
            "crawl", site.seed_urls[0], "--db", f"{server.dsn}?schema=waits",
            "--allow-private", "127.0.0.1", "--delay", "0", "--no-warc", "--db-wait", "60",
            "--json", env={"TMPDIR": str(tmp_path)},  # its owner slot: none left in /tmp
        )  # fmt: skip
        time.sleep(2.5)
        assert proc.poll() is None  # still waiting, not gone
        server.resume()
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        assert "waiting up to 60 s for the database server" in err
        assert json.loads(out.splitlines()[-1])["complete"] is True
        assert {e["path"] for e in site.request_log()} >= {"/p/0", "/p/1", "/p/2"}
