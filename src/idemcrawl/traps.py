"""Crawler-trap defences (R17): URL shape limits, per-template growth gates, host budgets.

A crawler trap is a site (usually by accident) offering unboundedly many URLs: calendars with a
"next day" link forever, faceted navigation whose filters combine into millions of query
strings, session ids minted into every link, relative-link bugs producing ``/a/a/a/a/...``.
No single rule catches them all without also blocking real sites, so there are three layers,
each cheap and each explainable by the reason string it returns:

1. :func:`check_url`: static limits on one URL (length, query parameters, repeated path
   segments, link depth). Stateless.
2. :class:`TemplateGate`: URLs are reduced to a *template* (:func:`url_template`) that keeps
   the host, the literal words of the path and the query keys but replaces numbers, ids and
   query values by their shape. A real site has a few templates with bounded growth; a trap
   keeps minting new URLs of the same template. After ``template_growth_limit`` new URLs a
   template is *paused*: only one in ``template_sample_every`` further new URLs is admitted,
   so a legitimate long list (pagination, a big catalogue) still progresses slowly instead of
   being cut off, and a trap costs a bounded fraction of the crawl. Other templates and other
   hosts are never affected.
3. :class:`HostBudget`: a per-host cap on fetches per UTC day, the backstop for traps that
   evade templates (random words in paths).

The gate and the budget keep their counters in memory for speed, but expose
``snapshot()``/``restore()`` so the frontier can persist them and a restart resumes with the
same counts (R2): a restarted crawl must not re-admit a trap's first 1,000 URLs.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, date, datetime
from typing import Final

__all__ = [
    "HostBudget",
    "TemplateGate",
    "TrapLimits",
    "check_url",
    "url_template",
]


@dataclass(frozen=True, slots=True)
class TrapLimits:
    """Thresholds of the trap defences; the defaults suit a general-purpose crawl.

    * ``max_url_length``: longer URLs are almost always generated junk (2,048 is also the
      longest URL several search engines index).
    * ``max_query_params``: faceted navigation piles parameters up; real pages rarely need
      more than a dozen.
    * ``max_repeated_segment``: a path segment occurring more than this many times
      (``/a/a/a/a``, ``/x/y/x/y/x/y/x/y``) is a relative-link loop.
    * ``max_depth``: links followed from a seed.
    * ``template_growth_limit`` / ``template_sample_every``: see :class:`TemplateGate`.
    * ``host_daily_budget``: fetches per host per UTC day, see :class:`HostBudget`.
    """

    max_url_length: int = 2048
    max_query_params: int = 12
    max_repeated_segment: int = 3
    max_depth: int = 16
    template_growth_limit: int = 1000
    template_sample_every: int = 50
    host_daily_budget: int = 100_000

    def __post_init__(self) -> None:
        for name in (
            "max_url_length",
            "max_query_params",
            "max_repeated_segment",
            "max_depth",
            "template_growth_limit",
            "template_sample_every",
            "host_daily_budget",
        ):
            value = getattr(self, name)
            if value < (1 if name == "template_sample_every" else 0):
                raise ValueError(f"{name} must not be {value}")


# --------------------------------------------------------------------------------------------
# URL templates

#: A UUID anywhere, or an "alphanumeric run" where a percent-escape counts as one character
#: (so ``caf%C3%A9`` is one word, not three tokens).
_TOKEN: Final = re.compile(
    r"[0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{12}"
    r"|(?:[A-Za-z0-9]|%[0-9A-Fa-f]{2})+"
)
_HEX: Final = frozenset("0123456789abcdefABCDEF")
_DIGITS: Final = re.compile(r"[0-9]+")
_LETTER_DIGIT_SWITCH: Final = re.compile(r"(?<=[0-9])(?=[^0-9])|(?<=[^0-9])(?=[0-9])")


def _token_shape(token: str, in_query_value: bool) -> str:
    """The shape of one alphanumeric token.

    * ``N``: all digits (ids, dates, page numbers);
    * ``H``: a UUID, or 8+ hex digits with at least one digit and one letter a-f (hashes,
      hex session ids: ``jsessionid``, ``sid``);
    * ``X``: random-looking: 12+ characters switching between letters and digits at least 3
      times (``aZ9kq0Lm3Xp2``), or any token of 32+ characters (base64-ish tokens);
    * anything else is a *word*. In the path a word is kept literally, with its digit runs
      replaced by ``N`` (``page2`` -> ``pageN``): path words are the site's vocabulary. In a
      query value a word becomes ``W``: values are the user's choices (``view=day``,
      ``color=red``), and two URLs differing only in such choices are the same page type.
    """
    if "-" in token:  # only the UUID alternative of _TOKEN contains '-'
        return "H"
    if token.isdigit():
        return "N"
    length = len(token)
    if length >= 8 and _HEX.issuperset(token) and any(c.isdigit() for c in token):
        return "H"  # not all digits (checked above), so it has a letter a-f too
    if length >= 32 or (length >= 12 and len(_LETTER_DIGIT_SWITCH.findall(token)) >= 3):
        return "X"
    if in_query_value:
        return "W"
    return _DIGITS.sub("N", token)


def _shape(text: str, in_query_value: bool) -> str:
    return _TOKEN.sub(lambda m: _token_shape(m.group(), in_query_value), text)


def _split_url(url: str) -> tuple[str, str, str]:
    """``(origin, path, query)`` by slicing; works on any URL-ish string, fragment dropped."""
    url = url.split("#", 1)[0]
    scheme_end = url.find("://")
    start = scheme_end + 3 if scheme_end != -1 else 0
    cut = len(url)
    for sep in "/?":
        at = url.find(sep, start)
        if at != -1:
            cut = min(cut, at)
    origin, rest = url[:cut], url[cut:]
    path, _, query = rest.partition("?")
    return origin.lower(), path, query


def url_template(url: str) -> str:
    """Reduce ``url`` to its shape: same template = same kind of page on the same host.

    Kept: scheme, host and port (lower-cased); the path's punctuation and literal words;
    query keys, in their original order (order is part of how a site generates links, and
    keeping it costs nothing). Replaced, in the path and query keys: digit runs -> ``N``,
    UUIDs and hex ids -> ``H``, long random-looking tokens -> ``X``; in query values, words
    -> ``W`` as well (see :func:`_token_shape`). The fragment is dropped. Examples::

        https://ex.com/cal/2024/05/12?view=day        -> https://ex.com/cal/N/N/N?view=W
        https://ex.com/p;jsessionid=0A1B2C3D4E5F6A7B  -> https://ex.com/p;jsessionid=H
        https://ex.com/list?sid=5f3a9c01d2&page=7     -> https://ex.com/list?sid=H&page=N

    Pass normalised URLs (``idemcrawl.url.normalise``) so equivalent spellings agree.
    """
    origin, path, query = _split_url(url)
    template = origin + _shape(path, in_query_value=False)
    if query:
        params = []
        for param in query.split("&"):
            key, eq, value = param.partition("=")
            params.append(_shape(key, False) + eq + _shape(value, True))
        template += "?" + "&".join(params)
    return template


# --------------------------------------------------------------------------------------------
# Static limits


def check_url(url: str, depth: int, limits: TrapLimits) -> str | None:
    """Why ``url`` (found at link ``depth``) must not be queued, or None if it may be.

    Checks, in this order, and returns the first failure: URL length, number of query
    parameters (non-empty ``&``-separated pieces), the most repeated path segment (counted
    anywhere in the path, so ``/x/y/x/y/x/y/x/y`` loops are caught too; a trailing ``/`` does
    not count as an empty segment), and depth.
    """
    if len(url) > limits.max_url_length:
        return f"url length {len(url)} > {limits.max_url_length}"
    _, path, query = _split_url(url)
    if query:
        params = sum(1 for piece in query.split("&") if piece)
        if params > limits.max_query_params:
            return f"query params {params} > {limits.max_query_params}"
    segments = path.split("/")[1:]
    if segments and segments[-1] == "":
        segments.pop()
    if len(segments) > limits.max_repeated_segment:
        segment, times = Counter(segments).most_common(1)[0]
        if times > limits.max_repeated_segment:
            return f"repeated path segment {segment!r} x{times}"
    if depth > limits.max_depth:
        return f"depth {depth} > {limits.max_depth}"
    return None


def reason_class(reason: str) -> str:
    """The counter name of a :func:`check_url` reason ("url length 3000 > 2048" → url_length)."""
    for prefix, name in (
        ("url length", "url_length"),
        ("query params", "query_params"),
        ("repeated path segment", "repeated_segment"),
        ("depth", "depth"),
    ):
        if reason.startswith(prefix):
            return name
    return "trap"


# --------------------------------------------------------------------------------------------
# Template growth gate


class TemplateGate:
    """Admits new URLs per template; pauses a template after it has grown too much.

    Call :meth:`admit` only for URLs that are *new* to the crawl (after the frontier's
    de-duplication), since the count is "new URLs of this template". The n-th new URL of a
    template is admitted when ``n <= growth_limit``; after that the template is paused and
    only every ``sample_every``-th new URL is admitted, so a legitimate but long list still
    advances (and a human reading the reasons sees the template). Counting is per template
    string, and templates include the host, so a paused template never affects another
    template or host.

    Memory is one entry per distinct template. URLs whose variable parts are plain words
    (random slugs) evade shaping and get a template each; :class:`HostBudget` is the
    backstop for those.

    State is a ``{template: count}`` dict: :meth:`snapshot` / :meth:`restore` let the
    frontier persist it (e.g. a ``templates(template TEXT PRIMARY KEY, count INTEGER)`` table
    updated in the same transaction as the URLs it admitted).
    """

    def __init__(self, limits: TrapLimits | None = None) -> None:
        limits = limits if limits is not None else TrapLimits()
        self.growth_limit = limits.template_growth_limit
        self.sample_every = limits.template_sample_every
        self._counts: dict[str, int] = {}
        #: Templates this gate saw cross the growth limit (a trap trigger, for metrics).
        self.pauses = 0

    def admit(self, url: str) -> tuple[bool, str | None]:
        """Count a new URL; ``(True, None)`` to queue it, ``(False, reason)`` to reject it."""
        return self.admit_template(url_template(url))

    def admit_template(self, template: str) -> tuple[bool, str | None]:
        """:meth:`admit` for a caller that already computed the template."""
        n = self._counts.get(template, 0) + 1
        self._counts[template] = n
        over = n - self.growth_limit
        if over == 1:
            self.pauses += 1
        if over <= 0 or over % self.sample_every == 0:
            return True, None
        return False, f"template paused: {template} ({self.growth_limit} new URLs)"

    def count(self, template: str) -> int:
        return self._counts.get(template, 0)

    def is_paused(self, template: str) -> bool:
        return self._counts.get(template, 0) >= self.growth_limit

    def paused(self) -> list[str]:
        """Paused templates, most grown first (for status reports)."""
        return sorted(
            (t for t, n in self._counts.items() if n >= self.growth_limit),
            key=lambda t: -self._counts[t],
        )

    def snapshot(self) -> dict[str, int]:
        return dict(self._counts)

    def restore(self, counts: Mapping[str, int]) -> None:
        """Replace the state with persisted counts."""
        self._counts = {t: int(n) for t, n in counts.items() if int(n) > 0}

    def __len__(self) -> int:
        return len(self._counts)


# --------------------------------------------------------------------------------------------
# Host daily budget

_DAY_SECONDS: Final = 86_400


def _utc_day(now: float) -> int:
    """Days since 1970-01-01 UTC."""
    return int(now // _DAY_SECONDS)


def _day_label(day: int) -> str:
    return datetime.fromtimestamp(day * _DAY_SECONDS, UTC).date().isoformat()


def _day_from_label(label: str) -> int:
    return (date.fromisoformat(label) - date(1970, 1, 1)).days


class HostBudget:
    """Caps fetches per host per UTC day; the count starts again at 00:00 UTC.

    Keyed by ``(host_key, UTC day)``. The engine asks :meth:`allow` before leasing/fetching
    and calls :meth:`spend` once per fetch. Counters of past days are dropped as soon as a
    later day is seen, so memory is bounded by the hosts active today.

    :meth:`snapshot` returns ``{"YYYY-MM-DD <host_key>": count}`` (a host key never contains a
    space), a flat form that persists as easily as the template counts.
    """

    def __init__(self, limits: TrapLimits | None = None) -> None:
        limits = limits if limits is not None else TrapLimits()
        self.daily_budget = limits.host_daily_budget
        self._spent: dict[tuple[str, int], int] = {}
        self._latest_day = -1

    def _advance(self, day: int) -> None:
        if day > self._latest_day:
            self._latest_day = day
            self._spent = {key: n for key, n in self._spent.items() if key[1] >= day}

    def spent(self, host_key: str, now: float) -> int:
        return self._spent.get((host_key, _utc_day(now)), 0)

    def remaining(self, host_key: str, now: float) -> int:
        return max(0, self.daily_budget - self.spent(host_key, now))

    def allow(self, host_key: str, now: float) -> bool:
        """Whether ``host_key`` may be fetched once more on ``now``'s UTC day."""
        return self.spent(host_key, now) < self.daily_budget

    def spend(self, host_key: str, now: float, n: int = 1) -> int:
        """Record ``n`` fetches on ``now``'s UTC day; returns what is left of today's budget."""
        day = _utc_day(now)
        self._advance(day)
        key = (host_key, day)
        total = self._spent.get(key, 0) + n
        self._spent[key] = total
        return max(0, self.daily_budget - total)

    def snapshot(self) -> dict[str, int]:
        return {f"{_day_label(day)} {host}": n for (host, day), n in self._spent.items()}

    def restore(self, counts: Mapping[str, int]) -> None:
        """Replace the state with persisted counts (malformed keys raise ``ValueError``)."""
        spent: dict[tuple[str, int], int] = {}
        for label, n in counts.items():
            day_text, sep, host = label.partition(" ")
            if not sep or not host:
                raise ValueError(f"malformed budget key {label!r}")
            spent[(host, _day_from_label(day_text))] = int(n)
        self._spent = spent
        self._latest_day = max((day for _, day in spent), default=-1)
