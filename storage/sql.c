/* storage/sql.c: the prepared statements (see sql.h). */
#include "sql.h"

#include <errno.h>
#include <stdlib.h>

#include "sql_session.h"

const db_stmt_def sql_stmts[SQL__COUNT] = {
    [SQL_PING] = {"ping", "SELECT 1", 0},
    [SQL_AUTH_LOOKUP] = {"auth_lookup",
                         "SELECT k.id, k.tenant_id, k.key_hash, t.tier, t.name, t.embed_dim, "
                         "t.embed_provider FROM api_keys k JOIN tenants t ON t.id = k.tenant_id "
                         "WHERE k.key_id = $1 AND k.revoked_at IS NULL",
                         1},
    [SQL_MEMORY_STORE] = {"memory_store",
                          "SELECT id, created_ms, seq FROM engram_memory_store($1, $2, $3, $4, $5, "
                          "$6, $7, $8::jsonb, $9, $10, $11, $12)",
                          12},
    [SQL_MEMORY_GET] = {"memory_get",
                        "SELECT " SQL_MEMROW_COLS " FROM memories m WHERE m.tenant_id = $1 AND "
                        "m.id = ANY ($2::bigint[]) ORDER BY array_position($2::bigint[], m.id)",
                        2},
    [SQL_MEMORY_DELETE] = {"memory_delete",
                           "SELECT id, seq FROM engram_memory_delete($1, $2::bigint[])", 2},
    [SQL_TENANT_CREATE] = {"tenant_create",
                           "WITH t AS (INSERT INTO tenants (name, tier, embed_provider, "
                           "embed_model, embed_dim) VALUES ($1, $2, $3, $4, $5) RETURNING id) "
                           "INSERT INTO api_keys (tenant_id, name, key_id, key_hash) SELECT t.id, "
                           "$6, $7, decode($8, 'hex') FROM t RETURNING tenant_id, id",
                           8},
};

const char *sql_name(sql_stmt s)
{
    return sql_stmts[s].name;
}

/* Every statement table, in order; each module with statements of its own adds a line. */
static const struct {
    const db_stmt_def *defs;
    size_t n;
} tables[] = {
    {sql_stmts, SQL__COUNT},
    {sql_session_stmts, SQLS__COUNT},
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

const db_stmt_def *sql_all(size_t *n)
{
    *n = nall;
    return all;
}
