"""The crawl's cookie jar: Set-Cookie in, Cookie out, rows kept by the frontier (issue 16).

A crawl with a spider gets one cookie jar per crawl (``Spider.keep_cookies``, True unless the
spider sets it False; a crawl without a spider keeps none), stored in the frontier's
``cookies`` table: the cookies a response sets are written in the transaction that
completes its URL (so a login and the session it opened commit together), and every crawl
process reloads the jar after each lease call, so a URL discovered after a login is always
fetched with the session (its insert committed with the cookie, before anyone could lease it).
A restart reloads the same jar: a login done once is not done again while its session lasts.

What is implemented of RFC 6265 is what a crawler needs: host-only and ``Domain`` cookies
(never for a public suffix we can spot cheaply: a bare top-level name), ``Path`` prefix
matching, ``Secure`` (https only), ``Expires``/``Max-Age`` (a cookie in the past deletes the
stored one). ``HttpOnly`` and ``SameSite`` change nothing for a crawler.
"""

from __future__ import annotations

import email.utils
import threading
from collections.abc import Iterable, Sequence
from urllib.parse import urlsplit

from .frontier.base import Cookie

#: Cookies kept per crawl at most, and bytes per cookie: a hostile site cannot fill the table.
MAX_COOKIES = 3000
MAX_COOKIE_BYTES = 4096
#: Set-Cookie headers taken from one response at most.
MAX_PER_RESPONSE = 50


def _default_path(path: str) -> str:
    if not path.startswith("/") or path.count("/") == 1:
        return "/"
    return path[: path.rindex("/")]


def _expiry(attrs: dict[str, str], now: float) -> float | None:
    """Seconds since the epoch the cookie dies at; None: a session cookie (the crawl's life)."""
    max_age = attrs.get("max-age")
    if max_age is not None:
        try:
            return now + int(max_age)
        except ValueError:
            pass
    expires = attrs.get("expires")
    if expires:
        try:
            return email.utils.parsedate_to_datetime(expires).timestamp()
        except (TypeError, ValueError, IndexError, OverflowError):
            return None
    return None


def parse_set_cookie(header: str, url: str, now: float) -> Cookie | None:
    """One ``Set-Cookie`` value received from ``url`` as a :class:`Cookie`; None when it is
    malformed or names a domain the URL's host may not set cookies for."""
    if len(header) > MAX_COOKIE_BYTES:
        return None
    parts = header.split(";")
    name, sep, value = parts[0].partition("=")
    name, value = name.strip(), value.strip()
    if not sep or not name:
        return None
    attrs: dict[str, str] = {}
    for part in parts[1:]:
        k, _, v = part.partition("=")
        attrs[k.strip().lower()] = v.strip()
    split = urlsplit(url)
    host = (split.hostname or "").lower()
    domain = attrs.get("domain", "").lstrip(".").lower()
    host_only = not domain
    if domain and ("." not in domain or not (host == domain or host.endswith("." + domain))):
        return None  # a bare TLD, or another site's domain
    path = attrs.get("path", "")
    if not path.startswith("/"):
        path = _default_path(split.path or "/")
    return Cookie(
        domain or host,
        path,
        name,
        value,
        _expiry(attrs, now),
        "secure" in attrs,
        host_only,
    )


def cookies_from(raw_headers: Iterable[tuple[str, str]], url: str, now: float) -> list[Cookie]:
    """Every acceptable cookie a response's headers set, in order."""
    out = []
    for name, value in raw_headers:
        if name.lower() == "set-cookie":
            c = parse_set_cookie(value, url, now)
            if c is not None:
                out.append(c)
    return out[:MAX_PER_RESPONSE]


def _matches(c: Cookie, host: str, path: str, https: bool, now: float) -> bool:
    if c.expires is not None and c.expires <= now:
        return False
    if c.secure and not https:
        return False
    if c.host_only:
        if host != c.domain:
            return False
    elif not (host == c.domain or host.endswith("." + c.domain)):
        return False
    return path == c.path or (
        path.startswith(c.path) and (c.path.endswith("/") or path[len(c.path)] == "/")
    )


class CookieJar:
    """This process's copy of the crawl's jar (:meth:`load` replaces it with the frontier's),
    and the ``Cookie`` header for a URL. Loaded on the frontier's thread, read on the loop."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cookies: tuple[Cookie, ...] = ()

    def load(self, cookies: Sequence[Cookie]) -> None:
        with self._lock:
            self._cookies = tuple(cookies)

    def __len__(self) -> int:
        return len(self._cookies)

    def header_for(self, url: str, now: float) -> str | None:
        """``name=value; …`` of the cookies to send to ``url`` (longer paths first), or None."""
        split = urlsplit(url)
        host = (split.hostname or "").lower()
        path = split.path or "/"
        https = split.scheme == "https"
        with self._lock:
            found = [c for c in self._cookies if _matches(c, host, path, https, now)]
        if not found:
            return None
        found.sort(key=lambda c: -len(c.path))
        return "; ".join(f"{c.name}={c.value}" for c in found)
