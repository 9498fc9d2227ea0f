"""SSRF defence (R18): one unit test per address class, the allow-list, and end to end.

Network rule: non-loopback addresses are only *classified* or handed to a guard that must
refuse them. Every end-to-end test runs with :class:`ConnectSpy`, which records each address a
socket connects to and refuses anything that is not loopback, and resolves names with an
injected resolver, never DNS. "No connection attempted" is asserted on the spy's record.
"""

from __future__ import annotations

import asyncio
import ipaddress
import re
import socket
from typing import Any

import pytest

from idemcrawl.fetch import (
    AddressPolicy,
    BlockedAddress,
    FetchError,
    FetchResult,
    GuardedResolver,
    guarded_socket_factory,
    parse_allow_list,
)
from idemcrawl.lab.testsite.hostile import HOSTILE_NAMES, HostileSite, hostile_resolver

from .test_fetch import LOOPBACK_ONLY, ConnectSpy, FakeResolver, LoopbackServer, fetcher, run

ip = ipaddress.ip_address


def reason(address: str, allow: tuple[str, ...] = ()) -> str | None:
    return AddressPolicy(parse_allow_list(allow)).forbidden_reason(ip(address))


def assert_refused(addresses: list[str], label: str) -> None:
    """Each address is refused, the reason names ``label`` and the address (as judged)."""
    for address in addresses:
        why = reason(address)
        assert why is not None, f"{address} was allowed"
        assert why.startswith(f"{label} address "), f"{address}: {why}"
        with pytest.raises(BlockedAddress, match=re.escape(why)):
            AddressPolicy().check("evil.test", address)


# -- one test per address class ---------------------------------------------------------------


def test_loopback() -> None:
    assert_refused(["127.0.0.1", "127.0.0.2", "127.255.255.254", "::1"], "loopback")


def test_private_ipv4() -> None:
    assert_refused(
        ["10.0.0.1", "10.255.255.254", "172.16.0.1", "172.31.255.254", "192.168.0.1"], "private"
    )
    assert reason("172.32.0.1") is None  # just outside 172.16/12
    assert reason("11.0.0.1") is None


def test_unique_local_ipv6() -> None:
    assert_refused(["fc00::1", "fd12:3456::1", "fdff:ffff::1"], "private")  # fc00::/7


def test_link_local() -> None:
    assert_refused(["169.254.0.1", "169.254.255.254", "fe80::1", "febf:ffff::1"], "link-local")
    with pytest.raises(BlockedAddress, match="link-local address fe80::1 refused"):
        AddressPolicy().check("evil.test", "fe80::1%eth0")  # a zone id does not help


def test_cgnat() -> None:
    assert_refused(["100.64.0.1", "100.127.255.254"], "CGNAT")
    assert reason("100.63.255.254") is None
    assert reason("100.128.0.1") is None


def test_multicast() -> None:
    assert_refused(["224.0.0.1", "239.255.255.255", "ff02::1", "ff0e::1"], "multicast")


def test_reserved() -> None:
    # 240/4 (incl. the broadcast address) and reserved IPv6 (IPv4-compatible ::a.b.c.d, 100::)
    assert_refused(["240.0.0.1", "255.255.255.255", "::7f00:1", "100::1"], "reserved")


def test_unspecified() -> None:
    assert_refused(["0.0.0.0", "::"], "unspecified")
    assert reason("0.1.2.3") is not None  # the rest of 0/8, "this network"


def test_cloud_metadata() -> None:
    assert_refused(
        ["169.254.169.254", "fd00:ec2::254", "169.254.170.2", "100.100.100.200", "168.63.129.16"],
        "cloud-metadata",
    )


def test_ipv4_mapped_ipv6_is_judged_as_ipv4() -> None:
    assert reason("::ffff:10.0.0.1") == "private address 10.0.0.1"
    assert reason("::ffff:127.0.0.1") == "loopback address 127.0.0.1"
    assert reason("::ffff:169.254.169.254") == "cloud-metadata address 169.254.169.254"
    assert reason("::ffff:7f00:1") == "loopback address 127.0.0.1"  # same address, hex form
    assert reason("::ffff:8.8.8.8") is None


