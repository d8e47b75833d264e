/* util/xxh64.c: XXH64 (see xxh64.h), after the xxHash specification: four lanes of 8-byte
 * rounds over 32-byte stripes, merged, then the tail in 8, 4 and 1-byte steps and a final
 * avalanche. */
#include "xxh64.h"

#include <string.h>

#define P1 0x9E3779B185EBCA87ULL
#define P2 0xC2B2AE3D27D4EB4FULL
#define P3 0x165667B19E3779F9ULL
#define P4 0x85EBCA77C2B2AE63ULL
#define P5 0x27D4EB2F165667C5ULL

static uint64_t rotl(uint64_t x, int r)
{
    return (x << r) | (x >> (64 - r));
}

/* little-endian reads whatever the host order (compilers make them one load on x86) */
static uint64_t rd64(const unsigned char *p)
{
    return (uint64_t)p[0] | (uint64_t)p[1] << 8 | (uint64_t)p[2] << 16 | (uint64_t)p[3] << 24 |
           (uint64_t)p[4] << 32 | (uint64_t)p[5] << 40 | (uint64_t)p[6] << 48 |
           (uint64_t)p[7] << 56;
}

static uint32_t rd32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t xround(uint64_t acc, uint64_t in)
{
    return rotl(acc + in * P2, 31) * P1;
}

static uint64_t xmerge(uint64_t acc, uint64_t v)
{
    return (acc ^ xround(0, v)) * P1 + P4;
}

/* xxh64_init starts a hash with seed. */
void xxh64_init(xxh64_state *h, uint64_t seed)
{
    h->v[0] = seed + P1 + P2;
    h->v[1] = seed + P2;
    h->v[2] = seed;
    h->v[3] = seed - P1;
    h->nbuf = 0;
    h->total = 0;
    h->seed = seed;
}

/* xxh64_update folds whole stripes into the lanes and keeps the rest in h->buf. */
void xxh64_update(xxh64_state *h, const void *data, size_t len)
{
    const unsigned char *p = data;
    if (len == 0)
        return; /* data may be NULL */
    h->total += len;
    if (h->nbuf) {
        size_t take = 32 - h->nbuf < len ? 32 - h->nbuf : len;
        memcpy(h->buf + h->nbuf, p, take);
        h->nbuf += take;
        p += take;
        len -= take;
        if (h->nbuf < 32)
            return;
        for (int i = 0; i < 4; i++)
            h->v[i] = xround(h->v[i], rd64(h->buf + 8 * i));
        h->nbuf = 0;
    }
    uint64_t v0 = h->v[0], v1 = h->v[1], v2 = h->v[2], v3 = h->v[3];
    while (len >= 32) {
        v0 = xround(v0, rd64(p));
        v1 = xround(v1, rd64(p + 8));
        v2 = xround(v2, rd64(p + 16));
        v3 = xround(v3, rd64(p + 24));
        p += 32;
        len -= 32;
    }
    h->v[0] = v0, h->v[1] = v1, h->v[2] = v2, h->v[3] = v3;
    if (len)
        memcpy(h->buf, p, len);
    h->nbuf = len;
}

/* xxh64_digest merges the lanes (or starts from seed + P5 below one stripe), folds the tail
 * and avalanches. */
uint64_t xxh64_digest(const xxh64_state *h)
{
    uint64_t acc;
    if (h->total >= 32) {
        acc = rotl(h->v[0], 1) + rotl(h->v[1], 7) + rotl(h->v[2], 12) + rotl(h->v[3], 18);
        for (int i = 0; i < 4; i++)
            acc = xmerge(acc, h->v[i]);
    } else {
        acc = h->seed + P5;
    }
    acc += h->total;
    const unsigned char *p = h->buf;
    size_t len = h->nbuf;
    while (len >= 8) {
        acc ^= xround(0, rd64(p));
        acc = rotl(acc, 27) * P1 + P4;
        p += 8;
        len -= 8;
    }
    if (len >= 4) {
        acc ^= (uint64_t)rd32(p) * P1;
        acc = rotl(acc, 23) * P2 + P3;
        p += 4;
        len -= 4;
    }
    while (len > 0) {
        acc ^= (*p) * P5;
        acc = rotl(acc, 11) * P1;
        p++;
        len--;
    }
    acc ^= acc >> 33;
    acc *= P2;
    acc ^= acc >> 29;
    acc *= P3;
    acc ^= acc >> 32;
    return acc;
}

/* xxh64 hashes one buffer. */
uint64_t xxh64(const void *data, size_t len, uint64_t seed)
{
    xxh64_state h;
    xxh64_init(&h, seed);
    xxh64_update(&h, data, len);
    return xxh64_digest(&h);
}
