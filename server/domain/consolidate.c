/* server/domain/consolidate.c: consolidation runs and their scheduler (see consolidate.h). */
#include "consolidate.h"
#include "consolidate_int.h"
#include "chat.h"

#include <errno.h>
#include <pthread.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "db.h"
#include "pgsync.h"
#include "dedupe.h"
#include "loader.h"
#include "log.h"
#include "memrow.h"
#include "metrics.h"
#include "score.h"
#include "sql_bg.h"
#include "textrule.h"
#include "tiers.h"
#include "ubuf.h"
#include "xxh64.h"

/* Advisory lock keys: one per tenant, in a range of their own. */
#define LOCK_BASE (1LL << 60)

/* The next element of a JSON array's text at *p (before end): its bytes in *e, *en, with
 * surrounding spaces trimmed; *p moves past it and its comma. Returns false at the end. */
static bool json_elem(const char **p, const char *end, const char **e, size_t *en)
{
    const char *q = *p;
    while (q < end && (*q == ' ' || *q == '\n' || *q == '\t' || *q == ','))
        q++;
    if (q >= end || *q == ']')
        return false;
    const char *start = q;
    int depth = 0;
    bool str = false;
    for (; q < end; q++) {
        if (str) {
            if (*q == '\\' && q + 1 < end)
                q++;
            else if (*q == '"')
                str = false;
        } else if (*q == '"') {
            str = true;
        } else if (*q == '[' || *q == '{') {
            depth++;
        } else if (*q == ']' || *q == '}') {
            if (depth == 0)
                break;
            depth--;
        } else if (*q == ',' && depth == 0) {
            break;
        }
    }
    const char *stop = q;
    while (stop > start && (stop[-1] == ' ' || stop[-1] == '\n' || stop[-1] == '\t'))
        stop--;
    *e = start;
    *en = (size_t)(stop - start);
    *p = q;
    return true;
}

/* A hash of a JSON value's text, 0 for null, an empty list or object, or no value. */
static uint64_t json_hash(const char *e, size_t en)
{
    if (!e || en == 0 || (en == 4 && !memcmp(e, "null", 4)) || (en == 2 && e[0] == '[') ||
        (en == 2 && e[0] == '{'))
        return 0;
    return xxh64(e, en, 0x6d657461) | 1;
}

/* Reads the metadata the text rules must not contradict: tag_json is the loader's array
 * [tokens, chains, protocols, strategy_id], attrs_json metadata.attrs (NULL: absent).
 * PostgreSQL prints jsonb in one canonical form, so equal values have equal text. */
static void meta_read(cmeta *mt, const char *tag_json, size_t len, const char *attrs_json)
{
    memset(mt, 0, sizeof(*mt));
    mt->attrs = attrs_json ? json_hash(attrs_json, strlen(attrs_json)) : 0;
    if (!tag_json || len < 2 || tag_json[0] != '[')
        return;
    const char *p = tag_json + 1, *end = tag_json + len, *e;
    size_t en;
    for (int k = 0; k < 4 && json_elem(&p, end, &e, &en); k++) {
        if (k == 3) {
            mt->strategy = json_hash(e, en);
        } else if (en > 2 && e[0] == '[') {
            const char *q = e + 1, *qe = e + en, *x;
            size_t xn;
            while (mt->nlist[k] < META_LIST && json_elem(&q, qe, &x, &xn))
                mt->list[k][mt->nlist[k]++] = (uint32_t)json_hash(x, xn) | 1u;
        }
    }
}

/* True when the lists a and b (na, nb elements) share an element. */
static bool lists_meet(const uint32_t *a, uint8_t na, const uint32_t *b, uint8_t nb)
{
    for (uint8_t i = 0; i < na; i++)
        for (uint8_t j = 0; j < nb; j++)
            if (a[i] == b[j])
                return true;
    return false;
}

/* True when neither metadata contradicts the other: attrs and strategy_id equal where both
 * have one, and each list empty on one side or sharing an element ("ETH" and "USDC" tokens
 * are about different assets). */
static bool meta_agree(const cmeta *a, const cmeta *b)
{
    if ((a->attrs && b->attrs && a->attrs != b->attrs) ||
        (a->strategy && b->strategy && a->strategy != b->strategy))
        return false;
    for (int k = 0; k < 3; k++)
        if (a->nlist[k] && b->nlist[k] &&
            !lists_meet(a->list[k], a->nlist[k], b->list[k], b->nlist[k]))
            return false;
    return true;
}

/* Folds m into a cluster's summary s (what every member agrees with): the first attrs and
 * strategy_id seen, and the intersection of the lists. Called only when meta_agree(s, m). */
static void meta_fold(cmeta *s, const cmeta *m)
{
    if (!s->attrs)
        s->attrs = m->attrs;
    if (!s->strategy)
        s->strategy = m->strategy;
    for (int k = 0; k < 3; k++) {
        if (!m->nlist[k])
            continue;
        if (!s->nlist[k]) {
            memcpy(s->list[k], m->list[k], sizeof(s->list[k]));
            s->nlist[k] = m->nlist[k];
            continue;
        }
        uint8_t n = 0;
        for (uint8_t i = 0; i < s->nlist[k]; i++)
            if (lists_meet(&s->list[k][i], 1, m->list[k], m->nlist[k]))
                s->list[k][n++] = s->list[k][i];
        s->nlist[k] = n;
    }
}

