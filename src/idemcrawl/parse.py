"""The parsing side: Page, the Spider API, and the code that runs inside parser processes.

Parsing is CPU work (HTML tree, link resolution), so it runs in worker processes while the event
loop keeps fetching (R19). A worker receives plain data (URL, status, headers, body) and returns
plain data (records ready to upsert, links already normalised and scope-checked), so nothing but
bytes and tuples crosses the process boundary.
"""

from __future__ import annotations

import codecs
import hashlib
import importlib
import importlib.util
import os
import re
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from selectolax.lexbor import LexborHTMLParser, LexborNode

from . import url as urls
from .frontier.base import PAGE, SITEMAP, NewURL, RecordWrite, canonical_json
from .sitemaps import parse_sitemap, priority_for
from .traps import TrapLimits, check_url, reason_class


@dataclass(frozen=True, slots=True)
class Record:
    """What a spider yields for each item it scrapes; ``key`` is the item's natural key (R1)."""

    key: str
    data: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Link:
    """A URL to follow, with an optional priority (higher is fetched first within its host)."""

    url: str
    priority: int = 0


class Node:
    """A thin, stable wrapper over the HTML parser's node, so spiders do not depend on it."""

    __slots__ = ("_node",)

    def __init__(self, node: LexborNode) -> None:
        self._node = node

    def text(self, strip: bool = True) -> str:
        return self._node.text(strip=strip)

    @property
    def attrs(self) -> dict[str, str | None]:
        return dict(self._node.attributes)

    @property
    def tag(self) -> str:
        return self._node.tag or ""

    @property
    def html(self) -> str:
        return self._node.html or ""

    def css(self, selector: str) -> list[Node]:
        return [Node(n) for n in self._node.css(selector)]

    def css_first(self, selector: str) -> Node | None:
        n = self._node.css_first(selector)
        return None if n is None else Node(n)

    def __repr__(self) -> str:
        return f"<Node {self.tag}>"


_META_CHARSET = re.compile(rb"""<meta[^>]+charset\s*=\s*["']?\s*([A-Za-z0-9_.:-]+)""", re.I)
_BOMS = (
    (codecs.BOM_UTF8, "utf-8-sig"),
    (codecs.BOM_UTF16_LE, "utf-16-le"),
    (codecs.BOM_UTF16_BE, "utf-16-be"),
)


def detect_encoding(body: bytes, content_type: str | None) -> str:
    """BOM, then the Content-Type charset, then a ``<meta>`` charset, then UTF-8 (HTML5 order)."""
    for bom, name in _BOMS:
        if body.startswith(bom):
            return name
    if content_type and "charset=" in content_type.lower():
        cs = content_type.lower().split("charset=", 1)[1].split(";")[0].strip().strip("\"'")
        if _known_codec(cs):
            return cs
    m = _META_CHARSET.search(body[:4096])
    if m:
        cs = m.group(1).decode("ascii", "replace").lower()
        if _known_codec(cs):
            return cs
    return "utf-8"


def _known_codec(name: str) -> bool:
    try:
        info = codecs.lookup(name)
    except LookupError:
        return False
    return bool(getattr(info, "_is_text_encoding", True))  # base64, zlib… are not charsets


class Page:
    """A fetched response as a spider sees it."""

    def __init__(
        self,
        url: str,
        status: int,
        headers: dict[str, str],
        body: bytes,
        *,
        depth: int = 0,
        scope_hosts: frozenset[str] = frozenset(),
        scope: str = "any",
    ) -> None:
        self.url = url
        self.status = status
        self.headers = headers
        self.body = body
        self.depth = depth
        self._scope_hosts = scope_hosts
        self._scope = scope

    @property
    def content_type(self) -> str:
        return self.headers.get("content-type", "").split(";")[0].strip().lower()

    @property
    def is_html(self) -> bool:
        ct = self.content_type
        return ct in ("", "text/html", "application/xhtml+xml")

    @cached_property
    def encoding(self) -> str:
        return detect_encoding(self.body, self.headers.get("content-type"))

    @cached_property
    def text(self) -> str:
        return self.body.decode(self.encoding, errors="replace")

    @cached_property
    def _tree(self) -> LexborHTMLParser:
        return LexborHTMLParser(self.text)

    def css(self, selector: str) -> list[Node]:
        return [Node(n) for n in self._tree.css(selector)]

    def css_first(self, selector: str) -> Node | None:
        n = self._tree.css_first(selector)
        return None if n is None else Node(n)

    @cached_property
    def base_url(self) -> str:
        """The document's base for relative links: ``<base href>`` when valid, else the URL."""
        if not self.is_html:
            return self.url
        node = self._tree.css_first("base[href]")
        if node is not None:
            href = node.attributes.get("href")
            if href:
                try:
                    return urls.normalise(href, self.url)
                except urls.InvalidURL:
                    pass
        return self.url

    def links(self) -> list[str]:
        """Absolute, normalised, in-scope links of the page, each once, in document order."""
        if not self.is_html:
            return []
        out: dict[str, None] = {}
        base = self.base_url
        for node in self._tree.css("a[href], area[href]"):
            href = node.attributes.get("href")
            if not href:
                continue
            try:
                u = urls.normalise(href, base)
            except urls.InvalidURL:
                continue
            if self.in_scope(u):
                out[u] = None
        return list(out)

    def in_scope(self, url: str) -> bool:
        return urls.in_scope(url, self._scope_hosts, self._scope)


