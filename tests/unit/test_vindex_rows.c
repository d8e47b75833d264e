/* tests/unit/test_vindex_rows.c: float rows read from the snapshot, mapped (issue 34).
 *
 * - Round trip: a save moves the rows of an SQ8/ANN index off the heap into the new file,
 *   mapped; searches answer exactly as before; a load maps them too and answers the same.
 *   A FLAT index and one created with heap_rows keep them on the heap.
 * - Checksum and torn tail: any byte flipped in the rows or their padding, and any
 *   truncation, is refused (nothing of such a file is served).
 * - Growth while mapped: adds (into the mapping's copy-on-write last chunk, then new heap
 *   chunks), upserts and removes on a mapped index answer as the same changes on an index
 *   whose rows are all on the heap; a save while searches run maps the grown index again,
 *   and a load of that file answers the same. A file replaced (renamed over) while mapped
 *   does not change the index that maps it.
 * - Resident bytes: vindex_bytes counts the heap and the mapped pages in RAM, not the file:
 *   after vindex_trim the mapped pages are gone from the count, searches read them back
 *   (page-ins, counted) and answer the same.
 * - Rows kept to a cap: vindex_rows_keep drops the pages no search read since its last call
 *   first (those the last searches read stay: reading them again is no page-in), all of them
 *   when the pages in use are more than the cap, nothing under the cap; answers unchanged.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "vindex.h"

#define DIM 256 /* 1,024 slots a chunk: 1 MiB of rows */
#define N 3000
#define PAGE_BYTES 4096

static uint64_t rs = 0x853c49e6748fea9bULL;

static double rnd(void)
{
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return (double)(rs >> 11) / 9007199254740992.0 - 0.5;
}

/* vectors around a few directions, so that the ANN kind finds neighbours */
static float BASE[8][DIM];

static void vec(float *v)
{
    const float *b = BASE[(rs >> 7) % 8];
    for (size_t j = 0; j < DIM; j++)
        v[j] = b[j] + 0.6f * (float)rnd();
}

static char dir[256];

static char *path_in(const char *name)
{
    static char buf[4][512];
    static int next;
    char *b = buf[next++ % 4];
    snprintf(b, 512, "%s/%s", dir, name);
    return b;
}

static const vindex_opts base_opts = {
    .dim = DIM, .meta_size = sizeof(uint64_t), .quant_min = 100, .ann_min = 1000};

/* same_results compares 40 searches (plain, filtered by id parity, k up to 30) on a and b:
 * identical ids and similarities. */
static bool odd(uint64_t id, const void *m, void *ctx)
{
    return *(const uint64_t *)m % 2 == 1;
}

static int same_results(vindex *a, vindex *b)
{
    int bad = 0;
    float q[DIM];
    vindex_hit ha[30], hb[30];
    uint64_t keep = rs;
    rs = 4242; /* the same queries every call */
    for (int t = 0; t < 40; t++) {
        vec(q);
        vindex_query qq = {.vec = q, .k = 1 + (size_t)t % 30};
        if (t % 4 == 3)
            qq.keep = odd;
        size_t na = 0, nb = 1;
        if (vindex_search(a, &qq, ha, &na) || vindex_search(b, &qq, hb, &nb) || na != nb) {
            bad++;
            continue;
        }
        for (size_t i = 0; i < na; i++)
            bad += ha[i].id != hb[i].id || ha[i].similarity != hb[i].similarity;
    }
    rs = keep;
    return bad;
}

static vindex *make(const vindex_opts *o, size_t n)
{
    vindex *vi = vindex_create(o);
    float v[DIM];
    for (size_t i = 0; i < n; i++) {
        vec(v);
        uint64_t m = i;
        CHECK(vindex_add(vi, i, v, o->meta_size ? &m : NULL) == 0);
    }
    CHECK(vindex_settle(vi, 0.99, NULL) >= 0);
    return vi;
}

static vindex_stats stats(vindex *vi)
{
    vindex_stats st;
    vindex_get_stats(vi, &st);
    return st;
}

