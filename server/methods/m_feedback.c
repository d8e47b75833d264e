/* server/methods/m_feedback.c: memory.feedback and memory.provenance (provenance feedback).
 *
 * A gateway that injected memories into a prompt tells the server which of them the model's
 * answer cited (memory.feedback, from citations) or lets the server estimate it
 * (memory.provenance, the seed's fallback for backends without citations: a memory counts as
 * cited when the response contains at least provenance_overlap_threshold of its wording, or
 * when some sentence of the response has an embedding cosine above provenance_threshold with
 * it, unless the response puts another number where the memory has one; the text side is
 * server/domain/provenance.h). Either way each memory's injected_count grows by one and, when
 * cited, its cited_count too (storage/functions/25_feedback.sql); the composite importance may use
 * them (score.h, setting score_w_usefulness).
 *
 * Rules shared by both: ids are the tenant's own; an id that names no memory of the tenant
 * (never existed, deleted, expired, or another tenant's) is reported in "unknown" and
 * counted nowhere, the others are recorded; a cited id counts as injected whether or not
 * the injected list names it; an id listed twice counts once per call. The write is
 * acknowledged after PostgreSQL committed it.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "app.h"
#include "reqembed.h"
#include "handlers.h"
#include "idmap.h"
#include "log.h"
#include "mempack.h"
#include "memrow.h"
#include "provenance.h"
#include "rowcache.h"
#include "sql.h"
#include "tenants.h"

#define FEEDBACK_MAX_IDS 1000      /* ids per list of memory.feedback */
#define PROVENANCE_MAX_IDS 100     /* injected ids of memory.provenance */
#define PROVENANCE_MAX_BYTES 65536 /* response size */
#define PROVENANCE_MAX_SENTENCES 256

/* One memory named by a call, in the order the call first named it. */
typedef struct fb_item {
    uint64_t id;
    bool cited;
    bool known;        /* PostgreSQL recorded it */
    bool has_sim;      /* provenance: the index had its vector */
    float similarity;  /* provenance: the best cosine over the sentences */
    int sentence;      /* provenance: the sentence of the evidence, -1 when none */
    bool has_overlap;  /* provenance: its text was read */
    bool conflict;     /* provenance: the response has another number in place of one of its */
    float overlap;     /* provenance: the share of its wording the response contains */
    const char *match; /* provenance: "overlap", "cosine" or "both" when cited, else NULL */
    uint64_t seq;      /* provenance: the change the index knows it at (for the row cache) */
    int64_t cited_count, injected_count;
} fb_item;

typedef struct fb_state {
    fb_item *items;
    size_t n;
    idmap *pos; /* id -> index into items */
    bool provenance;
    /* provenance */
    const char *response;
    size_t rlen;
    const char **sent;
    size_t *sent_len;
    size_t nsent;
    float *vecs; /* nsent * dim */
    float **outs;
    tenant *t;
    prov_text *text; /* the response, read for the overlap */
    bool *record;    /* per item: the index knows it (recorded, scored) */
} fb_state;

static void free_state(void *arg)
{
    fb_state *st = arg;
    idmap_destroy(st->pos);
    st->pos = NULL;
    prov_text_destroy(st->text);
    st->text = NULL;
    tenants_put(st->t);
    st->t = NULL;
}

/* Adds the ids of array o (may be NULL) to st's items, each once; cited marks them cited.
 * Returns 0 or -ENOMEM. */
static int add_ids(req *r, fb_state *st, const msgpack_object *o, bool cited)
{
    if (!o)
        return 0;
    size_t n;
    uint64_t *ids = mp_uint_array(r, o, &n);
    if (!ids)
        return -ENOMEM;
    for (size_t i = 0; i < n; i++) {
        uint64_t p;
        if (idmap_get(st->pos, ids[i], &p)) {
            st->items[p].cited |= cited;
            continue;
        }
        if (idmap_put(st->pos, ids[i], st->n) < 0)
            return -ENOMEM;
        fb_item *it = &st->items[st->n++];
        memset(it, 0, sizeof(*it));
        it->id = ids[i];
        it->cited = cited;
        it->sentence = -1;
    }
    return 0;
}

/* Allocates st with room for cap items and registers its cleanup. Returns NULL after
 * failing r. */
static fb_state *state_new(req *r, size_t cap)
{
    fb_state *st = req_alloc(r, sizeof(*st));
    if (st) {
        memset(st, 0, sizeof(*st));
        st->items = req_alloc(r, (cap + 1) * sizeof(*st->items));
        st->pos = idmap_create(cap + 1);
    }
    if (!st || !st->items || !st->pos || req_on_free(r, free_state, st) < 0) {
        if (st)
            idmap_destroy(st->pos);
        req_fail(r, RPC_INTERNAL, "out of memory");
        return NULL;
    }
    req_set_state(r, st);
    return st;
}

