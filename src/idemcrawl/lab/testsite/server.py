"""One way to serve a test site: an aiohttp app on loopback, in its own thread or the caller's loop.

Every test site (the shop, the hostile site, the multi-host politeness site, the trap site) and
every test that needs a throw-away HTTP server use this module, so binding, start-up errors and
bounded shutdown are written once:

* :func:`bind` and :func:`start_app` are the two steps (a socket first, then the app on it).
  Binding first means port 0 is resolved before the app is built, so an app can know its own
  base URL (the multi-host site needs that), and a second address can share the port.
* :func:`serving` is both steps as an ``async with`` for a server on the caller's event loop.
* :class:`ThreadedServer` runs them on a private event loop in a daemon thread, which is what
  synchronous tests, crawlers in other processes and async crawlers can all share; a subclass
  says what to serve by overriding :meth:`ThreadedServer.make_app` (one app, one port) or
  :meth:`ThreadedServer.open` (anything else). :meth:`ThreadedServer.serve_until_signal` is the
  same server in the foreground of a command (``idemcrawl testsite``).

Only loopback addresses are ever bound here: these servers are targets for tests and benchmarks
on one machine, never something to expose.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import signal
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Self, TypeVar

from aiohttp import web

__all__ = [
    "DEFAULT_SHUTDOWN_TIMEOUT",
    "AppServer",
    "ThreadedServer",
    "bind",
    "cleanup",
    "serving",
    "start_app",
    "url_host",
]

#: Grace given to in-flight handlers at shutdown. Short: tests stop servers often, and a
#: handler that hangs on purpose (a trickle, a hanging robots.txt) must not stall them.
DEFAULT_SHUTDOWN_TIMEOUT = 0.5
#: How long :meth:`ThreadedServer.on_loop` waits for the server loop before reading directly.
_LOOP_CALL_TIMEOUT = 2.0
#: How often the foreground server looks for a signal: the delay between SIGTERM and stopping.
_SIGNAL_POLL = 0.05

_T = TypeVar("_T")


def url_host(host: str) -> str:
    """``host`` as it appears in a URL: IPv6 literals need brackets."""
    return f"[{host}]" if ":" in host else host


def bind(host: str, port: int = 0) -> socket.socket:
    """A listening TCP socket on ``host:port`` (port 0: any free port).

    The address family follows the literal, so ``::1`` works as well as ``127.0.0.1``.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return socket.create_server((host, port), family=family)


async def start_app(
    app: web.Application,
    socks: Sequence[socket.socket],
    *,
    shutdown_timeout: float = DEFAULT_SHUTDOWN_TIMEOUT,
) -> web.AppRunner:
    """Serve ``app`` on every socket in ``socks``; the caller owns the returned runner.

    On failure the runner is cleaned up and every socket closed, so a half-started server never
    keeps a port.
    """
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=shutdown_timeout)
    try:
        await runner.setup()
        for sock in socks:
            await web.SockSite(runner, sock).start()
    except BaseException:
        await runner.cleanup()
        for sock in socks:
            sock.close()
        raise
    return runner


async def cleanup(runners: Sequence[web.AppRunner]) -> None:
    """Stop runners concurrently, so shutdown costs one grace period, not one per runner."""
    await asyncio.gather(*(r.cleanup() for r in runners), return_exceptions=True)


@contextlib.asynccontextmanager
async def serving(
    app: web.Application,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    shutdown_timeout: float = DEFAULT_SHUTDOWN_TIMEOUT,
) -> AsyncIterator[int]:
    """Serve ``app`` on the running loop for the ``async with`` body; yields the bound port.

    For tests that want the server on their own loop (so one loop sees both ends); everything
    else wants :class:`ThreadedServer`.
    """
    sock = bind(host, port)
    bound = int(sock.getsockname()[1])
    runner = await start_app(app, [sock], shutdown_timeout=shutdown_timeout)
    try:
        yield bound
    finally:
        await runner.cleanup()


