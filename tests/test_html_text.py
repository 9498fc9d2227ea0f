"""``Node.text()`` gives the words a reader sees: no glued words, whitespace collapsed."""

from __future__ import annotations

import html
import re

from hypothesis import given, settings
from hypothesis import strategies as st
from selectolax.lexbor import LexborHTMLParser

from idemcrawl.html_text import BREAKING_TAGS, reader_text
from idemcrawl.parse import Node, Page


def node_of(markup: str) -> Node:
    tree = LexborHTMLParser(f"<div id=root>{markup}</div>")
    found = tree.css_first("#root")
    assert found is not None
    return Node(found)


def test_inline_markup_keeps_word_boundaries() -> None:
    assert node_of("<p>Hello <b>world</b></p>").text() == "Hello world"
    assert node_of("<p>Hel<b>lo</b> there</p>").text() == "Hello there"
    assert node_of("<a href=/x>see <em>the</em>\n\n  <span>docs</span></a>").text() == (
        "see the docs"
    )


def test_blocks_cells_items_and_breaks_separate_words() -> None:
    assert node_of("<h2>Install</h2><p>Run it</p>").text() == "Install Run it"
    assert node_of("<ul><li>one</li><li>two</li></ul>").text() == "one two"
    assert node_of("<table><tr><td>a</td><td>b</td></tr></table>").text() == "a b"
    assert node_of("line<br>next").text() == "line next"


def test_hidden_content_is_skipped_but_a_script_itself_can_be_read() -> None:
    assert node_of("a<script>var x = 1;</script><style>p{}</style>b").text() == "ab"
    tree = LexborHTMLParser('<script type="application/ld+json">{"sku": "A1"}</script>')
    script = tree.css_first("script")
    assert script is not None
    assert Node(script).text() == '{"sku": "A1"}'


def test_raw_and_unstripped_variants() -> None:
    n = node_of(" <p>Hello <b>world</b></p>\n")
    assert n.text(raw=True) == " Hello world\n"
    assert n.text(strip=False) == " Hello world "
    # A non-breaking space is not HTML whitespace: it stays, as it does on screen.
    assert node_of("<p>12&nbsp;€</p>").text() == "12\xa0€"


def test_page_nodes_read_the_same_way() -> None:
    page = Page("https://a.example/", 200, {}, b"<html><body><h1>Big <i>sale</i></h1></body>")
    h1 = page.css_first("h1")
    assert h1 is not None and h1.text() == "Big sale"


def test_deep_nesting_does_not_recurse() -> None:
    depth = 20_000
    assert node_of("<span>" * depth + "x" + "</span>" * depth).text() == "x"


# -- property: random markup against a reference extraction ---------------------------------------

INLINE = ("b", "i", "em", "strong", "span", "code", "small", "u")
BLOCK = ("div", "section", "article")
words = st.text(alphabet="abcxyzé&<>\"' \t\n", max_size=8)


def trees(blocks: bool) -> st.SearchStrategy[object]:
    tags = INLINE + (BLOCK if blocks else ())
    return st.recursive(
        words,
        lambda children: st.tuples(st.sampled_from(tags), st.lists(children, max_size=4)),
        max_leaves=12,
    )


def render(tree: object) -> str:
    if isinstance(tree, str):
        return html.escape(tree, quote=False)
    tag, children = tree  # type: ignore[misc]
    return f"<{tag}>" + "".join(render(c) for c in children) + f"</{tag}>"


def reference(tree: object) -> str:
    """What a reader sees, built from the tree itself rather than from a parsed document."""
    if isinstance(tree, str):
        return tree
    tag, children = tree  # type: ignore[misc]
    inner = "".join(reference(c) for c in children)
    return f" {inner} " if tag in BREAKING_TAGS else inner


def collapse(text: str) -> str:
    return re.sub(r"[ \t\n\f\r]+", " ", text).strip(" ")


@settings(max_examples=300, deadline=None)
@given(st.lists(trees(blocks=False), max_size=5))
def test_inline_markup_reads_as_its_text(forest: list[object]) -> None:
    markup = "".join(render(t) for t in forest)
    expected = collapse("".join(reference(t) for t in forest))
    assert node_of(markup).text() == expected
    # Raw text is exactly the character data, in order.
    assert node_of(markup).text(raw=True) == "".join(_raw(t) for t in forest).replace("\r", "")


@settings(max_examples=300, deadline=None)
@given(st.lists(trees(blocks=True), max_size=5))
def test_blocks_never_glue_words(forest: list[object]) -> None:
    markup = "".join(render(t) for t in forest)
    assert node_of(markup).text() == collapse("".join(reference(t) for t in forest))


def _raw(tree: object) -> str:
    if isinstance(tree, str):
        return tree
    _, children = tree  # type: ignore[misc]
    return "".join(_raw(c) for c in children)


def test_reader_text_of_a_text_node() -> None:
    tree = LexborHTMLParser("<p>  two   words </p>")
    p = tree.css_first("p")
    assert p is not None and p.child is not None
    assert reader_text(p.child) == "two words"
