"""``Resolver`` must be ``normalise(href, base)`` exactly, fast paths or not, in C or Python."""

from __future__ import annotations

import os
import string

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import idemcrawl.url as url_mod
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
    "a:b", "é", "x=1&y=2", ";", "@", "~", "-", "_", "\x00", "tel:", "javascript:", "MAILTO:",
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
    expected = outcome(lambda h: normalise(h, base), href)
    assert outcome(r.resolve, href) == expected
    assert outcome(r._resolve_py, href) == expected  # the reference, also the fallback
    # The batch form joins only what the fast path may: each answer is normalise's, or None.
    (joined,) = r.resolve_many([href])
    assert joined is None or joined == expected


def test_the_c_fast_path_is_built_in_ci() -> None:
    """Without it every link takes the Python path (same URLs, ~10x the instructions)."""
    if not os.environ.get("CI"):
        pytest.skip("only CI requires the build; elsewhere the fallback is allowed")
    assert url_mod._native is not None, "idemcrawl._links was not built"


@pytest.mark.skipif(url_mod._native is None, reason="idemcrawl._links not built")
def test_c_and_python_fast_paths_take_the_same_links() -> None:
    """Where the Python fast path answers without the URL parser, so does the C one."""
    base = "http://shop.test/p/5"
    r = Resolver(base)
    native = url_mod._native
    assert native is not None
    hrefs = [
        "/p/1",
        "1",
        "./1",
        "../p/1",
        "http://shop.test/p/1#x",
        "/q?a=1&b=c",
        "/?.",
        "./a/../b",
        "/p/%7e",
        "#top",
        "mailto:x",
        "//o.test/",
        "/p?",
        "/a/.b",
        None,
        "",
    ]
    many = r.resolve_many(list(hrefs))
    for href, joined in zip(hrefs, many, strict=True):
        one = native.plain_join(r.origin, r._dir, r._dir_root, href)
        assert one == joined
        if joined is not None:
            assert joined == normalise(href, base)
    assert many[:7] == [
        "http://shop.test/p/1",
        "http://shop.test/p/1",
        "http://shop.test/p/1",
        "http://shop.test/p/1",
        "http://shop.test/p/1",
        "http://shop.test/q?a=1&b=c",
        "http://shop.test/?.",
    ]
    assert many[8:] == [None] * 8
    with pytest.raises(ValueError, match="start with origin"):
        native.plain_join("http://a.test", "http://b.test/", 15, "/x")
    with pytest.raises(TypeError):
        native.plain_join_many("http://a.test", "http://a.test/", 15, ("/x",))


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


@pytest.mark.parametrize("native", [True, False])
def test_common_links_take_the_fast_path(monkeypatch: pytest.MonkeyPatch, native: bool) -> None:
    """The plain forms never reach the URL parser (otherwise the property above is vacuous)."""
    if native and url_mod._native is None:
        pytest.skip("idemcrawl._links not built")
    if not native:
        monkeypatch.setattr(url_mod, "_native", None)
    r = Resolver("http://shop.test/p/5")

    def no_parser(*_args: object) -> str:
        raise AssertionError("took the slow path")

    monkeypatch.setattr(url_mod, "normalise", no_parser)
    for href in ["/p/1", "1", "./1", "../p/1", "http://shop.test/p/1#x", "/q?a=1&b=c", "tags/1"]:
        assert r.resolve(href).startswith("http://shop.test/")
    with pytest.raises(AssertionError):
        r.resolve("/p/%7e")
