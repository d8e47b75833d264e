/* tests/unit/test_access.c: server/domain/access.c and access_writer.c: the per-worker access
 * log (one entry per tenant and memory, counts summed, the latest time kept; entries whose
 * keys collide kept apart; taken whole) and its writer on a fake pool (tests/fakes/fake_req.h):
 * the first counts written at the first tick, then at most once per flush interval, or at
 * every tick while draining; one statement in flight; the four binary bigint[] parameters
 * PostgreSQL receives; counts that failed to be written given back (and added to newer
 * ones), counts a refused submit kept.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "access.h"
#include "check.h"
#include "fake_req.h"
#include "hash.h"
#include "pgres.h"

static fr_env env;

/* The entry of (tenant, id) in e[0..n), or NULL. */
static const access_entry *entry(const access_entry *e, size_t n, int64_t tid, uint64_t id)
{
    for (size_t i = 0; i < n; i++)
        if (e[i].tenant == tid && e[i].id == id)
            return &e[i];
    return NULL;
}

static void test_log(void)
{
    access_log *l = access_log_create();
    CHECK(l && access_log_count(l) == 0);
    access_entry *e = (access_entry *)1;
    size_t n = 7;
    CHECK(access_log_take(l, &e, &n) == 0 && e == NULL && n == 0);

    uint64_t ids[] = {1, 2, 1, 3, 1};
    CHECK(access_log_add(l, 7, ids, 5, 1000) == 0);
    CHECK(access_log_add(l, 7, ids, 1, 900) == 0);  /* an older time does not go back */
    CHECK(access_log_add(l, 8, ids, 2, 2000) == 0); /* another tenant's memory 1 and 2 */
    CHECK(access_log_count(l) == 5);
    CHECK(access_log_take(l, &e, &n) == 0 && n == 5);
    const access_entry *x = entry(e, n, 7, 1);
    CHECK(x && x->count == 4 && x->last_ms == 1000);
    x = entry(e, n, 7, 2);
    CHECK(x && x->count == 1);
    x = entry(e, n, 7, 3);
    CHECK(x && x->count == 1);
    x = entry(e, n, 8, 1);
    CHECK(x && x->count == 1 && x->last_ms == 2000);
    /* taken: the log is empty and starts over */
    CHECK(access_log_count(l) == 0);
    CHECK(access_log_add(l, 7, ids, 1, 3000) == 0 && access_log_count(l) == 1);
    /* merged back: counts add up with what came since, the latest time wins */
    CHECK(access_log_merge(l, e, n) == 0);
    free(e);
    CHECK(access_log_count(l) == 5);
    CHECK(access_log_take(l, &e, &n) == 0 && n == 5);
    x = entry(e, n, 7, 1);
    CHECK(x && x->count == 5 && x->last_ms == 3000);
    free(e);

    /* keys are (tenant * golden) ^ id: pairs of different tenants can share one, and the
     * key after it, and the reserved key UINT64_MAX is skipped */
    uint64_t k = hash_pair(1, 100);
    uint64_t id2 = k ^ hash_pair(2, 0);       /* tenant 2: the same key as (1, 100) */
    uint64_t id3 = (k + 1) ^ hash_pair(3, 0); /* tenant 3: the next key */
    uint64_t id4 = UINT64_MAX ^ hash_pair(4, 0);
    uint64_t id5 = UINT64_MAX ^ hash_pair(5, 0);
    CHECK(hash_pair(2, id2) == k && hash_pair(3, id3) == k + 1);
    uint64_t one = 100;
    CHECK(access_log_add(l, 1, &one, 1, 1) == 0);
    CHECK(access_log_add(l, 2, &id2, 1, 2) == 0);
    CHECK(access_log_add(l, 3, &id3, 1, 3) == 0);
    CHECK(access_log_add(l, 4, &id4, 1, 4) == 0);
    CHECK(access_log_add(l, 5, &id5, 1, 5) == 0);
    CHECK(access_log_add(l, 2, &id2, 1, 6) == 0); /* found past (1, 100) */
    CHECK(access_log_add(l, 3, &id3, 1, 7) == 0);
    CHECK(access_log_add(l, 5, &id5, 1, 8) == 0);
    CHECK(access_log_count(l) == 5);
    CHECK(access_log_take(l, &e, &n) == 0 && n == 5);
    CHECK((x = entry(e, n, 1, 100)) && x->count == 1);
    CHECK((x = entry(e, n, 2, id2)) && x->count == 2 && x->last_ms == 6);
    CHECK((x = entry(e, n, 3, id3)) && x->count == 2 && x->last_ms == 7);
    CHECK((x = entry(e, n, 4, id4)) && x->count == 1);
    CHECK((x = entry(e, n, 5, id5)) && x->count == 2 && x->last_ms == 8);
    free(e);

    /* many memories: every one counted apart */
    int failed = 0;
    for (uint64_t i = 0; i < 5000; i++) {
        uint64_t id = i * 7919;
        failed += access_log_add(l, (int64_t)(i % 3), &id, 1, (int64_t)i) != 0;
    }
    CHECK(failed == 0);
    CHECK(access_log_count(l) == 5000);
    access_log_destroy(l);
    access_log_destroy(NULL);
}

/* Decodes a binary bigint[] parameter (array_send) into v (at most max); returns its length
 * or -1 when it is not one. */
