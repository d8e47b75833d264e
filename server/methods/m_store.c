/* server/methods/m_store.c: memory.store and memory.store_batch: one memory's fields
 * validated, embedded, and written through the worker's store group (gcommit.h). */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sodium.h>

#include "gcommit.h"
#include "handlers.h"
#include "log.h"
#include "memfilter.h"
#include "memops.h"
#include "mempack.h"
#include "memrow.h"
#include "plimits.h"
#include "reqembed.h"
#include "sql.h"
#include "tenants.h"

#define BATCH_MAX 1000
#define IDEM_KEY_MAX 200
#define FUTURE_SLACK_MS (5 * 60 * 1000) /* how far ahead a given created_at may lie */

/* ---- one memory's fields, shared by store and store_batch ---------------------------- */

enum {
    P_IT_CONTENT,
    P_IT_TYPE,
    P_IT_MEMORY_TYPE, /* seed 003's name of type (an alias: bound to P_IT_TYPE) */
    P_IT_IMPORTANCE,
    P_IT_METADATA,
    P_IT_EMBEDDING,
    P_IT_AGENT_ID,
    P_IT_CLADE_ID,
    P_IT_SCOPE,
    P_IT_CREATED_AT,
    P_IT_EXPIRES_AT,
    P_IT_TTL_SECONDS,
    P_IT_PINNED,
    P_IT_UPDATED_AT,
    P_IT_LAST_ACCESSED_AT,
    P_IT_ACCESS_COUNT,
    P_IT__COUNT
};

#define ITEM_PARAMS                                                                                \
    {"content", RPC_T_STR, RPC_P_REQUIRED | RPC_P_RANGE | RPC_P_LIMIT(PLIM_CONTENT), 1, 0},        \
        {"type", RPC_T_STR, RPC_P_REQUIRED, 0, 0},                                                 \
        {"memory_type", RPC_T_STR, RPC_P_NULLABLE | RPC_P_ALIAS, 0, 0},                            \
        {"importance", RPC_T_NUM, RPC_P_REQUIRED | RPC_P_RANGE, 0, 1},                             \
        {"metadata", RPC_T_MAP, RPC_P_NULLABLE | RPC_P_LIMIT(PLIM_METADATA), 0, 0},                \
        {"embedding", RPC_T_VECTOR, RPC_P_NULLABLE | RPC_P_RANGE, 1, 4096},                        \
        {"agent_id", RPC_T_UINT, RPC_P_NULLABLE, 0, 0},                                            \
        {"clade_id", RPC_T_UINT, RPC_P_NULLABLE, 0, 0},                                            \
        {"scope", RPC_T_STR, RPC_P_NULLABLE, 0, 0},                                                \
        {"created_at", RPC_T_INT, RPC_P_NULLABLE | RPC_P_RANGE, 0, 1e15},                          \
        {"expires_at", RPC_T_INT, RPC_P_NULLABLE | RPC_P_RANGE, 0, 1e15},                          \
        {"ttl_seconds", RPC_T_UINT, RPC_P_NULLABLE | RPC_P_RANGE, 1, 3.2e9},                       \
        {"pinned", RPC_T_BOOL, RPC_P_NULLABLE, 0, 0},                                              \
        {"updated_at", RPC_T_INT, RPC_P_NULLABLE | RPC_P_RANGE, 0, 1e15},                          \
        {"last_accessed_at", RPC_T_INT, RPC_P_NULLABLE | RPC_P_RANGE, 0, 1e15},                    \
    {                                                                                              \
        "access_count", RPC_T_UINT, RPC_P_NULLABLE | RPC_P_RANGE, 0, 4e9                           \
    }

static const rpc_param item_schema[] = {ITEM_PARAMS};

typedef struct mem_item {
    const char *content;
    size_t content_len;
    int type;
    double importance;
    char *metadata_json;
    const msgpack_object *metadata;
    const msgpack_object *embedding;
    float *vec; /* dim floats in the arena */
    uint64_t agent_id, clade_id;
    int scope;
    int64_t created_ms, updated_ms, accessed_ms, expires_ms; /* INT64_MIN: none */
    int64_t access_count;                                    /* -1: none */
    bool pinned;
    char what[32]; /* "" or "memories[3]." for messages */
} mem_item;

