"""Live control of a running crawl: pause, resume, block, change a delay or budget, add URLs.

A request is written into the crawl database, so every process and machine sharing the crawl
obeys it at its next lease. This module turns what an operator typed (an action and its words)
into a checked :class:`ControlRequest` and applies it through the frontier. The frontier's own
check (:func:`idemcrawl.frontier.base.control_value`: known action, host present, delay >= 0)
stays the rule the backends enforce; it is asked here too, so an operator hears about a bad
value before anything is written, in words about what they typed.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from .config import host_keys_for
from .frontier.base import CONTROL_ACTIONS, Frontier, NewURL, control_value
from .url import host_key, normalise

__all__ = ["ACTIONS", "ControlError", "ControlRequest", "apply_control", "parse_control"]

#: Every action an operator can ask for: the frontier's host controls, plus adding URLs.
ACTIONS = (*CONTROL_ACTIONS, "add")

#: The words each action takes, for messages (pause/resume also work without a host).
_SHAPES = {"set-delay": "HOST SECONDS", "set-budget": "HOST N"}


class ControlError(ValueError):
    """A control request that cannot be applied; the message is one line for the operator."""


@dataclass(frozen=True)
class ControlRequest:
    """A checked request. ``host_keys`` empty means the whole crawl (pause/resume only)."""

    action: str
    host_keys: tuple[str, ...] = ()
    #: Seconds for set-delay, fetches per day for set-budget, else None.
    value: float | int | None = None
    #: Normalised URLs for ``add``.
    urls: tuple[str, ...] = ()


def parse_control(action: str, args: Sequence[str]) -> ControlRequest:
    """Check ``action`` and its words: ``pause``/``resume [HOST]``, ``block``/``unblock HOST``,
    ``set-delay HOST SECONDS``, ``set-budget HOST N``, ``add URL…``.

    A bare ``host[:port]`` names both its http and https host keys. Raises
    :class:`ControlError` (or :class:`~idemcrawl.url.InvalidURL` for a bad URL to add).
    """
    if action not in ACTIONS:
        raise ControlError(f"unknown control action {action!r} (known: {', '.join(ACTIONS)})")
    if action == "add":
        if not args:
            raise ControlError("control add needs at least one URL")
        return ControlRequest(action, urls=tuple(normalise(raw) for raw in args))
    if action in ("pause", "resume") and not args:
        return ControlRequest(action)
    wants_value = action in _SHAPES
    if len(args) != (2 if wants_value else 1):
        raise ControlError(f"control {action} takes {_SHAPES.get(action, 'HOST')}")
    try:
        keys = tuple(host_keys_for(args[0]))
    except ValueError as exc:
        raise ControlError(str(exc)) from None
    value: float | int | None = None
    if wants_value:
        text = args[1]
        try:
            value = float(text) if action == "set-delay" else int(text)
        except ValueError:
            raise ControlError(f"control {action}: {text!r} is not a number") from None
        if action == "set-budget" and value < 1:  # a budget of 0 would stop the host for good
            raise ControlError(f"control {action}: {text!r} is out of range")
        try:
            control_value(action, keys[0], value)
        except ValueError:
            raise ControlError(f"control {action}: {text!r} is out of range") from None
    return ControlRequest(action, keys, value)


def apply_control(frontier: Frontier, request: ControlRequest, now: float | None = None) -> str:
    """Write ``request`` into the crawl database; returns one line saying what was done."""
    if request.action == "add":
        new = [NewURL(u, host_key(u), priority=1) for u in request.urls]
        frontier.add_seeds([n.host_key for n in new])
        added = frontier.add(new, time.time() if now is None else now)
        return f"added {added} new URL(s) of {len(new)}"
    if not request.host_keys:
        frontier.control(request.action, None)
        return f"{request.action}d the whole crawl"
    for hk in request.host_keys:
        frontier.control(request.action, hk, request.value)
    value = "" if request.value is None else f" = {request.value}"
    return f"{request.action} {', '.join(request.host_keys)}{value}"
