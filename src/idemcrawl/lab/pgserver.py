"""Throw-away PostgreSQL servers on loopback ports, for tests and benchmarks of a fleet.

A partitioned frontier (issue 15) spreads a crawl over several PostgreSQL servers; its tests must
start those servers themselves and stop them, on any machine that has the server binaries
(Debian's ``postgresql`` package puts them in ``/usr/lib/postgresql/VERSION/bin``), without
touching the machine's own cluster. Each :class:`PgServer` is a fresh ``initdb`` data directory
in a temporary directory, listening on 127.0.0.1 only (and a socket in that directory), trust
authentication, durability settings off (a test server is thrown away, so ``fsync`` buys
nothing), started and stopped with ``pg_ctl``.

``initdb`` refuses to run as root: as root, the server runs as the ``postgres`` system user and
its directory belongs to that user.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

from .. import owner

__all__ = ["PgServer", "PgServerError", "drop_run_schema", "find_bin_dir"]


class PgServerError(RuntimeError):
    """A test server could not be made, started or stopped (with what the tool said)."""


def drop_run_schema(db: str) -> None:
    """Remove a benchmark or chaos run's crawl on a server (``db``: the crawl's ``--db``, naming
    its schema): the schema, the dead catalog rows its DDL left (a server without autovacuum
    keeps them, ``PostgresFrontier.vacuum_catalogs``), and its owner slots in the temp directory
    (``owner.forget``). Call it once the run's crawl processes have exited."""
    from ..frontier import split_schema
    from ..frontier.postgres import PostgresFrontier

    dsn, schema = split_schema(db)
    pg = PostgresFrontier(dsn, schema=schema)
    try:
        pg.drop_schema()
        pg.vacuum_catalogs()
    finally:
        pg.close()
    owner.forget(db)


def find_bin_dir() -> Path | None:
    """The newest PostgreSQL server bin directory on this machine (``IDEMCRAWL_PG_BIN`` wins)."""
    env = os.environ.get("IDEMCRAWL_PG_BIN")
    if env:
        return Path(env) if (Path(env) / "initdb").exists() else None
    found = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"),
        key=lambda p: int(Path(p).parent.parent.name)
        if Path(p).parent.parent.name.isdigit()
        else 0,
    )
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PgServer:
    """One PostgreSQL server of its own: ``start()``, then ``dsn``; ``stop()`` removes it all."""

    def __init__(
        self, bin_dir: Path | None = None, *, port: int | None = None, durable: bool = False
    ) -> None:
        found = bin_dir or find_bin_dir()
        if found is None:
            raise PgServerError("no PostgreSQL server binaries (initdb, pg_ctl) on this machine")
        self.bin_dir = found
        self.port = port or _free_port()
        #: ``durable=True`` keeps PostgreSQL's default fsync and synchronous commit, for tests
        #: that crash the server (``crash()``): without them a crash may lose commits the
        #: clients were told succeeded, which no frontier can survive.
        self.durable = durable
        self.root: Path | None = None
        self._user: str | None = None

    @property
    def dsn(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    @property
    def data_dir(self) -> Path:
        assert self.root is not None, "start() the server first"
        return self.root / "data"

    def _run(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        cmd = [str(self.bin_dir / args[0]), *args[1:]]
        if self._user is not None:
            cmd = ["runuser", "-u", self._user, "--", *cmd]
        try:
            res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        except OSError as exc:
            raise PgServerError(f"{args[0]} could not run: {exc}") from exc
        if res.returncode != 0:
            raise PgServerError(
                f"{args[0]} failed ({res.returncode}): {(res.stderr or res.stdout).strip()[-800:]}"
            )
        return res

    def start(self) -> PgServer:
        self.root = Path(tempfile.mkdtemp(prefix="idemcrawl-pg-"))
        if os.geteuid() == 0:
            self._user = "postgres"
            pw = pwd.getpwnam(self._user)
            os.chown(self.root, pw.pw_uid, pw.pw_gid)
        try:
            self._run(
                "initdb", "-D", str(self.data_dir), "-U", "postgres", "--auth=trust",
                "--no-sync", "-E", "UTF8", "--locale=C",
            )  # fmt: skip
            self.resume()
        except BaseException:
            self._remove()
            raise
        return self

    def stop(self) -> None:
        """Stop the server at once (clients are disconnected) and remove its directory."""
        if self.root is None:
            return
        with contextlib.suppress(PgServerError, subprocess.TimeoutExpired):
            self.crash()
        self._remove()

    def pause(self) -> None:
        """Stop the server but keep its data: ``resume()`` starts it again (outage tests)."""
        self._run("pg_ctl", "-D", str(self.data_dir), "-m", "fast", "-w", "stop")

    def crash(self) -> None:
        """Kill the server as a crash would (``pg_ctl stop -m immediate``: no checkpoint, no
        goodbye to clients) but keep its data: ``resume()`` starts it with crash recovery."""
        self._run("pg_ctl", "-D", str(self.data_dir), "-m", "immediate", "-w", "stop")

    def resume(self) -> None:
        """Start the server on its data directory (after ``pause()`` or ``crash()``)."""
        options = (
            f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.root} "
            "-c max_connections=60 -c shared_buffers=32MB"
        )
        if not self.durable:
            options += " -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
        self._run(
            "pg_ctl", "-D", str(self.data_dir), "-o", options, "-l",
            str(self.data_dir.parent / "server.log"), "-w", "-t", "60", "start",
        )  # fmt: skip

    def _remove(self) -> None:
        if self.root is not None:
            for _ in range(5):
                try:
                    shutil.rmtree(self.root)
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.2)
            self.root = None

    def __enter__(self) -> PgServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
