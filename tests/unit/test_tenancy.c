/* tests/unit/test_tenancy.c: server/tenancy: token buckets, revoked keys, deleted tenants,
 * current tiers and the notification payloads.
 *
 * The bucket arithmetic is driven with explicit times (tenancy_bucket_take), so admission
 * counts are exact; tenancy_rate_take is checked with the real clock where the rate is so
 * low that no token can be earned during the test, which makes its counts exact too.
 */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include "check.h"
#include "tenancy.h"
#include "tenants.h"
#include "tiers.h"

#define MS UINT64_C(1000000)
#define S UINT64_C(1000000000)

/* ---- the bucket ----------------------------------------------------------------------- */

static void test_bucket_burst_and_refill(void)
{
    /* 8 per second: a token every 125 ms; the times below are exact in binary */
    uint64_t retry = 0;
    /* a new bucket is full: exactly burst requests pass at once, the next waits */
    tenancy_bucket b = {.tokens = 5, .last_ns = 10 * S};
    for (int i = 0; i < 5; i++)
        CHECK(tenancy_bucket_take(&b, 8, 5, 10 * S, &retry));
    CHECK(!tenancy_bucket_take(&b, 8, 5, 10 * S, &retry));
    CHECK_MSG(retry == 125, "retry %llu", (unsigned long long)retry);
    /* three quarters of a token earned: a quarter of the wait left (31.25 ms, rounded up) */
    CHECK(!tenancy_bucket_take(&b, 8, 5, 10 * S + 93750000, &retry));
    CHECK_MSG(retry == 32, "retry %llu", (unsigned long long)retry);
    /* a refused request costs nothing: at 125 ms the token is there */
    CHECK(tenancy_bucket_take(&b, 8, 5, 10 * S + 125 * MS, &retry));
    CHECK(!tenancy_bucket_take(&b, 8, 5, 10 * S + 125 * MS, &retry));
    CHECK_MSG(retry == 125, "retry %llu", (unsigned long long)retry);
    CHECK(!tenancy_bucket_take(&b, 8, 5, 10 * S + 187500000, &retry));
    CHECK_MSG(retry == 63, "retry %llu", (unsigned long long)retry); /* 62.5 ms */
    CHECK(tenancy_bucket_take(&b, 8, 5, 10 * S + 250 * MS, &retry));
    /* a long idle refills to the burst, not beyond */
    uint64_t t = 3600 * S;
    int passed = 0;
    while (tenancy_bucket_take(&b, 8, 5, t, &retry))
        passed++;
    CHECK_MSG(passed == 5, "%d passed after an hour idle", passed);
    /* a burst below 1 never admits anything (the settings forbid it: burst >= 1) */
    tenancy_bucket tiny = {.tokens = 0.5, .last_ns = 0};
    CHECK(!tenancy_bucket_take(&tiny, 8, 0.5, 3600 * S, &retry));
}

static void test_bucket_exact_admission(void)
{
    /* one request a millisecond for 10 s at 100 per second with a burst of 20: the burst,
     * then the rate: 20 + 100 * 10 (one fewer at most where float rounding leaves a token a
     * hair under 1 at the last instant) */
    tenancy_bucket b = {.tokens = 20, .last_ns = 0};
    uint64_t retry;
    int passed = 0, max_wait_wrong = 0;
    for (uint64_t ms = 0; ms <= 10000; ms++) {
        if (tenancy_bucket_take(&b, 100, 20, ms * MS, &retry))
            passed++;
        else if (retry == 0 || retry > 10)
            max_wait_wrong++; /* never more than one token interval (10 ms) away */
    }
    CHECK_MSG(passed == 1020 || passed == 1019, "%d passed", passed);
    CHECK(max_wait_wrong == 0);

    /* a burst of 1 at 2 per second, asked every 100 ms: one pass per 500 ms */
    tenancy_bucket c = {.tokens = 1, .last_ns = 0};
    passed = 0;
    for (uint64_t ms = 0; ms < 5000; ms += 100)
        passed += tenancy_bucket_take(&c, 2, 1, ms * MS, &retry);
    CHECK_MSG(passed == 10, "%d passed", passed);

    /* fractional rates: one every 10 s */
    tenancy_bucket d = {.tokens = 1, .last_ns = 0};
    CHECK(tenancy_bucket_take(&d, 0.1, 1, 0, &retry));
    CHECK(!tenancy_bucket_take(&d, 0.1, 1, 5 * S, &retry) && retry == 5000);
    CHECK(tenancy_bucket_take(&d, 0.1, 1, 10 * S, &retry));
}