static unsigned char *slurp(const char *p, size_t *len)
{
    FILE *f = fopen(p, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    *len = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc(*len + 1);
    if (fread(b, 1, *len, f) != *len) {
        free(b);
        b = NULL;
    }
    fclose(f);
    return b;
}

static void spit(const char *p, const unsigned char *b, size_t len)
{
    FILE *f = fopen(p, "wb");
    if (len)
        fwrite(b, 1, len, f);
    fclose(f);
}

static void round_trip(void)
{
    vindex_opts o = base_opts;
    o.meta_size = sizeof(uint64_t);
    vindex *vi = make(&o, N);
    vindex_opts ho = o;
    ho.heap_rows = true;
    vindex_stats a = stats(vi);
    CHECK(a.kind == VINDEX_KIND_ANN && a.rows_mapped == 0);
    CHECK(a.rows_heap == 3 * 1024 * DIM * sizeof(float)); /* three chunks' rows */
    const char *p = path_in("rt.snap");
    CHECK(vindex_save(vi, p, 11) == 0);
    vindex_stats b = stats(vi);
    fprintf(stderr, "save: heap %zu -> %zu bytes, rows mapped %zu, resident %zu\n", a.heap_bytes,
            b.heap_bytes, b.rows_mapped, b.rows_resident);
    CHECK(b.rows_heap == 0 && b.rows_mapped == a.rows_heap);
    CHECK(b.heap_bytes + a.rows_heap <= a.heap_bytes + 256); /* the mapping's handle */
    CHECK(b.bytes <= b.heap_bytes + b.rows_mapped);          /* resident, never the file's length */
    /* load it twice: rows mapped, and rows on the heap */
    vindex *lv = NULL, *hv = NULL;
    uint64_t seq = 0;
    CHECK(vindex_load(p, &o, &lv, &seq) == 0 && seq == 11);
    CHECK(vindex_load(p, &ho, &hv, &seq) == 0);
    if (lv && hv) {
        vindex_stats l = stats(lv), h = stats(hv);
        CHECK(l.rows_mapped == b.rows_mapped && l.rows_heap == 0 && l.count == N);
        CHECK(h.rows_mapped == 0 && h.heap_bytes >= l.heap_bytes + b.rows_mapped - 4096);
        CHECK(same_results(vi, lv) == 0 && same_results(lv, hv) == 0);
    }
    vindex_destroy(lv);
    vindex_destroy(hv);
    /* a FLAT index keeps its rows on the heap: its search reads every one */
    vindex_opts fo = {.dim = DIM};
    vindex *fv = make(&fo, 300);
    CHECK(vindex_save(fv, path_in("flat.snap"), 1) == 0);
    CHECK(stats(fv).rows_mapped == 0);
    CHECK(vindex_load(path_in("flat.snap"), &fo, &lv, &seq) == 0 && stats(lv).rows_mapped == 0);
    vindex_destroy(lv);
    vindex_destroy(fv);
    unlink(path_in("flat.snap"));
    unlink(path_in("rt.snap"));
    vindex_destroy(vi);
}

/* damaged files: a flipped byte in the rows or their padding, any truncation */
static void checksum_and_tail(void)
{
    vindex *vi = make(&base_opts, 2100); /* three chunks, the last mostly padding */
    const char *p = path_in("dmg.snap");
    CHECK(vindex_save(vi, p, 5) == 0);
    size_t len = 0;
    unsigned char *b = slurp(p, &len);
    CHECK(b != NULL);
    if (!b) {
        vindex_destroy(vi);
        return;
    }
    uint64_t rows_off, rows_len;
    memcpy(&rows_off, b + 96, 8);
    memcpy(&rows_len, b + 104, 8);
    CHECK(rows_off % 4096 == 0 && rows_off + rows_len <= len);
    CHECK(rows_len == 3 * 1024 * DIM * sizeof(float));
    const char *bad = path_in("bad.snap");
    vindex *lv = NULL;
    uint64_t seq = 77;
    int tried = 0, refused = 0;
    size_t at[] = {rows_off,
                   rows_off + 1,
                   rows_off + 1000 * DIM * 4 + 3,
                   rows_off + 2099 * DIM * 4 + 4 * DIM - 1, /* the last row's last byte */
                   rows_off + 2100 * DIM * 4,               /* the padding */
                   rows_off + rows_len - 1,
                   rows_off - 1}; /* the zeros before the rows */
    for (size_t i = 0; i < sizeof(at) / sizeof(at[0]); i++) {
        b[at[i]] ^= 0x40;
        spit(bad, b, len);
        b[at[i]] ^= 0x40;
        int rc = vindex_load(bad, &base_opts, &lv, &seq);
        tried++;
        refused += rc == VINDEX_E_CORRUPT && !lv && seq == 77;
        vindex_destroy(lv);
        lv = NULL;
    }
    CHECK_MSG(refused == tried, "%d of %d flipped bytes refused", refused, tried);
    /* torn: cut anywhere in the rows, or the extra bytes' place */
    tried = refused = 0;
    for (size_t cut = rows_off - 8; cut < len; cut += 4093 * 7) {
        spit(bad, b, cut);
        int rc = vindex_load(bad, &base_opts, &lv, &seq);
        tried++;
        refused += rc == VINDEX_E_CORRUPT && !lv;
        vindex_destroy(lv);
        lv = NULL;
    }
    spit(bad, b, len - 1);
    tried++;
    refused += vindex_load(bad, &base_opts, &lv, &seq) == VINDEX_E_CORRUPT && !lv;
    CHECK_MSG(refused == tried, "%d of %d truncations refused", refused, tried);
    /* the intact file still loads */
    CHECK(vindex_load(p, &base_opts, &lv, &seq) == 0 && seq == 5);
    vindex_destroy(lv);
    unlink(bad);
    unlink(p);
    free(b);
    vindex_destroy(vi);
}

/* the same changes on two indexes */
static void change(vindex *a, vindex *b, size_t adds, size_t upserts, size_t removes,
                   uint64_t *next_id)
{
    float v[DIM];
    for (size_t i = 0; i < adds; i++) {
        vec(v);
        uint64_t id = (*next_id)++;
        CHECK(vindex_add(a, id, v, &id) == 0 && vindex_add(b, id, v, &id) == 0);
    }
    for (size_t i = 0; i < upserts; i++) {
        vec(v);
        uint64_t id = (uint64_t)(i * 7 + 3) % *next_id;
        CHECK(vindex_upsert(a, id, v, &id) == vindex_upsert(b, id, v, &id));
    }
    for (size_t i = 0; i < removes; i++) {
        uint64_t id = (uint64_t)(i * 13 + 5) % *next_id;
        CHECK(vindex_remove(a, id) == vindex_remove(b, id));
    }
}

typedef struct searcher {
    vindex *vi;
    atomic_bool stop;
    int runs, bad;
} searcher;

static void *search_loop(void *arg)
{
    searcher *s = arg;
    float q[DIM];
    uint64_t r = 99;
    while (!atomic_load(&s->stop)) {
        for (size_t j = 0; j < DIM; j++) {
            r = r * 6364136223846793005ULL + 1442695040888963407ULL;
            q[j] = (float)((double)(r >> 11) / 9007199254740992.0 - 0.5);
        }
        vindex_hit h[10];
        size_t n = 0;
        vindex_query qq = {.vec = q, .k = 10};
        if (vindex_search(s->vi, &qq, h, &n) || n != 10)
            s->bad++;
        for (size_t i = 0; i < n; i++)
            s->bad += !(fabsf(h[i].similarity) <= 1.0f);
        s->runs++;
    }
    return NULL;
}

static void growth_while_mapped(void)
{
    vindex_opts o = base_opts;
    o.meta_size = sizeof(uint64_t);
    vindex_opts ho = o;
    ho.heap_rows = true;
    vindex *vi = make(&o, 2100);
    const char *p = path_in("grow.snap");
    CHECK(vindex_save(vi, p, 1) == 0);
    vindex_destroy(vi);
    vindex *lv = NULL, *ref = NULL;
    uint64_t seq;
    CHECK(vindex_load(p, &o, &lv, &seq) == 0 && vindex_load(p, &ho, &ref, &seq) == 0);
    if (!lv || !ref)
        return;
    uint64_t next_id = 2100;
    /* 900 adds fill the mapping's last chunk (copy-on-write), 600 more take new heap chunks */
    change(lv, ref, 1500, 300, 200, &next_id);
    vindex_stats st = stats(lv);
    CHECK(st.rows_mapped == 3 * 1024 * DIM * sizeof(float) && st.rows_heap > 0);
    CHECK_MSG(same_results(lv, ref) == 0, "mapped and heap rows answer differently");
    /* a save while searches run maps the grown index */
    searcher s = {.vi = lv};
    pthread_t th;
    pthread_create(&th, NULL, search_loop, &s);
    CHECK(vindex_save(lv, p, 2) == 0);
    change(lv, ref, 700, 100, 100, &next_id);
    CHECK(vindex_save(lv, p, 3) == 0);
    atomic_store(&s.stop, true);
    pthread_join(th, NULL);
    CHECK_MSG(s.bad == 0 && s.runs > 0, "%d of %d concurrent searches went wrong", s.bad, s.runs);
    st = stats(lv);
    CHECK(st.rows_heap == 0 && st.rows_mapped == 5 * 1024 * DIM * sizeof(float));
    CHECK(same_results(lv, ref) == 0);
    /* loaded again */
    vindex *lv2 = NULL;
    CHECK(vindex_load(p, &o, &lv2, &seq) == 0 && seq == 3);
    if (lv2) {
        CHECK(same_results(lv2, ref) == 0);
        CHECK(stats(lv2).count == stats(ref).count);
    }
    /* the file replaced under lv2 (another index saved over its path): lv2 keeps its data */
    vindex *other = make(&o, 1500);
    CHECK(vindex_save(other, p, 9) == 0);
    if (lv2)
        CHECK(same_results(lv2, ref) == 0);
    /* a rebuild (compaction) puts the rows back on the heap until the next save */
    for (uint64_t id = 0; id < 1500; id++)
        vindex_remove(ref, id), vindex_remove(lv, id);
    CHECK(vindex_maintenance(lv) == 1 && vindex_maintenance(ref) == 1);
    st = stats(lv);
    CHECK(st.rows_mapped == 0 && st.rows_heap > 0);
    CHECK(same_results(lv, ref) == 0);
    CHECK(vindex_save(lv, path_in("grow2.snap"), 4) == 0);
    CHECK(stats(lv).rows_heap == 0 && same_results(lv, ref) == 0);
    unlink(path_in("grow2.snap"));
    vindex_destroy(other);
    vindex_destroy(lv2);
    vindex_destroy(lv);
    vindex_destroy(ref);
    unlink(p);
}

static void resident_and_trim(void)
{
    /* the pages must be mapped by the trimmed index alone (the kernel keeps pages others map):
     * the saved index goes, a load with heap rows answers for it */
    vindex *vi = make(&base_opts, N);
    const char *p = path_in("res.snap");
    CHECK(vindex_save(vi, p, 1) == 0);
    vindex_destroy(vi);
    vindex_opts ho = base_opts;
    ho.heap_rows = true;
    vindex *lv = NULL;
    uint64_t seq;
    vi = NULL;
    CHECK(vindex_load(p, &ho, &vi, &seq) == 0);
    CHECK(vindex_load(p, &base_opts, &lv, &seq) == 0);
    if (!lv || !vi) {
        vindex_destroy(vi);
        vindex_destroy(lv);
        return;
    }
    vindex_stats st = stats(lv);
    size_t loaded = vindex_resident(lv); /* the load read every row through the mapping */
    st = stats(lv);
    fprintf(stderr, "loaded: heap %zu, mapped %zu, resident %zu\n", st.heap_bytes, st.rows_mapped,
            st.rows_resident);
    CHECK(loaded == st.bytes && st.bytes == st.heap_bytes + st.rows_resident);
    CHECK(st.rows_resident > 0 && st.rows_resident <= st.rows_mapped);
    size_t after = vindex_trim(lv);
    st = stats(lv);
    fprintf(stderr, "trimmed: resident %zu (bytes %zu -> %zu), page-ins %llu\n", st.rows_resident,
            loaded, after, (unsigned long long)st.page_ins);
    CHECK(after == st.bytes && after < loaded);
    CHECK_MSG(st.rows_resident < st.rows_mapped / 2, "trim left %zu of %zu resident",
              st.rows_resident, st.rows_mapped);
    /* searches read the rows back from the file, and answer as before */
    CHECK(same_results(lv, vi) == 0);
    vindex_stats st2 = stats(lv);
    CHECK_MSG(st2.page_ins > st.page_ins, "page-ins %llu -> %llu", (unsigned long long)st.page_ins,
              (unsigned long long)st2.page_ins);
    size_t again = vindex_resident(lv);
    CHECK(again > after && again < loaded);
    vindex_destroy(lv);
    vindex_destroy(vi);
    unlink(p);
}

/* search_set runs 6 searches of seed's queries (top k) and returns the sum of their first
 * hits' ids, to compare answers. */
static uint64_t search_set(vindex *vi, uint64_t seed, size_t k)
{
    uint64_t keep = rs, sum = 0;
    rs = seed;
    float q[DIM];
    for (int t = 0; t < 6; t++) {
        vindex_hit h[30];
        size_t n = 0;
        vec(q);
        vindex_query qq = {.vec = q, .k = k};
        CHECK(vindex_search(vi, &qq, h, &n) == 0 && n == k);
        sum += n ? h[0].id + 1 : 0;
    }
    rs = keep;
    return sum;
}

static void rows_kept_to_cap(void)
{
    vindex_opts o = base_opts;
    vindex *vi = make(&o, N);
    const char *p = path_in("keep.snap");
    CHECK(vindex_save(vi, p, 1) == 0);
    vindex_destroy(vi);
    vi = NULL;
    uint64_t seq;
    CHECK(vindex_load(p, &o, &vi, &seq) == 0);
    if (!vi)
        return;
    vindex_stats st = stats(vi);
    CHECK(st.kind == VINDEX_KIND_ANN && st.rows_mapped > 0);
    uint64_t a_ref = search_set(vi, 11, 30), b_ref = search_set(vi, 11, 1);
    size_t dropped = 0;
    /* under the cap: nothing goes, however cold; 100: the kernel keeps what it will */
    vindex_rows_keep(vi, 99, &dropped);
    CHECK(dropped == 0);
    vindex_rows_keep(vi, 100, &dropped);
    CHECK(dropped == 0 && stats(vi).rows_resident > st.rows_mapped / 2);
    /* no search since the last call: every page goes */
    vindex_rows_keep(vi, 1, &dropped);
    st = stats(vi);
    fprintf(stderr, "kept: cold pages dropped %zu, resident %zu of %zu\n", dropped,
            st.rows_resident, st.rows_mapped);
    CHECK(dropped > 0 && st.rows_resident < st.rows_mapped / 2);
    /* set B (top 1: few near-ties) alone in RAM; then set A (the same queries, top 30),
     * each after a call under the cap (which clears the marks), and B again: at a cap
     * between B's pages and A's and B's, A's alone go */
    vindex_trim(vi);
    CHECK(search_set(vi, 11, 1) == b_ref);
    size_t b_alone = vindex_resident(vi) - st.heap_bytes;
    vindex_rows_keep(vi, 99, &dropped);
    CHECK(search_set(vi, 11, 30) == a_ref);
    vindex_rows_keep(vi, 99, &dropped);
    CHECK(search_set(vi, 11, 1) == b_ref);
    size_t both = vindex_resident(vi) - st.heap_bytes;
    fprintf(stderr, "kept: A and B %zu bytes in RAM, B alone %zu\n", both, b_alone);
    CHECK(b_alone > 0 && b_alone + 8 * PAGE_BYTES < both);
    size_t before = dropped;
    size_t cap = (b_alone + both) / 2;
    vindex_rows_keep(vi, 100.0 * (double)cap / (double)st.rows_mapped, &dropped);
    st = stats(vi);
    fprintf(stderr, "kept to %zu: dropped %zu, resident %zu\n", cap, dropped - before,
            st.rows_resident);
    CHECK(dropped > before && st.rows_resident <= cap);
    uint64_t pi = st.page_ins;
    CHECK(search_set(vi, 11, 1) == b_ref);
    st = stats(vi);
    CHECK_MSG(st.page_ins == pi, "B's pages were dropped: %llu page-ins",
              (unsigned long long)(st.page_ins - pi));
    /* the pages in use (B's, just read again) are more than the cap: the cap's worth of them
     * stays, the rest goes, the answers stay */
    before = dropped;
    size_t half = b_alone / 2 > PAGE_BYTES ? b_alone / 2 : PAGE_BYTES;
    vindex_rows_keep(vi, 100.0 * (double)half / (double)st.rows_mapped, &dropped);
    st = stats(vi);
    fprintf(stderr, "kept to %zu of B's %zu: dropped %zu, resident %zu\n", half, b_alone,
            dropped - before, st.rows_resident);
    CHECK(dropped > before && st.rows_resident <= half && st.rows_resident > 0);
    CHECK(search_set(vi, 11, 1) == b_ref && search_set(vi, 11, 30) == a_ref);
    CHECK(stats(vi).page_ins > st.page_ins);
    vindex_destroy(vi);
    unlink(p);
}

int main(void)
{
    snprintf(dir, sizeof(dir), "/tmp/test_vindex_rows.XXXXXX");
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    for (size_t b = 0; b < 8; b++)
        for (size_t j = 0; j < DIM; j++)
            BASE[b][j] = (float)rnd() * 4;
    round_trip();
    checksum_and_tail();
    growth_while_mapped();
    resident_and_trim();
    rows_kept_to_cap();
    CHECK_MSG(rmdir(dir) == 0, "%s left behind: %s", dir, strerror(errno));
    CHECK_RETURN();
}
