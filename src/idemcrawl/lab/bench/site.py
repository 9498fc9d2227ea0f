"""A deterministic many-host static site for crawl benchmarks, served by a separate process.

Why a generated site: a throughput benchmark must be repeatable and must not touch the network,
so the site is built from a seed (the same spec always produces the same bytes) and served on
loopback. ``host_key`` includes the port, so each of the H hosts is one port on 127.0.0.1: real
per-host politeness and connection pooling without DNS or extra interfaces.

Why a separate server process: a server in the benchmark's own process (or, worse, the
crawler's) competes with the crawler for the GIL and would measure the server as much as the
crawler. nginx (one worker) is used when installed, because it serves static files faster than
any crawler can fetch them; otherwise a small aiohttp server serving the files from memory in a
subprocess, which is slower but far faster than ``python -m http.server`` (one thread per
connection, HTTP/1.0).

What is measured from here: both servers write the same access log line per request,
``$server_port $request_uri $msec``, and :meth:`StaticSite.log_stats` turns the lines written
since :meth:`StaticSite.reset_log` into request, page, robots.txt and duplicate counts. The
server's log, not the crawler's own report, decides how many pages were fetched and how many
were fetched twice.

The shape of the site mimics a shop: every page ``/p/N`` carries one item (``<span
class="sku">`` and ``<span class="price">``) and ``links`` followable links, written in the
forms real pages mix (absolute, root-relative, relative, ``./``, ``../``, protocol-relative,
some with fragments), mostly to pages of the same host with a few to other hosts, plus links a
crawler must not follow (``mailto:``, a fragment-only link, an out-of-scope host). Link ``0`` of
page ``N`` points to page ``N+1``, so each host's ``/p/0`` reaches all of its pages.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Final, Self

__all__ = [
    "LOG_FORMAT",
    "OUT_OF_SCOPE_URL",
    "LogEntry",
    "LogStats",
    "SiteError",
    "SiteSpec",
    "StaticSite",
    "free_ports",
    "generate_site",
    "nginx_path",
    "page_html",
    "page_links",
    "page_url",
    "read_log",
]

LOOPBACK: Final = "127.0.0.1"
#: nginx ``log_format``; the fallback server writes the same fields in the same order.
LOG_FORMAT: Final = "$server_port $request_uri $msec"
ROBOTS_TXT: Final = "User-agent: *\nAllow: /\n"
#: Linked from every page and never to be fetched: another loopback address, so a crawler that
#: wrongly follows it still stays on the machine (and fails fast on the discard port).
OUT_OF_SCOPE_URL: Final = "http://127.0.0.2:9/partner"
_FRAGMENT: Final = "#reviews"
_PARAGRAPH: Final = 600  # characters of filler text per <p>
_LOREM: Final = (
    "lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod tempor incididunt ut "
    "labore et dolore magna aliqua enim ad minim veniam quis nostrud exercitation ullamco laboris "
    "nisi aliquip ex ea commodo consequat duis aute irure in reprehenderit voluptate velit esse "
    "cillum fugiat nulla pariatur excepteur sint occaecat cupidatat non proident sunt culpa qui "
    "officia deserunt mollit anim id est laborum"
)


class SiteError(RuntimeError):
    """The site could not be generated or its server could not be started."""


@dataclass(frozen=True)
class SiteSpec:
    """The shape of a generated site; frozen because the pages are a pure function of it.

    ``links`` counts the followable links of a page (ring link included); ``cross_links`` of
    them point to other hosts (none when there is only one host).
    """

    hosts: int = 50
    pages: int = 400
    page_kb: float = 15.0
    links: int = 40
    cross_links: int = 2
    seed: int = 1

    def __post_init__(self) -> None:
        if self.hosts < 1 or self.pages < 1:
            raise ValueError("hosts and pages must be >= 1")
        if self.page_kb <= 0:
            raise ValueError("page_kb must be > 0")
        if self.links < 1:
            raise ValueError("links must be >= 1 (link 0 makes every page reachable)")
        if not 0 <= self.cross_links < self.links:
            raise ValueError("cross_links must be >= 0 and < links")

    @property
    def total_pages(self) -> int:
        return self.hosts * self.pages


def page_url(port: int, n: int) -> str:
    return f"http://{LOOPBACK}:{port}/p/{n}"


def _rng(spec: SiteSpec, kind: str, host: int, n: int) -> random.Random:
    # str seeds are hashed with SHA-512, so the stream is the same in every process and run
    # (PYTHONHASHSEED does not matter); one stream per purpose keeps page_links computable alone.
    return random.Random(f"{spec.seed}:{kind}:{host}:{n}")


def _same_host_href(rng: random.Random, port: int, m: int) -> str:
    r = rng.random()
    if r < 0.30:
        href = page_url(port, m)
    elif r < 0.70:
        href = f"/p/{m}"
    elif r < 0.85:
        href = str(m)  # relative to /p/N: resolves to /p/m
    elif r < 0.93:
        href = f"./{m}"
    else:
        href = f"../p/{m}"
    return href + _FRAGMENT if rng.random() < 0.1 else href


def page_links(spec: SiteSpec, ports: Sequence[int], host: int, n: int) -> list[str]:
    """The followable hrefs of page ``n`` of host ``host``, exactly as written in its HTML.

    Public so that tests (and anyone checking a crawl) can rebuild the link graph offline.
    Targets repeat now and then, as on real pages (the same product in two lists).
    """
    rng = _rng(spec, "links", host, n)
    port = ports[host]
    hrefs = [_same_host_href(rng, port, (n + 1) % spec.pages)]
    cross = spec.cross_links if spec.hosts > 1 else 0
    for _ in range(spec.links - 1 - cross):
        hrefs.append(_same_host_href(rng, port, rng.randrange(spec.pages)))
    for _ in range(cross):
        other = rng.randrange(spec.hosts - 1)
        other += other >= host  # any host but this one
        target = page_url(ports[other], rng.randrange(spec.pages))
        hrefs.append(target if rng.random() < 0.8 else target.removeprefix("http:"))
    # The ring link first would make every crawl a depth-first walk; real pages do not care.
    rng.shuffle(hrefs)
    return hrefs


def _corpus() -> str:
    rng = random.Random("idemcrawl-bench-corpus")
    words = _LOREM.split()
    return " ".join(rng.choice(words) for _ in range(12_000)) + " "


_CORPUS: Final = _corpus()


def _filler(rng: random.Random, length: int) -> str:
    """About ``length`` characters of text in ``<p>`` paragraphs (tags included)."""
    if length <= 0:
        return ""
    raw = max(1, length * _PARAGRAPH // (_PARAGRAPH + 8))  # 8 = len("</p>\n<p>")
    start = rng.randrange(len(_CORPUS))
    text = (_CORPUS[start:] + _CORPUS * (1 + raw // len(_CORPUS)))[:raw]
    return "</p>\n<p>".join(text[i : i + _PARAGRAPH] for i in range(0, raw, _PARAGRAPH))


def _sku(host: int, n: int) -> str:
    return f"H{host}-P{n}"


def page_html(spec: SiteSpec, ports: Sequence[int], host: int, n: int) -> str:
    """The HTML of page ``n`` of host ``host``: about ``page_kb`` KB, ASCII only."""
    rng = _rng(spec, "body", host, n)
    port = ports[host]
    sku = _sku(host, n)
    price = f"{rng.randint(100, 99_999) / 100:.2f}"
    items = [
        f'<li><a href="{href}">Related product {i}</a></li>'
        for i, href in enumerate(page_links(spec, ports, host, n))
    ]
    split = (2 * len(items)) // 3  # a nav list on top, a "see also" list after the text
    head = (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>Product {sku}</title>\n"
        f'<link rel="canonical" href="{page_url(port, n)}">\n</head>\n<body>\n'
        f'<header><a id="top" href="#top">Shop {host}</a> '
        f'<a href="mailto:shop{host}@example.invalid">Contact</a></header>\n<main>\n'
        f'<div class="product"><h1>Product {sku}</h1>\n'
        f'<p>SKU <span class="sku">{sku}</span>, price <span class="price">{price}</span>'
        " EUR</p></div>\n"
        '<nav class="related"><ul>\n' + "\n".join(items[:split]) + "\n</ul></nav>\n"
        '<section class="description">\n<p>'
    )
    tail = (
        "</p>\n</section>\n"
        '<aside class="see-also"><ul>\n' + "\n".join(items[split:]) + "\n</ul></aside>\n"
        f'</main>\n<footer><a href="{OUT_OF_SCOPE_URL}">Partner shop</a></footer>\n'
        "</body>\n</html>\n"
    )
    target = int(spec.page_kb * 1024)
    return head + _filler(rng, target - len(head) - len(tail)) + tail


def generate_site(spec: SiteSpec, ports: Sequence[int], www: Path) -> None:
    """Write ``www/h{i}/p/{n}`` and ``www/h{i}/robots.txt`` for every host ``i``.

    Pages have no file extension (the URL is ``/p/N``); the servers send them as text/html.
    """
    if len(ports) != spec.hosts:
        raise ValueError(f"need {spec.hosts} ports, got {len(ports)}")
    for h in range(spec.hosts):
        pdir = www / f"h{h}" / "p"
        pdir.mkdir(parents=True, exist_ok=True)
        (www / f"h{h}" / "robots.txt").write_text(ROBOTS_TXT, encoding="ascii")
        for n in range(spec.pages):
            (pdir / str(n)).write_bytes(page_html(spec, ports, h, n).encode("ascii"))


def free_ports(count: int) -> list[int]:
    """``count`` distinct free loopback ports.

    All sockets are bound before any is closed, so the ports differ; another process could
    still take one before the server binds it, which :class:`StaticSite` handles by retrying.
    """
    socks: list[socket.socket] = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            socks.append(s)
            s.bind((LOOPBACK, 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def nginx_path() -> str | None:
    """The nginx binary, also when /usr/sbin is not on a non-root user's PATH."""
    found = shutil.which("nginx")
    if found:
        return found
    for candidate in ("/usr/sbin/nginx", "/usr/local/sbin/nginx", "/usr/local/nginx/sbin/nginx"):
        if os.access(candidate, os.X_OK):
            return candidate
    return None


