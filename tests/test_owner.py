"""Owner slots: removing those of a crawl that is gone (``owner.forget``)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from idemcrawl import owner

DSN = "postgresql://127.0.0.1/test?schema=gone"


@pytest.fixture(autouse=True)
def _tmpdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))


def test_forget_removes_free_slots_and_their_directory() -> None:
    for _ in range(2):
        owner.acquire(DSN).close()  # a crawl that ran and exited
    first, second = owner.acquire(DSN), owner.acquire(DSN)
    first.close()
    second.close()
    directory = owner.lock_dir_for(DSN)
    assert sorted(os.listdir(directory)) == ["slot-0.lock", "slot-1.lock"]
    assert owner.forget(DSN) is True
    assert not os.path.exists(directory)


def test_forget_keeps_a_slot_a_live_process_holds() -> None:
    held, free = owner.acquire(DSN), owner.acquire(DSN)
    free.close()
    directory = owner.lock_dir_for(DSN)
    assert owner.forget(DSN) is False
    assert os.listdir(directory) == [os.path.basename(held.path)]
    again = owner.acquire(DSN)
    assert again.owner == free.owner  # the freed slot is taken again, not a third one
    again.close()
    held.close()


def test_forget_of_a_crawl_without_slots_is_a_no_op(tmp_path: Path) -> None:
    assert owner.forget(DSN) is False
    sqlite = str(tmp_path / "crawl.db")
    assert owner.lock_dir_for(sqlite) == sqlite + ".owners"
    owner.acquire(sqlite).close()
    assert owner.forget(sqlite) is True
    assert not os.path.exists(sqlite + ".owners")