static int take_row(const loader_row *row, void *arg)
{
    loaded *l = arg;
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 1024;
        cmem *m = realloc(l->m, cap * sizeof(*m));
        if (!m)
            return -ENOMEM;
        l->m = m;
        float *v = realloc(l->vecs, cap * l->dim * sizeof(float));
        if (!v)
            return -ENOMEM;
        l->vecs = v;
        l->cap = cap;
    }
    cmem *m = &l->m[l->n];
    memset(m, 0, sizeof(*m));
    m->id = (int64_t)row->meta.id;
    m->seq = (int64_t)row->meta.seq;
    m->type = row->meta.type;
    m->scope = row->meta.scope;
    m->owner = row->meta.scope == SCOPE_AGENT   ? row->meta.agent_id
               : row->meta.scope == SCOPE_CLADE ? row->meta.clade_id
                                                : 0;
    m->importance = row->meta.importance;
    m->access = row->meta.access_count;
    m->created_ms = row->meta.created_ms;
    m->cited = row->meta.cited_count > UINT32_MAX ? UINT32_MAX : (uint32_t)row->meta.cited_count;
    m->injected =
        row->meta.injected_count > UINT32_MAX ? UINT32_MAX : (uint32_t)row->meta.injected_count;
    m->pinned = row->meta.pinned;
    m->attrs_key = row->attrs_key ? strdup(row->attrs_key) : NULL;
    if ((row->attrs_key && !m->attrs_key) ||
        textrule_sign(row->content, row->content_len, &m->sig) < 0) {
        free(m->attrs_key); /* not counted in l->n: run_fini would not free it */
        return -ENOMEM;
    }
    meta_read(&m->meta, row->meta.tags, row->meta.tags_len, row->attrs_json);
    m->parent = (uint32_t)l->n;
    float *v = l->vecs + l->n * l->dim;
    double norm = 0;
    for (size_t k = 0; k < l->dim; k++)
        norm += (double)row->vec[k] * row->vec[k];
    norm = norm > 0 ? sqrt(norm) : 1;
    for (size_t k = 0; k < l->dim; k++)
        v[k] = (float)(row->vec[k] / norm);
    l->n++;
    return 0;
}

static uint32_t find(cmem *m, uint32_t i)
{
    while (m[i].parent != i) {
        m[i].parent = m[m[i].parent].parent;
        i = m[i].parent;
    }
    return i;
}

/* The memories that share a type and a visibility are compared with each other only:
 * sorted by that, then by id. qsort has no context argument; runs are planned one at a
 * time (plan_mu). */
static pthread_mutex_t plan_mu = PTHREAD_MUTEX_INITIALIZER;
static const cmem *sort_base;

static int cmp_idx(const void *x, const void *y)
{
    const cmem *a = &sort_base[*(const uint32_t *)x], *b = &sort_base[*(const uint32_t *)y];
    if (a->type != b->type)
        return a->type < b->type ? -1 : 1;
    if (a->scope != b->scope)
        return a->scope < b->scope ? -1 : 1;
    if (a->owner != b->owner)
        return a->owner < b->owner ? -1 : 1;
    return a->id < b->id ? -1 : a->id > b->id;
}

static bool same_group(const cmem *a, const cmem *b)
{
    return a->type == b->type && a->scope == b->scope && a->owner == b->owner;
}

/* Records a failed run (its changes were rolled back) in a transaction of its own. */
static void record_failure(PGconn *pg, int64_t tenant, const char *trigger, int64_t started,
                           const char *error)
{
    char err[256], st[24], tid[24];
    snprintf(st, sizeof(st), "%lld", (long long)started);
    snprintf(tid, sizeof(tid), "%lld", (long long)tenant);
    const char *fv[] = {tid, trigger, st, error};
    if (pgsync_tenant_begin(pg, tenant, PGSYNC_TX_WRITE, err, sizeof(err)) < 0) {
        log_warn("recording a failed consolidation: %s", err);
        return;
    }
    PGresult *r = PGSYNC_EXEC(pg, sqlb_def(SQLB_CONSOLIDATE_FAILED), fv, err, sizeof(err));
    bool ok = r != NULL;
    PQclear(r);
    if (pgsync_tx_end(pg, ok, err, sizeof(err)) < 0 || !ok)
        log_warn("recording a failed consolidation: %s", err);
}

static void run_fini(run *r)
{
    for (size_t k = 0; k < r->l.n; k++)
        free(r->l.m[k].attrs_key);
    free(r->l.m);
    free(r->l.vecs);
    free(r->cands);
    free(r->imp);
    free(r->acc);
    free(r->members);
    free(r->mseqs);
    free(r->mcos);
    free(r->first);
    consolidate_model_fini(r);
}

static int add_cand(run *r, uint32_t a, uint32_t b, int rule)
{
    if (r->ncand == r->ccand) {
        size_t cap = r->ccand ? r->ccand * 2 : 256;
        cand *c = realloc(r->cands, cap * sizeof(*c));
        if (!c)
            return -ENOMEM;
        r->cands = c;
        r->ccand = cap;
    }
    r->cands[r->ncand++] = (cand){a, b, rule};
    return 0;
}

/* Step 1, read: the tenant's live memories, as of one snapshot. */
static int step_read(run *r)
{
    char err[300];
    if (loader_live(r->pg, r->tenant, r->l.dim, &r->seq, take_row, &r->l, err, sizeof(err)) < 0) {
        set_err(r->out, "reading memories: %s", err);
        return -EIO;
    }
    return 0;
}

/* A memory of a group in an order of the text rules: sorted by a key (two hashes, or
 * attrs.key), then newest first, then by id. */
typedef struct ord {
    uint64_t h0, h1;
    const char *key;
    int64_t created_ms, id;
    uint32_t idx;
} ord;

static int cmp_ord(const void *x, const void *y)
{
    const ord *a = x, *b = y;
    if (a->key || b->key) {
        int c = strcmp(a->key ? a->key : "", b->key ? b->key : "");
        if (c)
            return c;
    }
    if (a->h0 != b->h0)
        return a->h0 < b->h0 ? -1 : 1;
    if (a->h1 != b->h1)
        return a->h1 < b->h1 ? -1 : 1;
    if (a->created_ms != b->created_ms)
        return a->created_ms > b->created_ms ? -1 : 1;
    return a->id > b->id ? -1 : a->id < b->id;
}

static float dot(const float *a, const float *b, size_t dim)
{
    double d = 0;
    for (size_t k = 0; k < dim; k++)
        d += (double)a[k] * b[k];
    return (float)d;
}

/* A cluster of one text being formed: its first member (the union-find root) and what all
 * its members agree with. */
typedef struct tclu {
    uint32_t root;
    cmeta sum;
} tclu;

