"""Crawls of the scraping sandbox (``testsite --site sandbox``) by the example spiders, in
crawl processes, some of them killed with SIGKILL (issue 16)."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from idemcrawl.lab.testsite.sandbox import (
    CATEGORIES,
    SandboxConfig,
    SandboxServer,
    expected_api,
    expected_items,
    expected_members,
    expected_search,
    item_category,
)

from .helpers import DEVNULL, run, spawn
from .sandbox_spiders import BuggyCatalog


def crawl_cmd(db: Path | str, spider: str | None, *seeds: str, concurrency: int = 4) -> list[str]:
    """A crawl of the sandbox; ``spider`` None: the plain crawl without ``--spider``."""
    return [
        sys.executable, "-m", "idemcrawl", "crawl", *seeds, "--db", str(db),
        *(["--spider", spider] if spider else []),
        "--concurrency", str(concurrency), "--host-concurrency", str(concurrency),
        "--delay", "0", "--latency-factor", "0", "--allow-private", "127.0.0.1", "--quiet",
    ]  # fmt: skip


def records(db: Path) -> dict[str, Any]:
    con = sqlite3.connect(db)
    try:
        return {k: json.loads(d) for k, d in con.execute("SELECT key, data FROM records")}
    finally:
        con.close()


def test_catalog_spider_carries_listing_context_to_details(tmp_path: Path) -> None:
    db = tmp_path / "c.db"
    with SandboxServer() as server:
        base = server.base_url
        done = run(crawl_cmd(db, "examples/catalog.py:Catalog", f"{base}/catalog"))
        assert done.returncode == 0, done.stderr
        log = server.requests()
    assert records(db) == expected_items(server.cfg)
    con = sqlite3.connect(db)
    try:
        rows = con.execute(
            "SELECT u.url, r.callback FROM requests r JOIN urls u USING (url_id)"
        ).fetchall()
    finally:
        con.close()
    # Only the detail pages have a side-table row: the listings are plain GETs for parse.
    assert sorted(rows) == sorted((f"{base}/item/{i}", "parse_item") for i in range(1, 21))
    assert all(e["method"] == "GET" for e in log)


def _kill_after(
    server: SandboxServer, cmd: list[str], n: int, env: dict[str, str] | None = None
) -> bool:
    """Start a crawl and SIGKILL its process group once the server saw ``n`` more requests;
    False when the crawl ended first (nothing left to kill)."""
    before = len(server.requests())
    proc = spawn(cmd, new_session=True, stdout=DEVNULL, stderr=DEVNULL, env=env)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and proc.poll() is None:
        if len(server.requests()) >= before + n:
            break
        time.sleep(0.002)
    if proc.poll() is not None:
        return False
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    return True


@pytest.mark.slow
def test_callback_context_and_method_survive_sigkill(tmp_path: Path) -> None:
    """10 SIGKILLs, then a run to the end: exactly the expected records, and every request the
    server saw was made the way the spider asked (POST with its body for searches, GET for
    the rest), whichever process made it."""
    cfg = SandboxConfig(pages=6, per_page=5, latency_ms=25)
    db = tmp_path / "k.db"
    spider = "tests.sandbox_spiders:CatalogSearch"
    with SandboxServer(cfg) as server:
        seed = f"{server.base_url}/catalog?page=1"
        cmd = crawl_cmd(db, spider, seed, concurrency=3)
        landed = sum(_kill_after(server, cmd, 3 + i % 3) for i in range(10))
        assert landed >= 8  # the last ones may find the crawl finished on a fast machine
        done = run(crawl_cmd(db, spider, seed), timeout=120)
        assert done.returncode == 0, done.stderr
        log = server.requests()
    queries = sorted({item_category(i) for i in range(1, cfg.pages * cfg.per_page + 1)})
    assert set(queries) <= set(CATEGORIES)
    assert records(db) == {**expected_items(cfg), **expected_search(cfg, queries)}
    searches = [e for e in log if e["path"] == "/search"]
    assert searches and all(e["method"] == "POST" for e in searches)
    assert all(server.form(e)["form_id"] == "search-v1" for e in searches)
    assert all(e["content_type"] == "application/x-www-form-urlencoded" for e in searches)
    assert {server.form(e)["q"] for e in searches} == set(queries)
    assert all(e["method"] == "GET" for e in log if e["path"] != "/search")


def test_a_spider_with_start_requests_needs_no_seed_and_gets_json(tmp_path: Path) -> None:
    db = tmp_path / "api.db"
    with SandboxServer() as server:
        env = {"SANDBOX": server.base_url}
        done = run(crawl_cmd(db, "examples/api.py:LoadMore"), env=env)
        assert done.returncode == 0, done.stderr
        # A second run adds the start request again: a no-op, nothing is fetched.
        before = len(server.requests())
        again = run(crawl_cmd(db, "examples/api.py:LoadMore"), env=env)
        assert again.returncode == 0, again.stderr
        assert len(server.requests()) == before
    assert records(db) == expected_api(server.cfg)


def test_a_new_crawl_without_seeds_or_start_requests_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "none.db"
    done = run(crawl_cmd(db, "examples/catalog.py:Catalog"))
    assert done.returncode == 2
    assert "has no start_urls or start_requests" in done.stderr
    assert not db.exists()


def test_search_and_login_examples(tmp_path: Path) -> None:
    """from_form keeps the hidden fields; the login's session cookie reaches the members
    pages, which answer 403 without it."""
    with SandboxServer() as server:
        env = {"SANDBOX": server.base_url}
        for name, spider in (
            ("s", "examples/search.py:Search"),
            ("m", "examples/login.py:Members"),
        ):
            done = run(crawl_cmd(tmp_path / f"{name}.db", spider), env=env)
            assert done.returncode == 0, done.stderr
        log = server.requests()
    assert records(tmp_path / "s.db") == expected_search(server.cfg, ["books", "toys"])
    assert records(tmp_path / "m.db") == expected_members(server.cfg)
    (login,) = [e for e in log if e["path"] == "/login" and e["method"] == "POST"]
    form = server.form(login)
    assert form["user"] == "demo" and len(form["csrf"]) == 24
    assert "csrf_nonce=" in login["cookie"]
    members = [e for e in log if e["path"].startswith("/members")]
    assert len(members) == 1 + server.cfg.members
    assert all("session=" in e["cookie"] for e in members)


def test_spiders_keep_cookies_unless_they_say_not_to(tmp_path: Path) -> None:
    """The login spider sets nothing about cookies (as a Scrapy spider would not) and logs in
    (above); with ``keep_cookies = False`` it sends no cookie, so the CSRF check fails and the
    members' pages are never reached. A crawl without a spider keeps no cookies either."""
    from examples.login import Members

    assert "keep_cookies" not in vars(Members)
    with SandboxServer() as server:
        env = {"SANDBOX": server.base_url}
        done = run(
            crawl_cmd(tmp_path / "off.db", "tests.sandbox_spiders:MembersWithoutCookies"), env=env
        )
        assert done.returncode == 0, done.stderr
        off = server.requests()
        base = server.base_url
        plain = crawl_cmd(tmp_path / "plain.db", None, f"{base}/login", f"{base}/")
        done = run(plain)
        assert done.returncode == 0, done.stderr
        log = server.requests()[len(off) :]
    assert [(e["method"], e["path"]) for e in off if e["path"].startswith("/login")] == [
        ("GET", "/login"),
        ("POST", "/login"),
    ]
    assert not [e for e in off if e["cookie"]]
    assert not [e for e in off if e["path"].startswith("/members")]
    assert records(tmp_path / "off.db") == {}
    # The plain crawl got the login page's cookie, then fetched the rest of the site without it.
    first_login = next(i for i, e in enumerate(log) if e["path"] == "/login")
    assert len(log) > first_login + 10
    assert not [e for e in log if e["cookie"]]


