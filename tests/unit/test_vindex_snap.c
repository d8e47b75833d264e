/* tests/unit/test_vindex_snap.c: vindex snapshots: round trips at every kind (identical
 * searches, state, seq), atomic replacement, and refusal of every damaged file: each byte
 * flipped, every truncation, a trailing byte, wrong magic, another dim or meta_size, a
 * missing file.
 */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <dirent.h>

#include "check.h"
#include "vindex.h"

typedef struct meta {
    uint32_t tag;
    uint32_t level;
} meta;

static uint64_t rs = 0x9e3779b97f4a7c15ULL;

static double rnd(void)
{
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return (double)(rs >> 11) / 9007199254740992.0 - 0.5;
}

static char dir[256];

/* path_in returns dir/name in one of four rotating buffers (callers hold at most three). */
static char *path_in(const char *name)
{
    static char buf[4][512];
    static int next;
    char *b = buf[next++ % 4];
    snprintf(b, 512, "%s/%s", dir, name);
    return b;
}

static bool keep_even(const void *m, void *ctx)
{
    return ((const meta *)m)->tag % 2 == 0;
}

static double by_level(float sim, const void *m, void *ctx)
{
    return 0.5 * sim + 0.1 * ((const meta *)m)->level;
}

/* same_results compares searches on a and b: identical ids, similarities and scores. */
static int same_results(vindex *a, vindex *b, size_t dim)
{
    int bad = 0;
    float *q = malloc(dim * sizeof(float));
    vindex_hit ha[20], hb[20];
    for (int t = 0; t < 30; t++) {
        for (size_t j = 0; j < dim; j++)
            q[j] = (float)rnd();
        vindex_query qq = {.vec = q, .k = 1 + (size_t)t % 20};
        if (t % 3 == 1)
            qq.keep = keep_even;
        if (t % 3 == 2) {
            qq.score = by_level;
            qq.score_slope = 0.5;
            qq.score_bound = 0.4;
        }
        size_t na = 0, nb = 1;
        if (vindex_search(a, &qq, ha, &na) || vindex_search(b, &qq, hb, &nb) || na != nb) {
            bad++;
            continue;
        }
        for (size_t i = 0; i < na; i++) {
            if (ha[i].id != hb[i].id || ha[i].similarity != hb[i].similarity ||
                ha[i].score != hb[i].score)
                bad++;
        }
    }
    free(q);
    return bad;
}

typedef struct cmpctx {
    vindex *other;
    size_t dim;
    int bad;
} cmpctx;

static int cmp_one(uint64_t id, const float *vec, const void *m, void *arg)
{
    cmpctx *c = arg;
    float v[256];
    meta mm;
    if (vindex_get_vector(c->other, id, v) || vindex_get_meta(c->other, id, &mm) ||
        memcmp(v, vec, c->dim * sizeof(float)) || memcmp(&mm, m, sizeof(mm)))
        c->bad++;
    return 0;
}

static vindex *make(size_t dim, size_t n, const vindex_opts *base, size_t removals)
{
    vindex_opts o = *base;
    o.dim = dim;
    o.meta_size = sizeof(meta);
    vindex *vi = vindex_create(&o);
    float v[256];
    for (size_t i = 0; i < n; i++) {
        for (size_t j = 0; j < dim; j++)
            v[j] = (float)rnd();
        meta m = {(uint32_t)i, (uint32_t)(i % 5)};
        CHECK(vindex_add(vi, 1000 + i * 7, v, &m) == 0);
    }
    for (size_t i = 0; i < removals; i++)
        vindex_remove(vi, 1000 + (i * 13 % n) * 7);
    return vi;
}

