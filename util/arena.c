/* util/arena.c: a bump allocator (see arena.h). */
#include "arena.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define ARENA_FIRST 4096

struct arena_chunk {
    struct arena_chunk *next;
    size_t cap, used;
    max_align_t data[];
};

void *arena_alloc(arena *a, size_t n)
{
    if (n > SIZE_MAX - sizeof(max_align_t))
        return NULL;
    n = (n + sizeof(max_align_t) - 1) & ~(sizeof(max_align_t) - 1);
    arena_chunk *ch = a->chunks;
    if (!ch || ch->cap - ch->used < n) {
        size_t cap = n > ARENA_FIRST ? n : ARENA_FIRST;
        if (cap > SIZE_MAX - sizeof(*ch))
            return NULL;
        ch = malloc(sizeof(*ch) + cap);
        if (!ch)
            return NULL;
        ch->cap = cap;
        ch->used = 0;
        ch->next = a->chunks;
        a->chunks = ch;
    }
    void *p = (char *)ch->data + ch->used;
    ch->used += n;
    return p;
}

char *arena_strndup(arena *a, const char *s, size_t n)
{
    if (n == SIZE_MAX)
        return NULL;
    char *d = arena_alloc(a, n + 1);
    if (!d)
        return NULL;
    if (n)
        memcpy(d, s, n);
    d[n] = '\0';
    return d;
}

void arena_reset(arena *a)
{
    arena_chunk *ch = a->chunks;
    while (ch) {
        arena_chunk *next = ch->next;
        free(ch);
        ch = next;
    }
    a->chunks = NULL;
}
