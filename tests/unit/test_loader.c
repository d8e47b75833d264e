/* tests/unit/test_loader.c: storage/loader against a throwaway database (pgtest.h), read
 * as engram_app through row-level security, as the server's background threads read it.
 *
 * Every memory of a tenant arrives with each field as stored (the pending access counts
 * added) and none of another tenant's; the change number is the snapshot's; changes
 * arrive in order, a deleted memory as no row; live memories in id order without the
 * archived and the expired; a missing tenant is -ENOENT, a row that does not parse
 * -EBADMSG (and counted), a broken connection -EIO, an impossible allocation -ENOMEM; a
 * callback's value, positive or negative, comes back unchanged and stops the stream, with
 * the connection left ready for the next call.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <libpq-fe.h>

#include "check.h"
#include "loader.h"
#include "memrow.h"
#include "migrate.h"
#include "pgsync.h"
#include "pgtest.h"
#include "rowerr.h"

#define DIM 3

static PGconn *own; /* the schema's owner: writes the rows (bypassing row-level security) */
static PGconn *app; /* engram_app, as the server reads */

/* Inserts memory id of tenant with embedding v (n floats), importance 0.5 (0.25 for id 2),
 * created at id seconds, and the given extra columns and values (SQL text, may be ""), e.g.
 * ", pinned" / ", true". */
static void put_memory(int64_t tenant, uint64_t id, const float *v, size_t n, uint64_t seq,
                       const char *type, const char *cols, const char *vals)
{
    char hex[2 * 64 * sizeof(float) + 1] = "";
    const unsigned char *b = (const unsigned char *)v; /* little-endian, as stored */
    for (size_t i = 0; i < n * sizeof(float) && i < 64 * sizeof(float); i++)
        snprintf(hex + 2 * i, 3, "%02x", b[i]);
    char sql[2048];
    snprintf(sql, sizeof(sql),
             "INSERT INTO memories (tenant_id, id, type, content, content_tsv, importance, "
             "embedding, created_at, updated_at, seq%s) VALUES (%lld, %llu, '%s', 'memory %llu', "
             "to_tsvector('english', 'memory %llu'), %g, '\\x%s', engram_ts(%llu), "
             "engram_ts(%llu), %llu%s)",
             cols, (long long)tenant, (unsigned long long)id, type, (unsigned long long)id,
             (unsigned long long)id, id == 2 ? 0.25 : 0.5, hex, (unsigned long long)(1000 * id),
             (unsigned long long)(1000 * id + 1), (unsigned long long)seq, vals);
    pgtest_exec(own, sql);
}

static void put_change(int64_t tenant, uint64_t seq, uint64_t id)
{
    char sql[200];
    snprintf(sql, sizeof(sql),
             "INSERT INTO memory_changes (tenant_id, seq, memory_id, op) VALUES (%lld, %llu, "
             "%llu, 'u')",
             (long long)tenant, (unsigned long long)seq, (unsigned long long)id);
    pgtest_exec(own, sql);
}

/* Tenant 1: four memories of every kind (two live, one archived, one expired) and a change
 * log that also names a memory since deleted (9). Tenant 2: a memory with tenant 1's id 1,
 * never to be seen through tenant 1. Tenant 3: a memory whose embedding is two floats. Tenant
 * 4: no memories. */
