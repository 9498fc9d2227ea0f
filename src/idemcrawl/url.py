"""URL normalisation and scoping for the crawler.

Every URL the crawler sees passes through :func:`normalise` before it is queued, deduplicated
or fetched. The normalised string is the crawler's identity for a resource: two links that a
server would treat as the same resource should map to the same string, and normalising an
already-normalised URL must change nothing (idempotence), otherwise a URL could be
re-discovered under a "new" name after a restart and fetched twice.

Parsing and resolution follow the WHATWG URL Standard (what browsers do) via ``ada_url``; on
top of that this module applies the RFC 3986 section 6 "syntax-based" normalisations that
WHATWG leaves alone (hex-case of escapes, decoding of escaped unreserved characters), plus a
few crawler policy choices (no fragments, no credentials, http(s) only, bare ``?`` dropped).

Design notes:

* ``normalise`` is on the hot path (dozens of calls per fetched page), so it makes exactly one
  call into ada and does everything else with plain ``str`` slicing on ada's serialisation,
  which has a fixed, well-known shape for http(s): ``scheme://[userinfo@]host[:port]/path[?q]
  [#frag]``. Percent-escape work only happens when the string contains a ``%``.
* ``host_key`` and ``hostname`` rely on that shape too and never re-parse, so they are only
  meaningful for ``normalise`` output (or a ``host_key`` value).
* Nothing here touches the network: IDNA is ada's local UTS #46 implementation and
  :func:`same_site` is a heuristic, not a Public Suffix List lookup.
"""

from __future__ import annotations

import hashlib
import re
from functools import lru_cache
from typing import Final

import ada_url

try:  # the fast path of Resolver in C (setup.py; optional: the Python one gives the same URLs)
    from . import _links as _native
except ImportError:  # pragma: no cover - a build without a C compiler
    _native = None

__all__ = [
    "MAX_URL_LENGTH",
    "InvalidURL",
    "Resolver",
    "host_key",
    "hostname",
    "in_scope",
    "normalise",
    "same_site",
    "url_fingerprint",
]

#: Longest URL (input or output) accepted: about the request-line limit of common servers, so
#: anything longer could not be fetched anyway. Checked before parsing so junk is cheap.
MAX_URL_LENGTH: Final = 8192

_ERROR_URL_CHARS: Final = 200

#: WHATWG strips leading/trailing C0 controls and space; we use the same set so that our
#: idea of "surrounding whitespace" matches the browser's (a non-breaking space is *not*
#: stripped by browsers, it is percent-encoded, and so it is here).
_STRIP_CHARS: Final = "".join(chr(c) for c in range(0x21))

_HEX: Final = "0123456789abcdefABCDEF"
_UNRESERVED: Final = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-._~")


def _build_escape_table() -> dict[str, tuple[str, bool]]:
    """Map every two-hex-digit escape body (any case) to its canonical replacement.

    The flag says whether the replacement is a bare hex digit, which matters for the
    stray-``%`` guard in :func:`_normalise_escapes`. A precomputed dict turns the per-escape
    work into one lookup instead of ``int()``/``chr()``/``upper()`` calls.
    """
    table: dict[str, tuple[str, bool]] = {}
    for hi in _HEX:
        for lo in _HEX:
            body = hi + lo
            char = chr(int(body, 16))
            if char in _UNRESERVED:
                table[body] = (char, char in _HEX)
            else:
                table[body] = ("%" + body.upper(), False)
    return table


_ESCAPES: Final = _build_escape_table()


class InvalidURL(ValueError):
    """A URL the crawler will not handle: unparseable, wrong scheme, credentials, too long...

    Subclasses ``ValueError`` so callers that just want "bad input" can catch that; the
    offending URL (truncated, since junk URLs can be huge) and the reason are kept as
    attributes so they can be logged or counted without parsing the message.
    """

    def __init__(self, url: str, reason: str) -> None:
        shown = url if len(url) <= _ERROR_URL_CHARS else url[:_ERROR_URL_CHARS] + "..."
        super().__init__(f"invalid URL {shown!r}: {reason}")
        self.url = shown
        self.reason = reason


