/* server/methods/m_memory.c: writing and reading memories: store, store_batch, get, delete,
 * update, archive, restore, history, list, stats. Searches live in m_search.c. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sodium.h>

#include "embedder.h"
#include "gcommit.h"
#include "handlers.h"
#include "plimits.h"
#include "log.h"
#include "memfilter.h"
#include "mempack.h"
#include "memrow.h"
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

/* metadata_json checks a metadata map (what prefixes the parameter's name in messages) and
 * sets *out to its JSON text, allocated in r's arena. Returns RPC_OK, or
 * RPC_INVALID_ARGUMENT / RPC_INTERNAL with the reason in err. */
static rpc_code metadata_json(req *r, const msgpack_object *md, const char *what, char **out,
                              char *err, size_t errlen)
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
    if (it->type < 0) {
        snprintf(err, errlen,
                 "parameter '%stype' must be one of fact, preference, episode, strategy_outcome, "
                 "constraint",
                 what);
        return RPC_INVALID_ARGUMENT;
    }
    it->importance = rpc_get_num(a[P_IT_IMPORTANCE], 0);
    it->metadata = a[P_IT_METADATA];
    it->metadata_json = "{}";
    if (it->metadata) {
        rpc_code code = metadata_json(r, it->metadata, what, &it->metadata_json, err, errlen);
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
            snprintf(err, errlen, "parameter '%sscope' must be agent, clade or tenant", what);
            return RPC_INVALID_ARGUMENT;
        }
    }
    if (it->scope == SCOPE_AGENT && !a[P_IT_AGENT_ID]) {
        snprintf(err, errlen, "scope 'agent' needs parameter '%sagent_id'", what);
        return RPC_INVALID_ARGUMENT;
    }
    if (it->scope == SCOPE_CLADE && !a[P_IT_CLADE_ID]) {
        snprintf(err, errlen, "scope 'clade' needs parameter '%sclade_id'", what);
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

/* Ends r for a failed job that stores, updates, archives or restores memories: a tier limit
 * (EG429, detail "limit=L usage=U requested=N") becomes quota_exceeded with limit, usage,
 * requested and quota ("memories": the live memory count, requested memories;
 * "memory_bytes": the bytes of text the memories and their kept versions hold, requested
 * bytes); anything else as req_fail_db. requested: the memories asked for (a detail's
 * requested is used when present). */
static void memory_write_fail(req *r, const db_result *res, int64_t requested)
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

/* Ends r for a failed store job. */
static void store_fail(req *r, const db_result *res)
{
    store_state *st = req_state(r);
    memory_write_fail(r, res, (int64_t)st->n);
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
            m.ntags = ntags;
        }
        tenant_apply_upsert(t, mm.seq, mm.id, st->items[k].vec, &m);
        free((void *)m.tags);
    }
    tenant_put(t);
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
             counts = {0}, dims = {0};
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
        ok = mp_array_i64(&tens, a->tenant_id, false) == 0 &&
             mp_array_i64(&counts, (int64_t)st->n, false) == 0 &&
             mp_array_i64(&dims, (int64_t)a->dim, false) == 0;
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
    char *lits[16] = {NULL};
    mp_array *arrs[16] = {&agent, &clade, &scope, &type, &content, &imp,  &md,     &cr,
                          &up,    &acc,   &cnt,   &ex,   &pin,     &tens, &counts, &dims};
    for (int i = 0; i < 16; i++) {
        if (ok)
            ok = (lits[i] = mp_array_finish(m[0], arrs[i])) != NULL;
        else
            mp_array_fini(arrs[i]);
    }
    if (!ok)
        return -ENOMEM;
    memset(lens, 0, 19 * sizeof(*lens));
    memset(fmts, 0, 19 * sizeof(*fmts));
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
        const char *v[19] = {lits[13], lits[14], lits[15], s->memory_limits, lits[0],  lits[1],
                             lits[2],  lits[3],  lits[4],  lits[5],          lits[6],  emb,
                             lits[7],  lits[8],  lits[9],  lits[10],         lits[11], lits[12],
                             probe};
        memcpy(vals, v, sizeof(v));
        lens[11] = (int)vbytes;
        fmts[11] = 1;
        *q = (db_query){.stmt = sql_def(SQL_MEMORY_STORE_GROUP),
                        .nvalues = 19, /* v[19] */
                        .values = vals,
                        .lengths = lens,
                        .formats = fmts};
        return 0;
    }
    const char *tid = mp_tenant_param(m[0]);
    char *dim = req_alloc(m[0], 16);
    if (!tid || !dim)
        return -ENOMEM;
    snprintf(dim, 16, "%u", req_auth(m[0])->dim);
    const char *v[19] = {tid,      s->memory_limits, st0->idem, st0->idem ? st0->fingerprint : NULL,
                         dim,      lits[0],          lits[1],   lits[2],
                         lits[3],  lits[4],          lits[5],   lits[6],
                         emb,      lits[7],          lits[8],   lits[9],
                         lits[10], lits[11],         lits[12]};
    memcpy(vals, v, sizeof(v));
    lens[12] = (int)vbytes;
    fmts[12] = 1;
    *q = (db_query){.stmt = sql_def(SQL_MEMORY_STORE_BATCH),
                    .nvalues = 19, /* v[19] */
                    .values = vals,
                    .lengths = lens,
                    .formats = fmts};
    return 0;
}

/* Stores go through the worker's group commit (gcommit.h), except those with an
 * idempotency key: a replay must see its own transaction. */
static size_t store_items(req *r)
{
    return ((const store_state *)req_state(r))->n;
}

static int store_build(req *const *m, size_t nm, db_query *q, gc_params *p)
{
    return store_query(m, nm, true, p->wait, q, p->vals, p->lens, p->fmts);
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
    .build = store_build,
    .finish = store_finish,
    .fail = store_fail,
};