static void fill(void)
{
    pgtest_exec(own, "INSERT INTO tenants (id, name, tier, embed_dim, change_seq, index_engine) "
                     "VALUES (1, 'one', 'free', 3, 6, 'faiss'), (2, 'two', 'free', 3, 1, NULL), "
                     "(3, 'three', 'free', 3, 2, NULL), (4, 'four', 'free', 3, 0, NULL)");
    const float v1[] = {1, 2, 3}, v2[] = {4, 5, 6}, v3[] = {7, 8, 9}, v4[] = {10, 11, 12};
    put_memory(1, 1, v1, DIM, 1, "fact",
               ", agent_id, clade_id, access_count, cited_count, injected_count, metadata",
               ", 11, 21, 2, 4, 5, '{\"tokens\": [\"ETH\"], \"strategy_id\": \"s1\"}'");
    put_memory(1, 2, v2, DIM, 3, "preference",
               ", scope, pinned, access_count, last_accessed_at, archived_at",
               ", 'clade', true, 1, engram_ts(5000), engram_ts(7000)");
    put_memory(1, 3, v3, DIM, 4, "episode", ", scope, expires_at", ", 'tenant', engram_ts(1000)");
    put_memory(1, 4, v4, DIM, 6, "constraint", ", metadata, expires_at",
               ", '{\"attrs\": {\"key\": \"k4\", \"n\": 1}}', now() + interval '1 day'");
    /* pending reads of memory 2, not folded yet: counted in */
    pgtest_exec(own, "INSERT INTO memory_access (tenant_id, id, access_count, last_accessed_at) "
                     "VALUES (1, 2, 3, engram_ts(6000))");
    put_change(1, 1, 1);
    put_change(1, 2, 9); /* deleted since */
    put_change(1, 3, 2);
    put_change(1, 4, 3);
    put_change(1, 5, 9);
    put_change(1, 6, 4);
    const float w[] = {100, 100, 100};
    put_memory(2, 1, w, DIM, 1, "fact", "", "");
    put_change(2, 1, 1);
    put_memory(3, 1, v1, DIM, 1, "fact", "", "");
    put_memory(3, 2, v2, 2, 2, "fact", "", ""); /* two floats in a tenant of three */
    put_change(3, 1, 1);
    put_change(3, 2, 2);
}

/* What the callbacks saw. */
typedef struct seen {
    int n;
    uint64_t ids[16];
    loader_row rows[16]; /* pointers are not kept: vec and tag_json are copied below */
    float vecs[16][DIM];
    char tags[16][128];
    char keys[16][16];
    char content[16][32];
    uint64_t seqs[16];
    bool null_row[16];
    int stop_at; /* return stop_rc on this call (1-based), 0: never */
    int stop_rc;
} seen;

static int take(const loader_row *row, void *arg)
{
    seen *s = arg;
    if (s->n < 16) {
        s->ids[s->n] = row->meta.id;
        s->rows[s->n] = *row;
        if (row->dim == DIM && row->vec)
            memcpy(s->vecs[s->n], row->vec, sizeof(s->vecs[0]));
        snprintf(s->tags[s->n], sizeof(s->tags[0]), "%.*s", (int)row->meta.tags_len,
                 row->meta.tags);
        snprintf(s->keys[s->n], sizeof(s->keys[0]), "%s", row->attrs_key ? row->attrs_key : "-");
        snprintf(s->content[s->n], sizeof(s->content[0]), "%.*s", (int)row->content_len,
                 row->content ? row->content : "");
    }
    s->n++;
    return s->n == s->stop_at ? s->stop_rc : 0;
}

static int take_change(uint64_t seq, uint64_t id, const loader_row *row, void *arg)
{
    seen *s = arg;
    if (s->n < 16) {
        s->seqs[s->n] = seq;
        s->null_row[s->n] = row == NULL;
    }
    /* ids[] records row->meta.id: a row of another memory than the change's fails the checks */
    return take(row ? row : &(loader_row){.meta = {.id = id}}, arg);
}

static int find(const seen *s, uint64_t id)
{
    for (int i = 0; i < s->n && i < 16; i++)
        if (s->ids[i] == id)
            return i;
    return -1;
}

