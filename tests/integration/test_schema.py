"""The schema: a baseline migration plus repeatable function files applied by checksum.

A function file runs again when its checksum differs from the one recorded (here: a
function changed by hand in the database is put back, and the record updated); files whose
checksum matches are left alone; every function is executable by the server's role only; a
database created with the numbering that preceded the baseline is refused with a message
that says so.
"""
import glob
import hashlib
import os

from harness import Server, new_database, psql

FUNCTIONS = os.path.join(os.path.dirname(__file__), "..", "..", "storage", "functions")


def test_function_files_apply_by_checksum():
    dsn = new_database("schema")
    srv = Server(dsn).start()
    try:
        files = sorted(os.path.basename(p) for p in glob.glob(os.path.join(FUNCTIONS, "*.sql")))
        rows = dict(line.split("|") for line in
                    psql(dsn, "SELECT name, checksum FROM schema_functions").splitlines())
        assert sorted(rows) == files
        for name in files:
            with open(os.path.join(FUNCTIONS, name), "rb") as f:
                assert rows[name] == hashlib.sha256(f.read()).hexdigest(), name
        applied = dict(line.split("|") for line in psql(
            dsn, "SELECT name, applied_at FROM schema_functions").splitlines())
        # a function changed behind the server's back, with its file's record made stale
        psql(dsn, "CREATE OR REPLACE FUNCTION engram_ts(ms bigint) RETURNS timestamptz "
                  "LANGUAGE sql IMMUTABLE AS $$ SELECT 'epoch'::timestamptz $$")
        psql(dsn, "UPDATE schema_functions SET checksum = 'stale' WHERE name = '10_core.sql'")
        srv.stop()
        srv.start()
        assert psql(dsn, "SELECT engram_ts(86400000) = '1970-01-02 00:00:00+00'") == "t"
        after = dict(line.split("|") for line in psql(
            dsn, "SELECT name, applied_at FROM schema_functions").splitlines())
        assert after["10_core.sql"] != applied["10_core.sql"]
        assert all(after[n] == applied[n] for n in files if n != "10_core.sql")
        # the server's role executes every function; nobody else does
        assert psql(dsn, "SELECT count(*) FROM pg_proc p WHERE p.pronamespace = "
                         "'public'::regnamespace AND p.proname LIKE 'engram%' AND "
                         "has_function_privilege('public', p.oid, 'EXECUTE')") == "0"
        assert psql(dsn, "SELECT count(*) FROM pg_proc p WHERE p.pronamespace = "
                         "'public'::regnamespace AND p.proname LIKE 'engram%' AND NOT "
                         "has_function_privilege('engram_app', p.oid, 'EXECUTE')") == "0"
        assert int(psql(dsn, "SELECT count(*) FROM pg_proc WHERE proname LIKE 'engram%'")) > 60
        srv.stop()
    finally:
        srv.cleanup()


def test_pre_baseline_database_is_refused():
    dsn = new_database("old")
    psql(dsn, "CREATE TABLE schema_migrations (version integer PRIMARY KEY, name text NOT NULL,"
              " applied_at timestamptz NOT NULL DEFAULT now());"
              "INSERT INTO schema_migrations (version, name) VALUES (1, 'init'), (2, 'memory_api')")
    srv = Server(dsn)
    try:
        srv.start(wait=False)
        assert srv.proc.wait(timeout=60) != 0
        assert "preceded the baseline" in srv.log_text()
    finally:
        srv.cleanup()
