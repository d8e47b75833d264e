/* storage/citusmap.c: which Citus node holds each tenant (see citusmap.h). */
#include "citusmap.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pgsync.h"

typedef struct crange {
    int32_t min, max; /* the shard's hash range, inclusive */
    int group;        /* pg_dist_placement.groupid of its placement */
} crange;

struct cmap {
    pthread_mutex_t mu;
    crange *r; /* sorted by min; owned */
    size_t n;
    uint64_t loads;
};

/* PostgreSQL's hash_bytes_uint32 (src/common/hashfn.c: Bob Jenkins' lookup3 final mix). */
#define ROT(x, k) (((x) << (k)) | ((x) >> (32 - (k))))

static uint32_t hash_uint32(uint32_t k)
{
    uint32_t a, b, c;
    a = b = c = 0x9e3779b9u + (uint32_t)sizeof(uint32_t) + 3923095u;
    a += k;
    c ^= b;
    c -= ROT(b, 14);
    a ^= c;
    a -= ROT(c, 11);
    b ^= a;
    b -= ROT(a, 25);
    c ^= b;
    c -= ROT(b, 16);
    a ^= c;
    a -= ROT(c, 4);
    b ^= a;
    b -= ROT(a, 14);
    c ^= b;
    c -= ROT(b, 24);
    return c;
}

int32_t cmap_hashint8(int64_t v)
{
    /* hashint8: the low half xor the high half (its complement for a negative value), so
     * that a value that fits an int4 hashes as hashint4 does */
    uint32_t lo = (uint32_t)(uint64_t)v, hi = (uint32_t)((uint64_t)v >> 32);
    lo ^= v >= 0 ? hi : ~hi;
    return (int32_t)hash_uint32(lo);
}

cmap *cmap_create(void)
{
    cmap *m = calloc(1, sizeof(*m));
    if (!m)
        return NULL;
    if (pthread_mutex_init(&m->mu, NULL) != 0) {
        free(m);
        return NULL;
    }
    return m;
}

void cmap_destroy(cmap *m)
{
    if (!m)
        return;
    pthread_mutex_destroy(&m->mu);
    free(m->r);
    free(m);
}

int cmap_load(cmap *m, PGconn *c, char *err, size_t errlen)
{
    /* one row a shard of tenants and placement, in hash order; a shard whose move is being
     * finished may show two placements for a moment: the first one stands */
    PGresult *res = pgsync_exec(c,
                                "SELECT s.shardminvalue::int, s.shardmaxvalue::int, p.groupid "
                                "FROM pg_dist_shard s JOIN pg_dist_placement p USING (shardid) "
                                "WHERE s.logicalrelid = 'tenants'::regclass "
                                "ORDER BY 1, p.placementid",
                                0, NULL, err, errlen);
    if (!res)
        return -EIO;
    int nt = PQntuples(res);
    if (nt == 0) {
        snprintf(err, errlen, "tenants has no shards (not a Citus table?)");
        PQclear(res);
        return -EIO;
    }
    crange *r = malloc((size_t)nt * sizeof(*r));
    if (!r) {
        PQclear(res);
        return -ENOMEM;
    }
    size_t n = 0;
    for (int i = 0; i < nt; i++) {
        crange x = {(int32_t)strtol(PQgetvalue(res, i, 0), NULL, 10),
                    (int32_t)strtol(PQgetvalue(res, i, 1), NULL, 10), atoi(PQgetvalue(res, i, 2))};
        if (n > 0 && r[n - 1].min == x.min)
            continue;
        r[n++] = x;
    }
    PQclear(res);
    pthread_mutex_lock(&m->mu);
    crange *old = m->r;
    m->r = r;
    m->n = n;
    m->loads++;
    pthread_mutex_unlock(&m->mu);
    free(old);
    return (int)n;
}

int cmap_node(cmap *m, int64_t tenant)
{
    if (!m)
        return -1;
    int32_t h = cmap_hashint8(tenant);
    int group = -1;
    pthread_mutex_lock(&m->mu);
    size_t lo = 0, hi = m->n; /* the last range whose min <= h */
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (m->r[mid].min <= h)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo > 0 && h <= m->r[lo - 1].max)
        group = m->r[lo - 1].group;
    pthread_mutex_unlock(&m->mu);
    return group;
}

uint64_t cmap_loads(cmap *m)
{
    if (!m)
        return 0;
    pthread_mutex_lock(&m->mu);
    uint64_t n = m->loads;
    pthread_mutex_unlock(&m->mu);
    return n;
}
