/* bench/workload.c: request generation and answer checks for engram-bench (see
 * workload.h). */
#include "workload.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CONTEXT_BUDGET 4000 /* tokens: room for ten of the data set's short memories */

static const char *const op_names[WL_NOPS] = {"search",      "search_text", "context", "store",
                                              "store_batch", "ping",        "load"};
static const char *const mem_types[] = {"fact", "preference", "episode", "strategy_outcome",
                                        "constraint"};

/* One prepared store_batch argument map. */
typedef struct batch {
    char *data;
    size_t len, count;
} batch;

typedef struct tenant_state {
    uint64_t next_new; /* index of the next memory a store op creates */
    batch *batches;    /* load batches, handed out in order */
    size_t nbatches, next_batch;
    uint64_t *ids; /* kept ids of stored memories */
    size_t nids, cap;
    float *pool; /* pre-generated vectors of new memories pool_first .. + npool - 1 */
    uint64_t pool_first;
    size_t npool;
} tenant_state;

struct workload {
    workload_conf c;
    tenant_state *ts;
    workload_opstats st[WL_NOPS];
    double cum[WL_NOPS]; /* cumulative mix weights */
    uint64_t *rng;       /* one generator per connection */
    size_t nconns;
    float *vec; /* dim scratch floats */
};

const char *workload_op_name(int op)
{
    return op >= 0 && op < WL_NOPS ? op_names[op] : "?";
}

int workload_op_parse(const char *s, size_t n)
{
    for (int op = 0; op < WL_NOPS; op++)
        if (strlen(op_names[op]) == n && memcmp(op_names[op], s, n) == 0)
            return op;
    return -1;
}

workload *workload_create(const workload_conf *conf)
{
    workload *w = calloc(1, sizeof(*w));
    if (!w)
        return NULL;
    w->c = *conf;
    w->ts = calloc(conf->ntenants ? conf->ntenants : 1, sizeof(*w->ts));
    w->vec = malloc(dataset_dim(conf->ds) * sizeof(float));
    if (!w->ts || !w->vec) {
        workload_destroy(w);
        return NULL;
    }
    for (size_t i = 0; i < conf->ntenants; i++)
        w->ts[i].next_new = conf->memories;
    double acc = 0;
    for (int op = 0; op < WL_NOPS; op++) {
        if (op != WL_LOAD && conf->mix[op] > 0)
            acc += conf->mix[op];
        w->cum[op] = acc;
    }
    return w;
}

void workload_destroy(workload *w)
{
    if (!w)
        return;
    if (w->ts) {
        for (size_t i = 0; i < w->c.ntenants; i++) {
            tenant_state *t = &w->ts[i];
            for (size_t b = 0; b < t->nbatches; b++)
                free(t->batches[b].data);
            free(t->batches);
            free(t->ids);
            free(t->pool);
        }
    }
    free(w->ts);
    free(w->rng);
    free(w->vec);
    free(w);
}

/* ---- packing --------------------------------------------------------------------------- */

typedef struct growbuf {
    char *data;
    size_t len, cap;
    bool failed;
} growbuf;

static int gb_write(void *data, const char *buf, size_t len)
{
    growbuf *b = data;
    if (b->failed)
        return -1;
    if (b->len + len > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->len + len)
            cap *= 2;
        char *p = realloc(b->data, cap);
        if (!p) {
            b->failed = true;
            return -1;
        }
        b->data = p;
        b->cap = cap;
    }
    memcpy(b->data + b->len, buf, len);
    b->len += len;
    return 0;
}

/* Packs one memory {content, type, importance, embedding}. */
static void pack_memory(const workload *w, msgpack_packer *pk, uint64_t t, uint64_t i,
                        const float *vec)
{
    char content[DATASET_CONTENT_MAX];
    size_t n = dataset_content(w->c.ds, t, i, content);
    msgpack_pack_map(pk, 4);
    rpc_pack_cstr(pk, "content");
    rpc_pack_strn(pk, content, n);
    rpc_pack_kv_str(pk, "type", mem_types[i % (sizeof(mem_types) / sizeof(mem_types[0]))]);
    rpc_pack_kv_num(pk, "importance", (double)(i % 97) / 96.0);
    rpc_pack_cstr(pk, "embedding");
    rpc_pack_vector(pk, vec, dataset_dim(w->c.ds));
}

