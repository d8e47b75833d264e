/* tests/unit/test_memrow.c: storage/memrow and storage/rowerr: memory rows as PostgreSQL
 * returns them, without a database.
 *
 * libpq builds results without a connection (PQmakeEmptyPGresult, PQsetResultAttrs,
 * PQsetvalue): the rows below are what SQL_MEMROW_COLS and engram_memory_meta return, in
 * text format, written by hand. A value that does not parse must fail the row and be counted
 * and logged (rowerr), never read as 0.
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <libpq-fe.h>

#include "check.h"
#include "memrow.h"
#include "rowerr.h"

/* Column names as the statements return them (PQfname), for the messages. */
#define NCOLS 22 /* SQL_MEMROW_NCOLS */
static const char *const memrow_cols[NCOLS] = {
    "id",          "agent_id",      "clade_id",        "scope",         "type",
    "content",     "importance",    "metadata",        "engram_ms",     "engram_ms",
    "last_ms",     "access_count",  "engram_ms",       "engram_ms",     "version",
    "seq",         "pinned",        "archived_reason", "superseded_by", "merged_into",
    "cited_count", "injected_count"};

/* A valid row: an agent memory that was read once, pinned, archived as superseded. */
static const char *const good_row[NCOLS] = {
    "17",   "5",          "3",    "agent", "preference", "likes tea", "0.75", "{\"a\": 1}",
    "1000", "2000",       "3000", "4",     NULL,         "5000",      "2",    "99",
    "t",    "superseded", "18",   NULL,    "6",          "8"};

/* Makes a one-row text result with ncols columns named from names, values from vals
 * (NULL: SQL NULL). */
static PGresult *make_result(int ncols, const char *const *names, const char *const *vals)
{
    PGresult *r = PQmakeEmptyPGresult(NULL, PGRES_TUPLES_OK);
    PGresAttDesc att[32];
    memset(att, 0, sizeof(att));
    for (int i = 0; i < ncols; i++)
        att[i].name = (char *)names[i];
    if (!r || !PQsetResultAttrs(r, ncols, att))
        abort();
    for (int i = 0; i < ncols; i++)
        if (!PQsetvalue(r, 0, i, (char *)vals[i], vals[i] ? (int)strlen(vals[i]) : -1))
            abort();
    return r;
}

/* Log lines the rowerr hook received. */
static char logged[16][300];
static int nlogged;

static void capture(const char *file, int line, const char *msg)
{
    if (nlogged < 16)
        snprintf(logged[nlogged], sizeof(logged[0]), "%s", msg);
    nlogged++;
}

static void test_parse_good(void)
{
    PGresult *r = make_result(NCOLS, memrow_cols, good_row);
    memrow m;
    uint64_t before = rowerr_count(ROWERR_MEMORIES);
    CHECK(memrow_parse(r, 0, 0, &m) == 0);
    CHECK(m.id == 17 && m.agent_id == 5 && m.clade_id == 3);
    CHECK(m.scope == SCOPE_AGENT && m.type == MEM_PREFERENCE);
    CHECK(m.content_len == 9 && memcmp(m.content, "likes tea", 9) == 0);
    CHECK(m.importance == 0.75);
    CHECK(m.metadata_len == 8 && memcmp(m.metadata_json, "{\"a\": 1}", 8) == 0);
    CHECK(m.created_ms == 1000 && m.updated_ms == 2000 && m.last_accessed_ms == 3000);
    CHECK(m.access_count == 4);
    CHECK(m.expires_ms == MEMROW_NO_TIME); /* NULL: never expires */
    CHECK(m.archived_ms == 5000 && m.version == 2 && m.seq == 99 && m.pinned);
    CHECK(m.archived_reason && strcmp(m.archived_reason, "superseded") == 0);
    CHECK(m.superseded_by == 18 && m.merged_into == 0); /* NULL: none */
    CHECK(m.cited_count == 6 && m.injected_count == 8);
    CHECK(rowerr_count(ROWERR_MEMORIES) == before);
    PQclear(r);

    /* the nullable columns at NULL give their documented defaults */
    const char *sparse[NCOLS];
    memcpy(sparse, good_row, sizeof(sparse));
    sparse[1] = sparse[2] = sparse[10] = sparse[12] = sparse[13] = NULL;
    sparse[14] = sparse[17] = sparse[18] = sparse[19] = NULL;
    sparse[16] = "f";
    r = make_result(NCOLS, memrow_cols, sparse);
    CHECK(memrow_parse(r, 0, 0, &m) == 0);
    CHECK(m.agent_id == 0 && m.clade_id == 0 && m.last_accessed_ms == MEMROW_NO_TIME);
    CHECK(m.expires_ms == MEMROW_NO_TIME && m.archived_ms == MEMROW_NO_TIME);
    CHECK(m.version == 1 && m.archived_reason == NULL && m.superseded_by == 0 && !m.pinned);
    PQclear(r);

    /* ids are unsigned 64-bit identities stored as the bigint of the same bits */
    const char *neg[NCOLS];
    memcpy(neg, good_row, sizeof(neg));
    neg[0] = "-1";
    r = make_result(NCOLS, memrow_cols, neg);
    CHECK(memrow_parse(r, 0, 0, &m) == 0 && m.id == UINT64_MAX);
    PQclear(r);

    /* the columns may start after others (col) */
    const char *shifted_names[NCOLS + 2] = {"x", "y"}, *shifted[NCOLS + 2] = {"a", "b"};
    for (int i = 0; i < NCOLS; i++) {
        shifted_names[i + 2] = memrow_cols[i];
        shifted[i + 2] = good_row[i];
    }
    r = make_result(NCOLS + 2, shifted_names, shifted);
    CHECK(memrow_parse(r, 0, 2, &m) == 0 && m.id == 17 && m.seq == 99);
    /* ... and a row or columns past the end are refused, not read */
    CHECK(memrow_parse(r, 1, 2, &m) == -EBADMSG);
    CHECK(memrow_parse(r, 0, 3, &m) == -EBADMSG);
    PQclear(r);
}

