/* storage/sql.h: every prepared statement of the memory API, in one table.
 *
 * The table is handed to db_pool_create so each connection prepares all of them; callers
 * name a statement by its enum value. Column orders of the row shapes are fixed here and
 * parsed by memrow.c.
 */
#ifndef ENGRAM_STORAGE_SQL_H
#define ENGRAM_STORAGE_SQL_H

#include "db.h"

typedef enum sql_stmt {
    SQL_PING,               /* () -> 1 */
    SQL_AUTH_LOOKUP,        /* (key_id) -> key id, tenant id, key hash, tier, name, dim, provider */
    SQL_MEMORY_STORE_BATCH, /* engram_memory_store_batch(...) -> idx, replay, created, META */
    SQL_MEMORY_STORE_GROUP, /* engram_memory_store_group(..., idempotency keys, fingerprints)
                             * -> idx, replay, created, META, err_state, err_message,
                             * err_detail */
    SQL_MEMORY_STORE_AS,    /* SQL_MEMORY_STORE_BATCH's parameters and rows; on Citus through
                             * engram_memory_store_as, which binds row-level security to its
                             * tenant itself (a store group of several tenants, gcommit.h) */
    SQL_MEMORY_STORE_SOLO,  /* the parameters and rows of SQL_MEMORY_STORE_GROUP for a group
                             * of one request of a few memories (run with engram.tenant_id
                             * set); no rows when it does not fit the tier (or the tenant is
                             * gone) */
    SQL_MEMORY_GET,         /* (tenant, ids[]) -> MEMROW */
    SQL_MEMORY_DELETE,      /* (tenant, ids[]) -> id, seq */
    SQL_MEMORY_UPDATE,      /* engram_memory_update(...) -> version, updated, META */
    SQL_MEMORY_ARCHIVE,     /* (tenant, ids[], archive?, reason, limits[3]) -> META */
    SQL_MEMORY_HISTORY,     /* (tenant, id) -> version rows */
    SQL_MEMORY_FEEDBACK,    /* (tenant, cited[], injected[]) -> cited?, counts, META */
    SQL_MEMORY_TOUCH,       /* (tenants[], ids[], counts[], at_ms[]) -> entries */
    SQL_NOTIFY_CHANGES,     /* ("tenant:seq"[]) -> count: NOTIFY engram_changes of each;
                             * its commit does not wait for the disk (it wrote no data) */
    SQL_MEMORY_ATTRS_IDS,   /* (tenant, attrs containment doc) -> ids */
    SQL_MEMORY_TEXT_SEARCH, /* FILTER params, query, limit -> id, rank */
    SQL_MEMORY_LIST, /* FILTER params, order, sign, cursor key, cursor id, limit -> MEMROW, key */
    SQL_MEMORY_LIST_EMB,      /* as SQL_MEMORY_LIST, plus the embedding as the last column */
    SQL_MEMORY_DELETE_LOCK,   /* (tenant) -> last memory id; takes the tenant row's lock */
    SQL_MEMORY_DELETE_COUNT,  /* FILTER params, owner agent, owner clade -> count */
    SQL_MEMORY_DELETE_FILTER, /* FILTER params, owner agent, owner clade, last id or NULL,
                               * limit, after id or NULL -> id, seq of those deleted */
    SQL_MEMORY_STATS,         /* (tenant) -> type, scope, count, archived, oldest, newest, bytes */
    SQL_TENANT_CREATE,        /* (name, tier, provider, model, dim, key name, key id, key hash hex,
                               * index engine or NULL) -> tenant id, key id: the tenant and its
                               * first key at once */
    SQL_TENANT_INDEX_ENGINE,  /* (tenant) -> the tenant's index engine, NULL: the server's */
    SQL_KEY_TOUCH,            /* (key row) */
    SQL_QUERY_RESERVE,        /* (tenant, limits[3], holder, used, want, lease ms) -> granted,
                               * used, limit, resets_ms, others */
    SQL_SYNC_OFF,             /* () this transaction commits without waiting for the disk */
    SQL_TENANT_USAGE,      /* (tenant) -> tier, memories, queries today, bytes, resets_ms, archived,
                            * sessions, memory bytes, model calls, tokens in, out, cost, chat_model */
    SQL_ADMIN_TENANT_GET,  /* (id, name, default engine) -> json */
    SQL_ADMIN_TENANT_LIST, /* (after id, limit, default engine) -> json array */
    SQL_ADMIN_TENANT_UPDATE, /* (id, name, new name, tier, engine, default engine, chat model,
                              * embedding provider, model, dim, cancel re-embedding) -> json,
                              * id */
    SQL_ADMIN_TENANT_DELETE, /* (id, name) -> tenant id */
    SQL_ADMIN_KEY_CREATE,    /* (id, name, key name, key id, key hash hex) -> tenant, key row, ms */
    SQL_ADMIN_KEY_LIST,      /* (id, name) -> json array */
    SQL_ADMIN_KEY_REVOKE,    /* (key row) -> tenant id */
    SQL_CONSOLIDATION_RUNS,  /* (tenant, limit, before id) -> run rows, newest first */
    SQL_DREAM_STATE,         /* (tenant) -> the auto-dream state as JSON (tenant.dream) */
    SQL_READ_FLOOR,          /* (tenant) -> change_seq, on a standby: see req_submit_read */
    SQL_REEMBED_STATE,       /* (tenant) -> the re-embedding in progress as JSON, NULL: none */
    SQL__COUNT
} sql_stmt;

