"""robots.txt policy (RFC 9309): what a fetch outcome means, and what it lets us crawl.

This module is pure policy. It never touches the network or the database: the engine fetches
``{host_key}/robots.txt`` (following at most five redirects) and hands the final outcome to
:func:`outcome`; the frontier persists the resulting :class:`RobotsState` with
:func:`state_to_row` / :func:`state_from_row`; the lease path asks :meth:`RobotsCache.allowed`
and :meth:`RobotsCache.effective_delay`. Keeping the decisions here, as plain functions of plain
data, is what makes them testable without a server and identical across a restart.

How a fetch outcome maps to a policy (RFC 9309 section 2.3.1):

* **2xx, "successful access" (2.3.1.1)**: obey the parsed rules (``RULES``). The body is cut to
  ``max_bytes`` first (2.5: parse *at least* the first 500 KiB), and only complete lines are
  kept, so a rule sliced in half at the limit cannot turn into a broader one
  (``Allow: /pub`` from ``Allow: /public``).
* **4xx, "unavailable" (2.3.1.3)**: allow everything (``ALLOW_ALL``). This includes 401 and
  403: the RFC counts every 4xx as unavailable, unlike the old draft that read 401/403 as
  "disallow all". The one exception is **429**: it means "slow down", not "there is no file",
  and crawling a host at full speed because it asked us to back off is the opposite of polite,
  so it is treated as unreachable (Google's crawlers do the same).
* **More than five redirects (2.3.1.2)**: the RFC says the crawler "MAY assume that the
  robots.txt file is unavailable", i.e. the 4xx case, so ``ALLOW_ALL``. This is deliberately
  *not* the unreachable case: a redirect loop is a stable property of the site, not a transient
  failure that a retry would fix.
* **5xx, network error, timeout, and any other status (1xx, an unfollowed 3xx, 429, >= 600):
  "unreachable" (2.3.1.4)**: the crawler MUST assume complete disallow (``DISALLOW_ALL``) and
  retry after the short ``error_ttl``. If a good copy (``RULES`` or ``ALLOW_ALL``) is already
  known it is kept instead, because RFC 9309 section 2.4 allows using a cached copy beyond
  24 hours while the file is unreachable, and a known rule set is a better guess than locking
  the host out. The kept copy's ``fetched_at`` is unchanged, so the parsed rules are reused.

Crawl-delay is not part of RFC 9309; we honour it for our group because a site that asks for
one means it. A delay up to ``crawl_delay_cap`` is applied as the host's minimum delay; a larger
one sets ``deferred_reason`` so the frontier can pause the host with a visible reason instead of
crawling it faster than it asked.
"""

from __future__ import annotations

import json
import math
import re
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Final, Literal, Protocol

from protego import Protego

from .version import DEFAULT_USER_AGENT, PRODUCT_TOKEN

__all__ = [
    "ALLOW_ALL",
    "DEFAULT_PRODUCT_TOKEN",
    "DISALLOW_ALL",
    "MODES",
    "ROBOTS_PATH",
    "ROW_COLUMNS",
    "RULES",
    "RobotsCache",
    "RobotsSettings",
    "RobotsState",
    "needs_fetch",
    "outcome",
    "product_token",
    "refuses_nothing",
    "robots_url",
    "state_from_row",
    "state_to_row",
]

ROBOTS_PATH: Final = "/robots.txt"

#: Obey the parsed rules in ``RobotsState.body``.
RULES: Final = "rules"
#: No usable rules exist (4xx, too many redirects): everything may be crawled.
ALLOW_ALL: Final = "allow_all"
#: robots.txt is unreachable and no good copy is known: nothing may be crawled yet.
DISALLOW_ALL: Final = "disallow_all"
MODES: Final = frozenset({RULES, ALLOW_ALL, DISALLOW_ALL})

#: Used when a configured user agent string has no usable product token: our own name, the
#: token of the default User-Agent, so groups addressed to us by name still apply.
DEFAULT_PRODUCT_TOKEN: Final = PRODUCT_TOKEN