static void test_parse_bad(void)
{
    static const struct {
        int col;
        const char *value;
    } cases[] = {
        {0, "17x"},
        {0, ""},
        {1, "five"},
        {3, "planet"},
        {3, "Agent"},
        {4, "factoid"},
        {6, "high"},
        {6, "NaN"},
        {6, NULL},
        {8, "1e3"},
        {11, "9223372036854775808"}, /* past int64 */
        {14, "2.0"},
        {15, "0x63"},
        {16, "yes"},
        {16, NULL},
        {18, "eighteen"},
        {20, "six"},
        {21, "-"},
    };
    rowerr_set_log(capture);
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const char *vals[NCOLS];
        memcpy(vals, good_row, sizeof(vals));
        vals[cases[i].col] = cases[i].value;
        PGresult *r = make_result(NCOLS, memrow_cols, vals);
        uint64_t before = rowerr_count(ROWERR_MEMORIES);
        memrow m;
        CHECK_MSG(memrow_parse(r, 0, 0, &m) == -EBADMSG, "column %d = '%s' accepted", cases[i].col,
                  cases[i].value ? cases[i].value : "NULL");
        CHECK_MSG(rowerr_count(ROWERR_MEMORIES) == before + 1, "column %d counted %llu times",
                  cases[i].col, (unsigned long long)(rowerr_count(ROWERR_MEMORIES) - before));
        PQclear(r);
    }
    /* several bad columns in one row: one row, counted once */
    const char *vals[NCOLS];
    memcpy(vals, good_row, sizeof(vals));
    vals[0] = "x";
    vals[8] = "y";
    vals[15] = "z";
    PGresult *r = make_result(NCOLS, memrow_cols, vals);
    uint64_t before = rowerr_count(ROWERR_MEMORIES);
    memrow m;
    CHECK(memrow_parse(r, 0, 0, &m) == -EBADMSG);
    CHECK(rowerr_count(ROWERR_MEMORIES) == before + 1);
    PQclear(r);
    /* too few columns for the reader */
    r = make_result(NCOLS - 1, memrow_cols, good_row);
    before = rowerr_count(ROWERR_MEMORIES);
    CHECK(memrow_parse(r, 0, 0, &m) == -EBADMSG);
    CHECK(rowerr_count(ROWERR_MEMORIES) == before + 1);
    PQclear(r);
    rowerr_set_log(NULL);
}

static const char *const meta_cols[MEMROW_META_NCOLS] = {
    "m_id",         "m_seq",         "m_agent_id",   "m_clade_id",    "m_scope",
    "m_type",       "m_importance",  "m_created_ms", "m_accessed_ms", "m_access_count",
    "m_expires_ms", "m_archived_ms", "m_pinned",     "m_tags"};

