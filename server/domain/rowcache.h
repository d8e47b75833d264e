/* server/domain/rowcache.h: a process-wide cache of memory rows, so that a search whose results
 * are all cached answers without PostgreSQL.
 *
 * An entry is a copy of a memory's row as PostgreSQL returned it, tagged with the row's
 * change number (memrow.seq). A caller asks for the version it knows to be current (the
 * index's metadata carries the change that last wrote each memory), so an entry of an
 * older version is never returned, whichever process changed the memory: every write of a
 * row's fields bumps its change number. Access counts and last access times, which reads
 * change without a change number, are not taken from the cache (the index holds them).
 *
 * Least recently used entries are dropped above the byte budget. The table is split into
 * stripes, each with its own lock and a share of the budget.
 *
 * Thread-safety: every function may be called from any thread.
 */
#ifndef ENGRAM_SERVER_ROWCACHE_H
#define ENGRAM_SERVER_ROWCACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "memrow.h"

typedef struct rowcache rowcache;

/* rc_create returns a cache holding at most about bytes of rows (0: a cache that holds
 * nothing), or NULL when out of memory. rc_destroy frees it (NULL is a no-op). */
rowcache *rc_create(size_t bytes);
void rc_destroy(rowcache *c);

/* rc_get copies the row of memory id of tenant, if the cache holds it at change seq, into
 * *out; its strings are allocated with alloc(ctx, n) (e.g. a request's arena) and live as
 * long as those allocations. Returns true when found. */
bool rc_get(rowcache *c, int64_t tenant, uint64_t id, uint64_t seq, memrow *out,
            void *(*alloc)(void *ctx, size_t n), void *ctx);

/* rc_put stores a copy of row m of tenant (replacing an older version; an entry of a newer
 * change number is kept). Rows larger than a stripe's budget are not stored. */
void rc_put(rowcache *c, int64_t tenant, const memrow *m);

/* rc_forget_tenant drops every row of tenant: the database no longer has the versions they
 * are tagged with (a failover lost changes whose numbers will be reused). Walks the whole
 * cache; for rare events. */
void rc_forget_tenant(rowcache *c, int64_t tenant);

/* rc_stats reports the entries and bytes held, and the hits and misses so far. */
void rc_stats(rowcache *c, uint64_t *entries, uint64_t *bytes, uint64_t *hits, uint64_t *misses);

#endif
