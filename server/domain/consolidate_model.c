/* server/domain/consolidate_model.c: a consolidation run's candidate groups judged by a chat
 * model (consolidate.h, step 3b; issue 32).
 *
 * Groups: the pairs step_pairs offered (cosine at consolidate_model_floor or above, same type
 * and visibility, no text rule relating them), among memories the rules' plan leaves alone,
 * joined most similar first into groups of at most consolidate_model_group_max memories; at
 * most consolidate_model_max_groups groups per run, the most similar first.
 *
 * Prompts are files (server/prompts/, prompts.h). Each memory goes into the user message as
 * one JSON object per line between <memories> and </memories>, its text a JSON string in
 * which '<', '>' and '&' are escaped too, so no memory can close the block or open another:
 * what a memory says is data, and the system prompt says so. Whatever the model answers,
 * a decision can only name memories of its own group: an answer naming any other id is
 * rejected whole, so no memory (hostile or not) can change the fate of a memory it was not
 * grouped with.
 *
 * Calls run on an event base of this background thread (llm.h), never on a worker's loop,
 * in windows of llm_max_concurrency. A call that gets no usable answer (timeout, 429 after
 * its retries, 5xx, a dropped connection: the provider is unavailable) stops the run's
 * later calls; an answer that is not JSON, breaks the schema, is cut at the token limit or
 * names ids outside its group changes nothing in its group. Either way the reason goes into
 * the run record (settings.model.errors) and the rest of the run goes on without the model.
 */
#include "consolidate_int.h"

#include <pthread.h>
#include <stdlib.h>
#include <time.h>

#include <event2/event.h>
#include <msgpack.h>

#include "chat.h"
#include "log.h"
#include "mcall.h"
#include "memrow.h"
#include "pgsync.h"
#include "prompts.h"
#include "sql_bg.h"
#include "tiers.h"
#include "idmap.h"
#include "xxh64.h"

#define LOG_MAX 100          /* decisions listed in the run record */
#define ERRORS_MAX 20        /* failed groups listed in the run record */
#define PROMPT_TEXT_MAX 4000 /* bytes of one memory's text shown to the model */

/* fates of memories the model's decisions archive (step_apply acts on 1 to 3 only) */
enum { FATE_MODEL_MERGED = 4, FATE_MODEL_SUPERSEDED = 5 };

static const char *const relation_names[MDEC__COUNT] = {"same", "newer", "distinct",
                                                        "contradiction"};

/* ---- the answer's schema, made once -------------------------------------------------------- */

static pthread_once_t schema_once = PTHREAD_ONCE_INIT;
static llm_schema *schema;
static char schema_err[200];

static void schema_make(void)
{
    size_t len;
    const char *json = prompts_get("consolidate_schema.json", &len);
    if (!json)
        snprintf(schema_err, sizeof(schema_err), "consolidate_schema.json is not embedded");
    else if (llm_schema_create(json, len, &schema, schema_err, sizeof(schema_err)) != 0)
        schema = NULL;
}

/* ---- candidate pairs and groups ------------------------------------------------------------ */

int consolidate_model_pair(run *r, uint32_t a, uint32_t b, float sim)
{
    model_run *mr = &r->model;
    if (mr->npairs == mr->cpairs) {
        size_t cap = mr->cpairs ? mr->cpairs * 2 : 256;
        mpair *p = realloc(mr->pairs, cap * sizeof(*p));
        if (!p)
            return -ENOMEM;
        mr->pairs = p;
        mr->cpairs = cap;
    }
    mr->pairs[mr->npairs++] = (mpair){a, b, sim};
    return 0;
}

void consolidate_model_fini(run *r)
{
    model_run *mr = &r->model;
    free(mr->pairs);
    for (size_t i = 0; i < mr->ndec; i++) {
        free(mr->dec[i].text);
        free(mr->dec[i].why);
    }
    free(mr->dec);
    ubuf_fini(&mr->errors);
    ubuf_fini(&mr->log);
    mr->pairs = NULL;
    mr->dec = NULL;
    mr->npairs = mr->ndec = 0;
}

static int cmp_pair(const void *x, const void *y)
{
    const mpair *a = x, *b = y;
    if (a->sim != b->sim)
        return a->sim > b->sim ? -1 : 1;
    if (a->a != b->a)
        return a->a < b->a ? -1 : 1;
    return a->b < b->b ? -1 : a->b > b->b;
}

/* A candidate group and, once asked, the model's answer. */
typedef struct group {
    uint32_t *idx; /* members: indexes into the run's memories */
    size_t n;
    float best; /* the highest cosine that joined it */
    bool cut;   /* a member's text was cut for the prompt: no rewritten text is taken */
    bool asked, finished;
    bool judged; /* its answer was taken: its pairs are remembered */
    llm_result res;
} group;

static int cmp_group(const void *x, const void *y)
{
    const group *a = x, *b = y;
    if (a->best != b->best)
        return a->best > b->best ? -1 : 1;
    return a->idx[0] < b->idx[0] ? -1 : a->idx[0] > b->idx[0];
}

static uint32_t uf_find(uint32_t *parent, uint32_t i)
{
    while (parent[i] != i) {
        parent[i] = parent[parent[i]];
        i = parent[i];
    }
    return i;
}

/* ---- pairs judged before ------------------------------------------------------------------- */

/* The memo's key of the pair (a, b) of memory ids (a < b), and its value: the two texts'
 * normalized hashes (textrule.h). */
static uint64_t memo_key(int64_t a, int64_t b)
{
    int64_t k[2] = {a, b};
    return xxh64(k, sizeof(k), 0x6a756467) & ~(1ULL << 63);
}

