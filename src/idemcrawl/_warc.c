/*
 * idemcrawl._warc: the WARC/1.1 records of an exchange, natively (issue 17).
 *
 * Why this exists: with the archive on, a parser process builds every page's exchange
 * (warc_records.build_exchange) and both of the machine's cores are saturated, so every
 * instruction the archive spends is pages per second. After SHA-1 and the gzip members, what
 * was left was Python building a few dozen short strings per exchange: the HTTP heads
 * (stored_headers, http_head, request_head's urlsplit), the three record heads, four Base32
 * digests and three record ids. This module writes the same bytes in one pass each.
 *
 * Same bytes, not similar ones: warc_records.py keeps the pure-Python builder as the fallback
 * (no C compiler) and as the reference tests/test_warc_native.py compares against byte for
 * byte (non-ASCII and CR/LF header fields, bytes header pairs, a truncated body, a POST, an
 * IP address, seeded record ids). Where an input is unusual in a way whose Python handling is
 * not reproduced here (a header that is neither a (str, str) nor a (bytes, bytes) pair, a URL
 * that is not a plain http(s) one, a non-ASCII method or HTTP version), the head functions
 * return None and the caller builds that head in Python.
 *
 * SHA-1 is hashlib.sha1 (OpenSSL: SHA-NI where the CPU has it) called from here; compression
 * stays with the caller (ISA-L or zlib by level, one gzip member per record).
 *
 * Field encoding, as warc_records.http_head: a text field is written latin-1 when every
 * character fits (the fetcher decodes received headers as latin-1, so this restores the bytes
 * received), else UTF-8 (surrogates raise UnicodeEncodeError, as str.encode does); a bytes
 * field is written as is; a CR or LF inside any field becomes a space, so no header line can
 * be forged. Record heads are UTF-8 (warc_records.record's head.encode()).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

/* hashlib.sha1 and the method names called on its objects (set once at import). */
static PyObject *sha1_new = NULL;
static PyObject *str_update = NULL;
static PyObject *str_digest = NULL;

/* ------------------------------------------------------------------------------------------ */
/* A growing byte buffer. */

typedef struct {
    char *p;
    Py_ssize_t n;
    Py_ssize_t cap;
} Buf;

