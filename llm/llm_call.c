/* llm/llm_call.c: one call's life on its event base (see llm.h).
 *
 *   llm_call -> WAIT (a slot under max_concurrency; FIFO across all bases)
 *            -> RUN (one HTTP request on a new connection, bounded by an absolute timer)
 *            -> the answer: done, or BACKOFF (a retryable failure) -> WAIT -> RUN ...
 *
 * One timer per call serves the three states: the deadline while waiting, the attempt's
 * end (capped by the deadline) while running, the pause while backing off. The slot
 * count and the queue are under the provider's mutex; a slot freed on one base is handed
 * to the first waiter, whatever its base, by activating that call's wake event (libevent
 * does the cross-thread notification). Everything else about a call is touched only on
 * its base's thread.
 *
 * libevent 2.1 details relied on: a request's callback may run inside
 * evhttp_make_request (a connection refused at once), which in_make catches; a cancelled
 * request's callback never runs (its error callback does, with REQUEST_CANCEL); an
 * outgoing connection is only reset, never freed, by libevent when its request ends, so
 * the attempt hands it to its base's graves (llm_int.h) and the reap event frees it.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/bufferevent_ssl.h>
#include <event2/dns.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include "llm_int.h"

enum { C_WAIT, C_RUN, C_BACKOFF };

typedef struct llm_callst call;

struct llm_callst {
    llm_provider *p;
    llm_base *b;
    call *bnext, *bprev; /* in b->calls */
    call *wnext;         /* in the provider's queue (under p->mu) */
    bool waiting;        /* queued (under p->mu) */
    bool has_slot;       /* holds a slot (under p->mu) */
    int state;
    struct event *timer;
    struct event *wake;
    struct evhttp_request *hr;       /* the attempt in flight */
    struct evhttp_connection *evcon; /* its connection */
    SSL *ssl;                        /* its TLS object */
    llm_grave *grave;                /* where evcon goes when the attempt ends */
    char *body;
    size_t body_len;
    const llm_schema *schema;
    char schema_name[65];
    llm_done_fn done;
    void *arg;
    uint64_t t0_ns, deadline_ns;
    uint64_t due_ns; /* when the timer is meant to fire */
    unsigned deadline_ms;
    int http_err; /* the evhttp_request_error of the attempt, -1 none */
    long tls_err; /* the X509 verify error of the attempt, 0 none */
    bool in_make, early;
    uint64_t rng;
    llm_result res;
};

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static uint64_t rand_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Arms the call's timer ms from now. libevent counts a timeout from the time it cached when
 * the loop last woke, which may be well before now inside a callback: without refreshing
 * it a pause could end before the Retry-After it honours. */
static void arm(call *c, uint64_t ms)
{
    struct timeval tv = {.tv_sec = (time_t)(ms / 1000), .tv_usec = (suseconds_t)(ms % 1000) * 1000};
    event_base_update_cache_time(c->b->base);
    c->due_ns = now_ns() + ms * 1000000u;
    evtimer_add(c->timer, &tv);
}

static uint64_t ms_until(uint64_t t_ns)
{
    uint64_t n = now_ns();
    return t_ns > n ? (t_ns - n + 999999) / 1000000 : 0;
}

/* ---- slots ------------------------------------------------------------------------------- */

/* Takes a slot (true) or queues c for one (false; its wake event fires when it has one). */
static bool slot_take(call *c)
{
    llm_provider *p = c->p;
    bool got = false;
    pthread_mutex_lock(&p->mu);
    if (p->max_concurrency == 0 || p->in_flight < p->max_concurrency) {
        p->in_flight++;
        c->has_slot = true;
        got = true;
    } else {
        c->wnext = NULL;
        if (p->wait_tail)
            p->wait_tail->wnext = c;
        else
            p->wait_head = c;
        p->wait_tail = c;
        c->waiting = true;
        p->n_waiting++;
    }
    pthread_mutex_unlock(&p->mu);
    return got;
}

