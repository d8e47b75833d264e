/* index/vindex_snap.c: the vector index's snapshots (see vindex.h for the file format):
 * vindex_save writes the live vectors, metadata, codes and the FAISS engine's section from
 * a frozen view (neither searches nor writers wait for the I/O) into a temporary file,
 * checksummed with XXH64, fsynced and renamed; vindex_load verifies everything before it
 * trusts anything, reads versions 2 and 3, and computes codes the file lacks.
 */
#define _GNU_SOURCE /* mkostemp */

#include "vindex.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "idmap.h"
#include "vindex_int.h"
#include "xxh64.h"

/* ---- snapshots ---- */

#define SNAP_MAGIC "ENGVIDX"
#define SNAP_VERSION 3 /* 3: the sign codes' centre follows them; 2 is read (codes redone) */
#define SNAP_HEADER 88
#define SNAP_BOM 0x01020304u
#define CK_OFF 56

static uint64_t rd64(const unsigned char *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v; /* little-endian hosts only (the snapshot format is little-endian) */
}

static uint32_t rd32(const unsigned char *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* A buffered writer that hashes what it writes. */
typedef struct wbuf {
    int fd;
    unsigned char *buf;
    size_t n, cap;
    xxh64_state h;
    int err; /* first -errno */
} wbuf;

static void wflush(wbuf *w)
{
    size_t done = 0;
    while (done < w->n && !w->err) {
        ssize_t r = write(w->fd, w->buf + done, w->n - done);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            w->err = -errno;
        } else {
            done += (size_t)r;
        }
    }
    w->n = 0;
}

static void wput(wbuf *w, const void *data, size_t len)
{
    const unsigned char *p = data;
    xxh64_update(&w->h, p, len);
    while (len > 0 && !w->err) {
        size_t take = w->cap - w->n < len ? w->cap - w->n : len;
        memcpy(w->buf + w->n, p, take);
        w->n += take;
        p += take;
        len -= take;
        if (w->n == w->cap)
            wflush(w);
    }
}

static void put_u32(unsigned char *p, uint32_t v)
{
    memcpy(p, &v, 4);
}

static void put_u64(unsigned char *p, uint64_t v)
{
    memcpy(p, &v, 8);
}

/* fsync_dir fsyncs the directory holding path. Returns 0 or -errno. */
static int fsync_dir(const char *path)
{
    const char *slash = strrchr(path, '/');
    char *dir;
    if (!slash) {
        dir = strdup(".");
    } else if (slash == path) {
        dir = strdup("/");
    } else {
        dir = strndup(path, (size_t)(slash - path));
    }
    if (!dir)
        return -ENOMEM;
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    free(dir);
    if (fd < 0)
        return -errno;
    int rc = fsync(fd) ? -errno : 0;
    close(fd);
    return rc;
}

