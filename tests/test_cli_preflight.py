"""Configuration errors end as one line on stderr, exit status 2 and nothing written: a
forgotten ``--allow-private`` (#18), a --db the crawl cannot use, a busy test-site port."""

from __future__ import annotations

import json
import socket
import sqlite3
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from idemcrawl.cli import main
from idemcrawl.lab.testsite import ShopServer, expected_products

from .conftest import SHOP_SPIDER
from .helpers import run_cli, run_python


def test_loopback_seed_without_the_flag_then_with_it(shop: ShopServer, tmp_path: Path) -> None:
    db = tmp_path / "c.db"
    common = [shop.seed_url, "--db", str(db), "--spider", SHOP_SPIDER, "--delay", "0"]
    res = run_cli("crawl", *common)
    assert res.returncode == 2
    assert "Traceback" not in res.stderr
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, res.stderr
    assert "loopback address 127.0.0.1" in lines[0]
    assert "--allow-private 127.0.0.1" in lines[0]
    assert not db.exists()  # nothing remembered: no robots failure, no deferred host
    assert shop.stats()["total"] == 0  # and no request left the machine's crawler

    res = run_cli(
        "crawl", *common, "--allow-private", "127.0.0.1", "--host-concurrency", "4", "--json"
    )
    assert res.returncode == 0, res.stderr
    assert "Traceback" not in res.stderr
    assert json.loads(res.stdout.splitlines()[-1])["finished"] is True
    out = tmp_path / "r.jsonl"
    assert run_cli("export", "--db", str(db), "-o", str(out)).returncode == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert {r["key"]: r["data"]["price"] for r in rows} == expected_products(shop.cfg)


def test_render_without_a_browser_is_one_line_and_writes_nothing(
    shop: ShopServer, tmp_path: Path
) -> None:
    db = tmp_path / "c.db"
    res = run_cli(
        "crawl", shop.seed_url, "--db", str(db), "--allow-private", "127.0.0.1", "--render",
        env={"IDEMCRAWL_CHROMIUM": str(tmp_path / "no-such-browser")},
    )  # fmt: skip
    assert res.returncode == 2
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "no Chromium found for rendering" in lines[0], res.stderr
    assert not db.exists()
    assert shop.stats()["total"] == 0


def _one_line(stderr: str) -> str:
    assert "Traceback" not in stderr, stderr
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, stderr
    return lines[0]


def _tree(root: Path) -> dict[str, bytes | None]:
    """Every path under ``root`` with its bytes (None for a directory): "nothing written"."""
    return {
        str(p.relative_to(root)): None if p.is_dir() else p.read_bytes()
        for p in sorted(root.rglob("*"))
    }


def _directory(tmp: Path) -> str:
    (tmp / "crawls").mkdir()
    return str(tmp / "crawls")


def _random_bytes(tmp: Path) -> str:
    (tmp / "r.db").write_bytes(bytes(range(256)) * 20)
    return str(tmp / "r.db")


def _foreign_sqlite(tmp: Path) -> str:
    con = sqlite3.connect(tmp / "app.db")
    con.execute("CREATE TABLE t (x)")
    con.commit()
    con.close()
    return str(tmp / "app.db")


#: A --db no command can use -> (how to make it, what the one line says when a command would
#: create the crawl, and when it must exist). Port 1 on loopback: nothing listens there.
BAD_DBS: dict[str, tuple[Callable[[Path], str], str, str]] = {
    "directory": (_directory, "is a directory, not a database file", "is a directory"),
    "missing directory": (lambda t: str(t / "no" / "x.db"), "directory", "no crawl database"),
    "random bytes": (_random_bytes, "file is not a database", "file is not a database"),
    "foreign SQLite": (_foreign_sqlite, "not an idemcrawl crawl", "not an idemcrawl crawl"),
    "unreachable server": (
        lambda t: "postgresql://127.0.0.1:1/x",
        "cannot connect to PostgreSQL",
        "cannot connect to PostgreSQL",
    ),
}

#: Every command taking --db but crawl (run as a process below), with what it needs besides.
DB_COMMANDS = {
    "status": [],
    "export": [],
    "events": [],
    "reparse": [],
    "control": ["pause"],
    "serve": ["--port", "0"],
    "db migrate": [],
}


@pytest.mark.parametrize("kind", sorted(BAD_DBS))
def test_crawl_with_a_database_it_cannot_use(kind: str, tmp_path: Path) -> None:
    make, creating, _ = BAD_DBS[kind]
    db = make(tmp_path)
    before = _tree(tmp_path)
    # --db-wait 0: a server that refuses is reported at once (a crawl's default waits a
    # minute for a server that is restarting: tests/test_postgres_crawl.py)
    res = run_cli(
        "crawl", "http://127.0.0.1:9/", "--db", db, "--allow-private", "127.0.0.1",
        "--db-wait", "0",
    )  # fmt: skip
    assert res.returncode == 2, res.stderr
    assert creating in _one_line(res.stderr)
    assert _tree(tmp_path) == before


