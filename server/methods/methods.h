/* server/methods/methods.h: the one sorted table of RPC methods.
 *
 * Each entry names a handler, its parameter schema and what a caller must be. The table
 * drives dispatch, metrics labels, the `methods` introspection call (which the isolation
 * tests walk), and docs/protocol.md is checked against it.
 */
#ifndef ENGRAM_SERVER_METHODS_H
#define ENGRAM_SERVER_METHODS_H

#include <stddef.h>

#include "req.h"
#include "rpc.h"

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

typedef struct method_def {
    const char *name;
    void (*fn)(req *r);
    const rpc_param *params;
    size_t nparams;
    unsigned flags;
    const size_t *count; /* where nparams comes from (the handler file's np_<name>) */
} method_def;

extern const method_def *const methods_table;
extern const size_t methods_count;

/* methods_find returns the method named name (n bytes) and its index in *idx, or NULL. */
const method_def *methods_find(const char *name, size_t n, size_t *idx);

/* methods_check verifies the table is sorted and sane (at start); returns 0 or -EINVAL. */
int methods_check(void);

#endif
