/* storage/memrow.c: memory row parsing and the type and scope names (see memrow.h). */
#include "memrow.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rowerr.h"

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

bool memrow_parse_i64(const char *s, int64_t *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end != '\0')
        return false;
    *out = v;
    return true;
}

bool memrow_parse_f64(const char *s, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end != '\0' || !isfinite(v))
        return false;
    *out = v;
    return true;
}

/* The name of column col for messages (PostgreSQL's, else its number). */
static const char *col_name(const PGresult *r, int col, char *buf, size_t len)
{
    const char *n = PQfname(r, col);
    if (n && *n && strcmp(n, "?column?") != 0)
        return n;
    snprintf(buf, len, "#%d", col + 1);
    return buf;
}

int64_t memrow_i64_of(const PGresult *r, int row, int col, int64_t def, rowerr_table table)
{
    if (PQgetisnull(r, row, col))
        return def;
    int64_t v;
    if (!memrow_parse_i64(PQgetvalue(r, row, col), &v)) {
        char buf[16];
        rowerr_report(table, col_name(r, col, buf, sizeof(buf)), "not an integer");
        return def;
    }
    return v;
}

double memrow_f64_of(const PGresult *r, int row, int col, double def, rowerr_table table)
{
    if (PQgetisnull(r, row, col))
        return def;
    double v;
    if (!memrow_parse_f64(PQgetvalue(r, row, col), &v)) {
        char buf[16];
        rowerr_report(table, col_name(r, col, buf, sizeof(buf)), "not a finite number");
        return def;
    }
    return v;
}

int64_t memrow_i64(const PGresult *r, int row, int col, int64_t def)
{
    return memrow_i64_of(r, row, col, def, ROWERR_OTHER);
}

char *memrow_u64_sql(uint64_t v, char *buf)
{
    snprintf(buf, 24, "%lld", (long long)(int64_t)v);
    return buf;
}

/* A reader of one memories row: the first unparsable column is reported (table memories)
 * and fails the row. */
typedef struct rd {
    const PGresult *r;
    int row;
    bool bad;
} rd;

static void bad(rd *d, int col, const char *problem)
{
    if (d->bad)
        return;
    d->bad = true;
    char buf[16];
    rowerr_report(ROWERR_MEMORIES, col_name(d->r, col, buf, sizeof(buf)), problem);
}

static int64_t rd_i64(rd *d, int col, int64_t def)
{
    if (PQgetisnull(d->r, d->row, col))
        return def;
    int64_t v;
    if (!memrow_parse_i64(PQgetvalue(d->r, d->row, col), &v)) {
        bad(d, col, "not an integer");
        return def;
    }
    return v;
}

static double rd_f64(rd *d, int col)
{
    double v = 0;
    if (PQgetisnull(d->r, d->row, col) || !memrow_parse_f64(PQgetvalue(d->r, d->row, col), &v))
        bad(d, col, "not a finite number");
    return v;
}

static bool rd_bool(rd *d, int col)
{
    const char *v = PQgetvalue(d->r, d->row, col);
    if (PQgetisnull(d->r, d->row, col) || (strcmp(v, "t") != 0 && strcmp(v, "f") != 0))
        bad(d, col, "not a boolean");
    return v[0] == 't';
}

static int rd_enum(rd *d, int col, int (*parse)(const char *s, size_t n), const char *what)
{
    const char *v = PQgetvalue(d->r, d->row, col);
    int e = parse(v, (size_t)PQgetlength(d->r, d->row, col));
    if (e < 0)
        bad(d, col, what);
    return e;
}

/* Checks that r has at least ncols columns from col and a row row. */
static bool shape_ok(const PGresult *r, int row, int ncols)
{
    if (PQnfields(r) < ncols || row < 0 || row >= PQntuples(r)) {
        rowerr_report(ROWERR_MEMORIES, "(all)", "fewer columns or rows than the reader expects");
        return false;
    }
    return true;
}

