"""The C SimHash (idemcrawl._simhash) gives exactly the pure-Python fingerprints.

Fingerprints are stored (``simhash_blocks``), so the native code must agree bit for bit with
``dedup._simhash64_py`` (itself checked against the textbook definition in test_dedup.py) and
its XXH3-64 with the ``xxhash`` package, for every input length its code distinguishes.
"""

from __future__ import annotations

import random
import subprocess
import sys
from array import array
from types import ModuleType

import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from idemcrawl import dedup
from idemcrawl.dedup import _WORD, _simhash64_py, simhash64

from .conftest import native_extension
from .frontier.conftest import in_ci


@pytest.fixture(scope="module")
def native() -> ModuleType:
    return native_extension("_simhash")


def both(native: ModuleType, text: str) -> int:
    """The native fingerprint of ``text`` by each path that applies, checked equal."""
    words = _WORD.findall(text.lower())
    fp = native.simhash_words(words)
    assert native.simhash_words([w.encode() for w in words]) == fp
    if text.isascii():
        assert native.simhash_ascii(text) == fp
    return fp


def test_extension_is_built_and_used_in_ci() -> None:
    """CI (CI=true) must not silently measure or test the slow path."""
    if not in_ci():
        pytest.skip("only CI requires the build; elsewhere the fallback is allowed")
    from idemcrawl import _simhash

    assert dedup._native is _simhash


def test_parse_module_imports_the_extension() -> None:
    """Parser processes import idemcrawl.parse (the fork server preloads it): that is enough."""
    if dedup._native is None:
        pytest.skip("idemcrawl._simhash was not built")
    code = "import sys, idemcrawl.parse; print('idemcrawl._simhash' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "True"


# --- XXH3-64 ----------------------------------------------------------------------------------


def test_xxh3_matches_xxhash_for_every_length(native: ModuleType) -> None:
    # 0, 1-3, 4-8, 9-16, 17-128 (four round counts), 129-240 and the >240 fallback: every
    # length, several random inputs each, plus all-zero and all-0xff bytes.
    rng = random.Random(17)
    for length in range(301):
        inputs = [rng.randbytes(length) for _ in range(20)]
        inputs += [bytes(length), b"\xff" * length]
        for data in inputs:
            assert native.xxh3_64(data) == xxhash.xxh3_64_intdigest(data), (length, data)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_xxh3_matches_xxhash_on_any_bytes(native: ModuleType, data: bytes) -> None:
    assert native.xxh3_64(data) == xxhash.xxh3_64_intdigest(data)


# --- SimHash ----------------------------------------------------------------------------------


def test_known_fingerprints(native: ModuleType) -> None:
    assert native.simhash_ascii("a b c d e f g") == 0x0DCC43F2565B7A5B
    assert native.simhash_ascii("") == native.simhash_words([]) == 0
    assert native.simhash_ascii(" ,.;\n ") == 0


def test_every_ascii_character_tokenises_like_python(native: ModuleType) -> None:
    for c in map(chr, range(128)):
        for text in (f"ab{c}cd ef gh", f"{c}", f"{c}x{c}{c}y{c}z{c}", f"Q{c}{c}"):
            assert both(native, text) == _simhash64_py(text), repr(text)


