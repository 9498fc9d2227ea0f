"""Tests for idemcrawl.traps: templates, static limits, template gate and host budgets."""

from __future__ import annotations

import random
from datetime import UTC, date, datetime, timedelta

import pytest

from idemcrawl.traps import HostBudget, TemplateGate, TrapLimits, check_url, url_template
from idemcrawl.url import host_key, normalise

LIMITS = TrapLimits()


def at(year: int, month: int, day: int, hour: int = 0, minute: int = 0, sec: int = 0) -> float:
    return datetime(year, month, day, hour, minute, sec, tzinfo=UTC).timestamp()


# --- templates --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "template"),
    [
        ("https://ex.com/cal/2024/05/12?view=day", "https://ex.com/cal/N/N/N?view=W"),
        ("https://EX.com/cal/2024/05/12#frag", "https://ex.com/cal/N/N/N"),
        ("https://ex.com/p;jsessionid=0A1B2C3D4E5F6A7B", "https://ex.com/p;jsessionid=H"),
        ("https://ex.com/list?sid=5f3a9c01d2&page=7", "https://ex.com/list?sid=H&page=N"),
        (
            "https://ex.com/item/550e8400-e29b-41d4-a716-446655440000/edit",
            "https://ex.com/item/H/edit",
        ),
        ("https://ex.com/s?token=aZ9kq0Lm3Xp2&q=caf%C3%A9+noir", "https://ex.com/s?token=X&q=W+W"),
        ("https://ex.com/page2/red-shoes-2024", "https://ex.com/pageN/red-shoes-N"),
        ("https://ex.com:8080/?123", "https://ex.com:8080/?N"),
        ("https://ex.com/a?flag&empty=&x=1", "https://ex.com/a?flag&empty=&x=N"),
        ("https://ex.com/d/deadbeef", "https://ex.com/d/deadbeef"),  # a word, not hex: no digit
        ("https://ex.com/" + "k" * 40, "https://ex.com/X"),
    ],
)
def test_url_template(url: str, template: str) -> None:
    assert url_template(url) == template


def test_query_key_order_is_kept() -> None:
    assert url_template("https://ex.com/?b=1&a=2") == "https://ex.com/?b=N&a=N"
    assert url_template("https://ex.com/?a=2&b=1") == "https://ex.com/?a=N&b=N"


def test_session_ids_collapse_to_one_template() -> None:
    rng = random.Random(1)
    jsession = {
        url_template(f"https://shop.example/cart;jsessionid={rng.getrandbits(128):032X}")
        for _ in range(200)
    }
    assert jsession == {"https://shop.example/cart;jsessionid=H"}
    sids = {
        url_template(normalise(f"https://shop.example/item?id={i}&sid={rng.getrandbits(64):016x}"))
        for i in range(200)
    }
    assert sids == {"https://shop.example/item?id=N&sid=H"}
    php = {
        url_template(
            "https://shop.example/x?PHPSESSID="
            + "".join(rng.choice("abcdefghijklmnopqrstuv0123456789") for _ in range(32))
        )
        for _ in range(200)
    }
    assert len(php) == 1


# --- static limits ----------------------------------------------------------------------------


def test_check_url_accepts_ordinary_urls() -> None:
    assert check_url("https://ex.com/a/b/c?x=1&y=2", 3, LIMITS) is None
    assert check_url("https://ex.com/a/a/a/", 0, LIMITS) is None  # three times is allowed


def test_repeated_segments_rejected() -> None:
    assert check_url("https://ex.com/a/a/a/a/a", 0, LIMITS) == "repeated path segment 'a' x5"
    assert check_url("https://ex.com/x/y/x/y/x/y/x/y/", 0, LIMITS) == (
        "repeated path segment 'x' x4"
    )
    # A relative-link loop grows one level per hop: rejected as soon as it passes the limit.
    url = "https://ex.com/docs/"
    hops = 0
    while check_url(url, 0, LIMITS) is None:
        url = normalise("static/page.html", url).rsplit("/", 1)[0] + "/"
        hops += 1
    assert hops == 4


def test_depth_and_length_limits() -> None:
    assert check_url("https://ex.com/", 16, LIMITS) is None
    assert check_url("https://ex.com/", 17, LIMITS) == "depth 17 > 16"
    long_url = "https://ex.com/" + "x" * 2985
    assert len(long_url) == 3000
    assert check_url(long_url, 0, LIMITS) == "url length 3000 > 2048"
    assert check_url(long_url, 0, TrapLimits(max_url_length=4096)) is None


def test_invalid_limits_rejected() -> None:
    with pytest.raises(ValueError):
        TrapLimits(template_sample_every=0)
    with pytest.raises(ValueError):
        TrapLimits(max_depth=-1)


# --- template gate: traps ---------------------------------------------------------------------


def calendar_urls(host: str, start: date) -> list[str]:
    """An infinite calendar: every day links to the next one, forever."""
    return [
        normalise(f"https://{host}/cal/{d:%Y/%m/%d}")
        for d in (start + timedelta(days=i) for i in range(3000))
    ]


