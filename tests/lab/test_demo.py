"""``idemcrawl.lab.demo``: the shop crawled and every record checked; a rerun on the same port
resumes the finished crawl without a request, and a busy port falls back to a free one."""

from __future__ import annotations

import socket
from pathlib import Path

from idemcrawl.lab.demo import run_demo


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_demo_stores_every_product_once_and_a_rerun_makes_no_request(tmp_path: Path) -> None:
    db, port = str(tmp_path / "demo.db"), _free_port()
    said: list[str] = []
    first = run_demo(db, 2, 3, port, log=said.append)
    assert said == [f"test shop at http://127.0.0.1:{port}/list/1; crawling into {db}"]
    assert first.ok and first.correct == len(first.records) == len(first.expected) == 6
    assert [r["key"] for r in first.records] == [f"SKU-{i:05d}" for i in range(1, 7)]
    assert all(r["data"]["price"] == first.expected[r["key"]] for r in first.records)
    assert first.fetched == first.requests == 9  # robots.txt, 2 listings, 6 products

    again = run_demo(db, 2, 3, port)
    assert again.ok and again.records == first.records
    assert again.fetched == again.requests == 0


def test_demo_falls_back_to_a_free_port(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = run_demo(str(tmp_path / "demo.db"), 1, 2, port)
    assert result.ok and len(result.records) == 2
    assert f":{port}/" not in result.seed_url