static void test_meta(void)
{
    const char *vals[MEMROW_META_NCOLS] = {
        "8",    "41", "0", "2",    "clade", "fact", "1",
        "7000", NULL, "0", "9000", NULL,    "f",    "[[\"ETH\"], [1], null, null]"};
    PGresult *r = make_result(MEMROW_META_NCOLS, meta_cols, vals);
    memrow_meta mm;
    CHECK(memrow_meta_parse(r, 0, 0, &mm) == 0);
    CHECK(mm.present && mm.id == 8 && mm.seq == 41 && mm.agent_id == 0 && mm.clade_id == 2);
    CHECK(mm.scope == SCOPE_CLADE && mm.type == MEM_FACT && mm.importance == 1.0);
    CHECK(mm.created_ms == 7000 && mm.accessed_ms == MEMROW_NO_TIME && mm.access_count == 0);
    CHECK(mm.expires_ms == 9000 && mm.archived_ms == MEMROW_NO_TIME && !mm.pinned);
    /* the typed metadata fields as JSON, for the server to hash (memfilter) */
    CHECK(mm.tags_len == 26 && memcmp(mm.tags, "[[\"ETH\"], [1], null, null]", 26) == 0);
    PQclear(r);

    /* a NULL id: the memory is gone, which is not an error */
    const char *gone[MEMROW_META_NCOLS] = {NULL};
    r = make_result(MEMROW_META_NCOLS, meta_cols, gone);
    uint64_t before = rowerr_count(ROWERR_MEMORIES);
    CHECK(memrow_meta_parse(r, 0, 0, &mm) == 0 && !mm.present && mm.id == 0);
    CHECK(rowerr_count(ROWERR_MEMORIES) == before);
    PQclear(r);

    /* a bad value: refused and counted, whatever the column */
    for (int col = 0; col < MEMROW_META_NCOLS - 1; col++) {
        const char *bad[MEMROW_META_NCOLS];
        memcpy(bad, vals, sizeof(bad));
        bad[col] = "?";
        r = make_result(MEMROW_META_NCOLS, meta_cols, bad);
        before = rowerr_count(ROWERR_MEMORIES);
        CHECK_MSG(memrow_meta_parse(r, 0, 0, &mm) == -EBADMSG, "column %d accepted '?'", col);
        CHECK(rowerr_count(ROWERR_MEMORIES) == before + 1);
        PQclear(r);
    }
}

static void test_i64(void)
{
    const char *names[6] = {"a", "b", "c", "d", "e", "f"};
    const char *vals[6] = {"42", NULL, "-9223372036854775808", "4x", "", "12.5"};
    PGresult *r = make_result(6, names, vals);
    uint64_t other = rowerr_count(ROWERR_OTHER), keys = rowerr_count(ROWERR_API_KEYS);
    CHECK(memrow_i64(r, 0, 0, -1) == 42);
    CHECK(memrow_i64(r, 0, 1, -1) == -1); /* NULL: the default, not an error */
    CHECK(memrow_i64(r, 0, 2, 0) == INT64_MIN);
    CHECK(rowerr_count(ROWERR_OTHER) == other);
    /* not integers: the default, and counted */
    CHECK(memrow_i64(r, 0, 3, -7) == -7);
    CHECK(memrow_i64(r, 0, 4, -7) == -7);
    CHECK(rowerr_count(ROWERR_OTHER) == other + 2);
    /* counted under the table the caller names */
    CHECK(memrow_i64_of(r, 0, 5, 0, ROWERR_API_KEYS) == 0);
    CHECK(rowerr_count(ROWERR_API_KEYS) == keys + 1 && rowerr_count(ROWERR_OTHER) == other + 2);
    CHECK(memrow_f64_of(r, 0, 5, 0, ROWERR_API_KEYS) == 12.5);
    CHECK(memrow_f64_of(r, 0, 3, -1, ROWERR_API_KEYS) == -1);
    CHECK(rowerr_count(ROWERR_API_KEYS) == keys + 2);
    PQclear(r);

    int64_t v = 5;
    double d = 5;
    CHECK(memrow_parse_i64("9223372036854775807", &v) && v == INT64_MAX);
    CHECK(!memrow_parse_i64("9223372036854775808", &v) && v == INT64_MAX);
    CHECK(!memrow_parse_i64("12 ", &v) && !memrow_parse_i64("-", &v));
    CHECK(memrow_parse_f64("-0.25", &d) && d == -0.25);
    CHECK(memrow_parse_f64("1e-3", &d) && d == 1e-3);
    CHECK(!memrow_parse_f64("inf", &d) && !memrow_parse_f64("1e999", &d) &&
          !memrow_parse_f64("0.5.", &d));

    /* the bigint text of an unsigned identity reads back to the same bits */
    char buf[24];
    const uint64_t ids[] = {0, 1, INT64_MAX, (uint64_t)INT64_MAX + 1, UINT64_MAX};
    for (size_t i = 0; i < sizeof(ids) / sizeof(ids[0]); i++) {
        CHECK(memrow_parse_i64(memrow_u64_sql(ids[i], buf), &v) && (uint64_t)v == ids[i]);
    }
    CHECK(strcmp(memrow_u64_sql(UINT64_MAX, buf), "-1") == 0);
}