/* vindex_save_extra writes a snapshot atomically; see vindex.h. */
int vindex_save_extra(vindex *vi, const char *path, uint64_t seq, const void *extra,
                      size_t extra_len)
{
    view v;
    unsigned char *metas = NULL;
    int rc;
    size_t plen = strlen(path);
    char *tmp = malloc(plen + 16);
    if (!tmp)
        return -ENOMEM;
    memcpy(tmp, path, plen);
    memcpy(tmp + plen, ".tmp.XXXXXX", 12);

    pthread_mutex_lock(&vi->maint_mu);
    pthread_mutex_lock(&vi->wmu);
    rc = vi_view_take(vi, &v);
    if (rc == 0 && vi->meta_size && v.live) {
        metas = malloc(v.live * vi->meta_size);
        if (!metas) {
            rc = -ENOMEM;
            vi_view_free(&v);
        } else {
            size_t j = 0;
            for (size_t s = 0; s < v.nslots; s++) {
                if (!view_tomb(&v, s)) {
                    memcpy(metas + j * vi->meta_size,
                           meta_in(vi, &v.ch[s >> vi->ch_shift], s & vi->ch_mask), vi->meta_size);
                    j++;
                }
            }
        }
    }
    if (rc == 0)
        vi->pinned = true;
    pthread_mutex_unlock(&vi->wmu);
    if (rc) {
        pthread_mutex_unlock(&vi->maint_mu);
        free(tmp);
        return rc;
    }

    wbuf w = {.fd = -1, .cap = 1 << 20};
    w.buf = malloc(w.cap);
    if (!w.buf) {
        rc = -ENOMEM;
        goto done;
    }
    w.fd = mkostemp(tmp, O_CLOEXEC);
    if (w.fd < 0) {
        rc = -errno;
        goto done;
    }
    xxh64_init(&w.h, 0);
    unsigned char hdr[SNAP_HEADER];
    memset(hdr, 0, sizeof(hdr));
    memcpy(hdr, SNAP_MAGIC, 8);
    put_u32(hdr + 8, SNAP_VERSION);
    put_u32(hdr + 12, SNAP_HEADER);
    put_u64(hdr + 16, vi->dim);
    put_u64(hdr + 24, vi->meta_size);
    put_u64(hdr + 32, v.live);
    put_u64(hdr + 40, seq);
    put_u32(hdr + 48, (uint32_t)v.kind);
    put_u32(hdr + 52, SNAP_BOM);
    put_u64(hdr + 64, vi->sq_stride);
    put_u64(hdr + 72, vi->words);
    put_u64(hdr + 80, extra_len);
    wput(&w, hdr, sizeof(hdr)); /* checksum field zero while hashed */

    /* sections; each walks the live slots of the view */
    for (int sec = 0; sec < 7 && !w.err; sec++) {
        if (sec == 1) {
            if (metas)
                wput(&w, metas, v.live * vi->meta_size);
            continue;
        }
        if (sec >= 3 && sec <= 5 && v.kind < VINDEX_KIND_SQ8)
            continue;
        if (sec == 6 && v.kind < VINDEX_KIND_ANN)
            continue;
        for (size_t s = 0; s < v.nslots && !w.err; s++) {
            if (view_tomb(&v, s))
                continue;
            const chunk *c = &v.ch[s >> vi->ch_shift];
            size_t off = s & vi->ch_mask;
            switch (sec) {
            case 0:
                wput(&w, &c->ids[off], sizeof(uint64_t));
                break;
            case 2:
                wput(&w, row_in(vi, c, off), vi->dim * sizeof(float));
                break;
            case 3:
                wput(&w, &c->sq_scale[off], sizeof(float));
                break;
            case 4:
                wput(&w, &c->sq_rn[off], sizeof(float));
                break;
            case 5:
                wput(&w, c->sq + off * vi->sq_stride, vi->sq_stride);
                break;
            case 6:
                wput(&w, c->bin + off * vi->words, vi->words * sizeof(uint64_t));
                break;
            }
        }
    }
    if (v.kind >= VINDEX_KIND_ANN && !w.err) {
        unsigned char cl[8];
        put_u64(cl, vi->center_live);
        wput(&w, v.center, vi->dim * sizeof(float));
        wput(&w, cl, 8);
        /* the FAISS engine's index (maint_mu keeps it as it is), its labels mapped to the
         * snapshot's slots: u64 bytes, u64 labels, the bytes, u32 slot per label (UINT32_MAX:
         * deleted), u64 where the tail starts; zeros without one */
        void *fxb = NULL;
        size_t fxlen = 0;
        uint32_t *newof = NULL;
        if (vi->fx) {
            newof = malloc((v.nslots + 1) * sizeof(uint32_t));
            if (!newof || vi->o.faiss_engine->serialize(vi->fx, &fxb, &fxlen) != 0) {
                free(newof);
                newof = NULL;
                fxb = NULL;
                fxlen = 0; /* saved without it: the next maintenance builds it again */
            }
        }
        unsigned char fh[16];
        put_u64(fh, fxlen);
        put_u64(fh + 8, fxlen ? vi->fx_n : 0);
        wput(&w, fh, 16);
        size_t upto = 0;
        if (fxlen) {
            wput(&w, fxb, fxlen);
            uint32_t j = 0;
            for (size_t s = 0; s < v.nslots; s++) {
                newof[s] = view_tomb(&v, s) ? UINT32_MAX : j++;
                if (s < vi->fx_upto && newof[s] != UINT32_MAX)
                    upto++;
            }
            for (size_t l = 0; l < vi->fx_n && !w.err; l++) {
                uint32_t ns = vi->fx_slot[l] < v.nslots ? newof[vi->fx_slot[l]] : UINT32_MAX;
                unsigned char b4[4];
                put_u32(b4, ns);
                wput(&w, b4, 4);
            }
        }
        put_u64(fh, upto);
        wput(&w, fh, 8);
        free(fxb);
        free(newof);
    }
    if (extra_len)
        wput(&w, extra, extra_len);
    wflush(&w);
    rc = w.err;
    if (rc == 0) {
        unsigned char ck[8];
        put_u64(ck, xxh64_digest(&w.h));
        if (pwrite(w.fd, ck, 8, CK_OFF) != 8)
            rc = errno ? -errno : -EIO;
    }
    if (rc == 0 && fsync(w.fd))
        rc = -errno;
    if (close(w.fd) && rc == 0)
        rc = -errno;
    w.fd = -1;
    if (rc == 0 && rename(tmp, path))
        rc = -errno;
    if (rc == 0)
        rc = fsync_dir(path);
    else
        unlink(tmp);

done:
    if (w.fd >= 0) {
        close(w.fd);
        unlink(tmp);
    }
    free(w.buf);
    pthread_mutex_lock(&vi->wmu);
    vi_unpin(vi);
    pthread_mutex_unlock(&vi->wmu);
    pthread_mutex_unlock(&vi->maint_mu);
    vi_view_free(&v);
    free(metas);
    free(tmp);
    return rc;
}

