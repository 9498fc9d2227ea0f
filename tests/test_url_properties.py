"""Property-based tests of URL normalisation (hypothesis): idempotent, faithful, never crashes."""

from __future__ import annotations

import re
import string

import ada_url
from hypothesis import given, settings
from hypothesis import strategies as st

from idemcrawl.url import InvalidURL, host_key, normalise

_UNRESERVED = set(string.ascii_letters + string.digits + "-._~")


def _decode_unreserved(s: str) -> str:
    """What RFC 3986 6.2.2.2 says is equivalent: %XX of an unreserved char == the char."""

    def sub(m: re.Match[str]) -> str:
        ch = chr(int(m.group(1), 16))
        return ch if ch in _UNRESERVED else "%" + m.group(1).upper()

    return re.sub(r"%([0-9A-Fa-f]{2})", sub, s)


label = st.text(alphabet=string.ascii_lowercase + string.digits, min_size=1, max_size=8)
hosts = st.lists(label, min_size=1, max_size=3).map(lambda xs: ".".join([*xs, "test"]))
segment = st.text(
    alphabet=string.ascii_letters + string.digits + "-._~!$&'()*+,;=:@%/ äé", max_size=12
)
query = st.text(alphabet=string.ascii_letters + string.digits + "=&%+-._~ ?", max_size=20)
urls = st.builds(
    lambda scheme, host, port, path, q, frag: (
        f"{scheme}://{host}{port}/{path}"
        + (f"?{q}" if q is not None else "")
        + (f"#{frag}" if frag is not None else "")
    ),
    st.sampled_from(["http", "https", "HTTP", "hTtPs"]),
    hosts.map(lambda h: h.upper() if len(h) % 2 else h),
    st.sampled_from(["", ":80", ":443", ":8080"]),
    segment,
    st.none() | query,
    st.none() | st.text(max_size=5),
)


@settings(max_examples=400, deadline=None)
@given(urls)
def test_idempotent(u: str) -> None:
    try:
        once = normalise(u)
    except InvalidURL:
        return
    assert normalise(once) == once


@settings(max_examples=400, deadline=None)
@given(urls)
def test_requests_what_a_browser_would(u: str) -> None:
    """Same origin and, up to unreserved-character escapes, the same request target."""
    try:
        ours = normalise(u)
    except InvalidURL:
        return
    browser = ada_url.URL(u)  # the WHATWG parser browsers implement
    mine = ada_url.URL(ours)
    assert mine.protocol == browser.protocol
    assert mine.hostname == browser.hostname.rstrip(".")
    assert mine.port == browser.port
    target_browser = _decode_unreserved((browser.pathname or "/") + (browser.search or ""))
    target_mine = _decode_unreserved((mine.pathname or "/") + (mine.search or ""))
    assert target_mine == target_browser
    assert "#" not in ours
    assert host_key(ours) == ours[: len(host_key(ours))]


@settings(max_examples=600, deadline=None)
@given(st.text(max_size=60), st.none() | st.text(max_size=30))
def test_never_crashes_on_arbitrary_strings(u: str, base: str | None) -> None:
    try:
        out = normalise(u, base)
    except InvalidURL:
        return
    assert out.startswith(("http://", "https://"))
    assert normalise(out) == out


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=string.printable + "äé\u2028", max_size=40))
def test_relative_references_against_a_base(ref: str) -> None:
    try:
        out = normalise(ref, "http://base.test/a/b/c?q=1")
    except InvalidURL:
        return
    assert normalise(out) == out


def test_aliases_of_one_product_are_one_url_and_query_order_is_kept() -> None:
    base = "http://host.test/list/1"
    forms = ["/p/1", "/p/1#reviews", "/x/../p/1", "HTTP://Host.test:80/p/1", "./../p/1"]
    assert {normalise(f, base) for f in forms} == {"http://host.test/p/1"}
    assert normalise("/p/1?a=1&b=2", base) != normalise("/p/1?b=2&a=1", base)