/* Leaves the queue, or gives c's slot to the first waiter (or back). Idempotent. */
static void slot_drop(call *c)
{
    llm_provider *p = c->p;
    pthread_mutex_lock(&p->mu);
    if (c->waiting) {
        call *prev = NULL;
        for (call *w = p->wait_head; w; prev = w, w = w->wnext)
            if (w == c) {
                if (prev)
                    prev->wnext = c->wnext;
                else
                    p->wait_head = c->wnext;
                if (p->wait_tail == c)
                    p->wait_tail = prev;
                break;
            }
        c->waiting = false;
        p->n_waiting--;
    } else if (c->has_slot) {
        c->has_slot = false;
        call *w = p->wait_head;
        if (w) {
            p->wait_head = w->wnext;
            if (!p->wait_head)
                p->wait_tail = NULL;
            w->waiting = false;
            p->n_waiting--;
            w->has_slot = true;
            event_active(w->wake, EV_READ, 0); /* w's base may belong to another thread */
        } else {
            p->in_flight--;
        }
    }
    pthread_mutex_unlock(&p->mu);
}

/* ---- bases ------------------------------------------------------------------------------- */

static llm_base *base_find(llm_provider *p, struct event_base *eb, bool make)
{
    pthread_mutex_lock(&p->mu);
    llm_base *b = p->bases;
    while (b && b->base != eb)
        b = b->next;
    if (!b && make && (b = calloc(1, sizeof(*b))) != NULL) {
        b->base = eb;
        b->next = p->bases;
        p->bases = b;
    }
    pthread_mutex_unlock(&p->mu);
    return b;
}

void llm_base_reap(llm_base *b)
{
    llm_grave *g = b->graves;
    b->graves = NULL;
    while (g) {
        llm_grave *next = g->next;
        evhttp_connection_free(g->evcon);
        free(g);
        g = next;
    }
}

static void on_reap(evutil_socket_t fd, short what, void *arg)
{
    llm_base_reap(arg);
}

static struct evdns_base *base_dns(llm_provider *p, llm_base *b)
{
    if (p->numeric_host)
        return NULL;
    if (!b->dns_tried) {
        b->dns_tried = true;
        /* without a resolver of its own, evhttp would resolve with a blocking getaddrinfo
         * on the caller's loop; if evdns cannot start, that is the fallback */
        b->dns = evdns_base_new(b->base, EVDNS_BASE_INITIALIZE_NAMESERVERS |
                                             EVDNS_BASE_DISABLE_WHEN_INACTIVE);
    }
    return b->dns;
}

/* ---- finishing --------------------------------------------------------------------------- */

static void finish(call *c, int status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static void finish(call *c, int status, const char *fmt, ...)
{
    llm_provider *p = c->p;
    llm_result *r = &c->res;
    r->status = status;
    if (status == LLM_OK) {
        r->reason[0] = '\0';
    } else if (fmt) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(r->reason, sizeof(r->reason), fmt, ap);
        va_end(ap);
    }
    /* the last guard: whatever a provider put where (an error's type, code, message), no
     * reason leaves with a piece of the key */
    if (llm_wire_has_key(r->reason, p->key))
        snprintf(r->reason, sizeof(r->reason), "%s (the reason quoted the API key: withheld)",
                 llm_status_name(status));
    evtimer_del(c->timer);
    slot_drop(c);
    if (c->bprev)
        c->bprev->bnext = c->bnext;
    else
        c->b->calls = c->bnext;
    if (c->bnext)
        c->bnext->bprev = c->bprev;
    event_free(c->timer);
    event_free(c->wake);
    free(c->grave);
    r->latency_ms = (now_ns() - c->t0_ns) / 1000000u;
    r->cost_usd = ((double)r->tokens_in * p->price_in + (double)r->tokens_out * p->price_out) / 1e6;
    atomic_fetch_add(&p->st_calls, 1);
    atomic_fetch_add(&p->st_status[status], 1);
    atomic_fetch_add(&p->st_tokens_in, r->tokens_in);
    atomic_fetch_add(&p->st_tokens_out, r->tokens_out);
    atomic_fetch_add(&p->st_cost_nusd, (uint64_t)(r->cost_usd * 1e9 + 0.5));
    llm_done_fn done = c->done;
    void *arg = c->arg;
    free(c->body);
    c->body = NULL;
    done(r, arg);
    llm_result_fini(r);
    free(c);
}

/* ---- attempts ---------------------------------------------------------------------------- */

static void attempt_start(call *c);

/* The attempt's request is over (answered, failed or cancelled): its connection goes to
 * the graves, to be freed from the reap event, outside libevent's callbacks. */
static void attempt_end(call *c)
{
    if (c->ssl)
        SSL_set_ex_data(c->ssl, llm_ssl_call_index(), NULL);
    c->ssl = NULL;
    c->hr = NULL;
    if (c->evcon) {
        llm_grave *g = c->grave;
        g->evcon = c->evcon;
        g->next = c->b->graves;
        c->b->graves = g;
        c->grave = NULL;
        c->evcon = NULL;
        event_active(c->b->reap, EV_READ, 0);
    }
}

