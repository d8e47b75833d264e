/* bench/dataset.c: benchmark vectors of several distributions (synthetic, generated row by
 * row, or real text read from files), content and exact ground truth (see dataset.h). */
#include "dataset.h"

#include <cblas.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define VOCAB 1024
#define WORD_MAX 16
#define CONTENT_WORDS 10
#define TRUTH_BASE_BLOCK 4096
#define TRUTH_QUERY_BLOCK 1024

/* anisotropic: the shared direction's length relative to the rest of a row (whose squared
 * length is about dim (1 + 0.3^2)): mean pairwise cosine A^2 / (A^2 + 1.09), about 0.7 */
#define ANISO_SHARED 1.6
/* spectral: coordinate j is scaled by 1 / (1 + j / SPECTRAL_SCALE) */
#define SPECTRAL_SCALE 16.0
/* relu: the bias added before max(0, .); with N(0, 1.09) inputs about 91% of the
 * coordinates stay positive and the mean pairwise cosine is about 0.7 */
#define RELU_BIAS 1.4
/* clustered: topics, the spread of a member around its topic's centre (relative to the
 * centre's length 1), and the share of memories that duplicate an earlier memory (half of
 * them exactly, half with a little noise of relative length CLUSTER_NEAR) */
#define CLUSTERS 300
#define CLUSTER_SPREAD 0.5
#define CLUSTER_DUP 0.03
#define CLUSTER_NEAR 0.02

/* Distinct streams of the per-row generators. */
enum {
    STREAM_W = 1,
    STREAM_MEMORY,
    STREAM_QUERY,
    STREAM_CONTENT,
    STREAM_VOCAB,
    STREAM_SHARED,
    STREAM_CENTRE,
    STREAM_MEMORY_EXTRA,
    STREAM_QUERY_EXTRA,
};

struct dataset {
    dataset_kind kind;
    uint64_t seed, salt; /* salt: 0 for gaussian, as in the first versions */
    size_t dim;
    float *wt;      /* W (dim x DATASET_LATENT) transposed: DATASET_LATENT rows of dim */
    float *shared;  /* anisotropic: the shared direction, length ANISO_SHARED sqrt(dim) */
    float *centres; /* clustered: CLUSTERS x dim, unit rows */
    /* text */
    float *tv, *tq; /* tn x dim stored rows, tqn x dim queries */
    size_t tn, tqn;
    char *sent_buf;    /* sentences.txt, lines NUL-terminated */
    const char **sent; /* tn sentences, or NULL */
    char vocab[VOCAB][WORD_MAX];
};

static const char *const kind_names[DATASET_NKINDS] = {
    "gaussian", "anisotropic", "spectral", "relu", "clustered", "text",
};

const char *dataset_kind_name(dataset_kind kind)
{
    return kind >= 0 && kind < DATASET_NKINDS ? kind_names[kind] : "?";
}

int dataset_kind_parse(const char *name, dataset_kind *kind)
{
    for (int k = 0; k < DATASET_NKINDS; k++) {
        if (strcmp(name, kind_names[k]) == 0) {
            *kind = (dataset_kind)k;
            return 0;
        }
    }
    return -EINVAL;
}

uint64_t dataset_rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

double dataset_rng_uniform(uint64_t *s)
{
    return ((double)(dataset_rng_next(s) >> 11) + 0.5) / 9007199254740992.0;
}

uint64_t dataset_seed_mix(uint64_t a, uint64_t b, uint64_t c)
{
    uint64_t s = a;
    uint64_t h = dataset_rng_next(&s);
    s = h ^ (b * 0xd1b54a32d192ed03ULL);
    h = dataset_rng_next(&s);
    s = h ^ (c * 0x8cb92ba72f3d8dd7ULL);
    return dataset_rng_next(&s);
}

/* Fills out[0..n) with standard normal values (Box-Muller, two per pair of uniforms). */
static void gauss_fill(uint64_t *s, float *out, size_t n)
{
    size_t i = 0;
    while (i < n) {
        double u1 = dataset_rng_uniform(s), u2 = dataset_rng_uniform(s);
        double r = sqrt(-2.0 * log(u1)), a = 6.283185307179586 * u2;
        out[i++] = (float)(r * cos(a));
        if (i < n)
            out[i++] = (float)(r * sin(a));
    }
}

