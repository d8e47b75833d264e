/* server/main.c: engramd: start-up, the accept loop, signals and graceful shutdown. */
#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cblas.h>
#include <event2/event.h>
#include <event2/listener.h>
#include <event2/thread.h>

#include "app.h"
#include "auth.h"
#include "bg.h"
#include "chat.h"
#include "citusmap.h"
#include "climits.h"
#include "autocompact.h"
#include "consolidate.h"
#include "dream.h"
#include "reembed.h"
#include "extract.h"
#include "db.h"
#include "pgsync.h"
#include "embedder.h"
#include "handlers.h"
#include "http.h"
#include "log.h"
#include "maint.h"
#include "methods.h"
#include "metrics.h"
#include "migrate.h"
#include "notify.h"
#include "server.h"
#include "sql.h"
#include "tenancy.h"
#include "rowcache.h"
#include "tenants.h"
#include "offload.h"
#include "plimits.h"
#include "tls.h"
#include "worker.h"

/* OpenBLAS's own setter (cblas.h of libopenblas declares it). */
void openblas_set_num_threads(int n);

#define STARTUP_DB_WAIT_MS 30000

/* One published set of tier limits (server.h: s->tiers, s->memory_limits, s->query_limits).
 * A SIGHUP reload publishes a new one; the older stay allocated, since a request may still
 * read them, and are freed at exit. */
typedef struct tier_snap {
    struct tier_snap *older;
    tier_limits tiers[TIER_COUNT];
    char memory_limits[160];
    char query_limits[80];
} tier_snap;

typedef struct proc {
    server srv;
    struct event_base *base;
    struct evconnlistener *listener;
    struct event *ev_relisten;
    struct event *ev_sigint, *ev_sigterm, *ev_sighup;
    struct event *ev_ready;    /* polls until the indexes are loaded, then READY=1 */
    struct event *ev_watchdog; /* WATCHDOG=1 pings when the unit sets WatchdogSec */
    struct event *ev_history;  /* a sample of the metrics' history every step */
    bool ready_sent;
    http_srv *http;
    unsigned next_worker;
    int argc; /* the serve command's settings, read again on SIGHUP */
    char **argv;
    config live; /* the reloadable settings in force after the last reload (have_live) */
    bool have_live;
    tier_snap *snaps; /* the newest first */
    char hostport[300];
    const char **names; /* the methods' names, for the metrics (method_names) */
} proc;

/* ---- accepting ------------------------------------------------------------------------- */

static void on_accept(struct evconnlistener *l, evutil_socket_t fd, struct sockaddr *addr, int len,
                      void *arg)
{
    proc *a = arg;
    worker_accept(&a->srv, fd, addr, &a->next_worker, false);
}

static void on_relisten(evutil_socket_t fd, short what, void *arg)
{
    proc *a = arg;
    if (a->listener && !atomic_load(&a->srv.draining))
        evconnlistener_enable(a->listener);
}

/* On EMFILE/ENFILE the listener would spin on the pending connection: pause it briefly. */
static void on_accept_error(struct evconnlistener *l, void *arg)
{
    proc *a = arg;
    int err = EVUTIL_SOCKET_ERROR();
    log_warn("accept failed: %s; pausing the listener for 100 ms", strerror(err));
    evconnlistener_disable(l);
    struct timeval tv = {.tv_sec = 0, .tv_usec = 100000};
    evtimer_add(a->ev_relisten, &tv);
}

/* ---- shutdown -------------------------------------------------------------------------- */

static void on_signal(evutil_socket_t sig, short what, void *arg)
{
    proc *a = arg;
    if (atomic_exchange(&a->srv.draining, true)) {
        log_warn("second signal: exiting without waiting");
        _exit(1);
    }
    log_info("received %s: finishing in-flight requests (up to %d ms)",
             sig == SIGINT ? "SIGINT" : "SIGTERM", a->srv.cfg.shutdown_timeout_ms);
    notify_stopping("finishing in-flight requests");
    if (a->listener)
        evconnlistener_disable(a->listener);
    http_stop_accepting(a->http);
    for (unsigned i = 0; i < a->srv.nworkers; i++)
        worker_drain(a->srv.workers[i]);
    event_base_loopexit(a->base, NULL);
}