int vindex_save(vindex *vi, const char *path, uint64_t seq)
{
    return vindex_save_extra(vi, path, seq, NULL, 0);
}

/* A reader that hashes what it reads and reports short files. */
typedef struct rbuf {
    int fd;
    xxh64_state h;
    int err; /* first error: VINDEX_E_CORRUPT on a short read, or -errno */
} rbuf;

static void rget(rbuf *r, void *dst, size_t len)
{
    unsigned char *p = dst;
    size_t done = 0;
    while (done < len && !r->err) {
        ssize_t n = read(r->fd, p + done, len - done);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            r->err = -errno;
        } else if (n == 0) {
            r->err = VINDEX_E_CORRUPT;
        } else {
            done += (size_t)n;
        }
    }
    if (!r->err)
        xxh64_update(&r->h, p, len);
}

/* rskip reads and hashes len bytes nobody keeps. */
static void rskip(rbuf *r, size_t len, unsigned char *scratch, size_t scap)
{
    while (len > 0 && !r->err) {
        size_t take = len < scap ? len : scap;
        rget(r, scratch, take);
        len -= take;
    }
}

/* mul_ok stores a * b in *out unless it overflows. */
static bool mul_ok(uint64_t a, uint64_t b, uint64_t *out)
{
    if (a && b > UINT64_MAX / a)
        return false;
    *out = a * b;
    return true;
}