static uint64_t stream_seed(const dataset *ds, int stream, uint64_t t, uint64_t i)
{
    return dataset_seed_mix(
        ds->seed ^ ds->salt ^ ((uint64_t)stream << 56) ^ ((uint64_t)ds->dim << 40), t, i);
}

/* Normalizes the n rows of dim floats at x to unit length (a zero row stays zero). */
static void normalize_rows(float *x, size_t n, size_t dim)
{
    for (size_t r = 0; r < n; r++) {
        float *row = x + r * dim;
        double ss = 0;
        for (size_t j = 0; j < dim; j++)
            ss += (double)row[j] * row[j];
        float inv = ss > 0 ? (float)(1.0 / sqrt(ss)) : 0.0f;
        for (size_t j = 0; j < dim; j++)
            row[j] *= inv;
    }
}

/* W z + 0.3 e for rows first.. of a stream, not normalized: noise and latent from each row's
 * own generator, then the W z part summed in double in one fixed order (l = 0..31) and
 * rounded once. Not BLAS: OpenBLAS picks its sgemm kernel by CPU (Haswell, SkylakeX,
 * Cooperlake, ...), each summing in its own order, so the data set's last bits depended on
 * the machine. Each product of two floats is exact in double, so the result is the same
 * with or without fused multiply-adds. */
static int gen_base(const dataset *ds, int stream, uint64_t t, uint64_t first, size_t n, float *out)
{
    size_t dim = ds->dim;
    if (n == 0)
        return 0;
    float z[DATASET_LATENT];
    double *acc = malloc(dim * sizeof(double));
    if (!acc)
        return -ENOMEM;
    for (size_t r = 0; r < n; r++) {
        uint64_t s = stream_seed(ds, stream, t, first + r);
        gauss_fill(&s, z, DATASET_LATENT);
        float *row = out + r * dim;
        gauss_fill(&s, row, dim);
        for (size_t j = 0; j < dim; j++)
            acc[j] = 0.0;
        for (size_t l = 0; l < DATASET_LATENT; l++) {
            const float *wl = ds->wt + l * dim;
            double zl = z[l];
            for (size_t j = 0; j < dim; j++)
                acc[j] += zl * (double)wl[j];
        }
        for (size_t j = 0; j < dim; j++)
            row[j] = (float)((double)(row[j] * (float)DATASET_NOISE) + acc[j]);
    }
    free(acc);
    return 0;
}

/* A topic index skewed towards the first topics (as skewed_word), so topic sizes range
 * from large to small. */
static size_t skewed_topic(uint64_t *s)
{
    double u = dataset_rng_uniform(s);
    size_t c = (size_t)(u * u * CLUSTERS);
    return c < CLUSTERS ? c : CLUSTERS - 1;
}

/* clustered: the topic member that row i of the stream is before any duplication, from its
 * own normalized base row u: centre + CLUSTER_SPREAD u, normalized, into out. The topic is
 * the first draw of the row's extra stream. */
static int topic_member(const dataset *ds, int stream, uint64_t t, uint64_t i, float *out)
{
    size_t dim = ds->dim;
    int rc = gen_base(ds, stream, t, i, 1, out);
    if (rc != 0)
        return rc;
    normalize_rows(out, 1, dim);
    int extra = stream == STREAM_MEMORY ? STREAM_MEMORY_EXTRA : STREAM_QUERY_EXTRA;
    uint64_t s = stream_seed(ds, extra, t, i);
    const float *c = ds->centres + skewed_topic(&s) * dim;
    for (size_t j = 0; j < dim; j++)
        out[j] = c[j] + (float)CLUSTER_SPREAD * out[j];
    normalize_rows(out, 1, dim);
    return 0;
}

/* clustered, memories only: whether memory i duplicates an earlier one; if so sets *src to
 * that one's index (itself no duplicate) and *near to whether noise is added. Draws after
 * the topic in the row's extra stream; *s is left where the noise continues. */
static bool duplicate_of(const dataset *ds, uint64_t t, uint64_t i, uint64_t *s, uint64_t *src,
                         bool *near)
{
    *s = stream_seed(ds, STREAM_MEMORY_EXTRA, t, i);
    (void)skewed_topic(s);
    if (i == 0 || dataset_rng_uniform(s) >= CLUSTER_DUP)
        return false;
    uint64_t j = dataset_rng_next(s) % i;
    *near = dataset_rng_next(s) & 1;
    /* follow the chain down to a memory that is not a duplicate: an exact duplicate then
     * equals a stored memory bit for bit */
    for (;;) {
        uint64_t s2 = stream_seed(ds, STREAM_MEMORY_EXTRA, t, j);
        (void)skewed_topic(&s2);
        if (j == 0 || dataset_rng_uniform(&s2) >= CLUSTER_DUP)
            break;
        j = dataset_rng_next(&s2) % j;
    }
    *src = j;
    return true;
}

