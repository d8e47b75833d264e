/* tests/unit/test_rowcache.c: server/rowcache: rows by tenant, id and change number.
 *
 * What rowcache.h promises: a row is returned only at the change number asked for; a newer
 * version replaces an older one and an older never replaces a newer; tenants are kept
 * apart; the bytes held stay within the budget, least recently used rows going first; rows
 * larger than a stripe's share are not kept; the caller's copies are its own.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "rowcache.h"

/* Allocations handed out by rc_get, freed at the end of each test. */
typedef struct pool {
    void *p[4096];
    size_t n;
} pool;

static void *pool_alloc(void *ctx, size_t n)
{
    pool *pl = ctx;
    if (pl->n == sizeof(pl->p) / sizeof(pl->p[0]))
        return NULL;
    return (pl->p[pl->n++] = malloc(n));
}

static void pool_free(pool *pl)
{
    for (size_t i = 0; i < pl->n; i++)
        free(pl->p[i]);
    pl->n = 0;
}

static memrow row(uint64_t id, uint64_t seq, const char *content)
{
    return (memrow){.id = id,
                    .seq = seq,
                    .agent_id = 3,
                    .scope = SCOPE_AGENT,
                    .type = MEM_EPISODE,
                    .content = content,
                    .content_len = strlen(content),
                    .importance = 0.25,
                    .metadata_json = "{\"tokens\":[\"ETH\"]}",
                    .metadata_len = strlen("{\"tokens\":[\"ETH\"]}"),
                    .created_ms = 1000,
                    .updated_ms = 2000,
                    .last_accessed_ms = MEMROW_NO_TIME,
                    .expires_ms = MEMROW_NO_TIME,
                    .archived_ms = MEMROW_NO_TIME,
                    .version = (int32_t)seq,
                    .pinned = true};
}

/* Looks up (tenant, id, seq); returns the content or NULL. */
static const char *get(rowcache *c, int64_t tenant, uint64_t id, uint64_t seq, pool *pl,
                       memrow *out)
{
    memrow tmp;
    if (!out)
        out = &tmp;
    return rc_get(c, tenant, id, seq, out, pool_alloc, pl) ? out->content : NULL;
}

static void test_versions(void)
{
    rowcache *c = rc_create(1 << 20);
    pool pl = {0};
    memrow m = row(10, 5, "version five");
    rc_put(c, 1, &m);
    memrow got;
    const char *s = get(c, 1, 10, 5, &pl, &got);
    CHECK(s && strcmp(s, "version five") == 0);
    /* every field comes back, the strings as the caller's own NUL-terminated copies */
    CHECK(got.id == 10 && got.seq == 5 && got.agent_id == 3 && got.scope == SCOPE_AGENT &&
          got.type == MEM_EPISODE && got.importance == 0.25 && got.created_ms == 1000 &&
          got.updated_ms == 2000 && got.last_accessed_ms == MEMROW_NO_TIME && got.pinned &&
          got.version == 5 && got.archived_reason == NULL);
    CHECK(got.content != m.content && got.content_len == strlen("version five"));
    CHECK(got.metadata_json && strcmp(got.metadata_json, "{\"tokens\":[\"ETH\"]}") == 0);
    /* only the version asked for: neither an older nor a newer change number matches */
    CHECK(get(c, 1, 10, 4, &pl, NULL) == NULL);
    CHECK(get(c, 1, 10, 6, &pl, NULL) == NULL);
    /* a newer version replaces it */
    memrow m6 = row(10, 6, "version six");
    m6.archived_reason = "superseded";
    m6.archived_ms = 3000;
    rc_put(c, 1, &m6);
    CHECK(get(c, 1, 10, 5, &pl, NULL) == NULL);
    s = get(c, 1, 10, 6, &pl, &got);
    CHECK(s && strcmp(s, "version six") == 0);
    CHECK(got.archived_reason && strcmp(got.archived_reason, "superseded") == 0 &&
          got.archived_ms == 3000);
    /* an older version arriving late does not replace it, nor does the same one twice */
    rc_put(c, 1, &m);
    CHECK(get(c, 1, 10, 6, &pl, NULL) != NULL);
    CHECK(get(c, 1, 10, 5, &pl, NULL) == NULL);
    memrow again = row(10, 6, "impostor");
    rc_put(c, 1, &again);
    s = get(c, 1, 10, 6, &pl, NULL);
    CHECK(s && strcmp(s, "version six") == 0);
    uint64_t entries, bytes, hits, misses;
    rc_stats(c, &entries, &bytes, &hits, &misses);
    CHECK(entries == 1);
    /* hits: 5 (v5), 6, 6, 6; misses: 4, 6 (before), 5, 5 */
    CHECK_MSG(hits == 4 && misses == 4, "hits %llu misses %llu", (unsigned long long)hits,
              (unsigned long long)misses);
    /* change number 0 is "unknown": never stored, never found */
    memrow zero = row(11, 0, "no seq");
    rc_put(c, 1, &zero);
    CHECK(get(c, 1, 11, 0, &pl, NULL) == NULL);
    rc_stats(c, &entries, &bytes, &hits, &misses);
    CHECK(entries == 1);
    pool_free(&pl);
    rc_destroy(c);
}

