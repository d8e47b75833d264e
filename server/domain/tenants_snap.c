/* server/domain/tenants_snap.c: index snapshot files: their directory, identity and tag records,
 * and saving (see tenants.h, tenants_int.h). */
#include "tenants.h"

#include <dirent.h>
#include <malloc.h>
#include <math.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/file.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "hash.h"
#include "idmap.h"
#include "log.h"
#include "memfilter.h"
#include "metrics.h"
#include "sql_bg.h"
#include "vfaiss.h"

#include "tenants_int.h"

/* ---- snapshot files ------------------------------------------------------------------- */

/* Finds (once) the directory for this database's snapshots: <index_dir>/<instance id>.
 * Returns true when snapshots can be used. Any thread with a connection. */
bool tn_snap_dir_ready(tenants *ts, PGconn *pg)
{
    pthread_mutex_lock(&ts->dir_mu);
    bool ok = ts->dir != NULL;
    if (ok || ts->dir_failed || !pg) {
        pthread_mutex_unlock(&ts->dir_mu);
        return ok;
    }
    char inst[64], err[256];
    if (loader_instance(pg, inst, sizeof(inst), err, sizeof(err)) < 0) {
        pthread_mutex_unlock(&ts->dir_mu);
        log_warn("index snapshots: cannot read the database's instance id: %s", err);
        return false; /* tried again on the next load */
    }
    if (strspn(inst, "0123456789abcdef-") != strlen(inst)) {
        ts->dir_failed = true;
        pthread_mutex_unlock(&ts->dir_mu);
        log_error("index snapshots disabled: unexpected instance id in engram_instance");
        return false;
    }
    const config *c = &ts->srv->cfg;
    char base[PATH_MAX], path[PATH_MAX];
    if (c->index_dir[0])
        snprintf(base, sizeof(base), "%s", c->index_dir);
    else
        snprintf(base, sizeof(base), "%s/index", c->data_dir);
    int n = snprintf(path, sizeof(path), "%s/%s", base, inst);
    if (n < 0 || (size_t)n >= sizeof(path) - 32 || (mkdir(base, 0700) && errno != EEXIST) ||
        (mkdir(path, 0700) && errno != EEXIST) || !(ts->dir = strdup(path))) {
        ts->dir_failed = true;
        pthread_mutex_unlock(&ts->dir_mu);
        log_error("index snapshots disabled: cannot create %s: %s", path, strerror(errno));
        return false;
    }
    /* Every engramd writing here holds .lock shared. Whoever gets it exclusively first is
     * alone: temporary files then are a crash's leftovers, removed at once (see
     * remove_strays); the lock is then held shared like everyone else's. */
    char lpath[PATH_MAX + 8];
    snprintf(lpath, sizeof(lpath), "%s/.lock", path);
    ts->dir_lock = open(lpath, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (ts->dir_lock >= 0) {
        ts->dir_alone = flock(ts->dir_lock, LOCK_EX | LOCK_NB) == 0;
        if (flock(ts->dir_lock, LOCK_SH) != 0) {
            close(ts->dir_lock);
            ts->dir_lock = -1;
            ts->dir_alone = false;
        }
    }
    pthread_mutex_unlock(&ts->dir_mu);
    log_info("index snapshots in %s%s", path,
             ts->dir_alone ? "" : " (shared with another engramd)");
    return true;
}

/* Writes the snapshot path of tenant id into buf. Returns false while the directory is
 * not known (or not usable). */
bool tn_snap_path(tenants *ts, int64_t id, char *buf, size_t len)
{
    pthread_mutex_lock(&ts->dir_mu);
    bool ok = ts->dir != NULL;
    if (ok)
        snprintf(buf, len, "%s/%lld.idx", ts->dir, (long long)id);
    pthread_mutex_unlock(&ts->dir_mu);
    return ok;
}

/* The tags a snapshot's metadata points to travel in its extra bytes (host byte order, as
 * the snapshot itself), followed by what the index was built as:
 *   "ENGTAGS2", i64 wall-clock ms of the save, u64 record count, then per memory
 *   u64 id, u64 seq (the change that last wrote it), u32 ntags, u32 0, ntags u64 hashes;
 *   then the identity: u32 engine (VINDEX_ENGINE_*), u32 0, u64 FNV-1a hash of the FAISS
 *   factory string (0 for the native engine), "ENGSNID1".
 * A snapshot is only used for an index of the same identity: one written by another
 * engine, or by FAISS from another factory, may hold structures that do not fit the index
 * asked for, and is rebuilt from the database instead. The identity ends the file (vindex
 * stores the extra bytes last), so a load can tell from its last bytes, before reading the
 * snapshot, that it will not fit; the check after the checksummed load is the one that
 * counts. Snapshots of earlier versions ("ENGTAGS1", no identity) were all native. */

/* The identity of an index created with vo. */
snap_id tn_snap_id_of(const vindex_opts *vo)
{
    snap_id id = {.engine = (uint32_t)vo->engine};
    if (vo->engine == VINDEX_ENGINE_FAISS) {
        const char *f = vo->faiss_factory ? vo->faiss_factory : "";
        id.factory = hash_fnv1a(f, strlen(f));
    }
    return id;
}

static void snap_id_put(unsigned char out[SNAPID_LEN], const snap_id *id)
{
    uint32_t zero = 0;
    memcpy(out, &id->engine, 4);
    memcpy(out + 4, &zero, 4);
    memcpy(out + 8, &id->factory, 8);
    memcpy(out + 16, SNAPID_MAGIC, 8);
}

/* Reads an identity from the last SNAPID_LEN bytes p. Returns false when they are none. */
static bool snap_id_get(const unsigned char *p, snap_id *id)
{
    if (memcmp(p + 16, SNAPID_MAGIC, 8) != 0)
        return false;
    memcpy(&id->engine, p, 4);
    memcpy(&id->factory, p + 8, 8);
    return true;
}

/* Splits a snapshot's extra bytes into the tag records' part (*rec_len bytes from the
 * start) and the identity. Returns false when they are not in a known format. */
bool tn_snap_extra_split(const unsigned char *x, size_t xlen, size_t *rec_len, snap_id *id)
{
    if (!x || xlen < TAGS_HEADER)
        return false;
    if (memcmp(x, TAGS_MAGIC_V1, 8) == 0) {
        *id = (snap_id){.engine = VINDEX_ENGINE_NATIVE};
        *rec_len = xlen;
        return true;
    }
    if (memcmp(x, TAGS_MAGIC, 8) != 0 || xlen < TAGS_HEADER + SNAPID_LEN ||
        !snap_id_get(x + xlen - SNAPID_LEN, id))
        return false;
    *rec_len = xlen - SNAPID_LEN;
    return true;
}

const char *tn_snap_id_name(const snap_id *id)
{
    return id->engine == VINDEX_ENGINE_FAISS    ? "the faiss engine"
           : id->engine == VINDEX_ENGINE_NATIVE ? "the native engine"
                                                : "an unknown engine";
}

/* Tells, from the last bytes of the file at path and without reading the rest, whether it
 * was written for another identity than want (a hint: false when it cannot tell). */
bool tn_snap_file_other(const char *path, const snap_id *want, snap_id *got)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return false;
    struct stat sb;
    unsigned char tail[SNAPID_LEN];
    bool other = fstat(fd, &sb) == 0 && sb.st_size >= SNAPID_LEN &&
                 pread(fd, tail, SNAPID_LEN, sb.st_size - SNAPID_LEN) == SNAPID_LEN &&
                 snap_id_get(tail, got) &&
                 (got->engine != want->engine || got->factory != want->factory);
    close(fd);
    return other;
}

