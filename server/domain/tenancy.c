/* server/domain/tenancy.c: revocations, tiers, request rates and query counts (see tenancy.h). */
#include "tenancy.h"
#include "index_engine.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "db.h"
#include "embed.h"
#include "pgsync.h"
#include "idmap.h"
#include "log.h"
#include "memrow.h"
#include "sql_bg.h"
#include "tenants.h"
#include "tiers.h"

#define CHECK_INTERVAL_MS 5000
#define COUNT_FLUSH_MS 1000

struct tenancy {
    server *srv;
    pthread_mutex_t mu;
    idmap *key_refs;     /* key row id -> connections using it */
    idmap *key_tenant;   /* key row id -> tenant id, while in use */
    idmap *tenant_conns; /* tenant id -> connections authenticated as it */
    idmap *revoked;      /* key row ids revoked while in use */
    idmap *deleted;      /* tenant ids deleted */
    idmap *tiers;        /* tenant id -> tier + 1, while it has connections */
    idmap *bucket_at;    /* tenant id -> index in buckets */
    tenancy_bucket *buckets;
    size_t nbuckets, cbuckets;
    idmap *queries; /* tenant id -> queries counted, not yet written */
    idmap *embeds;  /* tenant id -> its embedding model since the last swap seen: see pack */
};

/* An embedding model in an idmap value: the generation above bit 16, the provider in bits
 * 13-15 (0 builtin, 1 openai), the dimension (at most 4096) below. */
#define EMB_DIM_BITS 13
static uint64_t emb_pack(int64_t gen, const char *provider, uint32_t dim)
{
    uint64_t p = strcmp(provider, "openai") == 0 ? 1 : 0;
    return ((uint64_t)gen << 16) | (p << EMB_DIM_BITS) | (dim & ((1u << EMB_DIM_BITS) - 1));
}

tenancy *tenancy_create(server *s)
{
    tenancy *t = calloc(1, sizeof(*t));
    if (!t)
        return NULL;
    t->srv = s;
    pthread_mutex_init(&t->mu, NULL);
    t->key_refs = idmap_create(64);
    t->key_tenant = idmap_create(64);
    t->tenant_conns = idmap_create(64);
    t->revoked = idmap_create(16);
    t->deleted = idmap_create(16);
    t->tiers = idmap_create(64);
    t->bucket_at = idmap_create(64);
    t->queries = idmap_create(64);
    t->embeds = idmap_create(16);
    if (!t->embeds || !t->key_refs || !t->key_tenant || !t->tenant_conns || !t->revoked ||
        !t->deleted || !t->tiers || !t->bucket_at || !t->queries) {
        tenancy_destroy(t);
        return NULL;
    }
    return t;
}

void tenancy_destroy(tenancy *t)
{
    if (!t)
        return;
    idmap_destroy(t->key_refs);
    idmap_destroy(t->key_tenant);
    idmap_destroy(t->tenant_conns);
    idmap_destroy(t->revoked);
    idmap_destroy(t->deleted);
    idmap_destroy(t->tiers);
    idmap_destroy(t->bucket_at);
    idmap_destroy(t->queries);
    idmap_destroy(t->embeds);
    free(t->buckets);
    pthread_mutex_destroy(&t->mu);
    free(t);
}

/* Counts one more connection of key_id (tenant_id, tier). Lock held. */
static void key_in_use(tenancy *t, int64_t key_id, int64_t tenant_id, int tier)
{
    uint64_t n = 0;
    idmap_get(t->key_refs, (uint64_t)key_id, &n);
    idmap_put(t->key_refs, (uint64_t)key_id, n + 1);
    idmap_put(t->key_tenant, (uint64_t)key_id, (uint64_t)tenant_id);
    n = 0;
    idmap_get(t->tenant_conns, (uint64_t)tenant_id, &n);
    idmap_put(t->tenant_conns, (uint64_t)tenant_id, n + 1);
    /* a fresh authentication read the tier from the database: it is current */
    idmap_put(t->tiers, (uint64_t)tenant_id, (uint64_t)tier + 1);
}

void tenancy_key_in_use(tenancy *t, int64_t key_id, int64_t tenant_id, int tier)
{
    pthread_mutex_lock(&t->mu);
    key_in_use(t, key_id, tenant_id, tier);
    pthread_mutex_unlock(&t->mu);
}

