/* storage/loader.c: streaming index loads from PostgreSQL (see loader.h). */
#include "loader.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "memrow.h"
#include "pgsync.h"
#include "rowerr.h"
#include "sql.h"

/* Binary-format columns of a loader row, after any leading columns of the query; the query
 * joins memory_access as pa (LOADER_ACCESS). The typed metadata fields go out as one JSON
 * array for the caller to hash: engram_tags per row was most of a load's database time. */
#define LOADER_COLS                                                                                \
    "m.id, m.agent_id, m.clade_id, m.scope, m.type, m.importance, "                                \
    "engram_ms(m.created_at), engram_ms(greatest(m.last_accessed_at, pa.last_accessed_at)), "      \
    "m.access_count + COALESCE(pa.access_count, 0), engram_ms(m.expires_at), "                     \
    "engram_ms(m.archived_at), m.seq, m.pinned, "                                                  \
    "jsonb_build_array(m.metadata -> 'tokens', m.metadata -> 'chains', "                           \
    "m.metadata -> 'protocols', m.metadata -> 'strategy_id')::text, m.embedding, m.cited_count, "  \
    "m.injected_count"
#define LOADER_NCOLS 17
/* The pending access counts (memory_access), one join rather than a subquery per row. */
#define LOADER_ACCESS " LEFT JOIN memory_access pa ON pa.tenant_id = m.tenant_id AND pa.id = m.id"

static uint64_t be64(const char *p)
{
    const unsigned char *u = (const unsigned char *)p;
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v = (v << 8) | u[i];
    return v;
}

/* A binary bigint column; NULL gives def. A value of another size is reported (rowerr,
 * under table) and gives def with *ok cleared; ok may be NULL where the caller reports
 * nothing more. */
static int64_t col_i64(const PGresult *r, int col, int64_t def, rowerr_table table, bool *ok)
{
    if (PQgetisnull(r, 0, col))
        return def;
    if (PQgetlength(r, 0, col) != 8) {
        if (!ok || *ok)
            rowerr_report(table, PQfname(r, col), "not an 8-byte integer");
        if (ok)
            *ok = false;
        return def;
    }
    return (int64_t)be64(PQgetvalue(r, 0, col));
}

/* Reports the first bad column of a row (table memories) and fails the row. */
static void bad_col(const PGresult *r, int col, const char *problem, bool *ok)
{
    if (*ok)
        rowerr_report(ROWERR_MEMORIES, PQfname(r, col), problem);
    *ok = false;
}

/* Parses the LOADER_COLS at offset off of the single row of r into row; vec is scratch of
 * dim floats. Returns 0, or -EBADMSG after reporting the first unparsable column. */
