"""The crawl process's side of parsing: a pool of parser processes fed from the event loop.

:mod:`idemcrawl.parse` is what runs *inside* a parser process (the Page and Spider API, the
:class:`~idemcrawl.parse.Parser`, the worker loop); this module starts those processes (a fork
server that preloads only that module), sends them jobs over pipes read and written by the event
loop itself (no helper threads), and times them out. Kept apart so that a parser process never
imports asyncio or this pool.

A parser process is a plain ``python -c`` child (``subprocess``) with two pipes, not a
``multiprocessing`` worker: a fork server and multiprocessing's resource tracker were two more
interpreters in every crawl (29 + 12 MB of the crawl's 152 MB peak on the benchmark), for a
faster replacement of a worker that timed out, which is rare and already costs its timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import pickle
import struct
import subprocess
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from .parse import ParseJob, ParseResult

#: The framing of ``multiprocessing.Connection.send_bytes``/``recv_bytes``, which the worker
#: uses on its side of the pipes.
_LEN = struct.Struct("!i")
_BIG_LEN = struct.Struct("!Q")


def _frame(payload: bytes) -> bytes:
    n = len(payload)
    if n > 0x7FFFFFFF:
        return _LEN.pack(-1) + _BIG_LEN.pack(n) + payload
    return _LEN.pack(n) + payload


_READ_CHUNK = 1 << 18
PROCESS_DIED = "parser process died"


#: What a parser process runs: the parent's import path, then the worker loop of ``parse``.
_BOOT = (
    "import json, os, sys; sys.path[:] = json.loads(os.environ.pop('IDEMCRAWL_PARSER_PATH')); "
    "from idemcrawl.parse import worker_main; worker_main(int(sys.argv[1]), int(sys.argv[2]))"
)


@dataclass(eq=False)
class _PendingJob:
    payload: bytes
    future: asyncio.Future[ParseResult]
    timeout: float


@dataclass(eq=False)
class _Worker:
    proc: subprocess.Popen[bytes]
    rfd: int
    wfd: int
    pending: deque[_PendingJob] = field(default_factory=deque)
    inbuf: bytearray = field(default_factory=bytearray)
    #: Frames (or what is left of one) the job pipe has not taken yet, oldest first. A queue
    #: of views, not one bytearray: 16 pages (~240 KB) can wait here, and shifting a
    #: bytearray's tail after every partial write copied ~200 KB per page.
    outq: deque[memoryview] = field(default_factory=deque)
    timer: asyncio.TimerHandle | None = None
    dead: bool = False
    #: The worker said it finished starting (imports, spider); only then are jobs timed.
    ready: bool = False


class ParserPool:
    """``workers`` parser processes, each running :func:`init_worker` with ``initargs`` once.

    :meth:`parse` sends a job to the worker with the fewest jobs queued and waits for its
    result. A job that runs past its timeout, or whose worker dies (a crash, the memory cap of
    a process without memory to raise MemoryError), gets a :class:`ParseResult` with the
    error; that worker is replaced and the jobs queued behind it, which never started, go to
    the replacement. Use from one event loop.
    """

    def __init__(self, workers: int, initargs: tuple[Any, ...]) -> None:
        if workers < 1:
            raise ValueError(f"a parser pool needs at least one worker, got {workers}")
        self._n = workers
        self._initargs = pickle.dumps(initargs, pickle.HIGHEST_PROTOCOL)
        self._workers: list[_Worker] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False
        #: Workers replaced after a timeout or a death (for tests and the crawl summary).
        self.restarts = 0

    def start(self) -> None:
        """Start the processes now (otherwise the first :meth:`parse` does)."""
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        while len(self._workers) < self._n:
            self._workers.append(self._spawn())

    @property
    def pids(self) -> list[int]:
        return [w.proc.pid for w in self._workers]

    async def parse(self, job: ParseJob, timeout: float) -> ParseResult:
        if self._closed:
            raise RuntimeError("parser pool is closed")
        self.start()
        loop = self._loop
        assert loop is not None
        item = _PendingJob(
            pickle.dumps(job, pickle.HIGHEST_PROTOCOL), loop.create_future(), timeout
        )
        worker = min(self._workers, key=lambda w: len(w.pending))
        self._submit(worker, item)
        return await item.future

    def close(self, grace: float = 5.0) -> None:
        """Close the job pipes (workers finish their current page and exit); kill stragglers."""
        self._closed = True
        workers, self._workers = self._workers, []
        for w in workers:
            self._detach(w)
            for item in w.pending:
                if not item.future.done():
                    item.future.cancel()
            w.pending.clear()
        deadline = time.monotonic() + grace
        for w in workers:
            try:
                w.proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _kill(w.proc)

    # -- internals ------------------------------------------------------------------------------

    def _spawn(self) -> _Worker:
        jobs_r, wfd = os.pipe()
        rfd, results_w = os.pipe()
        env = {**os.environ, "IDEMCRAWL_PARSER_PATH": json.dumps(sys.path)}
        try:
            proc = subprocess.Popen(
                [sys.executable, "-c", _BOOT, str(jobs_r), str(results_w)],
                stdin=subprocess.DEVNULL,
                pass_fds=(jobs_r, results_w),
                env=env,
            )
        except BaseException:
            for fd in (rfd, wfd):
                os.close(fd)
            raise
        finally:
            os.close(jobs_r)  # the child has its own copies now
            os.close(results_w)
        os.set_blocking(rfd, False)
        os.set_blocking(wfd, False)
        for fd in (rfd, wfd):
            _widen(fd)
        worker = _Worker(proc, rfd, wfd)
        assert self._loop is not None
        self._loop.add_reader(rfd, self._on_readable, worker)
        self._write(worker, _frame(self._initargs))  # what to parse with, before any job
        return worker

    def _submit(self, w: _Worker, item: _PendingJob) -> None:
        w.pending.append(item)
        if len(w.pending) == 1 and w.ready:
            self._arm(w)
        self._write(w, _frame(item.payload))

    def _arm(self, w: _Worker) -> None:
        """Time the job at the head of the queue: the one the worker is parsing now."""
        assert self._loop is not None
        if w.timer is not None:
            w.timer.cancel()
        w.timer = None
        if w.pending:
            w.timer = self._loop.call_later(w.pending[0].timeout, self._on_timeout, w)

    def _write(self, w: _Worker, data: bytes) -> None:
        if w.dead:
            return
        if w.outq:  # frames wait already: this one goes behind them
            w.outq.append(memoryview(data))
            return
        try:
            n = os.write(w.wfd, data)
        except BlockingIOError:
            n = 0
        except OSError:
            self._replace(w, PROCESS_DIED)
            return
        if n < len(data):
            w.outq.append(memoryview(data)[n:])
            assert self._loop is not None
            self._loop.add_writer(w.wfd, self._on_writable, w)

    def _on_writable(self, w: _Worker) -> None:
        q = w.outq
        while q:
            head = q[0]
            try:
                n = os.write(w.wfd, head)
            except BlockingIOError:
                return
            except OSError:
                self._replace(w, PROCESS_DIED)
                return
            if n < len(head):
                q[0] = head[n:]
                return
            q.popleft()
        assert self._loop is not None
        self._loop.remove_writer(w.wfd)

    def _on_readable(self, w: _Worker) -> None:
        try:
            data = os.read(w.rfd, _READ_CHUNK)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:  # EOF: the worker exited
            self._replace(w, PROCESS_DIED)
            return
        buf = w.inbuf
        buf += data
        # Walk the whole messages in the buffer, then cut them off once: a read brings up to
        # 16 results (~8 KB each with the page's WARC exchange), and cutting each off the front
        # in turn moved the rest of the buffer every time.
        pos = 0
        messages = []
        with memoryview(buf) as view:
            while len(buf) - pos >= _LEN.size:
                n = _LEN.unpack_from(buf, pos)[0]
                start = pos + _LEN.size
                if n < 0:
                    if len(buf) - pos < _LEN.size + _BIG_LEN.size:
                        break
                    n = _BIG_LEN.unpack_from(buf, start)[0]
                    start += _BIG_LEN.size
                if len(buf) < start + n:
                    break
                messages.append(bytes(view[start : start + n]))  # one copy
                pos = start + n
        if pos:
            del buf[:pos]
        for message in messages:
            self._on_result(w, message)

    def _on_result(self, w: _Worker, message: bytes) -> None:
        if not w.ready and not message:  # the start-up handshake, never a result (a pickle)
            w.ready = True
            self._arm(w)
            return
        if not w.pending:
            return  # cannot happen with an honest worker; nothing to deliver it to
        item = w.pending.popleft()
        self._arm(w)
        try:
            result = pickle.loads(message)
        except Exception as exc:
            result = ParseResult(error=f"parse error: bad result from parser: {exc}"[:500])
        if not item.future.done():
            item.future.set_result(result)

    def _on_timeout(self, w: _Worker) -> None:
        w.timer = None
        if w.pending and not w.dead:
            self._replace(w, f"parse timeout after {w.pending[0].timeout} s")

    def _replace(self, w: _Worker, error: str) -> None:
        """Fail the job the worker was on, kill it, and requeue the rest on a new worker."""
        if w.dead:
            return
        self._detach(w)
        _kill(w.proc)
        queued = list(w.pending)
        w.pending.clear()
        if queued and not queued[0].future.done():
            queued[0].future.set_result(ParseResult(error=error))
        if self._closed:
            for item in queued[1:]:
                item.future.cancel()
            return
        self.restarts += 1
        fresh = self._spawn()
        self._workers[self._workers.index(w)] = fresh
        for item in queued[1:]:
            if not item.future.done():
                self._submit(fresh, item)

    def _detach(self, w: _Worker) -> None:
        if w.dead:
            return
        w.dead = True
        if w.timer is not None:
            w.timer.cancel()
            w.timer = None
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.remove_reader(w.rfd)
            loop.remove_writer(w.wfd)
        for fd in (w.wfd, w.rfd):
            with contextlib.suppress(OSError):
                os.close(fd)


#: Pipe capacity asked for (Linux, ``F_SETPIPE_SZ``; an unprivileged process may go up to
#: ``/proc/sys/fs/pipe-max-size``, 1 MiB by default): the 16 pages sent ahead to a parser
#: (~240 KB on the benchmark site) then sit in the kernel, not in the queue above.
PIPE_BYTES = 1 << 20


def _widen(fd: int) -> None:
    """Ask for a bigger pipe; the 64 KiB default (or less, where refused) still works."""
    setpipe = getattr(fcntl, "F_SETPIPE_SZ", None)
    if setpipe is not None:
        with contextlib.suppress(OSError):
            fcntl.fcntl(fd, setpipe, PIPE_BYTES)


def _kill(proc: subprocess.Popen[bytes]) -> None:
    """Kill a parser process (if it still runs) and reap it."""
    if proc.poll() is None:
        proc.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(1.0)
