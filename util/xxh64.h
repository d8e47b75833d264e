/* util/xxh64.h: XXH64, the 64-bit xxHash (Yann Collet's algorithm), one-shot and streaming.
 *
 * Used for the vector index's snapshot checksums (index/vindex_snap.c): the values are
 * those of the reference implementation (XXH64 with the given seed, inputs read as
 * little-endian words on any host), so a file's checksum can be checked with `xxhsum -H1`.
 * Not a cryptographic hash.
 *
 * Ownership: the caller owns the state (no allocation). Thread-safety: a state is used by
 * one thread at a time; the functions keep no other state. No function fails.
 */
#ifndef ENGRAM_UTIL_XXH64_H
#define ENGRAM_UTIL_XXH64_H

#include <stddef.h>
#include <stdint.h>

typedef struct xxh64_state {
    uint64_t v[4];
    unsigned char buf[32]; /* input not yet folded in (nbuf bytes) */
    size_t nbuf;
    uint64_t total; /* bytes seen */
    uint64_t seed;
} xxh64_state;

/* xxh64_init starts a hash with seed. */
void xxh64_init(xxh64_state *h, uint64_t seed);

/* xxh64_update hashes len more bytes at data (data may be NULL when len is 0). */
void xxh64_update(xxh64_state *h, const void *data, size_t len);

/* xxh64_digest returns the hash of everything given so far; h is unchanged, so more may
 * follow. */
uint64_t xxh64_digest(const xxh64_state *h);

/* xxh64 returns the hash of len bytes at data with seed, in one call. */
uint64_t xxh64(const void *data, size_t len, uint64_t seed);

#endif