/* Validates one memory's bound arguments into it. Returns 0, or an rpc_code with err. */
static rpc_code parse_item(req *r, const msgpack_object *const *a, const char *what, int64_t now,
                           mem_item *it, char *err, size_t errlen)
{
    memset(it, 0, sizeof(*it));
    snprintf(it->what, sizeof(it->what), "%s", what);
    it->content = a[P_IT_CONTENT]->via.str.ptr;
    it->content_len = a[P_IT_CONTENT]->via.str.size; /* the binder checked its length */
    const msgpack_object *t = a[P_IT_TYPE];          /* or memory_type: the binder took either */
    it->type = memrow_type_parse(t->via.str.ptr, t->via.str.size);
    if (it->type < 0) { /* an item of memory.store_batch (memory.store's: checked already) */
        char name[48];
        snprintf(name, sizeof(name), "%stype", what);
        hooks_enum_message(name, enum_memory_types, err, errlen);
        return RPC_INVALID_ARGUMENT;
    }
    it->importance = rpc_get_num(a[P_IT_IMPORTANCE], 0);
    it->metadata = a[P_IT_METADATA];
    it->metadata_json = "{}";
    if (it->metadata) {
        rpc_code code = mo_metadata_json(r, it->metadata, what, &it->metadata_json, err, errlen);
        if (code != RPC_OK)
            return code;
    }
    it->embedding = a[P_IT_EMBEDDING];
    it->agent_id = rpc_get_uint(a[P_IT_AGENT_ID], 0);
    it->clade_id = rpc_get_uint(a[P_IT_CLADE_ID], 0);
    it->scope = a[P_IT_AGENT_ID] ? SCOPE_AGENT : SCOPE_TENANT;
    if (a[P_IT_SCOPE]) {
        it->scope = memrow_scope_parse(a[P_IT_SCOPE]->via.str.ptr, a[P_IT_SCOPE]->via.str.size);
        if (it->scope < 0) {
            char name[48];
            snprintf(name, sizeof(name), "%sscope", what);
            hooks_enum_message(name, enum_scopes, err, errlen);
            return RPC_INVALID_ARGUMENT;
        }
    }
    if (it->scope == SCOPE_AGENT && !a[P_IT_AGENT_ID]) {
        /* the parameter first: the error's data.field is the first quoted name */
        snprintf(err, errlen, "parameter '%sagent_id' is required with scope 'agent'", what);
        return RPC_INVALID_ARGUMENT;
    }
    if (it->scope == SCOPE_CLADE && !a[P_IT_CLADE_ID]) {
        snprintf(err, errlen, "parameter '%sclade_id' is required with scope 'clade'", what);
        return RPC_INVALID_ARGUMENT;
    }
    it->created_ms = a[P_IT_CREATED_AT] ? rpc_get_int(a[P_IT_CREATED_AT], 0) : INT64_MIN;
    it->updated_ms = a[P_IT_UPDATED_AT] ? rpc_get_int(a[P_IT_UPDATED_AT], 0) : INT64_MIN;
    it->accessed_ms =
        a[P_IT_LAST_ACCESSED_AT] ? rpc_get_int(a[P_IT_LAST_ACCESSED_AT], 0) : INT64_MIN;
    const char *late = it->created_ms > now + FUTURE_SLACK_MS    ? "created_at"
                       : it->updated_ms > now + FUTURE_SLACK_MS  ? "updated_at"
                       : it->accessed_ms > now + FUTURE_SLACK_MS ? "last_accessed_at"
                                                                 : NULL;
    if (late) {
        snprintf(err, errlen, "parameter '%s%s' lies in the future", what, late);
        return RPC_INVALID_ARGUMENT;
    }
    it->access_count = a[P_IT_ACCESS_COUNT] ? (int64_t)rpc_get_uint(a[P_IT_ACCESS_COUNT], 0) : -1;
    it->expires_ms = INT64_MIN;
    if (a[P_IT_EXPIRES_AT] && a[P_IT_TTL_SECONDS]) {
        snprintf(err, errlen, "give '%sexpires_at' or '%sttl_seconds', not both", what, what);
        return RPC_INVALID_ARGUMENT;
    }
    if (a[P_IT_EXPIRES_AT]) {
        it->expires_ms = rpc_get_int(a[P_IT_EXPIRES_AT], 0);
        if (it->expires_ms <= now) {
            snprintf(err, errlen, "parameter '%sexpires_at' must lie in the future", what);
            return RPC_INVALID_ARGUMENT;
        }
    } else if (a[P_IT_TTL_SECONDS]) {
        it->expires_ms = now + (int64_t)rpc_get_uint(a[P_IT_TTL_SECONDS], 0) * 1000;
    }
    it->pinned = rpc_get_bool(a[P_IT_PINNED], false);
    return RPC_OK;
}