static int gen_clustered(const dataset *ds, int stream, uint64_t t, uint64_t first, size_t n,
                         float *out)
{
    size_t dim = ds->dim;
    for (size_t r = 0; r < n; r++) {
        float *row = out + r * dim;
        uint64_t i = first + r, src = 0, s = 0;
        bool near = false;
        if (stream == STREAM_MEMORY && duplicate_of(ds, t, i, &s, &src, &near)) {
            int rc = topic_member(ds, stream, t, src, row);
            if (rc != 0)
                return rc;
            if (near) {
                float *e = malloc(dim * sizeof(float));
                if (!e)
                    return -ENOMEM;
                gauss_fill(&s, e, dim);
                float scale = (float)(CLUSTER_NEAR / sqrt((double)dim));
                for (size_t j = 0; j < dim; j++)
                    row[j] += scale * e[j];
                free(e);
                normalize_rows(row, 1, dim);
            }
        } else {
            int rc = topic_member(ds, stream, t, i, row);
            if (rc != 0)
                return rc;
        }
    }
    return 0;
}

/* Rows first.. of a stream of a synthetic kind, normalized. */
static int gen_rows(const dataset *ds, int stream, uint64_t t, uint64_t first, size_t n, float *out)
{
    size_t dim = ds->dim;
    if (ds->kind == DATASET_CLUSTERED)
        return gen_clustered(ds, stream, t, first, n, out);
    int rc = gen_base(ds, stream, t, first, n, out);
    if (rc != 0)
        return rc;
    for (size_t r = 0; r < n; r++) {
        float *row = out + r * dim;
        switch (ds->kind) {
        case DATASET_ANISOTROPIC:
            for (size_t j = 0; j < dim; j++)
                row[j] += ds->shared[j];
            break;
        case DATASET_SPECTRAL:
            for (size_t j = 0; j < dim; j++)
                row[j] *= (float)(1.0 / (1.0 + (double)j / SPECTRAL_SCALE));
            break;
        case DATASET_RELU:
            for (size_t j = 0; j < dim; j++)
                row[j] = row[j] + (float)RELU_BIAS > 0 ? row[j] + (float)RELU_BIAS : 0.0f;
            break;
        default:
            break;
        }
    }
    normalize_rows(out, n, dim);
    return 0;
}

/* The common part of every kind: the vocabulary. */
static dataset *alloc_dataset(dataset_kind kind, uint64_t seed, size_t dim)
{
    dataset *ds = calloc(1, sizeof(*ds));
    if (!ds)
        return NULL;
    ds->kind = kind;
    ds->seed = seed;
    ds->salt = kind == DATASET_GAUSSIAN ? 0 : dataset_seed_mix(0x6b696e64ULL, (uint64_t)kind, 0);
    ds->dim = dim;
    /* pronounceable pseudo-words: 2 to 4 consonant-vowel syllables, made distinct by a
     * suffix letter pair so the vocabulary has exactly VOCAB words */
    static const char cons[] = "bdfgklmnprstvz";
    static const char vow[] = "aeiou";
    uint64_t s = dataset_seed_mix(seed, STREAM_VOCAB, 0);
    for (size_t v = 0; v < VOCAB; v++) {
        char *wd = ds->vocab[v];
        size_t len = 0;
        int syl = 2 + (int)(dataset_rng_next(&s) % 3);
        for (int k = 0; k < syl; k++) {
            wd[len++] = cons[dataset_rng_next(&s) % (sizeof(cons) - 1)];
            wd[len++] = vow[dataset_rng_next(&s) % (sizeof(vow) - 1)];
        }
        wd[len++] = (char)('a' + v % 26);
        wd[len++] = (char)('a' + v / 26 % 26);
        wd[len] = '\0';
    }
    return ds;
}

