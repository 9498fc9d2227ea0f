"""Config layering (defaults < the spider's custom_settings < config file < flags given), its
one-line errors, and the help texts that read every default from CrawlConfig instead of
repeating it."""

from __future__ import annotations

import argparse
import dataclasses
import re
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from idemcrawl import cli
from idemcrawl.config import (
    FILE_KEYS,
    ConfigError,
    ConfigFileError,
    CrawlConfig,
    FlagLists,
    default_of,
    layered_config,
    parse_host_flag,
    spider_settings,
)
from idemcrawl.parse import Spider, load_spider
from idemcrawl.url import InvalidURL
from idemcrawl.version import DEFAULT_USER_AGENT

SEED = "http://127.0.0.1:9/"


def _toml(tmp_path: Path, text: str) -> str:
    path = tmp_path / "crawl.toml"
    path.write_text(text)
    return str(path)


def test_defaults_then_file_then_flags(tmp_path: Path) -> None:
    path = _toml(
        tmp_path,
        f'db = "{tmp_path / "file.db"}"\nseeds = ["{SEED}"]\nconcurrency = 3\ndelay = 0.5\n'
        'scope = "domain"\n',
    )
    cfg = layered_config(path, {"concurrency": 7, "db": str(tmp_path / "flag.db")})
    assert cfg.concurrency == 7  # the flag beats the file
    assert cfg.delay == 0.5  # the file beats the default
    assert cfg.scope == "domain"
    assert cfg.db == str(tmp_path / "flag.db")
    assert cfg.seeds == (SEED,)
    assert cfg.host_concurrency == default_of("host_concurrency")  # neither: the default
    assert cfg.user_agent == DEFAULT_USER_AGENT


def test_seed_flags_replace_file_seeds_and_sitemaps_add(tmp_path: Path) -> None:
    path = _toml(
        tmp_path,
        f'db = "{tmp_path / "c.db"}"\nseeds = ["http://a.example/"]\n'
        'sitemaps = ["http://a.example/sitemap.xml"]\n',
    )
    cfg = layered_config(
        path,
        {"seeds": ["http://b.example/"]},
        FlagLists(sitemaps=["http://b.example/s.xml"]),
    )
    assert cfg.seeds == ("http://b.example/",)
    assert cfg.sitemaps == ("http://a.example/sitemap.xml", "http://b.example/s.xml")


def test_host_flags_beat_the_file_per_host(tmp_path: Path) -> None:
    path = _toml(
        tmp_path,
        f'db = "{tmp_path / "c.db"}"\nseeds = ["{SEED}"]\n'
        '[hosts."http://a.example"]\ndelay = 2\nconcurrency = 3\nbudget = 50\n',
    )
    cfg = layered_config(
        path,
        {},
        FlagLists(
            host_maxes=["http://a.example=5"],
            host_delays=["b.example=0.25"],
            host_budgets=["http://a.example=9"],
        ),
    )
    overrides = {h: (d, m) for h, d, m in cfg.host_overrides}
    assert overrides["http://a.example"] == (2.0, 5)  # file delay kept, flag max wins
    # a bare host names both schemes
    assert overrides["http://b.example"] == (0.25, None)
    assert overrides["https://b.example"] == (0.25, None)
    assert dict(cfg.host_budgets) == {"http://a.example": 9}


def test_pins_from_file_hosts_and_flags(tmp_path: Path) -> None:
    path = _toml(
        tmp_path,
        f'db = "{tmp_path / "c.db"}"\nseeds = ["{SEED}"]\npins = ["/news=60"]\n'
        '[hosts."http://a.example"]\nrecrawl_interval = 120\n',
    )
    cfg = layered_config(path, {}, FlagLists(pins=["/live=5"]))
    assert cfg.pins == (("/news", 60.0), (r"^http://a\.example/", 120.0), ("/live", 5.0))


def test_no_config_file_flags_only(tmp_path: Path) -> None:
    cfg = layered_config(None, {"db": str(tmp_path / "c.db"), "seeds": [SEED], "warc": False})
    assert cfg.warc is False and cfg.seeds == (SEED,)
    assert cfg.parse_workers == default_of("parse_workers")


