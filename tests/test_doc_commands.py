"""The commands in README.md, docs/scrapy.md and the examples' docstrings work as written.

A user copies them: each must parse with the CLI's own parser, quote what a shell would expand,
and the ones aimed at the scraping sandbox must run against it (a missing ``--db`` or
``--allow-private`` is a usage error, exit status 2, that parsing alone does not see).
"""

from __future__ import annotations

import ast
import re
import shlex
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from idemcrawl.cli import build_parser
from idemcrawl.lab.testsite.sandbox import SandboxServer

from .helpers import ROOT, cli_command, run

MARKDOWN = ("README.md", "docs/scrapy.md")
EXAMPLES = tuple(sorted(f"examples/{p.name}" for p in (ROOT / "examples").glob("*.py")))
#: Where the documented commands expect the sandbox (``testsite --site sandbox``'s default).
SANDBOX_ADDRESS = "127.0.0.1:8000"

_FENCE = re.compile(r"^```(?:sh|bash|shell|console)\n(.*?)^```", re.M | re.S)
_INLINE = re.compile(r"`(idemcrawl [^`]+)`")
_OPTIONAL = re.compile(r"\s*\[[^\]]*\]")
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


@dataclass(frozen=True)
class DocCommand:
    """One ``idemcrawl`` command as a document shows it."""

    where: str  # file:line
    text: str  # as written, continuation lines joined
    argv: tuple[str, ...]  # the arguments after ``idemcrawl``
    env: dict[str, str] = field(default_factory=dict)
    #: A real shell line (a code block, a docstring), not a synopsis in running text whose
    #: ``[...]`` parts were left out.
    shell: bool = True


def _logical_lines(block: str, first_line: int) -> Iterator[tuple[int, str]]:
    """(line number, line) with backslash continuations joined and ``$`` prompts removed."""
    pending: list[str] = []
    start = first_line
    for n, line in enumerate(block.splitlines(), first_line):
        if not pending:
            start = n
        stripped = line.strip()
        if stripped.endswith("\\"):
            pending.append(stripped[:-1])
            continue
        text = " ".join([*pending, stripped]).removeprefix("$ ")
        pending = []
        if text:
            yield start, text


def _commands(where: str, text: str, *, shell: bool = True) -> Iterator[DocCommand]:
    """The ``idemcrawl`` commands of one shell line (``a && b``, a trailing ``&``)."""
    for part in re.split(r"&&|;", text):
        words = shlex.split(part, comments=True)
        if words and words[-1] == "&":
            words.pop()
        env: dict[str, str] = {}
        while words and _ASSIGNMENT.match(words[0]):
            name, value = words.pop(0).split("=", 1)
            env[name] = value
        if words and Path(words[0]).name == "idemcrawl":
            yield DocCommand(where, part.strip(), tuple(words[1:]), env, shell)


def documented_commands() -> list[DocCommand]:
    found: list[DocCommand] = []
    for name in MARKDOWN:
        text = (ROOT / name).read_text()
        for block in _FENCE.finditer(text):
            first = text.count("\n", 0, block.start(1)) + 1
            for n, line in _logical_lines(block.group(1), first):
                found += _commands(f"{name}:{n}", line)
        prose = _FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)
        for span in _INLINE.finditer(prose):
            n = prose.count("\n", 0, span.start()) + 1
            synopsis = " ".join(_OPTIONAL.sub("", span.group(1)).split())
            found += _commands(f"{name}:{n}", synopsis, shell=False)
    for name in EXAMPLES:
        source = (ROOT / name).read_text()
        doc = ast.get_docstring(ast.parse(source), clean=True) or ""
        indented = "\n".join(ln if ln.startswith("    ") else "" for ln in doc.splitlines())
        for n, line in _logical_lines(indented, 1):
            found += _commands(f"{name} (docstring line {n})", line)
    return found


COMMANDS = documented_commands()


def test_the_documents_have_commands() -> None:
    """The extraction finds what the documents show (a changed format would test nothing)."""
    places = {c.where.split(":")[0].split(" ")[0] for c in COMMANDS}
    assert places == {*MARKDOWN, *(e for e in EXAMPLES if e != "examples/scrapy_catalog.py")}
    crawls = [c for c in COMMANDS if c.argv[:1] == ("crawl",) and c.shell]
    assert len(crawls) >= 7, [c.text for c in crawls]


