"""Tests for the robots.txt policy module: outcome classes, caching, matching and persistence.

These drive the pure functions directly (no server): the point of the module is that every
decision is a function of plain data, so that is how it is checked.
"""

from __future__ import annotations

import sqlite3
import string
from pathlib import Path
from urllib.parse import quote

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from protego import Protego

from idemcrawl import robots
from idemcrawl.robots import (
    ALLOW_ALL,
    DISALLOW_ALL,
    ROW_COLUMNS,
    RULES,
    RobotsCache,
    RobotsSettings,
    RobotsState,
    needs_fetch,
    outcome,
    product_token,
    robots_url,
    state_from_row,
    state_to_row,
)

HOST = "https://shop.example"
UA = "idemcrawl/0.1 (+https://example.org/bot)"
SETTINGS = RobotsSettings(user_agent=UA)
NOW = 1_000_000.0


def rules(text: str, now: float = NOW, settings: RobotsSettings = SETTINGS) -> RobotsState:
    return outcome(200, text.encode(), now, settings)


def can(state: RobotsState | None, path: str, settings: RobotsSettings = SETTINGS) -> bool:
    return RobotsCache(settings).allowed(HOST, state, HOST + path)


# --- small helpers ------------------------------------------------------------------------


def test_robots_url() -> None:
    assert robots_url("https://a.example") == "https://a.example/robots.txt"
    assert robots_url("http://a.example:8080") == "http://a.example:8080/robots.txt"


@pytest.mark.parametrize(
    ("ua", "token"),
    [
        ("idemcrawl/0.1 (+https://example.org/bot)", "idemcrawl"),
        ("IdemCrawl", "IdemCrawl"),
        ("my_bot-2/1.0", "my_bot-"),
        ("  spaced/1 extra", "spaced"),
        ("", "idemcrawl"),
        ("123/4.5", "idemcrawl"),
    ],
)
def test_product_token(ua: str, token: str) -> None:
    assert product_token(ua) == token