def _normalise_escapes(tail: str) -> str:
    """Canonicalise percent-escapes in the path+query part of a URL.

    Escapes of unreserved characters are decoded (RFC 3986 6.2.2.2 says they are equivalent)
    and the hex digits of every other escape are upper-cased (6.2.2.1). ada already
    percent-encodes everything that needs it, but it deliberately leaves existing escapes
    untouched, so ``%7e``, ``%7E`` and ``~`` would otherwise be three different URLs.

    A ``%`` not followed by two hex digits is left as is (that is what a browser sends). Such
    a stray ``%`` could combine with a *decoded* hex digit into a brand-new escape
    (``%%34%31`` -> ``%41``), which a second pass would decode again, breaking idempotence;
    so an escape that would decode to a hex digit right after a stray ``%`` and at most one
    hex digit is kept (upper-cased) instead of decoded.
    """
    pieces = tail.split("%")
    out = [pieces[0]]
    guard = False  # previous piece was a stray '%' that a decoded hex digit could complete
    for piece in pieces[1:]:
        entry = _ESCAPES.get(piece[:2])
        if entry is None:
            out.append("%")
            out.append(piece)
            guard = piece == "" or (len(piece) == 1 and piece in _HEX)
            continue
        replacement, is_hex_digit = entry
        if guard and is_hex_digit:
            replacement = "%" + piece[:2].upper()
        out.append(replacement)
        out.append(piece[2:])
        guard = False
    return "".join(out)


def normalise(url: str, base: str | None = None) -> str:
    """Return the canonical absolute form of ``url``, resolved against ``base`` if given.

    The result is an ``http``/``https`` URL with: lower-case scheme and host; IDNA (punycode)
    host without a trailing dot; no default port; dot segments removed; path at least ``/``;
    escapes of unreserved characters decoded and all other escapes upper-case; no fragment;
    and no empty query (a bare trailing ``?`` is dropped: practically every server treats
    ``/p?`` and ``/p`` alike, and keeping it would make them two frontier entries). Query
    parameters are never reordered or removed, since servers may depend on their order.

    ``normalise(normalise(u)) == normalise(u)`` holds for every accepted ``u``.

    Raises :class:`InvalidURL` for: input (or result) longer than :data:`MAX_URL_LENGTH`; a
    relative reference with no ``base``; anything ada cannot parse; schemes other than
    http(s) (``mailto:``, ``javascript:``, ``data:``, ``ftp:``...); an empty host or one with
    empty labels (``a..b``, ``.a``; only a single trailing dot is folded away); and URLs
    carrying a username or password (a crawler must not store or send credentials taken from
    a page, and silently stripping them could fetch something other than what was linked). A
    bare ``@`` with empty userinfo is accepted because WHATWG drops it: it carries nothing.
    """
    url = url.strip(_STRIP_CHARS)
    if len(url) > MAX_URL_LENGTH:
        raise InvalidURL(url, f"longer than {MAX_URL_LENGTH} characters")
    if base is not None and len(base) > MAX_URL_LENGTH:
        raise InvalidURL(base, f"base URL longer than {MAX_URL_LENGTH} characters")
    try:
        href = ada_url.normalize_url(url) if base is None else ada_url.join_url(base, url)
    except ValueError:
        if base is None and ":" not in url:
            reason = "relative reference without a base URL"
        elif base is None:
            reason = "not a valid absolute URL"
        else:
            reason = f"cannot be resolved against base {base[:_ERROR_URL_CHARS]!r}"
        raise InvalidURL(url, reason) from None

    # ada serialises http(s) URLs as scheme://[userinfo@]host[:port]/path[?query][#fragment]
    # with a lower-case scheme, so everything below is slicing on that known shape.
    if href.startswith("https://"):
        start = 8
    elif href.startswith("http://"):
        start = 7
    else:
        scheme = href.partition(":")[0]
        raise InvalidURL(url, f"unsupported scheme {scheme!r} (only http and https)")

    # '#' cannot occur unescaped before the fragment, so the first one starts it.
    hash_at = href.find("#")
    if hash_at != -1:
        href = href[:hash_at]

    path_at = href.find("/", start)  # always present: special URLs have a non-empty path
    authority = href[start:path_at]
    rest = href[path_at:]

    if "@" in authority:  # '@' can't appear in a host; ada drops empty userinfo
        raise InvalidURL(url, "credentials in URL")

    if authority.startswith("["):  # IPv6: ada already canonicalised it, port after ']'
        host_end = authority.index("]") + 1
    else:
        host_end = authority.find(":")
        if host_end == -1:
            host_end = len(authority)
        host = authority[:host_end]
        if host.endswith("."):
            # "example.com." and "example.com" are the same host for DNS; fold them.
            host = host[:-1]
            authority = host + authority[host_end:]
            host_end = len(host)
        if host.startswith(".") or host.endswith(".") or ".." in host:
            # Empty labels can't be resolved by DNS, and folding them away would change how
            # WHATWG reads the host ("h..9.." is a domain, "h..9" an invalid IPv4 address).
            raise InvalidURL(url, "empty label in host")
    if host_end == 0:
        raise InvalidURL(url, "empty host")

    if "%" in rest:
        rest = _normalise_escapes(rest)
    # Drop an empty query. The path cannot contain '?', and a '?' inside the query stays
    # literal, so the query is empty exactly when the first '?' is also the last character
    # ("/p?a?" has the query "a?" and is kept).
    if rest.endswith("?") and rest.find("?") == len(rest) - 1:
        rest = rest[:-1]

    result = href[:start] + authority + rest
    if len(result) > MAX_URL_LENGTH:
        raise InvalidURL(url, f"longer than {MAX_URL_LENGTH} characters once normalised")
    return result