typedef struct tagbuf {
    unsigned char *p;
    size_t n, cap;
    uint64_t count;
} tagbuf;

static int tagbuf_put(tagbuf *b, const void *data, size_t len)
{
    if (b->n + len > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->n + len)
            cap *= 2;
        unsigned char *p = realloc(b->p, cap);
        if (!p)
            return -ENOMEM;
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, data, len);
    b->n += len;
    return 0;
}

static int tags_record(uint64_t id, const float *vec, const void *meta, void *arg)
{
    tagbuf *b = arg;
    const mem_meta *m = meta;
    uint32_t rec[2] = {m->ntags, 0};
    b->count++;
    if (tagbuf_put(b, &id, 8) || tagbuf_put(b, &m->seq, 8) || tagbuf_put(b, rec, 8) ||
        (m->ntags && tagbuf_put(b, m->tags, m->ntags * sizeof(uint64_t))))
        return 1;
    return 0;
}

/* Serializes every memory's tags and the index's identity. Call with t->mu held (no change
 * can move them). On success the caller owns *out (free). Returns 0 or -ENOMEM. */
static int tags_build(tenant *t, unsigned char **out, size_t *len)
{
    tagbuf b = {0};
    int64_t now = server_now_ms();
    uint64_t zero = 0;
    vindex_opts vo;
    tn_index_opts(t, &vo);
    snap_id sid = tn_snap_id_of(&vo);
    unsigned char idb[SNAPID_LEN];
    snap_id_put(idb, &sid);
    if (tagbuf_put(&b, TAGS_MAGIC, 8) || tagbuf_put(&b, &now, 8) || tagbuf_put(&b, &zero, 8) ||
        vindex_foreach(t->vi, tags_record, &b) != 0 || tagbuf_put(&b, idb, SNAPID_LEN)) {
        free(b.p);
        return -ENOMEM;
    }
    memcpy(b.p + 16, &b.count, 8);
    *out = b.p;
    *len = b.n;
    return 0;
}