static long bin_array(const fr_stmt *s, size_t p, int64_t *v, long max)
{
    const unsigned char *b = (const unsigned char *)s->values[p];
    if (!b || s->formats[p] != 1 || s->lengths[p] < 20)
        return -1;
#define BE32(q) ((uint32_t)(q)[0] << 24 | (uint32_t)(q)[1] << 16 | (uint32_t)(q)[2] << 8 | (q)[3])
    if (BE32(b) != 1 || BE32(b + 4) != 0 || BE32(b + 8) != 20 || BE32(b + 16) != 1)
        return -1;
    long n = (long)BE32(b + 12);
    if (s->lengths[p] != 20 + 12 * n)
        return -1;
    for (long i = 0; i < n && i < max; i++) {
        const unsigned char *q = b + 20 + 12 * i;
        if (BE32(q) != 8)
            return -1;
        v[i] = (int64_t)((uint64_t)BE32(q + 4) << 32 | BE32(q + 8));
    }
#undef BE32
    return n;
}

static void test_writer(void)
{
    access_log *l = access_log_create();
    db_pool *pool = worker_db(env.w);
    access_writer *aw = access_writer_create(l, pool, 3);
    CHECK(aw && access_writer_idle(aw));
    uint64_t now = 5000;
    /* nothing to write: no statement */
    access_writer_tick(aw, now, 5000, false);
    CHECK(fr_jobs() == 0);
    /* the first counts go at the first tick, whatever the interval */
    uint64_t ids[] = {10, 11, 10};
    access_log_add(l, 7, ids, 3, INT64_C(1700000000123));
    int64_t big = INT64_C(0x123456789a);
    uint64_t bigid = (uint64_t)big;
    access_log_add(l, 8, &bigid, 1, -5); /* values past 32 bits and negative ones */
    CHECK(!access_writer_idle(aw));
    access_writer_tick(aw, now, 5000, false);
    fr_job *j = fr_take();
    CHECK(j && j->kind == FR_POOL && j->pool == pool && j->rls == -1 && j->nq == 1);
    CHECK(j && strcmp(j->q[0].name, "memory_touch") == 0 && j->q[0].nvalues == 4);
    CHECK(access_log_count(l) == 0 && !access_writer_idle(aw)); /* in flight */
    if (j) {
        int64_t t[8], id[8], c[8], ms[8];
        CHECK(bin_array(&j->q[0], 0, t, 8) == 3 && bin_array(&j->q[0], 1, id, 8) == 3);
        CHECK(bin_array(&j->q[0], 2, c, 8) == 3 && bin_array(&j->q[0], 3, ms, 8) == 3);
        bool seen10 = false, seen11 = false, seenbig = false;
        for (int i = 0; i < 3; i++) {
            if (t[i] == 7 && id[i] == 10)
                seen10 = c[i] == 2 && ms[i] == INT64_C(1700000000123);
            if (t[i] == 7 && id[i] == 11)
                seen11 = c[i] == 1;
            if (t[i] == 8 && id[i] == big)
                seenbig = c[i] == 1 && ms[i] == -5;
        }
        CHECK(seen10 && seen11 && seenbig);
    }
    /* one statement at a time: more counts wait, even when draining */
    access_log_add(l, 7, ids, 1, 1);
    access_writer_tick(aw, now + 10000, 5000, true);
    CHECK(fr_jobs() == 0);
    /* it fails: its counts come back and add to the new ones */
    fr_answer_error(j, "57P01", "terminating connection", NULL);
    CHECK(access_log_count(l) == 3 && !access_writer_idle(aw));
    /* within the interval since the last write began: nothing */
    access_writer_tick(aw, now + 4999, 5000, false);
    CHECK(fr_jobs() == 0);
    /* the interval elapsed: everything in one statement */
    access_writer_tick(aw, now + 5000, 5000, false);
    j = fr_take();
    CHECK(j != NULL);
    if (j) {
        int64_t t[8], id[8], c[8];
        CHECK(bin_array(&j->q[0], 0, t, 8) == 3 && bin_array(&j->q[0], 1, id, 8) == 3 &&
              bin_array(&j->q[0], 2, c, 8) == 3);
        int64_t c10 = 0;
        for (int i = 0; i < 3; i++)
            if (t[i] == 7 && id[i] == 10)
                c10 = c[i];
        CHECK(c10 == 3); /* 2 given back + 1 since */
        fr_answer1(j, pgres_command());
    }
    CHECK(access_writer_idle(aw) && access_log_count(l) == 0);
    /* while draining, every tick writes what there is */
    access_log_add(l, 7, ids, 1, 2);
    access_writer_tick(aw, now + 5001, 5000, true);
    j = fr_take();
    CHECK(j != NULL);
    if (j)
        fr_answer1(j, pgres_command());
    /* a pool that refuses the statement: the counts stay for the next tick */
    access_log_add(l, 7, ids, 2, 3);
    fr_submit_fail(1);
    access_writer_tick(aw, now + 20000, 5000, false);
    CHECK(fr_jobs() == 0 && access_log_count(l) == 2 && !access_writer_idle(aw));
    access_writer_tick(aw, now + 20001, 5000, false); /* not sent: due again at once */
    j = fr_take();
    CHECK(j != NULL);
    if (j)
        fr_answer1(j, pgres_command());
    CHECK(access_writer_idle(aw));
    access_writer_destroy(aw);
    access_log_destroy(l);
}

int main(void)
{
    if (fr_env_init(&env, NULL, false) < 0) {
        fprintf(stderr, "cannot set up the test server\n");
        return 1;
    }
    test_log();
    test_writer();
    CHECK(fr_jobs() == 0);
    fr_env_fini(&env);
    CHECK_RETURN();
}