static int parse_row(const PGresult *r, int off, size_t dim, float *vec, loader_row *row)
{
    const rowerr_table m = ROWERR_MEMORIES;
    bool ok = true;
    memset(row, 0, sizeof(*row));
    row->meta.present = true;
    row->meta.id = (uint64_t)col_i64(r, off + 0, 0, m, &ok);
    row->meta.agent_id = (uint64_t)col_i64(r, off + 1, 0, m, &ok);
    row->meta.clade_id = (uint64_t)col_i64(r, off + 2, 0, m, &ok);
    row->meta.scope =
        memrow_scope_parse(PQgetvalue(r, 0, off + 3), (size_t)PQgetlength(r, 0, off + 3));
    if (row->meta.scope < 0)
        bad_col(r, off + 3, "not a memory scope", &ok);
    row->meta.type =
        memrow_type_parse(PQgetvalue(r, 0, off + 4), (size_t)PQgetlength(r, 0, off + 4));
    if (row->meta.type < 0)
        bad_col(r, off + 4, "not a memory type", &ok);
    if (PQgetlength(r, 0, off + 5) == 8) {
        uint64_t bits = be64(PQgetvalue(r, 0, off + 5));
        memcpy(&row->meta.importance, &bits, sizeof(bits));
    } else {
        bad_col(r, off + 5, "not an 8-byte float", &ok);
    }
    row->meta.created_ms = col_i64(r, off + 6, 0, m, &ok);
    row->meta.accessed_ms = col_i64(r, off + 7, MEMROW_NO_TIME, m, &ok);
    row->meta.access_count = col_i64(r, off + 8, 0, m, &ok);
    row->meta.expires_ms = col_i64(r, off + 9, MEMROW_NO_TIME, m, &ok);
    row->meta.archived_ms = col_i64(r, off + 10, MEMROW_NO_TIME, m, &ok);
    row->meta.seq = (uint64_t)col_i64(r, off + 11, 0, m, &ok);
    if (PQgetlength(r, 0, off + 12) != 1)
        bad_col(r, off + 12, "not a boolean", &ok);
    row->meta.pinned = PQgetlength(r, 0, off + 12) == 1 && PQgetvalue(r, 0, off + 12)[0] != 0;
    row->meta.tags = PQgetvalue(r, 0, off + 13);
    row->meta.tags_len = (size_t)PQgetlength(r, 0, off + 13);
    if ((size_t)PQgetlength(r, 0, off + 14) != dim * sizeof(float)) {
        bad_col(r, off + 14, "embedding of another dimension than the tenant's", &ok);
        return -EBADMSG;
    }
    if (!ok)
        return -EBADMSG;
    /* embeddings are little-endian float32, as is every host we build for */
    memcpy(vec, PQgetvalue(r, 0, off + 14), dim * sizeof(float));
    row->meta.cited_count = col_i64(r, off + 15, 0, m, &ok);
    row->meta.injected_count = col_i64(r, off + 16, 0, m, &ok);
    if (!ok)
        return -EBADMSG;
    row->vec = vec;
    row->dim = dim;
    return 0;
}

static void set_err(char *err, size_t errlen, const char *what, const char *msg)
{
    snprintf(err, errlen, "%s: %s", what, msg);
    size_t n = strlen(err);
    while (n > 0 && err[n - 1] == '\n')
        err[--n] = '\0';
}

/* After a callback failed with rc < 0: err keeps what the callback wrote there, or else
 * gets the errno's text, so that a negative return always comes with a reason. */
static void callback_err(int rc, char *err, size_t errlen)
{
    if (rc < 0 && errlen && !err[0] && strerror_r(-rc, err, errlen) != 0)
        snprintf(err, errlen, "stopped by the caller (%d)", rc);
}

/* Reads the tenant's change number inside the current transaction. */
static int read_seq(PGconn *c, int64_t tenant, uint64_t *seq, char *err, size_t errlen)
{
    char t[24];
    snprintf(t, sizeof(t), "%lld", (long long)tenant);
    const char *vals[] = {t};
    PGresult *r =
        pgsync_exec(c, "SELECT change_seq FROM tenants WHERE id = $1", 1, vals, err, errlen);
    if (!r)
        return -EIO;
    if (PQntuples(r) != 1) {
        PQclear(r);
        snprintf(err, errlen, "tenant %lld not found", (long long)tenant);
        return -ENOENT;
    }
    int64_t v;
    if (!memrow_parse_i64(PQgetvalue(r, 0, 0), &v) || v < 0) {
        rowerr_report(ROWERR_TENANTS, "change_seq", "not a change number");
        PQclear(r);
        snprintf(err, errlen, "tenant %lld: unreadable change number", (long long)tenant);
        return -EBADMSG;
    }
    *seq = (uint64_t)v;
    PQclear(r);
    return 0;
}

/* Runs sql (text parameters, binary results) in single-row mode, calling each(r) per row
 * until it returns non-zero. Every result is read to the end either way, so the connection
 * is ready for the next statement. Returns 0, each's non-zero value, or -EIO with err. */
