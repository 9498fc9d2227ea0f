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
from dataclasses import dataclass

from ..config import CrawlConfig
from ..frontier.base import Frontier, HostPolicy
from ..frontier.scheduler import end_gap
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


@dataclass(frozen=True, slots=True)
class HostRules:
    """What a rendering page's own requests to its host obey, as the crawl's requests do."""

    #: robots.txt as a predicate on URLs of the host (R7).
    allowed: Callable[[str], bool]
    #: Seconds from the end of one response to the next start on the host (I8): the delay
    #: configured for it, or its robots.txt Crawl-delay within the cap.
    gap: float


async def host_rules(
    policy: HostPolicy, call: Call, frontier: Frontier, host_key: str
) -> HostRules:
    """The host's rules, read from the frontier's row of it."""
    row = await call(frontier.host_row, host_key)
    gap = end_gap(row, policy) if row else policy.delay
    cache = policy.robots
    if cache is None:
        return HostRules(lambda _url: True, gap)
    state = state_from_row(row) if row else None
    return HostRules(lambda url: cache.allowed(host_key, state, url), gap)