static void test_copies(void)
{
    rowcache *c = rc_create(1 << 20);
    pool pl = {0};
    char content[] = "mutable";
    memrow m = row(1, 1, content);
    rc_put(c, 7, &m);
    content[0] = 'X'; /* the cache keeps its own copy */
    memrow got;
    const char *s = get(c, 7, 1, 1, &pl, &got);
    CHECK(s && strcmp(s, "mutable") == 0);
    ((char *)got.content)[0] = 'Y'; /* and hands out copies */
    s = get(c, 7, 1, 1, &pl, NULL);
    CHECK(s && strcmp(s, "mutable") == 0);
    /* content with NUL bytes keeps its length */
    memrow bin = row(2, 1, "");
    bin.content = "a\0b";
    bin.content_len = 3;
    rc_put(c, 7, &bin);
    CHECK(rc_get(c, 7, 2, 1, &got, pool_alloc, &pl) && got.content_len == 3 &&
          memcmp(got.content, "a\0b", 3) == 0);
    pool_free(&pl);
    rc_destroy(c);
}

static void test_tenants_apart(void)
{
    rowcache *c = rc_create(16 << 20);
    pool pl = {0};
    /* ids are numbered per tenant: the same id in two tenants is two memories */
    memrow a = row(42, 3, "tenant one's"), b = row(42, 3, "tenant two's");
    rc_put(c, 1, &a);
    rc_put(c, 2, &b);
    const char *s1 = get(c, 1, 42, 3, &pl, NULL), *s2 = get(c, 2, 42, 3, &pl, NULL);
    CHECK(s1 && strcmp(s1, "tenant one's") == 0);
    CHECK(s2 && strcmp(s2, "tenant two's") == 0);
    CHECK(get(c, 3, 42, 3, &pl, NULL) == NULL);
    /* replacing one tenant's row leaves the other's */
    memrow a4 = row(42, 4, "tenant one's, newer");
    rc_put(c, 1, &a4);
    s2 = get(c, 2, 42, 3, &pl, NULL);
    CHECK(s2 && strcmp(s2, "tenant two's") == 0);
    CHECK(get(c, 1, 42, 3, &pl, NULL) == NULL);
    /* many tenants with the same id: with 2000 entries in 16 x 1024 hash buckets some
     * share a chain, and each must still find its own */
    for (int64_t t = 100; t < 2100; t++) {
        char content[32];
        snprintf(content, sizeof(content), "tenant %lld", (long long)t);
        memrow m = row(7, 1, content);
        rc_put(c, t, &m);
    }
    int wrong = 0;
    for (int64_t t = 100; t < 2100; t++) {
        char content[32];
        snprintf(content, sizeof(content), "tenant %lld", (long long)t);
        const char *s = get(c, t, 7, 1, &pl, NULL);
        wrong += !s || strcmp(s, content) != 0;
        pool_free(&pl);
    }
    CHECK_MSG(wrong == 0, "%d tenants got another tenant's row or none", wrong);
    /* negative and large tenant ids too */
    memrow x = row(UINT64_MAX, 1, "edge");
    rc_put(c, INT64_MIN, &x);
    CHECK(get(c, INT64_MIN, UINT64_MAX, 1, &pl, NULL) != NULL);
    CHECK(get(c, INT64_MAX, UINT64_MAX, 1, &pl, NULL) == NULL);
    pool_free(&pl);
    rc_destroy(c);
}