/* Sends the store once every memory has its vector. */
static void store_submit(req *r, rpc_code code, const char *message)
{
    store_state *st = req_state(r);
    if (code != RPC_OK) {
        req_fail(r, code, "%s", message ? message : "embedding failed");
        return;
    }
    if (!st->idem) {
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
    embedder_run(r, texts, lens, outs, whats, need, store_submit);
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

/* ---- memory.get ------------------------------------------------------------------------ */

enum { P_GET_IDS };
PARAMS(memory_get, {"ids", RPC_T_UINT_ARRAY, RPC_P_REQUIRED | RPC_P_RANGE, 1, 1000});

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static void get_rows(req *r, const db_result *res)
{
    if (res->status != DB_OK) {
        req_fail_db(r, res);
        return;
    }
    const PGresult *pr = res->res[0];
    int n = PQntuples(pr);
    size_t nask;
    uint64_t *ask = mp_uint_array(r, req_arg(r, P_GET_IDS), &nask);
    uint64_t *found = req_alloc(r, ((size_t)n + 1) * sizeof(*found));
    if (!ask || !found) {
        req_fail(r, RPC_INTERNAL, "out of memory");
        return;
    }
    msgpack_packer *pk = req_result(r);
    msgpack_pack_map(pk, 2);
    rpc_pack_cstr(pk, "memories");
    msgpack_pack_array(pk, (uint32_t)n);
    size_t nfound = 0;
    for (int i = 0; i < n; i++) {
        memrow m;
        if (memrow_parse(pr, i, 0, &m) != 0) {
            msgpack_pack_nil(pk);
        } else {
            mp_pack_memory(pk, &m, NULL, 0);
            found[nfound++] = m.id;
        }
    }
    /* the ids asked for that are not there (deleted, expired, another tenant's, never
     * stored), in the order asked, once each */
    qsort(found, nfound, sizeof(*found), cmp_u64);
    size_t nmissing = 0;
    for (size_t i = 0; i < nask; i++) {
        bool seen = bsearch(&ask[i], found, nfound, sizeof(*found), cmp_u64) != NULL;
        for (size_t j = 0; !seen && j < i; j++)
            seen = ask[j] == ask[i];
        if (!seen)
            ask[nmissing++] = ask[i];
    }
    rpc_pack_cstr(pk, "missing");
    msgpack_pack_array(pk, (uint32_t)nmissing);
    for (size_t i = 0; i < nmissing; i++)
        msgpack_pack_uint64(pk, ask[i]);
    req_done(r);
}

/* Submits one statement taking (tenant, ids[]) with the request's ids argument; a read
 * (read true) may run on a standby (req_submit_read). */
static void submit_ids(req *r, size_t param, sql_stmt stmt, bool read,
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

void h_memory_get(req *r)
{
    submit_ids(r, P_GET_IDS, SQL_MEMORY_GET, true, get_rows);
}

/* ---- memory.delete ------------------------------------------------------------------- */

#define DELETE_BATCH 1000 /* memories per transaction of a delete by filter */

enum { P_DEL_IDS, P_DEL_FILTER, P_DEL_DRY_RUN, P_DEL_ALL };
PARAMS(memory_delete, {"ids", RPC_T_UINT_ARRAY, RPC_P_NULLABLE | RPC_P_RANGE, 1, 1000},
       {"filter", RPC_T_MAP, RPC_P_NULLABLE | RPC_P_LIMIT(PLIM_METADATA), 0, 0},
       {"dry_run", RPC_T_BOOL, RPC_P_NULLABLE, 0, 0}, {"all", RPC_T_BOOL, RPC_P_NULLABLE, 0, 0});

static const rpc_param delete_filter_schema[] = {MF_PARAMS};

/* Applies the deleted (id, seq) rows of pr to the tenant's index; returns how many. */
static int apply_deletes(req *r, const PGresult *pr)
{
    const conn_auth *a = req_auth(r);
    tenant *t = tenants_get(req_server(r)->tenants, a->tenant_id, a->dim);
    int n = PQntuples(pr);
    for (int i = 0; t && i < n; i++)
        tenant_apply_delete(t, (uint64_t)memrow_i64(pr, i, 1, 0),
                            (uint64_t)memrow_i64(pr, i, 0, 0));
    tenant_put(t);
    return n;
}

static void delete_done(req *r, const db_result *res)
{
    if (res->status != DB_OK) {
        req_fail_db(r, res);
        return;
    }
    const PGresult *pr = res->res[0];
    int n = apply_deletes(r, pr);
    msgpack_packer *pk = req_result(r);
    msgpack_pack_map(pk, 1);
    rpc_pack_cstr(pk, "deleted");
    msgpack_pack_array(pk, (uint32_t)n);
    for (int i = 0; i < n; i++)
        msgpack_pack_uint64(pk, (uint64_t)memrow_i64(pr, i, 0, 0));
    req_done(r);
}

/* A delete by filter: the statement parameters (see SQL_MEMORY_DELETE_FILTER) and the count
 * so far. Batches of DELETE_BATCH memories in id order, each its own transaction under the
 * tenant row's lock, up to the tenant's last memory id when the first batch ran. */
typedef struct delete_state {
    const char *vals[1 + SQL_FILTER_NPARAMS + 5];
    char last[24], after[24], limit[16];
    int64_t count;
} delete_state;

enum { DV_OWNER_AGENT = 1 + SQL_FILTER_NPARAMS, DV_OWNER_CLADE, DV_LAST, DV_LIMIT, DV_AFTER };

static void delete_filter_batch(req *r);

static void delete_filter_rows(req *r, const db_result *res)
{
    delete_state *st = req_state(r);
    if (res->status != DB_OK) {
        /* earlier batches stay deleted; a repeated call deletes the rest */
        req_fail_db(r, res);
        return;
    }
    if (!st->vals[DV_LAST]) {
        snprintf(st->last, sizeof(st->last), "%lld", (long long)memrow_i64(res->res[0], 0, 0, 0));
        st->vals[DV_LAST] = st->last;
    }
    const PGresult *pr = res->res[1];
    int n = apply_deletes(r, pr);
    st->count += n;
    if (n == DELETE_BATCH) {
        /* rows come back in id order: the next batch starts after the last */
        snprintf(st->after, sizeof(st->after), "%lld", (long long)memrow_i64(pr, n - 1, 0, 0));
        st->vals[DV_AFTER] = st->after;
        delete_filter_batch(r);
        return;
    }
    msgpack_packer *pk = req_result(r);
    msgpack_pack_map(pk, 2);
    rpc_pack_kv_int(pk, "count", st->count);
    rpc_pack_kv_bool(pk, "dry_run", false);
    req_done(r);
}

static void delete_filter_batch(req *r)
{
    delete_state *st = req_state(r);
    db_query q[2] = {{.stmt = sql_def(SQL_MEMORY_DELETE_LOCK), .values = st->vals, .nvalues = 1},
                     {.stmt = sql_def(SQL_MEMORY_DELETE_FILTER), DB_VALUES(st->vals)}};
    req_submit(r, req_auth(r)->tenant_id, q, 2, delete_filter_rows);
}

static void delete_count_rows(req *r, const db_result *res)
{
    if (res->status != DB_OK) {
        req_fail_db(r, res);
        return;
    }
    msgpack_packer *pk = req_result(r);
    msgpack_pack_map(pk, 2);
    rpc_pack_kv_int(pk, "count", memrow_i64(res->res[0], 0, 0, 0));
    rpc_pack_kv_bool(pk, "dry_run", true);
    req_done(r);
}

/* memory.delete {filter, dry_run, all}: the search filters, except that agent_id and
 * clade_id select the memories stored with them (ownership, not what that agent may see:
 * that includes the tenant's shared memories) and archived memories match unless
 * include_archived is false. An empty filter needs all: true. */
static void delete_by_filter(req *r, const msgpack_object *filter)
{
    char err[300];
    const msgpack_object *args[MF__COUNT];
    if (rpc_bind_params(filter, delete_filter_schema, MF__COUNT, args, err, sizeof(err)) != 0) {
        req_fail(r, RPC_INVALID_ARGUMENT, "filter: %s", err);
        return;
    }
    bool constrains = false;
    for (size_t i = 0; i < MF__COUNT; i++)
        constrains = constrains || (i != MF_INCLUDE_ARCHIVED && args[i]);
    bool all = rpc_get_bool(req_arg(r, P_DEL_ALL), false);
    if (!constrains && !all) {
        req_fail(r, RPC_INVALID_ARGUMENT,
                 "an empty 'filter' matches every memory of the tenant: give 'all': true to "
                 "delete them all");
        return;
    }
    if (constrains && all) {
        req_fail(r, RPC_INVALID_ARGUMENT, "'all': true goes with an empty 'filter' only");
        return;
    }
    const msgpack_object *agent = args[MF_AGENT_ID], *clade = args[MF_CLADE_ID];
    args[MF_AGENT_ID] = args[MF_CLADE_ID] = NULL;
    mem_filter f;
    if (mf_parse_args(r, args, "filter.", &f) < 0)
        return;
    f.include_archived = rpc_get_bool(args[MF_INCLUDE_ARCHIVED], true);
    delete_state *st = req_alloc(r, sizeof(*st));
    char *owner = req_alloc(r, 64);
    if (!st || !owner) {
        req_fail(r, RPC_INTERNAL, "out of memory");
        return;
    }
    memset(st, 0, sizeof(*st));
    st->vals[0] = mp_tenant_param(r);
    if (!st->vals[0] || mf_sql_params(r, &f, st->vals + 1) < 0) {
        req_fail(r, RPC_INTERNAL, "out of memory");
        return;
    }
    st->vals[DV_OWNER_AGENT] = agent ? memrow_u64_sql(rpc_get_uint(agent, 0), owner) : NULL;
    st->vals[DV_OWNER_CLADE] = clade ? memrow_u64_sql(rpc_get_uint(clade, 0), owner + 32) : NULL;
    req_set_state(r, st);
    if (rpc_get_bool(req_arg(r, P_DEL_DRY_RUN), false)) {
        db_query q = {.stmt = sql_def(SQL_MEMORY_DELETE_COUNT),
                      .values = st->vals,
                      .nvalues = DV_OWNER_CLADE + 1};
        req_submit(r, req_auth(r)->tenant_id, &q, 1, delete_count_rows);
        return;
    }
    snprintf(st->limit, sizeof(st->limit), "%d", DELETE_BATCH);
    st->vals[DV_LIMIT] = st->limit;
    delete_filter_batch(r);
}

void h_memory_delete(req *r)
{
    const msgpack_object *filter = req_arg(r, P_DEL_FILTER);
    if (!req_arg(r, P_DEL_IDS) == !filter) {
        req_fail(r, RPC_INVALID_ARGUMENT, "give 'ids' or 'filter'%s",
                 filter ? ", not both" : " (memories by id, or those that pass a filter)");
        return;
    }
    if (filter) {
        delete_by_filter(r, filter);
        return;
    }
    if (req_arg(r, P_DEL_DRY_RUN) || req_arg(r, P_DEL_ALL)) {
        req_fail(r, RPC_INVALID_ARGUMENT, "'dry_run' and 'all' go with 'filter', not 'ids'");
        return;
    }
    submit_ids(r, P_DEL_IDS, SQL_MEMORY_DELETE, false, delete_done);
}

/* ---- index updates from returned meta rows --------------------------------------------- */

/* Applies every meta row (14 columns from col) of pr to the tenant's index, with vec for
 * all of them (NULL: metadata only). */
static void apply_meta_rows(req *r, const PGresult *pr, int col, const float *vec)
{
    const conn_auth *a = req_auth(r);
    tenant *t = tenants_get(req_server(r)->tenants, a->tenant_id, a->dim);
    if (!t)
        return;
    for (int i = 0; i < PQntuples(pr); i++) {
        memrow_meta mm;
        mem_meta m;
        if (memrow_meta_parse(pr, i, col, &mm) != 0 || !mm.present || mem_meta_from_db(&m, &mm) < 0)
            continue;
        tenant_apply_upsert(t, mm.seq, mm.id, vec, &m);
        free((void *)m.tags);
    }
    tenant_put(t);
}

/* ---- memory.update --------------------------------------------------------------------- */

enum {
    P_UP_ID,
    P_UP_CONTENT,
    P_UP_IMPORTANCE,
    P_UP_TYPE,
    P_UP_METADATA,
    P_UP_EMBEDDING,
    P_UP_EXPIRES_AT,
    P_UP_TTL_SECONDS,
    P_UP_PINNED
};
PARAMS(memory_update, {"id", RPC_T_UINT, RPC_P_REQUIRED, 0, 0},
       {"content", RPC_T_STR, RPC_P_NULLABLE | RPC_P_RANGE | RPC_P_LIMIT(PLIM_CONTENT), 1, 0},
       {"importance", RPC_T_NUM, RPC_P_NULLABLE | RPC_P_RANGE, 0, 1},
       {"type", RPC_T_STR, RPC_P_NULLABLE, 0, 0},
       {"metadata", RPC_T_MAP, RPC_P_NULLABLE | RPC_P_LIMIT(PLIM_METADATA), 0, 0},
       {"embedding", RPC_T_VECTOR, RPC_P_NULLABLE | RPC_P_RANGE, 1, 4096},
       {"expires_at", RPC_T_INT, RPC_P_NULLABLE | RPC_P_RANGE, 0, 1e15},
       {"ttl_seconds", RPC_T_UINT, RPC_P_NULLABLE | RPC_P_RANGE, 1, 3.2e9},
       {"pinned", RPC_T_BOOL, RPC_P_NULLABLE, 0, 0});

typedef struct update_state {
    float *vec; /* the new vector, or NULL when the content stays */
    char *content;
    char *metadata;
    const char *type;
    char importance[32];
    char expires[24];
    bool clear_expiry;
} update_state;

static void update_done(req *r, const db_result *res)
{
    update_state *st = req_state(r);
    if (res->status != DB_OK) {
        memory_write_fail(r, res, 0);
        return;
    }
    const PGresult *pr = res->res[0];
    apply_meta_rows(r, pr, 2, st->vec);
    msgpack_packer *pk = req_result(r);
    msgpack_pack_map(pk, 3);
    rpc_pack_kv_uint(pk, "id", (uint64_t)memrow_i64(pr, 0, 2, 0));
    rpc_pack_kv_int(pk, "version", memrow_i64(pr, 0, 0, 0));
    rpc_pack_kv_int(pk, "updated_at", memrow_i64(pr, 0, 1, 0));
    req_done(r);
}

static void update_submit(req *r, rpc_code code, const char *message)
{
    update_state *st = req_state(r);
    if (code != RPC_OK) {
        req_fail(r, code, "%s", message ? message : "embedding failed");
        return;
    }
    const conn_auth *a = req_auth(r);
    const char *tid = mp_tenant_param(r);
    char *id = req_alloc(r, 24);
    if (!tid || !id) {
        req_fail(r, RPC_INTERNAL, "out of memory");
        return;
    }
    snprintf(id, 24, "%lld", (long long)rpc_get_uint(req_arg(r, P_UP_ID), 0));
    const msgpack_object *pinned = req_arg(r, P_UP_PINNED);
    const char *vals[11] = {tid,
                            id,
                            st->content,
                            st->type,
                            st->importance[0] ? st->importance : NULL,
                            st->metadata,
                            (const char *)st->vec,
                            st->expires[0] ? st->expires : NULL,
                            st->clear_expiry ? "true" : "false",
                            pinned ? (rpc_get_bool(pinned, false) ? "true" : "false") : NULL,
                            req_server(r)->memory_limits};
    int lens[11] = {0}, fmts[11] = {0};
    lens[6] = (int)(a->dim * sizeof(float));
    fmts[6] = 1;
    db_query q = {
        .stmt = sql_def(SQL_MEMORY_UPDATE), DB_VALUES(vals), .lengths = lens, .formats = fmts};
    req_submit(r, a->tenant_id, &q, 1, update_done);
}

void h_memory_update(req *r)
{
    const conn_auth *a = req_auth(r);
    update_state *st = req_alloc(r, sizeof(*st));
    if (!st) {
        req_fail(r, RPC_INTERNAL, "out of memory");
        return;
    }
    memset(st, 0, sizeof(*st));
    char err[300];
    const msgpack_object *o;
    bool any = false;
    for (size_t i = P_UP_CONTENT; i <= P_UP_PINNED; i++)
        any = any || req_arg(r, i);
    if (!any) {
        req_fail(r, RPC_INVALID_ARGUMENT, "memory.update needs at least one field to change");
        return;
    }
    if ((o = req_arg(r, P_UP_CONTENT))) {
        if (!(st->content = req_strdup(r, o))) {
            req_fail(r, RPC_INTERNAL, "out of memory");
            return;
        }
    }
    if ((o = req_arg(r, P_UP_TYPE))) {
        int t = memrow_type_parse(o->via.str.ptr, o->via.str.size);
        if (t < 0) {
            req_fail(r, RPC_INVALID_ARGUMENT,
                     "parameter 'type' must be one of fact, preference, episode, "
                     "strategy_outcome, constraint");
            return;
        }
        st->type = memrow_type_name((mem_type)t);
    }
    if ((o = req_arg(r, P_UP_IMPORTANCE)))
        snprintf(st->importance, sizeof(st->importance), "%.17g", rpc_get_num(o, 0));
    if ((o = req_arg(r, P_UP_METADATA))) {
        rpc_code code = metadata_json(r, o, "", &st->metadata, err, sizeof(err));
        if (code != RPC_OK) {
            req_fail(r, code, "%s", err);
            return;
        }
    }
    const msgpack_object *ex = req_arg(r, P_UP_EXPIRES_AT), *ttl = req_arg(r, P_UP_TTL_SECONDS);
    if (ex && ttl) {
        req_fail(r, RPC_INVALID_ARGUMENT, "give 'expires_at' or 'ttl_seconds', not both");
        return;
    }
    int64_t now = server_now_ms();
    if (ex) {
        int64_t v = rpc_get_int(ex, 0);
        if (v == 0) {
            st->clear_expiry = true; /* expires_at 0 removes the expiry */
        } else if (v <= now) {
            req_fail(r, RPC_INVALID_ARGUMENT, "parameter 'expires_at' must lie in the future");
            return;
        } else {
            snprintf(st->expires, sizeof(st->expires), "%lld", (long long)v);
        }
    } else if (ttl) {
        snprintf(st->expires, sizeof(st->expires), "%lld",
                 (long long)(now + (int64_t)rpc_get_uint(ttl, 0) * 1000));
    }
    req_set_state(r, st);
    const msgpack_object *emb = req_arg(r, P_UP_EMBEDDING);
    if (emb || st->content) {
        st->vec = req_alloc(r, a->dim * sizeof(float));
        if (!st->vec) {
            req_fail(r, RPC_INTERNAL, "out of memory");
            return;
        }
    }
    if (emb) {
        if (rpc_get_vector(emb, "embedding", st->vec, a->dim, err, sizeof(err)) != 0) {
            req_fail(r, RPC_INVALID_ARGUMENT, "%s (this tenant's dimension is %u)", err, a->dim);
            return;
        }
        double norm = 0;
        for (size_t k = 0; k < a->dim; k++)
            norm += (double)st->vec[k] * st->vec[k];
        if (norm == 0.0) {
            req_fail(r, RPC_INVALID_ARGUMENT, "parameter 'embedding' is a zero vector");
            return;
        }
        update_submit(r, RPC_OK, NULL);
        return;
    }
    if (st->content) {
        const char *texts[1] = {st->content};
        size_t lens[1] = {strlen(st->content)};
        float *outs[1] = {st->vec};
        const char *whats[1] = {"content"};
        embedder_run(r, texts, lens, outs, whats, 1, update_submit);
        return;
    }
    update_submit(r, RPC_OK, NULL);
}

/* ---- memory.archive and memory.restore --------------------------------------------------- */

enum { P_AR_IDS, P_AR_REASON };
PARAMS(memory_archive, {"ids", RPC_T_UINT_ARRAY, RPC_P_REQUIRED | RPC_P_RANGE, 1, 1000},
       {"reason", RPC_T_STR, RPC_P_NULLABLE | RPC_P_RANGE, 1, 200});
enum { P_RS_IDS };
PARAMS(memory_restore, {"ids", RPC_T_UINT_ARRAY, RPC_P_REQUIRED | RPC_P_RANGE, 1, 1000});

static void archive_done(req *r, const db_result *res)
{
    const char *key = req_state(r);
    if (res->status != DB_OK) {
        memory_write_fail(r, res, 0); /* the detail says how many were asked */
        return;
    }
    const PGresult *pr = res->res[0];
    apply_meta_rows(r, pr, 2, NULL);
    int n = PQntuples(pr);
    msgpack_packer *pk = req_result(r);
    msgpack_pack_map(pk, 1);
    rpc_pack_cstr(pk, key);
    msgpack_pack_array(pk, (uint32_t)n);
    for (int i = 0; i < n; i++)
        msgpack_pack_uint64(pk, (uint64_t)memrow_i64(pr, i, 2, 0));
    req_done(r);
}

static void set_archived(req *r, bool archive, const char *reason)
{
    size_t n;
    uint64_t *ids = mp_uint_array(r, req_arg(r, 0), &n);
    char *arr = ids ? mp_ids_literal(r, ids, n) : NULL;
    const char *tid = mp_tenant_param(r);
    if (!arr || !tid) {
        req_fail(r, RPC_INTERNAL, "out of memory");
        return;
    }
    req_set_state(r, archive ? "archived" : "restored");
    /* a restore is checked against the tier's memory limit (archived ones do not count) */
    const char *vals[] = {tid, arr, archive ? "true" : "false", reason,
                          req_server(r)->memory_limits};
    db_query q = {.stmt = sql_def(SQL_MEMORY_ARCHIVE), DB_VALUES(vals)};
    req_submit(r, req_auth(r)->tenant_id, &q, 1, archive_done);
}

void h_memory_archive(req *r)
{
    const char *reason = req_strdup(r, req_arg(r, P_AR_REASON));
    set_archived(r, true, reason ? reason : "manual");
}

void h_memory_restore(req *r)
{
    set_archived(r, false, NULL);
}

/* ---- memory.history --------------------------------------------------------------------- */

enum { P_HI_ID };
PARAMS(memory_history, {"id", RPC_T_UINT, RPC_P_REQUIRED, 0, 0});

static void history_rows(req *r, const db_result *res)
{
    if (res->status != DB_OK) {
        req_fail_db(r, res);
        return;
    }
    const PGresult *cur = res->res[0], *vs = res->res[1];
    memrow m;
    if (PQntuples(cur) != 1 || memrow_parse(cur, 0, 0, &m) != 0) {
        req_fail(r, RPC_NOT_FOUND, "memory %llu not found",
                 (unsigned long long)rpc_get_uint(req_arg(r, P_HI_ID), 0));
        return;
    }
    int n = PQntuples(vs);
    msgpack_packer *pk = req_result(r);
    msgpack_pack_map(pk, 2);
    rpc_pack_kv_uint(pk, "id", m.id);
    rpc_pack_cstr(pk, "versions");
    msgpack_pack_array(pk, (uint32_t)n + 1);
    for (int i = 0; i < n; i++) {
        msgpack_pack_map(pk, 11);
        rpc_pack_kv_int(pk, "version", memrow_i64(vs, i, 0, 0));
        rpc_pack_cstr(pk, "content");
        rpc_pack_strn(pk, PQgetvalue(vs, i, 1), (size_t)PQgetlength(vs, i, 1));
        rpc_pack_kv_str(pk, "type", PQgetvalue(vs, i, 2));
        rpc_pack_kv_num(pk, "importance", memrow_f64_of(vs, i, 3, 0, ROWERR_MEMORIES));
        rpc_pack_cstr(pk, "metadata");
        mp_pack_json(pk, PQgetvalue(vs, i, 4), (size_t)PQgetlength(vs, i, 4));
        rpc_pack_kv_int(pk, "valid_from", memrow_i64(vs, i, 5, 0));
        rpc_pack_kv_int(pk, "valid_to", memrow_i64(vs, i, 6, 0));
        rpc_pack_kv_str(pk, "replaced_by", PQgetvalue(vs, i, 7));
        rpc_pack_cstr(pk, "detail");
        mp_pack_json(pk, PQgetvalue(vs, i, 8), (size_t)PQgetlength(vs, i, 8));
        mp_pack_time(pk, "expires_at", memrow_i64(vs, i, 9, MEMROW_NO_TIME));
        mp_pack_time(pk, "archived_at", memrow_i64(vs, i, 10, MEMROW_NO_TIME));
    }
    msgpack_pack_map(pk, 11);
    rpc_pack_kv_int(pk, "version", m.version);
    rpc_pack_cstr(pk, "content");
    rpc_pack_strn(pk, m.content, m.content_len);
    rpc_pack_kv_str(pk, "type", memrow_type_name(m.type));
    rpc_pack_kv_num(pk, "importance", m.importance);
    rpc_pack_cstr(pk, "metadata");
    mp_pack_json(pk, m.metadata_json, m.metadata_len);
    rpc_pack_kv_int(pk, "valid_from", m.updated_ms);
    rpc_pack_kv_nil(pk, "valid_to");
    rpc_pack_kv_nil(pk, "replaced_by");
    rpc_pack_cstr(pk, "detail");
    msgpack_pack_map(pk, 0);
    mp_pack_time(pk, "expires_at", m.expires_ms);
    mp_pack_time(pk, "archived_at", m.archived_ms);
    req_done(r);
}

void h_memory_history(req *r)
{
    uint64_t id = rpc_get_uint(req_arg(r, P_HI_ID), 0);
    const char *tid = mp_tenant_param(r);
    char *ids = mp_ids_literal(r, &id, 1), *one = req_alloc(r, 24);
    if (!tid || !ids || !one) {
        req_fail(r, RPC_INTERNAL, "out of memory");
        return;
    }
    snprintf(one, 24, "%lld", (long long)id);
    const char *v1[] = {tid, ids};
    const char *v2[] = {tid, one};
    db_query q[2] = {{.stmt = sql_def(SQL_MEMORY_GET), DB_VALUES(v1)},
                     {.stmt = sql_def(SQL_MEMORY_HISTORY), DB_VALUES(v2)}};
    req_submit_read(r, q, 2, history_rows);
}

/* ---- memory.list ------------------------------------------------------------------------ */

enum {
    P_LI_ORDER_BY = MF__COUNT,
    P_LI_ORDER,
    P_LI_CURSOR,
    P_LI_LIMIT,
    P_LI_INCLUDE_EMBEDDING,
};
PARAMS(memory_list, MF_PARAMS, {"order_by", RPC_T_STR, RPC_P_NULLABLE, 0, 0},
       {"order", RPC_T_STR, RPC_P_NULLABLE, 0, 0},
       {"cursor", RPC_T_STR, RPC_P_NULLABLE | RPC_P_RANGE, 1, 200},
       {"limit", RPC_T_UINT, RPC_P_NULLABLE | RPC_P_RANGE, 1, 1000},
       {"include_embedding", RPC_T_BOOL, RPC_P_NULLABLE, 0, 0});

typedef struct list_state {
    const char *order_by;
    int sign;
    int64_t as_of;
    size_t limit;
    bool embedding;
} list_state;

static void list_rows(req *r, const db_result *res)
{
    list_state *st = req_state(r);
    if (res->status != DB_OK) {
        req_fail_db(r, res);
        return;
    }
    const PGresult *pr = res->res[0];
    int n = PQntuples(pr);
    msgpack_packer *pk = req_result(r);
    msgpack_pack_map(pk, 2);
    rpc_pack_cstr(pk, "memories");
    msgpack_pack_array(pk, (uint32_t)n);
    for (int i = 0; i < n; i++) {
        memrow m;
        if (memrow_parse(pr, i, 2, &m) != 0) {
            msgpack_pack_nil(pk);
            continue;
        }
        mp_pack_memory(pk, &m, NULL, st->embedding ? 1 : 0);
        if (st->embedding) {
            /* base64 from PostgreSQL, back to bytes: a bin of little-endian float32 */
            const char *b64 = PQgetvalue(pr, i, 2 + SQL_MEMROW_NCOLS);
            size_t blen = (size_t)PQgetlength(pr, i, 2 + SQL_MEMROW_NCOLS);
            unsigned char *bin = malloc(blen);
            size_t got = 0;
            rpc_pack_cstr(pk, "embedding");
            if (bin && sodium_base642bin(bin, blen, b64, blen, "\n", &got, NULL,
                                         sodium_base64_VARIANT_ORIGINAL) == 0) {
                msgpack_pack_bin(pk, got);
                msgpack_pack_bin_body(pk, bin, got);
            } else {
                msgpack_pack_nil(pk);
            }
            free(bin);
        }
    }
    rpc_pack_cstr(pk, "next_cursor");
    if ((size_t)n == st->limit && n > 0) {
        char cur[200];
        snprintf(cur, sizeof(cur), "v1:%s:%d:%lld:%s:%s", st->order_by, st->sign,
                 (long long)st->as_of, PQgetvalue(pr, n - 1, 0), PQgetvalue(pr, n - 1, 1));
        rpc_pack_cstr(pk, cur);
    } else {
        msgpack_pack_nil(pk);
    }
    req_done(r);
}

void h_memory_list(req *r)
{
    mem_filter f;
    if (mf_parse(r, 0, &f) < 0)
        return;
    list_state *st = req_alloc(r, sizeof(*st));
    if (!st) {
        req_fail(r, RPC_INTERNAL, "out of memory");
        return;
    }
    memset(st, 0, sizeof(*st));
    st->order_by = "created_at";
    const msgpack_object *o;
    if ((o = req_arg(r, P_LI_ORDER_BY))) {
        if (rpc_str_eq(o, "created_at"))
            st->order_by = "created_at";
        else if (rpc_str_eq(o, "importance"))
            st->order_by = "importance";
        else if (rpc_str_eq(o, "composite"))
            st->order_by = "composite";
        else {
            req_fail(r, RPC_INVALID_ARGUMENT,
                     "parameter 'order_by' must be created_at, importance or composite");
            return;
        }
    }
    st->sign = 1;
    if ((o = req_arg(r, P_LI_ORDER))) {
        if (rpc_str_eq(o, "asc"))
            st->sign = -1;
        else if (!rpc_str_eq(o, "desc")) {
            req_fail(r, RPC_INVALID_ARGUMENT, "parameter 'order' must be asc or desc");
            return;
        }
    }
    st->limit = (size_t)rpc_get_uint(req_arg(r, P_LI_LIMIT), 100);
    st->embedding = rpc_get_bool(req_arg(r, P_LI_INCLUDE_EMBEDDING), false);
    st->as_of = f.now_ms;
    char *ckey = NULL, *cid = NULL;
    if ((o = req_arg(r, P_LI_CURSOR))) {
        /* v1:<order_by>:<sign>:<as_of>:<key>:<signed id> */
        char buf[201], order[16];
        int sign;
        long long asof, id;
        double key;
        memcpy(buf, o->via.str.ptr, o->via.str.size);
        buf[o->via.str.size] = '\0';
        if (sscanf(buf, "v1:%15[a-z_]:%d:%lld:%lf:%lld", order, &sign, &asof, &key, &id) != 5 ||
            strcmp(order, st->order_by) != 0 || sign != st->sign || !isfinite(key)) {
            req_fail(r, RPC_INVALID_ARGUMENT,
                     "parameter 'cursor' is not a cursor of this listing (same order_by and "
                     "order)");
            return;
        }
        st->as_of = asof; /* composite ranks stay as they were on the first page */
        f.now_ms = asof;
        ckey = req_alloc(r, 40);
        cid = req_alloc(r, 24);
        if (!ckey || !cid) {
            req_fail(r, RPC_INTERNAL, "out of memory");
            return;
        }
        snprintf(ckey, 40, "%.17g", key);
        snprintf(cid, 24, "%lld", id);
    }
    req_set_state(r, st);
    const char *vals[1 + SQL_FILTER_NPARAMS + 5];
    char *sign = req_alloc(r, 4), *limit = req_alloc(r, 16);
    vals[0] = mp_tenant_param(r);
    if (!vals[0] || !sign || !limit || mf_sql_params(r, &f, vals + 1) < 0) {
        req_fail(r, RPC_INTERNAL, "out of memory");
        return;
    }
    snprintf(sign, 4, "%d", st->sign);
    snprintf(limit, 16, "%zu", st->limit);
    const char **tail = vals + 1 + SQL_FILTER_NPARAMS;
    tail[0] = st->order_by;
    tail[1] = sign;
    tail[2] = ckey;
    tail[3] = cid;
    tail[4] = limit;
    db_query q = {.stmt = sql_def(st->embedding ? SQL_MEMORY_LIST_EMB : SQL_MEMORY_LIST),
                  DB_VALUES(vals)};
    req_submit_read(r, &q, 1, list_rows);
}

/* ---- memory.stats ----------------------------------------------------------------------- */

NO_PARAMS(memory_stats);

static void stats_rows(req *r, const db_result *res)
{
    if (res->status != DB_OK) {
        req_fail_db(r, res);
        return;
    }
    const PGresult *pr = res->res[0];
    int64_t by_type[MEM_TYPE_COUNT] = {0}, by_scope[SCOPE_COUNT] = {0};
    int64_t total = 0, archived = 0, bytes = 0;
    int64_t oldest = MEMROW_NO_TIME, newest = MEMROW_NO_TIME;
    for (int i = 0; i < PQntuples(pr); i++) {
        const char *type = PQgetvalue(pr, i, 0), *scope = PQgetvalue(pr, i, 1);
        int t = memrow_type_parse(type, strlen(type)),
            sc = memrow_scope_parse(scope, strlen(scope));
        int64_t n = memrow_i64(pr, i, 2, 0);
        if (t >= 0)
            by_type[t] += n;
        else
            rowerr_report(ROWERR_MEMORIES, PQfname(pr, 0), "not a memory type");
        if (sc >= 0)
            by_scope[sc] += n;
        else
            rowerr_report(ROWERR_MEMORIES, PQfname(pr, 1), "not a memory scope");
        total += n;
        archived += memrow_i64(pr, i, 3, 0);
        int64_t lo = memrow_i64(pr, i, 4, MEMROW_NO_TIME),
                hi = memrow_i64(pr, i, 5, MEMROW_NO_TIME);
        if (lo != MEMROW_NO_TIME && (oldest == MEMROW_NO_TIME || lo < oldest))
            oldest = lo;
        if (hi != MEMROW_NO_TIME && (newest == MEMROW_NO_TIME || hi > newest))
            newest = hi;
        bytes += memrow_i64(pr, i, 6, 0);
    }
    /* the index: as loaded in this process, or the engine its next load will use */
    server *s = req_server(r);
    tenants_index ti;
    bool loaded = tenants_index_info(s->tenants, req_auth(r)->tenant_id, &ti);
    const char *engine;
    if (loaded) {
        engine = index_engine_name(ti.engine);
    } else {
        const PGresult *er = res->nres > 1 ? res->res[1] : NULL;
        engine = er && PQntuples(er) == 1 && !PQgetisnull(er, 0, 0) ? PQgetvalue(er, 0, 0)
                                                                    : s->cfg.index_engine;
    }
    static const char *const kinds[] = {"flat", "sq8", "ann"};
    msgpack_packer *pk = req_result(r);
    msgpack_pack_map(pk, 8);
    rpc_pack_kv_int(pk, "total", total);
    rpc_pack_kv_int(pk, "archived", archived);
    rpc_pack_cstr(pk, "by_type");
    msgpack_pack_map(pk, MEM_TYPE_COUNT);
    for (int i = 0; i < MEM_TYPE_COUNT; i++)
        rpc_pack_kv_int(pk, memrow_type_name((mem_type)i), by_type[i]);
    rpc_pack_cstr(pk, "by_scope");
    msgpack_pack_map(pk, SCOPE_COUNT);
    for (int i = 0; i < SCOPE_COUNT; i++)
        rpc_pack_kv_int(pk, memrow_scope_name((mem_scope)i), by_scope[i]);
    mp_pack_time(pk, "oldest_at", oldest);
    mp_pack_time(pk, "newest_at", newest);
    rpc_pack_kv_int(pk, "storage_bytes", bytes);
    rpc_pack_cstr(pk, "index");
    msgpack_pack_map(pk, 13);
    rpc_pack_kv_str(pk, "engine", engine);
    rpc_pack_kv_bool(pk, "loaded", loaded);
    if (loaded) {
        const vindex_recall *rc = &ti.recall;
        rpc_pack_kv_str(pk, "engine_in_use", index_engine_name(ti.engine_in_use));
        rpc_pack_kv_str(pk, "kind", kinds[ti.kind <= VINDEX_KIND_ANN ? ti.kind : VINDEX_KIND_ANN]);
        rpc_pack_kv_int(pk, "vectors", (int64_t)ti.vectors);
        rpc_pack_cstr(pk, "recall_estimate");
        if (isnan(rc->estimate))
            msgpack_pack_nil(pk);
        else
            msgpack_pack_double(pk, rc->estimate);
        rpc_pack_kv_int(pk, "candidate_depth", (int64_t)rc->depth);
        rpc_pack_kv_int(pk, "blended_depth", (int64_t)rc->scored_depth);
        rpc_pack_kv_bool(pk, "exact_fallback", rc->exact_fallback);
        rpc_pack_kv_int(pk, "recall_samples", (int64_t)rc->samples);
        rpc_pack_kv_int(pk, "recall_query_samples", (int64_t)rc->query_samples);
        rpc_pack_kv_str(pk, "row_cache_warm", tenants_rows_warm_name(ti.rows_warm));
        rpc_pack_kv_int(pk, "rows_warmed", (int64_t)ti.rows_warmed);
    } else {
        rpc_pack_kv_nil(pk, "engine_in_use");
        rpc_pack_kv_nil(pk, "kind");
        rpc_pack_kv_nil(pk, "vectors");
        rpc_pack_kv_nil(pk, "recall_estimate");
        rpc_pack_kv_nil(pk, "candidate_depth");
        rpc_pack_kv_nil(pk, "blended_depth");
        rpc_pack_kv_nil(pk, "exact_fallback");
        rpc_pack_kv_nil(pk, "recall_samples");
        rpc_pack_kv_nil(pk, "recall_query_samples");
        rpc_pack_kv_nil(pk, "row_cache_warm");
        rpc_pack_kv_nil(pk, "rows_warmed");
    }
    req_done(r);
}

void h_memory_stats(req *r)
{
    const char *tid = mp_tenant_param(r);
    if (!tid) {
        req_fail(r, RPC_INTERNAL, "out of memory");
        return;
    }
    const char *vals[] = {tid};
    db_query q[2] = {{.stmt = sql_def(SQL_MEMORY_STATS), DB_VALUES(vals)},
                     {.stmt = sql_def(SQL_TENANT_INDEX_ENGINE), DB_VALUES(vals)}};
    req_submit_read(r, q, 2, stats_rows);
}
