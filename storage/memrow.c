/* storage/memrow.c: memory row parsing and the type and scope names (see memrow.h). */
#include "memrow.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const type_names[MEM_TYPE_COUNT] = {"fact", "preference", "episode",
                                                       "strategy_outcome", "constraint"};
static const char *const scope_names[SCOPE_COUNT] = {"agent", "clade", "tenant"};

const char *memrow_type_name(mem_type t)
{
    return (unsigned)t < MEM_TYPE_COUNT ? type_names[t] : "unknown";
}

const char *memrow_scope_name(mem_scope s)
{
    return (unsigned)s < SCOPE_COUNT ? scope_names[s] : "unknown";
}

static int lookup(const char *const *names, int count, const char *s, size_t n)
{
    for (int i = 0; i < count; i++)
        if (strlen(names[i]) == n && memcmp(names[i], s, n) == 0)
            return i;
    return -1;
}

int memrow_type_parse(const char *s, size_t n)
{
    return lookup(type_names, MEM_TYPE_COUNT, s, n);
}

int memrow_scope_parse(const char *s, size_t n)
{
    return lookup(scope_names, SCOPE_COUNT, s, n);
}

int64_t memrow_i64(const PGresult *r, int row, int col, int64_t def)
{
    if (PQgetisnull(r, row, col))
        return def;
    return strtoll(PQgetvalue(r, row, col), NULL, 10);
}

char *memrow_u64_sql(uint64_t v, char *buf)
{
    snprintf(buf, 24, "%lld", (long long)(int64_t)v);
    return buf;
}

int memrow_parse(const PGresult *r, int row, int col, memrow *out)
{
    if (PQnfields(r) < col + 20 || row >= PQntuples(r))
        return -1;
    memset(out, 0, sizeof(*out));
    out->id = (uint64_t)memrow_i64(r, row, col + 0, 0);
    out->agent_id = (uint64_t)memrow_i64(r, row, col + 1, 0);
    out->clade_id = (uint64_t)memrow_i64(r, row, col + 2, 0);
    const char *scope = PQgetvalue(r, row, col + 3);
    const char *type = PQgetvalue(r, row, col + 4);
    int sc = memrow_scope_parse(scope, strlen(scope));
    int ty = memrow_type_parse(type, strlen(type));
    if (sc < 0 || ty < 0)
        return -1;
    out->scope = (mem_scope)sc;
    out->type = (mem_type)ty;
    out->content = PQgetvalue(r, row, col + 5);
    out->content_len = (size_t)PQgetlength(r, row, col + 5);
    out->importance = strtod(PQgetvalue(r, row, col + 6), NULL);
    out->metadata_json = PQgetvalue(r, row, col + 7);
    out->metadata_len = (size_t)PQgetlength(r, row, col + 7);
    out->created_ms = memrow_i64(r, row, col + 8, 0);
    out->updated_ms = memrow_i64(r, row, col + 9, 0);
    out->last_accessed_ms = memrow_i64(r, row, col + 10, MEMROW_NO_TIME);
    out->access_count = memrow_i64(r, row, col + 11, 0);
    out->expires_ms = memrow_i64(r, row, col + 12, MEMROW_NO_TIME);
    out->archived_ms = memrow_i64(r, row, col + 13, MEMROW_NO_TIME);
    out->version = (int32_t)memrow_i64(r, row, col + 14, 1);
    out->seq = (uint64_t)memrow_i64(r, row, col + 15, 0);
    out->pinned = PQgetvalue(r, row, col + 16)[0] == 't';
    out->archived_reason = PQgetisnull(r, row, col + 17) ? NULL : PQgetvalue(r, row, col + 17);
    out->superseded_by = (uint64_t)memrow_i64(r, row, col + 18, 0);
    out->merged_into = (uint64_t)memrow_i64(r, row, col + 19, 0);
    return 0;
}

int memrow_meta_parse(const PGresult *r, int row, int col, memrow_meta *out)
{
    memset(out, 0, sizeof(*out));
    if (PQnfields(r) < col + MEMROW_META_NCOLS || row >= PQntuples(r))
        return -1;
    if (PQgetisnull(r, row, col))
        return 0; /* gone */
    out->present = true;
    out->id = (uint64_t)memrow_i64(r, row, col + 0, 0);
    out->seq = (uint64_t)memrow_i64(r, row, col + 1, 0);
    out->agent_id = (uint64_t)memrow_i64(r, row, col + 2, 0);
    out->clade_id = (uint64_t)memrow_i64(r, row, col + 3, 0);
    const char *scope = PQgetvalue(r, row, col + 4);
    const char *type = PQgetvalue(r, row, col + 5);
    out->scope = memrow_scope_parse(scope, strlen(scope));
    out->type = memrow_type_parse(type, strlen(type));
    if (out->scope < 0 || out->type < 0)
        return -1;
    out->importance = strtod(PQgetvalue(r, row, col + 6), NULL);
    out->created_ms = memrow_i64(r, row, col + 7, 0);
    out->accessed_ms = memrow_i64(r, row, col + 8, MEMROW_NO_TIME);
    out->access_count = memrow_i64(r, row, col + 9, 0);
    out->expires_ms = memrow_i64(r, row, col + 10, MEMROW_NO_TIME);
    out->archived_ms = memrow_i64(r, row, col + 11, MEMROW_NO_TIME);
    out->pinned = PQgetvalue(r, row, col + 12)[0] == 't';
    out->tags = PQgetvalue(r, row, col + 13);
    out->tags_len = (size_t)PQgetlength(r, row, col + 13);
    return 0;
}