def test_infinite_calendar_is_paused_without_affecting_others() -> None:
    limits = TrapLimits(template_growth_limit=1000, template_sample_every=50)
    gate = TemplateGate(limits)
    admitted = rejected = 0
    reasons = set()
    articles = articles_ok = other_host = other_host_ok = 0
    for i, url in enumerate(calendar_urls("site.example", date(2024, 1, 1))):
        ok, reason = gate.admit(url)
        if ok:
            admitted += 1
        else:
            rejected += 1
            reasons.add(reason)
        # Interleaved: real pages of the same host, growing at a quarter of the trap's pace...
        if i % 4 == 0:
            articles += 1
            articles_ok += gate.admit(f"https://site.example/articles/{i}")[0]
        # ...and another host's calendar, which has its own count.
        if i % 5 == 0:
            other_host += 1
            other_host_ok += gate.admit(f"https://other.example/cal/2024/{i % 12}/{i}")[0]
    # The trap: 1000 before the pause, then 1 in 50 of the remaining 2000.
    assert admitted == 1000 + 2000 // 50
    assert rejected == 2000 - 2000 // 50
    assert reasons == {"template paused: https://site.example/cal/N/N/N (1000 new URLs)"}
    assert gate.is_paused("https://site.example/cal/N/N/N")
    assert gate.paused() == ["https://site.example/cal/N/N/N"]
    # Everything else kept being admitted all along.
    assert articles_ok == articles == 750
    assert other_host_ok == other_host == 600
    assert not gate.is_paused("https://other.example/cal/N/N/N")
    assert gate.admit("https://site.example/about") == (True, None)


def test_calendar_host_still_admits_other_template_while_paused() -> None:
    gate = TemplateGate(TrapLimits(template_growth_limit=100, template_sample_every=10))
    for url in calendar_urls("site.example", date(2024, 1, 1))[:150]:
        gate.admit(url)
    assert gate.is_paused("https://site.example/cal/N/N/N")
    assert all(gate.admit(f"https://site.example/products/p{i}")[0] for i in range(100))
    assert all(gate.admit(f"https://another.example/cal/2024/01/{i}")[0] for i in range(100))


def test_faceted_navigation() -> None:
    colors = ["red", "blue", "green", "black", "white"]
    sizes = ["xs", "s", "m", "l", "xl"]
    brands = ["acme", "globex", "initech", "umbrella"]
    # Every combination of filters, in a fixed key order, is one template...
    facet_urls = [
        normalise(f"https://shop.example/shoes?color={c}&size={s}&brand={b}&page={p}")
        for c in colors
        for s in sizes
        for b in brands
        for p in range(1, 15)
    ]
    assert {url_template(u) for u in facet_urls} == {
        "https://shop.example/shoes?color=W&size=W&brand=W&page=N"
    }
    gate = TemplateGate(TrapLimits(template_growth_limit=1000, template_sample_every=50))
    decisions = [gate.admit(u)[0] for u in facet_urls]
    assert len(facet_urls) == 1400
    assert sum(decisions) == 1000 + 400 // 50
    # ...and piling up combinable filters hits the parameter limit outright.
    params = "&".join(f"f{i}={colors[i % 5]}" for i in range(30))
    assert check_url(f"https://shop.example/shoes?{params}", 1, LIMITS) == "query params 30 > 12"
    twelve = "&".join(f"f{i}=x" for i in range(12))
    assert check_url(f"https://shop.example/shoes?{twelve}", 1, LIMITS) is None


def test_session_id_trap_is_paused() -> None:
    gate = TemplateGate(TrapLimits(template_growth_limit=20, template_sample_every=5))
    rng = random.Random(2)
    results = [
        gate.admit(f"https://ex.com/home;jsessionid={rng.getrandbits(128):032X}")[0]
        for _ in range(45)
    ]
    assert results[:20] == [True] * 20
    assert sum(results[20:]) == 5


def test_gate_snapshot_and_restore() -> None:
    limits = TrapLimits(template_growth_limit=10, template_sample_every=3)
    gate = TemplateGate(limits)
    for i in range(12):
        gate.admit(f"https://ex.com/cal/{i}")
    snap = gate.snapshot()
    assert snap == {"https://ex.com/cal/N": 12}
    restored = TemplateGate(limits)
    restored.restore(snap)
    assert len(restored) == 1
    # The restarted gate continues exactly where the first one was (13th sampled: 3 % 3 == 0).
    for i in range(13, 20):
        url = f"https://ex.com/cal/{i * 100}"
        assert restored.admit(url) == gate.admit(url)
    assert [restored.admit(f"https://ex.com/cal/{2000 + i}")[0] for i in range(3)] == [
        False,
        False,
        True,
    ]
    snap["https://ex.com/cal/N"] = 0
    restored.restore(snap)
    assert len(restored) == 0


# --- host budget ------------------------------------------------------------------------------


def test_host_budget_resets_on_next_utc_day() -> None:
    budget = HostBudget(TrapLimits(host_daily_budget=3))
    host = host_key(normalise("https://ex.com/"))
    other = "https://other.example"
    late = at(2024, 5, 12, 23, 59, 59)
    assert budget.allow(host, late)
    assert budget.spend(host, late) == 2
    budget.spend(host, late, 2)
    assert not budget.allow(host, late)
    assert budget.remaining(host, late) == 0
    assert budget.allow(other, late)  # per host
    # One second later it is another UTC day.
    next_day = at(2024, 5, 13, 0, 0, 0)
    assert budget.allow(host, next_day)
    assert budget.spent(host, next_day) == 0
    budget.spend(host, next_day)
    # The old day's counters are dropped once a later day is seen.
    assert budget.snapshot() == {"2024-05-13 https://ex.com": 1}


def test_host_budget_snapshot_restore() -> None:
    budget = HostBudget(TrapLimits(host_daily_budget=5))
    now = at(2024, 5, 12, 12)
    budget.spend("https://ex.com", now, 5)
    budget.spend("http://ex.com:8080", now, 2)
    snap = budget.snapshot()
    assert snap == {"2024-05-12 https://ex.com": 5, "2024-05-12 http://ex.com:8080": 2}
    restored = HostBudget(TrapLimits(host_daily_budget=5))
    restored.restore(snap)
    assert not restored.allow("https://ex.com", now)
    assert restored.remaining("http://ex.com:8080", now) == 3
    with pytest.raises(ValueError):
        restored.restore({"garbage": 1})
