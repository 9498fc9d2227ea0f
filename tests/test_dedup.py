"""Tests for idemcrawl.dedup: body hash, SimHash, the near-duplicate index and the Bloom cache."""

from __future__ import annotations

import codecs
import hashlib
import random
import re

import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from idemcrawl.dedup import (
    _ASCII_NONWORD_TO_SPACE,
    BloomNegativeCache,
    BloomStats,
    SimHashIndex,
    block_keys,
    block_layout,
    bloom_saving_experiment,
    body_hash,
    fp_from_signed,
    fp_to_signed,
    hamming,
    page_simhash,
    same_body,
    simhash64,
    visible_text,
)


def zipf_text(seed: int, words: int = 2500, vocab_size: int = 5000) -> str:
    """A text with a natural (Zipfian) word distribution; 2,500 words is ~15-17 KB."""
    rng = random.Random(seed)
    vocab = [
        "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 9)))
        for _ in range(vocab_size)
    ]
    weights = [1 / (i + 1) for i in range(vocab_size)]
    return " ".join(rng.choices(vocab, weights, k=words))


# --- exact hash -------------------------------------------------------------------------------


def test_body_hash_is_tagged_xxh3_128_hex() -> None:
    assert body_hash(b"abc") == "x3:" + xxhash.xxh3_128_hexdigest(b"abc")
    assert len(body_hash(b"")) == 3 + 32
    assert body_hash(b"a") != body_hash(b"b")


def test_same_body_reads_new_and_legacy_digests() -> None:
    body = b"<html>same</html>"
    digest = body_hash(body)
    assert same_body(digest, body, digest)
    assert not same_body(body_hash(b"other"), body, digest)
    assert not same_body(None, body, digest)
    # A crawl stored before the change holds BLAKE2b-128: still the same body, not a change.
    legacy = hashlib.blake2b(body, digest_size=16).hexdigest()
    assert same_body(legacy, body, digest)
    assert not same_body(hashlib.blake2b(b"other", digest_size=16).hexdigest(), body, digest)
    # A digest of a form this version does not know never matches.
    assert not same_body("sha1:ABC", body, digest)


# --- visible text -----------------------------------------------------------------------------


def test_visible_text_drops_invisible_elements_and_collapses_whitespace() -> None:
    html = (
        "<html><head><title>Title</title><style>p{color:red}</style></head><body>"
        "<p>Hello\n\n   <b>world</b></p><script>var tracking = 1;</script>"
        "<noscript>enable js</noscript><template><p>hidden</p></template>"
        "<div>  tail\ttext </div></body></html>"
    )
    assert visible_text(html) == "Hello world tail text"


def test_visible_text_accepts_bytes_with_meta_charset() -> None:
    html = '<meta charset="iso-8859-1"><p>caf\xe9</p>'.encode("latin-1")
    assert visible_text(html) == "café"
    assert visible_text("<p>caf\u00e9</p>".encode()) == "café"
    assert visible_text(b"") == ""
    assert visible_text(codecs.BOM_UTF16_LE + "<p>xé</p>".encode("utf-16-le")) == "xé"


# --- simhash ----------------------------------------------------------------------------------


def test_simhash_identical_text_same_fingerprint_and_range() -> None:
    text = zipf_text(1)
    fp = simhash64(text)
    assert fp == simhash64(text)
    assert 0 <= fp < 2**64
    # Case, punctuation and spacing are not content.
    assert simhash64("Hello, World!  Foo bar.") == simhash64("hello world foo bar")


def reference_simhash(text: str) -> int:
    """The textbook per-bit +1/-1 vote, to check the packed-column implementation against."""
    words = re.findall(r"\w+", text.lower())
    features = (
        words if len(words) < 3 else [" ".join(words[i : i + 3]) for i in range(len(words) - 2)]
    )
    votes = [0] * 64
    for feature in features:
        h = xxhash.xxh3_64_intdigest(feature.encode())
        for b in range(64):
            votes[b] += 1 if h >> b & 1 else -1
    return sum(1 << b for b in range(64) if votes[b] > 0)


def test_simhash_matches_textbook_definition() -> None:
    for text in ("", "one", "two words", "a b c d e f g", "x y x y x y x y", zipf_text(9, 400)):
        assert simhash64(text) == reference_simhash(text)


@settings(max_examples=300, deadline=None)
@given(
    st.text(
        alphabet=st.sampled_from("ab Z_9 .,;\t\n-éßİΣ日\u00a0\u2028\x1c\x00"), max_size=40
    )
)
def test_simhash_fast_paths_match_textbook_definition(text: str) -> None:
    # ASCII texts take the bytes tokeniser, the others the regex one: both must agree with it.
    assert simhash64(text) == reference_simhash(text)
    assert simhash64(text.encode("ascii", "ignore").decode()) == reference_simhash(
        text.encode("ascii", "ignore").decode()
    )