static void round_trip(size_t dim, size_t n, const vindex_opts *base, const char *label)
{
    vindex *vi = make(dim, n, base, n / 5);
    const char *p = path_in("rt.snap");
    CHECK(vindex_save(vi, p, 1234) == 0);
    vindex_opts o = *base;
    o.dim = dim;
    o.meta_size = sizeof(meta);
    vindex *lv = NULL;
    uint64_t seq = 0;
    CHECK(vindex_load(p, &o, &lv, &seq) == 0);
    CHECK(seq == 1234);
    if (!lv) {
        vindex_destroy(vi);
        return;
    }
    vindex_stats a, b;
    vindex_get_stats(vi, &a);
    vindex_get_stats(lv, &b);
    CHECK(a.count == b.count && b.tombstones == 0 && a.kind == b.kind);
    fprintf(stderr, "%s: %zu vectors, kind %d, bytes %zu / %zu\n", label, b.count, (int)b.kind,
            a.bytes, b.bytes);
    cmpctx c = {lv, dim, 0};
    CHECK(vindex_foreach(vi, cmp_one, &c) == 0 && c.bad == 0);
    CHECK_MSG(same_results(vi, lv, dim) == 0, "%s: searches differ after load", label);
    /* stale seq: the snapshot does not follow later changes */
    float v[256];
    for (size_t j = 0; j < dim; j++)
        v[j] = (float)rnd();
    meta m = {1, 1};
    CHECK(vindex_add(vi, 5, v, &m) == 0);
    vindex *lv2 = NULL;
    CHECK(vindex_load(p, &o, &lv2, &seq) == 0 && seq == 1234);
    CHECK(lv2 && !vindex_contains(lv2, 5) && vindex_contains(vi, 5));
    /* the loaded index keeps working: adds, removes, a save of its own */
    CHECK(vindex_add(lv, 5, v, &m) == 0 && vindex_remove(lv, 5) == 0);
    CHECK(vindex_save(lv, p, 1235) == 0);
    vindex_destroy(lv2);
    lv2 = NULL;
    CHECK(vindex_load(p, &o, &lv2, &seq) == 0 && seq == 1235);
    CHECK(lv2 && same_results(lv, lv2, dim) == 0);
    vindex_destroy(lv2);
    vindex_destroy(lv);
    vindex_destroy(vi);
    unlink(p);
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

static void damage(const vindex_opts *base, size_t dim, size_t n)
{
    vindex *vi = make(dim, n, base, n / 3);
    const char *good = path_in("good.snap");
    CHECK(vindex_save(vi, good, 77) == 0);
    size_t len = 0;
    unsigned char *b = slurp(good, &len);
    CHECK(b != NULL && len > 80);
    if (!b) {
        vindex_destroy(vi);
        return;
    }
    vindex_opts o = *base;
    o.dim = dim;
    o.meta_size = sizeof(meta);
    const char *bad = path_in("bad.snap");
    vindex *lv = NULL;
    uint64_t seq = 99;
    int flips_ok = 0, cuts_ok = 0;
    for (size_t i = 0; i < len; i++) {
        unsigned char save = b[i];
        b[i] ^= (unsigned char)(1u << (i % 8));
        spit(bad, b, len);
        b[i] = save;
        int rc = vindex_load(bad, &o, &lv, &seq);
        /* a flipped dim/meta_size field could in principle read as a mismatch; any
         * refusal is right, a success is not */
        if ((rc == VINDEX_E_CORRUPT || rc == VINDEX_E_MISMATCH) && lv == NULL && seq == 99)
            flips_ok++;
        vindex_destroy(lv);
        lv = NULL;
    }
    CHECK_MSG(flips_ok == (int)len, "%d of %zu flipped bytes detected", flips_ok, len);
    for (size_t cut = 0; cut < len; cut++) {
        spit(bad, b, cut);
        int rc = vindex_load(bad, &o, &lv, &seq);
        if (rc == VINDEX_E_CORRUPT && lv == NULL)
            cuts_ok++;
    }
    CHECK_MSG(cuts_ok == (int)len, "%d of %zu truncations detected", cuts_ok, len);
    /* a trailing byte */
    unsigned char *b2 = malloc(len + 1);
    memcpy(b2, b, len);
    b2[len] = 0;
    spit(bad, b2, len + 1);
    CHECK(vindex_load(bad, &o, &lv, &seq) == VINDEX_E_CORRUPT && !lv);
    free(b2);
    /* wrong magic with a recomputed-looking rest */
    b[0] = 'X';
    spit(bad, b, len);
    CHECK(vindex_load(bad, &o, &lv, &seq) == VINDEX_E_CORRUPT);
    b[0] = 'E';
    /* an intact file read with other options */
    vindex_opts od = o;
    od.dim = dim + 1;
    CHECK(vindex_load(good, &od, &lv, &seq) == VINDEX_E_MISMATCH && !lv);
    od = o;
    od.meta_size = sizeof(meta) + 1;
    CHECK(vindex_load(good, &od, &lv, &seq) == VINDEX_E_MISMATCH && !lv);
    od.dim = 0;
    CHECK(vindex_load(good, &od, &lv, &seq) == -EINVAL);
    /* missing file; a directory; the good file still loads */
    CHECK(vindex_load(path_in("none.snap"), &o, &lv, &seq) == VINDEX_E_NOT_FOUND && !lv);
    CHECK(vindex_load(dir, &o, &lv, &seq) != 0 && !lv);
    CHECK(vindex_load(good, &o, &lv, &seq) == 0 && seq == 77 && lv);
    vindex_destroy(lv);
    /* saving into a missing directory fails and leaves nothing */
    CHECK(vindex_save(vi, path_in("no/such/dir.snap"), 1) == -ENOENT);
    free(b);
    vindex_destroy(vi);
    unlink(bad);
    unlink(good);
}

/* no temporary files are left behind */
static void check_clean(void)
{
    DIR *d = opendir(dir);
    int left = 0;
    struct dirent *e;
    while (d && (e = readdir(d))) {
        if (e->d_name[0] != '.')
            left++, fprintf(stderr, "left behind: %s\n", e->d_name);
    }
    if (d)
        closedir(d);
    CHECK(left == 0);
}

int main(void)
{
    snprintf(dir, sizeof(dir), "/tmp/test_vindex_snap.XXXXXX");
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    vindex_opts flat = {.quant_min = SIZE_MAX, .ann_min = SIZE_MAX};
    vindex_opts sq8 = {.quant_min = 1, .ann_min = SIZE_MAX};
    vindex_opts ann = {.quant_min = 1, .ann_min = 1, .ann_max_candidates = 32};
    round_trip(48, 700, &flat, "flat");
    round_trip(48, 700, &sq8, "sq8");
    round_trip(48, 700, &ann, "ann");
    round_trip(200, 1500, &ann, "ann 200");
    round_trip(48, 0, &flat, "empty");
    /* a file of one kind loaded with options calling for another */
    {
        vindex *vi = make(40, 300, &flat, 10);
        const char *p = path_in("kinds.snap");
        CHECK(vindex_save(vi, p, 5) == 0);
        vindex *lv = NULL;
        uint64_t seq;
        vindex_opts o = ann;
        o.dim = 40;
        o.meta_size = sizeof(meta);
        CHECK(vindex_load(p, &o, &lv, &seq) == 0);
        vindex_stats st;
        vindex_get_stats(lv, &st);
        CHECK(st.kind == VINDEX_KIND_ANN && st.count == 290);
        CHECK(same_results(vi, lv, 40) == 0);
        vindex_destroy(lv);
        vindex_destroy(vi);
        vi = make(40, 300, &ann, 0);
        CHECK(vindex_save(vi, p, 7) == 0);
        o = flat;
        o.dim = 40;
        o.meta_size = sizeof(meta);
        CHECK(vindex_load(p, &o, &lv, &seq) == 0 && seq == 7);
        vindex_get_stats(lv, &st);
        CHECK(st.kind == VINDEX_KIND_FLAT && same_results(vi, lv, 40) == 0);
        vindex_destroy(lv);
        vindex_destroy(vi);
        unlink(p);
    }
    /* the caller's extra bytes: returned intact, covered by the checksum */
    {
        vindex *vi = make(24, 50, &flat, 0);
        const char *p = path_in("extra.snap");
        const char xs[] = "tags of fifty memories";
        CHECK(vindex_save_extra(vi, p, 9, xs, sizeof(xs)) == 0);
        vindex_opts o = flat;
        o.dim = 24;
        o.meta_size = sizeof(meta);
        vindex *lv = NULL;
        uint64_t seq = 0;
        void *x = NULL;
        size_t xlen = 0;
        CHECK(vindex_load_extra(p, &o, &lv, &seq, &x, &xlen) == 0 && seq == 9);
        CHECK(xlen == sizeof(xs) && x && memcmp(x, xs, xlen) == 0);
        CHECK(lv && same_results(vi, lv, 24) == 0);
        free(x);
        vindex_destroy(lv);
        lv = NULL;
        size_t len = 0;
        unsigned char *b = slurp(p, &len);
        CHECK(b && len > sizeof(xs));
        if (b) {
            b[len - 3] ^= 0x20; /* inside the extra bytes */
            spit(p, b, len);
            x = NULL;
            CHECK(vindex_load_extra(p, &o, &lv, &seq, &x, &xlen) == VINDEX_E_CORRUPT && !lv && !x);
            free(b);
        }
        vindex_destroy(vi);
        unlink(p);
    }
    damage(&flat, 8, 6);
    damage(&ann, 8, 6);
    damage(&sq8, 40, 3);
    check_clean();
    rmdir(dir);
    CHECK_RETURN();
}