static int buf_reserve(Buf *b, Py_ssize_t extra) {
    if (b->n + extra <= b->cap) {
        return 0;
    }
    Py_ssize_t cap = b->cap ? b->cap : 512;
    while (cap < b->n + extra) {
        cap *= 2;
    }
    char *p = PyMem_Realloc(b->p, (size_t)cap);
    if (p == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    b->p = p;
    b->cap = cap;
    return 0;
}

static int buf_put(Buf *b, const char *s, Py_ssize_t n) {
    if (buf_reserve(b, n) < 0) {
        return -1;
    }
    memcpy(b->p + b->n, s, (size_t)n);
    b->n += n;
    return 0;
}

#define BUF_LIT(b, s) buf_put((b), (s), (Py_ssize_t)(sizeof(s) - 1))

/* s with every CR and LF written as a space (warc_records.field). */
static int buf_put_field(Buf *b, const char *s, Py_ssize_t n) {
    if (buf_reserve(b, n) < 0) {
        return -1;
    }
    char *out = b->p + b->n;
    memcpy(out, s, (size_t)n);
    for (Py_ssize_t i = 0; i < n; i++) {
        if (out[i] == '\r' || out[i] == '\n') {
            out[i] = ' ';
        }
    }
    b->n += n;
    return 0;
}

static int buf_put_decimal(Buf *b, Py_ssize_t v) {
    char tmp[32];
    int len = snprintf(tmp, sizeof tmp, "%zd", v);
    return buf_put(b, tmp, len);
}

/* ------------------------------------------------------------------------------------------ */
/* Fields. */

/* The bytes of a text field as http_head writes it: latin-1 when every character fits (then
 * the string's own storage is those bytes), else UTF-8. */
static const char *http_text(PyObject *s, Py_ssize_t *n) {
#if PY_VERSION_HEX < 0x030C0000
    if (PyUnicode_READY(s) < 0) {
        return NULL;
    }
#endif
    if (PyUnicode_KIND(s) == PyUnicode_1BYTE_KIND) {
        *n = PyUnicode_GET_LENGTH(s);
        return (const char *)PyUnicode_1BYTE_DATA(s);
    }
    return PyUnicode_AsUTF8AndSize(s, n);
}

/* One HTTP head field (str or bytes, checked by the caller), CR/LF as spaces. */
static int put_http_field(Buf *b, PyObject *o) {
    Py_ssize_t n;
    const char *s;
    if (PyBytes_Check(o)) {
        s = PyBytes_AS_STRING(o);
        n = PyBytes_GET_SIZE(o);
    } else {
        s = http_text(o, &n);
        if (s == NULL) {
            return -1;
        }
    }
    return buf_put_field(b, s, n);
}

/* A record head's field value: UTF-8 (strict). */
static int put_utf8(Buf *b, PyObject *o, int as_field) {
    Py_ssize_t n;
    const char *s = PyUnicode_AsUTF8AndSize(o, &n);
    if (s == NULL) {
        return -1;
    }
    return as_field ? buf_put_field(b, s, n) : buf_put(b, s, n);
}

/* ASCII bytes of a str whose characters are all ASCII, else NULL (no error set). */
static const char *ascii_of(PyObject *o, Py_ssize_t *n) {
    if (!PyUnicode_Check(o)) {
        return NULL;
    }
#if PY_VERSION_HEX < 0x030C0000
    if (PyUnicode_READY(o) < 0) {
        PyErr_Clear();
        return NULL;
    }
#endif
    if (!PyUnicode_IS_ASCII(o)) {
        return NULL;
    }
    *n = PyUnicode_GET_LENGTH(o);
    return (const char *)PyUnicode_1BYTE_DATA(o);
}

/* The name's characters when it is str with 1-byte storage, or bytes (what str.lower() can
 * map onto an ASCII name: a wider character never lowers to one of the names compared here,
 * which have no 'k'); else NULL. */
static const char *narrow_name(PyObject *o, Py_ssize_t *n) {
    if (PyBytes_Check(o)) {
        *n = PyBytes_GET_SIZE(o);
        return PyBytes_AS_STRING(o);
    }
#if PY_VERSION_HEX < 0x030C0000
    if (PyUnicode_READY(o) < 0) {
        PyErr_Clear();
        return NULL;
    }
#endif
    if (PyUnicode_KIND(o) != PyUnicode_1BYTE_KIND) {
        return NULL;
    }
    *n = PyUnicode_GET_LENGTH(o);
    return (const char *)PyUnicode_1BYTE_DATA(o);
}

/* s (n bytes) equals the lower-case ASCII word, ignoring ASCII case. */
static int is_word(const char *s, Py_ssize_t n, const char *word) {
    size_t len = strlen(word);
    if (n != (Py_ssize_t)len) {
        return 0;
    }
    for (size_t i = 0; i < len; i++) {
        char c = s[i];
        if (c >= 'A' && c <= 'Z') {
            c = (char)(c + 32);
        }
        if (c != word[i]) {
            return 0;
        }
    }
    return 1;
}

/* headers as a list or tuple of (name, value) pairs all str, or all bytes when bytes_ok: the
 * pair items are stored in names/values (borrowed); returns the count, -2 when the headers are
 * not such pairs (the caller falls back to Python), -1 on error. */
static Py_ssize_t header_pairs(PyObject *headers, int bytes_ok, PyObject ***names,
                               PyObject ***values, int *as_bytes) {
    if (!PyList_Check(headers) && !PyTuple_Check(headers)) {
        return -2;
    }
    Py_ssize_t count = PySequence_Fast_GET_SIZE(headers);
    PyObject **items = PySequence_Fast_ITEMS(headers);
    *names = PyMem_Malloc(sizeof(PyObject *) * (size_t)(count ? 2 * count : 1));
    if (*names == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    *values = *names + count;
    *as_bytes = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *pair = items[i];
        if (!(PyTuple_Check(pair) || PyList_Check(pair)) || PySequence_Fast_GET_SIZE(pair) != 2) {
            goto fallback;
        }
        PyObject *name = PySequence_Fast_GET_ITEM(pair, 0);
        PyObject *value = PySequence_Fast_GET_ITEM(pair, 1);
        int b = PyBytes_Check(name);
        if (i == 0) {
            *as_bytes = b;
        }
        if (b) {
            if (!bytes_ok || !*as_bytes || !PyBytes_Check(value)) {
                goto fallback;
            }
        } else if (*as_bytes || !PyUnicode_CheckExact(name) || !PyUnicode_CheckExact(value)) {
            goto fallback;
        }
        (*names)[i] = name;
        (*values)[i] = value;
    }
    return count;
fallback:
    PyMem_Free(*names);
    *names = NULL;
    return -2;
}

/* ------------------------------------------------------------------------------------------ */
/* response_head */

PyDoc_STRVAR(response_head_doc,
"response_head(start_line: str, headers: Sequence, body_length: int, keep_encoding: bool, /)\n"
"    -> tuple[bytes, list[list[str]]] | None\n\n"
"warc_records.http_head(start_line, stored) with stored, original = stored_headers(headers,\n"
"body_length, keep_encoding=keep_encoding): the HTTP head stored next to a decoded body and\n"
"the renamed originals (text: bytes pairs are decoded as latin-1). headers: (str, str) or\n"
"(bytes, bytes) pairs as received; None for anything else (the caller uses Python).");

static const char *const kRewritten[] = {"content-encoding", "transfer-encoding",
                                         "content-length"};

static PyObject *response_head(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "response_head() takes exactly 4 arguments");
        return NULL;
    }
    PyObject *start = args[0];
    if (!PyUnicode_Check(start)) {
        Py_RETURN_NONE;
    }
    Py_ssize_t body_length = PyLong_AsSsize_t(args[2]);
    if (body_length == -1 && PyErr_Occurred()) {
        return NULL;
    }
    int keep_encoding = PyObject_IsTrue(args[3]);
    if (keep_encoding < 0) {
        return NULL;
    }
    PyObject **names, **values;
    int as_bytes;
    Py_ssize_t count = header_pairs(args[1], 1, &names, &values, &as_bytes);
    if (count == -1) {
        return NULL;
    }
    if (count == -2) {
        Py_RETURN_NONE;
    }
    Buf b = {NULL, 0, 0};
    PyObject *original = PyList_New(0);
    PyObject *head = NULL;
    if (original == NULL || put_http_field(&b, start) < 0 || BUF_LIT(&b, "\r\n") < 0) {
        goto done;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *name = names[i], *value = values[i];
        Py_ssize_t n;
        const char *s = narrow_name(name, &n);
        int renamed = 0;
        if (s != NULL) {
            for (int k = 0; k < 3; k++) {
                if (is_word(s, n, kRewritten[k])) {
                    renamed = !(keep_encoding && k == 0);
                    break;
                }
            }
        }
        if (renamed) {
            PyObject *pair;
            if (as_bytes) {
                PyObject *tname = PyUnicode_DecodeLatin1(PyBytes_AS_STRING(name), n, NULL);
                PyObject *tvalue = tname == NULL ? NULL
                    : PyUnicode_DecodeLatin1(PyBytes_AS_STRING(value), PyBytes_GET_SIZE(value),
                                             NULL);
                pair = tvalue == NULL ? NULL : PyList_New(2);
                if (pair == NULL) {
                    Py_XDECREF(tname);
                    Py_XDECREF(tvalue);
                    goto done;
                }
                PyList_SET_ITEM(pair, 0, tname);
                PyList_SET_ITEM(pair, 1, tvalue);
            } else {
                pair = PyList_New(2);
                if (pair == NULL) {
                    goto done;
                }
                Py_INCREF(name);
                Py_INCREF(value);
                PyList_SET_ITEM(pair, 0, name);
                PyList_SET_ITEM(pair, 1, value);
            }
            int rc = PyList_Append(original, pair);
            Py_DECREF(pair);
            if (rc < 0 || BUF_LIT(&b, "X-Original-") < 0) {
                goto done;
            }
        }
        if (put_http_field(&b, name) < 0 || BUF_LIT(&b, ": ") < 0 ||
            put_http_field(&b, value) < 0 || BUF_LIT(&b, "\r\n") < 0) {
            goto done;
        }
    }
    if (BUF_LIT(&b, "Content-Length: ") < 0 || buf_put_decimal(&b, body_length) < 0 ||
        BUF_LIT(&b, "\r\n\r\n") < 0) {
        goto done;
    }
    PyObject *bytes = PyBytes_FromStringAndSize(b.p, b.n);
    if (bytes != NULL) {
        head = PyTuple_Pack(2, bytes, original);
        Py_DECREF(bytes);
    }
