/* storage/migrate.h: the schema, applied at start.
 *
 * Two kinds of files, embedded in the binary at build time:
 * - storage/migrations/NNNN_name.sql: forward-only numbered schema changes (tables,
 *   columns, indexes, policies). Each runs once, in its own transaction, recorded in
 *   schema_migrations. 0001_baseline is the whole schema as first released.
 * - storage/functions/NN_name.sql: the PL/pgSQL and SQL functions, as repeatable
 *   definitions (CREATE OR REPLACE). After the migrations, each file whose SHA-256 differs
 *   from the one recorded in schema_functions runs whole in one transaction (function
 *   bodies are checked when called, not when created, so files may refer to each other
 *   in any order), followed by the privileges every function gets (engram_app only), and
 *   its checksum is recorded. A changed function is a diff of its file.
 * - storage/citus/10_tables.sql and 20_functions.sql: on a Citus cluster (the database has
 *   the citus extension), the schema's distribution: tables distributed by tenant_id or made
 *   reference tables (after the migrations, before the function files), functions
 *   propagated and delegated by p_tenant (after the function files). Idempotent, each run in
 *   one transaction at every migrate_run. A single PostgreSQL never sees them; the function
 *   files run there with "SET search_path FROM CURRENT" spelled out (Citus refuses it).
 *   docs/scaling.md.
 * A session-level advisory lock keeps two engramd processes from migrating at once.
 */
#ifndef ENGRAM_STORAGE_MIGRATE_H
#define ENGRAM_STORAGE_MIGRATE_H

#include <libpq-fe.h>

typedef struct migrate_step {
    int version;
    const char *name;
    const char *sql;
} migrate_step;

extern const migrate_step migrate_steps[];
extern const int migrate_nsteps;

typedef struct migrate_functions {
    const char *name;     /* file name, e.g. "20_memory.sql"; applied in name order */
    const char *checksum; /* SHA-256 of the file, hex */
    const char *sql;
} migrate_functions;

extern const migrate_functions migrate_function_files[];
extern const int migrate_nfunction_files;

/* storage/citus/10_tables.sql and 20_functions.sql */
extern const char migrate_citus_tables[];
extern const char migrate_citus_functions[];

/* migrate_run applies every migration newer than the database's version, then every
 * function file whose checksum changed, blocking on c (a connection whose user owns the
 * schema: not engram_app). Sets *applied (may be NULL) to how many migrations and function
 * files ran, also when it fails. Returns 0; -EIO when a statement failed or the connection
 * broke (the failing migration or function file is rolled back, so the recorded version and
 * checksums stay those of the last step that committed; earlier steps stay applied);
 * -EPROTONOSUPPORT when the database is newer than this binary knows, or was created before
 * the baseline (pre-release numbering), and nothing ran. The reason is in err either way.
 * On a database with the citus extension the Citus files run too (not counted in
 * *applied); their failure is -EIO. On a Citus worker nothing runs: the schema the
 * coordinator applied is checked to be this binary's (-EAGAIN when it is not yet: migrate
 * through the coordinator first; -EPROTONOSUPPORT when newer).
 * The advisory lock is released before it returns. */
int migrate_run(PGconn *c, int *applied, char *err, size_t errlen);

/* migrate_citus says whether c's database has the citus extension: 1 on a Citus
 * coordinator (whose schema migrate_run distributed), 2 on a Citus worker (queries from any
 * node: the schema as the coordinator distributed it), 0 no Citus, -EIO with the reason in
 * err. */
int migrate_citus(PGconn *c, char *err, size_t errlen);

/* migrate_latest returns the newest version this binary carries. */
int migrate_latest(void);

/* A schema to apply: numbered migrations (versions ascending, 1..N) and function files
 * (names ascending). migrate_run applies the embedded one. */
typedef struct migrate_plan {
    const migrate_step *steps;
    int nsteps;
    const migrate_functions *functions;
    int nfunctions;
    const char *citus_tables;    /* on a Citus database, before the functions; NULL: never */
    const char *citus_functions; /* on a Citus database, after the functions */
} migrate_plan;

/* migrate_run_plan is migrate_run with plan in place of the embedded schema, for tests of
 * the upgrade path (a later or a failing migration, a changed function file). */
int migrate_run_plan(PGconn *c, const migrate_plan *plan, int *applied, char *err, size_t errlen);

#endif
