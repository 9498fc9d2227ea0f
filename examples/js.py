"""Pages built by JavaScript: each list, and the link to the next page, exist only once a
script has filled them in from an API.

``render=True`` runs the response in headless Chromium (the ``render`` extra and a Chromium,
e.g. Debian's ``chromium``), so the callback sees the DOM the script built, and the request
for the next page asks for rendering too. The script's own request to the API goes through the
crawl's fetcher, under the host's politeness and robots.txt, and is archived with the page
(``testsite --site sandbox``, on loopback: hence ``--allow-private``; ``SANDBOX=URL`` for one
not at 127.0.0.1:8000).

    idemcrawl crawl --db js.db --allow-private 127.0.0.1 --spider examples/js.py:Rendered
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

from idemcrawl.parse import Page, Record, Request, Spider

SANDBOX = os.environ.get("SANDBOX", "http://127.0.0.1:8000")


class Rendered(Spider):
    name = "js"

    def start_requests(self) -> Iterator[Request]:
        yield Request(f"{SANDBOX}/js?page=1", self.parse_list, data={"page": 1}, render=True)

    def parse_list(self, page: Page) -> Iterator[Any]:
        for li in page.css("li.item"):
            yield Record(f"js-{li.attrs['data-id']}", {"title": li.text(), **page.data})
        nxt = page.css_first("a.next[href]")
        if nxt is not None:
            n = page.data["page"] + 1
            yield page.follow(str(nxt.attrs["href"]), self.parse_list, {"page": n}, render=True)
