/* storage/sql.c: the prepared statements (see sql.h). */
#include "sql.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "sql_session.h"
#include "sql_work.h"

/* The filter shared by text search, list and delete by filter. Parameters:
 *   $1 tenant            $2 types text[]         $3 include archived
 *   $4 agent id          $5 clade id             $6 scopes text[]
 *   $7 created after ms  $8 created before ms
 *   $9 tokens, $10 chains, $11 protocols: jsonb[] of containment documents, any-of
 *   $12 strategy containment document     $13 attrs containment document
 *   $14 minimum composite  $15 as-of ms
 *   $16 weights float8[6]: recency, access, explicit, recency days, saturation, usefulness
 *   $17 minimum explicit importance (the author's; compared in float4, as the index holds it)
 * NULL means "no constraint" everywhere. Expired memories never match. The composite counts
 * every access, folded into the row or still pending (SQL_ACCESS_COUNT), as search ranks
 * with it and memory.get reports it. */
#define COMPOSITE                                                                                  \
    "engram_composite_u(engram_composite(m.created_at, " SQL_ACCESS_COUNT ", m.importance, "       \
    "engram_ts($15::bigint), ($16::float8[])[1], ($16::float8[])[2], ($16::float8[])[3], "         \
    "($16::float8[])[4], ($16::float8[])[5]), m.cited_count, m.injected_count, "                   \
    "($16::float8[])[6])"
#define FILTER                                                                                     \
    "m.tenant_id = $1 AND (m.expires_at IS NULL OR m.expires_at > now()) "                         \
    "AND ($2::text[] IS NULL OR m.type = ANY ($2)) "                                               \
    "AND ($3::boolean OR m.archived_at IS NULL) "                                                  \
    "AND (CASE WHEN $4::bigint IS NULL THEN ($6::text[] IS NULL OR m.scope = ANY ($6)) "           \
    "ELSE ((m.scope = 'agent' AND m.agent_id = $4 AND ($6 IS NULL OR 'agent' = ANY ($6))) "        \
    "OR (m.scope = 'clade' AND $5::bigint IS NOT NULL AND m.clade_id = $5 "                        \
    "AND ($6 IS NULL OR 'clade' = ANY ($6))) "                                                     \
    "OR (m.scope = 'tenant' AND ($6 IS NULL OR 'tenant' = ANY ($6)))) END) "                       \
    "AND ($7::bigint IS NULL OR m.created_at > engram_ts($7)) "                                    \
    "AND ($8::bigint IS NULL OR m.created_at < engram_ts($8)) "                                    \
    "AND ($9::jsonb[] IS NULL OR m.metadata @> ANY ($9)) "                                         \
    "AND ($10::jsonb[] IS NULL OR m.metadata @> ANY ($10)) "                                       \
    "AND ($11::jsonb[] IS NULL OR m.metadata @> ANY ($11)) "                                       \
    "AND ($12::jsonb IS NULL OR m.metadata @> $12) "                                               \
    "AND ($13::jsonb IS NULL OR m.metadata @> $13) "                                               \
    "AND ($14::float8 IS NULL OR " COMPOSITE " >= $14) "                                           \
    "AND ($17::float8 IS NULL OR m.importance::float4 >= $17::float4) "

/* The list's sort key for $18 ('created_at', 'importance', 'composite'), times $19 (1 for
 * descending, -1 for ascending); keyset paging continues after ($20, $21). */
#define LIST_KEY                                                                                   \
    "(CASE $18::text WHEN 'created_at' THEN engram_ms(m.created_at)::float8 "                      \
    "WHEN 'importance' THEN m.importance ELSE " COMPOSITE " END) * $19::int"
#define LIST_TAIL                                                                                  \
    " FROM memories m WHERE " FILTER "AND ($20::float8 IS NULL OR (" LIST_KEY                      \
    ", m.id * $19::int) < ($20, $21::bigint)) ORDER BY 1 DESC, 2 DESC LIMIT $22::int"

/* memory.delete by filter: FILTER without visibility ($4, $5 NULL), the memories of owner
 * agent $18 and clade $19 instead; a batch takes up to $21 ids after $22 (NULL: from the
 * first) and up to $20 (NULL: the tenant's last id). */
#define DELETE_FILTER                                                                              \
    FILTER "AND ($18::bigint IS NULL OR m.agent_id = $18) "                                        \
           "AND ($19::bigint IS NULL OR m.clade_id = $19) "