def nginx_config(root: Path, ports: Sequence[int]) -> str:
    """One ``server`` per port; everything nginx writes goes under ``root``.

    One worker process, so the server uses at most one core of the machine the crawlers share;
    temp paths and the pid file are redirected because the defaults need root. No
    ``open_file_cache``: with 20,000 pages it exhausts the file descriptors and nginx answers
    500 and pauses ``accept`` (seconds-long stalls), while an uncached ``open`` costs
    microseconds.
    """
    servers = "\n".join(
        f"  server {{ listen {LOOPBACK}:{port} backlog=1024; root {root / 'www' / f'h{i}'}; }}"
        for i, port in enumerate(ports)
    )
    tmp = root / "nginx-tmp"
    return f"""worker_processes 1;
pid {root / "nginx.pid"};
error_log {root / "error.log"} warn;
events {{ worker_connections 4096; }}
http {{
  default_type text/html;
  types {{ text/plain txt; }}
  charset utf-8;
  log_format bench '{LOG_FORMAT}';
  access_log {root / "access.log"} bench;
  sendfile on;
  tcp_nopush on;
  tcp_nodelay on;
  keepalive_timeout 65;
  keepalive_requests 1000000;
  server_tokens off;
  client_body_temp_path {tmp}/body;
  proxy_temp_path {tmp}/proxy;
  fastcgi_temp_path {tmp}/fastcgi;
  uwsgi_temp_path {tmp}/uwsgi;
  scgi_temp_path {tmp}/scgi;
{servers}
}}
"""


