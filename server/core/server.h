/* server/core/server.h: the process-wide context every server module shares.
 *
 * One `server` exists per engramd process. It is filled in by main before any thread
 * starts and is read-only afterwards, except for the fields marked atomic. cfg keeps the
 * values engramd started with; the settings a SIGHUP reloads live in atomic fields (tiers)
 * or in their modules (log level, bg intervals).
 */
#ifndef ENGRAM_SERVER_SERVER_H
#define ENGRAM_SERVER_SERVER_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "config.h"
#include "rpc.h"
#include "score.h"
#include "tiers.h"

struct worker;
struct tenants;
struct bg;
struct tenancy;
struct rowcache;
struct climits;
struct tls_ctx;
struct offload;
struct net_hooks;

typedef struct server {
    config cfg;
    rpc_limits limits;
    score_params score;
    /* The tier limits in force, tiers[TIER_COUNT], and the same limits as the bigint[]
     * literals the SQL takes ("{free,standard,premium}", 0: unlimited). A SIGHUP reload
     * (main.c) publishes a new immutable snapshot by storing these pointers; the old ones stay
     * valid until exit. Read them with server_tiers / server_memory_limits /
     * server_query_limits (explicit acquire loads: gcc's TSan instrumentation sees a plain
     * read in an _Atomic lvalue conversion) and take a tier once per use. */
    const tier_limits *_Atomic tiers;
    const char *_Atomic memory_limits;
    const char *_Atomic query_limits;
    unsigned nworkers;
    struct worker **workers;
    struct tenants *tenants;
    struct bg *bg;
    struct tenancy *tenancy;
    struct rowcache *rows; /* memory rows for search results */
    uint8_t secret[32];    /* keys the API-key hashes */
    bool have_admin;
    bool on_citus; /* the database is a Citus coordinator (found at start: migrate_citus) */
    /* on Citus: which node holds each tenant (storage/citusmap.h), for the store groups;
     * loaded at start, again by the change listener every change_poll_ms and after a
     * move; NULL on one PostgreSQL */
    struct cmap *placements;
    uint8_t admin_hash[32];        /* keyed hash of the admin key */
    atomic_bool ready;             /* start-up finished: listening, indexes loadable */
    atomic_bool draining;          /* shutdown has begun */
    atomic_int nconns;             /* open RPC connections (counted at accept) */
    atomic_int nhttp;              /* open HTTP connections (counted at accept) */
    struct climits *limits_cl;     /* per-address and buffered-byte limits */
    struct tls_ctx *tls;           /* the RPC and HTTP ports' TLS context; NULL: plain TCP */
    struct offload *offload;       /* threads for decoding large messages (offload.h); NULL: none */
    const struct net_hooks *hooks; /* the methods and what the network layer asks of the rest
                                    * (net/hooks.h); set by main before any worker starts */
} server;

/* A thread that runs work posted to it (a worker): post(target, fn, arg) runs fn(arg) on
 * that thread soon and returns 0, or -ENOMEM (fn does not run then). Safe from any thread. */
typedef struct server_poster {
    int (*post)(void *target, void (*fn)(void *arg), void *arg);
    void *target;
} server_poster;

/* server_now_ms returns the wall-clock time in milliseconds since the Unix epoch. */
int64_t server_now_ms(void);

/* server_mono_ns returns a monotonic time in nanoseconds. */
uint64_t server_mono_ns(void);

/* The tier limits in force (tiers[TIER_COUNT]) and their SQL literals; see server.tiers. */
static inline const tier_limits *server_tiers(const server *s)
{
    return atomic_load_explicit(&s->tiers, memory_order_acquire);
}

static inline const char *server_memory_limits(const server *s)
{
    return atomic_load_explicit(&s->memory_limits, memory_order_acquire);
}

static inline const char *server_query_limits(const server *s)
{
    return atomic_load_explicit(&s->query_limits, memory_order_acquire);
}

#endif
