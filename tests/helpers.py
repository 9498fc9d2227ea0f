"""Child processes for tests, started one way: the CLI, a module, or a short Python script.

Tests that need a real process (a crawl to SIGKILL, ``serve``, ``events --follow``, a command's
exit code and output) use :func:`run_cli` (wait for it) or :func:`spawn_cli` (a ``Popen`` to
drive), and :func:`run_python` / :func:`spawn_python` for a ``python -c`` script. They share:

* the interpreter running the tests (``sys.executable``), so the child has the same packages;
* an environment in which the child imports the same ``idemcrawl`` as this process and the
  ``tests`` package (spiders named ``tests.test_x:Spider``), whatever its working directory:
  the roots they come from go first on ``PYTHONPATH`` (see :func:`child_env`);
* the repository root as the default working directory, so relative paths in a test mean
  the same thing however pytest was started;
* text mode (``str`` output), and a timeout on every wait.

:func:`run` and :func:`spawn` take any command line, for a command built elsewhere (the chaos
tool's crawl command, a benchmark script).
"""

from __future__ import annotations

import os
import site
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

import idemcrawl

#: The repository root: the default working directory and the home of the ``tests`` package.
ROOT = Path(__file__).resolve().parent.parent
#: Where the ``idemcrawl`` this process imported lives: ``src/`` for an editable install or a
#: ``PYTHONPATH=src`` run, the environment's site-packages for a regular install (CI).
PACKAGE_ROOT = Path(idemcrawl.__file__).resolve().parent.parent


def _import_roots() -> list[str]:
    """What a child needs on PYTHONPATH to import what this process imports.

    site-packages is left out: every child of this interpreter has it already, and putting it
    ahead of the standard library (where PYTHONPATH goes) could shadow stdlib modules.
    """
    installed = {Path(p).resolve() for p in [*site.getsitepackages(), site.getusersitepackages()]}
    roots = [ROOT]
    if PACKAGE_ROOT not in installed and PACKAGE_ROOT != ROOT:
        roots.append(PACKAGE_ROOT)
    return [str(r) for r in roots]


#: The directories :func:`child_env` puts first on a child's PYTHONPATH, in order.
IMPORT_ROOTS = _import_roots()

PIPE = subprocess.PIPE
DEVNULL = subprocess.DEVNULL
#: Seconds a test waits for a command to finish unless it says otherwise.
DEFAULT_TIMEOUT = 60.0

_Stream = int | IO[Any] | None


def cli_command(*args: str, module: str = "idemcrawl") -> list[str]:
    """``python -m idemcrawl ARGS`` (or another ``module``) with the tests' interpreter."""
    return [sys.executable, "-m", module, *args]


def python_command(code: str, *args: str) -> list[str]:
    """``python -c CODE ARGS`` with the tests' interpreter (``ARGS`` are ``sys.argv[1:]``)."""
    return [sys.executable, "-c", code, *args]


def child_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment plus ``env``, with :data:`IMPORT_ROOTS` first on PYTHONPATH.

    Without it a child started outside the repository root could not import ``tests.…``
    spiders, and one started without an installed package (``PYTHONPATH=src pytest``) could
    not import ``idemcrawl`` at all; with it the child imports exactly what the test does.
    """
    merged = {**os.environ, **(env or {})}
    given = merged.get("PYTHONPATH", "").split(os.pathsep)
    rest = [p for p in given if p and p not in IMPORT_ROOTS]
    merged["PYTHONPATH"] = os.pathsep.join([*IMPORT_ROOTS, *rest])
    return merged


def run(
    cmd: Sequence[str],
    *,
    timeout: float = DEFAULT_TIMEOUT,
    env: Mapping[str, str] | None = None,
    cwd: Path | str = ROOT,
    input: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``cmd`` to completion, capturing stdout and stderr as text; never raises on exit code.

    A command still running after ``timeout`` seconds is killed and ``TimeoutExpired`` raised:
    a hung child fails its test instead of the whole suite.
    """
    return subprocess.run(
        list(cmd),
        capture_output=True,
        text=True,
        timeout=timeout,
        env=child_env(env),
        cwd=cwd,
        input=input,
    )


def spawn(
    cmd: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    cwd: Path | str = ROOT,
    stdout: _Stream = PIPE,
    stderr: _Stream = PIPE,
    new_session: bool = False,
) -> subprocess.Popen[str]:
    """Start ``cmd`` and return its ``Popen`` (text mode); the caller waits for or kills it.

    Pass ``DEVNULL`` for a stream the test never reads: a full pipe blocks the child.
    ``new_session`` puts the child in its own process group, so ``os.killpg`` kills it
    together with its own children (parser workers) the way a machine crash would.
    """
    return subprocess.Popen(
        list(cmd),
        stdout=stdout,
        stderr=stderr,
        text=True,
        env=child_env(env),
        cwd=cwd,
        start_new_session=new_session,
    )


def run_cli(
    *args: str,
    timeout: float = DEFAULT_TIMEOUT,
    env: Mapping[str, str] | None = None,
    cwd: Path | str = ROOT,
    input: str | None = None,
    module: str = "idemcrawl",
) -> subprocess.CompletedProcess[str]:
    """``idemcrawl ARGS`` as a child process, run to completion (see :func:`run`)."""
    return run(cli_command(*args, module=module), timeout=timeout, env=env, cwd=cwd, input=input)


def spawn_cli(
    *args: str,
    env: Mapping[str, str] | None = None,
    cwd: Path | str = ROOT,
    stdout: _Stream = PIPE,
    stderr: _Stream = PIPE,
    new_session: bool = False,
    module: str = "idemcrawl",
) -> subprocess.Popen[str]:
    """``idemcrawl ARGS`` as a running child process (see :func:`spawn`)."""
    return spawn(
        cli_command(*args, module=module),
        env=env,
        cwd=cwd,
        stdout=stdout,
        stderr=stderr,
        new_session=new_session,
    )


def run_python(
    code: str,
    *args: str,
    timeout: float = DEFAULT_TIMEOUT,
    env: Mapping[str, str] | None = None,
    cwd: Path | str = ROOT,
    input: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """``python -c CODE ARGS`` run to completion (see :func:`run`)."""
    return run(python_command(code, *args), timeout=timeout, env=env, cwd=cwd, input=input)


def spawn_python(
    code: str,
    *args: str,
    env: Mapping[str, str] | None = None,
    cwd: Path | str = ROOT,
    stdout: _Stream = PIPE,
    stderr: _Stream = PIPE,
    new_session: bool = False,
) -> subprocess.Popen[str]:
    """``python -c CODE ARGS`` as a running child process (see :func:`spawn`)."""
    return spawn(
        python_command(code, *args),
        env=env,
        cwd=cwd,
        stdout=stdout,
        stderr=stderr,
        new_session=new_session,
    )
