"""Build of the one C extension, ``idemcrawl._simhash`` (everything else is in pyproject.toml).

``optional=True``: without a C compiler or Python headers ``pip install`` still succeeds and
``idemcrawl.dedup`` falls back to its pure-Python SimHash, which gives the same fingerprints
(only slower: docs/benchmarks.md). CI asserts the extension is built (tests/test_simhash_native.py).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "idemcrawl._simhash",
            sources=["src/idemcrawl/_simhash.c"],
            optional=True,
        )
    ]
)
