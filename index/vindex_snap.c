/* index/vindex_snap.c: saving the vector index's snapshots (see vindex.h for the format).
 *
 * vindex_save writes every slot of a frozen view (neither searches nor writers wait for the
 * I/O), the calibration of its codes and the FAISS engine's section into a temporary file,
 * checksummed with XXH64, fsynced and renamed over the path. From the SQ8 kind on, the rows
 * are page-aligned and padded to whole chunks; the index then maps them from the new file
 * and frees its heap rows (vindex_rows.c), so after a save the heap holds the codes and
 * metadata, and the rows of slots added since.
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

#include "vindex_int.h"
#include "xxh64.h"

/* mul_add sets *acc += a * b unless that overflows. */
static bool mul_add(uint64_t a, uint64_t b, uint64_t *acc)
{
    if (a && b > UINT64_MAX / a)
        return false;
    if (a * b > UINT64_MAX - *acc)
        return false;
    *acc += a * b;
    return true;
}

/* vi_snap_layout computes a snapshot's section sizes; see vindex_int.h. */
bool vi_snap_layout(uint32_t version, uint64_t dim, uint64_t meta_size, uint64_t slots,
                    uint32_t kind, uint64_t cal_len, uint64_t fx_len, uint64_t extra_len,
                    snap_layout *l)
{
    memset(l, 0, sizeof(*l));
    uint64_t stride = (dim + 31) / 32 * 32, words = vi_snap_words(version, (size_t)dim);
    uint64_t ch = (uint64_t)1 << vi_chunk_shift((size_t)dim);
    if (dim == 0 || dim > MAX_DIM || meta_size > MAX_META || slots > MAX_SLOTS)
        return false;
    l->ids = slots * 8;
    l->tombs = (slots + 63) / 64 * 8;
    l->meta = slots * meta_size;
    /* per slot: scale, (format 5) the error along the centre, error norm; the code */
    uint64_t sq_per = (version == SNAP_VERSION_OLD_CODES ? 8 : 12) + stride;
    l->sq8 = kind >= VINDEX_KIND_SQ8 ? slots * sq_per : 0;
    l->ann = kind >= VINDEX_KIND_ANN ? slots * words * 8 + dim * 4 + 8 : 0;
    l->cal = cal_len;
    l->fx = fx_len;
    l->extra = extra_len;
    uint64_t end = SNAP_HEADER;
    if (!mul_add(1, l->ids, &end) || !mul_add(1, l->tombs, &end) || !mul_add(1, l->meta, &end) ||
        !mul_add(1, l->sq8, &end) || !mul_add(1, l->ann, &end) || !mul_add(1, cal_len, &end) ||
        !mul_add(1, fx_len, &end))
        return false;
    l->body_end = end;
    bool padded = kind >= VINDEX_KIND_SQ8;
    l->rows_off = padded ? (end + PAGE - 1) / PAGE * PAGE : end;
    l->rows_slots = padded ? (slots + ch - 1) / ch * ch : slots;
    l->rows_len = l->rows_slots * dim * 4;
    uint64_t total = l->rows_off;
    if (l->rows_off < end || !mul_add(1, l->rows_len, &total) || !mul_add(1, extra_len, &total))
        return false;
    l->total = total;
    return true;
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

/* wzero writes len zero bytes. */
static void wzero(wbuf *w, uint64_t len)
{
    static const unsigned char zeros[4096];
    while (len > 0 && !w->err) {
        size_t take = len < sizeof(zeros) ? (size_t)len : sizeof(zeros);
        wput(w, zeros, take);
        len -= take;
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
    char *dir = !slash          ? strdup(".")
                : slash == path ? strdup("/")
                                : strndup(path, (size_t)(slash - path));
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

/* What a save writes, taken under the locks: the frozen view and copies of what may change
 * meanwhile. */
typedef struct snap_src {
    view v;
    unsigned char *metas; /* slots * meta_size (zeros for tombstones) */
    unsigned char *cal;   /* the calibration section (cal_len bytes) */
    size_t cal_len;
    void *fxb; /* the FAISS engine's serialized index (fx_bytes), and its labels */
    size_t fx_bytes, fx_labels, fx_upto;
    const uint32_t *fx_slot;
    size_t center_live;
} snap_src;

static void src_free(snap_src *src)
{
    vi_view_free(&src->v);
    free(src->metas);
    free(src->cal);
    free(src->fxb);
    memset(src, 0, sizeof(*src));
}

/* take_src freezes what the save writes (maint_mu and wmu held): the view (the index is
 * pinned on success), the metadata, and the calibration when it is of these codes. Returns 0
 * or -ENOMEM. */
static int take_src(vindex *vi, snap_src *src)
{
    if (vi_view_take(vi, &src->v))
        return -ENOMEM;
    const view *v = &src->v;
    src->center_live = vi->s.center_live;
    if (vi->meta_size && v->nslots) {
        src->metas = calloc(v->nslots, vi->meta_size);
        if (!src->metas)
            return -ENOMEM;
        for (size_t s = 0; s < v->nslots; s++) {
            if (!view_tomb(v, s))
                memcpy(src->metas + s * vi->meta_size,
                       meta_in(vi, &v->ch[s >> vi->ch_shift], s & vi->ch_mask), vi->meta_size);
        }
    }
    pthread_mutex_lock(&vi->cal_mu);
    const vcal *c = &vi->cal;
    if (v->kind == VINDEX_KIND_ANN && c->measured && c->gen == vi->code_gen && c->pos) {
        src->cal_len = vi_cal_size(c);
        src->cal = malloc(src->cal_len);
        if (src->cal)
            vi_cal_encode(c, src->cal);
        else
            src->cal_len = 0; /* saved unmeasured: a load measures again */
    }
    pthread_mutex_unlock(&vi->cal_mu);
    vi->pinned = true;
    return 0;
}

/* take_fx serializes the FAISS engine's index (maint_mu keeps it as it is). Without one, or
 * when it cannot be serialized, the snapshot has no section and the next maintenance builds
 * it again. */
static void take_fx(vindex *vi, snap_src *src)
{
    if (!vi->fx || src->v.kind != VINDEX_KIND_ANN)
        return;
    if (vi->o.faiss_engine->serialize(vi->fx, &src->fxb, &src->fx_bytes) != 0) {
        src->fxb = NULL;
        src->fx_bytes = 0;
        return;
    }
    src->fx_labels = vi->fx_n;
    src->fx_slot = vi->fx_slot;
    src->fx_upto = vi->fx_upto;
}

static uint64_t fx_section_len(const snap_src *src)
{
    return src->fx_bytes ? 16 + src->fx_bytes + src->fx_labels * 4 + 8 : 0;
}

/* write_header writes the header (checksum field zero). */
static void write_header(const vindex *vi, wbuf *w, const snap_src *src, const snap_layout *l,
                         uint64_t seq)
{
    unsigned char hdr[SNAP_HEADER];
    memset(hdr, 0, sizeof(hdr));
    memcpy(hdr, SNAP_MAGIC, 8);
    put_u32(hdr + 8, SNAP_VERSION);
    put_u32(hdr + 12, SNAP_HEADER);
    put_u64(hdr + 16, vi->dim);
    put_u64(hdr + 24, vi->meta_size);
    put_u64(hdr + 32, src->v.nslots);
    put_u64(hdr + 40, seq);
    put_u32(hdr + 48, (uint32_t)src->v.kind);
    put_u32(hdr + 52, SNAP_BOM);
    put_u64(hdr + 64, vi->sq_stride);
    put_u64(hdr + 72, vi->words);
    put_u64(hdr + 80, l->extra);
    put_u64(hdr + 88, src->v.live);
    put_u64(hdr + 96, l->rows_off);
    put_u64(hdr + 104, l->rows_len);
    put_u64(hdr + 112, l->cal);
    put_u64(hdr + 120, l->fx);
    wput(w, hdr, sizeof(hdr));
}

/* write_codes writes the per-slot sections after the metadata: the int8 steps, errors along
 * the centre, error norms and codes, then the sign codes. */
static void write_codes(const vindex *vi, wbuf *w, const view *v)
{
    for (int sec = 0; sec < 5 && !w->err; sec++) {
        if (v->kind < (sec == 4 ? VINDEX_KIND_ANN : VINDEX_KIND_SQ8))
            continue;
        for (size_t s = 0; s < v->nslots && !w->err; s++) {
            const chunk *c = &v->ch[s >> vi->ch_shift];
            size_t off = s & vi->ch_mask;
            if (sec == 0)
                wput(w, &c->sq_scale[off], sizeof(float));
            else if (sec == 1)
                wput(w, &c->sq_e[off], sizeof(float));
            else if (sec == 2)
                wput(w, &c->sq_rn[off], sizeof(float));
            else if (sec == 3)
                wput(w, c->sq + off * vi->sq_stride, vi->sq_stride);
            else
                wput(w, c->bin + off * vi->words, vi->words * sizeof(uint64_t));
        }
    }
}

/* write_body writes everything between the header and the rows' padding. */
static void write_body(const vindex *vi, wbuf *w, const snap_src *src)
{
    const view *v = &src->v;
    for (size_t s = 0; s < v->nslots && !w->err; s++)
        wput(w, &v->ch[s >> vi->ch_shift].ids[s & vi->ch_mask], sizeof(uint64_t));
    wput(w, v->tomb, (v->nslots + 63) / 64 * sizeof(uint64_t));
    if (src->metas)
        wput(w, src->metas, v->nslots * vi->meta_size);
    write_codes(vi, w, v);
    if (v->kind >= VINDEX_KIND_ANN) {
        unsigned char cl[8];
        put_u64(cl, src->center_live);
        wput(w, v->center, vi->dim * sizeof(float));
        wput(w, cl, 8);
    }
    if (src->cal_len)
        wput(w, src->cal, src->cal_len);
    if (src->fx_bytes) {
        /* u64 bytes, u64 labels, the bytes, u32 slot per label, u64 where the tail starts;
         * every slot is saved, so labels keep their slots */
        unsigned char fh[16];
        put_u64(fh, src->fx_bytes);
        put_u64(fh + 8, src->fx_labels);
        wput(w, fh, 16);
        wput(w, src->fxb, src->fx_bytes);
        wput(w, src->fx_slot, src->fx_labels * sizeof(uint32_t));
        put_u64(fh, src->fx_upto);
        wput(w, fh, 8);
    }
}

/* write_rows writes the zeros up to the rows, every slot's row, and the padding. */
static void write_rows(const vindex *vi, wbuf *w, const snap_src *src, const snap_layout *l)
{
    const view *v = &src->v;
    wzero(w, l->rows_off - l->body_end);
    for (size_t s = 0; s < v->nslots && !w->err; s++)
        wput(w, row_in(vi, &v->ch[s >> vi->ch_shift], s & vi->ch_mask), vi->dim * sizeof(float));
    wzero(w, (l->rows_slots - v->nslots) * vi->dim * sizeof(float));
}

/* write_file writes the snapshot into w.fd and checksums and fsyncs it. Returns 0 or
 * -errno. */
static int write_file(const vindex *vi, wbuf *w, const snap_src *src, const snap_layout *l,
                      uint64_t seq, const void *extra)
{
    xxh64_init(&w->h, 0);
    write_header(vi, w, src, l, seq);
    write_body(vi, w, src);
    write_rows(vi, w, src, l);
    if (l->extra)
        wput(w, extra, (size_t)l->extra);
    wflush(w);
    if (w->err)
        return w->err;
    unsigned char ck[8];
    put_u64(ck, xxh64_digest(&w->h));
    if (pwrite(w->fd, ck, 8, SNAP_CK_OFF) != 8)
        return errno ? -errno : -EIO;
    return fsync(w->fd) ? -errno : 0;
}

/* remap makes the index read the rows of the snapshot just written (slots [0, saved)) from
 * r, unless writers made that impossible; r is consumed. maint_mu held, index pinned. */
static void remap(vindex *vi, vrows *r, size_t saved)
{
    vrows *old = NULL;
    pthread_mutex_lock(&vi->wmu);
    vi_unpin(vi);
    bool ok = r && vi_rows_attach(vi, &vi->s, r, saved, true, &old);
    pthread_mutex_unlock(&vi->wmu);
    if (!ok)
        vi_rows_unmap(r);
    vi_rows_unmap(old); /* no chunk reads it any more; maint_mu keeps pinned readers away */
}

/* vindex_save_extra writes a snapshot atomically; see vindex.h. */
int vindex_save_extra(vindex *vi, const char *path, uint64_t seq, const void *extra,
                      size_t extra_len)
{
    snap_src src = {0};
    snap_layout l;
    size_t plen = strlen(path);
    char *tmp = malloc(plen + 16);
    wbuf w = {.fd = -1, .cap = 1 << 20};
    if (!tmp)
        return -ENOMEM;
    memcpy(tmp, path, plen);
    memcpy(tmp + plen, ".tmp.XXXXXX", 12);

    pthread_mutex_lock(&vi->maint_mu);
    pthread_mutex_lock(&vi->wmu);
    int rc = take_src(vi, &src);
    pthread_mutex_unlock(&vi->wmu);
    if (rc == 0)
        take_fx(vi, &src);
    vrows *r = NULL;
    if (rc == 0 &&
        !vi_snap_layout(SNAP_VERSION, vi->dim, vi->meta_size, src.v.nslots, (uint32_t)src.v.kind,
                        src.cal_len, fx_section_len(&src), extra_len, &l))
        rc = -EOVERFLOW;
    if (rc == 0 && !(w.buf = malloc(w.cap)))
        rc = -ENOMEM;
    if (rc == 0 && (w.fd = mkostemp(tmp, O_CLOEXEC)) < 0)
        rc = -errno;
    if (rc == 0)
        rc = write_file(vi, &w, &src, &l, seq, extra);
    /* map the rows before the name can point at another file (another process may rename
     * its snapshot over the path at any time) */
    bool want_map = rc == 0 && src.v.kind >= VINDEX_KIND_SQ8 && !vi->o.heap_rows && l.rows_len;
    if (want_map)
        r = vi_rows_map(vi, w.fd, l.rows_off, (size_t)l.rows_slots, path); /* NULL: rows stay */
    if (w.fd >= 0 && close(w.fd) && rc == 0)
        rc = -errno;
    if (rc == 0 && rename(tmp, path))
        rc = -errno;
    if (rc == 0)
        rc = fsync_dir(path);
    else if (w.fd >= 0)
        unlink(tmp);
    if (rc == 0 && want_map) {
        remap(vi, r, src.v.nslots);
    } else {
        vi_rows_unmap(r);
        if (src.v.ch) { /* pinned */
            pthread_mutex_lock(&vi->wmu);
            vi_unpin(vi);
            pthread_mutex_unlock(&vi->wmu);
        }
    }
    pthread_mutex_unlock(&vi->maint_mu);
    src_free(&src);
    free(w.buf);
    free(tmp);
    return rc;
}

int vindex_save(vindex *vi, const char *path, uint64_t seq)
{
    return vindex_save_extra(vi, path, seq, NULL, 0);
}