extern const db_stmt_def sql_stmts[SQL__COUNT];

/* sql_def returns statement s of the table (db_query.stmt, pgsync_exec_stmt). */
static inline const db_stmt_def *sql_def(sql_stmt s)
{
    return &sql_stmts[s];
}

/* sql_init gathers every module's statement table into one array (call once at start,
 * before any pool exists); sql_all returns it; sql_fini frees it. */
int sql_init(void);
const db_stmt_def *sql_all(size_t *n);
void sql_fini(void);

/* sql_use_citus gives the statements that a Citus cluster needs written differently their
 * Citus text in sql_all's array (same names and parameters): call after sql_init, before
 * any pool exists, when the database is a Citus cluster. Returns 0, or -ENOENT when a
 * Citus form names no statement (a table that changed). */
int sql_use_citus(void);

/* The columns of a memory row, in the order memrow_parse expects (text format). */
/* A memory m's access counts not folded into its row yet (memory_access, see
 * migrations/0001_baseline.sql), and its last access time and access count with them. The
 * statements that use them all have the tenant as $1, named by value: Citus routes a query
 * to one shard only when every table in it is tied to a value of the distribution column
 * (with pa.tenant_id = m.tenant_id, memory.get ran on every shard of memories: 275 ms
 * against 7 ms for one shard, bench/citus-cost.sh). */
#define SQL_PENDING_ACCESS(col)                                                                    \
    "(SELECT pa." col " FROM memory_access pa WHERE pa.tenant_id = $1::bigint AND pa.id = m.id)"
#define SQL_LAST_ACCESSED_MS                                                                       \
    "engram_ms(greatest(m.last_accessed_at, " SQL_PENDING_ACCESS("last_accessed_at") "))"
#define SQL_ACCESS_COUNT "(m.access_count + COALESCE(" SQL_PENDING_ACCESS("access_count") ", 0))"

#define SQL_MEMROW_COLS                                                                            \
    "m.id, m.agent_id, m.clade_id, m.scope, m.type, m.content, m.importance, m.metadata::text, "   \
    "engram_ms(m.created_at), engram_ms(m.updated_at), " SQL_LAST_ACCESSED_MS                      \
    ", " SQL_ACCESS_COUNT                                                                          \
    ", engram_ms(m.expires_at), engram_ms(m.archived_at), m.version, m.seq, "                      \
    "m.pinned, m.archived_reason, m.superseded_by, m.merged_into, m.cited_count, "                 \
    "m.injected_count"
#define SQL_MEMROW_NCOLS 22

/* Parameters $2..$17 of the filtered statements (text search, list, delete): see sql.c. */
#define SQL_FILTER_NPARAMS 16

#endif