/* The same text: memories whose normalized texts are equal (o[0..n), one run of equal text
 * hashes, oldest id first) join one cluster, each the first whose members all agree with
 * its metadata, or a new one (among the first 64 clusters, so that a text stored thousands
 * of times with as many metadata stays linear). */
static int same_text_run(run *r, const ord *o, size_t n, tclu **cl, size_t *ccap)
{
    cmem *m = r->l.m;
    size_t nc = 0;
    for (size_t k = 0; k < n; k++) {
        cmem *mk = &m[o[k].idx];
        size_t c = 0;
        while (c < nc && c < 64 && !meta_agree(&(*cl)[c].sum, &mk->meta))
            c++;
        if (c == nc || c == 64) { /* past 64 clusters of one text: left alone */
            if (nc == *ccap) {
                size_t cap = *ccap ? *ccap * 2 : 16;
                tclu *t = realloc(*cl, cap * sizeof(*t));
                if (!t)
                    return -ENOMEM;
                *cl = t;
                *ccap = cap;
            }
            (*cl)[nc++] = (tclu){.root = o[k].idx, .sum = mk->meta};
            continue;
        }
        meta_fold(&(*cl)[c].sum, &mk->meta);
        mk->parent = (*cl)[c].root; /* roots are never re-parented: one level */
        r->rules.same_text++;
    }
    return 0;
}

/* Step 2, pairs: within each group (type, scope, owner),
 *  - merges: memories of the same text (textrule.h) whose metadata agree join one cluster
 *    (union-find in l.m[].parent), whatever their cosine;
 *  - updates of facts and preferences: a memory and the newest memory of its group with the
 *    same attrs.key (RULE_KEY), or the newest with the same text but for quantities whose
 *    metadata agree (RULE_VALUES), become supersession candidates;
 *  - the pairs that a cosine alone would have merged or superseded before (at
 *    consolidate_dedupe_threshold, and for facts and preferences at
 *    consolidate_supersede_threshold) and no rule relates are counted, not acted on.
 * Time: a sort per group and the similarity search; memory: a few arrays of n. */
/* Same-text runs of one group (idx: gn memories of one type and visibility): merge
 * candidates. o is scratch of gn entries. Returns 0 or -ENOMEM. */
static int pairs_same_text(run *r, const uint32_t *idx, size_t gn, ord *o, tclu **cl, size_t *ccap)
{
    const cmem *m = r->l.m;
    /* runs of equal text hashes, oldest id first */
    for (size_t k = 0; k < gn; k++) {
        const cmem *mk = &m[idx[k]];
        o[k] = (ord){.h0 = mk->sig.text[0], .h1 = mk->sig.text[1], .id = -mk->id, .idx = idx[k]};
    }
    qsort(o, gn, sizeof(*o), cmp_ord);
    for (size_t a = 0, b; a < gn; a = b) {
        for (b = a + 1; b < gn && o[b].h0 == o[a].h0 && o[b].h1 == o[a].h1; b++)
            ;
        if (b - a > 1 && same_text_run(r, o + a, b - a, cl, ccap) < 0)
            return -ENOMEM;
    }
    return 0;
}

/* The same attrs.key in one group of facts or preferences: each older memory and the newest
 * (first: where both rules relate two memories, the client's key is the reason recorded).
 * Returns 0 or -ENOMEM. */
static int pairs_same_key(run *r, const uint32_t *idx, size_t gn, ord *o)
{
    const cmem *m = r->l.m;
    size_t no = 0;
    for (size_t k = 0; k < gn; k++) {
        const cmem *mk = &m[idx[k]];
        if (mk->attrs_key)
            o[no++] = (ord){
                .key = mk->attrs_key, .created_ms = mk->created_ms, .id = mk->id, .idx = idx[k]};
    }
    qsort(o, no, sizeof(*o), cmp_ord);
    for (size_t a = 0, b; a < no; a = b) {
        for (b = a + 1; b < no && !strcmp(o[b].key, o[a].key); b++)
            if (add_cand(r, o[b].idx, o[a].idx, RULE_KEY) < 0)
                return -ENOMEM;
    }
    return 0;
}

/* The same text but for quantities in one group of facts or preferences: each older memory
 * and the newest of its run that has other values and agreeing metadata (the first 64 newer
 * ones are looked at). Returns 0 or -ENOMEM. */
static int pairs_values(run *r, const uint32_t *idx, size_t gn, ord *o)
{
    const cmem *m = r->l.m;
    size_t no = 0;
    for (size_t k = 0; k < gn; k++) {
        const cmem *mk = &m[idx[k]];
        if (mk->sig.nquant > 0)
            o[no++] = (ord){.h0 = mk->sig.subject[0],
                            .h1 = mk->sig.subject[1],
                            .created_ms = mk->created_ms,
                            .id = mk->id,
                            .idx = idx[k]};
    }
    qsort(o, no, sizeof(*o), cmp_ord);
    for (size_t a = 0, b; a < no; a = b) {
        for (b = a + 1; b < no && o[b].h0 == o[a].h0 && o[b].h1 == o[a].h1; b++)
            ;
        for (size_t x = a + 1; x < b; x++) {
            const cmem *old = &m[o[x].idx];
            for (size_t y = a; y < x && y < a + 64; y++) {
                const cmem *nw = &m[o[y].idx];
                if (!textrule_values(&old->sig, &nw->sig) || !meta_agree(&old->meta, &nw->meta))
                    continue;
                if (add_cand(r, o[x].idx, o[y].idx, RULE_VALUES) < 0)
                    return -ENOMEM;
                break;
            }
        }
    }
    return 0;
}

/* Near pairs of one group by cosine: what a cosine alone would have archived is counted, and
 * with a model the pairs above its floor become its candidates. gv is scratch of gn vectors.
 * Returns 0, -ENOMEM, or -EIO with r->out's error set. */