static void test_tenant(void)
{
    char err[300] = "";
    seen s = {0};
    uint64_t seq = 0;
    int rc = loader_tenant(app, 1, DIM, &seq, take, &s, err, sizeof(err));
    CHECK_MSG(rc == 0, "%d %s", rc, err);
    CHECK(seq == 6);
    CHECK(s.n == 4); /* archived and expired too: the index holds them */
    int i = find(&s, 1);
    CHECK(i >= 0);
    if (i >= 0) {
        const loader_row *r = &s.rows[i];
        CHECK(r->meta.agent_id == 11 && r->meta.clade_id == 21);
        CHECK(r->meta.scope == SCOPE_AGENT && r->meta.type == MEM_FACT);
        CHECK(r->meta.importance == 0.5);
        CHECK(r->meta.created_ms == 1000);
        CHECK(r->meta.accessed_ms == MEMROW_NO_TIME);
        CHECK(r->meta.access_count == 2);
        CHECK(r->meta.expires_ms == MEMROW_NO_TIME && r->meta.archived_ms == MEMROW_NO_TIME);
        CHECK(r->meta.seq == 1 && !r->meta.pinned);
        CHECK(r->meta.cited_count == 4 && r->meta.injected_count == 5);
        CHECK(r->dim == DIM);
        CHECK(s.vecs[i][0] == 1 && s.vecs[i][1] == 2 && s.vecs[i][2] == 3);
        CHECK_STR_CONTAINS(s.tags[i], "[\"ETH\"]");
        CHECK_STR_CONTAINS(s.tags[i], "\"s1\"");
        CHECK(r->attrs_key == NULL && r->content == NULL); /* loader_live's only */
    }
    i = find(&s, 2);
    CHECK(i >= 0);
    if (i >= 0) {
        const loader_row *r = &s.rows[i];
        CHECK(r->meta.scope == SCOPE_CLADE && r->meta.type == MEM_PREFERENCE);
        CHECK(r->meta.importance == 0.25 && r->meta.pinned);
        CHECK(r->meta.access_count == 4);   /* 1 folded + 3 pending */
        CHECK(r->meta.accessed_ms == 6000); /* the later of the two */
        CHECK(r->meta.archived_ms == 7000);
        CHECK(s.vecs[i][0] == 4 && s.vecs[i][2] == 6);
    }
    i = find(&s, 3);
    CHECK(i >= 0 && s.rows[i].meta.expires_ms == 1000 && s.rows[i].meta.scope == SCOPE_TENANT);
    /* tenant 2's memory 1 (all 100s) never shows through tenant 1 */
    for (int k = 0; k < s.n && k < 16; k++)
        CHECK(s.vecs[k][0] != 100);

    /* tenant 2 sees its own only */
    seen s2 = {0};
    CHECK(loader_tenant(app, 2, DIM, &seq, take, &s2, err, sizeof(err)) == 0);
    CHECK(s2.n == 1 && seq == 1 && s2.vecs[0][0] == 100);

    /* an empty tenant: no rows, change 0 */
    seen s4 = {0};
    seq = 99;
    CHECK(loader_tenant(app, 4, DIM, &seq, take, &s4, err, sizeof(err)) == 0);
    CHECK(s4.n == 0 && seq == 0);
    CHECK(PQtransactionStatus(app) == PQTRANS_IDLE);
}

static void test_live(void)
{
    char err[300] = "";
    seen s = {0};
    uint64_t seq = 0;
    int rc = loader_live(app, 1, DIM, &seq, take, &s, err, sizeof(err));
    CHECK_MSG(rc == 0, "%d %s", rc, err);
    CHECK(seq == 6);
    /* not archived (2), not expired (3); in id order */
    CHECK(s.n == 2);
    CHECK(s.ids[0] == 1 && s.ids[1] == 4);
    CHECK(strcmp(s.keys[0], "-") == 0 && strcmp(s.keys[1], "k4") == 0);
    CHECK(strcmp(s.content[1], "memory 4") == 0);
    CHECK(s.rows[1].attrs_json != NULL); /* the pointer only: its text was valid then */
    CHECK(s.rows[0].attrs_json == NULL);
    CHECK(s.vecs[1][0] == 10 && s.vecs[1][2] == 12);
}

/* citus: the query form for a Citus cluster, which must stream the same changes here */
static void test_changes_form(bool citus)
{
    char err[300] = "";
    seen s = {0};
    uint64_t upto = 0;
    int rc = loader_changes(app, 1, DIM, citus, 1, &upto, take_change, &s, err, sizeof(err));
    CHECK_MSG(rc == 0, "%d %s", rc, err);
    CHECK(upto == 6);
    /* after change 1: 2..6 in order; memory 9 no longer exists */
    CHECK(s.n == 5);
    for (int i = 0; i < s.n && i < 5; i++)
        CHECK(s.seqs[i] == (uint64_t)i + 2);
    const uint64_t ids[] = {9, 2, 3, 9, 4};
    const bool gone[] = {true, false, false, true, false};
    for (int i = 0; i < 5; i++) {
        CHECK(s.ids[i] == ids[i]);
        CHECK(s.null_row[i] == gone[i]);
    }
    CHECK(s.rows[1].meta.access_count == 4 && s.vecs[1][1] == 5); /* memory 2 as it is now */

    /* caught up: nothing after 6 */
    seen none = {0};
    CHECK(loader_changes(app, 1, DIM, citus, 6, &upto, take_change, &none, err, sizeof(err)) == 0);
    CHECK(none.n == 0 && upto == 6);
    /* another tenant's log is not this one's */
    seen t2 = {0};
    CHECK(loader_changes(app, 2, DIM, citus, 0, &upto, take_change, &t2, err, sizeof(err)) == 0);
    CHECK(t2.n == 1 && upto == 1 && t2.vecs[0][0] == 100);
}