dataset *dataset_create(dataset_kind kind, uint64_t seed, size_t dim)
{
    if (dim == 0 || kind < 0 || kind >= DATASET_TEXT)
        return NULL;
    dataset *ds = alloc_dataset(kind, seed, dim);
    if (!ds)
        return NULL;
    float *w = malloc(dim * DATASET_LATENT * sizeof(float)); /* W row-major, as drawn */
    ds->wt = malloc(dim * DATASET_LATENT * sizeof(float));
    if (!w || !ds->wt) {
        free(w);
        goto fail;
    }
    uint64_t s = stream_seed(ds, STREAM_W, 0, 0);
    gauss_fill(&s, w, dim * DATASET_LATENT);
    float scale = 1.0f / sqrtf((float)DATASET_LATENT);
    for (size_t j = 0; j < dim; j++) {
        for (size_t l = 0; l < DATASET_LATENT; l++)
            ds->wt[l * dim + j] = w[j * DATASET_LATENT + l] * scale;
    }
    free(w);
    if (kind == DATASET_ANISOTROPIC) {
        ds->shared = malloc(dim * sizeof(float));
        if (!ds->shared)
            goto fail;
        s = stream_seed(ds, STREAM_SHARED, 0, 0);
        gauss_fill(&s, ds->shared, dim);
        normalize_rows(ds->shared, 1, dim);
        float len = (float)(ANISO_SHARED * sqrt((double)dim));
        for (size_t j = 0; j < dim; j++)
            ds->shared[j] *= len;
    }
    if (kind == DATASET_CLUSTERED) {
        ds->centres = malloc(CLUSTERS * dim * sizeof(float));
        if (!ds->centres || gen_base(ds, STREAM_CENTRE, 0, 0, CLUSTERS, ds->centres) != 0)
            goto fail;
        normalize_rows(ds->centres, CLUSTERS, dim);
    }
    return ds;
fail:
    dataset_destroy(ds);
    return NULL;
}

/* Reads the whole file dir/name into a malloc'd buffer (NUL-terminated); *len is its size.
 * Returns 0, DATASET_E_TEXT with err, or -ENOMEM. */
static int read_file(const char *dir, const char *name, char **buf, size_t *len, char *err,
                     size_t errlen)
{
    char path[4096];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, errlen, "cannot open %s: %s (make it with bench/text-dataset.sh %s)", path,
                 strerror(errno), dir);
        return DATASET_E_TEXT;
    }
    int rc = DATASET_E_TEXT;
    long sz = -1;
    if (fseek(f, 0, SEEK_END) == 0)
        sz = ftell(f);
    if (sz < 0 || fseek(f, 0, SEEK_SET) != 0) {
        snprintf(err, errlen, "cannot read %s", path);
        goto out;
    }
    *buf = malloc((size_t)sz + 1);
    if (!*buf) {
        rc = -ENOMEM;
        goto out;
    }
    if (fread(*buf, 1, (size_t)sz, f) != (size_t)sz) {
        snprintf(err, errlen, "cannot read %s", path);
        free(*buf);
        *buf = NULL;
        goto out;
    }
    (*buf)[sz] = '\0';
    *len = (size_t)sz;
    rc = 0;
out:
    fclose(f);
    return rc;
}

/* The unsigned number after "key": in a small JSON object, or 0. */
static size_t json_size(const char *json, const char *key)
{
    char pat[64];
    snprintf(pat, sizeof(pat), "\"%s\"", key);
    const char *p = strstr(json, pat);
    if (!p)
        return 0;
    p += strlen(pat);
    while (*p == ' ' || *p == ':' || *p == '\t' || *p == '\n')
        p++;
    return (size_t)strtoull(p, NULL, 10);
}

/* Reads rows x dim float32 little-endian (what bench/text-dataset.sh writes) into *out. */
static int read_rows(const char *dir, const char *name, size_t rows, size_t dim, float **out,
                     char *err, size_t errlen)
{
    char *buf = NULL;
    size_t len = 0;
    int rc = read_file(dir, name, &buf, &len, err, errlen);
    if (rc != 0)
        return rc;
    if (len != rows * dim * sizeof(float)) {
        snprintf(err, errlen, "%s/%s: %zu bytes, expected %zu rows of %zu float32", dir, name, len,
                 rows, dim);
        free(buf);
        return DATASET_E_TEXT;
    }
    float *v = (float *)(void *)buf; /* malloc's alignment suits float */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    for (size_t i = 0; i < rows * dim; i++) {
        uint32_t u;
        memcpy(&u, &v[i], 4);
        u = __builtin_bswap32(u);
        memcpy(&v[i], &u, 4);
    }
#endif
    /* the script writes unit rows; renormalize only rows that are not */
    for (size_t r = 0; r < rows; r++) {
        double ss = 0;
        for (size_t j = 0; j < dim; j++)
            ss += (double)v[r * dim + j] * v[r * dim + j];
        if (fabs(ss - 1.0) > 1e-4)
            normalize_rows(v + r * dim, 1, dim);
    }
    *out = v;
    return 0;
}