static int stream(PGconn *c, const char *sql, int nparams, const char *const *vals,
                  int (*each)(const PGresult *r, void *ctx), void *ctx, char *err, size_t errlen)
{
    if (!PQsendQueryParams(c, sql, nparams, NULL, vals, NULL, NULL, 1)) {
        set_err(err, errlen, "query", PQerrorMessage(c));
        return -EIO;
    }
    int rc = 0;
    if (!PQsetSingleRowMode(c)) {
        /* the whole result would arrive as one: memory no longer bounded */
        set_err(err, errlen, "query", "single-row mode refused");
        rc = -EIO;
    }
    if (errlen)
        err[0] = '\0'; /* set below by whoever fails, or by callback_err */
    PGresult *r;
    while ((r = PQgetResult(c)) != NULL) {
        ExecStatusType st = PQresultStatus(r);
        if (rc != 0) {
            /* stopped: drain */
        } else if (st == PGRES_SINGLE_TUPLE) {
            rc = each(r, ctx);
            callback_err(rc, err, errlen);
        } else if (st != PGRES_TUPLES_OK) {
            /* an error (the connection lost midway, a statement timeout), or a result a
             * query in single-row mode never gives */
            set_err(err, errlen, "query",
                    st == PGRES_FATAL_ERROR ? PQresultErrorMessage(r) : PQresStatus(st));
            rc = -EIO;
        }
        PQclear(r);
    }
    return rc;
}

typedef struct load_ctx {
    size_t dim;
    float *vec;
    int (*fn)(const loader_row *row, void *ctx);
    int (*cfn)(uint64_t seq, uint64_t id, const loader_row *row, void *ctx);
    int (*afn)(uint64_t id, int64_t access_count, int64_t last_ms, void *ctx);
    void *ctx;
    char *err;
    size_t errlen;
} load_ctx;

/* Allocates lc's scratch vector of lc->dim floats. Returns 0 or -ENOMEM with err. */
static int alloc_vec(load_ctx *lc)
{
    size_t bytes = lc->dim ? lc->dim * sizeof(float) : 1;
    lc->vec = lc->dim <= SIZE_MAX / sizeof(float) ? malloc(bytes) : NULL;
    if (!lc->vec) {
        snprintf(lc->err, lc->errlen, "out of memory");
        return -ENOMEM;
    }
    return 0;
}

static int each_row(const PGresult *r, void *arg)
{
    load_ctx *lc = arg;
    loader_row row;
    if (parse_row(r, 0, lc->dim, lc->vec, &row) < 0) {
        snprintf(lc->err, lc->errlen, "memory %lld has a malformed row or embedding",
                 (long long)col_i64(r, 0, 0, ROWERR_MEMORIES, NULL));
        return -EBADMSG;
    }
    return lc->fn(&row, lc->ctx);
}

static int each_change(const PGresult *r, void *arg)
{
    load_ctx *lc = arg;
    bool ok = !PQgetisnull(r, 0, 0) && !PQgetisnull(r, 0, 1);
    uint64_t seq = (uint64_t)col_i64(r, 0, 0, ROWERR_MEMORY_CHANGES, &ok);
    uint64_t id = (uint64_t)col_i64(r, 1, 0, ROWERR_MEMORY_CHANGES, &ok);
    if (!ok) {
        if (PQgetisnull(r, 0, 0) || PQgetisnull(r, 0, 1))
            rowerr_report(ROWERR_MEMORY_CHANGES, "seq, memory_id", "NULL");
        snprintf(lc->err, lc->errlen, "a change log entry is malformed");
        return -EBADMSG;
    }
    if (PQgetisnull(r, 0, 2))
        return lc->cfn(seq, id, NULL, lc->ctx);
    loader_row row;
    if (parse_row(r, 2, lc->dim, lc->vec, &row) < 0) {
        snprintf(lc->err, lc->errlen, "memory %llu has a malformed row or embedding",
                 (unsigned long long)id);
        return -EBADMSG;
    }
    return lc->cfn(seq, id, &row, lc->ctx);
}

