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

int memrow_parse(const PGresult *r, int row, memrow *out)
{
    if (PQnfields(r) < 16 || row >= PQntuples(r))
        return -1;
    memset(out, 0, sizeof(*out));
    out->id = (uint64_t)memrow_i64(r, row, 0, 0);
    out->agent_id = (uint64_t)memrow_i64(r, row, 1, 0);
    out->clade_id = (uint64_t)memrow_i64(r, row, 2, 0);
    const char *scope = PQgetvalue(r, row, 3);
    const char *type = PQgetvalue(r, row, 4);
    int sc = memrow_scope_parse(scope, strlen(scope));
    int ty = memrow_type_parse(type, strlen(type));
    if (sc < 0 || ty < 0)
        return -1;
    out->scope = (mem_scope)sc;
    out->type = (mem_type)ty;
    out->content = PQgetvalue(r, row, 5);
    out->content_len = (size_t)PQgetlength(r, row, 5);
    out->importance = strtod(PQgetvalue(r, row, 6), NULL);
    out->metadata_json = PQgetvalue(r, row, 7);
    out->metadata_len = (size_t)PQgetlength(r, row, 7);
    out->created_ms = memrow_i64(r, row, 8, 0);
    out->updated_ms = memrow_i64(r, row, 9, 0);
    out->last_accessed_ms = memrow_i64(r, row, 10, MEMROW_NO_TIME);
    out->access_count = memrow_i64(r, row, 11, 0);
    out->expires_ms = memrow_i64(r, row, 12, MEMROW_NO_TIME);
    out->archived_ms = memrow_i64(r, row, 13, MEMROW_NO_TIME);
    out->version = (int32_t)memrow_i64(r, row, 14, 1);
    out->seq = (uint64_t)memrow_i64(r, row, 15, 0);
    return 0;
}
