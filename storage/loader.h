/* storage/loader.h: bulk reads that rebuild a tenant's vector index from PostgreSQL.
 *
 * Blocking calls for background threads (index loads and change catch-up), never for a
 * worker serving a request. Rows stream in single-row mode, so memory stays bounded
 * however large the tenant is. c is the caller's connection (pgsync.h), with no transaction
 * open; each call runs its own read-only transaction and leaves none open.
 *
 * Returns, for every function here: 0, or a negative errno with the reason in err:
 *   -EIO      the database: a statement failed or the connection broke (PQstatus tells)
 *   -ENOENT   no such tenant (where a function says so)
 *   -EBADMSG  a row that does not parse (also reported to rowerr.h, by table and column)
 *   -ENOMEM   out of memory
 * The streaming calls take a callback fn that returns 0 to continue or non-zero to stop:
 * that value is returned unchanged, so a positive value is a stop of the caller's own and a
 * negative one an error of the caller's (its -ENOMEM reaches the caller as -ENOMEM). err is
 * cleared before the first call of fn: on a negative value it holds what fn wrote there, or
 * else the errno's text (strerror), so a negative return always comes with a reason. The
 * rest of the result is read and dropped after a stop.
 */
#ifndef ENGRAM_STORAGE_LOADER_H
#define ENGRAM_STORAGE_LOADER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <libpq-fe.h>

#include "memrow.h"

/* What an index needs of one memory. */
typedef struct loader_row {
    memrow_meta meta;      /* present always true; accessed_ms is the last access */
    const char *attrs_key; /* metadata.attrs.key as text, or NULL (loader_live only) */
    /* loader_live only: the content (content_len bytes, not NUL-terminated) and
     * metadata.attrs as JSON text (NULL when absent), for consolidation's text rules */
    const char *content;
    size_t content_len;
    const char *attrs_json;
    const float *vec; /* dim floats, valid during the callback only */
    size_t dim;
} loader_row;

/* loader_tenant streams every memory of tenant to fn, from one consistent snapshot, and
 * sets *seq to the tenant's change number as of that snapshot (every change up to it is in
 * the rows, none after it), in no particular order. A row whose embedding is not dim
 * floats, or any other column of which does not parse, ends the load with -EBADMSG. Returns
 * 0, fn's non-zero value, -EIO, -ENOENT (no such tenant), -EBADMSG or -ENOMEM. */
int loader_tenant(PGconn *c, int64_t tenant, size_t dim, uint64_t *seq,
                  int (*fn)(const loader_row *row, void *ctx), void *ctx, char *err, size_t errlen);

/* loader_changes streams the tenant's changes numbered after `after`, in order: for each,
 * fn(seq, memory id, row) where row is the memory's current state or NULL when it no longer
 * exists (a NULL seq or memory id in the log is -EBADMSG). Sets *upto to the tenant's change
 * number as of the read. citus: c is connected to a Citus cluster (the query is written so
 * Citus routes it to the tenant's shard; on one node the other form plans better). Same
 * returns as loader_tenant. */
int loader_changes(PGconn *c, int64_t tenant, size_t dim, bool citus, uint64_t after,
                   uint64_t *upto,
                   int (*fn)(uint64_t seq, uint64_t id, const loader_row *row, void *ctx),
                   void *ctx, char *err, size_t errlen);

/* loader_live streams the tenant's live memories (not archived, not expired) in id order,
 * with attrs_key, content and attrs_json set, from one snapshot, for consolidation. Same
 * returns as loader_tenant. */
int loader_live(PGconn *c, int64_t tenant, size_t dim, uint64_t *seq,
                int (*fn)(const loader_row *row, void *ctx), void *ctx, char *err, size_t errlen);

/* loader_accessed streams (id, access_count, last_accessed_ms) of the tenant's memories
 * read at or after since_ms (access counts are not changes: an index restored from a
 * snapshot refreshes them this way). Returns as loader_tenant, except that a row that does
 * not parse is reported (rowerr.h) and skipped: the memory keeps the count the index has. */
int loader_accessed(PGconn *c, int64_t tenant, int64_t since_ms,
                    int (*fn)(uint64_t id, int64_t access_count, int64_t last_ms, void *ctx),
                    void *ctx, char *err, size_t errlen);

/* loader_rows reads one page of the tenant's live memory rows (not archived, not expired) as
 * text-format SQL_MEMROW_COLS, newest first: at most limit rows whose id is below before
 * (0: no bound), calling fn(row, ctx) for each (*last: the smallest id read; *n: how many;
 * fewer than limit means the tenant has no more). fn returns 0 to continue, non-zero to
 * stop. For warming the row cache: each page is a transaction of its own, and the rows carry
 * their change numbers. Returns 0, fn's non-zero value, -EIO or -EBADMSG (a tenant that
 * does not exist has no rows: 0 with *n 0). */
int loader_rows(PGconn *c, int64_t tenant, uint64_t before, size_t limit,
                int (*fn)(const memrow *row, void *ctx), void *ctx, uint64_t *last, size_t *n,
                char *err, size_t errlen);

/* loader_index_engine copies the tenant's own choice of index engine (the column
 * tenants.index_engine) into out: "native", "faiss", or "" when it has none (the server's setting
 * applies). Returns 0, -EIO, -ENOENT (no such tenant) or -EBADMSG (a value longer than
 * outlen), with err. */
int loader_index_engine(PGconn *c, int64_t tenant, char *out, size_t outlen, char *err,
                        size_t errlen);

/* loader_instance copies the database's identity into out: its instance id (see migration
 * 0006), a dash and its oid. Returns 0, -EIO, or -EBADMSG when engram_instance does not
 * hold exactly one id that fits in outlen; err says why. */
int loader_instance(PGconn *c, char *out, size_t outlen, char *err, size_t errlen);

#endif
