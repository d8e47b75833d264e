/* server/net/hapi.c: HTTP/1.1 and the JSON API on a connection of the HTTP port (see
 * hapi.h). */
#include "hapi.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include <event2/buffer.h>
#include <sodium.h>

#include "auth.h"
#include "console.h"
#include "http.h"
#include "http1.h"
#include "json.h"
#include "log.h"
#include "hooks.h"
#include "metrics.h"
#include "req.h"
#include "rest.h"

/* A request head longer than this is refused (431). */
#define HEAD_MAX 16384
/* Nesting of a result or an error printed as JSON: results nest a few levels around
 * metadata, which is at most 16 deep. */
#define OUT_DEPTH 64
#define PREFIX "/v1/rpc/"

enum { STAGE_NONE, STAGE_AUTH, STAGE_CALL };
enum { MSGID_AUTH = 1, MSGID_CALL = 2 };

struct hapi {
    conn *c;
    server *srv;
    rpc_scanner *scan;   /* the RPC limits, applied to what a JSON body becomes */
    size_t head_scanned; /* http1_find_end's resume point in the head being received */
    bool continue_sent;  /* "100 Continue" went out for the request being received */
    bool had_request;    /* a whole request has arrived */
    /* the exchange in progress: one at a time, answered in order */
    bool busy;
    int stage;
    bool pending;  /* the call waits in call[] to be dispatched (its auth succeeded) */
    uint8_t *call; /* the method's MessagePack-RPC request, while auth runs before it */
    size_t call_len;
    size_t midx; /* the method's index for metrics of answers given here; SIZE_MAX: none */
    bool keep_alive, head_only, emb_array;
    /* the request's Origin when cors_allowed_origins lists it (echoed in
     * Access-Control-Allow-Origin), else origin_len 0 */
    char origin[256];
    size_t origin_len;
    /* the bearer key the connection's identity was established with (keyed hash) */
    bool have_key;
    uint8_t key_hash[32], pending_hash[32];
};

hapi *hapi_create(conn *c)
{
    hapi *h = calloc(1, sizeof(*h));
    if (!h)
        return NULL;
    h->c = c;
    h->srv = conn_server(c);
    h->scan = rpc_scanner_create(&h->srv->limits);
    if (!h->scan) {
        free(h);
        return NULL;
    }
    h->midx = SIZE_MAX;
    return h;
}

void hapi_destroy(hapi *h)
{
    if (!h)
        return;
    rpc_scanner_destroy(h->scan);
    free(h->call);
    free(h);
}

/* ---- answers ---------------------------------------------------------------------------- */

typedef struct extra {
    long retry_after; /* seconds, or -1 */
    bool bearer;      /* WWW-Authenticate */
    const char *allow;
    const char *cache;   /* Cache-Control; NULL: no-store */
    const char *etag;    /* ETag, or NULL */
    const char *headers; /* more header lines, each ended by CRLF, or NULL */
} extra;

/* Ends the exchange with an answer. The connection closes after it unless kept alive. */
/* Appends to the response head buf (cap bytes, *len used so far); a head that would not fit
 * stops growing (the caller answers 500 instead), so *len never passes cap - 1. Returns
 * false once it did not fit. */
static bool head_add(char *buf, size_t cap, size_t *len, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static bool head_add(char *buf, size_t cap, size_t *len, const char *fmt, ...)
{
    if (*len >= cap - 1)
        return false;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf + *len, cap - *len, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= cap - *len) {
        *len = cap - 1;
        return false;
    }
    *len += (size_t)n;
    return true;
}

/* The CORS headers of every answer when cors_allowed_origins is set: Vary: Origin (the
 * answer depends on it), and for a listed origin that origin, never '*', with the headers
 * a page may read. Returns head_add's result. */
static bool cors_headers(hapi *h, char *head, size_t cap, size_t *len)
{
    if (!h->srv->cfg.cors_allowed_origins[0])
        return true;
    if (!h->origin_len)
        return head_add(head, cap, len, "Vary: Origin\r\n");
    return head_add(head, cap, len,
                    "Vary: Origin\r\nAccess-Control-Allow-Origin: %.*s\r\n"
                    "Access-Control-Expose-Headers: Retry-After, ETag, WWW-Authenticate\r\n",
                    (int)h->origin_len, h->origin);
}

