/* server/methods/openapi.c: the OpenAPI 3.1 document of the JSON API (see openapi.h). */
#include "openapi.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include <event2/buffer.h>

#include "methods.h"
#include "plimits.h"
#include "rest.h"
#include "results.h"

/* The HTTP status each error code is answered with (hapi.c uses the same table). */
static const int statuses[] = {400, 401, 402, 403, 404, 409, 413, 429, 500, 503};

static const char *status_text(int st)
{
    switch (st) {
    case 400:
        return "invalid_argument or malformed_request (the JSON body is not an object)";
    case 401:
        return "unauthenticated: no, or an invalid, revoked or unknown bearer key";
    case 402:
        return "cost_limit_exceeded: a session's cost cap would be passed";
    case 403:
        return "permission_denied: admin-only or tenant-only method";
    case 404:
        return "not_found, or unknown_method";
    case 409:
        return "conflict or already_exists";
    case 413:
        return "the body passes max_message_bytes";
    case 429:
        return "rate_limited or quota_exceeded; Retry-After when the server knows when";
    case 500:
        return "internal";
    case 503:
        return "unavailable: retry";
    }
    return "error";
}

static void put_bound(struct evbuffer *b, const char *key, double v, bool integer)
{
    if (!isfinite(v))
        return;
    if (integer && v >= -9.2e18 && v <= 9.2e18 && v == (double)(long long)v)
        evbuffer_add_printf(b, ",\"%s\":%lld", key, (long long)v);
    else
        evbuffer_add_printf(b, ",\"%s\":%.17g", key, v);
}

/* "type": T, or [T, "null"] for a nullable parameter. */
static void put_type(struct evbuffer *b, const char *t, bool nullable)
{
    if (nullable)
        evbuffer_add_printf(b, "\"type\":[\"%s\",\"null\"]", t);
    else
        evbuffer_add_printf(b, "\"type\":\"%s\"", t);
}

static void put_schema(struct evbuffer *b, const rpc_param *p)
{
    bool nul = (p->flags & RPC_P_NULLABLE) != 0;
    bool rng = (p->flags & RPC_P_RANGE) != 0;
    bool container = p->type == RPC_T_MAP || p->type == RPC_T_ARRAY || p->type == RPC_T_ANY;
    unsigned lim = RPC_P_LIMIT_OF(p->flags);
    /* the bounds the binder applies: a limit's setting, the defaults (rpc.h) */
    double lo = rng ? p->min : -INFINITY;
    double hi =
        container || p->type == RPC_T_STR_ARRAY ? (rng ? p->max : INFINITY) : rpc_param_max(p);
    if (p->type == RPC_T_STR && lo == -INFINITY)
        lo = 0;
    evbuffer_add(b, "{", 1);
    switch (p->type) {
    case RPC_T_ANY:
        evbuffer_add_printf(b, "\"description\":\"any JSON value\"");
        break;
    case RPC_T_BOOL:
        put_type(b, "boolean", nul);
        break;
    case RPC_T_UINT:
        put_type(b, "integer", nul);
        put_bound(b, "minimum", lo > 0 ? lo : 0, true);
        put_bound(b, "maximum", hi, true);
        break;
    case RPC_T_INT:
        put_type(b, "integer", nul);
        put_bound(b, "minimum", lo, true);
        put_bound(b, "maximum", hi, true);
        break;
    case RPC_T_NUM:
        put_type(b, "number", nul);
        put_bound(b, "minimum", lo, false);
        put_bound(b, "maximum", hi, false);
        break;
    case RPC_T_STR:
        put_type(b, "string", nul);
        put_bound(b, "minLength", lo, true);
        put_bound(b, "maxLength", hi, true);
        evbuffer_add_printf(b, ",\"description\":\"length bounds count UTF-8 bytes%s%s\"",
                            lim ? "; the maximum is the setting " : "", plimits_setting(lim));
        break;
    case RPC_T_BIN:
        put_type(b, "string", nul);
        evbuffer_add_printf(b, ",\"contentEncoding\":\"base64\"");
        break;
    case RPC_T_ARRAY:
        put_type(b, "array", nul);
        put_bound(b, "minItems", lo, true);
        put_bound(b, "maxItems", hi, true);
        break;
    case RPC_T_MAP:
        put_type(b, "object", nul);
        put_bound(b, "minProperties", lo, true);
        put_bound(b, "maxProperties", hi, true);
        break;
    case RPC_T_VECTOR:
        evbuffer_add_printf(b, "\"oneOf\":[{\"$ref\":\"#/components/schemas/VectorArray\"");
        put_bound(b, "minItems", lo, true);
        put_bound(b, "maxItems", hi, true);
        evbuffer_add_printf(b, "},{\"$ref\":\"#/components/schemas/VectorBase64\"}%s]",
                            nul ? ",{\"type\":\"null\"}" : "");
        break;
    case RPC_T_STR_ARRAY:
        put_type(b, "array", nul);
        evbuffer_add_printf(b, ",\"items\":{\"type\":\"string\"}");
        put_bound(b, "minItems", lo, true);
        put_bound(b, "maxItems", hi, true);
        break;
    case RPC_T_UINT_ARRAY:
        put_type(b, "array", nul);
        evbuffer_add_printf(b, ",\"items\":{\"type\":\"integer\",\"minimum\":0}");
        put_bound(b, "minItems", lo, true);
        put_bound(b, "maxItems", hi, true);
        break;
    case RPC_T_TIME:
        evbuffer_add_printf(b, "\"oneOf\":[{\"type\":\"integer\"");
        put_bound(b, "minimum", lo > 0 ? lo : 0, true);
        put_bound(b, "maximum", hi, true);
        evbuffer_add_printf(b,
                            "},{\"type\":\"string\",\"format\":\"date-time\"}%s],"
                            "\"description\":\"milliseconds since the epoch, or an RFC 3339 "
                            "time\"",
                            nul ? ",{\"type\":\"null\"}" : "");
        break;
    }
    if (container) {
        /* the binder's byte bound on the value's MessagePack form (about its JSON length) */
        put_bound(b, "x-maxBytes", rpc_param_max(p), true);
        if (lim)
            evbuffer_add_printf(b, ",\"x-maxBytesSetting\":\"%s\"", plimits_setting(lim));
    } else if (p->type == RPC_T_STR_ARRAY) {
        put_bound(b, "x-maxItemBytes", lim ? rpc_limit_value(lim) : RPC_STR_MAX_DEFAULT, true);
    }
    evbuffer_add(b, "}", 1);
}

