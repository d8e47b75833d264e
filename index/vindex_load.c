/* index/vindex_load.c: loading the vector index's snapshots (see vindex.h for the format).
 *
 * Nothing in the file is trusted before the whole of it has been read and its checksum
 * matched: the header's numbers are checked against each other and the file's length before
 * anything is allocated from them, every section is hashed as it is read (the rows through
 * their mapping), and only then are the codes the file lacks computed, the id map built
 * (a duplicate or reserved id: corrupt) and the index handed out. From the SQ8 kind on the
 * rows stay in the file, mapped (vindex_rows.c); below it they are read into the heap.
 */
#define _GNU_SOURCE /* madvise */

#include "vindex.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "vindex_int.h"
#include "xxh64.h"

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

/* A reader that hashes what it reads and reports short files. */
typedef struct rbuf {
    int fd;
    xxh64_state h;
    int err; /* first error: VINDEX_E_CORRUPT on a short read, or -errno */
    unsigned char *scratch;
} rbuf;

#define SCRATCH (1 << 16)

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
static void rskip(rbuf *r, uint64_t len)
{
    while (len > 0 && !r->err) {
        size_t take = len < SCRATCH ? (size_t)len : SCRATCH;
        rget(r, r->scratch, take);
        len -= take;
    }
}

/* What the header says, checked. */
typedef struct snap_hdr {
    uint64_t dim, msz, slots, seq, live;
    uint32_t kind, version;
    uint64_t ck;
    snap_layout l;
} snap_hdr;

/* read_header reads and checks the header against itself and the file's length (size).
 * Returns 0, VINDEX_E_CORRUPT, VINDEX_E_MISMATCH (another format version) or -errno. */
static int read_header(rbuf *r, uint64_t size, snap_hdr *h)
{
    unsigned char hdr[SNAP_HEADER];
    if (size < SNAP_HEADER)
        return VINDEX_E_CORRUPT;
    rget(r, hdr, sizeof(hdr));
    if (r->err)
        return r->err;
    if (memcmp(hdr, SNAP_MAGIC, 8) != 0 || rd32(hdr + 52) != SNAP_BOM)
        return VINDEX_E_CORRUPT;
    h->version = rd32(hdr + 8);
    if (h->version != SNAP_VERSION && h->version != SNAP_VERSION_OLD_CODES)
        return h->version >= 2 && h->version < SNAP_VERSION ? VINDEX_E_MISMATCH : VINDEX_E_CORRUPT;
    h->ck = rd64(hdr + SNAP_CK_OFF);
    /* the checksum covers the header with its own field zero: rehash the header */
    memset(hdr + SNAP_CK_OFF, 0, 8);
    xxh64_init(&r->h, 0);
    xxh64_update(&r->h, hdr, sizeof(hdr));
    h->dim = rd64(hdr + 16);
    h->msz = rd64(hdr + 24);
    h->slots = rd64(hdr + 32);
    h->seq = rd64(hdr + 40);
    h->kind = rd32(hdr + 48);
    h->live = rd64(hdr + 88);
    if (rd32(hdr + 12) != SNAP_HEADER || h->kind > VINDEX_KIND_ANN || h->dim == 0 ||
        h->dim > MAX_DIM || h->msz > MAX_META || h->slots >= MAX_SLOTS || h->live > h->slots ||
        rd64(hdr + 64) != (h->dim + 31) / 32 * 32 ||
        rd64(hdr + 72) != vi_snap_words(h->version, h->dim) || rd64(hdr + 112) > size ||
        rd64(hdr + 120) > size || rd64(hdr + 80) > size)
        return VINDEX_E_CORRUPT;
    if ((rd64(hdr + 112) && h->kind != VINDEX_KIND_ANN) ||
        (rd64(hdr + 120) && h->kind != VINDEX_KIND_ANN))
        return VINDEX_E_CORRUPT;
    if (!vi_snap_layout(h->version, h->dim, h->msz, h->slots, h->kind, rd64(hdr + 112),
                        rd64(hdr + 120), rd64(hdr + 80), &h->l) ||
        h->l.total != size || h->l.rows_off != rd64(hdr + 96) || h->l.rows_len != rd64(hdr + 104))
        return VINDEX_E_CORRUPT;
    return 0;
}