static void respond(hapi *h, int status, const char *ctype, const void *body, size_t n,
                    const extra *x)
{
    char head[2048], date[64];
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    strftime(date, sizeof(date), "%a, %d %b %Y %H:%M:%S GMT", &tm);
    size_t len = 0;
    bool ok = head_add(head, sizeof(head), &len, "HTTP/1.1 %d %s\r\nDate: %s\r\n", status,
                       http1_reason(status), date);
    if (status != 204) /* a 204 has neither (RFC 9110 8.6) */
        ok = ok && head_add(head, sizeof(head), &len, "Content-Type: %s\r\nContent-Length: %zu\r\n",
                            ctype, n);
    ok = ok && head_add(head, sizeof(head), &len,
                        "Cache-Control: %s\r\nX-Content-Type-Options: nosniff\r\n",
                        x && x->cache ? x->cache : "no-store");
    ok = ok && cors_headers(h, head, sizeof(head), &len);
    if (x && x->etag)
        ok = ok && head_add(head, sizeof(head), &len, "ETag: %s\r\n", x->etag);
    if (x && x->headers)
        ok = ok && head_add(head, sizeof(head), &len, "%s", x->headers);
    if (x && x->retry_after >= 0)
        ok = ok && head_add(head, sizeof(head), &len, "Retry-After: %ld\r\n", x->retry_after);
    if (x && x->bearer)
        ok = ok &&
             head_add(head, sizeof(head), &len, "WWW-Authenticate: Bearer realm=\"engram\"\r\n");
    if (x && x->allow)
        ok = ok && head_add(head, sizeof(head), &len, "Allow: %s\r\n", x->allow);
    if (!h->keep_alive)
        ok = ok && head_add(head, sizeof(head), &len, "Connection: close\r\n");
    ok = ok && head_add(head, sizeof(head), &len, "\r\n");
    if (!ok) {
        /* cannot happen with the fixed headers above; never send a cut head */
        static const char fail[] = "HTTP/1.1 500 Internal Server Error\r\nContent-Length: 0\r\n"
                                   "Connection: close\r\n\r\n";
        log_error("HTTP response head longer than %zu bytes", sizeof(head));
        conn_send(h->c, fail, sizeof(fail) - 1);
        h->keep_alive = false;
        n = 0;
    } else {
        conn_send(h->c, head, len);
    }
    if (!h->head_only && n)
        conn_send(h->c, body, n);
    h->busy = false;
    h->stage = STAGE_NONE;
    h->pending = false;
    free(h->call);
    h->call = NULL;
    if (!h->keep_alive)
        conn_close_after_flush(h->c);
}

/* The HTTP status of an error code. */
static int status_of(const char *code, size_t n)
{
    static const struct {
        const char *code;
        int status;
    } map[] = {
        {"invalid_argument", 400},
        {"malformed_request", 400},
        {"unknown_method", 404},
        {"unauthenticated", 401},
        {"permission_denied", 403},
        {"not_found", 404},
        {"already_exists", 409},
        {"conflict", 409},
        {"quota_exceeded", 429},
        {"rate_limited", 429},
        {"cost_limit_exceeded", 402},
        {"unavailable", 503},
        {"internal", 500},
        {"result_too_large", 413},
    };
    for (size_t i = 0; i < sizeof(map) / sizeof(map[0]); i++)
        if (strlen(map[i].code) == n && memcmp(map[i].code, code, n) == 0)
            return map[i].status;
    return 500;
}

/* An error made here (not by a handler): {"error": {code, message}}. */
static void local_error(hapi *h, int status, rpc_code code, const extra *x, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

static void local_error(hapi *h, int status, rpc_code code, const extra *x, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    msgpack_sbuffer sb;
    msgpack_packer pk;
    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 2);
    rpc_pack_kv_str(&pk, "code", rpc_code_name(code));
    rpc_pack_kv_str(&pk, "message", msg);
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    json_buf jb = {0};
    int rc = -ENOMEM;
    if (msgpack_unpack_next(&u, sb.data, sb.size, NULL) == MSGPACK_UNPACK_SUCCESS &&
        json_buf_append(&jb, "{\"error\":", 9) == 0 && json_from_msgpack(&u.data, 0, 4, &jb) == 0 &&
        json_buf_append(&jb, "}\n", 2) == 0)
        rc = 0;
    if (h->midx != SIZE_MAX || code == RPC_UNKNOWN_METHOD)
        metrics_request(h->midx, code, 0);
    if (rc == 0)
        respond(h, status, "application/json", jb.data, jb.len, x);
    else
        respond(h, 500, "application/json", "{\"error\":{\"code\":\"internal\"}}\n", 29, NULL);
    json_buf_fini(&jb);
    msgpack_unpacked_destroy(&u);
    msgpack_sbuffer_destroy(&sb);
}

/* An error answer of a request (the error map of its response). */
static void respond_error(hapi *h, const msgpack_object *err)
{
    const msgpack_object *code = rpc_map_get(err, "code");
    int status = code && code->type == MSGPACK_OBJECT_STR
                     ? status_of(code->via.str.ptr, code->via.str.size)
                     : 500;
    extra x = {.retry_after = -1, .bearer = status == 401};
    if (rpc_str_eq(code, "rate_limited")) {
        uint64_t ms = rpc_get_uint(rpc_map_get(err, "retry_after_ms"), 1000);
        x.retry_after = (long)((ms + 999) / 1000);
    } else if (rpc_str_eq(code, "quota_exceeded")) {
        const msgpack_object *at = rpc_map_get(err, "resets_at");
        if (at) {
            int64_t wait = rpc_get_int(at, 0) - server_now_ms();
            x.retry_after = wait > 0 ? (long)((wait + 999) / 1000) : 1;
        }
    }
    if (x.retry_after == 0)
        x.retry_after = 1;
    json_buf jb = {0};
    if (json_buf_append(&jb, "{\"error\":", 9) == 0 &&
        json_from_msgpack(err, JSON_BIN_BASE64, OUT_DEPTH, &jb) == 0 &&
        json_buf_append(&jb, "}\n", 2) == 0)
        respond(h, status, "application/json", jb.data, jb.len, &x);
    else
        local_error(h, 500, RPC_INTERNAL, NULL, "the error has no JSON form");
    json_buf_fini(&jb);
}