@pytest.mark.parametrize("cmd", COMMANDS, ids=[c.where for c in COMMANDS])
def test_documented_command_parses(cmd: DocCommand, capsys: pytest.CaptureFixture[str]) -> None:
    try:
        args = build_parser().parse_args(list(cmd.argv))
    except SystemExit as exc:
        if exc.code == 0 and {"-h", "--help"} & set(cmd.argv):
            return  # `idemcrawl crawl --help`: printed the help, as documented
        pytest.fail(f"{cmd.where}: {cmd.text!r}: {capsys.readouterr().err.strip()}")
    if args.command == "crawl":  # required by the crawl's settings, which --config may give
        assert "db" in vars(args) or args.config, f"{cmd.where}: {cmd.text!r} has no --db"


@pytest.mark.parametrize(
    "cmd", [c for c in COMMANDS if c.shell], ids=[c.where for c in COMMANDS if c.shell]
)
def test_documented_command_quotes_shell_patterns(cmd: DocCommand) -> None:
    """``?`` and ``*`` in an unquoted word are globs: zsh (macOS's shell) stops the command
    with "no matches found", bash passes the word on only while no file matches."""
    lexer = shlex.shlex(cmd.text, posix=False)
    lexer.whitespace_split = True
    lexer.commenters = "#"
    bare = [w for w in lexer if w[0] not in "'\"" and any(c in w for c in "?*")]
    assert not bare, f"{cmd.where}: quote {bare} in {cmd.text!r}"


def _sandbox_sources() -> list[object]:
    """docs/scrapy.md and the examples: their commands scrape the sandbox (README's name
    other sites, which a test must never contact)."""
    sources = [
        name
        for name in ("docs/scrapy.md", *EXAMPLES)
        if any(c.where.startswith(name) and c.shell for c in COMMANDS)
    ]
    return [
        pytest.param(s, marks=pytest.mark.browser) if s == "examples/js.py" else s for s in sources
    ]


@pytest.mark.slow
@pytest.mark.parametrize("source", _sandbox_sources())
def test_sandbox_commands_run_as_written(source: str, tmp_path: Path) -> None:
    """Each source's commands, in order, in one directory (an export reads the crawl before
    it), against a sandbox on a free port: ``127.0.0.1:8000`` in a command becomes its
    address, and ``SANDBOX`` (which the examples read) names it. Crawls get ``--delay 0
    --latency-factor 0`` added so that they take seconds; nothing else is added."""
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    commands = [c for c in COMMANDS if c.where.startswith(source) and c.shell]
    with SandboxServer() as server:
        address = server.base_url.removeprefix("http://")
        ran = 0
        for cmd in commands:
            if cmd.argv[0] == "testsite":  # the server above stands in for it
                assert "sandbox" in cmd.argv, cmd.text
                continue
            urls = [a for a in cmd.argv if "://" in a]
            assert all(SANDBOX_ADDRESS in u for u in urls), f"{cmd.where}: not the sandbox"
            argv = [a.replace(SANDBOX_ADDRESS, address) for a in cmd.argv]
            if argv[0] == "crawl":
                argv += ["--delay", "0", "--latency-factor", "0"]
            env = {**cmd.env, "SANDBOX": server.base_url}
            res = run(cli_command(*argv), env=env, cwd=tmp_path, timeout=120)
            assert res.returncode == 0, f"{cmd.where}: {cmd.text!r}:\n{res.stderr}"
            assert "Traceback" not in res.stderr, res.stderr
            if argv[0] == "crawl":
                db = build_parser().parse_args(argv).db
                con = sqlite3.connect(tmp_path / db)
                try:
                    (n,) = con.execute("SELECT count(*) FROM records").fetchone()
                finally:
                    con.close()
                assert n > 0, f"{cmd.where}: {cmd.text!r} stored no record"
            ran += 1
        assert ran, f"{source} has no command to run"
        assert server.requests(), "no request reached the sandbox"
