"""Build of the two C extensions (everything else is in pyproject.toml).

* ``idemcrawl._simhash``: SimHash and XXH3 for ``idemcrawl.dedup``;
* ``idemcrawl._links``: the plain-link fast path of ``idemcrawl.url.Resolver``;
* ``idemcrawl._warc``: the WARC records of an exchange for ``idemcrawl.warc_records``.

``optional=True``: without a C compiler or Python headers ``pip install`` still succeeds and
``idemcrawl.dedup``, ``idemcrawl.url`` and ``idemcrawl.warc_records`` fall back to pure Python,
which gives the same results (only slower: docs/benchmarks.md). CI asserts all three are built
(tests/test_simhash_native.py, tests/test_url_resolver.py, tests/test_warc_native.py).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "idemcrawl._simhash",
            sources=["src/idemcrawl/_simhash.c"],
            optional=True,
        ),
        Extension(
            "idemcrawl._links",
            sources=["src/idemcrawl/_links.c"],
            optional=True,
        ),
        Extension(
            "idemcrawl._warc",
            sources=["src/idemcrawl/_warc.c"],
            libraries=["m"],
            optional=True,
        ),
    ]
)