/* ---- memory.store and memory.store_batch ---------------------------------------------- */

enum { P_ST_IDEMPOTENCY_KEY = P_IT__COUNT };
ENUMS(memory_store, {"type", enum_memory_types}, {"scope", enum_scopes});
PARAMS(memory_store, ITEM_PARAMS,
       {"idempotency_key", RPC_T_STR, RPC_P_NULLABLE | RPC_P_RANGE, 1, IDEM_KEY_MAX});

enum { P_SB_MEMORIES, P_SB_IDEMPOTENCY_KEY };
PARAMS(memory_store_batch,
       {"memories", RPC_T_ARRAY, RPC_P_REQUIRED | RPC_P_RANGE | RPC_P_LIMIT(PLIM_MESSAGE), 1,
        BATCH_MAX},
       {"idempotency_key", RPC_T_STR, RPC_P_NULLABLE | RPC_P_RANGE, 1, IDEM_KEY_MAX});

typedef struct store_state {
    mem_item *items;
    size_t n;
    bool batch;
    const char *idem;
    char fingerprint[2 + 64 + 1]; /* "\x" + hex: bytea input */
} store_state;

/* Ends r for a failed store job. */
static void store_fail(req *r, const db_result *res)
{
    store_state *st = req_state(r);
    mo_write_fail(r, res, (int64_t)st->n);
}

/* tenants_settle callback: the index is settled, the answer packed. */
static void store_settled(void *arg)
{
    req_done(arg);
}

/* Completes r from its rows of a store's result: rows off .. off + n - 1, in the order of
 * its items. */
static void store_finish(req *r, const PGresult *pr, int off)
{
    store_state *st = req_state(r);
    int rows = PQntuples(pr) - off;
    if (rows < (int)st->n) {
        req_fail(r, RPC_INTERNAL, "store returned %d rows for %zu memories", rows, st->n);
        return;
    }
    rows = (int)st->n;
    const conn_auth *a = req_auth(r);
    tenant *t = tenants_get(req_server(r)->tenants, a->tenant_id, a->dim);
    if (t && !tenants_dim_is(t, a->dim)) {
        tenants_put(t); /* another model since: its load reads the database */
        t = NULL;
    }
    bool replayed = false;
    for (int k = 0; k < rows; k++) {
        int i = off + k;
        bool replay = PQgetvalue(pr, i, 1)[0] == 't';
        replayed = replayed || replay;
        memrow_meta mm;
        if (replay || !t || memrow_meta_parse(pr, i, 3, &mm) != 0 || !mm.present)
            continue;
        mem_meta m;
        if (mem_meta_from_db(&m, &mm) < 0)
            continue;
        if (PQgetisnull(pr, i, 3 + MEMROW_META_NCOLS - 1)) {
            /* a new memory: its tags come from the request (as filters derive theirs) */
            uint64_t *tags = NULL;
            uint32_t ntags = 0;
            if (st->items[k].metadata &&
                mf_tags_from_metadata(st->items[k].metadata, &tags, &ntags) < 0) {
                free((void *)m.tags);
                log_error("memory %llu not indexed: out of memory", (unsigned long long)mm.id);
                continue;
            }
            free((void *)m.tags);
            m.tags = tags;
            m.ntags = (uint16_t)ntags; /* at most 193: mf_check_metadata passed the request */
        }
        tenants_apply_upsert(t, mm.seq, mm.id, st->items[k].vec, &m);
        free((void *)m.tags);
    }
    msgpack_packer *pk = req_result(r);
    if (!st->batch) {
        msgpack_pack_map(pk, 3);
        rpc_pack_kv_uint(pk, "id", (uint64_t)memrow_i64(pr, off, 3, 0));
        rpc_pack_kv_int(pk, "created_at", memrow_i64(pr, off, 2, 0));
        rpc_pack_kv_bool(pk, "replayed", replayed);
    } else {
        msgpack_pack_map(pk, 3);
        rpc_pack_cstr(pk, "ids");
        msgpack_pack_array(pk, (uint32_t)rows);
        for (int k = 0; k < rows; k++)
            msgpack_pack_uint64(pk, (uint64_t)memrow_i64(pr, off + k, 3, 0));
        rpc_pack_cstr(pk, "created_at");
        msgpack_pack_array(pk, (uint32_t)rows);
        for (int k = 0; k < rows; k++)
            msgpack_pack_int64(pk, memrow_i64(pr, off + k, 2, 0));
        rpc_pack_kv_bool(pk, "replayed", replayed);
    }
    /* a batch that took the index into the approximate tier (or doubled it) answers once
     * the index is measured: the searches that follow a bulk load run at the measured
     * depth (issue 34) */
    int rc = st->batch && t ? tenants_settle(t, worker_poster(req_worker(r)), store_settled, r) : 1;
    tenants_put(t);
    if (rc != 0)
        req_done(r);
}