/* A load in progress. */
typedef struct loading {
    vindex *vi;
    snap_hdr h;
    rbuf r;
    vstore st;
    int target;  /* the kind to build */
    vrows *rows; /* the mapped rows (target SQ8 and up, file kind too) */
    vcal cal;
    bool has_cal;
    vindex_eix *fx;
    uint32_t *fx_slot;
    uint64_t fx_labels, fx_upto;
    unsigned char *extra;
    const char *path;
} loading;

/* alloc_chunks gives ld->st the chunks of slots slots: whole ones over the mapping when
 * there is one, else chunk 0 sized to fit a small index. Returns 0 or -ENOMEM. */
static int alloc_chunks(loading *ld)
{
    vindex *vi = ld->vi;
    size_t slots = (size_t)ld->h.slots;
    size_t nch = slots ? (slots + vi->ch_rows - 1) >> vi->ch_shift : 0;
    vstore *st = &ld->st;
    st->kind = ld->target;
    st->chunks = calloc(nch ? nch : 1, sizeof(chunk *));
    if (!st->chunks)
        return -ENOMEM;
    st->tcap = nch ? nch : 1;
    for (size_t i = 0; i < nch; i++) {
        size_t cap = vi->ch_rows;
        if (nch == 1 && !ld->rows) {
            cap = CHUNK0_MIN;
            while (cap < slots)
                cap *= 2;
        }
        st->chunks[i] =
            ld->rows ? vi_chunk_new_mapped(vi, cap, ld->target, vi_rows_at(vi, ld->rows, i * cap))
                     : vi_chunk_new(vi, cap, ld->target);
        if (!st->chunks[i])
            return -ENOMEM;
        st->nchunks++;
    }
    st->nslots = slots;
    return 0;
}

/* read_slots reads the per-slot sections into the chunks: ids, tombstones, metadata, and the
 * codes the target kind keeps (the rest is skipped, still hashed). */
static void read_slots(loading *ld)
{
    vindex *vi = ld->vi;
    rbuf *r = &ld->r;
    vstore *st = &ld->st;
    size_t slots = st->nslots;
    /* format 4 has no errors along the centre (section 4), and its codes are taken anew:
     * skipped (hashed) */
    bool old = ld->h.version == SNAP_VERSION_OLD_CODES;
    for (int sec = 0; sec < 8 && !r->err; sec++) {
        if (sec >= 3 && ld->h.kind < (sec == 7 ? VINDEX_KIND_ANN : VINDEX_KIND_SQ8))
            continue;
        if (sec == 4 && old)
            continue;
        size_t per[8] = {8, 0, vi->meta_size, 4,
                         4, 4, vi->sq_stride, vi_snap_words(ld->h.version, vi->dim) * 8};
        if (sec == 1) { /* tombstones: whole words of the file, chunk words in memory */
            for (size_t i = 0; i < st->nchunks && !r->err; i++) {
                chunk *c = st->chunks[i];
                size_t m =
                    slots - (i << vi->ch_shift) < c->cap ? slots - (i << vi->ch_shift) : c->cap;
                rget(r, c->tomb, (m + 63) / 64 * 8);
            }
            continue;
        }
        for (size_t i = 0; i < st->nchunks && !r->err; i++) {
            chunk *c = st->chunks[i];
            size_t m = slots - (i << vi->ch_shift) < c->cap ? slots - (i << vi->ch_shift) : c->cap;
            void *dst[8] = {c->ids,  c->tomb,  c->meta, c->sq_scale,
                            c->sq_e, c->sq_rn, c->sq,   c->bin};
            if (dst[sec] &&
                (sec < 3 || (!old && ld->target >= (sec == 7 ? VINDEX_KIND_ANN : VINDEX_KIND_SQ8))))
                rget(r, dst[sec], m * per[sec]);
            else
                rskip(r, (uint64_t)m * per[sec]);
        }
    }
}

/* check_tombs: the bits past the last slot are zero, the live count is the header's. */
static bool check_tombs(const loading *ld)
{
    const vindex *vi = ld->vi;
    const vstore *st = &ld->st;
    size_t dead = 0;
    for (size_t i = 0; i < st->nchunks; i++) {
        const chunk *c = st->chunks[i];
        size_t base = i << vi->ch_shift;
        size_t m = st->nslots - base < c->cap ? st->nslots - base : c->cap;
        for (size_t w = 0; w < (m + 63) / 64; w++) {
            uint64_t bits = c->tomb[w];
            if (w == m / 64 && m % 64 && (bits >> (m % 64)))
                return false;
            dead += (size_t)__builtin_popcountll(bits);
        }
    }
    return st->nslots - dead == ld->h.live;
}