def test_6to4_embedding() -> None:
    for address, inner in [
        ("2002:a00:1::", "10.0.0.1"),
        ("2002:7f00:1::", "127.0.0.1"),
        ("2002:a9fe:a9fe::1", "169.254.169.254"),
    ]:
        assert reason(address) == f"6to4/teredo address {ip(address)} embeds {inner}"
    assert reason("2002:808:808::1") is None  # 6to4 of a public address


def teredo(server: str, client: str) -> str:
    """A Teredo address (2001::/32): server IPv4, flags, port, then the client IPv4 inverted."""
    s = int(ipaddress.IPv4Address(server))
    c = int(ipaddress.IPv4Address(client)) ^ 0xFFFFFFFF
    return str(ipaddress.IPv6Address((0x20010000 << 96) | (s << 64) | (0x8000FFFF << 32) | c))


def test_teredo_embedding() -> None:
    for client in ("10.0.0.1", "127.0.0.1", "169.254.169.254"):
        address = teredo("65.54.227.120", client)
        assert ip(address).teredo == (ip("65.54.227.120"), ip(client))  # the helper is right
        assert reason(address) == f"6to4/teredo address {address} embeds {client}"


def test_nat64() -> None:
    assert_refused(["64:ff9b::a00:1", "64:ff9b::808:808"], "NAT64")
    assert_refused(["64:ff9b:1::1"], "local-use NAT64")


def test_other_special_purpose_ranges() -> None:
    assert_refused(["192.0.0.8"], "IETF protocol assignment")
    assert_refused(["198.18.0.1", "198.19.255.254"], "benchmarking")
    assert_refused(["fec0::1"], "site-local")
    for address in ("192.0.2.1", "198.51.100.1", "203.0.113.1", "2001:db8::1"):  # TEST-NETs
        assert reason(address) is not None


@pytest.mark.parametrize(
    "address", ["8.8.8.8", "1.1.1.1", "93.184.215.14", "2001:4860:4860::8888", "2606:4700::1111"]
)
def test_global_addresses_are_allowed(address: str) -> None:
    # Classified only; nothing in this module ever connects to them.
    assert reason(address) is None
    AddressPolicy().check("public.test", address)  # does not raise


# -- --allow-private: opens exactly what it names ---------------------------------------------


def test_allow_single_address_opens_only_that_address() -> None:
    allow = ("127.0.0.1",)
    assert reason("127.0.0.1", allow) is None
    assert reason("::ffff:127.0.0.1", allow) is None  # the same address, mapped
    assert reason("127.0.0.2", allow) == "loopback address 127.0.0.2"
    assert reason("::1", allow) == "loopback address ::1"
    assert reason("10.0.0.1", allow) is not None
    assert reason("::1", ("::1",)) is None
    assert reason("127.0.0.1", ("::1",)) is not None


def test_allow_cidr_opens_exactly_its_range() -> None:
    allow = ("127.0.0.0/30", "fd00::/8", "10.1.0.0/16")
    for address in ("127.0.0.0", "127.0.0.3", "fd12::1", "10.1.255.254"):
        assert reason(address, allow) is None, address
    for address in ("127.0.0.4", "fc00::1", "10.2.0.1", "192.168.0.1"):
        assert reason(address, allow) is not None, address


def test_allow_can_open_metadata_only_by_naming_it() -> None:
    assert reason("169.254.169.254", ("169.254.169.254",)) is None
    assert reason("169.254.169.254", ("169.254.0.0/16",)) is None
    assert reason("169.254.169.254", ("127.0.0.1",)) is not None