typedef struct tagfix {
    idmap *at; /* id -> offset of its record */
    const unsigned char *x;
    uint64_t upto; /* the snapshot's change number */
    uint64_t *drop;
    size_t ndrop, cdrop;
    bool bad;
} tagfix;

/* Points one loaded memory's metadata at a fresh copy of its tags (vindex_update_meta
 * callback). Memories written after the snapshot's change number are set aside: their
 * tags may be newer than the record, and the replay brings them back. */
static void tags_fix_one(uint64_t id, void *meta, void *arg)
{
    tagfix *tf = arg;
    mem_meta *m = meta;
    uint32_t want = m->ntags;
    m->tags = NULL; /* the saved pointer means nothing in this process */
    m->ntags = 0;
    if (m->seq > tf->upto) {
        if (tf->ndrop == tf->cdrop) {
            size_t cap = tf->cdrop ? tf->cdrop * 2 : 16;
            uint64_t *d = realloc(tf->drop, cap * sizeof(*d));
            if (!d) {
                tf->bad = true;
                return;
            }
            tf->drop = d;
            tf->cdrop = cap;
        }
        tf->drop[tf->ndrop++] = id;
        return;
    }
    uint64_t off, seq;
    uint32_t ntags;
    if (!tf->at || !idmap_get(tf->at, id, &off)) {
        tf->bad = true;
        return;
    }
    memcpy(&seq, tf->x + off + 8, 8);
    memcpy(&ntags, tf->x + off + 16, 4);
    if (seq != m->seq || ntags != want) {
        tf->bad = true;
        return;
    }
    if (!ntags)
        return;
    uint64_t *tags = malloc(ntags * sizeof(*tags));
    if (!tags) {
        tf->bad = true;
        return;
    }
    memcpy(tags, tf->x + off + TAGS_RECORD, ntags * sizeof(*tags));
    m->tags = tags;
    m->ntags = (uint16_t)ntags;
}

static int collect_id(uint64_t id, const float *vec, const void *meta, void *arg)
{
    tagbuf *b = arg;
    return tagbuf_put(b, &id, sizeof(id)) ? 1 : 0;
}

/* Restores the tags of a loaded snapshot from the tag records x (xlen bytes: the extra bytes
 * without the identity) and removes the memories written after its change number upto. Returns 0;
 * -EBADMSG when the extra bytes do not describe the snapshot's memories (every entry's tags are
 * valid or NULL: free them with the index); or -ENOMEM when memory ran out before any entry was
 * touched (the tags pointers are the saved ones: destroy the index without freeing them). */
