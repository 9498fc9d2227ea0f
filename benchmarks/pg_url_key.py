"""What the URL key costs a PostgreSQL insert: a unique b-tree over the text against a hash
index under an exclusion constraint (schema 6) and a plain hash index probed by NOT EXISTS.

Each variant is a table of 2,000,000 URLs shaped like ``bench frontier``'s; then, in rounds
interleaved across the variants, 30 inserts of 2,560 new URLs on random hosts (one repeated
within its batch, as links are). Printed: the backend's CPU per insert (``/proc/<pid>/schedstat``,
so the server must be local) for each round, and each table's index size.

    python benchmarks/pg_url_key.py [DSN]   # default postgresql://127.0.0.1/test

It works in a schema of its own (``bench_url_key``), dropped at the end.
"""

from __future__ import annotations

import random
import sys

import psycopg

SCHEMA = "bench_url_key"
#: variant -> (DDL, ON CONFLICT clause, extra WHERE)
VARIANTS = {
    "btree": (
        "CREATE TABLE {t} (id bigserial PRIMARY KEY, url text NOT NULL UNIQUE, h int, s text)",
        "ON CONFLICT DO NOTHING",
        "",
    ),
    "hash_exclusion": (
        "CREATE TABLE {t} (id bigserial PRIMARY KEY, url text NOT NULL, h int, s text, "
        "EXCLUDE USING hash (url WITH =))",
        "ON CONFLICT DO NOTHING",
        "",
    ),
    "hash_not_exists": (
        "CREATE TABLE {t} (id bigserial PRIMARY KEY, url text NOT NULL, h int, s text);"
        "CREATE INDEX ON {t} USING hash (url)",
        "",
        "WHERE NOT EXISTS (SELECT 1 FROM {t} AS x WHERE x.url = l.u)",
    ),
}


def main(dsn: str) -> None:
    conn = psycopg.connect(dsn, autocommit=True)
    conn.execute(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE")
    conn.execute(f"CREATE SCHEMA {SCHEMA}")
    conn.execute(f"SET search_path TO {SCHEMA}")
    row = conn.execute("SELECT pg_backend_pid()").fetchone()
    assert row is not None
    pid = row[0]

    def cpu_s() -> float:
        with open(f"/proc/{pid}/schedstat") as fh:
            return int(fh.read().split()[0]) / 1e9

    try:
        for name, (ddl, _, _) in VARIANTS.items():
            for stmt in ddl.format(t=name).split(";"):
                conn.execute(stmt)
            conn.execute(
                f"INSERT INTO {name} (url, h, s) SELECT 'http://h' || lpad((g % 100000)::text, "
                "6, '0') || '.bench.invalid/p/' || (g / 100000), g % 100000, 'queued' "
                "FROM generate_series(0, 1999999) AS g"
            )
            conn.execute(f"VACUUM ANALYZE {name}")
        per_insert: dict[str, list[float]] = {name: [] for name in VARIANTS}
        for rnd in range(4):
            for name, (_, conflict, where) in VARIANTS.items():
                before = cpu_s()
                for b in range(30):
                    urls = [
                        f"http://h{random.randrange(100000):06d}.bench.invalid/n/{rnd}/{b}/{i}"
                        for i in range(2560)
                    ]
                    urls[5] = urls[3]
                    conn.execute(
                        f"INSERT INTO {name} (url, h, s) SELECT l.u, 1, 'queued' "
                        f"FROM unnest(%s::text[]) AS l(u) {where.format(t=name)} {conflict}",
                        (urls,),
                    )
                per_insert[name].append(round((cpu_s() - before) * 1000 / 30, 1))
        print("backend CPU ms per insert of 2,560 URLs, by round:", per_insert)
        for name in VARIANTS:
            size = conn.execute(f"SELECT pg_size_pretty(pg_indexes_size('{name}'))").fetchone()
            print(f"{name}: indexes {size[0] if size else '?'}")
    finally:
        conn.execute(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE")
        conn.close()


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "postgresql://127.0.0.1/test")