@dataclass(frozen=True, slots=True)
class LogEntry:
    port: int
    uri: str
    time: float


@dataclass(frozen=True)
class LogStats:
    """What the server saw: ``duplicates`` counts requests beyond the first per port+URI."""

    requests: int
    page_requests: int
    unique_pages: int
    robots: int
    other: int
    duplicates: int
    first: float | None
    last: float | None

    @classmethod
    def of(cls, entries: Sequence[LogEntry]) -> LogStats:
        counts = Counter((e.port, e.uri) for e in entries)
        page_keys = [k for k in counts if k[1].startswith("/p/")]
        page_requests = sum(counts[k] for k in page_keys)
        robots = sum(c for (_, uri), c in counts.items() if uri == "/robots.txt")
        return cls(
            requests=len(entries),
            page_requests=page_requests,
            unique_pages=len(page_keys),
            robots=robots,
            other=len(entries) - page_requests - robots,
            duplicates=sum(c - 1 for c in counts.values()),
            first=min((e.time for e in entries), default=None),
            last=max((e.time for e in entries), default=None),
        )


def read_log(path: Path, offset: int = 0) -> list[LogEntry]:
    """Parse the access log from byte ``offset``; a torn last line (no newline) is skipped."""
    with open(path, "rb") as fh:
        fh.seek(offset)
        data = fh.read()
    entries = []
    for line in data.decode("utf-8", "replace").split("\n")[:-1]:
        port, _, rest = line.partition(" ")
        uri, _, msec = rest.rpartition(" ")
        with contextlib.suppress(ValueError):
            entries.append(LogEntry(int(port), uri, float(msec)))
    return entries


