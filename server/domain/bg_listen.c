/* server/domain/bg_listen.c: the change listener of bg.h.
 *
 * One thread LISTENs for engram_changes ("tenant:seq") and engram_admin on the configured
 * database and, every change_poll_ms, compares the loaded tenants' change numbers with the
 * database's (the backstop for announcements never sent). On Citus a function delegated to
 * a worker (a store, an update, an archive, a re-embedding's swap) sends its NOTIFY on that
 * worker, and one that runs on the coordinator (the admin functions) on the coordinator;
 * neither is relayed. So the listener also LISTENs on every other active primary node of
 * pg_dist_node (the workers when connected to the coordinator; the coordinator and the
 * other workers when connected to a worker), with the configured DSN's credentials and
 * options at that node's host and port. A node that cannot be reached
 * is tried again at each change check, whose catch-up covers what it announced meanwhile;
 * the listener is healthy while its connection to the configured database is.
 */
#include "bg_int.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "citusmap.h"
#include "db.h"
#include "log.h"
#include "pgsync.h"
#include "sql_bg.h"
#include "tenancy.h"
#include "tenants.h"

#define LISTEN_MAX_WORKERS 64

/* The listener's connections: [0] the configured database, then a Citus cluster's other
 * nodes (NULL while one cannot be reached). host and port name each, as pg_dist_node. */
typedef struct listen_set {
    size_t n;
    PGconn *c[1 + LISTEN_MAX_WORKERS];
    char host[1 + LISTEN_MAX_WORKERS][256];
    char port[1 + LISTEN_MAX_WORKERS][8];
} listen_set;

/* Parses "tenant:seq" and tells the registry. */
static void handle_notify(bg *b, const char *payload)
{
    long long tid = 0;
    unsigned long long seq = 0;
    if (sscanf(payload, "%lld:%llu", &tid, &seq) == 2)
        tenants_notify_change(b->srv->tenants, tid, seq);
}

/* Compares the loaded tenants' change numbers with PostgreSQL's (one query on the listener's
 * connection c) and has every index that lacks a committed change catch up: the backstop
 * for changes whose NOTIFY was never sent (store groups announce theirs after the commit,
 * gcommit.c; a process that died in between sent none). Returns false when the query
 * failed (the connection is then re-made). */
static bool check_change_seqs(bg *b, PGconn *c)
{
    int64_t *ids = NULL;
    size_t n = 0;
    if (tenants_loaded_ids(b->srv->tenants, &ids, &n) < 0 || n == 0)
        return true; /* out of memory: the next check tries again */
    char *lit = malloc(n * 21 + 3);
    if (!lit) {
        free(ids);
        return true;
    }
    size_t len = 0;
    lit[len++] = '{';
    for (size_t i = 0; i < n; i++)
        len += (size_t)sprintf(lit + len, "%s%lld", i ? "," : "", (long long)ids[i]);
    lit[len++] = '}';
    lit[len] = '\0';
    free(ids);
    const char *vals[1] = {lit};
    char err[256];
    PGresult *r = PGSYNC_EXEC(c, sqlb_def(SQLB_CHANGE_SEQS), vals, err, sizeof(err));
    free(lit);
    if (!r) {
        log_warn("change check failed: %s", err);
        return false;
    }
    for (int i = 0; i < PQntuples(r); i++) {
        long long tid = strtoll(PQgetvalue(r, i, 0), NULL, 10);
        unsigned long long seq = strtoull(PQgetvalue(r, i, 1), NULL, 10);
        tenants_notify_change(b->srv->tenants, tid, seq);
    }
    PQclear(r);
    return true;
}

/* Opens a connection to the configured database (host NULL) or to the node host:port of
 * the same database, and LISTENs on both channels. NULL with the reason in err. */
