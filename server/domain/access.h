/* server/domain/access.h: access counts waiting to be written to PostgreSQL.
 *
 * Every memory a search or context call returns counts as an access. The index sees the
 * access at once; PostgreSQL gets the counts in batches: each worker keeps one log and
 * writes it at most once every access_flush_ms (5 s by default; a worker that wrote none
 * for that long writes at its next tick; and when it shuts down), so a crash
 * loses at most the last few seconds of access counts, never a memory. A memory read many
 * times within that time is one entry. Not thread-safe: one log per worker.
 */
#ifndef ENGRAM_SERVER_ACCESS_H
#define ENGRAM_SERVER_ACCESS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "db.h"

typedef struct access_log access_log;

/* One memory's pending accesses. */
typedef struct access_entry {
    int64_t tenant;
    uint64_t id;
    uint64_t count;
    int64_t last_ms;
} access_entry;

/* access_log_create returns an empty log or NULL; access_log_destroy frees it. */
access_log *access_log_create(void);
void access_log_destroy(access_log *l);

/* access_log_add counts one access at now_ms to each of n memories of tenant. Returns 0
 * or -ENOMEM (the accesses are then lost: they are statistics, not data). */
int access_log_add(access_log *l, int64_t tenant, const uint64_t *ids, size_t n, int64_t now_ms);

/* access_log_merge adds back entries that could not be written (counts add up). */
int access_log_merge(access_log *l, const access_entry *e, size_t n);

/* access_log_count returns how many memories have pending accesses. */
size_t access_log_count(const access_log *l);

/* access_log_take moves every pending entry into a malloc'd array (*out, *n; the caller
 * frees it) and empties the log. Returns 0 or -ENOMEM (the log is unchanged then). */
int access_log_take(access_log *l, access_entry **out, size_t *n);

/* An access writer sends a log's counts to PostgreSQL (SQL_MEMORY_TOUCH), one statement at a
 * time: the first at the first tick with counts, then at most once every flush_ms, and at
 * every tick while draining. A statement that fails gives its counts back to the log (unless
 * the backlog has grown past a million memories: then they are dropped, and logged).
 *
 * access_writer_create makes the writer of l (not owned) on pool db (not owned), whose
 * messages name worker idx; NULL when out of memory. access_writer_tick sends what is due;
 * access_writer_idle tells whether nothing is pending or in flight. Destroy after the pool
 * (its callbacks reach the writer). Worker thread only. */
typedef struct access_writer access_writer;
access_writer *access_writer_create(access_log *l, db_pool *db, unsigned idx);
void access_writer_tick(access_writer *aw, uint64_t now_ms, unsigned flush_ms, bool draining);
bool access_writer_idle(const access_writer *aw);
void access_writer_destroy(access_writer *aw);

#endif