/* vindex_load_extra reads a snapshot; see vindex.h. */
int vindex_load_extra(const char *path, const vindex_opts *opts, vindex **out, uint64_t *seq,
                      void **extra, size_t *extra_len)
{
    *out = NULL;
    if (extra) {
        *extra = NULL;
        *extra_len = 0;
    }
    unsigned char *xbuf = NULL;
    vindex_opts ro;
    if (vi_resolve_opts(opts, &ro))
        return -EINVAL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return errno == ENOENT ? VINDEX_E_NOT_FOUND : -errno;
#ifdef POSIX_FADV_SEQUENTIAL
    posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
#endif
    vindex *vi = NULL;
    unsigned char *scratch = NULL;
    rbuf r = {.fd = fd};
    xxh64_init(&r.h, 0);
    int rc;
    struct stat sb;
    if (fstat(fd, &sb)) {
        rc = -errno;
        goto fail;
    }
    unsigned char hdr[SNAP_HEADER];
    rget(&r, hdr, sizeof(hdr));
    if (r.err) {
        rc = r.err;
        goto fail;
    }
    uint64_t want_ck = rd64(hdr + CK_OFF);
    /* the checksum covers the header with its own field zero: rehash the header */
    memset(hdr + CK_OFF, 0, 8);
    xxh64_init(&r.h, 0);
    xxh64_update(&r.h, hdr, sizeof(hdr));
    uint64_t dim = rd64(hdr + 16), msz = rd64(hdr + 24), count = rd64(hdr + 32);
    uint32_t kind = rd32(hdr + 48), version = rd32(hdr + 8);
    /* the width of the file's sign codes: one bit per dimension (files before
     * vi_code_words), or that width */
    uint64_t fwords = rd64(hdr + 72);
    if (memcmp(hdr, SNAP_MAGIC, 8) != 0 || version < 2 || version > SNAP_VERSION ||
        rd32(hdr + 12) != SNAP_HEADER || rd32(hdr + 52) != SNAP_BOM || kind > VINDEX_KIND_ANN ||
        dim == 0 || dim > MAX_DIM || msz > MAX_META || rd64(hdr + 64) != (dim + 31) / 32 * 32 ||
        (fwords != (dim + 63) / 64 && fwords != vi_code_words(dim)) || count >= MAX_SLOTS) {
        rc = VINDEX_E_CORRUPT;
        goto fail;
    }
    /* expected length: every section's size from count */
    uint64_t per = 8 + msz + dim * 4;
    if (kind >= VINDEX_KIND_SQ8)
        per += 8 + (dim + 31) / 32 * 32;
    if (kind >= VINDEX_KIND_ANN)
        per += fwords * 8;
    uint64_t body, xlen = rd64(hdr + 80);
    /* version 3, ANN: the centre, then the FAISS engine's section, whose two lengths are
     * read ahead here to check the file's length (they are hashed in order later) */
    uint64_t tail = 0, fxlen = 0, fxlab = 0;
    if (version >= 3 && kind >= VINDEX_KIND_ANN) {
        unsigned char fh[16];
        uint64_t at;
        if (!mul_ok(count, per, &body) || body > (uint64_t)sb.st_size ||
            (at = SNAP_HEADER + body + dim * 4 + 8) + 16 > (uint64_t)sb.st_size ||
            pread(fd, fh, 16, (off_t)at) != 16) {
            rc = VINDEX_E_CORRUPT;
            goto fail;
        }
        fxlen = rd64(fh);
        fxlab = rd64(fh + 8);
        if (fxlen > (uint64_t)sb.st_size || fxlab > count * 4 + 1024) {
            rc = VINDEX_E_CORRUPT;
            goto fail;
        }
        tail = dim * 4 + 8 + 16 + fxlen + fxlab * 4 + 8;
    }
    if (!mul_ok(count, per, &body) || body > UINT64_MAX - SNAP_HEADER - xlen - tail ||
        xlen > (uint64_t)sb.st_size || (uint64_t)sb.st_size != SNAP_HEADER + body + tail + xlen) {
        rc = VINDEX_E_CORRUPT;
        goto fail;
    }
    if (dim != ro.dim || msz != ro.meta_size) {
        /* intact? only a good checksum says so; a mismatch is reported either way, since
         * neither a corrupt nor a foreign file can be used */
        rc = VINDEX_E_MISMATCH;
        goto fail;
    }
    vi = vindex_create(&ro);
    scratch = malloc(1 << 16);
    if (!vi || !scratch) {
        rc = -ENOMEM;
        goto fail;
    }
    /* the kind to build: what the options call for, but at most what the file has plus
     * encoding (codes the file lacks are computed after the checksum) */
    int target = vi_kind_for(vi, (size_t)count, VINDEX_KIND_FLAT);
    store st = {0};
    st.kind = target;
    size_t nch = count ? ((size_t)count + vi->ch_rows - 1) >> vi->ch_shift : 0;
    st.chunks = calloc(nch ? nch : 1, sizeof(chunk *));
    if (!st.chunks) {
        rc = -ENOMEM;
        goto fail;
    }
    st.tcap = nch ? nch : 1;
    for (size_t i = 0; i < nch; i++) {
        size_t cap = vi->ch_rows;
        if (nch == 1) {
            cap = CHUNK0_MIN;
            while (cap < count)
                cap *= 2;
        }
        st.chunks[i] = vi_chunk_new(vi, cap, target);
        if (!st.chunks[i]) {
            vi_store_free(&st);
            rc = -ENOMEM;
            goto fail;
        }
        st.nchunks++;
    }
    st.nslots = (size_t)count;
    /* sections, chunk by chunk (a chunk's slots are contiguous in each section) */
    for (int sec = 0; sec < 7 && !r.err; sec++) {
        if (sec >= 3 && sec <= 5 && kind < VINDEX_KIND_SQ8)
            continue;
        if (sec == 6 && kind < VINDEX_KIND_ANN)
            continue;
        for (size_t i = 0; i < nch && !r.err; i++) {
            chunk *c = st.chunks[i];
            size_t base = i << vi->ch_shift;
            size_t m = (size_t)count - base < c->cap ? (size_t)count - base : c->cap;
            switch (sec) {
            case 0:
                rget(&r, c->ids, m * sizeof(uint64_t));
                break;
            case 1:
                if (vi->meta_size)
                    rget(&r, c->meta, m * vi->meta_size);
                break;
            case 2:
                rget(&r, c->rows, m * vi->dim * sizeof(float));
                break;
            case 3:
                if (c->sq)
                    rget(&r, c->sq_scale, m * sizeof(float));
                else
                    rskip(&r, m * sizeof(float), scratch, 1 << 16);
                break;
            case 4:
                if (c->sq)
                    rget(&r, c->sq_rn, m * sizeof(float));
                else
                    rskip(&r, m * sizeof(float), scratch, 1 << 16);
                break;
            case 5:
                if (c->sq)
                    rget(&r, c->sq, m * vi->sq_stride);
                else
                    rskip(&r, m * vi->sq_stride, scratch, 1 << 16);
                break;
            case 6:
                if (c->bin && fwords == vi->words)
                    rget(&r, c->bin, m * vi->words * sizeof(uint64_t));
                else
                    rskip(&r, m * fwords * sizeof(uint64_t), scratch, 1 << 16);
                break;
            }
        }
    }
    /* codes the file has and may be used: a version 2 file's sign codes are raw signs */
    int usable = (int)kind;
    if ((version < 3 || fwords != vi->words) && usable > VINDEX_KIND_SQ8)
        usable = VINDEX_KIND_SQ8; /* codes of another width are redone too */
    vindex_eix *fx = NULL;
    uint32_t *fx_slot = NULL;
    uint64_t fx_upto = 0;
    if (!r.err && tail) {
        float *fc = malloc((size_t)dim * sizeof(float));
        unsigned char cl[16];
        if (!fc) {
            r.err = -ENOMEM;
        } else {
            rget(&r, fc, (size_t)dim * sizeof(float));
            rget(&r, cl, 8);
            if (target >= VINDEX_KIND_ANN) {
                st.center = fc;
                vi->center_live = (size_t)rd64(cl);
            } else {
                free(fc);
            }
        }
        rget(&r, cl, 16); /* the FAISS lengths, read ahead above */
        /* without a FAISS engine (ro.faiss_engine NULL) the section is skipped, still
         * hashed: the index runs on its native codes */
        bool want_fx = fxlen && target >= VINDEX_KIND_ANN && ro.engine == VINDEX_ENGINE_FAISS &&
                       ro.faiss_engine;
        if (!r.err && want_fx) {
            unsigned char *fb = malloc((size_t)fxlen);
            fx_slot = malloc((size_t)fxlab * sizeof(uint32_t) + 1);
            if (!fb || !fx_slot) {
                r.err = -ENOMEM;
            } else {
                rget(&r, fb, (size_t)fxlen);
                for (uint64_t l = 0; l < fxlab && !r.err; l++) {
                    rget(&r, cl, 4);
                    fx_slot[l] = rd32(cl);
                    if (fx_slot[l] != UINT32_MAX && fx_slot[l] >= count)
                        r.err = VINDEX_E_CORRUPT;
                }
            }
            rget(&r, cl, 8);
            fx_upto = rd64(cl);
            if (!r.err && fx_upto > count)
                r.err = VINDEX_E_CORRUPT;
            if (!r.err && ro.faiss_engine->deserialize(fb, (size_t)fxlen, ro.faiss_ef_search, &fx,
                                                       NULL, 0) != 0)
                fx = NULL; /* unusable: the next maintenance builds it again */
            if (fx && ro.faiss_engine->count(fx) != fxlab) {
                fx_destroy(vi, fx);
                fx = NULL;
            }
            free(fb);
        } else if (!r.err) {
            rskip(&r, (size_t)fxlen + (size_t)fxlab * 4, scratch, 1 << 16);
            rget(&r, cl, 8);
        }
    }
    if (!r.err && target >= VINDEX_KIND_ANN && usable < VINDEX_KIND_ANN) {
        /* after the checksum the rows are trusted; computing first is harmless either way */
        st.center = vi_center_of(vi, st.chunks, st.nslots, NULL);
        vi->center_live = st.nslots;
        if (!st.center)
            r.err = -ENOMEM;
    }
    if (!r.err && xlen) {
        xbuf = malloc((size_t)xlen);
        if (!xbuf)
            r.err = -ENOMEM;
        else
            rget(&r, xbuf, (size_t)xlen);
    }
    if (!r.err) {
        /* nothing may follow */
        unsigned char trailing;
        ssize_t x = read(fd, &trailing, 1);
        if (x != 0)
            r.err = x > 0 ? VINDEX_E_CORRUPT : -errno;
    }
    if (!r.err && xxh64_digest(&r.h) != want_ck)
        r.err = VINDEX_E_CORRUPT;
    if (r.err) {
        vi_store_free(&st);
        fx_destroy(vi, fx);
        free(fx_slot);
        rc = r.err;
        goto fail;
    }
    /* verified: codes the file lacks, then the map (duplicate or reserved ids: corrupt) */
    idmap *map = idmap_create((size_t)count + (size_t)count / 4 + 16);
    if (!map) {
        vi_store_free(&st);
        fx_destroy(vi, fx);
        free(fx_slot);
        rc = -ENOMEM;
        goto fail;
    }
    rc = 0;
    for (size_t s = 0; s < st.nslots && rc == 0; s++) {
        chunk *c = st.chunks[s >> vi->ch_shift];
        size_t off = s & vi->ch_mask;
        if (target > usable)
            vi_encode_slot(vi, st.center, c, off, usable);
        uint64_t id = c->ids[off];
        if (id == UINT64_MAX || idmap_get(map, id, NULL))
            rc = VINDEX_E_CORRUPT;
        else if (idmap_put(map, id, s))
            rc = -ENOMEM;
    }
    if (rc) {
        idmap_destroy(map);
        vi_store_free(&st);
        fx_destroy(vi, fx);
        free(fx_slot);
        goto fail;
    }
    idmap_destroy(vi->map);
    vi->map = map;
    vi->chunks = st.chunks;
    vi->nchunks = st.nchunks;
    vi->tcap = st.tcap;
    vi->nslots = st.nslots;
    vi->live = st.nslots;
    vi->ntomb = 0;
    vi->kind = target;
    vi->center = st.center; /* NULL below ANN */
    if (fx) {
        vi->fx = fx;
        vi->fx_slot = fx_slot;
        vi->fx_n = (size_t)fxlab;
        vi->fx_upto = (size_t)fx_upto;
        fx_slot = NULL;
    }
    free(fx_slot);
    *seq = rd64(hdr + 40);
    *out = vi;
    if (extra) {
        *extra = xbuf; /* the caller's now */
        *extra_len = (size_t)xlen;
    } else {
        free(xbuf);
    }
    free(scratch);
    close(fd);
    return 0;

fail:
    vindex_destroy(vi);
    free(xbuf);
    free(scratch);
    close(fd);
    return rc;
}

int vindex_load(const char *path, const vindex_opts *opts, vindex **out, uint64_t *seq)
{
    return vindex_load_extra(path, opts, out, seq, NULL, NULL);
}
