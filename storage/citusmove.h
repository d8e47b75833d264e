/* storage/citusmove.h: moving one tenant to a Citus worker (admin.tenant.move).
 *
 * Citus keeps a tenant's rows of every table in one shard group (storage/citus/10_tables.sql:
 * all co-located with tenants). A move first isolates the tenant into a shard group of its
 * own (isolate_tenant_to_new_shard ... 'CASCADE': the split of the group it shared), then
 * moves that group to the target worker (citus_move_shard_placement). The move runs with
 * shard_transfer_mode 'force_logical': Citus copies the rows, follows the writes made
 * meanwhile by logical replication and blocks writes only for the final switch, so stores
 * keep being acknowledged during the move and an acknowledged write is never lost (Citus
 * commits it on the source and replicates it, or it waits for the switch and commits on
 * the target). The split blocks the group's writes while it copies ('block_writes': see
 * split() in citusmove.c for why not 'force_logical'). The nodes need wal_level = logical
 * (and, on PostgreSQL releases that have it, citus in output_plugin_libraries:
 * deploy/citus sets both).
 *
 * Runs blocking statements on c, which must be a connection to the coordinator as the
 * tables' owner or a superuser (Citus checks it), outside any transaction block: a move
 * takes seconds to minutes. Any thread.
 */
#ifndef ENGRAM_STORAGE_CITUSMOVE_H
#define ENGRAM_STORAGE_CITUSMOVE_H

#include <stdbool.h>
#include <stdint.h>

#include <libpq-fe.h>

/* The split fence. A statement that a split's switch overtakes on a worker can be routed by
 * the shard metadata the split just replaced: Citus then fails it ("could not find valid
 * entry for shard"), or a routed UPDATE finds no row and the function goes on with NULLs
 * (seen: engram_memory_store_batch's counters). So every tenant transaction on Citus (the
 * pool's jobs, db.c; the background threads', pgsync_tenant_begin) first takes a shared
 * transaction-level advisory lock on (CMOVE_FENCE_CLASS, the tenant's shard of tenants), and
 * cmove_tenant holds that lock exclusively for the split: the transactions in flight finish
 * before it, the ones that arrive during it wait and then run on the new metadata. A
 * tenant's shard id fits an int4 (Citus numbers shards from 102008). */
#define CMOVE_FENCE_CLASS 0x456e67 /* "Eng" */
#define CMOVE_FENCE_SQL_FMT                                                                        \
    "SELECT pg_advisory_xact_lock_shared(%d, get_shard_id_for_distribution_column('tenants', "     \
    "%lld::bigint)::int)"

/* The split fence of several tenants at once (db_opts.tenants): the class, then the ids as
 * the text of a bigint array's elements ("1,2,3"). */
#define CMOVE_FENCE_MANY_SQL_FMT                                                                   \
    "SELECT count(pg_advisory_xact_lock_shared(%d, "                                               \
    "get_shard_id_for_distribution_column('tenants', t)::int)) FROM unnest('{%s}'::bigint[]) t"

typedef struct cmove_result {
    int64_t shard_id; /* the tenant's shard of tenants afterwards */
    bool split;       /* the tenant shared its shard group and was isolated now */
    bool moved;       /* the group was on another worker and was moved */
    char from[300];   /* "host:port" of the worker that held the tenant before */
    char to[300];     /* "host:port" of the worker that holds it now */
} cmove_result;

/* cmove_tenant moves tenant to the worker host:port (isolating it first when isolate is
 * true and it shares its shard group). A tenant already alone on that worker is left as it
 * is (split and moved false). Returns 0 with *out filled; -ENOENT when the tenant does not
 * exist; -EINVAL when host:port is not an active primary worker of the cluster, or the
 * tenant shares its shard group and isolate is false (moving it would move other tenants);
 * -EIO when a statement failed (err says which and why). err is set on every failure. */
int cmove_tenant(PGconn *c, int64_t tenant, const char *host, int port, bool isolate,
                 cmove_result *out, char *err, size_t errlen);

#endif
