/* server/server.h: the process-wide context every server module shares.
 *
 * One `server` exists per engramd process. It is filled in by main before any thread
 * starts and is read-only afterwards, except for the fields marked atomic.
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

typedef struct server {
    config cfg;
    rpc_limits limits;
    score_params score;
    tier_limits tiers[TIER_COUNT];
    char memory_limits[80]; /* "{free,standard,premium}" bigint[] literals, 0: unlimited */
    char query_limits[80];
    unsigned nworkers;
    struct worker **workers;
    struct tenants *tenants;
    struct bg *bg;
    struct tenancy *tenancy;
    struct rowcache *rows; /* memory rows for search results */
    uint8_t secret[32];    /* keys the API-key hashes */
    bool have_admin;
    uint8_t admin_hash[32];    /* keyed hash of the admin key */
    atomic_bool ready;         /* start-up finished: listening, indexes loadable */
    atomic_bool draining;      /* shutdown has begun */
    atomic_int nconns;         /* open client connections (counted at accept) */
    struct climits *limits_cl; /* per-address and buffered-byte limits */
    struct tls_ctx *tls;       /* the RPC and HTTP ports' TLS context; NULL: plain TCP */
} server;

/* server_now_ms returns the wall-clock time in milliseconds since the Unix epoch. */
int64_t server_now_ms(void);

/* server_mono_ns returns a monotonic time in nanoseconds. */
uint64_t server_mono_ns(void);

#endif