bool tenancy_key_claim(tenancy *t, int64_t key_id, int64_t tenant_id, int tier, int64_t cap,
                       int64_t *in_use)
{
    pthread_mutex_lock(&t->mu);
    uint64_t n = 0;
    idmap_get(t->tenant_conns, (uint64_t)tenant_id, &n);
    *in_use = (int64_t)n;
    bool ok = cap <= 0 || (int64_t)n < cap;
    if (ok)
        key_in_use(t, key_id, tenant_id, tier);
    pthread_mutex_unlock(&t->mu);
    return ok;
}

void tenancy_key_released(tenancy *t, int64_t key_id)
{
    pthread_mutex_lock(&t->mu);
    uint64_t n = 0;
    if (idmap_get(t->key_refs, (uint64_t)key_id, &n)) {
        uint64_t tid = 0, c = 0;
        if (idmap_get(t->key_tenant, (uint64_t)key_id, &tid) &&
            idmap_get(t->tenant_conns, tid, &c)) {
            if (c <= 1) {
                /* its next connection reads the tier afresh (key_in_use): an idle tenant
                 * costs no entry here */
                idmap_del(t->tenant_conns, tid);
                idmap_del(t->tiers, tid);
            } else
                idmap_put(t->tenant_conns, tid, c - 1);
        }
        if (n <= 1) {
            idmap_del(t->key_refs, (uint64_t)key_id);
            idmap_del(t->key_tenant, (uint64_t)key_id);
            idmap_del(t->revoked, (uint64_t)key_id); /* nobody holds it: the database decides */
        } else {
            idmap_put(t->key_refs, (uint64_t)key_id, n - 1);
        }
    }
    pthread_mutex_unlock(&t->mu);
}

bool tenancy_key_ok(tenancy *t, int64_t key_id, int64_t tenant_id)
{
    uint64_t v;
    pthread_mutex_lock(&t->mu);
    bool ok = !idmap_get(t->revoked, (uint64_t)key_id, &v) &&
              !idmap_get(t->deleted, (uint64_t)tenant_id, &v);
    pthread_mutex_unlock(&t->mu);
    return ok;
}

int tenancy_tier(tenancy *t, int64_t tenant_id, int fallback)
{
    uint64_t v;
    pthread_mutex_lock(&t->mu);
    int tier = idmap_get(t->tiers, (uint64_t)tenant_id, &v) ? (int)v - 1 : fallback;
    pthread_mutex_unlock(&t->mu);
    return tier;
}

void tenancy_revoked(tenancy *t, int64_t key_id)
{
    uint64_t v;
    pthread_mutex_lock(&t->mu);
    if (idmap_get(t->key_refs, (uint64_t)key_id, &v))
        idmap_put(t->revoked, (uint64_t)key_id, 1);
    pthread_mutex_unlock(&t->mu);
}

void tenancy_deleted(tenancy *t, int64_t tenant_id)
{
    pthread_mutex_lock(&t->mu);
    idmap_put(t->deleted, (uint64_t)tenant_id, 1);
    pthread_mutex_unlock(&t->mu);
    tenants_forget(t->srv->tenants, tenant_id);
}

void tenancy_tier_changed(tenancy *t, int64_t tenant_id, int tier)
{
    if (tier < 0 || tier >= TIER_COUNT)
        return;
    pthread_mutex_lock(&t->mu);
    /* only tenants with connections are tracked: the others read theirs when they connect
     * (one that connects meanwhile read it from the database, or check_keys corrects it) */
    if (idmap_get(t->tenant_conns, (uint64_t)tenant_id, NULL))
        idmap_put(t->tiers, (uint64_t)tenant_id, (uint64_t)tier + 1);
    pthread_mutex_unlock(&t->mu);
}

void tenancy_embedding_changed(tenancy *t, int64_t tenant_id, int64_t gen, const char *provider,
                               uint32_t dim, bool swapped)
{
    if (gen < 0 || dim == 0 || dim >= (1u << EMB_DIM_BITS))
        return;
    uint64_t v = 0;
    pthread_mutex_lock(&t->mu);
    bool known = idmap_get(t->embeds, (uint64_t)tenant_id, &v);
    bool newer = !known || (int64_t)(v >> 16) < gen;
    if (newer)
        idmap_put(t->embeds, (uint64_t)tenant_id, emb_pack(gen, provider, dim));
    pthread_mutex_unlock(&t->mu);
    /* the periodic check's first news of a tenant is no change: it only learns the model */
    if (newer && (known || swapped)) {
        log_info("tenant %lld: embedding model now %s (dimension %u, generation %lld): index "
                 "dropped, rebuilt from the database on its next use",
                 (long long)tenant_id, provider, dim, (long long)gen);
        tenants_dim_changed(t->srv->tenants, tenant_id, dim);
    }
}