/* "operationId", "tags", "summary", "description" and "security" of an operation running m,
 * each followed by a comma; id_prefix goes before the operationId (REST routes). */
static void put_op_head(struct evbuffer *b, const method_def *m, const char *id_prefix,
                        const char *summary)
{
    evbuffer_add_printf(b, "\"operationId\":\"%s", id_prefix);
    for (const char *c = m->name; *c; c++)
        evbuffer_add(b, *c == '.' ? "_" : c, 1);
    const char *dot = strchr(m->name, '.');
    evbuffer_add_printf(b, "\",\"tags\":[\"%.*s\"],",
                        dot ? (int)(dot - m->name) : (int)strlen(m->name), m->name);
    if (summary)
        evbuffer_add_printf(b, "\"summary\":\"%s: runs %s\",", summary, m->name);
    else
        evbuffer_add_printf(b, "\"summary\":\"%s (docs/protocol.md)\",", m->name);
    evbuffer_add_printf(b, "\"description\":\"%s%s%s\",",
                        (m->flags & M_ADMIN) ? "Needs the admin key. " : "",
                        (m->flags & M_TENANT) ? "Needs a tenant API key. " : "",
                        (m->flags & M_QUERY) ? "Counts toward the tier's daily query limit." : "");
    if (m->flags & M_PUBLIC)
        evbuffer_add_printf(b, "\"security\":[],");
}

/* "requestBody": one object of m's named parameters (aliases are further names of the one
 * before) but skip (a REST route's path parameter, or NULL), followed by a comma. */
static void put_body(struct evbuffer *b, const method_def *m, const char *skip)
{
    bool any_required = false, first = true;
    evbuffer_add_printf(b, "\"requestBody\":{\"content\":{\"application/json\":{\"schema\":{"
                           "\"type\":\"object\",\"additionalProperties\":false,\"properties\":{");
    for (size_t k = 0; k < m->nparams; k++) {
        const rpc_param *p = &m->params[k];
        if (skip && strcmp(p->name, skip) == 0)
            continue;
        evbuffer_add_printf(b, "%s\"%s\":", first ? "" : ",", p->name);
        first = false;
        if (p->flags & RPC_P_ALIAS) {
            /* the schema of the parameter it names, and which that is */
            size_t j = k;
            while (j > 0 && (m->params[j].flags & RPC_P_ALIAS))
                j--;
            rpc_param q = m->params[j];
            q.flags = (q.flags & ~RPC_P_REQUIRED) | RPC_P_NULLABLE;
            evbuffer_add_printf(b, "{\"description\":\"another name of '%s'\",\"allOf\":[",
                                m->params[j].name);
            put_schema(b, &q);
            evbuffer_add(b, "]}", 2);
            continue;
        }
        put_schema(b, p);
        any_required = any_required || (p->flags & RPC_P_REQUIRED);
    }
    evbuffer_add_printf(b, "}");
    if (any_required) {
        evbuffer_add_printf(b, ",\"required\":[");
        first = true;
        for (size_t k = 0; k < m->nparams; k++) {
            if (!(m->params[k].flags & RPC_P_REQUIRED) || (m->params[k].flags & RPC_P_ALIAS) ||
                (skip && strcmp(m->params[k].name, skip) == 0))
                continue;
            evbuffer_add_printf(b, "%s\"%s\"", first ? "" : ",", m->params[k].name);
            first = false;
        }
        evbuffer_add_printf(b, "]");
    }
    evbuffer_add_printf(b, "}}},\"required\":%s},", any_required ? "true" : "false");
}