/* With ?embeddings=array: every bin under a key "embedding" (little-endian float32) becomes
 * an array of numbers, in place, with the arrays allocated in zone. Returns 0 or -ENOMEM. */
static int embeddings_to_arrays(msgpack_object *o, msgpack_zone *zone, unsigned depth)
{
    if (depth > OUT_DEPTH)
        return 0; /* json_from_msgpack refuses it anyway */
    if (o->type == MSGPACK_OBJECT_ARRAY) {
        for (uint32_t i = 0; i < o->via.array.size; i++)
            if (embeddings_to_arrays(&o->via.array.ptr[i], zone, depth + 1) < 0)
                return -ENOMEM;
    } else if (o->type == MSGPACK_OBJECT_MAP) {
        for (uint32_t i = 0; i < o->via.map.size; i++) {
            msgpack_object_kv *kv = &o->via.map.ptr[i];
            msgpack_object *v = &kv->val;
            if (rpc_str_eq(&kv->key, "embedding") && v->type == MSGPACK_OBJECT_BIN &&
                v->via.bin.size % 4 == 0) {
                uint32_t dim = v->via.bin.size / 4;
                msgpack_object *a = dim ? msgpack_zone_malloc(zone, dim * sizeof(*a)) : NULL;
                if (dim && !a)
                    return -ENOMEM;
                const unsigned char *p = (const unsigned char *)v->via.bin.ptr;
                for (uint32_t k = 0; k < dim; k++) {
                    uint32_t bits = (uint32_t)p[4 * k] | (uint32_t)p[4 * k + 1] << 8 |
                                    (uint32_t)p[4 * k + 2] << 16 | (uint32_t)p[4 * k + 3] << 24;
                    float f;
                    memcpy(&f, &bits, sizeof(f));
                    a[k].type = MSGPACK_OBJECT_FLOAT32;
                    a[k].via.f64 = f;
                }
                v->type = MSGPACK_OBJECT_ARRAY;
                v->via.array.size = dim;
                v->via.array.ptr = a;
            } else if (embeddings_to_arrays(v, zone, depth + 1) < 0) {
                return -ENOMEM;
            }
        }
    }
    return 0;
}

static void respond_result(hapi *h, msgpack_object *result, msgpack_zone *zone)
{
    msgpack_object nil = {.type = MSGPACK_OBJECT_NIL};
    if (!result)
        result = &nil;
    if (h->emb_array && embeddings_to_arrays(result, zone, 0) < 0) {
        local_error(h, 500, RPC_INTERNAL, NULL, "out of memory");
        return;
    }
    json_buf jb = {0};
    int rc = json_from_msgpack(result, JSON_BIN_BASE64, OUT_DEPTH, &jb);
    if (rc == 0 && json_buf_append(&jb, "\n", 1) == 0) {
        respond(h, 200, "application/json", jb.data, jb.len, NULL);
    } else {
        log_error("%s: the result has no JSON form (%d)",
                  h->midx < h->srv->hooks->nmethods ? h->srv->hooks->methods[h->midx].name : "?",
                  rc);
        local_error(h, 500, RPC_INTERNAL, NULL, "the result has no JSON form");
    }
    json_buf_fini(&jb);
}

void hapi_on_response(hapi *h, const void *data, size_t len)
{
    if (!h->busy)
        return; /* nothing asked for it: never happens */
    msgpack_zone zone;
    msgpack_zone_init(&zone, 2048);
    rpc_response resp;
    char err[256];
    if (rpc_decode_response(data, len, &zone, &resp, err, sizeof(err)) != 0) {
        log_error("HTTP: cannot read a response: %s", err);
        local_error(h, 500, RPC_INTERNAL, NULL, "internal error");
    } else if (h->stage == STAGE_AUTH) {
        if (resp.error) {
            h->have_key = false;
            respond_error(h, resp.error);
        } else {
            /* the call runs next, from the read loop (conn_release resumes it) */
            memcpy(h->key_hash, h->pending_hash, sizeof(h->key_hash));
            h->have_key = true;
            h->pending = true;
            h->stage = STAGE_CALL;
        }
    } else if (resp.error) {
        respond_error(h, resp.error);
    } else {
        respond_result(h, (msgpack_object *)resp.result, &zone);
    }
    msgpack_zone_destroy(&zone);
}

bool hapi_had_request(hapi *h)
{
    return h->had_request;
}

bool hapi_timeout(hapi *h)
{
    if (h->busy)
        return false;
    h->keep_alive = false;
    h->head_only = false;
    h->midx = SIZE_MAX;
    local_error(h, 408, RPC_MALFORMED_REQUEST, NULL,
                "the request did not arrive within %d ms (frame_timeout_ms)",
                h->srv->cfg.frame_timeout_ms);
    return true;
}

/* ---- requests --------------------------------------------------------------------------- */

/* Packs value v of parameter p, turning a base64 string into bin where p takes a vector or
 * binary (nested: the "embedding" of each map in an array parameter, as memory.store_batch's
 * memories carry). Returns 0, or RPC_E_INVALID with err. */