#: A path (and optional query) that ``normalise`` would return unchanged after an origin:
#: only characters WHATWG leaves as they are in a path and a query (no ``%``, so no escape to
#: canonicalise; no ``'``, which the query set of special schemes encodes; no ``\``, space or
#: controls), a non-empty query if any, and no dot segment (a ``/.`` anywhere sends the link
#: down the general path, which also covers ``/.well-known``: rare, and merely slower).
_PLAIN_PATH: Final = re.compile(
    r"/[A-Za-z0-9\-_~!$&()*+,;=:@/.]*(?:\?[A-Za-z0-9\-_~!$&()*+,;=:@/.?]+)?"
)
_HREF_SPECIAL: Final = re.compile(r"[\t\n\r\\%]")
#: Links that are not URLs to crawl, refused without the URL parser (an opaque path follows
#: the colon, which the parser accepts whatever it holds, so the refusal is the same).
_OTHER_SCHEME: Final = re.compile(r"(mailto|tel|javascript):(?!/)")
_NOT_PLAIN_STARTS: Final = frozenset("#mtj")
#: A host ``normalise`` keeps as it is: lower-case labels of ``[a-z0-9-]``, none starting
#: ``xn--`` (the parser checks punycode), the last starting with a letter (else WHATWG reads an
#: IPv4 address), or a canonical dotted quad; then an optional port without a leading zero.
_PLAIN_DOMAIN: Final = re.compile(r"(?!xn--)[a-z0-9-]+(?:\.(?!xn--)[a-z0-9-]+)*")
_PLAIN_IPV4: Final = re.compile(
    r"(?:(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])\.){3}"
    r"(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
)
_PLAIN_PORT: Final = re.compile(r"(?::(?:0|[1-9][0-9]{0,4}))?")
_DEFAULT_PORT: Final = {"http://": ":80", "https://": ":443"}


