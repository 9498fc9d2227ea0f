/* idemcrawl._links: the plain-link fast path of url.Resolver, in C.
 *
 * A page's links are mostly root-relative ("/p/12"), relative ("12", "./12", "../p/12") or
 * absolute on the page's own origin, made of plain characters. url.Resolver joins those with
 * string operations instead of the URL parser; in Python that still cost ~10,000 instructions
 * per link (a regex search, a regex fullmatch, slicing, a method call), about a third of the
 * parser process's work on the benchmark site. This is the same fast path, byte for byte:
 * plain_join() returns the joined URL, or None whenever Python's url.normalise() must decide
 * (anything the fast path does not cover, any non-ASCII input). url.Resolver keeps the Python
 * version as the reference and the fallback; tests/test_url_resolver.py checks both against
 * normalise() by hypothesis.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

/* url.MAX_URL_LENGTH */
#define MAX_URL_LENGTH 8192

/* Characters of _PLAIN_PATH's path part: [A-Za-z0-9\-_~!$&()*+,;=:@/.]; its query part also
 * allows '?'. */
static unsigned char kPathChar[256];
static unsigned char kQueryChar[256];

static void init_tables(void) {
    const char *extra = "-_~!$&()*+,;=:@/.";
    for (int c = 0; c < 256; c++) {
        int ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                 (c != 0 && strchr(extra, c) != NULL);
        kPathChar[c] = (unsigned char)ok;
        kQueryChar[c] = (unsigned char)(ok || c == '?');
    }
}

/* _PLAIN_PATH.fullmatch(p) is not None and "/." not in p, for p = a + b (two pieces, so the
 * joined path need not be built before it is known to be plain). */
static int plain_path(const char *a, Py_ssize_t na, const char *b, Py_ssize_t nb) {
    Py_ssize_t n = na + nb;
    if (n == 0) {
        return 0;
    }
#define AT(i) ((unsigned char)((i) < na ? a[(i)] : b[(i) - na]))
    if (AT(0) != '/') {
        return 0;
    }
    Py_ssize_t i = 1;
    unsigned char prev = '/';
    while (i < n) {
        unsigned char c = AT(i);
        if (c == '?') {
            break;
        }
        if (!kPathChar[c] || (prev == '/' && c == '.')) {
            return 0;
        }
        prev = c;
        i++;
    }
    if (i < n) { /* a query: at least one character, all query characters */
        prev = '?';
        i++;
        if (i == n) {
            return 0;
        }
        for (; i < n; i++) {
            unsigned char c = AT(i);
            if (!kQueryChar[c] || (prev == '/' && c == '.')) {
                return 0;
            }
            prev = c;
        }
    }
#undef AT
    return 1;
}

static const char *ascii_of(PyObject *s, Py_ssize_t *n) {
    if (!PyUnicode_Check(s)) {
        return NULL;
    }
#if PY_VERSION_HEX < 0x030C0000
    if (PyUnicode_READY(s) < 0) {
        PyErr_Clear();
        return NULL;
    }
#endif
    if (!PyUnicode_IS_ASCII(s)) {
        return NULL;
    }
    *n = PyUnicode_GET_LENGTH(s);
    return (const char *)PyUnicode_1BYTE_DATA(s);
}

static int starts_with(const char *s, Py_ssize_t n, const char *prefix, Py_ssize_t np) {
    return n >= np && memcmp(s, prefix, (size_t)np) == 0;
}

/* ':' in the first path segment of ref[0:n] (ref.partition("/")[0]) */
static int colon_in_first_segment(const char *ref, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n && ref[i] != '/'; i++) {
        if (ref[i] == ':') {
            return 1;
        }
    }
    return 0;
}