static void store_done(req *r, const db_result *res)
{
    if (res->status != DB_OK)
        store_fail(r, res);
    else
        store_finish(r, res->res[0], 0);
}

/* Builds into q the store statement for the items of the nm requests m, in that order:
 * group false, the single request m[0] (nm 1) by engram_memory_store_batch, which takes its
 * idempotency key and runs with the tenant set; group true, the group statement
 * (engram_memory_store_group, no tenant set: see gcommit.h), the requests of any tenants,
 * sorted by tenant. Every item has its vector. Parameter text lives in m[0]'s arena.
 * Returns 0 or -ENOMEM. */
static int store_query(req *const *m, size_t nm, bool group, bool wait, db_query *q,
                       const char **vals, int *lens, int *fmts)
{
    server *s = req_server(m[0]);
    const store_state *st0 = req_state(m[0]);
    mp_array agent = {0}, clade = {0}, scope = {0}, type = {0}, content = {0}, imp = {0}, md = {0},
             cr = {0}, up = {0}, acc = {0}, cnt = {0}, ex = {0}, pin = {0}, tens = {0},
             counts = {0}, dims = {0}, gens = {0}, idems = {0}, fps = {0};
    size_t vbytes = 0;
    for (size_t j = 0; j < nm; j++)
        vbytes += ((const store_state *)req_state(m[j]))->n * req_auth(m[j])->dim * sizeof(float);
    char *emb = req_alloc(m[0], vbytes ? vbytes : 1);
    bool ok = emb != NULL;
    size_t at = 0;
    for (size_t j = 0; ok && j < nm; j++) {
        const store_state *st = req_state(m[j]);
        const conn_auth *a = req_auth(m[j]);
        size_t row = a->dim * sizeof(float);
        /* a request's idempotency key and its fingerprint in hex (without bytea's "\x") */
        ok = mp_array_i64(&tens, a->tenant_id, false) == 0 &&
             mp_array_i64(&counts, (int64_t)st->n, false) == 0 &&
             mp_array_i64(&dims, (int64_t)a->dim, false) == 0 &&
             mp_array_i64(&gens, a->embed_gen, false) == 0 &&
             mp_array_str(&idems, st->idem, st->idem ? strlen(st->idem) : 0) == 0 &&
             mp_array_str(&fps, st->idem ? st->fingerprint + 2 : NULL,
                          st->idem ? strlen(st->fingerprint + 2) : 0) == 0;
        for (size_t i = 0; ok && i < st->n; i++, at += row) {
            const mem_item *it = &st->items[i];
            memcpy(emb + at, it->vec, row);
            ok = mp_array_i64(&agent, (int64_t)it->agent_id, false) == 0 &&
                 mp_array_i64(&clade, (int64_t)it->clade_id, false) == 0 &&
                 mp_array_str(&scope, memrow_scope_name(it->scope),
                              strlen(memrow_scope_name(it->scope))) == 0 &&
                 mp_array_str(&type, memrow_type_name(it->type),
                              strlen(memrow_type_name(it->type))) == 0 &&
                 mp_array_str(&content, it->content, it->content_len) == 0 &&
                 mp_array_f64(&imp, it->importance) == 0 &&
                 mp_array_str(&md, it->metadata_json, strlen(it->metadata_json)) == 0 &&
                 mp_array_i64(&cr, it->created_ms, it->created_ms == INT64_MIN) == 0 &&
                 mp_array_i64(&up, it->updated_ms, it->updated_ms == INT64_MIN) == 0 &&
                 mp_array_i64(&acc, it->accessed_ms, it->accessed_ms == INT64_MIN) == 0 &&
                 mp_array_i64(&cnt, it->access_count, it->access_count < 0) == 0 &&
                 mp_array_i64(&ex, it->expires_ms, it->expires_ms == INT64_MIN) == 0 &&
                 mp_array_bool(&pin, it->pinned) == 0;
        }
    }
    char *lits[19] = {NULL};
    mp_array *arrs[19] = {&agent, &clade, &scope, &type, &content, &imp,  &md,   &cr,    &up, &acc,
                          &cnt,   &ex,    &pin,   &tens, &counts,  &dims, &gens, &idems, &fps};
    for (int i = 0; i < 19; i++) {
        if (ok)
            ok = (lits[i] = mp_array_finish(m[0], arrs[i])) != NULL;
        else
            mp_array_fini(arrs[i]);
    }
    if (!ok)
        return -ENOMEM;
    memset(lens, 0, 22 * sizeof(*lens));
    memset(fmts, 0, 22 * sizeof(*fmts));
    if (group) {
        /* the database picks the limit of each tenant's tier as it is when the rows go in */
        /* a tenant whose row another transaction holds: waited for at most
         * write_lock_probe_ms, then refused (EG503) and sent alone to its lane, which waits
         * (NULL: the lane's lock_timeout bounds it) */
        char *probe = wait ? NULL : req_alloc(m[0], 16);
        if (!wait && !probe)
            return -ENOMEM;
        if (probe)
            snprintf(probe, 16, "%d", s->cfg.write_lock_probe_ms);
        /* lits[16]: each request's embedding generation (conn_auth.embed_gen): a request
         * embedded with a model its tenant has left since is refused (EG412) */
        /* lits[17], lits[18]: each request's idempotency key and fingerprint (NULL: none):
         * a keyed request replays or conflicts in the group as alone; a group without keys
         * passes NULL arrays, which skip the function's key checks */
        bool keyed = false;
        for (size_t j = 0; j < nm && !keyed; j++)
            keyed = ((const store_state *)req_state(m[j]))->idem != NULL;
        if (!keyed)
            lits[17] = lits[18] = NULL;
        const char *v[22] = {lits[13], lits[14], lits[15], server_memory_limits(s),
                             lits[0],  lits[1],  lits[2],  lits[3],
                             lits[4],  lits[5],  lits[6],  emb,
                             lits[7],  lits[8],  lits[9],  lits[10],
                             lits[11], lits[12], lits[16], probe,
                             lits[17], lits[18]};
        memcpy(vals, v, sizeof(v));
        lens[11] = (int)vbytes;
        fmts[11] = 1;
        *q = (db_query){.stmt = sql_def(SQL_MEMORY_STORE_GROUP),
                        .nvalues = 22, /* v[22] */
                        .values = vals,
                        .lengths = lens,
                        .formats = fmts};
        return 0;
    }
    const char *tid = mp_tenant_param(m[0]);
    char *dim = req_alloc(m[0], 16), *gen = req_alloc(m[0], 24);
    if (!tid || !dim || !gen)
        return -ENOMEM;
    snprintf(dim, 16, "%u", req_auth(m[0])->dim);
    snprintf(gen, 24, "%lld", (long long)req_auth(m[0])->embed_gen);
    const char *v[20] = {tid,       server_memory_limits(s),
                         st0->idem, st0->idem ? st0->fingerprint : NULL,
                         dim,       lits[0],
                         lits[1],   lits[2],
                         lits[3],   lits[4],
                         lits[5],   lits[6],
                         emb,       lits[7],
                         lits[8],   lits[9],
                         lits[10],  lits[11],
                         lits[12],  gen};
    memcpy(vals, v, sizeof(v));
    lens[12] = (int)vbytes;
    fmts[12] = 1;
    *q = (db_query){.stmt = sql_def(SQL_MEMORY_STORE_BATCH),
                    .nvalues = 20, /* v[20] */
                    .values = vals,
                    .lengths = lens,
                    .formats = fmts};
    return 0;
}

