"""Benchmarks that measure idemcrawl against other crawlers on the same generated site.

:mod:`idemcrawl.bench.site` builds and serves the site, :mod:`idemcrawl.bench.crawl` runs the
crawlers against it and reports. Nothing is imported here, so that ``python -m
idemcrawl.bench.site`` (the fallback server's entry point) and parser worker processes that load
:class:`idemcrawl.bench.crawl.BenchSpider` do not pay for the other module.
"""
