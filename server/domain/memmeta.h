/* server/domain/memmeta.h: what the index keeps per memory next to its vector (mem_meta),
 * and its one conversion from a row of PostgreSQL (memrow_meta: the change functions' meta
 * columns, and the loader's rows, which embed one).
 */
#ifndef ENGRAM_SERVER_MEMMETA_H
#define ENGRAM_SERVER_MEMMETA_H

#include <stddef.h>
#include <stdint.h>

#include "memrow.h"
#include "vindex.h"

/* What the index keeps per memory, next to its vector (vindex metadata). The tags array
 * belongs to the index entry: the registry copies it in and frees it when the entry is
 * replaced or removed; readers may use it only under the index's lock (filter callbacks). */
typedef struct mem_meta {
    uint64_t id; /* the memory's own id (filters need it) */
    uint64_t agent_id;
    uint64_t clade_id;
    uint64_t seq; /* the change that last wrote this memory */
    int64_t created_ms;
    /* The access counters: the index's atomic range (vindex_opts.meta_atomic_off). Every
     * search bumps them with vindex_touch_meta while other searches read them, so a
     * pointer into the index reads them with mem_meta_access_count / _last_access. */
    int64_t last_access_ms; /* 0: never accessed */
    uint64_t access_count;  /* at most UINT32_MAX */
    int64_t expires_ms;     /* INT64_MAX: never expires */
    int64_t archived_ms;    /* 0: live */
    const uint64_t *tags;   /* sorted tag hashes (see memfilter.h), NULL when none */
    uint32_t ntags;
    float importance;
    /* provenance feedback (memory.feedback): times injected and cited; both only grow, so
     * the index keeps the higher of what it has and what a change brings */
    uint32_t cited;
    uint32_t injected;
    uint8_t type;  /* mem_type */
    uint8_t scope; /* mem_scope */
    uint8_t pinned;
} mem_meta;

/* the atomic range is the two counters, adjacent */
_Static_assert(offsetof(mem_meta, access_count) == offsetof(mem_meta, last_access_ms) + 8,
               "mem_meta's access counters must be adjacent 8-byte words");
#define MEM_META_ATOMIC_OFF offsetof(mem_meta, last_access_ms)
#define MEM_META_ATOMIC_LEN 16

static inline uint32_t mem_meta_access_count(const mem_meta *m)
{
    uint64_t v = vindex_meta_word(&m->access_count);
    return v > UINT32_MAX ? UINT32_MAX : (uint32_t)v;
}

static inline int64_t mem_meta_last_access(const mem_meta *m)
{
    return (int64_t)vindex_meta_word((const uint64_t *)(const void *)&m->last_access_ms);
}

/* mem_meta_from_db fills m from a memory's meta columns; m->tags is malloc'd from the row's
 * tag JSON (the caller frees it unless handed to the index; NULL when the row has none).
 * Returns 0, -ENOMEM or -EINVAL (the tag JSON is not what the statements select). */
int mem_meta_from_db(mem_meta *m, const memrow_meta *row);

#endif
