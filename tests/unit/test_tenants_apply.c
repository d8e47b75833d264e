/* tests/unit/test_tenants_apply.c: server/domain/tenants_apply.c and tenants_snap.c on a real
 * registry (the server of tests/fakes/fake_req.h, whose blocking database calls fail):
 * changes applied once each in any order with the watermark advancing over contiguous runs,
 * a late older write kept out by a newer one or by a delete's tombstone (pruned once the
 * watermark passes it), metadata-only changes keeping the index's vector, access counts and
 * feedback counts, metadata for a memory the index lacks left unapplied, changes queued while
 * the index loads, the read floor; and snapshots: written when changed, read back with the
 * same vectors, metadata and tags, memories written after the snapshot's change number set
 * aside, the identity at the file's end, tag records that do not describe the index refused.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "fake_req.h"
#include "tenants_int.h"

#define DIM 8

static fr_env env;

static void unit(float *v, int axis, float other)
{
    memset(v, 0, DIM * sizeof(float));
    v[axis] = 1.0f;
    v[(axis + 1) % DIM] = other;
}

static mem_meta meta(uint64_t id, uint64_t seq, float importance)
{
    return (mem_meta){.seq = seq,
                      .created_ms = 1700000000000,
                      .expires_ms = INT64_MAX,
                      .importance = importance,
                      .type = MEM_FACT,
                      .scope = SCOPE_TENANT};
}

static void upsert(tenant *t, uint64_t seq, uint64_t id, int axis, float importance)
{
    float v[DIM];
    unit(v, axis, 0.0f);
    mem_meta m = meta(id, seq, importance);
    tenants_apply_upsert(t, seq, id, v, &m);
}

/* The index's metadata of id (false when absent). */
static bool get(tenant *t, uint64_t id, mem_meta *m)
{
    memset(m, 0, sizeof(*m));
    return vindex_get_meta(tenants_vindex(t), id, m) == 0;
}

/* The axis of id's stored vector (-1 when absent). */
static int axis_of(tenant *t, uint64_t id)
{
    float v[DIM];
    if (vindex_get_vector(tenants_vindex(t), id, v) != 0)
        return -1;
    int best = 0;
    for (int d = 1; d < DIM; d++)
        if (v[d] > v[best])
            best = d;
    return best;
}

static uint64_t watermark(tenant *t, size_t *nabove)
{
    pthread_mutex_lock(&t->mu);
    uint64_t a = t->applied;
    if (nabove)
        *nabove = t->nabove;
    pthread_mutex_unlock(&t->mu);
    return a;
}

static bool applied(tenant *t, uint64_t seq)
{
    pthread_mutex_lock(&t->mu);
    bool a = tn_seq_applied(t, seq);
    pthread_mutex_unlock(&t->mu);
    return a;
}

static size_t tombstones(tenant *t)
{
    pthread_mutex_lock(&t->mu);
    size_t n = t->deleted ? idmap_count(t->deleted) : 0;
    pthread_mutex_unlock(&t->mu);
    return n;
}

/* ---- change order ---------------------------------------------------------------------- */