static void test_bucket_clock_order(void)
{
    /* two threads read the clock, the later one takes the lock first: the earlier time must
     * not count as a refill of (2^64 - 1) ns, which would refill the bucket to its burst */
    tenancy_bucket b = {.tokens = 1, .last_ns = 10 * S};
    uint64_t retry;
    CHECK(tenancy_bucket_take(&b, 0.001, 5, 10 * S + 1, &retry));
    CHECK(!tenancy_bucket_take(&b, 0.001, 5, 10 * S, &retry));
    CHECK(!tenancy_bucket_take(&b, 0.001, 5, 10 * S - 1, &retry));
    CHECK(b.last_ns == 10 * S + 1); /* time never moves back */
    CHECK(retry > 999000 && retry <= 1000000);
}

/* ---- the registry --------------------------------------------------------------------- */

static server srv;

static void setup(void)
{
    memset(&srv, 0, sizeof(srv));
    /* free: 5 requests, then one per 1000 s (never within this test); standard: unlimited
     * rate; premium: 3 requests */
    static const tier_limits tl[TIER_COUNT] = {
        [TIER_FREE] = {.rate_per_s = 0.001, .rate_burst = 5},
        [TIER_STANDARD] = {.rate_per_s = 0, .rate_burst = 1},
        [TIER_PREMIUM] = {.rate_per_s = 0.001, .rate_burst = 3},
    };
    srv.tiers = tl;
    srv.cfg.index_engine = "native";
    srv.tenants = tenants_create(&srv);
    srv.tenancy = tenancy_create(&srv);
}

static void teardown(void)
{
    tenancy_destroy(srv.tenancy);
    tenants_destroy(srv.tenants);
}

static int admitted(tenancy *t, int64_t tenant_id, int tier, int tries, uint64_t *retry)
{
    int n = 0;
    for (int i = 0; i < tries; i++)
        n += tenancy_rate_take(t, tenant_id, tier, retry);
    return n;
}

static void test_rates(void)
{
    setup();
    tenancy *t = srv.tenancy;
    uint64_t retry = 0;
    CHECK(admitted(t, 1, TIER_FREE, 100, &retry) == 5);
    /* the wait: one token at 0.001 per second is 1000 s away, less what has passed */
    CHECK_MSG(retry > 999000 && retry <= 1000000, "retry %llu", (unsigned long long)retry);
    /* each tenant has its own bucket, sized by the tier it asks with */
    CHECK(admitted(t, 2, TIER_FREE, 100, &retry) == 5);
    CHECK(admitted(t, 3, TIER_PREMIUM, 100, &retry) == 3);
    /* no rate: everything passes */
    CHECK(admitted(t, 4, TIER_STANDARD, 1000, &retry) == 1000);
    /* an unknown tier gets the free tier's limits */
    CHECK(admitted(t, 5, 17, 100, &retry) == 5);
    CHECK(admitted(t, 6, -1, 100, &retry) == 5);
    /* tenant 1 stays refused */
    CHECK(admitted(t, 1, TIER_FREE, 10, &retry) == 0);
    teardown();
}

static void test_sweep_buckets(void)
{
    /* free: burst 5 at 0.001/s fills in 5000 s; premium: 3 in 3000 s: 5000 s is the longest,
     * so a bucket is forgotten once idle that long, not before */
    setup();
    tenancy *t = srv.tenancy;
    uint64_t retry = 0;
    /* tenants 1..100 empty their buckets before mid, 101..200 after it */
    for (int64_t id = 1; id <= 100; id++)
        CHECK(admitted(t, id, id % 2 ? TIER_FREE : TIER_PREMIUM, 10, &retry) == (id % 2 ? 5 : 3));
    uint64_t mid = server_mono_ns();
    for (int64_t id = 101; id <= 200; id++)
        CHECK(admitted(t, id, TIER_FREE, 10, &retry) == 5);
    CHECK(tenancy_sweep_buckets(t, mid) == 0);
    CHECK(tenancy_sweep_buckets(t, mid + 4999 * S) == 0);
    /* at mid + 5000 s the first hundred have been idle 5000 s: full, forgotten; the others,
     * moved into the freed places, keep their own (empty) buckets */
    size_t gone = tenancy_sweep_buckets(t, mid + 5000 * S);
    CHECK_MSG(gone == 100, "%zu forgotten", gone);
    for (int64_t id = 101; id <= 200; id++)
        CHECK_MSG(admitted(t, id, TIER_FREE, 10, &retry) == 0, "tenant %lld", (long long)id);
    /* a forgotten tenant starts full, as after that long it would have */
    CHECK(admitted(t, 7, TIER_FREE, 10, &retry) == 5);
    CHECK(admitted(t, 8, TIER_PREMIUM, 10, &retry) == 3);
    CHECK(admitted(t, 7, TIER_FREE, 10, &retry) == 0);
    /* everything idle: the table empties */
    CHECK(tenancy_sweep_buckets(t, server_mono_ns() + 5000 * S) == 102);
    CHECK(admitted(t, 150, TIER_FREE, 10, &retry) == 5);
    teardown();
}

