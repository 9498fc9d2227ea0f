"""Process-tree helpers the benchmark launchers share (``bench crawl``'s timed runs and its
instruction counts): both must see every process a tool starts exit, grandchildren included."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
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