static uint64_t text_hash(const cmem *m)
{
    return m->sig.text[0] & ~(1ULL << 63); /* stored as a bigint */
}

static uint64_t memo_value(uint64_t ha, uint64_t hb)
{
    uint64_t k[2] = {ha, hb};
    return xxh64(k, sizeof(k), 0x68617368);
}

/* Reads the pairs judged before into a map (memo_key -> memo_value). Returns it, or NULL
 * with err (-EIO / -ENOMEM in *rc). */
static idmap *memo_read(run *r, int *rc, char *err, size_t errlen)
{
    const char *v[] = {r->tid};
    *rc = pgsync_tenant_begin(r->pg, r->tenant, PGSYNC_TX_READ, err, errlen);
    PGresult *res = *rc == 0 ? PGSYNC_EXEC(r->pg, sqlb_def(SQLB_JUDGED_GET), v, err, errlen) : NULL;
    if (*rc == 0) {
        *rc = pgsync_tx_end(r->pg, res != NULL, err, errlen);
        if (*rc == 0 && !res)
            *rc = -EIO;
    }
    if (*rc < 0) {
        PQclear(res);
        *rc = -EIO;
        return NULL;
    }
    int n = PQntuples(res);
    idmap *m = idmap_create((size_t)n + 16);
    for (int i = 0; m && i < n; i++) {
        uint64_t k = memo_key(memrow_i64(res, i, 0, 0), memrow_i64(res, i, 1, 0));
        uint64_t val =
            memo_value((uint64_t)memrow_i64(res, i, 2, 0), (uint64_t)memrow_i64(res, i, 3, 0));
        if (idmap_put(m, k, val) < 0) {
            idmap_destroy(m);
            m = NULL;
        }
    }
    PQclear(res);
    if (!m) {
        snprintf(err, errlen, "out of memory");
        *rc = -ENOMEM;
    }
    return m;
}

/* True when the pair was judged before and neither text changed since. */
static bool memo_has(const idmap *memo, const cmem *x, const cmem *y)
{
    const cmem *a = x->id < y->id ? x : y, *b = x->id < y->id ? y : x;
    uint64_t v;
    return memo && idmap_get(memo, memo_key(a->id, b->id), &v) &&
           v == memo_value(text_hash(a), text_hash(b));
}

/* Forms the groups from the pairs among memories no rule changes. Returns the number made
 * (in *groups, most similar first) or -ENOMEM. */
static long make_groups(run *r, const idmap *memo, group **groups)
{
    size_t n = r->l.n, cap = (size_t)r->cfg->consolidate_model_group_max;
    const cmem *m = r->l.m;
    model_run *mr = &r->model;
    uint32_t *parent = malloc((n + 1) * sizeof(*parent)), *size = calloc(n + 1, sizeof(*size));
    float *best = calloc(n + 1, sizeof(*best));
    bool *busy = calloc(n + 1, sizeof(*busy));
    uint32_t *slot = malloc((n + 1) * sizeof(*slot));
    group *g = NULL;
    long ng = 0;
    if (!parent || !size || !best || !busy || !slot)
        goto nomem;
    /* memories the rules' plan changes are left to it: the archived, and the survivors and
     * newer memories they point at */
    for (size_t i = 0; i < n; i++) {
        parent[i] = (uint32_t)i;
        size[i] = 1;
        if (m[i].fate != 0) {
            busy[i] = true;
            if (m[i].fate == 1 || m[i].fate == 2)
                busy[m[i].into] = true;
        }
    }
    if (mr->npairs > 1) /* pairs is NULL when there are none: not for qsort */
        qsort(mr->pairs, mr->npairs, sizeof(*mr->pairs), cmp_pair);
    for (size_t p = 0; p < mr->npairs; p++) {
        uint32_t a = mr->pairs[p].a, b = mr->pairs[p].b;
        if (busy[a] || busy[b])
            continue;
        if (memo_has(memo, &m[a], &m[b])) {
            mr->remembered++;
            continue;
        }
        uint32_t ra = uf_find(parent, a), rb = uf_find(parent, b);
        if (ra == rb || size[ra] + size[rb] > cap)
            continue; /* a full group: this pair waits for a later run */
        if (size[ra] < size[rb] || (size[ra] == size[rb] && rb < ra)) {
            uint32_t t = ra;
            ra = rb;
            rb = t;
        }
        parent[rb] = ra;
        size[ra] += size[rb];
        if (mr->pairs[p].sim > best[ra])
            best[ra] = mr->pairs[p].sim;
        if (best[rb] > best[ra])
            best[ra] = best[rb];
    }
    /* one group per root of two or more, members in index order */
    for (size_t i = 0; i < n; i++)
        slot[i] = UINT32_MAX;
    for (size_t i = 0; i < n; i++)
        if (parent[i] == i && size[i] > 1)
            slot[i] = (uint32_t)ng++;
    g = calloc((size_t)ng + 1, sizeof(*g));
    if (!g)
        goto nomem;
    for (size_t i = 0; i < n; i++) {
        if (parent[i] != i || size[i] < 2)
            continue;
        group *gi = &g[slot[i]];
        gi->idx = malloc(size[i] * sizeof(uint32_t));
        gi->best = best[i];
        if (!gi->idx)
            goto nomem;
    }
    for (size_t i = 0; i < n; i++) {
        if (busy[i])
            continue;
        uint32_t root = uf_find(parent, (uint32_t)i);
        if (slot[root] != UINT32_MAX)
            g[slot[root]].idx[g[slot[root]].n++] = (uint32_t)i;
    }
    qsort(g, (size_t)ng, sizeof(*g), cmp_group);
    free(parent);
    free(size);
    free(best);
    free(busy);
    free(slot);
    *groups = g;
    return ng;
nomem:
    for (long k = 0; g && k < ng; k++)
        free(g[k].idx);
    free(g);
    free(parent);
    free(size);
    free(best);
    free(busy);
    free(slot);
    return -ENOMEM;
}