void tenancy_embedding(tenancy *t, int64_t tenant_id, int64_t *gen, uint32_t *dim, char *provider)
{
    uint64_t v = 0;
    pthread_mutex_lock(&t->mu);
    bool known = idmap_get(t->embeds, (uint64_t)tenant_id, &v);
    pthread_mutex_unlock(&t->mu);
    if (!known || (int64_t)(v >> 16) <= *gen)
        return;
    *gen = (int64_t)(v >> 16);
    *dim = (uint32_t)(v & ((1u << EMB_DIM_BITS) - 1));
    snprintf(provider, 16, "%s", (v >> EMB_DIM_BITS) & 7 ? "openai" : "builtin");
}

void tenancy_notify(tenancy *t, const char *payload)
{
    long long id = 0, gen = 0;
    unsigned dim = 0;
    char name[32];
    if (sscanf(payload, "embedding:%lld:%lld:%31[^:]:%u", &id, &gen, name, &dim) == 4)
        tenancy_embedding_changed(t, id, gen, name, dim, true);
    else if (sscanf(payload, "revoked:%lld", &id) == 1)
        tenancy_revoked(t, id);
    else if (sscanf(payload, "deleted:%lld", &id) == 1)
        tenancy_deleted(t, id);
    else if (sscanf(payload, "tier:%lld:%31s", &id, name) == 2)
        tenancy_tier_changed(t, id, tier_parse(name, strlen(name)));
    else if (sscanf(payload, "engine:%lld:%31s", &id, name) == 2) {
        /* "default": the tenant follows this server's setting */
        const char *e = strcmp(name, "default") == 0 ? t->srv->cfg.index_engine : name;
        tenants_engine_changed(t->srv->tenants, id, index_engine_parse(e, strlen(e)));
    }
}

bool tenancy_bucket_take(tenancy_bucket *b, double rate_per_s, double burst, uint64_t now_ns,
                         uint64_t *retry_ms)
{
    if (now_ns > b->last_ns) {
        b->tokens += (double)(now_ns - b->last_ns) / 1e9 * rate_per_s;
        b->last_ns = now_ns;
    }
    if (b->tokens > burst)
        b->tokens = burst;
    if (b->tokens >= 1.0) {
        b->tokens -= 1.0;
        return true;
    }
    *retry_ms = (uint64_t)ceil((1.0 - b->tokens) / rate_per_s * 1000.0);
    if (*retry_ms == 0)
        *retry_ms = 1;
    return false;
}

bool tenancy_rate_take(tenancy *t, int64_t tenant_id, int tier, uint64_t *retry_ms)
{
    const tier_limits *lim = &server_tiers(t->srv)[tier >= 0 && tier < TIER_COUNT ? tier : 0];
    if (lim->rate_per_s <= 0)
        return true;
    uint64_t now = server_mono_ns();
    pthread_mutex_lock(&t->mu);
    uint64_t at;
    if (!idmap_get(t->bucket_at, (uint64_t)tenant_id, &at)) {
        if (t->nbuckets == t->cbuckets) {
            size_t cap = t->cbuckets ? t->cbuckets * 2 : 64;
            tenancy_bucket *b = realloc(t->buckets, cap * sizeof(*b));
            if (!b) {
                pthread_mutex_unlock(&t->mu);
                return true; /* cannot track: let it through rather than refuse service */
            }
            t->buckets = b;
            t->cbuckets = cap;
        }
        at = t->nbuckets++;
        t->buckets[at] =
            (tenancy_bucket){.tokens = lim->rate_burst, .last_ns = now, .tenant = tenant_id};
        idmap_put(t->bucket_at, (uint64_t)tenant_id, at);
    }
    bool ok = tenancy_bucket_take(&t->buckets[at], lim->rate_per_s, lim->rate_burst, now, retry_ms);
    pthread_mutex_unlock(&t->mu);
    return ok;
}