class Spider:
    """Subclass this: set ``name`` (the records' source) and implement ``parse``.

    ``parse`` yields :class:`Record` items and URLs (``str`` or :class:`Link`) to follow. The
    default implementation follows every in-scope link and stores no records, which makes a plain
    crawler out of the base class.
    """

    name: str = "default"
    #: Call ``parse`` for non-HTML responses too (their links are never extracted).
    parse_non_html: bool = False

    def parse(self, page: Page) -> Iterable[Record | Link | str]:
        yield from page.links()


class SpiderLoadError(Exception):
    """The ``--spider`` argument does not name a usable Spider class."""


def load_spider(spec: str | None) -> type[Spider]:
    """``FILE.py:Class`` or ``package.module:Class``; None gives the link-following default."""
    if not spec:
        return Spider
    target, sep, cls_name = spec.rpartition(":")
    if not sep or not target or not cls_name:
        raise SpiderLoadError(
            f"--spider must look like FILE.py:Class or module:Class, got {spec!r}"
        )
    try:
        if target.endswith(".py") or os.sep in target:
            path = os.path.abspath(target)
            if not os.path.isfile(path):
                raise SpiderLoadError(f"spider file not found: {target}")
            mod_name = "idemcrawl_user_spider_" + hashlib.sha256(path.encode()).hexdigest()[:16]
            module = sys.modules.get(mod_name)
            if module is None:
                spec_obj = importlib.util.spec_from_file_location(mod_name, path)
                if spec_obj is None or spec_obj.loader is None:
                    raise SpiderLoadError(f"cannot load spider file {target}")
                module = importlib.util.module_from_spec(spec_obj)
                sys.modules[mod_name] = module
                try:
                    spec_obj.loader.exec_module(module)
                except BaseException:
                    sys.modules.pop(mod_name, None)
                    raise
        else:
            module = importlib.import_module(target)
    except SpiderLoadError:
        raise
    except Exception as exc:  # a user's file can raise anything while importing
        raise SpiderLoadError(
            f"cannot import spider {target}: {type(exc).__name__}: {exc}"
        ) from exc
    cls = getattr(module, cls_name, None)
    if cls is None:
        raise SpiderLoadError(f"{target} has no attribute {cls_name!r}")
    if not (isinstance(cls, type) and issubclass(cls, Spider)):
        raise SpiderLoadError(f"{cls_name!r} in {target} is not an idemcrawl.Spider subclass")
    return cls


# -- the worker side ----------------------------------------------------------------------------


@dataclass(slots=True)
class ParseJob:
    url: str
    status: int
    headers: dict[str, str]
    body: bytes
    depth: int
    kind: str = PAGE


@dataclass(slots=True)
class ParseResult:
    records: list[RecordWrite] = field(default_factory=list)
    links: list[NewURL] = field(default_factory=list)
    #: Links not followed, by reason class (out_of_scope, invalid_url, url_length, depth, …).
    rejected: dict[str, int] = field(default_factory=dict)
    error: str | None = None