/* Reads the tenant's change number and streams sql through each, both in one read-only
 * repeatable-read transaction bound to the tenant. Returns as stream, or -ENOENT / -EBADMSG
 * from read_seq, -EIO when the transaction does not start. */
static int in_snapshot(PGconn *c, int64_t tenant, uint64_t *seq, const char *sql, int nparams,
                       const char *const *vals, int (*each)(const PGresult *, void *), load_ctx *lc,
                       char *err, size_t errlen)
{
    /* row-level security: the connection sees this tenant's rows only */
    if (pgsync_tenant_begin(c, tenant, PGSYNC_TX_SNAPSHOT, err, errlen) < 0)
        return -EIO;
    int rc = read_seq(c, tenant, seq, err, errlen);
    if (rc == 0)
        rc = stream(c, sql, nparams, vals, each, lc, err, errlen);
    /* read-only: nothing to keep, and a failed COMMIT loses nothing already read */
    pgsync_tx_end(c, false, NULL, 0);
    return rc;
}

int loader_tenant(PGconn *c, int64_t tenant, size_t dim, uint64_t *seq,
                  int (*fn)(const loader_row *row, void *ctx), void *ctx, char *err, size_t errlen)
{
    load_ctx lc = {.dim = dim, .fn = fn, .ctx = ctx, .err = err, .errlen = errlen};
    if (alloc_vec(&lc) < 0)
        return -ENOMEM;
    char t[24];
    snprintf(t, sizeof(t), "%lld", (long long)tenant);
    const char *vals[] = {t};
    int rc = in_snapshot(c, tenant, seq,
                         "SELECT " LOADER_COLS " FROM memories m" LOADER_ACCESS
                         " WHERE m.tenant_id = $1",
                         1, vals, each_row, &lc, err, errlen);
    free(lc.vec);
    return rc;
}

static int each_live(const PGresult *r, void *arg)
{
    load_ctx *lc = arg;
    loader_row row;
    if (parse_row(r, 0, lc->dim, lc->vec, &row) < 0) {
        snprintf(lc->err, lc->errlen, "memory %lld has a malformed row or embedding",
                 (long long)col_i64(r, 0, 0, ROWERR_MEMORIES, NULL));
        return -EBADMSG;
    }
    row.attrs_key = PQgetisnull(r, 0, LOADER_NCOLS) ? NULL : PQgetvalue(r, 0, LOADER_NCOLS);
    row.content = PQgetvalue(r, 0, LOADER_NCOLS + 1);
    row.content_len = (size_t)PQgetlength(r, 0, LOADER_NCOLS + 1);
    row.attrs_json =
        PQgetisnull(r, 0, LOADER_NCOLS + 2) ? NULL : PQgetvalue(r, 0, LOADER_NCOLS + 2);
    return lc->fn(&row, lc->ctx);
}

int loader_live(PGconn *c, int64_t tenant, size_t dim, uint64_t *seq,
                int (*fn)(const loader_row *row, void *ctx), void *ctx, char *err, size_t errlen)
{
    load_ctx lc = {.dim = dim, .fn = fn, .ctx = ctx, .err = err, .errlen = errlen};
    if (alloc_vec(&lc) < 0)
        return -ENOMEM;
    char t[24];
    snprintf(t, sizeof(t), "%lld", (long long)tenant);
    const char *vals[] = {t};
    int rc = in_snapshot(c, tenant, seq,
                         "SELECT " LOADER_COLS ", m.metadata -> 'attrs' ->> 'key', m.content, "
                         "(m.metadata -> 'attrs')::text FROM memories m" LOADER_ACCESS
                         " WHERE m.tenant_id = $1 AND m.archived_at IS NULL AND (m.expires_at IS "
                         "NULL OR m.expires_at > now()) ORDER BY m.id",
                         1, vals, each_live, &lc, err, errlen);
    free(lc.vec);
    return rc;
}