size_t tenancy_sweep_buckets(tenancy *t, uint64_t now_ns)
{
    /* the longest any tier's bucket takes to fill from empty: a bucket idle that long is
     * full whatever tier its tenant has (after a reload that lowered a rate, one forgotten a
     * little early starts full: the old limits' leniency, once) */
    const tier_limits *lim = server_tiers(t->srv);
    double full_s = 0;
    for (int i = 0; i < TIER_COUNT; i++)
        if (lim[i].rate_per_s > 0 && lim[i].rate_burst / lim[i].rate_per_s > full_s)
            full_s = lim[i].rate_burst / lim[i].rate_per_s;
    uint64_t full_ns = full_s * 1e9 < 1e18 ? (uint64_t)(full_s * 1e9) : UINT64_MAX;
    size_t gone = 0;
    pthread_mutex_lock(&t->mu);
    for (size_t i = 0; i < t->nbuckets;) {
        tenancy_bucket *b = &t->buckets[i];
        if (now_ns < b->last_ns || now_ns - b->last_ns < full_ns) {
            i++;
            continue;
        }
        idmap_del(t->bucket_at, (uint64_t)b->tenant);
        if (i != --t->nbuckets) {
            *b = t->buckets[t->nbuckets];
            idmap_put(t->bucket_at, (uint64_t)b->tenant, i); /* replaces: never allocates */
        }
        gone++;
    }
    if (t->cbuckets > 64 && t->nbuckets < t->cbuckets / 4) {
        size_t cap = t->cbuckets / 2;
        tenancy_bucket *b = realloc(t->buckets, cap * sizeof(*b));
        if (b) { /* else the larger table stays */
            t->buckets = b;
            t->cbuckets = cap;
        }
    }
    pthread_mutex_unlock(&t->mu);
    return gone;
}

static void sweep_job(bg_ctx *ctx, void *arg)
{
    (void)ctx;
    tenancy_sweep_buckets(arg, server_mono_ns());
}

void tenancy_count_query(tenancy *t, int64_t tenant_id)
{
    pthread_mutex_lock(&t->mu);
    uint64_t n = 0;
    idmap_get(t->queries, (uint64_t)tenant_id, &n);
    idmap_put(t->queries, (uint64_t)tenant_id, n + 1);
    pthread_mutex_unlock(&t->mu);
}

/* ---- periodic work --------------------------------------------------------------------- */

typedef struct id_list {
    uint64_t *a, *b;
    size_t n, cap;
} id_list;

static int collect(uint64_t key, uint64_t value, void *arg)
{
    id_list *l = arg;
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 64;
        uint64_t *a = realloc(l->a, cap * sizeof(*a));
        if (!a)
            return 1;
        l->a = a;
        uint64_t *b = realloc(l->b, cap * sizeof(*b));
        if (!b)
            return 1;
        l->b = b;
        l->cap = cap;
    }
    l->a[l->n] = key;
    l->b[l->n] = value;
    l->n++;
    return 0;
}

static char *literal(const uint64_t *v, size_t n)
{
    char *s = malloc(n * 21 + 3);
    if (!s)
        return NULL;
    char *p = s;
    *p++ = '{';
    for (size_t i = 0; i < n; i++)
        p += sprintf(p, "%s%lld", i ? "," : "", (long long)v[i]);
    *p++ = '}';
    *p = '\0';
    return s;
}

/* Verifies every key in use (revoked elsewhere while our listener was away?) and refreshes
 * the tiers of their tenants. */