typedef struct hammer_arg {
    tenancy *t;
    int passed;
} hammer_arg;

static void *hammer(void *p)
{
    hammer_arg *a = p;
    uint64_t retry;
    for (int i = 0; i < 50000; i++)
        a->passed += tenancy_rate_take(a->t, 9, TIER_FREE, &retry);
    return NULL;
}

static void test_rates_threads(void)
{
    /* four threads share one tenant's bucket: together exactly the burst passes, however
     * their clock readings and the lock interleave */
    setup();
    pthread_t th[4];
    hammer_arg args[4];
    for (int i = 0; i < 4; i++) {
        args[i] = (hammer_arg){.t = srv.tenancy};
        pthread_create(&th[i], NULL, hammer, &args[i]);
    }
    int total = 0;
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        total += args[i].passed;
    }
    CHECK_MSG(total == 5, "%d of 200000 passed, burst 5", total);
    teardown();
}

static void test_keys(void)
{
    setup();
    tenancy *t = srv.tenancy;
    /* key 100 of tenant 1, used by two connections; key 101 of tenant 1, one connection */
    tenancy_key_in_use(t, 100, 1, TIER_STANDARD);
    tenancy_key_in_use(t, 100, 1, TIER_STANDARD);
    tenancy_key_in_use(t, 101, 1, TIER_STANDARD);
    CHECK(tenancy_key_ok(t, 100, 1) && tenancy_key_ok(t, 101, 1));
    /* revoking one key stops that key only */
    tenancy_revoked(t, 100);
    CHECK(!tenancy_key_ok(t, 100, 1));
    CHECK(tenancy_key_ok(t, 101, 1));
    /* it stays revoked while any connection still holds it */
    tenancy_key_released(t, 100);
    CHECK(!tenancy_key_ok(t, 100, 1));
    /* once nobody holds it, the database decides at the next authentication */
    tenancy_key_released(t, 100);
    CHECK(tenancy_key_ok(t, 100, 1));
    /* a key nobody here holds is not remembered as revoked (the database refuses it) */
    tenancy_revoked(t, 555);
    CHECK(tenancy_key_ok(t, 555, 1));
    /* releasing a key never taken is harmless */
    tenancy_key_released(t, 777);

    /* deleting a tenant stops every key of it, in use or not, and no other tenant's */
    tenancy_key_in_use(t, 200, 2, TIER_FREE);
    tenancy_deleted(t, 1);
    CHECK(!tenancy_key_ok(t, 101, 1));
    CHECK(!tenancy_key_ok(t, 999, 1));
    CHECK(tenancy_key_ok(t, 200, 2));
    teardown();
}

static void test_tiers(void)
{
    setup();
    tenancy *t = srv.tenancy;
    /* unknown tenant: the caller's fallback (the tier its connection authenticated with) */
    CHECK(tenancy_tier(t, 1, TIER_PREMIUM) == TIER_PREMIUM);
    CHECK(tenancy_tier(t, 1, TIER_FREE) == TIER_FREE);
    /* an authentication records the current tier, and a change replaces it */
    tenancy_key_in_use(t, 10, 1, TIER_FREE);
    CHECK(tenancy_tier(t, 1, TIER_PREMIUM) == TIER_FREE);
    tenancy_tier_changed(t, 1, TIER_STANDARD);
    CHECK(tenancy_tier(t, 1, TIER_PREMIUM) == TIER_STANDARD);
    /* TIER_FREE is 0: stored so that it is not taken for "unknown" */
    tenancy_key_in_use(t, 20, 2, TIER_STANDARD);
    tenancy_tier_changed(t, 2, TIER_FREE);
    CHECK(tenancy_tier(t, 2, TIER_PREMIUM) == TIER_FREE);
    /* a tenant without connections is not tracked: a change names no entry, and the last
     * connection's end forgets the tier (the next authentication reads it) */
    tenancy_tier_changed(t, 3, TIER_STANDARD);
    CHECK(tenancy_tier(t, 3, TIER_PREMIUM) == TIER_PREMIUM);
    tenancy_key_in_use(t, 21, 2, TIER_FREE); /* a second connection of tenant 2 */
    tenancy_key_released(t, 20);
    CHECK(tenancy_tier(t, 2, TIER_PREMIUM) == TIER_FREE);
    tenancy_key_released(t, 21);
    CHECK(tenancy_tier(t, 2, TIER_PREMIUM) == TIER_PREMIUM);
    /* a tier that does not exist changes nothing */
    tenancy_tier_changed(t, 1, -1);
    tenancy_tier_changed(t, 1, TIER_COUNT);
    CHECK(tenancy_tier(t, 1, TIER_PREMIUM) == TIER_STANDARD);
    teardown();
}