int workload_prepare_load(workload *w, size_t i, uint64_t first, size_t n, const float *vectors)
{
    if (i >= w->c.ntenants || w->c.batch == 0)
        return -EINVAL;
    tenant_state *t = &w->ts[i];
    size_t dim = dataset_dim(w->c.ds);
    size_t nb = (n + w->c.batch - 1) / w->c.batch;
    batch *bs = calloc(nb ? nb : 1, sizeof(*bs));
    if (!bs)
        return -ENOMEM;
    for (size_t b = 0; b < nb; b++) {
        size_t lo = b * w->c.batch, cnt = n - lo < w->c.batch ? n - lo : w->c.batch;
        growbuf gb = {0};
        msgpack_packer pk;
        msgpack_packer_init(&pk, &gb, gb_write);
        msgpack_pack_map(&pk, 1);
        rpc_pack_cstr(&pk, "memories");
        msgpack_pack_array(&pk, cnt);
        for (size_t r = 0; r < cnt; r++)
            pack_memory(w, &pk, w->c.tenant_ids[i], first + lo + r, vectors + (lo + r) * dim);
        if (gb.failed) {
            free(gb.data);
            for (size_t k = 0; k < b; k++)
                free(bs[k].data);
            free(bs);
            return -ENOMEM;
        }
        bs[b] = (batch){gb.data, gb.len, cnt};
    }
    for (size_t b = 0; b < t->nbatches; b++)
        free(t->batches[b].data);
    free(t->batches);
    t->batches = bs;
    t->nbatches = nb;
    t->next_batch = 0;
    return 0;
}

int workload_prepare_new(workload *w, size_t per_tenant)
{
    size_t dim = dataset_dim(w->c.ds);
    for (size_t i = 0; i < w->c.ntenants; i++) {
        tenant_state *t = &w->ts[i];
        free(t->pool);
        t->pool = NULL;
        t->npool = 0;
        if (per_tenant == 0)
            continue;
        t->pool = malloc(per_tenant * dim * sizeof(float));
        if (!t->pool)
            return -ENOMEM;
        int rc = dataset_vectors(w->c.ds, w->c.tenant_ids[i], t->next_new, per_tenant, t->pool);
        if (rc != 0)
            return rc;
        t->pool_first = t->next_new;
        t->npool = per_tenant;
    }
    return 0;
}

/* The vector of new memory index of tenant slot i: from the pool when it has one, past its
 * end again from its start (generating vectors during the run took the client 0.4 cores
 * under store_batch, cores the server competes for on a 2-core machine; a write costs the
 * same whatever its vector). */
static const float *new_vector(workload *w, size_t i, uint64_t index)
{
    tenant_state *t = &w->ts[i];
    size_t dim = dataset_dim(w->c.ds);
    if (t->pool && t->npool > 0 && index >= t->pool_first)
        return t->pool + ((index - t->pool_first) % t->npool) * dim;
    if (dataset_vectors(w->c.ds, w->c.tenant_ids[i], index, 1, w->vec) != 0)
        return NULL;
    return w->vec;
}

int workload_reset_stats(workload *w, size_t conns, uint64_t run)
{
    memset(w->st, 0, sizeof(w->st));
    uint64_t *r = realloc(w->rng, (conns ? conns : 1) * sizeof(*r));
    if (!r)
        return -ENOMEM;
    w->rng = r;
    w->nconns = conns;
    for (size_t c = 0; c < conns; c++)
        w->rng[c] = dataset_seed_mix(w->c.seed ^ 0x62656e63ULL, run, c);
    return 0;
}

const workload_opstats *workload_stats(const workload *w, int op)
{
    return &w->st[op];
}

const uint64_t *workload_kept_ids(const workload *w, size_t i, size_t *n)
{
    *n = w->ts[i].nids;
    return w->ts[i].ids;
}

void workload_clear_kept_ids(workload *w)
{
    for (size_t i = 0; i < w->c.ntenants; i++)
        w->ts[i].nids = 0;
}

/* ---- next ------------------------------------------------------------------------------ */

static int pick_op(workload *w, uint64_t *rng)
{
    double total = w->cum[WL_NOPS - 1];
    double u = dataset_rng_uniform(rng) * total;
    for (int op = 0; op < WL_NOPS; op++)
        if (op != WL_LOAD && w->c.mix[op] > 0 && u < w->cum[op])
            return op;
    for (int op = WL_NOPS - 1; op >= 0; op--)
        if (op != WL_LOAD && w->c.mix[op] > 0)
            return op;
    return -1;
}

static void pack_raw(msgpack_packer *pk, const char *data, size_t len)
{
    pk->callback(pk->data, data, len);
}