class StaticSite:
    """Generate a site into a temp directory and serve it from a child process.

    ``server`` is ``"auto"`` (nginx when installed, else aiohttp), ``"nginx"`` or
    ``"aiohttp"``. Use as a context manager; the directory and the server are removed on exit.
    """

    def __init__(
        self,
        spec: SiteSpec,
        *,
        server: str = "auto",
        workdir: str | Path | None = None,
        startup_timeout: float = 30.0,
    ) -> None:
        if server not in ("auto", "nginx", "aiohttp"):
            raise ValueError(f"server must be auto, nginx or aiohttp, not {server!r}")
        if server == "auto":
            server = "nginx" if nginx_path() else "aiohttp"
        elif server == "nginx" and not nginx_path():
            raise SiteError("nginx is not installed")
        self.spec = spec
        self.kind = server
        self.ports: list[int] = []
        self._workdir = workdir
        self._startup_timeout = startup_timeout
        self._root: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_offset = 0

    # -- lifecycle ---------------------------------------------------------------------------

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def start(self) -> None:
        self._root = Path(tempfile.mkdtemp(prefix="idemcrawl-bench-site-", dir=self._workdir))
        # mkdtemp makes the directory 0700; nginx's worker runs as "nobody" when started as root.
        self._root.chmod(0o755)
        try:
            for attempt in range(3):
                self.ports = free_ports(self.spec.hosts)
                www = self.root / "www"
                shutil.rmtree(www, ignore_errors=True)  # page contents embed the ports
                generate_site(self.spec, self.ports, www)
                error = self._start_server()
                if error is None:
                    break
                if "in use" not in error or attempt == 2:
                    raise SiteError(f"{self.kind} did not start: {error}")
        except BaseException:
            self.close()
            raise
        self.reset_log()

    def close(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            _stop(proc)
        root, self._root = self._root, None
        if root is not None:
            shutil.rmtree(root, ignore_errors=True)

    def _start_server(self) -> str | None:
        """Start the server; None when every port accepts connections, else the error text."""
        root = self.root
        log = root / "access.log"
        log.touch()
        errlog = root / "server.stderr"
        if self.kind == "nginx":
            binary = nginx_path()
            assert binary is not None
            for sub in ("body", "proxy", "fastcgi", "uwsgi", "scgi"):
                (root / "nginx-tmp" / sub).mkdir(parents=True, exist_ok=True)
            conf = root / "nginx.conf"
            conf.write_text(nginx_config(root, self.ports), encoding="utf-8")
            cmd = [binary, "-p", str(root), "-c", str(conf), "-e", str(root / "error.log")]
            cmd += ["-g", "daemon off;"]
        else:
            cmd = [sys.executable, "-m", "idemcrawl.lab.bench.site", "serve", str(root / "www")]
            cmd += [str(log), ",".join(map(str, self.ports))]
        with open(errlog, "wb") as err:
            proc = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=err, stderr=err, start_new_session=True
            )
        self._proc = proc
        deadline = time.monotonic() + self._startup_timeout
        pending = list(self.ports)
        while pending:
            if proc.poll() is not None:
                self._proc = None
                return self._server_errors() or f"exit status {proc.returncode}"
            if time.monotonic() > deadline:
                self._proc = None
                _stop(proc)
                return f"ports {pending[:5]} not listening after {self._startup_timeout} s"
            with socket.socket() as s:
                s.settimeout(0.5)
                if s.connect_ex((LOOPBACK, pending[-1])) == 0:
                    pending.pop()
                    continue
            time.sleep(0.02)
        return None

    def _server_errors(self) -> str:
        texts = []
        for name in ("error.log", "server.stderr"):
            with contextlib.suppress(OSError):
                texts.append((self.root / name).read_text(errors="replace").strip())
        return " | ".join(t for t in texts if t)[-2000:]

    # -- what the crawlers and the benchmark use ---------------------------------------------

    @property
    def root(self) -> Path:
        if self._root is None:
            raise SiteError("the site is not started")
        return self._root

    @property
    def log_path(self) -> Path:
        return self.root / "access.log"

    @property
    def seeds(self) -> list[str]:
        """Each host's ``/p/0``: together they reach every page."""
        return [page_url(port, 0) for port in self.ports]

    @property
    def all_page_urls(self) -> list[str]:
        return [page_url(port, n) for port in self.ports for n in range(self.spec.pages)]

    def reset_log(self) -> None:
        """Start a new measurement window ("rotation" by offset: the writer never reopens)."""
        self._wait_log_quiet()
        self._log_offset = self.log_path.stat().st_size

    def log_entries(self) -> list[LogEntry]:
        """Requests logged since :meth:`reset_log`."""
        self._wait_log_quiet()
        return read_log(self.log_path, self._log_offset)

    def log_stats(self) -> LogStats:
        return LogStats.of(self.log_entries())

    def _wait_log_quiet(self, quiet: float = 0.1, limit: float = 3.0) -> None:
        """Wait until the log stops growing: nginx writes a line after the response is sent,
        so the crawler can exit a moment before its last requests are logged."""
        path = self.log_path
        deadline = time.monotonic() + limit
        size = path.stat().st_size
        stable_since = time.monotonic()
        while time.monotonic() < deadline:
            time.sleep(0.02)
            now_size = path.stat().st_size
            if now_size != size:
                size, stable_since = now_size, time.monotonic()
            elif time.monotonic() - stable_since >= quiet:
                return


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """TERM the server's process group (nginx master and worker), KILL it if it lingers."""
    for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


