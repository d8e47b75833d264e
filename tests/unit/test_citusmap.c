/* tests/unit/test_citusmap.c: storage/citusmap, which Citus node holds a tenant, against a
 * throwaway database (pgtest.h).
 *
 * The hash is PostgreSQL's own (compared with hashint8 on the server for values of every
 * kind); the map is loaded from tables shaped as Citus' pg_dist_shard and pg_dist_placement
 * (plain PostgreSQL has none, so the test database gets look-alikes that the query finds
 * through the search path) and answers for every tenant what a range join in SQL answers;
 * a failed load keeps the map it had; an empty map knows nothing.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <libpq-fe.h>

#include "check.h"
#include "citusmap.h"
#include "pgtest.h"

static int64_t next_value(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return (int64_t)*s;
}

static void test_hash(PGconn *c)
{
    /* the edges, values that fit an int4 and values that do not, both signs */
    char sql[64 * 1024];
    size_t n = (size_t)snprintf(sql, sizeof(sql),
                                "SELECT x, hashint8(x) FROM unnest(ARRAY[0, "
                                "1, -1, 2147483647, 2147483648, -2147483648, "
                                "-2147483649, 4294967295, 4294967296, "
                                "9223372036854775807, -9223372036854775808");
    uint64_t s = 88172645463325252ull;
    for (int i = 0; i < 1500; i++) {
        int64_t v = next_value(&s);
        if (i % 3 == 0)
            v %= 100000; /* tenant ids as they come */
        n += (size_t)snprintf(sql + n, sizeof(sql) - n, ", %" PRId64, v);
    }
    snprintf(sql + n, sizeof(sql) - n, "]::bigint[]) x");
    PGresult *r = pgtest_query(c, sql);
    int bad = 0;
    for (int i = 0; i < PQntuples(r); i++) {
        int64_t v = strtoll(PQgetvalue(r, i, 0), NULL, 10);
        int32_t want = (int32_t)strtol(PQgetvalue(r, i, 1), NULL, 10);
        if (cmap_hashint8(v) != want && bad++ < 5)
            fprintf(stderr, "hashint8(%" PRId64 ") = %d, ours %d\n", v, want, cmap_hashint8(v));
    }
    CHECK(PQntuples(r) == 1511);
    CHECK(bad == 0);
    PQclear(r);
}

static void test_map(PGconn *c)
{
    cmap *m = cmap_create();
    CHECK(m != NULL);
    CHECK(cmap_node(m, 7) == -1); /* never loaded */
    CHECK(cmap_node(NULL, 7) == -1);
    char err[256] = "";
    /* no such tables: an error, and the map stays empty */
    CHECK(cmap_load(m, c, err, sizeof(err)) == -EIO);
    CHECK(err[0] != '\0');
    CHECK(cmap_loads(m) == 0);

    /* four shards of a quarter of the hash range each on groups 1 and 2, and one tenant
     * (iso, the first whose hash is inside the second quarter) isolated into a shard of its
     * own (a range of one hash value) on group 3, whose neighbours' ranges end next to it;
     * one shard shows two placements (a move being finished): the first one stands */
    pgtest_exec(c, "CREATE TABLE tenants (id bigint PRIMARY KEY)");
    pgtest_exec(c, "CREATE TABLE pg_dist_shard (logicalrelid regclass, shardid bigint, "
                   "shardminvalue text, shardmaxvalue text)");
    pgtest_exec(c, "CREATE TABLE pg_dist_placement (placementid bigint, shardid bigint, "
                   "groupid int)");
    pgtest_exec(c, "CREATE TABLE other (id bigint)");
    char sql[1024];
    int64_t iso = 1;
    while (cmap_hashint8(iso) <= -1073741824 || cmap_hashint8(iso) >= -1)
        iso++;
    int32_t hiso = cmap_hashint8(iso);
    char v[64];
    snprintf(sql, sizeof(sql), "SELECT hashint8(%" PRId64 ")", iso);
    CHECK(hiso == atoi(pgtest_value(c, sql, v, sizeof(v))));
    snprintf(sql, sizeof(sql),
             "INSERT INTO pg_dist_shard VALUES "
             "('tenants', 1, '-2147483648', '-1073741825'), "
             "('tenants', 2, '-1073741824', '%d'), ('tenants', 5, '%d', '%d'), "
             "('tenants', 6, '%d', '-1'), "
             "('tenants', 3, '0', '1073741823'), ('tenants', 4, '1073741824', '2147483647'), "
             "('other', 9, '-2147483648', '2147483647')",
             hiso - 1, hiso, hiso, hiso + 1);
    pgtest_exec(c, sql);
    pgtest_exec(c, "INSERT INTO pg_dist_placement VALUES (10, 1, 1), (11, 2, 2), (12, 5, 3), "
                   "(13, 6, 2), (14, 3, 1), (15, 4, 2), (16, 4, 1), (17, 9, 7)");
    CHECK(cmap_load(m, c, err, sizeof(err)) == 6);
    CHECK(cmap_loads(m) == 1);
    CHECK(cmap_node(m, iso) == 3);

    /* every tenant 1..3000 where SQL puts it */
    PGresult *r = pgtest_query(
        c, "SELECT t, (SELECT p.groupid FROM pg_dist_shard s JOIN pg_dist_placement p USING "
           "(shardid) WHERE s.logicalrelid = 'tenants'::regclass AND hashint8(t) BETWEEN "
           "s.shardminvalue::int AND s.shardmaxvalue::int ORDER BY p.placementid LIMIT 1) "
           "FROM generate_series(1, 3000) t");
    int bad = 0, per[4] = {0};
    for (int i = 0; i < PQntuples(r); i++) {
        int64_t t = strtoll(PQgetvalue(r, i, 0), NULL, 10);
        int want = atoi(PQgetvalue(r, i, 1)), got = cmap_node(m, t);
        if (got != want && bad++ < 5)
            fprintf(stderr, "tenant %" PRId64 ": group %d, ours %d\n", t, want, got);
        if (want >= 0 && want < 4)
            per[want]++;
    }
    PQclear(r);
    CHECK(bad == 0);
    CHECK(per[1] > 1000 && per[2] > 1000 && per[3] == 1); /* both nodes, and iso */

    /* the move finished: shard 4 is on group 1 only now; a reload sees it */
    pgtest_exec(c, "DELETE FROM pg_dist_placement WHERE placementid = 15");
    int64_t in4 = -1;
    for (int64_t t = 1; t < 1000 && in4 < 0; t++)
        if (cmap_hashint8(t) >= 1073741824)
            in4 = t;
    CHECK(in4 > 0 && cmap_node(m, in4) == 2);
    CHECK(cmap_load(m, c, err, sizeof(err)) == 6);
    CHECK(cmap_node(m, in4) == 1);

    /* a failed load keeps the last map */
    pgtest_exec(c, "ALTER TABLE pg_dist_placement RENAME TO gone");
    CHECK(cmap_load(m, c, err, sizeof(err)) == -EIO);
    CHECK(cmap_node(m, iso) == 3 && cmap_loads(m) == 2);
    cmap_destroy(m);
}

int main(void)
{
    char dsn[1024];
    pgtest_create("citusmap", dsn, sizeof(dsn));
    PGconn *c = PQconnectdb(dsn);
    if (PQstatus(c) != CONNECTION_OK)
        pgtest_die("connecting", PQerrorMessage(c));
    test_hash(c);
    test_map(c);
    PQfinish(c);
    pgtest_drop();
    CHECK_RETURN();
}