static void test_order(void)
{
    tenant *t = fr_index_loaded(&env, 1, DIM, 0);
    CHECK(t != NULL);
    if (!t)
        return;
    size_t above;
    /* 3 before 1 and 2: applied, remembered above the watermark */
    upsert(t, 3, 30, 3, 0.3f);
    CHECK(watermark(t, &above) == 0 && above == 1);
    CHECK(applied(t, 3) && !applied(t, 2));
    upsert(t, 1, 10, 1, 0.1f);
    CHECK(watermark(t, &above) == 1 && above == 1);
    /* 2 closes the gap: the watermark runs over 3 */
    upsert(t, 2, 20, 2, 0.2f);
    CHECK(watermark(t, &above) == 3 && above == 0);
    CHECK(vindex_count(tenants_vindex(t)) == 3);
    CHECK(tenants_floor_of(t) == 3);
    /* a change applied twice is applied once: the second (other content) is ignored */
    float v[DIM];
    unit(v, 5, 0.0f);
    mem_meta m = meta(20, 2, 0.9f);
    tenants_apply_upsert(t, 2, 20, v, &m);
    mem_meta got;
    CHECK(get(t, 20, &got) && got.importance == 0.2f && axis_of(t, 20) == 2);

    /* a later write of 20 replaces it (vector and metadata) */
    upsert(t, 4, 20, 4, 0.4f);
    CHECK(get(t, 20, &got) && got.importance == 0.4f && got.seq == 4 && axis_of(t, 20) == 4);
    /* an older write of 20 that arrives after a newer one (change 6 before 5) stays out,
     * though its change number counts as applied */
    upsert(t, 6, 20, 6, 0.6f);
    upsert(t, 5, 20, 5, 0.5f);
    CHECK(get(t, 20, &got) && got.seq == 6 && got.importance == 0.6f && axis_of(t, 20) == 6);
    CHECK(watermark(t, NULL) == 6);
    /* the version recorded is the change's number, not what the metadata says (a caller
     * that left it 0 would let any late write through) */
    unit(v, 7, 0.0f);
    m = meta(20, 0, 0.8f);
    tenants_apply_upsert(t, 8, 20, v, &m);
    CHECK(get(t, 20, &got) && got.seq == 8 && got.importance == 0.8f);
    upsert(t, 7, 20, 1, 0.7f);
    CHECK(get(t, 20, &got) && got.seq == 8 && axis_of(t, 20) == 7);
    tenants_put(t);
}

/* ---- deletes and their tombstones ------------------------------------------------------ */

static void test_deletes(void)
{
    tenant *t = fr_index_loaded(&env, 2, DIM, 0);
    if (!t)
        return;
    mem_meta got;
    upsert(t, 1, 11, 1, 0.5f);
    upsert(t, 2, 12, 2, 0.5f);
    /* delete 11 at change 4 while 3 is missing: a tombstone keeps an older write out */
    tenants_apply_delete(t, 4, 11);
    CHECK(!get(t, 11, &got) && vindex_count(tenants_vindex(t)) == 1);
    CHECK(tombstones(t) == 1);
    /* change 3, an update of 11 committed before its delete, arrives late: not undone */
    upsert(t, 3, 11, 3, 0.7f);
    CHECK(!get(t, 11, &got));
    /* the watermark passed the delete: the tombstone is no longer needed */
    CHECK(watermark(t, NULL) == 4 && tombstones(t) == 0);

    /* a delete older than the memory's version (12 rewritten at 6, deleted at 5, which
     * arrives last) leaves the newer version */
    upsert(t, 6, 12, 6, 0.6f);
    tenants_apply_delete(t, 5, 12);
    CHECK(get(t, 12, &got) && got.seq == 6 && axis_of(t, 12) == 6);
    /* deleting what was never there is applied too */
    tenants_apply_delete(t, 7, 99);
    CHECK(watermark(t, NULL) == 7 && vindex_count(tenants_vindex(t)) == 1);
    tenants_put(t);
}

/* ---- metadata-only changes --------------------------------------------------------------- */

