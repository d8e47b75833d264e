/* server/domain/extract.c: memory extraction from a session's transcript (extract.h). */
#include "extract.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <msgpack.h>

#include "chat.h"
#include "embedder.h"
#include "json.h"
#include "log.h"
#include "mcall.h"
#include "memmeta.h"
#include "memrow.h"
#include "metrics.h"
#include "pgsync.h"
#include "prompts.h"
#include "rpc.h"
#include "sql_bg.h"
#include "tenants.h"
#include "ubuf.h"

#define ENTRY_SHOWN_MAX 8000 /* bytes of one message shown to the model */
#define NB_MAX 50            /* extract_neighbours' maximum */
#define READY_WAIT_S 60      /* longest wait for the tenant's index to load */

enum { CAT_PREFERENCE, CAT_PROJECT, CAT_PATTERN, CAT_DECISION, CAT_CONSTRAINT, CAT__COUNT };
static const char *const cat_names[CAT__COUNT] = {"preference", "project", "pattern", "decision",
                                                  "constraint"};
/* the memory type of each category */
static const char *const cat_types[CAT__COUNT] = {"preference", "fact", "fact", "fact",
                                                  "constraint"};

enum { ACT_ADD, ACT_UPDATE, ACT_NONE };

/* One fact of the model's answer, and what becomes of it. */
typedef struct fact {
    int cat;
    char *text;
    double confidence;
    int64_t *eids;
    size_t neids;
    float *vec;
    /* its neighbours: the closest live memories, most similar first */
    int64_t nb_id[NB_MAX], nb_seq[NB_MAX];
    char *nb_text[NB_MAX];
    float nb_sim[NB_MAX];
    int nnb;
    int action;
    int target; /* ACT_UPDATE / ACT_NONE: the neighbour's index */
    char *why;
} fact;

/* One run. */
typedef struct xrun {
    server *s;
    bg_ctx *ctx;
    const config *cfg;
    PGconn *pg;
    int64_t tenant, session, through_entry;
    uint32_t dim;
    const char *trigger;
    char tid[24], sid[24], holder[96];
    extract_result *out;
    mcall m;
    bool claimed;
    /* the claim's answer: the transcript (entries point into it) */
    msgpack_sbuffer sb;
    msgpack_unpacked up;
    const msgpack_object *entries;
    int64_t agent, last_seq;
    char provider[64];
    char gen[24]; /* the tenant's embedding generation at the claim ("" when not known) */
    fact *f;
    size_t nf;
    char fail_status[32]; /* the reason recorded on the session when the run changes nothing */
} xrun;

/* ---- schemas, made once ------------------------------------------------------------------- */

static pthread_once_t schema_once = PTHREAD_ONCE_INIT;
static llm_schema *facts_schema, *decide_schema;
static char schema_err[200];

static void schema_make(void)
{
    const char *names[2] = {"extract_schema.json", "extract_decide_schema.json"};
    llm_schema **outs[2] = {&facts_schema, &decide_schema};
    for (int i = 0; i < 2; i++) {
        size_t len;
        const char *json = prompts_get(names[i], &len);
        if (!json)
            snprintf(schema_err, sizeof(schema_err), "%s is not embedded", names[i]);
        else if (llm_schema_create(json, len, outs[i], schema_err, sizeof(schema_err)) != 0)
            *outs[i] = NULL;
    }
}

/* ---- small helpers -------------------------------------------------------------------------- */

static void fail(xrun *x, int status, const char *why, const char *fmt, const char *a)
{
    x->out->status = status;
    snprintf(x->out->error, sizeof(x->out->error), fmt, a);
    if (why)
        snprintf(x->fail_status, sizeof(x->fail_status), "%s", why);
}

static bool as_i64(const msgpack_object *o, int64_t *v)
{
    if (o && o->type == MSGPACK_OBJECT_POSITIVE_INTEGER && o->via.u64 <= INT64_MAX) {
        *v = (int64_t)o->via.u64;
        return true;
    }
    if (o && o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER) {
        *v = o->via.i64;
        return true;
    }
    return false;
}

static bool str_is(const msgpack_object *o, const char *s)
{
    size_t n = strlen(s);
    return o && o->type == MSGPACK_OBJECT_STR && o->via.str.size == n &&
           memcmp(o->via.str.ptr, s, n) == 0;
}

/* Runs statement st with values in a transaction of the tenant's. Returns the result or NULL
 * with err. */
static PGresult *tx_exec(xrun *x, sqlb_stmt st, const char *const *v, size_t n, pgsync_tx_mode mode,
                         char *err, size_t errlen)
{
    return pgsync_tenant_exec(x->pg, x->tenant, mode, sqlb_def(st), v, n, err, errlen);
}

static void facts_free(xrun *x)
{
    for (size_t i = 0; i < x->nf; i++) {
        fact *f = &x->f[i];
        free(f->text);
        free(f->eids);
        free(f->vec);
        free(f->why);
        for (int k = 0; k < f->nnb; k++)
            free(f->nb_text[k]);
    }
    free(x->f);
    x->f = NULL;
    x->nf = 0;
}

/* ---- 1. the claim and the transcript ----------------------------------------------------------
 */