static int pack_param(msgpack_packer *pk, const rpc_param *p, const msgpack_object *v, bool nested,
                      char *err, size_t errlen)
{
    bool binary = p && (p->type == RPC_T_VECTOR || p->type == RPC_T_BIN);
    if (binary && v->type == MSGPACK_OBJECT_STR) {
        size_t n = v->via.str.size, got = 0;
        unsigned char *bin = malloc(n / 4 * 3 + 3);
        if (!bin)
            return -ENOMEM;
        const char *end = NULL;
        if (sodium_base642bin(bin, n / 4 * 3 + 3, v->via.str.ptr, n, NULL, &got, &end,
                              sodium_base64_VARIANT_ORIGINAL) != 0 ||
            end != v->via.str.ptr + n) {
            free(bin);
            snprintf(err, errlen, "parameter '%s%s' is not valid base64", nested ? "[]." : "",
                     p->name);
            return RPC_E_INVALID;
        }
        msgpack_pack_bin(pk, got);
        msgpack_pack_bin_body(pk, bin, got);
        free(bin);
        return 0;
    }
    if (p && p->type == RPC_T_ARRAY && !nested && v->type == MSGPACK_OBJECT_ARRAY) {
        static const rpc_param emb = {"embedding", RPC_T_VECTOR, 0, 0, 0};
        msgpack_pack_array(pk, v->via.array.size);
        for (uint32_t i = 0; i < v->via.array.size; i++) {
            const msgpack_object *e = &v->via.array.ptr[i];
            if (e->type != MSGPACK_OBJECT_MAP) {
                msgpack_pack_object(pk, *e);
                continue;
            }
            msgpack_pack_map(pk, e->via.map.size);
            for (uint32_t k = 0; k < e->via.map.size; k++) {
                const msgpack_object_kv *kv = &e->via.map.ptr[k];
                msgpack_pack_object(pk, kv->key);
                if (!rpc_str_eq(&kv->key, "embedding")) {
                    msgpack_pack_object(pk, kv->val);
                    continue;
                }
                int rc = pack_param(pk, &emb, &kv->val, true, err, errlen);
                if (rc)
                    return rc;
            }
        }
        return 0;
    }
    msgpack_pack_object(pk, *v);
    return 0;
}

static const rpc_param *param_named(const method_def *m, const msgpack_object *key)
{
    for (size_t i = 0; m && key->type == MSGPACK_OBJECT_STR && i < m->nparams; i++)
        if (rpc_str_eq(key, m->params[i].name))
            return &m->params[i];
    return NULL;
}

/* Dispatches msg (the exchange's stage says what it is). */
static int dispatch(hapi *h, const uint8_t *msg, size_t len)
{
    h->busy = true;
    int d = conn_dispatch(h->c, msg, len);
    return d < 0 ? HAPI_CLOSE : HAPI_AGAIN;
}

/* Whether path is one of the health and metrics endpoints (served on the probes' reserved
 * connections too). */
static bool probe_path(const char *path, size_t n)
{
    static const char *const probes[] = {"/livez", "/readyz", "/healthz", "/metrics"};
    for (size_t i = 0; i < sizeof(probes) / sizeof(probes[0]); i++)
        if (strlen(probes[i]) == n && memcmp(probes[i], path, n) == 0)
            return true;
    return false;
}

/* The checks of a call before its body is read: the embeddings query parameter, a method
 * served over HTTP, the bearer key (*key, *key_len; none: 0) where one is needed. Returns 0,
 * or -1 after answering the error. */
static int call_checks(hapi *h, const http1_request *rq, const method_def *m, const char **key,
                       size_t *key_len)
{
    const char *ev = NULL;
    long evn = http1_query_get(rq->query, rq->query_len, "embeddings", &ev);
    h->emb_array = evn == 5 && memcmp(ev, "array", 5) == 0;
    if (evn >= 0 && !h->emb_array && !(evn == 6 && memcmp(ev, "base64", 6) == 0)) {
        local_error(h, 400, RPC_INVALID_ARGUMENT, NULL,
                    "query parameter 'embeddings' must be 'array' or 'base64'");
        return -1;
    }
    if (m && (m->flags & M_AUTH)) {
        local_error(h, 404, RPC_UNKNOWN_METHOD, NULL,
                    "%s is not served over HTTP: send 'Authorization: Bearer <api key>' with "
                    "each request",
                    m->name);
        return -1;
    }
    *key = NULL;
    *key_len = 0;
    if (rq->authorization) {
        const char *a = rq->authorization;
        size_t n = rq->authorization_len;
        if (n < 7 || strncasecmp(a, "bearer ", 7) != 0) {
            extra x = {.retry_after = -1, .bearer = true};
            local_error(h, 401, RPC_UNAUTHENTICATED, &x,
                        "Authorization must be 'Bearer <api key>'");
            return -1;
        }
        *key = a + 7;
        *key_len = n - 7;
        while (*key_len && (**key == ' ' || **key == '\t'))
            (*key)++, (*key_len)--;
    }
    if (m && !(m->flags & M_PUBLIC) && !*key_len) {
        extra x = {.retry_after = -1, .bearer = true};
        local_error(h, 401, RPC_UNAUTHENTICATED, &x,
                    "not authenticated: send 'Authorization: Bearer <api key>'");
        return -1;
    }
    return 0;
}