/* Publishes the tier limits of cfg (s->tiers and the SQL literals). Returns 0 or -ENOMEM. */
static int publish_tiers(proc *a, const config *cfg)
{
    tier_snap *t = calloc(1, sizeof(*t));
    if (!t)
        return -ENOMEM;
    tiers_from_config(cfg, t->tiers);
    /* memory counts, then memory bytes (engram_tier_limit, engram_tier_byte_limit) */
    snprintf(t->memory_limits, sizeof(t->memory_limits), "{%lld,%lld,%lld,%lld,%lld,%lld}",
             (long long)t->tiers[0].max_memories, (long long)t->tiers[1].max_memories,
             (long long)t->tiers[2].max_memories, (long long)t->tiers[0].max_memory_bytes,
             (long long)t->tiers[1].max_memory_bytes, (long long)t->tiers[2].max_memory_bytes);
    snprintf(t->query_limits, sizeof(t->query_limits), "{%lld,%lld,%lld}",
             (long long)t->tiers[0].queries_per_day, (long long)t->tiers[1].queries_per_day,
             (long long)t->tiers[2].queries_per_day);
    t->older = a->snaps;
    a->snaps = t;
    atomic_store(&a->srv.tiers, t->tiers);
    atomic_store(&a->srv.memory_limits, t->memory_limits);
    atomic_store(&a->srv.query_limits, t->query_limits);
    return 0;
}

typedef struct reload_count {
    int changed, restart;
} reload_count;

/* A setting that needs a restart differs from the value engramd started with. */
static void on_restart_diff(const char *name, unsigned flags, const char *old_value,
                            const char *new_value, void *arg)
{
    reload_count *n = arg;
    if (flags & CONFIG_RELOAD)
        return;
    n->restart++;
    log_warn("reload: %s is now '%s' in the configuration but needs a restart; engramd keeps "
             "'%s' until then",
             name, new_value, old_value);
}

/* A reloadable setting differs from the value in force. */
static void on_reload_diff(const char *name, unsigned flags, const char *old_value,
                           const char *new_value, void *arg)
{
    reload_count *n = arg;
    if (!(flags & CONFIG_RELOAD))
        return;
    n->changed++;
    log_info("reload: %s = %s (was %s)", name, new_value, old_value);
}

/* Reads the configuration again (the same file, environment and flags as at start) and
 * applies the settings marked CONFIG_RELOAD: the log level, the maintenance and
 * consolidation intervals, the tier limits. Settings that need a restart are compared with
 * the running values and each change is logged as a warning. A configuration with an error
 * changes nothing. Main thread only. */
static void reload_config(proc *a, reload_count *n)
{
    server *s = &a->srv;
    config ncfg;
    bool exit_now = false;
    char *msg = NULL;
    size_t msglen = 0;
    FILE *errf = open_memstream(&msg, &msglen);
    if (!errf) {
        log_error("reload: out of memory; nothing changed");
        metrics_config_reload(false);
        return;
    }
    int rc = config_load(&ncfg, a->argc, a->argv, errf, errf, &exit_now);
    fclose(errf);
    if (rc < 0 || exit_now) {
        while (msglen > 0 && msg[msglen - 1] == '\n')
            msg[--msglen] = '\0';
        log_error("reload: the configuration has an error, nothing changed: %s",
                  msg && msg[0] ? msg : "(no message)");
        free(msg);
        config_free(&ncfg);
        metrics_config_reload(false);
        return;
    }
    free(msg);
    const config *cur = a->have_live ? &a->live : &s->cfg;
    config_diff(&s->cfg, &ncfg, on_restart_diff, n);
    config_diff(cur, &ncfg, on_reload_diff, n);
    if (publish_tiers(a, &ncfg) < 0) {
        log_error("reload: out of memory; nothing changed");
        config_free(&ncfg);
        metrics_config_reload(false);
        return;
    }
    log_set_level((log_level)log_parse_level(ncfg.log_level));
    log_set_format((log_format)log_parse_format(ncfg.log_format));
    if (ncfg.maintenance_interval_s != cur->maintenance_interval_s)
        maint_set_interval(s, ncfg.maintenance_interval_s);
    if (ncfg.consolidate_check_interval_s != cur->consolidate_check_interval_s)
        consolidate_set_interval(s, ncfg.consolidate_check_interval_s);
    if (a->have_live)
        config_free(&a->live);
    a->live = ncfg; /* takes the strings */
    a->have_live = true;
    metrics_config_reload(true);
}

