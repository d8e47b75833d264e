/* index/vfaiss.c: one FAISS inner-product index behind an opaque handle (see vfaiss.h). */
#include "vfaiss.h"

#include <errno.h>
#include <math.h>
#include <omp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <faiss/c_api/AutoTune_c.h>
#include <faiss/c_api/Index_c.h>
#include <faiss/c_api/error_c.h>
#include <faiss/c_api/index_factory_c.h>
#include <faiss/c_api/index_io_c.h>

#include "vindex.h"

#define MAX_DIM 65536
#define MAX_FACTORY 256
#define MAX_K (1u << 30)
#define DEFAULT_EF 16 /* FAISS's own HNSW default */

/* The serialized form: a header, the factory string, then FAISS's own bytes
 * (faiss_write_index). The factory travels with the index so that a reader knows what it
 * holds (vfaiss_factory) and can estimate its memory; the length lets a reader refuse bytes
 * cut short before FAISS sees them. Host byte order (a snapshot is read back by the kind
 * of machine that wrote it):
 *   "VFAISS1\0", u32 factory length, i32 efSearch in force (0: none), u64 FAISS bytes. */
#define SER_MAGIC "VFAISS1"
#define SER_HEAD 24

struct vfaiss {
    FaissIndex *idx;
    size_t dim;
    size_t per_vec; /* estimated bytes per vector (vfaiss_bytes) */
    int ef;         /* efSearch in force; 0: the index has none */
    char *factory;  /* as given to faiss_index_factory */
};

const char *vfaiss_last_error(void)
{
    const char *m = faiss_get_last_error();
    return m ? m : "";
}

