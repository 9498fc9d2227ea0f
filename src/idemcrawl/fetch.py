"""HTTP fetching: an SSRF-checked connection, no automatic redirects, bounded bodies.

aiohttp is the client (see docs/decisions.md): it streams, it lets us plug in our own resolver
and socket factory, and it is the fastest mature asyncio client on this machine. Redirects are
*not* followed here: the crawler turns a 3xx into a new URL that goes through discovery (scope,
dedup, politeness).

SSRF (R18) is checked in three places, each on the address itself, never on a name:

* IP literals in the URL are checked before anything else, for a clear message;
* :class:`GuardedResolver` drops forbidden addresses from every DNS answer, and aiohttp's DNS
  cache is off, so each new connection is resolved and checked again (DNS rebinding);
* the connector's socket factory checks the very address a socket is about to connect to, so
  nothing that bypasses the resolver (literals, a future aiohttp code path) can connect.

Hostile responses (R17, R18) are bounded while streaming: aiohttp's own decompression is off and
the body is decoded here, incrementally, with an output limit on every call
(:func:`zlib.decompressobj` ``max_length``, brotli's ``output_buffer_limit``, a zstd writer whose
sink refuses to grow), so a decompression bomb stops at ``max_decompressed_bytes`` without ever
inflating past it; ``max_bytes`` bounds the compressed bytes taken from the wire.

Timeout policy: a request with no response head within ``total_timeout`` (or a connect/read
timeout before the head) raises ``FetchError("timeout")`` and is retried like any transient
error. Once the head has arrived, a total or read timeout returns the body received so far with
``cut_reason`` ``"total_timeout"`` or ``"read_timeout"``: the server answered, a slow-loris
body is its choice, and retrying it would only spend another timeout on the same trickle.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import ipaddress
import socket
import time
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import InitVar, dataclass, field
from typing import Any, Protocol

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import ThreadedResolver

from . import url as urls
from .version import DEFAULT_USER_AGENT

try:  # optional: only advertised in Accept-Encoding when we can decode it
    import brotli
except ImportError:  # pragma: no cover - depends on the environment
    brotli = None
try:
    import zstandard
except ImportError:  # pragma: no cover - depends on the environment
    zstandard = None

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

# Ranges the default guard refuses beyond what ``ipaddress`` flags, checked before its flags so
# the label does not depend on the Python release's idea of "private".
_EXTRA_FORBIDDEN: tuple[tuple[str, IPNetwork], ...] = (
    ("CGNAT", ipaddress.ip_network("100.64.0.0/10")),  # carrier NAT: often the provider's LAN
    ("IETF protocol assignment", ipaddress.ip_network("192.0.0.0/24")),
    ("benchmarking", ipaddress.ip_network("198.18.0.0/15")),
    ("NAT64", ipaddress.ip_network("64:ff9b::/96")),  # translates to any IPv4, private included
    ("local-use NAT64", ipaddress.ip_network("64:ff9b:1::/48")),  # RFC 8215
)
# Cloud instance-metadata endpoints: the classic SSRF prize. Named separately so the refusal
# says so, and because one of them (Azure's WireServer) is a public-looking address.
_METADATA: frozenset[IPAddress] = frozenset(
    ipaddress.ip_address(a)
    for a in (
        "169.254.169.254",  # AWS, GCP, Azure, OpenStack, DigitalOcean
        "169.254.170.2",  # AWS ECS task metadata
        "fd00:ec2::254",  # AWS IMDS over IPv6
        "100.100.100.200",  # Alibaba Cloud
        "168.63.129.16",  # Azure WireServer
    )
)


class BlockedAddress(OSError):
    """The target resolves to an address the SSRF guard refuses (R18)."""


class FetchError(Exception):
    """A fetch that produced no usable HTTP response; ``kind`` classifies it for retry logic.

    Kinds: ``blocked`` (SSRF guard: permanent), ``connect``, ``timeout`` (no response head in
    time), ``protocol`` (malformed or oversized response head, broken framing), ``network``.
    """

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind

    def __str__(self) -> str:
        return f"{self.kind}: {super().__str__()}"


def parse_allow_list(items: Iterable[str]) -> tuple[IPNetwork, ...]:
    """``--allow-private`` values: addresses or CIDRs. Raises ValueError with the bad item."""
    nets = []
    for item in items:
        try:
            nets.append(ipaddress.ip_network(item.strip(), strict=False))
        except ValueError as exc:
            raise ValueError(f"--allow-private: {item!r} is not an address or CIDR") from exc
    return tuple(nets)


@dataclass(frozen=True, slots=True)
class AddressPolicy:
    """Which resolved addresses may be connected to.

    The allow-list opens exactly the addresses it names (``127.0.0.1`` is not ``127.0.0.2``);
    an IPv4-mapped IPv6 address is judged as the IPv4 address it is.
    """

    allow: tuple[IPNetwork, ...] = ()
    #: :meth:`check`'s verdicts by address string. Per policy rather than one ``lru_cache``
    #: keyed by (policy, address): hashing the policy (a dataclass of ``ipaddress`` networks,
    #: in Python) on every call cost ~11 k instructions per fetch, which makes two checks.
    _verdicts: dict[str, str | None] = field(
        default_factory=dict, init=False, repr=False, compare=False, hash=False
    )

    def forbidden_reason(self, ip: IPAddress) -> str | None:
        mapped = getattr(ip, "ipv4_mapped", None)
        if mapped is not None:
            ip = mapped
        if any(ip in net for net in self.allow):
            return None
        if ip in _METADATA:
            return f"cloud-metadata address {ip}"
        teredo = getattr(ip, "teredo", None)
        embedded = getattr(ip, "sixtofour", None) or (teredo[1] if teredo else None)
        if embedded is not None and self.forbidden_reason(embedded):
            return f"6to4/teredo address {ip} embeds {embedded}"
        for label, net in _EXTRA_FORBIDDEN:
            if net.version == ip.version and ip in net:
                return f"{label} address {ip}"
        checks = (
            ("loopback", ip.is_loopback),
            ("unspecified", ip.is_unspecified),
            ("link-local", ip.is_link_local),
            ("multicast", ip.is_multicast),
            ("reserved", ip.is_reserved),
            ("private", ip.is_private),
            ("site-local", getattr(ip, "is_site_local", False)),  # fec0::/10, deprecated
        )
        for name, hit in checks:
            if hit:
                return f"{name} address {ip}"
        if not ip.is_global:
            return f"non-global address {ip}"
        return None

    def check(self, host: str, address: str) -> None:
        verdicts = self._verdicts
        reason = verdicts.get(address, _UNJUDGED)
        if reason is _UNJUDGED:
            # Cached: every fetch checks its peer (and often a literal host), and parsing an
            # address costs more than the rest of the check. Bounded like the lru_cache was.
            if len(verdicts) >= _VERDICTS_MAX:
                verdicts.clear()
            reason = verdicts[address] = self.forbidden_reason(
                ipaddress.ip_address(address.split("%", 1)[0])
            )
        if reason:
            raise BlockedAddress(f"{host} -> {reason} refused (use --allow-private to permit)")


_UNJUDGED: Any = object()
_VERDICTS_MAX = 4096


@functools.lru_cache(maxsize=4096)
def _is_ip_literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


class GuardedResolver(AbstractResolver):
    """Resolves once and drops forbidden addresses; aiohttp connects only to what we return."""

    def __init__(self, policy: AddressPolicy, inner: AbstractResolver | None = None) -> None:
        self.policy = policy
        self.inner = inner or ThreadedResolver()

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        results = await self.inner.resolve(host, port, family)
        allowed: list[ResolveResult] = []
        last: BlockedAddress | None = None
        for r in results:
            try:
                self.policy.check(host, r["host"])
            except BlockedAddress as exc:
                last = exc
                continue
            allowed.append(r)
        if not allowed:
            if last is None:  # an empty answer is a DNS failure, worth retrying
                raise OSError(f"{host}: no address")
            raise last
        return allowed

    async def close(self) -> None:
        await self.inner.close()


def guarded_socket_factory(policy: AddressPolicy) -> Any:
    """aiohttp ``socket_factory`` that refuses to create a socket for a forbidden peer.

    aiohappyeyeballs calls it with the exact ``addrinfo`` it is about to ``connect()`` to, so
    this is the last gate before a SYN leaves, whatever produced the address.
    """

    def factory(addr_info: tuple[Any, ...]) -> socket.socket:
        family, type_, proto, _, sockaddr = addr_info
        policy.check("connect", str(sockaddr[0]))
        return socket.socket(family=family, type=type_, proto=proto)

    return factory


@dataclass(slots=True)
class FetchResult:
    """One HTTP exchange as received; ``body`` is the decoded payload, possibly cut.

    ``cut_reason`` says why the body is incomplete: ``"max_bytes"`` (wire limit),
    ``"max_decompressed_bytes"``, ``"decode_error: <coding>: <why>"``, ``"total_timeout"`` or
    ``"read_timeout"`` (see the module docstring); ``None`` for a whole body. ``wire_bytes``
    counts body bytes taken from the connection (after de-chunking, before decoding), up to
    the cut. ``http_version`` is the status-line token (``"HTTP/1.1"``); ``raw_headers`` are
    the response headers in received order and case (latin-1 decoded, as HTTP defines them)
    and ``request_headers`` what was sent, both for WARC. ``notes`` records facts that are
    not cuts, e.g. a content-coding we cannot decode (the body is then kept as received).

    ``raw_headers`` is decoded from ``wire_headers`` (the pairs as received, bytes) when first
    read: only the archive, the cookie jar and the renderer read it, and built for every fetch
    its list and tuples were ~22 k of the fetch's ~550 k instructions (valgrind, most of it the
    cyclic GC walking them while the page waits for its commit). A result built by hand may
    give ``raw_headers`` instead.
    """

    url: str
    status: int
    headers: dict[str, str]
    body: bytes
    elapsed: float
    wire_bytes: int = 0
    cut_reason: str | None = None
    reason: str = ""
    http_version: str = "HTTP/1.1"
    raw_headers: InitVar[list[tuple[str, str]] | None] = None
    request_headers: list[tuple[str, str]] = field(default_factory=list)
    ip: str | None = None
    content_encoding: str | None = None
    notes: tuple[str, ...] = ()
    wire_headers: Sequence[tuple[bytes, bytes]] = ()
    _raw_headers: list[tuple[str, str]] | None = field(
        default=None, init=False, repr=False, compare=False
    )

    def __post_init__(self, raw_headers: list[tuple[str, str]] | None) -> None:
        if raw_headers is not None:
            self._raw_headers = raw_headers

    @property
    def truncated(self) -> bool:
        return self.cut_reason is not None


def _raw_headers_of(self: FetchResult) -> list[tuple[str, str]]:
    """The response headers in received order and case, latin-1 decoded (decoded once)."""
    pairs = self._raw_headers
    if pairs is None:
        pairs = self._raw_headers = _latin1(self.wire_headers)
    return pairs


def _headers_at_hand_of(self: FetchResult) -> Sequence[tuple[Any, Any]]:
    """The response headers in whichever form is already built: the latin-1 pairs once
    something read ``raw_headers``, else the bytes pairs as received. For a consumer that
    decodes either form itself (the archive's exchange, built in a parser process) and should
    not make the crawl process decode them first."""
    pairs = self._raw_headers
    return self.wire_headers if pairs is None else pairs


# Set after the class is built: inside its body the name is the InitVar's (the constructor's
# ``raw_headers=``), and a dataclass would take a property there for the field's default.
FetchResult.raw_headers = property(_raw_headers_of)  # type: ignore[assignment,method-assign]
FetchResult.headers_at_hand = property(_headers_at_hand_of)  # type: ignore[attr-defined]


@dataclass(frozen=True, slots=True)
class FetchSettings:
    user_agent: str = DEFAULT_USER_AGENT
    connect_timeout: float = 10.0
    read_timeout: float = 20.0
    total_timeout: float = 60.0
    max_bytes: int = 10 * 1024 * 1024  # body bytes on the wire (compressed, as received)
    max_decompressed_bytes: int = 10 * 1024 * 1024  # decoded body bytes kept
    allow_private: tuple[IPNetwork, ...] = ()


# -- incremental, output-bounded content decoding ---------------------------------------------

# Largest output one decoder call may produce: bounds the transient memory of a single step.
_STEP = 256 * 1024
# RFC 9659: HTTP zstd senders must not need more than an 8 MiB window. Without this cap a
# hostile frame header could make the decoder allocate its 128 MiB default window per fetch.
_ZSTD_MAX_WINDOW = 8 * 1024 * 1024


class _Decoder(Protocol):
    name: str

    def feed(self, data: bytes, room: int) -> list[bytes]:
        """Decode ``data``; stop once ``room`` bytes were produced (input may then be left).

        Returning fewer than ``room`` bytes means all of ``data`` was consumed.
        """
        ...

    def incomplete(self) -> bool:
        """True when the stream fed so far lacks its end marker."""
        ...


_GZIP_MAGIC = b"\x1f\x8b"


class _ZlibDecoder:
    """gzip (also zlib-wrapped data mislabelled gzip) and deflate (zlib-wrapped or raw)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._wbits = 47 if name == "gzip" else 15  # 47: gzip or zlib header, auto-detected
        self._d = zlib.decompressobj(self._wbits)
        # "deflate" means zlib-wrapped (RFC 9110) but many servers send raw deflate; keep the
        # first bytes until output proves the guess, so we can retry them as raw deflate.
        self._probe: bytearray | None = bytearray() if name == "deflate" else None
        self._pending = b""

    def feed(self, data: bytes, room: int) -> list[bytes]:
        if self._probe is None:
            return self._inflate(data, room)
        self._probe += data
        try:
            out = self._inflate(data, room)
        except zlib.error:
            self._d = zlib.decompressobj(-zlib.MAX_WBITS)
            probe, self._probe = bytes(self._probe), None
            return self._inflate(probe, room)
        if any(out) or len(self._probe) > 1024:
            self._probe = None
        return out

    def _inflate(self, data: bytes, room: int) -> list[bytes]:
        if self._pending:  # the start of a next gzip member, split across reads
            data, self._pending = self._pending + data, b""
        out: list[bytes] = []
        produced = 0
        while data and produced < room:
            d = self._d
            if d.eof:  # gzip allows several members back to back; anything else is ignored
                if self.name != "gzip" or not _GZIP_MAGIC.startswith(data[:2]):
                    break  # bytes after the final member are dropped, as gzip(1) does
                if len(data) < len(_GZIP_MAGIC):
                    self._pending = data
                    break
                d = self._d = zlib.decompressobj(self._wbits)
            chunk = d.decompress(data, min(room - produced, _STEP))
            out.append(chunk)
            produced += len(chunk)
            data = d.unused_data if d.eof else d.unconsumed_tail
        return out

    def incomplete(self) -> bool:
        return not self._d.eof


class _BrotliDecoder:
    name = "br"

    def __init__(self) -> None:
        assert brotli is not None
        self._d = brotli.Decompressor()

    def feed(self, data: bytes, room: int) -> list[bytes]:
        d = self._d
        if d.is_finished():
            return []
        # The limit is a buffer-growth cap, so a call may return a little more than asked.
        out = [d.process(data, output_buffer_limit=min(room, _STEP))]
        produced = len(out[0])
        while produced < room and not d.can_accept_more_data() and not d.is_finished():
            chunk = d.process(b"", output_buffer_limit=min(room - produced, _STEP))
            if not chunk:
                break
            out.append(chunk)
            produced += len(chunk)
        return out

    def incomplete(self) -> bool:
        return not self._d.is_finished()


class _RoomFull(Exception):
    """Raised by :class:`_Sink` from inside the zstd writer to stop it mid-input."""


class _Sink:
    """File-like target for zstandard's stream writer that stops it once ``room`` is used.

    zstandard's ``decompressobj`` has no output limit (one 32 KiB chunk of a zstd bomb is 1 GiB
    of zeros); its writer hands over output in ``write_size`` pieces, and an exception from
    ``write`` stops decompression there.
    """

    def __init__(self) -> None:
        self.parts: list[bytes] = []
        self.room = 0
        self.size = 0

    def write(self, data: Any) -> int:
        self.parts.append(bytes(data))
        self.size += len(data)
        if self.size >= self.room:
            raise _RoomFull
        return len(data)


class _ZstdDecoder:
    name = "zstd"

    def __init__(self) -> None:
        assert zstandard is not None
        self._sink = _Sink()
        dctx = zstandard.ZstdDecompressor(max_window_size=_ZSTD_MAX_WINDOW)
        self._w = dctx.stream_writer(self._sink, write_size=64 * 1024, write_return_read=True)

    def feed(self, data: bytes, room: int) -> list[bytes]:
        sink = self._sink
        sink.parts, sink.size, sink.room = [], 0, room
        with contextlib.suppress(_RoomFull):
            self._w.write(data)
        return sink.parts

    def incomplete(self) -> bool:
        return False  # the writer does not expose frame completion; a cut stream just ends


_DECODE_ERRORS: tuple[type[Exception], ...] = (zlib.error,)
if brotli is not None:
    _DECODE_ERRORS += (brotli.error,)
if zstandard is not None:
    _DECODE_ERRORS += (zstandard.ZstdError,)


def accept_encoding() -> str:
    """The codings this build can decode, for the Accept-Encoding request header."""
    codings = ["gzip", "deflate"]
    if brotli is not None:
        codings.append("br")
    if zstandard is not None:
        codings.append("zstd")
    return ", ".join(codings)


def _decoder_for(content_encoding: str | None) -> tuple[_Decoder | None, str | None]:
    """A decoder for the header value, or None plus a note when the body stays as received."""
    if not content_encoding:
        return None, None
    codings = [c.strip().lower() for c in content_encoding.split(",")]
    codings = [c for c in codings if c and c != "identity"]
    if not codings:
        return None, None
    if len(codings) > 1:
        return None, f"stacked content-encoding {content_encoding!r} not decoded: body as received"
    coding = codings[0]
    if coding in ("gzip", "x-gzip"):
        return _ZlibDecoder("gzip"), None
    if coding == "deflate":
        return _ZlibDecoder("deflate"), None
    if coding == "br" and brotli is not None:
        return _BrotliDecoder(), None
    if coding == "zstd" and zstandard is not None:
        return _ZstdDecoder(), None
    return None, f"content-encoding {coding!r} not decoded: body as received"


class _Exchange:
    """What one fetch has received so far; survives a timeout so the partial body is kept."""

    __slots__ = (
        "cancelling",
        "cut_reason",
        "deadline",
        "decoder",
        "expired",
        "ip",
        "notes",
        "parts",
        "resp",
        "size",
        "task",
        "wire",
    )

    def __init__(self) -> None:
        self.resp: aiohttp.ClientResponse | None = None  # set once the response head is in
        self.decoder: _Decoder | None = None
        self.ip: str | None = None
        self.notes: list[str] = []
        self.parts: list[bytes] = []
        self.size = 0
        self.wire = 0
        self.cut_reason: str | None = None
        #: The total timeout (:class:`_Deadlines`): when, which task it cancels, how many
        #: cancellations that task had pending before, and whether it has fired (and its
        #: cancellation is not taken back yet).
        self.deadline = 0.0
        self.task: asyncio.Task[Any] | None = None
        self.cancelling = 0
        self.expired = False

    def keep(self, data: bytes, limit: int) -> None:
        room = limit - self.size
        if len(data) > room:
            data = data[:room]
            self.cut_reason = "max_decompressed_bytes"
        if data:
            self.parts.append(data)
            self.size += len(data)


class _Deadlines:
    """The total timeouts of one fetcher's exchanges, kept by one timer instead of one each.

    ``asyncio.timeout()`` scheduled and cancelled a timer handle per fetch: ~27 k of a fetch's
    579 k instructions (valgrind, 2,000 fetches of the bench site with uvloop), for a timeout
    that almost never fires. Every exchange of a fetcher has the same length of time, so their
    deadlines come in the order they start: the dict below (insertion-ordered) holds the
    exchanges in flight, earliest deadline first, and one timer is armed for the first. When it
    fires, the exchanges past their deadline are cancelled like ``asyncio.timeout`` does (the
    task is cancelled; :meth:`Fetcher.fetch` takes the cancellation back with ``uncancel`` and
    reports a timeout, unless the task was cancelled from elsewhere too) and the timer is armed
    for the new first; one whose exchange has finished meanwhile just re-arms. A fetch costs a
    dict insert and a delete; the timer fires about once per timeout length.
    """

    __slots__ = ("_live", "_loop", "_timer", "seconds")

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._live: dict[_Exchange, None] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def enter(self, ex: _Exchange) -> None:
        """Start ``ex``'s time; it belongs to the current task."""
        loop = asyncio.get_running_loop()
        task = asyncio.current_task(loop)
        if task is None:
            raise RuntimeError("Fetcher.fetch must run inside a task")
        ex.task = task
        ex.cancelling = task.cancelling()
        ex.deadline = loop.time() + self.seconds
        self._live[ex] = None
        if self._timer is None or self._loop is not loop:
            self._loop = loop
            self._timer = loop.call_at(ex.deadline, self._fire)

    def exit(self, ex: _Exchange) -> None:
        """``ex`` is over (its timer, if it is the first, fires later and re-arms).

        A deadline that fired and whose cancellation the exchange never saw (swallowed on the
        way) is taken back here, as ``asyncio.timeout`` does on exit, so the task's count of
        pending cancellations stays right.
        """
        self._live.pop(ex, None)
        if ex.expired:
            ex.expired = False
            assert ex.task is not None
            ex.task.uncancel()

    def _fire(self) -> None:
        self._timer = None
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        now = loop.time()
        live = self._live
        while live:
            ex = next(iter(live))
            if ex.deadline > now:
                self._timer = loop.call_at(ex.deadline, self._fire)
                return
            del live[ex]
            ex.expired = True
            assert ex.task is not None
            ex.task.cancel()


class _PeerResponse(aiohttp.ClientResponse):
    """Notes the peer address when the response starts, while the connection is surely open.

    Read later, a short ``Connection: close`` response may already have dropped its transport.
    """

    peer_ip: str | None = None

    async def start(self, connection: Any) -> aiohttp.ClientResponse:
        transport = connection.transport
        peer = transport.get_extra_info("peername") if transport is not None else None
        self.peer_ip = str(peer[0]) if peer else None
        return await super().start(connection)


def _latin1(pairs: Iterable[tuple[bytes, bytes]]) -> list[tuple[str, str]]:
    return [(k.decode("latin-1"), v.decode("latin-1")) for k, v in pairs]


class Fetcher:
    """Owns one aiohttp session; use as an async context manager."""

    def __init__(
        self,
        settings: FetchSettings,
        concurrency: int,
        resolver: AbstractResolver | None = None,
    ) -> None:
        self.settings = settings
        self.policy = AddressPolicy(settings.allow_private)
        self._resolver = GuardedResolver(self.policy, resolver)
        self._concurrency = concurrency
        self._session: aiohttp.ClientSession | None = None
        self._deadlines = _Deadlines(settings.total_timeout)

    async def __aenter__(self) -> Fetcher:
        connector = aiohttp.TCPConnector(
            limit=self._concurrency,
            limit_per_host=0,
            resolver=self._resolver,
            ttl_dns_cache=None,
            use_dns_cache=False,  # never reuse a resolution past its check
            socket_factory=guarded_socket_factory(self.policy),
        )
        self._session = aiohttp.ClientSession(
            connector=connector,
            # total is enforced by fetch() itself so it can keep a partial body (module doc)
            timeout=aiohttp.ClientTimeout(
                total=None,
                sock_connect=self.settings.connect_timeout,
                sock_read=self.settings.read_timeout,
            ),
            headers={"User-Agent": self.settings.user_agent, "Accept-Encoding": accept_encoding()},
            auto_decompress=False,  # we decode with limits; aiohttp would inflate unbounded
            response_class=_PeerResponse,
            # No cookies of its own: a spider that wants a session keeps it in the frontier
            # (idemcrawl.cookies), so it is the same in every process and after a restart.
            cookie_jar=aiohttp.DummyCookieJar(),
            max_line_size=16 * 1024,
            max_field_size=16 * 1024,
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def fetch(
        self,
        url: str,
        headers: dict[str, str] | list[tuple[str, str]] | None = None,
        *,
        method: str = "GET",
        body: bytes | None = None,
    ) -> FetchResult:
        """One exchange, redirects not followed; ``method`` and ``body`` for a spider's
        request (a POST form, a JSON API call). FetchError when there is no HTTP response."""
        assert self._session is not None, "use Fetcher as an async context manager"
        host = urls.hostname(url)
        if _is_ip_literal(host):  # aiohttp skips the resolver for these: check here
            try:
                self.policy.check(host, host)
            except BlockedAddress as exc:
                raise FetchError("blocked", str(exc)) from None
        t0 = time.monotonic()
        ex = _Exchange()
        deadlines = self._deadlines
        deadlines.enter(ex)
        try:
            await self._exchange(url, host, headers, ex, method, body)
        except asyncio.CancelledError:
            if not ex.expired:
                raise
            ex.expired = False  # the timeout's cancellation is taken back here, once
            assert ex.task is not None
            if ex.task.uncancel() > ex.cancelling:
                raise  # cancelled from elsewhere too: that one wins
            if ex.resp is None:
                raise FetchError("timeout", "no response in time") from None
            ex.cut_reason = "total_timeout"
        except TimeoutError as exc:  # aiohttp's connect or read timeout
            if ex.resp is None:
                raise FetchError("timeout", str(exc) or "no response in time") from None
            ex.cut_reason = "read_timeout"
        except aiohttp.ClientConnectorError as exc:
            if isinstance(exc.os_error, BlockedAddress):
                raise FetchError("blocked", str(exc.os_error)) from None
            raise FetchError("connect", str(exc)) from None
        except BlockedAddress as exc:
            raise FetchError("blocked", str(exc)) from None
        except aiohttp.ClientResponseError as exc:
            # raised while parsing the response head: too long a line or header, too many
            # headers, a malformed status line
            message = f"malformed or oversized response head: {exc.message}"
            raise FetchError("protocol", message) from None
        except aiohttp.ClientPayloadError as exc:
            raise FetchError("protocol", f"broken response body: {exc}") from None
        except (aiohttp.ClientError, OSError, ValueError) as exc:
            raise FetchError("network", f"{type(exc).__name__}: {exc}") from None
        finally:
            deadlines.exit(ex)
        return self._result(url, ex, time.monotonic() - t0)

    async def _exchange(
        self,
        url: str,
        host: str,
        headers: dict[str, str] | list[tuple[str, str]] | None,
        ex: _Exchange,
        method: str = "GET",
        body: bytes | None = None,
    ) -> None:
        assert self._session is not None
        async with self._session.request(
            method, url, allow_redirects=False, headers=headers, max_redirects=0, data=body
        ) as resp:
            ex.ip = getattr(resp, "peer_ip", None)
            if ex.ip is not None:  # cannot fail after the connect-time gate; kept as a backstop
                try:
                    self.policy.check(host, ex.ip)
                except BlockedAddress:
                    resp.close()
                    raise
            ex.decoder, note = _decoder_for(resp.headers.get("Content-Encoding"))
            if note:
                ex.notes.append(note)
            ex.resp = resp
            await self._read_body(resp, ex)
            if ex.cut_reason is not None:
                resp.close()  # never pool a connection with an unread body behind the cut

    async def _read_body(self, resp: aiohttp.ClientResponse, ex: _Exchange) -> None:
        """Stream the body, cutting at the wire limit, the decoded limit or a decode error.

        Memory stays at most the decoded limit plus one read buffer and one decoder step.
        """
        max_wire = self.settings.max_bytes
        max_out = self.settings.max_decompressed_bytes
        decoder = ex.decoder
        content = resp.content
        while True:
            chunk = await content.readany()
            if not chunk:
                break
            over = ex.wire + len(chunk) - max_wire
            if over > 0:
                chunk = chunk[: len(chunk) - over]
            ex.wire += len(chunk)
            if decoder is None:
                ex.keep(chunk, max_out)
            else:
                try:
                    parts = decoder.feed(chunk, max_out - ex.size + 1)
                except _DECODE_ERRORS as exc:
                    ex.cut_reason = f"decode_error: {decoder.name}: {exc}"
                    return
                for part in parts:
                    ex.keep(part, max_out)
                    if ex.cut_reason is not None:
                        break
            if ex.cut_reason is not None:
                return
            if over > 0:
                ex.cut_reason = "max_bytes"
                return
        if decoder is not None and ex.wire and decoder.incomplete():
            ex.cut_reason = f"decode_error: {decoder.name}: stream ends before its end marker"

    @staticmethod
    def _result(url: str, ex: _Exchange, elapsed: float) -> FetchResult:
        resp = ex.resp
        assert resp is not None
        encoding = resp.headers.get("Content-Encoding")
        version = resp.version
        return FetchResult(
            url=url,
            status=resp.status,
            headers={k.lower(): v for k, v in resp.headers.items()},
            body=b"".join(ex.parts),
            elapsed=elapsed,
            wire_bytes=ex.wire,
            cut_reason=ex.cut_reason,
            reason=resp.reason or "",
            http_version=f"HTTP/{version.major}.{version.minor}" if version else "HTTP/1.1",
            wire_headers=resp.raw_headers,
            request_headers=list(resp.request_info.headers.items()),
            ip=ex.ip,
            content_encoding=encoding.strip().lower() if encoding else None,
            notes=tuple(ex.notes),
        )


RETRYABLE_STATUS = frozenset({408, 425, 429, 500, 502, 503, 504})


def retry_after_seconds(value: str | None, now: float, cap: float) -> float | None:
    """``Retry-After`` as delta-seconds or an HTTP date, capped; None when absent or invalid."""
    if not value:
        return None
    value = value.strip()
    if value.isascii() and value.isdigit():
        return min(float(value), cap)
    from email.utils import parsedate_to_datetime

    try:
        when = parsedate_to_datetime(value).timestamp()
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    return max(0.0, min(when - now, cap))


def lower_headers(pairs: Sequence[tuple[str, str]] | dict[str, Any]) -> dict[str, str]:
    items = pairs.items() if isinstance(pairs, dict) else pairs
    return {str(k).lower(): str(v) for k, v in items}