/* Reads the body (a JSON object of named parameters, or nothing) as MessagePack under the
 * RPC limits into *top (in zone; nil when there is no body; params holds its bytes).
 * Returns 0, or -1 after answering the error. */
static int read_body(hapi *h, const uint8_t *body, size_t body_len, msgpack_sbuffer *params,
                     msgpack_zone *zone, msgpack_object *top)
{
    char err[300];
    *top = (msgpack_object){.type = MSGPACK_OBJECT_NIL};
    size_t i = 0;
    while (i < body_len &&
           (body[i] == ' ' || body[i] == '\t' || body[i] == '\r' || body[i] == '\n'))
        i++;
    if (i == body_len)
        return 0;
    unsigned depth = h->srv->limits.max_depth > 2 ? h->srv->limits.max_depth - 2 : 1;
    msgpack_packer pk;
    msgpack_packer_init(&pk, params, msgpack_sbuffer_write);
    int rc = json_to_msgpack((const char *)body, body_len, depth, &pk, err, sizeof(err));
    if (rc == -ENOMEM) {
        local_error(h, 500, RPC_INTERNAL, NULL, "out of memory");
        return -1;
    }
    if (rc != 0) {
        local_error(h, 400, RPC_MALFORMED_REQUEST, NULL, "the body is not JSON: %s", err);
        return -1;
    }
    size_t mlen;
    rpc_scanner_reset(h->scan);
    rc = rpc_scanner_scan(h->scan, (const uint8_t *)params->data, params->size, &mlen, err,
                          sizeof(err));
    rpc_scanner_reset(h->scan);
    if (rc == RPC_E_TOO_LARGE) {
        local_error(h, 413, RPC_INVALID_ARGUMENT, NULL, "the request is too large: %s", err);
        return -1;
    }
    if (rc != 0) {
        local_error(h, 400, RPC_MALFORMED_REQUEST, NULL, "%s", err);
        return -1;
    }
    size_t off = 0;
    if (msgpack_unpack((const char *)params->data, params->size, &off, zone, top) !=
        MSGPACK_UNPACK_SUCCESS) {
        local_error(h, 500, RPC_INTERNAL, NULL, "out of memory");
        return -1;
    }
    if (top->type != MSGPACK_OBJECT_MAP) {
        local_error(h, 400, RPC_MALFORMED_REQUEST, NULL,
                    "the body must be a JSON object of named parameters");
        return -1;
    }
    return 0;
}

/* Packs the call of method name (m: its entry, or NULL when unknown) with the named
 * parameters top (a map, or nil for none) into msg, each converted to its type (pack_param).
 * Returns 0, or -1 after answering the error. */
/* The index of key in map top, or -1. */
static long map_index(const msgpack_object *top, const msgpack_object *key)
{
    for (uint32_t k = 0; top->type == MSGPACK_OBJECT_MAP && k < top->via.map.size; k++)
        if (msgpack_object_equal(top->via.map.ptr[k].key, *key))
            return (long)k;
    return -1;
}

/* Packs the call of method name with the body's parameters (top: a map, or anything else
 * for none) and the path's and query's (x[0..nx), a REST route's; a body naming one of
 * them must give the same value). Returns 0, or -1 after answering the error. */
static int pack_call(hapi *h, const method_def *m, const char *name, size_t name_len,
                     const msgpack_object *top, const msgpack_object_kv *x, size_t nx,
                     msgpack_sbuffer *msg)
{
    char err[300];
    bool no_args = top->type != MSGPACK_OBJECT_MAP && nx == 0;
    uint32_t n = top->type == MSGPACK_OBJECT_MAP ? top->via.map.size : 0, size = n;
    for (size_t i = 0; i < nx; i++) {
        long at = map_index(top, &x[i].key);
        if (at < 0) {
            size++;
        } else if (!msgpack_object_equal(top->via.map.ptr[at].val, x[i].val)) {
            local_error(h, 400, RPC_INVALID_ARGUMENT, NULL,
                        "parameter '%.*s' differs between the path or query and the body",
                        (int)x[i].key.via.str.size, x[i].key.via.str.ptr);
            return -1;
        }
    }
    msgpack_packer pk;
    msgpack_packer_init(&pk, msg, msgpack_sbuffer_write);
    msgpack_pack_array(&pk, 4);
    msgpack_pack_uint8(&pk, RPC_KIND_REQUEST);
    msgpack_pack_uint32(&pk, MSGID_CALL);
    rpc_pack_strn(&pk, name, name_len);
    msgpack_pack_array(&pk, no_args ? 0 : 1);
    if (!no_args) {
        msgpack_pack_map(&pk, size);
        for (uint32_t k = 0; k < n + nx; k++) {
            const msgpack_object_kv *kv = k < n ? &top->via.map.ptr[k] : &x[k - n];
            if (k >= n && map_index(top, &kv->key) >= 0)
                continue; /* given in the body too, with the same value */
            msgpack_pack_object(&pk, kv->key);
            int rc = pack_param(&pk, param_named(m, &kv->key), &kv->val, false, err, sizeof(err));
            if (rc == -ENOMEM) {
                local_error(h, 500, RPC_INTERNAL, NULL, "out of memory");
                return -1;
            }
            if (rc != 0) {
                local_error(h, 400, RPC_INVALID_ARGUMENT, NULL, "%s", err);
                return -1;
            }
        }
    }
    if (msg->size > h->srv->limits.max_message) {
        local_error(h, 413, RPC_INVALID_ARGUMENT, NULL,
                    "the request is too large: %zu bytes as MessagePack, over %zu", msg->size,
                    h->srv->limits.max_message);
        return -1;
    }
    return 0;
}