static void set_err(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void set_err(char *err, size_t errlen, const char *fmt, ...)
{
    if (!err || !errlen)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

/* Maps a failed FAISS call to a result: -ENOMEM when FAISS ran out of memory (the C API
 * reports std::bad_alloc as a standard exception), else VFAISS_E_FAISS. */
static int faiss_rc(void)
{
    const char *m = faiss_get_last_error();
    if (m && strstr(m, "bad_alloc"))
        return -ENOMEM;
    return VFAISS_E_FAISS;
}

/* The first decimal number in s after the prefix p, or 0. */
static size_t number_after(const char *s, const char *p)
{
    const char *at = strstr(s, p);
    if (!at)
        return 0;
    at += strlen(p);
    size_t v = 0;
    while (*at >= '0' && *at <= '9' && v < 1000000)
        v = v * 10 + (size_t)(*at++ - '0');
    return v;
}

/* Bytes one vector costs in an index made from factory (see vfaiss_bytes). */
static size_t per_vector(const char *factory, size_t dim)
{
    size_t code = 4 * dim;
    size_t pq = number_after(factory, "PQ");
    if (strstr(factory, "SQfp16"))
        code = 2 * dim;
    else if (strstr(factory, "SQ8"))
        code = dim;
    else if (strstr(factory, "SQ4"))
        code = (dim + 1) / 2;
    else if (pq)
        code = pq;
    else if (strstr(factory, "LSH"))
        code = (dim + 7) / 8;
    size_t graph = 0;
    size_t m = number_after(factory, "HNSW");
    if (strstr(factory, "HNSW"))
        /* 2 M neighbour ids at level 0, M per upper level (1 / (M - 1) levels on average),
         * the level (int) and the offset (size_t) */
        graph = 4 * (2 * (m ? m : 32) + 1) + 4 + 8;
    size_t r = number_after(factory, "NSG");
    if (strstr(factory, "NSG"))
        graph = 4 * (r ? r : 32);
    return code + graph;
}

/* Sets efSearch through ParameterSpace. Returns 0, or VFAISS_E_FAISS when the index has no
 * such parameter (or FAISS failed otherwise). */
static int apply_ef(FaissIndex *idx, int ef)
{
    FaissParameterSpace *ps = NULL;
    if (faiss_ParameterSpace_new(&ps))
        return faiss_rc();
    int rc = faiss_ParameterSpace_set_index_parameter(ps, idx, "efSearch", (double)ef);
    faiss_ParameterSpace_free(ps);
    return rc ? VFAISS_E_FAISS : 0;
}

/* Wraps idx (taking ownership) with a copy of factory. Returns 0 or -ENOMEM (idx freed). */
static int wrap(FaissIndex *idx, const char *factory, size_t flen, int ef, vfaiss **out)
{
    vfaiss *f = calloc(1, sizeof(*f));
    char *fac = malloc(flen + 1);
    if (!f || !fac) {
        free(f);
        free(fac);
        faiss_Index_free(idx);
        return -ENOMEM;
    }
    memcpy(fac, factory, flen);
    fac[flen] = '\0';
    f->idx = idx;
    f->dim = (size_t)faiss_Index_d(idx);
    f->factory = fac;
    f->per_vec = per_vector(fac, f->dim);
    /* probing efSearch tells whether the index has it at all */
    f->ef = apply_ef(idx, ef > 0 ? ef : DEFAULT_EF) == 0 ? (ef > 0 ? ef : DEFAULT_EF) : 0;
    *out = f;
    return 0;
}

int vfaiss_create(size_t dim, const char *factory, int ef_search, vfaiss **out, char *err,
                  size_t errlen)
{
    *out = NULL;
    if (dim == 0 || dim > MAX_DIM || !factory || !factory[0] || ef_search < 0) {
        set_err(err, errlen, "invalid FAISS index arguments");
        return -EINVAL;
    }
    size_t flen = strlen(factory);
    if (flen > MAX_FACTORY) {
        set_err(err, errlen, "FAISS factory string too long");
        return -EINVAL;
    }
    if (strstr(factory, "IDMap")) {
        set_err(err, errlen, "FAISS factory '%s': %s", factory,
                "IDMap indexes are not supported (labels are consecutive)");
        return VFAISS_E_TRAIN;
    }
    FaissIndex *idx = NULL;
    if (faiss_index_factory(&idx, (int)dim, factory, METRIC_INNER_PRODUCT)) {
        int rc = faiss_rc();
        set_err(err, errlen, "FAISS factory '%s': %s", factory, vfaiss_last_error());
        if (idx)
            faiss_Index_free(idx);
        return rc;
    }
    if (!faiss_Index_is_trained(idx)) {
        faiss_Index_free(idx);
        set_err(err, errlen, "FAISS factory '%s': %s", factory,
                "the index needs training, which is not supported (use e.g. HNSW32,Flat)");
        return VFAISS_E_TRAIN;
    }
    int rc = wrap(idx, factory, flen, ef_search, out);
    if (rc < 0)
        set_err(err, errlen, "out of memory");
    return rc;
}

void vfaiss_destroy(vfaiss *f)
{
    if (!f)
        return;
    faiss_Index_free(f->idx);
    free(f->factory);
    free(f);
}

int vfaiss_add(vfaiss *f, size_t n, const float *vecs)
{
    if (n == 0)
        return 0;
    if (n > (size_t)INT64_MAX / f->dim)
        return -EINVAL;
    return faiss_Index_add(f->idx, (idx_t)n, vecs) ? faiss_rc() : 0;
}

size_t vfaiss_count(const vfaiss *f)
{
    return (size_t)faiss_Index_ntotal(f->idx);
}

size_t vfaiss_dim(const vfaiss *f)
{
    return f->dim;
}

const char *vfaiss_factory(const vfaiss *f)
{
    return f->factory;
}

int vfaiss_set_ef(vfaiss *f, int ef_search)
{
    if (ef_search < 1)
        return -EINVAL;
    if (!f->ef)
        return 0;
    int rc = apply_ef(f->idx, ef_search);
    if (rc == 0)
        f->ef = ef_search;
    return rc;
}

int vfaiss_ef(const vfaiss *f)
{
    return f->ef;
}

int vfaiss_search(const vfaiss *f, const float *q, size_t k, int64_t *labels, float *sims)
{
    if (k == 0)
        return 0;
    if (k > MAX_K)
        return -EINVAL;
    /* one query, one thread: FAISS's parallel region would otherwise wake the pool */
    int saved = omp_get_max_threads();
    if (saved != 1)
        omp_set_num_threads(1);
    int rc = faiss_Index_search(f->idx, 1, q, (idx_t)k, sims, labels);
    if (saved != 1)
        omp_set_num_threads(saved);
    if (rc)
        return faiss_rc();
    for (size_t i = 0; i < k; i++)
        if (labels[i] < 0)
            sims[i] = -INFINITY;
    return 0;
}

size_t vfaiss_bytes(const vfaiss *f)
{
    return sizeof(*f) + strlen(f->factory) + 1 + vfaiss_count(f) * f->per_vec;
}

int vfaiss_serialize(const vfaiss *f, void **buf, size_t *len)
{
    char *p = NULL;
    size_t n = 0;
    *buf = NULL;
    *len = 0;
    FILE *ms = open_memstream(&p, &n);
    if (!ms)
        return -errno;
    unsigned char head[SER_HEAD] = {0};
    uint32_t flen = (uint32_t)strlen(f->factory);
    int32_t ef = f->ef;
    memcpy(head, SER_MAGIC, 8);
    memcpy(head + 8, &flen, 4);
    memcpy(head + 12, &ef, 4);
    int rc = 0;
    errno = 0;
    if (fwrite(head, 1, SER_HEAD, ms) != SER_HEAD || fwrite(f->factory, 1, flen, ms) != flen)
        rc = errno ? -errno : -ENOMEM;
    else if (faiss_write_index(f->idx, ms))
        rc = faiss_rc();
    /* the stream's buffer and size are final only after fclose */
    if (fclose(ms) != 0 && rc == 0)
        rc = errno ? -errno : -ENOMEM;
    if (rc != 0) {
        free(p);
        return rc;
    }
    uint64_t body = (uint64_t)(n - SER_HEAD - flen);
    memcpy(p + 16, &body, 8);
    *buf = p;
    *len = n;
    return 0;
}

int vfaiss_deserialize(const void *buf, size_t len, int ef_search, vfaiss **out, char *err,
                       size_t errlen)
{
    *out = NULL;
    if (ef_search < 0) {
        set_err(err, errlen, "invalid efSearch");
        return -EINVAL;
    }
    const unsigned char *b = buf;
    uint32_t flen = 0;
    int32_t saved_ef = 0;
    uint64_t body = 0;
    if (b && len >= SER_HEAD) {
        memcpy(&flen, b + 8, 4);
        memcpy(&saved_ef, b + 12, 4);
        memcpy(&body, b + 16, 8);
    }
    /* FAISS leaks what it has read when its input ends early: lengths are checked first */
    if (!b || len < SER_HEAD || memcmp(b, SER_MAGIC, 8) != 0 || flen == 0 || flen > MAX_FACTORY ||
        saved_ef < 0 || len - SER_HEAD < flen || body != len - SER_HEAD - flen ||
        memchr(b + SER_HEAD, '\0', flen)) {
        set_err(err, errlen, "not a serialized vfaiss index, or cut short");
        return VFAISS_E_CORRUPT;
    }
    char fac[MAX_FACTORY + 1];
    memcpy(fac, b + SER_HEAD, flen);
    fac[flen] = '\0';
    /* a read-only stream: fmemopen does not write through a stream opened "r" */
    FILE *in = fmemopen((void *)(uintptr_t)(b + SER_HEAD + flen), (size_t)body, "r");
    if (!in) {
        int e = errno;
        set_err(err, errlen, "fmemopen failed");
        return e ? -e : -ENOMEM;
    }
    FaissIndex *idx = NULL;
    int frc = faiss_read_index(in, 0, &idx);
    fclose(in);
    if (frc) {
        int rc = faiss_rc();
        set_err(err, errlen, "FAISS cannot read the index: %s", vfaiss_last_error());
        if (idx)
            faiss_Index_free(idx);
        return rc == -ENOMEM ? rc : VFAISS_E_CORRUPT;
    }
    if (faiss_Index_metric_type(idx) != METRIC_INNER_PRODUCT || !faiss_Index_is_trained(idx) ||
        faiss_Index_d(idx) <= 0 || faiss_Index_d(idx) > MAX_DIM) {
        faiss_Index_free(idx);
        set_err(err, errlen, "the FAISS index is not a trained inner-product index");
        return VFAISS_E_CORRUPT;
    }
    /* FAISS saves efSearch too, but the C API cannot read it: the header's copy is used */
    int rc = wrap(idx, fac, flen, ef_search > 0 ? ef_search : saved_ef, out);
    if (rc < 0)
        set_err(err, errlen, "out of memory");
    return rc;
}

/* ---- vindex's engine interface (vindex.h): the same functions behind vindex_engine ---- */

static int eng_create(size_t dim, const char *factory, int ef_search, vindex_eix **out, char *err,
                      size_t errlen)
{
    vfaiss *f = NULL;
    int rc = vfaiss_create(dim, factory, ef_search, &f, err, errlen);
    *out = (vindex_eix *)f;
    return rc;
}

static void eng_destroy(vindex_eix *x)
{
    vfaiss_destroy((vfaiss *)x);
}

static int eng_add(vindex_eix *x, size_t n, const float *vecs)
{
    return vfaiss_add((vfaiss *)x, n, vecs);
}

static int eng_search(const vindex_eix *x, const float *q, size_t k, int64_t *labels, float *sims)
{
    return vfaiss_search((const vfaiss *)x, q, k, labels, sims);
}

static size_t eng_count(const vindex_eix *x)
{
    return vfaiss_count((const vfaiss *)x);
}

static size_t eng_bytes(const vindex_eix *x)
{
    return vfaiss_bytes((const vfaiss *)x);
}

static int eng_serialize(const vindex_eix *x, void **buf, size_t *len)
{
    return vfaiss_serialize((const vfaiss *)x, buf, len);
}

static int eng_deserialize(const void *buf, size_t len, int ef_search, vindex_eix **out, char *err,
                           size_t errlen)
{
    vfaiss *f = NULL;
    int rc = vfaiss_deserialize(buf, len, ef_search, &f, err, errlen);
    *out = (vindex_eix *)f;
    return rc;
}

static const vindex_engine_ops engine = {
    .name = "FAISS",
    .create = eng_create,
    .destroy = eng_destroy,
    .add = eng_add,
    .search = eng_search,
    .count = eng_count,
    .bytes = eng_bytes,
    .serialize = eng_serialize,
    .deserialize = eng_deserialize,
};

/* vfaiss_engine returns the FAISS engine's function table (static, never freed). */
const vindex_engine_ops *vfaiss_engine(void)
{
    return &engine;
}
