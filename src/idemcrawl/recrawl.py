"""When to fetch a URL again (R16): an adaptive revisit interval, bounded, with pins.

The rule is the classic one of incremental crawlers (Cho & Garcia-Molina): a page that changed
since the last round is probably changing often, so halve its interval; a page that did not
change doubles it. Both are clamped to ``[min_interval, max_interval]`` so no page is polled
more often than the operator allows, nor forgotten. Pinned patterns override the adaptation for
high-value URLs (a front page every hour whatever it does). 404/410 leave a *tombstone*: the URL
stays known (rediscovery does not make it new) and is checked again only after the long
tombstone interval (R15). Near-duplicates are revisited less often (R11).

The interval is decided in the engine, where the configuration lives, and stored with the
completion; the frontier only compares ``next_fetch_at`` with the clock.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

DAY = 86_400.0
TOMBSTONE_STATUS = frozenset({404, 410})


class PinError(ValueError):
    """A ``REGEX=SECONDS`` pin that cannot be used."""


def parse_pin(text: str) -> tuple[str, float]:
    """``REGEX=SECONDS`` → (regex, seconds); the regex is searched in the normalised URL."""
    pattern, sep, value = text.rpartition("=")
    if not sep or not pattern:
        raise PinError(f"pin {text!r}: expected REGEX=SECONDS")
    try:
        seconds = float(value)
    except ValueError:
        raise PinError(f"pin {text!r}: {value!r} is not a number of seconds") from None
    if not seconds > 0:
        raise PinError(f"pin {text!r}: the interval must be > 0 seconds")
    try:
        re.compile(pattern)
    except re.error as exc:
        raise PinError(f"pin {text!r}: bad regular expression: {exc}") from None
    return pattern, seconds


@dataclass(frozen=True)
class RecrawlPolicy:
    min_interval: float = DAY
    max_interval: float = 30 * DAY
    #: Interval after the first fetch; None = ``min_interval`` (learn quickly, then back off).
    initial_interval: float | None = None
    #: How long a 404/410 waits before it is checked again; None = ``max_interval``.
    tombstone_interval: float | None = None
    #: A near-duplicate's interval is stretched by this factor (still capped).
    near_dup_factor: float = 2.0
    #: (regex, seconds): the first pattern found in the URL fixes its interval.
    pins: tuple[tuple[str, float], ...] = ()

    def __post_init__(self) -> None:
        if not 0 < self.min_interval <= self.max_interval:
            raise ValueError("recrawl intervals need 0 < min <= max")
        object.__setattr__(self, "_compiled", tuple((re.compile(p), s) for p, s in self.pins))

    def pinned(self, url: str) -> float | None:
        for rx, seconds in self._compiled:  # type: ignore[attr-defined]
            if rx.search(url):
                return float(seconds)
        return None

    def next_interval(
        self,
        url: str,
        previous: float | None,
        *,
        changed: bool,
        status: int,
        near_duplicate: bool = False,
    ) -> float:
        """The interval until the next round of ``url`` after this one."""
        pinned = self.pinned(url)
        if pinned is not None:
            return pinned
        if status in TOMBSTONE_STATUS:
            return self.tombstone_interval or self.max_interval
        if previous is None:
            interval = self.initial_interval or self.min_interval
        elif changed:
            interval = previous / 2
        else:
            interval = previous * 2
        if near_duplicate:
            interval *= self.near_dup_factor
        return min(max(interval, self.min_interval), self.max_interval)