def test_every_feature_length_up_to_300_bytes(native: ModuleType) -> None:
    """Features of each byte length 1..300: single words (< 3 words) and 3-word shingles."""
    rng = random.Random(3)
    for length in range(1, 301):
        texts = ["w" * length, "é" * (length // 2) + "x" * (length % 2)]
        if length >= 5:
            a = rng.randint(1, length - 4)
            b = rng.randint(1, length - 3 - a)
            c = length - 2 - a - b
            texts.append(f"{'a' * a} {'b' * b} {'c' * c}")
            texts.append(f"{'a' * a} {'b' * b} {'c' * c} more words here")
            texts.append(f"x {'a' * a}, {'ü' * (b // 2) or 'u'}; {'c' * c}")
        for text in texts:
            assert both(native, text) == _simhash64_py(text), (length, text)


def test_words_at_every_block_boundary(native: ModuleType) -> None:
    """simhash_ascii classifies the text 64 bytes at a time and finds words by bit scans: a
    word may start or end at any offset of a block, run across blocks, end the text exactly at
    a block's end, or be followed by several separators (its shingles are then joined, not
    sliced); every case gives the Python fingerprint."""
    rng = random.Random(11)
    for n in range(0, 200):
        for alphabet in ("ab ", "aB_9 ,", "x", " ", "Az \t\n.;", "z" * 9 + "@[`{/:"):
            text = "".join(rng.choice(alphabet) for _ in range(n))
            assert both(native, text) == _simhash64_py(text), repr(text)
    for size in (62, 63, 64, 65, 127, 128, 129, 191, 192, 256):
        for gap in (" ", "  ", ", ", "\n\n\t"):
            words = [f"W{i}" * (1 + i % 5) for i in range(size)]
            text = gap.join(words)[:size]
            assert both(native, text) == _simhash64_py(text), repr(text)
            long = gap.join(["q" * 100, "r" * 100, "s" * 100, "t"])  # joined shingle > 240
            assert both(native, long) == _simhash64_py(long)


ascii_texts = st.text(alphabet=st.characters(max_codepoint=127), max_size=400)
word_texts = st.lists(
    st.one_of(
        st.text(alphabet="abcXYZ_09", min_size=1, max_size=8),
        st.text(alphabet="abcéΣ日", min_size=1, max_size=8),
        st.text(alphabet="lw", min_size=60, max_size=300),  # shingles over 240 bytes
    ),
    max_size=12,
).map(" ".join)


@settings(max_examples=400, deadline=None)
@given(st.one_of(ascii_texts, st.text(max_size=400), word_texts))
def test_native_matches_python(native: ModuleType, text: str) -> None:
    assert both(native, text) == _simhash64_py(text)
    assert simhash64(text) == _simhash64_py(text)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.binary(max_size=20), max_size=8))
def test_words_of_any_bytes_match_python_shingles(native: ModuleType, words: list[bytes]) -> None:
    """simhash_words hashes the bytes it is given, joined by one space, as Python would."""
    if len(words) < 3:
        features = words
    else:
        features = [b" ".join(words[i : i + 3]) for i in range(len(words) - 2)]
    hashes = [xxhash.xxh3_64_intdigest(f) for f in features]
    expected = sum(1 << b for b in range(64) if 2 * sum(h >> b & 1 for h in hashes) > len(hashes))
    assert native.simhash_words(words) == expected


def test_long_texts_cross_the_vote_flush(native: ModuleType) -> None:
    """Lane counters are flushed every 255 features: counts beyond that must be exact."""
    rng = random.Random(5)
    vocab = ["alpha", "beta", "gamma", "delta", "x" * 250]
    for n in (254, 255, 256, 257, 510, 511, 2500, 20000):
        text = " ".join(rng.choice(vocab) for _ in range(n))
        assert both(native, text) == _simhash64_py(text)
    # One shingle repeated: every bit is decided by that hash alone, whatever the count.
    text = "a b c " * 3000
    assert both(native, text) == _simhash64_py(text)


def test_rejects_what_it_cannot_take(native: ModuleType) -> None:
    with pytest.raises(ValueError):
        native.simhash_ascii("café")
    with pytest.raises(TypeError):
        native.simhash_ascii(b"bytes")
    with pytest.raises(TypeError):
        native.simhash_words([b"a", 1])
    with pytest.raises(TypeError):
        native.xxh3_64("str")