/* Sends the call msg: first an auth with key when the connection is not authenticated as
 * that key already (the connection keeps the identity of the last key that passed; the call
 * waits in h->call for the auth's answer). Returns dispatch's result. */
static int send_call(hapi *h, const char *key, size_t key_len, msgpack_sbuffer *msg)
{
    if (key_len) {
        uint8_t hash[32];
        auth_hash(h->srv, key, key_len, hash);
        if (!(h->have_key && auth_equal(hash, h->key_hash) && conn_get_auth(h->c)->authenticated)) {
            h->call = malloc(msg->size);
            if (!h->call) {
                local_error(h, 500, RPC_INTERNAL, NULL, "out of memory");
                return HAPI_AGAIN;
            }
            memcpy(h->call, msg->data, msg->size);
            h->call_len = msg->size;
            memcpy(h->pending_hash, hash, sizeof(hash));
            h->have_key = false;
            msgpack_sbuffer_clear(msg);
            msgpack_packer pk;
            msgpack_packer_init(&pk, msg, msgpack_sbuffer_write);
            msgpack_pack_array(&pk, 4);
            msgpack_pack_uint8(&pk, RPC_KIND_REQUEST);
            msgpack_pack_uint32(&pk, MSGID_AUTH);
            rpc_pack_cstr(&pk, "auth");
            msgpack_pack_array(&pk, 1);
            msgpack_pack_map(&pk, 1);
            rpc_pack_cstr(&pk, "api_key");
            rpc_pack_strn(&pk, key, key_len);
            h->stage = STAGE_AUTH;
            int ret = dispatch(h, (const uint8_t *)msg->data, msg->size);
            sodium_memzero(msg->data, msg->size); /* it held the key */
            return ret;
        }
    }
    h->stage = STAGE_CALL;
    return dispatch(h, (const uint8_t *)msg->data, msg->size);
}

/* The parameters a REST route adds to the body's (rest_args), into x; the count, or -1
 * after answering the error. */
static long route_args(hapi *h, const http1_request *rq, const rest_route *rr, uint64_t id,
                       const method_def *m, const msgpack_object *top, msgpack_zone *zone,
                       msgpack_object_kv *x)
{
    char err[200];
    if (top->type != MSGPACK_OBJECT_MAP && top->type != MSGPACK_OBJECT_NIL) {
        local_error(h, 400, RPC_INVALID_ARGUMENT, NULL,
                    "the body must be a JSON object of %s's parameters", rr->method);
        return -1;
    }
    long nx = rest_args(rr, id, rq->query, rq->query_len, m->params, m->nparams, zone, x, err,
                        sizeof(err));
    if (nx == -ENOMEM)
        local_error(h, 500, RPC_INTERNAL, NULL, "out of memory");
    else if (nx < 0)
        local_error(h, 400, RPC_INVALID_ARGUMENT, NULL, "%s", err);
    return nx < 0 ? -1 : nx;
}

/* POST /v1/rpc/{name} with its JSON body (rr NULL), or a seed's REST path (rest.h): rr's
 * method with the body's parameters, the path's id and the query's. */
static int rpc_call(hapi *h, const http1_request *rq, const char *name, size_t name_len,
                    const rest_route *rr, uint64_t id, const uint8_t *body, size_t body_len)
{
    size_t idx = SIZE_MAX;
    const net_hooks *hk = h->srv->hooks;
    const method_def *m = hooks_method_find(hk->methods, hk->nmethods, name, name_len, &idx);
    h->midx = m ? idx : SIZE_MAX;
    const char *key;
    size_t key_len;
    if (rr && !m) {
        local_error(h, 404, RPC_UNKNOWN_METHOD, NULL, "%s is not served", rr->method);
        return HAPI_AGAIN;
    }
    if (call_checks(h, rq, m, &key, &key_len) < 0)
        return HAPI_AGAIN;
    msgpack_sbuffer params, msg;
    msgpack_sbuffer_init(&params);
    msgpack_sbuffer_init(&msg);
    msgpack_zone zone;
    msgpack_zone_init(&zone, 2048);
    msgpack_object top;
    msgpack_object_kv x[1 + REST_QUERY_MAX];
    long nx = 0;
    int ret = HAPI_AGAIN;
    if (read_body(h, body, body_len, &params, &zone, &top) == 0 &&
        (!rr || (nx = route_args(h, rq, rr, id, m, &top, &zone, x)) >= 0) &&
        pack_call(h, m, name, name_len, &top, x, (size_t)nx, &msg) == 0)
        ret = send_call(h, key, key_len, &msg);
    msgpack_zone_destroy(&zone);
    msgpack_sbuffer_destroy(&params);
    msgpack_sbuffer_destroy(&msg);
    return ret;
}

