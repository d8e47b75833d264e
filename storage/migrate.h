/* storage/migrate.h: versioned schema migrations, applied at start.
 *
 * Migrations are the files storage/migrations/NNNN_name.sql, embedded in the binary at
 * build time. Each runs in its own transaction and is recorded in schema_migrations; a
 * session-level advisory lock keeps two engramd processes from migrating at once.
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

/* migrate_run applies every migration newer than the database's version, blocking on c.
 * Sets *applied (may be NULL) to how many ran. Returns 0, or -1 with the reason in err
 * (the failing migration is rolled back; earlier ones stay applied). Fails when the
 * database is newer than this binary knows. */
int migrate_run(PGconn *c, int *applied, char *err, size_t errlen);

/* migrate_latest returns the newest version this binary carries. */
int migrate_latest(void);

#endif
