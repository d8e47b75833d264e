/* index/vindex_map.c: the map from a live id to its slot (see vmap in vindex_int.h).
 *
 * Open addressing with linear probing over uint32 entries holding slot + 1 (0: empty); the
 * key of an entry is the id stored in that slot, read from the storage, so the map itself
 * holds 4 bytes an entry. The load stays at most 3/4; the capacity is any number, and the
 * home of a key is the high half of hash * capacity (no power of two, so a map is sized to
 * its count rather than to the next doubling). Deletion shifts the entries after the hole
 * back, so lookups never slow down after many deletions. The locking is the storage's:
 * lookups under the shared lock or wmu, changes under wmu and the exclusive lock.
 */
#include "vindex.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "hash.h"
#include "vindex_int.h"

__extension__ typedef unsigned __int128 u128;

#define MIN_CAP 8

static size_t home(const vmap *m, uint64_t id)
{
    return (size_t)(((u128)hash_mix64(id) * m->cap) >> 64);
}

static size_t next(const vmap *m, size_t i)
{
    return i + 1 == m->cap ? 0 : i + 1;
}

static size_t max_count(size_t cap)
{
    return cap / 4 * 3 + cap % 4 * 3 / 4;
}

/* vm_init sizes m for hint entries. Returns 0 or -ENOMEM. */
int vm_init(vmap *m, size_t hint)
{
    size_t cap = hint + hint / 3 + 1;
    if (cap < MIN_CAP)
        cap = MIN_CAP;
    if (cap > MAX_SLOTS)
        cap = MAX_SLOTS;
    m->tab = calloc(cap, sizeof(uint32_t));
    if (!m->tab) {
        m->cap = m->count = 0;
        return -ENOMEM;
    }
    m->cap = cap;
    m->count = 0;
    return 0;
}

void vm_free(vmap *m)
{
    free(m->tab);
    m->tab = NULL;
    m->cap = m->count = 0;
}

size_t vm_bytes(const vmap *m)
{
    return m->cap * sizeof(uint32_t);
}

size_t vm_room(const vmap *m)
{
    size_t most = max_count(m->cap);
    return most > m->count ? most - m->count : 0;
}

/* vm_find returns the slot of id in st, or -1. */
int64_t vm_find(const vindex *vi, const vstore *st, uint64_t id)
{
    const vmap *m = &st->map;
    if (!m->cap)
        return -1;
    for (size_t i = home(m, id);; i = next(m, i)) {
        uint32_t e = m->tab[i];
        if (!e)
            return -1;
        if (st_id(vi, st, e - 1) == id)
            return (int64_t)(e - 1);
    }
}

/* vm_put maps id to slot: replaces the entry whose slot holds id, or takes an empty one
 * (vm_room was positive). */
void vm_put(const vindex *vi, vstore *st, uint64_t id, uint32_t slot)
{
    vmap *m = &st->map;
    size_t i = home(m, id);
    while (m->tab[i] && st_id(vi, st, m->tab[i] - 1) != id)
        i = next(m, i);
    if (!m->tab[i])
        m->count++;
    m->tab[i] = slot + 1;
}

/* between tells whether k lies cyclically in (i, j]. */
static bool between(size_t i, size_t k, size_t j)
{
    return i <= j ? i < k && k <= j : i < k || k <= j;
}

/* vm_del removes id's entry (backward shift). Returns true when there was one. */
bool vm_del(const vindex *vi, vstore *st, uint64_t id)
{
    vmap *m = &st->map;
    if (!m->cap)
        return false;
    size_t i = home(m, id);
    while (m->tab[i] && st_id(vi, st, m->tab[i] - 1) != id)
        i = next(m, i);
    if (!m->tab[i])
        return false;
    for (size_t j = next(m, i);; j = next(m, j)) {
        uint32_t e = m->tab[j];
        if (!e)
            break;
        size_t k = home(m, st_id(vi, st, e - 1));
        if (between(i, k, j))
            continue; /* its home is after the hole: it stays */
        m->tab[i] = e;
        i = j;
    }
    m->tab[i] = 0;
    m->count--;
    return true;
}

/* vm_rehash builds into out a copy of m sized for hint entries (at least m's count).
 * Returns 0 or -ENOMEM. */
int vm_rehash(const vindex *vi, const vstore *st, const vmap *m, size_t hint, vmap *out)
{
    if (hint < m->count)
        hint = m->count;
    if (vm_init(out, hint))
        return -ENOMEM;
    for (size_t i = 0; i < m->cap; i++) {
        uint32_t e = m->tab[i];
        if (!e)
            continue;
        size_t h = home(out, st_id(vi, st, e - 1));
        while (out->tab[h])
            h = next(out, h);
        out->tab[h] = e;
        out->count++;
    }
    return 0;
}