@pytest.mark.slow
def test_the_login_survives_kills(tmp_path: Path) -> None:
    """Killed first right after its login committed, then 9 more times: one login in all,
    and every members page fetched with the session, whichever process fetched it."""
    cfg = SandboxConfig(members=30, latency_ms=30)
    db = tmp_path / "m.db"
    with SandboxServer(cfg) as server:
        env = {"SANDBOX": server.base_url}
        cmd = crawl_cmd(db, "examples/login.py:Members", concurrency=2)
        proc = spawn(cmd, new_session=True, stdout=DEVNULL, stderr=DEVNULL, env=env)
        deadline = time.monotonic() + 30
        while not any(e["path"] == "/members" for e in server.requests()):
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.002)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        landed = sum(_kill_after(server, cmd, 2 + i % 3, env) for i in range(9))
        assert landed >= 5
        done = run(cmd, env=env)
        assert done.returncode == 0, done.stderr
        log = server.requests()
    assert records(db) == expected_members(cfg)
    assert [e["method"] for e in log if e["path"] == "/login"] == ["GET", "POST"]
    assert server.state.logins == 1
    members = [e for e in log if e["path"].startswith("/members")]
    assert all("session=" in e["cookie"] for e in members)


@pytest.mark.slow
@pytest.mark.parametrize("example", ["api", "search"])
def test_start_request_examples_under_kills(tmp_path: Path, example: str) -> None:
    """10 SIGKILLs (those that land before the crawl ends) then a final run: exactly the
    expected records; every API call a GET with its offset, every search a POST with q."""
    cfg = SandboxConfig(api_items=45, api_page=3, latency_ms=30)
    spider = {"api": "examples/api.py:LoadMore", "search": "examples/search.py:Search"}[example]
    db = tmp_path / "k.db"
    with SandboxServer(cfg) as server:
        env = {"SANDBOX": server.base_url}
        cmd = crawl_cmd(db, spider, concurrency=2)
        for i in range(10):
            _kill_after(server, cmd, 1 + i % 2, env)
        done = run(cmd, env=env)
        assert done.returncode == 0, done.stderr
        log = server.requests()
    if example == "api":
        assert records(db) == expected_api(cfg)
        calls = [e for e in log if e["path"].startswith("/api/")]
        assert all(e["method"] == "GET" and not e["body"] for e in calls)
        assert {e["path"] for e in calls} == {f"/api/items?offset={o}" for o in range(0, 45, 3)}
    else:
        assert records(db) == expected_search(cfg, ["books", "toys"])
        posts = [e for e in log if e["method"] == "POST"]
        assert posts and all(server.form(e)["form_id"] == "search-v1" for e in posts)
        assert {server.form(e)["q"] for e in posts} == {"books", "toys"}


