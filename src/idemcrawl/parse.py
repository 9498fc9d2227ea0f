"""The parsing side: Page, the Spider API, and the code that runs inside parser processes.

Parsing is CPU work (HTML tree, link resolution), so it runs in worker processes while the event
loop keeps fetching (R19). A worker receives plain data (URL, status, headers, body) and returns
plain data (records ready to upsert, links already normalised and scope-checked), so nothing but
bytes and tuples crosses the process boundary.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import importlib.util
import inspect
import json as jsonlib
import logging
import operator
import os
import pickle
import re
import signal
import sys
import time
import types
import typing
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from multiprocessing.connection import Connection
from typing import Any, Final
from urllib.parse import urlencode

from selectolax.lexbor import LexborHTMLParser, LexborNode

from . import url as urls
from .dedup import page_simhash
from .encoding import detect_encoding
from .failures import TRACE_FRAMES, spider_trace
from .frontier.base import (
    DOWNLOAD,
    METHODS,
    PAGE,
    QUEUED,
    REQUISITE,
    SITEMAP,
    NewURL,
    RecordWrite,
    RequestSpec,
    request_key,
)
from .html_text import reader_text
from .sitemaps import parse_sitemap, priority_for
from .traps import TrapLimits, check_url, reason_class
from .warc_records import BuiltExchange, ExchangeSpec, build_page_exchange

#: Elements that bring in what a page renders with; ``link`` only for the ``_REQUISITE_RELS``.
_REQUISITE_CSS = (
    "link[href], script[src], img[src], img[srcset], source[src], source[srcset], "
    "video[src], video[poster], audio[src], embed[src], input[type=image][src]"
)
_REQUISITE_RELS = frozenset(
    {"stylesheet", "icon", "shortcut", "apple-touch-icon", "preload", "modulepreload", "manifest"}
)
#: Requisites taken from one page at most: a hostile page cannot enqueue thousands.
MAX_REQUISITES = 200


def _add_resolved(out: dict[str, None], resolve: Callable[[str], str], href: str) -> None:
    try:
        u = resolve(href.strip())
    except urls.InvalidURL:
        return
    if u.startswith(("http://", "https://")):
        out[u] = None


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


@dataclass(frozen=True, slots=True)
class Download:
    """A file to fetch and keep (image, PDF…): stored under the WARC directory's ``files/``,
    named by the SHA-256 of its content, so downloading it again overwrites instead of adding
    a copy. It is archived like any exchange but never parsed."""

    url: str
    priority: int = 0


#: Headers the HTTP client owns: a spider setting them would break the exchange's framing.
_MANAGED_HEADERS = frozenset(
    {"host", "content-length", "transfer-encoding", "connection", "keep-alive", "upgrade", "te"}
)
_UNSET: Any = object()
#: Sizes a request may store with its URL (bytes of JSON, body, header text): the frontier
#: keeps them for every such URL until the crawl's end, so a spider bug that puts a whole page
#: into ``data`` is refused where it happens instead of growing the database.
MAX_REQUEST_DATA = 64 * 1024
MAX_REQUEST_BODY = 1024 * 1024
MAX_REQUEST_HEADERS = 16 * 1024


def _limit(what: str, size: int, limit: int) -> None:
    if size > limit:
        raise ValueError(f"{what} is {size:,} bytes; at most {limit:,} are stored with a URL")


def _json_text(value: Any, what: str) -> str:
    """Strict JSON (no NaN, no ``default=``): what is stored is exactly what comes back."""
    try:
        return jsonlib.dumps(
            value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
        )
    except (TypeError, ValueError) as exc:
        raise TypeError(
            f"{what} must be JSON-serialisable (it is stored in the frontier): {exc}"
        ) from None


def _context_text(data: dict[str, Any], cb_kwargs: dict[str, Any]) -> str:
    """What the frontier stores as a request's context (``RequestSpec.data``): the JSON of
    ``data`` as before, or, with ``cb_kwargs``, the JSON array ``[data, cb_kwargs]`` (a stored
    ``data`` is always an object, so the two can never be confused); "" for neither."""
    if cb_kwargs:
        return _json_text([data, cb_kwargs], "Request data and cb_kwargs")
    return _json_text(data, "Request data") if data else ""


def split_context(text: str | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """A stored request context (:func:`_context_text`) back as ``(data, cb_kwargs)``."""
    if not text:
        return {}, {}
    value = jsonlib.loads(text)
    if isinstance(value, list) and len(value) == 2:
        data, kwargs = value
        if isinstance(data, dict) and isinstance(kwargs, dict):
            return data, kwargs
    return (value if isinstance(value, dict) else {}), {}


def _check_cb_kwargs_keys(cb_kwargs: Any) -> None:
    if not isinstance(cb_kwargs, dict):
        raise TypeError(f"Request cb_kwargs must be a dict, got {type(cb_kwargs).__name__}")
    for name in cb_kwargs:
        if not isinstance(name, str) or not name.isidentifier():
            raise TypeError(f"Request cb_kwargs keys must be argument names, got {name!r}")


#: Scrapy ``Request`` arguments with no counterpart here, and what to do instead.
_SCRAPY_REQUEST_ARGS = {
    "dont_filter": "a request's identity is method + URL + body and it is fetched once per "
    "crawl; --recrawl revisits on a schedule, and another body or method is another request",
    "errback": "a request that fails for good is recorded with its reason (the end of crawl "
    "and idemcrawl status list them; reparse --where-failed parses stored pages again); no "
    "spider method is called for it",
    "cookies": "cookies come from the crawl's jar (keep_cookies, on by default); send one of "
    "your own with headers={'Cookie': ...}",
    "encoding": "a str body is sent as UTF-8; give bytes for another encoding",
    "flags": "there are no request flags; data= carries your own markers",
    "formdata": "from_form(page, css, data) submits a page's form; Request(url, method='POST', "
    "body=urlencode(fields), headers={'Content-Type': 'application/x-www-form-urlencoded'}) "
    "sends fields of your own",
}


#: Scrapy's special ``Request.meta`` keys: settings for its middlewares, not context. Nothing
#: here reads them, so each is refused with what idemcrawl does instead (the rest of ``meta``
#: is the callback's context, ``page.meta``).
_SCRAPY_META = {
    "dont_redirect": "redirects are followed as URLs of their own (--max-redirects)",
    "redirect_urls": "redirects are followed as URLs of their own (--max-redirects)",
    "redirect_reasons": "redirects are followed as URLs of their own (--max-redirects)",
    "redirect_times": "redirects are followed as URLs of their own (--max-redirects)",
    "dont_retry": "transient errors are retried by the crawl (--max-retries)",
    "max_retry_times": "transient errors are retried by the crawl (--max-retries)",
    "retry_times": "transient errors are retried by the crawl (--max-retries)",
    "handle_httpstatus_list": "4xx/5xx responses are recorded (and 5xx retried), never parsed",
    "handle_httpstatus_all": "4xx/5xx responses are recorded (and 5xx retried), never parsed",
    "download_timeout": "the crawl's timeouts apply (--total-timeout, --read-timeout)",
    "download_maxsize": "the crawl's size caps apply (--max-bytes)",
    "download_warnsize": "the crawl's size caps apply (--max-bytes)",
    "download_fail_on_dataloss": "a cut response is recorded with its cut reason",
    "download_slot": "politeness is per host, enforced by the frontier",
    "download_latency": "response times are in the crawl's metrics",
    "dont_obey_robotstxt": "robots.txt is obeyed unless the operator passes --ignore-robots",
    "cookiejar": "one cookie jar per crawl: keep_cookies on the spider",
    "dont_merge_cookies": "one cookie jar per crawl: keep_cookies on the spider",
    "dont_cache": "every exchange is archived (WARC); reparse reads it back",
    "proxy": "requests are made directly; there is no proxy setting",
    "bindaddress": "requests are made directly; there is no bind address setting",
    "referrer_policy": "no Referer header is sent unless headers= gives one",
    "allow_offsite": "what is followed is the crawl's scope (--scope, allowed_domains)",
    "depth": "the depth is page.depth, counted by the crawl (--max-depth)",
    "playwright": "Request(url, render=True) renders the page in headless Chromium",
    "splash": "Request(url, render=True) renders the page in headless Chromium",
    "dont_filter": _SCRAPY_REQUEST_ARGS["dont_filter"],
}


def _meta_as_data(meta: Any, data: dict[str, Any] | None) -> dict[str, Any]:
    """``meta=`` as the request's context (``data``): a Scrapy user's meta, minus nothing."""
    if not isinstance(meta, dict):
        raise TypeError(f"Request meta must be a dict, got {type(meta).__name__}")
    if data:
        raise ValueError("Request takes data= or meta= (one context: page.data is page.meta)")
    for key in meta:
        why = _SCRAPY_META.get(key)
        if why is not None:
            raise ValueError(
                f"Request meta {key!r} is a Scrapy setting idemcrawl does not take: {why}; "
                "meta= here is only the callback's context (page.meta)"
            )
    return meta


def _refuse_request_arguments(other: dict[str, Any]) -> None:
    """A keyword ``Request`` does not take: Scrapy's named with the idemcrawl way, anything
    else as the TypeError Python would give, listing what it takes."""
    for name in other:
        why = _SCRAPY_REQUEST_ARGS.get(name)
        if why is not None:
            raise TypeError(f"Request does not take Scrapy's {name}=: {why}")
    raise TypeError(
        f"Request got unexpected keyword argument(s) {', '.join(sorted(other))}; it takes "
        "callback, data, method, headers, body, json, priority, render, cb_kwargs, meta"
    )


class Request:
    """A URL to fetch, and how: the method, headers and body to send, the spider method that
    parses the response (``callback``, by name) and context for it (``data``, given back as
    ``page.data``).

    Everything here is stored with the URL in the frontier, so after any crash the URL is
    fetched the same way and parsed by the same callback with the same context. Hence
    ``data`` must be a JSON object and ``callback`` a method of the spider, named or given
    (``self.parse_item``); both are checked where the request is made or yielded, not when
    the response comes back. ``json=`` sends a JSON body (POST unless ``method`` says
    otherwise). Identity for dedup is method + URL + body (``frontier.base.request_key``):
    callback, data, headers and priority do not make a request new.

    For Scrapy ports: ``cb_kwargs`` (a JSON object too, stored the same way) is passed to the
    callback as keyword arguments, checked against its signature when the request is yielded;
    ``meta`` is another name for ``data`` (``page.meta`` is ``page.data``), and Scrapy's
    special meta keys (``dont_redirect``, ``proxy``, …) are refused, naming the idemcrawl way,
    since nothing here would act on them.
    """

    __slots__ = (
        "body", "callback", "cb_kwargs", "data", "headers", "method", "priority", "render", "url",
    )  # fmt: skip

    def __init__(
        self,
        url: str,
        callback: str | Callable[..., Any] | None = None,
        data: dict[str, Any] | None = None,
        *,
        method: str | None = None,
        headers: dict[str, str] | Iterable[tuple[str, str]] | None = None,
        body: bytes | str | None = None,
        json: Any = _UNSET,
        priority: int = 0,
        render: bool = False,
        cb_kwargs: dict[str, Any] | None = None,
        meta: dict[str, Any] | None = None,
        **other: Any,
    ) -> None:
        if other:
            _refuse_request_arguments(other)
        if not isinstance(url, str) or not url:
            raise TypeError(f"Request url must be a non-empty str, got {url!r}")
        self.url = url
        if callback is not None and not isinstance(callback, str):
            name = getattr(callback, "__name__", None)
            if not (inspect.ismethod(callback) or inspect.isfunction(callback)) or not name:
                raise TypeError(
                    f"Request callback must be a spider method or its name, got {callback!r}"
                )
            callback = name
        self.callback: str | None = None if callback in (None, "parse") else callback
        if meta is not None:
            data = _meta_as_data(meta, data)
        if data is not None and not isinstance(data, dict):
            raise TypeError(f"Request data must be a dict, got {type(data).__name__}")
        self.data: dict[str, Any] = data or {}
        if cb_kwargs is not None:
            _check_cb_kwargs_keys(cb_kwargs)
        #: Keyword arguments for the callback (Scrapy's ``cb_kwargs``), stored like ``data``.
        self.cb_kwargs: dict[str, Any] = cb_kwargs or {}
        _limit("Request data", len(_context_text(self.data, self.cb_kwargs)), MAX_REQUEST_DATA)
        pairs: list[tuple[str, str]] = []
        items = headers.items() if isinstance(headers, dict) else (headers or ())
        for name, value in items:
            name, value = str(name), str(value)
            if name.lower() in _MANAGED_HEADERS:
                raise ValueError(f"Request header {name!r} is set by the HTTP client, not a spider")
            if "\r" in name + value or "\n" in name + value:
                raise ValueError(f"Request header {name!r} contains a line break")
            pairs.append((name, value))
        if json is not _UNSET:
            if body is not None:
                raise ValueError("Request takes body= or json=, not both")
            body = _json_text(json, "Request json").encode()
            if not any(n.lower() == "content-type" for n, _ in pairs):
                pairs.append(("Content-Type", "application/json"))
            method = method or "POST"
        self.method = (method or "GET").upper()
        if self.method not in METHODS:
            raise ValueError(f"Request method {method!r} is not one of {', '.join(METHODS)}")
        self.headers: tuple[tuple[str, str], ...] = tuple(pairs)
        self.body: bytes | None = body.encode() if isinstance(body, str) else body
        if self.body is not None and not isinstance(self.body, bytes):
            raise TypeError(f"Request body must be bytes or str, got {type(body).__name__}")
        _limit("Request body", len(self.body or b""), MAX_REQUEST_BODY)
        _limit("Request headers", sum(len(k) + len(v) for k, v in pairs), MAX_REQUEST_HEADERS)
        self.priority = int(priority)
        #: Run the response in headless Chromium before the callback sees it (``crawl
        #: --render`` does it for every page; this for one request).
        self.render = bool(render)

    def spec(self) -> RequestSpec | None:
        """What the frontier stores for it; None for a plain GET parsed by ``parse``."""
        if (
            self.method == "GET"
            and self.callback is None
            and not self.data
            and not self.cb_kwargs
            and not self.headers
            and not self.body
            and not self.render
        ):
            return None
        data = _context_text(self.data, self.cb_kwargs) or None
        _limit("Request data", len(data or ""), MAX_REQUEST_DATA)  # changed since it was made?
        return RequestSpec(
            self.method,
            self.callback,
            data,
            _json_text([list(p) for p in self.headers], "headers") if self.headers else None,
            self.body,
            self.render,
        )

    def __repr__(self) -> str:
        cb = f" callback={self.callback}" if self.callback else ""
        return f"<Request {self.method} {self.url}{cb}>"


class Node:
    """A thin, stable wrapper over the HTML parser's node, so spiders do not depend on it."""

    __slots__ = ("_node",)

    def __init__(self, node: LexborNode) -> None:
        self._node = node

    def text(self, strip: bool = True, *, raw: bool = False) -> str:
        """The element's text as a reader sees it (``idemcrawl.html_text``).

        ``<p>Hello <b>world</b></p>`` gives ``Hello world``; ``<li>a</li><li>b</li>`` gives
        ``a b``; whitespace runs collapse to one space. ``strip=False`` keeps one space at an
        end that had whitespace. ``raw=True`` gives the character data exactly as written in
        the document, concatenated (no collapsing, scripts included).
        """
        if raw:
            return self._node.text(deep=True, separator="", strip=False)
        return reader_text(self._node, strip=strip)

    @property
    def attrs(self) -> dict[str, str | None]:
        return dict(self._node.attributes)

    @property
    def tag(self) -> str:
        return self._node.tag or ""

    @property
    def html(self) -> str:
        return self._node.html or ""

    def css(self, selector: str) -> Matches[Any]:
        """Elements under this one (and itself) that ``selector`` matches, as :class:`Node`;
        with ``::text`` or ``::attr(name)`` at the end, strings, as in parsel."""
        return _css(self._node, self._node.css, selector)

    def css_first(self, selector: str) -> Any:
        """The first of :meth:`css`, or None."""
        return _css_first(self._node, self._node.css, self._node.css_first, selector)

    def __repr__(self) -> str:
        return f"<Node {self.tag}>"