/* A failed attempt: retry after a pause when allowed and there is time, else finish. */
static void failed(call *c, int status, bool retryable, long long retry_after_ms, const char *why)
{
    llm_provider *p = c->p;
    unsigned n = c->res.attempts;
    const char *s = n == 1 ? "" : "s";
    if (!retryable)
        finish(c, status, "%s", why);
    else if (n > p->max_retries)
        finish(c, status, "%s (%u attempt%s)", why, n, s);
    else if (retry_after_ms > (long long)p->retry_after_max_ms)
        finish(c, status,
               "%s; the provider asks to wait %lld s, more than %u s allowed (%u "
               "attempt%s)",
               why, (retry_after_ms + 999) / 1000, (p->retry_after_max_ms + 999) / 1000, n, s);
    else {
        uint64_t wait;
        if (retry_after_ms >= 0) {
            /* honour it; a little jitter on top spreads the callers it told the same */
            wait = (uint64_t)retry_after_ms + rand_next(&c->rng) % (retry_after_ms / 20 + 1);
        } else {
            uint64_t d = (uint64_t)p->backoff_ms << (n - 1 < 20 ? n - 1 : 20);
            if (d > p->backoff_max_ms)
                d = p->backoff_max_ms;
            wait = d / 2 + rand_next(&c->rng) % (d / 2 + 1); /* "equal jitter" */
        }
        if (now_ns() + wait * 1000000u >= c->deadline_ns) {
            finish(c, status,
                   "%s; no time for another attempt within the %u ms deadline (%u "
                   "attempt%s)",
                   why, c->deadline_ms, n, s);
            return;
        }
        c->state = C_BACKOFF;
        arm(c, wait);
    }
}

static const char *http_error_name(int e)
{
    switch (e) {
    case EVREQ_HTTP_TIMEOUT:
        return "no answer within the timeout";
    case EVREQ_HTTP_EOF:
        return "the connection closed before a whole answer";
    case EVREQ_HTTP_INVALID_HEADER:
        return "the answer's HTTP header is invalid";
    case EVREQ_HTTP_BUFFER_ERROR:
        return "the connection failed";
    default:
        return NULL;
    }
}

/* Reads an answer that is not a 200. */
static void http_failed(call *c, struct evhttp_request *hr, int code)
{
    llm_provider *p = c->p;
    struct evbuffer *in = evhttp_request_get_input_buffer(hr);
    size_t len = evbuffer_get_length(in);
    const char *body = len ? (const char *)evbuffer_pullup(in, -1) : NULL;
    llm_wire_error e;
    llm_wire_error_parse(body, len, &e);
    struct evkeyvalq *h = evhttp_request_get_input_headers(hr);
    long long ra = -1;
    const char *ms = evhttp_find_header(h, "retry-after-ms");
    if (ms) {
        char *end;
        long long v = strtoll(ms, &end, 10);
        if (end != ms && *end == '\0' && v >= 0)
            ra = v;
    }
    if (ra < 0)
        ra = llm_wire_retry_after(evhttp_find_header(h, "retry-after"), (long long)time(NULL));
    char msg[160] = "";
    /* providers echo parts of a wrong key in their auth errors: none of those messages */
    if (code != 401 && code != 403 && e.message[0])
        llm_wire_redact(e.message, p->key, msg, sizeof(msg));
    char why[LLM_REASON_MAX];
    snprintf(why, sizeof(why), "HTTP %d%s%s%s%s%s%s", code, e.type[0] ? " " : "", e.type,
             e.code[0] && strcmp(e.code, e.type) ? " " : "",
             e.code[0] && strcmp(e.code, e.type) ? e.code : "", msg[0] ? ": " : "", msg);
    bool retryable = (code == 408 || code == 409 || code == 429 || code >= 500) && !e.quota;
    int status = code == 429 || code == 529 ? LLM_E_RATE_LIMITED : LLM_E_HTTP;
    failed(c, status, retryable, retryable ? ra : -1, why);
}

