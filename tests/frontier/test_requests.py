"""Requests as data (I11 of ``idemcrawl.frontier.base``), for every backend: a URL's method,
headers, body, callback and context are stored with it and come back on every lease."""

from __future__ import annotations

import pytest

from idemcrawl.frontier.base import (
    Completion,
    Failure,
    Frontier,
    HostPolicy,
    NewURL,
    Reparsed,
    RequestSpec,
    request_key,
    request_url,
)

T0 = 1_000_000.0
FAST = HostPolicy(max_in_flight=8, delay=0.0)
H = "http://a"

ITEM = RequestSpec(callback="parse_item", data='{"category":"books","rank":3}')
#: A plain GET for ``parse`` whose only difference is that it is rendered: it needs a row too.
RENDERED = RequestSpec(render=True)
SEARCH = RequestSpec(
    method="POST",
    callback="parse_results",
    data='{"q":"tea"}',
    headers='[["Content-Type","application/x-www-form-urlencoded"]]',
    body=b"q=tea&page=1\x00\xff",
)


def test_request_key_keeps_get_identity_and_separates_bodies() -> None:
    url = "http://a/search"
    assert request_key(url) == url
    assert request_key(url, "GET", b"") == url
    post = request_key(url, "POST", b"q=tea")
    assert post.startswith(url + "#POST:") and request_url(post) == url
    assert request_key(url, "POST", b"q=tea") == post
    assert request_key(url, "POST", b"q=coffee") != post
    assert request_key(url, "PUT", b"q=tea") != post
    assert request_key(url, "POST", b"") != url


def test_spec_comes_back_on_the_lease(frontier: Frontier) -> None:
    post = request_key(f"{H}/search", "POST", SEARCH.body)
    assert (
        frontier.add(
            [
                NewURL(f"{H}/plain", H),
                NewURL(f"{H}/item/1", H, request=ITEM),
                NewURL(post, H, request=SEARCH),
                NewURL(f"{H}/js", H, request=RENDERED),
            ],
            T0,
        )
        == 4
    )
    leases = {ls.url: ls for ls in frontier.lease("w", 10, T0, 30, FAST)}
    assert leases[f"{H}/plain"].request is None
    assert leases[f"{H}/item/1"].request == ITEM
    assert leases[post].request == SEARCH
    assert leases[f"{H}/js"].request == RENDERED and not ITEM.render
    assert leases[post].fetch_url == f"{H}/search"
    assert leases[post].request.header_pairs() == [
        ("Content-Type", "application/x-www-form-urlencoded")
    ]


def test_first_request_for_a_key_wins(frontier: Frontier) -> None:
    other = RequestSpec(callback="parse_other", data='{"x":1}')
    # Known first without a spec: it never gains one.
    frontier.add([NewURL(f"{H}/p", H)], T0)
    assert frontier.add([NewURL(f"{H}/p", H, request=ITEM)], T0) == 0
    # Known with a spec: a later spec does not replace it.
    frontier.add([NewURL(f"{H}/q", H, request=ITEM)], T0)
    frontier.add([NewURL(f"{H}/q", H, request=other)], T0)
    # Within one batch too: the first occurrence decides.
    frontier.add([NewURL(f"{H}/r", H), NewURL(f"{H}/r", H, request=other)], T0)
    frontier.add([NewURL(f"{H}/s", H, request=other), NewURL(f"{H}/s", H, request=ITEM)], T0)
    got = {ls.url: ls.request for ls in frontier.lease("w", 10, T0, 30, FAST)}
    assert got == {f"{H}/p": None, f"{H}/q": ITEM, f"{H}/r": None, f"{H}/s": other}