/* SIGHUP re-reads the TLS certificate, key and CA files. New connections get the new
 * context, open ones keep theirs; a reload that fails keeps the current files in use. */
static void reload_tls(proc *a)
{
    char err[512], warn[512];
    if (!a->srv.tls)
        return;
    if (tls_reload(a->srv.tls, err, sizeof(err), warn, sizeof(warn)) < 0) {
        metrics_tls_reload(false);
        log_error("reload: TLS reload failed, still serving the previous certificate: %s", err);
        return;
    }
    metrics_tls_reload(true);
    if (warn[0])
        log_warn("TLS: %s", warn);
    log_info("reload: TLS certificate reloaded; new connections use it");
}

/* SIGHUP: the configuration (reload_config), then the TLS files, between RELOADING=1 and
 * READY=1 for the service manager (before the first READY=1, only a status). */
static void on_sighup(evutil_socket_t sig, short what, void *arg)
{
    proc *a = arg;
    if (a->ready_sent)
        notify_reloading();
    log_info("received SIGHUP: reloading the configuration%s",
             a->srv.tls ? " and the TLS files" : "");
    reload_count n = {0};
    reload_config(a, &n);
    reload_tls(a);
    char status[200];
    snprintf(status, sizeof(status),
             "serving; configuration reloaded: %d setting(s) changed, %d need a restart", n.changed,
             n.restart);
    log_info("reload done: %d setting(s) changed, %d changed setting(s) need a restart", n.changed,
             n.restart);
    if (a->ready_sent)
        notify_ready(status);
}

/* Polls every 100 ms from the moment engramd listens until the indexes are loaded, then
 * tells the service manager it is ready (READY=1) and stops. */
static void on_ready_check(evutil_socket_t fd, short what, void *arg)
{
    proc *a = arg;
    if (!tenants_preloaded(a->srv.tenants))
        return;
    event_del(a->ev_ready);
    a->ready_sent = true;
    char status[400];
    snprintf(status, sizeof(status), "serving: rpc %s, http %s:%d, indexes loaded", a->hostport,
             a->srv.cfg.listen_host, a->srv.cfg.http_port);
    notify_ready(status);
    log_info("indexes loaded; ready (notified the service manager: %s)",
             notify_enabled() && getenv("NOTIFY_SOCKET") ? "yes" : "no");
}

static void on_watchdog(evutil_socket_t fd, short what, void *arg)
{
    notify_watchdog();
}

/* Whether host (listen_host) is a loopback address, where plain TCP stays on the machine. */
static bool loopback_host(const char *host)
{
    return strncmp(host, "127.", 4) == 0 || strcmp(host, "::1") == 0 ||
           strcmp(host, "localhost") == 0;
}

/* ---- start-up helpers -------------------------------------------------------------------- */

static PGconn *connect_with_wait(const config *cfg)
{
    char err[512];
    uint64_t start = server_mono_ns();
    unsigned delay = 100;
    for (;;) {
        PGconn *c = pgsync_connect(cfg->pg_dsn, NULL, 5000, err, sizeof(err));
        if (c)
            return c;
        if (server_mono_ns() - start > (uint64_t)STARTUP_DB_WAIT_MS * 1000000u) {
            log_error("cannot connect to PostgreSQL: %s", err);
            return NULL;
        }
        log_warn("waiting for PostgreSQL: %s", err);
        struct timespec ts = {.tv_sec = delay / 1000, .tv_nsec = (long)(delay % 1000) * 1000000L};
        nanosleep(&ts, NULL);
        delay = delay * 2 > 2000 ? 2000 : delay * 2;
    }
}

