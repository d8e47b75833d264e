/* tests/unit/test_vindex_threads.c: every kind of call on one index at once, for
 * ThreadSanitizer (deploy/test runs it in build-tsan) and as a plain correctness test.
 *
 * Two searchers (plain, filtered, scored), a writer (adds, upserts, removes), a metadata
 * writer (set_meta, update_meta), a toucher (touch_meta, which writes the metadata's atomic
 * word under the searches), a maintainer (maintenance, calibration), a reader
 * (contains, get_meta, get_vector, foreach, stats, recall) and a snapshotter (save) run
 * on one index while it goes from SQ8 to ANN and is compacted under them, first with the
 * native engine, then with FAISS. Each id's vector never changes and its group (what the
 * filter reads) never changes, so every answer can be checked while the index moves: hits
 * carry their id's exact similarity, in score order, pass the filter, and fill k; reads see
 * a live id's own vector. At the end the index and the last snapshot are compared with the
 * writer's record of which ids are live.
 */
#include <math.h>
#include <stddef.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "vfaiss.h"
#include "vindex.h"

/* The writer makes at least WRITES changes, and goes on (up to WRITES_MAX) until every other
 * thread has done enough for the overlap to mean something. */
enum { D = 48, KEYS = 3000, BASE = 1400, WRITES = 3000, WRITES_MAX = 60000, K = 10, GROUPS = 7 };

typedef struct meta {
    uint32_t group;   /* id % GROUPS, never changes */
    uint32_t version; /* bumped by the metadata writer */
    uint64_t touches; /* the atomic range: bumped by the toucher */
} meta;

static float X[KEYS + 1][D]; /* id -> its vector (ids 1..KEYS), normalized */

typedef struct shared {
    vindex *vi;
    atomic_bool done;
    atomic_int bad;
    atomic_int searches, reads, saves, rebuilds, meta_writes, writes, touches;
    bool live[KEYS + 1]; /* the writer's record; read by others only after the join */
    char snap[256];
} shared;