def test_invalid_records_fail_their_urls_and_reparse_fixes_them(tmp_path: Path) -> None:
    db = tmp_path / "v.db"
    with SandboxServer() as server:
        seed = f"{server.base_url}/catalog"
        done = run(crawl_cmd(db, "tests.sandbox_spiders:StrictCatalog", seed))
        assert done.returncode == 4, done.stderr  # finished, but URLs failed for good
        fetched = len(server.requests())
    assert records(db) == {}
    con = sqlite3.connect(db)
    try:
        errors = con.execute(
            "SELECT url, last_error FROM urls WHERE state = 'failed' ORDER BY url_id"
        ).fetchall()
    finally:
        con.close()
    assert len(errors) == 20
    assert all(
        e.startswith("parse error: InvalidRecord: record 'item-")
        and "does not fit Item: field price is str" in e
        for _, e in errors
    ), errors[0]
    # The fix, without the network: the archived pages parsed again by their callback with
    # their context (the failed URLs' request specs come back with them).
    fixed = run(
        [sys.executable, "-m", "idemcrawl", "reparse", "--db", str(db), "--where-failed",
         "--spider", "tests.sandbox_spiders:CleanCatalog", "--quiet"]
    )  # fmt: skip
    assert fixed.returncode == 0, fixed.stderr
    want = {
        k: {**v, "price": float(v["price"]), "currency": "EUR"}
        for k, v in expected_items(server.cfg).items()
    }
    assert records(db) == want
    assert len(server.requests()) == fetched
    # Nothing failed any more: the crawl, run again, finishes with every URL done.
    again = run(crawl_cmd(db, "tests.sandbox_spiders:StrictCatalog", seed))
    assert again.returncode == 0, again.stderr
    assert len(server.requests()) == fetched


def test_failed_callbacks_are_shown_at_the_end_and_by_status(tmp_path: Path) -> None:
    """A spider with two bugs (a KeyError in a callback, a dict yielded as an item): the end
    of the crawl lists each reason with its count, the first URL and the line that broke, and
    exits 4; ``status`` shows the same, and a run of the finished crawl ends the same way."""
    db = tmp_path / "buggy.db"
    spider = "tests.sandbox_spiders:BuggyCatalog"
    with SandboxServer() as server:
        base = server.base_url
        cmd = [c for c in crawl_cmd(db, spider, f"{base}/catalog") if c != "--quiet"]
        done = run(cmd)
        fetched = len(server.requests())
        again = run(cmd)
        assert len(server.requests()) == fetched
    assert done.returncode == 4, done.stderr
    status = run([sys.executable, "-m", "idemcrawl", "status", "--db", str(db)])
    as_json = run([sys.executable, "-m", "idemcrawl", "status", "--db", str(db), "--json"])
    assert status.returncode == 0 == as_json.returncode, status.stderr
    lines = done.stdout.splitlines()
    assert lines[0].endswith(" s") and "failed 20" in lines[0]
    start = lines.index("failed URLs      20 (failed for good; by reason, most URLs first):")
    key_error = lines.index("       10  parse error: KeyError: 'colour'")
    dict_item = next(i for i, x in enumerate(lines) if "spider yielded dict" in x)
    assert lines[dict_item].startswith("       10  parse error: TypeError: ")
    assert "Record(key, data)" in lines[dict_item]
    assert sorted([key_error, dict_item]) == [start + 1, start + 5]
    first = int(lines[key_error + 1].removeprefix(f"           first: {base}/item/"))
    assert first % 2 == 0
    line_no = BuggyCatalog.parse_item.__code__.co_firstlineno + 3
    assert lines[key_error + 2 : key_error + 4] == [
        f'             File "tests/sandbox_spiders.py", line {line_no}, in parse_item',
        '               colour = page.data["colour"]',
    ]
    assert lines[dict_item + 3] == '               yield {"item": n}'
    report = lines[start : start + 9]  # the heading, then 4 lines for each reason
    shown = status.stdout.splitlines()
    assert shown[shown.index(report[0]) :][:9] == report
    assert again.returncode == 4 and again.stdout.splitlines()[1:] == lines[1:]
    reasons = json.loads(as_json.stdout)["failure_reasons"]
    assert sorted(r["urls"] for r in reasons) == [10, 10]


