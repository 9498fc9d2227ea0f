"""Tests for idemcrawl.url: normalisation, idempotence, host keys and scoping."""

from __future__ import annotations

import hashlib

import pytest

from idemcrawl.url import (
    MAX_URL_LENGTH,
    InvalidURL,
    host_key,
    hostname,
    in_scope,
    normalise,
    same_site,
    url_fingerprint,
)

BASE = "http://a.example/b/c/d;p?q"


# --- resolution -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ref", "expected"),
    [
        ("../g", "http://a.example/b/g"),
        ("../../g", "http://a.example/g"),
        ("../../../../g", "http://a.example/g"),
        ("./g", "http://a.example/b/c/g"),
        ("g/./h/../i", "http://a.example/b/c/g/i"),
        ("/abs/path", "http://a.example/abs/path"),
        ("//other.example/path", "http://other.example/path"),
        ("//Other.Example:80", "http://other.example/"),
        ("?y=1", "http://a.example/b/c/d;p?y=1"),
        ("#frag", "http://a.example/b/c/d;p?q"),
        ("", "http://a.example/b/c/d;p?q"),
        ("https://x.example/", "https://x.example/"),
    ],
)
def test_relative_resolution(ref: str, expected: str) -> None:
    assert normalise(ref, BASE) == expected


def test_protocol_relative_keeps_base_scheme() -> None:
    assert normalise("//cdn.example/x.js", "https://a.example/") == "https://cdn.example/x.js"


def test_base_fragment_not_inherited() -> None:
    assert normalise("", "http://a.example/p#top") == "http://a.example/p"


def test_relative_without_base_rejected() -> None:
    with pytest.raises(InvalidURL, match="relative"):
        normalise("/just/a/path")
    with pytest.raises(InvalidURL):
        normalise("../g")


# --- authority --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("http://a.example:80/x", "http://a.example/x"),
        ("https://a.example:443/x", "https://a.example/x"),
        ("http://a.example:443/x", "http://a.example:443/x"),
        ("https://a.example:80/x", "https://a.example:80/x"),
        ("http://a.example:8080/x", "http://a.example:8080/x"),
        ("http://a.example:080/x", "http://a.example/x"),
    ],
)
def test_ports(url: str, expected: str) -> None:
    assert normalise(url) == expected


def test_scheme_and_host_lowercased_but_path_not() -> None:
    assert normalise("HTTPS://WWW.Example.COM/Path/To") == "https://www.example.com/Path/To"


def test_idn_host_punycoded() -> None:
    assert normalise("http://Bücher.example/") == "http://xn--bcher-kva.example/"


def test_trailing_dot_host_stripped() -> None:
    assert normalise("http://example.com./a") == "http://example.com/a"
    assert normalise("http://example.com.:8080/a") == "http://example.com:8080/a"


@pytest.mark.parametrize("url", ["http://a..b/", "http://.a/", "http://a../", "http://./"])
def test_empty_host_labels_rejected(url: str) -> None:
    with pytest.raises(InvalidURL):
        normalise(url)


def test_empty_path_becomes_slash() -> None:
    assert normalise("http://a.example") == "http://a.example/"
    assert normalise("http://a.example?x=1") == "http://a.example/?x=1"


def test_ipv6_literal() -> None:
    assert normalise("http://[0:0::1]:8080/x") == "http://[::1]:8080/x"


def test_ipv4_literal_canonicalised() -> None:
    assert normalise("http://0x7f.1/") == "http://127.0.0.1/"


# --- path and query ---------------------------------------------------------------------------


def test_dot_segments_removed() -> None:
    assert normalise("http://a.example/a/./b/../c/%2E%2e/d") == "http://a.example/a/d"


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("http://h.example/%7e", "http://h.example/~"),
        ("http://h.example/%7E%41%2d%2E%5f%30", "http://h.example/~A-._0"),
        ("http://h.example/a%2fb", "http://h.example/a%2Fb"),
        ("http://h.example/%c3%a4", "http://h.example/%C3%A4"),
        ("http://h.example/ä", "http://h.example/%C3%A4"),
        ("http://h.example/%25", "http://h.example/%25"),
        ("http://h.example/%zz", "http://h.example/%zz"),
        ("http://h.example/?q=%7e%2f%3d", "http://h.example/?q=~%2F%3D"),
        ("http://h.example/?%c3%a4=%C3%A4", "http://h.example/?%C3%A4=%C3%A4"),
    ],
)
def test_percent_encoding_consistent(url: str, expected: str) -> None:
    assert normalise(url) == expected


def test_stray_percent_not_merged_into_new_escape() -> None:
    # Decoding %34 and %31 would create "%41", which a second pass would turn into "A".
    assert normalise("http://h.example/%%34%31") == "http://h.example/%%341"
    assert normalise("http://h.example/%4%31") == "http://h.example/%4%31"