static void test_names(void)
{
    for (int t = 0; t < MEM_TYPE_COUNT; t++) {
        const char *n = memrow_type_name((mem_type)t);
        CHECK(memrow_type_parse(n, strlen(n)) == t);
    }
    for (int s = 0; s < SCOPE_COUNT; s++) {
        const char *n = memrow_scope_name((mem_scope)s);
        CHECK(memrow_scope_parse(n, strlen(n)) == s);
    }
    CHECK(strcmp(memrow_type_name(MEM_STRATEGY_OUTCOME), "strategy_outcome") == 0);
    CHECK(strcmp(memrow_type_name(MEM_TYPE_COUNT), "unknown") == 0);
    CHECK(strcmp(memrow_scope_name((mem_scope)-1), "unknown") == 0);
    CHECK(memrow_type_parse("fac", 3) == -1 && memrow_type_parse("facts", 5) == -1);
    CHECK(memrow_type_parse("fact", 3) == -1); /* n bounds the name */
    CHECK(memrow_scope_parse("tenant\0", 7) == -1);
}

/* The log: the first report of a table and column at once, repeats of it held back (one a
 * minute per table), the value never in the message. */
static void test_log(void)
{
    rowerr_set_log(capture);
    nlogged = 0;
    const char *names[2] = {"tenant_secret_col", "other_col"};
    const char *vals[2] = {"SECRET-VALUE-1", "SECRET-VALUE-2"};
    PGresult *r = make_result(2, names, vals);
    uint64_t before = rowerr_count(ROWERR_TENANTS);
    memrow_i64_of(r, 0, 0, 0, ROWERR_TENANTS);
    CHECK(nlogged == 1);
    CHECK_STR_CONTAINS(logged[0], "table tenants");
    CHECK_STR_CONTAINS(logged[0], "column tenant_secret_col");
    CHECK_STR_CONTAINS(logged[0], "not an integer");
    CHECK_STR_CONTAINS(logged[0], "engram_rows_unparsable_total");
    CHECK(strstr(logged[0], "SECRET-VALUE") == NULL);
    /* the same kind again: counted, not logged */
    for (int i = 0; i < 100; i++)
        memrow_i64_of(r, 0, 0, 0, ROWERR_TENANTS);
    CHECK_MSG(nlogged == 1, "%d lines", nlogged);
    /* another column is another kind: logged once */
    memrow_i64_of(r, 0, 1, 0, ROWERR_TENANTS);
    memrow_i64_of(r, 0, 1, 0, ROWERR_TENANTS);
    CHECK_MSG(nlogged == 2, "%d lines", nlogged);
    CHECK_STR_CONTAINS(logged[1], "column other_col");
    CHECK(strstr(logged[1], "SECRET-VALUE") == NULL);
    CHECK(rowerr_count(ROWERR_TENANTS) == before + 103);
    /* ... and the count so far is in the line: the 102nd report */
    char want[64];
    snprintf(want, sizeof(want), "(%llu such rows", (unsigned long long)(before + 102));
    CHECK_STR_CONTAINS(logged[1], want);
    PQclear(r);
    /* without a hook nothing is written, but everything is counted */
    rowerr_set_log(NULL);
    rowerr_report(ROWERR_MEMORY_CHANGES, "seq", "NULL");
    CHECK(nlogged == 2 && rowerr_count(ROWERR_MEMORY_CHANGES) >= 1);
    CHECK(strcmp(rowerr_table_name(ROWERR_MEMORY_CHANGES), "memory_changes") == 0);
    CHECK(strcmp(rowerr_table_name(ROWERR_TABLE_COUNT), "other") == 0);
}

int main(void)
{
    test_parse_good();
    test_parse_bad();
    test_meta();
    test_i64();
    test_names();
    test_log();
    CHECK_RETURN();
}
