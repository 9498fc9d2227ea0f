"""Who holds a lease: a stable owner id per crawl process, and detection of dead local owners.

Leases already make a crash harmless (R4): a dead worker's leases expire by themselves. Waiting
for them is wasted time when the dead process ran on this very machine, so each process holds an
exclusive ``flock`` on one slot file next to the crawl. The kernel drops the lock the instant the
process dies (SIGKILL included), so a slot file we can lock belongs to a dead owner, and its
leases can be returned at once instead of after ``lease_seconds``. Owners on other machines are
never touched: for them the lease expiry is the only signal.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass, field

MAX_SLOTS = 256


def _host() -> str:
    return socket.gethostname() or "localhost"


def lock_dir_for(crawl_identity: str) -> str:
    """Where slot files live: beside an SQLite file, or under the temp dir for a server DSN or
    an in-memory crawl (``memory:``, whose name is not a path)."""
    if "://" not in crawl_identity and not crawl_identity.startswith("memory:"):
        return os.path.abspath(crawl_identity) + ".owners"
    digest = hashlib.blake2b(crawl_identity.encode(), digest_size=8).hexdigest()
    return os.path.join(os.environ.get("TMPDIR", "/tmp"), f"idemcrawl-owners-{digest}")


@dataclass
class OwnerSlot:
    """An owner id whose slot file stays locked for as long as this process lives."""

    owner: str
    path: str
    _fd: int = field(repr=False, default=-1)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def _try_lock(path: str) -> int:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return -1
    return fd


def acquire(crawl_identity: str) -> OwnerSlot:
    """Take the first free slot; its previous holder (if any) is dead."""
    directory = lock_dir_for(crawl_identity)
    os.makedirs(directory, exist_ok=True)
    for slot in range(MAX_SLOTS):
        path = os.path.join(directory, f"slot-{slot}.lock")
        fd = _try_lock(path)
        if fd >= 0:
            return OwnerSlot(f"{_host()}/{slot}", path, fd)
    raise RuntimeError(f"more than {MAX_SLOTS} crawl processes on {crawl_identity}")


def forget(crawl_identity: str) -> bool:
    """Remove the slot files of a crawl that is gone (its schema or file deleted), and their
    directory; returns whether the directory went.

    A server crawl's slots live in the temp directory, which nothing else cleans: a benchmark or
    chaos run that drops its schema would otherwise leave one directory per run behind (74 on
    a machine after a day of runs). Only slots no process holds are removed, and the directory
    only when it is then empty: a crawl still running on the name keeps its own slot, and the
    caller must not start a new one on it meanwhile (a file unlinked while another process
    opens it would give two processes one owner id).
    """
    directory = lock_dir_for(crawl_identity)
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return False
    for name in names:
        path = os.path.join(directory, name)
        if not (name.startswith("slot-") and name.endswith(".lock")):
            continue
        fd = _try_lock(path)
        if fd < 0:
            continue  # held: that crawl is alive
        try:
            os.unlink(path)
        finally:
            os.close(fd)
    try:
        os.rmdir(directory)
    except OSError:
        return False
    return True


def reclaim_dead_local_owners(
    crawl_identity: str, owners: list[str], me: str, release: Callable[[str], int]
) -> int:
    """Return the leases of owners that ran on this machine and are gone.

    The dead owner's slot stays locked by us while its leases are released, so a process starting
    right now cannot take that owner id and have its fresh leases released under it.
    """
    directory = lock_dir_for(crawl_identity)
    prefix = _host() + "/"
    released = 0
    for owner in owners:
        if owner == me or not owner.startswith(prefix):
            continue
        slot = owner[len(prefix) :]
        if not slot.isdigit():
            continue
        fd = _try_lock(os.path.join(directory, f"slot-{slot}.lock"))
        if fd < 0:
            continue  # alive
        try:
            released += release(owner)
        finally:
            os.close(fd)
    return released