def _normal_absolute(href: str) -> str | None:
    """``href`` without its fragment when it is an absolute http(s) URL that :func:`normalise`
    returns unchanged (plain host, port and path), else None: the reference for
    ``_links.normal_absolute`` and its fallback. A page links to other hosts, and a crawl's
    URLs come back as bases, in this form; the URL parser costs ~37,000 instructions a call."""
    if len(href) > MAX_URL_LENGTH or not href.isascii() or _HREF_SPECIAL.search(href):
        return None
    scheme = "https://" if href.startswith("https://") else "http://"
    if not href.startswith(scheme):
        return None
    ref = href.partition("#")[0]
    slash = ref.find("/", len(scheme))
    if slash == -1:
        return None
    authority, path = ref[len(scheme) : slash], ref[slash:]
    host, colon, port = authority.partition(":")
    if colon and (
        not _PLAIN_PORT.fullmatch(colon + port)
        or int(port) > 65535
        or colon + port == _DEFAULT_PORT[scheme]
    ):
        return None
    last = host.rpartition(".")[2]
    if not (
        (_PLAIN_DOMAIN.fullmatch(host) and "a" <= last[:1] <= "z") or _PLAIN_IPV4.fullmatch(host)
    ):
        return None
    if _PLAIN_PATH.fullmatch(path) is None or "/." in path:
        return None
    return ref


class Resolver:
    """``normalise(href, base)`` for the many links of one page, with fast paths.

    A page's links are mostly root-relative (``/p/12``), relative (``12``, ``./12``,
    ``../p/12``) or absolute on the page's own origin, and made only of plain characters. For
    those, the normalised form is the base's origin (or directory) joined with the href by
    string operations, which this class does without calling the URL parser; every other href,
    and every href whose joined form is not plainly canonical (:data:`_PLAIN_PATH`), goes
    through :func:`normalise` itself. So ``Resolver(base).resolve(h) == normalise(h, base)``
    for every ``h``, including the :class:`InvalidURL` it raises (tested property-based against
    :func:`normalise`); the fast paths are only taken for a base that is already normalised.
    Measured on the benchmark site's pages: ~0.6 µs per link instead of ~4 µs.
    """

    __slots__ = ("_dir", "_dir_root", "_origin", "base", "resolve")

    def __init__(self, base: str) -> None:
        self.base = base
        # A crawl's bases are normalised URLs, mostly plain ones: checked without the parser.
        plain = _native.normal_absolute(base) if _native else _normal_absolute(base)
        try:
            canonical = plain == base or normalise(base) == base
        except InvalidURL:
            canonical = False
        if canonical:
            _, end = _authority(base)
            self._origin = base[:end]
            query = base.find("?", end)
            path = base[end : len(base) if query == -1 else query]
            self._dir = self._origin + path[: path.rfind("/") + 1]
            self._dir_root = len(self._origin) + 1  # _dir never shrinks below origin + "/"
        else:
            self._origin = ""
            self._dir = ""
            self._dir_root = 0
        #: ``normalise(href, base)``: the C fast path when the extension is built and the base
        #: allows one, else :meth:`_resolve_py`.
        self.resolve = self._resolve_native if canonical and _native else self._resolve_py

    @property
    def origin(self) -> str:
        """The base's host key when it is normalised (fast paths on), else ``""``."""
        return self._origin

    def resolve_many(self, hrefs: list[str | None]) -> list[str | None]:
        """Only the plain same-origin links of ``hrefs`` joined, in order; None where
        :meth:`resolve` must decide (or ``href`` was None). One C call per page's links."""
        if self._origin and _native is not None:
            return _native.plain_join_many(self._origin, self._dir, self._dir_root, hrefs)
        return [None] * len(hrefs)

    def _resolve_native(self, href: str) -> str:
        u = _native.plain_join(self._origin, self._dir, self._dir_root, href)  # type: ignore[union-attr]
        return self._not_plain(href) if u is None else u

    def _not_plain(self, href: str) -> str:
        """What the plain fast path leaves, with two more shortcuts for a normalised base:
        a fragment-only href is the base itself (fragments are dropped), and a ``mailto:``,
        ``tel:`` or ``javascript:`` link is refused as :func:`normalise` refuses it, without
        the URL parser (a page has a few of each: ~40,000 instructions apiece)."""
        if self._origin and len(href) <= MAX_URL_LENGTH:
            if href[:1] == "#":
                return self.base
            m = _OTHER_SCHEME.match(href)
            if m is not None:
                url = href.strip(_STRIP_CHARS)
                raise InvalidURL(url, f"unsupported scheme {m[1]!r} (only http and https)")
        return normalise(href, self.base)

    def _resolve_py(self, href: str) -> str:
        """The fast paths in Python: the reference for ``_links.c`` and its fallback."""
        if href[:1] in _NOT_PLAIN_STARTS and (href[:1] == "#" or _OTHER_SCHEME.match(href)):
            return self._not_plain(href)  # not "men/shirts": that one is a plain relative link
        origin = self._origin
        if not origin or _HREF_SPECIAL.search(href):
            return normalise(href, self.base)
        hash_at = href.find("#")
        ref = href if hash_at == -1 else href[:hash_at]
        if ref.startswith(origin) and ref[len(origin) : len(origin) + 1] == "/":
            path = ref[len(origin) :]  # absolute, on this page's origin
        elif ref[:1] == "/":
            if ref[1:2] == "/":
                return normalise(href, self.base)  # scheme-relative: another host
            path = ref
        elif ref and ref[0] not in "?.:" and ":" not in ref.partition("/")[0]:
            path = self._dir[len(origin) :] + ref  # a relative path without dot segments
        elif ref.startswith(("./", "../")):
            directory = self._dir
            while True:
                if ref.startswith("./"):
                    ref = ref[2:]
                elif ref.startswith("../"):
                    ref = ref[3:]
                    if len(directory) > self._dir_root:
                        directory = directory[: directory.rfind("/", 0, -1) + 1]
                else:
                    break
            if not ref or ref[0] in "?.:/" or ":" in ref.partition("/")[0]:
                return normalise(href, self.base)
            path = directory[len(origin) :] + ref
        else:
            return _normal_absolute(href) or normalise(href, self.base)
        if _PLAIN_PATH.fullmatch(path) is None or "/." in path:
            return normalise(href, self.base)
        result = origin + path
        if len(result) > MAX_URL_LENGTH or len(href) > MAX_URL_LENGTH:
            return normalise(href, self.base)
        return result


