/* server/methods/m_move.c: admin.tenant.move, a tenant moved to another Citus worker.
 *
 * The move (storage/citusmove.h) runs for seconds to minutes, so it runs on a background
 * thread with a connection of its own as the DSN's user (Citus lets only the tables' owner
 * or a superuser split and move shards: the server role of pg_role is not used), outside
 * any transaction, and the answer is sent when it is done. Stores, searches and sessions of
 * the tenant go on meanwhile: the split that isolates the tenant makes the writes of the
 * tenants sharing its shard group wait for its copy (citusmove.h), the move itself copies
 * by logical replication and blocks writes only for the final switch. The indexes of every
 * engramd stay right: the rows, their ids and the tenant's change numbers move unchanged.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bg.h"
#include "citusmap.h"
#include "citusmove.h"
#include "handlers.h"
#include "log.h"
#include "pgsync.h"
#include "worker.h"

enum { P_TM_TENANT_ID, P_TM_NODE, P_TM_ISOLATE };
PARAMS(admin_tenant_move, {"tenant_id", RPC_T_UINT, RPC_P_REQUIRED, 0, 0},
       {"node", RPC_T_STR, RPC_P_REQUIRED | RPC_P_RANGE, 3, 300},
       {"isolate", RPC_T_BOOL, RPC_P_NULLABLE, 0, 0});

typedef struct move_job {
    req *r;
    worker *w;
    int64_t tenant;
    char host[256];
    int port;
    bool isolate;
    int rc; /* cmove_tenant's, or -ECONNREFUSED: no connection; -ESHUTDOWN: stopping */
    uint64_t ms;
    cmove_result res;
    char err[512];
} move_job;

static void move_reply(void *arg)
{
    move_job *j = arg;
    req *r = j->r;
    if (j->rc == -ENOENT) {
        req_fail(r, RPC_NOT_FOUND, "%s", j->err);
    } else if (j->rc == -EINVAL) {
        req_fail(r, RPC_INVALID_ARGUMENT, "%s", j->err);
    } else if (j->rc < 0) {
        req_fail(r, RPC_UNAVAILABLE, "the move of tenant %lld did not complete: %s",
                 (long long)j->tenant, j->err);
    } else {
        msgpack_packer *pk = req_result(r);
        msgpack_pack_map(pk, 7);
        rpc_pack_kv_int(pk, "tenant_id", j->tenant);
        rpc_pack_kv_int(pk, "shard_id", j->res.shard_id);
        rpc_pack_kv_str(pk, "from", j->res.from);
        rpc_pack_kv_str(pk, "node", j->res.to);
        rpc_pack_kv_bool(pk, "isolated", j->res.split);
        rpc_pack_kv_bool(pk, "moved", j->res.moved);
        rpc_pack_kv_int(pk, "duration_ms", (int64_t)j->ms);
        req_done(r);
    }
    free(j);
}

static void move_on_bg(bg_ctx *ctx, void *arg)
{
    move_job *j = arg;
    const config *cfg = &req_server(j->r)->cfg;
    uint64_t t0 = server_mono_ns();
    PGconn *c = NULL;
    if (bg_cancelled(ctx)) {
        j->rc = -ESHUTDOWN;
        snprintf(j->err, sizeof(j->err), "server shutting down");
    } else if (!(c = pgsync_connect(cfg->pg_dsn, NULL, (unsigned)cfg->db_queue_timeout_ms, j->err,
                                    sizeof(j->err)))) {
        j->rc = -ECONNREFUSED;
    } else {
        /* the server's statement and lock timeouts are for requests, not for a move */
        PGresult *r = pgsync_exec(c, "SET statement_timeout = 0", 0, NULL, j->err, sizeof(j->err));
        j->rc = r ? cmove_tenant(c, j->tenant, j->host, j->port, j->isolate, &j->res, j->err,
                                 sizeof(j->err))
                  : -EIO;
        PQclear(r);
        /* this process's store groups see the new placement at once (the others' at their
         * next read: citusmap.h); a failure leaves the listener's next read to it */
        char perr[256];
        if (j->rc == 0 && req_server(j->r)->placements &&
            cmap_load(req_server(j->r)->placements, c, perr, sizeof(perr)) == -EIO)
            log_warn("tenant %lld moved; its placement is read again later: %s",
                     (long long)j->tenant, perr);
        PQfinish(c);
    }
    j->ms = (server_mono_ns() - t0) / 1000000u;
    if (j->rc == 0)
        log_info("tenant %lld moved to %s (from %s, shard %lld, isolated now: %s) in %llu ms",
                 (long long)j->tenant, j->res.to, j->res.from, (long long)j->res.shard_id,
                 j->res.split ? "yes" : "no", (unsigned long long)j->ms);
    else
        log_warn("tenant %lld: move to %s:%d failed: %s", (long long)j->tenant, j->host, j->port,
                 j->err);
    if (worker_post(j->w, move_reply, j) < 0)
        log_error("cannot deliver a tenant move's result (out of memory)");
}

/* Splits "host:port" (the last colon: an IPv6 address keeps its own) into j. */
static int node_arg(req *r, move_job *j)
{
    char *node = req_strdup(r, req_arg(r, P_TM_NODE));
    if (!node) {
        req_fail(r, RPC_INTERNAL, "out of memory");
        return -1;
    }
    char *colon = strrchr(node, ':');
    char *end = NULL;
    long port = colon ? strtol(colon + 1, &end, 10) : 0;
    if (!colon || colon == node || (size_t)(colon - node) >= sizeof(j->host) || !end ||
        *end != '\0' || end == colon + 1 || port < 1 || port > 65535) {
        req_fail(r, RPC_INVALID_ARGUMENT,
                 "node must be a worker's host:port as pg_dist_node names it (e.g. "
                 "10.0.0.5:5432)");
        return -1;
    }
    *colon = '\0';
    snprintf(j->host, sizeof(j->host), "%s", node);
    j->port = (int)port;
    return 0;
}

void h_admin_tenant_move(req *r)
{
    server *s = req_server(r);
    if (!s->on_citus) {
        req_fail(r, RPC_INVALID_ARGUMENT,
                 "this server's database is not a Citus cluster: there is no other node to move "
                 "a tenant to");
        return;
    }
    move_job *j = calloc(1, sizeof(*j));
    if (!j) {
        req_fail(r, RPC_INTERNAL, "out of memory");
        return;
    }
    if (node_arg(r, j) < 0) {
        free(j);
        return;
    }
    uint64_t tid = rpc_get_uint(req_arg(r, P_TM_TENANT_ID), 0);
    if (tid == 0 || tid > INT64_MAX) {
        free(j);
        req_fail(r, RPC_INVALID_ARGUMENT, "tenant_id must be a tenant's id");
        return;
    }
    j->r = r;
    j->w = req_worker(r);
    j->tenant = (int64_t)tid;
    j->isolate = rpc_get_bool(req_arg(r, P_TM_ISOLATE), true);
    if (bg_submit(s->bg, move_on_bg, j) < 0) {
        free(j);
        req_fail(r, RPC_UNAVAILABLE, "server shutting down");
    }
}
