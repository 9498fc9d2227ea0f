"""A crawl over several PostgreSQL servers (issue 15, ``docs/partitioning.md``).

Built as a layer on top of the frontier contract (``frontier/base.py``): each partition is an
ordinary PostgreSQL frontier in its own schema; this package adds

* ``partition_map`` — which partitions exist, on which server, stored on every server;
* ``partition`` — one partition's frontier plus its transactional outbox;
* ``membership`` — members, fair shares, ownership with fencing epochs, the ownership log;
* ``frontier`` — :class:`~.frontier.PartitionedFrontier`, the contract by routing.
"""
