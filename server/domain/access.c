/* server/domain/access.c: the per-worker access count log (see access.h). */
#include "access.h"

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "hash.h"
#include "idmap.h"

struct access_log {
    /* (tenant, memory id) -> index in entries. Ids are numbered per tenant, so the key
     * combines both; two pairs can meet on one key, and the next key is tried then (see
     * find_slot). */
    idmap *pos;
    access_entry *entries;
    size_t n, cap;
};

access_log *access_log_create(void)
{
    access_log *l = calloc(1, sizeof(*l));
    if (!l)
        return NULL;
    l->pos = idmap_create(256);
    if (!l->pos) {
        free(l);
        return NULL;
    }
    return l;
}

void access_log_destroy(access_log *l)
{
    if (!l)
        return;
    idmap_destroy(l->pos);
    free(l->entries);
    free(l);
}

/* find_slot returns the key of (tenant, id) in l->pos, and sets *found and *i when the pair
 * is there; otherwise the key is the free one to insert it under. */
static uint64_t find_slot(const access_log *l, int64_t tenant, uint64_t id, bool *found,
                          uint64_t *i)
{
    uint64_t key = hash_pair((uint64_t)tenant, id);
    for (;; key++) {
        if (key == UINT64_MAX) /* reserved by idmap */
            continue;
        if (!idmap_get(l->pos, key, i)) {
            *found = false;
            return key;
        }
        const access_entry *e = &l->entries[*i];
        if (e->tenant == tenant && e->id == id) {
            *found = true;
            return key;
        }
    }
}

static int add_one(access_log *l, int64_t tenant, uint64_t id, uint64_t count, int64_t ms)
{
    uint64_t i;
    bool found;
    uint64_t key = find_slot(l, tenant, id, &found, &i);
    if (found) {
        l->entries[i].count += count;
        if (ms > l->entries[i].last_ms)
            l->entries[i].last_ms = ms;
        return 0;
    }
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 64;
        access_entry *e = realloc(l->entries, cap * sizeof(*e));
        if (!e)
            return -ENOMEM;
        l->entries = e;
        l->cap = cap;
    }
    if (idmap_put(l->pos, key, l->n) < 0)
        return -ENOMEM;
    l->entries[l->n++] = (access_entry){.tenant = tenant, .id = id, .count = count, .last_ms = ms};
    return 0;
}

int access_log_add(access_log *l, int64_t tenant, const uint64_t *ids, size_t n, int64_t now_ms)
{
    for (size_t i = 0; i < n; i++)
        if (add_one(l, tenant, ids[i], 1, now_ms) < 0)
            return -ENOMEM;
    return 0;
}

int access_log_merge(access_log *l, const access_entry *e, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (add_one(l, e[i].tenant, e[i].id, e[i].count, e[i].last_ms) < 0)
            return -ENOMEM;
    return 0;
}

size_t access_log_count(const access_log *l)
{
    return l->n;
}

int access_log_take(access_log *l, access_entry **out, size_t *n)
{
    *out = NULL;
    *n = 0;
    if (l->n == 0)
        return 0;
    *out = l->entries;
    *n = l->n;
    l->entries = NULL;
    l->n = l->cap = 0;
    /* a burst (a second of searches over many tenants) grows the map; it need not stay that
     * size between flushes (1 MiB at 40,000 entries) */
    idmap *fresh = idmap_bytes(l->pos) > 64 * 1024 ? idmap_create(256) : NULL;
    if (fresh) {
        idmap_destroy(l->pos);
        l->pos = fresh;
    } else {
        idmap_clear(l->pos);
    }
    return 0;
}