@pytest.mark.parametrize(
    ("given", "lists", "needle"),
    [
        ({"seeds": [SEED]}, FlagLists(), "--db is required"),
        ({"db": "DB"}, FlagLists(host_delays=["nonsense"]), "--host-delay takes HOST=VALUE"),
        ({"db": "DB"}, FlagLists(host_maxes=["a.example=x"]), "--host-max 'a.example=x': 'x'"),
        ({"db": "DB"}, FlagLists(host_maxes=["a.example=0"]), "value out of range"),
        ({"db": "DB"}, FlagLists(host_budgets=["a b=3"]), "--host-budget 'a b=3': bad host"),
        ({"db": "DB"}, FlagLists(pins=["(oops=5"]), "pin '(oops=5': bad regular expression"),
        ({"db": "DB", "seeds": [SEED], "allow_private": ["nope"]}, FlagLists(), "'nope'"),
        ({"db": "DB", "seeds": [SEED], "commit_seconds": 5}, FlagLists(), "--commit-seconds"),
        ({"db": "DB", "concurrency": 0, "seeds": [SEED]}, FlagLists(), "--concurrency must"),
        ({"db": "DB", "fast_latency": -1, "seeds": [SEED]}, FlagLists(), "--fast-latency must"),
        ({"db": "DB", "warc_level": 10, "seeds": [SEED]}, FlagLists(), "--warc-level must"),
        ({"db": "DB", "lease_ahead": -1, "seeds": [SEED]}, FlagLists(), "--lease-ahead must"),
        ({"db": "DB", "speed": 3}, FlagLists(), "unknown setting(s): speed"),
    ],
)
def test_errors_are_one_line_and_name_the_flag(
    tmp_path: Path, given: dict[str, object], lists: FlagLists, needle: str
) -> None:
    if given.get("db") == "DB":
        given = {**given, "db": str(tmp_path / "c.db")}
    with pytest.raises(ConfigError) as exc:
        layered_config(None, given, lists)
    message = str(exc.value)
    assert needle in message and "\n" not in message, message


def test_leases_ahead_default_to_the_workers(tmp_path: Path) -> None:
    db = str(tmp_path / "c.db")
    assert layered_config(None, {"db": db, "seeds": [SEED], "concurrency": 64}).leases_ahead() == 64
    off = layered_config(None, {"db": db, "seeds": [SEED], "lease_ahead": 0})
    assert off.leases_ahead() == 0
    path = _toml(tmp_path, f'db = "{db}"\nseeds = ["{SEED}"]\nlease_ahead = 5\n')
    assert layered_config(path, {}).leases_ahead() == 5


def test_resume_needs_an_existing_database(tmp_path: Path) -> None:
    missing = str(tmp_path / "none.db")
    with pytest.raises(ConfigError, match="no seed URLs given and no crawl database"):
        layered_config(None, {"db": missing})
    Path(missing).touch()
    assert layered_config(None, {"db": missing}).seeds == ()


def test_bad_seed_url_names_it(tmp_path: Path) -> None:
    with pytest.raises(InvalidURL, match="mailto"):
        layered_config(None, {"db": str(tmp_path / "c.db"), "seeds": ["mailto:a@b.c"]})


def test_config_file_errors_are_config_errors(tmp_path: Path) -> None:
    path = _toml(tmp_path, "concurrency = 4\n\ndelay_seconds = 2\n")
    with pytest.raises(ConfigFileError, match=r"crawl\.toml:3: unknown key 'delay_seconds'"):
        layered_config(path, {"db": str(tmp_path / "c.db"), "seeds": [SEED]})
    assert issubclass(ConfigFileError, ConfigError)


def test_parse_host_flag() -> None:
    assert parse_host_flag("--host-delay", "a.example:8080=1.5", integer=False) == (
        ["http://a.example:8080", "https://a.example:8080"],
        1.5,
    )
    assert parse_host_flag("--host-max", "https://a.example=2", integer=True) == (
        ["https://a.example"],
        2,
    )
    with pytest.raises(ConfigError, match=r"--host-max 'a=1\.5': '1\.5' is not a number"):
        parse_host_flag("--host-max", "a=1.5", integer=True)
    with pytest.raises(ConfigError, match="value out of range"):
        parse_host_flag("--host-delay", "a=-1", integer=False)


def test_every_file_key_is_a_setting() -> None:
    fields = {f.name for f in dataclasses.fields(CrawlConfig)}
    assert set(FILE_KEYS) <= fields


def test_default_of_reads_crawl_config() -> None:
    assert default_of("concurrency") == CrawlConfig(db="x").concurrency
    assert default_of("parse_workers") == CrawlConfig(db="x").parse_workers  # a factory
    with pytest.raises(KeyError):
        default_of("db")


