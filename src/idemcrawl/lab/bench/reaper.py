"""Process-tree helpers the benchmark launchers share (``bench crawl``'s timed runs and its
instruction counts): both must see every process a tool starts exit, grandchildren included."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import time
from typing import Final

#: prctl option that makes orphaned descendants re-parent to this process (Linux).
_PR_SET_CHILD_SUBREAPER: Final = 36


def set_subreaper() -> bool:
    """Become a child subreaper (Linux), so orphaned descendants are re-parented to us."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def killpg(pgid: int) -> None:
    """SIGKILL a process group that may already be gone."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def reap_descendants(pgid: int, grace: float, poll: float) -> bool:
    """Wait for every child (re-parented descendants too, as a subreaper) until none is left.

    Their CPU time joins ``RUSAGE_CHILDREN`` only once they are waited for. One still running
    ``grace`` seconds on is killed with the process group ``pgid``, and if even that does not
    end it within 5 s the wait stops rather than hang. Returns whether the group was killed.
    """
    deadline, killed = time.monotonic() + grace, False
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return killed
        if pid == 0:
            if time.monotonic() > deadline:
                if killed:
                    return killed
                killpg(pgid)
                deadline, killed = time.monotonic() + 5.0, True
            time.sleep(poll)