static int claim(xrun *x)
{
    char err[300], through[24], stale[16], maxe[16], maxb[24];
    snprintf(through, sizeof(through), "%lld", (long long)x->through_entry);
    snprintf(stale, sizeof(stale), "%d", x->cfg->extract_stale_s);
    snprintf(maxe, sizeof(maxe), "%d", x->cfg->extract_max_entries);
    snprintf(maxb, sizeof(maxb), "%ld", x->cfg->extract_max_bytes);
    const char *v[] = {x->tid, x->sid, x->through_entry ? through : NULL, x->holder, stale,
                       maxe,   maxb};
    PGresult *res = tx_exec(x, SQLB_EXTRACT_BEGIN, v, 7, PGSYNC_TX_WRITE, err, sizeof(err));
    if (!res) {
        fail(x, EXTRACT_FAILED, NULL, "claiming the session: %s", err);
        return -EIO;
    }
    msgpack_sbuffer_init(&x->sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &x->sb, msgpack_sbuffer_write);
    const char *json = PQgetvalue(res, 0, 0);
    int rc = json_to_msgpack(json, strlen(json), 16, &pk, err, sizeof(err));
    PQclear(res);
    size_t off = 0;
    if (rc != 0 ||
        msgpack_unpack_next(&x->up, x->sb.data, x->sb.size, &off) != MSGPACK_UNPACK_SUCCESS) {
        fail(x, EXTRACT_FAILED, NULL, "the claim's answer: %s", "not JSON");
        return -EIO;
    }
    const msgpack_object *o = &x->up.data, *e = rpc_map_get(o, "error");
    if (e) {
        const msgpack_object *msg = rpc_map_get(o, "message");
        char m[300] = "";
        if (msg && msg->type == MSGPACK_OBJECT_STR)
            snprintf(m, sizeof(m), "%.*s", (int)msg->via.str.size, msg->via.str.ptr);
        fail(x, str_is(e, "busy") ? EXTRACT_BUSY : EXTRACT_NOT_FOUND, NULL, "%s", m);
        return 1;
    }
    x->claimed = true;
    const msgpack_object *p = rpc_map_get(o, "embed_provider");
    snprintf(x->provider, sizeof(x->provider), "%.*s",
             p && p->type == MSGPACK_OBJECT_STR ? (int)p->via.str.size : 0,
             p && p->type == MSGPACK_OBJECT_STR ? p->via.str.ptr : "");
    int64_t gen;
    if (as_i64(rpc_map_get(o, "embed_gen"), &gen))
        snprintf(x->gen, sizeof(x->gen), "%lld", (long long)gen);
    x->entries = rpc_map_get(o, "entries");
    if (!as_i64(rpc_map_get(o, "agent_id"), &x->agent) ||
        !as_i64(rpc_map_get(o, "last_seq"), &x->last_seq) || !x->entries ||
        x->entries->type != MSGPACK_OBJECT_ARRAY) {
        fail(x, EXTRACT_FAILED, NULL, "the claim's answer: %s", "fields missing");
        return -EIO;
    }
    x->out->more = rpc_get_bool(rpc_map_get(o, "more"), false);
    x->out->entries = (int)x->entries->via.array.size;
    return 0;
}

/* ---- 2. the facts -------------------------------------------------------------------------------
 */

/* The user message of the facts call: the transcript as JSON lines. */
static int facts_prompt(xrun *x, ubuf *out)
{
    ubuf lines = {0};
    int rc = 0;
    for (uint32_t i = 0; i < x->entries->via.array.size && rc == 0; i++) {
        const msgpack_object *e = &x->entries->via.array.ptr[i];
        const msgpack_object *c = rpc_map_get(e, "content"), *r = rpc_map_get(e, "role");
        int64_t id = 0, at = 0;
        as_i64(rpc_map_get(e, "id"), &id);
        as_i64(rpc_map_get(e, "created_at"), &at);
        const char *text = c && c->type == MSGPACK_OBJECT_STR ? c->via.str.ptr : "";
        size_t len = c && c->type == MSGPACK_OBJECT_STR ? c->via.str.size : 0;
        char created[32];
        prompts_utc(at, false, created, sizeof(created));
        rc = ubuf_printf(&lines, "%s{\"id\": %lld, \"role\": \"%s\", \"created\": \"%s\", ",
                         i ? "\n" : "", (long long)id, str_is(r, "user") ? "user" : "assistant",
                         created);
        rc = rc < 0 ? rc : ubuf_puts(&lines, "\"content\": ");
        rc = rc < 0 ? rc
                    : prompts_json_str(&lines, text, prompts_utf8_cut(text, len, ENTRY_SHOWN_MAX));
        rc = rc < 0 ? rc : ubuf_putc(&lines, '}');
    }
    char today[16], count[16], sess[24];
    prompts_utc(server_now_ms(), true, today, sizeof(today));
    snprintf(count, sizeof(count), "%u", x->entries->via.array.size);
    snprintf(sess, sizeof(sess), "%lld", (long long)x->session);
    const char *keys[] = {"today", "count", "session", "entries"};
    const char *vals[] = {today, count, sess, lines.data ? lines.data : ""};
    if (rc == 0)
        rc = prompts_render("extract_user.txt", keys, vals, 4, out);
    ubuf_fini(&lines);
    return rc;
}

/* Makes one structured call. Returns 0 with res filled and LLM_OK, or 1 with the run failed
 * (the reason set: the model is not to be used or the call failed), or -ENOMEM. */
static int ask(xrun *x, const char *system_name, const ubuf *user, const llm_schema *schema,
               const char *schema_name, llm_result *res)
{
    const char *system = prompts_get(system_name, NULL);
    llm_message msg = {LLM_USER, user->data, user->len};
    llm_request req = {.system = system,
                       .messages = &msg,
                       .n_messages = 1,
                       .schema = schema,
                       .schema_name = schema_name,
                       .has_temperature = true,
                       .temperature = 0};
    memset(res, 0, sizeof(*res));
    int rc = mcall_ask(&x->m, &req, res);
    if (rc == -EAGAIN) {
        x->out->model_status = x->m.status;
        fail(x, EXTRACT_NO_MODEL, x->m.status, "%s", x->m.reason);
        return 1;
    }
    if (rc < 0) {
        fail(x, EXTRACT_FAULT, "failed", "%s", "the model call could not be made");
        return rc == -ENOMEM ? -ENOMEM : 1;
    }
    x->out->calls = x->m.calls;
    x->out->tokens_in = x->m.tokens_in;
    x->out->tokens_out = x->m.tokens_out;
    x->out->cost_usd = x->m.cost_usd;
    if (res->status != LLM_OK) {
        x->out->model_status = llm_status_name(res->status);
        char why[400];
        snprintf(why, sizeof(why), "the model's %s answer: %s", schema_name, res->reason);
        fail(x, EXTRACT_FAULT, llm_status_name(res->status), "%s", why);
        llm_result_fini(res);
        return 1;
    }
    return 0;
}