/* Stores go through the worker's group commit (gcommit.h), those with an idempotency key
 * too: the group statement checks and records each request's key as
 * engram_memory_store_batch does alone, and a group never holds one key of a tenant twice
 * (the second goes in a later group, where it replays the first). */
static size_t store_items(req *r)
{
    return ((const store_state *)req_state(r))->n;
}

static const char *store_key(req *r)
{
    return ((const store_state *)req_state(r))->idem;
}

static int store_build(req *const *m, size_t nm, db_query *q, gc_params *p)
{
    return store_query(m, nm, true, p->wait, q, p->vals, p->lens, p->fmts);
}

/* On Citus: r alone through engram_memory_store_as (its tenant bound by the function), one
 * statement of a store group of its worker's tenants (gcommit.h). */
static int store_build_one(req *r, db_query *q, gc_params *p)
{
    if (store_query(&r, 1, false, false, q, p->vals, p->lens, p->fmts) < 0)
        return -ENOMEM;
    q->stmt = sql_def(SQL_MEMORY_STORE_AS); /* the same parameters and rows */
    return 0;
}

static const gc_ops store_ops = {
    .max_items = BATCH_MAX,
    .seq_col = 4, /* engram_memory_store_group's m_seq (it sends no NOTIFY itself) */
    .solo_stmt = SQL_MEMORY_STORE_SOLO,
    /* A bigger request goes through engram_memory_store_group, which computes its text
     * search vectors before it takes the tenant's lock (migration 0008), while another
     * batch of the tenant holds it: store_batch of 1,000 on 2 connections, one tenant,
     * 24,483 and 25,132 memories/s through the statement, 32,877 to 33,729 through the
     * function (bench/README.md, "Text search vectors before the lock"). */
    .solo_max_items = 16,
    .items = store_items,
    .key = store_key,
    .build = store_build,
    .build_one = store_build_one,
    .finish = store_finish,
    .fail = store_fail,
};

