"""A login with a CSRF token, then members-only pages (``testsite --site sandbox``).

A spider keeps cookies by default (``keep_cookies = False`` turns that off), in one cookie jar
per crawl, kept in the frontier: the session the login opens is stored in the same transaction as the login's completion, shared by every crawl
process and kept across restarts, so a killed crawl does not log in again while the session
is valid. ``from_form`` keeps the form's hidden CSRF field and fills in the rest. The sandbox
runs on loopback, hence ``--allow-private`` (``SANDBOX=URL`` for one not at 127.0.0.1:8000):

    idemcrawl crawl --db members.db --allow-private 127.0.0.1 --spider examples/login.py:Members
"""

from __future__ import annotations

import os
from collections.abc import Iterator

from idemcrawl.parse import Page, Record, Request, Spider, from_form

SANDBOX = os.environ.get("SANDBOX", "http://127.0.0.1:8000")


class Members(Spider):
    name = "members"

    def start_requests(self) -> Iterator[Request]:
        yield Request(f"{SANDBOX}/login", self.login)

    def login(self, page: Page) -> Iterator[Request]:
        # POST /login answers with the session cookie and a redirect to /members, which
        # keeps this callback chain: the redirect target is parsed by parse_members.
        yield from_form(
            page, "#login", {"user": "demo", "password": "demo"}, callback=self.parse_members
        )

    def parse_members(self, page: Page) -> Iterator[Request]:
        yield from page.follow_all(css="li.deal a", callback=self.parse_deal)

    def parse_deal(self, page: Page) -> Iterator[Record]:
        title = page.css_first(".deal-title")
        yield Record(
            "member-" + page.url.rsplit("/", 1)[1], {"title": title.text() if title else None}
        )