@pytest.mark.slow
def test_two_processes_on_postgres_share_requests_and_the_session(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The login spider and the catalogue+search spider, two processes each on one PostgreSQL
    schema, one of them killed mid-crawl: the specs and the cookie jar live in the database, so
    whichever process leases a URL fetches it the way it was asked for, with the session."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # the crawls' owner slots: none left in /tmp
    from .frontier.conftest import PG_DSN, require_postgres

    require_postgres()  # skips locally without a server; fails in CI
    import uuid

    import psycopg

    schemas = []
    cfg = SandboxConfig(pages=4, per_page=5, members=12, latency_ms=20)
    try:
        with SandboxServer(cfg) as server:
            env = {"SANDBOX": server.base_url}
            seed = f"{server.base_url}/catalog?page=1"
            got = {}
            for spider, seeds in (
                ("examples/login.py:Members", []),
                ("tests.sandbox_spiders:CatalogSearch", [seed]),
            ):
                schema = "t_sandbox_" + uuid.uuid4().hex[:10]
                schemas.append(schema)
                cmd = crawl_cmd(f"{PG_DSN}?schema={schema}", spider, *seeds, concurrency=2)
                first = spawn(cmd, new_session=True, stdout=DEVNULL, stderr=DEVNULL, env=env)
                second = spawn(cmd, new_session=True, stdout=DEVNULL, env=env)
                time.sleep(1.0)
                os.killpg(first.pid, signal.SIGKILL)
                first.wait()
                _, err = second.communicate(timeout=120)
                assert second.returncode == 0, err
                done = run(cmd, env=env)
                assert done.returncode == 0, done.stderr
                with psycopg.connect(PG_DSN) as con:
                    con.execute(f'SET search_path TO "{schema}"')
                    got[spider] = {
                        k: d if isinstance(d, dict) else json.loads(d)
                        for k, d in con.execute("SELECT key, data FROM records")
                    }
            log = server.requests()
            logins = server.state.logins
    finally:
        with psycopg.connect(PG_DSN, autocommit=True) as con:
            for schema in schemas:
                con.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    queries = sorted({item_category(i) for i in range(1, 21)})
    assert got["examples/login.py:Members"] == expected_members(cfg)
    assert got["tests.sandbox_spiders:CatalogSearch"] == {
        **expected_items(cfg),
        **expected_search(cfg, queries),
    }
    assert logins <= 2  # a kill before the login committed may repeat it, never more
    assert all("session=" in e["cookie"] for e in log if e["path"].startswith("/members"))
    assert all(e["method"] == "POST" for e in log if e["path"] == "/search")


#: ``python -c`` running the CLI with Playwright unimportable, as without the "render" extra.
_NO_PLAYWRIGHT = (
    "import sys; sys.modules['playwright'] = None\n"
    "from idemcrawl.cli import main; sys.exit(main(sys.argv[1:]))"
)


def test_a_render_without_the_extra_is_a_failure_reason_naming_it(tmp_path: Path) -> None:
    """A spider asking for rendering where the "render" extra is missing: the JS pages fail
    for good with the reason naming the install, listed at the end, and the crawl exits 4
    (issue 36: it had printed only "failed N" and exited 0)."""
    with SandboxServer() as server:
        base = server.base_url
        env = {**os.environ, "SANDBOX": base}
        cmd = crawl_cmd(tmp_path / "js.db", "examples/js.py:Rendered")
        cmd = [sys.executable, "-c", _NO_PLAYWRIGHT, *cmd[3:]]
        cmd.remove("--quiet")
        done = run(cmd, env=env)
    assert done.returncode == 4, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert any(line.startswith("failed URLs      1 ") for line in lines), lines
    reason = next(x for x in lines if "needs Playwright" in x)
    assert "pip install 'idemcrawl[render]'" in reason
    assert f"first: {base}/js?page=1" in done.stdout
