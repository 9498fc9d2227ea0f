"""The spider author's loop: ``idemcrawl parse``, ``shell`` and ``new`` (issue 16).

``parse`` fetches one URL (through the crawler's own fetcher: the SSRF guard and the byte and
time limits apply, redirects are not followed) and runs one spider callback on it exactly as a
parser process would (scope = the URL's host, the trap checks, the request checks), and
reports what would be stored — records, and the requests with their callback, context,
method and frontier key — without touching any database. ``shell`` gives the same page to
a Python prompt. ``new`` writes a starter spider.
"""

from __future__ import annotations

import asyncio
import json
import keyword
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import url as urls
from .fetch import Fetcher, FetchError, FetchResult, FetchSettings
from .frontier.base import RequestSpec, request_url
from .parse import (
    Page,
    ParseJob,
    Parser,
    Request,
    Spider,
    from_form,
    load_spider,
    split_context,
)


class DevLoopError(Exception):
    """Bad input for ``parse``/``shell``/``new`` (reported as a usage error)."""


def fetch_one(
    url: str,
    settings: FetchSettings,
    *,
    method: str = "GET",
    headers: list[tuple[str, str]] | None = None,
    body: bytes | None = None,
) -> FetchResult:
    """One exchange with the crawler's fetcher; DevLoopError when there is no response."""
    try:
        target = urls.normalise(url)
    except urls.InvalidURL as exc:
        raise DevLoopError(str(exc)) from None

    async def go() -> FetchResult:
        async with Fetcher(settings, 1) as fetcher:
            return await fetcher.fetch(target, headers or None, method=method, body=body)

    try:
        return asyncio.run(go())
    except FetchError as exc:
        raise DevLoopError(f"fetch {target}: {exc}") from None


@dataclass
class ParsedOnce:
    """What one callback produced from one response, as it would be stored."""

    url: str
    status: int
    callback: str
    records: list[dict[str, Any]] = field(default_factory=list)
    requests: list[dict[str, Any]] = field(default_factory=list)
    rejected: dict[str, int] = field(default_factory=dict)
    error: str | None = None
    #: Where the callback's exception rose: its whole traceback but the parser's own frame.
    trace: str | None = None

    def as_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def request_spec(
    callback: str | None,
    data: dict[str, Any] | None,
    cb_kwargs: dict[str, Any] | None = None,
) -> RequestSpec | None:
    """The spec a page fetched for ``callback`` with context ``data`` (and ``cb_kwargs``)
    would have carried."""
    req = Request("http://spec.invalid/", callback, data, cb_kwargs=cb_kwargs)
    return req.spec()


def parse_once(
    spider_spec: str | None,
    res: FetchResult,
    *,
    callback: str | None = None,
    data: dict[str, Any] | None = None,
    scope: str = "host",
    cb_kwargs: dict[str, Any] | None = None,
) -> ParsedOnce:
    """Run ``callback`` (``parse`` by default) of the spider on the response, as the crawl's
    parser would, and describe the records and requests it would store."""
    parser = Parser(
        spider_spec, frozenset({urls.host_key(res.url)}), scope, simhash=False, trace_frames=None
    )
    spec = request_spec(callback, data, cb_kwargs)
    if spec is not None and (spec.callback is not None or cb_kwargs):
        # An unknown callback, or cb_kwargs it cannot take: a clear error now.
        parser.check_request(Request(res.url, spec.callback, cb_kwargs=cb_kwargs))
    job = ParseJob(res.url, res.status, res.headers, res.body, 0, "page", spec)
    result = parser.run(job)
    out = ParsedOnce(
        res.url, res.status, callback or "parse", error=result.error, trace=result.trace
    )
    out.rejected = dict(result.rejected)
    for r in result.records:
        out.records.append({"source": r.source, "key": r.key, "data": json.loads(r.data_json)})
    for u in result.links:
        s = u.request
        context, kwargs = split_context(s.data if s else None)
        out.requests.append(
            {
                "url": request_url(u.url),
                "key": u.url,
                "method": s.method if s else "GET",
                "callback": (s.callback if s else None) or "parse",
                "data": context,
                "cb_kwargs": kwargs,
                "headers": s.header_pairs() if s else [],
                "body": s.body.decode("utf-8", "replace") if s and s.body else None,
                "priority": u.priority,
                "kind": u.kind,
            }
        )
    return out


