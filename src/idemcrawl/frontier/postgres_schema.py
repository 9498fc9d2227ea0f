"""The PostgreSQL schema of a crawl: the same logical schema and version numbers as SQLite's.

See ``sqlite.py`` for what each column is for. Each migration is a tuple of statements, applied
in one transaction under an advisory lock (``postgres.py``). The migrations are Python strings,
so the wheel needs no package data.

Statement-level triggers keep ``hosts.queued`` / ``hosts.in_flight`` equal to the counts of the
host's URLs in ``queued`` / ``leased`` (invariant I6), like the SQLite row triggers but with one
write per host per statement instead of one per URL, and with the host rows taken in key order.
"""

from __future__ import annotations

from .store import SCHEMA_VERSION

COUNT_QUEUED_ON_INSERT = """
CREATE FUNCTION urls_count_insert() RETURNS trigger LANGUAGE plpgsql
SET search_path FROM CURRENT AS $$
BEGIN
    INSERT INTO hosts AS h (host_key, queued, in_flight)
    SELECT host_key,
           count(*) FILTER (WHERE state = 'queued'),
           count(*) FILTER (WHERE state = 'leased')
      FROM new_rows GROUP BY host_key ORDER BY host_key
    ON CONFLICT (host_key) DO UPDATE
       SET queued = h.queued + excluded.queued, in_flight = h.in_flight + excluded.in_flight
     WHERE excluded.queued <> 0 OR excluded.in_flight <> 0;
    RETURN NULL;
END
$$"""

# Transition tables cannot be combined with "UPDATE OF state", so the update trigger sees every
# UPDATE of urls; rows whose state did not change cancel out (+1 new, -1 old) and touch nothing.
COUNT_QUEUED_ON_UPDATE = """
CREATE FUNCTION urls_count_update() RETURNS trigger LANGUAGE plpgsql
SET search_path FROM CURRENT AS $$
BEGIN
    UPDATE hosts AS h SET queued = h.queued + d.dq, in_flight = h.in_flight + d.dl
      FROM (SELECT host_key, sum(dq) AS dq, sum(dl) AS dl
              FROM (SELECT host_key, (state = 'queued')::int AS dq, (state = 'leased')::int AS dl
                      FROM new_rows
                    UNION ALL
                    SELECT host_key, -(state = 'queued')::int, -(state = 'leased')::int
                      FROM old_rows) AS c
             GROUP BY host_key
            HAVING sum(dq) <> 0 OR sum(dl) <> 0) AS d
     WHERE h.host_key = d.host_key;
    RETURN NULL;
END
$$"""

# SQLite has no delete trigger because nothing deletes URLs; one here keeps I6 true even for a
# manual clean-up.
COUNT_QUEUED_ON_DELETE = """
CREATE FUNCTION urls_count_delete() RETURNS trigger LANGUAGE plpgsql
SET search_path FROM CURRENT AS $$
BEGIN
    UPDATE hosts AS h SET queued = h.queued - d.dq, in_flight = h.in_flight - d.dl
      FROM (SELECT host_key,
                   count(*) FILTER (WHERE state = 'queued') AS dq,
                   count(*) FILTER (WHERE state = 'leased') AS dl
              FROM old_rows GROUP BY host_key) AS d
     WHERE h.host_key = d.host_key AND (d.dq <> 0 OR d.dl <> 0);
    RETURN NULL;
END
$$"""

# Schema 6: the same three counts by host_id, each also adding its per-state deltas to
# url_states under this server process's own shard (so concurrent writers never wait on one
# another's totals), in state order.
_STATE_DELTAS = """
    INSERT INTO url_states AS t (state, shard, n)
    SELECT state, pg_backend_pid(), sum(d) FROM ({rows}) AS c
     GROUP BY state HAVING sum(d) <> 0 ORDER BY state
    ON CONFLICT (state, shard) DO UPDATE SET n = t.n + excluded.n;"""