class ThreadedServer:
    """A server on its own event loop in a daemon thread, bound to a loopback address.

    A thread (rather than the caller's loop) lets synchronous tests, subprocess crawlers and
    async crawlers all use the same fixture, and keeps the server responsive while the caller's
    loop is blocked. Use as a context manager or call :meth:`start`/:meth:`stop`; a stopped
    server can be started again (a subclass builds a fresh app each time, since an aiohttp app
    is bound to the loop it first ran on).

    Subclasses override :meth:`make_app`, or :meth:`open` to bind several ports or addresses.
    ``label`` names the server in errors.
    """

    label = "test server"
    shutdown_timeout = DEFAULT_SHUTDOWN_TIMEOUT

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self.host = host
        self._requested_port = port
        self._ports: list[int] = []
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop_event: asyncio.Event | None = None
        self._stop_requested = threading.Event()
        self._ready = threading.Event()
        self._error: BaseException | None = None

    # -- what to serve (subclass hooks) ------------------------------------------------------

    def make_app(self) -> web.Application:
        """The app to serve on ``host:port``; called on the server loop at every start."""
        raise NotImplementedError(f"{type(self).__name__} must override make_app() or open()")

    async def open(self) -> list[web.AppRunner]:
        """Bind and start everything this server serves; returns the runners to clean up.

        Runs on the server loop. The default serves :meth:`make_app` on ``host:port``;
        overrides record each bound port with :meth:`_bound` and, if they fail part-way,
        clean up what they started before raising (:func:`start_app` and :func:`cleanup`).
        """
        app = self.make_app()
        sock = bind(self.host, self._requested_port)
        self._bound(int(sock.getsockname()[1]))
        return [await start_app(app, [sock], shutdown_timeout=self.shutdown_timeout)]

    def _bound(self, port: int) -> None:
        """Record a bound port (in bind order: the first one is :attr:`port`)."""
        self._ports.append(port)

    # -- addresses ---------------------------------------------------------------------------

    @property
    def port(self) -> int:
        """Bound port (the first one, for a server with several); only valid while started."""
        if not self._ports:
            raise RuntimeError(f"{type(self).__name__} is not running")
        return self._ports[0]

    @property
    def ports(self) -> list[int]:
        """Every bound port, in bind order; only valid while started."""
        if not self._ports:
            raise RuntimeError(f"{type(self).__name__} is not running")
        return list(self._ports)

    @property
    def base_url(self) -> str:
        """``http://HOST:PORT`` without a trailing slash."""
        return f"http://{url_host(self.host)}:{self.port}"

    @property
    def running(self) -> bool:
        """True between a successful :meth:`start` and :meth:`stop`."""
        return self._thread is not None and bool(self._ports)

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self, timeout: float = 10.0) -> Self:
        """Start serving and block until every socket is bound (or raise why it was not)."""
        if self._thread is not None:
            raise RuntimeError(f"{type(self).__name__} already started")
        self._ready.clear()
        self._stop_requested.clear()
        self._error = None
        self._ports = []
        name = self.label.replace(" ", "-")
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout):
            self.stop()
            raise TimeoutError(f"{self.label} did not start within {timeout} s")
        if self._error is not None:
            err = self._error
            self.stop()
            raise RuntimeError(f"{self.label} failed to start") from err
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Stop serving; never blocks longer than ``timeout`` (the thread is a daemon).

        Handlers still running after the grace period (``shutdown_timeout``) are cancelled.
        """
        thread, loop, stop_event = self._thread, self._loop, self._stop_event
        if thread is None:
            return
        self._stop_requested.set()  # seen by a start-up still binding
        if loop is not None and stop_event is not None:
            # The loop may already be closed if startup failed; nothing to wake then.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(stop_event.set)
        thread.join(timeout)
        self._thread = None
        self._ports = []

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def on_loop(self, fn: Callable[[], _T]) -> _T:
        """Run ``fn`` on the server loop when it is running, else directly; return its result.

        For reads of server state that must be ordered after the handler steps already run:
        reading from another thread races the server (a client can receive the last byte of a
        response before the server thread runs the ``finally`` that accounts for it), while a
        callback queued on the loop runs only after that step, the ordering an HTTP stats
        request gets. ``fn`` must be safe to call from any thread (a lock-protected read): if
        the loop is stopped, stuck, or this is the loop's own thread, it runs directly.
        """
        loop, thread = self._loop, self._thread
        if (
            loop is None
            or thread is None
            or thread.ident == threading.get_ident()
            or loop.is_closed()
            or not loop.is_running()
        ):
            return fn()
        done: concurrent.futures.Future[_T] = concurrent.futures.Future()

        def run() -> None:
            try:
                done.set_result(fn())
            except BaseException as exc:
                done.set_exception(exc)

        try:
            loop.call_soon_threadsafe(run)
            return done.result(timeout=_LOOP_CALL_TIMEOUT)
        except (RuntimeError, concurrent.futures.TimeoutError):
            # Loop closed or stuck: a lock-protected direct read is still correct, just racy.
            return fn()

    def serve_until_signal(self, announce: Callable[[], None]) -> None:
        """Serve in the foreground of a command until SIGINT or SIGTERM, then stop cleanly.

        ``announce`` runs once everything is bound (it prints the real URLs, so port 0 is
        usable by scripts). Returns normally on the signal, so the process exits 0 without a
        traceback; the previous handlers are restored. Main thread only (signals).
        """
        # The handler only flips a flag: taking a lock in a signal handler (Event.set) can
        # deadlock against the main thread holding it.
        signalled: list[int] = []
        sigs = (signal.SIGINT, signal.SIGTERM)
        previous = {sig: signal.signal(sig, lambda n, _f: signalled.append(n)) for sig in sigs}
        try:
            with self:
                announce()
                while not signalled:
                    time.sleep(_SIGNAL_POLL)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    # -- the server thread -------------------------------------------------------------------

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            loop.run_until_complete(self._serve())
        except BaseException as exc:  # reported to start(); a thread must not die silently
            self._error = exc
        finally:
            self._ready.set()
            with contextlib.suppress(Exception):
                loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    async def _serve(self) -> None:
        self._stop_event = asyncio.Event()
        runners = await self.open()
        try:
            self._ready.set()
            if not self._stop_requested.is_set():
                await self._stop_event.wait()
        finally:
            await cleanup(runners)


class AppServer(ThreadedServer):
    """A :class:`ThreadedServer` for one app built by ``app_factory`` (called at each start).

    For tests with a small site of their own: ``with AppServer(site.app) as server: ...``.
    """

    label = "app server"

    def __init__(
        self,
        app_factory: Callable[[], web.Application],
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        shutdown_timeout: float = DEFAULT_SHUTDOWN_TIMEOUT,
    ) -> None:
        super().__init__(host, port)
        self._app_factory = app_factory
        self.shutdown_timeout = shutdown_timeout

    def make_app(self) -> web.Application:
        return self._app_factory()