/* An authority "host[:port]" that url.normalise() keeps as it is, for the scheme whose default
 * port is default_port: a host of lower-case letters, digits, '-' and '.', in non-empty
 * labels, none starting "xn--" (punycode is checked by the URL parser), the last label starting
 * with a letter (else WHATWG reads an IPv4 address) unless the host is a canonical dotted-quad
 * (four decimal numbers up to 255, no leading zeros); a port, if any, of digits without a
 * leading zero, up to 65535 and not the default. Anything else (upper case, IDNA, trailing
 * dot, other IPv4 spellings, IPv6, userinfo, empty or default port) is left to the parser. */
static int plain_authority(const char *a, Py_ssize_t n, long default_port) {
    Py_ssize_t colon = n;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (a[i] == ':') {
            colon = i;
            break;
        }
    }
    if (colon == 0) {
        return 0;
    }
    if (colon < n) { /* a port */
        Py_ssize_t np = n - colon - 1;
        if (np < 1 || np > 5 || (a[colon + 1] == '0' && np > 1)) {
            return 0;
        }
        long port = 0;
        for (Py_ssize_t i = colon + 1; i < n; i++) {
            if (a[i] < '0' || a[i] > '9') {
                return 0;
            }
            port = port * 10 + (a[i] - '0');
        }
        if (port > 65535 || port == default_port) {
            return 0;
        }
    }
    /* the host: labels */
    Py_ssize_t label = 0, nlabels = 0, last = 0;
    int all_digits_labels = 1;
    for (Py_ssize_t i = 0; i <= colon; i++) {
        if (i == colon || a[i] == '.') {
            Py_ssize_t len = i - label;
            if (len == 0) {
                return 0;
            }
            if (len >= 4 && memcmp(a + label, "xn--", 4) == 0) {
                return 0;
            }
            /* a decimal number 0..255 without a leading zero? */
            int decimal = len <= 3 && !(a[label] == '0' && len > 1);
            long value = 0;
            for (Py_ssize_t j = label; decimal && j < i; j++) {
                if (a[j] < '0' || a[j] > '9') {
                    decimal = 0;
                } else {
                    value = value * 10 + (a[j] - '0');
                }
            }
            if (!decimal || value > 255) {
                all_digits_labels = 0;
            }
            last = label;
            nlabels++;
            label = i + 1;
            continue;
        }
        char c = a[i];
        if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-')) {
            return 0;
        }
    }
    if (a[last] >= 'a' && a[last] <= 'z') {
        return 1; /* a domain */
    }
    return nlabels == 4 && all_digits_labels; /* a canonical IPv4 address */
}

/* href as url.normalise() gives it, when it is an absolute http(s) URL already in normal form
 * (plain_authority, then a plain path): the href without its fragment. NULL otherwise. */
static PyObject *plain_absolute(const char *href, Py_ssize_t nhref) {
    Py_ssize_t start;
    long default_port;
    if (starts_with(href, nhref, "http://", 7)) {
        start = 7;
        default_port = 80;
    } else if (starts_with(href, nhref, "https://", 8)) {
        start = 8;
        default_port = 443;
    } else {
        return NULL;
    }
    const char *hash = memchr(href, '#', (size_t)nhref);
    Py_ssize_t nref = hash == NULL ? nhref : (Py_ssize_t)(hash - href);
    const char *slash = memchr(href + start, '/', (size_t)(nref - start));
    if (slash == NULL) {
        return NULL; /* no path: the parser adds "/" */
    }
    Py_ssize_t path = (Py_ssize_t)(slash - href);
    if (!plain_authority(href + start, path - start, default_port) ||
        !plain_path(href + path, nref - path, "", 0)) {
        return NULL;
    }
    return PyUnicode_FromStringAndSize(href, nref);
}

/* The fast path of url.Resolver.resolve: a new str, Py_None (a new reference) when the slow
 * path must decide, NULL on a Python error. */