/* The end of an attempt, with or without an answer. */
static void outcome(call *c, struct evhttp_request *hr)
{
    llm_provider *p = c->p;
    int code = hr ? evhttp_request_get_response_code(hr) : 0;
    c->res.http_status = code ? code : c->res.http_status;
    if (code == 0) {
        char why[LLM_REASON_MAX];
        if (c->tls_err) {
            finish(c, LLM_E_TLS, "TLS: the certificate of %s did not verify: %s", p->host,
                   X509_verify_cert_error_string(c->tls_err));
            return;
        }
        if (c->http_err == EVREQ_HTTP_DATA_TOO_LONG) {
            finish(c, LLM_E_MALFORMED, "the answer is longer than %zu bytes",
                   p->max_response_bytes);
            return;
        }
        const char *what = http_error_name(c->http_err);
        if (c->http_err == EVREQ_HTTP_TIMEOUT) {
            snprintf(why, sizeof(why), "no answer within %u ms", p->timeout_ms);
            failed(c, LLM_E_TIMEOUT, true, -1, why);
            return;
        }
        snprintf(why, sizeof(why), "%s (%s:%d)", what ? what : "cannot connect", p->host, p->port);
        failed(c, LLM_E_TRANSPORT, true, -1, why);
        return;
    }
    if (code != 200) {
        http_failed(c, hr, code);
        return;
    }
    struct evbuffer *in = evhttp_request_get_input_buffer(hr);
    size_t len = evbuffer_get_length(in);
    const char *body = len ? (const char *)evbuffer_pullup(in, -1) : "";
    if (llm_wire_answer(p->wire.kind, body, len, c->schema, c->schema_name, &c->res) != 0) {
        finish(c, LLM_E_INTERNAL, "out of memory reading the answer");
        return;
    }
    finish(c, c->res.status, NULL);
}

static void on_answer(struct evhttp_request *hr, void *arg)
{
    call *c = arg;
    if (c->in_make) {
        /* inside evhttp_make_request: attempt_start takes it from here */
        c->early = true;
        return;
    }
    attempt_end(c);
    evtimer_del(c->timer);
    slot_drop(c);
    outcome(c, hr);
}

static void on_http_error(enum evhttp_request_error e, void *arg)
{
    call *c = arg;
    if (e != EVREQ_HTTP_REQUEST_CANCEL)
        c->http_err = (int)e;
}

static int on_verify(int ok, X509_STORE_CTX *ctx)
{
    SSL *ssl = X509_STORE_CTX_get_ex_data(ctx, SSL_get_ex_data_X509_STORE_CTX_idx());
    call *c = ssl ? SSL_get_ex_data(ssl, llm_ssl_call_index()) : NULL;
    if (!c)
        return 0; /* the call is gone: nobody wants this connection */
    if (!ok && !c->tls_err)
        c->tls_err = X509_STORE_CTX_get_error(ctx);
    return ok;
}

/* A new connection for one attempt: TLS with the name (or address) checked, or plain. */
static struct evhttp_connection *connect_new(call *c)
{
    llm_provider *p = c->p;
    struct event_base *eb = c->b->base;
    struct evdns_base *dns = base_dns(p, c->b);
    struct bufferevent *bev = NULL;
    c->ssl = NULL;
    if (p->https) {
        SSL *ssl = SSL_new(p->ssl);
        if (!ssl)
            return NULL;
        if (p->numeric_host) {
            X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), p->host);
        } else {
            SSL_set_tlsext_host_name(ssl, p->host);
            SSL_set1_host(ssl, p->host);
        }
        SSL_set_ex_data(ssl, llm_ssl_call_index(), c);
        SSL_set_verify(ssl, SSL_VERIFY_PEER, on_verify);
        bev = bufferevent_openssl_socket_new(eb, -1, ssl, BUFFEREVENT_SSL_CONNECTING,
                                             BEV_OPT_CLOSE_ON_FREE);
        if (!bev) {
            SSL_free(ssl);
            return NULL;
        }
        /* the answer is framed by Content-Length; a close without close_notify after it is
         * no error */
        bufferevent_openssl_set_allow_dirty_shutdown(bev, 1);
        c->ssl = ssl;
    }
    struct evhttp_connection *evcon =
        evhttp_connection_base_bufferevent_new(eb, dns, bev, p->host, (ev_uint16_t)p->port);
    if (!evcon) {
        if (bev)
            bufferevent_free(bev);
        c->ssl = NULL;
        return NULL;
    }
    struct timeval tv = {.tv_sec = p->timeout_ms / 1000,
                         .tv_usec = (suseconds_t)(p->timeout_ms % 1000) * 1000};
    evhttp_connection_set_timeout_tv(evcon, &tv);
    evhttp_connection_set_retries(evcon, 0);
    evhttp_connection_set_max_body_size(evcon, (ev_ssize_t)p->max_response_bytes);
    evhttp_connection_set_max_headers_size(evcon, 64 * 1024);
    return evcon;
}