/* "responses": m's result schema and the error answers. */
static void put_responses(struct evbuffer *b, const method_def *m)
{
    const char *result = results_find(m->name);
    evbuffer_add_printf(b,
                        "\"responses\":{\"200\":{\"description\":\"the result (see "
                        "docs/protocol.md)\",\"content\":{\"application/json\":{\"schema\":%s}}}",
                        result ? result : "{}");
    for (size_t i = 0; i < sizeof(statuses) / sizeof(statuses[0]); i++)
        evbuffer_add_printf(b, ",\"%d\":{\"$ref\":\"#/components/responses/E%d\"}", statuses[i],
                            statuses[i]);
    evbuffer_add(b, "}", 1);
}

static void put_method(struct evbuffer *b, const method_def *m)
{
    evbuffer_add_printf(b, "\"/v1/rpc/%s\":{\"post\":{", m->name);
    put_op_head(b, m, "", NULL);
    put_body(b, m, NULL);
    put_responses(b, m);
    evbuffer_add_printf(b, "}}");
}

static const method_def *method_named(const char *name)
{
    for (size_t i = 0; i < methods_count; i++)
        if (strcmp(methods_table[i].name, name) == 0)
            return &methods_table[i];
    return NULL;
}

static const rpc_param *param_named(const method_def *m, const char *name)
{
    for (size_t k = 0; k < m->nparams; k++)
        if (strcmp(m->params[k].name, name) == 0)
            return &m->params[k];
    return NULL;
}

/* One REST route's operation (rest.h): its path and query parameters, and the body of its
 * method's parameters but the one the path fills. */
static void put_route(struct evbuffer *b, const rest_route *rr, const method_def *m)
{
    char lower[16], id[32], prefix[80];
    const char *verb = rest_verb_name(rr->verb);
    size_t n = 0;
    for (; verb[n] && n < sizeof(lower) - 1; n++)
        lower[n] = (char)(verb[n] - 'A' + 'a');
    lower[n] = '\0';
    rest_id_name(rr, id, sizeof(id));
    snprintf(prefix, sizeof(prefix), "rest_%s_", lower);
    evbuffer_add_printf(b, "\"%s\":{", lower);
    put_op_head(b, m, prefix, rr->summary);
    evbuffer_add_printf(b, "\"parameters\":[");
    bool first = true;
    if (id[0]) {
        evbuffer_add_printf(b,
                            "{\"name\":\"%s\",\"in\":\"path\",\"required\":true,"
                            "\"description\":\"the method's parameter %s\",\"schema\":"
                            "{\"type\":\"integer\",\"minimum\":0}}",
                            id, rr->id_param);
        first = false;
    }
    for (size_t q = 0; q < REST_QUERY_MAX && rr->query[q].key; q++) {
        const rpc_param *p = param_named(m, rr->query[q].param);
        if (!p)
            continue;
        evbuffer_add_printf(b,
                            "%s{\"name\":\"%s\",\"in\":\"query\",\"description\":"
                            "\"the method's parameter %s%s\",",
                            first ? "" : ",", rr->query[q].key, p->name,
                            p->type == RPC_T_STR_ARRAY ? ", a comma-separated list" : "");
        if (p->type == RPC_T_STR_ARRAY)
            evbuffer_add_printf(b, "\"style\":\"form\",\"explode\":false,");
        evbuffer_add_printf(b, "\"schema\":");
        put_schema(b, p);
        evbuffer_add(b, "}", 1);
        first = false;
    }
    evbuffer_add_printf(b, "],");
    if (rr->verb != HTTP1_GET)
        put_body(b, m, rr->id_param);
    put_responses(b, m);
    evbuffer_add(b, "}", 1);
}