static PyObject *join_one(const char *origin, Py_ssize_t norigin, const char *dir,
                          Py_ssize_t ndir, Py_ssize_t dir_root, PyObject *href_obj,
                          int absolute) {
    Py_ssize_t nhref;
    const char *href = ascii_of(href_obj, &nhref);
    if (href == NULL || nhref > MAX_URL_LENGTH) {
        Py_RETURN_NONE;
    }
    for (Py_ssize_t i = 0; i < nhref; i++) { /* _HREF_SPECIAL: [\t\n\r\\%] */
        char c = href[i];
        if (c == '\t' || c == '\n' || c == '\r' || c == '\\' || c == '%') {
            Py_RETURN_NONE;
        }
    }
    const char *hash = memchr(href, '#', (size_t)nhref);
    const char *ref = href;
    Py_ssize_t nref = hash == NULL ? nhref : (Py_ssize_t)(hash - href);
    const char *head; /* the result is origin + head + ref (head: a piece of dir) */
    Py_ssize_t nhead;
    if (starts_with(ref, nref, origin, norigin) && nref > norigin && ref[norigin] == '/') {
        head = "";
        nhead = 0;
        ref += norigin;
        nref -= norigin;
    } else if (nref >= 1 && ref[0] == '/') {
        if (nref >= 2 && ref[1] == '/') {
            Py_RETURN_NONE; /* scheme-relative: another host */
        }
        head = "";
        nhead = 0;
    } else if (nref >= 1 && ref[0] != '?' && ref[0] != '.' && ref[0] != ':' &&
               !colon_in_first_segment(ref, nref)) {
        head = dir + norigin;
        nhead = ndir - norigin;
    } else if (starts_with(ref, nref, "./", 2) || starts_with(ref, nref, "../", 3)) {
        Py_ssize_t ndirectory = ndir;
        for (;;) {
            if (starts_with(ref, nref, "./", 2)) {
                ref += 2;
                nref -= 2;
            } else if (starts_with(ref, nref, "../", 3)) {
                ref += 3;
                nref -= 3;
                if (ndirectory > dir_root) {
                    /* directory[: directory.rfind("/", 0, -1) + 1] */
                    Py_ssize_t j = ndirectory - 2;
                    while (j >= 0 && dir[j] != '/') {
                        j--;
                    }
                    ndirectory = j + 1;
                }
            } else {
                break;
            }
        }
        if (nref == 0 || ref[0] == '?' || ref[0] == '.' || ref[0] == ':' || ref[0] == '/' ||
            colon_in_first_segment(ref, nref)) {
            Py_RETURN_NONE;
        }
        if (ndirectory < norigin) { /* cannot happen with dir_root = len(origin) + 1 */
            Py_RETURN_NONE;
        }
        head = dir + norigin;
        nhead = ndirectory - norigin;
    } else {
        /* absolute on another origin (only when asked: plain_join_many promises the page's) */
        PyObject *out = absolute ? plain_absolute(href, nhref) : NULL;
        if (out == NULL && !PyErr_Occurred()) {
            Py_RETURN_NONE;
        }
        return out;
    }
    if (!plain_path(head, nhead, ref, nref)) {
        Py_RETURN_NONE;
    }
    Py_ssize_t total = norigin + nhead + nref;
    if (total > MAX_URL_LENGTH) {
        Py_RETURN_NONE;
    }
    PyObject *out = PyUnicode_New(total, 127);
    if (out == NULL) {
        return NULL;
    }
    char *data = (char *)PyUnicode_1BYTE_DATA(out);
    memcpy(data, origin, (size_t)norigin);
    memcpy(data + norigin, head, (size_t)nhead);
    memcpy(data + norigin + nhead, ref, (size_t)nref);
    return out;
}

