"""How a body's bytes become text: the HTML5 charset order (BOM, header, ``<meta>``, UTF-8).

Its own module because two consumers need exactly the same answer: ``parse`` decodes a page for
the spider, and ``dedup`` decodes a body to take its SimHash. If each decoded on its own, the
same page could hash differently from the text the spider saw; if one imported the other, the
two would import each other (``parse`` uses ``dedup``'s SimHash).
"""

from __future__ import annotations

import codecs
import re

__all__ = ["decode_html", "detect_encoding"]

_META_CHARSET = re.compile(rb"""<meta[^>]+charset\s*=\s*["']?\s*([A-Za-z0-9_.:-]+)""", re.I)
_BOMS = (
    (codecs.BOM_UTF8, "utf-8-sig"),
    (codecs.BOM_UTF16_LE, "utf-16-le"),
    (codecs.BOM_UTF16_BE, "utf-16-be"),
)


def detect_encoding(body: bytes, content_type: str | None) -> str:
    """BOM, then the Content-Type charset, then a ``<meta>`` charset, then UTF-8 (HTML5 order)."""
    for bom, name in _BOMS:
        if body.startswith(bom):
            return name
    if content_type and "charset=" in content_type.lower():
        cs = content_type.lower().split("charset=", 1)[1].split(";")[0].strip().strip("\"'")
        if _known_codec(cs):
            return cs
    m = _META_CHARSET.search(body[:4096])
    if m:
        cs = m.group(1).decode("ascii", "replace").lower()
        if _known_codec(cs):
            return cs
    return "utf-8"


def _known_codec(name: str) -> bool:
    try:
        info = codecs.lookup(name)
    except LookupError:
        return False
    return bool(getattr(info, "_is_text_encoding", True))  # base64, zlib… are not charsets


def decode_html(html: bytes) -> str:
    """Decode a body as a browser would without headers: BOM, then ``<meta charset>``, UTF-8.

    The UTF-16 codec names :func:`detect_encoding` returns (``utf-16-le``/``-be``) keep the BOM
    as U+FEFF, so that is removed here.
    """
    return html.decode(detect_encoding(html, None), errors="replace").removeprefix("\ufeff")