static void pack_ids(msgpack_packer *pk, const fb_state *st, bool known)
{
    uint32_t n = 0;
    for (size_t i = 0; i < st->n; i++)
        n += st->items[i].known == known;
    msgpack_pack_array(pk, n);
    for (size_t i = 0; i < st->n; i++)
        if (st->items[i].known == known)
            msgpack_pack_uint64(pk, st->items[i].id);
}

/* Answers with st's items: the recorded ones and their counts, then the unknown ids. */
static void feedback_reply(req *r, const fb_state *st)
{
    msgpack_packer *pk = req_result(r);
    msgpack_pack_map(pk, st->provenance ? 3 : 2);
    rpc_pack_cstr(pk, "memories");
    uint32_t n = 0;
    for (size_t i = 0; i < st->n; i++)
        n += st->items[i].known;
    msgpack_pack_array(pk, n);
    for (size_t i = 0; i < st->n; i++) {
        const fb_item *it = &st->items[i];
        if (!it->known)
            continue;
        msgpack_pack_map(pk, st->provenance ? 10 : 4);
        rpc_pack_kv_uint(pk, "id", it->id);
        rpc_pack_kv_bool(pk, "cited", it->cited);
        rpc_pack_kv_int(pk, "cited_count", it->cited_count);
        rpc_pack_kv_int(pk, "injected_count", it->injected_count);
        if (!st->provenance)
            continue;
        rpc_pack_kv_str(pk, "match", it->match);
        if (it->has_sim)
            rpc_pack_kv_num(pk, "similarity", it->similarity);
        else
            rpc_pack_kv_nil(pk, "similarity");
        if (it->has_overlap)
            rpc_pack_kv_num(pk, "overlap", it->overlap);
        else
            rpc_pack_kv_nil(pk, "overlap");
        rpc_pack_kv_bool(pk, "conflict", it->conflict);
        if (it->sentence >= 0) {
            rpc_pack_kv_int(pk, "sentence", it->sentence);
            /* the sentence itself, so a gateway can show what matched */
            rpc_pack_cstr(pk, "matched_text");
            rpc_pack_strn(pk, st->sent[it->sentence], st->sent_len[it->sentence]);
        } else {
            rpc_pack_kv_nil(pk, "sentence");
            rpc_pack_kv_nil(pk, "matched_text");
        }
    }
    rpc_pack_cstr(pk, "unknown");
    pack_ids(pk, st, false);
    if (st->provenance)
        rpc_pack_kv_uint(pk, "sentences", st->nsent);
    req_done(r);
}

/* The feedback committed: apply the new counts to the index, then answer. */
static void feedback_done(req *r, const db_result *res)
{
    fb_state *st = req_state(r);
    if (res->status != DB_OK) {
        req_fail_db(r, res);
        return;
    }
    const PGresult *pr = res->res[0];
    const conn_auth *a = req_auth(r);
    tenant *t = tenants_get(req_server(r)->tenants, a->tenant_id, a->dim);
    if (t && !tenants_dim_is(t, a->dim)) {
        tenants_put(t); /* another model since: its load reads the database */
        t = NULL;
    }
    for (int i = 0; i < PQntuples(pr); i++) {
        memrow_meta mm;
        mem_meta m;
        if (memrow_meta_parse(pr, i, 3, &mm) != 0 || !mm.present)
            continue;
        uint64_t p;
        if (idmap_get(st->pos, mm.id, &p)) {
            fb_item *it = &st->items[p];
            it->known = true;
            it->cited_count = memrow_i64(pr, i, 1, 0);
            it->injected_count = memrow_i64(pr, i, 2, 0);
        }
        if (!t || mem_meta_from_db(&m, &mm) < 0)
            continue; /* the change log brings it to the index */
        int64_t c = memrow_i64(pr, i, 1, 0), inj = memrow_i64(pr, i, 2, 0);
        m.cited = c > UINT32_MAX ? UINT32_MAX : c < 0 ? 0 : (uint32_t)c;
        m.injected = inj > UINT32_MAX ? UINT32_MAX : inj < 0 ? 0 : (uint32_t)inj;
        tenants_apply_upsert(t, mm.seq, mm.id, NULL, &m);
        free((void *)m.tags);
    }
    tenants_put(t);
    feedback_reply(r, st);
}

