/* util/arena.h: a bump allocator whose allocations are freed all at once.
 *
 * An arena is a struct its owner embeds (zero-initialized is an empty arena); arena_alloc
 * hands out aligned pieces of malloc'd chunks, and arena_reset frees every chunk. Not
 * thread-safe: one owner at a time.
 */
#ifndef ENGRAM_UTIL_ARENA_H
#define ENGRAM_UTIL_ARENA_H

#include <stddef.h>

typedef struct arena_chunk arena_chunk;

typedef struct arena {
    arena_chunk *chunks; /* owned; the newest first */
} arena;

/* arena_alloc returns n bytes aligned for any type, valid until arena_reset, or NULL when
 * out of memory. */
void *arena_alloc(arena *a, size_t n);

/* arena_strndup copies n bytes of s into the arena and adds a NUL; NULL when out of
 * memory. */
char *arena_strndup(arena *a, const char *s, size_t n);

/* arena_reset frees everything a holds; a is an empty arena afterwards. */
void arena_reset(arena *a);

#endif