static void test_changes(void)
{
    test_changes_form(false);
    test_changes_form(true);
}

static void test_missing_tenant(void)
{
    char err[300] = "", out[16] = "x";
    seen s = {0};
    uint64_t seq = 0;
    CHECK(loader_tenant(app, 42, DIM, &seq, take, &s, err, sizeof(err)) == -ENOENT);
    CHECK_STR_CONTAINS(err, "tenant 42 not found");
    CHECK(loader_changes(app, 42, DIM, false, 0, &seq, take_change, &s, err, sizeof(err)) ==
          -ENOENT);
    CHECK(loader_live(app, 42, DIM, &seq, take, &s, err, sizeof(err)) == -ENOENT);
    CHECK(loader_index_engine(app, 42, out, sizeof(out), err, sizeof(err)) == -ENOENT);
    CHECK(s.n == 0);
    CHECK(PQtransactionStatus(app) == PQTRANS_IDLE);
}

static void test_bad_row(void)
{
    char err[300] = "";
    seen s = {0};
    uint64_t seq = 0;
    uint64_t before = rowerr_count(ROWERR_MEMORIES);
    int rc = loader_tenant(app, 3, DIM, &seq, take, &s, err, sizeof(err));
    CHECK_MSG(rc == -EBADMSG, "%d %s", rc, err);
    CHECK_STR_CONTAINS(err, "memory 2");
    CHECK(rowerr_count(ROWERR_MEMORIES) == before + 1);
    CHECK(find(&s, 2) < 0); /* the bad row never reaches the callback */
    /* the same row through the change log */
    seen c = {0};
    err[0] = '\0';
    rc = loader_changes(app, 3, DIM, false, 0, &seq, take_change, &c, err, sizeof(err));
    CHECK_MSG(rc == -EBADMSG, "%d %s", rc, err);
    CHECK_STR_CONTAINS(err, "memory 2");
    CHECK(c.n == 1 && c.seqs[0] == 1);
    /* ... and a dimension the tenant's rows do not have: every row is bad */
    seen d = {0};
    CHECK(loader_tenant(app, 1, DIM + 1, &seq, take, &d, err, sizeof(err)) == -EBADMSG);
    CHECK(d.n == 0);
    /* the connection is ready for the next load */
    CHECK(PQtransactionStatus(app) == PQTRANS_IDLE);
    seen ok = {0};
    CHECK(loader_tenant(app, 2, DIM, &seq, take, &ok, err, sizeof(err)) == 0 && ok.n == 1);
}

static int warm(const memrow *row, void *arg);