T = typing.TypeVar("T")


class Matches(list[T]):
    """What ``css()`` and ``xpath()`` return: a plain list, plus parsel's ``SelectorList``
    readers, so ``page.css("h1::text").get()`` ports from Scrapy as it is."""

    __slots__ = ()

    def get(self, default: str | None = None) -> str | None:
        """The first match as a string (an element as its HTML, like parsel), or ``default``."""
        return _match_text(self[0]) if self else default

    def getall(self) -> list[str]:
        """Every match as a string (elements as their HTML)."""
        return [_match_text(x) for x in self]

    extract_first = get  # parsel's older names, still in many Scrapy spiders
    extract = getall


def _css(
    root: LexborNode | None, css: Callable[[str], list[LexborNode]], selector: str
) -> Matches[Any]:
    """``css()`` of a page (``root`` its tree's root) or of an element: :class:`Node`s, or
    the strings of a ``::text`` / ``::attr()`` selector."""
    if "::" in selector:
        plan = _pseudo_plan(selector)
        if plan is not None:
            return _pseudo_matches(root, css, plan)
    return Matches(map(Node, css(selector)))


def _css_first(
    root: LexborNode | None,
    css: Callable[[str], list[LexborNode]],
    css_first: Callable[[str], LexborNode | None],
    selector: str,
) -> Any:
    """``css_first()``: selectolax's own first match, unless the selector has pseudo-elements."""
    if "::" in selector:
        found = _css(root, css, selector)
        return found[0] if found else None
    n = css_first(selector)
    return None if n is None else Node(n)


def _match_text(item: Any) -> str:
    return item if isinstance(item, str) else str(item.html)


@dataclass(frozen=True, slots=True)
class _Pseudo:
    """One selector group ending in ``::text`` or ``::attr(name)``, as parsel reads it."""

    #: The elements' selector; "" for the context element itself.
    select: str
    #: The elements and all their descendants (``p ::text``, ``p *::text``, ``::text``),
    #: else the elements alone (``p::text``: p's own text children).
    subtree: bool
    #: The attribute to read; None for text nodes.
    attr: str | None


