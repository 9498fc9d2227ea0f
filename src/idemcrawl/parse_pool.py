"""The crawl process's side of parsing: a pool of parser processes fed from the event loop.

:mod:`idemcrawl.parse` is what runs *inside* a parser process (the Page and Spider API, the
:class:`~idemcrawl.parse.Parser`, the worker loop); this module starts those processes (a fork
server that preloads only that module), sends them jobs over pipes read and written by the event
loop itself (no helper threads), and times them out. Kept apart so that a parser process never
imports asyncio or this pool.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import pickle
import struct
import sys
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from multiprocessing.context import BaseContext
from multiprocessing.process import BaseProcess
from typing import Any

from .parse import ParseJob, ParseResult, _pool_worker

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


def parser_context() -> BaseContext:
    """The multiprocessing context parser processes start from.

    A fork server that imports the parsing code once (this module, preloaded): each worker, and
    each replacement after a timeout, is a fork of it, quick to start, sharing the code pages.
    """
    if sys.platform == "win32":
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["idemcrawl.parse"])
    return context


def warm_up_parsers() -> None:
    """Start the fork server now, in the background, while the crawl process is still
    importing and opening its database: the first page then finds its parser ready instead of
    waiting ~0.15 s for an interpreter to start and import the parsing code."""
    if parser_context().get_start_method() == "forkserver":
        from multiprocessing import forkserver

        with _main_not_inherited():
            forkserver.ensure_running()


@contextlib.contextmanager
def _main_not_inherited() -> Iterator[None]:
    """Start a worker without it running this process's main script first.

    A spawned or forkserver child re-runs the parent's ``__main__`` file (so that functions
    defined there can be unpickled). Ours is the ``idemcrawl`` console script, which imports
    the CLI, the engine and aiohttp: 0.2 s and tens of MB per parser process, for nothing, as
    the worker's code lives in this module. Without a ``__file__`` on ``__main__`` (and no
    ``__spec__``, as for a script) multiprocessing leaves the main module alone.
    """
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if main is None or path is None or getattr(main, "__spec__", None) is not None:
        yield
        return
    del main.__file__
    try:
        yield
    finally:
        main.__file__ = path


@dataclass(eq=False)
class _PendingJob:
    payload: bytes
    future: asyncio.Future[ParseResult]
    timeout: float


@dataclass(eq=False)
class _Worker:
    proc: BaseProcess
    rfd: int
    wfd: int
    pending: deque[_PendingJob] = field(default_factory=deque)
    inbuf: bytearray = field(default_factory=bytearray)
    outbuf: bytearray = field(default_factory=bytearray)
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

    def __init__(
        self,
        workers: int,
        initargs: tuple[Any, ...],
        context: BaseContext | None = None,
    ) -> None:
        if workers < 1:
            raise ValueError(f"a parser pool needs at least one worker, got {workers}")
        self._n = workers
        self._initargs = initargs
        self._ctx = context or parser_context()
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
        return [w.proc.pid for w in self._workers if w.proc.pid is not None]

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
            w.proc.join(max(0.0, deadline - time.monotonic()))
            if w.proc.is_alive():
                w.proc.kill()
                w.proc.join(1.0)

    # -- internals ------------------------------------------------------------------------------

    def _spawn(self) -> _Worker:
        jobs_r, jobs_w = self._ctx.Pipe(duplex=False)
        res_r, res_w = self._ctx.Pipe(duplex=False)
        proc = self._ctx.Process(
            target=_pool_worker,
            args=(jobs_r, res_w, self._initargs),
            name="idemcrawl-parser",
            daemon=True,
        )
        try:
            with _main_not_inherited():
                proc.start()
        finally:
            jobs_r.close()  # the child has its own copies now
            res_w.close()
        rfd, wfd = os.dup(res_r.fileno()), os.dup(jobs_w.fileno())
        res_r.close()
        jobs_w.close()
        os.set_blocking(rfd, False)
        os.set_blocking(wfd, False)
        worker = _Worker(proc, rfd, wfd)
        assert self._loop is not None
        self._loop.add_reader(rfd, self._on_readable, worker)
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
        if not w.outbuf:
            try:
                n = os.write(w.wfd, data)
            except BlockingIOError:
                n = 0
            except OSError:
                self._replace(w, PROCESS_DIED)
                return
            if n == len(data):
                return
            data = data[n:]
            assert self._loop is not None
            self._loop.add_writer(w.wfd, self._on_writable, w)
        w.outbuf += data

    def _on_writable(self, w: _Worker) -> None:
        try:
            n = os.write(w.wfd, w.outbuf)
        except BlockingIOError:
            return
        except OSError:
            self._replace(w, PROCESS_DIED)
            return
        del w.outbuf[:n]
        if not w.outbuf:
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
        while len(buf) >= _LEN.size:
            n = _LEN.unpack_from(buf)[0]
            start = _LEN.size
            if n < 0:
                if len(buf) < _LEN.size + _BIG_LEN.size:
                    break
                n = _BIG_LEN.unpack_from(buf, _LEN.size)[0]
                start += _BIG_LEN.size
            if len(buf) < start + n:
                break
            message = bytes(buf[start : start + n])
            del buf[: start + n]
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
        if w.proc.is_alive():
            w.proc.kill()
        w.proc.join(1.0)
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