/* read_fx reads the FAISS engine's section: kept when the options ask for that engine and
 * give one that can read it, else skipped (still hashed). */
static void read_fx(loading *ld, const vindex_opts *o)
{
    rbuf *r = &ld->r;
    unsigned char b[16];
    if (!ld->h.l.fx)
        return;
    rget(r, b, 16);
    uint64_t bytes = rd64(b), labels = rd64(b + 8);
    if (!r->err && (bytes > ld->h.l.fx || 16 + bytes + labels * 4 + 8 != ld->h.l.fx)) {
        r->err = VINDEX_E_CORRUPT;
        return;
    }
    bool want =
        ld->target >= VINDEX_KIND_ANN && o->engine == VINDEX_ENGINE_FAISS && o->faiss_engine;
    if (!want) {
        rskip(r, ld->h.l.fx - 16);
        return;
    }
    unsigned char *fb = malloc(bytes ? (size_t)bytes : 1);
    ld->fx_slot = malloc(labels * sizeof(uint32_t) + 1);
    if (!fb || !ld->fx_slot) {
        free(fb);
        r->err = -ENOMEM;
        return;
    }
    rget(r, fb, (size_t)bytes);
    rget(r, ld->fx_slot, (size_t)labels * sizeof(uint32_t));
    rget(r, b, 8);
    ld->fx_upto = rd64(b);
    ld->fx_labels = labels;
    for (uint64_t l = 0; l < labels && !r->err; l++) {
        if (ld->fx_slot[l] >= ld->h.slots)
            r->err = VINDEX_E_CORRUPT; /* labels of deleted vectors name tombstoned slots */
    }
    if (!r->err && ld->fx_upto > ld->h.slots)
        r->err = VINDEX_E_CORRUPT;
    /* a section the engine cannot read (or of another count) is dropped: built again */
    if (!r->err &&
        o->faiss_engine->deserialize(fb, (size_t)bytes, o->faiss_ef_search, &ld->fx, NULL, 0))
        ld->fx = NULL;
    if (ld->fx && o->faiss_engine->count(ld->fx) != labels) {
        o->faiss_engine->destroy(ld->fx);
        ld->fx = NULL;
    }
    free(fb);
}

/* read_tail reads the centre, the calibration and the FAISS section. */
static void read_tail(loading *ld, const vindex_opts *o)
{
    vindex *vi = ld->vi;
    rbuf *r = &ld->r;
    if (ld->h.kind >= VINDEX_KIND_ANN) {
        float *fc = malloc(vi->dim * sizeof(float));
        unsigned char cl[8];
        if (!fc) {
            r->err = -ENOMEM;
            return;
        }
        rget(r, fc, vi->dim * sizeof(float));
        rget(r, cl, 8);
        if (ld->target >= VINDEX_KIND_ANN) {
            ld->st.center = fc;
            ld->st.center_live = (size_t)rd64(cl);
        } else {
            free(fc);
        }
    }
    if (ld->h.l.cal && !r->err) {
        unsigned char *cb = malloc((size_t)ld->h.l.cal);
        if (!cb) {
            r->err = -ENOMEM;
            return;
        }
        rget(r, cb, (size_t)ld->h.l.cal);
        int crc = r->err ? 0 : vi_cal_decode(cb, (size_t)ld->h.l.cal, &ld->cal);
        if (crc)
            r->err = crc;
        ld->has_cal = !r->err;
        free(cb);
    }
    read_fx(ld, o);
}

/* read_rows reads the padding and the rows: hashed through the mapping when there is one
 * (which brings them into RAM, read ahead), else into the heap chunks. */