/* Sends the store once every memory has its vector. */
static void store_submit(req *r, rpc_code code, const char *message)
{
    if (code != RPC_OK) {
        req_fail(r, code, "%s", message ? message : "embedding failed");
        return;
    }
    /* Every store goes through the group (keyed ones too: the client libraries give every
     * store a key). On Citus a group holds the tenants of one node only, each request
     * through engram_memory_store_as, which the coordinator delegates to that node: the
     * group is one local transaction there (gcommit.h); each request is
     * engram_memory_store_batch there, its key checked under its tenant's row lock as alone.
     * Without the placements a request goes alone through engram_memory_store_batch,
     * delegated the same way. */
    server *s = req_server(r);
    if (!s->on_citus || s->placements) {
        gc_submit(r, &store_ops);
        return;
    }
    gc_params p;
    db_query q;
    if (store_query(&r, 1, false, false, &q, p.vals, p.lens, p.fmts) < 0) {
        req_fail(r, RPC_INTERNAL, "out of memory");
        return;
    }
    req_submit(r, req_auth(r)->tenant_id, &q, 1, store_done);
}

/* Embeds the items that came without a vector, checks the others, then submits. */
static void store_embed(req *r)
{
    store_state *st = req_state(r);
    const conn_auth *a = req_auth(r);
    size_t need = 0;
    char err[300], name[64];
    for (size_t i = 0; i < st->n; i++) {
        mem_item *it = &st->items[i];
        it->vec = req_alloc(r, a->dim * sizeof(float));
        if (!it->vec) {
            req_fail(r, RPC_INTERNAL, "out of memory");
            return;
        }
        if (!it->embedding) {
            need++;
            continue;
        }
        snprintf(name, sizeof(name), "%sembedding", it->what);
        if (rpc_get_vector(it->embedding, name, it->vec, a->dim, err, sizeof(err)) != 0) {
            req_fail(r, RPC_INVALID_ARGUMENT, "%s (this tenant's dimension is %u)", err, a->dim);
            return;
        }
        double norm = 0;
        for (size_t k = 0; k < a->dim; k++)
            norm += (double)it->vec[k] * it->vec[k];
        if (norm == 0.0) {
            req_fail(r, RPC_INVALID_ARGUMENT, "parameter '%s' is a zero vector", name);
            return;
        }
    }
    const char **texts = req_alloc(r, (need + 1) * sizeof(*texts));
    const char **whats = req_alloc(r, (need + 1) * sizeof(*whats));
    size_t *lens = req_alloc(r, (need + 1) * sizeof(*lens));
    float **outs = req_alloc(r, (need + 1) * sizeof(*outs));
    if (!texts || !whats || !lens || !outs) {
        req_fail(r, RPC_INTERNAL, "out of memory");
        return;
    }
    size_t k = 0;
    for (size_t i = 0; i < st->n; i++) {
        mem_item *it = &st->items[i];
        if (it->embedding)
            continue;
        char *w = req_alloc(r, 48);
        if (!w) {
            req_fail(r, RPC_INTERNAL, "out of memory");
            return;
        }
        snprintf(w, 48, "%scontent", it->what);
        texts[k] = it->content;
        lens[k] = it->content_len;
        outs[k] = it->vec;
        whats[k] = w;
        k++;
    }
    re_embed(r, texts, lens, outs, whats, need, store_submit);
}