/* Common argument checks: origin and dir ASCII str, dir starting with origin, dir_root int. */
static int parse_base(PyObject *const *args, const char **origin, Py_ssize_t *norigin,
                      const char **dir, Py_ssize_t *ndir, Py_ssize_t *dir_root) {
    *origin = ascii_of(args[0], norigin);
    *dir = ascii_of(args[1], ndir);
    if (*origin == NULL || *dir == NULL) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_TypeError, "origin and dir must be ASCII str");
        }
        return -1;
    }
    if (*ndir < *norigin || memcmp(*dir, *origin, (size_t)*norigin) != 0) {
        PyErr_SetString(PyExc_ValueError, "dir must start with origin");
        return -1;
    }
    *dir_root = PyLong_AsSsize_t(args[2]);
    if (*dir_root == -1 && PyErr_Occurred()) {
        return -1;
    }
    return 0;
}

PyDoc_STRVAR(plain_join_doc,
"plain_join(origin: str, dir: str, dir_root: int, href: object, /) -> str | None\n\n"
"url.Resolver's fast path: href joined to a normalised base whose origin and directory are\n"
"given, or None when url.normalise() must decide (href not a plain same-origin link nor a\n"
"plain absolute http(s) URL already in normal form, not ASCII, or not a str).");

static PyObject *plain_join(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "plain_join() takes exactly 4 arguments");
        return NULL;
    }
    const char *origin, *dir;
    Py_ssize_t norigin, ndir, dir_root;
    if (parse_base(args, &origin, &norigin, &dir, &ndir, &dir_root) < 0) {
        return NULL;
    }
    return join_one(origin, norigin, dir, ndir, dir_root, args[3], 1);
}

PyDoc_STRVAR(plain_join_many_doc,
"plain_join_many(origin: str, dir: str, dir_root: int, hrefs: list, /) -> list[str | None]\n\n"
"plain_join() of every item of hrefs (a list), in order, for same-origin links only: None\n"
"for an absolute URL on another origin, so every str returned has origin as its host key.");

PyDoc_STRVAR(normal_absolute_doc,
"normal_absolute(url: object, /) -> str | None\n\n"
"url without its fragment when it is an absolute http(s) URL that url.normalise() returns\n"
"unchanged (plain host, port and path: see plain_absolute), else None (the parser decides).");

static PyObject *normal_absolute(PyObject *module, PyObject *url) {
    Py_ssize_t n;
    const char *s = ascii_of(url, &n);
    if (s == NULL || n > MAX_URL_LENGTH) {
        Py_RETURN_NONE;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        char c = s[i];
        if (c == '\t' || c == '\n' || c == '\r' || c == '\\' || c == '%') {
            Py_RETURN_NONE;
        }
    }
    PyObject *out = plain_absolute(s, n);
    if (out == NULL && !PyErr_Occurred()) {
        Py_RETURN_NONE;
    }
    return out;
}

static PyObject *plain_join_many(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "plain_join_many() takes exactly 4 arguments");
        return NULL;
    }
    const char *origin, *dir;
    Py_ssize_t norigin, ndir, dir_root;
    if (parse_base(args, &origin, &norigin, &dir, &ndir, &dir_root) < 0) {
        return NULL;
    }
    PyObject *hrefs = args[3];
    if (!PyList_Check(hrefs)) {
        PyErr_SetString(PyExc_TypeError, "plain_join_many() hrefs must be a list");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(hrefs);
    PyObject *out = PyList_New(n);
    if (out == NULL) {
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = join_one(origin, norigin, dir, ndir, dir_root, PyList_GET_ITEM(hrefs, i), 0);
        if (item == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, i, item);
    }
    return out;
}

static PyMethodDef methods[] = {
    {"plain_join", (PyCFunction)(void (*)(void))plain_join, METH_FASTCALL, plain_join_doc},
    {"plain_join_many", (PyCFunction)(void (*)(void))plain_join_many, METH_FASTCALL,
     plain_join_many_doc},
    {"normal_absolute", (PyCFunction)normal_absolute, METH_O, normal_absolute_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "idemcrawl._links",
    "url.Resolver's plain-link fast path in C (see url.py).", -1, methods,
};

PyMODINIT_FUNC PyInit__links(void) {
    init_tables();
    return PyModule_Create(&module_def);
}