_PSEUDO_RE = re.compile(r"::(?:(text)|attr\(\s*['\"]?([^'\"()\s]+)['\"]?\s*\))\s*$")
#: Selectors already read (spiders use a few, on every page); None for those without one.
_PLANS: dict[str, tuple[_Pseudo, ...] | None] = {}


def _selector_groups(selector: str) -> list[str]:
    """``selector`` split at its top-level commas (not those in brackets or quotes)."""
    groups, depth, quote, start = [], 0, "", 0
    for i, c in enumerate(selector):
        if quote:
            quote = "" if c == quote else quote
        elif c in "'\"":
            quote = c
        elif c in "([":
            depth += 1
        elif c in ")]":
            depth -= 1
        elif c == "," and depth == 0:
            groups.append(selector[start:i])
            start = i + 1
    groups.append(selector[start:])
    return groups


def _pseudo_plan(selector: str) -> tuple[_Pseudo, ...] | None:
    """How to evaluate a selector with parsel's pseudo-elements (selectolax has none), or
    None when it has none; ValueError for one that cannot be evaluated here."""
    try:
        return _PLANS[selector]
    except KeyError:
        pass
    parts: list[_Pseudo | None] = []
    for group in _selector_groups(selector):
        m = _PSEUDO_RE.search(group)
        rest = group if m is None else group[: m.start()]
        if "::" in rest:
            raise ValueError(
                f"css {selector!r}: the pseudo-elements supported are ::text and "
                "::attr(name), at the end of a selector"
            )
        if m is None:
            parts.append(None)
            continue
        text = rest.strip()
        head = text[:-1].rstrip()
        if text in ("", "*"):
            part = _Pseudo("", True, m.group(2))
        elif rest[-1].isspace() and text[-1] not in ">+~":  # "p ::text"
            part = _Pseudo(text, True, m.group(2))
        elif text[-1] == "*" and head != text[:-1] and head[-1] not in ">+~":  # "p *::text"
            part = _Pseudo(head, True, m.group(2))
        elif text[-1] in ">+~":  # "div > ::text" is "div > *::text"
            part = _Pseudo(text + " *", False, m.group(2))
        else:
            part = _Pseudo(text, False, m.group(2))
        parts.append(part)
    plan: tuple[_Pseudo, ...] | None = None
    if any(p is not None for p in parts):
        if any(p is None for p in parts):
            raise ValueError(
                f"css {selector!r}: groups with and without ::text/::attr() in one selector; "
                "select the elements and the strings in two calls"
            )
        plan = tuple(p for p in parts if p is not None)
    if len(_PLANS) >= 1024:
        _PLANS.clear()
    _PLANS[selector] = plan
    return plan


def _pseudo_matches(
    root: LexborNode | None, css: Callable[[str], list[LexborNode]], plan: tuple[_Pseudo, ...]
) -> Matches[Any]:
    """The strings a pseudo-element selector gives, as parsel would: text nodes as they are
    (whitespace kept) in document order, attribute values of the elements that have it.

    Two orders differ from parsel's, to keep the common case one selectolax query and no
    tree walk: the text of an element matched inside another matched one comes after all of
    the outer one's (``div::text`` on nested divs), and groups with different
    pseudo-elements (``h1::text, a::attr(href)``) come group by group."""
    out: Matches[Any] = Matches()
    batches = [plan] if len({(p.subtree, p.attr) for p in plan}) == 1 else [(p,) for p in plan]
    for batch in batches:
        subtree, attr = batch[0].subtree, batch[0].attr
        if any(not p.select for p in batch):
            elements = [] if root is None else [root]
        else:
            elements = css(", ".join(p.select for p in batch))
        if subtree:  # each element and its descendants, each node once
            seen: set[int] = set()
            nodes = []
            for el in elements:
                for n in el.traverse(include_text=attr is None):
                    if n.mem_id not in seen:
                        seen.add(n.mem_id)
                        nodes.append(n)
        else:
            nodes = elements
        if attr is not None:
            for el in nodes:
                attrs = el.attributes
                if attr in attrs:
                    value = attrs[attr]
                    out.append("" if value is None else value)
        elif subtree:
            out.extend(n.text_content or "" for n in nodes if n.is_text_node)
        else:
            for el in nodes:
                texts = el.iter(include_text=True)
                out.extend(c.text_content or "" for c in texts if c.is_text_node)
    return out


class XNode:
    """An element found by :meth:`Page.xpath`: the lxml element behind a small stable API
    (the same names as :class:`Node`), so spiders do not depend on lxml's."""

    __slots__ = ("_el",)

    def __init__(self, el: Any) -> None:
        self._el = el

    def text(self) -> str:
        """The element's text, whitespace runs collapsed to one space and stripped."""
        return " ".join("".join(self._el.itertext()).split())

    @property
    def attrs(self) -> dict[str, str]:
        return dict(self._el.attrib)

    @property
    def tag(self) -> str:
        return str(self._el.tag)

    @property
    def html(self) -> str:
        from lxml import html as lxml_html

        return str(lxml_html.tostring(self._el, encoding="unicode", with_tail=False))

    def xpath(self, query: str) -> Matches[Any]:
        """``query`` relative to this element (``.//a/@href``)."""
        return _xpath_results(self._el.xpath(query))

    def __repr__(self) -> str:
        return f"<XNode {self.tag}>"