static int pairs_near(run *r, const uint32_t *idx, size_t gn, bool updatable, float *gv)
{
    const cmem *m = r->l.m;
    size_t dim = r->l.dim;
    float tdup = (float)r->cfg->consolidate_dedupe_threshold;
    float tsup = (float)r->cfg->consolidate_supersede_threshold;
    dedupe_opts dopts = {.exact_max = (size_t)r->cfg->consolidate_exact_max,
                         .threads = (unsigned)r->cfg->consolidate_threads};
    float thr = updatable && tsup < tdup ? tsup : tdup;
    if (r->model.wanted && r->model.floor < thr)
        thr = r->model.floor;
    for (size_t k = 0; k < gn; k++)
        memcpy(gv + k * dim, r->l.vecs + (size_t)idx[k] * dim, dim * sizeof(float));
    dedupe_pair *pairs = NULL;
    size_t np = 0;
    char err[300];
    if (dedupe_pairs(gv, gn, dim, thr, &dopts, &pairs, &np, err, sizeof(err)) < 0) {
        set_err(r->out, "similarity search: %s", err);
        return -EIO;
    }
    int rc = 0;
    for (size_t p = 0; p < np && rc == 0; p++) {
        const cmem *a = &m[idx[pairs[p].i]], *b = &m[idx[pairs[p].j]];
        bool agree = meta_agree(&a->meta, &b->meta);
        bool key = a->attrs_key && b->attrs_key && !strcmp(a->attrs_key, b->attrs_key);
        if ((agree && textrule_same(&a->sig, &b->sig)) ||
            (updatable && (key || (agree && textrule_values(&a->sig, &b->sig)))))
            continue;
        if (pairs[p].sim >= tdup)
            r->rules.near_kept++;
        else if (updatable && pairs[p].sim >= tsup)
            r->rules.similar_kept++;
        if (r->model.wanted && pairs[p].sim >= r->model.floor &&
            consolidate_model_pair(r, idx[pairs[p].i], idx[pairs[p].j], pairs[p].sim) < 0)
            rc = -ENOMEM;
    }
    free(pairs);
    return rc;
}

static int step_pairs(run *r)
{
    size_t n = r->l.n, dim = r->l.dim;
    cmem *m = r->l.m;
    int rc = -ENOMEM;
    tclu *cl = NULL;
    size_t ccap = 0;
    uint32_t *order = malloc((n + 1) * sizeof(*order));
    float *gv = malloc((n + 1) * dim * sizeof(float));
    ord *o = malloc((n + 1) * sizeof(*o));
    if (!order || !gv || !o)
        goto out;
    for (size_t i = 0; i < n; i++)
        order[i] = (uint32_t)i;
    pthread_mutex_lock(&plan_mu);
    sort_base = m;
    qsort(order, n, sizeof(*order), cmp_idx);
    pthread_mutex_unlock(&plan_mu);
    rc = 0;
    for (size_t g0 = 0, g1; g0 < n && rc == 0; g0 = g1) {
        for (g1 = g0 + 1; g1 < n && same_group(&m[order[g0]], &m[order[g1]]); g1++)
            ;
        size_t gn = g1 - g0;
        int type = m[order[g0]].type;
        bool updatable = type == MEM_FACT || type == MEM_PREFERENCE;
        if (gn < 2)
            continue;
        rc = pairs_same_text(r, order + g0, gn, o, &cl, &ccap);
        if (rc == 0 && updatable)
            rc = pairs_same_key(r, order + g0, gn, o);
        if (rc == 0 && updatable)
            rc = pairs_values(r, order + g0, gn, o);
        if (rc == 0)
            rc = pairs_near(r, order + g0, gn, updatable, gv);
    }
out:
    if (rc == -ENOMEM)
        set_err(r->out, "%s", "out of memory");
    free(order);
    free(gv);
    free(o);
    free(cl);
    return rc;
}

/* Step 3, plan: each memory's fate. Every cluster's best memory survives and absorbs the
 * others (merged importance: the highest; access counts: the sum); supersessions between
 * what is still live (the older goes, pointing at its newest related memory); prunes of low
 * composite, old enough, neither a constraint nor pinned. Then each survivor's members, in
 * id order, for the apply step. */
/* Merges: every cluster's survivor (best[root], scratch of n) absorbs the others, and takes
 * their highest importance and summed accesses (r->imp, r->acc). */
static void plan_merges(run *r, uint32_t *best)
{
    size_t n = r->l.n;
    cmem *m = r->l.m;
    /* merges: every cluster's survivor absorbs the others */
    for (size_t i = 0; i < n; i++)
        best[i] = UINT32_MAX;
    for (size_t i = 0; i < n; i++) {
        uint32_t root = find(m, (uint32_t)i);
        if (best[root] == UINT32_MAX || better(&m[i], &m[best[root]]))
            best[root] = (uint32_t)i;
    }
    for (size_t i = 0; i < n; i++)
        m[i].late = (uint32_t)i;
    for (size_t i = 0; i < n; i++) {
        uint32_t surv = best[find(m, (uint32_t)i)];
        if (surv != i) {
            m[i].fate = 1;
            m[i].into = surv;
            m[i].cos = dot(r->l.vecs + i * r->l.dim, r->l.vecs + (size_t)surv * r->l.dim, r->l.dim);
            if (newer(&m[i], &m[m[surv].late]))
                m[surv].late = (uint32_t)i;
        }
    }
    /* the survivors' merged values, for the prune decision below */
    for (size_t i = 0; i < n; i++) {
        r->imp[i] = m[i].importance;
        r->acc[i] = m[i].access;
    }
    for (size_t i = 0; i < n; i++) {
        if (m[i].fate != 1)
            continue;
        uint32_t sv = m[i].into;
        if (m[i].importance > r->imp[sv])
            r->imp[sv] = m[i].importance;
        r->acc[sv] += m[i].access;
    }
}

