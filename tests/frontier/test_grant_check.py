"""The grant's own check on the SQL backends: a grant counts the URLs it moves from queued to
leased into their hosts itself (I6), so a grant that finds one of its URLs no longer queued
fails whole instead of writing counts that would be wrong."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from idemcrawl.frontier.base import FrontierError, HostPolicy, NewURL
from idemcrawl.frontier.store import Grant

from .conftest import open_backend, queued_and_leased_by_host

T0 = 1_000_000.0
FAST = HostPolicy(max_in_flight=8, delay=0.0)


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_a_grant_of_a_url_that_is_not_queued_is_rolled_back_whole(
    backend: str, tmp_path: Path
) -> None:
    f = open_backend(backend, tmp_path)
    try:
        f.add([NewURL(f"http://a/p{i}", "http://a") for i in range(3)], T0)
        (lease,) = f.lease("w", 1, T0, 30, FAST)
        before = f.stats().urls_by_state
        log_before = f._run(lambda s: s.audit_facts(), write=False)  # type: ignore[attr-defined]
        # The leased URL granted again, beside a queued one: the grant must not half happen.
        queued = next(r for r in f.url_rows() if r["state"] == "queued")  # type: ignore[attr-defined]
        other = dataclasses.replace(lease, url_id=queued["url_id"], url=queued["url"])
        grant = Grant(lease.host_key, [other, lease], 0.0, 8, 1, T0, "", 0)
        with pytest.raises(FrontierError) as err:
            f._run(lambda s: s.grant([grant], "w", T0 + 1, T0 + 31))  # type: ignore[attr-defined]
        text = str(err.value)
        if backend == "postgres":
            assert text == (
                "PostgreSQL error: a grant found 1 of its 2 URLs queued; its counts would be "
                "wrong, so the transaction is rolled back"
            )
        else:
            assert text == "granted 1 URLs, expected 2: rolled back"
        assert f.stats().urls_by_state == before
        counted, kept = queued_and_leased_by_host(f)  # type: ignore[arg-type]
        assert counted == kept == {"http://a": [2, 1]}
        assert f._run(lambda s: s.audit_facts(), write=False) == log_before  # type: ignore[attr-defined]
        # The frontier goes on: the other two URLs are still granted normally.
        assert len(f.lease("w", 5, T0 + 2, 30, FAST)) == 2
    finally:
        f.close()
