"""A JSON "load more" API: each response names the next offset (``testsite --site sandbox``).

No seed URL needed: ``start_requests`` says where to begin, and the JSON responses reach the
callback that asked for them (``parse`` only sees HTML). The sandbox runs on loopback, which a
crawl refuses unless allowed (set ``SANDBOX=URL`` for one not at 127.0.0.1:8000):

    idemcrawl crawl --db api.db --allow-private 127.0.0.1 --spider examples/api.py:LoadMore
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

from idemcrawl.parse import Page, Record, Request, Spider

SANDBOX = os.environ.get("SANDBOX", "http://127.0.0.1:8000")


class LoadMore(Spider):
    name = "api"

    def start_requests(self) -> Iterator[Request]:
        yield Request(f"{SANDBOX}/api/items?offset=0", self.parse_api, data={"offset": 0})

    def parse_api(self, page: Page) -> Iterator[Any]:
        batch = page.json()
        for item in batch["items"]:
            yield Record(f"api-{item['id']}", {"name": item["name"], "offset": page.data["offset"]})
        if batch["next"] is not None:
            nxt = batch["next"]
            yield page.follow(f"/api/items?offset={nxt}", self.parse_api, data={"offset": nxt})
