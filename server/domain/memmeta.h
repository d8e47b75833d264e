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

/* What the index keeps per memory, next to its vector (vindex metadata): 72 bytes, for it
 * is part of every memory's resident cost (issue 34: about 0.09 bytes per dimension at 768
 * dimensions). The memory's id is not here: the index keeps it beside the metadata and
 * hands it to every callback. The tags array belongs to the index entry: the registry
 * copies it in and frees it when the entry is replaced or removed; readers may use it only
 * under the index's lock (filter callbacks). */
typedef struct mem_meta {
    uint64_t agent_id;
    uint64_t clade_id;
    uint64_t seq; /* the change that last wrote this memory */
    int64_t created_ms;
    /* The access counters in one word, the index's atomic range (vindex_opts.meta_atomic_off):
     * the last access in milliseconds since the epoch (0: never) above MEM_ACCESS_COUNT_BITS
     * bits of the access count, which saturates at MEM_ACCESS_COUNT_MAX (ranking saturates
     * far below it: score_access_saturation; reads past it show the database's count). Every
     * search bumps it with vindex_touch_meta while other searches read it: read it with
     * mem_meta_access_count / mem_meta_last_access, write it with mem_meta_set_access. */
    uint64_t access;
    int64_t expires_ms;   /* INT64_MAX: never expires */
    const uint64_t *tags; /* sorted tag hashes (see memfilter.h), NULL when none */
    float importance;
    /* provenance feedback (memory.feedback): times injected and cited; both only grow, so
     * the index keeps the higher of what it has and what a change brings */
    uint32_t cited;
    uint32_t injected;
    uint16_t ntags;    /* at most 3 lists of 64 and a strategy (mf_check_metadata) */
    uint8_t type;      /* mem_type */
    uint8_t scope : 4; /* mem_scope */
    uint8_t pinned : 1;
    uint8_t archived : 1; /* archived (the time is in the database) */
} mem_meta;

_Static_assert(sizeof(mem_meta) == 72, "mem_meta is part of every memory's resident cost");
_Static_assert(offsetof(mem_meta, access) % 8 == 0, "the access word must be an aligned word");
#define MEM_META_ATOMIC_OFF offsetof(mem_meta, access)
#define MEM_META_ATOMIC_LEN 8

/* 20 bits of count below 44 bits of milliseconds since the epoch (until the year 2527; a
 * store rejects an access time more than five minutes ahead) */
#define MEM_ACCESS_COUNT_BITS 20
#define MEM_ACCESS_COUNT_MAX ((1u << MEM_ACCESS_COUNT_BITS) - 1)
#define MEM_ACCESS_MS_MAX ((INT64_C(1) << (64 - MEM_ACCESS_COUNT_BITS)) - 1)

/* mem_access_word packs a last access (ms, 0: never) and a count, each clamped to its range. */
static inline uint64_t mem_access_word(int64_t last_ms, uint64_t count)
{
    if (last_ms < 0)
        last_ms = 0;
    if (last_ms > MEM_ACCESS_MS_MAX)
        last_ms = MEM_ACCESS_MS_MAX;
    if (count > MEM_ACCESS_COUNT_MAX)
        count = MEM_ACCESS_COUNT_MAX;
    return (uint64_t)last_ms << MEM_ACCESS_COUNT_BITS | count;
}

static inline uint32_t mem_access_word_count(uint64_t w)
{
    return (uint32_t)(w & MEM_ACCESS_COUNT_MAX);
}

static inline int64_t mem_access_word_last(uint64_t w)
{
    return (int64_t)(w >> MEM_ACCESS_COUNT_BITS);
}

/* For metadata inside the index (an atomic read); a private copy may be read the same way. */
static inline uint32_t mem_meta_access_count(const mem_meta *m)
{
    return mem_access_word_count(vindex_meta_word(&m->access));
}

static inline int64_t mem_meta_last_access(const mem_meta *m)
{
    return mem_access_word_last(vindex_meta_word(&m->access));
}

/* mem_meta_set_access stores the access word (an atomic store: searches may be reading it). */
static inline void mem_meta_set_access(mem_meta *m, int64_t last_ms, uint64_t count)
{
    vindex_meta_word_store(&m->access, mem_access_word(last_ms, count));
}

/* mem_meta_from_db fills m from a memory's meta columns; m->tags is malloc'd from the row's
 * tag JSON (the caller frees it unless handed to the index; NULL when the row has none).
 * Returns 0, -ENOMEM or -EINVAL (the tag JSON is not what the statements select). */
int mem_meta_from_db(mem_meta *m, const memrow_meta *row);

#endif