/* Records st's items (those with record set: all for feedback, those the index knows for
 * provenance) in one transaction. */
static void feedback_submit(req *r, fb_state *st, const bool *record)
{
    mp_array cited = {0}, injected = {0};
    int rc = 0;
    for (size_t i = 0; i < st->n; i++) {
        if (record && !record[i])
            continue;
        rc |= mp_array_i64(&injected, (int64_t)st->items[i].id, false);
        if (st->items[i].cited)
            rc |= mp_array_i64(&cited, (int64_t)st->items[i].id, false);
    }
    char *c = rc < 0 ? NULL : cited.n ? mp_array_finish(r, &cited) : "{}";
    char *in = rc < 0 ? NULL : injected.n ? mp_array_finish(r, &injected) : "{}";
    mp_array_fini(&cited);
    mp_array_fini(&injected);
    const char *tid = mp_tenant_param(r);
    if (!c || !in || !tid) {
        req_fail(r, RPC_INTERNAL, "out of memory");
        return;
    }
    const char *vals[] = {tid, c, in};
    db_query q = {.stmt = sql_def(SQL_MEMORY_FEEDBACK), DB_VALUES(vals)};
    req_submit(r, req_auth(r)->tenant_id, &q, 1, feedback_done);
}

/* ---- memory.feedback --------------------------------------------------------------------- */

enum { P_FB_CITED, P_FB_INJECTED };
PARAMS(memory_feedback,
       {"cited", RPC_T_UINT_ARRAY, RPC_P_NULLABLE | RPC_P_RANGE, 0, FEEDBACK_MAX_IDS},
       {"injected", RPC_T_UINT_ARRAY, RPC_P_NULLABLE | RPC_P_RANGE, 0, FEEDBACK_MAX_IDS});

void h_memory_feedback(req *r)
{
    const msgpack_object *cited = req_arg(r, P_FB_CITED);
    const msgpack_object *injected = req_arg(r, P_FB_INJECTED);
    size_t total = (cited ? cited->via.array.size : 0) + (injected ? injected->via.array.size : 0);
    if (total == 0) {
        req_fail(r, RPC_INVALID_ARGUMENT,
                 "memory.feedback needs at least one id in 'cited' or 'injected'");
        return;
    }
    fb_state *st = state_new(r, total);
    if (!st)
        return;
    if (add_ids(r, st, cited, true) < 0 || add_ids(r, st, injected, false) < 0) {
        req_fail(r, RPC_INTERNAL, "out of memory");
        return;
    }
    feedback_submit(r, st, NULL);
}

/* ---- memory.provenance ------------------------------------------------------------------- */

enum { P_PV_RESPONSE, P_PV_INJECTED };
PARAMS(memory_provenance,
       {"response", RPC_T_STR, RPC_P_REQUIRED | RPC_P_RANGE, 1, PROVENANCE_MAX_BYTES},
       {"injected", RPC_T_UINT_ARRAY, RPC_P_REQUIRED | RPC_P_RANGE, 1, PROVENANCE_MAX_IDS});

/* The sentence of st's response that holds byte offset at (the last one starting at or
 * before it). */
static int sentence_at(const fb_state *st, size_t at)
{
    int k = 0;
    while ((size_t)k + 1 < st->nsent && (size_t)(st->sent[k + 1] - st->response) <= at)
        k++;
    return k;
}

/* Scores item it's text (len bytes) against the response and decides whether it is cited:
 * the overlap or the cosine reaches its threshold, and no number of it is contradicted. */
static int decide(req *r, fb_state *st, fb_item *it, const char *text, size_t len)
{
    const config *cfg = &req_server(r)->cfg;
    prov_overlap o = {0};
    if (text) {
        if (prov_overlap_score(st->text, text, len, &o) < 0)
            return -ENOMEM;
        it->has_overlap = true;
        it->overlap = (float)o.score;
        it->conflict = o.conflict;
    }
    bool by_ov = it->has_overlap && o.total > 0 && o.score >= cfg->provenance_overlap_threshold;
    bool by_cos = it->has_sim && it->similarity > cfg->provenance_threshold;
    it->cited = (by_ov || by_cos) && !it->conflict;
    it->match = !it->cited ? NULL : by_ov && by_cos ? "both" : by_ov ? "overlap" : "cosine";
    if (by_ov && o.at != SIZE_MAX)
        it->sentence = sentence_at(st, o.at); /* where the quote is, else the best cosine's */
    return 0;
}

