"""The command line: help for every command, one-line errors, export and status output."""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from idemcrawl.cli import COMMANDS, main
from idemcrawl.lab.testsite import ShopServer, expected_products

from .conftest import SHOP_SPIDER
from .helpers import run_cli


@pytest.mark.parametrize("command", [*sorted(COMMANDS), "sim"])
def test_every_command_has_help(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main([command, "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert f"idemcrawl {command}" in out and "--" in out


def _assert_one_line_error(res: subprocess.CompletedProcess[str], needle: str) -> None:
    assert res.returncode == 2, res
    assert "Traceback" not in res.stderr
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, res.stderr
    assert needle in lines[0], lines[0]


def test_invalid_seed_url(tmp_path: Path) -> None:
    _assert_one_line_error(
        run_cli("crawl", "ht!tp://nope", "--db", str(tmp_path / "x.db")), "invalid URL"
    )
    _assert_one_line_error(
        run_cli("crawl", "mailto:a@b.c", "--db", str(tmp_path / "x.db")), "unsupported scheme"
    )


def test_unknown_spider_file(tmp_path: Path) -> None:
    res = run_cli(
        "crawl",
        "http://127.0.0.1:9/",
        "--db",
        str(tmp_path / "x.db"),
        "--spider",
        str(tmp_path / "missing.py") + ":S",
        "--allow-private",
        "127.0.0.1",
    )
    _assert_one_line_error(res, "spider file not found")


def test_unreadable_database(tmp_path: Path) -> None:
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"this is not a database" * 100)
    _assert_one_line_error(run_cli("status", "--db", str(junk)), "cannot open crawl database")
    _assert_one_line_error(
        run_cli("export", "--db", str(tmp_path / "none.db")), "no crawl database"
    )
    _assert_one_line_error(run_cli("crawl", "--db", str(tmp_path / "none.db")), "no seed URLs")
    res = run_cli(
        "crawl",
        "http://127.0.0.1:9/",
        "--db",
        str(tmp_path / "no/dir/x.db"),
        "--allow-private",
        "127.0.0.1",
    )
    _assert_one_line_error(res, "missing")


def test_bad_flag_values(tmp_path: Path) -> None:
    res = run_cli(
        "crawl",
        "http://127.0.0.1:9/",
        "--db",
        str(tmp_path / "x.db"),
        "--allow-private",
        "not-an-ip",
    )
    _assert_one_line_error(res, "not-an-ip")
    res = run_cli(
        "crawl", "http://127.0.0.1:9/", "--db", str(tmp_path / "x.db"), "--commit-seconds", "5"
    )
    _assert_one_line_error(res, "--commit-seconds")
    res = run_cli("crawl", "http://x/", "--db", str(tmp_path / "x.db"), "--delay", "abc")
    assert res.returncode == 2 and "Traceback" not in res.stderr


@pytest.mark.slow
def test_crawl_status_export_roundtrip(shop: ShopServer, tmp_path: Path) -> None:
    db = str(tmp_path / "c.db")
    res = run_cli(
        "crawl",
        shop.seed_url,
        "--db",
        db,
        "--spider",
        SHOP_SPIDER,
        "--delay",
        "0",
        "--latency-factor",
        "0",
        "--host-concurrency",
        "4",
        "--allow-private",
        "127.0.0.1",
        "--json",
    )
    assert res.returncode == 0, res.stderr
    summary = json.loads(res.stdout)
    assert summary["finished"] and summary["records"] == 20

    st = run_cli("status", "--db", db, "--json")
    assert st.returncode == 0, st.stderr
    d = json.loads(st.stdout)
    # 4 listings + 20 products + robots.txt
    assert d["urls"]["done"] == 25 and d["records"] == 20 and d["requests"] == 25
    assert d["requests_per_record"] == 1.25
    assert d["group_commit"]["max_completions"] == 64
    text = run_cli("status", "--db", db)
    assert "group commit" in text.stdout and "per stored record 1.25" in text.stdout

    out = tmp_path / "r.jsonl"
    assert run_cli("export", "--db", db, "-o", str(out)).returncode == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert {r["key"]: r["data"]["price"] for r in rows} == expected_products(shop.cfg)
    assert set(rows[0]) == {
        "record_id",
        "source",
        "key",
        "url",
        "data",
        "first_seen",
        "last_changed",
        "content_hash",
    }
    res = run_cli("export", "--db", db, "--format", "csv")
    table = list(csv.DictReader(io.StringIO(res.stdout)))
    # CSV records are flat: one column per field of the spider's data.
    assert len(table) == 20 and table[0]["sku"] == table[0]["key"]
    assert {r["key"]: r["price"] for r in table} == expected_products(shop.cfg)


def test_demo_prints_what_was_stored(tmp_path: Path) -> None:
    res = run_cli("demo", "--db", str(tmp_path / "demo.db"), "--listings", "2", "--per-page", "3")
    assert res.returncode == 0, res.stderr
    assert "stored 6 records (6 equal to the pages, 6 products)" in res.stdout
    assert "SKU-00006" in res.stdout


def test_testsite_serves_and_stops() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "idemcrawl", "testsite", "--port", "0", "--listings", "2"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert "serving shop at http://127.0.0.1:" in line
    finally:
        proc.terminate()
        assert proc.wait(10) == 0


@pytest.mark.slow
def test_chaos_small_run_passes() -> None:
    res = run_cli(
        "chaos",
        "--runs",
        "1",
        "--kills",
        "2",
        "--listings",
        "3",
        "--per-page",
        "10",
        "--latency-ms",
        "60",
        "--min",
        "0.1",
        "--max",
        "0.3",
        "--json",
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    report = json.loads(res.stdout)
    assert report["ok"]
    naive, idem = report["results"]
    assert idem["rows"] == idem["correct"] == 30 and idem["missing"] == 0
    assert naive["crawler"] == "naive" and naive["distinct"] <= 30


@pytest.mark.slow
def test_config_file_errors_name_key_and_line(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text("concurrency = 4\n\ndelay_seconds = 2\n")
    res = run_cli(
        "crawl", "http://127.0.0.1:9/", "--db", str(tmp_path / "x.db"), "--config", str(cfg)
    )
    _assert_one_line_error(res, f"{cfg}:3: unknown key 'delay_seconds'")
    cfg.write_text('delay = "fast"\n')
    res = run_cli(
        "crawl", "http://127.0.0.1:9/", "--db", str(tmp_path / "x.db"), "--config", str(cfg)
    )
    _assert_one_line_error(res, f"{cfg}:1: delay must be")
    cfg.write_text('[hosts."a.example"]\nspeed = 3\n')
    res = run_cli(
        "crawl", "http://127.0.0.1:9/", "--db", str(tmp_path / "x.db"), "--config", str(cfg)
    )
    _assert_one_line_error(res, f"{cfg}:2: unknown key 'speed'")
    cfg.write_text("delay = \n")
    res = run_cli("crawl", "--db", str(tmp_path / "x.db"), "--config", str(cfg))
    _assert_one_line_error(res, str(cfg))
    for text, expected in (
        ("concurrency = 2\ndelay = -1\n", ":2: delay must be >= 0"),
        ('[hosts."a.example"]\nbudget = 0\n', ":2: budget must be >= 1"),
        ('pins = ["(oops=5"]\n', ":1: pin '(oops=5': bad regular expression"),
        ("[hosts.\n", "c.toml"),  # malformed TOML: the parser's line and column
    ):
        cfg.write_text(text)
        res = run_cli(
            "crawl", "http://127.0.0.1:9/", "--db", str(tmp_path / "x.db"), "--config", str(cfg)
        )
        _assert_one_line_error(res, expected)


def test_config_file_and_flags_set_host_overrides(shop: ShopServer, tmp_path: Path) -> None:
    from idemcrawl.frontier.sqlite import SQLiteFrontier

    cfg = tmp_path / "c.toml"
    cfg.write_text(
        f'allow_private = ["127.0.0.1"]\nseeds = ["{shop.seed_url}"]\nspider = "{SHOP_SPIDER}"\n'
        f'delay = 0\nlatency_factor = 0\n[hosts."{shop.base_url}"]\ndelay = 0.01\n'
        "concurrency = 3\n"
    )
    db = tmp_path / "c.db"
    res = run_cli(
        "crawl",
        "--db",
        str(db),
        "--config",
        str(cfg),
        "--quiet",
        "--host-max",
        f"{shop.base_url}=2",
    )
    assert res.returncode == 0, res.stderr
    f = SQLiteFrontier(str(db))
    host = f.host_row(shop.base_url)
    f.close()
    assert host is not None and host["delay"] == 0.01 and host["max_in_flight"] == 2
    res = run_cli("crawl", "--db", str(db), "--host-delay", "nonsense")
    _assert_one_line_error(res, "--host-delay takes HOST=VALUE")


@pytest.mark.parametrize("command", ["demo", "testsite", "chaos"])
def test_shop_sizes_must_be_positive(command: str) -> None:
    res = run_cli(command, "--listings", "0")
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert "'0' must be at least 1" in res.stderr