# -- the fallback server (runs in its own process) --------------------------------------------


def _load(www: Path, count: int) -> list[dict[str, tuple[bytes, str]]]:
    sites: list[dict[str, tuple[bytes, str]]] = []
    for h in range(count):
        base = www / f"h{h}"
        files: dict[str, tuple[bytes, str]] = {}
        for path in base.rglob("*"):
            if path.is_file():
                ctype = "text/plain" if path.suffix == ".txt" else "text/html"
                files["/" + path.relative_to(base).as_posix()] = (
                    path.read_bytes(),
                    ctype + "; charset=utf-8",
                )
        sites.append(files)
    return sites


async def _serve(www: Path, log_path: Path, ports: list[int]) -> None:
    """One aiohttp low-level server per port, files from memory, one log line per request."""
    from aiohttp import web

    sites = _load(www, len(ports))
    not_found = (b"not found\n", "text/plain; charset=utf-8")
    with open(log_path, "a", buffering=1, encoding="utf-8") as log:  # line-buffered: readable

        def make_handler(
            port: int, files: dict[str, tuple[bytes, str]]
        ) -> Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]:
            async def handle(request: web.BaseRequest) -> web.StreamResponse:
                body, ctype = files.get(request.path, not_found)
                log.write(f"{port} {request.raw_path} {time.time():.3f}\n")
                status = 404 if body is not_found[0] else 200
                return web.Response(body=body, status=status, headers={"Content-Type": ctype})

            return handle

        loop = asyncio.get_running_loop()
        servers = []
        for port, files in zip(ports, sites, strict=True):
            handler = web.Server(make_handler(port, files), access_log=None)
            servers.append(await loop.create_server(handler, LOOPBACK, port, backlog=1024))
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        for s in servers:
            s.close()


def main(argv: Sequence[str] | None = None) -> int:
    """``serve WWW LOG PORTS`` (the fallback server) or ``run`` (serve a site until Ctrl-C)."""
    ap = argparse.ArgumentParser(prog="python -m idemcrawl.lab.bench.site")
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve", help="internal: the fallback server process")
    s.add_argument("www", type=Path)
    s.add_argument("log", type=Path)
    s.add_argument("ports", help="comma-separated, host i on the i-th port")
    r = sub.add_parser("run", help="generate a site, serve it and print its seeds")
    r.add_argument("--hosts", type=int, default=2)
    r.add_argument("--pages", type=int, default=20)
    r.add_argument("--page-kb", type=float, default=15.0)
    r.add_argument("--links", type=int, default=40)
    r.add_argument("--server", choices=("auto", "nginx", "aiohttp"), default="auto")
    a = ap.parse_args(argv)
    if a.cmd == "serve":
        ports = [int(p) for p in a.ports.split(",")]
        asyncio.run(_serve(a.www, a.log, ports))
        return 0
    spec = SiteSpec(hosts=a.hosts, pages=a.pages, page_kb=a.page_kb, links=a.links)
    with StaticSite(spec, server=a.server) as site:
        print(f"{site.kind} serving {spec.total_pages} pages; access log {site.log_path}")
        print(" ".join(site.seeds))
        with contextlib.suppress(KeyboardInterrupt):
            signal.pause()
    return 0


if __name__ == "__main__":
    sys.exit(main())