def test_ascii_word_characters_are_what_the_regex_calls_words() -> None:
    for c in map(chr, range(128)):
        assert (re.fullmatch(r"\w", c) is not None) == (_ASCII_NONWORD_TO_SPACE[ord(c)] != 32)


def test_split_collapses_exactly_the_regex_whitespace() -> None:
    for c in map(chr, range(0x110000)):
        if (re.fullmatch(r"\s", c) is not None) != c.isspace():
            raise AssertionError(f"U+{ord(c):04X}")


def test_page_simhash_is_simhash_of_visible_text() -> None:
    html = (
        "<html><head><title>T</title><style>p{}</style></head><body><p>Hello,\n  world"
        "</p><script>var x</script><div>third  word\u00a0here</div> and   more text</body></html>"
    )
    assert page_simhash(html) == simhash64(visible_text(html)) == reference_simhash(
        "Hello, world third word here and more text"
    )
    assert page_simhash("") == simhash64(visible_text("")) == 0


def test_simhash_is_stable_across_processes() -> None:
    # The fingerprint is stored on disk, so it must not depend on hash() salting: pin a value.
    assert simhash64("a b c d e f g") == 0x0DCC43F2565B7A5B
    assert simhash64("the quick brown fox jumps over the lazy dog") == simhash64(
        "The quick brown fox jumps over the lazy dog."
    )
    assert simhash64("") == 0
    assert simhash64("one") != simhash64("two")  # fewer than 3 words: words are features


def test_simhash_one_word_change_is_small_distance() -> None:
    text = zipf_text(2)
    assert 14_000 <= len(text) <= 18_000
    words = text.split()
    fp = simhash64(text)
    rng = random.Random(3)
    distances = []
    for _ in range(30):
        edited = list(words)
        edited[rng.randrange(len(edited))] = "replacedword"
        distances.append(hamming(fp, simhash64(" ".join(edited))))
    assert max(distances) <= 3, distances


def test_simhash_unrelated_texts_are_far_apart() -> None:
    fps = [simhash64(zipf_text(seed, words=1500)) for seed in range(10, 16)]
    for i, a in enumerate(fps):
        for b in fps[i + 1 :]:
            assert hamming(a, b) >= 12


def test_hamming() -> None:
    assert hamming(0, 0) == 0
    assert hamming(0, 2**64 - 1) == 64
    assert hamming(0b1010, 0b0110) == 2


# --- near-duplicate index ---------------------------------------------------------------------


def flip(fp: int, bits: list[int]) -> int:
    for b in bits:
        fp ^= 1 << b
    return fp


def test_block_layout_covers_all_bits_once() -> None:
    for k in (1, 2, 3, 4, 6, 7, 15):
        layout = block_layout(k)
        assert len(layout) == k + 1
        mask = 0
        for shift, width in layout:
            block = ((1 << width) - 1) << shift
            assert mask & block == 0
            mask |= block
        assert mask == 2**64 - 1
    assert block_layout(3) == [(48, 16), (32, 16), (16, 16), (0, 16)]
    with pytest.raises(ValueError):
        block_layout(0)


def test_block_keys_encoding_and_pigeonhole() -> None:
    fp = 0x1234_5678_9ABC_DEF0
    assert block_keys(fp) == [0x1234, (1 << 32) | 0x5678, (2 << 32) | 0x9ABC, (3 << 32) | 0xDEF0]
    rng = random.Random(5)
    for _ in range(200):
        a = rng.getrandbits(64)
        b = flip(a, rng.sample(range(64), rng.randint(0, 3)))
        assert set(block_keys(a)) & set(block_keys(b))
        assert all(0 <= key < 2**63 for key in block_keys(a))
    with pytest.raises(ValueError):
        block_keys(2**64)


def test_signed_roundtrip_for_sqlite() -> None:
    for fp in (0, 1, 2**63 - 1, 2**63, 2**64 - 1):
        signed = fp_to_signed(fp)
        assert -(2**63) <= signed < 2**63
        assert fp_from_signed(signed) == fp


def test_simhash_index_matches_brute_force() -> None:
    rng = random.Random(42)
    k = 3
    index = SimHashIndex(k)
    stored: list[tuple[int, int]] = []
    for doc_id in range(20_000):
        fp = rng.getrandbits(64)
        stored.append((fp, doc_id))
    # Plant near-duplicates at every distance 0..k+2 around some of the fingerprints.
    next_id = 20_000
    for base_fp, _ in stored[:300]:
        for distance in range(k + 3):
            stored.append((flip(base_fp, rng.sample(range(64), distance)), next_id))
            next_id += 1
    for fp, doc_id in stored:
        index.add(fp, doc_id)
    assert len(index) == len(stored)
    index.add(*stored[0])  # idempotent
    assert len(index) == len(stored)

    queries = [fp for fp, _ in stored[:150]] + [rng.getrandbits(64) for _ in range(50)]
    queries += [flip(fp, rng.sample(range(64), 2)) for fp, _ in stored[:50]]
    total_found = 0
    for q in queries:
        expected = sorted(
            ((doc_id, hamming(q, fp)) for fp, doc_id in stored if hamming(q, fp) <= k),
            key=lambda item: (item[1], item[0]),
        )
        got = index.near(q)
        assert got == expected
        total_found += len(got)
    assert total_found > 150 * 4  # the planted near-duplicates were really exercised