static int ensure_dir(const char *path)
{
    if (mkdir(path, 0700) == 0 || errno == EEXIST)
        return 0;
    int e = errno;
    log_error("cannot create directory %s: %s", path, strerror(e));
    return -e;
}

/* engramd create-tenant NAME TIER KEY_FILE: creates the tenant (or a new key for an
 * existing one) and writes the key to KEY_FILE (mode 600), unless KEY_FILE exists. */
static int create_tenant_cmd(server *s, PGconn *c, const char *name, const char *tier,
                             const char *path)
{
    if (access(path, F_OK) == 0) {
        log_info("%s exists; tenant '%s' already has its key", path, name);
        return 0;
    }
    if (tier_parse(tier, strlen(tier)) < 0) {
        log_error("tier must be free, standard or premium, not '%s'", tier);
        return -EINVAL;
    }
    char key[AUTH_KEY_LEN + 1], key_id[AUTH_KEY_ID_LEN + 1], hex[65], dim[16], err[512];
    uint8_t hash[32];
    auth_new_key(key, key_id);
    auth_hash(s, key, AUTH_KEY_LEN, hash);
    auth_hash_hex(hash, hex);
    snprintf(dim, sizeof(dim), "%d", s->cfg.embed_dim);
    /* the functions admin.tenant.create and admin.key.create call: a new tenant with its
     * first key, or, when the name exists, a new key of that tenant */
    const char *tv[] = {name, tier, "builtin", "", dim, "bootstrap", key_id, hex, NULL};
    PGresult *r = PGSYNC_EXEC(c, sql_def(SQL_TENANT_CREATE), tv, err, sizeof(err));
    if (!r) {
        char e2[512];
        const char *kv[] = {NULL, name, "bootstrap", key_id, hex};
        r = PGSYNC_EXEC(c, sql_def(SQL_ADMIN_KEY_CREATE), kv, e2, sizeof(e2));
        if (!r) {
            log_error("cannot create tenant '%s': %s", name, err);
            return -EIO;
        }
    }
    long long tid = atoll(PQgetvalue(r, 0, 0));
    PQclear(r);
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0600);
    if (fd < 0) {
        int e = errno;
        log_error("cannot create %s: %s", path, strerror(e));
        return -e;
    }
    size_t n = strlen(key);
    bool ok = write(fd, key, n) == (ssize_t)n && write(fd, "\n", 1) == 1 && fsync(fd) == 0;
    close(fd);
    if (!ok) {
        log_error("cannot write %s", path);
        return -EIO;
    }
    log_info("tenant '%s' (id %lld, tier %s): API key written to %s", name, tid, tier, path);
    return 0;
}

static const char **method_names(void)
{
    const char **names = calloc(methods_count, sizeof(*names));
    for (size_t i = 0; names && i < methods_count; i++)
        names[i] = methods_table[i].name;
    return names;
}

/* ---- start-up and shutdown -------------------------------------------------------------- */

typedef enum { CMD_SERVE, CMD_MIGRATE, CMD_CREATE_TENANT } command;

/* The command line's command (serve, migrate, create-tenant NAME TIER KEY_FILE), taken off
 * argv so that the settings that follow parse alike. Returns 0, or 2 after printing usage. */
static int parse_command(int *argc, char ***argv, command *cmd, const char *ct[3])
{
    int shift = 0;
    *cmd = CMD_SERVE;
    if (*argc > 1 && strcmp((*argv)[1], "migrate") == 0) {
        *cmd = CMD_MIGRATE;
        shift = 1;
    } else if (*argc > 1 && strcmp((*argv)[1], "create-tenant") == 0) {
        if (*argc < 5) {
            fprintf(stderr, "usage: engramd create-tenant NAME TIER KEY_FILE [SETTINGS...]\n");
            return 2;
        }
        *cmd = CMD_CREATE_TENANT;
        for (int i = 0; i < 3; i++)
            ct[i] = (*argv)[2 + i];
        shift = 4;
    }
    (*argv)[shift] = (*argv)[0];
    *argc -= shift;
    *argv += shift;
    return 0;
}