/* GET /console...: the web console's embedded files (console.h), with its security headers;
 * 304 when If-None-Match names the file's ETag. f is NULL for a console path naming no file. */
static void serve_console(hapi *h, const http1_request *rq, const console_file *f)
{
    if (rq->method != HTTP1_GET && rq->method != HTTP1_HEAD) {
        extra x = {.retry_after = -1, .allow = "GET, HEAD"};
        local_error(h, 405, RPC_INVALID_ARGUMENT, &x, "use GET for the console");
        return;
    }
    if (!f) {
        local_error(h, 404, RPC_NOT_FOUND, NULL, "no such console file");
        return;
    }
    extra x = {.retry_after = -1,
               .cache = CONSOLE_CACHE_CONTROL,
               .etag = f->etag,
               .headers = console_headers()};
    bool fresh = console_not_modified(f, rq->if_none_match, rq->if_none_match_len);
    if (fresh)
        h->head_only = true; /* a 304 has the 200's Content-Length but no body */
    respond(h, fresh ? 304 : 200, f->ctype, f->data, f->len, &x);
}

/* Parses a request's head from in (len bytes) into *rq and its body's length. Returns
 * HAPI_AGAIN when it is good, HAPI_MORE when incomplete, HAPI_CLOSE after answering a bad
 * one (the connection closes after it). */
static int read_head(hapi *h, const uint8_t *in, size_t len, http1_request *rq, uint64_t *body_len)
{
    char err[256];
    h->midx = SIZE_MAX;
    h->head_only = false;
    h->origin_len = 0;
    int rc = http1_parse_head(in, len, HEAD_MAX, rq, err, sizeof(err));
    if (rc == HTTP1_E_INCOMPLETE)
        return HAPI_MORE;
    if (rc != 0) {
        h->keep_alive = false;
        local_error(h,
                    rc == HTTP1_E_TOO_LARGE ? 431
                    : rc == HTTP1_E_VERSION ? 505
                                            : 400,
                    RPC_MALFORMED_REQUEST, NULL, "%s", err);
        return HAPI_CLOSE;
    }
    h->keep_alive = rq->keep_alive;
    h->head_only = rq->method == HTTP1_HEAD;
    if (rq->origin && rq->origin_len <= sizeof(h->origin) &&
        http1_origin_listed(h->srv->cfg.cors_allowed_origins, rq->origin, rq->origin_len)) {
        memcpy(h->origin, rq->origin, rq->origin_len);
        h->origin_len = rq->origin_len;
    }
    if (rq->transfer_encoding) {
        h->keep_alive = false;
        local_error(h, 411, RPC_MALFORMED_REQUEST, NULL,
                    "Transfer-Encoding is not supported: send the body with Content-Length");
        return HAPI_CLOSE;
    }
    *body_len = rq->has_length ? rq->content_length : 0;
    if (*body_len > h->srv->limits.max_message) {
        h->keep_alive = false;
        local_error(h, 413, RPC_INVALID_ARGUMENT, NULL,
                    "the body of %llu bytes is over the limit of %zu (max_message_bytes)",
                    (unsigned long long)*body_len, h->srv->limits.max_message);
        return HAPI_CLOSE;
    }
    return HAPI_AGAIN;
}

/* The GET endpoints (http.c: health, metrics, OpenAPI), or 404. */
static int serve_get(hapi *h, const http1_request *rq)
{
    struct evbuffer *b = evbuffer_new();
    if (!b) {
        h->keep_alive = false;
        local_error(h, 500, RPC_INTERNAL, NULL, "out of memory");
        return HAPI_CLOSE;
    }
    const char *ctype = "application/json";
    int status = http_get(h->srv, rq->path, rq->path_len, b, &ctype);
    if (status && rq->method != HTTP1_GET && rq->method != HTTP1_HEAD) {
        extra x = {.retry_after = -1, .allow = "GET, HEAD"};
        local_error(h, 405, RPC_INVALID_ARGUMENT, &x, "use GET for %.*s", (int)rq->path_len,
                    rq->path);
    } else if (status) {
        size_t n = evbuffer_get_length(b);
        const unsigned char *p = n ? evbuffer_pullup(b, -1) : (const unsigned char *)"";
        if (!p)
            local_error(h, 500, RPC_INTERNAL, NULL, "out of memory");
        else
            respond(h, status, ctype, p, n, NULL);
    } else {
        local_error(h, 404, RPC_NOT_FOUND, NULL,
                    "no such path: POST /v1/rpc/{method}, the seeds' REST paths (/v1/memory, "
                    "/v1/sessions...: see /v1/openapi.json), GET /v1/openapi.json, /healthz, "
                    "/readyz, /livez, /metrics, /metrics/history or /console");
    }
    evbuffer_free(b);
    return HAPI_AGAIN;
}

/* OPTIONS with cors_allowed_origins set: a CORS preflight. A listed origin gets 204 with
 * the methods and request headers the port takes (read_head set its origin for
 * cors_headers); any other origin, or none, gets 403. */
