/* tests/unit/test_hash.c: util/hash.h and util/xxh64.h against known answers.
 *
 * XXH64: the values of the reference implementation (xxhsum -H1 for seed 0, and the
 * xxHash sanity-test buffer for a seed), one-shot and streamed in every split. The mixers:
 * splitmix64's published first outputs, FNV-1a's published vectors, and the pinned
 * FNV-1a + splitmix64 values the server stores as tag hashes (they must never change).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "hash.h"
#include "xxh64.h"

#define PRIME32 2654435761ULL
#define PRIME64 11400714785074694797ULL

/* The sanity-test buffer of xxHash: byte i is the top byte of PRIME32 * PRIME64^i. */
static void fill_sanity(unsigned char *p, size_t n)
{
    uint64_t g = PRIME32;
    for (size_t i = 0; i < n; i++) {
        p[i] = (unsigned char)(g >> 56);
        g *= PRIME64;
    }
}

static void test_xxh64_known(void)
{
    CHECK(xxh64("", 0, 0) == 0xef46db3751d8e999ULL);
    CHECK(xxh64(NULL, 0, 0) == 0xef46db3751d8e999ULL);
    CHECK(xxh64("a", 1, 0) == 0xd24ec4f1a98c6e5bULL);
    CHECK(xxh64("abc", 3, 0) == 0x44bc2cf5ad770999ULL);
    const char *s = "Nobody inspects the spammish repetition";
    CHECK(xxh64(s, strlen(s), 0) == 0xfbcea83c8a378bf1ULL);

    unsigned char buf[222];
    fill_sanity(buf, sizeof(buf));
    CHECK(xxh64(buf, 1, 0) == 0xe934a84adb052768ULL);
    CHECK(xxh64(buf, 14, 0) == 0x8282dcc4994e35c8ULL);
    CHECK(xxh64(buf, 222, 0) == 0xb641ae8cb691c174ULL);
    /* seeded */
    CHECK(xxh64(NULL, 0, PRIME32) == 0xac75fda2929b17efULL);
    CHECK(xxh64(buf, 1, PRIME32) == 0x5014607643a9b4c3ULL);
    CHECK(xxh64(buf, 14, PRIME32) == 0xc3bd6bf63deb6df0ULL);
    CHECK(xxh64(buf, 222, PRIME32) == 0x20cb8ab7ae10c14aULL);

    /* (i * 7) % 251, as xxhsum -H1 hashes it */
    unsigned char big[1000];
    for (size_t i = 0; i < sizeof(big); i++)
        big[i] = (unsigned char)(i * 7 % 251);
    CHECK(xxh64(big, 1000, 0) == 0x023fd2ed1ff957d5ULL);
    CHECK(xxh64(big, 37, 0) == 0x478890c607390313ULL);
}

/* Streaming: every split of a buffer into two, and byte-at-a-time, give the one-shot value;
 * a digest in the middle does not disturb the state. */
static void test_xxh64_stream(void)
{
    unsigned char buf[222];
    fill_sanity(buf, sizeof(buf));
    uint64_t want = xxh64(buf, sizeof(buf), 7);
    int bad = 0;
    for (size_t cut = 0; cut <= sizeof(buf); cut++) {
        xxh64_state h;
        xxh64_init(&h, 7);
        xxh64_update(&h, buf, cut);
        uint64_t mid = xxh64_digest(&h);
        if (mid != xxh64(buf, cut, 7))
            bad++;
        xxh64_update(&h, buf + cut, sizeof(buf) - cut);
        if (xxh64_digest(&h) != want)
            bad++;
    }
    CHECK_MSG(bad == 0, "%d split(s) differ", bad);
    xxh64_state h;
    xxh64_init(&h, 7);
    for (size_t i = 0; i < sizeof(buf); i++)
        xxh64_update(&h, buf + i, 1);
    CHECK(xxh64_digest(&h) == want);
    xxh64_update(&h, NULL, 0);
    CHECK(xxh64_digest(&h) == want);
    /* the seed matters */
    CHECK(xxh64(buf, sizeof(buf), 0) != want);
}

static void test_mixers(void)
{
    /* splitmix64 from state 0: its published first outputs */
    uint64_t st = 0;
    CHECK(hash_splitmix64(&st) == 0xe220a8397b1dcdafULL);
    CHECK(hash_splitmix64(&st) == 0x6e789e6aa1b965f4ULL);
    CHECK(hash_splitmix64(&st) == 0x06c45d188009454fULL);
    CHECK(st == 3 * HASH_GOLDEN64);
    CHECK(hash_mix64(0) == 0);
    CHECK(hash_mix64(1) == 0x5692161d100b05e5ULL);

    /* FNV-1a 64: published vectors */
    CHECK(hash_fnv1a(NULL, 0) == 0xcbf29ce484222325ULL);
    CHECK(hash_fnv1a("a", 1) == 0xaf63dc4c8601ec8cULL);
    CHECK(hash_fnv1a("foobar", 6) == 0x85944171f73967e8ULL);
    uint64_t h = HASH_FNV1A_OFFSET;
    for (const char *p = "foobar"; *p; p++)
        h = hash_fnv1a_byte(h, (unsigned char)*p);
    CHECK(h == 0x85944171f73967e8ULL);

    /* the server's tag hash (FNV-1a, then the splitmix64 finalizer): stored in the database
     * and in snapshots, so pinned */
    CHECK(hash_mix64(hash_fnv1a("", 0)) == 0xf52a15e9a9b5e89bULL);
    CHECK(hash_mix64(hash_fnv1a("a", 1)) == 0x02c0bdbf481420f8ULL);
    CHECK(hash_mix64(hash_fnv1a("ttag:urgent", 11)) == 0x2536a7080b4ec897ULL);

    /* hash_pair: the multiplicative key of (tenant, id) */
    CHECK(hash_pair(0, 42) == 42);
    CHECK(hash_pair(1, 0) == HASH_GOLDEN64);
    CHECK(hash_pair(3, 5) == ((3 * HASH_GOLDEN64) ^ 5));
    CHECK(hash_pair(1, 2) != hash_pair(1, 3));
}

int main(void)
{
    test_xxh64_known();
    test_xxh64_stream();
    test_mixers();
    CHECK_RETURN();
}