/* The process-wide settings of the libraries engramd uses. */
static void setup_process(const config *cfg)
{
    /* A request's buffers can be megabytes (a store_batch of 1,000 memories of 768
     * dimensions: its vectors, their copy for the statement, the statement's parameters):
     * glibc would hand freed blocks that large back to the kernel and fault the pages in
     * again for the next request, which cost more than the copies themselves (a third of
     * engramd's CPU under store_batch). Blocks under 32 MiB come from the heap, and up to
     * 64 MiB of free memory at a heap's top is kept. */
    mallopt(M_MMAP_THRESHOLD, 32 << 20);
    mallopt(M_TRIM_THRESHOLD, 64 << 20);
    log_set_level((log_level)log_parse_level(cfg->log_level));
    log_set_format((log_format)log_parse_format(cfg->log_format));
    signal(SIGPIPE, SIG_IGN);
    /* SIGHUP reloads the configuration and the TLS files once serving; until then it must not
     * end the process */
    signal(SIGHUP, SIG_IGN);
    evthread_use_pthreads();
    log_route_libevent();
    log_route_storage();
    /* one BLAS thread per query; queries run in parallel across workers */
    openblas_set_num_threads(1);
}

/* The server secret, the admin key and (serving) the TLS context. Returns 0 or -1 (logged). */
static int load_keys(server *s, command cmd)
{
    char err[512];
    if (auth_init() < 0) {
        log_error("libsodium failed to initialize");
        return -1;
    }
    if (ensure_dir(s->cfg.data_dir) < 0)
        return -1;
    char secret_path[1024];
    if (s->cfg.secret_file[0])
        snprintf(secret_path, sizeof(secret_path), "%s", s->cfg.secret_file);
    else
        snprintf(secret_path, sizeof(secret_path), "%s/secret.key", s->cfg.data_dir);
    if (auth_load_secret(s, secret_path, err, sizeof(err)) < 0) {
        log_error("server secret: %s", err);
        return -1;
    }
    if (s->cfg.admin_key_file[0] &&
        auth_load_admin(s, s->cfg.admin_key_file, err, sizeof(err)) < 0) {
        log_error("admin key: %s", err);
        return -1;
    }
    if (cmd == CMD_SERVE) {
        /* before anything slow: a bad certificate or key stops engramd at once */
        char warn[512];
        if (tls_create(&s->cfg, &s->tls, err, sizeof(err), warn, sizeof(warn)) < 0) {
            log_error("TLS: %s", err);
            return -1;
        }
        if (warn[0])
            log_warn("TLS: %s", warn);
    }
    return 0;
}

/* Brings the schema up to date and runs the commands that need nothing more. Returns 0 to go
 * on serving, 1 when the command finished (*rc its exit status), -1 on failure (logged). */
static int prepare_database(server *s, command cmd, const char *const ct[3], int *rc)
{
    char err[512];
    PGconn *pg = connect_with_wait(&s->cfg);
    if (!pg)
        return -1;
    int applied = 0, ret = 0;
    if (migrate_run(pg, &applied, err, sizeof(err)) < 0) {
        log_error("schema migration failed: %s", err);
        ret = -1;
        goto done;
    }
    if (applied)
        log_info("applied %d schema migration(s); schema version %d", applied, migrate_latest());
    int citus = migrate_citus(pg, err, sizeof(err));
    if (citus < 0) {
        log_error("cannot tell whether the database is a Citus cluster: %s", err);
        ret = -1;
        goto done;
    }
    s->on_citus = citus >= 1;
    pgsync_set_citus(s->on_citus); /* before any thread: the background writers' split fence */
    if (citus == 1)
        log_info("the database is a Citus coordinator: schema distributed by tenant");
    else if (citus == 2)
        log_info("the database is a Citus worker: schema as its coordinator distributed it");
    if (s->on_citus && !s->placements) {
        /* store groups take one node's tenants (gcommit.h); until a load works each store
         * goes alone */
        int n = (s->placements = cmap_create()) ? cmap_load(s->placements, pg, err, sizeof(err))
                                                : -ENOMEM;
        if (n < 0)
            log_warn("the tenants' Citus placements are not known yet (%s): stores go one by "
                     "one until the change listener reads them",
                     n == -ENOMEM ? "out of memory" : err);
        else
            log_info("Citus placements of tenants: %d shard ranges", n);
    }
    if (cmd == CMD_MIGRATE) {
        *rc = 0;
        ret = 1;
    } else if (cmd == CMD_CREATE_TENANT) {
        *rc = create_tenant_cmd(s, pg, ct[0], ct[1], ct[2]) == 0 ? 0 : 1;
        ret = 1;
    }
done:
    PQfinish(pg);
    return ret;
}