def _crawl_parser() -> argparse.ArgumentParser:
    sub = next(a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices["crawl"]


def _crawl_help() -> str:
    return " ".join(_crawl_parser().format_help().split())


def test_crawl_help_shows_crawl_config_defaults() -> None:
    checked = 0
    for action in _crawl_parser()._actions:
        m = re.search(r"\(default ([^;):]+)[;)]", action.help or "")
        if m is None or action.dest not in FILE_KEYS:
            continue
        shown, default = m.group(1), default_of(action.dest)
        if isinstance(default, str):
            assert shown == default, action.dest
        elif shown.endswith("MiB"):
            assert int(shown.removesuffix(" MiB")) << 20 == default, action.dest
        else:
            assert float(shown) == default, action.dest
        checked += 1
    assert checked >= 25, checked  # every numeric setting whose help shows a default


def test_a_changed_default_changes_the_help(monkeypatch: pytest.MonkeyPatch) -> None:
    assert "(default 16)" in _crawl_help()
    real = cli.default_of
    monkeypatch.setattr(cli, "default_of", lambda n: 5 if n == "concurrency" else real(n))
    text = _crawl_help()
    assert "requests in flight across all hosts (default 5)" in text
    assert "(default 16)" not in text


def test_the_default_warc_level_is_the_stores() -> None:
    from idemcrawl import warc

    assert CrawlConfig(db="x").warc_level == warc.COMPRESSION_LEVEL


# -- a spider's custom_settings and allowed_domains -----------------------------------------


def _spider(monkeypatch: pytest.MonkeyPatch, **attrs: Any) -> str:
    """A spider class with ``attrs``, importable as the returned ``module:Class`` spec."""
    mod = types.ModuleType("config_test_spiders")
    mod.S = type("S", (Spider,), attrs)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, mod.__name__, mod)
    return f"{mod.__name__}:S"


def test_spider_settings_sit_between_defaults_and_the_operators(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = _spider(
        monkeypatch,
        custom_settings={
            "DOWNLOAD_DELAY": 2.5,
            "CONCURRENT_REQUESTS": 8,
            "CONCURRENT_REQUESTS_PER_DOMAIN": 2,
            "USER_AGENT": "porter/1 (+https://example.org)",
            "DEPTH_LIMIT": 4,
            "ROBOTSTXT_OBEY": True,
            "max_redirects": 2,
        },
    )
    db = str(tmp_path / "c.db")
    cfg = layered_config(None, {"db": db, "seeds": [SEED], "spider": spec}, None, load_spider)
    assert (cfg.delay, cfg.concurrency, cfg.host_concurrency) == (2.5, 8, 2)
    assert cfg.user_agent == "porter/1 (+https://example.org)" and cfg.max_depth == 4
    assert cfg.max_redirects == 2 and not cfg.ignore_robots
    # The config file beats the spider, a flag beats both.
    path = _toml(tmp_path, f'spider = "{spec}"\ndelay = 1.5\nconcurrency = 4\n')
    cfg = layered_config(path, {"db": db, "seeds": [SEED], "concurrency": 32}, None, load_spider)
    assert (cfg.delay, cfg.concurrency, cfg.host_concurrency) == (1.5, 32, 2)


def test_scrapy_offs_and_zeroes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    class Off(Spider):
        custom_settings = {
            "RETRY_ENABLED": False,
            "RETRY_TIMES": 5,  # RETRY_ENABLED False wins, as in Scrapy
            "REDIRECT_ENABLED": False,
            "AUTOTHROTTLE_ENABLED": False,
            "DEPTH_LIMIT": 0,  # Scrapy's "no limit": idemcrawl's trap default stays
            "CLOSESPIDER_PAGECOUNT": 0,
        }

    assert spider_settings(Off) == {"max_retries": 0, "max_redirects": 0, "latency_factor": 0}
    Off.custom_settings = {"RETRY_ENABLED": True, "AUTOTHROTTLE_ENABLED": True}
    assert spider_settings(Off) == {}


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"ROBOTSTXT_OBEY": False}, r"only the operator can turn that off \(crawl --ignore-robots"),
        ({"ignore_robots": True}, "only the operator can turn that off"),
        ({"db": "x.db"}, "db is the operator's to give"),
        ({"allow_private": ["127.0.0.1"]}, "allow_private is the operator's to give"),
        ({"COOKIES_ENABLED": True}, "keep_cookies = True or False on the spider"),
        ({"LOG_FILE": "x.log"}, "self.logger is a standard logging.Logger"),
        ({"FEEDS": {}}, "idemcrawl export"),
        ({"ITEM_PIPELINES": {}}, "process_record"),
        ({"HTTPCACHE_ENABLED": True}, "reparse"),
        ({"DOWNLOAD_DELAY": "2"}, r"\['DOWNLOAD_DELAY'\] must be int or float, got '2'"),
        ({"CONCURRENT_REQUESTS": -1}, "must be >= 0"),
        ({"RETRY_ENABLED": "no"}, "must be True or False"),
        ({"FOO_BAR": 1}, r"unknown setting; .*DOWNLOAD_DELAY.* or the idemcrawl crawl settings "),
    ],
)
def test_custom_settings_that_cannot_be_honoured_are_refused(
    settings: dict[str, Any], message: str
) -> None:
    cls = type("Porting", (Spider,), {"custom_settings": settings})
    with pytest.raises(ConfigError, match=r"Porting\.custom_settings\[") as exc:
        spider_settings(cls)
    assert re.search(message, str(exc.value)), str(exc.value)


