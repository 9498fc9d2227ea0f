"""Benchmarks that report figures (not tests): ``idemcrawl bench ...``.

Each benchmark is a module of its own. For ``bench crawl``, :mod:`idemcrawl.lab.bench.site` builds
and serves a generated site and :mod:`idemcrawl.lab.bench.crawl` runs idemcrawl and the comparators
against it. Nothing is imported here, so that ``python -m idemcrawl.lab.bench.site`` (the fallback
server's entry point) and parser worker processes that load
:class:`idemcrawl.lab.bench.crawl.BenchSpider` do not pay for the other modules.
"""