def test_spaces_encoded() -> None:
    assert normalise("http://h.example/a b?c d") == "http://h.example/a%20b?c%20d"


def test_surrounding_whitespace_stripped() -> None:
    assert normalise("  \thttp://h.example/a\n ") == "http://h.example/a"
    assert normalise(" ../x ", "http://h.example/a/b") == "http://h.example/x"


def test_query_order_and_duplicates_preserved() -> None:
    assert normalise("http://h.example/p?b=2&a=1&b=1") == "http://h.example/p?b=2&a=1&b=1"
    assert normalise("http://h.example/p?a=&&b") == "http://h.example/p?a=&&b"


def test_fragment_dropped() -> None:
    assert normalise("http://h.example/p?q=1#section-2") == "http://h.example/p?q=1"
    assert normalise("http://h.example/p#a#b") == "http://h.example/p"


def test_empty_query_dropped_but_nonempty_kept() -> None:
    assert normalise("http://h.example/p?") == "http://h.example/p"
    assert normalise("http://h.example/p?#x") == "http://h.example/p"
    assert normalise("http://h.example/p??") == "http://h.example/p??"
    assert normalise("http://h.example/p?a?") == "http://h.example/p?a?"


# --- idempotence ------------------------------------------------------------------------------

TRICKY = [
    "HTTP://User@Example.COM:80/a/../b/./c?x=%7e#frag",
    "http://Bücher.example./Straße?ä=ö",
    "https://a.example:443",
    "http://a.example:8080",
    "http://[::1]:8080/x",
    "http://[2001:DB8::1]/",
    "http://h.example/%7e%2f%c3%a4?q=%7e%2f%41",
    "http://h.example/%%34%31",
    "http://h.example/%4%31%7e",
    "http://h.example/%zz%",
    "http://h.example/a b/c\td?e f",
    "http://h.example/?",
    "http://h.example/p??",
    "http://h.example/'\"<>`{}|^?'\"<>`{}|^",
    "http://h.example/%2e%2E/x/.%2e/y",
    "http://h.example/a\\b\\..\\c",
    "http://h.example:0/",
    "http://0x7f.1/",
    "http://%41.example/",
    "https://x.co.uk./a;b=c?d=e&f",
    "http://h.example/\u00a0",
    "http://@h.example/",
]


@pytest.mark.parametrize("url", TRICKY)
def test_idempotent(url: str) -> None:
    if "User@" in url:
        with pytest.raises(InvalidURL):
            normalise(url)
        return
    once = normalise(url)
    assert normalise(once) == once
    assert normalise(once, "http://unrelated.example/x") == once


@pytest.mark.parametrize("url", TRICKY)
def test_output_shape(url: str) -> None:
    try:
        out = normalise(url)
    except InvalidURL:
        return
    assert out.startswith(("http://", "https://"))
    assert "#" not in out
    assert out.isascii()
    assert host_key(out) + "/" == out[: len(host_key(out)) + 1]


# --- rejections -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("mailto:someone@example.com", "scheme"),
        ("javascript:void(0)", "scheme"),
        ("data:text/plain,hi", "scheme"),
        ("ftp://files.example/x", "scheme"),
        ("file:///etc/passwd", "scheme"),
        ("", "relative"),
        ("   ", "relative"),
        ("http://", "valid"),
        ("http://user:pw@host.example/", "credentials"),
        ("http://user@host.example/", "credentials"),
        ("http://:pw@host.example/", "credentials"),
        ("http://exa mple.com/", "valid"),
    ],
)
def test_rejections(url: str, reason: str) -> None:
    with pytest.raises(InvalidURL, match=reason) as info:
        normalise(url)
    assert isinstance(info.value, ValueError)


def test_relative_non_http_rejected_even_with_base() -> None:
    with pytest.raises(InvalidURL, match="mailto"):
        normalise("mailto:x@y.example", "http://a.example/")
    with pytest.raises(InvalidURL, match="javascript"):
        normalise("javascript:alert(1)", "http://a.example/")


def test_too_long_rejected() -> None:
    ok = "http://h.example/" + "a" * (MAX_URL_LENGTH - len("http://h.example/"))
    assert normalise(ok) == ok
    with pytest.raises(InvalidURL, match="longer"):
        normalise(ok + "a")


