"""The partition map without servers: a stable hash, ids that name their partition, and
maps that refuse bad input."""

from __future__ import annotations

import subprocess
import sys

import pytest

from idemcrawl.fleet.partition_map import (
    LOCAL_ID_BITS,
    PartitionMap,
    global_id,
    local_id,
    partition_of,
    stable_hash,
)
from idemcrawl.frontier.base import FrontierError

DSNS = ("postgresql://postgres@127.0.0.1:1/a", "postgresql://postgres@127.0.0.1:2/a")


def test_the_hash_is_the_same_in_every_process() -> None:
    # Python's hash() of a str changes per process (PYTHONHASHSEED); routing must not.
    code = (
        "from idemcrawl.fleet.partition_map import stable_hash;"
        "print(stable_hash('http://shop.example'))"
    )
    outs = {
        subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            env={"PYTHONHASHSEED": seed, "PATH": ""},
        ).stdout.strip()
        for seed in ("1", "2")
    }
    assert outs == {str(stable_hash("http://shop.example"))}
    assert 0 <= stable_hash("x") < 2**64


def test_hosts_spread_over_partitions() -> None:
    counts = [0] * 16
    for i in range(1600):
        counts[partition_of(f"http://host{i}.example", 16)] += 1
    assert min(counts) > 60 and max(counts) < 150  # roughly uniform, every partition used


def test_a_crawl_wide_id_names_its_partition() -> None:
    for p, local in [(0, 1), (5, 123456), (65535, (1 << LOCAL_ID_BITS) - 1)]:
        gid = global_id(p, local)
        assert local_id(gid) == (p, local)
        assert gid < 2**63  # fits a signed bigint
    assert global_id(0, 7) == 7  # partition 0's ids are its own
    with pytest.raises(FrontierError, match="does not fit"):
        global_id(1, 1 << LOCAL_ID_BITS)


def test_the_map_places_partitions_and_round_trips() -> None:
    pmap = PartitionMap("shop", 5, DSNS)
    assert [pmap.server(p) for p in range(5)] == [DSNS[0], DSNS[1]] * 2 + [DSNS[0]]
    assert pmap.schema(7) == "shop_p007"
    assert PartitionMap.from_json(pmap.to_json()) == pmap
    assert pmap.of_host("http://a") == partition_of("http://a", 5)


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"partitions": 0}, "partitions must be"),
        ({"servers": ()}, "at least one server"),
        ({"servers": (DSNS[0], DSNS[0])}, "listed twice"),
        ({"servers": ("crawl.db",)}, "postgresql://"),
        ({"servers": (DSNS[0] + "?schema=x",)}, "without \\?schema="),
        ({"crawl": "bad-name"}, "crawl name"),
    ],
)
def test_bad_maps_are_refused(kw: dict[str, object], message: str) -> None:
    args: dict[str, object] = {"crawl": "shop", "partitions": 4, "servers": DSNS, **kw}
    with pytest.raises(FrontierError, match=message):
        PartitionMap(**args)  # type: ignore[arg-type]


def test_an_unknown_map_version_is_refused() -> None:
    with pytest.raises(FrontierError, match="version 9"):
        PartitionMap.from_json('{"version": 9}')
    with pytest.raises(FrontierError, match="unreadable"):
        PartitionMap.from_json("not json")