def _xpath_results(found: Any) -> Matches[Any]:
    """Elements as :class:`XNode`, strings (attributes, text()) as plain ``str``, a number or
    boolean result as a one-item list of its string."""
    if not isinstance(found, list):
        return Matches([str(found)])
    return Matches(str(x) if isinstance(x, str) else XNode(x) for x in found)


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
        request: RequestSpec | None = None,
        allowed_domains: frozenset[str] = frozenset(),
    ) -> None:
        self.url = url
        self.status = status
        self.headers = headers
        self.body = body
        self.depth = depth
        #: How this URL was requested (None: a plain GET for ``parse``).
        self.request = request
        self._scope_hosts = scope_hosts
        self._scope = scope
        self._domains = allowed_domains
        #: What :meth:`links` returned, with each URL's host key: normalised and in scope
        #: already, so the parser does not redo that when the spider yields them.
        self._checked_links: dict[str, str] = {}
        #: What :meth:`links` left out as out of scope, counted with the page's rejections so
        #: a crawl can say what it did not follow.
        self._out_of_scope: set[str] = set()

    @property
    def method(self) -> str:
        return self.request.method if self.request else "GET"

    @property
    def callback(self) -> str:
        """The name of the spider method this page was fetched for."""
        return (self.request.callback if self.request else None) or "parse"

    @cached_property
    def data(self) -> dict[str, Any]:
        """The context the request carried (``Request(data=…)``), back from the frontier: the
        same after any restart. Empty when the request had none."""
        if self.request is None or not self.request.data:
            return {}
        return split_context(self.request.data)[0]

    @property
    def meta(self) -> dict[str, Any]:
        """``page.data`` under Scrapy's name (``Request(meta=…)`` is ``Request(data=…)``)."""
        return self.data

    @cached_property
    def cb_kwargs(self) -> dict[str, Any]:
        """The keyword arguments the callback is called with (``Request(cb_kwargs=…)``)."""
        if self.request is None or not self.request.data:
            return {}
        return split_context(self.request.data)[1]

    def json(self) -> Any:
        """The body parsed as JSON (any content type); ValueError with the reason if it is not."""
        try:
            return jsonlib.loads(self.text)
        except ValueError as exc:
            raise ValueError(f"{self.url}: body is not JSON: {exc}") from None

    def follow(
        self, href: str | Node | XNode, callback: str | Callable[..., Any] | None = None,
        data: dict[str, Any] | None = None, **kwargs: Any,
    ) -> Request:  # fmt: skip
        """A :class:`Request` for ``href`` (a string or an element with ``href``/``src``) resolved
        against this page, like the links of the page itself."""
        if isinstance(href, Node | XNode):
            value = href.attrs.get("href") or href.attrs.get("src")
            if not value:
                raise ValueError(f"follow() got {href!r}, which has no href")
            href = value
        url = self.resolver.resolve(href.strip())
        return Request(url, callback, data, **kwargs)

    def follow_all(
        self, hrefs: Iterable[str | Node | XNode] | None = None, *, css: str | None = None,
        callback: str | Callable[..., Any] | None = None, data: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> list[Request]:  # fmt: skip
        """Requests for every ``href`` given, or for the ``href`` of every element ``css``
        selects (``page.follow_all(css="a.product")``), each once, in document order; hrefs
        that are not valid URLs are skipped."""
        if (hrefs is None) == (css is None):
            raise ValueError("follow_all takes hrefs or css=, exactly one of them")
        items: Iterable[str | Node | XNode] = hrefs if hrefs is not None else self.css(css or "")
        out: dict[str, Request] = {}
        for h in items:
            if isinstance(h, Node | XNode) and not (h.attrs.get("href") or h.attrs.get("src")):
                continue
            try:
                req = self.follow(h, callback, data, **kwargs)
            except urls.InvalidURL:
                continue
            out.setdefault(req.url, req)
        return list(out.values())

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

    def css(self, selector: str) -> Matches[Any]:
        """Elements ``selector`` matches, as :class:`Node`, in document order; with ``::text``
        or ``::attr(name)`` at the end (``a.next::attr(href)``, ``p ::text``), strings, as
        parsel gives them. ``.get()`` / ``.getall()`` read the result as parsel's do."""
        tree = self._tree
        return _css(tree.root, tree.css, selector)

    def css_first(self, selector: str) -> Any:
        """The first of :meth:`css` (a :class:`Node`, or a string for ``::text`` and
        ``::attr()``), or None."""
        tree = self._tree
        return _css_first(tree.root, tree.css, tree.css_first, selector)

    @cached_property
    def _lxml_tree(self) -> Any:
        """The document parsed by lxml, only when a spider uses XPath (selectolax, which
        ``css()`` uses, has no XPath). Parsed from the bytes with the detected encoding, so an
        XML declaration in the text cannot make lxml refuse it."""
        from lxml import etree
        from lxml import html as lxml_html

        if not self.body.strip():
            return None
        parser = lxml_html.HTMLParser(encoding=self.encoding)
        try:
            return lxml_html.document_fromstring(self.body, parser=parser)
        except (etree.ParserError, ValueError):
            return None

    def xpath(self, query: str) -> Matches[Any]:
        """XPath 1.0 over the page (lxml): elements as :class:`XNode`, attribute and text
        results as ``str`` (``page.xpath("//a[@class='next']/@href")``). An invalid
        expression raises ValueError with lxml's reason."""
        from lxml import etree

        tree = self._lxml_tree
        if tree is None:
            return Matches()
        try:
            return _xpath_results(tree.xpath(query))
        except etree.XPathError as exc:
            raise ValueError(f"invalid XPath {query!r}: {exc}") from None

    def xpath_first(self, query: str) -> XNode | str | None:
        found = self.xpath(query)
        return found[0] if found else None

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

    @cached_property
    def resolver(self) -> urls.Resolver:
        """``normalise(href, page.base_url)`` with fast paths for the page's many links."""
        return urls.Resolver(self.base_url)

    def links(self) -> list[str]:
        """Absolute, normalised, in-scope links of the page, each once, in document order."""
        if not self.is_html:
            return []
        out: dict[str, str] = {}
        resolver = self.resolver
        resolve = resolver.resolve
        host_key = urls.host_key
        in_scope = self.in_scope
        # Scope is decided by the host key alone in every mode (same origin, same site, any,
        # allowed domains).
        scoped: dict[str, bool] = {}
        hrefs = [node.attributes.get("href") for node in self._tree.css("a[href], area[href]")]
        # Plain same-origin links joined in one C call (their host key is the page's origin);
        # None for the others, which take the whole path below.
        plain = resolver.resolve_many(hrefs)
        origin = resolver.origin
        origin_ok = bool(origin) and in_scope(origin + "/")
        for href, u in zip(hrefs, plain, strict=True):
            if u is not None:
                if origin_ok:
                    if u not in out:
                        out[u] = origin
                else:
                    self._out_of_scope.add(u)
                continue
            if not href:
                continue
            try:
                u = resolve(href)
            except urls.InvalidURL:
                continue
            if u in out:
                continue
            hk = host_key(u)
            ok = scoped.get(hk)
            if ok is None:
                ok = scoped[hk] = in_scope(u)
            if ok:
                out[u] = hk
            else:
                self._out_of_scope.add(u)
        self._checked_links.update(out)
        return list(out)

    def in_scope(self, url: str) -> bool:
        """Whether the crawl would follow ``url`` (normalised): in its scope and, when the
        spider has ``allowed_domains``, on one of them or a subdomain."""
        return urls.in_scope(url, self._scope_hosts, self._scope, self._domains)

    def requisites(self) -> list[str]:
        """Absolute URLs of what the page needs to render (stylesheets, scripts, images, icons,
        media), each once, in document order, on any host: what a browser would load with it
        and what a replay needs (``--requisites``, like wget's ``-p``)."""
        if not self.is_html:
            return []
        out: dict[str, None] = {}
        resolve = self.resolver.resolve
        for node in self._tree.css(_REQUISITE_CSS):
            attrs = node.attributes
            if node.tag == "link":
                rel = (attrs.get("rel") or "").lower().split()
                if not _REQUISITE_RELS.intersection(rel):
                    continue
            for name in ("href", "src", "poster"):
                value = attrs.get(name)
                if value:
                    _add_resolved(out, resolve, value)
            srcset = attrs.get("srcset")
            if srcset:
                for candidate in srcset.split(","):
                    parts = candidate.split()
                    if parts:
                        _add_resolved(out, resolve, parts[0])
            if len(out) >= MAX_REQUISITES:
                break
        return list(out)[:MAX_REQUISITES]


#: Spider loggers this process has set up (``Spider.logger``).
_LOGGERS_READY: set[str] = set()
_LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def spider_log_level(cls: type) -> int:
    """The level of a spider's ``self.logger``: INFO, or its ``custom_settings``
    ``LOG_LEVEL`` (one of DEBUG … CRITICAL); ``LOG_ENABLED: False`` silences it."""
    raw = getattr(cls, "custom_settings", None) or {}
    if not isinstance(raw, Mapping):
        return logging.INFO  # refused with its reason by config.spider_settings
    if raw.get("LOG_ENABLED", True) is False:
        return logging.CRITICAL + 1
    level = raw.get("LOG_LEVEL", "INFO")
    if level not in _LOG_LEVELS:
        raise SpiderLoadError(
            f"{cls.__name__}.custom_settings['LOG_LEVEL'] must be one of "
            f"{', '.join(_LOG_LEVELS)}, got {level!r}"
        )
    return int(getattr(logging, level))


class Spider:
    """Subclass this: set ``name`` (the records' source) and implement ``parse``.

    ``parse`` yields :class:`Record` items and URLs (``str`` or :class:`Link`) to follow. The
    default implementation follows every in-scope link and stores no records, which makes a plain
    crawler out of the base class.

    A spider may have more callbacks: any method taking a :class:`Page`, named by a
    :class:`Request` (``Request(url, callback="parse_item", data={...})`` or
    ``page.follow(href, self.parse_item)``); its page then has ``page.data``. A callback named
    explicitly gets the response whatever its content type (JSON, images, …); ``parse`` gets
    HTML only unless ``parse_non_html`` is set. A request's ``cb_kwargs`` come as keyword
    arguments after the page; a callback may be ``async def`` (returning its items, or an
    async generator yielding them): the parser runs it to completion.
    """

    name: str = "default"
    #: Call ``parse`` for non-HTML responses too (their links are never extracted).
    parse_non_html: bool = False
    #: Where a crawl with this spider starts (``crawl --spider`` then needs no seed URL).
    start_urls: Iterable[str] = ()
    #: Keep a cookie jar for the crawl (a login's session), as Scrapy, Crawlee and browsers
    #: do: stored in the frontier, shared by every crawl process, kept across restarts
    #: (``idemcrawl.cookies``). ``False`` sends no cookie at all. A crawl without a spider
    #: (plain link following from seeds) keeps none: it has no session to keep, and a broad
    #: crawl should not carry tracking cookies from page to page.
    keep_cookies: bool = True
    #: What every record's data must be: a dataclass or a pydantic model (anything with
    #: ``model_validate``). A record that does not fit fails its URL with the reason (fix the
    #: spider, then ``idemcrawl reparse --where-failed``); what is stored is the validated data
    #: (defaults filled in).
    record_schema: type | None = None
    #: Run every HTML page in headless Chromium before parsing it, as ``crawl --render`` does
    #: (``Request(url, render=True)`` asks for it one request at a time).
    render: bool = False
    #: Domains this spider may fetch from (Scrapy's ``allowed_domains``): a URL whose host is
    #: none of them nor a subdomain of one is not followed (links, requests, redirects and
    #: sitemap entries; seeds and start requests are the operator's and always go). With
    #: it, ``crawl`` defaults to ``--scope any`` so these domains alone decide; an explicit
    #: ``--scope`` applies as well.
    allowed_domains: Iterable[str] = ()
    #: Crawl settings this spider needs (Scrapy's ``custom_settings``): Scrapy names with an
    #: idemcrawl equivalent (``DOWNLOAD_DELAY``, ``USER_AGENT``, …) or crawl setting names
    #: (``delay``); anything else is refused. Above the built-in defaults, below ``--config``
    #: and the command line (``config.spider_settings``).
    custom_settings: Mapping[str, Any] | None = None

    @property
    def logger(self) -> logging.Logger:
        """A standard logger named after the spider, as Scrapy's ``self.logger``. Unless the
        program set up logging itself, its records reach stderr as ``[name] LEVEL: message``
        from INFO up, as Scrapy shows them (``custom_settings`` ``LOG_LEVEL`` / ``LOG_ENABLED``
        change that, for this spider only)."""
        log = logging.getLogger(str(self.name))
        if log.name not in _LOGGERS_READY:
            _LOGGERS_READY.add(log.name)
            log.setLevel(spider_log_level(type(self)))
            if not log.handlers and not logging.getLogger().handlers:
                handler = logging.StreamHandler(sys.stderr)
                handler.setFormatter(logging.Formatter("[%(name)s] %(levelname)s: %(message)s"))
                log.addHandler(handler)
                log.propagate = False
        return log

    def process_record(self, record: Record) -> Record | None:
        """Clean a record before it is validated and stored; None drops it."""
        return record

    def start_requests(self) -> Iterable[Request | Link | str]:
        """The crawl's first requests, added (if new) at every start of a crawl process; their
        hosts join the crawl's scope like seed URLs. By default ``start_urls``, for ``parse``."""
        yield from self.start_urls

    def parse(self, page: Page) -> Iterable[Record | Link | str]:
        yield from page.links()


#: Input types a browser never submits by themselves (a submit button only when clicked).
_UNSUBMITTED = frozenset({"submit", "button", "image", "reset", "file"})


def _form_fields(form: Node) -> list[tuple[str, str]]:
    """What a browser would submit for ``form`` as it stands: named, enabled controls, checked
    boxes only, each select's chosen options (its first without a choice), textareas."""
    fields: list[tuple[str, str]] = []
    for el in form.css("input, select, textarea"):
        attrs = el.attrs
        name = attrs.get("name")
        if not name or "disabled" in attrs:
            continue
        if el.tag == "input":
            kind = (attrs.get("type") or "text").lower()
            if kind in _UNSUBMITTED:
                continue
            if kind in ("checkbox", "radio"):
                if "checked" in attrs:
                    fields.append((name, attrs.get("value") or "on"))
                continue
            fields.append((name, attrs.get("value") or ""))
        elif el.tag == "select":
            options = el.css("option")
            chosen = [o for o in options if "selected" in o.attrs]
            if not chosen and options and "multiple" not in attrs:
                chosen = options[:1]
            for o in chosen:
                value = o.attrs.get("value")
                fields.append((name, value if value is not None else o.text()))
        else:  # textarea
            fields.append((name, el.text(raw=True)))
    return fields


def from_form(
    page: Page,
    css: str | None = None,
    data: dict[str, str | Iterable[str]] | None = None,
    *,
    callback: str | Callable[..., Any] | None = None,
    context: dict[str, Any] | None = None,
    headers: dict[str, str] | None = None,
    priority: int = 0,
    cb_kwargs: dict[str, Any] | None = None,
    meta: dict[str, Any] | None = None,
) -> Request:
    """A :class:`Request` submitting the page's form (the first, or the first ``css`` selects)
    the way a browser would: its hidden fields kept (CSRF tokens), its current values, then
    ``data`` filled in (a name given replaces that field where it stands, a new name goes at
    the end; a list gives several values). The
    form's method (GET or POST, urlencoded) and action (resolved against the page) decide
    where it goes; ``callback`` and ``context`` (the callback's ``page.data``; ``meta`` is
    another name for it), ``cb_kwargs`` as for any Request. A form that is missing or that
    needs multipart encoding is a ValueError.
    """
    form = page.css_first(css or "form")
    if form is None or form.tag != "form":
        what = f"matching {css!r}" if css else ""
        raise ValueError(f"from_form: no form {what} on {page.url}".replace("  ", " "))
    enctype = (form.attrs.get("enctype") or "").lower()
    if enctype.startswith("multipart/"):
        raise ValueError(f"from_form: {enctype} forms are not supported ({page.url})")
    given = {
        name: [value] if isinstance(value, str) else [str(v) for v in value]
        for name, value in (data or {}).items()
    }
    fields: list[tuple[str, str]] = []
    placed: set[str] = set()
    for name, value in _form_fields(form):
        if name not in given:
            fields.append((name, value))
        elif name not in placed:  # where the form has the field, as a browser sends it
            fields += [(name, v) for v in given[name]]
            placed.add(name)
    fields += [(n, v) for n, vs in given.items() if n not in placed for v in vs]
    method = (form.attrs.get("method") or "GET").upper()
    action = (form.attrs.get("action") or "").strip() or page.url
    url = page.resolver.resolve(action)
    encoded = urlencode(fields)
    if method != "POST":
        base = url.split("?", 1)[0]
        return Request(
            f"{base}?{encoded}" if encoded else base, callback, context,
            headers=headers, priority=priority, cb_kwargs=cb_kwargs, meta=meta,
        )  # fmt: skip
    sent = {"Content-Type": "application/x-www-form-urlencoded", **(headers or {})}
    return Request(
        url, callback, context, method="POST", headers=sent, body=encoded, priority=priority,
        cb_kwargs=cb_kwargs, meta=meta,
    )  # fmt: skip


def _check_cb_kwargs(fn: Callable[..., Any], name: str, cb_kwargs: dict[str, Any]) -> None:
    """Refuse, where the request is made, ``cb_kwargs`` its callback could not be called with
    (Scrapy finds out when the response comes back; here that is after any restart)."""
    try:
        inspect.signature(fn).bind(None, **cb_kwargs)
    except TypeError as exc:
        raise TypeError(
            f"callback {name} cannot take cb_kwargs {', '.join(sorted(cb_kwargs))}: {exc}"
        ) from None
    except ValueError:  # no signature to check (a builtin): the call will tell
        pass


def start_links(spider: Spider) -> list[NewURL]:
    """The spider's :meth:`Spider.start_requests` as frontier URLs (normalised, keyed and
    checked like yielded requests; priority 1 like seeds, plus the request's own)."""
    out: list[NewURL] = []
    for item in spider.start_requests() or ():
        if isinstance(item, str):
            item = Request(item)
        elif isinstance(item, Link):
            item = Request(item.url, priority=item.priority)
        elif not isinstance(item, Request):
            raise TypeError(
                f"start_requests yielded {type(item).__name__}; expected Request, Link or str"
            )
        if item.callback is not None or item.cb_kwargs:
            fn = getattr(spider, item.callback or "parse", None)
            if not callable(fn) or (item.callback or "").startswith("_"):
                raise ValueError(
                    f"unknown callback {item.callback!r}: "
                    f"{type(spider).__name__} has no such method"
                )
            if item.cb_kwargs:
                _check_cb_kwargs(fn, item.callback or "parse", item.cb_kwargs)
        try:
            u = urls.normalise(item.url)
        except urls.InvalidURL as exc:
            raise ValueError(f"start request {item.url!r} is not a valid URL: {exc}") from None
        key = request_key(u, item.method, item.body)
        out.append(NewURL(key, urls.host_key(u), 1 + item.priority, request=item.spec()))
    return out


class InvalidRecord(ValueError):
    """A record that does not fit the spider's ``record_schema``."""


def _type_ok(value: Any, hint: Any) -> bool | None:
    """Whether ``value`` fits a simple annotation (None: not one we check)."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        verdicts = [_type_ok(value, h) for h in typing.get_args(hint)]
        return None if None in verdicts else any(verdicts)
    if hint is Any:
        return True
    if hint is None or hint is type(None):
        return value is None
    cls = origin or hint
    if cls in (list, tuple, set, frozenset, Sequence):
        return isinstance(value, list)
    if cls in (dict, Mapping):
        return isinstance(value, dict)
    if cls is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if cls is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if cls in (str, bool):
        return isinstance(value, cls)
    return None


def validate_record(schema: type, data: dict[str, Any]) -> dict[str, Any]:
    """``data`` checked against a dataclass or pydantic ``schema``; the data to store, or
    :class:`InvalidRecord` saying what is wrong."""
    name = schema.__name__
    validate = getattr(schema, "model_validate", None)
    if validate is not None:  # pydantic v2 (or a look-alike)
        try:
            return dict(validate(data).model_dump(mode="json"))
        except Exception as exc:
            raise InvalidRecord(f"does not fit {name}: {exc}") from None
    if not dataclasses.is_dataclass(schema):
        raise TypeError(f"record_schema {name} is neither a dataclass nor a pydantic model")
    fields = {f.name: f for f in dataclasses.fields(schema) if f.init}
    extra = sorted(set(data) - set(fields))
    if extra:
        raise InvalidRecord(f"does not fit {name}: unexpected field(s) {', '.join(extra)}")
    missing = sorted(
        n for n, f in fields.items()
        if n not in data
        and f.default is dataclasses.MISSING
        and f.default_factory is dataclasses.MISSING
    )  # fmt: skip
    if missing:
        raise InvalidRecord(f"does not fit {name}: missing field(s) {', '.join(missing)}")
    hints = typing.get_type_hints(schema)
    for key, value in data.items():
        if _type_ok(value, hints.get(key, Any)) is False:
            raise InvalidRecord(
                f"does not fit {name}: field {key} is {type(value).__name__} {value!r:.60}, "
                f"expected {hints[key]}"
            )
    try:
        obj = schema(**data)
    except (TypeError, ValueError) as exc:  # the schema's own __post_init__ checks
        raise InvalidRecord(f"does not fit {name}: {exc}") from None
    return dataclasses.asdict(obj)


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
    schema = cls.record_schema
    if schema is not None and not (
        dataclasses.is_dataclass(schema) or hasattr(schema, "model_validate")
    ):
        raise SpiderLoadError(
            f"{cls_name}.record_schema must be a dataclass or a pydantic model, got {schema!r}"
        )
    _check_spider_methods(cls)
    allowed_domains(cls)
    spider_log_level(cls)
    return cls


def _check_spider_methods(cls: type[Spider]) -> None:
    """Refuse, when the spider is loaded, what would otherwise be skipped without a word:
    Scrapy 2.13's ``async def start()`` (nothing here calls it) and ``async`` versions of the
    methods idemcrawl calls synchronously. ``async def`` callbacks are fine (the parser runs
    them)."""
    name = cls.__name__
    start = getattr(cls, "start", None)
    if inspect.iscoroutinefunction(start) or inspect.isasyncgenfunction(start):
        raise SpiderLoadError(
            f"{name}.start(): idemcrawl's first requests come from start_urls or "
            "start_requests() (a plain generator of Request, Link or str)"
        )
    for method in ("start_requests", "process_record"):
        fn = getattr(cls, method, None)
        if inspect.iscoroutinefunction(fn) or inspect.isasyncgenfunction(fn):
            raise SpiderLoadError(f"{name}.{method} must be a plain (not async) method")


def allowed_domains(cls: type[Spider]) -> frozenset[str]:
    """The spider's ``allowed_domains`` as normalised host names (lower case, IDNA), or
    SpiderLoadError naming an entry that is not a domain name (a URL, a port: Scrapy warns
    and drops those; here the spider does not load)."""
    given = getattr(cls, "allowed_domains", None) or ()
    if isinstance(given, str):
        raise SpiderLoadError(
            f"{cls.__name__}.allowed_domains must be a list of domains, got the str {given!r}"
        )
    out = set()
    for domain in given:
        text = domain.strip() if isinstance(domain, str) else ""
        try:
            host = urls.hostname(urls.normalise(f"http://{text}/")) if text else ""
        except urls.InvalidURL:
            host = ""
        if not host or any(c in text for c in "/:@?#") or text.startswith("."):
            raise SpiderLoadError(
                f"{cls.__name__}.allowed_domains: {domain!r} is not a domain name "
                "(give 'example.com': its subdomains are allowed too)"
            )
        out.add(host)
    return frozenset(out)


# -- the worker side ----------------------------------------------------------------------------


@dataclass(slots=True)
class ParseJob:
    url: str
    status: int
    headers: dict[str, str]
    body: bytes
    depth: int
    kind: str = PAGE
    #: The lease's request spec: which callback, with what context (None: ``parse``).
    request: RequestSpec | None = None
    #: With the archive on: the facts to build the page's WARC exchange with, here in the
    #: parser process, which holds the body and has CPU to spare (issue 17; ParseResult.warc).
    warc: ExchangeSpec | None = None

    def __reduce__(self) -> tuple[Any, ...]:
        # A plain tuple on the wire: the dataclass default pickles a field dict per object (and
        # a NamedTuple pickles at twice a tuple's cost: ~4 us a page for the WARC spec).
        return (
            _job_from_wire,
            (
                self.url,
                self.status,
                self.headers,
                self.body,
                self.depth,
                self.kind,
                self.request,
                None if self.warc is None else tuple(self.warc),
            ),
        )


def _job_from_wire(
    url: str,
    status: int,
    headers: dict[str, str],
    body: bytes,
    depth: int,
    kind: str,
    request: RequestSpec | None,
    warc: tuple[Any, ...] | None,
) -> ParseJob:
    spec = None if warc is None else ExchangeSpec(*warc)
    return ParseJob(url, status, headers, body, depth, kind, request, spec)


#: A link's fields after its URL and host key, in :class:`NewURL`'s order (a test holds
#: NewURL to it: :class:`LinkColumns` builds and reads these tuples by position).
LINK_REST_FIELDS = ("priority", "depth", "state", "reason", "kind", "hops", "request")
LinkRest = tuple[int, int, str, str | None, str, int, RequestSpec | None]


class LinkColumns:
    """A page's links, :class:`NewURL` values kept as columns: the URLs, their host keys, and
    the other fields (:data:`LinkRest`) once for the page when every link has the same ones,
    else one tuple per link.

    Why: a page has ~40 links and ~95 % of them are URLs the crawl process already knows and
    drops at once (``KnownURLs``). As objects, each was built in the parser process, pickled as
    a 9-field tuple, and built again in the crawl process only to be thrown away. As columns,
    the pickle is two lists of strings and one tuple (the common case: a page's plain links all
    share priority, depth and the rest), and the crawl process looks at :attr:`urls` first and
    builds objects only for the links it keeps (:meth:`pick`).

    Lazy: no NewURL is stored. Iterating, indexing or :meth:`pick` builds new (equal) objects
    on every call; a consumer that walks them more than once takes ``list(links)``.
    """

    __slots__ = ("_common", "_rest", "hosts", "urls")

    def __init__(self) -> None:
        #: Each link's frontier key (its URL, or a request's key), in discovery order.
        self.urls: list[str] = []
        #: Each link's host key, parallel to :attr:`urls`.
        self.hosts: list[str] = []
        #: Every link's other fields, while they are all the same (None: no link yet, or
        #: they differ and :attr:`_rest` holds them per link).
        self._common: LinkRest | None = None
        self._rest: list[LinkRest] | None = None

    @classmethod
    def of(cls, links: Iterable[NewURL]) -> LinkColumns:
        """The columns of these links, in this order."""
        out = cls()
        for u in links:
            out.add(u.url, u.host_key, _link_rest(u))
        return out

    def add(self, url: str, host_key: str, rest: LinkRest) -> None:
        """Append a link. Passing the same ``rest`` object for a page's links (the parser's
        plain links) keeps the common case to an identity check."""
        urls = self.urls
        urls.append(url)
        self.hosts.append(host_key)
        per = self._rest
        if per is not None:
            per.append(rest)
            return
        common = self._common
        if common is None:
            self._common = rest
        elif rest is not common and rest != common:
            self._rest = [common] * (len(urls) - 1)
            self._rest.append(rest)
            self._common = None

    def pick(self, indexes: Iterable[int]) -> list[NewURL]:
        """New NewURL objects for the links at ``indexes``, in that order."""
        urls, hosts, per = self.urls, self.hosts, self._rest
        if per is not None:
            return [NewURL(urls[i], hosts[i], *per[i]) for i in indexes]
        common = self._common
        if common is None:  # no link: every index is out of range
            for i in indexes:
                raise IndexError(f"link index {i} out of range")
            return []
        p, d, s, r, k, h, q = common
        return [NewURL(urls[i], hosts[i], p, d, s, r, k, h, q) for i in indexes]

    def with_hops(self, hops: int) -> LinkColumns:
        """The same links, each ``hops`` redirect hops from where the crawl found it (R14)."""
        out = LinkColumns()
        out.urls = list(self.urls)
        out.hosts = list(self.hosts)
        if self._rest is not None:
            out._rest = [(*r[:5], hops, r[6]) for r in self._rest]
        elif self._common is not None:
            c = self._common
            out._common = (*c[:5], hops, c[6])
        return out

    def __len__(self) -> int:
        return len(self.urls)

    def __iter__(self) -> Iterator[NewURL]:
        return iter(self.pick(range(len(self.urls))))

    def __getitem__(self, index: int) -> NewURL:
        return self.pick((index,))[0]

    def __eq__(self, other: object) -> bool:
        """Equal when they hold the same links, however their fields are laid out."""
        if not isinstance(other, LinkColumns):
            return NotImplemented
        return list(self) == list(other)

    __hash__ = None  # type: ignore[assignment]  # mutable, like a list

    def __repr__(self) -> str:
        return f"LinkColumns.of({list(self)!r})"

    def _wire(self) -> tuple[list[str], list[str], LinkRest | None, list[LinkRest] | None]:
        return self.urls, self.hosts, self._common, self._rest

    @classmethod
    def _from_wire(
        cls,
        urls: list[str],
        hosts: list[str],
        common: LinkRest | None,
        rest: list[LinkRest] | None,
    ) -> LinkColumns:
        out = cls()
        out.urls, out.hosts, out._common, out._rest = urls, hosts, common, rest
        return out


_link_rest: Callable[[NewURL], LinkRest] = operator.attrgetter(*LINK_REST_FIELDS)


@dataclass(slots=True)
class ParseResult:
    records: list[RecordWrite] = field(default_factory=list)
    #: The page's links as columns; their NewURL objects are built on demand (see
    #: :class:`LinkColumns`: iterating builds new ones each time).
    links: LinkColumns = field(default_factory=LinkColumns)
    #: Links not followed, by reason class (out_of_scope, invalid_url, url_length, depth, …).
    rejected: dict[str, int] = field(default_factory=dict)
    error: str | None = None
    #: Where the spider's exception rose, when ``error`` is one (``failures.spider_trace``).
    trace: str | None = None
    #: 64-bit SimHash of an HTML page's visible text (:func:`dedup.simhash64` of
    #: :func:`dedup.visible_text`), for near-duplicate grouping at completion (R11).
    simhash: int | None = None
    #: The page's ``<link rel=canonical>``, normalised: stored as a hint, never followed in
    #: place of the URL that was fetched (R9).
    canonical: str | None = None
    #: The page's WARC exchange, built from ``ParseJob.warc`` (None without one, or when it
    #: could not be built: the crawl process then builds it itself and meets the same error).
    warc: BuiltExchange | None = None

    def __reduce__(self) -> tuple[Any, ...]:
        """Records as tuples of their fields and links as their columns: the dataclass default
        (a field-name dict per object) cost more than the link extraction itself."""
        records = list(map(_record_fields, self.records))
        warc = None if self.warc is None else tuple(self.warc)
        return (
            _result_from_wire,
            (
                records,
                *self.links._wire(),
                self.rejected,
                self.error,
                self.trace,
                self.simhash,
                self.canonical,
                warc,
            ),
        )


#: Field values in declaration order, so ``Class(*values)`` rebuilds the object (C speed).
_record_fields = operator.attrgetter(*(f.name for f in dataclasses.fields(RecordWrite)))


def _result_from_wire(
    records: list[tuple[Any, ...]],
    urls: list[str],
    hosts: list[str],
    common: LinkRest | None,
    rest: list[LinkRest] | None,
    rejected: dict[str, int],
    error: str | None,
    trace: str | None,
    simhash: int | None,
    canonical: str | None,
    warc: tuple[Any, ...] | None,
) -> ParseResult:
    return ParseResult(
        [RecordWrite(*r) for r in records],
        LinkColumns._from_wire(urls, hosts, common, rest),
        rejected,
        error,
        trace,
        simhash,
        canonical,
        None if warc is None else BuiltExchange(*warc),
    )


#: Not in the trap-verdict cache (its values are a verdict or None).
_UNCHECKED: Final = "unchecked"


class Parser:
    """Turns fetched responses into records and links; one instance per worker process."""

    def __init__(
        self,
        spider_spec: str | None,
        scope_hosts: frozenset[str],
        scope: str,
        limits: TrapLimits | None = None,
        *,
        simhash: bool = True,
        requisites: bool = False,
        trace_frames: int | None = TRACE_FRAMES,
    ) -> None:
        self.spider = load_spider(spider_spec)()
        #: Frames kept of a spider exception's traceback (None: all, for ``idemcrawl parse``).
        self.trace_frames = trace_frames
        #: Also discover what each HTML page needs to render (``crawl --requisites``).
        self.requisites = requisites
        #: Compute ParseResult.simhash for HTML pages (~0.5 ms per 15 KB page).
        self.simhash = simhash
        self.source = str(self.spider.name)
        self.scope_hosts = scope_hosts
        self.scope = scope
        #: The spider's ``allowed_domains`` (normalised): a filter on top of the scope.
        self.allowed_domains = allowed_domains(type(self.spider))
        self.limits = limits or TrapLimits()
        #: check_url's verdict on the URL alone (its depth check aside), by URL: sites link the
        #: same pages from many pages. Bounded; only used when depth 0 passes the depth check.
        self._trap_cache: dict[str, str | None] = {}
        #: The event loop ``async def`` callbacks run on, made at the first (:meth:`_run_async`).
        self._async_loop: Any = None
        self._async_thread: Any = None

    def run(self, job: ParseJob) -> ParseResult:
        """Parse the job; with ``job.warc``, also build its WARC exchange (``result.warc``)."""
        result = self._parse(job)
        if job.warc is not None:
            try:
                result.warc = build_page_exchange(
                    job.warc,
                    job.url,
                    job.status,
                    job.body,
                    links=result.links.urls,
                    records=len(result.records),
                    parse_error=result.error,
                )
            except Exception:
                # Never fail the parse for it: without result.warc the crawl process builds the
                # exchange itself and meets the same error, handled there (it stops the crawl).
                result.warc = None
        return result

    def _parse(self, job: ParseJob) -> ParseResult:
        result = ParseResult()
        depth = job.depth + 1
        if 300 <= job.status < 400:
            # Redirects are followed by the crawler, not the HTTP library: the target becomes a
            # URL of its own and goes through the same discovery path (R14).
            loc = job.headers.get("location")
            if loc and job.request is not None:
                self._redirect_request(result, loc, job, depth)
            elif loc:
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
            request=job.request,
            allowed_domains=self.allowed_domains,
        )
        callback = job.request.callback if job.request else None
        if job.status >= 400 or not (
            page.is_html or self.spider.parse_non_html or callback is not None
        ):
            return result
        # A plain link of page.links() (normalised and scope-checked there) whose URL-only
        # trap verdict is cached: accepted here without three method calls (~40 per page).
        checked = page._checked_links
        verdicts = self._trap_cache
        links = result.links
        add_link = links.add
        # While every link so far shares ``plain`` (LinkColumns' common case), a plain link is
        # two appends here instead of a call of add() (~40 a page).
        append_url, append_host = links.urls.append, links.hosts.append
        plain: LinkRest = (0, depth, QUEUED, None, PAGE, 0, None)  # one object: see add()
        inline = 0 <= depth <= self.limits.max_depth
        produced: Any = None
        try:
            produced = self._call(callback, page, job.request)
            for item in produced:
                if isinstance(item, str):
                    hk = checked.get(item) if inline else None
                    if hk is not None and verdicts.get(item, _UNCHECKED) is None:
                        if links._common is plain and links._rest is None:
                            append_url(item)
                            append_host(hk)
                        else:
                            add_link(item, hk, plain)
                    else:
                        self._follow_page_link(result, item, page, depth, 0)
                elif isinstance(item, Record):
                    write = self._record(item)
                    if write is not None:
                        result.records.append(write)
                elif isinstance(item, Request):
                    self._request(result, item, page, depth)
                elif isinstance(item, Link):
                    self._follow_page_link(result, item.url, page, depth, item.priority)
                elif isinstance(item, Download):
                    self._follow_page_link(result, item.url, page, depth, item.priority, DOWNLOAD)
                else:
                    dict_hint = type(item) is dict
                    hint = " (a Scrapy item dict is Record(key, data))" if dict_hint else ""
                    raise TypeError(
                        f"spider yielded {type(item).__name__}; "
                        f"expected Record, Request, Link, Download or str{hint}"
                    )
            if page._out_of_scope:
                dropped = len(page._out_of_scope)
                result.rejected["out_of_scope"] = result.rejected.get("out_of_scope", 0) + dropped
            if page.is_html:
                result.canonical = _canonical_hint(page)
                if self.requisites and job.kind == PAGE:
                    self._requisites(result, page, job.depth)
            if self.simhash and page.is_html:
                # The spider is done and Node offers it no way to change the tree, so the
                # page's own tree is visible_text(page.text)'s input, parsed already.
                result.simhash = page_simhash(page._tree, page.text)
        except MemoryError:
            return ParseResult(error="parse error: memory limit exceeded")
        except Exception as exc:  # a spider bug must fail this URL, not the crawl
            return ParseResult(
                error=f"parse error: {type(exc).__name__}: {exc}"[:500],
                trace=spider_trace(exc, produced, self.trace_frames),
            )
        return result

    def _callback(self, name: str | None) -> Callable[[Page], Iterable[Any]]:
        """The spider method called ``name`` (``parse`` for None)."""
        fn = getattr(self.spider, name or "parse", None)
        if not callable(fn) or (name or "").startswith("_"):
            raise ValueError(
                f"unknown callback {name!r}: {type(self.spider).__name__} has no such method"
            )
        return fn  # type: ignore[no-any-return]

    def _call(self, name: str | None, page: Page, spec: RequestSpec | None) -> Iterable[Any]:
        """The callback's output for ``page``: called with its ``cb_kwargs`` when the request
        had some (stored as a JSON array: :func:`_context_text`), and run to completion when
        it is ``async def``."""
        fn = self._callback(name)
        if spec is not None and spec.data and spec.data[0] == "[":
            out = fn(page, **page.cb_kwargs)
        else:
            out = fn(page)
        if type(out) in _ASYNC_RESULTS:
            out = self._run_async(out)
        return out or ()

    def _run_async(self, out: Any) -> Any:
        """An ``async def`` callback's coroutine (its return value) or async generator (its
        items, as a list), run on this parser's own event loop, made once: ~15 us a page
        against ~250 us for ``asyncio.run`` each time. Where this thread runs a loop already
        (``parse_workers = 0``: the crawl's own), the coroutine runs on a helper thread
        instead, and the parse blocks as a synchronous one does."""
        import asyncio

        if self._async_loop is None:
            self._async_loop = asyncio.new_event_loop()
        run = self._async_loop.run_until_complete
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return run(_settle(out))
        if self._async_thread is None:
            from concurrent.futures import ThreadPoolExecutor

            self._async_thread = ThreadPoolExecutor(1, thread_name_prefix="idemcrawl-async")
        return self._async_thread.submit(run, _settle(out)).result()

    def check_request(self, req: Request) -> RequestSpec | None:
        """Refuse, when it is yielded, a request whose response could never be parsed: its
        callback must be a public method of this spider that takes its ``cb_kwargs`` (data
        was checked when it was made)."""
        if req.callback is not None or req.cb_kwargs:
            fn = self._callback(req.callback)
            if req.cb_kwargs:
                _check_cb_kwargs(fn, req.callback or "parse", req.cb_kwargs)
        return req.spec()

    def _request(self, result: ParseResult, req: Request, page: Page, depth: int) -> None:
        """A yielded :class:`Request`: checked, then the same discovery path as a link, its
        frontier key carrying method and body (``request_key``) and its spec stored with it."""
        spec = self.check_request(req)
        u = self._in_scope(result, req.url, page.resolver.resolve)
        if u is None:
            return
        key = request_key(u, req.method, req.body)
        self._accept(result, u, urls.host_key(u), depth, req.priority, PAGE, key, spec)

    def _redirect_request(self, result: ParseResult, loc: str, job: ParseJob, depth: int) -> None:
        """A redirect of a request with a spec: the target keeps its callback, context and
        headers; 301/302/303 turn a POST (any method but HEAD) into a GET without a body, as
        browsers do; 307/308 repeat the method and body."""
        spec = job.request
        assert spec is not None
        base = job.url.partition("#")[0]
        target = self._in_scope(result, loc, lambda h: urls.normalise(h, base))
        if target is None:
            return
        if job.status not in (307, 308) and spec.method not in ("GET", "HEAD"):
            body_headers = ("content-type", "content-encoding")
            pairs = [p for p in spec.header_pairs() if p[0].lower() not in body_headers]
            headers = _json_text([list(p) for p in pairs], "headers") if pairs else None
            spec = RequestSpec("GET", spec.callback, spec.data, headers, None, spec.render)
        if spec == RequestSpec():
            key, spec_or_none = target, None
        else:
            key, spec_or_none = request_key(target, spec.method, spec.body), spec
        self._accept(result, target, urls.host_key(target), depth, 0, job.kind, key, spec_or_none)

    def _requisites(self, result: ParseResult, page: Page, depth: int) -> None:
        """A page's requisites enter the frontier on any host (each host under its own
        robots.txt and politeness), at the page's own depth (they are part of it), ahead of
        its links (priority 2), checked by the URL trap defences; they are never parsed."""
        for u in page.requisites():
            self._accept(result, u, urls.host_key(u), depth, 2, REQUISITE)

    def _record(self, rec: Record) -> RecordWrite | None:
        """The spider's ``process_record``, then its ``record_schema``: a record that does not
        fit fails the page with the key and the reason (R1's records are trusted as stored)."""
        cleaned = self.spider.process_record(rec)
        if cleaned is None:
            return None
        if not isinstance(cleaned, Record):
            raise TypeError(
                f"process_record returned {type(cleaned).__name__}; expected Record or None"
            )
        rec = cleaned
        if not isinstance(rec.data, dict):
            raise TypeError(f"Record.data must be a dict, got {type(rec.data).__name__}")
        data = rec.data
        schema = self.spider.record_schema
        if schema is not None:
            try:
                data = validate_record(schema, data)
            except InvalidRecord as exc:
                raise InvalidRecord(f"record {str(rec.key)!r} {exc}") from None
        # make() serialises data first: unserialisable data fails here, in the worker.
        return RecordWrite.make(self.source, str(rec.key), data)

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

    def _follow_page_link(
        self, result: ParseResult, href: str, page: Page, depth: int, prio: int, kind: str = PAGE
    ) -> None:
        """:meth:`_follow` for a link of ``page``: the same checks, done once per URL."""
        hk = page._checked_links.get(href)
        if hk is not None:  # from page.links(): normalised and scope-checked already
            self._accept(result, href, hk, depth, prio, kind)
        else:
            self._follow_resolved(result, href, page.resolver.resolve, depth, prio, kind)

    def _follow_resolved(
        self,
        result: ParseResult,
        href: str,
        resolve: Callable[[str], str],
        depth: int,
        prio: int,
        kind: str,
    ) -> None:
        """The discovery path for every link: normalise, scope, trap checks (R9, R17)."""
        u = self._in_scope(result, href, resolve)
        if u is not None:
            self._accept(result, u, urls.host_key(u), depth, prio, kind)

    def _in_scope(
        self, result: ParseResult, href: str, resolve: Callable[[str], str]
    ) -> str | None:
        """``href`` normalised, if it is a URL in the crawl's scope; else None, counted."""
        try:
            u = resolve(href)
        except urls.InvalidURL:
            _count(result.rejected, "invalid_url")
            return None
        if not urls.in_scope(u, self.scope_hosts, self.scope, self.allowed_domains):
            _count(result.rejected, "out_of_scope")
            return None
        return u

    def _accept(
        self,
        result: ParseResult,
        url: str,
        hk: str,
        depth: int,
        prio: int,
        kind: str,
        key: str | None = None,
        request: RequestSpec | None = None,
    ) -> None:
        """Add a link that passes the trap checks; ``key`` is its frontier key when that is
        not the URL itself (a non-GET request)."""
        trap = self._check_url(url, depth)
        if trap is not None:
            _count(result.rejected, reason_class(trap))
            return
        result.links.add(key or url, hk, (prio, depth, QUEUED, None, kind, 0, request))

    def _check_url(self, url: str, depth: int) -> str | None:
        """``check_url(url, depth, limits)``, with the URL-only part cached by URL."""
        limits = self.limits
        if depth > limits.max_depth or limits.max_depth < 0:
            return check_url(url, depth, limits)
        cache = self._trap_cache
        try:
            return cache[url]
        except KeyError:
            pass
        if len(cache) >= 50_000:
            cache.clear()
        verdict = cache[url] = check_url(url, depth, limits)
        return verdict

    def _follow(
        self,
        result: ParseResult,
        href: str,
        base: str,
        depth: int,
        prio: int,
        kind: str = PAGE,
    ) -> None:
        """A link without a page to resolve it (redirect targets, sitemap entries)."""
        self._follow_resolved(result, href, lambda h: urls.normalise(h, base), depth, prio, kind)


#: What an ``async def`` callback returns when called: run by :meth:`Parser._run_async`.
_ASYNC_RESULTS: Final = frozenset({types.CoroutineType, types.AsyncGeneratorType})


async def _settle(out: Any) -> Any:
    """A coroutine's value, an async generator's items as a list (either may give the other:
    a coroutine returning an async generator)."""
    if isinstance(out, types.CoroutineType):
        out = await out
    if isinstance(out, types.AsyncGeneratorType):
        return [item async for item in out]
    return out


def _canonical_hint(page: Page) -> str | None:
    node = page.css_first('link[rel="canonical"][href]')
    if node is None:
        return None
    try:  # the page's resolver is normalise(href, page.base_url), without the parser mostly
        return page.resolver.resolve(str(node.attrs.get("href") or ""))
    except urls.InvalidURL:
        return None


def _count(counts: dict[str, int], key: str) -> None:
    counts[key] = counts.get(key, 0) + 1


_worker: Parser | None = None


def init_worker(
    spider_spec: str | None,
    scope_hosts: frozenset[str],
    scope: str,
    limits: TrapLimits | None = None,
    memory_limit: int | None = None,
    requisites: bool = False,
) -> None:
    """Process-pool initializer: cap the worker's memory, load the spider once (R18).

    A hostile page (or a spider bug) that makes the parser allocate without bound then fails
    with MemoryError — that URL is failed with the reason — instead of taking the machine down.
    """
    global _worker
    _limit_memory(memory_limit)
    _worker = Parser(spider_spec, scope_hosts, scope, limits, requisites=requisites)


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


# -- the parser pool ----------------------------------------------------------------------------
#
# Parser processes fed by the event loop itself. concurrent.futures.ProcessPoolExecutor needs two
# helper threads in the crawl process (a queue feeder and a result manager) and three thread
# hand-offs per page; on a crawl process whose event loop and SQL thread already share one GIL,
# those hand-offs were ~15 % of its CPU (docs/benchmarks.md). Here each worker has a job pipe and
# a result pipe that the loop reads and writes without blocking (add_reader/add_writer), so a
# page costs one pickle each way and no thread at all.


#: multiprocessing.Connection's framing (4-byte signed big-endian length; -1 and then an 8-byte
#: length for huge messages), so the worker side can use Connection.recv_bytes/send_bytes.
def worker_main(jobs_fd: int, results_fd: int) -> None:
    """A parser process's entry point (``parse_pool`` starts ``python -c`` on it): the pool
    sends the :func:`init_worker` arguments first on the job pipe, then jobs."""
    jobs = Connection(jobs_fd, writable=False)
    results = Connection(results_fd, readable=False)
    try:
        initargs = pickle.loads(jobs.recv_bytes())
    except (EOFError, OSError):
        return  # the crawl ended before this worker was told what to parse
    _pool_worker(jobs, results, initargs)


def _pool_worker(jobs: Connection, results: Connection, initargs: tuple[Any, ...]) -> None:
    """A parser process: parse jobs in arrival order until the job pipe closes.

    Interrupts are the crawl process's to handle: on Ctrl-C or SIGTERM to the process group it
    drains its in-flight pages, which still need their parses; the worker ends when the crawl
    process closes its job pipe (or dies, which closes it too).
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    init_worker(*initargs)
    try:
        results.send_bytes(b"")  # ready: parse timeouts count from here, not from the spawn
    except OSError:
        return  # the crawl ended while this worker started (a finished crawl, a quick stop)
    dumps, loads = pickle.dumps, pickle.loads
    while True:
        try:
            data = jobs.recv_bytes()
        except (EOFError, OSError):
            return
        try:
            result = parse_in_worker(loads(data))
            out = dumps(result, pickle.HIGHEST_PROTOCOL)
        except MemoryError:
            out = dumps(ParseResult(error="parse error: memory limit exceeded"))
        except Exception as exc:  # e.g. a record that cannot be pickled: fail the page only
            out = dumps(ParseResult(error=f"parse error: {type(exc).__name__}: {exc}"[:500]))
        try:
            results.send_bytes(out)
        except OSError:
            return


def iter_records(items: Iterable[Any]) -> Iterator[Record]:
    """Helper for tests and tools: the Records among a spider's outputs."""
    return (i for i in items if isinstance(i, Record))