/* Every item the index knows has its text scored (or is gone): record the outcome. */
static void provenance_finish(req *r, fb_state *st)
{
    bool any = false;
    for (size_t i = 0; i < st->n; i++) {
        fb_item *it = &st->items[i];
        if (st->record[i] && !it->has_overlap && decide(r, st, it, NULL, 0) < 0) {
            req_fail(r, RPC_INTERNAL, "out of memory");
            return;
        }
        any |= st->record[i];
    }
    if (!any) {
        feedback_reply(r, st); /* nothing the index knows: nothing to record */
        return;
    }
    feedback_submit(r, st, st->record);
}

/* The texts the row cache did not have (a memory deleted meanwhile has none: its cosine
 * alone decides, and the feedback reports it unknown). The rows go into the cache too. */
static void provenance_rows(req *r, const db_result *res)
{
    fb_state *st = req_state(r);
    if (res->status != DB_OK) {
        req_fail_db(r, res);
        return;
    }
    const PGresult *pr = res->res[0];
    rowcache *rc = req_server(r)->rows;
    int64_t tid = req_auth(r)->tenant_id;
    for (int row = 0; row < PQntuples(pr); row++) {
        memrow m;
        uint64_t p;
        if (memrow_parse(pr, row, 0, &m) != 0) {
            req_fail(r, RPC_INTERNAL, "malformed memory row");
            return;
        }
        rc_put(rc, tid, &m);
        if (!idmap_get(st->pos, m.id, &p) || !st->record[p] || st->items[p].has_overlap)
            continue;
        /* m.content points into pr, which lives until this callback returns */
        if (decide(r, st, &st->items[p], m.content, m.content_len) < 0) {
            req_fail(r, RPC_INTERNAL, "out of memory");
            return;
        }
    }
    provenance_finish(r, st);
}

static void *req_arena_alloc(void *ctx, size_t n)
{
    return req_alloc(ctx, n);
}

/* The cosines are known: score the texts, from the row cache at the version the index knows
 * or from PostgreSQL. */
static void provenance_texts(req *r, fb_state *st)
{
    rowcache *rc = req_server(r)->rows;
    int64_t tid = req_auth(r)->tenant_id;
    uint64_t *miss = req_alloc(r, (st->n + 1) * sizeof(*miss));
    if (!miss || prov_text_create(st->response, st->rlen, &st->text) < 0) {
        req_fail(r, RPC_INTERNAL, "out of memory");
        return;
    }
    size_t nmiss = 0;
    for (size_t i = 0; i < st->n; i++) {
        fb_item *it = &st->items[i];
        memrow m;
        if (!st->record[i])
            continue;
        if (!rc_get(rc, tid, it->id, it->seq, &m, req_arena_alloc, r)) {
            miss[nmiss++] = it->id;
            continue;
        }
        if (decide(r, st, it, m.content, m.content_len) < 0) {
            req_fail(r, RPC_INTERNAL, "out of memory");
            return;
        }
    }
    if (nmiss == 0) {
        provenance_finish(r, st);
        return;
    }
    char *arr = mp_ids_literal(r, miss, nmiss);
    const char *tid_param = mp_tenant_param(r);
    if (!arr || !tid_param) {
        req_fail(r, RPC_INTERNAL, "out of memory");
        return;
    }
    const char *vals[] = {tid_param, arr};
    db_query q = {.stmt = sql_def(SQL_MEMORY_GET), DB_VALUES(vals)};
    req_submit_read(r, &q, 1, provenance_rows);
}

/* The index is loaded: the best cosine of every injected memory over the sentences, then
 * the texts. */
static void provenance_score(req *r)
{
    fb_state *st = req_state(r);
    vindex *vi = tenants_vindex(st->t);
    size_t dim = req_auth(r)->dim;
    float *v = req_alloc(r, dim * sizeof(float));
    double *snorm = req_alloc(r, (st->nsent + 1) * sizeof(double));
    st->record = req_alloc(r, st->n + 1);
    if (!v || !snorm || !st->record) {
        req_fail(r, RPC_INTERNAL, "out of memory");
        return;
    }
    for (size_t k = 0; k < st->nsent; k++) {
        double q = 0;
        for (size_t d = 0; d < dim; d++)
            q += (double)st->outs[k][d] * st->outs[k][d];
        snorm[k] = sqrt(q);
    }
    for (size_t i = 0; i < st->n; i++) {
        fb_item *it = &st->items[i];
        mem_meta meta;
        st->record[i] = false;
        if (vindex_get_vector(vi, it->id, v) != 0 || vindex_get_meta(vi, it->id, &meta) != 0)
            continue; /* not in the index: reported unknown, not recorded */
        it->seq = meta.seq;
        double vn = 0;
        for (size_t d = 0; d < dim; d++)
            vn += (double)v[d] * v[d];
        vn = sqrt(vn);
        double best = -2;
        for (size_t k = 0; k < st->nsent; k++) {
            if (vn == 0 || snorm[k] == 0)
                continue;
            double dot = 0;
            for (size_t d = 0; d < dim; d++)
                dot += (double)v[d] * st->outs[k][d];
            double cos = dot / (vn * snorm[k]);
            if (cos > best) {
                best = cos;
                it->sentence = (int)k;
            }
        }
        it->has_sim = it->sentence >= 0;
        it->similarity = it->has_sim ? (float)best : 0.0f;
        st->record[i] = true;
    }
    provenance_texts(r, st);
}