static void check_keys(bg_ctx *ctx, void *arg)
{
    tenancy *t = arg;
    id_list keys = {0};
    pthread_mutex_lock(&t->mu);
    idmap_foreach(t->key_tenant, collect, &keys);
    pthread_mutex_unlock(&t->mu);
    if (keys.n == 0)
        return;
    char err[256];
    PGconn *pg = bg_conn(ctx, err, sizeof(err));
    char *klit = literal(keys.a, keys.n), *tlit = literal(keys.b, keys.n);
    if (!pg || !klit || !tlit)
        goto out;
    const char *v1[] = {klit};
    PGresult *r = PGSYNC_EXEC(pg, sqlb_def(SQLB_KEYS_VALID), v1, err, sizeof(err));
    if (r) {
        idmap *valid = idmap_create((size_t)PQntuples(r) + 1);
        for (int i = 0; valid && i < PQntuples(r); i++)
            idmap_put(valid, (uint64_t)memrow_i64_of(r, i, 0, 0, ROWERR_API_KEYS), 1);
        for (size_t i = 0; valid && i < keys.n; i++) {
            uint64_t v;
            if (!idmap_get(valid, keys.a[i], &v)) {
                log_info("key %llu no longer authenticates: closing its access",
                         (unsigned long long)keys.a[i]);
                tenancy_revoked(t, (int64_t)keys.a[i]);
            }
        }
        idmap_destroy(valid);
        PQclear(r);
    }
    const char *v2[] = {tlit};
    r = PGSYNC_EXEC(pg, sqlb_def(SQLB_TENANT_TIERS), v2, err, sizeof(err));
    if (r) {
        for (int i = 0; i < PQntuples(r); i++) {
            const char *tier = PQgetvalue(r, i, 1);
            int64_t tid = memrow_i64_of(r, i, 0, 0, ROWERR_TENANTS);
            int level = tier_parse(tier, strlen(tier));
            if (level < 0)
                rowerr_report(ROWERR_TENANTS, PQfname(r, 1), "not a tier");
            tenancy_tier_changed(t, tid, level); /* ignores an unknown tier */
        }
        PQclear(r);
    } else if (PQstatus(pg) != CONNECTION_OK) {
        bg_conn_failed(ctx);
        goto out;
    }
    /* and their embedding models: a swap whose notification was lost */
    r = PGSYNC_EXEC(pg, sqlb_def(SQLB_TENANT_EMBEDDINGS), v2, err, sizeof(err));
    for (int i = 0; r && i < PQntuples(r); i++) {
        int64_t dim = memrow_i64_of(r, i, 3, 0, ROWERR_TENANTS);
        if (dim > 0 && dim <= EMBED_MAX_DIM)
            tenancy_embedding_changed(t, memrow_i64_of(r, i, 0, 0, ROWERR_TENANTS),
                                      memrow_i64_of(r, i, 1, 0, ROWERR_TENANTS),
                                      PQgetvalue(r, i, 2), (uint32_t)dim, false);
    }
    PQclear(r);
    if (!r && PQstatus(pg) != CONNECTION_OK)
        bg_conn_failed(ctx);
out:
    free(klit);
    free(tlit);
    free(keys.a);
    free(keys.b);
}

/* Writes the counted queries of tiers without a daily limit. */
static void flush_queries(bg_ctx *ctx, void *arg)
{
    tenancy *t = arg;
    id_list q = {0};
    pthread_mutex_lock(&t->mu);
    idmap_foreach(t->queries, collect, &q);
    idmap_clear(t->queries);
    pthread_mutex_unlock(&t->mu);
    if (q.n == 0)
        return;
    char err[256];
    PGconn *pg = bg_conn(ctx, err, sizeof(err));
    char *tl = literal(q.a, q.n), *cl = literal(q.b, q.n);
    PGresult *r = NULL;
    if (pg && tl && cl) {
        const char *v[] = {tl, cl};
        r = PGSYNC_EXEC(pg, sqlb_def(SQLB_QUERY_COUNT), v, err, sizeof(err));
    }
    if (!r) {
        /* keep them for the next attempt */
        pthread_mutex_lock(&t->mu);
        for (size_t i = 0; i < q.n; i++) {
            uint64_t n = 0;
            idmap_get(t->queries, q.a[i], &n);
            idmap_put(t->queries, q.a[i], n + q.b[i]);
        }
        pthread_mutex_unlock(&t->mu);
        if (pg && PQstatus(pg) != CONNECTION_OK)
            bg_conn_failed(ctx);
    }
    PQclear(r);
    free(tl);
    free(cl);
    free(q.a);
    free(q.b);
}

int tenancy_start(tenancy *t)
{
    if (bg_every(t->srv->bg, CHECK_INTERVAL_MS, check_keys, t) < 0 ||
        bg_every(t->srv->bg, COUNT_FLUSH_MS, flush_queries, t) < 0 ||
        bg_every(t->srv->bg, CHECK_INTERVAL_MS, sweep_job, t) < 0)
        return -ENOMEM;
    return 0;
}
