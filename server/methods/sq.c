/* server/methods/sq.c: statements answering with one JSON document (see sq.h). */
#include "sq.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json.h"

#define RESULT_MAX_DEPTH 32

/* ---- query building ------------------------------------------------------------------- */

void sq_add(sq *q, const char *v)
{
    if (q->n < DB_MAX_PARAMS)
        q->v[q->n++] = v;
    else
        q->oom = true;
}

static char *sq_fmt_i64(sq *q, int64_t v)
{
    char *s = req_alloc(q->r, 24);
    if (!s) {
        q->oom = true;
        return NULL;
    }
    snprintf(s, 24, "%lld", (long long)v);
    return s;
}

void sq_init(sq *q, req *r)
{
    memset(q, 0, sizeof(*q));
    q->r = r;
    sq_add(q, sq_fmt_i64(q, req_auth(r)->tenant_id));
}

void sq_i64(sq *q, int64_t v)
{
    sq_add(q, sq_fmt_i64(q, v));
}

/* An unsigned id (or NULL): its 64 bits as a bigint, the way the schema stores them. */
void sq_u64(sq *q, const msgpack_object *o)
{
    sq_add(q, o ? sq_fmt_i64(q, (int64_t)o->via.u64) : NULL);
}

void sq_time(sq *q, const msgpack_object *o)
{
    sq_add(q, o ? sq_fmt_i64(q, rpc_get_time(o, 0)) : NULL);
}

void sq_str(sq *q, const msgpack_object *o)
{
    char *s = NULL;
    if (o) {
        s = req_strdup(q->r, o);
        if (!s)
            q->oom = true;
    }
    sq_add(q, s);
}

/* A number (or NULL) as the shortest decimal that reads back as the same double, so a
 * client's 0.1 is stored as exactly 0.1 in numeric columns and sums stay exact. */
void sq_num(sq *q, const msgpack_object *o)
{
    if (!o) {
        sq_add(q, NULL);
        return;
    }
    char *s = req_alloc(q->r, 40);
    if (!s) {
        q->oom = true;
        return;
    }
    if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER) {
        snprintf(s, 40, "%llu", (unsigned long long)o->via.u64);
    } else if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER) {
        snprintf(s, 40, "%lld", (long long)o->via.i64);
    } else {
        double d = rpc_get_num(o, 0);
        for (int prec = 15; prec <= 17; prec++) {
            snprintf(s, 40, "%.*g", prec, d);
            if (strtod(s, NULL) == d)
                break;
        }
    }
    sq_add(q, s);
}

/* A JSON text parameter from an already validated value (or NULL). Returns 0, or the
 * json_from_msgpack code (the caller fails the request). */
int sq_json(sq *q, const msgpack_object *o, unsigned depth, size_t max_bytes)
{
    if (!o) {
        sq_add(q, NULL);
        return 0;
    }
    json_buf jb = {0};
    int rc = json_from_msgpack(o, 0, depth, &jb);
    if (rc == 0 && jb.len > max_bytes)
        rc = SQ_JSON_TOO_BIG;
    char *s = NULL;
    if (rc == 0) {
        s = req_alloc(q->r, jb.len + 1);
        if (s)
            memcpy(s, jb.data, jb.len + 1);
        else
            rc = -ENOMEM;
    }
    json_buf_fini(&jb);
    if (rc != 0)
        return rc;
    sq_add(q, s);
    return 0;
}

/* A text[] literal from an array of words already checked against a word list (so no
 * quoting is needed), or NULL. */
void sq_words(sq *q, const msgpack_object *o)
{
    if (!o) {
        sq_add(q, NULL);
        return;
    }
    size_t n = 3;
    for (uint32_t i = 0; i < o->via.array.size; i++)
        n += o->via.array.ptr[i].via.str.size + 1;
    char *s = req_alloc(q->r, n);
    if (!s) {
        q->oom = true;
        return;
    }
    char *w = s;
    *w++ = '{';
    for (uint32_t i = 0; i < o->via.array.size; i++) {
        const msgpack_object_str *e = &o->via.array.ptr[i].via.str;
        if (i)
            *w++ = ',';
        memcpy(w, e->ptr, e->size);
        w += e->size;
    }
    *w++ = '}';
    *w = '\0';
    sq_add(q, s);
}

/* ---- results and errors ---------------------------------------------------------------- */