def format_parsed(p: ParsedOnce) -> str:
    """``idemcrawl parse``'s human-readable report."""
    lines = [f"{p.status} {p.url} -> {p.callback}"]
    if p.error:
        lines.append(f"error: {p.error}")
        if p.trace:
            lines.append("traceback (most recent call last):")
            lines += ["  " + line for line in p.trace.splitlines()]
    lines.append(f"records ({len(p.records)}):")
    lines += [
        f"  {r['key']}: {json.dumps(r['data'], ensure_ascii=False, sort_keys=True)}"
        for r in p.records
    ]
    lines.append(f"requests ({len(p.requests)}):")
    for q in p.requests:
        extra = f" data={json.dumps(q['data'], sort_keys=True)}" if q["data"] else ""
        if q["cb_kwargs"]:
            extra += f" cb_kwargs={json.dumps(q['cb_kwargs'], sort_keys=True)}"
        body = f" body={q['body']!r}" if q["body"] else ""
        lines.append(f"  {q['method']} {q['url']} -> {q['callback']}{extra}{body}")
    if p.rejected:
        lines.append(
            "not followed: " + ", ".join(f"{k} {n}" for k, n in sorted(p.rejected.items()))
        )
    return "\n".join(lines)


def shell_namespace(res: FetchResult, spider_spec: str | None) -> dict[str, Any]:
    """What ``idemcrawl shell`` puts at the prompt: the page, the spider, the API."""
    page = Page(res.url, res.status, res.headers, res.body, scope_hosts=frozenset(), scope="any")
    return {
        "page": page,
        "response": res,
        "spider": load_spider(spider_spec)(),
        "Request": Request,
        "from_form": from_form,
        "Spider": Spider,
    }


SHELL_BANNER = """idemcrawl shell: {status} {url} ({ctype}, {size} bytes)
  page.css(sel) page.xpath(q) page.json() page.links() page.follow(href, callback, data)
  from_form(page, css, data)  spider.<callback>(page)  response.headers
"""

_STARTER = '''"""{cls}: a starter spider (idemcrawl new {name}).

    idemcrawl parse URL --spider {name}.py:{cls}              # try one page
    idemcrawl crawl --db {name}.db --spider {name}.py:{cls}   # crawl from start_urls
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from idemcrawl import Page, Record, Spider


class {cls}(Spider):
    name = "{name}"
    start_urls = ("https://example.com/",)

    def parse(self, page: Page) -> Iterator[Any]:
        """A listing: follow each item to its detail page, with what only the listing says."""
        for item in page.css("a.item"):
            yield page.follow(item, self.parse_item, data={{"title": item.text()}})
        next_page = page.css_first("a[rel=next]")
        if next_page is not None:
            yield page.follow(next_page)

    def parse_item(self, page: Page) -> Iterator[Record]:
        """A detail page: page.data is what the listing gave it (kept across restarts)."""
        price = page.css_first(".price")
        yield Record(
            key=page.url,
            data={{"title": page.data.get("title"), "price": price.text() if price else None}},
        )
'''


def spider_class_name(name: str) -> str:
    """``my_shop`` -> ``MyShop``: the class ``new`` writes."""
    return "".join(part[:1].upper() + part[1:] for part in name.split("_") if part) or "Spider_"


def new_spider(name: str, directory: Path) -> Path:
    """Write ``NAME.py`` with a starter spider; refuses a bad name or an existing file."""
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name) or keyword.iskeyword(name):
        raise DevLoopError(f"spider name must be a Python identifier, got {name!r}")
    path = directory / f"{name}.py"
    if path.exists():
        raise DevLoopError(f"{path} exists already; not overwriting it")
    cls = spider_class_name(name)
    path.write_text(_STARTER.format(name=name, cls=cls), encoding="utf-8")
    return path