int dataset_load_text(const char *dir, uint64_t seed, dataset **out, char *err, size_t errlen)
{
    *out = NULL;
    if (!dir || !*dir)
        dir = getenv(DATASET_TEXT_ENV);
    if (!dir || !*dir) {
        snprintf(err, errlen,
                 "the text data set needs its directory: set %s (make it with "
                 "bench/text-dataset.sh DIR)",
                 DATASET_TEXT_ENV);
        return DATASET_E_TEXT;
    }
    char *json = NULL;
    size_t len = 0;
    int rc = read_file(dir, "dataset.json", &json, &len, err, errlen);
    if (rc != 0)
        return rc;
    size_t dim = json_size(json, "dim"), nv = json_size(json, "vectors"),
           nq = json_size(json, "queries");
    free(json);
    if (dim == 0 || dim > 65536 || nv == 0 || nv > UINT32_MAX || nq == 0) {
        snprintf(err, errlen, "%s/dataset.json: no dim, vectors or queries", dir);
        return DATASET_E_TEXT;
    }
    dataset *ds = alloc_dataset(DATASET_TEXT, seed, dim);
    if (!ds)
        return -ENOMEM;
    ds->tn = nv;
    ds->tqn = nq;
    if ((rc = read_rows(dir, "vectors.f32", nv, dim, &ds->tv, err, errlen)) != 0 ||
        (rc = read_rows(dir, "queries.f32", nq, dim, &ds->tq, err, errlen)) != 0)
        goto fail;
    /* sentences are optional: without them content is made of pseudo-words */
    char quiet[8];
    if (read_file(dir, "sentences.txt", &ds->sent_buf, &len, quiet, sizeof(quiet)) == 0) {
        ds->sent = calloc(nv, sizeof(*ds->sent));
        if (!ds->sent) {
            rc = -ENOMEM;
            goto fail;
        }
        size_t line = 0;
        char *p = ds->sent_buf;
        while (line < nv && p < ds->sent_buf + len) {
            char *nl = strchr(p, '\n');
            if (nl)
                *nl = '\0';
            ds->sent[line++] = p;
            if (!nl)
                break;
            p = nl + 1;
        }
        if (line != nv) { /* not the file of these vectors: ignore it */
            free(ds->sent);
            free(ds->sent_buf);
            ds->sent = NULL;
            ds->sent_buf = NULL;
        }
    }
    *out = ds;
    return 0;
fail:
    dataset_destroy(ds);
    return rc;
}