#: The ``hosts`` columns :func:`state_to_row` fills, in a stable order for building SQL.
ROW_COLUMNS: Final = (
    "robots_state",
    "robots_body",
    "robots_fetched_at",
    "robots_expires_at",
    "crawl_delay",
    "robots_meta",
)

_NOT_TOKEN_CHARS = re.compile(r"[^A-Za-z_-]")

_Outcome = Literal["success", "unavailable", "unreachable"]


def robots_url(host_key: str) -> str:
    """Return the robots.txt URL of a host key (``scheme://host[:port]``).

    One function builds it so that the engine's fetch and :meth:`RobotsCache.allowed`'s
    "the robots.txt URL itself is always allowed" check agree on the exact string.
    """
    return host_key.rstrip("/") + ROBOTS_PATH


def product_token(user_agent: str) -> str:
    """Return the RFC 9309 product token of a User-Agent string.

    ``"idemcrawl/0.1 (+https://example.org/bot)"`` -> ``"idemcrawl"``. RFC 9309 section 2.2.1
    matches ``User-agent`` lines against the product token only, which may contain just
    ``[A-Za-z_-]``; passing the full header to the matcher could let a URL or comment inside it
    match some other bot's group. An unusable string falls back to ``"idemcrawl"`` rather than
    ``"*"``, because ``"*"`` would make us skip groups addressed to us by name.
    """
    first = user_agent.strip().split(None, 1)[0] if user_agent.strip() else ""
    token = _NOT_TOKEN_CHARS.sub("", first.split("/", 1)[0])
    return token or DEFAULT_PRODUCT_TOKEN


@dataclass(frozen=True)
class RobotsSettings:
    """The robots.txt knobs; defaults follow RFC 9309 (24 h cache, 500 KiB parse limit)."""

    #: The crawler's User-Agent; only its product token is matched against robots.txt groups.
    user_agent: str = DEFAULT_USER_AGENT
    #: Seconds a fetched copy is trusted (RFC 9309 section 2.4: SHOULD NOT exceed 24 h).
    max_age: float = 86400.0
    #: Seconds before an unreachable robots.txt is tried again; short, so a blip pauses briefly.
    error_ttl: float = 3600.0
    #: Largest Crawl-delay we will honour by slowing down; above it the host is deferred.
    crawl_delay_cap: float = 30.0
    #: Bytes of the body that are parsed (RFC 9309 section 2.5: at least 500 KiB).
    max_bytes: int = 500 * 1024

    def __post_init__(self) -> None:
        # Fail at configuration time: a zero TTL would refetch robots.txt before every request.
        for name in ("max_age", "error_ttl"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"RobotsSettings.{name} must be a positive number, got {value!r}")
        if not (math.isfinite(self.crawl_delay_cap) and self.crawl_delay_cap >= 0):
            raise ValueError(f"crawl_delay_cap must be >= 0, got {self.crawl_delay_cap!r}")
        if self.max_bytes <= 0:
            raise ValueError(f"max_bytes must be positive, got {self.max_bytes!r}")

    @property
    def token(self) -> str:
        """The product token matched against ``User-agent`` lines."""
        return product_token(self.user_agent)


@dataclass(frozen=True)
class RobotsState:
    """What we know about one host's robots.txt; plain data so the frontier can persist it.

    Invalid combinations raise at construction, so a corrupt database row fails loudly in
    :func:`state_from_row` instead of silently granting or denying a whole host.
    """

    #: ``RULES``, ``ALLOW_ALL`` or ``DISALLOW_ALL``.
    mode: str
    #: The last good robots.txt body (already truncated) when ``mode`` is ``RULES``, else None.
    body: bytes | None
    #: When the copy in ``mode``/``body`` was obtained; with the host key it names the copy.
    fetched_at: float
    #: When robots.txt must be fetched again (see :func:`needs_fetch`).
    expires_at: float
    #: HTTP status of the last attempt; None for a network error or timeout.
    last_status: int | None
    #: Why the last attempt failed, if it did; None after a 2xx or 4xx.
    last_error: str | None
    #: Crawl-delay of the group that applies to us, raw and uncapped.
    crawl_delay: float | None
    #: Set when ``crawl_delay`` exceeds the cap: the frontier pauses the host with this reason.
    deferred_reason: str | None
    #: ``Sitemap:`` URLs, in file order without duplicates.
    sitemaps: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"unknown robots mode {self.mode!r}")
        if (self.mode == RULES) != (self.body is not None):
            raise ValueError(f"robots mode {self.mode!r} with body={self.body is not None}")

    @property
    def good_copy(self) -> bool:
        """True when this state came from an actual answer (2xx/4xx), not from a failure."""
        return self.mode != DISALLOW_ALL


