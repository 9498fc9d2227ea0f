"""``Resolver`` must be ``normalise(href, base)`` exactly, fast paths or not."""

from __future__ import annotations

import string

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from idemcrawl.url import InvalidURL, Resolver, normalise

BASES = [
    "http://shop.test/p/5",
    "http://shop.test/",
    "https://shop.test:8443/a/b/c?x=/y/z",
    "http://127.0.0.1:8080/p/dir/",
    "http://[::1]:81/x",
    "HTTP://Shop.Test/p/5",  # not normalised: no fast path, same answers
    "http://shop.test/p/%7e/",  # not normalised either
    "not a url",
]

_PIECES = [
    "/", "./", "../", ".", "..", "?", "#", ":", "//", "\\", "%2e", "%41", "%", " ", "\t",
    "'", "http://shop.test", "https://shop.test:8443", "http://127.0.0.1:8080",
    "http://shop.test.evil", "HTTP://shop.test", "http://shop.test:80", "mailto:", "p", "12",
    "a:b", "é", "x=1&y=2", ";", "@", "~", "-", "_", "\x00",
]  # fmt: skip
hrefs = st.lists(
    st.sampled_from(_PIECES) | st.text(string.ascii_letters + "./?#:%", max_size=4),
    max_size=8,
).map("".join)


def outcome(fn, href: str) -> str:  # type: ignore[no-untyped-def]
    try:
        return fn(href)
    except InvalidURL as exc:
        return f"InvalidURL: {exc}"


@settings(max_examples=3000, deadline=None)
@given(st.sampled_from(BASES), hrefs)
@example("http://shop.test/p/5", "../../../x?q#f")
@example("http://shop.test/p/5", "./a/./b")
@example("http://shop.test/p/5", "http://shop.test/x?")
@example("http://shop.test/p/5", "/x/%7e")
@example("http://shop.test/p/5", "/\t/evil.test/")
@pytest.mark.slow
def test_resolver_equals_normalise(base: str, href: str) -> None:
    r = Resolver(base)
    assert outcome(r.resolve, href) == outcome(lambda h: normalise(h, base), href)


@pytest.mark.parametrize(
    ("href", "expected"),
    [
        ("/p/12", "http://shop.test/p/12"),
        ("12", "http://shop.test/p/12"),
        ("./12", "http://shop.test/p/12"),
        ("../p/12#top", "http://shop.test/p/12"),
        ("../../../x", "http://shop.test/x"),
        ("http://shop.test/p/12?a=1&b=/c", "http://shop.test/p/12?a=1&b=/c"),
        ("//other.test/x", "http://other.test/x"),
        ("/x?", "http://shop.test/x"),
        ("/a/../b", "http://shop.test/b"),
        ("/%7e", "http://shop.test/~"),
    ],
)
def test_resolver_examples(href: str, expected: str) -> None:
    assert Resolver("http://shop.test/p/5").resolve(href) == expected


def test_resolver_raises_like_normalise() -> None:
    with pytest.raises(InvalidURL, match="unsupported scheme"):
        Resolver("http://shop.test/").resolve("javascript:alert(1)")
    with pytest.raises(InvalidURL, match="longer than"):
        Resolver("http://shop.test/").resolve("/" + "a" * 9000)


def test_common_links_take_the_fast_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """The plain forms never reach the URL parser (otherwise the property above is vacuous)."""
    import idemcrawl.url as url_mod

    r = Resolver("http://shop.test/p/5")

    def no_parser(*_args: object) -> str:
        raise AssertionError("took the slow path")

    monkeypatch.setattr(url_mod, "normalise", no_parser)
    for href in ["/p/1", "1", "./1", "../p/1", "http://shop.test/p/1#x", "/q?a=1&b=c"]:
        assert r.resolve(href).startswith("http://shop.test/")
    with pytest.raises(AssertionError):
        r.resolve("/p/%7e")