/* True when id is one of the transcript's entries. */
static bool in_transcript(const xrun *x, int64_t id)
{
    for (uint32_t i = 0; i < x->entries->via.array.size; i++) {
        int64_t e;
        if (as_i64(rpc_map_get(&x->entries->via.array.ptr[i], "id"), &e) && e == id)
            return true;
    }
    return false;
}

/* Takes the facts of a valid answer: every fact is checked first (an entry id outside the
 * transcript rejects the answer whole). Returns 0, 1 (rejected, the run failed) or -ENOMEM. */
static int take_facts(xrun *x, const llm_result *res)
{
    msgpack_unpacked up;
    msgpack_unpacked_init(&up);
    size_t off = 0;
    const msgpack_object *fs = NULL;
    if (msgpack_unpack_next(&up, res->value, res->value_len, &off) == MSGPACK_UNPACK_SUCCESS)
        fs = rpc_map_get(&up.data, "facts");
    char why[200] = "";
    if (!fs || fs->type != MSGPACK_OBJECT_ARRAY)
        snprintf(why, sizeof(why), "the answer has no list of facts");
    for (uint32_t i = 0; fs && !why[0] && i < fs->via.array.size; i++) {
        const msgpack_object *ids = rpc_map_get(&fs->via.array.ptr[i], "entry_ids");
        for (uint32_t k = 0; ids && k < ids->via.array.size && !why[0]; k++) {
            int64_t id = 0;
            if (!as_i64(&ids->via.array.ptr[k], &id) || !in_transcript(x, id))
                snprintf(why, sizeof(why),
                         "fact %u names entry %lld, which is not in the transcript shown", i + 1,
                         (long long)id);
        }
    }
    if (why[0]) {
        x->out->model_status = "invalid";
        fail(x, EXTRACT_FAULT, "invalid", "%s", why);
        msgpack_unpacked_destroy(&up);
        return 1;
    }
    x->out->facts = (int)fs->via.array.size;
    x->f = calloc(fs->via.array.size + 1, sizeof(*x->f));
    int rc = x->f ? 0 : -ENOMEM;
    for (uint32_t i = 0; rc == 0 && i < fs->via.array.size; i++) {
        const msgpack_object *o = &fs->via.array.ptr[i];
        double conf = rpc_get_num(rpc_map_get(o, "confidence"), 0);
        if (conf < x->cfg->extract_min_confidence) {
            x->out->dropped++;
            continue;
        }
        fact *f = &x->f[x->nf];
        const msgpack_object *c = rpc_map_get(o, "category"), *t = rpc_map_get(o, "text"),
                             *ids = rpc_map_get(o, "entry_ids");
        for (f->cat = 0; f->cat < CAT__COUNT - 1 && !str_is(c, cat_names[f->cat]); f->cat++)
            ;
        f->confidence = conf;
        f->text = strndup(t->via.str.ptr, t->via.str.size);
        f->eids = malloc((ids->via.array.size + 1) * sizeof(int64_t));
        if (!f->text || !f->eids) {
            rc = -ENOMEM;
            break;
        }
        for (uint32_t k = 0; k < ids->via.array.size; k++)
            as_i64(&ids->via.array.ptr[k], &f->eids[f->neids++]);
        x->nf++;
    }
    msgpack_unpacked_destroy(&up);
    return rc;
}

/* ---- 3. embeddings and neighbours ------------------------------------------------------------ */

/* Waiting on this thread for the tenant's index to load (tenants_when_ready). The callback
 * runs on the loader's thread; if the wait gave up first, the callback drops the tenant's
 * reference and frees the wait. */
typedef struct ready_wait {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    tenant *t;
    bool done, gave_up;
    int status;
    char err[200];
} ready_wait;

static int post_inline(void *target, void (*fn)(void *arg), void *arg)
{
    (void)target;
    fn(arg);
    return 0;
}

static void on_ready(void *arg, int status, const char *err)
{
    ready_wait *w = arg;
    pthread_mutex_lock(&w->mu);
    w->done = true;
    w->status = status;
    snprintf(w->err, sizeof(w->err), "%s", err ? err : "");
    bool gave_up = w->gave_up;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
    if (gave_up) {
        tenants_put(w->t);
        pthread_mutex_destroy(&w->mu);
        pthread_cond_destroy(&w->cv);
        free(w);
    }
}

/* Returns the tenant's loaded index entry (a reference the caller drops with tenants_put),
 * or NULL with err. */
