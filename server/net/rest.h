/* server/net/rest.h: the seeds' REST paths as a thin layer over the methods.
 *
 * Seed 003 names POST /v1/memory and /v1/memory/search; seed 000 POST /v1/sessions,
 * /v1/sessions/{id}/checkpoint, /v1/sessions/{id}/resume, /v1/sessions/{parentId}/spawn and
 * PATCH /v1/sessions/{id}/scratchpad; seed 004 GET /api/v1/session/{id}/scratchpad
 * ?scope=&category=&since=. Each route runs one method of the table exactly as
 * POST /v1/rpc/{method} does (authentication, validation, quotas, answers, errors): the
 * body is the method's object of named parameters, the path's id fills one parameter (a body
 * naming it too must agree), and a GET route's query parameters fill others.
 */
#ifndef ENGRAM_NET_REST_H
#define ENGRAM_NET_REST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <msgpack.h>

#include "http1.h"
#include "rpc.h"

#define REST_QUERY_MAX 4

/* A query parameter of a GET route: its name in the URL and the method's parameter it
 * fills. A string-array parameter takes a comma-separated list. */
typedef struct rest_query {
    const char *key;
    const char *param;
} rest_query;

typedef struct rest_route {
    http1_method verb;
    const char *path;     /* with one "{name}" segment at most: an unsigned integer id */
    const char *method;   /* the method it runs */
    const char *id_param; /* the method's parameter the {name} segment fills, or NULL */
    rest_query query[REST_QUERY_MAX]; /* GET routes: key NULL ends the list */
    const char *summary;              /* the seed's words for it */
} rest_route;

extern const rest_route rest_routes[];
extern const size_t rest_routes_count;

/* rest_match finds the route for verb and path (path_len bytes, no query). Returns it with
 * *id set (0 when the route has no id segment), or NULL: then *allow names the verbs the
 * path takes ("" when no route has this path: 404; else 405 with that Allow header). */
const rest_route *rest_match(http1_method verb, const char *path, size_t path_len, uint64_t *id,
                             char *allow, size_t allowlen);

/* rest_verb_name returns "GET", "POST", "PATCH"... */
const char *rest_verb_name(http1_method verb);

/* rest_id_name returns the name of route's {name} segment (into out, NUL-terminated), or
 * "" when it has none. */
void rest_id_name(const rest_route *route, char *out, size_t outlen);

/* rest_args builds the parameters route's path id and query string (query_len bytes; NULL
 * when none) give the method whose parameter table is params[0..nparams), as key/value
 * pairs in out (room for 1 + REST_QUERY_MAX), their strings allocated in zone. A query
 * value is typed by its parameter: a string-array parameter takes a comma-separated list,
 * an unsigned or time parameter digits as a number (anything else stays a string, for the
 * binder to refuse or, for a time, to parse). The query key "embeddings" (an answer's
 * format) is skipped. Returns the number of pairs, -EINVAL with err naming the problem (an
 * unknown or repeated query key, a bad escape), or -ENOMEM. */
long rest_args(const rest_route *route, uint64_t id, const char *query, size_t query_len,
               const rpc_param *params, size_t nparams, msgpack_zone *zone, msgpack_object_kv *out,
               char *err, size_t errlen);

/* rest_decode percent-decodes a query component (and '+' as a space) of n bytes into out
 * (at least n bytes). Returns the decoded length, or -1 for a bad escape. */
long rest_decode(const char *in, size_t n, char *out);

#endif
