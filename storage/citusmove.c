/* storage/citusmove.c: moving one tenant to a Citus worker (see citusmove.h). */
#include "citusmove.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pgsync.h"

/* The tenant's shard of tenants, whether it holds that tenant alone, and its worker. */
typedef struct placement {
    int64_t shard;
    bool alone;
    char host[256];
    int port;
} placement;

static int where(PGconn *c, const char *tid, placement *p, char *err, size_t errlen)
{
    const char *v[] = {tid};
    PGresult *r = pgsync_exec(c,
                              "SELECT s.shardid, s.shardminvalue = s.shardmaxvalue, n.nodename, "
                              "n.nodeport FROM pg_dist_shard s JOIN pg_dist_placement pl USING "
                              "(shardid) JOIN pg_dist_node n ON n.groupid = pl.groupid WHERE "
                              "n.noderole = 'primary' AND s.shardid = "
                              "get_shard_id_for_distribution_column('tenants', $1::bigint)",
                              1, v, err, errlen);
    if (!r)
        return -EIO;
    if (PQntuples(r) != 1) {
        snprintf(err, errlen, "the tenant's shard has %d placements, not one", PQntuples(r));
        PQclear(r);
        return -EIO;
    }
    p->shard = strtoll(PQgetvalue(r, 0, 0), NULL, 10);
    p->alone = PQgetvalue(r, 0, 1)[0] == 't';
    snprintf(p->host, sizeof(p->host), "%s", PQgetvalue(r, 0, 2));
    p->port = atoi(PQgetvalue(r, 0, 3));
    PQclear(r);
    return 0;
}

/* 1 when the query's one row says true, 0 when false or no row, -EIO on failure. */
static int ask(PGconn *c, const char *sql, int n, const char *const *v, char *err, size_t errlen)
{
    PGresult *r = pgsync_exec(c, sql, n, v, err, errlen);
    if (!r)
        return -EIO;
    int yes = PQntuples(r) == 1 && PQgetvalue(r, 0, 0)[0] == 't';
    PQclear(r);
    return yes;
}

/* Isolates the tenant tid (now in shard) into a shard group of its own, under the split
 * fence (citusmove.h). The split blocks writes to the group while it copies it: Citus' online
 * split ('force_logical') failed here when the tenants row of a tenant in the group was
 * updated meanwhile (its decoder sent the new shard's rows without their replica identity:
 * "publisher did not send replica identity column expected by the logical replication
 * target relation"), and every store updates its tenant's row. */
static int split(PGconn *c, const char *tid, int64_t shard, char *err, size_t errlen)
{
    char cls[16], sh[24];
    snprintf(cls, sizeof(cls), "%d", CMOVE_FENCE_CLASS);
    snprintf(sh, sizeof(sh), "%lld", (long long)shard);
    const char *lv[] = {cls, sh};
    PGresult *r = pgsync_exec(c, "SELECT pg_advisory_lock($1::int, $2::int)", 2, lv, err, errlen);
    if (!r)
        return -EIO;
    PQclear(r);
    const char *tv[] = {tid};
    r = pgsync_exec(c,
                    "SELECT isolate_tenant_to_new_shard('tenants', $1::bigint, 'CASCADE', "
                    "shard_transfer_mode => 'block_writes')",
                    1, tv, err, errlen);
    int rc = r ? 0 : -EIO;
    PQclear(r);
    char e2[256];
    PGresult *u =
        pgsync_exec(c, "SELECT pg_advisory_unlock($1::int, $2::int)", 2, lv, e2, sizeof(e2));
    if (!u && rc == 0) {
        snprintf(err, errlen, "%s", e2);
        rc = -EIO;
    }
    PQclear(u);
    return rc;
}

int cmove_tenant(PGconn *c, int64_t tenant, const char *host, int port, bool isolate,
                 cmove_result *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof(*out));
    char tid[24], pt[16];
    snprintf(tid, sizeof(tid), "%lld", (long long)tenant);
    snprintf(pt, sizeof(pt), "%d", port);
    const char *nv[] = {host, pt};
    int rc = ask(c,
                 "SELECT true FROM pg_dist_node WHERE nodename = $1 AND nodeport = $2::int AND "
                 "isactive AND noderole = 'primary' AND groupid <> 0",
                 2, nv, err, errlen);
    if (rc <= 0) {
        if (rc == 0)
            snprintf(err, errlen, "%s:%d is not an active primary worker of this cluster", host,
                     port);
        return rc < 0 ? rc : -EINVAL;
    }
    const char *tv[] = {tid};
    rc = ask(c, "SELECT true FROM tenants WHERE id = $1::bigint", 1, tv, err, errlen);
    if (rc <= 0) {
        if (rc == 0)
            snprintf(err, errlen, "no tenant %lld", (long long)tenant);
        return rc < 0 ? rc : -ENOENT;
    }
    placement p;
    if ((rc = where(c, tid, &p, err, errlen)) < 0)
        return rc;
    snprintf(out->from, sizeof(out->from), "%s:%d", p.host, p.port);
    if (!p.alone && !isolate) {
        snprintf(err, errlen,
                 "tenant %lld shares its shard group with other tenants: moving it without "
                 "isolating it would move them too",
                 (long long)tenant);
        return -EINVAL;
    }
    if (!p.alone) {
        if ((rc = split(c, tid, p.shard, err, errlen)) < 0)
            return rc;
        out->split = true;
        if ((rc = where(c, tid, &p, err, errlen)) < 0)
            return rc;
    }
    if (strcmp(p.host, host) != 0 || p.port != port) {
        char shard[24], from_port[16];
        snprintf(shard, sizeof(shard), "%lld", (long long)p.shard);
        snprintf(from_port, sizeof(from_port), "%d", p.port);
        const char *mv[] = {shard, p.host, from_port, host, pt};
        PGresult *r = pgsync_exec(c,
                                  "SELECT citus_move_shard_placement($1::bigint, $2, $3::int, "
                                  "$4, $5::int, shard_transfer_mode => 'force_logical')",
                                  5, mv, err, errlen);
        if (!r)
            return -EIO;
        PQclear(r);
        out->moved = true;
        if ((rc = where(c, tid, &p, err, errlen)) < 0)
            return rc;
    }
    out->shard_id = p.shard;
    snprintf(out->to, sizeof(out->to), "%s:%d", p.host, p.port);
    return 0;
}
