"""A page built by JavaScript: its list is empty until a script fills it from an API.

``render=True`` runs the response in headless Chromium (the ``render`` extra and a Chromium,
e.g. Debian's ``chromium``), so the callback sees the DOM the script built. The script's own
request to the API goes through the crawl's fetcher, under the host's politeness and
robots.txt, and is archived with the page (``testsite --site sandbox``).

    SANDBOX=http://127.0.0.1:8000 idemcrawl crawl --db js.db --spider examples/js.py:Rendered
"""

from __future__ import annotations

import os
from collections.abc import Iterator

from idemcrawl.parse import Page, Record, Request, Spider

SANDBOX = os.environ.get("SANDBOX", "http://127.0.0.1:8000")


class Rendered(Spider):
    name = "js"

    def start_requests(self) -> Iterator[Request]:
        yield Request(f"{SANDBOX}/js", self.parse_list, render=True)

    def parse_list(self, page: Page) -> Iterator[Record]:
        for li in page.css("li.item"):
            yield Record(f"js-{li.attrs['data-id']}", {"title": li.text()})
