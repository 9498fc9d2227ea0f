"""Host politeness formulas (R6-R8), in one place so every backend applies the same ones.

The frontier stores the host's token state (``next_allowed_at``, ``in_flight``, ``error_streak``,
``backoff_until``, ``latency_ewma``, ``crawl_delay``) and calls these functions inside the same
transaction that grants or releases a lease.

* **Allowance** shrinks while a host errs: each consecutive error halves the concurrency it may
  have, down to 1; each success takes one step back up. So a struggling host gets gentler
  traffic at once and full traffic only after it has answered well again.
* **Delay** between request starts is the largest of: the configured delay (global or per
  host), the host's robots.txt ``Crawl-delay`` (up to the cap), and the latency-adaptive gap
  ``latency_factor * (recent response time - fast_latency) / allowance`` (Mercator/Heritrix
  style), capped so that one slow answer cannot park a host. Dividing by the allowance keeps the
  load the same whatever concurrency the host was given: with one request at a time the gap is
  factor * slowness, so a slow host is busy with us at most about 1/factor of the time; with eight
  allowed, eight requests may overlap at the same duty per slot, and a slow or erring host (whose
  allowance the error streak halves) is still slowed down. Only the part of the response time
  above ``fast_latency`` (default 0.1 s) counts: a host that answers that fast is not straining,
  and holding it to 1/factor of what its allowed concurrency gives would make an explicit
  ``--host-concurrency 8 --delay 0`` slower than a crawler without the rule (issue 18: the
  525-page shop at 10 ms took 1.97 s against Scrapy's 1.75 s with the whole response time
  counted).
* **Back-off** after an error: ``Retry-After`` when the server sent one (capped), otherwise
  exponential back-off with full jitter (uniform in ``[0, min(cap, base * 2**streak)]``), which
  spreads retries of many workers instead of synchronising them.
* **Circuit breaker**: after ``breaker_threshold`` consecutive errors the host is left alone for
  ``breaker_seconds``; afterwards it gets one request at a time until it recovers.
"""

from __future__ import annotations

import random

from .frontier.base import HostPolicy

#: Weight of the newest latency sample in the host's moving average.
LATENCY_ALPHA = 0.3
MAX_STREAK_SHIFT = 20


def allowance(max_in_flight: int, error_streak: int) -> int:
    """Requests a host may have in flight now, given its configured maximum and error streak."""
    return max(1, max_in_flight >> min(max(error_streak, 0), MAX_STREAK_SHIFT))


def effective_delay(
    configured: float,
    crawl_delay: float | None,
    crawl_delay_cap: float,
    latency_ewma: float | None,
    policy: HostPolicy,
    allowance: int = 1,
) -> float:
    """Seconds between request starts on a host; never below the configured minimum.

    ``allowance`` is the number of requests the host may have in flight right now: the
    adaptive gap is ``latency_factor * (latency_ewma - fast_latency) / allowance`` (module doc).
    """
    delay = configured
    if crawl_delay is not None and crawl_delay <= crawl_delay_cap:
        delay = max(delay, crawl_delay)
    slowness = (latency_ewma or 0.0) - policy.fast_latency
    if policy.latency_factor > 0 and slowness > 0:
        adaptive = policy.latency_factor * slowness / max(1, allowance)
        delay = max(delay, min(adaptive, policy.max_adaptive_delay))
    return delay


def update_latency(previous: float | None, sample: float) -> float:
    return sample if previous is None else previous + LATENCY_ALPHA * (sample - previous)


def backoff_seconds(
    error_streak: int, retry_after: float | None, policy: HostPolicy, rng: random.Random
) -> tuple[float, str]:
    """How long a host rests after its ``error_streak``-th consecutive error, and why."""
    if error_streak >= policy.breaker_threshold:
        wait = policy.breaker_seconds
        if retry_after is not None:
            wait = max(wait, min(retry_after, policy.retry_after_cap))
        return wait, f"circuit open after {error_streak} consecutive errors"
    if retry_after is not None:
        return min(retry_after, policy.retry_after_cap), f"Retry-After {retry_after:g} s"
    ceiling = min(policy.backoff_cap, policy.backoff_base * 2 ** min(error_streak - 1, 40))
    return rng.uniform(0, ceiling), f"back-off after {error_streak} consecutive errors"