int workload_next(void *ud, size_t conn, uint32_t msgid, msgpack_packer *pk, loadgen_req *req)
{
    workload *w = ud;
    size_t slot = conn % w->c.ntenants;
    tenant_state *t = &w->ts[slot];
    uint64_t tn = w->c.tenant_ids[slot];
    size_t dim = dataset_dim(w->c.ds);
    if (t->nbatches) {
        if (t->next_batch >= t->nbatches)
            return 0;
        batch *b = &t->batches[t->next_batch];
        rpc_pack_request_begin(pk, msgid, "memory.store_batch", true);
        pack_raw(pk, b->data, b->len);
        req->op = WL_LOAD;
        req->tag = (uint64_t)t->next_batch++;
        return 1;
    }
    if (conn >= w->nconns)
        return -EINVAL;
    uint64_t *rng = &w->rng[conn];
    int op = pick_op(w, rng);
    if (op < 0)
        return 0;
    req->op = op;
    req->tag = 0;
    switch (op) {
    case WL_SEARCH:
    case WL_CONTEXT: {
        if (!w->c.queries || w->c.nq == 0)
            return -EINVAL;
        uint64_t q = dataset_rng_next(rng) % w->c.nq;
        req->tag = q;
        const float *qv = w->c.queries + (slot * w->c.nq + q) * dim;
        bool ctx = op == WL_CONTEXT;
        rpc_pack_request_begin(pk, msgid, ctx ? "memory.context" : "memory.search", true);
        msgpack_pack_map(pk, 4);
        rpc_pack_cstr(pk, "embedding");
        rpc_pack_vector(pk, qv, dim);
        rpc_pack_kv_uint(pk, "top_k", w->c.top_k);
        rpc_pack_kv_num(pk, "similarity_weight", 1.0);
        if (ctx)
            rpc_pack_kv_uint(pk, "budget_tokens", CONTEXT_BUDGET);
        else
            rpc_pack_kv_str(pk, "mode", "vector");
        return 1;
    }
    case WL_SEARCH_TEXT: {
        char q[64];
        size_t n = dataset_text_query(w->c.ds, rng, q);
        rpc_pack_request_begin(pk, msgid, "memory.search", true);
        msgpack_pack_map(pk, 3);
        rpc_pack_cstr(pk, "query");
        rpc_pack_strn(pk, q, n);
        rpc_pack_kv_uint(pk, "top_k", w->c.top_k);
        rpc_pack_kv_str(pk, "mode", "text");
        return 1;
    }
    case WL_STORE: {
        uint64_t i = t->next_new++;
        const float *v = new_vector(w, slot, i);
        if (!v)
            return -ENOMEM;
        rpc_pack_request_begin(pk, msgid, "memory.store", true);
        pack_memory(w, pk, tn, i, v);
        return 1;
    }
    case WL_STORE_BATCH: {
        rpc_pack_request_begin(pk, msgid, "memory.store_batch", true);
        msgpack_pack_map(pk, 1);
        rpc_pack_cstr(pk, "memories");
        msgpack_pack_array(pk, w->c.batch);
        for (size_t r = 0; r < w->c.batch; r++) {
            uint64_t i = t->next_new++;
            const float *v = new_vector(w, slot, i);
            if (!v)
                return -ENOMEM;
            pack_memory(w, pk, tn, i, v);
        }
        req->tag = w->c.batch;
        return 1;
    }
    case WL_PING:
        rpc_pack_request_begin(pk, msgid, "ping", false);
        return 1;
    default:
        return -EINVAL;
    }
}

/* ---- done ------------------------------------------------------------------------------ */

static int keep_id(tenant_state *t, uint64_t id)
{
    if (t->nids == t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 1024;
        uint64_t *p = realloc(t->ids, cap * sizeof(*p));
        if (!p)
            return -ENOMEM;
        t->ids = p;
        t->cap = cap;
    }
    t->ids[t->nids++] = id;
    return 0;
}

/* Whether memory index (of tenant slot) is a hit for query q: in the true top k, or at
 * least as similar as the k-th (a tie, or a memory stored since the truth was computed). */
static bool is_hit(workload *w, size_t slot, uint64_t q, uint64_t index)
{
    const dataset_truth *tr = &w->c.truth[slot];
    size_t k = tr->k;
    const uint32_t *ids = tr->idx + q * k;
    for (size_t j = 0; j < k; j++)
        if (ids[j] == index)
            return true;
    size_t dim = dataset_dim(w->c.ds);
    const float *v = index >= w->c.memories ? new_vector(w, slot, index) : NULL;
    if (index < w->c.memories) {
        if (dataset_vectors(w->c.ds, w->c.tenant_ids[slot], index, 1, w->vec) != 0)
            return false;
        v = w->vec;
    }
    if (!v)
        return false;
    const float *qv = w->c.queries + (slot * w->c.nq + q) * dim;
    return dataset_dot(qv, v, dim) >= tr->sim[q * k + k - 1] - WORKLOAD_TIE_EPS;
}