@pytest.mark.parametrize(
    "kw", [{"max_age": 0}, {"error_ttl": -1}, {"crawl_delay_cap": -1}, {"max_bytes": 0}]
)
def test_settings_reject_nonsense(kw: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        RobotsSettings(**kw)  # type: ignore[arg-type]


def test_state_rejects_inconsistent_fields() -> None:
    with pytest.raises(ValueError):
        RobotsState("ok", None, 0.0, 1.0, 200, None, None, None)
    with pytest.raises(ValueError):
        RobotsState(RULES, None, 0.0, 1.0, 200, None, None, None)
    with pytest.raises(ValueError):
        RobotsState(ALLOW_ALL, b"x", 0.0, 1.0, 404, None, None, None)


# --- outcome classes ----------------------------------------------------------------------


def test_200_obeys_rules_with_longest_match_precedence() -> None:
    state = rules(
        "User-agent: *\n"
        "Disallow: /shop\n"
        "Allow: /shop/public\n"
        "Allow: /a\n"
        "Disallow: /a/b\n"
        "Disallow: /tie\n"
        "Allow: /tie\n"
    )
    assert state.mode == RULES
    assert state.expires_at == NOW + SETTINGS.max_age
    assert state.last_status == 200 and state.last_error is None
    assert can(state, "/") is True
    assert can(state, "/shop/item") is False
    assert can(state, "/shop/public/item") is True  # longer Allow beats shorter Disallow
    assert can(state, "/a/x") is True
    assert can(state, "/a/b/c") is False  # longer Disallow beats shorter Allow
    assert can(state, "/tie") is True  # equal length: Allow wins (RFC 9309 section 2.2.2)


@pytest.mark.parametrize("status", [400, 401, 403, 404, 410, 451])
def test_4xx_allows_all(status: int) -> None:
    state = outcome(status, b"User-agent: *\nDisallow: /\n", NOW, SETTINGS)
    assert state.mode == ALLOW_ALL
    assert state.body is None  # a 4xx body is an error page, never rules
    assert state.expires_at == NOW + SETTINGS.max_age
    assert state.last_status == status and state.last_error is None
    assert can(state, "/anything") is True


@pytest.mark.parametrize("status", [500, 502, 503, 504, 599, 429, 100, 301, 304, 600])
def test_unreachable_status_disallows_all(status: int) -> None:
    state = outcome(status, b"User-agent: *\nAllow: /\n", NOW, SETTINGS)
    assert state.mode == DISALLOW_ALL
    assert state.expires_at == NOW + SETTINGS.error_ttl
    assert state.last_status == status
    assert state.last_error == f"HTTP {status}"
    assert can(state, "/") is False
    assert needs_fetch(state, NOW + SETTINGS.error_ttl)


def test_network_error_disallows_all() -> None:
    state = outcome(None, None, NOW, SETTINGS, error="timeout after 30 s")
    assert state.mode == DISALLOW_ALL
    assert state.last_status is None and state.last_error == "timeout after 30 s"
    assert state.expires_at == NOW + SETTINGS.error_ttl
    assert can(state, "/page") is False
    assert outcome(None, None, NOW, SETTINGS).last_error == "network error"


def test_too_many_redirects_means_unavailable_so_allow_all() -> None:
    state = outcome(301, None, NOW, SETTINGS, too_many_redirects=True)
    assert state.mode == ALLOW_ALL
    assert state.expires_at == NOW + SETTINGS.max_age
    assert state.last_status == 301 and state.last_error == "too many redirects"
    assert can(state, "/page") is True


@pytest.mark.parametrize(("status", "error"), [(500, None), (503, "busy"), (None, "refused")])
def test_unreachable_keeps_last_good_rules(status: int | None, error: str | None) -> None:
    good = rules("User-agent: *\nDisallow: /private\nCrawl-delay: 5\nSitemap: https://s/x.xml\n")
    later = NOW + 90_000
    state = outcome(status, b"", later, SETTINGS, good, error=error)
    assert state.mode == RULES
    assert state.body == good.body
    assert state.fetched_at == good.fetched_at  # same copy: the parsed rules are reused
    assert state.expires_at == later + SETTINGS.error_ttl
    assert state.last_status == status
    assert state.last_error == (error or f"HTTP {status}")
    assert state.crawl_delay == 5.0 and state.sitemaps == ("https://s/x.xml",)
    assert can(state, "/private/a") is False and can(state, "/public") is True


def test_unreachable_keeps_last_allow_all() -> None:
    good = outcome(404, None, NOW, SETTINGS)
    state = outcome(503, None, NOW + 10, SETTINGS, good)
    assert state.mode == ALLOW_ALL
    assert state.fetched_at == NOW and state.expires_at == NOW + 10 + SETTINGS.error_ttl
    assert state.last_status == 503 and state.last_error == "HTTP 503"


def test_unreachable_after_unreachable_stays_disallowed() -> None:
    bad = outcome(500, None, NOW, SETTINGS)
    state = outcome(None, None, NOW + 5, SETTINGS, bad, error="dns")
    assert state.mode == DISALLOW_ALL
    assert state.expires_at == NOW + 5 + SETTINGS.error_ttl
    assert state.last_error == "dns"


def test_success_replaces_previous_copy() -> None:
    old = rules("User-agent: *\nDisallow: /\n")
    new = outcome(200, b"User-agent: *\nDisallow: /x\n", NOW + 10, SETTINGS, old)
    assert new.fetched_at == NOW + 10
    assert can(new, "/page") is True and can(new, "/x") is False


def test_expiry_after_max_age() -> None:
    settings = RobotsSettings(max_age=100.0)
    state = rules("User-agent: *\nDisallow:\n", settings=settings)
    assert needs_fetch(None, NOW)
    assert not needs_fetch(state, NOW)
    assert not needs_fetch(state, NOW + 99.9)
    assert needs_fetch(state, NOW + 100.0)


# --- Crawl-delay ----------------------------------------------------------------------------


def test_crawl_delay_within_cap_slows_us_down() -> None:
    state = rules("User-agent: *\nCrawl-delay: 7.5\n")
    cache = RobotsCache(SETTINGS)
    assert state.crawl_delay == 7.5 and state.deferred_reason is None
    assert cache.effective_delay(state, 1.0) == 7.5
    assert cache.effective_delay(state, 10.0) == 10.0  # our own delay can only be longer
    assert cache.effective_delay(None, 1.0) == 1.0
    assert cache.effective_delay(rules("User-agent: *\nDisallow:\n"), 2.0) == 2.0


def test_crawl_delay_above_cap_defers_host() -> None:
    state = rules("User-agent: *\nCrawl-delay: 60\n")
    assert state.crawl_delay == 60.0  # stored raw, uncapped
    assert state.deferred_reason == "Crawl-delay 60 s exceeds cap 30 s"
    # Even if the caller forgot to pause the host, it is never crawled faster than asked.
    assert RobotsCache(SETTINGS).effective_delay(state, 1.0) == 60.0
    exactly = rules("User-agent: *\nCrawl-delay: 30\n")
    assert exactly.deferred_reason is None


def test_crawl_delay_of_our_group_only() -> None:
    state = rules(
        "User-agent: *\nCrawl-delay: 99\n\nUser-agent: idemcrawl\nCrawl-delay: 2\nDisallow: /x\n"
    )
    assert state.crawl_delay == 2.0 and state.deferred_reason is None


def test_kept_copy_deferral_uses_current_cap() -> None:
    good = rules("User-agent: *\nCrawl-delay: 20\n")
    strict = RobotsSettings(user_agent=UA, crawl_delay_cap=10.0)
    state = outcome(500, None, NOW + 1, strict, good)
    assert state.deferred_reason == "Crawl-delay 20 s exceeds cap 10 s"


# --- user-agent matching --------------------------------------------------------------------


def test_group_matches_product_token_case_insensitively() -> None:
    state = rules(
        "User-agent: IdemCrawl\nDisallow: /private\n\nUser-agent: otherbot\nDisallow: /\n"
    )
    assert can(state, "/private/x") is False  # our group, despite the case difference
    assert can(state, "/public") is True  # otherbot's "Disallow: /" is not ours


def test_group_for_other_bot_does_not_apply() -> None:
    state = rules("User-agent: otherbot\nDisallow: /\n")
    assert can(state, "/page") is True


def test_specific_group_overrides_star() -> None:
    text = "User-agent: *\nDisallow: /\n\nUser-agent: idemcrawl\nDisallow: /x\n"
    assert can(rules(text), "/page") is True
    assert can(rules("User-agent: *\nDisallow: /\n"), "/page") is False


def test_comment_or_url_in_user_agent_does_not_match_other_groups() -> None:
    # The full UA string contains "example" and "bot"; only the product token may match.
    settings = RobotsSettings(user_agent="idemcrawl/0.1 (+https://example.org/bot)")
    state = rules("User-agent: bot\nDisallow: /\n", settings=settings)
    assert can(state, "/page", settings) is True


def test_bom_does_not_hide_first_group() -> None:
    state = outcome(200, b"\xef\xbb\xbfUser-agent: *\nDisallow: /\n", NOW, SETTINGS)
    assert can(state, "/page") is False


# --- allowed() edge cases -------------------------------------------------------------------


@pytest.mark.parametrize(
    "state",
    [
        None,
        outcome(500, None, NOW, SETTINGS),
        outcome(200, b"User-agent: *\nDisallow: /\n", NOW, SETTINGS),
    ],
)
def test_robots_url_always_allowed(state: RobotsState | None) -> None:
    assert RobotsCache(SETTINGS).allowed(HOST, state, robots_url(HOST)) is True


def test_unknown_state_never_allowed() -> None:
    cache = RobotsCache(SETTINGS)
    assert cache.allowed(HOST, None, HOST + "/") is False
    assert cache.allowed(HOST, None, HOST + "/robots.txt?x=1") is False


# --- size limit, sitemaps ---------------------------------------------------------------


def test_body_truncated_at_max_bytes() -> None:
    head = b"User-agent: *\nDisallow: /early\n"
    filler = b"# padding padding padding padding padding padding padding padding\n"
    body = head + filler * (SETTINGS.max_bytes // len(filler) + 10) + b"Disallow: /late\n"
    assert len(body) > SETTINGS.max_bytes
    state = outcome(200, body, NOW, SETTINGS)
    assert state.body is not None and len(state.body) <= SETTINGS.max_bytes
    assert can(state, "/early") is False
    assert can(state, "/late") is True  # the rule after 500 KiB is ignored


def test_truncation_drops_a_line_sliced_by_the_limit() -> None:
    settings = RobotsSettings(user_agent=UA, max_bytes=64)
    head = b"User-agent: *\nDisallow: /\n"
    pad = b"#" * (64 - len(head) - len(b"\nAllow: /p")) + b"\n"
    body = head + pad + b"Allow: /public\n"
    assert body.index(b"Allow: /p") + len(b"Allow: /p") == 64  # the cut falls mid-rule
    state = outcome(200, body, NOW, settings)
    assert state.body == head + pad
    # Had "Allow: /p" survived, /private would be allowed.
    assert can(state, "/private", settings) is False


def test_sitemaps_collected_in_order_without_duplicates() -> None:
    state = rules(
        "Sitemap: https://shop.example/a.xml\n"
        "User-agent: *\nDisallow: /x\n"
        "Sitemap: https://cdn.example/b.xml\n"
        "Sitemap: https://shop.example/a.xml\n"
    )
    assert state.sitemaps == ("https://shop.example/a.xml", "https://cdn.example/b.xml")


# --- persistence ----------------------------------------------------------------------------


ROUND_TRIP_STATES = [
    rules("User-agent: *\nDisallow: /x\nCrawl-delay: 45\nSitemap: https://s/m.xml\n"),
    outcome(403, None, NOW, SETTINGS),
    outcome(None, None, NOW, SETTINGS, error="connect timeout: é"),
    outcome(503, None, NOW + 3.25, SETTINGS, rules("User-agent: *\nDisallow: /y\n")),
    outcome(301, None, NOW, SETTINGS, too_many_redirects=True),
]


@pytest.mark.parametrize("state", ROUND_TRIP_STATES)
def test_row_round_trip_through_sqlite(state: RobotsState) -> None:
    db = sqlite3.connect(":memory:")
    db.row_factory = sqlite3.Row
    db.execute(
        "CREATE TABLE hosts (host_key TEXT PRIMARY KEY, robots_state TEXT, robots_body BLOB,"
        " robots_fetched_at REAL, robots_expires_at REAL, crawl_delay REAL, robots_meta TEXT)"
    )
    row = state_to_row(state)
    assert tuple(row) == ROW_COLUMNS
    db.execute(
        f"INSERT INTO hosts (host_key, {', '.join(ROW_COLUMNS)})"
        f" VALUES (?, {', '.join('?' * len(ROW_COLUMNS))})",
        (HOST, *row.values()),
    )
    loaded = state_from_row(db.execute("SELECT * FROM hosts").fetchone())
    assert loaded == state
    assert state_from_row(row) == state  # a plain dict works too


def test_row_for_unknown_state() -> None:
    row = state_to_row(None)
    assert row == dict.fromkeys(ROW_COLUMNS)
    assert state_from_row(row) is None


def test_row_with_minimal_meta_loads_defaults() -> None:
    row = state_to_row(outcome(404, None, NOW, SETTINGS)) | {"robots_meta": None}
    state = state_from_row(row)
    assert state is not None and state.mode == ALLOW_ALL
    assert state.last_status is None and state.sitemaps == ()


def test_corrupt_row_raises() -> None:
    row = state_to_row(outcome(404, None, NOW, SETTINGS)) | {"robots_state": "bogus"}
    with pytest.raises(ValueError):
        state_from_row(row)


# --- RobotsCache ------------------------------------------------------------------------


@pytest.fixture
def parse_calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    calls: list[str] = []
    original = Protego.parse.__func__  # type: ignore[attr-defined]

    def counting(cls: type[Protego], content: str) -> Protego:
        calls.append(content)
        return original(cls, content)

    monkeypatch.setattr(Protego, "parse", classmethod(counting))
    return calls


def test_cache_parses_each_copy_once(parse_calls: list[str]) -> None:
    state = rules("User-agent: *\nDisallow: /x\n")
    cache = RobotsCache(SETTINGS)
    parse_calls.clear()  # outcome() parses once for crawl-delay and sitemaps
    for i in range(50):
        cache.allowed(HOST, state, f"{HOST}/page/{i}")
        cache.allowed(HOST, state, f"{HOST}/x/{i}")
    assert len(parse_calls) == 1

    # A copy kept across an unreachable refetch is the same copy: no new parse.
    kept = outcome(503, None, NOW + 10, SETTINGS, state)
    assert cache.allowed(HOST, kept, HOST + "/x") is False
    assert len(parse_calls) == 1

    # A state rebuilt from its row (new bytes object, same content) also hits.
    reloaded = state_from_row(state_to_row(state))
    assert cache.allowed(HOST, reloaded, HOST + "/x") is False
    assert len(parse_calls) == 1

    # A new fetch is a new copy.
    fresh = outcome(200, b"User-agent: *\nDisallow: /y\n", NOW + 20, SETTINGS)
    parse_calls.clear()
    assert cache.allowed(HOST, fresh, HOST + "/x") is True
    assert cache.allowed(HOST, fresh, HOST + "/y") is False
    assert len(parse_calls) == 1


def test_cache_never_serves_rules_of_a_different_body(parse_calls: list[str]) -> None:
    a = rules("User-agent: *\nDisallow: /a\n")
    b = rules("User-agent: *\nDisallow: /b\n")  # same host, same fetched_at
    cache = RobotsCache(SETTINGS)
    assert cache.allowed(HOST, a, HOST + "/b") is True
    assert cache.allowed(HOST, b, HOST + "/b") is False


def test_cache_is_bounded_lru(parse_calls: list[str]) -> None:
    cache = RobotsCache(SETTINGS, max_entries=2)
    state = rules("User-agent: *\nDisallow: /x\n")
    parse_calls.clear()
    for host in ("https://a.example", "https://b.example", "https://a.example"):
        cache.allowed(host, state, host + "/x")
    cache.allowed("https://c.example", state, "https://c.example/x")  # evicts b, not a
    assert len(cache) == 2
    assert set(cache) == {("https://a.example", NOW), ("https://c.example", NOW)}
    assert len(parse_calls) == 3
    cache.allowed("https://b.example", state, "https://b.example/x")
    assert len(parse_calls) == 4


def test_cache_not_used_for_blanket_modes(parse_calls: list[str]) -> None:
    cache = RobotsCache(SETTINGS)
    parse_calls.clear()
    cache.allowed(HOST, outcome(404, None, NOW, SETTINGS), HOST + "/a")
    cache.allowed(HOST, outcome(500, None, NOW, SETTINGS), HOST + "/a")
    assert parse_calls == [] and len(cache) == 0


def test_module_has_no_network_imports() -> None:
    source = Path(robots.__file__).read_text(encoding="utf-8")
    for name in ("aiohttp", "socket", "urllib.request", "http.client", "sqlite3"):
        assert f"import {name}" not in source and f"from {name}" not in source


# --- properties -----------------------------------------------------------------------------

# Characters a normalised URL path may carry literally, minus the pattern metacharacters
# ("*", "$") and "%" (escapes are covered by the non-ASCII strategy below).
SEGMENT_CHARS = string.ascii_letters + string.digits + "-._~!&'()+,;=:@/"
segments = st.text(alphabet=SEGMENT_CHARS, max_size=12)
unicode_segments = st.text(
    alphabet=st.characters(
        codec="utf-8", exclude_categories=("Cc", "Cs", "Zs", "Zl", "Zp"), exclude_characters="*$%#?"
    ),
    max_size=8,
)


def url_path(text: str) -> str:
    """Percent-encode like the normaliser does, so the URL is what the crawler would request."""
    return "/" + quote(text, safe=SEGMENT_CHARS)


@given(path=st.one_of(segments, unicode_segments))
def test_disallow_all_never_allows(path: str) -> None:
    p = url_path(path)
    assume(p != robots.ROBOTS_PATH)
    state = outcome(500, None, NOW, SETTINGS)
    assert can(state, p) is False
    assert RobotsCache(SETTINGS).allowed(HOST, None, HOST + p) is False


@given(path=st.one_of(segments, unicode_segments))
def test_allow_all_always_allows(path: str) -> None:
    assert can(outcome(404, None, NOW, SETTINGS), url_path(path)) is True


@given(
    prefixes=st.lists(st.one_of(segments, unicode_segments), min_size=1, max_size=5),
    pick=st.integers(min_value=0),
    suffix=st.one_of(segments, unicode_segments),
    use_our_group=st.booleans(),
)
def test_disallowed_prefix_never_allowed(
    prefixes: list[str], pick: int, suffix: str, use_our_group: bool
) -> None:
    agent = "IDEMCRAWL" if use_our_group else "*"
    text = f"User-agent: {agent}\n" + "".join(f"Disallow: /{p}\n" for p in prefixes)
    state = rules(text)
    target = url_path(prefixes[pick % len(prefixes)] + suffix)
    assume(target != robots.ROBOTS_PATH)
    assert can(state, target) is False


# --- robots.txt files that refuse nothing (the lease path skips Protego for them) -----------


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ("User-agent: *\nAllow: /\n", True),
        ("", True),
        ("# Disallow: /x\nUser-agent: *\nDisallow:\n", True),
        ("\ufeffUser-agent: *\nCrawl-delay: 1\nSitemap: https://shop.example/s.xml\n", True),
        ("User-agent: *\nDisallow: /x\n", False),
        ("User-agent: *\nDissalow: /x\n", False),  # a misspelling Protego honours
        ("User-agent: *\nDisallow /x\n", False),  # no colon: left to Protego
        ("User-agent: *\nNoindex: /x\n", False),  # unknown directive with a value
    ],
)
def test_refuses_nothing(body: str, expected: bool) -> None:
    assert robots.refuses_nothing(body.encode()) is expected


