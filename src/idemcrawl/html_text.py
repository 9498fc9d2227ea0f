"""The text of an HTML element as a reader sees it (``Node.text()``).

Concatenating an element's text nodes, as HTML parsers' ``text()`` does, is right inside a line
(``Hel<b>lo</b>`` is one word) but glues words wherever a block starts or ends: the source
``<h2>Install</h2><p>Run it</p>`` has no whitespace between the two, yet a browser shows them on
two lines. Stripping every text node on its own (selectolax's ``strip=True``) is worse: it also
glues the words around inline markup, so ``<p>Hello <b>world</b></p>`` became ``Helloworld``.

So the reader's text is built the way CSS lays text out, reduced to what matters for scraped
data: character data is kept as written; block-level elements, table cells, list items and
``<br>`` separate what comes before and after them; runs of HTML whitespace (space, tab, line
feed, form feed, carriage return) collapse to one space; the ends are trimmed. Script, style and
template contents inside the element are not shown to a reader and are skipped (but the text of a
``<script>`` element itself, e.g. JSON-LD, is its content). A non-breaking space stays a
non-breaking space, as on screen.
"""

from __future__ import annotations

import re
from typing import Final

from selectolax.lexbor import LexborNode

#: Elements a browser lays out as blocks (or cells, rows, list items): their content never runs
#: into the text before or after them. ``br`` and ``hr`` break the line too.
BREAKING_TAGS: Final = frozenset(
    {
        "address", "article", "aside", "blockquote", "body", "br", "caption", "center", "dd",
        "details", "dialog", "dir", "div", "dl", "dt", "fieldset", "figcaption", "figure",
        "footer", "form", "h1", "h2", "h3", "h4", "h5", "h6", "head", "header", "hgroup", "hr",
        "html", "legend", "li", "listing", "main", "menu", "nav", "ol", "optgroup", "option",
        "p", "plaintext", "pre", "section", "summary", "table", "tbody", "td", "tfoot", "th",
        "thead", "title", "tr", "ul", "xmp",
    }
)  # fmt: skip
#: Elements whose content a reader never sees when they sit inside the element asked for.
HIDDEN_TAGS: Final = frozenset({"script", "style", "template"})
#: The HTML definition of whitespace (not Python's, which also eats U+00A0 and U+2028).
_HTML_SPACE: Final = re.compile(r"[ \t\n\f\r]+")

_TEXT = "-text"


def reader_text(node: LexborNode, *, strip: bool = True) -> str:
    """Words as a reader sees them in ``node``, whitespace collapsed (see the module doc).

    Walks the tree with an explicit stack, so a hostile page nested ten thousand levels deep
    costs time in proportion to its size and never a ``RecursionError``.
    """
    if node.tag == _TEXT:
        return _collapse(node.text_content or "", strip)
    parts: list[str] = []
    # Children are pushed in reverse so they pop in document order; a closing marker (None
    # paired with the element) separates a block's content from what follows it.
    stack: list[tuple[LexborNode, bool]] = [(node, False)]
    root = True
    while stack:
        n, closing = stack.pop()
        if closing:
            parts.append(" ")
            continue
        tag = n.tag
        if tag == _TEXT:
            parts.append(n.text_content or "")
            continue
        if tag is None or tag.startswith("-") or (tag in HIDDEN_TAGS and not root):
            root = False
            continue  # comments, doctype, invisible subtrees
        root = False
        breaking = tag in BREAKING_TAGS
        if breaking:
            parts.append(" ")
            stack.append((n, True))
        children = []
        child = n.child
        while child is not None:
            children.append(child)
            child = child.next
        stack.extend((c, False) for c in reversed(children))
    return _collapse("".join(parts), strip)


def _collapse(text: str, strip: bool) -> str:
    text = _HTML_SPACE.sub(" ", text)
    return text.strip(" ") if strip else text