const db_stmt_def sql_stmts[SQL__COUNT] = {
    [SQL_PING] = {"ping", "SELECT 1", 0},
    [SQL_AUTH_LOOKUP] = {"auth_lookup", "SELECT * FROM engram_auth_lookup($1)", 1},

    [SQL_MEMORY_STORE_BATCH] =
        {"memory_store_batch",
         "SELECT * FROM engram_memory_store_batch($1, $2::bigint[], $3, $4, $5, "
         "$6::bigint[], $7::bigint[], $8::text[], $9::text[], $10::text[], "
         "$11::float8[], $12::text[], $13, $14::bigint[], $15::bigint[], "
         "$16::bigint[], $17::bigint[], $18::bigint[], $19::boolean[], $20::bigint)",
         20},
    /* the same on one node (unused there); its Citus form (citus_forms) binds the tenant */
    [SQL_MEMORY_STORE_AS] =
        {"memory_store_as",
         "SELECT * FROM engram_memory_store_batch($1, $2::bigint[], $3, $4, $5, "
         "$6::bigint[], $7::bigint[], $8::text[], $9::text[], $10::text[], "
         "$11::float8[], $12::text[], $13, $14::bigint[], $15::bigint[], "
         "$16::bigint[], $17::bigint[], $18::bigint[], $19::boolean[], $20::bigint)",
         20},
    /* the stores of several requests of any tenants (gcommit.h): no engram.tenant_id */
    [SQL_MEMORY_STORE_GROUP] =
        {"memory_store_group",
         "SELECT * FROM engram_memory_store_group($1::bigint[], $2::integer[], $3::integer[], "
         "$4::bigint[], $5::bigint[], $6::bigint[], $7::text[], $8::text[], $9::text[], "
         "$10::float8[], $11::text[], $12, $13::bigint[], $14::bigint[], $15::bigint[], "
         "$16::bigint[], $17::bigint[], $18::boolean[], $19::bigint[], $20::integer, "
         "$21::text[], $22::text[])",
         22},
    /* One statement, no function: engram_memory_store_group's work for one request of one
     * tenant, for the common case (it fits its tier's limit; the parameters agree). A
     * durable store of one memory took 0.373 to 0.412 ms by pgbench this way against 0.482
     * to 0.587 through the function (its plpgsql and its statements' executor start-ups).
     * Rows only when the tenant's UPDATE took: otherwise none, and the server sends the
     * request through the function, which says why (gcommit.c). Its text search vectors are
     * computed under the tenant's lock: for a few memories only (gc_ops.solo_max_items). */
    [SQL_MEMORY_STORE_SOLO] =
        {"memory_store_solo",
         "WITH p AS (SELECT ($1::bigint[])[1] AS tenant, ($2::integer[])[1] AS n, "
         "($3::integer[])[1] AS dim, $4::bigint[] AS lim, $12::bytea AS emb, "
         "cardinality($1::bigint[]) AS nseg, cardinality($9::text[]) AS nrows, "
         "(SELECT COALESCE(sum(octet_length(x.c) + octet_length(x.m::jsonb::text)), 0) "
         "FROM unnest($9::text[], $11::text[]) AS x (c, m)) AS nbytes), "
         "upd AS (UPDATE tenants t SET change_seq = t.change_seq + p.n, "
         "memory_count = t.memory_count + p.n, memory_bytes = t.memory_bytes + p.nbytes, "
         "memory_id_last = t.memory_id_last + p.n "
         "FROM p WHERE t.id = p.tenant AND p.nseg = 1 AND p.nrows = p.n "
         /* a row another transaction holds is not waited for: the request goes again alone
          * through engram_memory_store_group, which waits a little (p_probe_ms) */
         "AND t.id IN (SELECT x.id FROM tenants x WHERE x.id = p.tenant FOR UPDATE SKIP LOCKED) "
         "AND length(p.emb) = p.n::bigint * p.dim * 4 "
         /* vectors of the tenant's current embedding model only (else the group statement
          * refuses it: EG412, migration 0013) */
         "AND t.embed_gen = ($19::bigint[])[1] "
         "AND (engram_tier_limit(p.lim, t.tier) IS NULL "
         "OR t.memory_count + p.n <= engram_tier_limit(p.lim, t.tier)) "
         "AND (engram_tier_byte_limit(p.lim, t.tier) IS NULL "
         "OR t.memory_bytes + p.nbytes <= engram_tier_byte_limit(p.lim, t.tier)) "
         "RETURNING t.id AS tenant, t.change_seq - p.n AS seq0, t.memory_id_last - p.n AS id0, "
         "p.dim, p.emb), "
         "ins AS (INSERT INTO memories (tenant_id, id, agent_id, clade_id, scope, type, content, "
         "content_tsv, importance, metadata, embedding, created_at, updated_at, "
         "last_accessed_at, access_count, expires_at, pinned, seq) "
         "SELECT u.tenant, u.id0 + a.i, a.agent, a.clade, a.scope, a.type, a.content, "
         "to_tsvector('english', a.content), a.imp, a.md::jsonb, substring(u.emb FROM ((a.i - 1) * "
         "u.dim * 4 + 1)::integer FOR u.dim * 4), "
         "date_trunc('milliseconds', COALESCE(engram_ts(a.cr), now())), "
         "date_trunc('milliseconds', COALESCE(engram_ts(a.up), engram_ts(a.cr), now())), "
         "date_trunc('milliseconds', engram_ts(a.acc)), COALESCE(a.cnt, 0), engram_ts(a.ex), "
         "COALESCE(a.pin, false), u.seq0 + a.i "
         "FROM upd u, unnest($5::bigint[], $6::bigint[], $7::text[], $8::text[], $9::text[], "
         "$10::float8[], $11::text[], $13::bigint[], $14::bigint[], $15::bigint[], "
         "$16::bigint[], $17::bigint[], $18::boolean[]) WITH ORDINALITY AS a (agent, clade, "
         "scope, type, content, imp, md, cr, up, acc, cnt, ex, pin, i) "
         "RETURNING tenant_id, id, seq, agent_id, clade_id, scope, type, importance, created_at, "
         "last_accessed_at, access_count, expires_at, archived_at, pinned), "
         "ch AS (INSERT INTO memory_changes (tenant_id, seq, memory_id, op) "
         "SELECT m.tenant_id, m.seq, m.id, 'u' FROM ins m) "
         "SELECT NULL::integer, false, engram_ms(m.created_at), m.id, m.seq, m.agent_id, "
         "m.clade_id, m.scope, m.type, m.importance, engram_ms(m.created_at), "
         "engram_ms(m.last_accessed_at), m.access_count, engram_ms(m.expires_at), "
         "engram_ms(m.archived_at), m.pinned, NULL::text, NULL::text, NULL::text, NULL::text "
         "FROM ins m ORDER BY m.seq",
         19},
    /* The tenant goes in as an InitPlan value (SELECT $1) that the planner cannot see: with
     * the value itself, a tenant its statistics have not seen is estimated at one row and
     * "tenant_id = $1 AND id = ANY ($2)" was planned as a scan of the whole tenant. */
    [SQL_MEMORY_GET] = {"memory_get",
                        "SELECT " SQL_MEMROW_COLS " FROM memories m WHERE m.tenant_id = (SELECT "
                        "$1::bigint) AND m.id = ANY ($2::bigint[]) AND (m.expires_at IS NULL OR "
                        "m.expires_at > now()) ORDER BY array_position($2::bigint[], m.id)",
                        2},
    [SQL_MEMORY_DELETE] = {"memory_delete",
                           "SELECT id, seq FROM engram_memory_delete($1, $2::bigint[])", 2},
    [SQL_MEMORY_UPDATE] = {"memory_update",
                           "SELECT * FROM engram_memory_update($1, $2, $3, $4, $5, $6, $7, $8, "
                           "$9, $10, $11::bigint[], $12::bigint)",
                           12},
    [SQL_MEMORY_ARCHIVE] =
        {"memory_archive",
         "SELECT 0, 0, x.* FROM engram_memory_set_archived($1, $2::bigint[], $3, "
         "$4, $5::bigint[]) x",
         5},
    [SQL_MEMORY_HISTORY] = {"memory_history",
                            "SELECT v.version, v.content, v.type, v.importance, v.metadata::text, "
                            "engram_ms(v.valid_from), engram_ms(v.replaced_at), v.change, "
                            "v.detail::text, engram_ms(v.expires_at), engram_ms(v.archived_at) "
                            "FROM memory_versions v WHERE v.tenant_id = $1 AND v.memory_id = $2 "
                            "ORDER BY v.version",
                            2},
    [SQL_MEMORY_FEEDBACK] = {"memory_feedback",
                             "SELECT * FROM engram_memory_feedback($1, $2::bigint[], $3::bigint[])",
                             3},
    [SQL_MEMORY_TOUCH] = {"memory_touch",
                          "SELECT engram_memory_touch($1::bigint[], $2::bigint[], $3::bigint[], "
                          "$4::bigint[])",
                          4},
    [SQL_NOTIFY_CHANGES] = {"notify_changes",
                            "SELECT count(pg_notify('engram_changes', x)) FROM unnest($1::text[]) "
                            "AS x, set_config('synchronous_commit', 'off', true) AS a",
                            1},
    [SQL_MEMORY_ATTRS_IDS] = {"memory_attrs_ids",
                              "SELECT m.id FROM memories m WHERE m.tenant_id = $1 AND m.metadata "
                              "@> $2::jsonb",
                              2},
    [SQL_MEMORY_TEXT_SEARCH] = {"memory_text_search",
                                "SELECT m.id, ts_rank_cd(m.content_tsv, q) AS rank FROM memories "
                                "m, websearch_to_tsquery('english', $18) q WHERE " FILTER
                                "AND m.content_tsv @@ q ORDER BY rank DESC, m.id LIMIT $19::int",
                                19},
    [SQL_MEMORY_LIST] = {"memory_list",
                         "SELECT " LIST_KEY ", m.id * $19::int, " SQL_MEMROW_COLS LIST_TAIL, 22},
    [SQL_MEMORY_LIST_EMB] = {"memory_list_emb",
                             "SELECT " LIST_KEY ", m.id * $19::int, " SQL_MEMROW_COLS
                             ", encode(m.embedding, 'base64')" LIST_TAIL,
                             22},
    /* the tenant row's lock (what every memory write takes first), and the last memory id:
     * a delete by filter takes no memory stored after it began */
    [SQL_MEMORY_DELETE_LOCK] = {"memory_delete_lock",
                                "SELECT t.memory_id_last FROM tenants t WHERE t.id = $1 FOR "
                                "UPDATE",
                                1},
    [SQL_MEMORY_DELETE_COUNT] = {"memory_delete_count",
                                 "SELECT count(*) FROM memories m WHERE " DELETE_FILTER, 19},
    [SQL_MEMORY_DELETE_FILTER] = {"memory_delete_filter",
                                  "SELECT d.id, d.seq FROM engram_memory_delete($1, ARRAY(SELECT "
                                  "m.id FROM memories m WHERE " DELETE_FILTER
                                  "AND m.id <= COALESCE($20::bigint, (SELECT t.memory_id_last "
                                  "FROM tenants t WHERE t.id = $1)) AND m.id > COALESCE("
                                  "$22::bigint, 0) ORDER BY m.id LIMIT $21::int)) d",
                                  22},
    [SQL_MEMORY_STATS] = {"memory_stats",
                          "SELECT m.type, m.scope, count(*), count(m.archived_at), "
                          "min(engram_ms(m.created_at)), max(engram_ms(m.created_at)), "
                          "sum(pg_column_size(m.*)) FROM memories m WHERE m.tenant_id = $1 AND "
                          "(m.expires_at IS NULL OR m.expires_at > now()) GROUP BY 1, 2",
                          1},
    [SQL_TENANT_CREATE] = {"tenant_create",
                           "SELECT * FROM engram_admin_tenant_create($1, $2, $3, $4, $5, $6, $7, "
                           "decode($8, 'hex'), $9)",
                           9},
    [SQL_TENANT_INDEX_ENGINE] = {"tenant_index_engine",
                                 "SELECT t.index_engine FROM tenants t WHERE t.id = $1", 1},
    [SQL_KEY_TOUCH] = {"key_touch", "SELECT engram_key_touch($1)", 1},
    [SQL_QUERY_RESERVE] = {"query_reserve",
                           "SELECT * FROM engram_query_reserve($1, $2::bigint[], $3, $4, $5, $6)",
                           6},
    [SQL_SYNC_OFF] = {"sync_off", "SELECT set_config('synchronous_commit', 'off', true)", 0},
    [SQL_TENANT_USAGE] = {"tenant_usage", "SELECT * FROM engram_tenant_usage($1)", 1},
    /* the engine in force on this server: the tenant's own, or the default given as the
     * last parameter (see engram_tenant_engine) */
    [SQL_ADMIN_TENANT_GET] = {"admin_tenant_get",
                              "SELECT engram_tenant_engine(engram_admin_tenant_get($1, $2), "
                              "$3)::text",
                              3},
    [SQL_ADMIN_TENANT_LIST] = {"admin_tenant_list",
                               "SELECT engram_tenants_engine(engram_admin_tenant_list($1, $2), "
                               "$3)::text",
                               3},
    [SQL_ADMIN_TENANT_UPDATE] = {"admin_tenant_update",
                                 "SELECT engram_tenant_engine(j, $6)::text, (j ->> "
                                 "'tenant_id')::bigint FROM engram_admin_tenant_update($1, $2, "
                                 "$3, $4, $5, $7, $8, $9, $10::integer, $11::boolean) j",
                                 11},
    [SQL_ADMIN_TENANT_DELETE] = {"admin_tenant_delete", "SELECT engram_admin_tenant_delete($1, $2)",
                                 2},
    [SQL_ADMIN_KEY_CREATE] = {"admin_key_create",
                              "SELECT * FROM engram_admin_key_create($1, $2, $3, $4, decode($5, "
                              "'hex'))",
                              5},
    [SQL_ADMIN_KEY_LIST] = {"admin_key_list", "SELECT engram_admin_key_list($1, $2)::text", 2},
    [SQL_ADMIN_KEY_REVOKE] = {"admin_key_revoke", "SELECT engram_admin_key_revoke($1)", 1},
    [SQL_CONSOLIDATION_RUNS] = {"consolidation_runs",
                                "SELECT r.id, r.trigger, r.status, engram_ms(r.started_at), "
                                "engram_ms(r.finished_at), r.merged, r.superseded, r.rescored, "
                                "r.archived, r.skipped, r.error, r.settings::text FROM "
                                "consolidation_runs r WHERE r.tenant_id = $1 AND ($3::bigint IS "
                                "NULL OR r.id < $3) ORDER BY r.id DESC LIMIT $2::int",
                                3},
    [SQL_DREAM_STATE] = {"dream_state", "SELECT engram_dream_state($1)::text", 1},
    /* first in a read sent to a hot standby: the tenant's change number as the standby has
     * replayed it (no row: the standby has not replayed the tenant's creation) */
    [SQL_READ_FLOOR] = {"read_floor", "SELECT change_seq FROM tenants WHERE id = $1::bigint", 1},
    [SQL_REEMBED_STATE] = {"reembed_state", "SELECT engram_reembed_state($1)::text", 1},
};

