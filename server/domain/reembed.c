/* server/domain/reembed.c: online re-embedding of a tenant (see reembed.h). */
#include "reembed.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bg.h"
#include "embedder.h"
#include "log.h"
#include "memrow.h"
#include "pgsync.h"
#include "sql_bg.h"
#include "tenancy.h"
#include "ubuf.h"

/* The advisory lock keys of re-embedding jobs: apart from consolidation's (1 << 60). */
#define LOCK_BASE (2LL << 60)
/* Tenants looked at per look, and the time one may hold a thread per look. */
#define DUE_LIMIT "8"
#define SLICE_NS 2000000000ull

static atomic_uint_fast64_t n_vectors, n_failures, n_swaps;

/* bg_exec of statement s of sql_bg.h with the array v, for job j (failures logged). */
#define BG_EXEC(j, s, v) bg_exec((j)->ctx, sqlb_def(s), (v), DB_ARRAY_LEN(v), "re-embedding")

void reembed_get_metrics(reembed_metrics *m)
{
    m->vectors = atomic_load(&n_vectors);
    m->failures = atomic_load(&n_failures);
    m->swaps = atomic_load(&n_swaps);
}

/* One tenant's job as the due query gave it. */
typedef struct job {
    server *s;
    bg_ctx *ctx;
    int64_t tenant;
    char tid[24];
    char provider[16];
    uint32_t dim;
} job;

/* Records a failed batch and its backoff: reembed_retry_min_ms doubling up to
 * reembed_retry_max_ms, and at least what the provider asked for (a Retry-After in the
 * embedder's message, up to an hour). */
static void failed(job *j, const char *why)
{
    const config *c = &j->s->cfg;
    long lo_ms = c->reembed_retry_min_ms, hi_ms = c->reembed_retry_max_ms;
    const char *ra = strstr(why, "Retry-After: ");
    long asked = ra ? strtol(ra + 13, NULL, 10) : 0;
    if (asked > 0) {
        asked = (asked > 3600 ? 3600 : asked) * 1000;
        lo_ms = asked > lo_ms ? asked : lo_ms;
        hi_ms = asked > hi_ms ? asked : hi_ms;
    }
    char lo[24], hi[24];
    snprintf(lo, sizeof(lo), "%ld", lo_ms);
    snprintf(hi, sizeof(hi), "%ld", hi_ms);
    const char *v[] = {j->tid, why, lo, hi};
    PGresult *r = BG_EXEC(j, SQLB_REEMBED_FAIL, v);
    atomic_fetch_add(&n_failures, 1);
    log_warn("tenant %lld: re-embedding paused %s ms: %s", (long long)j->tenant,
             r && PQntuples(r) == 1 ? PQgetvalue(r, 0, 0) : "?", why);
    PQclear(r);
}

/* Appends a PostgreSQL array element of bytea text ("\x..." as PQgetvalue gives it). */
static int put_bytea_elem(ubuf *b, bool first, const char *text)
{
    /* in an array literal the backslash of \x is escaped */
    int rc = ubuf_puts(b, first ? "\"\\" : ",\"\\");
    rc = rc < 0 ? rc : ubuf_puts(b, text);
    return rc < 0 ? rc : ubuf_putc(b, '"');
}

/* Embeds the rows of todo (id, content, hash) and writes their side vectors. Returns the
 * vectors written (0: the job is gone), or -1 after a failure (recorded, or a database
 * error logged). */
static long long embed_batch(job *j, PGresult *todo)
{
    static const char hex[] = "0123456789abcdef";
    size_t n = (size_t)PQntuples(todo);
    const char **texts = calloc(n, sizeof(*texts));
    const char **whats = calloc(n, sizeof(*whats));
    size_t *lens = calloc(n, sizeof(*lens));
    float **outs = calloc(n, sizeof(*outs));
    float *vecs = calloc(n * j->dim, sizeof(float));
    ubuf ids = {0}, hashes = {0}, emb = {0};
    long long written = -1;
    char err[512];
    if (!texts || !whats || !lens || !outs || !vecs)
        goto out;
    for (size_t i = 0; i < n; i++) {
        texts[i] = PQgetvalue(todo, (int)i, 1);
        lens[i] = (size_t)PQgetlength(todo, (int)i, 1);
        whats[i] = "content";
        outs[i] = vecs + i * j->dim;
    }
    int code =
        embedder_run_sync(j->provider, j->dim, texts, lens, outs, whats, n, err, sizeof(err));
    if (code != RPC_OK) {
        failed(j, err);
        goto out;
    }
    int rc = ubuf_putc(&ids, '{');
    rc = rc < 0 ? rc : ubuf_putc(&hashes, '{');
    rc = rc < 0 ? rc : ubuf_puts(&emb, "\\x");
    for (size_t i = 0; i < n && rc == 0; i++) {
        rc = ubuf_printf(&ids, "%s%s", i ? "," : "", PQgetvalue(todo, (int)i, 0));
        rc = rc < 0 ? rc : put_bytea_elem(&hashes, i == 0, PQgetvalue(todo, (int)i, 2));
        const unsigned char *v = (const unsigned char *)outs[i];
        for (size_t b = 0; b < j->dim * sizeof(float) && rc == 0; b++)
            rc = ubuf_putc(&emb, hex[v[b] >> 4]) < 0 || ubuf_putc(&emb, hex[v[b] & 15]) < 0
                     ? -ENOMEM
                     : 0;
    }
    rc = rc < 0 ? rc : ubuf_putc(&ids, '}');
    rc = rc < 0 ? rc : ubuf_putc(&hashes, '}');
    if (rc < 0)
        goto out;
    char dim[16];
    snprintf(dim, sizeof(dim), "%u", j->dim);
    const char *v[] = {j->tid, dim, ids.data, hashes.data, emb.data};
    PGresult *r = BG_EXEC(j, SQLB_REEMBED_PUT, v);
    if (!r)
        goto out;
    written = strtoll(PQgetvalue(r, 0, 0), NULL, 10);
    PQclear(r);
    atomic_fetch_add(&n_vectors, (uint64_t)written);
out:
    ubuf_fini(&ids);
    ubuf_fini(&hashes);
    ubuf_fini(&emb);
    free(texts);
    free(whats);
    free(lens);
    free(outs);
    free(vecs);
    return written;
}