/* The request fingerprint for idempotency: SHA-256 of the arguments as MessagePack. */
static int fingerprint(const msgpack_object *const *args, size_t nargs, char out[2 + 64 + 1])
{
    msgpack_sbuffer sb;
    msgpack_packer pk;
    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    for (size_t i = 0; i < nargs; i++) {
        if (args[i])
            msgpack_pack_object(&pk, *args[i]);
        else
            msgpack_pack_nil(&pk);
    }
    unsigned char h[crypto_hash_sha256_BYTES];
    crypto_hash_sha256(h, (const unsigned char *)(sb.data ? sb.data : ""), sb.size);
    msgpack_sbuffer_destroy(&sb);
    out[0] = '\\';
    out[1] = 'x';
    sodium_bin2hex(out + 2, 65, h, sizeof(h));
    return 0;
}

void h_memory_store(req *r)
{
    char err[300];
    store_state *st = req_alloc(r, sizeof(*st));
    mem_item *it = req_alloc(r, sizeof(*it));
    if (!st || !it) {
        req_fail(r, RPC_INTERNAL, "out of memory");
        return;
    }
    memset(st, 0, sizeof(*st));
    const msgpack_object *args[P_IT__COUNT + 1];
    for (size_t i = 0; i <= P_IT__COUNT; i++)
        args[i] = req_arg(r, i);
    rpc_code code = parse_item(r, args, "", server_now_ms(), it, err, sizeof(err));
    if (code != RPC_OK) {
        req_fail(r, code, "%s", err);
        return;
    }
    st->items = it;
    st->n = 1;
    st->idem = req_strdup(r, req_arg(r, P_ST_IDEMPOTENCY_KEY));
    if (st->idem) {
        /* the arguments without the alias slot (always empty: memory_type binds to type),
         * so a retry may use either name and fingerprints stay as they were before it */
        const msgpack_object *fa[P_IT__COUNT];
        size_t nfa = 0;
        for (size_t i = 0; i < P_IT__COUNT; i++)
            if (i != P_IT_MEMORY_TYPE)
                fa[nfa++] = args[i];
        fingerprint(fa, nfa, st->fingerprint);
    }
    req_set_state(r, st);
    store_embed(r);
}

void h_memory_store_batch(req *r)
{
    char err[300];
    const msgpack_object *mems = req_arg(r, P_SB_MEMORIES);
    store_state *st = req_alloc(r, sizeof(*st));
    size_t n = mems->via.array.size;
    if (!st || !(st->items = req_alloc(r, n * sizeof(*st->items)))) {
        req_fail(r, RPC_INTERNAL, "out of memory");
        return;
    }
    st->n = n;
    st->batch = true;
    st->idem = NULL;
    int64_t now = server_now_ms();
    const size_t nitem = sizeof(item_schema) / sizeof(item_schema[0]);
    for (size_t i = 0; i < n; i++) {
        const msgpack_object *m = &mems->via.array.ptr[i];
        const msgpack_object *args[sizeof(item_schema) / sizeof(item_schema[0])];
        char what[32];
        snprintf(what, sizeof(what), "memories[%zu].", i);
        if (m->type != MSGPACK_OBJECT_MAP) {
            req_fail(r, RPC_INVALID_ARGUMENT, "'memories[%zu]' must be a map", i);
            return;
        }
        if (rpc_bind_params(m, item_schema, nitem, args, err, sizeof(err)) != 0) {
            req_fail(r, RPC_INVALID_ARGUMENT, "memories[%zu]: %s", i, err);
            return;
        }
        rpc_code code = parse_item(r, args, what, now, &st->items[i], err, sizeof(err));
        if (code != RPC_OK) {
            req_fail(r, code, "%s", err);
            return;
        }
    }
    const msgpack_object *key = req_arg(r, P_SB_IDEMPOTENCY_KEY);
    if (key) {
        st->idem = req_strdup(r, key);
        const msgpack_object *fa[1] = {mems};
        fingerprint(fa, 1, st->fingerprint);
    }
    req_set_state(r, st);
    store_embed(r);
}
