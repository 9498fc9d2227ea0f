"""Start-up reconciliation: what a crawl process settles with the frontier before it leases.

All of it is synchronous and runs as one call on the frontier's thread, before any task starts:

* this owner slot's previous holder is dead (the slot's lock was free), so its leases return now;
  so do those of any other dead process of this machine (their slot files are unlocked too);
* ``--retry-deferred`` gives deferred URLs another chance; per-host budgets and politeness
  overrides from the configuration are written;
* the in-memory indexes that sit in front of the frontier are created empty and marked as
  warming: the Bloom filter of archived bodies (WARC dedup), the SimHash index
  (near-duplicates), the discovery gate's filter of known URLs (its template counts are restored
  here); ``warmup.py`` fills them while the crawl already runs;
* seeds and sitemaps enter through ``add`` (a no-op for known ones), their hosts define the scope;
* the group-commit bound is published, so ``status`` can say what a kill may repeat (R5).
"""

from __future__ import annotations

from dataclasses import dataclass

from .. import owner as owners
from .. import url as urls
from ..config import CrawlConfig
from ..dedup import BloomNegativeCache
from ..discovery import DiscoveryGate
from ..frontier.base import SITEMAP, Frontier, NewURL
from ..parse import load_spider, start_links
from .clock import WallClock
from .gate import load_gate
from .neardup import NearDuplicates
from .parsing import spider_spec
from .warmup import MIN_BLOOM


@dataclass
class Reconciled:
    #: Leases of dead local processes returned (besides this slot's own).
    reclaimed: int
    #: Deferred URLs requeued (``retry_deferred``).
    requeued: int
    #: Payload digests of archived bodies (None without WARC output).
    bodies: BloomNegativeCache | None
    near: NearDuplicates
    gate: DiscoveryGate
    #: The seed hosts: the crawl's scope.
    scope_hosts: frozenset[str]


def reclaim_dead_owners(frontier: Frontier, crawl: str, me: str) -> int:
    """Return the leases of this machine's crawl processes that died (``owner`` module)."""
    holders = frontier.owners_with_leases()
    return owners.reclaim_dead_local_owners(crawl, holders, me, frontier.release_owner)


def seed_urls(cfg: CrawlConfig) -> list[NewURL]:
    """The configured seeds and sitemaps, then the spider's start requests (``start_urls`` /
    ``start_requests()``, with their callbacks and context)."""
    seeds = []
    for raw in cfg.seeds:
        u = urls.normalise(raw)
        seeds.append(NewURL(u, urls.host_key(u), priority=1))
    for raw in cfg.sitemaps:
        u = urls.normalise(raw)
        seeds.append(NewURL(u, urls.host_key(u), priority=5, kind=SITEMAP))
    if cfg.spider:
        seeds += start_links(load_spider(spider_spec(cfg.spider))())
    return seeds


def reconcile(
    frontier: Frontier, cfg: CrawlConfig, owner: str, clock: WallClock, *, archive: bool
) -> Reconciled:
    f = frontier
    f.release_owner(owner)  # this slot's previous holder is dead
    reclaimed = reclaim_dead_owners(f, getattr(f, "crawl_identity", cfg.db), owner)
    requeued = f.requeue_deferred() if cfg.retry_deferred else 0
    for host, budget in cfg.host_budgets:
        f.control("set-budget", host, budget)
    # Filled while the crawl runs (warmup.py): start-up stays flat in the size of the crawl.
    bodies = None
    if archive:
        bodies = BloomNegativeCache(MIN_BLOOM)
        bodies.warming = True
    near = NearDuplicates(cfg.near_dup_distance, ready=False)
    for host, delay, concurrency in cfg.host_overrides:
        f.set_host_overrides(host, delay=delay, max_in_flight=concurrency)
    seeds = seed_urls(cfg)
    if seeds:
        f.add_seeds([s.host_key for s in seeds])
        f.add(seeds, clock.time())
    gate = load_gate(f, cfg.trap_limits(), warm=False)
    f.set_meta("group_commit_max", str(cfg.commit_batch))
    f.set_meta("group_commit_linger_s", str(cfg.commit_seconds))
    return Reconciled(reclaimed, requeued, bodies, near, gate, f.seed_hosts())
