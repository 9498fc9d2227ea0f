/*
 * idemcrawl._simhash: the SimHash of idemcrawl.dedup.simhash64, natively.
 *
 * Why this exists: simhash64 was ~44% of a parser process's CPU (issue 17). The fingerprint is
 * part of the on-disk format (the simhash_blocks table), so this module computes exactly the
 * same int as the pure-Python code in dedup.py, which stays as the fallback when the extension
 * could not be built and as the reference the tests compare against:
 *
 *   features = lower-cased 3-word shingles joined by one space (single words when the text has
 *              fewer than 3 words); feature hash = XXH3-64, seed 0, of the UTF-8 bytes;
 *   bit b of the fingerprint = 1 when more than half of the feature occurrences have bit b set.
 *
 * XXH3-64 (seed 0, default secret) is implemented here for inputs of 0..240 bytes from the
 * published algorithm (xxHash's doc/xxhash_spec.md, version 0.2.0); a feature longer than
 * 240 bytes (only possible with words of ~80 characters) is hashed by calling back into the
 * Python xxhash.xxh3_64_intdigest, so the rarely used long-input algorithm is not duplicated.
 * The tests check this XXH3 against xxhash for every length 0..300.
 *
 * The words are laid out once in one buffer separated by single spaces, so every shingle is a
 * contiguous slice of it: no per-word or per-shingle objects and no copying per shingle.
 * Hashing runs with the GIL released (the input is copied first).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#define SHINGLE_WORDS 3

#if defined(__GNUC__) || defined(__clang__)
#define FORCE_INLINE static inline __attribute__((always_inline))
#else
#define FORCE_INLINE static inline
#endif
#define XXH3_SHORT_MAX 240

/* ------------------------------------------------------------------------------------------ */
/* XXH3-64, seed 0, inputs of 0..240 bytes (xxhash_spec.md, "XXH3 Algorithm Description") */

static const uint8_t kSecret[192] = {
    0xb8, 0xfe, 0x6c, 0x39, 0x23, 0xa4, 0x4b, 0xbe, 0x7c, 0x01, 0x81, 0x2c, 0xf7, 0x21, 0xad, 0x1c,
    0xde, 0xd4, 0x6d, 0xe9, 0x83, 0x90, 0x97, 0xdb, 0x72, 0x40, 0xa4, 0xa4, 0xb7, 0xb3, 0x67, 0x1f,
    0xcb, 0x79, 0xe6, 0x4e, 0xcc, 0xc0, 0xe5, 0x78, 0x82, 0x5a, 0xd0, 0x7d, 0xcc, 0xff, 0x72, 0x21,
    0xb8, 0x08, 0x46, 0x74, 0xf7, 0x43, 0x24, 0x8e, 0xe0, 0x35, 0x90, 0xe6, 0x81, 0x3a, 0x26, 0x4c,
    0x3c, 0x28, 0x52, 0xbb, 0x91, 0xc3, 0x00, 0xcb, 0x88, 0xd0, 0x65, 0x8b, 0x1b, 0x53, 0x2e, 0xa3,
    0x71, 0x64, 0x48, 0x97, 0xa2, 0x0d, 0xf9, 0x4e, 0x38, 0x19, 0xef, 0x46, 0xa9, 0xde, 0xac, 0xd8,
    0xa8, 0xfa, 0x76, 0x3f, 0xe3, 0x9c, 0x34, 0x3f, 0xf9, 0xdc, 0xbb, 0xc7, 0xc7, 0x0b, 0x4f, 0x1d,
    0x8a, 0x51, 0xe0, 0x4b, 0xcd, 0xb4, 0x59, 0x31, 0xc8, 0x9f, 0x7e, 0xc9, 0xd9, 0x78, 0x73, 0x64,
    0xea, 0xc5, 0xac, 0x83, 0x34, 0xd3, 0xeb, 0xc3, 0xc5, 0x81, 0xa0, 0xff, 0xfa, 0x13, 0x63, 0xeb,
    0x17, 0x0d, 0xdd, 0x51, 0xb7, 0xf0, 0xda, 0x49, 0xd3, 0x16, 0x55, 0x26, 0x29, 0xd4, 0x68, 0x9e,
    0x2b, 0x16, 0xbe, 0x58, 0x7d, 0x47, 0xa1, 0xfc, 0x8f, 0xf8, 0xb8, 0xd1, 0x7a, 0xd0, 0x31, 0xce,
    0x45, 0xcb, 0x3a, 0x8f, 0x95, 0x16, 0x04, 0x28, 0xaf, 0xd7, 0xfb, 0xca, 0xbb, 0x4b, 0x40, 0x7e,
};