static void test_stop(void)
{
    char err[300] = "";
    uint64_t seq = 0;
    /* a positive stop at the second row: returned as is, no third call */
    seen s = {.stop_at = 2, .stop_rc = 7};
    CHECK(loader_tenant(app, 1, DIM, &seq, take, &s, err, sizeof(err)) == 7);
    CHECK(s.n == 2);
    /* a negative one (the caller's out of memory) too, unchanged, and with a reason in err
     * although the callback wrote none there */
    seen m = {.stop_at = 1, .stop_rc = -ENOMEM};
    snprintf(err, sizeof(err), "stale");
    CHECK(loader_live(app, 1, DIM, &seq, take, &m, err, sizeof(err)) == -ENOMEM);
    CHECK(m.n == 1);
    CHECK_STR_CONTAINS(err, strerror(ENOMEM));
    seen w = {.stop_at = 1, .stop_rc = -EPIPE};
    uint64_t last = 0;
    size_t n = 0;
    snprintf(err, sizeof(err), "stale");
    CHECK(loader_rows(app, 1, 0, 10, warm, &w, &last, &n, err, sizeof(err)) == -EPIPE);
    CHECK_STR_CONTAINS(err, strerror(EPIPE));
    seen c = {.stop_at = 3, .stop_rc = 1};
    CHECK(loader_changes(app, 1, DIM, false, 0, &seq, take_change, &c, err, sizeof(err)) == 1);
    CHECK(c.n == 3);
    /* the rest of each result was drained: the connection serves the next call */
    CHECK(PQtransactionStatus(app) == PQTRANS_IDLE);
    seen all = {0};
    CHECK(loader_tenant(app, 1, DIM, &seq, take, &all, err, sizeof(err)) == 0 && all.n == 4);
}

static int count_access(uint64_t id, int64_t count, int64_t last_ms, void *arg)
{
    seen *s = arg;
    if (s->n < 16) {
        s->ids[s->n] = id;
        s->rows[s->n].meta.access_count = count;
        s->rows[s->n].meta.accessed_ms = last_ms;
    }
    s->n++;
    return s->n == s->stop_at ? s->stop_rc : 0;
}

static int warm(const memrow *row, void *arg)
{
    seen *s = arg;
    if (s->n < 16) {
        s->ids[s->n] = row->id;
        s->seqs[s->n] = row->seq;
    }
    s->n++;
    return s->n == s->stop_at ? s->stop_rc : 0;
}

static void test_accessed_and_rows(void)
{
    char err[300] = "";
    /* read at or after 5000: memory 2 (its pending count too) */
    seen a = {0};
    CHECK(loader_accessed(app, 1, 5000, count_access, &a, err, sizeof(err)) == 0);
    CHECK(a.n == 1 && a.ids[0] == 2);
    CHECK(a.rows[0].meta.access_count == 4 && a.rows[0].meta.accessed_ms == 6000);
    CHECK(loader_accessed(app, 42, 0, count_access, &a, err, sizeof(err)) == -ENOENT);

    /* live rows newest first, a page at a time */
    seen r = {0};
    uint64_t last = 0;
    size_t n = 0;
    CHECK(loader_rows(app, 1, 0, 1, warm, &r, &last, &n, err, sizeof(err)) == 0);
    CHECK(n == 1 && r.ids[0] == 4 && last == 4 && r.seqs[0] == 6);
    CHECK(loader_rows(app, 1, last, 10, warm, &r, &last, &n, err, sizeof(err)) == 0);
    CHECK(n == 1 && r.ids[1] == 1 && last == 1);
    seen stop = {.stop_at = 1, .stop_rc = 3};
    CHECK(loader_rows(app, 1, 0, 10, warm, &stop, &last, &n, err, sizeof(err)) == 3);
    CHECK(PQtransactionStatus(app) == PQTRANS_IDLE);
}

static void test_engine_and_instance(void)
{
    char err[300] = "", out[16] = "x", inst[80] = "", want[80];
    CHECK(loader_index_engine(app, 1, out, sizeof(out), err, sizeof(err)) == 0);
    CHECK(strcmp(out, "faiss") == 0);
    CHECK(loader_index_engine(app, 2, out, sizeof(out), err, sizeof(err)) == 0);
    CHECK(out[0] == '\0');
    char tiny[3];
    CHECK(loader_index_engine(app, 1, tiny, sizeof(tiny), err, sizeof(err)) == -EBADMSG);
    int rc = loader_instance(app, inst, sizeof(inst), err, sizeof(err));
    CHECK_MSG(rc == 0, "%d %s", rc, err);
    pgtest_value(own,
                 "SELECT i.id || '-' || d.oid FROM engram_instance i, pg_database d WHERE "
                 "d.datname = current_database()",
                 want, sizeof(want));
    CHECK(strcmp(inst, want) == 0 && strlen(inst) > 33);
    CHECK(loader_instance(app, inst, 10, err, sizeof(err)) == -EBADMSG);
    pgtest_exec(own, "INSERT INTO engram_instance SELECT id FROM engram_instance");
    CHECK(loader_instance(app, inst, sizeof(inst), err, sizeof(err)) == -EBADMSG);
    CHECK_STR_CONTAINS(err, "engram_instance must hold one id");
    pgtest_exec(own, "DELETE FROM engram_instance WHERE ctid <> (SELECT min(ctid) FROM "
                     "engram_instance)");
}

