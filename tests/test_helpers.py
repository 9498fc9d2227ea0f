"""The child-process helpers every subprocess test relies on (tests/helpers.py)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from .helpers import (
    DEVNULL,
    IMPORT_ROOTS,
    PACKAGE_ROOT,
    ROOT,
    child_env,
    run_cli,
    run_python,
    spawn_python,
)


def test_child_env_puts_the_import_roots_first_and_keeps_the_rest(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert IMPORT_ROOTS[0] == str(ROOT)
    assert all("site-packages" not in Path(r).parts for r in IMPORT_ROOTS)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(["/elsewhere", str(ROOT)]))
    env = child_env({"EXTRA": "1"})
    assert env["PYTHONPATH"].split(os.pathsep) == [*IMPORT_ROOTS, "/elsewhere"]
    assert env["EXTRA"] == "1" and env["PATH"] == os.environ["PATH"]


def test_a_child_outside_the_repository_imports_this_idemcrawl_and_the_tests(
    tmp_path: Path,
) -> None:
    code = "import idemcrawl, tests.helpers, os; print(idemcrawl.__file__); print(os.getcwd())"
    res = run_python(code, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    where, cwd = res.stdout.splitlines()
    assert Path(where).resolve().is_relative_to(PACKAGE_ROOT)
    assert Path(cwd).resolve() == tmp_path.resolve()


def test_run_cli_captures_text_and_the_exit_code() -> None:
    res = run_cli("no-such-command")
    assert res.returncode == 2
    assert isinstance(res.stderr, str) and "no-such-command" in res.stderr


def test_a_hung_child_is_killed_at_the_timeout() -> None:
    with pytest.raises(subprocess.TimeoutExpired):
        run_python("import time; time.sleep(60)", timeout=0.5)


def test_spawned_children_are_text_mode_and_can_get_their_own_session() -> None:
    proc = spawn_python(
        "import os, sys; print(os.getsid(0) == os.getpid(), sys.argv[1])",
        "arg",
        new_session=True,
        stderr=DEVNULL,
    )
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0 and out == "True arg\n"