#define PRIME32_1 0x9E3779B1U
#define PRIME32_2 0x85EBCA77U
#define PRIME32_3 0xC2B2AE3DU
#define PRIME64_1 0x9E3779B185EBCA87ULL
#define PRIME64_2 0xC2B2AE3D27D4EB4FULL
#define PRIME64_3 0x165667B19E3779F9ULL
#define PRIME64_4 0x85EBCA77C2B2AE63ULL
#define PRIME64_5 0x27D4EB2F165667C5ULL
#define PRIME_MX1 0x165667919E3779F9ULL
#define PRIME_MX2 0x9FB21C651E98DF25ULL

/* Little-endian reads on any platform (the spec reads input and secret little-endian); the
 * byte-by-byte form compiles to one load on little-endian machines. */
FORCE_INLINE uint32_t read32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) |
           ((uint32_t)p[3] << 24);
}

FORCE_INLINE uint64_t read64(const uint8_t *p) {
    return (uint64_t)read32(p) | ((uint64_t)read32(p + 4) << 32);
}

FORCE_INLINE uint64_t rotl64(uint64_t x, unsigned r) { return (x << r) | (x >> (64 - r)); }

FORCE_INLINE uint64_t bswap64(uint64_t x) {
    return ((x & 0x00000000000000FFULL) << 56) | ((x & 0x000000000000FF00ULL) << 40) |
           ((x & 0x0000000000FF0000ULL) << 24) | ((x & 0x00000000FF000000ULL) << 8) |
           ((x & 0x000000FF00000000ULL) >> 8) | ((x & 0x0000FF0000000000ULL) >> 24) |
           ((x & 0x00FF000000000000ULL) >> 40) | ((x & 0xFF00000000000000ULL) >> 56);
}

/* lowerHalf(a * b) xor higherHalf(a * b) of the full 128-bit product. */
FORCE_INLINE uint64_t mul128_fold64(uint64_t a, uint64_t b) {
#if defined(__SIZEOF_INT128__)
    __uint128_t product = (__uint128_t)a * b;
    return (uint64_t)product ^ (uint64_t)(product >> 64);
#else
    uint64_t lo_lo = (a & 0xFFFFFFFFULL) * (b & 0xFFFFFFFFULL);
    uint64_t hi_lo = (a >> 32) * (b & 0xFFFFFFFFULL);
    uint64_t lo_hi = (a & 0xFFFFFFFFULL) * (b >> 32);
    uint64_t hi_hi = (a >> 32) * (b >> 32);
    uint64_t cross = (lo_lo >> 32) + (hi_lo & 0xFFFFFFFFULL) + lo_hi;
    uint64_t upper = (hi_lo >> 32) + (cross >> 32) + hi_hi;
    uint64_t lower = (cross << 32) | (lo_lo & 0xFFFFFFFFULL);
    return lower ^ upper;
#endif
}

FORCE_INLINE uint64_t avalanche(uint64_t x) {
    x ^= x >> 37;
    x *= PRIME_MX1;
    x ^= x >> 32;
    return x;
}

FORCE_INLINE uint64_t avalanche_xxh64(uint64_t x) {
    x ^= x >> 33;
    x *= PRIME64_2;
    x ^= x >> 29;
    x *= PRIME64_3;
    x ^= x >> 32;
    return x;
}

/* mixStep with seed 0. */
FORCE_INLINE uint64_t mix16(const uint8_t *data, const uint8_t *secret) {
    return mul128_fold64(read64(data) ^ read64(secret), read64(data + 8) ^ read64(secret + 8));
}

/* XXH3_64bits(data, len) for len <= 240. */
FORCE_INLINE uint64_t xxh3_64_short(const uint8_t *p, size_t len) {
    if (len <= 16) {
        if (len > 8) {
            uint64_t low = (read64(kSecret + 24) ^ read64(kSecret + 32)) ^ read64(p);
            uint64_t high = (read64(kSecret + 40) ^ read64(kSecret + 48)) ^ read64(p + len - 8);
            return avalanche((uint64_t)len + bswap64(low) + high + mul128_fold64(low, high));
        }
        if (len >= 4) {
            uint64_t combined = (uint64_t)read32(p + len - 4) | ((uint64_t)read32(p) << 32);
            uint64_t value = (read64(kSecret + 8) ^ read64(kSecret + 16)) ^ combined;
            value ^= rotl64(value, 49) ^ rotl64(value, 24);
            value *= PRIME_MX2;
            value ^= (value >> 35) + (uint64_t)len;
            value *= PRIME_MX2;
            return value ^ (value >> 28);
        }
        if (len > 0) {
            uint32_t combined = (uint32_t)p[len - 1] | ((uint32_t)len << 8) |
                                ((uint32_t)p[0] << 16) | ((uint32_t)p[len >> 1] << 24);
            uint64_t value = (uint64_t)(read32(kSecret) ^ read32(kSecret + 4)) ^ combined;
            return avalanche_xxh64(value);
        }
        return avalanche_xxh64(read64(kSecret + 56) ^ read64(kSecret + 64));
    }
    uint64_t acc = (uint64_t)len * PRIME64_1;
    if (len <= 128) {
        if (len > 32) {
            if (len > 64) {
                if (len > 96) {
                    acc += mix16(p + 48, kSecret + 96);
                    acc += mix16(p + len - 64, kSecret + 112);
                }
                acc += mix16(p + 32, kSecret + 64);
                acc += mix16(p + len - 48, kSecret + 80);
            }
            acc += mix16(p + 16, kSecret + 32);
            acc += mix16(p + len - 32, kSecret + 48);
        }
        acc += mix16(p, kSecret);
        acc += mix16(p + len - 16, kSecret + 16);
        return avalanche(acc);
    }
    for (size_t i = 0; i < 8; i++) {
        acc += mix16(p + 16 * i, kSecret + 16 * i);
    }
    acc = avalanche(acc);
    size_t chunks = len >> 4;
    for (size_t i = 8; i < chunks; i++) {
        acc += mix16(p + 16 * i, kSecret + 16 * (i - 8) + 3);
    }
    acc += mix16(p + len - 16, kSecret + 119);
    return avalanche(acc);
}