static void test_metadata(void)
{
    tenant *t = fr_index_loaded(&env, 3, DIM, 0);
    if (!t)
        return;
    upsert(t, 1, 1, 2, 0.5f);
    /* three accesses in the index (the database learns them later), feedback counts */
    uint64_t id = 1;
    for (int i = 0; i < 3; i++)
        tenants_touch(t, &id, 1, 1700000005000 + i);
    mem_meta m = meta(1, 2, 0.5f);
    m.cited = 4;
    m.injected = 9;
    tenants_apply_upsert(t, 2, 1, NULL, &m);
    mem_meta got;
    CHECK(get(t, 1, &got) && mem_meta_access_count(&got) == 3);
    CHECK(mem_meta_last_access(&got) == 1700000005002);
    CHECK(got.cited == 4 && got.injected == 9);
    /* an update (archive, new importance, tags) without a vector: the vector stays; the
     * change carries no access or feedback counts (0): the index's higher ones stay */
    uint64_t tags[2] = {111, 222};
    m = meta(1, 3, 0.8f);
    m.archived = 1;
    m.tags = tags;
    m.ntags = 2;
    tenants_apply_upsert(t, 3, 1, NULL, &m);
    tags[0] = 0; /* the index holds its own copy */
    CHECK(get(t, 1, &got) && got.importance == 0.8f && got.archived);
    CHECK(axis_of(t, 1) == 2 && got.seq == 3);
    CHECK(mem_meta_access_count(&got) == 3 && got.cited == 4 && got.injected == 9);
    CHECK(got.ntags == 2 && got.tags && got.tags[0] == 111 && got.tags[1] == 222);
    /* a change bringing higher counts (from the database) raises them */
    m = meta(1, 4, 0.8f);
    m.access = mem_access_word(1700000010000, 10);
    m.cited = 5;
    tenants_apply_upsert(t, 4, 1, NULL, &m);
    CHECK(get(t, 1, &got) && mem_meta_access_count(&got) == 10 && got.cited == 5);
    CHECK(got.injected == 9 && got.ntags == 0 && got.tags == NULL);

    /* metadata of a memory the index has no vector for: not applied (the watermark stops
     * below it until a catch-up reads the whole row) */
    m = meta(2, 5, 0.5f);
    tenants_apply_upsert(t, 5, 2, NULL, &m);
    CHECK(!get(t, 2, &got) && !applied(t, 5) && watermark(t, NULL) == 4);
    /* the same memory with its vector: applied */
    float v[DIM];
    unit(v, 0, 0.0f);
    tenants_apply_upsert(t, 5, 2, v, &m);
    CHECK(get(t, 2, &got) && applied(t, 5) && watermark(t, NULL) == 5);
    tenants_put(t);
}

/* ---- changes while the index loads, and an unloaded index --------------------------------- */

static void test_loading(void)
{
    tenant *t = tenants_get(env.srv.tenants, 4, DIM);
    if (!t)
        return;
    /* not loaded: nothing is kept, but the read floor knows the change */
    upsert(t, 7, 1, 1, 0.5f);
    CHECK(tenants_floor_of(t) == 7 && tenants_read_floor(env.srv.tenants, 4) == 7);
    pthread_mutex_lock(&t->mu);
    CHECK(t->phead == NULL);
    t->state = T_LOADING;
    pthread_mutex_unlock(&t->mu);
    /* loading: changes wait in order with copies of their vectors and tags */
    uint64_t tags[1] = {42};
    float v[DIM];
    unit(v, 3, 0.0f);
    mem_meta m = meta(5, 9, 0.25f);
    m.tags = tags;
    m.ntags = 1;
    tenants_apply_upsert(t, 9, 5, v, &m);
    v[3] = 0.0f;
    tags[0] = 0;
    tenants_apply_delete(t, 8, 6);
    pthread_mutex_lock(&t->mu);
    pending *p = t->phead;
    CHECK(p && p->seq == 9 && p->id == 5 && !p->del && p->vec && p->vec[3] == 1.0f);
    CHECK(p && p->m.ntags == 1 && p->m.tags && p->m.tags[0] == 42 && p->m.tags != tags);
    CHECK(p && p->next && p->next->seq == 8 && p->next->del && !p->next->vec && !p->next->next);
    tn_pending_free_all(t);
    t->state = T_UNLOADED;
    pthread_mutex_unlock(&t->mu);
    CHECK(tenants_floor_of(t) == 9);
    /* another process's change, announced */
    tenants_notify_change(env.srv.tenants, 4, 12);
    CHECK(tenants_floor_of(t) == 12);
    CHECK(tenants_read_floor(env.srv.tenants, 99) == 0); /* never seen */
    tenants_put(t);
}

/* ---- snapshots ------------------------------------------------------------------------- */

static char snapdir[] = "/tmp/engram-test-snap-XXXXXX";

/* Loads the snapshot at path as tenants_load.c does: the file, its identity, the tags.
 * Returns the tn_tags_restore result (or a load failure as -1000 - code); *out the index. */