static void attempt_start(call *c)
{
    llm_provider *p = c->p;
    c->state = C_RUN;
    c->res.attempts++;
    atomic_fetch_add(&p->st_attempts, 1);
    if (c->res.attempts > 1)
        atomic_fetch_add(&p->st_retries, 1);
    c->http_err = -1;
    c->tls_err = 0;
    c->early = false;
    uint64_t end = now_ns() + (uint64_t)p->timeout_ms * 1000000u;
    arm(c, ms_until(end < c->deadline_ns ? end : c->deadline_ns));
    if (!c->grave)
        c->grave = malloc(sizeof(*c->grave));
    struct evhttp_connection *evcon = c->grave ? connect_new(c) : NULL;
    struct evhttp_request *hr = evcon ? evhttp_request_new(on_answer, c) : NULL;
    if (!hr) {
        if (evcon)
            evhttp_connection_free(evcon);
        c->ssl = NULL;
        evtimer_del(c->timer);
        finish(c, LLM_E_INTERNAL, "out of memory starting a request");
        return;
    }
    evhttp_request_set_error_cb(hr, on_http_error);
    struct evkeyvalq *h = evhttp_request_get_output_headers(hr);
    evhttp_add_header(h, "Host", p->host_header);
    evhttp_add_header(h, "Content-Type", "application/json");
    evhttp_add_header(h, "Accept", "application/json");
    evhttp_add_header(h, "Connection", "close");
    evhttp_add_header(h, "User-Agent", "engram-llm/1");
    if (p->wire.kind == LLM_ANTHROPIC) {
        evhttp_add_header(h, "anthropic-version", p->anthropic_version);
        if (p->key)
            evhttp_add_header(h, "x-api-key", p->key);
    } else if (p->auth) {
        evhttp_add_header(h, "Authorization", p->auth);
    }
    char clen[24];
    snprintf(clen, sizeof(clen), "%zu", c->body_len);
    evhttp_add_header(h, "Content-Length", clen);
    if (evbuffer_add(evhttp_request_get_output_buffer(hr), c->body, c->body_len) != 0) {
        evhttp_request_free(hr);
        evhttp_connection_free(evcon);
        c->ssl = NULL;
        evtimer_del(c->timer);
        finish(c, LLM_E_INTERNAL, "out of memory starting a request");
        return;
    }
    c->evcon = evcon;
    c->in_make = true;
    int rc = evhttp_make_request(evcon, hr, EVHTTP_REQ_POST, p->path);
    c->in_make = false;
    if (rc != 0 || c->early) {
        /* the request failed inside make_request (libevent freed it, or it was never
         * queued) */
        attempt_end(c);
        evtimer_del(c->timer);
        slot_drop(c);
        char why[LLM_REASON_MAX];
        snprintf(why, sizeof(why), "cannot connect (%s:%d)", p->host, p->port);
        failed(c, LLM_E_TRANSPORT, true, -1, why);
        return;
    }
    c->hr = hr;
}

/* ---- events ------------------------------------------------------------------------------ */

static void on_wake(evutil_socket_t fd, short what, void *arg)
{
    call *c = arg;
    if (c->state == C_WAIT)
        attempt_start(c);
}

/* Ends the attempt in flight without its callback. */
static void abort_attempt(call *c)
{
    if (!c->hr)
        return;
    if (c->ssl)
        SSL_set_ex_data(c->ssl, llm_ssl_call_index(), NULL);
    struct evhttp_request *hr = c->hr;
    c->hr = NULL;
    evhttp_cancel_request(hr); /* frees hr and resets the connection */
    attempt_end(c);
}

static void on_timer(evutil_socket_t fd, short what, void *arg)
{
    call *c = arg;
    llm_provider *p = c->p;
    if (now_ns() < c->due_ns) { /* early (the loop's clock): never end a wait before its time */
        arm(c, ms_until(c->due_ns));
        return;
    }
    switch (c->state) {
    case C_WAIT:
        slot_drop(c);
        finish(c, LLM_E_TIMEOUT, "no free slot within the %u ms deadline (max_concurrency %u)",
               c->deadline_ms, p->max_concurrency);
        return;
    case C_RUN: {
        abort_attempt(c);
        slot_drop(c);
        if (now_ns() >= c->deadline_ns) {
            unsigned n = c->res.attempts;
            finish(c, LLM_E_TIMEOUT, "no answer within the %u ms deadline (%u attempt%s)",
                   c->deadline_ms, n, n == 1 ? "" : "s");
            return;
        }
        char why[96];
        snprintf(why, sizeof(why), "no answer within %u ms", p->timeout_ms);
        failed(c, LLM_E_TIMEOUT, true, -1, why);
        return;
    }
    case C_BACKOFF:
        c->state = C_WAIT;
        arm(c, ms_until(c->deadline_ns));
        if (slot_take(c))
            attempt_start(c);
        return;
    }
}

