"""The deliberately naive scraper: an experiment baseline, NOT something to use.

This exists to show the duplicates a non-idempotent design makes.  It is the article's
"naive scraper": sequential, no memory of progress between runs, and it inserts a new row
for every product page it fetches.  Kill it half-way and start it again and it starts over
at ``start_url``, refetching every page and inserting every product a second time; run it
twice to completion and the table holds every product twice.  The rest of ``idemcrawl``
(persistent frontier, idempotent upserts) is measured against this baseline, so do not
"fix" it: its flaws are the point.

Deliberately stdlib only (``urllib.request``, ``sqlite3``, ``html.parser``) so the baseline
cannot be accused of being slow or fragile because of a library.  It commits after each
insert, as a typical hand-written scraper does, so a SIGKILL loses at most the page in
progress and every duplicate it makes is durable and countable.

Run as ``python -m idemcrawl.lab.naive START_URL DB_PATH``.
"""

from __future__ import annotations

import sqlite3
import sys
import time
import urllib.request
from html.parser import HTMLParser
from urllib.parse import urldefrag, urljoin

__all__ = ["run_naive"]

_TIMEOUT_S = 30.0
_USER_AGENT = "idemcrawl-naive/0.1 (experiment baseline)"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS products (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    sku TEXT,
    price TEXT,
    url TEXT,
    scraped_at REAL
)
"""


class _PageParser(HTMLParser):
    """Collects product links, the rel=next link and the sku/price spans of one page."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.product_links: list[str] = []
        self.next_link: str | None = None
        self.sku: str | None = None
        self.price: str | None = None
        self._capture: str | None = None
        self._buf: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        classes = a.get("class", "").split()
        if tag == "a" and "href" in a:
            if "product" in classes:
                self.product_links.append(a["href"])
            if "next" in a.get("rel", "").split() and self.next_link is None:
                self.next_link = a["href"]
        elif tag == "span" and self._capture is None:
            for field in ("sku", "price"):
                if field in classes:
                    self._capture = field
                    self._buf = []

    def handle_data(self, data: str) -> None:
        if self._capture is not None:
            self._buf.append(data)

    def handle_endtag(self, tag: str) -> None:
        if tag == "span" and self._capture is not None:
            value = "".join(self._buf).strip()
            if self._capture == "sku":
                self.sku = value
            else:
                self.price = value
            self._capture = None


def _fetch(url: str) -> tuple[str, str]:
    """GET ``url``; returns (final URL after redirects, decoded body). Errors propagate."""
    req = urllib.request.Request(url, headers={"User-Agent": _USER_AGENT})
    with urllib.request.urlopen(req, timeout=_TIMEOUT_S) as resp:
        charset = resp.headers.get_content_charset() or "utf-8"
        return resp.geturl(), resp.read().decode(charset, errors="replace")


def _parse(body: str) -> _PageParser:
    parser = _PageParser()
    parser.feed(body)
    parser.close()
    return parser


def _absolute(base: str, href: str) -> str:
    return urldefrag(urljoin(base, href)).url


def run_naive(start_url: str, db_path: str) -> None:
    """Scrape from ``start_url`` into ``db_path``, always from the beginning.

    Order: for each listing page, fetch each of its products (one INSERT + COMMIT per
    product page), then follow rel=next.  The ``visited`` set lives in memory only, so it
    prevents refetching within one run but is forgotten on exit, which is exactly what
    produces duplicates across runs.  Any HTTP or network error aborts the run, as it would
    in a typical naive script.
    """
    conn = sqlite3.connect(db_path)
    try:
        conn.execute(_SCHEMA)
        conn.commit()
        visited: set[str] = set()
        listing_url: str | None = _absolute(start_url, start_url)
        while listing_url is not None and listing_url not in visited:
            visited.add(listing_url)
            final_url, body = _fetch(listing_url)
            listing = _parse(body)
            for href in listing.product_links:
                product_url = _absolute(final_url, href)
                if product_url in visited:
                    continue
                visited.add(product_url)
                _, product_body = _fetch(product_url)
                product = _parse(product_body)
                conn.execute(
                    "INSERT INTO products (sku, price, url, scraped_at) VALUES (?, ?, ?, ?)",
                    (product.sku, product.price, product_url, time.time()),
                )
                conn.commit()
            listing_url = (
                _absolute(final_url, listing.next_link) if listing.next_link is not None else None
            )
    finally:
        conn.close()


def main(argv: list[str] | None = None) -> int:
    """Entry point for ``python -m idemcrawl.lab.naive START_URL DB_PATH``."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m idemcrawl.lab.naive START_URL DB_PATH", file=sys.stderr)
        return 2
    run_naive(args[0], args[1])
    return 0


if __name__ == "__main__":
    sys.exit(main())
