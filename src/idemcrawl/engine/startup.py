"""Start-up reconciliation: what a crawl process settles with the frontier before it leases.

All of it is synchronous and runs as one call on the frontier's thread, before any task starts:

* this owner slot's previous holder is dead (the slot's lock was free), so its leases return now;
  so do those of any other dead process of this machine (their slot files are unlocked too);
* ``--retry-deferred`` gives deferred URLs another chance; per-host budgets and politeness
  overrides from the configuration are written;
* the in-memory indexes that sit in front of the frontier are rebuilt from it: the Bloom filter
  of archived bodies (WARC dedup), the SimHash index (near-duplicates), the discovery gate
  (known URLs, and the template counts the last run saved);
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
from .clock import WallClock
from .gate import load_gate
from .neardup import NearDuplicates


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
    seeds = []
    for raw in cfg.seeds:
        u = urls.normalise(raw)
        seeds.append(NewURL(u, urls.host_key(u), priority=1))
    for raw in cfg.sitemaps:
        u = urls.normalise(raw)
        seeds.append(NewURL(u, urls.host_key(u), priority=5, kind=SITEMAP))
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
    bodies = None
    if archive:
        digests = list(f.body_digests())
        bodies = BloomNegativeCache(max(100_000, 2 * len(digests)))
        bodies.add_many(digests)
    near = NearDuplicates(cfg.near_dup_distance)
    near.load(f.simhashes())
    for host, delay, concurrency in cfg.host_overrides:
        f.set_host_overrides(host, delay=delay, max_in_flight=concurrency)
    seeds = seed_urls(cfg)
    if seeds:
        f.add_seeds([s.host_key for s in seeds])
        f.add(seeds, clock.time())
    gate = load_gate(f, cfg.trap_limits())
    f.set_meta("group_commit_max", str(cfg.commit_batch))
    f.set_meta("group_commit_linger_s", str(cfg.commit_seconds))
    return Reconciled(reclaimed, requeued, bodies, near, gate, f.seed_hosts())
