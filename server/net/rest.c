/* server/net/rest.c: the seeds' REST paths (rest.h). */
#include "rest.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

const rest_route rest_routes[] = {
    {HTTP1_POST, "/v1/memory", "memory.store", NULL, {{0}}, "Store a new memory (seed 003)"},
    {HTTP1_POST,
     "/v1/memory/search",
     "memory.search",
     NULL,
     {{0}},
     "Search memories by semantic similarity (seed 003)"},
    {HTTP1_POST, "/v1/sessions", "session.create", NULL, {{0}}, "Create a new session (seed 000)"},
    {HTTP1_POST,
     "/v1/sessions/{id}/checkpoint",
     "session.checkpoint",
     "session_id",
     {{0}},
     "Create a labeled checkpoint (seed 000)"},
    {HTTP1_POST,
     "/v1/sessions/{id}/resume",
     "session.resume",
     "session_id",
     {{0}},
     "Resume from a checkpoint of this session (creates a new session; seed 000)"},
    {HTTP1_GET,
     "/v1/sessions/{id}/scratchpad",
     "session.scratchpad.get",
     "session_id",
     {{0}},
     "Read the scratchpad"},
    {HTTP1_PATCH,
     "/v1/sessions/{id}/scratchpad",
     "session.scratchpad.update",
     "session_id",
     {{0}},
     "Update scratchpad content (seed 000)"},
    {HTTP1_POST,
     "/v1/sessions/{parentId}/spawn",
     "session.spawn",
     "parent_id",
     {{0}},
     "Spawn a sub-agent session (seed 000)"},
    {HTTP1_GET,
     "/api/v1/session/{id}/scratchpad",
     "session.notes",
     "session_id",
     {{"scope", "scopes"},
      {"category", "categories"},
      {"since", "since"},
      {"agent_id", "agent_id"}},
     "Read back the scratchpad entries (notes) after compaction (seed 004)"},
};
const size_t rest_routes_count = sizeof(rest_routes) / sizeof(rest_routes[0]);

const char *rest_verb_name(http1_method verb)
{
    switch (verb) {
    case HTTP1_GET:
        return "GET";
    case HTTP1_HEAD:
        return "HEAD";
    case HTTP1_POST:
        return "POST";
    case HTTP1_PATCH:
        return "PATCH";
    case HTTP1_OPTIONS:
        return "OPTIONS";
    case HTTP1_OTHER:
        break;
    }
    return "OTHER";
}

void rest_id_name(const rest_route *route, char *out, size_t outlen)
{
    const char *a = strchr(route->path, '{'), *b = a ? strchr(a, '}') : NULL;
    snprintf(out, outlen, "%.*s", a && b ? (int)(b - a - 1) : 0, a ? a + 1 : "");
}

/* Whether path matches pattern; an id segment must be 1 to 20 digits that fit 64 bits. */
static bool matches(const char *pattern, const char *path, size_t len, uint64_t *id)
{
    const char *p = pattern, *s = path, *end = path + len;
    *id = 0;
    while (*p && s < end) {
        if (*p == '{') {
            const char *close = strchr(p, '}');
            uint64_t v = 0;
            size_t nd = 0;
            for (; s < end && *s >= '0' && *s <= '9'; s++, nd++) {
                if (v > (UINT64_MAX - (uint64_t)(*s - '0')) / 10)
                    return false;
                v = v * 10 + (uint64_t)(*s - '0');
            }
            if (nd == 0 || !close)
                return false;
            *id = v;
            p = close + 1;
            continue;
        }
        if (*p != *s)
            return false;
        p++, s++;
    }
    return !*p && s == end;
}

const rest_route *rest_match(http1_method verb, const char *path, size_t path_len, uint64_t *id,
                             char *allow, size_t allowlen)
{
    size_t used = 0;
    if (allowlen)
        allow[0] = '\0';
    for (size_t i = 0; i < rest_routes_count; i++) {
        const rest_route *r = &rest_routes[i];
        if (!matches(r->path, path, path_len, id))
            continue;
        if (r->verb == verb)
            return r;
        int n = snprintf(allow + used, allowlen - used, "%s%s", used ? ", " : "",
                         rest_verb_name(r->verb));
        if (n > 0 && (size_t)n < allowlen - used)
            used += (size_t)n;
    }
    *id = 0;
    return NULL;
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

long rest_decode(const char *in, size_t n, char *out)
{
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        if (in[i] == '+') {
            out[o++] = ' ';
        } else if (in[i] == '%') {
            int hi = i + 2 < n ? hexval(in[i + 1]) : -1;
            int lo = hi >= 0 ? hexval(in[i + 2]) : -1;
            if (lo < 0)
                return -1;
            out[o++] = (char)(hi * 16 + lo);
            i += 2;
        } else {
            out[o++] = in[i];
        }
    }
    return (long)o;
}

