/* server/domain/embedder.c: embedding providers (see embedder.h).
 *
 * builtin: index/embed.c, inline on the worker.
 * openai: any OpenAI-compatible POST /v1/embeddings endpoint (a local model server, a
 * hosted API), over HTTP or HTTPS (OpenSSL, the system's CA store, host name checked), on
 * the worker's event loop. Texts go out in batches of openai_batch inputs; a batch that
 * fails (connection error, timeout, non-200 status, malformed answer, wrong dimension) is
 * retried up to openai_retries times with a growing pause, then the whole request fails
 * with unavailable and nothing is stored.
 */
#include "embedder.h"

#include <errno.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/bufferevent_ssl.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <openssl/err.h>
#include <openssl/ssl.h>

#include "embed.h"
#include "json.h"
#include "log.h"

#define MAX_WORKERS 256
#define BG_SLOTS 16 /* embedder_run_sync's slots, after the workers' */
#define MAX_SLOTS (MAX_WORKERS + BG_SLOTS)
#define CONNS_PER_WORKER 4

typedef struct provider {
    bool configured;
    char *url;
    char *host;
    char *path;
    int port;
    bool https;
    char *auth; /* "Bearer <key>" or NULL */
    SSL_CTX *ssl;
    const config *cfg; /* the settings embedder_init got (openai_*); lives until exit */
} provider;

static provider openai;

/* Per-worker HTTP connections, created on that worker's thread on first use. */
typedef struct wconns {
    struct evhttp_connection *c[CONNS_PER_WORKER];
    unsigned next;
} wconns;

static wconns *per_worker[MAX_SLOTS];
static atomic_uint bg_slots_used; /* a bit per slot of embedder_run_sync */

