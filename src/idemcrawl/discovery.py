"""The stateful half of discovery: which *new* URLs a template-growth trap may still mint.

The stateless checks (normalise, scope, URL length, query parameters, repeated segments, depth)
run in the parser processes (``parse.Parser._follow``). What needs memory runs here, in the
engine's process, on every page's links before they are committed:

* a Bloom filter answers "definitely new?" without a database round trip (R10). It is only a
  negative cache: "maybe known" links go to the frontier unchanged, where the durable unique key
  decides (a false positive costs nothing but one uncounted URL);
* a :class:`~idemcrawl.traps.TemplateGate` counts new URLs per URL template (digits → N, …) and
  pauses a template that keeps minting them (an infinite calendar, facet combinations, session
  ids), admitting only a sample (R17). A paused template never blocks other templates or hosts.

Refused URLs are still stored, as state ``rejected`` with the reason, so they are recorded,
counted in ``status``, and a rediscovery of them is a no-op. The gate's counts are saved in the
crawl's meta table and restored on restart; the Bloom filter is rebuilt from the frontier.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence

from .dedup import BloomNegativeCache
from .frontier.base import PAGE, QUEUED, REJECTED, NewURL, request_url
from .traps import TemplateGate, TrapLimits, url_template

META_KEY = "template_gate"
#: Most URL strings :class:`KnownURLs` keeps (two generations of half this each): ~150 bytes
#: per URL, so ~30 MB at most.
KNOWN_URLS_CAP = 200_000


class DiscoveryGate:
    def __init__(self, limits: TrapLimits, expected_urls: int = 100_000) -> None:
        self.limits = limits
        self.gate = TemplateGate(limits)
        self._expected = max(expected_urls, 100_000)
        self.bloom = BloomNegativeCache(self._expected)
        self.lookups_saved = 0

    def load(self, known_urls: Iterable[str], snapshot: str | None) -> None:
        known = list(known_urls)
        self._expected = max(self._expected, 2 * len(known))
        self.bloom = BloomNegativeCache(self._expected)
        self.bloom.add_many(known)
        self.restore(snapshot)

    def restore(self, snapshot: str | None) -> None:
        """The template counts a previous run saved (its known URLs are loaded separately)."""
        if snapshot:
            self.gate.restore(json.loads(snapshot))

    def snapshot(self) -> str:
        return json.dumps(self.gate.snapshot(), sort_keys=True)

    @property
    def needs_rebuild(self) -> bool:
        return self.bloom.saturated

    def _admit(self, url: str) -> tuple[bool, str | None]:
        """Both the URL's template and, for a query URL, its path's query variants must admit.

        Faceted navigation varies which parameters appear and in what order, so every
        combination is a template of its own; counting all query variants of one path as well
        bounds them together.
        """
        template = url_template(url)
        ok, reason = self.gate.admit_template(template)
        if "?" in template:
            ok_path, reason_path = self.gate.admit_template(template.split("?", 1)[0] + "?*")
            if ok and not ok_path:
                ok, reason = ok_path, reason_path
        return ok, reason

    def filter(self, links: Sequence[NewURL]) -> tuple[list[NewURL], dict[str, int]]:
        """Links to commit (refused ones marked ``rejected``) and refusals by reason class."""
        out: list[NewURL] = []
        refused: dict[str, int] = {}
        for link in links:
            if link.kind != PAGE or link.state != QUEUED or self.bloom.might_contain(link.url):
                out.append(link)
                continue
            self.lookups_saved += 1  # definitely new: no need to ask whether it is known
            self.bloom.add(link.url)
            ok, reason = self._admit(request_url(link.url))
            if ok:
                out.append(link)
            else:
                out.append(
                    NewURL(link.url, link.host_key, link.priority, link.depth, REJECTED, reason)
                )
                refused["template_paused"] = refused.get("template_paused", 0) + 1
        return out, refused


class KnownURLs:
    """URLs this process knows to be in the frontier already: a positive, exact, bounded cache.

    Discovered links are mostly URLs the frontier has had for a while (a site links the same
    pages from every page: ~95 % of the benchmark's 800,000 links). Each still costs a row in
    the completion's ``INSERT OR IGNORE`` (~29 % of the SQL thread's busy time, measured with
    the lease query fixed) and its trip through the gate. A URL goes in here only once the
    transaction that inserted it has committed (:meth:`add_committed`), and the frontier never
    forgets a URL, so dropping a link found here changes nothing in the frontier; the caller
    must still count it (``url_duplicates``, a page's link count). Two generations bound the
    memory: when the newer fills up, the older is dropped (a miss is only a redundant insert).
    """

    def __init__(self, cap: int = KNOWN_URLS_CAP) -> None:
        if cap < 2:
            raise ValueError(f"cap must be at least 2, got {cap}")
        self._half = cap // 2
        self._new: set[str] = set()
        self._old: set[str] = set()

    def __contains__(self, url: object) -> bool:
        return url in self._new or url in self._old

    def __len__(self) -> int:
        return len(self._new) + len(self._old - self._new)

    def add_committed(self, urls: Iterable[str]) -> None:
        """Record URLs whose insert (or an earlier one) is committed in the frontier."""
        new = self._new
        new.update(urls)
        if len(new) > self._half:
            self._old, self._new = new, set()

    def unknown(self, urls: Sequence[str]) -> list[int]:
        """The indexes of the URLs not known to be in the frontier, in order: the caller
        builds link objects for those alone (most links of a page are known)."""
        new, old = self._new, self._old
        return [i for i, u in enumerate(urls) if u not in new and u not in old]