/* The method table, the settings every layer reads, and the domain's services (indexes,
 * background threads, tenancy, row cache, maintenance, consolidation). Returns 0 or -1. */
static int start_domain(proc *a)
{
    server *s = &a->srv;
    char err[512];
    plimits_apply(&s->cfg);
    if (methods_check() < 0 || sql_init() < 0)
        return -1;
    if (s->on_citus && sql_use_citus() < 0) {
        log_error("a Citus form of a statement names no statement");
        return -1;
    }
    s->hooks = app_hooks();
    a->names = method_names();
    if (!a->names || metrics_init(a->names, methods_count) < 0 ||
        metrics_history_init((unsigned)s->cfg.metrics_history_step_s) < 0)
        return -1;
    if (embedder_init(&s->cfg, err, sizeof(err)) < 0) {
        log_error("%s", err);
        return -1;
    }
    if (chat_init(&s->cfg, err, sizeof(err)) < 0) {
        log_error("%s", err);
        return -1;
    }
    rpc_limits_default(&s->limits);
    s->limits.max_message = (size_t)s->cfg.max_message_bytes;
    s->limits.max_depth = (unsigned)s->cfg.max_depth;
    s->score = (score_params){.w_recency = s->cfg.score_w_recency,
                              .w_access = s->cfg.score_w_access,
                              .w_explicit = s->cfg.score_w_explicit,
                              .recency_days = s->cfg.score_recency_days,
                              .access_saturation = s->cfg.score_access_saturation,
                              .w_usefulness = s->cfg.score_w_usefulness};
    if (publish_tiers(a, &s->cfg) < 0)
        return -1;
    s->tenants = tenants_create(s);
    s->bg = bg_create(s, (unsigned)s->cfg.bg_threads);
    s->tenancy = tenancy_create(s);
    s->rows = rc_create((size_t)s->cfg.row_cache_mb << 20);
    if (!s->rows || !s->tenants || !s->bg || !s->tenancy || tenants_start(s->tenants) < 0 ||
        maint_start(s) < 0 || tenancy_start(s->tenancy) < 0 || consolidate_start(s) < 0 ||
        autocompact_start(s) < 0 || extract_start(s) < 0 || dream_start(s) < 0 ||
        reembed_start(s) < 0)
        return -1;
    return 0;
}

/* The connection limits, the decode threads and the workers. Returns 0 or -1 (logged). */
static int start_workers(server *s)
{
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    s->nworkers = s->cfg.workers > 0 ? (unsigned)s->cfg.workers : (unsigned)(ncpu > 0 ? ncpu : 1);
    /* descriptors the connections must leave: each worker's and the background threads'
     * database connections, snapshot files, listeners, logs, and a margin */
    long reserve =
        128 + (long)(s->nworkers + (unsigned)s->cfg.bg_threads + 4) * (long)s->cfg.pg_pool_size +
        2L * s->nworkers /* the lanes */ + s->cfg.admin_reserved_connections +
        s->cfg.http_max_connections + HTTP_PROBE_RESERVE;
    char msg[300];
    long lim = climits_fit_descriptors(&s->cfg, reserve, msg, sizeof(msg));
    if (msg[0])
        log_info("%s", msg);
    log_debug("descriptor limit %ld, max_connections %d", lim, s->cfg.max_connections);
    s->limits_cl = climits_create(&s->cfg);
    if (!s->limits_cl)
        return -1;
    if (s->cfg.decode_threads > 0 &&
        !(s->offload = offload_create((unsigned)s->cfg.decode_threads))) {
        log_error("cannot start the decode threads");
        return -1;
    }
    s->workers = calloc(s->nworkers, sizeof(*s->workers));
    if (!s->workers)
        return -1;
    for (unsigned i = 0; i < s->nworkers; i++) {
        s->workers[i] = worker_create(s, i);
        if (!s->workers[i] || worker_start(s->workers[i]) < 0) {
            log_error("cannot start worker %u", i);
            return -1;
        }
    }
    return 0;
}