def test_fallback_gives_the_same_fingerprints(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the extension simhash64 runs the Python code: nothing else changes."""
    texts = ["", "one", "Hello, World!  Foo bar.", "naïve café déjà vu ok", "x" * 300 + " a b"]
    expected = [simhash64(t) for t in texts]
    monkeypatch.setattr(dedup, "_native", None)
    assert [simhash64(t) for t in texts] == expected


@given(
    st.integers(0, 2**64 - 1),
    st.lists(st.integers(0, 2**64 - 1), max_size=60),
    st.integers(0, 64),
    st.lists(st.integers(0, 63), max_size=4),
)
@settings(max_examples=300, deadline=None)
def test_within_matches_python(
    native: ModuleType, fp: int, others: list[int], k: int, flips: list[int]
) -> None:
    near = fp
    for bit in flips:
        near ^= 1 << bit
    fps = array("Q", [*others, near, fp])
    assert native.within(fp, fps, k) == dedup._within(fp, fps, k)


def test_within_refuses_what_is_not_an_array_of_fingerprints(native: ModuleType) -> None:
    with pytest.raises(TypeError):
        native.within(1, array("q", [1]), 3)
    with pytest.raises(TypeError):
        native.within(1, [1, 2], 3)
    with pytest.raises(OverflowError):
        native.within(-1, array("Q", [1]), 3)


def test_the_index_finds_the_same_without_the_extension(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(3)
    base = [rng.getrandbits(64) for _ in range(40)]
    fps = [b ^ (1 << rng.randrange(64)) if i % 3 else b for i, b in enumerate(base * 5)]

    def answers() -> list[list[tuple[int, int]]]:
        index = dedup.SimHashIndex(3)
        for doc, fp in enumerate(fps):
            index.add(fp, doc)
        return [index.near(fp) for fp in fps]

    with_native = answers()
    monkeypatch.setattr(dedup, "_native", None)
    assert answers() == with_native
    assert all(any(d == 0 for _, d in found) for found in with_native)


@given(
    st.integers(0, 2**64 - 1),
    st.lists(st.tuples(st.lists(st.integers(0, 63), max_size=5), st.integers(0, 12)), max_size=40),
    st.integers(0, 3),
    st.one_of(st.none(), st.integers(0, 12)),
)
@settings(max_examples=300, deadline=None)
def test_nearest_is_the_first_of_near(
    native: ModuleType,
    fp: int,
    entries: list[tuple[list[int], int]],
    k: int,
    exclude: int | None,
) -> None:
    """nearest() answers what the first eligible entry of near() is, natively and in Python,
    whatever the ties (doc ids repeat, one doc can have several fingerprints)."""
    index = dedup.SimHashIndex(3)
    for flips, doc in entries:
        other = fp
        for bit in flips:
            other ^= 1 << bit
        index.add(other, doc)
    expected = next(
        ((doc, dist) for doc, dist in index.near(fp) if doc != exclude and dist <= k), None
    )
    assert dedup._native is native
    assert index.nearest(fp, k, exclude=exclude) == expected
    dedup._native = None
    try:
        assert index.nearest(fp, k, exclude=exclude) == expected
    finally:
        dedup._native = native


def test_nearest_refuses_what_is_not_a_bucket(native: ModuleType) -> None:
    with pytest.raises(TypeError):
        native.nearest(1, array("q", [1]), [1], 3, None, None)
    with pytest.raises(TypeError):
        native.nearest(1, array("Q", [1]), (1,), 3, None, None)
    with pytest.raises(ValueError):
        native.nearest(1, array("Q", [1, 2]), [1], 3, None, None)
    with pytest.raises(TypeError):
        native.nearest(1, array("Q", [1]), [1], 3, None, (0,))
    assert native.nearest(1, array("Q", [1, 3]), [7, 5], 3, None, None) == (0, 7)
    assert native.nearest(1, array("Q", [1, 3]), [7, 5], 3, 7, None) == (1, 5)
    assert native.nearest(1, array("Q", [1, 3]), [7, 5], 3, 7, (1, 2)) == (1, 2)


_HTML_PIECES = [
    "<script>", "</script>", "<SCRIPT src=x>", "<ScRiPt>", "<style>", "</style>", "<Style>",
    "<noscript>", "</noscript>", "<template>", "</template>", "<TEMPLATE>", "<p>", "</p>", "<b>",
    "<!-- <script> -->", "<scripts>", "< script>", "<svg><style>", "&lt;script&gt;", "<",
    "words here", "Hidden Text", "é", "日本", "\x00", "<body>", "</body>", "<html>", "<head>",
]  # fmt: skip
html_texts = st.lists(st.sampled_from(_HTML_PIECES), max_size=14).map("".join)


@settings(max_examples=400, deadline=None)
@given(html_texts)
def test_page_simhash_skips_the_strip_only_when_nothing_is_hidden(html: str) -> None:
    """page_simhash(tree, source) is page_simhash(tree) for every HTML text: the strip is
    skipped only when the source has none of the invisible elements' start tags."""
    from selectolax.lexbor import LexborHTMLParser

    assert dedup.page_simhash(LexborHTMLParser(html), html) == dedup.page_simhash(
        LexborHTMLParser(html)
    )
    assert dedup.page_simhash(html) == dedup.page_simhash(LexborHTMLParser(html))


def test_may_hide_text(native: ModuleType) -> None:
    for html in ("<p>a<ScRiPt>x", "<STYLE>", "a<noscript", "<template>", "é<script", "日<p>"):
        assert native.may_hide_text(html), html  # the last: not one byte a char, not scanned
    for html in ("", "<p>script</p>", "< script>", "<scrip>", "<p>é</p>", "<sty", "<"):
        assert not native.may_hide_text(html), html
    with pytest.raises(TypeError):
        native.may_hide_text(b"<script>")