done:
    PyMem_Free(names);
    PyMem_Free(b.p);
    Py_XDECREF(original);
    return head;
}

/* ------------------------------------------------------------------------------------------ */
/* request_head */

PyDoc_STRVAR(request_head_doc,
"request_head(url: str, http_version: str, headers: Sequence, method: str, /) -> bytes | None\n\n"
"warc_records.request_head's bytes (Host first when the headers have none) for a plain\n"
"absolute http(s) URL (printable ASCII, no brackets in its host), an ASCII method and HTTP\n"
"version and (str, str) header pairs; None for anything else (the caller uses urlsplit).");

static int is_scheme_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           c == '+' || c == '-' || c == '.';
}

static PyObject *request_head(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "request_head() takes exactly 4 arguments");
        return NULL;
    }
    Py_ssize_t n, nversion, nmethod;
    const char *url = ascii_of(args[0], &n);
    const char *version = ascii_of(args[1], &nversion);
    const char *method = ascii_of(args[3], &nmethod);
    if (url == NULL || version == NULL || method == NULL) {
        Py_RETURN_NONE;
    }
    /* urlsplit, for the URLs where its answer is this simple: scheme "://" netloc, then path,
     * query and fragment split at the first '?' and '#'. Printable ASCII only, so none of
     * the characters urlsplit strips or removes is present. */
    for (Py_ssize_t i = 0; i < n; i++) {
        if (url[i] <= ' ' || url[i] > '~') {
            Py_RETURN_NONE;
        }
    }
    Py_ssize_t i = 0;
    if (n == 0 || !((url[0] >= 'a' && url[0] <= 'z') || (url[0] >= 'A' && url[0] <= 'Z'))) {
        Py_RETURN_NONE;
    }
    while (i < n && is_scheme_char(url[i])) {
        i++;
    }
    if (i + 3 > n || url[i] != ':' || url[i + 1] != '/' || url[i + 2] != '/') {
        Py_RETURN_NONE;
    }
    Py_ssize_t host = i + 3, end = host;
    while (end < n && url[end] != '/' && url[end] != '?' && url[end] != '#') {
        end++;
    }
    for (Py_ssize_t k = host; k < end; k++) {
        if (url[k] == '[' || url[k] == ']') {
            Py_RETURN_NONE; /* urlsplit checks bracketed hosts (and may raise) */
        }
    }
    Py_ssize_t stop = end;
    while (stop < n && url[stop] != '#') {
        stop++;
    }
    Py_ssize_t path_end = end;
    while (path_end < stop && url[path_end] != '?') {
        path_end++;
    }

    PyObject *headers = args[2];
    PyObject **names, **values;
    int as_bytes;
    Py_ssize_t count = header_pairs(headers, 0, &names, &values, &as_bytes);
    if (count == -1) {
        return NULL;
    }
    if (count == -2) {
        Py_RETURN_NONE;
    }
    int has_host = 0;
    for (Py_ssize_t k = 0; k < count && !has_host; k++) {
        Py_ssize_t nn;
        const char *s = narrow_name(names[k], &nn);
        has_host = s != NULL && is_word(s, nn, "host");
    }
    Buf b = {NULL, 0, 0};
    PyObject *out = NULL;
    /* the start line: method, target, version (one field: CR/LF as spaces) */
    Py_ssize_t line_start = 0;
    if (buf_put(&b, method, nmethod) < 0 || BUF_LIT(&b, " ") < 0) {
        goto done;
    }
    if (path_end > end) {
        if (buf_put(&b, url + end, path_end - end) < 0) {
            goto done;
        }
    } else if (BUF_LIT(&b, "/") < 0) {
        goto done;
    }
    if (stop - path_end > 1 && buf_put(&b, url + path_end, stop - path_end) < 0) {
        goto done;
    }
    if (BUF_LIT(&b, " ") < 0) {
        goto done;
    }
    if (!(nversion >= 5 && is_word(version, 5, "http/")) && BUF_LIT(&b, "HTTP/") < 0) {
        goto done;
    }
    if (buf_put(&b, version, nversion) < 0) {
        goto done;
    }
    for (Py_ssize_t k = line_start; k < b.n; k++) {
        if (b.p[k] == '\r' || b.p[k] == '\n') {
            b.p[k] = ' ';
        }
    }
    if (BUF_LIT(&b, "\r\n") < 0) {
        goto done;
    }
    if (!has_host) {
        if (BUF_LIT(&b, "Host: ") < 0 || buf_put(&b, url + host, end - host) < 0 ||
            BUF_LIT(&b, "\r\n") < 0) {
            goto done;
        }
    }
    for (Py_ssize_t k = 0; k < count; k++) {
        if (put_http_field(&b, names[k]) < 0 || BUF_LIT(&b, ": ") < 0 ||
            put_http_field(&b, values[k]) < 0 || BUF_LIT(&b, "\r\n") < 0) {
            goto done;
        }
    }
    if (BUF_LIT(&b, "\r\n") < 0) {
        goto done;
    }
    out = PyBytes_FromStringAndSize(b.p, b.n);