/* Records the recall of one answer whose memory indexes are idx[0..n). */
static void score_answer(workload *w, int op, size_t slot, uint64_t q, const uint64_t *idx,
                         size_t n)
{
    workload_opstats *st = &w->st[op];
    st->answers++;
    st->results += n;
    if (!w->c.truth)
        return;
    size_t k = w->c.top_k;
    size_t hits = 0;
    for (size_t j = 0; j < n && j < k; j++) {
        bool dup = false;
        for (size_t p = 0; p < j; p++)
            dup |= idx[p] == idx[j];
        if (!dup && is_hit(w, slot, q, idx[j]))
            hits++;
    }
    st->recall_hits += hits;
    st->recall_slots += k;
}

/* A search answer: {results: [memory...]}; each content names its memory by "#<i>". */
static int done_search(workload *w, int op, size_t slot, uint64_t q, const msgpack_object *res,
                       bool measured)
{
    const msgpack_object *arr = rpc_map_get(res, "results");
    if (!arr || arr->type != MSGPACK_OBJECT_ARRAY)
        return 1;
    uint64_t idx[1024];
    size_t n = 0;
    for (uint32_t j = 0; j < arr->via.array.size; j++) {
        const msgpack_object *content = rpc_map_get(&arr->via.array.ptr[j], "content");
        uint64_t i;
        if (!content || content->type != MSGPACK_OBJECT_STR ||
            !dataset_parse_index(content->via.str.ptr, content->via.str.size, &i))
            return 1;
        if (n < sizeof(idx) / sizeof(idx[0]))
            idx[n++] = i;
    }
    if (arr->via.array.size > w->c.top_k)
        return 1;
    if (!measured)
        return 0;
    if (op == WL_SEARCH_TEXT) {
        w->st[op].answers++;
        w->st[op].results += n;
        return 0;
    }
    score_answer(w, op, slot, q, idx, n);
    return 0;
}

/* A context answer: {text, ids, tokens_used}; the entries' contents are in the text, in
 * rank order. */
static int done_context(workload *w, size_t slot, uint64_t q, const msgpack_object *res,
                        bool measured)
{
    const msgpack_object *text = rpc_map_get(res, "text");
    const msgpack_object *ids = rpc_map_get(res, "ids");
    if (!text || text->type != MSGPACK_OBJECT_STR || !ids || ids->type != MSGPACK_OBJECT_ARRAY)
        return 1;
    uint64_t idx[1024];
    size_t n = 0, off = 0;
    const char *s = text->via.str.ptr;
    size_t len = text->via.str.size;
    while (off < len && n < sizeof(idx) / sizeof(idx[0])) {
        uint64_t i;
        size_t used = dataset_parse_index(s + off, len - off, &i);
        if (!used)
            break;
        idx[n++] = i;
        off += used;
    }
    if (n != ids->via.array.size)
        return 1;
    if (measured)
        score_answer(w, WL_CONTEXT, slot, q, idx, n);
    return 0;
}

int workload_done(void *ud, size_t conn, const loadgen_req *req, const rpc_response *resp,
                  bool measured)
{
    workload *w = ud;
    size_t slot = conn % w->c.ntenants;
    tenant_state *t = &w->ts[slot];
    if (resp->error || !resp->result)
        return 0;
    const msgpack_object *res = resp->result;
    if (req->op == WL_PING) {
        if (!rpc_str_eq(res, "pong"))
            return 1;
        if (measured)
            w->st[WL_PING].answers++;
        return 0;
    }
    if (res->type != MSGPACK_OBJECT_MAP)
        return 1;
    switch (req->op) {
    case WL_SEARCH:
    case WL_SEARCH_TEXT:
        return done_search(w, req->op, slot, req->tag, res, measured);
    case WL_CONTEXT:
        return done_context(w, slot, req->tag, res, measured);
    case WL_STORE: {
        const msgpack_object *id = rpc_map_get(res, "id");
        if (!id || id->type != MSGPACK_OBJECT_POSITIVE_INTEGER)
            return 1;
        if (w->c.keep_ids && keep_id(t, id->via.u64) != 0)
            return 1;
        if (measured) {
            w->st[WL_STORE].answers++;
            w->st[WL_STORE].memories++;
        }
        return 0;
    }
    case WL_STORE_BATCH:
    case WL_LOAD: {
        const msgpack_object *ids = rpc_map_get(res, "ids");
        size_t want = req->op == WL_LOAD ? t->batches[req->tag].count : (size_t)req->tag;
        if (!ids || ids->type != MSGPACK_OBJECT_ARRAY || ids->via.array.size != want)
            return 1;
        for (uint32_t j = 0; w->c.keep_ids && req->op == WL_STORE_BATCH && j < want; j++) {
            const msgpack_object *id = &ids->via.array.ptr[j];
            if (id->type != MSGPACK_OBJECT_POSITIVE_INTEGER || keep_id(t, id->via.u64) != 0)
                return 1;
        }
        if (measured) {
            w->st[req->op].answers++;
            w->st[req->op].memories += want;
        }
        return 0;
    }
    default:
        return 1;
    }
}