/* Supersessions between what is still live, from the candidates. Returns 0 or -ENOMEM. */
static int plan_supersessions(run *r)
{
    size_t n = r->l.n;
    cmem *m = r->l.m;
    /* what all members of each cluster agree with (meta_fold): two clusters whose summaries
     * agree have no two members that contradict each other */
    cmeta *sum = malloc((n + 1) * sizeof(*sum));
    if (!sum)
        return -ENOMEM;
    for (size_t i = 0; i < n; i++)
        sum[i] = m[i].meta;
    for (size_t i = 0; i < n; i++)
        if (m[i].fate == 1)
            meta_fold(&sum[m[i].into], &m[i].meta);
    /* supersessions between what is still live: the older goes, pointing at its newest
     * related memory (a merged-away memory stands for its survivor) */
    for (size_t c = 0; c < r->ncand; c++) {
        uint32_t a = r->cands[c].a, b = r->cands[c].b;
        if (m[a].fate == 1)
            a = m[a].into;
        if (m[b].fate == 1)
            b = m[b].into;
        if (a == b || (r->cands[c].rule == RULE_VALUES && !meta_agree(&sum[a], &sum[b])))
            continue;
        /* a cluster is as new as its newest member */
        uint32_t older = newer(&m[m[a].late], &m[m[b].late]) ? b : a, newest = older == a ? b : a;
        cmem *o = &m[older];
        if (o->fate == 2 && !newer(&m[m[newest].late], &m[m[o->into].late]))
            continue;
        o->fate = 2;
        o->into = newest;
        o->rule = r->cands[c].rule;
        o->why_key =
            m[r->cands[c].a].attrs_key ? m[r->cands[c].a].attrs_key : m[r->cands[c].b].attrs_key;
    }
    free(sum);
    for (size_t i = 0; i < n; i++) {
        if (m[i].fate == 2 && m[i].rule == RULE_KEY)
            r->rules.attrs_key++;
        else if (m[i].fate == 2)
            r->rules.values++;
    }
    return 0;
}

/* Prune: what stays live, ranked by its composite with its merged values. */
static void plan_prune(run *r)
{
    size_t n = r->l.n;
    cmem *m = r->l.m;
    /* re-rank and prune: every memory still live is ranked by its composite as of the run
     * (with its merged values); those of low composite, old enough, neither a constraint
     * nor pinned, are archived. The composite is not stored: reads compute it live. */
    int64_t grace_ms = (int64_t)(r->cfg->consolidate_prune_grace_days * 86400000.0);
    for (size_t i = 0; i < n; i++) {
        cmem *mi = &m[i];
        if (mi->fate != 0)
            continue;
        uint32_t acc = r->acc[i] > UINT32_MAX ? UINT32_MAX : (uint32_t)r->acc[i];
        double c = score_composite(&r->s->score, mi->created_ms, acc, mi->cited, mi->injected,
                                   r->imp[i], r->started);
        r->out->rescored++;
        if (mi->pinned || mi->type == MEM_CONSTRAINT || r->started - mi->created_ms < grace_ms)
            continue;
        if (c < r->cfg->consolidate_prune_threshold) {
            mi->fate = 3;
            r->imp[i] = c; /* kept for the record */
        }
    }
}

/* Each survivor's members (r->members, r->mseqs, r->mcos from r->first). */
static void plan_members(run *r)
{
    size_t n = r->l.n;
    cmem *m = r->l.m;
    /* each survivor's members, gathered by a counting sort (in id order) */
    for (size_t j = 0; j < n; j++)
        if (m[j].fate == 1)
            r->first[m[j].into + 1]++;
    for (size_t i = 0; i < n; i++)
        r->first[i + 1] += r->first[i];
    for (size_t j = 0; j < n; j++) {
        if (m[j].fate != 1)
            continue;
        size_t at = r->first[m[j].into]++;
        r->members[at] = m[j].id;
        r->mseqs[at] = m[j].seq;
        r->mcos[at] = m[j].cos;
    }
    /* first[i] now ends survivor i's run of members; it starts where i - 1's ended */
}

static int step_plan(run *r)
{
    size_t n = r->l.n;
    uint32_t *best = malloc((n + 1) * sizeof(*best));
    r->imp = calloc(n + 1, sizeof(double));
    r->acc = calloc(n + 1, sizeof(int64_t));
    r->members = malloc((n + 1) * sizeof(int64_t));
    r->mseqs = malloc((n + 1) * sizeof(int64_t));
    r->mcos = malloc((n + 1) * sizeof(float));
    r->first = calloc(n + 2, sizeof(size_t));
    if (!best || !r->imp || !r->acc || !r->members || !r->mseqs || !r->mcos || !r->first) {
        free(best);
        set_err(r->out, "%s", "out of memory");
        return -ENOMEM;
    }
    plan_merges(r, best);
    free(best);
    if (plan_supersessions(r) < 0) {
        set_err(r->out, "%s", "out of memory");
        return -ENOMEM;
    }
    plan_prune(r);
    plan_members(r);
    return 0;
}

/* The recorded reason of a merge: the rule, and the members' cosine similarity to the
 * survivor (k of them in cos), which the rule did not need. */
static void merge_why(const float *cos, size_t k, char *out, size_t outlen)
{
    float lo = cos[0], hi = cos[0];
    for (size_t i = 1; i < k; i++) {
        lo = cos[i] < lo ? cos[i] : lo;
        hi = cos[i] > hi ? cos[i] : hi;
    }
    int w = snprintf(out, outlen,
                     "the same text once case, punctuation, spacing, number formats and the words "
                     "a/an/the/now/currently/still are set aside; metadata agree; cosine %.3f",
                     (double)lo);
    if (hi - lo >= 0.0005f && w > 0 && (size_t)w < outlen)
        snprintf(out + w, outlen - (size_t)w, " to %.3f", (double)hi);
}

/* Copies at most n bytes of s into out (outlen > n), never cutting a UTF-8 sequence. */
static void utf8_prefix(const char *s, size_t n, char *out, size_t outlen)
{
    size_t len = strlen(s);
    if (len > n) {
        len = n;
        while (len > 0 && ((unsigned char)s[len] & 0xC0) == 0x80)
            len--;
    }
    if (len >= outlen)
        len = outlen - 1;
    memcpy(out, s, len);
    out[len] = '\0';
}

/* The recorded reason of a supersession of o by nw. */
static void supersede_why(const cmem *o, const cmem *nw, char *out, size_t outlen)
{
    if (o->rule == RULE_KEY) {
        char key[160];
        utf8_prefix(o->why_key ? o->why_key : "", 150, key, sizeof(key));
        snprintf(out, outlen, "same attrs.key '%s'%s", key,
                 o->why_key && strlen(o->why_key) > 150 ? " (cut)" : "");
        return;
    }
    char diff[300];
    textrule_explain(&o->sig, &nw->sig, diff, sizeof(diff));
    snprintf(out, outlen, "the same text but for values: %s", diff);
}