static void test_notify(void)
{
    setup();
    tenancy *t = srv.tenancy;
    tenancy_key_in_use(t, 5, 50, TIER_FREE);
    tenancy_key_in_use(t, 6, 60, TIER_FREE);
    tenancy_notify(t, "revoked:5");
    CHECK(!tenancy_key_ok(t, 5, 50) && tenancy_key_ok(t, 6, 60));
    tenancy_notify(t, "tier:60:premium");
    CHECK(tenancy_tier(t, 60, TIER_FREE) == TIER_PREMIUM);
    tenancy_notify(t, "tier:60:platinum"); /* unknown tier: ignored */
    CHECK(tenancy_tier(t, 60, TIER_FREE) == TIER_PREMIUM);
    tenancy_notify(t, "deleted:60");
    CHECK(!tenancy_key_ok(t, 6, 60));
    /* engine changes of tenants not loaded here, and malformed payloads: no effect, no crash */
    tenancy_notify(t, "engine:70:faiss");
    tenancy_notify(t, "engine:70:default");
    tenancy_notify(t, "engine:70:bogus");
    tenancy_notify(t, "");
    tenancy_notify(t, "revoked:");
    tenancy_notify(t, "revoked:abc");
    tenancy_notify(t, "deleted");
    tenancy_notify(t, "tier:70");
    tenancy_notify(t, "something:else");
    tenancy_key_in_use(t, 7, 70, TIER_FREE);
    CHECK(tenancy_key_ok(t, 7, 70));
    CHECK(tenancy_tier(t, 70, TIER_STANDARD) == TIER_FREE);
    teardown();
}

/* The embedding model a connection embeds with follows the tenant's swaps: the periodic
 * check's first news only teaches the model; a newer generation (a swap, notified) also
 * drops the tenant's index entry; older or malformed news changes nothing. */
static void test_embedding(void)
{
    setup();
    tenancy *t = srv.tenancy;
    int64_t gen = 0;
    uint32_t dim = 384;
    char provider[16] = "builtin";
    tenancy_embedding(t, 80, &gen, &dim, provider); /* nothing known: unchanged */
    CHECK(gen == 0 && dim == 384 && strcmp(provider, "builtin") == 0);
    tenant *e1 = tenants_get(srv.tenants, 80, 384);
    tenancy_embedding_changed(t, 80, 2, "openai", 64, false);
    tenant *e2 = tenants_get(srv.tenants, 80, 384);
    CHECK(e1 == e2); /* learnt, not a change: the entry stays */
    tenancy_embedding(t, 80, &gen, &dim, provider);
    CHECK(gen == 2 && dim == 64 && strcmp(provider, "openai") == 0);
    tenancy_notify(t, "embedding:80:3:builtin:128");
    tenant *e3 = tenants_get(srv.tenants, 80, 64); /* a request that read the old model */
    CHECK(e3 != e1); /* dropped: a new entry (at dimension 128, tenants_dim_changed) */
    tenancy_embedding(t, 80, &gen, &dim, provider);
    CHECK(gen == 3 && dim == 128 && strcmp(provider, "builtin") == 0);
    /* older, malformed or impossible news: no effect */
    tenancy_notify(t, "embedding:80:1:openai:64");
    tenancy_notify(t, "embedding:80:4:openai:0");
    tenancy_notify(t, "embedding:80:4:openai:9000");
    tenancy_notify(t, "embedding:80:x");
    tenancy_notify(t, "embedding:");
    tenancy_embedding(t, 80, &gen, &dim, provider);
    CHECK(gen == 3 && dim == 128 && strcmp(provider, "builtin") == 0);
    int64_t later = 5; /* a connection ahead of what this process knows keeps its own */
    tenancy_embedding(t, 80, &later, &dim, provider);
    CHECK(later == 5);
    tenants_put(e1);
    tenants_put(e2);
    tenants_put(e3);
    teardown();
}

int main(void)
{
    test_bucket_burst_and_refill();
    test_bucket_exact_admission();
    test_bucket_clock_order();
    test_rates();
    test_rates_threads();
    test_sweep_buckets();
    test_keys();
    test_tiers();
    test_notify();
    test_embedding();
    CHECK_RETURN();
}