int loader_changes(PGconn *c, int64_t tenant, size_t dim, bool citus, uint64_t after,
                   uint64_t *upto,
                   int (*fn)(uint64_t seq, uint64_t id, const loader_row *row, void *ctx),
                   void *ctx, char *err, size_t errlen)
{
    load_ctx lc = {.dim = dim, .cfn = fn, .ctx = ctx, .err = err, .errlen = errlen};
    if (alloc_vec(&lc) < 0)
        return -ENOMEM;
    char t[24], a[24];
    snprintf(t, sizeof(t), "%lld", (long long)tenant);
    snprintf(a, sizeof(a), "%llu", (unsigned long long)after);
    const char *vals[] = {t, a};
    /* On one node the memories' side sees the tenant as an InitPlan value (SELECT $1): with
     * the value, a tenant the statistics have not seen is estimated at one row, and the join
     * may be planned as a scan of the whole tenant per change. Citus routes a query to the
     * tenant's shard only when every table is tied to the tenant by value or by join
     * ("complex joins are only supported when all distributed tables are co-located and
     * joined on their distribution columns" otherwise). */
    static const char q_node[] =
        "SELECT c.seq, c.memory_id, " LOADER_COLS
        " FROM memory_changes c LEFT JOIN memories m ON m.tenant_id = (SELECT $1::bigint) AND "
        "m.id = c.memory_id" LOADER_ACCESS " WHERE c.tenant_id = $1 AND c.seq > $2 ORDER BY c.seq";
    static const char q_citus[] =
        "SELECT c.seq, c.memory_id, " LOADER_COLS
        " FROM memory_changes c LEFT JOIN memories m ON m.tenant_id = c.tenant_id AND "
        "m.id = c.memory_id" LOADER_ACCESS " WHERE c.tenant_id = $1 AND c.seq > $2 ORDER BY c.seq";
    int rc = in_snapshot(c, tenant, upto, citus ? q_citus : q_node, 2, vals, each_change, &lc, err,
                         errlen);
    free(lc.vec);
    return rc;
}

static int each_access(const PGresult *r, void *arg)
{
    load_ctx *lc = arg;
    bool ok = true;
    uint64_t id = (uint64_t)col_i64(r, 0, 0, ROWERR_MEMORIES, &ok);
    int64_t count = col_i64(r, 1, 0, ROWERR_MEMORIES, &ok);
    int64_t last = col_i64(r, 2, MEMROW_NO_TIME, ROWERR_MEMORIES, &ok);
    if (!ok)
        return 0; /* reported; the memory keeps the access count the index has */
    return lc->afn(id, count, last, lc->ctx);
}

int loader_accessed(PGconn *c, int64_t tenant, int64_t since_ms,
                    int (*fn)(uint64_t id, int64_t access_count, int64_t last_ms, void *ctx),
                    void *ctx, char *err, size_t errlen)
{
    load_ctx lc = {.afn = fn, .ctx = ctx, .err = err, .errlen = errlen};
    char t[24], s[24];
    snprintf(t, sizeof(t), "%lld", (long long)tenant);
    snprintf(s, sizeof(s), "%lld", (long long)since_ms);
    const char *vals[] = {t, s};
    uint64_t seq;
    return in_snapshot(c, tenant, &seq,
                       "SELECT m.id, m.access_count + COALESCE(pa.access_count, 0),"
                       " engram_ms(greatest(m.last_accessed_at, pa.last_accessed_at))"
                       " FROM memories m LEFT JOIN memory_access pa"
                       " ON pa.tenant_id = m.tenant_id AND pa.id = m.id WHERE m.tenant_id = $1"
                       " AND (m.last_accessed_at >= engram_ts($2) OR pa.id IS NOT NULL)",
                       2, vals, each_access, &lc, err, errlen);
}