/* The literals of one step (see engram_consolidate_apply). */
enum {
    L_SURVIVOR,
    L_SURVIVOR_SEQ,
    L_MEMBERS,
    L_MEMBERS_SEQ,
    L_MERGE_WHY,
    L_OLD,
    L_OLD_SEQ,
    L_NEW,
    L_NEW_SEQ,
    L_OLD_RULE,
    L_OLD_WHY,
    L_PRUNE,
    L_PRUNE_SEQ,
    L_PRUNE_C,
    L__COUNT
};

/* Applies one step of decisions (the literals S[L__COUNT]) in a transaction of its own;
 * adds its counts to out. */
static int apply_one(run *r, const char *own, lit *S)
{
    char err[300];
    const char *vals[2 + L__COUNT] = {r->tid, own};
    for (int k = 0; k < L__COUNT; k++)
        vals[2 + k] = lit_end(&S[k]);
    int rc = pgsync_tenant_begin(r->pg, r->tenant, PGSYNC_TX_WRITE, err, sizeof(err));
    if (rc == 0) {
        PGresult *res =
            PGSYNC_EXEC(r->pg, sqlb_def(SQLB_CONSOLIDATE_APPLY), vals, err, sizeof(err));
        int counts[4] = {0};
        bool applied = res != NULL;
        for (int k = 0; applied && k < 4; k++)
            counts[k] = (int)memrow_i64(res, 0, k, 0);
        PQclear(res);
        rc = pgsync_tx_end(r->pg, applied, err, sizeof(err));
        if (rc == 0 && !applied)
            rc = -EIO;
        if (rc == 0) {
            r->out->merged += counts[0];
            r->out->superseded += counts[1];
            r->out->archived += counts[2];
            r->out->skipped += counts[3];
        }
    }
    if (rc < 0) {
        set_err(r->out, "applying the plan: %s", err);
        return -EIO;
    }
    return 0;
}

/* Step 4, apply: the plan in steps of about CONSOLIDATE_STEP memories changed, each its own
 * transaction: merges, then supersessions, then prunes, in id order. */
static int step_apply(run *r)
{
    size_t n = r->l.n;
    const cmem *m = r->l.m;
    bool ok = true;
    ubuf own = {0}; /* "{id,id,...}": the survivors of earlier steps */
    ok = ubuf_append(&own, "{}", 2) == 0;
    size_t at = 0, phase = 0;
    while (ok && phase < 3 && r->out->status >= 0) {
        lit S[L__COUNT];
        memset(S, 0, sizeof(S));
        size_t taken = 0;
        while (phase < 3 && taken < CONSOLIDATE_STEP) {
            if (at >= n) {
                phase++;
                at = 0;
                continue;
            }
            const cmem *mi = &m[at];
            char why[400];
            if (phase == 0) {
                size_t start = at ? r->first[at - 1] : 0, k = r->first[at] - start;
                if (k > 0) {
                    merge_why(r->mcos + start, k, why, sizeof(why));
                    ok = ok && lit_i64(&S[L_SURVIVOR], mi->id) == 0 &&
                         lit_i64(&S[L_SURVIVOR_SEQ], mi->seq) == 0 &&
                         lit_arr(&S[L_MEMBERS], r->members + start, k) == 0 &&
                         lit_arr(&S[L_MEMBERS_SEQ], r->mseqs + start, k) == 0 &&
                         lit_str(&S[L_MERGE_WHY], why) == 0;
                    taken += 1 + k;
                }
            } else if (phase == 1 && mi->fate == 2) {
                supersede_why(mi, &m[mi->into], why, sizeof(why));
                ok = ok && lit_i64(&S[L_OLD], mi->id) == 0 &&
                     lit_i64(&S[L_OLD_SEQ], mi->seq) == 0 &&
                     lit_i64(&S[L_NEW], m[mi->into].id) == 0 &&
                     lit_i64(&S[L_NEW_SEQ], m[mi->into].seq) == 0 &&
                     lit_str(&S[L_OLD_RULE], mi->rule == RULE_KEY ? "attrs_key" : "values") == 0 &&
                     lit_str(&S[L_OLD_WHY], why) == 0;
                taken++;
            } else if (phase == 2 && mi->fate == 3) {
                ok = ok && lit_i64(&S[L_PRUNE], mi->id) == 0 &&
                     lit_i64(&S[L_PRUNE_SEQ], mi->seq) == 0 &&
                     lit_f64(&S[L_PRUNE_C], r->imp[at]) == 0;
                taken++;
            }
            at++;
        }
        if (ok && taken > 0)
            apply_one(r, own.data, S);
        /* this step's survivors changed: later steps must not take them for memories that a
         * concurrent write changed (S[0] is "{id,id,...}" once ended) */
        if (ok && S[L_SURVIVOR].n) {
            ubuf_truncate(&own, own.len - 1); /* drop the closing brace */
            ok = (own.len <= 1 || ubuf_append(&own, ",", 1) == 0) &&
                 ubuf_append(&own, S[L_SURVIVOR].b.data + 1, S[L_SURVIVOR].b.len - 1) == 0;
        }
        for (int k = 0; k < L__COUNT; k++)
            ubuf_fini(&S[k].b);
    }
    ubuf_fini(&own);
    if (!ok && r->out->status >= 0)
        set_err(r->out, "%s", "out of memory");
    return r->out->status < 0 ? -EIO : 0;
}

/* Step 3b, model: the chat model's judgment of the candidate groups (consolidate_model.c). */
static int step_model(run *r)
{
    return consolidate_model_plan(r, r->ctx);
}

/* Step 4b: the model's decisions, in steps of their own after the rules'. */
static int step_model_apply(run *r)
{
    return consolidate_model_apply(r);
}