static void read_rows(loading *ld)
{
    vindex *vi = ld->vi;
    rbuf *r = &ld->r;
    vstore *st = &ld->st;
    rskip(r, ld->h.l.rows_off - ld->h.l.body_end);
    if (r->err)
        return;
    if (ld->rows) {
        if (lseek(r->fd, (off_t)(ld->h.l.rows_off + ld->h.l.rows_len), SEEK_SET) < 0) {
            r->err = -errno;
            return;
        }
        madvise(ld->rows->base, ld->rows->len, MADV_SEQUENTIAL);
        xxh64_update(&r->h, ld->rows->base, ld->rows->len);
        madvise(ld->rows->base, ld->rows->len, MADV_RANDOM);
        return;
    }
    for (size_t i = 0; i < st->nchunks && !r->err; i++) {
        chunk *c = st->chunks[i];
        size_t base = i << vi->ch_shift;
        size_t m = st->nslots - base < c->cap ? st->nslots - base : c->cap;
        rget(r, c->rows, m * vi->dim * sizeof(float));
    }
    rskip(r, ld->h.l.rows_len - (uint64_t)st->nslots * vi->dim * sizeof(float));
}

/* finish completes a verified load: the codes the file lacks or took around another centre
 * (or, format 4, another way), then the map (duplicate or reserved ids: corrupt). Returns 0,
 * VINDEX_E_CORRUPT or -ENOMEM. */
static int finish(loading *ld)
{
    vindex *vi = ld->vi;
    vstore *st = &ld->st;
    int usable = (int)ld->h.kind;
    if (ld->target >= VINDEX_KIND_ANN && usable < VINDEX_KIND_ANN) {
        /* after the checksum the rows are trusted */
        st->center = vi_center_of(vi, st->chunks, st->nslots, NULL);
        st->center_live = ld->h.live;
        if (!st->center)
            return -ENOMEM;
    }
    /* codes around a new centre, or around the origin where the file's had one, or of
     * format 4: taken anew */
    if ((ld->target >= VINDEX_KIND_ANN) != (usable >= VINDEX_KIND_ANN) ||
        ld->h.version == SNAP_VERSION_OLD_CODES)
        usable = VINDEX_KIND_FLAT;
    if (st->center && !(st->rcenter = vi_rotate_center(vi, st->center, &st->cnorm)))
        return -ENOMEM;
    if (vm_init(&st->map, (size_t)ld->h.live))
        return -ENOMEM;
    for (size_t s = 0; s < st->nslots; s++) {
        chunk *c = st_chunk(vi, st, s);
        size_t off = off_of(vi, s);
        if (ld->target > usable)
            vi_encode_slot(vi, st->rcenter, st->cnorm, c, off, usable);
        if (tomb_at(c, off))
            continue;
        uint64_t id = c->ids[off];
        if (id == UINT64_MAX || vm_find(vi, st, id) >= 0)
            return VINDEX_E_CORRUPT;
        vm_put(vi, st, id, (uint32_t)s);
    }
    st->live = (size_t)ld->h.live;
    st->ntomb = st->nslots - st->live;
    return 0;
}

/* remeasure measures the codes a format 4 file's ANN index got anew (its sign codes' recall
 * was measured on codes rotated in float), in the load's time as a build does, unless the
 * file's measurement is of the FAISS engine's candidates, which the codes do not change. A
 * failure (memory) leaves the index unmeasured: exact scans until the monitor measures. */
static void remeasure(loading *ld)
{
    if (ld->h.version != SNAP_VERSION_OLD_CODES || ld->target != VINDEX_KIND_ANN ||
        ld->h.kind != VINDEX_KIND_ANN || (ld->has_cal && ld->cal.fx_depth != 0 && ld->fx) ||
        ld->st.live == 0)
        return;
    vi_cal_free(&ld->cal);
    ld->has_cal = false;
    if (vi_cal_build(ld->vi, &ld->st, &ld->cal, ld->vi->o.recall_target, NULL) == 0 &&
        ld->cal.measured)
        ld->has_cal = true;
    else
        vi_cal_free(&ld->cal);
}

/* install hands the loaded storage, FAISS index and calibration to the new index. */
static void install(loading *ld)
{
    vindex *vi = ld->vi;
    vm_free(&vi->s.map);
    vi->s = ld->st;
    vi->s.rows = ld->rows;
    memset(&ld->st, 0, sizeof(ld->st));
    ld->rows = NULL;
    if (vi->s.kind < VINDEX_KIND_ANN) {
        free(vi->s.center);
        free(vi->s.rcenter);
        vi->s.center = NULL;
        vi->s.rcenter = NULL;
        vi->s.cnorm = 0.0;
    }
    if (ld->fx) {
        vi->fx = ld->fx;
        vi->fx_slot = ld->fx_slot;
        vi->fx_n = (size_t)ld->fx_labels;
        vi->fx_upto = (size_t)ld->fx_upto;
        ld->fx = NULL;
        ld->fx_slot = NULL;
    }
    /* the measurement applies to these codes and this candidate stage only */
    bool same = ld->has_cal && ld->target == VINDEX_KIND_ANN && ld->h.kind == VINDEX_KIND_ANN &&
                (ld->cal.fx_depth != 0) == (vi->fx != NULL);
    pthread_mutex_lock(&vi->cal_mu);
    if (same)
        vi_cal_install(vi, &ld->cal, vi->code_gen);
    pthread_mutex_unlock(&vi->cal_mu);
}