int loader_rows(PGconn *c, int64_t tenant, uint64_t before, size_t limit,
                int (*fn)(const memrow *row, void *ctx), void *ctx, uint64_t *last, size_t *n,
                char *err, size_t errlen)
{
    *n = 0;
    if (pgsync_tenant_begin(c, tenant, PGSYNC_TX_READ, err, errlen) < 0)
        return -EIO;
    char t[24], b[24], l[24];
    snprintf(t, sizeof(t), "%lld", (long long)tenant);
    snprintf(b, sizeof(b), "%llu", (unsigned long long)(before ? before : (uint64_t)INT64_MAX));
    snprintf(l, sizeof(l), "%zu", limit);
    const char *vals[] = {t, b, l};
    PGresult *r = pgsync_exec(c,
                              "SELECT " SQL_MEMROW_COLS " FROM memories m WHERE m.tenant_id = "
                              "$1 AND m.id < $2 AND m.archived_at IS NULL AND (m.expires_at "
                              "IS NULL OR m.expires_at > now()) ORDER BY m.id DESC LIMIT $3",
                              3, vals, err, errlen);
    int rc = r ? 0 : -EIO;
    if (r && errlen)
        err[0] = '\0'; /* for callback_err */
    for (int i = 0; r && i < PQntuples(r) && rc == 0; i++) {
        memrow m;
        if (memrow_parse(r, i, 0, &m) != 0) {
            snprintf(err, errlen, "a memory row does not parse");
            rc = -EBADMSG;
            break;
        }
        *last = m.id;
        (*n)++;
        rc = fn(&m, ctx);
        callback_err(rc, err, errlen);
    }
    PQclear(r);
    pgsync_tx_end(c, false, NULL, 0); /* read-only */
    return rc;
}

int loader_index_engine(PGconn *c, int64_t tenant, char *out, size_t outlen, char *err,
                        size_t errlen)
{
    /* the tenants table is under row-level security: read it as the tenant */
    if (pgsync_tenant_begin(c, tenant, PGSYNC_TX_READ, err, errlen) < 0)
        return -EIO;
    char t[24];
    snprintf(t, sizeof(t), "%lld", (long long)tenant);
    const char *vals[] = {t};
    int rc = -EIO;
    PGresult *r =
        pgsync_exec(c, "SELECT COALESCE(t.index_engine, '') FROM tenants t WHERE t.id = $1", 1,
                    vals, err, errlen);
    if (r && PQntuples(r) != 1) {
        snprintf(err, errlen, "tenant %lld not found", (long long)tenant);
        rc = -ENOENT;
    } else if (r && (size_t)PQgetlength(r, 0, 0) >= outlen) {
        rowerr_report(ROWERR_TENANTS, "index_engine", "longer than any engine name");
        snprintf(err, errlen, "tenant %lld: unexpected index_engine", (long long)tenant);
        rc = -EBADMSG;
    } else if (r) {
        snprintf(out, outlen, "%s", PQgetvalue(r, 0, 0));
        rc = 0;
    }
    PQclear(r);
    pgsync_tx_end(c, false, NULL, 0); /* read-only */
    return rc;
}

int loader_instance(PGconn *c, char *out, size_t outlen, char *err, size_t errlen)
{
    /* the database's oid too: a dump restored into another database (which carries the
     * engram_instance row along) gets other snapshots */
    PGresult *r = pgsync_exec(c,
                              "SELECT i.id || '-' || d.oid FROM engram_instance i, pg_database d"
                              " WHERE d.datname = current_database()",
                              0, NULL, err, errlen);
    if (!r)
        return -EIO;
    int rc = 0;
    if (PQntuples(r) != 1 || PQgetlength(r, 0, 0) == 0 || (size_t)PQgetlength(r, 0, 0) >= outlen) {
        snprintf(err, errlen, "engram_instance must hold one id");
        rc = -EBADMSG;
    } else {
        snprintf(out, outlen, "%s", PQgetvalue(r, 0, 0));
    }
    PQclear(r);
    return rc;
}