def test_too_long_after_encoding_rejected() -> None:
    url = "http://h.example/" + "ä" * (MAX_URL_LENGTH // 2)
    with pytest.raises(InvalidURL, match="longer"):
        normalise(url)


def test_invalid_url_message_truncated() -> None:
    url = "mailto:" + "x" * 5_000
    with pytest.raises(InvalidURL) as info:
        normalise(url)
    message = str(info.value)
    assert "mailto:xxx" in message
    assert "scheme" in message
    assert len(message) < 400
    assert info.value.reason.startswith("unsupported scheme")


# --- host_key / hostname ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "key", "host"),
    [
        ("http://[::1]:8080/x", "http://[::1]:8080", "::1"),
        ("https://a.example:443/x", "https://a.example", "a.example"),
        ("http://a.example:8080/x?y", "http://a.example:8080", "a.example"),
        ("https://A.Example/", "https://a.example", "a.example"),
        ("http://127.0.0.1:81/", "http://127.0.0.1:81", "127.0.0.1"),
        ("http://[2001:db8::1]/", "http://[2001:db8::1]", "2001:db8::1"),
    ],
)
def test_host_key_and_hostname(url: str, key: str, host: str) -> None:
    normalised = normalise(url)
    assert host_key(normalised) == key
    assert hostname(normalised) == host
    assert hostname(key) == host


def test_host_key_requires_http() -> None:
    with pytest.raises(InvalidURL):
        host_key("ftp://a.example/")


# --- fingerprint ------------------------------------------------------------------------------


def test_fingerprint() -> None:
    url = "https://a.example/p?q=1"
    fp = url_fingerprint(url)
    assert isinstance(fp, bytes)
    assert len(fp) == 16
    assert fp == hashlib.blake2b(url.encode(), digest_size=16).digest()
    assert fp == url_fingerprint(normalise("HTTPS://A.example:443/p?q=1#x"))
    assert fp != url_fingerprint("https://a.example/p?q=2")


# --- same_site / in_scope ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        ("a.example.com", "b.example.com", True),
        ("example.com", "www.example.com", True),
        ("example.com", "example.com", True),
        ("example.com", "example.org", False),
        ("x.co.uk", "y.co.uk", False),
        ("a.b.co.uk", "c.b.co.uk", True),
        ("b.co.uk", "www.b.co.uk", True),
        ("a.example.com.au", "b.example.com.au", True),
        ("x.com.au", "y.com.au", False),
        ("a.co.example", "b.co.example", True),  # not a ccTLD: last two labels
        ("127.0.0.1", "127.0.0.1", True),
        ("127.0.0.1", "10.0.0.1", False),
        ("1.0.0.1", "2.0.0.1", False),
        ("::1", "[::1]", True),
        ("::1", "::2", False),
        ("localhost", "localhost", True),
        ("com", "example.com", False),
    ],
)
def test_same_site(a: str, b: str, expected: bool) -> None:
    assert same_site(a, b) is expected
    assert same_site(b, a) is expected


SEEDS = frozenset({"https://www.example.com", "http://other.example:8080"})


@pytest.mark.parametrize(
    ("url", "host", "domain"),
    [
        ("https://www.example.com/a", True, True),
        ("http://www.example.com/a", False, True),
        ("https://www.example.com:8443/a", False, True),
        ("https://blog.example.com/a", False, True),
        ("http://other.example:8080/x", True, True),
        ("http://other.example/x", False, True),
        ("https://example.org/", False, False),
        ("https://example.com.evil.example/", False, False),
    ],
)
def test_in_scope(url: str, host: bool, domain: bool) -> None:
    assert in_scope(url, SEEDS, "host") is host
    assert in_scope(url, SEEDS, "domain") is domain
    assert in_scope(url, SEEDS, "any") is True


def test_in_scope_ip_seed() -> None:
    seeds = frozenset({"http://127.0.0.1:8000"})
    assert in_scope("http://127.0.0.1:9000/", seeds, "domain")
    assert not in_scope("http://127.0.0.2:8000/", seeds, "domain")
    assert not in_scope("http://127.0.0.1:9000/", seeds, "host")


def test_in_scope_unknown_mode() -> None:
    with pytest.raises(ValueError, match="mode"):
        in_scope("https://www.example.com/", SEEDS, "subdomain")
    with pytest.raises(ValueError):
        in_scope("https://www.example.com/", SEEDS, "")


@pytest.mark.parametrize(
    "alias",
    [
        "http://Example.COM/",
        "http://example.com./",
        "http://%65xample.com/",
        "http://example.com:80/",
        "HTTP://EXAMPLE.com:80/x",
    ],
)
def test_host_aliases_share_one_host_key(alias: str) -> None:
    """R8b: aliases of one host share one politeness budget and one robots entry."""
    assert host_key(normalise(alias)) == "http://example.com"


@pytest.mark.parametrize(
    "alias",
    ["http://bücher.example/", "http://xn--bcher-kva.example/", "http://B%C3%BCcher.example/"],
)
def test_idn_aliases_share_one_host_key(alias: str) -> None:
    assert host_key(normalise(alias)) == "http://xn--bcher-kva.example"
