/* util/idmap.c: open-addressing uint64 -> uint64 hash map, linear probing, backward-shift
 * deletion (no tombstones, so lookups never slow down after many deletions).
 *
 * Entries are {key, value} pairs in one array of power-of-two capacity; an empty entry holds
 * the reserved key UINT64_MAX. The map grows (doubling) before an insertion would push the
 * load factor past 0.7. Keys are hashed with a fixed 64-bit finalizer (hash_mix64), so the
 * layout is deterministic; keys are assumed not to be chosen by an adversary (they are
 * memory ids the server assigns).
 */
#include "idmap.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "hash.h"

#define EMPTY_KEY UINT64_MAX
#define MIN_CAP 8

typedef struct entry {
    uint64_t key;
    uint64_t value;
} entry;

struct idmap {
    entry *slots; /* owned; cap entries */
    size_t cap;   /* power of two, >= MIN_CAP */
    size_t mask;  /* cap - 1 */
    size_t count; /* keys present */
};

/* max_count is the number of keys cap slots may hold before the map must grow (load 0.7). */
static size_t max_count(size_t cap)
{
    return cap / 10 * 7 + cap % 10 * 7 / 10;
}

/* cap_for returns the smallest power-of-two capacity that holds n keys under the load limit,
 * or 0 on overflow. */
static size_t cap_for(size_t n)
{
    size_t cap = MIN_CAP;
    while (max_count(cap) < n) {
        if (cap > SIZE_MAX / 2 / sizeof(entry))
            return 0;
        cap *= 2;
    }
    return cap;
}

static entry *alloc_slots(size_t cap)
{
    entry *s = malloc(cap * sizeof(*s));
    if (!s)
        return NULL;
    for (size_t i = 0; i < cap; i++)
        s[i].key = EMPTY_KEY;
    return s;
}

/* idmap_create returns an empty map sized for about hint entries, or NULL when out of
 * memory (or when hint is too large to size). */
idmap *idmap_create(size_t hint)
{
    size_t cap = cap_for(hint);
    if (!cap)
        return NULL;
    idmap *m = malloc(sizeof(*m));
    if (!m)
        return NULL;
    m->slots = alloc_slots(cap);
    if (!m->slots) {
        free(m);
        return NULL;
    }
    m->cap = cap;
    m->mask = cap - 1;
    m->count = 0;
    return m;
}

/* idmap_destroy frees the map and its entries; NULL is a no-op. */
void idmap_destroy(idmap *m)
{
    if (!m)
        return;
    free(m->slots);
    free(m);
}

/* find returns the index of key's entry, or of the empty entry where it would go. */
static size_t find(const idmap *m, uint64_t key)
{
    size_t i = (size_t)hash_mix64(key) & m->mask;
    while (m->slots[i].key != key && m->slots[i].key != EMPTY_KEY)
        i = (i + 1) & m->mask;
    return i;
}

/* grow rehashes into twice the capacity; returns 0 or -ENOMEM with the map unchanged. */
static int grow(idmap *m)
{
    if (m->cap > SIZE_MAX / 2 / sizeof(entry))
        return -ENOMEM;
    size_t ncap = m->cap * 2;
    entry *ns = alloc_slots(ncap);
    if (!ns)
        return -ENOMEM;
    entry *old = m->slots;
    size_t ocap = m->cap;
    m->slots = ns;
    m->cap = ncap;
    m->mask = ncap - 1;
    for (size_t i = 0; i < ocap; i++) {
        if (old[i].key != EMPTY_KEY)
            m->slots[find(m, old[i].key)] = old[i];
    }
    free(old);
    return 0;
}

/* idmap_put sets key to value. Returns 0, -EINVAL for the reserved key, or -ENOMEM when a
 * new key needs the map to grow and that fails (the map is unchanged then). Replacing the
 * value of a key already present never allocates and never fails. */
int idmap_put(idmap *m, uint64_t key, uint64_t value)
{
    if (key == EMPTY_KEY)
        return -EINVAL;
    size_t i = find(m, key);
    if (m->slots[i].key == key) {
        m->slots[i].value = value;
        return 0;
    }
    if (m->count + 1 > max_count(m->cap)) {
        int rc = grow(m);
        if (rc)
            return rc;
        i = find(m, key);
    }
    m->slots[i].key = key;
    m->slots[i].value = value;
    m->count++;
    return 0;
}

/* idmap_get stores the value of key in *value (when value is not NULL) and returns true, or
 * returns false when key is absent. */
bool idmap_get(const idmap *m, uint64_t key, uint64_t *value)
{
    if (key == EMPTY_KEY)
        return false;
    size_t i = find(m, key);
    if (m->slots[i].key != key)
        return false;
    if (value)
        *value = m->slots[i].value;
    return true;
}

/* idmap_del removes key and returns true when it was present. Backward-shift deletion: the
 * entries after the hole that would be unreachable across it move back into it. */
bool idmap_del(idmap *m, uint64_t key)
{
    if (key == EMPTY_KEY)
        return false;
    size_t hole = find(m, key);
    if (m->slots[hole].key != key)
        return false;
    size_t j = hole;
    for (;;) {
        j = (j + 1) & m->mask;
        if (m->slots[j].key == EMPTY_KEY)
            break;
        size_t home = (size_t)hash_mix64(m->slots[j].key) & m->mask;
        /* The entry at j may move to hole only when its home is not cyclically within
         * (hole, j]: otherwise a lookup starting at home would never pass the hole. */
        if (((j - home) & m->mask) >= ((j - hole) & m->mask)) {
            m->slots[hole] = m->slots[j];
            hole = j;
        }
    }
    m->slots[hole].key = EMPTY_KEY;
    m->count--;
    return true;
}

/* idmap_count returns the number of keys. */
size_t idmap_count(const idmap *m)
{
    return m->count;
}

/* idmap_room returns how many new keys fit under the load limit without growing. */
size_t idmap_room(const idmap *m)
{
    return max_count(m->cap) - m->count;
}

/* idmap_clone returns a copy of m with capacity for at least max(hint, count) keys, or NULL
 * when out of memory. */
idmap *idmap_clone(const idmap *m, size_t hint)
{
    idmap *c = idmap_create(hint > m->count ? hint : m->count);
    if (!c)
        return NULL;
    for (size_t i = 0; i < m->cap; i++) {
        if (m->slots[i].key != EMPTY_KEY)
            c->slots[find(c, m->slots[i].key)] = m->slots[i];
    }
    c->count = m->count;
    return c;
}

/* idmap_clear removes every key and keeps the capacity. */
void idmap_clear(idmap *m)
{
    for (size_t i = 0; i < m->cap; i++)
        m->slots[i].key = EMPTY_KEY;
    m->count = 0;
}

/* idmap_bytes returns the bytes the map holds: the handle plus the entry array. */
size_t idmap_bytes(const idmap *m)
{
    return sizeof(*m) + m->cap * sizeof(entry);
}

/* idmap_foreach calls fn(key, value, ctx) for every key in table order; returns the first
 * non-zero value fn returns, or 0. */
int idmap_foreach(const idmap *m, int (*fn)(uint64_t key, uint64_t value, void *ctx), void *ctx)
{
    for (size_t i = 0; i < m->cap; i++) {
        if (m->slots[i].key == EMPTY_KEY)
            continue;
        int rc = fn(m->slots[i].key, m->slots[i].value, ctx);
        if (rc)
            return rc;
    }
    return 0;
}