_LINES = st.sampled_from(
    [
        "User-agent: *", "User-agent: idemcrawl", "User-agent: otherbot", "useragent idemcrawl",
        "Allow: /", "Allow: /a", "Disallow:", "Disallow: /a", "disallow: /b*", "Dissallow: /a",
        "Disallow /a", "Crawl-delay: 2", "Sitemap: /s.xml", "# Disallow: /a", "", "Noindex: /a",
        "Disallow: /*.php$", "Host: shop.example", "Allow: /a # Disallow: /",
    ]
)  # fmt: skip


@given(st.lists(_LINES, max_size=8), st.sampled_from(["/", "/a", "/a/b", "/b.php", "/x?q=1"]))
def test_allowed_without_protego_only_when_protego_allows(lines: list[str], path: str) -> None:
    """Whatever the file, the cache's verdict is Protego's: the fast path for files that
    refuse nothing never allows what Protego refuses."""
    body = "\n".join(lines).encode()
    state = rules(body.decode())
    if state.mode != robots.RULES:
        return
    url = HOST + path
    expected = Protego.parse(body.decode()).can_fetch(url, SETTINGS.token)
    assert RobotsCache(SETTINGS).allowed(HOST, state, url) is expected
    if robots.refuses_nothing(body):
        assert expected is True


def test_file_that_refuses_nothing_skips_matching(monkeypatch: pytest.MonkeyPatch) -> None:
    matched: list[str] = []
    original = Protego.can_fetch

    def counting(self: Protego, url: str, user_agent: str) -> bool:
        matched.append(url)
        return original(self, url, user_agent)

    monkeypatch.setattr(Protego, "can_fetch", counting)
    cache = RobotsCache(SETTINGS)
    open_site = rules("User-agent: *\nAllow: /\n")
    assert all(cache.allowed(HOST, open_site, f"{HOST}/p/{i}") for i in range(20))
    assert matched == []
    closed = rules("User-agent: *\nDisallow: /p/1\n", now=NOW + 1)
    assert cache.allowed(HOST, closed, HOST + "/p/1") is False
    assert cache.allowed(HOST, closed, HOST + "/p/2") is True
    assert matched == [HOST + "/p/1", HOST + "/p/2"]