COUNT_ON_INSERT = (
    """
CREATE FUNCTION urls_count_insert() RETURNS trigger LANGUAGE plpgsql
SET search_path FROM CURRENT AS $$
BEGIN
    UPDATE hosts AS h SET queued = h.queued + d.dq, in_flight = h.in_flight + d.dl,
           due_hint = CASE WHEN d.dq = 0 THEN h.due_hint WHEN h.queued = 0 THEN d.due
                           ELSE LEAST(h.due_hint, d.due) END
      FROM (SELECT host_id,
                   count(*) FILTER (WHERE state = 'queued') AS dq,
                   count(*) FILTER (WHERE state = 'leased') AS dl,
                   min(due_at) FILTER (WHERE state = 'queued') AS due
              FROM new_rows GROUP BY host_id) AS d
     WHERE h.host_id = d.host_id AND (d.dq <> 0 OR d.dl <> 0);"""
    + _STATE_DELTAS.format(rows="SELECT state, 1 AS d FROM new_rows")
    + """
    RETURN NULL;
END
$$"""
)

COUNT_ON_UPDATE = (
    """
CREATE FUNCTION urls_count_update() RETURNS trigger LANGUAGE plpgsql
SET search_path FROM CURRENT AS $$
BEGIN
    UPDATE hosts AS h SET queued = h.queued + d.dq, in_flight = h.in_flight + d.dl,
           due_hint = CASE WHEN d.due IS NULL THEN h.due_hint
                           WHEN h.queued = 0 OR h.due_hint IS NULL THEN d.due
                           ELSE LEAST(h.due_hint, d.due) END
      FROM (SELECT host_id, sum(dq) AS dq, sum(dl) AS dl, min(due) AS due
              FROM (SELECT host_id, (state = 'queued')::int AS dq, (state = 'leased')::int AS dl,
                           CASE WHEN state = 'queued' THEN due_at END AS due
                      FROM new_rows
                    UNION ALL
                    SELECT host_id, -(state = 'queued')::int, -(state = 'leased')::int, NULL
                      FROM old_rows) AS c
             GROUP BY host_id
            HAVING sum(dq) <> 0 OR sum(dl) <> 0 OR min(due) IS NOT NULL) AS d
     WHERE h.host_id = d.host_id;"""
    + _STATE_DELTAS.format(
        rows="SELECT state, 1 AS d FROM new_rows UNION ALL SELECT state, -1 FROM old_rows"
    )
    + """
    RETURN NULL;
END
$$"""
)

COUNT_ON_DELETE = (
    """
CREATE FUNCTION urls_count_delete() RETURNS trigger LANGUAGE plpgsql
SET search_path FROM CURRENT AS $$
BEGIN
    UPDATE hosts AS h SET queued = h.queued - d.dq, in_flight = h.in_flight - d.dl
      FROM (SELECT host_id,
                   count(*) FILTER (WHERE state = 'queued') AS dq,
                   count(*) FILTER (WHERE state = 'leased') AS dl
              FROM old_rows GROUP BY host_id) AS d
     WHERE h.host_id = d.host_id AND (d.dq <> 0 OR d.dl <> 0);"""
    + _STATE_DELTAS.format(rows="SELECT state, -1 AS d FROM old_rows")
    + """
    RETURN NULL;
END
$$"""
)

#: The planner settings migration 7 turns off in the count functions.
_JOIN_KNOBS = ("enable_hashjoin", "enable_mergejoin")
#: Schema 9: the update trigger leaves a statement whose writer counted its rows itself
#: (``PgStore.grant`` sets this transaction-local setting around its UPDATE of urls).
_SKIP_COUNTED = """    IF current_setting('idemcrawl.counted', true) = 'on' THEN
        RETURN NULL;
    END IF;
"""

#: Schema 10: the columns ANALYZE skips. Kept: every indexed column and every column the
#: frontier's scheduling statements filter, join or order on (urls: url_id, url_key, host_id,
#: state, priority, due_at, kind, lease_expires_at, next_fetch_at; the keys of the others;
#: every column of hosts but its robots.txt body and meta).
_NO_STATISTICS: dict[str, tuple[str, ...]] = {
    "urls": (
        "url", "reason", "version", "depth", "discovered_at", "lease_owner", "lease_token",
        "leased_at", "attempts", "last_error", "status_code", "fetched_at", "body_bytes",
        "content_hash", "simhash", "etag", "last_modified", "revisit_interval",
        "canonical_hint", "warc_file", "warc_offset", "warc_length", "payload_digest", "hops",
        "redirect_to", "near_dup_of", "stored_file",
    ),
    "records": ("source", "key", "url", "data", "content_hash", "first_seen", "last_changed"),
    "events": (
        "url", "status", "fetched_at", "content_hash", "records", "links", "warc_file",
        "warc_offset", "warc_length", "created_at", "payload_digest",
    ),
    "lease_log": ("kind", "eligible_at", "min_gap", "allowance", "in_flight_before"),
    "hosts": ("robots_body", "robots_meta"),
}  # fmt: skip