static tenant *tenant_ready(xrun *x, char *err, size_t errlen)
{
    tenant *t = tenants_get(x->s->tenants, x->tenant, x->dim);
    ready_wait *w = t ? calloc(1, sizeof(*w)) : NULL;
    if (!w) {
        if (t)
            tenants_put(t);
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    w->t = t;
    server_poster where = {post_inline, NULL};
    int rc = tenants_when_ready(t, where, on_ready, w);
    if (rc == 1 || rc < 0) {
        pthread_mutex_destroy(&w->mu);
        pthread_cond_destroy(&w->cv);
        free(w);
        if (rc == 1)
            return t;
        tenants_put(t);
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += READY_WAIT_S;
    pthread_mutex_lock(&w->mu);
    while (!w->done && pthread_cond_timedwait(&w->cv, &w->mu, &until) == 0)
        ;
    if (!w->done) {
        w->gave_up = true; /* the callback finishes: t's reference and w are its own now */
        pthread_mutex_unlock(&w->mu);
        snprintf(err, errlen, "the tenant's index did not load within %d s", READY_WAIT_S);
        return NULL;
    }
    pthread_mutex_unlock(&w->mu);
    int status = w->status;
    if (status != 0)
        snprintf(err, errlen, "the tenant's index did not load: %s", w->err);
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv);
    free(w);
    if (status != 0) {
        tenants_put(t);
        return NULL;
    }
    return t;
}

typedef struct nb_filter {
    int64_t agent;
    int64_t now_ms;
} nb_filter;

/* Live memories the session's agent sees: its own and the tenant's. */
static bool nb_keep(uint64_t id, const void *meta, void *ctx)
{
    const mem_meta *m = meta;
    const nb_filter *f = ctx;
    if (m->archived || m->expires_ms <= f->now_ms)
        return false;
    return m->scope == SCOPE_TENANT ||
           (m->scope == SCOPE_AGENT && m->agent_id == (uint64_t)f->agent);
}

/* Reads the live neighbours' seq and text; a neighbour gone since the search is dropped. */
static int read_neighbours(xrun *x, char *err, size_t errlen)
{
    ubuf ids = {0};
    int rc = ubuf_putc(&ids, '{');
    size_t n = 0;
    for (size_t i = 0; i < x->nf && rc == 0; i++)
        for (int k = 0; k < x->f[i].nnb && rc == 0; k++)
            rc = ubuf_printf(&ids, "%s%lld", n++ ? "," : "", (long long)x->f[i].nb_id[k]);
    rc = rc < 0 ? rc : ubuf_putc(&ids, '}');
    if (rc < 0 || n == 0) {
        ubuf_fini(&ids);
        return rc < 0 ? -ENOMEM : 0;
    }
    const char *v[] = {x->tid, ids.data};
    PGresult *res = tx_exec(x, SQLB_EXTRACT_MEMS, v, 2, PGSYNC_TX_READ, err, errlen);
    ubuf_fini(&ids);
    if (!res)
        return -EIO;
    int rows = PQntuples(res);
    for (size_t i = 0; i < x->nf; i++) {
        fact *f = &x->f[i];
        int w = 0;
        for (int k = 0; k < f->nnb; k++) {
            int row = -1;
            for (int r = 0; r < rows && row < 0; r++)
                if (memrow_i64(res, r, 0, 0) == f->nb_id[k])
                    row = r;
            if (row < 0)
                continue;
            f->nb_id[w] = f->nb_id[k];
            f->nb_sim[w] = f->nb_sim[k];
            f->nb_seq[w] = memrow_i64(res, row, 1, 0);
            f->nb_text[w] = strdup(PQgetvalue(res, row, 2));
            if (!f->nb_text[w]) {
                f->nnb = w;
                PQclear(res);
                return -ENOMEM;
            }
            w++;
        }
        f->nnb = w;
    }
    PQclear(res);
    return 0;
}

/* Embeds the facts and finds each one's neighbours. Returns 0, 1 (the run failed: the
 * embedder or the index) or a negative errno. */
static int neighbours(xrun *x)
{
    char err[300];
    const char **texts = calloc(x->nf + 1, sizeof(*texts)),
               **whats = calloc(x->nf + 1, sizeof(*whats));
    size_t *lens = calloc(x->nf + 1, sizeof(*lens));
    float **outs = calloc(x->nf + 1, sizeof(*outs));
    int rc = texts && whats && lens && outs ? 0 : -ENOMEM;
    for (size_t i = 0; i < x->nf && rc == 0; i++) {
        texts[i] = x->f[i].text;
        lens[i] = strlen(x->f[i].text);
        whats[i] = "fact";
        outs[i] = x->f[i].vec = malloc(x->dim * sizeof(float));
        if (!outs[i])
            rc = -ENOMEM;
    }
    if (rc == 0 && x->nf > 0) {
        int code = embedder_run_sync(x->provider, x->dim, texts, lens, outs, whats, x->nf, err,
                                     sizeof(err));
        if (code != RPC_OK) {
            fail(x, EXTRACT_FAULT, "embedder", "embedding the facts: %s", err);
            rc = 1;
        }
    }
    free(texts);
    free(whats);
    free(lens);
    free(outs);
    int k = x->cfg->extract_neighbours;
    if (rc != 0 || k == 0 || x->nf == 0)
        return rc;
    tenant *t = tenant_ready(x, err, sizeof(err));
    if (!t) {
        fail(x, EXTRACT_FAULT, "index", "%s", err);
        return 1;
    }
    vindex *vi = tenants_vindex(t);
    nb_filter nf = {x->agent, server_now_ms()};
    vindex_hit hits[NB_MAX];
    for (size_t i = 0; i < x->nf && vi; i++) {
        fact *f = &x->f[i];
        vindex_query q = {.vec = f->vec, .k = (size_t)k, .keep = nb_keep, .ctx = &nf};
        size_t n = 0;
        if (vindex_search(vi, &q, hits, &n) != 0)
            continue; /* a fact without direction has no neighbours */
        for (size_t h = 0; h < n; h++)
            if (hits[h].similarity >= (float)x->cfg->extract_floor) {
                f->nb_id[f->nnb] = (int64_t)hits[h].id;
                f->nb_sim[f->nnb++] = hits[h].similarity;
            }
    }
    tenants_put(t);
    if (read_neighbours(x, err, sizeof(err)) < 0) {
        fail(x, EXTRACT_FAILED, NULL, "reading the neighbours: %s", err);
        return -EIO;
    }
    return 0;
}

/* ---- the decisions -----------------------------------------------------------------------------
 */

static int decide_prompt(xrun *x, ubuf *out, int *asked)
{
    ubuf lines = {0};
    int rc = 0;
    *asked = 0;
    for (size_t i = 0; i < x->nf && rc == 0; i++) {
        const fact *f = &x->f[i];
        if (f->nnb == 0)
            continue;
        rc = ubuf_printf(&lines, "%s{\"fact\": %zu, \"category\": \"%s\", \"text\": ",
                         (*asked)++ ? "\n" : "", i + 1, cat_names[f->cat]);
        rc = rc < 0 ? rc : prompts_json_cstr(&lines, f->text);
        rc = rc < 0 ? rc : ubuf_puts(&lines, ", \"memories\": [");
        for (int k = 0; k < f->nnb && rc == 0; k++) {
            const char *t = f->nb_text[k];
            rc = ubuf_printf(&lines, "%s{\"id\": %lld, \"text\": ", k ? ", " : "",
                             (long long)f->nb_id[k]);
            rc = rc < 0
                     ? rc
                     : prompts_json_str(&lines, t, prompts_utf8_cut(t, strlen(t), ENTRY_SHOWN_MAX));
            rc = rc < 0 ? rc : ubuf_putc(&lines, '}');
        }
        rc = rc < 0 ? rc : ubuf_puts(&lines, "]}");
    }
    char today[16], count[16];
    prompts_utc(server_now_ms(), true, today, sizeof(today));
    snprintf(count, sizeof(count), "%d", *asked);
    const char *keys[] = {"today", "count", "facts"};
    const char *vals[] = {today, count, lines.data ? lines.data : ""};
    if (rc == 0 && *asked > 0)
        rc = prompts_render("extract_decide_user.txt", keys, vals, 3, out);
    ubuf_fini(&lines);
    return rc < 0 ? -ENOMEM : 0;
}

/* Checks one decision: its fact asked about and not decided before, its memory one of the
 * fact's neighbours for update and none. Returns the fact's index, or -1 with why. */
static long check_decision(xrun *x, const msgpack_object *d, const bool *decided, int *target,
                           char *why, size_t whylen)
{
    int64_t fi = 0, mem = 0;
    const msgpack_object *a = rpc_map_get(d, "action"), *m = rpc_map_get(d, "memory");
    if (!as_i64(rpc_map_get(d, "fact"), &fi) || fi < 1 || (size_t)fi > x->nf ||
        x->f[fi - 1].nnb == 0) {
        snprintf(why, whylen, "a decision names fact %lld, which was not asked about",
                 (long long)fi);
        return -1;
    }
    if (decided[fi - 1]) {
        snprintf(why, whylen, "fact %lld has two decisions", (long long)fi);
        return -1;
    }
    const fact *f = &x->f[fi - 1];
    *target = -1;
    if (!str_is(a, "add")) {
        if (!as_i64(m, &mem)) {
            snprintf(why, whylen, "the decision on fact %lld names no memory", (long long)fi);
            return -1;
        }
        for (int k = 0; k < f->nnb && *target < 0; k++)
            if (f->nb_id[k] == mem)
                *target = k;
        if (*target < 0) {
            snprintf(why, whylen,
                     "the decision on fact %lld names memory %lld, which is not one of its "
                     "candidates",
                     (long long)fi, (long long)mem);
            return -1;
        }
    }
    return (long)(fi - 1);
}

/* Takes the decisions: checked whole first (one bad decision rejects the answer), then
 * planned. A fact asked about and left out is added. Returns 0, 1 (rejected) or -ENOMEM. */
static int take_decisions(xrun *x, const llm_result *res)
{
    msgpack_unpacked up;
    msgpack_unpacked_init(&up);
    size_t off = 0;
    const msgpack_object *ds = NULL;
    if (msgpack_unpack_next(&up, res->value, res->value_len, &off) == MSGPACK_UNPACK_SUCCESS)
        ds = rpc_map_get(&up.data, "decisions");
    char why[300] = "";
    bool *decided = calloc(x->nf + 1, sizeof(bool));
    int *targets = calloc(x->nf + 1, sizeof(int));
    long *which = ds && ds->type == MSGPACK_OBJECT_ARRAY
                      ? calloc(ds->via.array.size + 1, sizeof(long))
                      : NULL;
    int rc = decided && targets && (which || !ds || ds->type != MSGPACK_OBJECT_ARRAY) ? 0 : -ENOMEM;
    if (rc == 0 && (!ds || ds->type != MSGPACK_OBJECT_ARRAY))
        snprintf(why, sizeof(why), "the answer has no list of decisions");
    for (uint32_t i = 0; rc == 0 && !why[0] && i < ds->via.array.size; i++) {
        int t = -1;
        which[i] = check_decision(x, &ds->via.array.ptr[i], decided, &t, why, sizeof(why));
        if (which[i] >= 0) {
            decided[which[i]] = true;
            targets[which[i]] = t;
        }
    }
    if (rc == 0 && why[0]) {
        x->out->model_status = "invalid";
        fail(x, EXTRACT_FAULT, "invalid", "%s", why);
        rc = 1;
    }
    for (uint32_t i = 0; rc == 0 && i < ds->via.array.size; i++) {
        const msgpack_object *d = &ds->via.array.ptr[i], *a = rpc_map_get(d, "action"),
                             *r = rpc_map_get(d, "reason");
        fact *f = &x->f[which[i]];
        f->action = str_is(a, "update") ? ACT_UPDATE : str_is(a, "none") ? ACT_NONE : ACT_ADD;
        f->target = targets[which[i]];
        if (r && r->type == MSGPACK_OBJECT_STR &&
            !(f->why = strndup(r->via.str.ptr, r->via.str.size)))
            rc = -ENOMEM;
    }
    free(decided);
    free(targets);
    free(which);
    msgpack_unpacked_destroy(&up);
    return rc;
}

/* ---- 4. applying -------------------------------------------------------------------------------
 */

/* A PostgreSQL array literal element: a quoted string. */
static int lit_str(ubuf *b, bool first, const char *s)
{
    if (ubuf_puts(b, first ? "\"" : ",\"") < 0)
        return -ENOMEM;
    for (; *s; s++)
        if (((*s == '"' || *s == '\\') && ubuf_putc(b, '\\') < 0) || ubuf_putc(b, *s) < 0)
            return -ENOMEM;
    return ubuf_putc(b, '"');
}

/* The metadata of fact f: category, confidence, provenance. */
static int fact_metadata(xrun *x, const fact *f, ubuf *md)
{
    int rc = ubuf_printf(md,
                         "{\"category\": \"%s\", \"confidence\": %.3g, \"provenance\": "
                         "{\"source\": \"extraction\", \"session_id\": %lld, \"entry_ids\": [",
                         cat_names[f->cat], f->confidence, (long long)x->session);
    for (size_t k = 0; k < f->neids && rc == 0; k++)
        rc = ubuf_printf(md, "%s%lld", k ? ", " : "", (long long)f->eids[k]);
    rc = rc < 0 ? rc : ubuf_printf(md, "], \"trigger\": \"%s\", \"model\": ", x->trigger);
    rc = rc < 0 ? rc : prompts_json_cstr(md, x->m.model);
    rc = rc < 0 ? rc : ubuf_puts(md, "}}");
    return rc;
}

enum { L_TYPE, L_CONTENT, L_IMP, L_MD, L_SFACT, L_SOLD, L_SSEQ, L_SWHY, L__COUNT };

/* Builds the arrays of the finish statement. Returns 0 or -ENOMEM. */
static int finish_arrays(xrun *x, ubuf L[L__COUNT], ubuf *emb, int *unchanged)
{
    int nadd = 0, nsup = 0, rc = 0;
    static const char hex[] = "0123456789abcdef";
    *unchanged = 0;
    for (int k = 0; k < L__COUNT && rc == 0; k++)
        rc = ubuf_putc(&L[k], '{');
    rc = rc < 0 ? rc : ubuf_puts(emb, "\\x");
    for (size_t i = 0; i < x->nf && rc == 0; i++) {
        const fact *f = &x->f[i];
        if (f->action == ACT_NONE) {
            (*unchanged)++;
            continue;
        }
        bool first = nadd++ == 0;
        ubuf md = {0};
        rc = fact_metadata(x, f, &md);
        rc = rc < 0 ? rc : lit_str(&L[L_TYPE], first, cat_types[f->cat]);
        rc = rc < 0 ? rc : lit_str(&L[L_CONTENT], first, f->text);
        rc = rc < 0 ? rc
                    : ubuf_printf(&L[L_IMP], "%s%.4f", first ? "" : ",", 0.3 + 0.6 * f->confidence);
        rc = rc < 0 ? rc : lit_str(&L[L_MD], first, md.data);
        ubuf_fini(&md);
        const unsigned char *v = (const unsigned char *)f->vec;
        for (size_t b = 0; b < x->dim * sizeof(float) && rc == 0; b++)
            rc = ubuf_putc(emb, hex[v[b] >> 4]) < 0 || ubuf_putc(emb, hex[v[b] & 15]) < 0 ? -ENOMEM
                                                                                          : 0;
        if (rc == 0 && f->action == ACT_UPDATE) {
            bool sfirst = nsup++ == 0;
            rc = ubuf_printf(&L[L_SFACT], "%s%d", sfirst ? "" : ",", nadd);
            rc = rc < 0 ? rc
                        : ubuf_printf(&L[L_SOLD], "%s%lld", sfirst ? "" : ",",
                                      (long long)f->nb_id[f->target]);
            rc = rc < 0 ? rc
                        : ubuf_printf(&L[L_SSEQ], "%s%lld", sfirst ? "" : ",",
                                      (long long)f->nb_seq[f->target]);
            rc = rc < 0 ? rc : lit_str(&L[L_SWHY], sfirst, f->why ? f->why : "");
        }
    }
    for (int k = 0; k < L__COUNT && rc == 0; k++)
        rc = ubuf_putc(&L[k], '}');
    return rc < 0 ? -ENOMEM : 0;
}

/* The run's result as JSON, for session_extraction.last_result. */
static int result_json(xrun *x, ubuf *b)
{
    const extract_result *o = x->out;
    int rc = ubuf_printf(b,
                         "{\"entries\": %d, \"facts\": %d, \"dropped\": %d, \"calls\": %d, "
                         "\"cost_usd\": %.17g, \"model\": ",
                         o->entries, o->facts, o->dropped, o->calls, o->cost_usd);
    rc = rc < 0 ? rc : prompts_json_cstr(b, x->m.model);
    rc = rc < 0 ? rc : ubuf_puts(b, ", \"decisions\": [");
    for (size_t i = 0; i < x->nf && rc == 0; i++) {
        const fact *f = &x->f[i];
        static const char *const acts[] = {"add", "update", "none"};
        rc = ubuf_printf(b,
                         "%s{\"fact\": %zu, \"category\": \"%s\", \"action\": \"%s\", \"memory\": ",
                         i ? ", " : "", i + 1, cat_names[f->cat], acts[f->action]);
        rc = rc < 0                 ? rc
             : f->action == ACT_ADD ? ubuf_puts(b, "null")
                                    : ubuf_printf(b, "%lld", (long long)f->nb_id[f->target]);
        rc = rc < 0 ? rc : ubuf_puts(b, ", \"why\": ");
        rc = rc < 0 ? rc : f->why ? prompts_json_cstr(b, f->why) : ubuf_puts(b, "null");
        rc = rc < 0 ? rc : ubuf_putc(b, '}');
    }
    rc = rc < 0 ? rc : ubuf_puts(b, "]}");
    return rc < 0 ? -ENOMEM : 0;
}

/* Applies the run in one transaction with its token count. Returns 0, 1 (the claim was
 * taken over: nothing changed) or -EIO / -ENOMEM with the run failed. */
static int apply(xrun *x)
{
    ubuf L[L__COUNT], emb = {0}, rj = {0};
    memset(L, 0, sizeof(L));
    int unchanged = 0;
    char err[400] = "", dim[16], last[24], agent[24], un[16], tin[24], tout[24];
    int rc = finish_arrays(x, L, &emb, &unchanged);
    rc = rc < 0 ? rc : result_json(x, &rj);
    if (rc < 0) {
        fail(x, EXTRACT_FAILED, NULL, "%s", "out of memory");
        goto out;
    }
    snprintf(dim, sizeof(dim), "%u", x->dim);
    snprintf(last, sizeof(last), "%lld", (long long)x->last_seq);
    snprintf(agent, sizeof(agent), "%lld", (long long)x->agent);
    snprintf(un, sizeof(un), "%d", unchanged);
    snprintf(tin, sizeof(tin), "%llu", (unsigned long long)x->m.tokens_in);
    snprintf(tout, sizeof(tout), "%llu", (unsigned long long)x->m.tokens_out);
    const char *v[] = {x->tid,
                       x->sid,
                       x->holder,
                       x->trigger,
                       server_memory_limits(x->s),
                       dim,
                       last,
                       agent,
                       L[L_TYPE].data,
                       L[L_CONTENT].data,
                       L[L_IMP].data,
                       L[L_MD].data,
                       emb.data,
                       L[L_SFACT].data,
                       L[L_SOLD].data,
                       L[L_SSEQ].data,
                       L[L_SWHY].data,
                       x->m.model,
                       un,
                       tin,
                       tout,
                       rj.data,
                       x->gen[0] ? x->gen : NULL};
    rc = pgsync_tenant_begin(x->pg, x->tenant, PGSYNC_TX_WRITE, err, sizeof(err));
    PGresult *res =
        rc == 0 ? PGSYNC_EXEC(x->pg, sqlb_def(SQLB_EXTRACT_FINISH), v, err, sizeof(err)) : NULL;
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_unpacked up;
    msgpack_unpacked_init(&up);
    bool busy = false, ok = res != NULL;
    if (ok) {
        msgpack_packer pk;
        msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
        const char *json = PQgetvalue(res, 0, 0);
        size_t off = 0;
        ok = json_to_msgpack(json, strlen(json), 8, &pk, NULL, 0) == 0 &&
             msgpack_unpack_next(&up, sb.data, sb.size, &off) == MSGPACK_UNPACK_SUCCESS;
        busy = ok && rpc_map_get(&up.data, "error");
    }
    /* the tokens count against the tenant's day in the same transaction */
    if (ok && !busy && mcall_record(&x->m, x->pg, false, err, sizeof(err)) < 0)
        ok = false;
    if (rc == 0)
        rc = pgsync_tx_end(x->pg, ok && !busy, ok ? err : NULL, ok ? sizeof(err) : 0);
    if ((rc < 0 || !ok) && strstr(err, "limit reached")) {
        /* the tier's memory count or byte quota (EG429): a fault of this run, recorded */
        fail(x, EXTRACT_FAULT, "quota_exceeded", "storing the facts: %s", err);
        x->out->model_status = "used";
        rc = 1;
    } else if (rc < 0 || !ok) {
        fail(x, EXTRACT_FAILED, NULL, "applying the extraction: %s", err);
        rc = -EIO;
    } else if (busy) {
        fail(x, EXTRACT_BUSY, NULL, "%s", "the session's extraction claim was taken over");
        x->claimed = false;
        rc = 1;
    } else {
        const msgpack_object *o = &up.data, *ids = rpc_map_get(o, "memory_ids");
        x->out->added = (int)rpc_get_int(rpc_map_get(o, "added"), 0);
        x->out->updated = (int)rpc_get_int(rpc_map_get(o, "updated"), 0);
        x->out->skipped = (int)rpc_get_int(rpc_map_get(o, "skipped"), 0);
        x->out->unchanged = unchanged;
        for (uint32_t i = 0; ids && ids->type == MSGPACK_OBJECT_ARRAY && i < ids->via.array.size &&
                             x->out->nids < EXTRACT_IDS_MAX;
             i++)
            as_i64(&ids->via.array.ptr[i], &x->out->memory_ids[x->out->nids++]);
        x->claimed = false;
    }
    PQclear(res);
    msgpack_unpacked_destroy(&up);
    msgpack_sbuffer_destroy(&sb);
out:
    for (int k = 0; k < L__COUNT; k++)
        ubuf_fini(&L[k]);
    ubuf_fini(&emb);
    ubuf_fini(&rj);
    return rc;
}

/* Records a run that changed nothing on the session, with its tokens (which count against
 * the tenant's day: the provider billed them). */
static void record_failure(xrun *x)
{
    char err[300], tin[24], tout[24];
    ubuf rj = {0};
    snprintf(tin, sizeof(tin), "%llu", (unsigned long long)x->m.tokens_in);
    snprintf(tout, sizeof(tout), "%llu", (unsigned long long)x->m.tokens_out);
    if (result_json(x, &rj) < 0) {
        ubuf_fini(&rj);
        return;
    }
    const char *v[] = {
        x->tid,        x->sid, x->holder, x->trigger, x->fail_status[0] ? x->fail_status : "failed",
        x->out->error, tin,    tout,      rj.data};
    int rc = pgsync_tenant_begin(x->pg, x->tenant, PGSYNC_TX_WRITE, err, sizeof(err));
    PGresult *res =
        rc == 0 ? PGSYNC_EXEC(x->pg, sqlb_def(SQLB_EXTRACT_FAIL), v, err, sizeof(err)) : NULL;
    bool ok = res && mcall_record(&x->m, x->pg, false, err, sizeof(err)) == 0;
    if (rc == 0)
        pgsync_tx_end(x->pg, ok, err, sizeof(err));
    if (!ok)
        log_warn("tenant %lld session %lld: recording a failed extraction: %s",
                 (long long)x->tenant, (long long)x->session, err);
    PQclear(res);
    ubuf_fini(&rj);
}

/* ---- the run ------------------------------------------------------------------------------------
 */

/* Steps 2 to 4 once the session is claimed. Returns 0 or a positive / negative code with the
 * run failed. */
static int run_claimed(xrun *x)
{
    char err[300];
    if (mcall_open(&x->m, x->s, x->pg, x->tenant, err, sizeof(err)) < 0) {
        fail(x, EXTRACT_FAILED, NULL, "reading the model state: %s", err);
        return -EIO;
    }
    if (x->m.status) {
        x->out->model_status = x->m.status;
        fail(x, EXTRACT_NO_MODEL, x->m.status, "%s", x->m.reason);
        return 1;
    }
    pthread_once(&schema_once, schema_make);
    if (!facts_schema || !decide_schema) {
        x->out->model_status = "failed";
        fail(x, EXTRACT_NO_MODEL, "failed", "the answer schema: %s", schema_err);
        return 1;
    }
    if (x->entries->via.array.size == 0)
        return apply(x); /* nothing new: the position still moves past events */
    ubuf user = {0};
    llm_result res;
    int rc = facts_prompt(x, &user);
    rc = rc < 0 ? -ENOMEM : ask(x, "extract_system.txt", &user, facts_schema, "facts", &res);
    ubuf_fini(&user);
    if (rc == 0) {
        x->out->model_status = "used";
        rc = take_facts(x, &res);
        llm_result_fini(&res);
    }
    rc = rc == 0 ? neighbours(x) : rc;
    int asked = 0;
    if (rc == 0)
        rc = decide_prompt(x, &user, &asked);
    if (rc == 0 && asked > 0) {
        rc = ask(x, "extract_decide_system.txt", &user, decide_schema, "decisions", &res);
        if (rc == 0) {
            rc = take_decisions(x, &res);
            llm_result_fini(&res);
        }
    }
    ubuf_fini(&user);
    if (rc == -ENOMEM)
        fail(x, EXTRACT_FAILED, NULL, "%s", "out of memory");
    return rc == 0 ? apply(x) : rc;
}

void extract_session(bg_ctx *ctx, server *s, int64_t tenant_id, uint32_t dim, int64_t session,
                     int64_t through_entry, const char *trigger, extract_result *out)
{
    static atomic_ulong runs;
    memset(out, 0, sizeof(*out));
    xrun x = {.s = s,
              .ctx = ctx,
              .cfg = &s->cfg,
              .tenant = tenant_id,
              .session = session,
              .through_entry = through_entry,
              .dim = dim,
              .trigger = trigger,
              .out = out};
    msgpack_unpacked_init(&x.up);
    msgpack_sbuffer_init(&x.sb);
    snprintf(x.tid, sizeof(x.tid), "%lld", (long long)tenant_id);
    snprintf(x.sid, sizeof(x.sid), "%lld", (long long)session);
    char host[64] = "";
    gethostname(host, sizeof(host) - 1);
    snprintf(x.holder, sizeof(x.holder), "%s:%ld:%lu", host, (long)getpid(),
             (unsigned long)atomic_fetch_add(&runs, 1));
    char err[300];
    x.pg = bg_conn(ctx, err, sizeof(err));
    if (!x.pg) {
        fail(&x, EXTRACT_FAILED, NULL, "no database connection: %s", err);
        goto out;
    }
    if (claim(&x) == 0 && run_claimed(&x) != 0 && x.claimed && PQstatus(x.pg) == CONNECTION_OK)
        record_failure(&x);
    static const int result_of[] = {[EXTRACT_OK] = 0,
                                    [EXTRACT_BUSY] = 1,
                                    [EXTRACT_NOT_FOUND] = 2,
                                    [EXTRACT_NO_MODEL] = 3,
                                    [EXTRACT_FAULT] = 4};
    metrics_extraction(trigger[0] == 'o'   ? 0
                       : trigger[0] == 'a' ? 1
                                           : 2,
                       out->status < 0 ? 5 : result_of[out->status], (uint64_t)out->added,
                       (uint64_t)out->updated, (uint64_t)out->unchanged, (uint64_t)out->dropped);
    if (out->status == EXTRACT_OK)
        log_info("tenant %lld session %lld extraction (%s): %d messages, %d facts, %d added, %d "
                 "updated, %d unchanged",
                 (long long)tenant_id, (long long)session, trigger, out->entries, out->facts,
                 out->added, out->updated, out->unchanged);
    else if (out->status != EXTRACT_BUSY)
        log_warn("tenant %lld session %lld extraction (%s): %s", (long long)tenant_id,
                 (long long)session, trigger, out->error);
    if (PQstatus(x.pg) != CONNECTION_OK)
        bg_conn_failed(ctx);
out:
    facts_free(&x);
    msgpack_unpacked_destroy(&x.up);
    msgpack_sbuffer_destroy(&x.sb);
}

/* ---- automatic extraction ---------------------------------------------------------------------
 */

static void scheduled(bg_ctx *ctx, void *arg)
{
    server *s = arg;
    const config *c = &s->cfg;
    if (!chat_available() || c->extract_min_messages == 0)
        return;
    char err[256], v0[16], v1[24], v2[16], v3[16], v4[16];
    snprintf(v0, sizeof(v0), "%d", c->extract_min_messages);
    snprintf(v1, sizeof(v1), "%ld", c->extract_min_tokens);
    snprintf(v2, sizeof(v2), "%d", c->extract_idle_s);
    snprintf(v3, sizeof(v3), "%d", c->extract_stale_s);
    snprintf(v4, sizeof(v4), "%d", c->extract_retry_s);
    PGconn *pg = bg_conn(ctx, err, sizeof(err));
    if (!pg)
        return;
    const char *v[] = {v0, v1, v2, v3, v4, "100"};
    PGresult *r = PGSYNC_EXEC(pg, sqlb_def(SQLB_EXTRACT_DUE), v, err, sizeof(err));
    if (!r) {
        log_warn("extraction scheduler: %s", err);
        if (PQstatus(pg) != CONNECTION_OK)
            bg_conn_failed(ctx);
        return;
    }
    int n = PQntuples(r);
    for (int i = 0; i < n && !bg_cancelled(ctx); i++) {
        int64_t t = memrow_i64(r, i, 0, 0), sess = memrow_i64(r, i, 1, 0);
        int64_t dim = memrow_i64(r, i, 2, 0);
        if (t <= 0 || sess <= 0 || dim <= 0 || dim > UINT32_MAX)
            continue;
        extract_result res;
        extract_session(ctx, s, t, (uint32_t)dim, sess, 0, "auto", &res);
    }
    PQclear(r);
}

int extract_start(server *s)
{
    return bg_every(s->bg, (unsigned)s->cfg.extract_check_interval_s * 1000u, scheduled, s);
}