static void groups_free(group *g, size_t ng)
{
    for (size_t k = 0; g && k < ng; k++) {
        free(g[k].idx);
        llm_result_fini(&g[k].res);
    }
    free(g);
}

/* ---- JSON for prompts and records ------------------------------------------------------------ */

/* The texts of the groups' memories (read from one snapshot). */
typedef struct texts {
    int64_t *ids; /* sorted */
    char **text;
    size_t n;
} texts;

static const char *text_of(const texts *t, int64_t id)
{
    size_t lo = 0, hi = t->n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (t->ids[mid] < id)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < t->n && t->ids[lo] == id ? t->text[lo] : NULL;
}

static void texts_fini(texts *t)
{
    for (size_t i = 0; i < t->n; i++)
        free(t->text[i]);
    free(t->ids);
    free(t->text);
}

/* Reads the live texts of the groups' members. Returns 0, -ENOMEM or -EIO (err). */
static int read_texts(run *r, const group *g, size_t ng, texts *out, char *err, size_t errlen)
{
    lit ids = {0};
    int rc = 0;
    for (size_t k = 0; k < ng && rc == 0; k++)
        for (size_t i = 0; i < g[k].n && rc == 0; i++)
            rc = lit_i64(&ids, r->l.m[g[k].idx[i]].id);
    const char *v[] = {r->tid, rc == 0 ? lit_end(&ids) : NULL};
    if (rc < 0 || !v[1]) {
        ubuf_fini(&ids.b);
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    rc = pgsync_tenant_begin(r->pg, r->tenant, PGSYNC_TX_READ, err, errlen);
    PGresult *res =
        rc == 0 ? PGSYNC_EXEC(r->pg, sqlb_def(SQLB_CONSOLIDATE_TEXTS), v, err, errlen) : NULL;
    ubuf_fini(&ids.b);
    if (rc == 0) {
        rc = pgsync_tx_end(r->pg, res != NULL, err, errlen);
        if (rc == 0 && !res)
            rc = -EIO;
    }
    if (rc < 0) {
        PQclear(res);
        return -EIO;
    }
    int nt = PQntuples(res); /* in id order (the statement sorts) */
    out->ids = malloc(((size_t)nt + 1) * sizeof(int64_t));
    out->text = calloc((size_t)nt + 1, sizeof(char *));
    out->n = 0;
    for (int i = 0; out->ids && out->text && i < nt; i++) {
        out->ids[i] = memrow_i64(res, i, 0, 0);
        out->text[i] = strdup(PQgetvalue(res, i, 1));
        if (!out->text[i])
            break;
        out->n++;
    }
    PQclear(res);
    if (!out->ids || !out->text || out->n != (size_t)nt) {
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    return 0;
}

/* The user message of group g: the template with the memories as JSON lines. */
static int group_prompt(run *r, group *g, const texts *t, ubuf *out)
{
    ubuf mems = {0};
    char today[16], created[32], count[16];
    int rc = 0;
    for (size_t i = 0; i < g->n && rc == 0; i++) {
        const cmem *mi = &r->l.m[g->idx[i]];
        const char *text = text_of(t, mi->id);
        size_t len = strlen(text), shown = prompts_utf8_cut(text, len, PROMPT_TEXT_MAX);
        g->cut |= shown < len;
        prompts_utc(mi->created_ms, false, created, sizeof(created));
        rc = ubuf_printf(&mems, "%s{\"id\": %lld, \"created\": \"%s\", \"text\": ", i ? "\n" : "",
                         (long long)mi->id, created);
        if (rc >= 0)
            rc = prompts_json_str(&mems, text, shown);
        if (rc >= 0)
            rc = ubuf_puts(&mems, shown < len ? ", \"cut\": true}" : "}");
    }
    if (rc < 0 || ubuf_putc(&mems, '\0') < 0) {
        ubuf_fini(&mems);
        return -ENOMEM;
    }
    prompts_utc(r->started, true, today, sizeof(today));
    snprintf(count, sizeof(count), "%zu", g->n);
    const char *keys[] = {"today", "count", "type", "memories"};
    const char *vals[] = {today, count, memrow_type_name(r->l.m[g->idx[0]].type), mems.data};
    rc = prompts_render("consolidate_user.txt", keys, vals, 4, out);
    ubuf_fini(&mems);
    if (rc == 0 && ubuf_putc(out, '\0') < 0)
        rc = -ENOMEM;
    return rc;
}

/* ---- the calls ----------------------------------------------------------------------------- */

typedef struct calls {
    struct event_base *base;
    llm_provider *p;
    bg_ctx *ctx;
    int pending;
} calls;

typedef struct gcall {
    calls *c;
    group *g;
} gcall;

static void call_done(llm_result *res, void *arg)
{
    gcall *gc = arg;
    llm_result_move(&gc->g->res, res);
    gc->g->finished = true;
    if (--gc->c->pending == 0)
        event_base_loopbreak(gc->c->base);
}

/* Every 200 ms: a server stopping ends the calls (their callbacks run, cancelled). */
static void cancel_tick(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    calls *c = arg;
    if (bg_cancelled(c->ctx))
        llm_detach(c->p, c->base);
}

/* True when a failed call says the provider cannot answer now (no usable answer at all). */
static bool unavailable(int status)
{
    return status == LLM_E_TIMEOUT || status == LLM_E_RATE_LIMITED || status == LLM_E_HTTP ||
           status == LLM_E_TRANSPORT || status == LLM_E_TLS || status == LLM_E_CANCELLED ||
           status == LLM_E_INTERNAL;
}

static void add_error(model_run *mr, const cmem *m, const group *g, const char *status,
                      const char *reason)
{
    if (mr->nerrors++ >= ERRORS_MAX)
        return;
    ubuf *b = &mr->errors;
    if (b->len)
        ubuf_puts(b, ", ");
    ubuf_puts(b, "{\"group\": [");
    for (size_t i = 0; i < g->n; i++)
        ubuf_printf(b, "%s%lld", i ? ", " : "", (long long)m[g->idx[i]].id);
    ubuf_printf(b, "], \"status\": \"%s\", \"reason\": ", status);
    prompts_json_cstr(b, reason);
    ubuf_putc(b, '}');
    if (!mr->reason[0])
        snprintf(mr->reason, sizeof(mr->reason), "%s: %s", status, reason);
}

/* Asks the model about the groups g[0..ng), in windows of the concurrency cap, until the
 * provider fails, the tenant's cap is reached or the server stops. Returns 0 or -ENOMEM. */
static int ask(run *r, llm_provider *p, group *g, size_t ng, const texts *t)
{
    model_run *mr = &r->model;
    const char *system = prompts_get("consolidate_system.txt", NULL);
    calls c = {.base = event_base_new(), .p = p, .ctx = r->ctx};
    gcall *gc = calloc(ng + 1, sizeof(*gc));
    struct event *tick = c.base ? event_new(c.base, -1, EV_PERSIST, cancel_tick, &c) : NULL;
    ubuf *prompts = calloc(ng + 1, sizeof(*prompts));
    int rc = 0;
    if (!c.base || !gc || !tick || !prompts || !system) {
        rc = -ENOMEM;
        goto out;
    }
    struct timeval tv = {0, 200000};
    event_add(tick, &tv);
    size_t window = (size_t)r->cfg->llm_max_concurrency, next = 0;
    bool stop = false;
    while (next < ng && !stop && !bg_cancelled(r->ctx)) {
        if (mr->cap > 0 &&
            mr->tokens_today + (int64_t)(mr->tokens_in + mr->tokens_out) >= mr->cap) {
            snprintf(mr->reason, sizeof(mr->reason),
                     "the tier's daily model token cap (%lld) was reached during the run; %zu "
                     "groups were not asked",
                     (long long)mr->cap, ng - next);
            chat_count_fallback(CHAT_FB_CAP);
            break;
        }
        size_t end = next + window < ng ? next + window : ng;
        for (size_t k = next; k < end; k++) {
            if ((rc = group_prompt(r, &g[k], t, &prompts[k])) < 0)
                goto out;
            llm_message msg = {LLM_USER, prompts[k].data, prompts[k].len - 1};
            llm_request req = {.system = system,
                               .messages = &msg,
                               .n_messages = 1,
                               .schema = schema,
                               .schema_name = "consolidation_decisions",
                               .schema_description =
                                   "decisions on pairs of memories of one candidate group",
                               .has_temperature = true,
                               .temperature = 0};
            gc[k] = (gcall){&c, &g[k]};
            if (llm_call(p, c.base, &req, call_done, &gc[k]) == 0) {
                g[k].asked = true;
                c.pending++;
                mr->calls++;
            } else {
                add_error(mr, r->l.m, &g[k], "internal", "the request could not be made");
            }
        }
        if (c.pending > 0)
            event_base_dispatch(c.base);
        for (size_t k = next; k < end; k++) {
            const llm_result *res = &g[k].res;
            if (!g[k].finished)
                continue;
            mr->tokens_in += res->tokens_in;
            mr->tokens_out += res->tokens_out;
            mr->cost_usd += res->cost_usd;
            if (res->status != LLM_OK && unavailable(res->status))
                stop = true;
        }
        next = end;
    }
    if (stop && next < ng)
        mr->unasked += (int)(ng - next);
out:
    if (tick)
        event_free(tick);
    if (c.base) {
        llm_detach(p, c.base);
        event_base_free(c.base);
    }
    for (size_t k = 0; prompts && k < ng; k++)
        ubuf_fini(&prompts[k]);
    free(prompts);
    free(gc);
    return rc;
}

/* ---- the answers --------------------------------------------------------------------------- */

static const msgpack_object *map_get(const msgpack_object *o, const char *key)
{
    if (o->type != MSGPACK_OBJECT_MAP)
        return NULL;
    size_t kl = strlen(key);
    for (uint32_t i = 0; i < o->via.map.size; i++) {
        const msgpack_object *k = &o->via.map.ptr[i].key;
        if (k->type == MSGPACK_OBJECT_STR && k->via.str.size == kl &&
            memcmp(k->via.str.ptr, key, kl) == 0)
            return &o->via.map.ptr[i].val;
    }
    return NULL;
}

static bool as_id(const msgpack_object *o, int64_t *out)
{
    if (!o || o->type != MSGPACK_OBJECT_POSITIVE_INTEGER || o->via.u64 > INT64_MAX)
        return false;
    *out = (int64_t)o->via.u64;
    return true;
}

/* The member of g with that id, or UINT32_MAX. */
static uint32_t member(const run *r, const group *g, int64_t id)
{
    for (size_t i = 0; i < g->n; i++)
        if (r->l.m[g->idx[i]].id == id)
            return g->idx[i];
    return UINT32_MAX;
}

/* One decision of an answer, checked against its group. */
typedef struct answer {
    uint32_t a, b, keep; /* keep: UINT32_MAX when null */
    int kind;
    const msgpack_object *text, *reason;
} answer;

/* Checks decision o of group g. Returns 0, or -1 with why. */
static int check_one(const run *r, const group *g, const msgpack_object *o, answer *out, char *why,
                     size_t whylen)
{
    int64_t a, b, keep = 0;
    const msgpack_object *rel = map_get(o, "relation"), *k = map_get(o, "keep");
    if (!as_id(map_get(o, "a"), &a) || !as_id(map_get(o, "b"), &b) || !rel ||
        rel->type != MSGPACK_OBJECT_STR) {
        snprintf(why, whylen, "a decision without ids or relation");
        return -1;
    }
    out->a = member(r, g, a);
    out->b = member(r, g, b);
    if (out->a == UINT32_MAX || out->b == UINT32_MAX) {
        snprintf(why, whylen, "the answer names memory %lld, which is not in the group",
                 (long long)(out->a == UINT32_MAX ? a : b));
        return -1;
    }
    if (a == b) {
        snprintf(why, whylen, "the answer pairs memory %lld with itself", (long long)a);
        return -1;
    }
    out->kind = -1;
    for (int i = 0; i < MDEC__COUNT; i++)
        if (rel->via.str.size == strlen(relation_names[i]) &&
            memcmp(rel->via.str.ptr, relation_names[i], rel->via.str.size) == 0)
            out->kind = i;
    out->keep = UINT32_MAX;
    if (k && k->type != MSGPACK_OBJECT_NIL) {
        if (!as_id(k, &keep) || (keep != a && keep != b)) {
            snprintf(why, whylen, "the answer keeps memory %lld, which is not of its pair",
                     (long long)keep);
            return -1;
        }
        out->keep = keep == a ? out->a : out->b;
    }
    if (out->kind < 0) {
        snprintf(why, whylen, "an unknown relation");
        return -1;
    }
    out->text = map_get(o, "text");
    out->reason = map_get(o, "reason");
    return 0;
}

static void add_log(model_run *mr, const cmem *m, const answer *d, uint32_t keep, bool applied,
                    const char *note, const char *reason, size_t rlen)
{
    if (mr->nlog++ >= LOG_MAX)
        return;
    ubuf *b = &mr->log;
    if (b->len)
        ubuf_puts(b, ", ");
    ubuf_printf(b, "{\"a\": %lld, \"b\": %lld, \"relation\": \"%s\", \"keep\": ",
                (long long)m[d->a].id, (long long)m[d->b].id, relation_names[d->kind]);
    if (keep == UINT32_MAX)
        ubuf_puts(b, "null");
    else
        ubuf_printf(b, "%lld", (long long)m[keep].id);
    ubuf_printf(b, ", \"applied\": %s, \"why\": ", applied ? "true" : "false");
    prompts_json_str(b, reason, rlen);
    if (note) {
        ubuf_puts(b, ", \"note\": ");
        prompts_json_cstr(b, note);
    }
    ubuf_putc(b, '}');
}

/* Plans one checked decision. Returns 0 or -ENOMEM. */
static int plan_one(run *r, const group *g, const answer *d, const texts *t)
{
    model_run *mr = &r->model;
    cmem *m = r->l.m;
    const char *reason =
        d->reason && d->reason->type == MSGPACK_OBJECT_STR ? d->reason->via.str.ptr : "";
    size_t rlen = d->reason && d->reason->type == MSGPACK_OBJECT_STR ? d->reason->via.str.size : 0;
    mr->by_relation[d->kind]++;
    if (d->kind == MDEC_DISTINCT) {
        add_log(mr, m, d, UINT32_MAX, false, NULL, reason, rlen);
        return 0;
    }
    uint32_t keep = d->keep, other;
    if (keep == UINT32_MAX && d->kind == MDEC_SAME)
        keep = better(&m[d->a], &m[d->b]) ? d->a : d->b;
    else if (keep == UINT32_MAX)
        keep = newer(&m[d->a], &m[d->b]) ? d->a : d->b;
    other = keep == d->a ? d->b : d->a;
    const char *note = NULL;
    if (m[keep].fate != 0 || m[other].fate != 0)
        note = "not applied: an earlier decision of the run archived one of the two";
    else if (d->kind == MDEC_NEWER && m[keep].type != MEM_FACT && m[keep].type != MEM_PREFERENCE &&
             m[keep].type != MEM_CONSTRAINT)
        note = "not applied: episodes and strategy outcomes are events, never superseded";
    if (note) {
        add_log(mr, m, d, keep, false, note, reason, rlen);
        return 0;
    }
    /* a rewritten text: not empty, not too long, not cut from what the model saw */
    char *text = NULL;
    const msgpack_object *tx = d->text;
    if (d->kind != MDEC_CONTRADICTION && tx && tx->type == MSGPACK_OBJECT_STR &&
        tx->via.str.size > 0 && tx->via.str.size <= (size_t)r->cfg->max_content_bytes && !g->cut) {
        const char *cur = text_of(t, m[keep].id);
        if (!cur || strlen(cur) != tx->via.str.size ||
            memcmp(cur, tx->via.str.ptr, tx->via.str.size) != 0) {
            if (!(text = strndup(tx->via.str.ptr, tx->via.str.size)))
                return -ENOMEM;
        }
    }
    if (mr->ndec == mr->cdec) {
        size_t cap = mr->cdec ? mr->cdec * 2 : 64;
        mdec *nd = realloc(mr->dec, cap * sizeof(*nd));
        if (!nd) {
            free(text);
            return -ENOMEM;
        }
        mr->dec = nd;
        mr->cdec = cap;
    }
    char *why = strndup(reason, rlen);
    if (!why) {
        free(text);
        return -ENOMEM;
    }
    mr->dec[mr->ndec++] = (mdec){d->kind, keep, other, text, why};
    if (d->kind == MDEC_SAME)
        m[other].fate = FATE_MODEL_MERGED;
    else if (d->kind == MDEC_NEWER)
        m[other].fate = FATE_MODEL_SUPERSEDED;
    add_log(mr, m, d, keep, true, NULL, reason, rlen);
    return 0;
}

/* Takes group g's answer: every decision is checked first (one that fails rejects the
 * whole answer), then planned in order. Returns 0 or -ENOMEM. */
static int take_answer(run *r, group *g, const texts *t)
{
    model_run *mr = &r->model;
    const llm_result *res = &g->res;
    if (!g->asked || !g->finished)
        return 0;
    if (res->status != LLM_OK) {
        mr->rejected++;
        add_error(mr, r->l.m, g, llm_status_name(res->status), res->reason);
        return 0;
    }
    msgpack_unpacked up;
    msgpack_unpacked_init(&up);
    size_t off = 0;
    char why[200] = "";
    const msgpack_object *ds = NULL;
    if (msgpack_unpack_next(&up, res->value, res->value_len, &off) == MSGPACK_UNPACK_SUCCESS)
        ds = map_get(&up.data, "decisions");
    if (!ds || ds->type != MSGPACK_OBJECT_ARRAY)
        snprintf(why, sizeof(why), "the answer has no list of decisions");
    answer *ans = ds ? calloc(ds->via.array.size + 1, sizeof(*ans)) : NULL;
    if (ds && !ans) {
        msgpack_unpacked_destroy(&up);
        return -ENOMEM;
    }
    for (uint32_t i = 0; ds && i < ds->via.array.size && !why[0]; i++)
        check_one(r, g, &ds->via.array.ptr[i], &ans[i], why, sizeof(why));
    int rc = 0;
    if (why[0]) {
        mr->rejected++;
        add_error(mr, r->l.m, g, "invalid", why);
    } else {
        mr->judged++;
        g->judged = true;
        for (uint32_t i = 0; i < ds->via.array.size && rc == 0; i++)
            rc = plan_one(r, g, &ans[i], t);
    }
    free(ans);
    msgpack_unpacked_destroy(&up);
    return rc;
}

/* ---- the plan ------------------------------------------------------------------------------ */

/* Reads the tenant's model state and decides whether the model may be asked: sets mr->model,
 * cap and tokens_today, or mr->status and reason when not. Returns 0 or -EIO (err). */
static int model_state(run *r, char *err, size_t errlen)
{
    model_run *mr = &r->model;
    mcall m;
    if (mcall_open(&m, r->s, r->pg, r->tenant, err, errlen) < 0)
        return -EIO;
    mr->tokens_today = m.tokens_today;
    mr->cap = m.cap;
    snprintf(mr->model, sizeof(mr->model), "%s", m.model);
    if (m.status) {
        bool cap = strcmp(m.status, "cap_reached") == 0;
        mr->status = cap ? "cap_reached" : "off";
        size_t n = strlen(m.reason);
        if (n >= sizeof(mr->reason))
            n = sizeof(mr->reason) - 1;
        memcpy(mr->reason, m.reason, n);
        mr->reason[n] = '\0';
        if (cap && n + 40 < sizeof(mr->reason))
            strcat(mr->reason, ": consolidated without the model");
    }
    return 0;
}

/* The literals of the pairs to remember: every candidate pair of a group whose answer was
 * taken, both memories still live after its decisions (a pair the model named distinct,
 * contradicting, or did not name). Returns 0 or -ENOMEM. */
static int remember(run *r, const group *g, size_t ng, lit L[4])
{
    model_run *mr = &r->model;
    const cmem *m = r->l.m;
    uint32_t *gid = malloc((r->l.n + 1) * sizeof(*gid));
    if (!gid)
        return -ENOMEM;
    for (size_t i = 0; i < r->l.n; i++)
        gid[i] = UINT32_MAX;
    for (size_t k = 0; k < ng; k++)
        for (size_t i = 0; g[k].judged && i < g[k].n; i++)
            gid[g[k].idx[i]] = (uint32_t)k;
    int rc = 0;
    for (size_t p = 0; p < mr->npairs && rc == 0; p++) {
        uint32_t a = mr->pairs[p].a, b = mr->pairs[p].b;
        if (gid[a] == UINT32_MAX || gid[a] != gid[b] || m[a].fate != 0 || m[b].fate != 0)
            continue;
        const cmem *x = m[a].id < m[b].id ? &m[a] : &m[b], *y = x == &m[a] ? &m[b] : &m[a];
        if (lit_i64(&L[0], x->id) < 0 || lit_i64(&L[1], y->id) < 0 ||
            lit_i64(&L[2], (int64_t)text_hash(x)) < 0 || lit_i64(&L[3], (int64_t)text_hash(y)) < 0)
            rc = -ENOMEM;
        mr->newly_judged++;
    }
    free(gid);
    return rc;
}

/* Counts the run's model calls against the tenant's day and remembers the pairs judged, in
 * one transaction. Returns 0, -ENOMEM or -EIO (err). */
static int record_calls(run *r, const group *g, size_t ng, char *err, size_t errlen)
{
    model_run *mr = &r->model;
    mcall m = {.tenant = r->tenant,
               .pending_calls = mr->calls,
               .pending_in = mr->tokens_in,
               .pending_out = mr->tokens_out,
               .pending_cost = mr->cost_usd};
    lit L[4];
    memset(L, 0, sizeof(L));
    int rc = remember(r, g, ng, L);
    if (rc < 0) {
        snprintf(err, errlen, "out of memory");
        goto out;
    }
    rc = pgsync_tenant_begin(r->pg, r->tenant, PGSYNC_TX_WRITE, err, errlen);
    if (rc < 0) {
        rc = -EIO;
        goto out;
    }
    bool ok = mcall_record(&m, r->pg, false, err, errlen) == 0;
    if (ok && L[0].n > 0) {
        const char *jv[] = {r->tid, lit_end(&L[0]), lit_end(&L[1]), lit_end(&L[2]), lit_end(&L[3])};
        PGresult *res = PGSYNC_EXEC(r->pg, sqlb_def(SQLB_JUDGED_PUT), jv, err, errlen);
        ok = res != NULL;
        PQclear(res);
    }
    rc = pgsync_tx_end(r->pg, ok, err, errlen);
    rc = rc < 0 || !ok ? -EIO : 0;
out:
    for (int k = 0; k < 4; k++)
        ubuf_fini(&L[k].b);
    return rc;
}

int consolidate_model_plan(run *r, bg_ctx *ctx)
{
    model_run *mr = &r->model;
    char err[300];
    if (!chat_available())
        return 0; /* settings.model stays null */
    if (r->cfg->consolidate_model_max_groups == 0) {
        mr->status = "off";
        snprintf(mr->reason, sizeof(mr->reason), "consolidate_model_max_groups is 0");
        return 0;
    }
    if (model_state(r, err, sizeof(err)) < 0) {
        set_err(r->out, "reading the model state: %s", err);
        return -EIO;
    }
    if (mr->status)
        return 0;
    pthread_once(&schema_once, schema_make);
    if (!schema) {
        mr->status = "failed";
        snprintf(mr->reason, sizeof(mr->reason), "the answer schema: %s", schema_err);
        return 0;
    }
    int rc = 0;
    idmap *memo = memo_read(r, &rc, err, sizeof(err));
    if (!memo) {
        set_err(r->out, "reading the pairs judged before: %s", err);
        return rc;
    }
    group *g = NULL;
    long ng = make_groups(r, memo, &g);
    idmap_destroy(memo);
    if (ng < 0) {
        set_err(r->out, "%s", "out of memory");
        return -ENOMEM;
    }
    size_t asked = (size_t)ng;
    if (asked > (size_t)r->cfg->consolidate_model_max_groups) {
        mr->unasked = (int)(asked - (size_t)r->cfg->consolidate_model_max_groups);
        asked = (size_t)r->cfg->consolidate_model_max_groups;
    }
    mr->groups = (int)asked;
    texts t = {0};
    llm_provider *p = NULL;
    if (asked == 0) {
        mr->status = "no_candidates";
    } else if (read_texts(r, g, asked, &t, err, sizeof(err)) < 0) {
        set_err(r->out, "reading the candidates' texts: %s", err);
        rc = -EIO;
    } else if (!(p = chat_provider(mr->model, err, sizeof(err)))) {
        mr->status = "failed";
        snprintf(mr->reason, sizeof(mr->reason), "%s", err);
    } else {
        /* a memory deleted or archived since the snapshot leaves its group */
        for (size_t k = 0; k < asked; k++) {
            size_t w = 0;
            for (size_t i = 0; i < g[k].n; i++)
                if (text_of(&t, r->l.m[g[k].idx[i]].id))
                    g[k].idx[w++] = g[k].idx[i];
            g[k].n = w;
            if (w < 2)
                mr->groups--;
        }
        rc = ask(r, p, g, asked, &t);
        for (size_t k = 0; k < asked && rc == 0; k++)
            if (g[k].n >= 2)
                rc = take_answer(r, &g[k], &t);
        if (rc < 0)
            set_err(r->out, "%s", "out of memory");
        else if (mr->calls > 0 && (rc = record_calls(r, g, asked, err, sizeof(err))) < 0)
            set_err(r->out, "counting the model's tokens: %s", err);
        mr->status = mr->judged == mr->groups ? "used" : mr->judged > 0 ? "partial" : "failed";
        if (mr->judged == 0)
            chat_count_fallback(CHAT_FB_UNAVAILABLE);
    }
    texts_fini(&t);
    groups_free(g, (size_t)ng);
    (void)ctx;
    return rc;
}

/* ---- applying the decisions ----------------------------------------------------------------- */

enum { A_KIND, A_KEEP, A_KEEP_SEQ, A_OTHER, A_OTHER_SEQ, A_TEXT, A_WHY, A__COUNT };

int consolidate_model_apply(run *r)
{
    model_run *mr = &r->model;
    const cmem *m = r->l.m;
    ubuf own = {0}; /* "{id,...}": what earlier steps changed, accepted by later guards */
    bool ok = ubuf_puts(&own, "{}") == 0;
    char err[300];
    for (size_t at = 0; ok && at < mr->ndec && r->out->status >= 0;) {
        lit S[A__COUNT];
        memset(S, 0, sizeof(S));
        size_t end = at + CONSOLIDATE_STEP / 2 < mr->ndec ? at + CONSOLIDATE_STEP / 2 : mr->ndec;
        for (size_t k = at; k < end && ok; k++) {
            const mdec *d = &mr->dec[k];
            ok = lit_str(&S[A_KIND], relation_names[d->kind]) == 0 &&
                 lit_i64(&S[A_KEEP], m[d->keep].id) == 0 &&
                 lit_i64(&S[A_KEEP_SEQ], m[d->keep].seq) == 0 &&
                 lit_i64(&S[A_OTHER], m[d->other].id) == 0 &&
                 lit_i64(&S[A_OTHER_SEQ], m[d->other].seq) == 0 &&
                 (d->text ? lit_str(&S[A_TEXT], d->text) : lit_null(&S[A_TEXT])) == 0 &&
                 lit_str(&S[A_WHY], d->why) == 0;
        }
        at = end;
        const char *vals[3 + A__COUNT] = {r->tid, own.data};
        for (int k = 0; k < A__COUNT; k++)
            vals[2 + k] = lit_end(&S[k]);
        vals[2 + A__COUNT] = mr->model;
        int rc =
            ok ? pgsync_tenant_begin(r->pg, r->tenant, PGSYNC_TX_WRITE, err, sizeof(err)) : -ENOMEM;
        PGresult *res = rc == 0 ? PGSYNC_EXEC(r->pg, sqlb_def(SQLB_CONSOLIDATE_MODEL_APPLY), vals,
                                              err, sizeof(err))
                                : NULL;
        if (rc == 0) {
            rc = pgsync_tx_end(r->pg, res != NULL, err, sizeof(err));
            if (rc == 0 && !res)
                rc = -EIO;
        }
        if (rc == 0) {
            for (int k = 0; k < 5; k++)
                mr->applied[k] += (int)memrow_i64(res, 0, k, 0);
            const char *ch = PQgetvalue(res, 0, 5); /* "{1,2}" or "{}" */
            size_t chl = strlen(ch);
            if (chl > 2) {
                ubuf_truncate(&own, own.len - 1);
                ok = (own.len <= 1 || ubuf_putc(&own, ',') == 0) &&
                     ubuf_append(&own, ch + 1, chl - 1) == 0;
            }
        }
        PQclear(res);
        for (int k = 0; k < A__COUNT; k++)
            ubuf_fini(&S[k].b);
        if (rc < 0) {
            set_err(r->out, "applying the model's decisions: %s", ok ? err : "out of memory");
            break;
        }
    }
    ubuf_fini(&own);
    if (!ok && r->out->status >= 0)
        set_err(r->out, "%s", "out of memory");
    r->out->merged += mr->applied[0];
    r->out->superseded += mr->applied[1];
    r->out->flagged += mr->applied[2];
    r->out->skipped += mr->applied[4];
    return r->out->status < 0 ? -EIO : 0;
}

/* ---- the record ----------------------------------------------------------------------------- */

int consolidate_model_record(const run *r, ubuf *b)
{
    const model_run *mr = &r->model;
    if (!mr->status)
        return ubuf_puts(b, ", \"model\": null");
    int rc = ubuf_puts(b, ", \"model\": {\"status\": ");
    rc = rc < 0 ? rc : prompts_json_cstr(b, mr->status);
    rc = rc < 0 ? rc : ubuf_puts(b, ", \"reason\": ");
    rc = rc < 0 ? rc : mr->reason[0] ? prompts_json_cstr(b, mr->reason) : ubuf_puts(b, "null");
    rc = rc < 0 ? rc : ubuf_puts(b, ", \"model\": ");
    rc = rc < 0 ? rc : prompts_json_cstr(b, mr->model);
    rc = rc < 0 ? rc
                : ubuf_printf(b,
                              ", \"floor\": %g, \"groups\": %d, \"judged\": %d, \"rejected\": %d, "
                              "\"unasked\": %d, \"remembered\": %d, \"newly_judged\": %d, "
                              "\"calls\": %d, \"tokens_in\": %llu, "
                              "\"tokens_out\": %llu, \"cost_usd\": %.17g, \"tokens_today\": %lld, "
                              "\"cap\": ",
                              (double)mr->floor, mr->groups, mr->judged, mr->rejected, mr->unasked,
                              mr->remembered, mr->newly_judged, mr->calls,
                              (unsigned long long)mr->tokens_in, (unsigned long long)mr->tokens_out,
                              mr->cost_usd, (long long)mr->tokens_today);
    if (rc >= 0 && mr->cap > 0)
        rc = ubuf_printf(b, "%lld", (long long)mr->cap);
    else if (rc >= 0)
        rc = ubuf_puts(b, "null");
    rc = rc < 0 ? rc
                : ubuf_printf(b,
                              ", \"decisions\": {\"same\": %d, \"newer\": %d, \"distinct\": %d, "
                              "\"contradiction\": %d}, \"applied\": {\"merged\": %d, "
                              "\"superseded\": %d, \"flagged\": %d, \"rewritten\": %d, "
                              "\"skipped\": %d}, \"errors\": [",
                              mr->by_relation[MDEC_SAME], mr->by_relation[MDEC_NEWER],
                              mr->by_relation[MDEC_DISTINCT], mr->by_relation[MDEC_CONTRADICTION],
                              mr->applied[0], mr->applied[1], mr->applied[2], mr->applied[3],
                              mr->applied[4]);
    if (rc >= 0 && mr->errors.len)
        rc = ubuf_append(b, mr->errors.data, mr->errors.len);
    rc = rc < 0 ? rc : ubuf_puts(b, "], \"log\": [");
    if (rc >= 0 && mr->log.len)
        rc = ubuf_append(b, mr->log.data, mr->log.len);
    rc = rc < 0 ? rc : ubuf_puts(b, "]}");
    return rc < 0 ? -ENOMEM : 0;
}