# The same logical schema and version numbers as the SQLite backend (see sqlite.py for what each
# column is for). Each migration is a tuple of statements, applied in one transaction.
MIGRATIONS: list[tuple[str, ...]] = [
    (
        "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
        "CREATE TABLE counters (name TEXT PRIMARY KEY, value BIGINT NOT NULL DEFAULT 0)",
        "CREATE TABLE seeds (host_key TEXT PRIMARY KEY)",
        """
CREATE TABLE hosts (
    host_key          TEXT PRIMARY KEY,
    next_allowed_at   DOUBLE PRECISION NOT NULL DEFAULT 0,
    in_flight         INTEGER NOT NULL DEFAULT 0,
    queued            INTEGER NOT NULL DEFAULT 0,
    max_in_flight     INTEGER,
    delay             DOUBLE PRECISION,
    backoff_until     DOUBLE PRECISION NOT NULL DEFAULT 0,
    error_streak      INTEGER NOT NULL DEFAULT 0,
    latency_ewma      DOUBLE PRECISION,
    paused            INTEGER NOT NULL DEFAULT 0,
    pause_reason      TEXT,
    robots_state      TEXT,
    robots_body       BYTEA,
    robots_fetched_at DOUBLE PRECISION,
    robots_expires_at DOUBLE PRECISION,
    crawl_delay       DOUBLE PRECISION,
    budget_day        TEXT,
    budget_used       INTEGER NOT NULL DEFAULT 0
)""",
        "CREATE INDEX hosts_ready ON hosts (next_allowed_at) WHERE queued > 0",
        """
CREATE TABLE urls (
    url_id           BIGSERIAL PRIMARY KEY,
    url              TEXT NOT NULL UNIQUE,
    host_key         TEXT NOT NULL,
    state            TEXT NOT NULL DEFAULT 'queued',
    reason           TEXT,
    version          INTEGER NOT NULL DEFAULT 1,
    priority         INTEGER NOT NULL DEFAULT 0,
    depth            INTEGER NOT NULL DEFAULT 0,
    due_at           DOUBLE PRECISION NOT NULL DEFAULT 0,
    discovered_at    DOUBLE PRECISION NOT NULL DEFAULT 0,
    lease_owner      TEXT,
    lease_token      BIGINT,
    lease_expires_at DOUBLE PRECISION,
    leased_at        DOUBLE PRECISION,
    attempts         INTEGER NOT NULL DEFAULT 0,
    last_error       TEXT,
    status_code      INTEGER,
    fetched_at       DOUBLE PRECISION,
    body_bytes       BIGINT,
    content_hash     TEXT,
    simhash          BIGINT,
    etag             TEXT,
    last_modified    TEXT,
    next_fetch_at    DOUBLE PRECISION,
    revisit_interval DOUBLE PRECISION,
    canonical_hint   TEXT,
    warc_file        TEXT,
    warc_offset      BIGINT,
    warc_length      BIGINT,
    payload_digest   TEXT
)""",
        "CREATE INDEX urls_queue ON urls (host_key, priority DESC, due_at) WHERE state = 'queued'",
        "CREATE INDEX urls_leases ON urls (lease_expires_at) WHERE state = 'leased'",
        "CREATE INDEX urls_state ON urls (state)",
        COUNT_QUEUED_ON_INSERT,
        COUNT_QUEUED_ON_UPDATE,
        COUNT_QUEUED_ON_DELETE,
        "CREATE TRIGGER urls_insert AFTER INSERT ON urls REFERENCING NEW TABLE AS new_rows "
        "FOR EACH STATEMENT EXECUTE FUNCTION urls_count_insert()",
        "CREATE TRIGGER urls_state AFTER UPDATE ON urls "
        "REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows "
        "FOR EACH STATEMENT EXECUTE FUNCTION urls_count_update()",
        "CREATE TRIGGER urls_delete AFTER DELETE ON urls REFERENCING OLD TABLE AS old_rows "
        "FOR EACH STATEMENT EXECUTE FUNCTION urls_count_delete()",
        """
CREATE TABLE records (
    record_id    TEXT PRIMARY KEY,
    source       TEXT NOT NULL,
    key          TEXT NOT NULL,
    url          TEXT NOT NULL,
    data         TEXT NOT NULL,
    content_hash TEXT NOT NULL,
    first_seen   DOUBLE PRECISION NOT NULL,
    last_changed DOUBLE PRECISION NOT NULL
)""",
        """
CREATE TABLE events (
    event_id     BIGSERIAL PRIMARY KEY,
    url_id       BIGINT NOT NULL,
    url_version  INTEGER NOT NULL,
    url          TEXT NOT NULL,
    status       INTEGER,
    fetched_at   DOUBLE PRECISION,
    content_hash TEXT,
    records      INTEGER NOT NULL DEFAULT 0,
    links        INTEGER NOT NULL DEFAULT 0,
    warc_file    TEXT,
    warc_offset  BIGINT,
    warc_length  BIGINT,
    created_at   DOUBLE PRECISION NOT NULL,
    UNIQUE (url_id, url_version)
)""",
        "CREATE TABLE deliveries (consumer TEXT PRIMARY KEY, cursor BIGINT NOT NULL DEFAULT 0)",
        """
CREATE TABLE partitions (
    partition  INTEGER PRIMARY KEY,
    owner      TEXT,
    epoch      BIGINT NOT NULL DEFAULT 0,
    expires_at DOUBLE PRECISION NOT NULL DEFAULT 0
)""",
    ),
    # 2: robots.txt as a URL kind, host back-off reasons, the politeness audit log.
    (
        "ALTER TABLE urls ADD COLUMN kind TEXT NOT NULL DEFAULT 'page'",
        "ALTER TABLE hosts ADD COLUMN robots_meta TEXT",
        "ALTER TABLE hosts ADD COLUMN robots_failures INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE hosts ADD COLUMN backoff_reason TEXT",
        """
CREATE TABLE lease_log (
    id               BIGSERIAL PRIMARY KEY,
    host_key         TEXT NOT NULL,
    url_id           BIGINT NOT NULL,
    kind             TEXT NOT NULL,
    granted_at       DOUBLE PRECISION NOT NULL,
    eligible_at      DOUBLE PRECISION NOT NULL,
    min_gap          DOUBLE PRECISION NOT NULL,
    allowance        INTEGER NOT NULL,
    in_flight_before INTEGER NOT NULL
)""",
        "CREATE INDEX lease_log_host ON lease_log (host_key, granted_at)",
    ),
    # 3: recrawl rounds, redirects, content dedup, per-host budgets (see sqlite.py).
    (
        "ALTER TABLE urls ADD COLUMN hops INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE urls ADD COLUMN redirect_to TEXT",
        "ALTER TABLE urls ADD COLUMN near_dup_of BIGINT",
        "ALTER TABLE urls ADD COLUMN stored_file TEXT",
        "ALTER TABLE hosts ADD COLUMN budget INTEGER",
        "ALTER TABLE events ADD COLUMN payload_digest TEXT",
        "CREATE INDEX urls_refetch ON urls (next_fetch_at) WHERE state = 'done'",
        "CREATE INDEX urls_due ON urls (due_at) WHERE state = 'queued'",
        """
CREATE TABLE bodies (
    payload_digest TEXT PRIMARY KEY,
    url_id         BIGINT NOT NULL,
    url            TEXT NOT NULL,
    warc_file      TEXT NOT NULL,
    warc_offset    BIGINT NOT NULL,
    warc_length    BIGINT NOT NULL,
    first_seen     DOUBLE PRECISION NOT NULL
)""",
    ),
    # 4: requests as data and the cookie jar (issue 16; see sqlite.py).
    (
        """
CREATE TABLE requests (
    url_id   BIGINT PRIMARY KEY,
    method   TEXT NOT NULL,
    callback TEXT,
    data     TEXT,
    headers  TEXT,
    body     BYTEA,
    render   INTEGER NOT NULL DEFAULT 0
)""",
        """
CREATE TABLE cookies (
    domain    TEXT NOT NULL,
    path      TEXT NOT NULL,
    name      TEXT NOT NULL,
    value     TEXT NOT NULL,
    expires   DOUBLE PRECISION,
    secure    INTEGER NOT NULL,
    host_only INTEGER NOT NULL,
    PRIMARY KEY (domain, path, name)
)""",
    ),
    # 5: SQLite dropped its per-row insert trigger (its inserts count their hosts themselves);
    # the statement-level triggers here already do one write per host per statement.
    ("COMMENT ON TRIGGER urls_insert ON urls IS 'hosts.queued/in_flight of inserted URLs (I6)'",),
    # 6: fewer bytes per URL (issue 14; see sqlite.py): URL rows and their queue index name the
    # host by an integer id, the URL key is unique through a hash index, the index on
    # urls.state goes, per-state totals live in url_states (one row per state and server
    # process: the triggers' upsert of one shared row per state would serialise every writer
    # up to its COMMIT; stats() sums them).
    (
        "DROP TRIGGER urls_insert ON urls",
        "DROP TRIGGER urls_state ON urls",
        "DROP TRIGGER urls_delete ON urls",
        "DROP FUNCTION urls_count_insert()",
        "DROP FUNCTION urls_count_update()",
        "DROP FUNCTION urls_count_delete()",
        "ALTER TABLE hosts ADD COLUMN host_id SERIAL",
        "ALTER TABLE hosts ADD CONSTRAINT hosts_host_id UNIQUE (host_id)",
        # Every lease and completion changes its hosts' counts (the triggers below): with the
        # ready index's predicate on a column that changes only when the count crosses zero,
        # and room left in each page, such an update is HOT (no new index entries, its dead
        # version pruned in the page) instead of a new wide row version that waits for vacuum.
        "ALTER TABLE hosts ADD COLUMN has_work BOOLEAN GENERATED ALWAYS AS (queued > 0) STORED",
        "DROP INDEX hosts_ready",
        "CREATE INDEX hosts_ready ON hosts (next_allowed_at) WHERE has_work",
        "ALTER TABLE hosts SET (fillfactor = 70)",
        # progress() takes the earliest due time from the hosts' hints, which every URL
        # entering a queue lowers (the triggers), instead of an index of every queued URL.
        "ALTER TABLE hosts ADD COLUMN due_hint DOUBLE PRECISION",
        "DROP INDEX urls_due",
        "INSERT INTO hosts (host_key) SELECT DISTINCT host_key FROM urls ORDER BY 1 "
        "ON CONFLICT DO NOTHING",
        "ALTER TABLE urls ADD COLUMN host_id INTEGER",
        "UPDATE urls SET host_id = h.host_id FROM hosts h WHERE h.host_key = urls.host_key",
        "ALTER TABLE urls ALTER COLUMN host_id SET NOT NULL",
        "DROP INDEX urls_queue",
        "DROP INDEX urls_state",
        "ALTER TABLE urls DROP COLUMN host_key",
        # The URL key's text was indexed whole in a b-tree (89 bytes per URL); a hash index
        # keeps 4 bytes of hash per URL and rechecks the text, and an exclusion constraint
        # over it keeps the key unique (ON CONFLICT DO NOTHING takes it as the arbiter).
        "ALTER TABLE urls DROP CONSTRAINT urls_url_key",
        "ALTER TABLE urls ADD CONSTRAINT urls_url EXCLUDE USING hash (url WITH =)",
        "CREATE INDEX urls_queue ON urls (host_id, priority DESC, due_at) WHERE state = 'queued'",
        "CREATE INDEX urls_deferred ON urls (host_id) WHERE state = 'deferred'",
        # The lease log names the host by its id too (one row per grant).
        "INSERT INTO hosts (host_key) SELECT DISTINCT host_key FROM lease_log ORDER BY 1 "
        "ON CONFLICT DO NOTHING",
        "ALTER TABLE lease_log ADD COLUMN host_id INTEGER",
        "UPDATE lease_log SET host_id = h.host_id FROM hosts h "
        "WHERE h.host_key = lease_log.host_key",
        "ALTER TABLE lease_log ALTER COLUMN host_id SET NOT NULL",
        "DROP INDEX lease_log_host",
        "ALTER TABLE lease_log DROP COLUMN host_key",
        "CREATE INDEX lease_log_host ON lease_log (host_id, granted_at)",
        "CREATE TABLE url_states (state TEXT NOT NULL, shard INTEGER NOT NULL, "
        "n BIGINT NOT NULL DEFAULT 0, PRIMARY KEY (state, shard))",
        "INSERT INTO url_states (state, shard, n) SELECT state, 0, count(*) FROM urls "
        "GROUP BY state",
        "UPDATE hosts SET due_hint = q.d FROM (SELECT host_id, MIN(due_at) AS d FROM urls "
        "WHERE state = 'queued' GROUP BY host_id) AS q WHERE q.host_id = hosts.host_id",
        COUNT_ON_INSERT,
        COUNT_ON_UPDATE,
        COUNT_ON_DELETE,
        "CREATE TRIGGER urls_insert AFTER INSERT ON urls REFERENCING NEW TABLE AS new_rows "
        "FOR EACH STATEMENT EXECUTE FUNCTION urls_count_insert()",
        "CREATE TRIGGER urls_state AFTER UPDATE ON urls "
        "REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows "
        "FOR EACH STATEMENT EXECUTE FUNCTION urls_count_update()",
        "CREATE TRIGGER urls_delete AFTER DELETE ON urls REFERENCING OLD TABLE AS old_rows "
        "FOR EACH STATEMENT EXECUTE FUNCTION urls_count_delete()",
    ),
    # 7: the count triggers' host updates go by hosts_host_id, whatever the batch's size
    # (issue 14). PL/pgSQL plans a statement without parameters once per server process and
    # keeps that plan: planned on the transition table of a 20,000-URL add (the row estimate
    # of a transition table is its size at planning time), "UPDATE hosts ... FROM (the batch's
    # hosts)" became a hash join over a sequential scan of every host, and every later
    # 256-page completion of that process read the whole hosts table (4,184 buffers, 64 of
    # the link insert's 143 ms at 10^5 hosts, growing with the crawl). Without hash and merge
    # joins the only plan left is one index probe per host of the batch, right for 1 host and
    # for 20,000. A later migration that replaces these functions (CREATE OR REPLACE resets
    # their settings) must set both again.
    tuple(
        f"ALTER FUNCTION {fn}() SET {knob} = off"
        for fn in ("urls_count_insert", "urls_count_update", "urls_count_delete")
        for knob in _JOIN_KNOBS
    ),
    # 8: SQLite's grants and completions count their hosts themselves (sqlite.py); the
    # statement-level triggers here already write each host once per statement. The version
    # numbers are shared: nothing changes here but the version.
    (),
    # 9: the URL key is a b-tree on a 64-bit hash, not the hash index under an exclusion
    # constraint (issue 14). An insert through the exclusion constraint probed the hash index
    # three times per URL (before the row, its own entry, the recheck after it), at a random
    # bucket each time, and every new version of a URL row (a grant, a completion) went into
    # it too. ``url_key_of`` puts a hash of the URL's authority (its host) in the high 32 bits
    # and a hash of the whole URL in the low 32: a host's URLs sit together in the index, so a
    # page's links are found and inserted in one leaf. The key is not unique (two URLs may
    # share a hash): uniqueness (I1) is the insert's ``NOT EXISTS`` on key and text, under the
    # host row locks every writer of a host's URLs holds to COMMIT (``PgStore.insert_urls``).
    # Key cost per 2,560 links at 10^6 URLs: 7.7 ms of backend CPU against 14.1 (A/B in one
    # session), and 36 MB of index against 40.
    (
        "CREATE FUNCTION url_key_of(u text) RETURNS bigint LANGUAGE sql IMMUTABLE STRICT "
        "PARALLEL SAFE AS $$ SELECT (hashtext(split_part(u, '/', 3))::bigint << 32) "
        "| (hashtext(u)::bigint & 4294967295) $$",
        "ALTER TABLE urls ADD COLUMN url_key BIGINT GENERATED ALWAYS AS (url_key_of(url)) STORED",
        "CREATE INDEX urls_key ON urls (url_key)",
        "ALTER TABLE urls DROP CONSTRAINT urls_url",
        # The grant counts its own URLs (PgStore.grant: queued -> leased per host, written
        # with the host's token, and the per-state totals), so the update trigger skips its
        # statement: it wrote each granted host a second time. Replacing the function resets
        # its settings: the join knobs of migration 7 are set again.
        COUNT_ON_UPDATE.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1).replace(
            "BEGIN\n", "BEGIN\n" + _SKIP_COUNTED, 1
        ),
        *(f"ALTER FUNCTION urls_count_update() SET {knob} = off" for knob in _JOIN_KNOBS),
    ),
    # 10: statistics only where a plan can use them (issue 14). The frontier analyzes its own
    # tables (``Scheduler._keep_statistics``), and ANALYZE's cost is per column sampled:
    # sorting 30,000 URLs, hashes and record bodies for columns no index holds and no hot
    # statement filters on. With STATISTICS 0 ANALYZE skips them (the planner uses its
    # defaults there, as it did for every column before the first ANALYZE): urls' ANALYZE of
    # 20,000 rows took 80 ms of backend CPU instead of 230-260, and one ANALYZE of all the
    # tables was 8-15 % of the server's CPU in a 20,000-page bench crawl (session 9).
    tuple(
        f"ALTER TABLE {table} " + ", ".join(f"ALTER COLUMN {c} SET STATISTICS 0" for c in cols)
        for table, cols in _NO_STATISTICS.items()
    ),
    # 11: the refetch index holds only the URLs that have a refetch time (issue 14). Every
    # completion makes a new version of its URL's row (not HOT: its state is in the partial
    # indexes' predicates), and each new version of a done URL went into ``urls_refetch`` even
    # with ``next_fetch_at`` NULL, as every URL of a crawl without recrawl has it: an index
    # entry (and its WAL) per page that no statement reads. Its two readers ask for a time
    # (``due_rounds``: ``next_fetch_at <= now``; ``progress``: ``IS NOT NULL``, session 9),
    # which implies the new predicate, so both keep the index.
    (
        "DROP INDEX urls_refetch",
        "CREATE INDEX urls_refetch ON urls (next_fetch_at) "
        "WHERE state = 'done' AND next_fetch_at IS NOT NULL",
    ),
    # 12: the lease log is written once per grant and read only whole (issue 14): the audit's
    # window over each host's grants sorts the log (``SQLStore.audit_facts``), the eligibility
    # histogram scans it, and nothing looks one grant up. Its two indexes, ``lease_log_host``
    # and the primary key, were two index insertions and two WAL records of the 8 a granted
    # URL wrote (pg_stat_statements, ``bench crawl``, session 14: 6.3 instead of 8.3 WAL
    # records, 605 instead of 761 bytes), and ~75 bytes of index per grant (``bench frontier
    # --hosts 10000 --urls-per-host 10 --completions 20000``: 72.3 -> 61.7 ms of server CPU
    # per 1,000 grants, 329 -> 324 bytes per known URL).
    # ``id`` keeps its sequence: it still orders the log (ties of the window, the newest
    # delays).
    (
        "DROP INDEX lease_log_host",
        "ALTER TABLE lease_log DROP CONSTRAINT lease_log_pkey",
    ),
    # 13: why URLs failed for good, with a spider exception's traceback tail, in a side table
    # the failure path alone writes (see sqlite.py); a crawl's earlier failures are copied in.
    (
        """
CREATE TABLE failures (
    url_id    BIGINT PRIMARY KEY,
    reason    TEXT NOT NULL,
    trace     TEXT,
    failed_at DOUBLE PRECISION NOT NULL
)""",
        "INSERT INTO failures (url_id, reason, failed_at) "
        "SELECT url_id, COALESCE(reason, last_error, 'unknown'), due_at FROM urls "
        "WHERE state = 'failed'",
    ),
]
assert len(MIGRATIONS) == SCHEMA_VERSION