def test_simhash_index_finds_real_near_duplicate_pages() -> None:
    index = SimHashIndex()
    base = zipf_text(7)
    index.add(simhash64(base), 1)
    index.add(simhash64(zipf_text(8)), 2)
    edited = base.replace(base.split()[100], "changed", 1)
    assert [doc for doc, _ in index.near(simhash64(edited))] == [1]


# --- Bloom negative cache ---------------------------------------------------------------------


def test_bloom_never_has_false_negatives_and_fp_rate_near_target() -> None:
    n = 100_000
    target = 0.01
    cache = BloomNegativeCache(n, target)
    keys = [f"https://h{i % 101}.example/p/{i}" for i in range(n)]
    cache.add_many(keys[: n // 2])
    for key in keys[n // 2 :]:
        cache.add(key)
    assert all(cache.might_contain(key) for key in keys)
    absent = [f"https://h{i % 101}.example/q/{i}" for i in range(n)]
    false_positives = sum(cache.might_contain(key) for key in absent)
    rate = false_positives / n
    assert target / 2 <= rate <= target * 2, rate
    assert cache.stats.lookups == 2 * n
    assert cache.stats.maybe_present == n + false_positives
    assert cache.stats.definitely_absent == n - false_positives
    assert not cache.saturated
    assert 0.9 * n <= cache.approx_items <= 1.1 * n


def test_bloom_stats_and_rebuild() -> None:
    cache = BloomNegativeCache(1000, 0.01)
    cache.add("a")
    assert cache.might_contain("a")
    cache.record_false_positive()
    assert cache.stats.false_positives == 1
    cache.rebuild(["x", "y"])
    assert cache.might_contain("x") and cache.might_contain("y")
    assert not cache.might_contain("a")  # a 1000-slot filter with 2 keys: no false positive
    cache.rebuild((f"k{i}" for i in range(5000)), expected_items=10_000)
    assert cache.expected_items == 10_000
    assert all(cache.might_contain(f"k{i}") for i in range(5000))
    stats = BloomStats(lookups=10, definitely_absent=9, maybe_present=1, false_positives=1)
    assert stats.observed_fp_rate == 0.1
    assert BloomStats().observed_fp_rate == 0.0
    with pytest.raises(ValueError):
        BloomNegativeCache(0)
    with pytest.raises(ValueError):
        BloomNegativeCache(10, 1.5)


def test_bloom_saturation_is_reported() -> None:
    cache = BloomNegativeCache(100, 0.01)
    cache.add_many(str(i) for i in range(1000))
    assert cache.saturated


def test_bloom_saving_experiment_is_sane() -> None:
    out = bloom_saving_experiment(10_000, 0.5, seed=1)
    assert out["lookups_without_bloom"] == 10_000
    assert out["distinct_urls"] + out["repeated_links"] == 10_000
    # Only repeats and false positives need a look-up.
    assert out["lookups_with_bloom"] == out["repeated_links"] + out["false_positives"]
    assert out["false_positives"] <= 0.02 * out["distinct_urls"]
    assert 0.45 <= out["saving"] <= 0.55
    assert out["saved_lookups"] == 10_000 - out["lookups_with_bloom"]
    # Deterministic apart from the false positives.
    again = bloom_saving_experiment(10_000, 0.5, seed=1)
    assert again["distinct_urls"] == out["distinct_urls"]
    # Extremes: nothing repeated -> almost every look-up saved; everything repeated -> none.
    assert bloom_saving_experiment(10_000, 0.0, seed=2)["saving"] >= 0.98
    assert bloom_saving_experiment(1_000, 1.0, seed=3)["distinct_urls"] == 1
    assert bloom_saving_experiment(0, 0.5, seed=4)["saving"] == 0.0


def test_bloom_saturation_via_single_adds_and_rebuild() -> None:
    cache = BloomNegativeCache(100, 0.01)
    for i in range(100):
        cache.add(f"k{i}")
    assert not cache.saturated  # fewer adds than the threshold: not even estimated
    for i in range(100, 1000):
        cache.add(f"k{i}")
    assert cache.saturated
    cache.rebuild([f"k{i}" for i in range(10)])
    assert not cache.saturated
    repeats = BloomNegativeCache(100, 0.01)
    for _ in range(50):
        repeats.add_many(["same"] * 10)  # 500 adds of one key: estimated, not saturated
        assert not repeats.saturated
