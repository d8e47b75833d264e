/* server/domain/rowcache.c: the memory row cache (see rowcache.h). */
#include "rowcache.h"

#include <malloc.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "hash.h"

#define STRIPES 16

/* One cached row; the strings follow the struct in the same allocation. */
typedef struct entry {
    struct entry *hnext;       /* hash chain */
    struct entry *prev, *next; /* LRU list, most recent first */
    int64_t tenant;
    memrow row;  /* string pointers point into data[] */
    size_t size; /* bytes charged: the whole allocation, as the allocator sized it */
    char data[];
} entry;

typedef struct stripe {
    pthread_mutex_t mu;
    entry **buckets;
    size_t nbuckets, count, bytes, budget;
    entry *head, *tail;
} stripe;

struct rowcache {
    stripe s[STRIPES];
    atomic_uint_least64_t hits, misses;
};

static uint64_t mix(int64_t tenant, uint64_t id)
{
    return hash_mix64(hash_pair((uint64_t)tenant, id));
}

rowcache *rc_create(size_t bytes)
{
    rowcache *c = calloc(1, sizeof(*c));
    if (!c)
        return NULL;
    for (int i = 0; i < STRIPES; i++) {
        stripe *s = &c->s[i];
        pthread_mutex_init(&s->mu, NULL);
        s->budget = bytes / STRIPES;
        s->nbuckets = 1024;
        s->buckets = calloc(s->nbuckets, sizeof(*s->buckets));
        if (!s->buckets) {
            rc_destroy(c);
            return NULL;
        }
    }
    return c;
}

void rc_destroy(rowcache *c)
{
    if (!c)
        return;
    for (int i = 0; i < STRIPES; i++) {
        stripe *s = &c->s[i];
        entry *e = s->head;
        while (e) {
            entry *next = e->next;
            free(e);
            e = next;
        }
        free(s->buckets);
        pthread_mutex_destroy(&s->mu);
    }
    free(c);
}

static entry **slot_of(stripe *s, int64_t tenant, uint64_t id, uint64_t h)
{
    entry **p = &s->buckets[(h >> 4) & (s->nbuckets - 1)];
    while (*p && ((*p)->tenant != tenant || (*p)->row.id != id))
        p = &(*p)->hnext;
    return p;
}

static void lru_unlink(stripe *s, entry *e)
{
    if (e->prev)
        e->prev->next = e->next;
    else
        s->head = e->next;
    if (e->next)
        e->next->prev = e->prev;
    else
        s->tail = e->prev;
    e->prev = e->next = NULL;
}

static void lru_push(stripe *s, entry *e)
{
    e->prev = NULL;
    e->next = s->head;
    if (s->head)
        s->head->prev = e;
    s->head = e;
    if (!s->tail)
        s->tail = e;
}

/* Removes e from the stripe and frees it. */
static void drop(stripe *s, entry *e)
{
    entry **p = slot_of(s, e->tenant, e->row.id, mix(e->tenant, e->row.id));
    if (*p == e)
        *p = e->hnext;
    lru_unlink(s, e);
    s->count--;
    s->bytes -= e->size;
    free(e);
}

void rc_forget_tenant(rowcache *c, int64_t tenant)
{
    for (int i = 0; c && i < STRIPES; i++) {
        stripe *s = &c->s[i];
        pthread_mutex_lock(&s->mu);
        for (entry *e = s->head; e;) {
            entry *next = e->next;
            if (e->tenant == tenant)
                drop(s, e);
            e = next;
        }
        pthread_mutex_unlock(&s->mu);
    }
}

/* Doubles the bucket array when the chains grow long (best effort). */
static void grow(stripe *s)
{
    size_t n = s->nbuckets * 2;
    entry **b = calloc(n, sizeof(*b));
    if (!b)
        return;
    for (size_t i = 0; i < s->nbuckets; i++) {
        entry *e = s->buckets[i];
        while (e) {
            entry *next = e->hnext;
            entry **p = &b[(mix(e->tenant, e->row.id) >> 4) & (n - 1)];
            e->hnext = *p;
            *p = e;
            e = next;
        }
    }
    free(s->buckets);
    s->buckets = b;
    s->nbuckets = n;
}