/* ---- the API ----------------------------------------------------------------------------- */

int llm_call(llm_provider *p, struct event_base *base, const llm_request *req, llm_done_fn done,
             void *arg)
{
    if (!p || !base || !req || !done || req->n_messages == 0 || !req->messages)
        return -EINVAL;
    if (req->schema && !llm_schema_root_is_object(req->schema))
        return -EINVAL;
    call *c = calloc(1, sizeof(*c));
    if (!c)
        return -ENOMEM;
    ubuf body = {0};
    char err[128];
    int rc = llm_wire_body(&p->wire, req, &body, err, sizeof(err));
    if (rc)
        goto fail;
    rc = -ENOMEM;
    c->p = p;
    c->body = body.data;
    c->body_len = body.len;
    body.data = NULL;
    c->schema = req->schema;
    snprintf(c->schema_name, sizeof(c->schema_name), "%s",
             req->schema_name ? req->schema_name : "result");
    c->done = done;
    c->arg = arg;
    c->t0_ns = now_ns();
    c->deadline_ms = req->deadline_ms ? req->deadline_ms : p->deadline_ms;
    c->deadline_ns = c->t0_ns + (uint64_t)c->deadline_ms * 1000000u;
    c->rng = c->t0_ns ^ (uint64_t)(uintptr_t)c;
    c->state = C_WAIT;
    if (!(c->b = base_find(p, base, true)))
        goto fail;
    if (c->b->closing) {
        rc = -ECANCELED;
        goto fail;
    }
    c->timer = evtimer_new(base, on_timer, c);
    c->wake = event_new(base, -1, 0, on_wake, c);
    if (!c->b->reap)
        c->b->reap = event_new(base, -1, 0, on_reap, c->b);
    if (!c->timer || !c->wake || !c->b->reap)
        goto fail;
    c->bnext = c->b->calls;
    if (c->bnext)
        c->bnext->bprev = c;
    c->b->calls = c;
    arm(c, c->deadline_ms);
    /* the attempt starts from the loop, never inside llm_call */
    if (slot_take(c))
        event_active(c->wake, EV_READ, 0);
    return 0;
fail:
    if (c->timer)
        event_free(c->timer);
    if (c->wake)
        event_free(c->wake);
    free(c->body);
    ubuf_fini(&body);
    free(c);
    return rc;
}

void llm_detach(llm_provider *p, struct event_base *base)
{
    llm_base *b = base_find(p, base, false);
    if (!b)
        return;
    b->closing = true;
    while (b->calls) {
        call *c = b->calls;
        abort_attempt(c);
        finish(c, LLM_E_CANCELLED, "cancelled: the event loop is closing (%u attempt%s)",
               c->res.attempts, c->res.attempts == 1 ? "" : "s");
    }
    llm_base_reap(b);
    if (b->reap)
        event_free(b->reap);
    if (b->dns)
        evdns_base_free(b->dns, 1);
    pthread_mutex_lock(&p->mu);
    llm_base **pp = &p->bases;
    while (*pp && *pp != b)
        pp = &(*pp)->next;
    if (*pp)
        *pp = b->next;
    pthread_mutex_unlock(&p->mu);
    free(b);
}

typedef struct sync_wait {
    bool done;
    llm_result res;
} sync_wait;

static void sync_done(llm_result *res, void *arg)
{
    sync_wait *w = arg;
    llm_result_move(&w->res, res);
    w->done = true;
}

int llm_call_sync(llm_provider *p, const llm_request *req, llm_result *out)
{
    struct event_base *eb = event_base_new();
    if (!eb)
        return -ENOMEM;
    sync_wait w = {0};
    int rc = llm_call(p, eb, req, sync_done, &w);
    while (rc == 0 && !w.done)
        if (event_base_loop(eb, EVLOOP_ONCE) != 0)
            break; /* nothing pending: cannot happen while the call lives; detach ends it */
    llm_detach(p, eb);
    event_base_free(eb);
    if (rc == 0)
        llm_result_move(out, &w.res);
    return rc;
}
