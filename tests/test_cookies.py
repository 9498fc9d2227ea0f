"""The crawl's cookie jar (``idemcrawl.cookies``): Set-Cookie in, Cookie out."""

from __future__ import annotations

from idemcrawl.cookies import CookieJar, cookies_from, parse_set_cookie
from idemcrawl.frontier.base import Cookie

NOW = 1_800_000_000.0


def test_parse_set_cookie_attributes() -> None:
    c = parse_set_cookie(
        "sid=abc; Path=/app; Max-Age=60; Secure; HttpOnly", "https://a.test/x", NOW
    )
    assert c == Cookie("a.test", "/app", "sid", "abc", NOW + 60, True, True)
    c = parse_set_cookie("t=1; Domain=.a.test", "http://www.a.test/dir/page", NOW)
    assert c == Cookie("a.test", "/dir", "t", "1", None, False, False)
    c = parse_set_cookie("t=1; Expires=Wed, 21 Oct 2015 07:28:00 GMT", "http://a.test/", NOW)
    assert c is not None and c.expires == 1445412480.0
    # Another site's domain, a bare top-level name, no name: refused.
    assert parse_set_cookie("t=1; Domain=b.test", "http://a.test/", NOW) is None
    assert parse_set_cookie("t=1; Domain=test", "http://a.test/", NOW) is None
    assert parse_set_cookie("=1", "http://a.test/", NOW) is None
    assert parse_set_cookie("novalue", "http://a.test/", NOW) is None


def test_cookies_from_reads_every_set_cookie_header() -> None:
    headers = [("Set-Cookie", "a=1"), ("Content-Type", "text/html"), ("set-cookie", "b=2")]
    assert [c.name for c in cookies_from(headers, "http://a.test/", NOW)] == ["a", "b"]


def test_jar_sends_what_matches_host_path_scheme_and_time() -> None:
    jar = CookieJar()
    jar.load(
        [
            Cookie("a.test", "/", "root", "1"),
            Cookie("a.test", "/app", "app", "2"),
            Cookie("a.test", "/", "sec", "3", secure=True),
            Cookie("a.test", "/", "old", "4", expires=NOW - 1),
            Cookie("a.test", "/", "dom", "5", host_only=False),
            Cookie("127.0.0.1", "/", "ip", "6"),
        ]
    )
    assert jar.header_for("http://a.test/app/x", NOW) == "app=2; root=1; dom=5"
    assert jar.header_for("https://a.test/", NOW) == "root=1; sec=3; dom=5"
    assert jar.header_for("http://a.test/application", NOW) == "root=1; dom=5"
    assert jar.header_for("http://www.a.test/", NOW) == "dom=5"
    assert jar.header_for("http://127.0.0.1:8000/x", NOW) == "ip=6"
    assert jar.header_for("http://b.test/", NOW) is None
