/* server/methods/memops.c: what the memory methods share (see memops.h). */
#include "memops.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json.h"
#include "memfilter.h"
#include "mempack.h"
#include "sql.h"
#include "tenants.h"

rpc_code mo_metadata_json(req *r, const msgpack_object *md, const char *what, char **out, char *err,
                          size_t errlen)
{
    char name[64];
    snprintf(name, sizeof(name), "%smetadata", what);
    if (mf_check_metadata(md, name, (size_t)req_server(r)->cfg.max_metadata_entries, err, errlen) !=
        0)
        return RPC_INVALID_ARGUMENT;
    json_buf jb = {0};
    int rc = json_from_msgpack(md, 0, 16, &jb);
    if (rc == 0 && !(*out = req_alloc(r, jb.len + 1)))
        rc = -ENOMEM;
    if (rc == 0)
        memcpy(*out, jb.data, jb.len + 1);
    json_buf_fini(&jb);
    if (rc == -ENOMEM) {
        snprintf(err, errlen, "out of memory");
        return RPC_INTERNAL;
    }
    if (rc != 0) {
        snprintf(err, errlen,
                 "parameter '%s' must hold only JSON values (strings, numbers, booleans, nil, "
                 "arrays, maps with string keys), at most 16 levels deep",
                 name);
        return RPC_INVALID_ARGUMENT;
    }
    return RPC_OK;
}

void mo_write_fail(req *r, const db_result *res, int64_t requested)
{
    if (res->sqlstate && strcmp(res->sqlstate, "EG429") == 0) {
        long long limit = 0, usage = 0, req_n = requested;
        const char *q;
        if (res->detail) {
            sscanf(res->detail, "limit=%lld usage=%lld", &limit, &usage);
            if ((q = strstr(res->detail, "requested=")))
                req_n = strtoll(q + 10, NULL, 10);
        }
        bool bytes = res->message && strstr(res->message, "byte") != NULL;
        rpc_detail d[4] = {
            {"limit", RPC_D_INT, {.i = limit}},
            {"usage", RPC_D_INT, {.i = usage}},
            {"requested", RPC_D_INT, {.i = req_n}},
            {"quota", RPC_D_STR, {.s = bytes ? "memory_bytes" : "memories"}},
        };
        if (bytes)
            req_fail_details(r, RPC_QUOTA_EXCEEDED, d, 4,
                             "memory byte limit of the tenant's tier reached (%lld of %lld bytes "
                             "used, %lld more asked; archived memories and kept versions count: "
                             "delete memories to make room)",
                             usage, limit, req_n);
        else
            req_fail_details(r, RPC_QUOTA_EXCEEDED, d, 4,
                             "memory limit of the tenant's tier reached (%lld of %lld live, "
                             "archived memories not counted)",
                             usage, limit);
        return;
    }
    req_fail_db(r, res);
}

void mo_apply_meta_rows(req *r, const PGresult *pr, int col, const float *vec)
{
    const conn_auth *a = req_auth(r);
    tenant *t = tenants_get(req_server(r)->tenants, a->tenant_id, a->dim);
    if (t && !tenants_dim_is(t, a->dim)) {
        tenants_put(t); /* another model since: its load reads the database */
        return;
    }
    if (!t)
        return;
    for (int i = 0; i < PQntuples(pr); i++) {
        memrow_meta mm;
        mem_meta m;
        if (memrow_meta_parse(pr, i, col, &mm) != 0 || !mm.present || mem_meta_from_db(&m, &mm) < 0)
            continue;
        tenants_apply_upsert(t, mm.seq, mm.id, vec, &m);
        free((void *)m.tags);
    }
    tenants_put(t);
}

void mo_submit_ids(req *r, size_t param, sql_stmt stmt, bool read,
                   void (*cb)(req *, const db_result *))
{
    size_t n;
    uint64_t *ids = mp_uint_array(r, req_arg(r, param), &n);
    char *arr = ids ? mp_ids_literal(r, ids, n) : NULL;
    const char *tid = mp_tenant_param(r);
    if (!arr || !tid) {
        req_fail(r, RPC_INTERNAL, "out of memory");
        return;
    }
    const char *vals[] = {tid, arr};
    db_query q = {.stmt = sql_def(stmt), DB_VALUES(vals)};
    if (read)
        req_submit_read(r, &q, 1, cb);
    else
        req_submit(r, req_auth(r)->tenant_id, &q, 1, cb);
}