int memrow_parse(const PGresult *r, int row, int col, memrow *out)
{
    memset(out, 0, sizeof(*out));
    if (!shape_ok(r, row, col + 22))
        return -EBADMSG;
    rd d = {.r = r, .row = row};
    out->id = (uint64_t)rd_i64(&d, col + 0, 0);
    out->agent_id = (uint64_t)rd_i64(&d, col + 1, 0);
    out->clade_id = (uint64_t)rd_i64(&d, col + 2, 0);
    int sc = rd_enum(&d, col + 3, memrow_scope_parse, "not a memory scope");
    int ty = rd_enum(&d, col + 4, memrow_type_parse, "not a memory type");
    out->scope = sc < 0 ? SCOPE_AGENT : (mem_scope)sc;
    out->type = ty < 0 ? MEM_FACT : (mem_type)ty;
    out->content = PQgetvalue(r, row, col + 5);
    out->content_len = (size_t)PQgetlength(r, row, col + 5);
    out->importance = rd_f64(&d, col + 6);
    out->metadata_json = PQgetvalue(r, row, col + 7);
    out->metadata_len = (size_t)PQgetlength(r, row, col + 7);
    out->created_ms = rd_i64(&d, col + 8, 0);
    out->updated_ms = rd_i64(&d, col + 9, 0);
    out->last_accessed_ms = rd_i64(&d, col + 10, MEMROW_NO_TIME);
    out->access_count = rd_i64(&d, col + 11, 0);
    out->expires_ms = rd_i64(&d, col + 12, MEMROW_NO_TIME);
    out->archived_ms = rd_i64(&d, col + 13, MEMROW_NO_TIME);
    out->version = (int32_t)rd_i64(&d, col + 14, 1);
    out->seq = (uint64_t)rd_i64(&d, col + 15, 0);
    out->pinned = rd_bool(&d, col + 16);
    out->archived_reason = PQgetisnull(r, row, col + 17) ? NULL : PQgetvalue(r, row, col + 17);
    out->superseded_by = (uint64_t)rd_i64(&d, col + 18, 0);
    out->merged_into = (uint64_t)rd_i64(&d, col + 19, 0);
    out->cited_count = rd_i64(&d, col + 20, 0);
    out->injected_count = rd_i64(&d, col + 21, 0);
    return d.bad ? -EBADMSG : 0;
}

int memrow_meta_parse(const PGresult *r, int row, int col, memrow_meta *out)
{
    memset(out, 0, sizeof(*out));
    if (!shape_ok(r, row, col + MEMROW_META_NCOLS))
        return -EBADMSG;
    if (PQgetisnull(r, row, col))
        return 0; /* gone */
    rd d = {.r = r, .row = row};
    out->present = true;
    out->id = (uint64_t)rd_i64(&d, col + 0, 0);
    out->seq = (uint64_t)rd_i64(&d, col + 1, 0);
    out->agent_id = (uint64_t)rd_i64(&d, col + 2, 0);
    out->clade_id = (uint64_t)rd_i64(&d, col + 3, 0);
    out->scope = rd_enum(&d, col + 4, memrow_scope_parse, "not a memory scope");
    out->type = rd_enum(&d, col + 5, memrow_type_parse, "not a memory type");
    out->importance = rd_f64(&d, col + 6);
    out->created_ms = rd_i64(&d, col + 7, 0);
    out->accessed_ms = rd_i64(&d, col + 8, MEMROW_NO_TIME);
    out->access_count = rd_i64(&d, col + 9, 0);
    out->expires_ms = rd_i64(&d, col + 10, MEMROW_NO_TIME);
    out->archived_ms = rd_i64(&d, col + 11, MEMROW_NO_TIME);
    out->pinned = rd_bool(&d, col + 12);
    out->tags = PQgetvalue(r, row, col + 13);
    out->tags_len = (size_t)PQgetlength(r, row, col + 13);
    return d.bad ? -EBADMSG : 0;
}