static int snap_read(tenant *t, const char *path, vindex **out, uint64_t *upto)
{
    vindex_opts vo;
    tn_index_opts(t, &vo);
    void *x = NULL;
    size_t xlen = 0, rec_len = 0;
    snap_id got;
    *out = NULL;
    int rc = vindex_load_extra(path, &vo, out, upto, &x, &xlen);
    if (rc != 0)
        return -1000 - rc;
    CHECK(tn_snap_extra_split(x, xlen, &rec_len, &got));
    CHECK(got.engine == VINDEX_ENGINE_NATIVE && got.factory == 0);
    rc = tn_tags_restore(*out, x, rec_len, *upto);
    free(x);
    return rc;
}

static void index_free(vindex *vi)
{
    if (vi)
        vindex_foreach(vi, tn_free_tags, NULL);
    vindex_destroy(vi);
}

static void test_snapshot(void)
{
    CHECK(mkdtemp(snapdir) != NULL);
    tenants *ts = env.srv.tenants;
    pthread_mutex_lock(&ts->dir_mu);
    ts->dir = strdup(snapdir);
    pthread_mutex_unlock(&ts->dir_mu);
    char path[PATH_MAX];
    CHECK(tn_snap_path(ts, 5, path, sizeof(path)));
    CHECK_STR_CONTAINS(path, "/5.idx");

    tenant *t = fr_index_loaded(&env, 5, DIM, 0);
    if (!t)
        return;
    CHECK(tn_save_snapshot(t) == 0); /* nothing changed: nothing written */
    CHECK(access(path, F_OK) != 0);
    uint64_t tags[3] = {7, 8, 9};
    for (uint64_t id = 1; id <= 4; id++) {
        float v[DIM];
        unit(v, (int)id, 0.5f);
        mem_meta m = meta(id, id, 0.1f * (float)id);
        m.tags = tags;
        m.ntags = (uint32_t)(id - 1); /* 0 to 3 tags */
        m.scope = SCOPE_AGENT;
        m.agent_id = 100 + id;
        tenants_apply_upsert(t, id, id, v, &m);
    }
    /* change 6 (memory 6) applied, 5 missing: the snapshot holds 6 but says "up to 4" */
    upsert(t, 6, 6, 6, 0.6f);
    CHECK(watermark(t, NULL) == 4);
    CHECK(tn_save_snapshot(t) == 1);
    CHECK(access(path, F_OK) == 0);
    CHECK(tn_save_snapshot(t) == 0); /* written: not dirty any more */

    vindex *vi;
    uint64_t upto;
    CHECK(snap_read(t, path, &vi, &upto) == 0);
    CHECK(upto == 4);
    /* memory 6 was written after the snapshot's change number: set aside, the replay of
     * the change log brings it back */
    CHECK(vi && vindex_count(vi) == 4);
    for (uint64_t id = 1; vi && id <= 4; id++) {
        mem_meta a, b;
        float va[DIM], vb[DIM];
        CHECK(vindex_get_meta(vi, id, &a) == 0 && get(t, id, &b));
        CHECK(vindex_get_vector(vi, id, va) == 0 &&
              vindex_get_vector(tenants_vindex(t), id, vb) == 0 && memcmp(va, vb, sizeof(va)) == 0);
        CHECK(a.seq == id && a.importance == b.importance && a.agent_id == 100 + id);
        CHECK(a.scope == SCOPE_AGENT && a.type == MEM_FACT && a.expires_ms == INT64_MAX);
        CHECK_MSG(a.ntags == id - 1, "memory %llu: %u tags", (unsigned long long)id, a.ntags);
        /* fresh copies in this process, not the saved pointers */
        CHECK(a.ntags == 0 ? a.tags == NULL : a.tags != NULL && a.tags != b.tags);
        for (uint32_t k = 0; a.tags && k < a.ntags; k++)
            CHECK(a.tags[k] == tags[k]);
    }
    index_free(vi);

    /* the identity ends the file: another engine's load knows without reading it */
    snap_id want_faiss = {.engine = VINDEX_ENGINE_FAISS, .factory = 1}, got;
    snap_id want_native = {.engine = VINDEX_ENGINE_NATIVE};
    CHECK(tn_snap_file_other(path, &want_faiss, &got) && got.engine == VINDEX_ENGINE_NATIVE);
    CHECK(!tn_snap_file_other(path, &want_native, &got));
    CHECK(strcmp(tn_snap_id_name(&got), "the native engine") == 0);

    /* tag records that do not describe the snapshot: refused, every pointer reset */
    vindex_opts vo;
    tn_index_opts(t, &vo);
    void *x = NULL;
    size_t xlen = 0, rec_len = 0;
    CHECK(vindex_load_extra(path, &vo, &vi, &upto, &x, &xlen) == 0);
    CHECK(tn_snap_extra_split(x, xlen, &rec_len, &got));
    unsigned char *bad = malloc(rec_len);
    memcpy(bad, x, rec_len);
    uint64_t count;
    memcpy(&count, bad + 16, 8);
    CHECK(count == 5);
    count = 4; /* one record fewer than it holds: the lengths do not add up */
    memcpy(bad + 16, &count, 8);
    CHECK(tn_tags_restore(vi, bad, rec_len, upto) == -EBADMSG);
    index_free(vi); /* the tags restored before the refusal are freed, the rest NULL */
    /* a record's change number that differs from its memory's */
    CHECK(vindex_load_extra(path, &vo, &vi, &upto, NULL, NULL) == 0);
    memcpy(bad, x, rec_len);
    uint64_t seq = 77;
    memcpy(bad + TAGS_HEADER + 8, &seq, 8);
    CHECK(tn_tags_restore(vi, bad, rec_len, upto) == -EBADMSG);
    index_free(vi);
    /* no records at all (extra bytes of no known format) */
    CHECK(vindex_load_extra(path, &vo, &vi, &upto, NULL, NULL) == 0);
    CHECK(tn_tags_restore(vi, NULL, 0, upto) == -EBADMSG);
    index_free(vi);
    /* the first format had no identity: all its snapshots were native */
    memcpy(bad, x, rec_len);
    memcpy(bad, TAGS_MAGIC_V1, 8);
    size_t v1len = 0;
    got.engine = 99;
    CHECK(tn_snap_extra_split(bad, rec_len, &v1len, &got) && v1len == rec_len &&
          got.engine == VINDEX_ENGINE_NATIVE);
    memcpy(bad, "ENGTAGS9", 8);
    CHECK(!tn_snap_extra_split(bad, rec_len, &v1len, &got));
    CHECK(!tn_snap_extra_split(x, 10, &v1len, &got));
    free(bad);
    free(x);

    /* a deleted tenant writes no snapshot (and removes the one being written) */
    upsert(t, 5, 5, 5, 0.5f);
    pthread_mutex_lock(&t->mu);
    t->dead = true;
    pthread_mutex_unlock(&t->mu);
    unlink(path);
    CHECK(tn_save_snapshot(t) == 0 && access(path, F_OK) != 0);
    pthread_mutex_lock(&t->mu);
    t->dead = false;
    pthread_mutex_unlock(&t->mu);
    /* a directory that cannot be written: -EIO, and the index stays dirty for the retry */
    pthread_mutex_lock(&ts->dir_mu);
    free(ts->dir);
    ts->dir = strdup("/nonexistent/engram-test");
    pthread_mutex_unlock(&ts->dir_mu);
    CHECK(tn_save_snapshot(t) == -EIO);
    pthread_mutex_lock(&t->mu);
    CHECK(t->dirty);
    pthread_mutex_unlock(&t->mu);
    tenants_put(t);
    rmdir(snapdir);
}

int main(void)
{
    if (fr_env_init(&env, NULL, true) < 0) {
        fprintf(stderr, "cannot set up the test server\n");
        return 1;
    }
    test_order();
    test_deletes();
    test_metadata();
    test_loading();
    test_snapshot();
    fr_env_fini(&env);
    CHECK_RETURN();
}