static char *copy_str(const char *src, size_t n, void *(*alloc)(void *ctx, size_t n), void *ctx)
{
    char *d = alloc(ctx, n + 1);
    if (d) {
        memcpy(d, src, n);
        d[n] = '\0';
    }
    return d;
}

bool rc_get(rowcache *c, int64_t tenant, uint64_t id, uint64_t seq, memrow *out,
            void *(*alloc)(void *ctx, size_t n), void *ctx)
{
    if (!c || !seq)
        return false;
    uint64_t h = mix(tenant, id);
    stripe *s = &c->s[h % STRIPES];
    bool ok = false;
    pthread_mutex_lock(&s->mu);
    entry *e = *slot_of(s, tenant, id, h);
    if (e && e->row.seq == seq) {
        *out = e->row;
        const memrow *m = &e->row;
        out->content = copy_str(m->content, m->content_len, alloc, ctx);
        out->metadata_json = copy_str(m->metadata_json, m->metadata_len, alloc, ctx);
        out->archived_reason = m->archived_reason ? copy_str(m->archived_reason,
                                                             strlen(m->archived_reason), alloc, ctx)
                                                  : NULL;
        ok = out->content && out->metadata_json && (!m->archived_reason || out->archived_reason);
        lru_unlink(s, e);
        lru_push(s, e);
    }
    pthread_mutex_unlock(&s->mu);
    atomic_fetch_add_explicit(ok ? &c->hits : &c->misses, 1, memory_order_relaxed);
    return ok;
}

void rc_put(rowcache *c, int64_t tenant, const memrow *m)
{
    if (!c || !m->seq)
        return;
    uint64_t h = mix(tenant, m->id);
    stripe *s = &c->s[h % STRIPES];
    size_t rlen = m->archived_reason ? strlen(m->archived_reason) : 0;
    size_t size = sizeof(entry) + m->content_len + 1 + m->metadata_len + 1 +
                  (m->archived_reason ? rlen + 1 : 0);
    if (size > s->budget)
        return;
    entry *e = malloc(size);
    if (!e)
        return;
    memset(e, 0, sizeof(*e));
    e->tenant = tenant;
    e->row = *m;
    /* what the allocator took, its chunk header included: rows of small memories are a few
     * hundred bytes, and the rounding and header (16 to 24 bytes) were 5 to 10% of the
     * cache uncounted by its budget and its metric (bench/README, many tenants). The bucket
     * arrays (at most 8 bytes a row) stay uncounted. */
    e->size = malloc_usable_size(e) + sizeof(size_t);
    char *p = e->data;
    memcpy(p, m->content, m->content_len);
    p[m->content_len] = '\0';
    e->row.content = p;
    p += m->content_len + 1;
    memcpy(p, m->metadata_json, m->metadata_len);
    p[m->metadata_len] = '\0';
    e->row.metadata_json = p;
    p += m->metadata_len + 1;
    if (m->archived_reason) {
        memcpy(p, m->archived_reason, rlen + 1);
        e->row.archived_reason = p;
    }
    pthread_mutex_lock(&s->mu);
    entry **slot = slot_of(s, tenant, m->id, h);
    if (*slot && (*slot)->row.seq >= m->seq) {
        pthread_mutex_unlock(&s->mu); /* as new or newer already */
        free(e);
        return;
    }
    if (*slot)
        drop(s, *slot);
    slot = slot_of(s, tenant, m->id, h);
    e->hnext = *slot;
    *slot = e;
    lru_push(s, e);
    s->count++;
    s->bytes += e->size;
    while (s->bytes > s->budget && s->tail && s->tail != e)
        drop(s, s->tail);
    if (s->count > s->nbuckets * 2)
        grow(s);
    pthread_mutex_unlock(&s->mu);
}

void rc_stats(rowcache *c, uint64_t *entries, uint64_t *bytes, uint64_t *hits, uint64_t *misses)
{
    *entries = *bytes = 0;
    for (int i = 0; c && i < STRIPES; i++) {
        pthread_mutex_lock(&c->s[i].mu);
        *entries += c->s[i].count;
        *bytes += c->s[i].bytes;
        pthread_mutex_unlock(&c->s[i].mu);
    }
    *hits = c ? atomic_load(&c->hits) : 0;
    *misses = c ? atomic_load(&c->misses) : 0;
}