/* Turns a DETAIL of "key=value key=value" into error fields: integers, numbers or strings.
 * Returns how many were filled (at most max); strings point into buf. */
static size_t parse_details(const char *detail, char *buf, size_t buflen, rpc_detail *d, size_t max)
{
    snprintf(buf, buflen, "%s", detail);
    size_t n = 0;
    char *save = NULL;
    for (char *tok = strtok_r(buf, " ", &save); tok && n < max; tok = strtok_r(NULL, " ", &save)) {
        char *eq = strchr(tok, '=');
        if (!eq || eq == tok)
            continue;
        *eq = '\0';
        const char *val = eq + 1;
        char *end;
        d[n].key = tok;
        errno = 0;
        long long i = strtoll(val, &end, 10);
        if (*val && !*end && errno == 0) {
            d[n].type = RPC_D_INT;
            d[n].v.i = i;
        } else {
            double x = strtod(val, &end);
            if (*val && !*end && isfinite(x)) {
                d[n].type = RPC_D_NUM;
                d[n].v.d = x;
            } else {
                d[n].type = RPC_D_STR;
                d[n].v.s = val;
            }
        }
        n++;
    }
    return n;
}

/* The callback of every session statement: one row, one column of JSON, packed as the
 * result. */
static void json_done(req *r, const db_result *res)
{
    if (res->status == DB_ERROR && res->sqlstate && res->detail) {
        rpc_code code = strcmp(res->sqlstate, "EG402") == 0   ? RPC_COST_LIMIT_EXCEEDED
                        : strcmp(res->sqlstate, "EG429") == 0 ? RPC_QUOTA_EXCEEDED
                        : strcmp(res->sqlstate, "EG409") == 0 ? RPC_CONFLICT
                                                              : RPC_OK;
        if (code != RPC_OK) {
            char buf[512];
            rpc_detail d[8];
            size_t nd = parse_details(res->detail, buf, sizeof(buf), d, 8);
            req_fail_details(r, code, d, nd, "%s", res->message ? res->message : "error");
            return;
        }
    }
    if (res->status != DB_OK) {
        req_fail_db(r, res);
        return;
    }
    const PGresult *pr = res->res[res->nres - 1];
    if (PQntuples(pr) != 1 || PQnfields(pr) != 1 || PQgetisnull(pr, 0, 0)) {
        req_fail(r, RPC_INTERNAL, "session statement returned no result");
        return;
    }
    char err[128];
    msgpack_packer *pk = req_result(r);
    int rc = json_to_msgpack(PQgetvalue(pr, 0, 0), (size_t)PQgetlength(pr, 0, 0), RESULT_MAX_DEPTH,
                             pk, err, sizeof(err));
    if (rc != 0) {
        req_fail(r, RPC_INTERNAL, "cannot encode the result: %s",
                 rc == -ENOMEM ? "out of memory" : err);
        return;
    }
    req_done(r);
}

void sq_submit_cb(sq *q, const db_stmt_def *def, void (*cb)(req *r, const db_result *res))
{
    if (q->oom) {
        req_fail(q->r, RPC_INTERNAL, "out of memory");
        return;
    }
    db_query dq = {.stmt = def, .nvalues = q->n, .values = q->v};
    req_submit(q->r, req_auth(q->r)->tenant_id, &dq, 1, cb);
}

void sq_submit(sq *q, const db_stmt_def *def)
{
    sq_submit_cb(q, def, json_done);
}

static bool one_of(const msgpack_object *o, const char *const *words)
{
    for (size_t i = 0; words[i]; i++)
        if (rpc_str_eq(o, words[i]))
            return true;
    return false;
}

bool sq_check_word(req *r, const msgpack_object *o, const char *name, const char *const *words,
                   const char *list)
{
    if (!o || one_of(o, words))
        return true;
    req_fail(r, RPC_INVALID_ARGUMENT, "parameter '%s' must be one of %s", name, list);
    return false;
}

bool sq_check_words(req *r, const msgpack_object *o, const char *name, const char *const *words,
                    const char *list)
{
    for (uint32_t i = 0; o && i < o->via.array.size; i++) {
        if (!one_of(&o->via.array.ptr[i], words)) {
            req_fail(r, RPC_INVALID_ARGUMENT, "parameter '%s[%u]' must be one of %s", name, i,
                     list);
            return false;
        }
    }
    return true;
}