/* ------------------------------------------------------------------------------------------ */
/* The bit majority */

/* Per-bit counts kept in SWAR lanes: nib[j] holds 16 four-bit counters, nibble k counting bit
 * 4k + j, so one feature costs four shift-mask-adds (a table lookup per byte, eight of them,
 * cost twice as many instructions). Every 15 features the nibbles move into byte counters
 * (byte m of bytes[j] counts bit 8m + j), every 255 features those into counts[64]. */
#define NIBBLE_MASK 0x1111111111111111ULL
#define LOW_NIBBLES 0x0F0F0F0F0F0F0F0FULL

typedef struct {
    uint64_t nib[4];     /* since the last nibble flush (at most 15 features) */
    uint64_t bytes[8];   /* since the last byte flush (at most 255 features) */
    uint64_t counts[64]; /* flushed per-bit counts */
    unsigned nib_pending;
    unsigned byte_pending;
    uint64_t features; /* all features added */
} BitVotes;

static void votes_flush_bytes(BitVotes *v) {
    for (int j = 0; j < 8; j++) {
        for (int m = 0; m < 8; m++) {
            v->counts[8 * m + j] += (v->bytes[j] >> (8 * m)) & 0xFF;
        }
        v->bytes[j] = 0;
    }
    v->byte_pending = 0;
}

static void votes_flush_nibbles(BitVotes *v) {
    for (int j = 0; j < 4; j++) {
        /* nibble 2m counts bit 8m + j, nibble 2m + 1 counts bit 8m + 4 + j */
        v->bytes[j] += v->nib[j] & LOW_NIBBLES;
        v->bytes[4 + j] += (v->nib[j] >> 4) & LOW_NIBBLES;
        v->nib[j] = 0;
    }
    v->byte_pending += v->nib_pending;
    v->nib_pending = 0;
    if (v->byte_pending > 255 - 15) {
        votes_flush_bytes(v);
    }
}

static void votes_flush(BitVotes *v) {
    votes_flush_nibbles(v);
    votes_flush_bytes(v);
}

FORCE_INLINE void votes_add(BitVotes *v, uint64_t h) {
    v->nib[0] += h & NIBBLE_MASK;
    v->nib[1] += (h >> 1) & NIBBLE_MASK;
    v->nib[2] += (h >> 2) & NIBBLE_MASK;
    v->nib[3] += (h >> 3) & NIBBLE_MASK;
    v->features++;
    if (++v->nib_pending == 15) {
        votes_flush_nibbles(v);
    }
}

static uint64_t votes_result(BitVotes *v) {
    votes_flush(v);
    uint64_t fp = 0;
    for (int b = 0; b < 64; b++) {
        if (2 * v->counts[b] > v->features) {
            fp |= 1ULL << b;
        }
    }
    return fp;
}

/* ------------------------------------------------------------------------------------------ */
/* Words laid out as "w0 w1 w2 ...": word i is buf[starts[i] : starts[i + 1] - 1] (starts has
 * nwords + 1 entries, starts[nwords] = length + 1), a shingle of words i..i+2 is
 * buf[starts[i] : starts[i + 3] - 1], exactly b" ".join of the three words. */

typedef struct {
    char *buf;
    Py_ssize_t *starts;
    Py_ssize_t nwords;
} Words;

static void words_free(Words *w) {
    PyMem_Free(w->buf);
    PyMem_Free(w->starts);
    w->buf = NULL;
    w->starts = NULL;
}

static PyObject *xxh3_fallback; /* xxhash.xxh3_64_intdigest, for features over 240 bytes */