def test_parse_allow_list_values() -> None:
    assert parse_allow_list([]) == ()
    assert parse_allow_list(["127.0.0.1"]) == (ipaddress.ip_network("127.0.0.1/32"),)
    # Host bits are tolerated (strict=False): the network is what counts.
    assert parse_allow_list(["10.1.2.3/8"]) == (ipaddress.ip_network("10.0.0.0/8"),)
    assert parse_allow_list([" fd00::/8 "]) == (ipaddress.ip_network("fd00::/8"),)


@pytest.mark.parametrize("bad", ["nope", "10.0.0.0/33", "", "localhost", "127.0.0.1/8/8"])
def test_parse_allow_list_rejects_garbage(bad: str) -> None:
    with pytest.raises(ValueError, match=f"--allow-private: {re.escape(repr(bad))} is not"):
        parse_allow_list(["127.0.0.1", bad])


def test_check_message_and_exception_type() -> None:
    with pytest.raises(BlockedAddress, match=r"evil\.test -> private address 10\.0\.0\.1 refused"):
        AddressPolicy().check("evil.test", "10.0.0.1")
    assert issubclass(BlockedAddress, OSError)  # aiohttp wraps OSErrors from resolvers


# -- the guarded resolver and the connect-time gate --------------------------------------------


def test_guarded_resolver_drops_forbidden_addresses() -> None:
    inner = FakeResolver({"mixed.test": ["10.0.0.1", "8.8.8.8", "::1", "2001:4860:4860::8888"]})
    guard = GuardedResolver(AddressPolicy(), inner)
    got = asyncio.run(guard.resolve("mixed.test", 8080, socket.AF_UNSPEC))
    assert [r["host"] for r in got] == ["8.8.8.8", "2001:4860:4860::8888"]
    assert all(r["port"] == 8080 for r in got)
    assert inner.calls == [("mixed.test", 8080, socket.AF_UNSPEC)]


def test_guarded_resolver_respects_allow_list() -> None:
    inner = FakeResolver({"shop.test": ["10.0.0.1", "127.0.0.1", "127.0.0.2"]})
    guard = GuardedResolver(AddressPolicy(LOOPBACK_ONLY), inner)
    got = asyncio.run(guard.resolve("shop.test", 80))
    assert [r["host"] for r in got] == ["127.0.0.1"]


def test_guarded_resolver_raises_when_nothing_is_left() -> None:
    inner = FakeResolver({"evil.test": ["10.0.0.1", "169.254.169.254"]})
    guard = GuardedResolver(AddressPolicy(), inner)
    with pytest.raises(BlockedAddress, match=r"evil\.test -> .*refused"):
        asyncio.run(guard.resolve("evil.test", 80))


def test_guarded_resolver_empty_answer_is_retryable() -> None:
    guard = GuardedResolver(AddressPolicy(), FakeResolver({"empty.test": []}))
    with pytest.raises(OSError, match="no address") as info:
        asyncio.run(guard.resolve("empty.test", 80))
    assert not isinstance(info.value, BlockedAddress)  # a DNS failure is retryable


def test_guarded_resolver_passes_inner_errors_and_close() -> None:
    inner = FakeResolver()
    guard = GuardedResolver(AddressPolicy(), inner)
    with pytest.raises(OSError, match="unknown name") as info:
        asyncio.run(guard.resolve("unknown.test", 80))
    assert not isinstance(info.value, BlockedAddress)
    asyncio.run(guard.close())
    assert inner.closed


