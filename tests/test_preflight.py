"""A seed the SSRF guard would refuse is a configuration error, reported before crawling."""

from __future__ import annotations

import socket
from typing import Any

from aiohttp.abc import AbstractResolver

from idemcrawl.fetch import parse_allow_list
from idemcrawl.preflight import refused_seeds


class FakeResolver(AbstractResolver):
    """Maps test names to addresses without any network traffic; records what was asked."""

    def __init__(self, table: dict[str, list[str]]) -> None:
        self.table = table
        self.asked: list[str] = []

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[dict[str, Any]]:
        self.asked.append(host)
        if host not in self.table:
            raise OSError(f"{host}: no such name")
        return [
            {"hostname": host, "host": a, "port": port, "family": family, "proto": 0, "flags": 0}
            for a in self.table[host]
        ]

    async def close(self) -> None:
        pass


def test_literal_loopback_seed_names_the_flag() -> None:
    found = refused_seeds(["http://127.0.0.1:8765/list/1", "http://127.0.0.1:8765/b"], ())
    assert len(found) == 1
    msg = found[0].message()
    assert msg.startswith("seed http://127.0.0.1:8765/list/1 (and 1 more seed(s) on it): ")
    assert "loopback address 127.0.0.1" in msg and msg.endswith("add --allow-private 127.0.0.1")
    assert "\n" not in msg


def test_allowed_seed_passes() -> None:
    allow = parse_allow_list(["127.0.0.1"])
    assert refused_seeds(["http://127.0.0.1:1/"], allow) == []
    # The allow-list opens exactly what it names.
    assert len(refused_seeds(["http://127.0.0.2:1/"], allow)) == 1


def test_names_are_judged_on_what_they_resolve_to() -> None:
    resolver = FakeResolver(
        {
            "intranet.test": ["10.1.2.3"],
            "metadata.test": ["169.254.169.254"],
            "mixed.test": ["10.0.0.1", "93.184.216.34"],
            "public.test": ["93.184.216.34"],
        }
    )
    seeds = [
        "http://intranet.test/",
        "http://metadata.test/latest",
        "http://mixed.test/",
        "http://public.test/",
        "http://unknown.test/",
    ]
    found = {r.host: r for r in refused_seeds(seeds, (), resolver)}
    assert set(found) == {"intranet.test", "metadata.test"}
    assert "private address 10.1.2.3" in found["intranet.test"].message()
    assert found["intranet.test"].message().endswith("--allow-private 10.1.2.3")
    assert "cloud-metadata" in found["metadata.test"].message()
    # Every host asked once; a name that does not resolve is left to the crawl's retries.
    assert sorted(resolver.asked) == sorted(
        ["intranet.test", "metadata.test", "mixed.test", "public.test", "unknown.test"]
    )


def test_ipv6_literal() -> None:
    (r,) = refused_seeds(["http://[::1]:8080/"], ())
    assert r.message().endswith("--allow-private ::1")