static void test_out_of_memory(void)
{
    char err[300] = "";
    seen s = {0};
    uint64_t seq = 0;
    /* a scratch vector no allocator gives: refused before the database is asked */
    size_t dim = SIZE_MAX / sizeof(float) + 1;
    CHECK(loader_tenant(app, 1, dim, &seq, take, &s, err, sizeof(err)) == -ENOMEM);
    CHECK_STR_CONTAINS(err, "out of memory");
    CHECK(loader_changes(app, 1, dim, false, 0, &seq, take_change, &s, err, sizeof(err)) ==
          -ENOMEM);
    CHECK(loader_live(app, 1, dim, &seq, take, &s, err, sizeof(err)) == -ENOMEM);
    CHECK(s.n == 0);
}

/* A statement that fails midway through a load (here: engram_app may no longer read the
 * memories) is the database's failure, -EIO, and the transaction is gone after it. */
static void test_statement_error(void)
{
    char err[300] = "";
    seen s = {0};
    uint64_t seq = 0;
    pgtest_exec(own, "REVOKE SELECT ON memories FROM engram_app");
    CHECK(loader_tenant(app, 1, DIM, &seq, take, &s, err, sizeof(err)) == -EIO);
    CHECK_STR_CONTAINS(err, "permission denied");
    CHECK(loader_changes(app, 1, DIM, false, 0, &seq, take_change, &s, err, sizeof(err)) == -EIO);
    CHECK(s.n == 0);
    CHECK(PQtransactionStatus(app) == PQTRANS_IDLE);
    pgtest_exec(own, "GRANT SELECT ON memories TO engram_app");
    CHECK(loader_tenant(app, 1, DIM, &seq, take, &s, err, sizeof(err)) == 0 && s.n == 4);
}

static void test_broken_connection(const char *dsn)
{
    char err[300] = "", sql[80];
    PGconn *c = pgsync_connect(dsn, "engram_app", 5000, err, sizeof(err));
    CHECK_MSG(c != NULL, "%s", err);
    if (!c)
        return;
    snprintf(sql, sizeof(sql), "SELECT pg_terminate_backend(%d)", PQbackendPID(c));
    pgtest_exec(own, sql);
    seen s = {0};
    uint64_t seq = 0;
    err[0] = '\0';
    CHECK(loader_tenant(c, 1, DIM, &seq, take, &s, err, sizeof(err)) == -EIO);
    CHECK(err[0] != '\0');
    CHECK(loader_changes(c, 1, DIM, false, 0, &seq, take_change, &s, err, sizeof(err)) == -EIO);
    char out[16];
    CHECK(loader_index_engine(c, 1, out, sizeof(out), err, sizeof(err)) == -EIO);
    CHECK(loader_instance(c, out, sizeof(out), err, sizeof(err)) == -EIO);
    CHECK(s.n == 0);
    PQfinish(c);
}

int main(void)
{
    char dsn[512], err[300] = "";
    pgtest_create("loader", dsn, sizeof(dsn));
    own = pgsync_connect(dsn, NULL, 5000, err, sizeof(err));
    if (!own)
        pgtest_die("connecting to the test database", err);
    int rc = migrate_run(own, NULL, err, sizeof(err));
    if (rc < 0)
        pgtest_die("migrating the test database", err);
    fill();
    app = pgsync_connect(dsn, "engram_app", 5000, err, sizeof(err));
    if (!app)
        pgtest_die("connecting as engram_app", err);
    test_tenant();
    test_live();
    test_changes();
    test_missing_tenant();
    test_bad_row();
    test_stop();
    test_accessed_and_rows();
    test_engine_and_instance();
    test_out_of_memory();
    test_statement_error();
    test_broken_connection(dsn);
    PQfinish(app);
    PQfinish(own);
    pgtest_drop();
    CHECK_RETURN();
}