def needs_fetch(state: RobotsState | None, now: float) -> bool:
    """Return True when robots.txt must be (re)fetched before the host is crawled further.

    Unknown (None) counts: no URL of a host is leased before its robots.txt is known.
    """
    return state is None or now >= state.expires_at


def _classify(status: int | None, too_many_redirects: bool) -> _Outcome:
    """Map a final fetch result to RFC 9309's three access results (see the module doc)."""
    if too_many_redirects:
        return "unavailable"
    if status is None:
        return "unreachable"
    if 200 <= status < 300:
        return "success"
    if 400 <= status < 500 and status != 429:
        return "unavailable"
    return "unreachable"


def _truncate(body: bytes, max_bytes: int) -> bytes:
    """Cut ``body`` to at most ``max_bytes``, dropping a line that the cut would slice in two.

    A sliced ``Allow: /public`` would read as ``Allow: /pub`` and grant more than the site
    wrote; a sliced ``User-agent`` line could move rules into another group. Ending at the last
    line break keeps only lines the site actually wrote.
    """
    if len(body) <= max_bytes:
        return body
    head = body[:max_bytes]
    end = max(head.rfind(b"\n"), head.rfind(b"\r"))
    return head[: end + 1]


def _decode(body: bytes) -> str:
    """Decode a robots.txt body for Protego.

    RFC 9309 says the file is UTF-8. Invalid bytes become U+FFFD rather than failing, since a
    stray Latin-1 byte in a comment must not throw away every rule. A leading BOM is removed
    because Protego would otherwise read ``\\ufeffUser-agent`` as an unknown directive and lose
    the first group.
    """
    return body.decode("utf-8", errors="replace").removeprefix("\ufeff")


def _parse(body: bytes) -> Protego:
    return Protego.parse(_decode(body))


#: Directives that never refuse a URL, in every spelling Protego reads them (a "Disallow" with
#: no value is ignored by Protego and refuses nothing either).
_HARMLESS_DIRECTIVES: Final = frozenset(
    {
        "user-agent", "useragent", "user agent", "allow", "sitemap", "sitemaps", "site-map",
        "crawl-delay", "crawl delay", "request-rate", "request rate", "visit-time",
        "visit time", "host",
    }
)  # fmt: skip


def refuses_nothing(body: bytes) -> bool:
    """True when the robots.txt ``body`` cannot disallow any URL for any user agent.

    A very common file, ``User-agent: *`` + ``Allow: /`` (the benchmark site's), has no rule
    that refuses anything, yet each of its URLs cost a Protego ``can_fetch`` on the lease path
    (~12 k instructions: URL quoting and rule matching), once per granted URL. Only a disallow
    directive with a value can refuse a URL; so when every line, comments removed, is empty, a
    harmless directive, or a directive without a value, every URL is allowed. Anything else (an
    unknown directive with a value, a misspelt "Dissalow" that Protego honours, a line without
    a colon that Protego might still read as a directive) answers False and leaves the verdicts
    to Protego: the test is conservative, never a second parser that could disagree with it.
    """
    for line in _decode(body).splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        field, colon, value = line.partition(":")
        if not colon:
            return False
        if field.strip().lower() not in _HARMLESS_DIRECTIVES and value.strip():
            return False
    return True


def _deferral(crawl_delay: float | None, cap: float) -> str | None:
    if crawl_delay is None or crawl_delay <= cap:
        return None
    return f"Crawl-delay {crawl_delay:g} s exceeds cap {cap:g} s"


