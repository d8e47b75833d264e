/* util/idmap.h: an open-addressing hash map from uint64 keys to uint64 values.
 *
 * Used for memory id -> slot lookups in the vector index and for the server's id tables
 * (tenants, connections per address, access counts, ...). Key UINT64_MAX is reserved.
 *
 * Ownership: the map owns its entry array; idmap_create/idmap_clone return a map the caller
 * frees with idmap_destroy. Thread-safety: none of its own; the owner serializes access
 * (concurrent readers are fine when no writer runs). Results: 0 or -errno (-ENOMEM,
 * -EINVAL) where a function returns int; lookups return bool.
 */
#ifndef ENGRAM_UTIL_IDMAP_H
#define ENGRAM_UTIL_IDMAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct idmap idmap;

/* idmap_create returns an empty map sized for about hint entries, or NULL when out of
 * memory. Free with idmap_destroy (NULL is a no-op). */
idmap *idmap_create(size_t hint);
void idmap_destroy(idmap *m);

/* idmap_put sets key to value, replacing an existing value. Returns 0 or -ENOMEM (the map is
 * unchanged then), -EINVAL for the reserved key. Replacing the value of a key already present
 * never allocates and never fails (the vector index relies on this while compacting). */
int idmap_put(idmap *m, uint64_t key, uint64_t value);

/* idmap_get stores the value of key in *value (value may be NULL for a membership test) and
 * returns true, or returns false. */
bool idmap_get(const idmap *m, uint64_t key, uint64_t *value);

/* idmap_del removes key; returns true when it was present. */
bool idmap_del(idmap *m, uint64_t key);

/* idmap_count returns the number of keys. */
size_t idmap_count(const idmap *m);

/* idmap_room returns how many new keys fit before an insertion would have to grow the map
 * (so a caller can grow a copy beforehand and keep idmap_put from allocating). */
size_t idmap_room(const idmap *m);

/* idmap_clone returns a copy of m sized for at least hint keys (and at least m's count), or
 * NULL when out of memory. m is only read, so other readers may use it meanwhile. */
idmap *idmap_clone(const idmap *m, size_t hint);

/* idmap_clear removes every key, keeping the memory. */
void idmap_clear(idmap *m);

/* idmap_bytes returns the memory the map holds, for memory accounting. */
size_t idmap_bytes(const idmap *m);

/* idmap_foreach calls fn for every key and value in unspecified order; fn must not change
 * the map. Stops early and returns fn's value when it is non-zero. */
int idmap_foreach(const idmap *m, int (*fn)(uint64_t key, uint64_t value, void *ctx), void *ctx);

#endif
