"""The lab: tools around the crawler, never imported by it.

Test sites (``testsite``), benchmarks (``bench``), the virtual-clock simulator (``sim``), the
kill test (``chaos``), its naive baseline scraper (``naive``) and the request-log politeness
checker (``politeness_check``) exist to measure and attack the crawler. The crawler's own modules
(everything outside ``lab``) must not import them; ``cli`` is the one place that reaches both.
"""
