/* server/domain/access_writer.c: writing a worker's access counts to PostgreSQL (see
 * access.h). */
#include "access.h"

#include <errno.h>
#include <stdlib.h>

#include "log.h"
#include "server.h"
#include "sql.h"

#define ACCESS_MAX_PENDING 1000000

struct access_writer {
    access_log *log; /* not owned */
    db_pool *db;     /* not owned */
    unsigned idx;
    /* when the last write began (the writer's creation until then); flushed_once false
     * until the first, which goes at the first tick with counts, as for a writer that wrote
     * none for flush_ms. (last_flush_ms 0 for "never" held the first write back on machines
     * up for less than flush_ms: CLOCK_MONOTONIC starts near 0 at boot.) */
    uint64_t last_flush_ms;
    bool flushed_once;
    bool flushing;
};

typedef struct flush_ctx {
    access_writer *aw;
    access_entry *e;
    size_t n;
} flush_ctx;

access_writer *access_writer_create(access_log *l, db_pool *db, unsigned idx)
{
    access_writer *aw = calloc(1, sizeof(*aw));
    if (!aw)
        return NULL;
    aw->log = l;
    aw->db = db;
    aw->idx = idx;
    aw->last_flush_ms = server_mono_ns() / 1000000u;
    return aw;
}

void access_writer_destroy(access_writer *aw)
{
    free(aw);
}

bool access_writer_idle(const access_writer *aw)
{
    return !aw->flushing && access_log_count(aw->log) == 0;
}

static void on_flushed(void *arg, const db_result *res)
{
    flush_ctx *fc = arg;
    access_writer *aw = fc->aw;
    aw->flushing = false;
    if (res->status != DB_OK) {
        /* keep them for the next attempt, unless the backlog has grown absurd */
        if (access_log_count(aw->log) + fc->n < ACCESS_MAX_PENDING &&
            access_log_merge(aw->log, fc->e, fc->n) == 0)
            log_debug("worker %u: access counts not written yet: %s", aw->idx,
                      res->message ? res->message : "?");
        else
            log_warn("worker %u: dropped %zu access counts: %s", aw->idx, fc->n,
                     res->message ? res->message : "?");
    }
    free(fc->e);
    free(fc);
}

/* PostgreSQL's binary form of a one-dimensional bigint[] without NULLs (array_send): a header
 * of ndim, flags, element type, length and lower bound, then each element as a length and
 * its eight bytes, all in network order. */
#define INT8_ARRAY_OID 20u
#define BIN_ARRAY_HEAD 20u
#define BIN_ARRAY_ELEM 12u

static void put_be32(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)(v >> 24);
    p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8);
    p[3] = (unsigned char)v;
}

/* Writes the n values got(e[i]) as a binary bigint[] into a malloc'd buffer (*len its size;
 * the caller frees it), or returns NULL when out of memory. Binary, not a text literal: a
 * worker writes thousands of entries a second, and formatting and parsing them as decimal
 * held its event loop for milliseconds. */
static char *bin_array(size_t n, int64_t (*get)(const access_entry *e), const access_entry *e,
                       int *len)
{
    size_t bytes = BIN_ARRAY_HEAD + n * BIN_ARRAY_ELEM;
    if (n > INT32_MAX / BIN_ARRAY_ELEM - 1)
        return NULL;
    unsigned char *b = malloc(bytes);
    if (!b)
        return NULL;
    put_be32(b, 1);     /* ndim */
    put_be32(b + 4, 0); /* no NULLs */
    put_be32(b + 8, INT8_ARRAY_OID);
    put_be32(b + 12, (uint32_t)n);
    put_be32(b + 16, 1); /* lower bound */
    unsigned char *p = b + BIN_ARRAY_HEAD;
    for (size_t i = 0; i < n; i++, p += BIN_ARRAY_ELEM) {
        uint64_t v = (uint64_t)get(&e[i]);
        put_be32(p, 8);
        put_be32(p + 4, (uint32_t)(v >> 32));
        put_be32(p + 8, (uint32_t)v);
    }
    *len = (int)bytes;
    return (char *)b;
}

static int64_t get_tenant(const access_entry *e)
{
    return e->tenant;
}
static int64_t get_id(const access_entry *e)
{
    return (int64_t)e->id;
}
static int64_t get_count(const access_entry *e)
{
    return (int64_t)e->count;
}
static int64_t get_ms(const access_entry *e)
{
    return e->last_ms;
}

/* Writes the pending access counts in one statement. */
static void flush(access_writer *aw, uint64_t now_ms)
{
    if (aw->flushing || access_log_count(aw->log) == 0)
        return;
    flush_ctx *fc = calloc(1, sizeof(*fc));
    if (!fc || access_log_take(aw->log, &fc->e, &fc->n) < 0) {
        free(fc);
        return;
    }
    fc->aw = aw;
    int lens[4] = {0}, fmts[4] = {1, 1, 1, 1};
    char *vals[4] = {
        bin_array(fc->n, get_tenant, fc->e, &lens[0]), bin_array(fc->n, get_id, fc->e, &lens[1]),
        bin_array(fc->n, get_count, fc->e, &lens[2]), bin_array(fc->n, get_ms, fc->e, &lens[3])};
    int rc = -ENOMEM;
    if (vals[0] && vals[1] && vals[2] && vals[3]) {
        db_query q = {.stmt = sql_def(SQL_MEMORY_TOUCH),
                      .nvalues = 4,
                      .values = (const char *const *)vals,
                      .lengths = lens,
                      .formats = fmts};
        rc = db_submit(aw->db, -1, &q, 1, on_flushed, fc);
    }
    for (int i = 0; i < 4; i++)
        free(vals[i]);
    if (rc < 0) {
        access_log_merge(aw->log, fc->e, fc->n);
        free(fc->e);
        free(fc);
        return;
    }
    aw->flushing = true;
    aw->flushed_once = true;
    aw->last_flush_ms = now_ms;
}

void access_writer_tick(access_writer *aw, uint64_t now_ms, unsigned flush_ms, bool draining)
{
    if (!aw->flushed_once || now_ms - aw->last_flush_ms >= flush_ms || draining)
        flush(aw, now_ms);
}
