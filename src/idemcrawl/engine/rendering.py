"""The engine's side of JavaScript pages: the renderer a crawl owns, and the rules its pages'
own requests obey.

A crawl always has a :class:`~idemcrawl.render.Renderer`; it starts Chromium first when every
page is rendered (``--render``, or ``render = True`` on the spider), so that a missing browser
stops the crawl with one line before anything is written, and otherwise on the first
``Request(render=True)``, if one ever comes. The pipeline renders; see ``pipeline.py``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from ..config import CrawlConfig
from ..frontier.base import Frontier, HostPolicy
from ..parse import load_spider
from ..render import Renderer, RenderSettings
from ..robots import state_from_row
from .calls import Call
from .parsing import spider_spec


async def open_renderer(
    cfg: CrawlConfig, resources: contextlib.AsyncExitStack
) -> tuple[Renderer, bool]:
    """The crawl's renderer (closed with ``resources``) and whether every page goes through it."""
    every_page = cfg.render or bool(load_spider(spider_spec(cfg.spider)).render)
    settings = RenderSettings(
        timeout=cfg.render_timeout, contexts=cfg.render_contexts, user_agent=cfg.user_agent
    )
    renderer = Renderer(settings)
    resources.push_async_callback(renderer.close)
    if every_page:
        await renderer.start()
    return renderer, every_page


async def robots_rules(
    policy: HostPolicy, call: Call, frontier: Frontier, host_key: str
) -> Callable[[str], bool]:
    """The host's robots.txt as a predicate, read from the frontier: a rendering page's own
    requests obey it as the crawl's do (R7)."""
    cache = policy.robots
    if cache is None:
        return lambda _url: True
    row = await call(frontier.host_row, host_key)
    state = state_from_row(row) if row else None
    return lambda url: cache.allowed(host_key, state, url)