/* Hash every feature into votes. Features over 240 bytes are skipped and their indexes written
 * to long_out (the caller hashes those with the GIL held); returns how many there were.
 * Needs no Python object: runs with the GIL released. */
static Py_ssize_t hash_features(const Words *w, BitVotes *votes, Py_ssize_t *long_out) {
    Py_ssize_t span = w->nwords < SHINGLE_WORDS ? 1 : SHINGLE_WORDS;
    Py_ssize_t nfeatures = w->nwords - span + 1;
    Py_ssize_t nlong = 0;
    const uint8_t *buf = (const uint8_t *)w->buf;
    for (Py_ssize_t i = 0; i < nfeatures; i++) {
        Py_ssize_t start = w->starts[i];
        size_t len = (size_t)(w->starts[i + span] - 1 - start);
        if (len <= XXH3_SHORT_MAX) {
            votes_add(votes, xxh3_64_short(buf + start, len));
        } else {
            long_out[nlong++] = i;
        }
    }
    return nlong;
}

/* The fingerprint of w; -1 with an exception set on failure (fp itself goes to *out). */
static int simhash_words_fp(const Words *w, uint64_t *out) {
    BitVotes votes;
    memset(&votes, 0, sizeof votes);
    if (w->nwords == 0) {
        *out = 0;
        return 0;
    }
    Py_ssize_t span = w->nwords < SHINGLE_WORDS ? 1 : SHINGLE_WORDS;
    Py_ssize_t nfeatures = w->nwords - span + 1;
    Py_ssize_t *long_idx = PyMem_Malloc(sizeof(Py_ssize_t) * (size_t)nfeatures);
    if (long_idx == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    Py_ssize_t nlong;
    Py_BEGIN_ALLOW_THREADS
    nlong = hash_features(w, &votes, long_idx);
    Py_END_ALLOW_THREADS
    for (Py_ssize_t n = 0; n < nlong; n++) {
        Py_ssize_t i = long_idx[n];
        Py_ssize_t start = w->starts[i];
        Py_ssize_t len = w->starts[i + span] - 1 - start;
        PyObject *feature = PyBytes_FromStringAndSize(w->buf + start, len);
        if (feature == NULL) {
            PyMem_Free(long_idx);
            return -1;
        }
        PyObject *digest = PyObject_CallOneArg(xxh3_fallback, feature);
        Py_DECREF(feature);
        if (digest == NULL) {
            PyMem_Free(long_idx);
            return -1;
        }
        unsigned long long h = PyLong_AsUnsignedLongLong(digest);
        Py_DECREF(digest);
        if (h == (unsigned long long)-1 && PyErr_Occurred()) {
            PyMem_Free(long_idx);
            return -1;
        }
        votes_add(&votes, (uint64_t)h);
    }
    PyMem_Free(long_idx);
    *out = votes_result(&votes);
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* Python functions */

/* The ASCII tokeniser of dedup.simhash64: [A-Za-z0-9_] are word bytes (lower-cased), every
 * other byte separates words, like bytes.translate(_ASCII_WORDS_LOWER).split(). */
static uint8_t kAsciiLower[256]; /* ' ' for a separator, else the lower-cased byte */

static void init_ascii(void) {
    for (unsigned c = 0; c < 256; c++) {
        uint8_t out = ' ';
        if ((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || c == '_') {
            out = (uint8_t)c;
        } else if (c >= 'A' && c <= 'Z') {
            out = (uint8_t)(c - 'A' + 'a');
        }
        kAsciiLower[c] = out;
    }
}

/* 64 bytes of text into out (word bytes lower-cased, the others spaces); returns the mask of
 * the word bytes (bit k for byte k). */
#if defined(__SSE2__)
FORCE_INLINE unsigned classify16(const uint8_t *in, uint8_t *out) {
    /* x in [lo, lo + range) as one signed compare: (x + 128 - lo) as int8 < range - 128 */
    __m128i v = _mm_loadu_si128((const __m128i *)in);
    __m128i case_bit = _mm_set1_epi8(0x20);
    __m128i folded = _mm_or_si128(v, case_bit);
    __m128i letter = _mm_cmplt_epi8(_mm_add_epi8(folded, _mm_set1_epi8((char)(128 - 'a'))),
                                    _mm_set1_epi8((char)(26 - 128)));
    __m128i digit = _mm_cmplt_epi8(_mm_add_epi8(v, _mm_set1_epi8((char)(128 - '0'))),
                                   _mm_set1_epi8((char)(10 - 128)));
    __m128i word = _mm_or_si128(_mm_or_si128(letter, digit),
                                _mm_cmpeq_epi8(v, _mm_set1_epi8('_')));
    __m128i lowered = _mm_or_si128(v, _mm_and_si128(letter, case_bit));
    __m128i res = _mm_or_si128(_mm_and_si128(word, lowered),
                               _mm_andnot_si128(word, _mm_set1_epi8(' ')));
    _mm_storeu_si128((__m128i *)out, res);
    return (unsigned)_mm_movemask_epi8(word);
}
#endif

FORCE_INLINE uint64_t classify64(const uint8_t *in, uint8_t *out) {
#if defined(__SSE2__)
    return (uint64_t)classify16(in, out) | ((uint64_t)classify16(in + 16, out + 16) << 16) |
           ((uint64_t)classify16(in + 32, out + 32) << 32) |
           ((uint64_t)classify16(in + 48, out + 48) << 48);
#else
    uint64_t mask = 0;
    for (int k = 0; k < 64; k++) {
        uint8_t c = kAsciiLower[in[k]];
        out[k] = c;
        mask |= (uint64_t)(c != ' ') << k;
    }
    return mask;
#endif
}

FORCE_INLINE int lowest_bit(uint64_t x) {
#if defined(__GNUC__) || defined(__clang__)
    return __builtin_ctzll(x);
#else
    int k = 0;
    while (!(x & 1)) {
        x >>= 1;
        k++;
    }
    return k;
#endif
}

/* Fill w from n ASCII bytes. Runs without the GIL. 0, or -1 when out of memory.
 *
 * 64 bytes at a time: classify64 maps them (SSE2: 16 at once) into a scratch copy and gives
 * the mask of word bytes; a word starts at a 1 after a 0 and ends at a 0 after a 1, found by
 * bit scans; then each word is copied into w->buf (16 bytes at a time) with one space after
 * it. ~1 instruction a byte plus ~20 a word, against ~14 a byte for the byte-by-byte loop it
 * replaces (issue 17: that tokeniser was ~180,000 instructions of a bench page). */
static int tokenise_ascii(const uint8_t *text, Py_ssize_t n, Words *w) {
    size_t padded = ((size_t)n + 63) & ~(size_t)63;
    size_t max_words = (size_t)(n + 1) / 2 + 1;
    /* 16 bytes of slack after each buffer: words are copied in 16-byte pieces */
    uint8_t *mapped = PyMem_RawMalloc(padded + 16);
    Py_ssize_t *ends = PyMem_RawMalloc(sizeof(Py_ssize_t) * max_words);
    w->buf = PyMem_RawMalloc((size_t)n + 2 + 16);
    w->starts = PyMem_RawMalloc(sizeof(Py_ssize_t) * max_words);
    if (mapped == NULL || ends == NULL || w->buf == NULL || w->starts == NULL) {
        PyMem_RawFree(mapped);
        PyMem_RawFree(ends);
        return -1;
    }
    Py_ssize_t *starts = w->starts;
    Py_ssize_t nstarts = 0, nends = 0;
    uint64_t carry = 0; /* 1 when the byte before this block is a word byte */
    for (size_t base = 0; base < padded; base += 64) {
        uint64_t mask;
        if (base + 64 <= (size_t)n) {
            mask = classify64(text + base, mapped + base);
        } else { /* the tail, padded with separators */
            uint8_t tail[64];
            memset(tail, ' ', sizeof tail);
            memcpy(tail, text + base, (size_t)n - base);
            mask = classify64(tail, mapped + base);
        }
        uint64_t before = (mask << 1) | carry; /* bit k: byte k - 1 is a word byte */
        uint64_t begin = mask & ~before;
        uint64_t end = ~mask & before;
        carry = mask >> 63;
        while (begin) {
            starts[nstarts++] = (Py_ssize_t)base + lowest_bit(begin);
            begin &= begin - 1;
        }
        while (end) {
            ends[nends++] = (Py_ssize_t)base + lowest_bit(end);
            end &= end - 1;
        }
    }
    if (nends < nstarts) { /* the text ends inside a word at a block boundary */
        ends[nends++] = n;
    }
    /* The compact layout: word k moves to out (never right of where it was), a space after. */
    uint8_t *buf = (uint8_t *)w->buf;
    Py_ssize_t out = 0;
    for (Py_ssize_t k = 0; k < nstarts; k++) {
        Py_ssize_t from = starts[k], len = ends[k] - from;
        starts[k] = out;
        for (Py_ssize_t i = 0; i < len; i += 16) { /* may copy past the word: slack */
#if defined(__SSE2__)
            _mm_storeu_si128((__m128i *)(buf + out + i),
                             _mm_loadu_si128((const __m128i *)(mapped + from + i)));
#else
            memcpy(buf + out + i, mapped + from + i, 16);
#endif
        }
        out += len;
        buf[out++] = ' ';
    }
    starts[nstarts] = out; /* one past the last word's trailing space: length + 1 */
    w->nwords = nstarts;
    PyMem_RawFree(mapped);
    PyMem_RawFree(ends);
    return 0;
}

static void words_raw_free(Words *w) {
    PyMem_RawFree(w->buf);
    PyMem_RawFree(w->starts);
}

/* 1 when text is a str ready for its data macros, else 0 with TypeError set (name: the
 * calling function's, for the message). */
static int ready_str(PyObject *text, const char *name) {
    if (!PyUnicode_Check(text)) {
        PyErr_Format(PyExc_TypeError, "%s() argument must be str, not %.100s", name,
                     Py_TYPE(text)->tp_name);
        return 0;
    }
#if PY_VERSION_HEX < 0x030C0000
    if (PyUnicode_READY(text) < 0) {
        return 0;
    }
#endif
    return 1;
}

PyDoc_STRVAR(simhash_ascii_doc,
"simhash_ascii(text: str, /) -> int\n\n"
"simhash64(text) for an ASCII str, tokenised here (word characters [A-Za-z0-9_],\n"
"lower-cased) without building a Python object per word. ValueError if text is not ASCII.");

static PyObject *simhash_ascii(PyObject *module, PyObject *text) {
    if (!ready_str(text, "simhash_ascii")) {
        return NULL;
    }
    if (!PyUnicode_IS_ASCII(text)) {
        PyErr_SetString(PyExc_ValueError, "simhash_ascii() needs an ASCII str");
        return NULL;
    }
    const uint8_t *data = PyUnicode_1BYTE_DATA(text);
    Py_ssize_t n = PyUnicode_GET_LENGTH(text);
    Words w = {NULL, NULL, 0};
    int rc;
    /* The str is immutable and kept alive by the caller, so it can be read without the GIL. */
    Py_BEGIN_ALLOW_THREADS
    rc = tokenise_ascii(data, n, &w);
    Py_END_ALLOW_THREADS
    if (rc < 0) {
        words_raw_free(&w);
        return PyErr_NoMemory();
    }
    uint64_t fp = 0;
    rc = simhash_words_fp(&w, &fp);
    words_raw_free(&w);
    if (rc < 0) {
        return NULL;
    }
    return PyLong_FromUnsignedLongLong(fp);
}

PyDoc_STRVAR(simhash_words_doc,
"simhash_words(words: list[str | bytes], /) -> int\n\n"
"The SimHash of already tokenised, already lower-cased words: features are the 3-word\n"
"shingles (the words themselves when there are fewer than 3) as UTF-8 bytes joined by one\n"
"space, each hashed with XXH3-64, then the per-bit majority. Bytes are taken as they are.");

static PyObject *simhash_words(PyObject *module, PyObject *arg) {
    PyObject *seq = PySequence_Fast(arg, "simhash_words() argument must be a sequence");
    if (seq == NULL) {
        return NULL;
    }
    Py_ssize_t nwords = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    Words w = {NULL, NULL, 0};
    /* First pass: the total length, checking types and encoding str as UTF-8 once (CPython
     * keeps it on the str, so the second pass costs nothing). */
    Py_ssize_t total = 0;
    for (Py_ssize_t i = 0; i < nwords; i++) {
        PyObject *item = items[i];
        Py_ssize_t len;
        if (PyBytes_Check(item)) {
            len = PyBytes_GET_SIZE(item);
        } else if (PyUnicode_Check(item)) {
            if (PyUnicode_AsUTF8AndSize(item, &len) == NULL) {
                Py_DECREF(seq);
                return NULL;
            }
        } else {
            PyErr_Format(PyExc_TypeError, "simhash_words() items must be str or bytes, not %.100s",
                         Py_TYPE(item)->tp_name);
            Py_DECREF(seq);
            return NULL;
        }
        total += len + 1;
    }
    w.buf = PyMem_Malloc((size_t)total + 1);
    w.starts = PyMem_Malloc(sizeof(Py_ssize_t) * ((size_t)nwords + 1));
    if (w.buf == NULL || w.starts == NULL) {
        words_free(&w);
        Py_DECREF(seq);
        return PyErr_NoMemory();
    }
    Py_ssize_t out = 0;
    for (Py_ssize_t i = 0; i < nwords; i++) {
        PyObject *item = items[i];
        const char *data;
        Py_ssize_t len;
        if (PyBytes_Check(item)) {
            data = PyBytes_AS_STRING(item);
            len = PyBytes_GET_SIZE(item);
        } else {
            data = PyUnicode_AsUTF8AndSize(item, &len);
        }
        if (i > 0) {
            w.buf[out++] = ' ';
        }
        w.starts[i] = out;
        memcpy(w.buf + out, data, (size_t)len);
        out += len;
    }
    w.starts[nwords] = out + 1;
    w.nwords = nwords;
    Py_DECREF(seq);
    uint64_t fp = 0;
    int rc = simhash_words_fp(&w, &fp);
    words_free(&w);
    if (rc < 0) {
        return NULL;
    }
    return PyLong_FromUnsignedLongLong(fp);
}

PyDoc_STRVAR(may_hide_text_doc,
"may_hide_text(html: str, /) -> bool\n\n"
"False when html has no '<script', '<style', '<noscript' or '<template' (ASCII case ignored):\n"
"then its tree has none of dedup's invisible elements, which can only come from such a start\n"
"tag, and stripping them would change nothing. True otherwise, and for any str that is not\n"
"one byte per character (not scanned).");

static int has_prefix_ci(const uint8_t *p, const uint8_t *end, const char *lower) {
    for (; *lower; lower++, p++) {
        if (p >= end || (uint8_t)(*p | 0x20) != (uint8_t)*lower) {
            return 0;
        }
    }
    return 1;
}

static PyObject *may_hide_text(PyObject *module, PyObject *text) {
    if (!ready_str(text, "may_hide_text")) {
        return NULL;
    }
    if (PyUnicode_KIND(text) != PyUnicode_1BYTE_KIND) {
        Py_RETURN_TRUE;
    }
    const uint8_t *p = PyUnicode_1BYTE_DATA(text);
    const uint8_t *end = p + PyUnicode_GET_LENGTH(text);
    /* '|0x20' folds ASCII upper case onto lower case; no other byte of these one-byte strs
     * folds onto the ASCII letters of the names (0xC0-0xFF fold onto 0xE0-0xFF). */
    while ((p = memchr(p, '<', (size_t)(end - p))) != NULL) {
        p++;
        if (has_prefix_ci(p, end, "script") || has_prefix_ci(p, end, "style") ||
            has_prefix_ci(p, end, "noscript") || has_prefix_ci(p, end, "template")) {
            Py_RETURN_TRUE;
        }
    }
    Py_RETURN_FALSE;
}

PyDoc_STRVAR(xxh3_64_doc,
"xxh3_64(data: bytes, /) -> int\n\n"
"XXH3-64 (seed 0) of data, the feature hash; inputs over 240 bytes go to\n"
"xxhash.xxh3_64_intdigest. For the tests, which compare it with xxhash.");

static PyObject *xxh3_64(PyObject *module, PyObject *arg) {
    if (!PyBytes_Check(arg)) {
        PyErr_Format(PyExc_TypeError, "xxh3_64() argument must be bytes, not %.100s",
                     Py_TYPE(arg)->tp_name);
        return NULL;
    }
    Py_ssize_t len = PyBytes_GET_SIZE(arg);
    if (len > XXH3_SHORT_MAX) {
        return PyObject_CallOneArg(xxh3_fallback, arg);
    }
    return PyLong_FromUnsignedLongLong(
        xxh3_64_short((const uint8_t *)PyBytes_AS_STRING(arg), (size_t)len));
}

PyDoc_STRVAR(within_doc,
"within(fp: int, fps: array('Q'), k: int, /) -> list[int]\n\n"
"The indices i of fps with popcount(fps[i] ^ fp) <= k, in order: the near-duplicate index's\n"
"bucket scan (dedup.SimHashIndex.near), one pass over the array's buffer.");

static PyObject *within(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_Format(PyExc_TypeError, "within() takes 3 arguments, not %zd", nargs);
        return NULL;
    }
    uint64_t fp = PyLong_AsUnsignedLongLong(args[0]);
    if (fp == (uint64_t)-1 && PyErr_Occurred()) {
        return NULL;
    }
    long k = PyLong_AsLong(args[2]);
    if (k == -1 && PyErr_Occurred()) {
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(args[1], &view, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0) {
        return NULL;
    }
    if (view.itemsize != 8 || view.format == NULL || strcmp(view.format, "Q") != 0) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_TypeError, "within() needs an array('Q') of fingerprints");
        return NULL;
    }
    const uint64_t *items = (const uint64_t *)view.buf;
    Py_ssize_t n = view.len / 8;
    PyObject *out = PyList_New(0);
    if (out == NULL) {
        PyBuffer_Release(&view);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        uint64_t x = items[i] ^ fp;
        long bits = 0;
        while (x) { /* Kernighan: one step per set bit, and a match has at most k of them */
            x &= x - 1;
            if (++bits > k) {
                break;
            }
        }
        if (bits <= k) {
            PyObject *index = PyLong_FromSsize_t(i);
            if (index == NULL || PyList_Append(out, index) < 0) {
                Py_XDECREF(index);
                Py_DECREF(out);
                PyBuffer_Release(&view);
                return NULL;
            }
            Py_DECREF(index);
        }
    }
    PyBuffer_Release(&view);
    return out;
}

PyDoc_STRVAR(nearest_doc,
"nearest(fp: int, fps: array('Q'), ids: list[int], k: int, exclude: int | None, best, /)\n"
"    -> tuple[int, int] | None\n\n"
"The nearest entry of one bucket as (distance, doc id): the smallest popcount(fps[i] ^ fp) <= k,\n"
"ties to the smallest doc id, skipping entries whose doc id equals exclude; best is the\n"
"(distance, doc id) found in the earlier buckets or None, returned when nothing here beats it.\n"
"dedup.SimHashIndex.nearest calls it once per block: no list of matches is built.");

static PyObject *nearest(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6) {
        PyErr_Format(PyExc_TypeError, "nearest() takes 6 arguments, not %zd", nargs);
        return NULL;
    }
    uint64_t fp = PyLong_AsUnsignedLongLong(args[0]);
    if (fp == (uint64_t)-1 && PyErr_Occurred()) {
        return NULL;
    }
    PyObject *ids = args[2];
    if (!PyList_Check(ids)) {
        PyErr_SetString(PyExc_TypeError, "nearest() needs a list of doc ids");
        return NULL;
    }
    long k = PyLong_AsLong(args[3]);
    if (k == -1 && PyErr_Occurred()) {
        return NULL;
    }
    PyObject *exclude = args[4];
    PyObject *best = args[5];
    long best_bits = k + 1;
    PyObject *best_id = NULL; /* borrowed */
    if (best != Py_None) {
        if (!PyTuple_Check(best) || PyTuple_GET_SIZE(best) != 2) {
            PyErr_SetString(PyExc_TypeError, "nearest() needs best as (distance, doc id) or None");
            return NULL;
        }
        best_bits = PyLong_AsLong(PyTuple_GET_ITEM(best, 0));
        if (best_bits == -1 && PyErr_Occurred()) {
            return NULL;
        }
        best_id = PyTuple_GET_ITEM(best, 1);
    }
    Py_buffer view;
    if (PyObject_GetBuffer(args[1], &view, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0) {
        return NULL;
    }
    if (view.itemsize != 8 || view.format == NULL || strcmp(view.format, "Q") != 0) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_TypeError, "nearest() needs an array('Q') of fingerprints");
        return NULL;
    }
    const uint64_t *items = (const uint64_t *)view.buf;
    Py_ssize_t n = view.len / 8;
    if (PyList_GET_SIZE(ids) < n) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "nearest() needs a doc id for every fingerprint");
        return NULL;
    }
    int found = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        long bits = __builtin_popcountll(items[i] ^ fp);
        if (bits > k || bits > best_bits) {
            continue;
        }
        PyObject *id = PyList_GET_ITEM(ids, i);
        if (exclude != Py_None) {
            int same = PyObject_RichCompareBool(id, exclude, Py_EQ);
            if (same < 0) {
                PyBuffer_Release(&view);
                return NULL;
            }
            if (same) {
                continue;
            }
        }
        if (bits == best_bits && best_id != NULL) {
            int less = PyObject_RichCompareBool(id, best_id, Py_LT);
            if (less < 0) {
                PyBuffer_Release(&view);
                return NULL;
            }
            if (!less) {
                continue;
            }
        }
        best_bits = bits;
        best_id = id;
        found = 1;
    }
    PyBuffer_Release(&view);
    if (!found) {
        return Py_NewRef(best);
    }
    return Py_BuildValue("(lO)", best_bits, best_id);
}

