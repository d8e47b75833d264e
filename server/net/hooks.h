/* server/net/hooks.h: what the network layer needs of the rest of the server, handed to it
 * by main through server.hooks.
 *
 * The network layer knows no method and no domain module: it frames messages, checks who a
 * connection is, dispatches to the method table below and runs the per-worker hooks. The
 * methods library fills this in (methods/app.c); tests of the network layer fill it with
 * fakes. Every hook runs on the thread the comment names; a NULL hook is skipped.
 */
#ifndef ENGRAM_SERVER_HOOKS_H
#define ENGRAM_SERVER_HOOKS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "rpc.h"
#include "server.h"

struct req;
struct worker;
struct evbuffer;

/* What a caller must be for a method, and how it is treated. */
enum {
    M_PUBLIC = 1 << 0, /* callable before auth */
    M_ADMIN = 1 << 1,  /* admin connections only */
    M_TENANT = 1 << 2, /* tenant connections only */
    M_QUERY = 1 << 3,  /* counts toward the tier's daily query quota */
    M_WRITE = 1 << 4,  /* changes tenant data */
    M_AUTH = 1 << 5,   /* sets the connection's identity: later requests wait for its answer,
                          and any failure leaves the connection unauthenticated */
};

#define METHOD_MAX_PARAMS 32

/* A parameter that takes one of a fixed set of strings (for an array of strings: each
 * element). The method table declares it; the dispatcher checks it after binding
 * (hooks_check_enums), so the "must be one of" message, the `methods` answer's `enum` and
 * the OpenAPI document's `enum` all come from these words. */
typedef struct method_enum {
    const char *param;        /* a parameter of the method (not an alias) */
    const char *const *words; /* the accepted strings, NULL-terminated */
} method_enum;

/* One method: its handler, parameter schema and flags. */
typedef struct method_def {
    const char *name;
    void (*fn)(struct req *r);
    const rpc_param *params;
    size_t nparams;
    unsigned flags;
    const size_t *count;      /* where nparams comes from (the handler file's np_<name>) */
    const method_enum *enums; /* its parameters' fixed sets of strings (NULL: none) */
    const size_t *nenums;     /* how many (the handler file's ne_<name>; NULL: none) */
} method_def;

/* A tenant request's admission (hooks.tenant_admit). */
typedef enum {
    HOOK_ADMIT_OK = 0,
    HOOK_ADMIT_REVOKED,      /* the key was revoked or its tenant deleted */
    HOOK_ADMIT_RATE_LIMITED, /* over the tier's request rate; retry_ms set */
} hook_admit;

/* The parts of readiness the network layer cannot see. */
typedef struct hook_health {
    bool listener; /* the change listener is connected */
    bool indexes;  /* the indexes are preloaded */
} hook_health;

typedef struct net_hooks {
    /* The method table, sorted by name (strcmp), and its size. */
    const method_def *methods;
    size_t nmethods;

    /* Per worker, on the main thread before the worker's loop starts (its pools exist):
     * worker_init sets up what the methods keep per worker (worker_set_app); 0 or -errno.
     * On the worker's thread every 100 ms: worker_tick(draining). While draining:
     * worker_idle tells whether the hooks' per-worker work is finished (the drain waits for
     * it). worker_fini, after the loop ended and the pools were destroyed (their callbacks
     * ran): frees what worker_init set up; also after a failed worker_init. */
    int (*worker_init)(struct worker *w);
    void (*worker_tick)(struct worker *w, uint64_t now_ms, bool draining);
    bool (*worker_idle)(struct worker *w);
    void (*worker_fini)(struct worker *w);

    /* Identity, on a worker's thread. key_in_use counts a tenant key's connection (when the
     * identity was not claimed already, see conn_auth.claimed); key_released gives it
     * back. tenant_admit checks a tenant request before it runs: the key still valid, the
     * tenant's tier now (*tier updated), its request rate. */
    void (*key_in_use)(server *s, int64_t key_id, int64_t tenant_id, int tier);
    void (*key_released)(server *s, int64_t key_id);
    hook_admit (*tenant_admit)(server *s, int64_t key_id, int64_t tenant_id, int *tier,
                               uint64_t *retry_ms);
    /* tenant_embedding (optional), after a tenant request's admission: when the tenant's
     * embedding model generation is newer than *gen (a re-embedding swapped it after the
     * connection authenticated), sets *gen, *dim and provider (16 bytes) to the current
     * one, so the request embeds with the tenant's model now. Any worker thread. */
    void (*tenant_embedding)(server *s, int64_t tenant_id, int64_t *gen, uint32_t *dim,
                             char *provider);

    /* read_floor returns the tenant's change number a hot standby must have replayed for
     * its answers to be used (req_submit_read); any thread. */
    uint64_t (*read_floor)(server *s, int64_t tenant_id);

    /* The HTTP port's GET endpoints, on a worker's thread: health fills what readiness needs
     * beyond the network's own view; metrics appends the rest of /metrics (Prometheus text
     * format); openapi renders /v1/openapi.json, 0 or -errno. */
    void (*health)(server *s, hook_health *h);
    void (*metrics)(server *s, struct evbuffer *b);
    int (*openapi)(server *s, struct evbuffer *b);
} net_hooks;

/* hooks_method_find returns the method named name (n bytes) in the sorted table t of count
 * methods and its index in *idx, or NULL. */
const method_def *hooks_method_find(const method_def *t, size_t count, const char *name, size_t n,
                                    size_t *idx);

/* hooks_param_enum returns the words parameter params[k] of m accepts (NULL-terminated),
 * or NULL when it takes any string. */
const char *const *hooks_param_enum(const method_def *m, size_t k);

/* hooks_enum_message writes into err "parameter 'WHAT' must be one of a, b, c", the words
 * (NULL-terminated) listed in order: the one message of every fixed set of strings, also for
 * those inside a parameter (what "memories[3].type"). Returns RPC_E_INVALID. */
int hooks_enum_message(const char *what, const char *const *words, char *err, size_t errlen);

/* hooks_check_enums checks the bound arguments args (rpc_bind_params' out[] for m->params)
 * against m's enums: a string not among its parameter's words fails with "parameter 'mode'
 * must be one of vector, text, hybrid" ("parameter 'scopes[1]' ..." for an element of an
 * array) in err. Returns 0 or RPC_E_INVALID. Thread-safe. */
int hooks_check_enums(const method_def *m, const msgpack_object *const *args, char *err,
                      size_t errlen);

#endif