class Parser:
    """Turns fetched responses into records and links; one instance per worker process."""

    def __init__(
        self,
        spider_spec: str | None,
        scope_hosts: frozenset[str],
        scope: str,
        limits: TrapLimits | None = None,
    ) -> None:
        self.spider = load_spider(spider_spec)()
        self.source = str(self.spider.name)
        self.scope_hosts = scope_hosts
        self.scope = scope
        self.limits = limits or TrapLimits()

    def run(self, job: ParseJob) -> ParseResult:
        result = ParseResult()
        depth = job.depth + 1
        if 300 <= job.status < 400:
            # Redirects are followed by the crawler, not the HTTP library: the target becomes a
            # URL of its own and goes through the same discovery path (R14).
            loc = job.headers.get("location")
            if loc:
                self._follow(result, loc, job.url, depth, 0, job.kind)
            return result
        if job.kind == SITEMAP:
            if 200 <= job.status < 300:
                self._sitemap(result, job, depth)
            return result
        page = Page(
            job.url,
            job.status,
            job.headers,
            job.body,
            depth=job.depth,
            scope_hosts=self.scope_hosts,
            scope=self.scope,
        )
        if job.status >= 400 or not (page.is_html or self.spider.parse_non_html):
            return result
        try:
            for item in self.spider.parse(page) or ():
                if isinstance(item, Record):
                    result.records.append(self._record(item))
                elif isinstance(item, Link):
                    self._follow(result, item.url, page.base_url, depth, item.priority)
                elif isinstance(item, str):
                    self._follow(result, item, page.base_url, depth, 0)
                else:
                    raise TypeError(
                        f"spider yielded {type(item).__name__}; expected Record, Link or str"
                    )
        except MemoryError:
            return ParseResult(error="parse error: memory limit exceeded")
        except Exception as exc:  # a spider bug must fail this URL, not the crawl
            return ParseResult(error=f"parse error: {type(exc).__name__}: {exc}"[:500])
        return result

    def _record(self, rec: Record) -> RecordWrite:
        if not isinstance(rec.data, dict):
            raise TypeError(f"Record.data must be a dict, got {type(rec.data).__name__}")
        canonical_json(rec.data)  # fail here, in the worker, on unserialisable data
        return RecordWrite.make(self.source, str(rec.key), rec.data)

    def _sitemap(self, result: ParseResult, job: ParseJob, depth: int) -> None:
        """Sitemap entries and child sitemaps enter through the same discovery path (R12)."""
        parsed = parse_sitemap(job.body, base_url=job.url)
        now = time.time()
        for entry in parsed.urls:
            self._follow(result, entry.url, job.url, depth, priority_for(entry, now))
        for child in parsed.sitemaps:
            self._follow(result, child, job.url, depth, 5, SITEMAP)
        if parsed.invalid or parsed.cross_host:
            _count(result.rejected, "sitemap_invalid_or_cross_host")
        if parsed.truncated_reason:
            _count(result.rejected, "sitemap_truncated")

    def _follow(
        self,
        result: ParseResult,
        href: str,
        base: str,
        depth: int,
        prio: int,
        kind: str = PAGE,
    ) -> None:
        """The discovery path for every link: normalise, scope, trap checks (R9, R17)."""
        try:
            u = urls.normalise(href, base)
        except urls.InvalidURL:
            _count(result.rejected, "invalid_url")
            return
        if not urls.in_scope(u, self.scope_hosts, self.scope):
            _count(result.rejected, "out_of_scope")
            return
        trap = check_url(u, depth, self.limits)
        if trap is not None:
            _count(result.rejected, reason_class(trap))
            return
        result.links.append(NewURL(u, urls.host_key(u), priority=prio, depth=depth, kind=kind))


def _count(counts: dict[str, int], key: str) -> None:
    counts[key] = counts.get(key, 0) + 1


_worker: Parser | None = None


def init_worker(
    spider_spec: str | None,
    scope_hosts: frozenset[str],
    scope: str,
    limits: TrapLimits | None = None,
    memory_limit: int | None = None,
) -> None:
    """Process-pool initializer: cap the worker's memory, load the spider once (R18).

    A hostile page (or a spider bug) that makes the parser allocate without bound then fails
    with MemoryError — that URL is failed with the reason — instead of taking the machine down.
    """
    global _worker
    _limit_memory(memory_limit)
    _worker = Parser(spider_spec, scope_hosts, scope, limits)


def _limit_memory(limit: int | None) -> None:
    if not limit:
        return
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    cap = limit if hard == resource.RLIM_INFINITY else min(limit, hard)
    if soft == resource.RLIM_INFINITY or soft > cap:
        resource.setrlimit(resource.RLIMIT_AS, (cap, hard))


def parse_in_worker(job: ParseJob) -> ParseResult:
    if _worker is None:
        raise RuntimeError("parser worker not initialised")
    return _worker.run(job)


def warm_up() -> int:
    """A no-op task that makes the pool start its processes before the first page arrives."""
    return os.getpid()


def iter_records(items: Iterable[Any]) -> Iterator[Record]:
    """Helper for tests and tools: the Records among a spider's outputs."""
    return (i for i in items if isinstance(i, Record))