static PyMethodDef simhash_methods[] = {
    {"may_hide_text", (PyCFunction)may_hide_text, METH_O, may_hide_text_doc},
    {"simhash_ascii", simhash_ascii, METH_O, simhash_ascii_doc},
    {"simhash_words", simhash_words, METH_O, simhash_words_doc},
    {"xxh3_64", xxh3_64, METH_O, xxh3_64_doc},
    {"within", (PyCFunction)(void (*)(void))within, METH_FASTCALL, within_doc},
    {"nearest", (PyCFunction)(void (*)(void))nearest, METH_FASTCALL, nearest_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef simhash_module = {
    PyModuleDef_HEAD_INIT,
    "idemcrawl._simhash",
    "Native SimHash for idemcrawl.dedup (same fingerprints as the pure-Python code).",
    -1,
    simhash_methods,
    NULL,
    NULL,
    NULL,
    NULL,
};

PyMODINIT_FUNC PyInit__simhash(void) {
    init_ascii();
    if (xxh3_fallback == NULL) {
        PyObject *xxhash = PyImport_ImportModule("xxhash");
        if (xxhash == NULL) {
            return NULL;
        }
        xxh3_fallback = PyObject_GetAttrString(xxhash, "xxh3_64_intdigest");
        Py_DECREF(xxhash);
        if (xxh3_fallback == NULL) {
            return NULL;
        }
    }
    return PyModule_Create(&simhash_module);
}