/* Every statement table, in order; each module with statements of its own adds a line. */
static const struct {
    const db_stmt_def *defs;
    size_t n;
} tables[] = {
    {sql_stmts, SQL__COUNT},
    {sql_session_stmts, SQLS__COUNT},
    {sql_work_stmts, SQLW__COUNT},
};

static db_stmt_def *all;
static size_t nall;

int sql_init(void)
{
    size_t n = 0;
    for (size_t i = 0; i < sizeof(tables) / sizeof(tables[0]); i++)
        n += tables[i].n;
    all = calloc(n, sizeof(*all));
    if (!all)
        return -ENOMEM;
    for (size_t i = 0; i < sizeof(tables) / sizeof(tables[0]); i++)
        for (size_t k = 0; k < tables[i].n; k++)
            all[nall++] = tables[i].defs[k];
    return 0;
}

void sql_fini(void)
{
    free(all);
    all = NULL;
    nall = 0;
}

/* The statements a Citus cluster needs written differently (by name; same parameters). On
 * one node memory_get gives the planner the tenant as an InitPlan value (SELECT $1) (see
 * sql_stmts); Citus routes a query to the tenant's shard only when it sees the value, and
 * with the InitPlan it ran the query on every shard of memories (bench/citus-cost.sh: about
 * 4 ms of PostgreSQL CPU per search whose rows were not cached). */
