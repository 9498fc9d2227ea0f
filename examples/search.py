"""A POST search form, one submission per query (``testsite --site sandbox``).

``from_form`` submits the page's form as a browser would (hidden fields kept, ``q`` filled
in); the query travels to the results callback as context. Each submission is its own
request (method + URL + body), stored with its body, so after a kill it is sent again
exactly as it was. The sandbox runs on loopback, hence ``--allow-private`` (``SANDBOX=URL``
for one not at 127.0.0.1:8000):

    idemcrawl crawl --db search.db --allow-private 127.0.0.1 --spider examples/search.py:Search
"""

from __future__ import annotations

import os
from collections.abc import Iterator

from idemcrawl.parse import Page, Record, Request, Spider, from_form

SANDBOX = os.environ.get("SANDBOX", "http://127.0.0.1:8000")
QUERIES = ("books", "toys")


class Search(Spider):
    name = "search"

    def start_requests(self) -> Iterator[Request]:
        yield Request(f"{SANDBOX}/search", self.search)

    def search(self, page: Page) -> Iterator[Request]:
        for q in QUERIES:
            yield from_form(page, "#search", {"q": q}, callback=self.results, context={"query": q})

    def results(self, page: Page) -> Iterator[Record]:
        q = page.data["query"]
        for hit in page.css("li.hit"):
            name, price = hit.css_first(".name"), hit.css_first(".price")
            if name is None or price is None:
                continue
            n = int(name.text().split()[-1])
            yield Record(f"{q}:{n}", {"query": q, "name": name.text(), "price": price.text()})