@pytest.mark.parametrize("kind", sorted(BAD_DBS))
def test_every_db_command_reports_it_the_same_way(
    kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    make, creating, existing = BAD_DBS[kind]
    db = make(tmp_path)
    before = _tree(tmp_path)
    for command, extra in DB_COMMANDS.items():
        assert main([*command.split(), *extra, "--db", db]) == 2, command
        line = _one_line(capsys.readouterr().err)
        assert line.startswith(f"idemcrawl {command.split()[0]}: error:"), line
        assert (creating if command == "db migrate" else existing) in line, (command, line)
        assert _tree(tmp_path) == before, command


#: ``python -c`` that runs the CLI with psycopg unimportable, as without the "postgres" extra.
_NO_PSYCOPG = (
    "import sys; sys.modules['psycopg'] = None\n"
    "from idemcrawl.cli import main; sys.exit(main(sys.argv[1:]))"
)


@pytest.mark.parametrize(
    "args",
    [
        ["crawl", "http://127.0.0.1:9/", "--allow-private", "127.0.0.1"],
        ["status"],
        ["db", "init", "--partitions", "2"],
    ],
    ids=lambda a: a[0] if a[0] != "db" else "db-init",
)
def test_postgresql_without_the_extra_names_the_fix(args: list[str], tmp_path: Path) -> None:
    res = run_python(_NO_PSYCOPG, *args, "--db", "postgresql://127.0.0.1:1/x", cwd=tmp_path)
    assert res.returncode == 2, res.stderr
    assert "pip install 'idemcrawl[postgres]'" in _one_line(res.stderr)
    assert list(tmp_path.iterdir()) == []


#: ``python -c`` that runs ``python ARGS`` without the capabilities that let root ignore file
#: permissions (dropped from the bounding set, so the exec'd process lacks them); as another
#: user the drop fails harmlessly and the permissions apply anyway.
_WITHOUT_ROOT_OVERRIDE = """
import ctypes, os, sys
prctl = ctypes.CDLL(None, use_errno=True).prctl
for cap in (1, 2):  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH
    prctl(24, cap, 0, 0, 0)  # PR_CAPBSET_DROP
os.execv(sys.executable, [sys.executable, *sys.argv[1:]])
"""


def _cli_without_override(*args: str) -> subprocess.CompletedProcess[str]:
    return run_python(_WITHOUT_ROOT_OVERRIDE, "-m", "idemcrawl", *args)


@pytest.mark.slow
def test_read_only_database_and_directory(tmp_path: Path) -> None:
    read_only_dir = tmp_path / "ro"
    read_only_dir.mkdir(mode=0o555)
    can_write = "import os, sys; sys.exit(os.access(sys.argv[1], os.W_OK))"
    res = run_python(_WITHOUT_ROOT_OVERRIDE, "-c", can_write, str(read_only_dir))
    assert res.returncode == 0, "the child could still write to a read-only directory"

    good = tmp_path / "crawl.db"
    assert run_cli("db", "migrate", "--db", str(good)).returncode == 0
    good.chmod(0o444)
    before = _tree(tmp_path)
    common = ["http://127.0.0.1:9/", "--allow-private", "127.0.0.1"]
    res = _cli_without_override("crawl", *common, "--db", str(good))
    assert res.returncode == 2, res.stderr
    assert f"crawl database {str(good)!r} is read-only" in _one_line(res.stderr)
    res = _cli_without_override("crawl", *common, "--db", str(read_only_dir / "x.db"))
    assert res.returncode == 2, res.stderr
    assert "is read-only" in _one_line(res.stderr)
    assert _tree(tmp_path) == before  # no owners or WARC directory, no -wal beside the file

    # A command that only writes through the crawl: refused at its write, rolled back.
    res = _cli_without_override("control", "pause", "--db", str(good))
    assert res.returncode == 2, res.stderr
    assert "is read-only" in _one_line(res.stderr)
    assert good.read_bytes() == before["crawl.db"]
    res = _cli_without_override("status", "--db", str(good))  # reading it is fine
    assert res.returncode == 0, res.stderr


@pytest.mark.parametrize("site", ["shop", "traps"])
def test_testsite_on_a_busy_port(site: str) -> None:
    with socket.create_server(("127.0.0.1", 0)) as busy:
        port = busy.getsockname()[1]
        res = run_cli("testsite", "--site", site, "--port", str(port), timeout=30)
    assert res.returncode == 2, res.stderr
    line = _one_line(res.stderr)
    assert f"port {port} on 127.0.0.1 is in use" in line and "--port" in line, line
    assert res.stdout == ""  # no "serving ... at" line for a site that is not served