/* Tries the swap: returns true when it was made, false when not (vectors are missing: the
 * job's cursor went back to the first memory; the job is gone; the database failed,
 * logged). */
static bool try_swap(job *j)
{
    const char *v[] = {j->tid};
    PGresult *r = BG_EXEC(j, SQLB_REEMBED_SWAP, v);
    bool swapped = r && PQntuples(r) == 1 && !PQgetisnull(r, 0, 0);
    if (swapped) {
        int64_t gen = memrow_i64(r, 0, 0, 0);
        atomic_fetch_add(&n_swaps, 1);
        log_info("tenant %lld: re-embedding done: now %s at dimension %u (generation %lld)",
                 (long long)j->tenant, j->provider, j->dim, (long long)gen);
        /* this process at once; the others by NOTIFY engram_admin */
        tenancy_embedding_changed(j->s->tenancy, j->tenant, gen, j->provider, j->dim, true);
    }
    PQclear(r);
    return swapped;
}

/* Works on one tenant's job for at most SLICE_NS, when no other process does. */
static void work(job *j)
{
    char key[32], batch[16];
    snprintf(key, sizeof(key), "%lld", (long long)(LOCK_BASE + j->tenant));
    snprintf(batch, sizeof(batch), "%d", j->s->cfg.reembed_batch);
    const char *kv[] = {key};
    PGresult *r = BG_EXEC(j, SQLB_TRY_LOCK, kv);
    bool locked = r && strcmp(PQgetvalue(r, 0, 0), "t") == 0;
    PQclear(r);
    if (!locked)
        return; /* another process works on it (or the database failed: next look) */
    uint64_t until = server_mono_ns() + SLICE_NS;
    bool refused = false; /* the last swap found vectors missing behind the cursor */
    while (!bg_cancelled(j->ctx) && server_mono_ns() < until) {
        const char *v[] = {j->tid, batch};
        PGresult *todo = BG_EXEC(j, SQLB_REEMBED_TODO, v);
        if (!todo)
            break;
        int n = PQntuples(todo);
        long long got = n > 0 ? embed_batch(j, todo) : 0;
        PQclear(todo);
        if (n == 0 && !refused && !try_swap(j)) {
            refused = true; /* once more from the first memory (none left: the job is gone) */
            continue;
        }
        if (got <= 0)
            break; /* swapped, gone, failed, or nothing found after a refused swap */
        refused = false;
    }
    /* a connection that broke meanwhile took the lock with it (bg_exec dropped it) */
    PQclear(BG_EXEC(j, SQLB_UNLOCK, kv));
}

/* The periodic look: the jobs that may run now, each in turn. */
static void look(bg_ctx *ctx, void *arg)
{
    server *s = arg;
    const char *v[] = {DUE_LIMIT};
    PGresult *due = bg_exec(ctx, sqlb_def(SQLB_REEMBED_DUE), v, 1, "re-embedding");
    if (!due)
        return;
    for (int i = 0; i < PQntuples(due) && !bg_cancelled(ctx); i++) {
        job j = {.s = s, .ctx = ctx, .tenant = memrow_i64(due, i, 0, 0)};
        int64_t dim = memrow_i64(due, i, 3, 0);
        const char *provider = PQgetvalue(due, i, 1);
        if (j.tenant <= 0 || dim <= 0 || dim > UINT32_MAX || !embedder_available(provider))
            continue; /* another engramd with that provider configured takes it */
        j.dim = (uint32_t)dim;
        snprintf(j.tid, sizeof(j.tid), "%lld", (long long)j.tenant);
        snprintf(j.provider, sizeof(j.provider), "%s", provider);
        work(&j);
    }
    PQclear(due);
}

int reembed_start(server *s)
{
    return bg_every(s->bg, (unsigned)s->cfg.reembed_interval_ms, look, s);
}