int embedder_init(const config *cfg, char *err, size_t errlen)
{
    openai.cfg = cfg;
    if (!cfg->openai_url[0])
        return 0;
    struct evhttp_uri *u = evhttp_uri_parse(cfg->openai_url);
    if (!u || !evhttp_uri_get_scheme(u) || !evhttp_uri_get_host(u)) {
        snprintf(err, errlen, "openai_url '%s' is not an http(s) URL", cfg->openai_url);
        if (u)
            evhttp_uri_free(u);
        return -EINVAL;
    }
    const char *scheme = evhttp_uri_get_scheme(u);
    openai.https = strcmp(scheme, "https") == 0;
    if (!openai.https && strcmp(scheme, "http") != 0) {
        snprintf(err, errlen, "openai_url must start with http:// or https://");
        evhttp_uri_free(u);
        return -EINVAL;
    }
    openai.url = strdup(cfg->openai_url);
    openai.host = strdup(evhttp_uri_get_host(u));
    const char *path = evhttp_uri_get_path(u);
    openai.path = strdup(path && *path ? path : "/v1/embeddings");
    openai.port = evhttp_uri_get_port(u);
    if (openai.port < 0)
        openai.port = openai.https ? 443 : 80;
    evhttp_uri_free(u);
    const char *key = cfg->openai_key_env[0] ? getenv(cfg->openai_key_env) : NULL;
    if (key && *key) {
        size_t n = strlen(key) + 8;
        openai.auth = malloc(n);
        if (openai.auth)
            snprintf(openai.auth, n, "Bearer %s", key);
    } else if (cfg->openai_key_env[0]) {
        log_warn("embedding provider openai: environment variable %s is empty; requests go "
                 "without an API key",
                 cfg->openai_key_env);
    }
    if (openai.https) {
        openai.ssl = SSL_CTX_new(TLS_client_method());
        if (!openai.ssl || SSL_CTX_set_default_verify_paths(openai.ssl) != 1) {
            snprintf(err, errlen, "cannot set up TLS for openai_url");
            return -EIO;
        }
        SSL_CTX_set_verify(openai.ssl, SSL_VERIFY_PEER, NULL);
        SSL_CTX_set_min_proto_version(openai.ssl, TLS1_2_VERSION);
    }
    if (!openai.url || !openai.host || !openai.path) {
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    openai.configured = true;
    log_info("embedding provider openai: %s, model %s, dimension %d", openai.url, cfg->openai_model,
             cfg->openai_dim);
    return 0;
}

void embedder_fini(void)
{
    free(openai.url);
    free(openai.host);
    free(openai.path);
    if (openai.auth) {
        memset(openai.auth, 0, strlen(openai.auth));
        free(openai.auth);
    }
    if (openai.ssl)
        SSL_CTX_free(openai.ssl);
    memset(&openai, 0, sizeof(openai));
}

bool embedder_available(const char *provider_name)
{
    if (strcmp(provider_name, "builtin") == 0)
        return true;
    return strcmp(provider_name, "openai") == 0 && openai.configured;
}

void embedder_worker_fini(unsigned idx)
{
    if (idx >= MAX_SLOTS || !per_worker[idx])
        return;
    for (int i = 0; i < CONNS_PER_WORKER; i++)
        if (per_worker[idx]->c[i])
            evhttp_connection_free(per_worker[idx]->c[i]);
    free(per_worker[idx]);
    per_worker[idx] = NULL;
}

/* A connection of this worker to the provider; created on first use. */
static struct evhttp_connection *conn_for(struct event_base *base, unsigned idx, const config *cfg)
{
    if (idx >= MAX_SLOTS)
        return NULL;
    if (!per_worker[idx] && !(per_worker[idx] = calloc(1, sizeof(wconns))))
        return NULL;
    wconns *wc = per_worker[idx];
    unsigned slot = wc->next++ % CONNS_PER_WORKER;
    if (wc->c[slot])
        return wc->c[slot];
    struct evhttp_connection *c = NULL;
    if (openai.https) {
        SSL *ssl = SSL_new(openai.ssl);
        if (!ssl)
            return NULL;
        SSL_set_tlsext_host_name(ssl, openai.host);
        SSL_set1_host(ssl, openai.host);
        struct bufferevent *bev = bufferevent_openssl_socket_new(
            base, -1, ssl, BUFFEREVENT_SSL_CONNECTING, BEV_OPT_CLOSE_ON_FREE);
        if (!bev) {
            SSL_free(ssl);
            return NULL;
        }
        c = evhttp_connection_base_bufferevent_new(base, NULL, bev, openai.host,
                                                   (ev_uint16_t)openai.port);
    } else {
        c = evhttp_connection_base_new(base, NULL, openai.host, (ev_uint16_t)openai.port);
    }
    if (!c)
        return NULL;
    struct timeval tv = {.tv_sec = cfg->openai_timeout_ms / 1000,
                         .tv_usec = (cfg->openai_timeout_ms % 1000) * 1000};
    evhttp_connection_set_timeout_tv(c, &tv);
    evhttp_connection_set_retries(c, 0);
    wc->c[slot] = c;
    return c;
}

/* ---- one embedding job: all of a request's texts, batch by batch ------------------------ */

typedef struct emb_job {
    struct event_base *base;
    unsigned slot;
    embedder_done done;
    void *arg;
    const char **texts; /* copies of the caller's arrays (which may be on its stack) */
    size_t *lens;
    float **outs;
    size_t n;
    size_t start, count; /* the batch in flight */
    int attempt;
    uint32_t dim;
    struct event *retry;
    char err[256];
} emb_job;

static void job_send(emb_job *j);

static void job_finish(emb_job *j, rpc_code code, const char *msg)
{
    embedder_done done = j->done;
    void *arg = j->arg;
    char buf[400];
    snprintf(buf, sizeof(buf), "%s", msg ? msg : "");
    if (j->retry)
        event_free(j->retry);
    free(j);
    done(arg, code, code == RPC_OK ? NULL : buf);
}

static void on_retry(evutil_socket_t fd, short what, void *arg)
{
    job_send(arg);
}

/* A batch failed: pause and retry, or give up. */
static void job_failed(emb_job *j, const char *why)
{
    const config *cfg = openai.cfg;
    snprintf(j->err, sizeof(j->err), "%s", why);
    if (j->attempt >= cfg->openai_retries) {
        char msg[340];
        snprintf(msg, sizeof(msg), "embedding provider failed after %d attempts: %s",
                 j->attempt + 1, j->err);
        log_warn("%s", msg);
        job_finish(j, RPC_UNAVAILABLE, msg);
        return;
    }
    j->attempt++;
    if (!j->retry)
        j->retry = evtimer_new(j->base, on_retry, j);
    if (!j->retry) {
        job_finish(j, RPC_INTERNAL, "out of memory");
        return;
    }
    unsigned ms = 100u << (j->attempt - 1);
    struct timeval tv = {.tv_sec = ms / 1000, .tv_usec = (ms % 1000) * 1000};
    evtimer_add(j->retry, &tv);
}

/* Reads data[i].embedding of the answer into the batch's outputs. Returns NULL or why not. */
static const char *parse_answer(emb_job *j, const char *body, size_t len)
{
    static char why[160];
    msgpack_sbuffer sb;
    msgpack_packer pk;
    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    char err[128];
    const char *res = NULL;
    msgpack_zone zone;
    msgpack_zone_init(&zone, 4096);
    msgpack_object root;
    size_t off = 0;
    if (json_to_msgpack(body, len, 8, &pk, err, sizeof(err)) != 0 ||
        msgpack_unpack(sb.data, sb.size, &off, &zone, &root) != MSGPACK_UNPACK_SUCCESS) {
        res = "the answer is not JSON";
        goto out;
    }
    const msgpack_object *data = rpc_map_get(&root, "data");
    if (!data || data->type != MSGPACK_OBJECT_ARRAY || data->via.array.size != j->count) {
        snprintf(why, sizeof(why), "the answer's data does not hold %zu embeddings", j->count);
        res = why;
        goto out;
    }
    for (uint32_t i = 0; i < data->via.array.size; i++) {
        const msgpack_object *item = &data->via.array.ptr[i];
        const msgpack_object *idx = rpc_map_get(item, "index");
        const msgpack_object *emb = rpc_map_get(item, "embedding");
        size_t at = i;
        if (idx && idx->type == MSGPACK_OBJECT_POSITIVE_INTEGER)
            at = (size_t)idx->via.u64;
        if (at >= j->count || !emb || emb->type != MSGPACK_OBJECT_ARRAY ||
            emb->via.array.size != j->dim) {
            snprintf(why, sizeof(why), "embedding %u has the wrong shape (dimension %u expected)",
                     i, j->dim);
            res = why;
            goto out;
        }
        float *out = j->outs[j->start + at];
        double norm = 0;
        for (uint32_t k = 0; k < j->dim; k++) {
            const msgpack_object *v = &emb->via.array.ptr[k];
            double d = v->type == MSGPACK_OBJECT_FLOAT64 || v->type == MSGPACK_OBJECT_FLOAT32
                           ? v->via.f64
                       : v->type == MSGPACK_OBJECT_POSITIVE_INTEGER ? (double)v->via.u64
                       : v->type == MSGPACK_OBJECT_NEGATIVE_INTEGER ? (double)v->via.i64
                                                                    : NAN;
            if (!isfinite(d) || d > 3.4e38 || d < -3.4e38) {
                res = "an embedding holds a non-number";
                goto out;
            }
            out[k] = (float)d;
            norm += d * d;
        }
        if (norm == 0.0) {
            res = "an embedding is all zeros";
            goto out;
        }
    }
out:
    msgpack_zone_destroy(&zone);
    msgpack_sbuffer_destroy(&sb);
    return res;
}

static void on_answer(struct evhttp_request *hr, void *arg)
{
    emb_job *j = arg;
    if (!hr) {
        job_failed(j, "no answer (connection failed or timed out)");
        return;
    }
    int status = evhttp_request_get_response_code(hr);
    if (status != 200) {
        /* a Retry-After in seconds goes into the message: background callers (reembed.c)
         * wait at least that long before their next attempt */
        const char *ra = evhttp_find_header(evhttp_request_get_input_headers(hr), "Retry-After");
        long secs = ra ? strtol(ra, NULL, 10) : 0;
        char why[96];
        if (secs > 0)
            snprintf(why, sizeof(why), "HTTP status %d (Retry-After: %ld s)", status, secs);
        else
            snprintf(why, sizeof(why), "HTTP status %d", status);
        job_failed(j, status == 0 ? "no answer (connection failed or timed out)" : why);
        return;
    }
    struct evbuffer *in = evhttp_request_get_input_buffer(hr);
    size_t len = evbuffer_get_length(in);
    const char *body = (const char *)evbuffer_pullup(in, -1);
    const char *bad = parse_answer(j, body ? body : "", body ? len : 0);
    if (bad) {
        job_failed(j, bad);
        return;
    }
    j->start += j->count;
    j->attempt = 0;
    if (j->start >= j->n) {
        job_finish(j, RPC_OK, NULL);
        return;
    }
    job_send(j);
}

/* Sends the next batch (or resends the current one). */
static void job_send(emb_job *j)
{
    const config *cfg = openai.cfg;
    size_t left = j->n - j->start;
    j->count = left < (size_t)cfg->openai_batch ? left : (size_t)cfg->openai_batch;
    struct evhttp_connection *c = conn_for(j->base, j->slot, cfg);
    struct evhttp_request *hr = c ? evhttp_request_new(on_answer, j) : NULL;
    if (!hr) {
        job_finish(j, RPC_INTERNAL, "out of memory");
        return;
    }
    json_buf body = {0};
    bool ok = json_buf_append(&body, "{\"model\":", 9) == 0;
    msgpack_object s = {.type = MSGPACK_OBJECT_STR};
    s.via.str.ptr = cfg->openai_model;
    s.via.str.size = (uint32_t)strlen(cfg->openai_model);
    ok = ok && json_from_msgpack(&s, 0, 2, &body) == 0 &&
         json_buf_append(&body, ",\"encoding_format\":\"float\",\"input\":[", 36) == 0;
    for (size_t i = 0; ok && i < j->count; i++) {
        s.via.str.ptr = j->texts[j->start + i];
        s.via.str.size = (uint32_t)j->lens[j->start + i];
        ok = (i == 0 || json_buf_append(&body, ",", 1) == 0) &&
             json_from_msgpack(&s, 0, 2, &body) == 0;
    }
    ok = ok && json_buf_append(&body, "]}", 2) == 0;
    if (!ok) {
        json_buf_fini(&body);
        evhttp_request_free(hr);
        job_finish(j, RPC_INTERNAL, "cannot build the embedding request");
        return;
    }
    struct evkeyvalq *h = evhttp_request_get_output_headers(hr);
    evhttp_add_header(h, "Host", openai.host);
    evhttp_add_header(h, "Content-Type", "application/json");
    evhttp_add_header(h, "Accept", "application/json");
    if (openai.auth)
        evhttp_add_header(h, "Authorization", openai.auth);
    evbuffer_add(evhttp_request_get_output_buffer(hr), body.data, body.len);
    json_buf_fini(&body);
    if (evhttp_make_request(c, hr, EVHTTP_REQ_POST, openai.path) != 0)
        job_failed(j, "cannot send the request");
}

void embedder_run(const embedder_ctx *ctx, const char *const *texts, const size_t *lens,
                  float *const *outs, const char *const *whats, size_t n, embedder_done done,
                  void *arg)
{
    char msg[256];
    if (n == 0) {
        done(arg, RPC_OK, NULL);
        return;
    }
    if (strcmp(ctx->provider, "builtin") == 0) {
        for (size_t i = 0; i < n; i++) {
            int rc = embed_text(texts[i], lens[i], ctx->dim, outs[i]);
            if (rc == EMBED_E_EMPTY) {
                snprintf(msg, sizeof(msg), "parameter '%s' has no text to embed", whats[i]);
                done(arg, RPC_INVALID_ARGUMENT, msg);
                return;
            }
            if (rc != 0) {
                snprintf(msg, sizeof(msg), "the built-in embedder failed (%d)", rc);
                done(arg, RPC_INTERNAL, msg);
                return;
            }
        }
        done(arg, RPC_OK, NULL);
        return;
    }
    if (strcmp(ctx->provider, "openai") != 0 || !openai.configured) {
        snprintf(msg, sizeof(msg), "embedding provider '%s' is not configured on this server",
                 ctx->provider);
        done(arg, RPC_UNAVAILABLE, msg);
        return;
    }
    emb_job *j = calloc(1, sizeof(*j) + n * (sizeof(char *) + sizeof(size_t) + sizeof(float *)));
    if (!j) {
        done(arg, RPC_INTERNAL, "out of memory");
        return;
    }
    j->texts = (const char **)(void *)(j + 1);
    j->lens = (size_t *)(void *)(j->texts + n);
    j->outs = (float **)(void *)(j->lens + n);
    memcpy(j->texts, texts, n * sizeof(*texts));
    memcpy(j->lens, lens, n * sizeof(*lens));
    memcpy(j->outs, outs, n * sizeof(*outs));
    j->base = ctx->base;
    j->slot = ctx->slot;
    j->arg = arg;
    j->n = n;
    j->dim = ctx->dim;
    j->done = done;
    job_send(j);
}

/* ---- blocking use, from background threads ------------------------------------------------ */

typedef struct sync_wait {
    struct event_base *base;
    bool done;
    rpc_code code;
    char msg[256];
} sync_wait;

static void sync_done(void *arg, rpc_code code, const char *message)
{
    sync_wait *w = arg;
    w->done = true;
    w->code = code;
    snprintf(w->msg, sizeof(w->msg), "%s", message ? message : "");
    event_base_loopbreak(w->base);
}

int embedder_run_sync(const char *provider_name, uint32_t dim, const char *const *texts,
                      const size_t *lens, float *const *outs, const char *const *whats, size_t n,
                      char *err, size_t errlen)
{
    unsigned slot = BG_SLOTS;
    unsigned used = atomic_load(&bg_slots_used);
    for (;;) {
        for (slot = 0; slot < BG_SLOTS && (used & (1u << slot)); slot++)
            ;
        if (slot == BG_SLOTS) {
            snprintf(err, errlen, "every background embedding slot is busy");
            return RPC_UNAVAILABLE;
        }
        if (atomic_compare_exchange_weak(&bg_slots_used, &used, used | (1u << slot)))
            break;
    }
    sync_wait w = {.base = event_base_new()};
    if (!w.base) {
        atomic_fetch_and(&bg_slots_used, ~(1u << slot));
        snprintf(err, errlen, "out of memory");
        return RPC_INTERNAL;
    }
    embedder_ctx ctx = {
        .provider = provider_name, .dim = dim, .base = w.base, .slot = MAX_WORKERS + slot};
    embedder_run(&ctx, texts, lens, outs, whats, n, sync_done, &w);
    while (!w.done && event_base_dispatch(w.base) == 0)
        ;
    /* the slot's connections belong to this base: closed with it */
    embedder_worker_fini(MAX_WORKERS + slot);
    event_base_free(w.base);
    atomic_fetch_and(&bg_slots_used, ~(1u << slot));
    if (!w.done) {
        snprintf(err, errlen, "the embedding did not finish");
        return RPC_UNAVAILABLE;
    }
    if (w.code != RPC_OK)
        snprintf(err, errlen, "%s", w.msg);
    return w.code;
}