def _authority(url: str) -> tuple[int, int]:
    """Return ``(start, end)`` of the authority in a normalised URL or host key, by slicing."""
    if url.startswith("https://"):
        start = 8
    elif url.startswith("http://"):
        start = 7
    else:
        raise InvalidURL(url, "not a normalised http(s) URL")
    end = url.find("/", start)
    return start, (len(url) if end == -1 else end)


def host_key(url: str) -> str:
    """Return ``scheme://host[:port]`` of a normalised URL (the per-origin politeness key).

    Pure slicing, because it is called for every discovered link; the default port is already
    gone after :func:`normalise`, so a non-default port is the only one that can appear.
    """
    _, end = _authority(url)
    return url[:end]


def hostname(url: str) -> str:
    """Return the bare host of a normalised URL (or host key): no port, IPv6 unbracketed.

    This is the form DNS resolution, robots.txt grouping and :func:`same_site` want.
    """
    start, end = _authority(url)
    if url.startswith("[", start):
        return url[start + 1 : url.index("]", start)]
    colon = url.find(":", start, end)
    return url[start : end if colon == -1 else colon]


def in_domains(url: str, domains: frozenset[str]) -> bool:
    """Whether the host of a normalised ``url`` (or host key) is one of ``domains`` or a
    subdomain of one, whatever the scheme or port: Scrapy's ``allowed_domains`` rule
    (``www.example.org`` admits ``a.www.example.org``, not ``example.org``)."""
    host = hostname(url)
    while True:
        if host in domains:
            return True
        dot = host.find(".")
        if dot == -1:
            return False
        host = host[dot + 1 :]


def url_fingerprint(url: str) -> bytes:
    """Return a 16-byte BLAKE2b digest of a normalised URL, for use as a compact durable key.

    128 bits keeps accidental collisions negligible for any realistic crawl while being a
    fraction of a typical URL's size. The URL is hashed as given, not re-normalised: pass
    :func:`normalise` output, or equal resources will get different keys. The exact scheme
    (plain BLAKE2b, ``digest_size=16``, UTF-8 input) is part of the on-disk format; changing
    it invalidates stored keys.
    """
    return hashlib.blake2b(url.encode("utf-8"), digest_size=16).digest()