static PGconn *listen_conn(bg *b, const char *host, const char *port, char *err, size_t errlen)
{
    const config *cfg = &b->srv->cfg;
    PGconn *c = pgsync_connect_at(cfg->pg_dsn, host, port, cfg->pg_role[0] ? cfg->pg_role : NULL,
                                  (unsigned)cfg->db_queue_timeout_ms, err, errlen);
    if (!c)
        return NULL;
    PGresult *r = pgsync_exec_stmt(c, sqlb_def(SQLB_LISTEN_CHANGES), NULL, 0, err, errlen);
    if (r) {
        PQclear(r);
        r = pgsync_exec_stmt(c, sqlb_def(SQLB_LISTEN_ADMIN), NULL, 0, err, errlen);
    }
    if (!r) {
        PQfinish(c);
        return NULL;
    }
    PQclear(r);
    return c;
}

static void workers_close(listen_set *ls)
{
    for (size_t i = 1; i < ls->n; i++)
        PQfinish(ls->c[i]);
    ls->n = 1;
}

/* On Citus: reads the other nodes through the connection ls->c[0]. When the list
 * changed (a node added, removed or moved) every worker connection is remade; otherwise only
 * the missing ones are tried again. Returns false when the coordinator's query failed. */
static bool workers_refresh(bg *b, listen_set *ls)
{
    char err[256];
    PGresult *r =
        pgsync_exec_stmt(ls->c[0], sqlb_def(SQLB_CITUS_WORKERS), NULL, 0, err, sizeof(err));
    if (!r) {
        log_warn("change listener: cannot read the Citus nodes: %s", err);
        return false;
    }
    size_t n = (size_t)PQntuples(r);
    if (n > LISTEN_MAX_WORKERS) {
        log_warn("change listener: %zu other Citus nodes, listening on the first %d", n,
                 LISTEN_MAX_WORKERS);
        n = LISTEN_MAX_WORKERS;
    }
    bool same = ls->n == n + 1;
    for (size_t i = 0; same && i < n; i++)
        same = strcmp(ls->host[i + 1], PQgetvalue(r, (int)i, 0)) == 0 &&
               strcmp(ls->port[i + 1], PQgetvalue(r, (int)i, 1)) == 0;
    if (!same) {
        workers_close(ls);
        for (size_t i = 0; i < n; i++) {
            snprintf(ls->host[i + 1], sizeof(ls->host[0]), "%s", PQgetvalue(r, (int)i, 0));
            snprintf(ls->port[i + 1], sizeof(ls->port[0]), "%s", PQgetvalue(r, (int)i, 1));
            ls->c[i + 1] = NULL;
        }
        ls->n = n + 1;
    }
    PQclear(r);
    for (size_t i = 1; i < ls->n; i++) {
        if (ls->c[i] && PQstatus(ls->c[i]) == CONNECTION_OK)
            continue;
        PQfinish(ls->c[i]);
        ls->c[i] = listen_conn(b, ls->host[i], ls->port[i], err, sizeof(err));
        if (!ls->c[i])
            log_warn("change listener: Citus node %s:%s: %s", ls->host[i], ls->port[i], err);
        else
            log_info("change listener: following Citus node %s:%s", ls->host[i], ls->port[i]);
    }
    return true;
}

/* On Citus: reads the tenants' placements again (a move by any process or operator is seen
 * within change_poll_ms; until then a store group may hold tenants of two nodes, which
 * costs that group a two-phase commit, nothing else: citusmap.h). */
static void placements_refresh(bg *b, PGconn *c)
{
    char err[256] = "out of memory";
    if (cmap_load(b->srv->placements, c, err, sizeof(err)) < 0)
        log_warn("change listener: cannot read the tenants' Citus placements: %s", err);
}

/* Hands on what connection i received. Announcements of this process's own writes come back
 * on the configured database's connection only (a worker runs a delegated function under a
 * backend of its own), so only those are told apart. Returns false when the connection
 * broke. */
static bool drain(bg *b, listen_set *ls, size_t i)
{
    PGconn *c = ls->c[i];
    if (!c)
        return true;
    if (!PQconsumeInput(c) || PQstatus(c) != CONNECTION_OK)
        return false;
    PGnotify *nt;
    while ((nt = PQnotifies(c)) != NULL) {
        if (strcmp(nt->relname, "engram_admin") == 0)
            tenancy_notify(b->srv->tenancy, nt->extra);
        else if (i > 0 || !db_is_own_backend(nt->be_pid))
            handle_notify(b, nt->extra); /* a worker applies its own writes */
        PQfreemem(nt);
    }
    return true;
}