static uint64_t next_rand(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static void make_vectors(void)
{
    uint64_t s = 0x9e3779b97f4a7c15ull;
    for (size_t id = 1; id <= KEYS; id++) {
        double n = 0;
        /* clustered: a shared direction per group plus noise, so the ANN codes matter */
        for (size_t j = 0; j < D; j++) {
            double base = ((id % GROUPS) == j % GROUPS) ? 0.6 : 0.0;
            X[id][j] = (float)(base + (double)(next_rand(&s) % 2001) / 1000.0 - 1.0);
            n += (double)X[id][j] * X[id][j];
        }
        for (size_t j = 0; j < D; j++)
            X[id][j] = (float)(X[id][j] / sqrt(n));
    }
}

static double exact_sim(uint64_t id, const float *q)
{
    double dot = 0, qn = 0;
    for (size_t j = 0; j < D; j++) {
        dot += (double)X[id][j] * q[j];
        qn += (double)q[j] * q[j];
    }
    return dot / sqrt(qn);
}

/* The index stores each vector normalized again: equal to X[id] up to rounding. */
static bool same_vec(const float *v, uint64_t id)
{
    for (size_t j = 0; j < D; j++)
        if (fabsf(v[j] - X[id][j]) > 1e-6f)
            return false;
    return true;
}

/* Background threads in the server run at a cadence; here a short pause between rounds
 * keeps one thread's loop from holding a mutex the others wait for (maint_mu, wmu). */
static void pause_ms(long ms)
{
    struct timespec t = {0, ms * 1000000L};
    nanosleep(&t, NULL);
}

static bool keep_group(uint64_t id, const void *m, void *ctx)
{
    return ((const meta *)m)->group == *(const uint32_t *)ctx;
}

/* similarity plus a small bonus from the version and the touches: score <= 1 * similarity +
 * 0.02 */
static double score_fn(float sim, const void *m, void *ctx)
{
    (void)ctx;
    const meta *x = m;
    return sim + 0.005 * (double)(x->version % 3) +
           0.005 * (double)(vindex_meta_word(&x->touches) % 2);
}

static void touch_fn(uint64_t id, void *m, void *ctx)
{
    (void)ctx;
    meta *x = m;
    vindex_meta_word_store(&x->touches, vindex_meta_word(&x->touches) + 1);
}

static void bump_version(uint64_t id, void *m, void *ctx)
{
    (void)ctx;
    ((meta *)m)->version++;
}

static void *searcher(void *arg)
{
    shared *s = arg;
    uint64_t rs = (uint64_t)(uintptr_t)&rs | 1;
    vindex_hit h[K];
    int n = 0;

    while (!atomic_load(&s->done) || n < 20) {
        float q[D];
        uint64_t like = next_rand(&rs) % KEYS + 1;
        uint32_t group = (uint32_t)(next_rand(&rs) % GROUPS);
        int mode = n % 3;
        for (size_t j = 0; j < D; j++)
            q[j] = X[like][j] + (float)((double)(next_rand(&rs) % 101) / 500.0 - 0.1);
        vindex_query qq = {.vec = q, .k = K};
        if (mode == 1) {
            qq.keep = keep_group;
            qq.ctx = &group;
        } else if (mode == 2) {
            qq.score = score_fn;
            qq.score_slope = 1.0;
            qq.score_bound = 0.02;
            qq.score_monotone = true;
        }
        size_t nh = 0;
        if (vindex_search(s->vi, &qq, h, &nh) != 0 || nh != K) {
            atomic_fetch_add(&s->bad, 1);
            n++;
            atomic_fetch_add(&s->searches, 1);
            continue;
        }
        for (size_t i = 0; i < nh; i++) {
            uint64_t id = h[i].id;
            /* 0.01: an ANN hit ranked from its code reports the int8 estimate */
            if (id == 0 || id > KEYS || fabs(exact_sim(id, q) - h[i].similarity) > 0.01 ||
                (i > 0 && h[i].score > h[i - 1].score) || (mode == 1 && id % GROUPS != group))
                atomic_fetch_add(&s->bad, 1);
        }
        n++;
        atomic_fetch_add(&s->searches, 1);
    }
    return NULL;
}

static bool enough(shared *s)
{
    return atomic_load(&s->searches) >= 200 && atomic_load(&s->saves) >= 3 &&
           atomic_load(&s->rebuilds) >= 2 && atomic_load(&s->reads) >= 200 &&
           atomic_load(&s->meta_writes) >= 100 && atomic_load(&s->touches) >= 100;
}

static void *toucher(void *arg)
{
    shared *s = arg;
    uint64_t rs = 4242;
    int n = 0;

    while (!atomic_load(&s->done)) {
        uint64_t ids[4];
        for (size_t i = 0; i < 4; i++)
            ids[i] = next_rand(&rs) % KEYS + 1;
        if (vindex_touch_meta(s->vi, ids, 4, touch_fn, NULL) > 4)
            atomic_fetch_add(&s->bad, 1);
        n++;
        atomic_fetch_add(&s->touches, 1);
        if (n % 32 == 0)
            pause_ms(1);
    }
    return NULL;
}

static void *writer(void *arg)
{
    shared *s = arg;
    uint64_t rs = 12345;

    for (int i = 0; i < WRITES_MAX && (i < WRITES || !enough(s)); i++) {
        uint64_t id = next_rand(&rs) % KEYS + 1;
        meta m = {(uint32_t)(id % GROUPS), 0, 0};
        int rc;
        switch (next_rand(&rs) % 4) {
        case 0: /* remove */
            rc = vindex_remove(s->vi, id);
            if (rc != (s->live[id] ? 0 : VINDEX_E_NOT_FOUND))
                atomic_fetch_add(&s->bad, 1);
            s->live[id] = false;
            break;
        case 1: /* add */
            rc = vindex_add(s->vi, id, X[id], &m);
            if (rc != (s->live[id] ? VINDEX_E_EXISTS : 0))
                atomic_fetch_add(&s->bad, 1);
            s->live[id] = true;
            break;
        default: /* upsert: the same vector, fresh metadata */
            rc = vindex_upsert(s->vi, id, X[id], &m);
            if (rc != (s->live[id] ? 1 : 0))
                atomic_fetch_add(&s->bad, 1);
            s->live[id] = true;
            break;
        }
        atomic_fetch_add(&s->writes, 1);
        if (i % 64 == 63)
            pause_ms(1);
    }
    atomic_store(&s->done, true);
    return NULL;
}

static void *meta_writer(void *arg)
{
    shared *s = arg;
    uint64_t rs = 777;
    int n = 0;

    while (!atomic_load(&s->done)) {
        uint64_t ids[8];
        for (size_t i = 0; i < 8; i++)
            ids[i] = next_rand(&rs) % KEYS + 1;
        (void)vindex_update_meta(s->vi, ids, 8, bump_version, NULL);
        meta m = {(uint32_t)(ids[0] % GROUPS), (uint32_t)n, 0};
        int rc = vindex_set_meta(s->vi, ids[0], &m);
        if (rc != 0 && rc != VINDEX_E_NOT_FOUND)
            atomic_fetch_add(&s->bad, 1);
        n++;
        atomic_fetch_add(&s->meta_writes, 1);
        if (n % 16 == 0)
            pause_ms(1);
    }
    return NULL;
}

static void *maintainer(void *arg)
{
    shared *s = arg;

    while (!atomic_load(&s->done)) {
        int rc = vindex_maintenance(s->vi);
        if (rc < 0)
            atomic_fetch_add(&s->bad, 1);
        if (rc == 1)
            atomic_fetch_add(&s->rebuilds, 1);
        vindex_recall rec;
        if (vindex_calibrate(s->vi, 8, 0.9, &rec) != 0)
            atomic_fetch_add(&s->bad, 1);
        pause_ms(2);
    }
    if (vindex_maintenance(s->vi) == 1)
        atomic_fetch_add(&s->rebuilds, 1);
    return NULL;
}

static int check_row(uint64_t id, const float *vec, const void *m, void *ctx)
{
    int *bad = ctx;
    if (id == 0 || id > KEYS || ((const meta *)m)->group != id % GROUPS || !same_vec(vec, id))
        ++*bad;
    return 0;
}

static void *reader(void *arg)
{
    shared *s = arg;
    uint64_t rs = 999;
    int n = 0, bad = 0;

    while (!atomic_load(&s->done) || n < 20) {
        uint64_t id = next_rand(&rs) % KEYS + 1;
        float v[D];
        meta m;
        (void)vindex_contains(s->vi, id);
        if (vindex_get_meta(s->vi, id, &m) == 0 && m.group != id % GROUPS)
            bad++;
        if (vindex_get_vector(s->vi, id, v) == 0 && !same_vec(v, id))
            bad++;
        if (n % 50 == 0) {
            vindex_stats st;
            vindex_recall rec;
            (void)vindex_foreach(s->vi, check_row, &bad);
            vindex_get_stats(s->vi, &st);
            vindex_get_recall(s->vi, &rec);
            if (st.count + st.tombstones != st.slots || vindex_bytes(s->vi) == 0)
                bad++;
        }
        n++;
        atomic_fetch_add(&s->reads, 1);
    }
    atomic_fetch_add(&s->bad, bad);
    return NULL;
}

static void *snapshotter(void *arg)
{
    shared *s = arg;
    int n = 0;

    while (!atomic_load(&s->done) || n < 2) {
        if (vindex_save(s->vi, s->snap, (uint64_t)n + 1) != 0)
            atomic_fetch_add(&s->bad, 1);
        n++;
        atomic_fetch_add(&s->saves, 1);
        pause_ms(2);
    }
    return NULL;
}

static void run(const char *name, const vindex_opts *base_opts)
{
    static shared s; /* big (live[]); one run at a time */
    vindex_opts o = *base_opts;
    /* tmpfs when there is one: the saves' fsyncs would otherwise set the pace */
    char dir[64];
    pthread_t th[8];
    void *(*fn[8])(void *) = {searcher,   searcher, writer,      meta_writer,
                              maintainer, reader,   snapshotter, toucher};

    snprintf(dir, sizeof(dir), "%s/engram-vthreads-XXXXXX",
             access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp");
    CHECK(mkdtemp(dir) != NULL);
    memset(&s, 0, sizeof(s));
    snprintf(s.snap, sizeof(s.snap), "%s/t.idx", dir);
    o.dim = D;
    o.meta_size = sizeof(meta);
    o.meta_atomic_off = offsetof(meta, touches);
    o.meta_atomic_len = sizeof(uint64_t);
    s.vi = vindex_create(&o);
    CHECK(s.vi != NULL);
    if (s.vi == NULL)
        return;
    for (uint64_t id = 1; id <= BASE; id++) {
        meta m = {(uint32_t)(id % GROUPS), 0, 0};
        CHECK(vindex_add(s.vi, id, X[id], &m) == 0);
        s.live[id] = true;
    }
    for (size_t i = 0; i < 8; i++)
        CHECK(pthread_create(&th[i], NULL, fn[i], &s) == 0);
    for (size_t i = 0; i < 8; i++)
        pthread_join(th[i], NULL);

    vindex_stats st;
    vindex_get_stats(s.vi, &st);
    fprintf(stderr,
            "%s: %d searches, %d reads, %d metadata writes, %d saves, %d rebuilds during %d "
            "writes; %zu live, kind %d\n",
            name, atomic_load(&s.searches), atomic_load(&s.reads), atomic_load(&s.meta_writes),
            atomic_load(&s.saves), atomic_load(&s.rebuilds), atomic_load(&s.writes), st.count,
            (int)st.kind);
    CHECK_MSG(atomic_load(&s.bad) == 0, "%d wrong answers", atomic_load(&s.bad));
    CHECK_MSG(enough(&s), "the threads did not overlap enough");

    /* the final state is the writer's record */
    size_t nlive = 0;
    int bad = 0;
    for (uint64_t id = 1; id <= KEYS; id++) {
        nlive += s.live[id];
        bad += vindex_contains(s.vi, id) != s.live[id];
    }
    CHECK(st.count == nlive && nlive > 0 && bad == 0);
    CHECK(vindex_foreach(s.vi, check_row, &bad) == 0 && bad == 0);

    /* the last snapshot loads, and holds only ids with their own vectors */
    vindex *back = NULL;
    uint64_t seq = 0;
    CHECK(vindex_load(s.snap, &o, &back, &seq) == 0 && seq >= 2);
    if (back != NULL) {
        CHECK(vindex_count(back) > 0);
        CHECK(vindex_foreach(back, check_row, &bad) == 0 && bad == 0);
        vindex_destroy(back);
    }
    vindex_destroy(s.vi);
    unlink(s.snap);
    rmdir(dir);
}

int main(void)
{
    make_vectors();
    /* SQ8 from the start, ANN once 1,800 are live (the writes cross it both ways), small
     * compaction thresholds so maintenance rebuilds under the searches */
    vindex_opts native = {.quant_min = 200,
                          .ann_min = 1800,
                          .ann_candidates = 64,
                          .ann_max_candidates = 512,
                          .compact_percent = 5,
                          .inline_compact_max = 1};
    run("native", &native);
    vindex_opts faiss = native;
    faiss.engine = VINDEX_ENGINE_FAISS;
    faiss.faiss_factory = "HNSW16,Flat";
    faiss.faiss_ef_search = 32;
    faiss.faiss_engine = vfaiss_engine();
    run("faiss", &faiss);
    CHECK_RETURN();
}