def outcome(
    status: int | None,
    body: bytes | None,
    now: float,
    settings: RobotsSettings,
    previous: RobotsState | None = None,
    *,
    error: str | None = None,
    too_many_redirects: bool = False,
) -> RobotsState:
    """Turn the final result of a robots.txt fetch into the host's new :class:`RobotsState`.

    ``status`` is the HTTP status after the engine followed redirects (None for a network error
    or timeout, with ``error`` saying which); ``too_many_redirects`` says the engine gave up
    after five hops. ``previous`` is the stored state, whose good copy survives an unreachable
    robots.txt. See the module docstring for the RFC 9309 reasoning behind each branch.
    """
    now = float(now)
    kind = _classify(status, too_many_redirects)
    cap = settings.crawl_delay_cap

    if kind == "success":
        kept = _truncate(body or b"", settings.max_bytes)
        parser = _parse(kept)
        delay = parser.crawl_delay(settings.token)
        return RobotsState(
            mode=RULES,
            body=kept,
            fetched_at=now,
            expires_at=now + settings.max_age,
            last_status=status,
            last_error=None,
            crawl_delay=delay,
            deferred_reason=_deferral(delay, cap),
            sitemaps=tuple(dict.fromkeys(parser.sitemaps)),
        )

    if kind == "unavailable":
        return RobotsState(
            mode=ALLOW_ALL,
            body=None,
            fetched_at=now,
            expires_at=now + settings.max_age,
            last_status=status,
            last_error=(error or "too many redirects") if too_many_redirects else None,
            crawl_delay=None,
            deferred_reason=None,
        )

    # Unreachable: keep a good copy if we have one, else disallow everything; retry soon.
    if error is None:
        error = "network error" if status is None else f"HTTP {status}"
    if previous is not None and previous.good_copy:
        return RobotsState(
            mode=previous.mode,
            body=previous.body,
            fetched_at=previous.fetched_at,
            expires_at=now + settings.error_ttl,
            last_status=status,
            last_error=error,
            crawl_delay=previous.crawl_delay,
            deferred_reason=_deferral(previous.crawl_delay, cap),
            sitemaps=previous.sitemaps,
        )
    return RobotsState(
        mode=DISALLOW_ALL,
        body=None,
        fetched_at=now,
        expires_at=now + settings.error_ttl,
        last_status=status,
        last_error=error,
        crawl_delay=None,
        deferred_reason=None,
    )