int tn_tags_restore(vindex *vi, const unsigned char *x, size_t xlen, uint64_t upto)
{
    tagfix tf = {.x = x, .upto = upto};
    tagbuf ids = {0};
    int rc = -1;
    uint64_t count;
    if (!x || xlen < TAGS_HEADER ||
        (memcmp(x, TAGS_MAGIC, 8) != 0 && memcmp(x, TAGS_MAGIC_V1, 8) != 0))
        goto fail;
    memcpy(&count, x + 16, 8);
    if (count > (xlen - TAGS_HEADER) / TAGS_RECORD)
        goto fail;
    tf.at = idmap_create((size_t)count + 16);
    if (!tf.at)
        goto fail;
    size_t off = TAGS_HEADER;
    for (uint64_t i = 0; i < count; i++) {
        uint64_t id;
        uint32_t ntags;
        if (xlen - off < TAGS_RECORD)
            goto fail;
        memcpy(&id, x + off, 8);
        memcpy(&ntags, x + off + 16, 4);
        if ((xlen - off - TAGS_RECORD) / sizeof(uint64_t) < ntags || idmap_get(tf.at, id, NULL) ||
            idmap_put(tf.at, id, off) < 0)
            goto fail;
        off += TAGS_RECORD + (size_t)ntags * sizeof(uint64_t);
    }
    if (off != xlen)
        goto fail;
    rc = 0;
fail:
    /* every entry's tags pointer is reset, even when the records are unusable */
    if (vindex_foreach(vi, collect_id, &ids) != 0) {
        idmap_destroy(tf.at);
        free(ids.p);
        return -ENOMEM;
    }
    if (rc < 0)
        tf.bad = true;
    vindex_update_meta(vi, (const uint64_t *)(const void *)ids.p, ids.n / sizeof(uint64_t),
                       tags_fix_one, &tf);
    for (size_t i = 0; i < tf.ndrop; i++)
        vindex_remove(vi, tf.drop[i]); /* their tags are NULL already */
    idmap_destroy(tf.at);
    free(tf.drop);
    free(ids.p);
    return tf.bad ? -EBADMSG : 0;
}

/* ---- snapshots, maintenance and eviction ---------------------------------------------- */

/* Writes t's snapshot when it is loaded and changed since the last one. Call without
 * t->mu, holding a reference. Returns 1 when written, 0 when there was nothing to do, -EIO
 * on failure (logged; retried later). */
int tn_save_snapshot(tenant *t)
{
    tenants *ts = t->ts;
    char path[PATH_MAX];
    if (!tn_snap_path(ts, t->id, path, sizeof(path)))
        return 0;
    pthread_mutex_lock(&t->mu);
    if (t->state != T_READY || t->saving || t->dead || !t->dirty) {
        pthread_mutex_unlock(&t->mu);
        return 0;
    }
    /* the tags are copied with the change number every change up to which is in the
     * index; vindex_save may catch later changes too, which the load sets aside */
    uint64_t upto = t->applied;
    unsigned char *x = NULL;
    size_t xlen = 0;
    if (tags_build(t, &x, &xlen) < 0) {
        pthread_mutex_unlock(&t->mu);
        log_warn("tenant %lld: snapshot skipped: out of memory", (long long)t->id);
        return -EIO;
    }
    t->saving = true;
    t->dirty = false;
    vindex *vi = t->vi; /* stays: eviction needs saving false */
    pthread_mutex_unlock(&t->mu);
    uint64_t t0 = server_mono_ns();
    int rc = vindex_save_extra(vi, path, upto, x, xlen);
    free(x);
    pthread_mutex_lock(&t->mu);
    t->saving = false;
    if (rc == 0) {
        t->saved_seq = upto;
        t->saved_mono_ns = server_mono_ns();
    } else {
        t->dirty = true;
    }
    bool dead = t->dead;
    pthread_mutex_unlock(&t->mu);
    if (dead) {
        unlink(path);
        return 0;
    }
    if (rc != 0) {
        log_warn("tenant %lld: cannot write snapshot %s: %s", (long long)t->id, path,
                 strerror(-rc));
        return -EIO;
    }
    tn_drop_cold_rows(vi); /* the rows now read from the file just written: still in RAM */
    atomic_fetch_add(&ts->n_snapshots, 1);
    log_debug("tenant %lld: snapshot at change %llu written in %.1f ms", (long long)t->id,
              (unsigned long long)upto, (double)(server_mono_ns() - t0) / 1e6);
    return 1;
}