/* The seeds' REST paths, each path once with the operations of its routes. */
static void put_routes(struct evbuffer *b)
{
    for (size_t i = 0; i < rest_routes_count; i++) {
        bool seen = false;
        for (size_t j = 0; j < i && !seen; j++)
            seen = strcmp(rest_routes[j].path, rest_routes[i].path) == 0;
        if (seen)
            continue;
        evbuffer_add_printf(b, ",\"%s\":{", rest_routes[i].path);
        bool first = true;
        for (size_t j = i; j < rest_routes_count; j++) {
            const method_def *m = method_named(rest_routes[j].method);
            if (strcmp(rest_routes[j].path, rest_routes[i].path) != 0 || !m)
                continue;
            if (!first)
                evbuffer_add(b, ",", 1);
            first = false;
            put_route(b, &rest_routes[j], m);
        }
        evbuffer_add(b, "}", 1);
    }
}

int openapi_render(const server *s, struct evbuffer *out)
{
    (void)s;
    struct evbuffer *b = evbuffer_new();
    if (!b)
        return -ENOMEM;
    evbuffer_add_printf(
        b, "{\"openapi\":\"3.1.0\",\"info\":{\"title\":\"Engram HTTP/JSON API\",\"version\":\"1\","
           "\"description\":\"Every method of the MessagePack-RPC protocol (docs/protocol.md) as "
           "POST /v1/rpc/{method} with a JSON object of its named parameters, and the seeds' REST "
           "paths (/v1/memory, /v1/sessions...) over the same methods. Binary values are "
           "base64 strings; embeddings are also accepted as arrays of numbers and returned as "
           "arrays with ?embeddings=array.\"},"
           "\"servers\":[{\"url\":\"/\",\"description\":\"the engramd that served this "
           "document (its HTTP port)\"}],"
           "\"security\":[{\"bearer\":[]}],\"paths\":{");
    bool first = true;
    for (size_t i = 0; i < methods_count; i++) {
        const method_def *m = &methods_table[i];
        if (m->flags & M_AUTH)
            continue; /* the bearer key of each request does its job */
        if (!first)
            evbuffer_add(b, ",", 1);
        first = false;
        put_method(b, m);
    }
    put_routes(b);
    evbuffer_add_printf(
        b, "},\"components\":{\"securitySchemes\":{\"bearer\":{\"type\":\"http\",\"scheme\":"
           "\"bearer\",\"description\":\"a tenant API key, or the admin key for admin.* "
           "methods\"}},\"schemas\":{"
           "\"RetryAfter\":{\"type\":\"integer\",\"minimum\":0,\"description\":\"seconds to "
           "wait before retrying\"},"
           "\"VectorArray\":{\"type\":\"array\",\"items\":{\"type\":\"number\"}},"
           "\"VectorBase64\":{\"type\":\"string\",\"contentEncoding\":\"base64\",\"description\":"
           "\"little-endian float32 values, 4 bytes each, base64 (RFC 4648, padded)\"},"
           "\"Error\":{\"type\":\"object\",\"required\":[\"error\"],\"properties\":{\"error\":{"
           "\"type\":\"object\",\"required\":[\"code\",\"message\"],\"properties\":{\"code\":{"
           "\"type\":\"string\",\"enum\":[");
    for (int c = RPC_OK + 1; c < RPC_CODE_COUNT; c++)
        evbuffer_add_printf(b, "%s\"%s\"", c > RPC_OK + 1 ? "," : "", rpc_code_name((rpc_code)c));
    evbuffer_add_printf(b, "]},\"message\":{\"type\":\"string\"},\"field\":{\"type\":\"string\","
                           "\"description\":\"the parameter an invalid_argument names\"}},"
                           "\"additionalProperties\":true}}}");
    for (size_t i = 0; i < results_components_count; i++)
        evbuffer_add_printf(b, ",\"%s\":%s", results_components[i].name,
                            results_components[i].schema);
    evbuffer_add_printf(b, "},\"responses\":{");
    for (size_t i = 0; i < sizeof(statuses) / sizeof(statuses[0]); i++) {
        bool retry = statuses[i] == 429 || statuses[i] == 503;
        evbuffer_add_printf(b, "%s\"E%d\":{\"description\":\"%s\",", i ? "," : "", statuses[i],
                            status_text(statuses[i]));
        if (retry)
            evbuffer_add_printf(b, "\"headers\":{\"Retry-After\":{\"description\":\"seconds "
                                   "to wait before retrying, when the server knows\",\"schema\":"
                                   "{\"$ref\":\"#/components/schemas/RetryAfter\"}}},");
        evbuffer_add_printf(b, "\"content\":{\"application/json\":"
                               "{\"schema\":{\"$ref\":\"#/components/schemas/Error\"}}}}");
    }
    evbuffer_add_printf(b, "}}}\n");
    int rc = evbuffer_add_buffer(out, b) == 0 ? 0 : -ENOMEM;
    evbuffer_free(b);
    return rc;
}
