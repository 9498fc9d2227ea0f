"""The package version and the crawler's default User-Agent, in a module that imports nothing.

Every part that names the crawler on the wire (fetches, robots.txt matching, webhook posts,
WARC ``warcinfo``) takes its string from here, so a version bump or a rename is one edit and the
robots.txt product token can never disagree with the User-Agent actually sent. It stays free of
imports so that the lowest modules (``fetch``, ``robots``, ``warc``) can use it without a cycle
through the package ``__init__`` (which imports the engine).
"""

from __future__ import annotations

from typing import Final

__version__: Final = "0.1.0"

#: The RFC 9309 product token: the name robots.txt ``User-agent`` groups address us by.
PRODUCT_TOKEN: Final = "idemcrawl"

#: Sent when no ``--user-agent`` / ``user_agent`` is configured.
DEFAULT_USER_AGENT: Final = f"{PRODUCT_TOKEN}/{__version__}"