/* Waits on every connection until the coordinator's (or the configured database's)
 * connection breaks or the server stops, checking change numbers every change_poll_ms. */
static void listen_loop(bg *b, listen_set *ls)
{
    uint64_t poll_ms = (uint64_t)b->srv->cfg.change_poll_ms;
    uint64_t next_check = server_mono_ns() / 1000000u + poll_ms;
    while (!bg_stopping(b)) {
        struct pollfd pfd[2 + LISTEN_MAX_WORKERS];
        size_t np = 0;
        pfd[np++] = (struct pollfd){.fd = b->wake[0], .events = POLLIN};
        for (size_t i = 0; i < ls->n; i++)
            pfd[np++] = (struct pollfd){.fd = ls->c[i] ? PQsocket(ls->c[i]) : -1, .events = POLLIN};
        uint64_t now = server_mono_ns() / 1000000u;
        int wait = next_check <= now ? 0 : next_check - now > 1000 ? 1000 : (int)(next_check - now);
        int n = poll(pfd, (nfds_t)np, wait);
        if ((n < 0 && errno != EINTR) || pfd[0].revents)
            return;
        if (!drain(b, ls, 0))
            return;
        for (size_t i = 1; i < ls->n; i++)
            if (pfd[i + 1].revents && !drain(b, ls, i)) {
                log_warn("change listener: lost Citus node %s:%s: %s", ls->host[i], ls->port[i],
                         PQerrorMessage(ls->c[i]));
                PQfinish(ls->c[i]);
                ls->c[i] = NULL;
            }
        if (server_mono_ns() / 1000000u >= next_check) {
            if (!check_change_seqs(b, ls->c[0]))
                return;
            if (b->srv->on_citus && !workers_refresh(b, ls))
                return;
            if (b->srv->placements)
                placements_refresh(b, ls->c[0]);
            next_check = server_mono_ns() / 1000000u + poll_ms;
        }
    }
}

/* The listener: connects (with backoff) and listens; after each reconnection every loaded
 * index catches up, since notifications sent while it was away are lost. */
void *bg_listener_thread(void *arg)
{
    bg *b = arg;
    const config *cfg = &b->srv->cfg;
    unsigned backoff = 100;
    bool first = true;
    listen_set *ls = calloc(1, sizeof(*ls));
    if (!ls) {
        log_error("change listener: out of memory; indexes follow other processes' changes "
                  "only through their own catch-ups");
        return NULL;
    }
    while (!bg_stopping(b)) {
        char err[256];
        ls->c[0] = listen_conn(b, NULL, NULL, err, sizeof(err));
        ls->n = 1;
        if (ls->c[0] && b->srv->on_citus && !workers_refresh(b, ls)) {
            workers_close(ls);
            PQfinish(ls->c[0]);
            ls->c[0] = NULL;
        }
        if (!ls->c[0]) {
            struct pollfd pfd = {.fd = b->wake[0], .events = POLLIN};
            poll(&pfd, 1, (int)backoff);
            backoff = backoff * 2 > (unsigned)cfg->db_backoff_max_ms
                          ? (unsigned)cfg->db_backoff_max_ms
                          : backoff * 2;
            continue;
        }
        backoff = 100;
        atomic_store(&b->listener_ok, true);
        if (!first) {
            log_info("change listener reconnected; catching up loaded indexes");
            tenants_catch_up_all(b->srv->tenants);
        }
        first = false;
        listen_loop(b, ls);
        atomic_store(&b->listener_ok, false);
        if (!bg_stopping(b))
            log_warn("change listener lost its database connection: %s", PQerrorMessage(ls->c[0]));
        workers_close(ls);
        PQfinish(ls->c[0]);
        ls->c[0] = NULL;
    }
    free(ls);
    return NULL;
}