static const struct {
    const char *name;
    const char *sql;
} citus_forms[] = {
    {"memory_get", "SELECT " SQL_MEMROW_COLS " FROM memories m WHERE m.tenant_id = $1::bigint "
                   "AND m.id = ANY ($2::bigint[]) AND (m.expires_at IS NULL OR m.expires_at > "
                   "now()) ORDER BY array_position($2::bigint[], m.id)"},
    /* a store group on Citus is one transaction of several tenants' delegated calls, which
     * run on the tenants' worker where SET LOCAL of the coordinator's block would take a
     * round trip per tenant: the function sets engram.tenant_id itself (citus/20_functions) */
    {"memory_store_as",
     "SELECT * FROM engram_memory_store_as($1, $2::bigint[], $3, $4, $5, "
     "$6::bigint[], $7::bigint[], $8::text[], $9::text[], $10::text[], "
     "$11::float8[], $12::text[], $13, $14::bigint[], $15::bigint[], "
     "$16::bigint[], $17::bigint[], $18::bigint[], $19::boolean[], $20::bigint)"},
};

int sql_use_citus(void)
{
    for (size_t f = 0; f < sizeof(citus_forms) / sizeof(citus_forms[0]); f++) {
        size_t i = 0;
        while (i < nall && strcmp(all[i].name, citus_forms[f].name) != 0)
            i++;
        if (i == nall)
            return -ENOENT;
        all[i].sql = citus_forms[f].sql;
    }
    return 0;
}

const db_stmt_def *sql_all(size_t *n)
{
    *n = nall;
    return all;
}
