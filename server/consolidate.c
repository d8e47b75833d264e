/* server/consolidate.c: consolidation runs and their scheduler (see consolidate.h). */
#include "consolidate.h"

#include <errno.h>
#include <pthread.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "db.h"
#include "dedupe.h"
#include "json.h"
#include "loader.h"
#include "log.h"
#include "memrow.h"
#include "score.h"
#include "tiers.h"

/* Advisory lock keys: one per tenant, in a range of their own. */
#define LOCK_BASE (1LL << 60)
/* Decisions applied per transaction: the tenant's writes wait at most one step. */
#define CONSOLIDATE_STEP 200

/* What the plan needs of one live memory. */
typedef struct cmem {
    int64_t id;
    int64_t seq;
    int type, scope;
    uint64_t owner; /* agent id (agent scope), clade id (clade scope), 0 (tenant scope) */
    double importance;
    int64_t access;
    int64_t created_ms;
    bool pinned;
    char *attrs_key;
    /* the plan */
    uint32_t parent; /* union-find */
    int fate;        /* 0 live, 1 merged away, 2 superseded, 3 pruned */
    uint32_t into;   /* merged into / superseded by (an index) */
} cmem;

typedef struct loaded {
    cmem *m;
    float *vecs;
    size_t n, cap, dim;
} loaded;

static int take_row(const loader_row *row, void *arg)
{
    loaded *l = arg;
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 1024;
        cmem *m = realloc(l->m, cap * sizeof(*m));
        if (!m)
            return -1;
        l->m = m;
        float *v = realloc(l->vecs, cap * l->dim * sizeof(float));
        if (!v)
            return -1;
        l->vecs = v;
        l->cap = cap;
    }
    cmem *m = &l->m[l->n];
    memset(m, 0, sizeof(*m));
    m->id = (int64_t)row->id;
    m->seq = (int64_t)row->seq;
    m->type = row->type;
    m->scope = row->scope;
    m->owner = row->scope == SCOPE_AGENT   ? row->agent_id
               : row->scope == SCOPE_CLADE ? row->clade_id
                                           : 0;
    m->importance = row->importance;
    m->access = row->access_count;
    m->created_ms = row->created_ms;
    m->pinned = row->pinned;
    m->attrs_key = row->attrs_key ? strdup(row->attrs_key) : NULL;
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

/* True when a should survive over b: higher importance, more accessed, newer, lower id. */
static bool better(const cmem *a, const cmem *b)
{
    if (a->importance != b->importance)
        return a->importance > b->importance;
    if (a->access != b->access)
        return a->access > b->access;
    if (a->created_ms != b->created_ms)
        return a->created_ms > b->created_ms;
    return a->id < b->id;
}