/* Step 5, record: the run with its counts and settings (engram_consolidate_finish). */
static int step_record(run *r)
{
    const config *cfg = r->cfg;
    consolidate_result *out = r->out;
    char err[300], started_s[24], counts[5][16], nmodel[16];
    const rule_counts *rk = &r->rules;
    ubuf settings = {0};
    snprintf(started_s, sizeof(started_s), "%lld", (long long)r->started);
    snprintf(nmodel, sizeof(nmodel), "%zu", r->model.ndec);
    int w = ubuf_printf(
        &settings,
        "{\"dedupe_threshold\": %g, \"supersede_threshold\": %g, \"prune_threshold\": %g, "
        "\"prune_grace_days\": %g, \"memories\": %zu, \"snapshot_seq\": %llu, "
        "\"rules\": {\"model\": %s, \"merged_same_text\": %d, "
        "\"superseded_attrs_key\": %d, \"superseded_values\": %d, "
        "\"near_pairs_kept\": %d, \"similar_pairs_kept\": %d}",
        cfg->consolidate_dedupe_threshold, cfg->consolidate_supersede_threshold,
        cfg->consolidate_prune_threshold, cfg->consolidate_prune_grace_days, r->l.n,
        (unsigned long long)r->seq, r->model.status ? nmodel : "null", rk->same_text, rk->attrs_key,
        rk->values, rk->near_kept, rk->similar_kept);
    if (w < 0 || consolidate_model_record(r, &settings) < 0 || ubuf_putc(&settings, '}') < 0) {
        ubuf_fini(&settings);
        set_err(out, "%s", "out of memory");
        return -ENOMEM;
    }
    snprintf(counts[0], 16, "%d", out->merged);
    snprintf(counts[1], 16, "%d", out->superseded);
    snprintf(counts[2], 16, "%d", out->rescored);
    snprintf(counts[3], 16, "%d", out->archived);
    snprintf(counts[4], 16, "%d", out->skipped);
    const char *fv[9] = {r->tid,    r->trigger, started_s, counts[0],    counts[1],
                         counts[2], counts[3],  counts[4], settings.data};
    int rc = pgsync_tenant_begin(r->pg, r->tenant, PGSYNC_TX_WRITE, err, sizeof(err));
    if (rc == 0) {
        PGresult *res = PGSYNC_EXEC(r->pg, sqlb_def(SQLB_CONSOLIDATE_FINISH), fv, err, sizeof(err));
        bool recorded = res != NULL;
        int64_t run_id = recorded ? memrow_i64(res, 0, 0, 0) : 0;
        PQclear(res);
        rc = pgsync_tx_end(r->pg, recorded, err, sizeof(err));
        if (rc == 0 && !recorded)
            rc = -EIO;
        if (rc == 0)
            out->run_id = run_id;
    }
    ubuf_fini(&settings);
    if (rc < 0) {
        set_err(out, "recording the run: %s", err);
        return -EIO;
    }
    return 0;
}

int consolidate_plan(server *s, const loader_row *rows, size_t n, uint32_t dim, int64_t now_ms,
                     consolidate_fate *fates, consolidate_counts *counts, char *err, size_t errlen)
{
    consolidate_result out = {0};
    run r = {.s = s, .cfg = &s->cfg, .started = now_ms, .l = {.dim = dim}, .out = &out};
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++)
        rc = take_row(&rows[i], &r.l);
    if (rc < 0) {
        set_err(&out, "%s", "out of memory");
        goto done;
    }
    rc = step_pairs(&r);
    if (rc == 0)
        rc = step_plan(&r);
    if (rc < 0)
        goto done;
    static const char *const rules[] = {NULL, "same_text", NULL, "prune"};
    for (size_t i = 0; i < n; i++) {
        const cmem *m = &r.l.m[i];
        consolidate_fate *f = &fates[i];
        memset(f, 0, sizeof(*f));
        f->id = m->id;
        f->fate = m->fate == 1   ? CONSOLIDATE_MERGED
                  : m->fate == 2 ? CONSOLIDATE_SUPERSEDED
                  : m->fate == 3 ? CONSOLIDATE_PRUNED
                                 : CONSOLIDATE_LIVE;
        f->rule = m->fate == 2 ? (m->rule == RULE_KEY ? "attrs_key" : "values") : rules[m->fate];
        f->into = m->fate == 1 || m->fate == 2 ? r.l.m[m->into].id : 0;
        f->importance = r.imp[i];
        f->access = r.acc[i];
        if (m->fate == 2)
            supersede_why(m, &r.l.m[m->into], f->why, sizeof(f->why));
    }
    if (counts)
        *counts = (consolidate_counts){.same_text = r.rules.same_text,
                                       .attrs_key = r.rules.attrs_key,
                                       .values = r.rules.values,
                                       .near_kept = r.rules.near_kept,
                                       .similar_kept = r.rules.similar_kept,
                                       .rescored = out.rescored};
done:
    if (rc < 0 && err && errlen)
        snprintf(err, errlen, "%s", out.error);
    run_fini(&r);
    return rc < 0 ? (rc == -ENOMEM ? -ENOMEM : -EIO) : 0;
}

static void run_tenant(bg_ctx *ctx, server *s, int64_t tenant, uint32_t dim, const char *trigger,
                       consolidate_result *out);

void consolidate_tenant(bg_ctx *ctx, server *s, int64_t tenant, uint32_t dim, const char *trigger,
                        consolidate_result *out)
{
    uint64_t t0 = server_mono_ns();
    run_tenant(ctx, s, tenant, dim, trigger, out);
    metrics_consolidation(strcmp(trigger, "schedule") == 0, out->status, (uint64_t)out->merged,
                          (uint64_t)out->superseded, (uint64_t)out->archived,
                          (uint64_t)out->rescored, (server_mono_ns() - t0) / 1000000u);
}