#: Second-level labels commonly used under two-letter ccTLDs as public suffixes (co.uk,
#: com.au, ac.jp, ...). Deliberately tiny: see :func:`same_site`.
_SECOND_LEVEL: Final = frozenset({"co", "com", "net", "org", "gov", "edu", "ac"})


def _site_key(host: str) -> str:
    """Approximate the registrable domain of ``host``; an IP address is its own key.

    IPv6 literals (with or without brackets) contain ``:``; IPv4 literals, after WHATWG
    parsing, are the only hosts whose last label is numeric. Domains keep their last two
    labels, or three for ``<name>.<co|com|...>.<cc>`` shapes such as ``example.co.uk``.
    """
    host = host.lower().rstrip(".")
    if ":" in host:
        return host.strip("[]")
    labels = host.split(".")
    if labels[-1].isdigit():
        return host
    if (
        len(labels) >= 3
        and labels[-2] in _SECOND_LEVEL
        and len(labels[-1]) == 2
        and labels[-1].isascii()
        and labels[-1].isalpha()
    ):
        return ".".join(labels[-3:])
    return ".".join(labels[-2:])


def same_site(host_a: str, host_b: str) -> bool:
    """Whether two hosts belong to the same (approximate) registrable domain.

    This is a heuristic **without the Public Suffix List** (no network, no bundled data):
    the registrable domain is taken to be the last two labels, or the last three when the
    second-to-last is a common second-level label (co, com, net, org, gov, edu, ac) under a
    two-letter ccTLD. So ``a.example.com``/``b.example.com`` match and ``x.co.uk``/
    ``y.co.uk`` do not, but private suffixes (``*.github.io``, ``*.blogspot.com``) and less
    common public ones (``*.pvt.k12.ma.us``) are treated as one site. IP addresses only
    match themselves.

    Implemented as equality of the approximated registrable domains, so the relation is
    symmetric and transitive; this differs from "one is a subdomain of the other's
    registrable domain" only for hosts that are themselves suffixes (``com``, ``co.uk``),
    which should not be the same site as everything beneath them anyway.
    """
    if host_a == host_b:
        return True
    return _site_key(host_a) == _site_key(host_b)


@lru_cache(maxsize=64)
def _seed_site_keys(seed_host_keys: frozenset[str]) -> frozenset[str]:
    """Site keys of the seeds, cached: the seed set is fixed for a crawl, links are many."""
    return frozenset(_site_key(hostname(key)) for key in seed_host_keys)


_MODES: Final = frozenset({"host", "domain", "any"})


def in_scope(
    url: str, seed_host_keys: frozenset[str], mode: str, domains: frozenset[str] = frozenset()
) -> bool:
    """Whether a normalised ``url`` may be crawled given the seeds' host keys and, when
    ``domains`` is not empty (a spider's ``allowed_domains``), on one of them or a subdomain
    (:func:`in_domains`) as well.

    ``mode``:

    * ``"host"``: same origin as a seed, i.e. ``host_key(url)`` is one of ``seed_host_keys``
      (scheme and port included, so ``http://a`` does not admit ``https://a``);
    * ``"domain"``: same approximate site as any seed (see :func:`same_site`), whatever the
      scheme or port;
    * ``"any"``: everything.

    Raises ``ValueError`` for any other mode, even when it would not be consulted, so that a
    typo in configuration fails at the first link instead of silently meaning something.
    """
    if mode not in _MODES:
        raise ValueError(f"unknown scope mode {mode!r}; expected one of {sorted(_MODES)}")
    if domains and not in_domains(url, domains):
        return False
    if mode == "any":
        return True
    if mode == "host":
        return host_key(url) in seed_host_keys
    return _site_key(hostname(url)) in _seed_site_keys(seed_host_keys)
