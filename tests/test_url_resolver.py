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


_HOST_PIECES = [
    "a", "z", "0", "1", "9", "25", "255", "256", "01", "0x1", "-", "xn--", "xN--", "A", ".",
    "127.0.0.1", "1.2.3", "é", "_", "@", "[::1]",
]  # fmt: skip
host_texts = st.lists(
    st.sampled_from(_HOST_PIECES) | st.text("az09-.", max_size=3), min_size=1, max_size=6
).map("".join)
port_texts = st.sampled_from(
    ["", ":", ":80", ":443", ":0", ":08", ":8080", ":65535", ":65536", ":99999", ":1a", ":+1"]
)
schemes = st.sampled_from(["http://", "https://", "HTTP://", "http:/", "ftp://", "http:///"])


@settings(max_examples=3000, deadline=None)
@given(schemes, host_texts, port_texts, hrefs)
@example("http://", "127.0.0.2", ":9", "/partner")
@example("https://", "a.test", ":443", "/x")
@example("http://", "a.test", "", "/x#y")
@example("http://", "1.2.3.04", "", "/")
@example("http://", "a" * 70 + ".test", "", "/")  # DNS limits are not the URL parser's
@example("http://", ".".join(["b" * 60] * 6), ":65535", "/x")
@example("http://", "a.test", "", "/" + "x" * 8200)  # too long
@pytest.mark.slow
def test_normal_absolute_equals_normalise(scheme: str, host: str, port: str, rest: str) -> None:
    """An absolute URL taken without the URL parser is exactly what normalise returns for it,
    as a link of any page (whatever the base) or a base; C and Python take the same ones."""
    href = scheme + host + port + rest
    expected = outcome(normalise, href)
    fast = url_mod._normal_absolute(href)
    assert fast is None or fast == expected
    if url_mod._native is not None:
        assert url_mod._native.normal_absolute(href) == fast
    for base in BASES[:3]:
        r = Resolver(base)
        assert outcome(r.resolve, href) == outcome(lambda h, b=base: normalise(h, b), href)
        assert outcome(r._resolve_py, href) == outcome(r.resolve, href)
    r = Resolver(href)  # a base: the fast paths are on exactly when normalise keeps it
    assert bool(r.origin) == (expected == href)


@pytest.mark.parametrize("native", [True, False])
def test_plain_absolute_links_skip_the_parser(
    monkeypatch: pytest.MonkeyPatch, native: bool
) -> None:
    """Links to other hosts and plain bases in normal form never reach the URL parser."""
    if native and url_mod._native is None:
        pytest.skip("idemcrawl._links not built")
    if not native:
        monkeypatch.setattr(url_mod, "_native", None)

    def no_parser(*_args: object) -> str:
        raise AssertionError("took the slow path")

    monkeypatch.setattr(url_mod, "normalise", no_parser)
    r = Resolver("http://127.0.0.1:40000/p/5")
    assert r.origin == "http://127.0.0.1:40000"
    assert r.resolve("http://127.0.0.1:40002/p/315#x") == "http://127.0.0.1:40002/p/315"
    assert r.resolve("https://shop.test:8443/a?b=1") == "https://shop.test:8443/a?b=1"
    for slow in ("http://Shop.test/", "http://shop.test:80/", "http://127.1/", "http://x.test"):
        with pytest.raises(AssertionError):
            r.resolve(slow)
    if native:  # plain_join_many keeps to the page's origin: its answers' host key is it
        many = r.resolve_many(["http://127.0.0.1:40002/p/1", "/p/1"])
        assert many == [None, "http://127.0.0.1:40000/p/1"]