/* One run of consolidate_tenant (which counts it in the metrics). */
static void run_tenant(bg_ctx *ctx, server *s, int64_t tenant, uint32_t dim, const char *trigger,
                       consolidate_result *out)
{
    memset(out, 0, sizeof(*out));
    run r = {.s = s,
             .ctx = ctx,
             .cfg = &s->cfg,
             .tenant = tenant,
             .trigger = trigger,
             .l = {.dim = dim},
             .out = out};
    r.started = server_now_ms();
    r.model.wanted = chat_available() && s->cfg.consolidate_model_max_groups > 0;
    r.model.floor = (float)s->cfg.consolidate_model_floor;
    uint64_t t0 = server_mono_ns();
    char err[300], key[32];
    snprintf(r.tid, sizeof(r.tid), "%lld", (long long)tenant);
    snprintf(key, sizeof(key), "%lld", (long long)(LOCK_BASE + tenant));
    r.pg = bg_conn(ctx, err, sizeof(err));
    if (!r.pg) {
        set_err(out, "database unavailable: %s", err);
        return;
    }
    /* one run per tenant at a time, across processes */
    const char *kv[] = {key};
    PGresult *res = PGSYNC_EXEC(r.pg, sqlb_def(SQLB_TRY_LOCK), kv, err, sizeof(err));
    if (!res) {
        set_err(out, "%s", err);
        if (PQstatus(r.pg) != CONNECTION_OK)
            bg_conn_failed(ctx);
        return;
    }
    bool locked = PQgetvalue(res, 0, 0)[0] == 't';
    PQclear(res);
    if (!locked) {
        out->status = 1;
        snprintf(out->error, sizeof(out->error), "a consolidation of this tenant is running");
        return;
    }
    /* the steps, each timed: read, pairs, plan, model, apply, model apply, record */
    int (*const steps[])(run *) = {step_read,  step_pairs,       step_plan,  step_model,
                                   step_apply, step_model_apply, step_record};
    enum { NSTEPS = sizeof(steps) / sizeof(steps[0]) };
    uint64_t t[NSTEPS + 1] = {t0};
    size_t done = 0;
    while (done < NSTEPS && steps[done](&r) == 0) {
        t[done + 1] = server_mono_ns();
        done++;
    }
    if (done == NSTEPS) {
        out->status = 0;
        log_info("tenant %lld consolidation: read %zu memories %.0f ms, similar pairs %.0f ms, "
                 "plan %.0f ms, model %.0f ms, apply %.0f ms, record %.0f ms",
                 (long long)tenant, r.l.n, (double)(t[1] - t[0]) / 1e6, (double)(t[2] - t[1]) / 1e6,
                 (double)(t[3] - t[2]) / 1e6, (double)(t[4] - t[3]) / 1e6,
                 (double)(t[6] - t[4]) / 1e6, (double)(t[7] - t[6]) / 1e6);
    }
    /* what the model did, also when the run failed afterwards (its tokens were spent) */
    out->model_status = r.model.status;
    snprintf(out->model_reason, sizeof(out->model_reason), "%s", r.model.reason);
    out->model_calls = r.model.calls;
    out->tokens_in = r.model.tokens_in;
    out->tokens_out = r.model.tokens_out;
    out->cost_usd = r.model.cost_usd;
    res = PGSYNC_EXEC(r.pg, sqlb_def(SQLB_UNLOCK), kv, err, sizeof(err));
    PQclear(res);
    if (out->status < 0 && PQstatus(r.pg) == CONNECTION_OK)
        record_failure(r.pg, tenant, trigger, r.started, out->error);
    run_fini(&r);
    out->duration_ms = (int64_t)((server_mono_ns() - t0) / 1000000u);
    if (PQstatus(r.pg) != CONNECTION_OK)
        bg_conn_failed(ctx);
}

/* ---- the scheduler ---------------------------------------------------------------------- */

static void scheduled(bg_ctx *ctx, void *arg)
{
    server *s = arg;
    char err[256], hours[64];
    const tier_limits *tl = server_tiers(s); /* one snapshot (a SIGHUP may publish another) */
    snprintf(hours, sizeof(hours), "{%d,%d,%d}", tl[TIER_FREE].consolidation_hours,
             tl[TIER_STANDARD].consolidation_hours, tl[TIER_PREMIUM].consolidation_hours);
    PGconn *pg = bg_conn(ctx, err, sizeof(err));
    if (!pg)
        return;
    const char *v[] = {hours};
    PGresult *r = PGSYNC_EXEC(pg, sqlb_def(SQLB_CONSOLIDATION_DUE), v, err, sizeof(err));
    if (!r) {
        log_warn("consolidation scheduler: %s", err);
        if (PQstatus(pg) != CONNECTION_OK)
            bg_conn_failed(ctx);
        return;
    }
    int n = PQntuples(r);
    int64_t *ids = malloc(((size_t)n + 1) * sizeof(*ids));
    uint32_t *dims = malloc(((size_t)n + 1) * sizeof(*dims));
    int k = 0; /* rows whose id and dimension parse (others are reported by rowerr) */
    for (int i = 0; ids && dims && i < n; i++) {
        int64_t id = memrow_i64_of(r, i, 0, 0, ROWERR_TENANTS);
        int64_t dim = memrow_i64_of(r, i, 1, 0, ROWERR_TENANTS);
        if (id > 0 && dim > 0 && dim <= UINT32_MAX) {
            ids[k] = id;
            dims[k++] = (uint32_t)dim;
        }
    }
    n = k;
    PQclear(r);
    for (int i = 0; ids && dims && i < n && !bg_cancelled(ctx); i++) {
        consolidate_result res;
        consolidate_tenant(ctx, s, ids[i], dims[i], "schedule", &res);
        if (res.status == 0)
            log_info("tenant %lld consolidated: %d merged, %d superseded, %d pruned, %d rescored, "
                     "%lld ms",
                     (long long)ids[i], res.merged, res.superseded, res.archived, res.rescored,
                     (long long)res.duration_ms);
        else if (res.status < 0)
            log_warn("tenant %lld: consolidation failed: %s", (long long)ids[i], res.error);
    }
    free(ids);
    free(dims);
}

int consolidate_start(server *s)
{
    return bg_every(s->bg, (unsigned)s->cfg.consolidate_check_interval_s * 1000u, scheduled, s);
}

int consolidate_set_interval(server *s, int interval_s)
{
    return bg_every_set(s->bg, scheduled, s, (unsigned)interval_s * 1000u);
}