def test_unknown_custom_setting_lists_the_options() -> None:
    cls = type("S", (Spider,), {"custom_settings": {"CONCURRENT_ITEMS": 10}})
    with pytest.raises(ConfigError) as exc:
        spider_settings(cls)
    text = str(exc.value)
    assert "CONCURRENT_REQUESTS_PER_DOMAIN" in text and "host_concurrency" in text
    assert "ignore_robots" not in text and " db," not in text


def test_custom_settings_must_be_a_dict() -> None:
    with pytest.raises(ConfigError, match="custom_settings must be a dict, got list"):
        spider_settings(type("S", (Spider,), {"custom_settings": [("DOWNLOAD_DELAY", 1)]}))


def test_allowed_domains_make_the_default_scope_any(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = _spider(monkeypatch, allowed_domains=["example.org"])
    db = str(tmp_path / "c.db")
    given = {"db": db, "seeds": [SEED], "spider": spec}
    assert layered_config(None, given, None, load_spider).scope == "any"
    # an explicit --scope stays (both filters then apply); without the loader, no spider layer
    assert layered_config(None, {**given, "scope": "host"}, None, load_spider).scope == "host"
    assert layered_config(None, given).scope == "host"
    plain = _spider(monkeypatch)
    given = {"db": db, "seeds": [SEED], "spider": plain}
    assert layered_config(None, given, None, load_spider).scope == "host"


def test_crawl_help_groups_every_option() -> None:
    parser = _crawl_parser()
    titles = [g.title for g in parser._action_groups]
    for title in ("what to crawl", "spider", "limits and trap defences", "recrawl",
                  "storage and output", "performance"):  # fmt: skip
        assert title in titles, titles
    assert any(t and t.startswith("politeness") for t in titles)
    assert any(t and t.startswith("fleet") for t in titles)
    grouped = [
        a for g in parser._action_groups if g.title not in ("options", "other options")
        for a in g._group_actions
    ]  # fmt: skip
    ungrouped = [a.option_strings or a.dest for a in parser._actions if a not in grouped]
    assert ungrouped == [["-h", "--help"]]
    text = _crawl_help()
    assert text.index("what to crawl:") < text.index("spider:") < text.index("performance:")


def test_crawl_help_shows_every_default() -> None:
    """Every option's help says its default (or that it is required), except the repeatable
    ones that add to a list that starts empty; none shows Python's 'None'."""
    missing = []
    for action in _crawl_parser()._actions:
        if not action.option_strings or action.dest == "help":
            continue
        text = " ".join((action.help or "").split())
        assert "None" not in text, (action.option_strings, text)
        if action.default == [] and "repeatable" in text:
            continue
        if "default" not in text and "required" not in text:
            missing.append(action.option_strings[0])
    assert missing == []


def test_a_bad_custom_setting_is_a_one_line_crawl_error(tmp_path: Path) -> None:
    from .helpers import run_cli

    spider = tmp_path / "port.py"
    spider.write_text(
        "from idemcrawl import Spider\n\n"
        "class Port(Spider):\n"
        "    custom_settings = {'ROBOTSTXT_OBEY': False}\n"
    )
    res = run_cli("crawl", SEED, "--db", str(tmp_path / "c.db"), "--spider", f"{spider}:Port")
    assert res.returncode == 2, res
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert lines == [
        "idemcrawl crawl: error: Port.custom_settings['ROBOTSTXT_OBEY']: robots.txt is obeyed, "
        "and only the operator can turn that off (crawl --ignore-robots)"
    ]
    assert not (tmp_path / "c.db").exists()