static void test_budget(void)
{
    /* 16 stripes of 4 KiB each */
    const size_t budget = 64 * 1024;
    rowcache *c = rc_create(budget);
    pool pl = {0};
    char content[301];
    memset(content, 'c', 300);
    content[300] = '\0';
    uint64_t entries, bytes, hits, misses, max_bytes = 0;
    /* the bytes one such row is charged (entry, strings and all) */
    memrow first = row(1, 1, content);
    rc_put(c, 1, &first);
    rc_stats(c, &entries, &bytes, &hits, &misses);
    const uint64_t row_bytes = bytes;
    CHECK(entries == 1 && row_bytes > 300 && row_bytes < 4096);
    const uint64_t n = 2000;
    for (uint64_t id = 2; id <= n; id++) {
        memrow m = row(id, 1, content);
        rc_put(c, 1, &m);
        /* row 1 is read after every insertion: always the most recently used of its stripe */
        CHECK_MSG(get(c, 1, 1, 1, &pl, NULL) != NULL, "row 1 evicted after %llu",
                  (unsigned long long)id);
        pool_free(&pl);
        rc_stats(c, &entries, &bytes, &hits, &misses);
        if (bytes > max_bytes)
            max_bytes = bytes;
    }
    CHECK_MSG(max_bytes <= budget, "%llu bytes held, budget %zu", (unsigned long long)max_bytes,
              budget);
    /* 2000 rows reach every stripe many times over: each is full, holding as many rows as
     * fit its 4 KiB share */
    rc_stats(c, &entries, &bytes, &hits, &misses);
    CHECK_MSG(entries == 16 * (4096 / row_bytes), "%llu entries of %llu bytes",
              (unsigned long long)entries, (unsigned long long)row_bytes);
    CHECK(bytes == entries * row_bytes);
    /* the newest row is there (it is the most recent of its stripe); the oldest untouched
     * ones are gone: about 125 rows went through each stripe, which holds a few */
    CHECK(get(c, 1, n, 1, &pl, NULL) != NULL);
    int old_present = 0;
    for (uint64_t id = 2; id <= 100; id++)
        old_present += get(c, 1, id, 1, &pl, NULL) != NULL;
    CHECK_MSG(old_present == 0, "%d of the oldest rows still cached", old_present);
    pool_free(&pl);

    /* a row larger than a stripe's share (4 KiB) is not kept at all */
    char *big = malloc(5000);
    memset(big, 'b', 4999);
    big[4999] = '\0';
    memrow m = row(n + 1, 1, big);
    rc_put(c, 1, &m);
    CHECK(get(c, 1, n + 1, 1, &pl, NULL) == NULL);
    uint64_t entries2;
    rc_stats(c, &entries2, &bytes, &hits, &misses);
    CHECK(entries2 == entries);
    free(big);
    pool_free(&pl);
    rc_destroy(c);

    /* a cache of 0 bytes holds nothing */
    rowcache *none = rc_create(0);
    memrow small = row(1, 1, "x");
    rc_put(none, 1, &small);
    CHECK(get(none, 1, 1, 1, &pl, NULL) == NULL);
    rc_stats(none, &entries, &bytes, &hits, &misses);
    CHECK(entries == 0 && bytes == 0);
    rc_destroy(none);
    /* and no cache at all is a valid, empty one */
    CHECK(get(NULL, 1, 1, 1, &pl, NULL) == NULL);
    rc_put(NULL, 1, &small);
    rc_stats(NULL, &entries, &bytes, &hits, &misses);
    CHECK(entries == 0 && hits == 0 && misses == 0);
    rc_destroy(NULL);
}

/* Many threads putting and getting the same few rows: every hit returns the content of the
 * version asked for (content encodes it), and the budget holds. */
typedef struct worker_arg {
    rowcache *c;
    unsigned seed;
    int wrong;
} worker_arg;

static void *hammer(void *p)
{
    worker_arg *w = p;
    pool pl = {0};
    for (int i = 0; i < 20000; i++) {
        w->seed = w->seed * 1103515245u + 12345u;
        uint64_t id = 1 + (w->seed >> 8) % 64, seq = 1 + (w->seed >> 16) % 8;
        int64_t tenant = 1 + (int64_t)((w->seed >> 20) % 3);
        char content[64];
        snprintf(content, sizeof(content), "t%lld id%llu seq%llu", (long long)tenant,
                 (unsigned long long)id, (unsigned long long)seq);
        if (w->seed & 1) {
            memrow m = row(id, seq, content);
            rc_put(w->c, tenant, &m);
        } else {
            const char *s = get(w->c, tenant, id, seq, &pl, NULL);
            if (s && strcmp(s, content) != 0)
                w->wrong++;
        }
        if (pl.n > 4000)
            pool_free(&pl);
    }
    pool_free(&pl);
    return NULL;
}

static void test_threads(void)
{
    rowcache *c = rc_create(32 * 1024);
    pthread_t th[4];
    worker_arg args[4];
    for (int i = 0; i < 4; i++) {
        args[i] = (worker_arg){.c = c, .seed = (unsigned)i * 7919u + 1};
        pthread_create(&th[i], NULL, hammer, &args[i]);
    }
    int wrong = 0;
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        wrong += args[i].wrong;
    }
    CHECK_MSG(wrong == 0, "%d lookups returned another version's row", wrong);
    uint64_t entries, bytes, hits, misses;
    rc_stats(c, &entries, &bytes, &hits, &misses);
    CHECK(bytes <= 32 * 1024);
    CHECK(hits > 0 && misses > 0);
    rc_destroy(c);
}

int main(void)
{
    test_versions();
    test_copies();
    test_tenants_apart();
    test_budget();
    test_threads();
    CHECK_RETURN();
}