/* The RPC listener, the HTTP port and the signals, on the main loop. Returns 0 or -1. */
static int start_listening(proc *a)
{
    server *s = &a->srv;
    char err[512];
    struct sockaddr_storage ss;
    int sslen = sizeof(ss);
    char *hostport = a->hostport;
    snprintf(hostport, sizeof(a->hostport), strchr(s->cfg.listen_host, ':') ? "[%s]:%d" : "%s:%d",
             s->cfg.listen_host, s->cfg.rpc_port);
    if (evutil_parse_sockaddr_port(hostport, (struct sockaddr *)&ss, &sslen) < 0) {
        log_error("listen_host '%s' is not an IP address", s->cfg.listen_host);
        return -1;
    }
    a->ev_relisten = evtimer_new(a->base, on_relisten, a);
    a->listener =
        evconnlistener_new_bind(a->base, on_accept, a, LEV_OPT_CLOSE_ON_FREE | LEV_OPT_REUSEABLE,
                                1024, (struct sockaddr *)&ss, sslen);
    if (!a->listener || !a->ev_relisten) {
        log_error("cannot listen on %s: %s", hostport, strerror(errno));
        return -1;
    }
    evconnlistener_set_error_cb(a->listener, on_accept_error);
    if (s->cfg.http_port > 0) {
        a->http = http_start(s, a->base, s->cfg.listen_host, s->cfg.http_port, err, sizeof(err));
        if (!a->http) {
            log_error("%s", err);
            return -1;
        }
    }
    a->ev_sigint = evsignal_new(a->base, SIGINT, on_signal, a);
    a->ev_sigterm = evsignal_new(a->base, SIGTERM, on_signal, a);
    a->ev_sighup = evsignal_new(a->base, SIGHUP, on_sighup, a);
    event_add(a->ev_sigint, NULL);
    event_add(a->ev_sigterm, NULL);
    event_add(a->ev_sighup, NULL);
    if (!s->tls && !loopback_host(s->cfg.listen_host))
        log_warn("listen_host %s is not a loopback address and TLS is off: API keys and "
                 "memories cross the network in clear text (set tls_cert_file and "
                 "tls_key_file)",
                 s->cfg.listen_host);
    return 0;
}

/* READY=1 once the indexes are loaded too (on_ready_check); WATCHDOG=1 pings from the main
 * loop, which also runs the signals and the listener. Returns 0 or -1. */
static int start_notify(proc *a)
{
    struct timeval poll_tv = {.tv_sec = 0, .tv_usec = 100000};
    a->ev_ready = event_new(a->base, -1, EV_PERSIST, on_ready_check, a);
    if (!a->ev_ready || event_add(a->ev_ready, &poll_tv) < 0)
        return -1;
    on_ready_check(-1, 0, a);
    uint64_t wd_usec = notify_watchdog_usec();
    if (wd_usec) {
        struct timeval wd_tv = {.tv_sec = (time_t)(wd_usec / 2 / 1000000u),
                                .tv_usec = (suseconds_t)(wd_usec / 2 % 1000000u)};
        a->ev_watchdog = event_new(a->base, -1, EV_PERSIST, on_watchdog, a);
        if (!a->ev_watchdog || event_add(a->ev_watchdog, &wd_tv) < 0)
            return -1;
        notify_watchdog();
        log_info("watchdog: pinging the service manager every %llu ms",
                 (unsigned long long)(wd_usec / 2000u));
    }
    return 0;
}

/* One sample of the last hour's figures (metrics_history_sample) with the indexes' own. */
static void on_history(evutil_socket_t fd, short what, void *arg)
{
    proc *a = arg;
    tenants_metrics tm = {0};
    if (a->srv.tenants)
        tenants_stats(a->srv.tenants, &tm);
    metrics_history_sample(server_now_ms(), (double)tm.bytes, (double)tm.budget,
                           (double)tm.vectors);
}

