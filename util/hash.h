/* util/hash.h: small fixed 64-bit hash functions, header only (static inline).
 *
 *   hash_mix64        the splitmix64 finalizer (a bijection of 64-bit values that spreads
 *                     every input bit over all output bits); for hash tables of ids.
 *   hash_splitmix64   one step of the splitmix64 generator: advances *state by the golden
 *                     gamma and returns its mix; a small deterministic random source.
 *   hash_fnv1a        FNV-1a 64 over bytes (hash_fnv1a_byte: one byte at a time, from
 *                     HASH_FNV1A_OFFSET or a seed derived from it).
 *   hash_pair         a key of two 64-bit values, (a * golden) ^ b: distinct b give distinct
 *                     keys for one a; not mixed (feed it to hash_mix64 to spread it).
 *
 * The values are fixed by this header and must never change: some are stored (tag hashes
 * in the database and in index snapshots, the snapshot identity's factory hash). None of
 * them resists inputs chosen by an adversary. Pure functions: any thread, no state but what
 * the caller passes.
 */
#ifndef ENGRAM_UTIL_HASH_H
#define ENGRAM_UTIL_HASH_H

#include <stddef.h>
#include <stdint.h>

#define HASH_GOLDEN64 0x9e3779b97f4a7c15ULL /* 2^64 / golden ratio, odd */
#define HASH_FNV1A_OFFSET 0xcbf29ce484222325ULL
#define HASH_FNV1A_PRIME 0x100000001b3ULL

/* hash_mix64 returns the splitmix64 finalizer of x. */
static inline uint64_t hash_mix64(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    x ^= x >> 31;
    return x;
}

/* hash_splitmix64 advances *state and returns the next splitmix64 output. */
static inline uint64_t hash_splitmix64(uint64_t *state)
{
    *state += HASH_GOLDEN64;
    return hash_mix64(*state);
}

/* hash_fnv1a_byte folds one byte into the FNV-1a state h. */
static inline uint64_t hash_fnv1a_byte(uint64_t h, unsigned char c)
{
    return (h ^ c) * HASH_FNV1A_PRIME;
}

/* hash_fnv1a returns FNV-1a 64 of the n bytes at p (p may be NULL when n is 0). */
static inline uint64_t hash_fnv1a(const void *p, size_t n)
{
    const unsigned char *b = p;
    uint64_t h = HASH_FNV1A_OFFSET;
    for (size_t i = 0; i < n; i++)
        h = hash_fnv1a_byte(h, b[i]);
    return h;
}

/* hash_pair returns (a * HASH_GOLDEN64) ^ b. */
static inline uint64_t hash_pair(uint64_t a, uint64_t b)
{
    return (a * HASH_GOLDEN64) ^ b;
}

#endif