/* load_body reads everything after the header and checks the checksum. */
static int load_body(loading *ld, const vindex_opts *ro)
{
    vindex *vi = ld->vi;
    /* the kind to build: what the options call for (codes the file lacks are computed after
     * the checksum); rows mapped when both want codes */
    ld->target = vi_kind_for(vi, (size_t)ld->h.live, VINDEX_KIND_FLAT);
    bool map = ld->target >= VINDEX_KIND_SQ8 && ld->h.kind >= VINDEX_KIND_SQ8 && !ro->heap_rows &&
               ld->h.l.rows_len;
    if (map &&
        !(ld->rows = vi_rows_map(vi, ld->r.fd, ld->h.l.rows_off, ld->h.l.rows_slots, ld->path)))
        return errno ? -errno : -ENOMEM;
    if (ld->rows)
        vi_rows_cow_from(vi, ld->rows, (size_t)ld->h.slots);
    if (alloc_chunks(ld))
        return -ENOMEM;
    read_slots(ld);
    if (!ld->r.err && !check_tombs(ld))
        ld->r.err = VINDEX_E_CORRUPT;
    read_tail(ld, ro);
    read_rows(ld);
    if (!ld->r.err && ld->h.l.extra) {
        ld->extra = malloc((size_t)ld->h.l.extra);
        if (!ld->extra)
            ld->r.err = -ENOMEM;
        rget(&ld->r, ld->extra, (size_t)ld->h.l.extra);
    }
    if (!ld->r.err && xxh64_digest(&ld->r.h) != ld->h.ck)
        ld->r.err = VINDEX_E_CORRUPT;
    if (ld->r.err)
        return ld->r.err;
    int rc = finish(ld);
    if (rc == 0)
        remeasure(ld);
    return rc;
}

static void loading_free(loading *ld)
{
    if (ld->vi)
        vi_store_free(ld->vi, &ld->st);
    vi_rows_unmap(ld->rows);
    vi_cal_free(&ld->cal);
    if (ld->fx && ld->vi)
        fx_destroy(ld->vi, ld->fx);
    free(ld->fx_slot);
    free(ld->extra);
    free(ld->r.scratch);
    vindex_destroy(ld->vi);
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
    vindex_opts ro;
    if (vi_resolve_opts(opts, &ro))
        return -EINVAL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return errno == ENOENT ? VINDEX_E_NOT_FOUND : -errno;
#ifdef POSIX_FADV_SEQUENTIAL
    posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
#endif
    loading ld = {.r = {.fd = fd}, .path = path};
    struct stat sb;
    xxh64_init(&ld.r.h, 0);
    int rc = fstat(fd, &sb) ? -errno : read_header(&ld.r, (uint64_t)sb.st_size, &ld.h);
    if (rc == 0 && (ld.h.dim != ro.dim || ld.h.msz != ro.meta_size))
        rc = VINDEX_E_MISMATCH; /* intact or not, a foreign file cannot be used */
    if (rc == 0) {
        ld.vi = vindex_create(&ro);
        ld.r.scratch = malloc(SCRATCH);
        rc = ld.vi && ld.r.scratch ? load_body(&ld, &ro) : -ENOMEM;
    }
    if (rc == 0) {
        install(&ld);
        *seq = ld.h.seq;
        *out = ld.vi;
        ld.vi = NULL;
        if (extra) {
            *extra = ld.extra; /* the caller's now */
            *extra_len = (size_t)ld.h.l.extra;
            ld.extra = NULL;
        }
    }
    loading_free(&ld);
    close(fd);
    return rc;
}

int vindex_load(const char *path, const vindex_opts *opts, vindex **out, uint64_t *seq)
{
    return vindex_load_extra(path, opts, out, seq, NULL, NULL);
}