def test_spec_survives_reopen_retry_expiry_and_rounds(frontier: Frontier, reopen) -> None:  # type: ignore[no-untyped-def]
    frontier.add([NewURL(f"{H}/item/1", H, request=ITEM)], T0)
    (ls,) = frontier.lease("w", 1, T0, 30, FAST)
    # A failure with a retry: the next lease carries the same spec.
    assert frontier.fail([Failure(ls, "HTTP 503", T0 + 1)], T0, FAST) == [True]
    (ls,) = frontier.lease("w", 1, T0 + 2, 30, FAST)
    assert ls.request == ITEM
    # The lease expires (its owner died): another handle leases it with the spec.
    other = reopen()
    try:
        (ls2,) = other.lease("x", 1, T0 + 100, 30, FAST)
        assert ls2.request == ITEM and ls2.attempts == ls.attempts
        done = Completion(ls2, 200, T0 + 101, next_fetch_at=T0 + 200)
        assert other.complete([done], T0 + 101, FAST) == [True]
        # A new round of the URL (recrawl) is fetched the same way.
        assert other.reschedule_due(T0 + 300, 10) == 1
        (ls3,) = other.lease("x", 1, T0 + 300, 30, FAST)
        assert ls3.version == 2 and ls3.request == ITEM
    finally:
        other.close()


def test_links_of_a_completion_and_a_reparse_keep_their_specs(frontier: Frontier) -> None:
    frontier.add([NewURL(f"{H}/list", H)], T0)
    (ls,) = frontier.lease("w", 1, T0, 30, FAST)
    post = request_key(f"{H}/search", "POST", SEARCH.body)
    links = [NewURL(f"{H}/item/1", H, request=ITEM), NewURL(post, H, request=SEARCH)]
    assert frontier.complete([Completion(ls, 200, T0, links=links)], T0, FAST) == [True]
    frontier.apply_reparse(
        [Reparsed(ls.url_id, ls.url, links=[NewURL(f"{H}/item/2", H, request=ITEM)])], T0
    )
    got = {x.url: x.request for x in frontier.lease("w", 10, T0 + 1, 30, FAST)}
    assert got == {f"{H}/item/1": ITEM, post: SEARCH, f"{H}/item/2": ITEM}


@pytest.mark.parametrize("n", [1, 1200])
def test_many_specs_in_one_batch(frontier: Frontier, n: int) -> None:
    """More specs than SQLite's parameter limit per statement (``requests_of`` chunks)."""
    batch = [
        NewURL(f"{H}/i/{i}", H, request=RequestSpec(callback="parse_item", data=f'{{"i":{i}}}'))
        for i in range(n)
    ]
    assert frontier.add(batch, T0) == n
    leases = frontier.lease("w", n, T0, 30, HostPolicy(max_in_flight=n, delay=0.0))
    assert len(leases) == n
    assert all(ls.request is not None and ls.request.data == f'{{"i":{ls.url[len(H) + 3 :]}}}'
               for ls in leases)  # fmt: skip


def test_cookies_commit_with_their_completion_only(frontier: Frontier, reopen) -> None:  # type: ignore[no-untyped-def]
    from idemcrawl.frontier.base import Cookie

    frontier.add([NewURL(f"{H}/login", H), NewURL(f"{H}/other", H)], T0)
    a, b = frontier.lease("w", 2, T0, 30, FAST)
    session = Cookie("a", "/", "session", "s1", T0 + 3600)
    ok = frontier.complete([Completion(a, 302, T0, cookies=[session])], T0, FAST)
    assert ok == [True]
    # A completion that is not accepted (stale lease) writes no cookie.
    stale = Completion(a, 200, T0, cookies=[Cookie("a", "/", "evil", "1")])
    assert frontier.complete([stale], T0, FAST) == [False]
    other = reopen()
    try:
        assert other.cookies(T0 + 1) == [session]
        # A newer value replaces it; an expired one deletes it; expiry hides it.
        nonce = Cookie("a", "/", "nonce", "n")
        renewed = Cookie("a", "/", "session", "s2", T0 + 7200)
        done = Completion(b, 200, T0 + 1, cookies=[nonce, renewed])
        assert other.complete([done], T0 + 1, FAST) == [True]
        assert frontier.cookies(T0 + 2) == [nonce, renewed]
        assert frontier.cookies(T0 + 7200) == [nonce]
    finally:
        other.close()
    frontier.add([NewURL(f"{H}/logout", H)], T0 + 3)
    (c,) = frontier.lease("w", 1, T0 + 3, 30, FAST)
    gone = Cookie("a", "/", "nonce", "", T0)
    assert frontier.complete([Completion(c, 200, T0 + 3, cookies=[gone])], T0 + 3, FAST) == [True]
    assert [k.name for k in frontier.cookies(T0 + 3)] == ["session"]