class RobotsCache:
    """Parsed robots.txt rules, so each stored copy is parsed once, not once per URL.

    Entries are keyed by ``(host_key, fetched_at)``: a new fetch gets a new ``fetched_at`` and
    so a new entry, while a copy kept across an unreachable refetch keeps its key and its parse.
    The body is stored with the parse and compared on lookup (identity first, so the usual hit
    costs nothing), which guards against two different bodies ever sharing a key. The cache is
    a bounded LRU because a broad crawl touches far more hosts than it needs rules for at once;
    an evicted entry is simply parsed again from the state. Not thread-safe: use it from the
    thread that schedules leases.
    """

    def __init__(self, settings: RobotsSettings, max_entries: int = 10_000) -> None:
        if max_entries < 1:
            raise ValueError(f"max_entries must be >= 1, got {max_entries!r}")
        self.settings = settings
        self.token = settings.token
        self.max_entries = max_entries
        #: (body, its rules, whether they refuse nothing: :func:`refuses_nothing`).
        self._entries: OrderedDict[tuple[str, float], tuple[bytes, Protego, bool]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[tuple[str, float]]:
        return iter(self._entries)

    def parser(self, host_key: str, state: RobotsState) -> Protego:
        """Return the parsed rules of a ``RULES`` state, parsing only on a miss."""
        return self._entry(host_key, state)[1]

    def _entry(self, host_key: str, state: RobotsState) -> tuple[bytes, Protego, bool]:
        if state.body is None:
            raise ValueError(f"robots state for {host_key} has no rules ({state.mode})")
        key = (host_key, state.fetched_at)
        entry = self._entries.get(key)
        if entry is not None and (entry[0] is state.body or entry[0] == state.body):
            self._entries.move_to_end(key)
            return entry
        entry = (state.body, _parse(state.body), refuses_nothing(state.body))
        self._entries[key] = entry
        self._entries.move_to_end(key)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)
        return entry

    def allowed(self, host_key: str, state: RobotsState | None, url: str) -> bool:
        """May ``url`` (a normalised URL of ``host_key``) be fetched under ``state``?

        The robots.txt URL itself is always allowed, since fetching it is how the state becomes
        known. Otherwise an unknown state is never allowed: leasing a URL before robots.txt is
        known would be exactly the request the site may have forbidden.
        """
        if url == robots_url(host_key):
            return True
        if state is None or state.mode == DISALLOW_ALL:
            return False
        if state.mode == ALLOW_ALL:
            return True
        _, parsed, allows_all = self._entry(host_key, state)
        return allows_all or parsed.can_fetch(url, self.token)

    def allows_every_url(self, host_key: str, state: RobotsState | None) -> bool:
        """True when :meth:`allowed` answers True for every URL of the host under ``state``
        (a 4xx robots.txt, or a file that refuses nothing): the lease path then neither reads
        spare URLs in case some are refused nor checks the ones it grants."""
        if state is None or state.mode == DISALLOW_ALL:
            return False
        return state.mode == ALLOW_ALL or self._entry(host_key, state)[2]

    def effective_delay(self, state: RobotsState | None, configured: float) -> float:
        """Seconds between request starts for the host: never less than the site asked for.

        Within the cap this is ``max(configured, crawl_delay)``. Above the cap the host is
        deferred (the caller pauses it on ``state.deferred_reason``), and the full requested
        delay is still returned rather than ``configured``, so a caller that forgets to pause
        still cannot crawl faster than the site asked.
        """
        if state is None or state.crawl_delay is None:
            return configured
        return max(configured, state.crawl_delay)


class _Row(Protocol):
    """Anything indexable by column name: a ``dict`` or a ``sqlite3.Row``."""

    def __getitem__(self, key: str, /) -> Any: ...


def state_to_row(state: RobotsState | None) -> dict[str, object]:
    """Return the ``hosts`` column values (:data:`ROW_COLUMNS`) that persist ``state``.

    None maps to all-NULL columns so the frontier can forget a host's robots.txt with the same
    statement. The fields that are never queried go into one JSON ``robots_meta`` column, which
    keeps the schema stable when a field is added.
    """
    if state is None:
        return dict.fromkeys(ROW_COLUMNS)
    meta = {
        "last_status": state.last_status,
        "last_error": state.last_error,
        "deferred_reason": state.deferred_reason,
        "sitemaps": list(state.sitemaps),
    }
    return {
        "robots_state": state.mode,
        "robots_body": state.body,
        "robots_fetched_at": state.fetched_at,
        "robots_expires_at": state.expires_at,
        "crawl_delay": state.crawl_delay,
        "robots_meta": json.dumps(meta, sort_keys=True, separators=(",", ":")),
    }


def state_from_row(row: _Row) -> RobotsState | None:
    """Rebuild a :class:`RobotsState` from :func:`state_to_row`'s columns; None if never set.

    Missing ``robots_meta`` keys take their defaults so rows written by an older version load.
    A corrupt row (unknown mode, rules without a body) raises ``ValueError``.
    """
    mode = row["robots_state"]
    if mode is None:
        return None
    raw_meta = row["robots_meta"]
    meta: dict[str, Any] = json.loads(raw_meta) if raw_meta else {}
    body = row["robots_body"]
    delay = row["crawl_delay"]
    status = meta.get("last_status")
    return RobotsState(
        mode=str(mode),
        body=None if body is None else bytes(body),
        fetched_at=float(row["robots_fetched_at"]),
        expires_at=float(row["robots_expires_at"]),
        last_status=None if status is None else int(status),
        last_error=meta.get("last_error"),
        crawl_delay=None if delay is None else float(delay),
        deferred_reason=meta.get("deferred_reason"),
        sitemaps=tuple(meta.get("sitemaps") or ()),
    )