done:
    PyMem_Free(names);
    PyMem_Free(b.p);
    return out;
}

/* ------------------------------------------------------------------------------------------ */
/* Digests and record ids */

static const char kBase32[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";

/* "sha1:" and the 32 Base32 letters of a 20-byte SHA-1 (37 chars, no terminator). */
static void sha1_label(const unsigned char raw[20], char out[37]) {
    memcpy(out, "sha1:", 5);
    char *p = out + 5;
    for (int g = 0; g < 4; g++) { /* 5 bytes -> 8 letters */
        const unsigned char *r = raw + 5 * g;
        uint64_t v = ((uint64_t)r[0] << 32) | ((uint64_t)r[1] << 24) | ((uint64_t)r[2] << 16) |
                     ((uint64_t)r[3] << 8) | (uint64_t)r[4];
        for (int k = 7; k >= 0; k--) {
            *p++ = kBase32[(v >> (5 * k)) & 31];
        }
    }
}

/* SHA-1 of a (then b, when not NULL) by hashlib.sha1. */
static int sha1_of(PyObject *a, PyObject *b, unsigned char out[20]) {
    PyObject *h = PyObject_CallOneArg(sha1_new, a);
    if (h == NULL) {
        return -1;
    }
    if (b != NULL) {
        PyObject *r = PyObject_CallMethodOneArg(h, str_update, b);
        if (r == NULL) {
            Py_DECREF(h);
            return -1;
        }
        Py_DECREF(r);
    }
    PyObject *d = PyObject_CallMethodNoArgs(h, str_digest);
    Py_DECREF(h);
    if (d == NULL) {
        return -1;
    }
    if (!PyBytes_Check(d) || PyBytes_GET_SIZE(d) != 20) {
        Py_DECREF(d);
        PyErr_SetString(PyExc_ValueError, "hashlib.sha1 gave no 20-byte digest");
        return -1;
    }
    memcpy(out, PyBytes_AS_STRING(d), 20);
    Py_DECREF(d);
    return 0;
}

PyDoc_STRVAR(sha1_base32_doc,
"sha1_base32(raw: bytes, /) -> str\n\n"
"warc_records.digest_of_sha1: 'sha1:' and the Base32 of a 20-byte SHA-1.");

static PyObject *sha1_base32(PyObject *module, PyObject *raw) {
    if (!PyBytes_Check(raw)) {
        PyErr_SetString(PyExc_TypeError, "sha1_base32() takes bytes");
        return NULL;
    }
    if (PyBytes_GET_SIZE(raw) != 20) {
        PyErr_Format(PyExc_ValueError, "a SHA-1 digest is 20 bytes, not %zd",
                     PyBytes_GET_SIZE(raw));
        return NULL;
    }
    char out[37];
    sha1_label((const unsigned char *)PyBytes_AS_STRING(raw), out);
    return PyUnicode_FromStringAndSize(out, 37);
}

/* "<urn:uuid:...>" (47 chars) of 16 random bytes read as a little-endian number, with the
 * version (4) and variant bits set: warc_records.new_record_id of getrandbits(128). */
static void record_id(const unsigned char le[16], char out[47]) {
    static const char hex[] = "0123456789abcdef";
    unsigned char be[16];
    for (int j = 0; j < 16; j++) {
        be[j] = le[15 - j];
    }
    be[6] = (unsigned char)((be[6] & 0x0F) | 0x40);
    be[8] = (unsigned char)((be[8] & 0x3F) | 0x80);
    char *p = out;
    memcpy(p, "<urn:uuid:", 10);
    p += 10;
    for (int j = 0; j < 16; j++) {
        if (j == 4 || j == 6 || j == 8 || j == 10) {
            *p++ = '-';
        }
        *p++ = hex[be[j] >> 4];
        *p++ = hex[be[j] & 15];
    }
    *p = '>';
}

/* ------------------------------------------------------------------------------------------ */
/* records */

/* One record: its head (after the four fields every record has, `own` holds the record's own
 * fields and ends with "\r\n") and the block digest over block (+ rest), then block, rest and
 * the closing CRLFs, as warc_records.record writes it. */
static PyObject *one_record(const char *rtype, const char *date, Py_ssize_t ndate,
                            const char rid[47], Buf *own, PyObject *block, PyObject *rest) {
    Py_buffer vb, vr = {0};
    if (PyObject_GetBuffer(block, &vb, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    if (rest != NULL && PyObject_GetBuffer(rest, &vr, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&vb);
        return NULL;
    }
    PyObject *out = NULL;
    unsigned char raw[20];
    char digest[37];
    Buf h = {NULL, 0, 0};
    if (sha1_of(block, rest, raw) < 0) {
        goto done;
    }
    sha1_label(raw, digest);
    if (BUF_LIT(&h, "WARC/1.1\r\nWARC-Type: ") < 0 || buf_put(&h, rtype, strlen(rtype)) < 0 ||
        BUF_LIT(&h, "\r\nWARC-Date: ") < 0 || buf_put(&h, date, ndate) < 0 ||
        BUF_LIT(&h, "\r\nWARC-Record-ID: ") < 0 || buf_put(&h, rid, 47) < 0 ||
        BUF_LIT(&h, "\r\nContent-Length: ") < 0 || buf_put_decimal(&h, vb.len + vr.len) < 0 ||
        BUF_LIT(&h, "\r\n") < 0 || buf_put(&h, own->p, own->n) < 0 ||
        BUF_LIT(&h, "WARC-Block-Digest: ") < 0 || buf_put(&h, digest, 37) < 0 ||
        BUF_LIT(&h, "\r\n\r\n") < 0) {
        goto done;
    }
    out = PyBytes_FromStringAndSize(NULL, h.n + vb.len + vr.len + 4);
    if (out == NULL) {
        goto done;
    }
    char *p = PyBytes_AS_STRING(out);
    memcpy(p, h.p, (size_t)h.n);
    p += h.n;
    memcpy(p, vb.buf, (size_t)vb.len);
    p += vb.len;
    if (vr.len) {
        memcpy(p, vr.buf, (size_t)vr.len);
        p += vr.len;
    }
    memcpy(p, "\r\n\r\n", 4);
done:
    PyMem_Free(h.p);
    PyBuffer_Release(&vb);
    if (rest != NULL) {
        PyBuffer_Release(&vr);
    }
    return out;
}

PyDoc_STRVAR(records_doc,
"records(url: str, date: str, rand: bytes, ip: str | None, cut: str | None,\n"
"        response_head: bytes, body: bytes, body_sha1: bytes | None, request_head: bytes,\n"
"        request_body: bytes, metadata: bytes, /)\n"
"    -> tuple[bytes, bytes, bytes, str, str]\n\n"
"The request, response and metadata records of warc_records.build_exchange (uncompressed),\n"
"the response's record id and the body's payload digest. rand: 48 random bytes, the three\n"
"record ids (response, request, metadata) as getrandbits(128) three times would give them\n"
"(Random.randbytes(48)); cut: the WARC-Truncated value; body_sha1: the body's SHA-1 when\n"
"known already.");

static PyObject *records(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 11) {
        PyErr_SetString(PyExc_TypeError, "records() takes exactly 11 arguments");
        return NULL;
    }
    PyObject *url = args[0], *date = args[1], *rand = args[2], *ip = args[3], *cut = args[4];
    PyObject *response_head = args[5], *body = args[6], *body_sha1 = args[7];
    PyObject *request_head = args[8], *request_body = args[9], *metadata = args[10];
    if (!PyUnicode_Check(url) || !PyUnicode_Check(date) || !PyBytes_Check(rand) ||
        PyBytes_GET_SIZE(rand) != 48 || (ip != Py_None && !PyUnicode_Check(ip)) ||
        (cut != Py_None && !PyUnicode_Check(cut))) {
        PyErr_SetString(PyExc_TypeError, "records(): bad argument types");
        return NULL;
    }
    Py_ssize_t ndate;
    const char *sdate = PyUnicode_AsUTF8AndSize(date, &ndate);
    if (sdate == NULL) {
        return NULL;
    }
    const unsigned char *r = (const unsigned char *)PyBytes_AS_STRING(rand);
    char ids[3][47];
    for (int k = 0; k < 3; k++) {
        record_id(r + 16 * k, ids[k]);
    }
    unsigned char raw[20];
    char payload[37];
    if (body_sha1 == Py_None) {
        if (sha1_of(body, NULL, raw) < 0) {
            return NULL;
        }
    } else {
        if (!PyBytes_Check(body_sha1) || PyBytes_GET_SIZE(body_sha1) != 20) {
            PyErr_SetString(PyExc_ValueError, "body_sha1 is not a 20-byte SHA-1");
            return NULL;
        }
        memcpy(raw, PyBytes_AS_STRING(body_sha1), 20);
    }
    sha1_label(raw, payload);

    PyObject *request = NULL, *response = NULL, *meta = NULL, *out = NULL;
    Buf target = {NULL, 0, 0}, own = {NULL, 0, 0};
    /* WARC-Target-URI (and WARC-IP-Address) of the request and response records */
    if (BUF_LIT(&target, "WARC-Target-URI: ") < 0 || put_utf8(&target, url, 0) < 0 ||
        BUF_LIT(&target, "\r\n") < 0) {
        goto done;
    }
    Py_ssize_t uri_only = target.n;
    if (ip != Py_None && PyUnicode_GET_LENGTH(ip) > 0) {
        if (BUF_LIT(&target, "WARC-IP-Address: ") < 0 || put_utf8(&target, ip, 1) < 0 ||
            BUF_LIT(&target, "\r\n") < 0) {
            goto done;
        }
    }
    /* response */
    if (buf_put(&own, target.p, target.n) < 0 ||
        BUF_LIT(&own, "Content-Type: application/http; msgtype=response\r\n") < 0) {
        goto done;
    }
    if (cut != Py_None && PyUnicode_GET_LENGTH(cut) > 0) {
        if (BUF_LIT(&own, "WARC-Truncated: ") < 0 || put_utf8(&own, cut, 0) < 0 ||
            BUF_LIT(&own, "\r\n") < 0) {
            goto done;
        }
    }
    if (BUF_LIT(&own, "WARC-Payload-Digest: ") < 0 || buf_put(&own, payload, 37) < 0 ||
        BUF_LIT(&own, "\r\n") < 0) {
        goto done;
    }
    response = one_record("response", sdate, ndate, ids[0], &own, response_head, body);
    if (response == NULL) {
        goto done;
    }
    /* request */
    own.n = 0;
    if (buf_put(&own, target.p, target.n) < 0 ||
        BUF_LIT(&own, "Content-Type: application/http; msgtype=request\r\n"
                      "WARC-Concurrent-To: ") < 0 ||
        buf_put(&own, ids[0], 47) < 0 || BUF_LIT(&own, "\r\n") < 0) {
        goto done;
    }
    int no_body = PyBytes_Check(request_body) && PyBytes_GET_SIZE(request_body) == 0;
    request = one_record("request", sdate, ndate, ids[1], &own, request_head,
                         no_body ? NULL : request_body);
    if (request == NULL) {
        goto done;
    }
    /* metadata */
    own.n = 0;
    if (buf_put(&own, target.p, uri_only) < 0 ||
        BUF_LIT(&own, "Content-Type: application/warc-fields\r\nWARC-Concurrent-To: ") < 0 ||
        buf_put(&own, ids[0], 47) < 0 || BUF_LIT(&own, "\r\n") < 0) {
        goto done;
    }
    meta = one_record("metadata", sdate, ndate, ids[2], &own, metadata, NULL);
    if (meta == NULL) {
        goto done;
    }
    out = Py_BuildValue("(OOOs#s#)", request, response, meta, ids[0], (Py_ssize_t)47, payload,
                        (Py_ssize_t)37);
done:
    PyMem_Free(target.p);
    PyMem_Free(own.p);
    Py_XDECREF(request);
    Py_XDECREF(response);
    Py_XDECREF(meta);
    return out;
}

/* ------------------------------------------------------------------------------------------ */
/* warc_date */

PyDoc_STRVAR(warc_date_doc,
"warc_date(ts: float | int, /) -> str | None\n\n"
"warc_records.warc_date: 'YYYY-MM-DDTHH:MM:SS.ffffffZ', UTC, the microseconds rounded half to\n"
"even as datetime.fromtimestamp rounds them; None outside 1970..5138 or for another type.");

static PyObject *warc_date(PyObject *module, PyObject *ts) {
    long long sec;
    long us;
    if (PyFloat_CheckExact(ts)) {
        /* CPython's _PyTime_DoubleToDenominator with _PyTime_ROUND_HALF_EVEN */
        double d = PyFloat_AS_DOUBLE(ts), intpart;
        if (!(d >= 0.0 && d < 1e11)) {
            Py_RETURN_NONE;
        }
        double frac = modf(d, &intpart) * 1e6;
        double rounded = round(frac);
        if (fabs(frac - rounded) == 0.5) {
            rounded = 2.0 * round(frac / 2.0);
        }
        frac = rounded;
        if (frac >= 1e6) {
            frac -= 1e6;
            intpart += 1.0;
        } else if (frac < 0) {
            frac += 1e6;
            intpart -= 1.0;
        }
        sec = (long long)intpart;
        us = (long)frac;
    } else if (PyLong_CheckExact(ts)) {
        sec = PyLong_AsLongLong(ts);
        if (sec == -1 && PyErr_Occurred()) {
            PyErr_Clear();
            Py_RETURN_NONE;
        }
        if (sec < 0 || sec >= 100000000000LL) {
            Py_RETURN_NONE;
        }
        us = 0;
    } else {
        Py_RETURN_NONE;
    }
    time_t t = (time_t)sec;
    struct tm tm;
    if (gmtime_r(&t, &tm) == NULL) {
        Py_RETURN_NONE;
    }
    char buf[64];
    int n = snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%06ldZ", tm.tm_year + 1900,
                     tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min,
                     tm.tm_sec > 59 ? 59 : tm.tm_sec, us);
    return PyUnicode_FromStringAndSize(buf, n);
}

/* ------------------------------------------------------------------------------------------ */

static PyMethodDef methods[] = {
    {"response_head", (PyCFunction)(void (*)(void))response_head, METH_FASTCALL,
     response_head_doc},
    {"request_head", (PyCFunction)(void (*)(void))request_head, METH_FASTCALL, request_head_doc},
    {"records", (PyCFunction)(void (*)(void))records, METH_FASTCALL, records_doc},
    {"sha1_base32", (PyCFunction)sha1_base32, METH_O, sha1_base32_doc},
    {"warc_date", (PyCFunction)warc_date, METH_O, warc_date_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "idemcrawl._warc",
    "The WARC records of an exchange in C (see warc_records.py).", -1, methods,
};

PyMODINIT_FUNC PyInit__warc(void) {
    PyObject *hashlib = PyImport_ImportModule("hashlib");
    if (hashlib == NULL) {
        return NULL;
    }
    sha1_new = PyObject_GetAttrString(hashlib, "sha1");
    Py_DECREF(hashlib);
    str_update = PyUnicode_InternFromString("update");
    str_digest = PyUnicode_InternFromString("digest");
    if (sha1_new == NULL || str_update == NULL || str_digest == NULL) {
        return NULL;
    }
    return PyModule_Create(&module_def);
}