static void provenance_index_ready(void *arg, int status, const char *err)
{
    req *r = arg;
    if (status != 0) {
        req_fail(r, RPC_UNAVAILABLE, "%s", err ? err : "index unavailable");
        return;
    }
    provenance_score(r);
}

/* The sentences are embedded: wait for the tenant's index (the memories' vectors). */
static void provenance_embedded(req *r, rpc_code code, const char *message)
{
    fb_state *st = req_state(r);
    if (code != RPC_OK) {
        req_fail(r, code, "%s", message ? message : "embedding failed");
        return;
    }
    const conn_auth *a = req_auth(r);
    st->t = tenants_get(req_server(r)->tenants, a->tenant_id, a->dim);
    if (!st->t) {
        req_fail(r, RPC_INTERNAL, "out of memory");
        return;
    }
    if (!tenants_dim_is(st->t, a->dim)) {
        tenants_put(st->t);
        st->t = NULL;
        req_fail(r, RPC_UNAVAILABLE, "%s", MODEL_CHANGED);
        return;
    }
    int rc = tenants_when_ready(st->t, worker_poster(req_worker(r)), provenance_index_ready, r);
    if (rc == 1)
        provenance_score(r);
    else if (rc < 0)
        req_fail(r, RPC_INTERNAL, "out of memory");
}

static void provenance_admitted(req *r)
{
    fb_state *st = req_state(r);
    const char **whats = req_alloc(r, st->nsent * sizeof(*whats));
    if (!whats) {
        req_fail(r, RPC_INTERNAL, "out of memory");
        return;
    }
    for (size_t k = 0; k < st->nsent; k++)
        whats[k] = "response sentence";
    re_embed(r, st->sent, st->sent_len, st->outs, whats, st->nsent, provenance_embedded);
}

void h_memory_provenance(req *r)
{
    const msgpack_object *response = req_arg(r, P_PV_RESPONSE);
    const msgpack_object *injected = req_arg(r, P_PV_INJECTED);
    fb_state *st = state_new(r, injected->via.array.size);
    if (!st)
        return;
    st->provenance = true;
    size_t dim = req_auth(r)->dim;
    st->response = req_strdup(r, response);
    st->sent = req_alloc(r, PROVENANCE_MAX_SENTENCES * sizeof(*st->sent));
    st->sent_len = req_alloc(r, PROVENANCE_MAX_SENTENCES * sizeof(*st->sent_len));
    if (!st->response || !st->sent || !st->sent_len || add_ids(r, st, injected, false) < 0) {
        req_fail(r, RPC_INTERNAL, "out of memory");
        return;
    }
    size_t rlen = st->rlen = response->via.str.size;
    size_t n = prov_sentences(st->response, rlen, st->sent, st->sent_len, PROVENANCE_MAX_SENTENCES);
    if (n == 0) {
        req_fail(r, RPC_INVALID_ARGUMENT, "parameter 'response' holds no sentence");
        return;
    }
    if (n > PROVENANCE_MAX_SENTENCES) {
        req_fail(r, RPC_INVALID_ARGUMENT,
                 "parameter 'response' has %zu sentences; at most %d are scored per call", n,
                 PROVENANCE_MAX_SENTENCES);
        return;
    }
    st->nsent = n;
    st->vecs = req_alloc(r, n * dim * sizeof(float));
    st->outs = req_alloc(r, n * sizeof(*st->outs));
    if (!st->vecs || !st->outs) {
        req_fail(r, RPC_INTERNAL, "out of memory");
        return;
    }
    for (size_t k = 0; k < n; k++)
        st->outs[k] = st->vecs + k * dim;
    /* valid: embedding the response counts against the daily query limit, as a search */
    app_admit_query(r, provenance_admitted);
}