/* Samples the metrics' history from now on, every metrics_history_step_s. Returns 0 or -1. */
static int start_history(proc *a)
{
    struct timeval tv = {.tv_sec = a->srv.cfg.metrics_history_step_s, .tv_usec = 0};
    a->ev_history = event_new(a->base, -1, EV_PERSIST, on_history, a);
    if (!a->ev_history || event_add(a->ev_history, &tv) < 0)
        return -1;
    on_history(-1, 0, a);
    return 0;
}

/* Stops everything started, in order: the listener, the workers (drained), the decode and
 * background threads, the indexes' snapshots (after a clean run: saved), then frees. */
static void shutdown_all(proc *a, bool clean)
{
    server *s = &a->srv;
    if (a->listener)
        evconnlistener_free(a->listener);
    a->listener = NULL;
    for (unsigned i = 0; s->workers && i < s->nworkers; i++)
        if (s->workers[i])
            worker_drain(s->workers[i]);
    for (unsigned i = 0; s->workers && i < s->nworkers; i++)
        worker_join(s->workers[i]);
    /* what the decode threads finish goes to the workers' mail, which worker_destroy reads */
    offload_destroy(s->offload);
    s->offload = NULL;
    bg_destroy(s->bg);
    s->bg = NULL;
    if (s->tenants && clean)
        tenants_save_all(s->tenants);
    for (unsigned i = 0; s->workers && i < s->nworkers; i++)
        worker_destroy(s->workers[i]);
    free(s->workers);
    http_stop(a->http);
    struct event *evs[] = {a->ev_sigint, a->ev_sigterm,  a->ev_sighup, a->ev_relisten,
                           a->ev_ready,  a->ev_watchdog, a->ev_history};
    for (size_t i = 0; i < sizeof(evs) / sizeof(evs[0]); i++)
        if (evs[i])
            event_free(evs[i]);
    if (a->base)
        event_base_free(a->base);
    tenants_destroy(s->tenants);
    tenancy_destroy(s->tenancy);
    tls_destroy(s->tls); /* after the workers and the HTTP port: no session is made after */
    rc_destroy(s->rows);
    cmap_destroy(s->placements); /* after the workers and the background threads */
    metrics_fini();
    sql_fini();
    embedder_fini();
    chat_fini(); /* after bg_stop: no consolidation calls a model any more */
    free(a->names);
}

int main(int argc, char **argv)
{
    command cmd;
    const char *ct[3] = {NULL, NULL, NULL};
    if (parse_command(&argc, &argv, &cmd, ct) != 0)
        return 2;
    static proc a;
    server *s = &a.srv;
    a.argc = argc;
    a.argv = argv;
    bool exit_now = false;
    if (config_load(&s->cfg, argc, argv, stdout, stderr, &exit_now) < 0)
        return 2;
    if (exit_now) {
        config_free(&s->cfg);
        return 0;
    }
    setup_process(&s->cfg);
    int rc = 1;
    if (load_keys(s, cmd) < 0)
        goto out;
    int prep = prepare_database(s, cmd, ct, &rc);
    if (prep != 0)
        goto out;
    a.base = event_base_new();
    if (!a.base || start_domain(&a) < 0 || start_workers(s) < 0 || start_listening(&a) < 0)
        goto out;
    atomic_store(&s->ready, true);
    log_info("engramd ready: rpc %s, http %s:%d%s, %u workers, schema %d", a.hostport,
             s->cfg.listen_host, s->cfg.http_port, s->tls ? " (TLS 1.3 only)" : " (plain TCP)",
             s->nworkers, migrate_latest());
    if (start_notify(&a) < 0 || start_history(&a) < 0)
        goto out;
    event_base_dispatch(a.base);
    rc = 0;
out:
    shutdown_all(&a, rc == 0 && cmd == CMD_SERVE);
    if (rc == 0 && cmd == CMD_SERVE)
        log_info("engramd stopped");
    config_free(&s->cfg);
    if (a.have_live)
        config_free(&a.live);
    while (a.snaps) {
        tier_snap *t = a.snaps;
        a.snaps = t->older;
        free(t);
    }
    libevent_global_shutdown();
    return rc;
}