int dataset_open(const char *name, uint64_t seed, size_t dim, const char *text_dir, dataset **out,
                 char *err, size_t errlen)
{
    dataset_kind kind;
    *out = NULL;
    if (dataset_kind_parse(name, &kind) != 0) {
        snprintf(err, errlen,
                 "unknown data set %s (gaussian, anisotropic, spectral, relu, clustered, text)",
                 name);
        return -EINVAL;
    }
    if (kind == DATASET_TEXT)
        return dataset_load_text(text_dir, seed, out, err, errlen);
    if (dim == 0) {
        snprintf(err, errlen, "dimension 0");
        return -EINVAL;
    }
    *out = dataset_create(kind, seed, dim);
    if (!*out) {
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    return 0;
}

void dataset_destroy(dataset *ds)
{
    if (!ds)
        return;
    free(ds->wt);
    free(ds->shared);
    free(ds->centres);
    free(ds->tv);
    free(ds->tq);
    free(ds->sent);
    free(ds->sent_buf);
    free(ds);
}

size_t dataset_dim(const dataset *ds)
{
    return ds->dim;
}

dataset_kind dataset_get_kind(const dataset *ds)
{
    return ds->kind;
}

size_t dataset_size(const dataset *ds)
{
    return ds->kind == DATASET_TEXT ? ds->tn : SIZE_MAX;
}

size_t dataset_query_size(const dataset *ds)
{
    return ds->kind == DATASET_TEXT ? ds->tqn : SIZE_MAX;
}

/* Rows first.. of the text file rows (count of them), repeating from the start. */
static void copy_rows(const float *rows, size_t count, size_t dim, uint64_t first, size_t n,
                      float *out)
{
    for (size_t r = 0; r < n; r++)
        memcpy(out + r * dim, rows + (size_t)((first + r) % count) * dim, dim * sizeof(float));
}

int dataset_vectors(const dataset *ds, uint64_t t, uint64_t first, size_t n, float *out)
{
    if (ds->kind == DATASET_TEXT) {
        copy_rows(ds->tv, ds->tn, ds->dim, first, n, out);
        return 0;
    }
    return gen_rows(ds, STREAM_MEMORY, t, first, n, out);
}

int dataset_queries(const dataset *ds, uint64_t t, uint64_t first, size_t n, float *out)
{
    if (ds->kind == DATASET_TEXT) {
        copy_rows(ds->tq, ds->tqn, ds->dim, first, n, out);
        return 0;
    }
    return gen_rows(ds, STREAM_QUERY, t, first, n, out);
}

/* A vocabulary index skewed towards the first words (density 1 / (2 sqrt(x))), so some
 * words are common and two-word queries find matches. */
static size_t skewed_word(uint64_t *s)
{
    double u = dataset_rng_uniform(s);
    size_t v = (size_t)(u * u * VOCAB);
    return v < VOCAB ? v : VOCAB - 1;
}

size_t dataset_content(const dataset *ds, uint64_t t, uint64_t i, char *buf)
{
    uint64_t s = stream_seed(ds, STREAM_CONTENT, t, i);
    int len = snprintf(buf, DATASET_CONTENT_MAX, "bench memory #%llu t%llu:", (unsigned long long)i,
                       (unsigned long long)t);
    size_t n = len > 0 ? (size_t)len : 0;
    if (ds->sent) { /* the sentence, cut at a word boundary if it is too long */
        const char *p = ds->sent[i % ds->tn];
        while (*p) {
            while (*p == ' ')
                p++;
            size_t wl = strcspn(p, " ");
            if (wl == 0 || n + 1 + wl + 1 > DATASET_CONTENT_MAX)
                break;
            buf[n++] = ' ';
            memcpy(buf + n, p, wl);
            n += wl;
            p += wl;
        }
        buf[n] = '\0';
        return n;
    }
    for (int k = 0; k < CONTENT_WORDS; k++) {
        const char *wd = ds->vocab[skewed_word(&s)];
        size_t wl = strlen(wd);
        if (n + 1 + wl + 1 > DATASET_CONTENT_MAX)
            break;
        buf[n++] = ' ';
        memcpy(buf + n, wd, wl);
        n += wl;
    }
    buf[n] = '\0';
    return n;
}

/* Copies into out (at most 31 bytes) the next word of at least 4 letters at or after *p,
 * advancing *p past it. Returns its length, 0 when there is none. */
static size_t next_word(const char **p, char *out)
{
    const char *s = *p;
    while (*s) {
        while (*s && !((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z')))
            s++;
        size_t l = 0;
        while ((s[l] >= 'a' && s[l] <= 'z') || (s[l] >= 'A' && s[l] <= 'Z'))
            l++;
        if (l >= 4 && l < 32) {
            memcpy(out, s, l);
            out[l] = '\0';
            *p = s + l;
            return l;
        }
        s += l;
    }
    *p = s;
    return 0;
}

size_t dataset_text_query(const dataset *ds, uint64_t *rng, char *buf)
{
    if (ds->sent) { /* two words of a stored sentence, so the query has an answer */
        for (int tries = 0; tries < 16; tries++) {
            const char *p = ds->sent[dataset_rng_next(rng) % ds->tn];
            char a[32], b[32];
            if (next_word(&p, a) && next_word(&p, b)) {
                int len = snprintf(buf, 64, "%s %s", a, b);
                return len > 0 ? (size_t)len : 0;
            }
        }
    }
    const char *a = ds->vocab[skewed_word(rng)];
    const char *b = ds->vocab[skewed_word(rng)];
    int len = snprintf(buf, 64, "%s %s", a, b);
    return len > 0 ? (size_t)len : 0;
}

size_t dataset_parse_index(const char *s, size_t n, uint64_t *i)
{
    for (size_t p = 0; p + 1 < n; p++) {
        if (s[p] != '#' || s[p + 1] < '0' || s[p + 1] > '9')
            continue;
        uint64_t v = 0;
        size_t q = p + 1;
        while (q < n && s[q] >= '0' && s[q] <= '9')
            v = v * 10 + (uint64_t)(s[q++] - '0');
        *i = v;
        return q;
    }
    return 0;
}

float dataset_dot(const float *a, const float *b, size_t dim)
{
    float s = 0;
    for (size_t j = 0; j < dim; j++)
        s += a[j] * b[j];
    return s;
}

/* Inserts (sim, idx) into the sorted (descending) top-k list of one query if it belongs. */
static void topk_offer(float *sims, uint32_t *idx, size_t k, float sim, uint32_t id)
{
    if (sim <= sims[k - 1])
        return;
    size_t p = k - 1;
    while (p > 0 && sims[p - 1] < sim) {
        sims[p] = sims[p - 1];
        idx[p] = idx[p - 1];
        p--;
    }
    sims[p] = sim;
    idx[p] = id;
}

int dataset_truth_init(dataset_truth *tr, const dataset *ds, uint64_t t, size_t n, const float *q,
                       size_t nq, size_t k, const float *base)
{
    memset(tr, 0, sizeof(*tr));
    if (k == 0 || k > n)
        return -EINVAL;
    size_t dim = ds->dim;
    float *block = NULL, *c = NULL;
    tr->idx = malloc(nq * k * sizeof(uint32_t));
    tr->sim = malloc(nq * k * sizeof(float));
    size_t qb = nq < TRUTH_QUERY_BLOCK ? nq : TRUTH_QUERY_BLOCK;
    c = malloc((qb ? qb : 1) * TRUTH_BASE_BLOCK * sizeof(float));
    if (!base)
        block = malloc(TRUTH_BASE_BLOCK * dim * sizeof(float));
    if (!tr->idx || !tr->sim || !c || (!base && !block))
        goto fail;
    for (size_t j = 0; j < nq * k; j++) {
        tr->sim[j] = -INFINITY;
        tr->idx[j] = UINT32_MAX;
    }
    for (size_t b0 = 0; b0 < n; b0 += TRUTH_BASE_BLOCK) {
        size_t nb = n - b0 < TRUTH_BASE_BLOCK ? n - b0 : TRUTH_BASE_BLOCK;
        const float *rows = base ? base + b0 * dim : block;
        if (!base && dataset_vectors(ds, t, b0, nb, block) != 0)
            goto fail;
        for (size_t q0 = 0; q0 < nq; q0 += qb) {
            size_t nqq = nq - q0 < qb ? nq - q0 : qb;
            /* c (nqq x nb) = queries (nqq x dim) * rows^T (dim x nb) */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)nqq, (int)nb, (int)dim, 1.0f,
                        q + q0 * dim, (int)dim, rows, (int)dim, 0.0f, c, (int)nb);
            for (size_t a = 0; a < nqq; a++) {
                float *sims = tr->sim + (q0 + a) * k;
                uint32_t *ids = tr->idx + (q0 + a) * k;
                const float *crow = c + a * nb;
                for (size_t r = 0; r < nb; r++)
                    topk_offer(sims, ids, k, crow[r], (uint32_t)(b0 + r));
            }
        }
    }
    tr->nq = nq;
    tr->k = k;
    free(block);
    free(c);
    return 0;
fail:
    free(block);
    free(c);
    dataset_truth_fini(tr);
    return -ENOMEM;
}

void dataset_truth_fini(dataset_truth *tr)
{
    free(tr->idx);
    free(tr->sim);
    memset(tr, 0, sizeof(*tr));
}

double dataset_mean_cosine(const float *rows, size_t n, size_t dim)
{
    if (n < 2)
        return 0;
    double *sum = calloc(dim, sizeof(double));
    if (!sum)
        return NAN;
    double self = 0;
    for (size_t r = 0; r < n; r++) {
        const float *row = rows + r * dim;
        for (size_t j = 0; j < dim; j++) {
            sum[j] += row[j];
            self += (double)row[j] * row[j];
        }
    }
    double all = 0;
    for (size_t j = 0; j < dim; j++)
        all += sum[j] * sum[j];
    free(sum);
    return (all - self) / ((double)n * (double)(n - 1));
}
