from __future__ import annotations

import pytest

from idemcrawl.recrawl import DAY, PinError, RecrawlPolicy, parse_pin


def test_changed_halves_unchanged_doubles_within_bounds() -> None:
    p = RecrawlPolicy(min_interval=10, max_interval=80)
    url = "http://a/p"
    first = p.next_interval(url, None, changed=True, status=200)
    assert first == 10
    assert p.next_interval(url, 40, changed=True, status=200) == 20
    assert p.next_interval(url, 10, changed=True, status=200) == 10  # floor
    assert p.next_interval(url, 40, changed=False, status=304) == 80
    assert p.next_interval(url, 80, changed=False, status=200) == 80  # ceiling


def test_defaults_are_one_to_thirty_days() -> None:
    p = RecrawlPolicy()
    assert p.next_interval("http://a/", None, changed=True, status=200) == DAY
    assert p.next_interval("http://a/", 20 * DAY, changed=False, status=200) == 30 * DAY


def test_tombstones_wait_long_and_pins_win() -> None:
    p = RecrawlPolicy(min_interval=10, max_interval=1000, pins=(("/news/", 30.0),))
    assert p.next_interval("http://a/gone", 10, changed=True, status=404) == 1000
    assert p.next_interval("http://a/gone", 10, changed=True, status=410) == 1000
    assert p.next_interval("http://a/news/1", 999, changed=False, status=200) == 30


def test_near_duplicates_are_revisited_less_often() -> None:
    p = RecrawlPolicy(min_interval=10, max_interval=1000)
    plain = p.next_interval("http://a/x", 100, changed=False, status=200)
    near = p.next_interval("http://a/x", 100, changed=False, status=200, near_duplicate=True)
    assert near == 2 * plain


@pytest.mark.parametrize(
    ("text", "message"),
    [("nothing", "REGEX=SECONDS"), ("a=b", "not a number"), ("a=0", "> 0"), ("(=5", "regular")],
)
def test_bad_pins_are_explained(text: str, message: str) -> None:
    with pytest.raises(PinError, match=message):
        parse_pin(text)


def test_pin_parses() -> None:
    assert parse_pin(r"^https://a/news/\d+=3600") == (r"^https://a/news/\d+", 3600.0)


def test_bad_bounds_rejected() -> None:
    with pytest.raises(ValueError, match="min <= max"):
        RecrawlPolicy(min_interval=100, max_interval=10)