def test_socket_factory_refuses_before_a_socket_exists() -> None:
    factory = guarded_socket_factory(AddressPolicy(LOOPBACK_ONLY))
    for sockaddr, family in [
        (("10.0.0.1", 80), socket.AF_INET),
        (("169.254.169.254", 80), socket.AF_INET),
        (("::ffff:127.0.0.2", 80, 0, 0), socket.AF_INET6),
    ]:
        with pytest.raises(BlockedAddress, match="refused"):
            factory((family, socket.SOCK_STREAM, 6, "", sockaddr))
    sock = factory((socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", 80)))
    try:
        assert sock.family == socket.AF_INET
    finally:
        sock.close()


# -- end to end: nothing forbidden is ever connected to ---------------------------------------


@pytest.mark.parametrize("host", ["127.0.0.1", "[::1]", "127.0.0.2", "[::ffff:127.0.0.1]"])
def test_loopback_literal_blocked_without_allow_list(host: str) -> None:
    async def scenario(server: LoopbackServer, spy: ConnectSpy) -> FetchError:
        return await _error(fetcher(), server.url(host=host))

    err, server, spy = run(scenario)
    assert err.kind == "blocked"
    assert "loopback" in str(err)
    assert server.requests == []
    assert spy.addresses == []


@pytest.mark.parametrize("literal", ["2130706433", "127.1", "0x7f.0.0.1", "017700000001"])
def test_legacy_numeric_hosts_never_connect(literal: str) -> None:
    # What socket.inet_aton would read as 127.0.0.x: aiohttp refuses these forms outright.
    async def scenario(server: LoopbackServer, spy: ConnectSpy) -> FetchError:
        resolver = FakeResolver({literal: ["127.0.0.2"]})
        f = fetcher(resolver, allow_private=LOOPBACK_ONLY)
        return await _error(f, server.url(host=literal))

    err, server, spy = run(scenario)
    assert err.kind in ("blocked", "network")
    assert server.requests == []
    assert spy.addresses == []


def test_bait_names_are_blocked_and_never_connected() -> None:
    """The brief's case: metadata.test -> 169.254.169.254, internal.test -> 10.0.0.1."""
    resolver = hostile_resolver()

    async def scenario(server: LoopbackServer, spy: ConnectSpy) -> list[FetchError]:
        errors = []
        async with fetcher(resolver, allow_private=LOOPBACK_ONLY) as f:
            for name in ("metadata.test", "internal.test"):
                try:
                    await f.fetch(f"http://{name}:{server.port}/latest/meta-data/")
                except FetchError as exc:
                    errors.append(exc)
        return errors

    errors, server, spy = run(scenario)
    assert [e.kind for e in errors] == ["blocked", "blocked"]
    assert "metadata.test -> cloud-metadata address 169.254.169.254 refused" in str(errors[0])
    assert "internal.test -> private address 10.0.0.1 refused" in str(errors[1])
    assert spy.addresses == []
    assert spy.refused == []  # not even an attempt reached the spy's refusal
    assert server.requests == []


def test_hostile_site_bait_links_are_refused() -> None:
    """Crawl-like: fetch the index, then every off-site link on it; only 127.0.0.1 is reached."""

    async def crawl(site: HostileSite) -> tuple[list[str], ConnectSpy]:
        spy = ConnectSpy(asyncio.get_running_loop())
        kinds = []
        async with fetcher(hostile_resolver(), allow_private=LOOPBACK_ONLY) as f:
            index = await f.fetch(site.seed_url)
            assert index.status == 200
            for link in site.index_links():
                if link.startswith("http://"):
                    assert link.split("/")[2].split(":")[0] in {"127.0.0.2", *HOSTILE_NAMES}
                    try:
                        await f.fetch(link)
                        kinds.append("fetched")
                    except FetchError as exc:
                        kinds.append(exc.kind)
        return kinds, spy

    with HostileSite() as site:
        kinds, spy = asyncio.run(crawl(site))
        assert site.canary_bound
        assert site.count("/x") == 0  # the 127.0.0.2 canary was never reached
        assert site.count("/") == 1
    assert kinds == ["blocked", "blocked", "blocked"]
    assert {a for a, _ in spy.addresses} == {"127.0.0.1"}


class RebindingResolver(FakeResolver):
    """Answers with the next address of ``answers`` on each lookup (DNS rebinding)."""

    def __init__(self, name: str, answers: list[str]) -> None:
        super().__init__({name: [answers[0]]})
        self.name = name
        self.answers = answers

    async def resolve(self, host: str, port: int = 0, family: Any = socket.AF_INET) -> Any:
        self.mapping[self.name] = [self.answers[min(len(self.calls), len(self.answers) - 1)]]
        return await super().resolve(host, port, family)


# Second answers that look public (or routable) but are forbidden.
@pytest.mark.parametrize(
    "second", ["168.63.129.16", "100.100.100.200", "2002:a9fe:a9fe::1", "::ffff:10.0.0.1"]
)
def test_dns_rebinding_is_refused_on_the_second_answer(second: str) -> None:
    resolver = RebindingResolver("rebind.test", ["127.0.0.1", second])

    async def scenario(server: LoopbackServer, spy: ConnectSpy) -> tuple[FetchResult, FetchError]:
        url = f"http://rebind.test:{server.port}/close"  # server closes: each fetch reconnects
        async with fetcher(resolver, allow_private=LOOPBACK_ONLY) as f:
            first = await f.fetch(url)
            return first, await _error_open(f, url)

    (first, err), server, spy = run(scenario)
    assert first.status == 200
    assert first.ip == "127.0.0.1"
    assert err.kind == "blocked"
    assert len(resolver.calls) == 2  # no DNS cache: the second connection resolved again
    assert server.paths == ["/close"]
    assert spy.addresses == [("127.0.0.1", server.port)]


def test_connect_time_gate_holds_even_if_the_resolver_check_is_skipped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The check is on the address being connected to, not only on the DNS answer."""

    async def unchecked(self: GuardedResolver, host: str, port: int = 0, family: Any = 0) -> Any:
        return await self.inner.resolve(host, port, family)

    monkeypatch.setattr(GuardedResolver, "resolve", unchecked)
    resolver = FakeResolver({"internal.test": ["10.0.0.1"], "lo2.test": ["127.0.0.2"]})

    async def scenario(server: LoopbackServer, spy: ConnectSpy) -> list[FetchError]:
        async with fetcher(resolver, allow_private=LOOPBACK_ONLY) as f:
            return [
                await _error_open(f, f"http://{name}:{server.port}/")
                for name in ("internal.test", "lo2.test")
            ]

    errors, server, spy = run(scenario)
    assert [e.kind for e in errors] == ["blocked", "blocked"]
    assert "10.0.0.1" in str(errors[0])
    assert "127.0.0.2" in str(errors[1])
    assert spy.addresses == []  # refused before the socket existed
    assert server.requests == []


async def _error(f: Any, url: str) -> FetchError:
    async with f:
        return await _error_open(f, url)


async def _error_open(f: Any, url: str) -> FetchError:
    try:
        await f.fetch(url)
    except FetchError as exc:
        return exc
    raise AssertionError(f"fetching {url} did not raise FetchError")


def test_verdicts_are_cached_per_policy_and_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    import idemcrawl.fetch as fetch_module

    strict, loopback = AddressPolicy(), AddressPolicy(LOOPBACK_ONLY)
    with pytest.raises(BlockedAddress):
        strict.check("h", "127.0.0.1")
    loopback.check("h", "127.0.0.1")  # another policy's verdict on the same address
    with pytest.raises(BlockedAddress):
        strict.check("h", "127.0.0.1")  # cached, still refused
    judged: list[str] = []
    real = AddressPolicy.forbidden_reason

    def counting(self: AddressPolicy, ip: Any) -> str | None:
        judged.append(str(ip))
        return real(self, ip)

    monkeypatch.setattr(AddressPolicy, "forbidden_reason", counting)
    loopback.check("h", "127.0.0.1")
    assert judged == []  # answered from the cache
    monkeypatch.setattr(fetch_module, "_VERDICTS_MAX", 3)
    for n in range(10):
        loopback.check("h", f"8.8.8.{n}")
    assert len(loopback._verdicts) <= 3
    assert len(judged) == 10