static void cors_preflight(hapi *h, const http1_request *rq)
{
    if (!h->origin_len) {
        local_error(
            h, 403, RPC_PERMISSION_DENIED, NULL, "origin '%.*s' is not in cors_allowed_origins",
            (int)(rq->origin_len > 200 ? 200 : rq->origin_len), rq->origin ? rq->origin : "");
        return;
    }
    extra x = {.retry_after = -1,
               .cache = "no-store",
               .headers = "Access-Control-Allow-Methods: GET, HEAD, POST, PATCH, OPTIONS\r\n"
                          "Access-Control-Allow-Headers: Authorization, Content-Type\r\n"
                          "Access-Control-Max-Age: 600\r\n"};
    respond(h, 204, "", "", 0, &x);
}

/* Routes one whole request (its body of body_len bytes at body): CORS preflights, the RPC
 * calls, the console, the GET endpoints (http.c). Returns a HAPI_* step result. */
static int route(hapi *h, const http1_request *rq, const uint8_t *body, size_t body_len)
{
    size_t plen = strlen(PREFIX);
    if (conn_get_auth(h->c)->reserved && !probe_path(rq->path, rq->path_len)) {
        /* accepted past http_max_connections: the probes' slots serve nothing else */
        h->keep_alive = false;
        extra x = {.retry_after = 1};
        local_error(h, 503, RPC_UNAVAILABLE, &x,
                    "the HTTP port's connections are all in use (http_max_connections); retry");
        return HAPI_CLOSE;
    }
    if (rq->method == HTTP1_OPTIONS && h->srv->cfg.cors_allowed_origins[0]) {
        cors_preflight(h, rq);
        return HAPI_AGAIN;
    }
    if (rq->path_len > plen && memcmp(rq->path, PREFIX, plen) == 0) {
        if (rq->method != HTTP1_POST) {
            extra x = {.retry_after = -1, .allow = "POST"};
            local_error(h, 405, RPC_INVALID_ARGUMENT, &x, "use POST for %.*s",
                        (int)(rq->path_len > 100 ? 100 : rq->path_len), rq->path);
            return HAPI_AGAIN;
        }
        const char *name = rq->path + plen;
        size_t n = rq->path_len - plen;
        bool ok = n <= 255;
        for (size_t k = 0; ok && k < n; k++)
            ok = name[k] > 0x20 && name[k] < 0x7f;
        if (!ok) {
            local_error(h, 404, RPC_UNKNOWN_METHOD, NULL, "unknown method");
            return HAPI_AGAIN;
        }
        return rpc_call(h, rq, name, n, NULL, 0, body, body_len);
    }
    uint64_t id;
    char allow[64];
    const rest_route *rr = rest_match(rq->method == HTTP1_HEAD ? HTTP1_OTHER : rq->method, rq->path,
                                      rq->path_len, &id, allow, sizeof(allow));
    if (rr)
        return rpc_call(h, rq, rr->method, strlen(rr->method), rr, id, body, body_len);
    if (allow[0]) {
        extra x = {.retry_after = -1, .allow = allow};
        local_error(h, 405, RPC_INVALID_ARGUMENT, &x, "use %s for %.*s", allow,
                    (int)(rq->path_len > 100 ? 100 : rq->path_len), rq->path);
        return HAPI_AGAIN;
    }
    const console_file *cf;
    if (console_find(rq->path, rq->path_len, &cf)) {
        serve_console(h, rq, cf);
        return HAPI_AGAIN;
    }
    return serve_get(h, rq);
}

int hapi_step(hapi *h, const uint8_t *in, size_t len, size_t *consumed)
{
    *consumed = 0;
    if (h->pending) {
        /* auth passed: now the call it stood before */
        h->pending = false;
        uint8_t *msg = h->call;
        h->call = NULL;
        int rc = dispatch(h, msg, h->call_len);
        free(msg);
        return rc;
    }
    if (h->busy)
        return HAPI_BUSY;
    size_t skip = 0; /* empty lines before a request are allowed (RFC 9112 2.2) */
    while (h->head_scanned == 0 && skip < len && (in[skip] == '\r' || in[skip] == '\n'))
        skip++;
    if (skip) {
        *consumed = skip;
        return HAPI_AGAIN;
    }
    if (len == 0)
        return HAPI_MORE;
    if (len < HEAD_MAX && http1_find_end(in, len, &h->head_scanned) == 0)
        return HAPI_MORE;
    http1_request rq;
    uint64_t body_len;
    int rc = read_head(h, in, len, &rq, &body_len);
    if (rc != HAPI_AGAIN) {
        if (rc == HAPI_CLOSE)
            *consumed = len;
        return rc;
    }
    if (len - rq.head_len < body_len) {
        if (rq.expect_100 && !h->continue_sent) {
            static const char cont[] = "HTTP/1.1 100 Continue\r\n\r\n";
            conn_send(h->c, cont, sizeof(cont) - 1);
            h->continue_sent = true;
        }
        return HAPI_MORE;
    }
    /* the whole request is here */
    h->had_request = true;
    *consumed = rq.head_len + (size_t)body_len;
    h->head_scanned = 0;
    h->continue_sent = false;
    return route(h, &rq, in + rq.head_len, (size_t)body_len);
}