static msgpack_object str_obj(const char *p, size_t n)
{
    return (msgpack_object){.type = MSGPACK_OBJECT_STR, .via.str = {.ptr = p, .size = (uint32_t)n}};
}

/* Digits only, fitting 64 bits: the number; else false. */
static bool as_u64(const char *p, size_t n, uint64_t *v)
{
    *v = 0;
    if (n == 0 || n > 20)
        return false;
    for (size_t i = 0; i < n; i++) {
        if (p[i] < '0' || p[i] > '9' || *v > (UINT64_MAX - (uint64_t)(p[i] - '0')) / 10)
            return false;
        *v = *v * 10 + (uint64_t)(p[i] - '0');
    }
    return true;
}

/* The value of a query parameter of type t (decoded text p, n bytes, in the zone). */
static int query_value(rpc_type t, const char *p, size_t n, msgpack_zone *zone, msgpack_object *out)
{
    uint64_t v;
    if ((t == RPC_T_UINT || t == RPC_T_TIME) && as_u64(p, n, &v)) {
        *out = (msgpack_object){.type = MSGPACK_OBJECT_POSITIVE_INTEGER, .via.u64 = v};
        return 0;
    }
    if (t != RPC_T_STR_ARRAY) {
        *out = str_obj(p, n);
        return 0;
    }
    uint32_t count = 1;
    for (size_t i = 0; i < n; i++)
        count += p[i] == ',';
    msgpack_object *items = msgpack_zone_malloc(zone, count * sizeof(*items));
    if (!items)
        return -ENOMEM;
    uint32_t k = 0;
    for (size_t i = 0, start = 0; i <= n; i++) {
        if (i == n || p[i] == ',') {
            items[k++] = str_obj(p + start, i - start);
            start = i + 1;
        }
    }
    *out = (msgpack_object){.type = MSGPACK_OBJECT_ARRAY, .via.array = {.size = k, .ptr = items}};
    return 0;
}

static const rpc_param *param_of(const rpc_param *params, size_t nparams, const char *name)
{
    for (size_t i = 0; i < nparams; i++)
        if (strcmp(params[i].name, name) == 0)
            return &params[i];
    return NULL;
}

long rest_args(const rest_route *route, uint64_t id, const char *query, size_t query_len,
               const rpc_param *params, size_t nparams, msgpack_zone *zone, msgpack_object_kv *out,
               char *err, size_t errlen)
{
    long n = 0;
    if (route->id_param)
        out[n++] = (msgpack_object_kv){str_obj(route->id_param, strlen(route->id_param)),
                                       {.type = MSGPACK_OBJECT_POSITIVE_INTEGER, .via.u64 = id}};
    bool seen[REST_QUERY_MAX] = {false};
    for (size_t i = 0; query && i < query_len;) {
        size_t end = i;
        while (end < query_len && query[end] != '&')
            end++;
        const char *eq = memchr(query + i, '=', end - i);
        size_t klen = eq ? (size_t)(eq - (query + i)) : end - i;
        const char *val = eq ? eq + 1 : query + end;
        size_t vlen = (size_t)(query + end - val);
        char *buf = msgpack_zone_malloc(zone, klen + vlen + 2);
        if (!buf)
            return -ENOMEM;
        long kd = rest_decode(query + i, klen, buf);
        long vd = kd >= 0 ? rest_decode(val, vlen, buf + kd + 1) : -1;
        if (vd < 0) {
            snprintf(err, errlen, "the query string has a bad %%-escape");
            return -EINVAL;
        }
        i = end + 1;
        if (kd == 0 || ((size_t)kd == 10 && memcmp(buf, "embeddings", 10) == 0))
            continue;
        size_t q = 0;
        while (q < REST_QUERY_MAX && route->query[q].key &&
               !(strlen(route->query[q].key) == (size_t)kd &&
                 memcmp(route->query[q].key, buf, (size_t)kd) == 0))
            q++;
        if (q == REST_QUERY_MAX || !route->query[q].key) {
            snprintf(err, errlen, "unknown query parameter '%.*s'", (int)(kd > 64 ? 64 : kd), buf);
            return -EINVAL;
        }
        if (seen[q]) {
            snprintf(err, errlen, "query parameter '%s' is given twice", route->query[q].key);
            return -EINVAL;
        }
        seen[q] = true;
        const rpc_param *p = param_of(params, nparams, route->query[q].param);
        msgpack_object v;
        int rc = query_value(p ? p->type : RPC_T_STR, buf + kd + 1, (size_t)vd, zone, &v);
        if (rc < 0)
            return rc;
        out[n++] =
            (msgpack_object_kv){str_obj(route->query[q].param, strlen(route->query[q].param)), v};
    }
    return n;
}