/* True when a is newer than b (supersedes it). */
static bool newer(const cmem *a, const cmem *b)
{
    if (a->created_ms != b->created_ms)
        return a->created_ms > b->created_ms;
    return a->id > b->id;
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

/* A growing text literal of a PostgreSQL array. */
typedef struct lit {
    json_buf b;
    size_t n;
} lit;

static int lit_i64(lit *l, int64_t v)
{
    char num[32];
    int k = snprintf(num, sizeof(num), "%s%lld", l->n++ ? "," : "{", (long long)v);
    return json_buf_append(&l->b, num, (size_t)k);
}

static int lit_f64(lit *l, double v)
{
    char num[40];
    int k = snprintf(num, sizeof(num), "%s%.17g", l->n++ ? "," : "{", v);
    return json_buf_append(&l->b, num, (size_t)k);
}

/* An element that is itself a quoted bigint[] literal ("{1,2}"). */
static int lit_arr(lit *l, const int64_t *v, size_t n)
{
    if (json_buf_append(&l->b, l->n++ ? ",\"{" : "{\"{", 3) < 0)
        return -1;
    for (size_t i = 0; i < n; i++) {
        char num[24];
        int k = snprintf(num, sizeof(num), "%s%lld", i ? "," : "", (long long)v[i]);
        if (json_buf_append(&l->b, num, (size_t)k) < 0)
            return -1;
    }
    return json_buf_append(&l->b, "}\"", 2);
}

static const char *lit_end(lit *l)
{
    if (l->n == 0)
        json_buf_append(&l->b, "{", 1);
    json_buf_append(&l->b, "}", 1);
    return l->b.data;
}

/* Records a failed run (its changes were rolled back) in a transaction of its own. */
static void record_failure(PGconn *pg, const char *tid, const char *trigger, int64_t started,
                           const char *error)
{
    char err[256], st[24];
    snprintf(st, sizeof(st), "%lld", (long long)started);
    const char *tv[] = {tid};
    const char *fv[] = {tid, trigger, st, error};
    PGresult *r = db_exec_blocking(pg, "BEGIN", 0, NULL, err, sizeof(err));
    PQclear(r);
    if (r)
        r = db_exec_blocking(pg, "SELECT set_config('engram.tenant_id', $1, true)", 1, tv, err,
                             sizeof(err));
    PQclear(r);
    if (r)
        r = db_exec_blocking(pg, "SELECT engram_consolidate_failed($1, $2, $3, $4)", 4, fv, err,
                             sizeof(err));
    PQclear(r);
    r = db_exec_blocking(pg, r ? "COMMIT" : "ROLLBACK", 0, NULL, err, sizeof(err));
    PQclear(r);
}

static void set_err(consolidate_result *out, const char *fmt, const char *a)
{
    out->status = -1;
    snprintf(out->error, sizeof(out->error), fmt, a);
}

void consolidate_tenant(bg_ctx *ctx, server *s, int64_t tenant, uint32_t dim, const char *trigger,
                        consolidate_result *out)
{
    const config *cfg = &s->cfg;
    memset(out, 0, sizeof(*out));
    int64_t started = server_now_ms();
    uint64_t t0 = server_mono_ns();
    char err[300], tid[24], key[32];
    snprintf(tid, sizeof(tid), "%lld", (long long)tenant);
    snprintf(key, sizeof(key), "%lld", (long long)(LOCK_BASE + tenant));
    PGconn *pg = bg_conn(ctx, err, sizeof(err));
    if (!pg) {
        set_err(out, "database unavailable: %s", err);
        return;
    }
    const char *kv[] = {key};
    PGresult *r =
        db_exec_blocking(pg, "SELECT pg_try_advisory_lock($1::bigint)", 1, kv, err, sizeof(err));
    if (!r) {
        set_err(out, "%s", err);
        if (PQstatus(pg) != CONNECTION_OK)
            bg_conn_failed(ctx);
        return;
    }
    bool locked = PQgetvalue(r, 0, 0)[0] == 't';
    PQclear(r);
    if (!locked) {
        out->status = 1;
        snprintf(out->error, sizeof(out->error), "a consolidation of this tenant is running");
        return;
    }

    loaded l = {.dim = dim};
    uint32_t *order = NULL;
    dedupe_pair *pairs = NULL;
    float *gv = NULL;
    uint64_t seq = 0;
    if (loader_live(pg, tenant, dim, &seq, take_row, &l, err, sizeof(err)) < 0) {
        set_err(out, "reading memories: %s", err);
        goto unlock;
    }
    size_t n = l.n;
    uint64_t t_read = server_mono_ns();
    order = malloc((n + 1) * sizeof(*order));
    gv = malloc((n + 1) * dim * sizeof(float));
    if (!order || !gv) {
        set_err(out, "%s", "out of memory");
        goto unlock;
    }
    for (size_t i = 0; i < n; i++)
        order[i] = (uint32_t)i;
    pthread_mutex_lock(&plan_mu);
    sort_base = l.m;
    qsort(order, n, sizeof(*order), cmp_idx);
    pthread_mutex_unlock(&plan_mu);

    float tdup = (float)cfg->consolidate_dedupe_threshold;
    float tsup = (float)cfg->consolidate_supersede_threshold;
    dedupe_opts dopts = {.exact_max = (size_t)cfg->consolidate_exact_max,
                         .threads = (unsigned)cfg->consolidate_threads};
    /* per group: the pairs above the lower threshold; duplicates join, near-duplicates of
     * facts and preferences are remembered as supersession candidates */
    typedef struct cand {
        uint32_t a, b;
    } cand;
    cand *cands = NULL;
    size_t ncand = 0, ccand = 0;
    for (size_t g0 = 0; g0 < n;) {
        size_t g1 = g0 + 1;
        while (g1 < n && same_group(&l.m[order[g0]], &l.m[order[g1]]))
            g1++;
        size_t gn = g1 - g0;
        int type = l.m[order[g0]].type;
        bool updatable = type == MEM_FACT || type == MEM_PREFERENCE;
        float thr = updatable && tsup < tdup ? tsup : tdup;
        if (gn >= 2) {
            for (size_t k = 0; k < gn; k++)
                memcpy(gv + k * dim, l.vecs + (size_t)order[g0 + k] * dim, dim * sizeof(float));
            size_t np = 0;
            if (dedupe_pairs(gv, gn, dim, thr, &dopts, &pairs, &np, err, sizeof(err)) < 0) {
                set_err(out, "similarity search: %s", err);
                free(cands);
                goto unlock;
            }
            for (size_t p = 0; p < np; p++) {
                uint32_t a = order[g0 + pairs[p].i], b = order[g0 + pairs[p].j];
                if (pairs[p].sim >= tdup) {
                    uint32_t ra = find(l.m, a), rb = find(l.m, b);
                    if (ra != rb)
                        l.m[ra > rb ? ra : rb].parent = ra < rb ? ra : rb;
                } else if (updatable) {
                    if (ncand == ccand) {
                        size_t cap = ccand ? ccand * 2 : 256;
                        cand *c = realloc(cands, cap * sizeof(*c));
                        if (!c) {
                            set_err(out, "%s", "out of memory");
                            free(cands);
                            goto unlock;
                        }
                        cands = c;
                        ccand = cap;
                    }
                    cands[ncand++] = (cand){a, b};
                }
            }
            free(pairs);
            pairs = NULL;
            /* facts and preferences sharing attrs.key are the same subject */
            for (size_t x = 0; updatable && x < gn; x++) {
                const cmem *mx = &l.m[order[g0 + x]];
                for (size_t y = x + 1; mx->attrs_key && y < gn; y++) {
                    const cmem *my = &l.m[order[g0 + y]];
                    if (!my->attrs_key || strcmp(mx->attrs_key, my->attrs_key) != 0)
                        continue;
                    if (ncand == ccand) {
                        size_t cap = ccand ? ccand * 2 : 256;
                        cand *c = realloc(cands, cap * sizeof(*c));
                        if (!c) {
                            set_err(out, "%s", "out of memory");
                            free(cands);
                            goto unlock;
                        }
                        cands = c;
                        ccand = cap;
                    }
                    cands[ncand++] = (cand){order[g0 + x], order[g0 + y]};
                }
            }
        }
        g0 = g1;
    }

    uint64_t t_pairs = server_mono_ns();
    /* merges: every cluster's survivor absorbs the others */
    uint32_t *best = malloc((n + 1) * sizeof(*best));
    if (!best) {
        set_err(out, "%s", "out of memory");
        free(cands);
        goto unlock;
    }
    for (size_t i = 0; i < n; i++)
        best[i] = UINT32_MAX;
    for (size_t i = 0; i < n; i++) {
        uint32_t root = find(l.m, (uint32_t)i);
        if (best[root] == UINT32_MAX || better(&l.m[i], &l.m[best[root]]))
            best[root] = (uint32_t)i;
    }
    for (size_t i = 0; i < n; i++) {
        uint32_t surv = best[find(l.m, (uint32_t)i)];
        if (surv != i) {
            l.m[i].fate = 1;
            l.m[i].into = surv;
        }
    }
    /* the survivors' merged values, for the prune decision below */
    double *imp = calloc(n + 1, sizeof(double));
    int64_t *acc = calloc(n + 1, sizeof(int64_t));
    if (!imp || !acc) {
        free(imp);
        free(acc);
        free(best);
        free(cands);
        set_err(out, "%s", "out of memory");
        goto unlock;
    }
    for (size_t i = 0; i < n; i++) {
        imp[i] = l.m[i].importance;
        acc[i] = l.m[i].access;
    }
    for (size_t i = 0; i < n; i++) {
        if (l.m[i].fate != 1)
            continue;
        uint32_t sv = l.m[i].into;
        if (l.m[i].importance > imp[sv])
            imp[sv] = l.m[i].importance;
        acc[sv] += l.m[i].access;
    }
    /* supersessions between what is still live: the older goes, pointing at its newest
     * related memory (a merged-away memory stands for its survivor) */
    for (size_t c = 0; c < ncand; c++) {
        uint32_t a = cands[c].a, b = cands[c].b;
        if (l.m[a].fate == 1)
            a = l.m[a].into;
        if (l.m[b].fate == 1)
            b = l.m[b].into;
        if (a == b)
            continue;
        uint32_t older = newer(&l.m[a], &l.m[b]) ? b : a, newest = older == a ? b : a;
        cmem *o = &l.m[older];
        if (o->fate == 2 && !newer(&l.m[newest], &l.m[o->into]))
            continue;
        o->fate = 2;
        o->into = newest;
    }
    /* prunes: low composite, old enough, not a constraint, not pinned */
    int64_t grace_ms = (int64_t)(cfg->consolidate_prune_grace_days * 86400000.0);
    for (size_t i = 0; i < n; i++) {
        cmem *m = &l.m[i];
        if (m->fate != 0 || m->pinned || m->type == MEM_CONSTRAINT ||
            started - m->created_ms < grace_ms)
            continue;
        double c =
            score_composite(&s->score, m->created_ms,
                            acc[i] > UINT32_MAX ? UINT32_MAX : (uint32_t)acc[i], imp[i], started);
        if (c < cfg->consolidate_prune_threshold) {
            m->fate = 3;
            imp[i] = c; /* kept for the record */
        }
    }

    /* each survivor's members, gathered by a counting sort (in id order) */
    int64_t *members = malloc((n + 1) * sizeof(int64_t)),
            *mseqs = malloc((n + 1) * sizeof(int64_t));
    size_t *first = calloc(n + 2, sizeof(size_t));
    bool ok = members && mseqs && first;
    for (size_t j = 0; ok && j < n; j++)
        if (l.m[j].fate == 1)
            first[l.m[j].into + 1]++;
    for (size_t i = 0; ok && i < n; i++)
        first[i + 1] += first[i];
    for (size_t j = 0; ok && j < n; j++) {
        if (l.m[j].fate != 1)
            continue;
        size_t at = first[l.m[j].into]++;
        members[at] = l.m[j].id;
        mseqs[at] = l.m[j].seq;
    }
    free(best);
    free(cands);
    if (!ok) {
        free(members);
        free(mseqs);
        free(first);
        free(imp);
        free(acc);
        set_err(out, "%s", "out of memory");
        goto unlock;
    }
    /* first[i] now ends survivor i's run of members; it starts where i - 1's ended */
    uint64_t t_plan = server_mono_ns();
    json_buf own = {0}; /* "{id,id,...}": the survivors of earlier steps */
    json_buf_append(&own, "{}", 2);
    const char *tv[] = {tid};
    /* steps of at most STEP decisions: merges, then supersessions, then prunes, in id order */
    size_t at = 0, phase = 0;
    while (phase < 3 && out->status >= 0) {
        lit S[11];
        memset(S, 0, sizeof(S));
        size_t taken = 0;
        while (phase < 3 && taken < CONSOLIDATE_STEP) {
            if (at >= n) {
                phase++;
                at = 0;
                continue;
            }
            const cmem *m = &l.m[at];
            if (phase == 0) {
                size_t start = at ? first[at - 1] : 0, k = first[at] - start;
                if (k > 0) {
                    ok = ok && lit_i64(&S[0], m->id) == 0 && lit_i64(&S[1], m->seq) == 0 &&
                         lit_arr(&S[2], members + start, k) == 0 &&
                         lit_arr(&S[3], mseqs + start, k) == 0;
                    taken++;
                }
            } else if (phase == 1 && m->fate == 2) {
                ok = ok && lit_i64(&S[4], m->id) == 0 && lit_i64(&S[5], m->seq) == 0 &&
                     lit_i64(&S[6], l.m[m->into].id) == 0 && lit_i64(&S[7], l.m[m->into].seq) == 0;
                taken++;
            } else if (phase == 2 && m->fate == 3) {
                ok = ok && lit_i64(&S[8], m->id) == 0 && lit_i64(&S[9], m->seq) == 0 &&
                     lit_f64(&S[10], imp[at]) == 0;
                taken++;
            }
            at++;
        }
        const char *own_lit = own.data;
        if (ok && taken > 0) {
            const char *vals[13] = {tid,
                                    own_lit,
                                    lit_end(&S[0]),
                                    lit_end(&S[1]),
                                    lit_end(&S[2]),
                                    lit_end(&S[3]),
                                    lit_end(&S[4]),
                                    lit_end(&S[5]),
                                    lit_end(&S[6]),
                                    lit_end(&S[7]),
                                    lit_end(&S[8]),
                                    lit_end(&S[9]),
                                    lit_end(&S[10])};
            r = db_exec_blocking(pg, "BEGIN", 0, NULL, err, sizeof(err));
            PQclear(r);
            if (r)
                r = db_exec_blocking(pg, "SELECT set_config('engram.tenant_id', $1, true)", 1, tv,
                                     err, sizeof(err));
            PQclear(r);
            if (r)
                r = db_exec_blocking(pg,
                                     "SELECT * FROM engram_consolidate_apply($1, $2::bigint[], "
                                     "$3::bigint[], $4::bigint[], $5::text[], $6::text[], "
                                     "$7::bigint[], $8::bigint[], $9::bigint[], $10::bigint[], "
                                     "$11::bigint[], $12::bigint[], $13::float8[])",
                                     13, vals, err, sizeof(err));
            if (r) {
                out->merged += (int)memrow_i64(r, 0, 0, 0);
                out->superseded += (int)memrow_i64(r, 0, 1, 0);
                out->archived += (int)memrow_i64(r, 0, 2, 0);
                out->skipped += (int)memrow_i64(r, 0, 3, 0);
                PQclear(r);
                r = db_exec_blocking(pg, "COMMIT", 0, NULL, err, sizeof(err));
                PQclear(r);
            }
            if (!r) {
                char e2[64];
                PQclear(db_exec_blocking(pg, "ROLLBACK", 0, NULL, e2, sizeof(e2)));
                set_err(out, "applying the plan: %s", err);
            }
        }
        /* this step's survivors changed: later steps must not take them for memories that a
         * concurrent write changed (S[0] is "{id,id,...}" once ended) */
        if (ok && S[0].n) {
            own.data[--own.len] = '\0'; /* drop the closing brace */
            if (own.len > 1)
                json_buf_append(&own, ",", 1);
            json_buf_append(&own, S[0].b.data + 1, S[0].b.len - 1);
        }
        for (int k = 0; k < 11; k++)
            json_buf_fini(&S[k].b);
        if (!ok && out->status >= 0)
            set_err(out, "%s", "out of memory");
    }
    json_buf_fini(&own);
    free(members);
    free(mseqs);
    free(first);
    free(imp);
    free(acc);
    if (out->status < 0)
        goto unlock;
    char started_s[24], w[160], settings[400], counts[4][16];
    snprintf(started_s, sizeof(started_s), "%lld", (long long)started);
    snprintf(w, sizeof(w), "{%.17g,%.17g,%.17g,%.17g,%.17g}", s->score.w_recency, s->score.w_access,
             s->score.w_explicit, s->score.recency_days, s->score.access_saturation);
    snprintf(settings, sizeof(settings),
             "{\"dedupe_threshold\": %g, \"supersede_threshold\": %g, \"prune_threshold\": %g, "
             "\"prune_grace_days\": %g, \"memories\": %zu, \"snapshot_seq\": %llu}",
             cfg->consolidate_dedupe_threshold, cfg->consolidate_supersede_threshold,
             cfg->consolidate_prune_threshold, cfg->consolidate_prune_grace_days, n,
             (unsigned long long)seq);
    snprintf(counts[0], 16, "%d", out->merged);
    snprintf(counts[1], 16, "%d", out->superseded);
    snprintf(counts[2], 16, "%d", out->archived);
    snprintf(counts[3], 16, "%d", out->skipped);
    const char *fv[10] = {tid,      trigger,   started_s, started_s, w,
                          settings, counts[0], counts[1], counts[2], counts[3]};
    r = db_exec_blocking(pg, "BEGIN", 0, NULL, err, sizeof(err));
    PQclear(r);
    if (r)
        r = db_exec_blocking(pg, "SELECT set_config('engram.tenant_id', $1, true)", 1, tv, err,
                             sizeof(err));
    PQclear(r);
    if (r)
        r = db_exec_blocking(pg,
                             "SELECT * FROM engram_consolidate_finish($1, $2, $3, $4, "
                             "$5::float8[], $6::jsonb, $7, $8, $9, $10)",
                             10, fv, err, sizeof(err));
    if (r) {
        out->run_id = memrow_i64(r, 0, 0, 0);
        out->rescored = (int)memrow_i64(r, 0, 1, 0);
        PQclear(r);
        r = db_exec_blocking(pg, "COMMIT", 0, NULL, err, sizeof(err));
        PQclear(r);
    }
    if (!r) {
        char e2[64];
        PQclear(db_exec_blocking(pg, "ROLLBACK", 0, NULL, e2, sizeof(e2)));
        set_err(out, "recording the run: %s", err);
        goto unlock;
    }
    out->status = 0;
    log_info("tenant %lld consolidation: read %zu memories %.0f ms, similar pairs %.0f ms, plan "
             "%.0f ms, apply %.0f ms",
             (long long)tenant, n, (double)(t_read - t0) / 1e6, (double)(t_pairs - t_read) / 1e6,
             (double)(t_plan - t_pairs) / 1e6, (double)(server_mono_ns() - t_plan) / 1e6);
unlock:
    r = db_exec_blocking(pg, "SELECT pg_advisory_unlock($1::bigint)", 1, kv, err, sizeof(err));
    PQclear(r);
    if (out->status < 0 && PQstatus(pg) == CONNECTION_OK)
        record_failure(pg, tid, trigger, started, out->error);
    for (size_t k = 0; k < l.n; k++)
        free(l.m[k].attrs_key);
    free(l.m);
    free(l.vecs);
    free(order);
    free(gv);
    free(pairs);
    out->duration_ms = (int64_t)((server_mono_ns() - t0) / 1000000u);
    if (PQstatus(pg) != CONNECTION_OK)
        bg_conn_failed(ctx);
}

/* ---- the scheduler ---------------------------------------------------------------------- */

static void scheduled(bg_ctx *ctx, void *arg)
{
    server *s = arg;
    char err[256], hours[64];
    snprintf(hours, sizeof(hours), "{%d,%d,%d}", s->tiers[TIER_FREE].consolidation_hours,
             s->tiers[TIER_STANDARD].consolidation_hours,
             s->tiers[TIER_PREMIUM].consolidation_hours);
    PGconn *pg = bg_conn(ctx, err, sizeof(err));
    if (!pg)
        return;
    const char *v[] = {hours};
    PGresult *r = db_exec_blocking(pg, "SELECT * FROM engram_consolidation_due($1::integer[])", 1,
                                   v, err, sizeof(err));
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
