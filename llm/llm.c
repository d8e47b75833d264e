/* llm/llm.c: provider settings and lifecycle, the credentials file, results and counters
 * (see llm.h). The calls themselves are in llm_call.c.
 */
#include "llm.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/dns.h>
#include <event2/event.h>
#include <event2/http.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/ssl.h>

#include "llm_int.h"

void llm_config_init(llm_config *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    cfg->timeout_ms = 60000;
    cfg->max_retries = 2;
    cfg->backoff_ms = 500;
    cfg->backoff_max_ms = 20000;
    cfg->retry_after_max_ms = 60000;
    cfg->max_concurrency = 4;
    cfg->max_output_tokens = 1024;
    cfg->max_response_bytes = 4u << 20;
}

int llm_kind_parse(const char *name, llm_kind *out)
{
    if (name && strcmp(name, "anthropic") == 0)
        *out = LLM_ANTHROPIC;
    else if (name && strcmp(name, "openai") == 0)
        *out = LLM_OPENAI;
    else
        return -EINVAL;
    return 0;
}

const char *llm_kind_name(llm_kind kind)
{
    return kind == LLM_ANTHROPIC ? "anthropic" : kind == LLM_OPENAI ? "openai" : "unknown";
}

const char *llm_status_name(int status)
{
    static const char *const names[LLM_STATUS_COUNT] = {
        [LLM_OK] = "ok",
        [LLM_E_TIMEOUT] = "timeout",
        [LLM_E_RATE_LIMITED] = "rate_limited",
        [LLM_E_HTTP] = "http",
        [LLM_E_TRANSPORT] = "transport",
        [LLM_E_TLS] = "tls",
        [LLM_E_MALFORMED] = "malformed",
        [LLM_E_SCHEMA] = "schema",
        [LLM_E_TRUNCATED] = "truncated",
        [LLM_E_REFUSED] = "refused",
        [LLM_E_CANCELLED] = "cancelled",
        [LLM_E_INTERNAL] = "internal",
    };
    return status >= 0 && status < LLM_STATUS_COUNT ? names[status] : "unknown";
}

/* ---- the credentials file ---------------------------------------------------------------- */

static char *trim(char *s)
{
    while (isspace((unsigned char)*s))
        s++;
    size_t n = strlen(s);
    while (n > 0 && isspace((unsigned char)s[n - 1]))
        s[--n] = '\0';
    return s;
}

/* "NAME=value" (NAME in upper case, as in an environment file, "export " allowed) gives
 * value, unquoted; anything else is the key itself (a base64 key may end in '='). */
static char *key_of_line(char *s)
{
    if (strncmp(s, "export ", 7) == 0)
        s = trim(s + 7);
    char *eq = strchr(s, '=');
    if (!eq || eq == s || eq[1] == '\0' || eq[1] == '=')
        return s;
    for (char *c = s; c < eq; c++)
        if (!(isupper((unsigned char)*c) || isdigit((unsigned char)*c) || *c == '_'))
            return s;
    char *v = trim(eq + 1);
    size_t n = strlen(v);
    if (n >= 2 && (v[0] == '"' || v[0] == '\'') && v[n - 1] == v[0]) {
        v[n - 1] = '\0';
        v++;
    }
    return v;
}

int llm_config_key_from_file(const char *path, char *key, size_t keylen, char *err, size_t errlen)
{
    char line[4096];
    int rc = -EINVAL;
    FILE *f = fopen(path, "r");
    if (!f) {
        rc = errno == ENOENT ? -ENOENT : -EIO;
        snprintf(err, errlen, "cannot read the credentials file %s: %s", path, strerror(errno));
        return rc;
    }
    while (fgets(line, sizeof(line), f)) {
        char *s = trim(line);
        if (!*s || *s == '#')
            continue;
        char *k = key_of_line(s);
        if (!*k)
            break;
        if (strlen(k) >= keylen) {
            snprintf(err, errlen, "the key in %s is longer than %zu bytes", path, keylen - 1);
            rc = -ENAMETOOLONG;
        } else {
            memcpy(key, k, strlen(k) + 1);
            rc = 0;
        }
        break;
    }
    if (ferror(f)) {
        snprintf(err, errlen, "cannot read the credentials file %s", path);
        rc = -EIO;
    } else if (rc == -EINVAL) {
        snprintf(err, errlen, "the credentials file %s holds no key", path);
    }
    OPENSSL_cleanse(line, sizeof(line));
    fclose(f);
    return rc;
}

/* ---- providers --------------------------------------------------------------------------- */

static pthread_once_t ssl_index_once = PTHREAD_ONCE_INIT;
static int ssl_index = -1;

static void make_ssl_index(void)
{
    ssl_index = SSL_get_ex_new_index(0, NULL, NULL, NULL, NULL);
}

int llm_ssl_call_index(void)
{
    pthread_once(&ssl_index_once, make_ssl_index);
    return ssl_index;
}

static int bad(char *err, size_t errlen, const char *what)
{
    snprintf(err, errlen, "%s", what);
    return -EINVAL;
}

/* Reads base_url into p's host, port, path. */
static int parse_url(llm_provider *p, const llm_config *cfg, char *err, size_t errlen)
{
    struct evhttp_uri *u = evhttp_uri_parse(cfg->base_url);
    int rc = -EINVAL;
    const char *scheme = u ? evhttp_uri_get_scheme(u) : NULL;
    const char *host = u ? evhttp_uri_get_host(u) : NULL;
    if (!scheme || !host || !*host) {
        snprintf(err, errlen, "base_url '%s' is not an http(s) URL", cfg->base_url);
        goto out;
    }
    if (evhttp_uri_get_userinfo(u)) {
        snprintf(err, errlen, "base_url must not hold credentials (use api_key)");
        goto out;
    }
    p->https = strcmp(scheme, "https") == 0;
    if (!p->https && strcmp(scheme, "http") != 0) {
        snprintf(err, errlen, "base_url must start with http:// or https://");
        goto out;
    }
    int port = evhttp_uri_get_port(u);
    p->port = port > 0 ? port : p->https ? 443 : 80;
    /* libevent keeps an IPv6 literal's brackets: the Host header wants them, connecting and
     * the certificate check do not */
    size_t hlen = strlen(host);
    bool v6 = host[0] == '[' && hlen > 2 && host[hlen - 1] == ']';
    const char *path = evhttp_uri_get_path(u);
    const char *query = evhttp_uri_get_query(u);
    const char *suffix = p->wire.kind == LLM_ANTHROPIC ? "/v1/messages" : "/chat/completions";
    size_t plen = path ? strlen(path) : 0;
    while (plen > 0 && path[plen - 1] == '/')
        plen--;
    size_t slen = strlen(suffix);
    bool has = plen >= slen && memcmp(path + plen - slen, suffix, slen) == 0;
    size_t n = plen + slen + (query ? strlen(query) + 1 : 0) + 1;
    p->path = malloc(n);
    size_t hn = hlen + 16;
    p->host_header = malloc(hn);
    p->host = v6 ? strndup(host + 1, hlen - 2) : strdup(host);
    if (!p->path || !p->host_header || !p->host) {
        snprintf(err, errlen, "out of memory");
        rc = -ENOMEM;
        goto out;
    }
    unsigned char addr[16];
    p->numeric_host =
        inet_pton(AF_INET, p->host, addr) == 1 || inet_pton(AF_INET6, p->host, addr) == 1;
    snprintf(p->path, n, "%.*s%s%s%s", (int)plen, path ? path : "", has ? "" : suffix,
             query ? "?" : "", query ? query : "");
    if (port > 0 && port != (p->https ? 443 : 80))
        snprintf(p->host_header, hn, "%s:%d", host, port);
    else
        snprintf(p->host_header, hn, "%s", host);
    rc = 0;
out:
    if (u)
        evhttp_uri_free(u);
    return rc;
}

static int setup_tls(llm_provider *p, const llm_config *cfg, char *err, size_t errlen)
{
    p->ssl = SSL_CTX_new(TLS_client_method());
    if (!p->ssl) {
        snprintf(err, errlen, "cannot set up TLS (no memory)");
        return -ENOMEM;
    }
    SSL_CTX_set_min_proto_version(p->ssl, TLS1_2_VERSION);
    SSL_CTX_set_verify(p->ssl, SSL_VERIFY_PEER, NULL);
    int ok = cfg->ca_file && *cfg->ca_file
                 ? SSL_CTX_load_verify_locations(p->ssl, cfg->ca_file, NULL)
                 : SSL_CTX_set_default_verify_paths(p->ssl);
    if (ok != 1) {
        unsigned long e = ERR_get_error();
        char why[160];
        ERR_error_string_n(e, why, sizeof(why));
        ERR_clear_error();
        snprintf(err, errlen, "cannot load the CA certificates%s%s: %s",
                 cfg->ca_file && *cfg->ca_file ? " of " : "",
                 cfg->ca_file && *cfg->ca_file ? cfg->ca_file : "", why);
        return -EIO;
    }
    return llm_ssl_call_index() < 0 ? -ENOMEM : 0;
}

static char *dup_or(const char *s, const char *def)
{
    return strdup(s && *s ? s : def);
}

int llm_provider_create(const llm_config *cfg, llm_provider **out, char *err, size_t errlen)
{
    if (cfg->kind != LLM_ANTHROPIC && cfg->kind != LLM_OPENAI)
        return bad(err, errlen, "kind must be anthropic or openai");
    if (!cfg->base_url || !*cfg->base_url)
        return bad(err, errlen, "base_url is required");
    if (!cfg->model || !*cfg->model)
        return bad(err, errlen, "model is required");
    if (cfg->timeout_ms == 0 || cfg->max_output_tokens == 0 || cfg->max_response_bytes < 1024)
        return bad(err, errlen,
                   "timeout_ms and max_output_tokens must be positive, "
                   "max_response_bytes at least 1024");
    if (cfg->max_retries > 100 || cfg->backoff_max_ms < cfg->backoff_ms)
        return bad(err, errlen,
                   "max_retries must be at most 100, backoff_max_ms at least "
                   "backoff_ms");
    if (!(cfg->price_in_per_mtok >= 0) || !(cfg->price_out_per_mtok >= 0))
        return bad(err, errlen, "prices must be zero or positive");
    const char *field = cfg->openai_max_tokens_field;
    if (field && *field && strcmp(field, "max_tokens") != 0 &&
        strcmp(field, "max_completion_tokens") != 0)
        return bad(err, errlen,
                   "openai_max_tokens_field must be max_completion_tokens or "
                   "max_tokens");
    llm_provider *p = calloc(1, sizeof(*p));
    if (!p) {
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    int rc = -ENOMEM;
    if (pthread_mutex_init(&p->mu, NULL) != 0) {
        free(p);
        snprintf(err, errlen, "cannot make a mutex");
        return -ENOMEM;
    }
    p->wire.kind = cfg->kind;
    p->model = strdup(cfg->model);
    p->anthropic_version = dup_or(cfg->anthropic_version, "2023-06-01");
    p->max_tokens_field = dup_or(field, "max_completion_tokens");
    if (!p->model || !p->anthropic_version || !p->max_tokens_field)
        goto nomem;
    if (cfg->api_key && *cfg->api_key) {
        if (!(p->key = strdup(cfg->api_key)))
            goto nomem;
        size_t n = strlen(p->key) + 8;
        if (!(p->auth = malloc(n)))
            goto nomem;
        snprintf(p->auth, n, "Bearer %s", p->key);
    }
    p->wire.model = p->model;
    p->wire.max_output_tokens = cfg->max_output_tokens;
    p->wire.openai_max_tokens_field = p->max_tokens_field;
    rc = parse_url(p, cfg, err, errlen);
    if (rc)
        goto fail;
    if (p->https && (rc = setup_tls(p, cfg, err, errlen)) != 0)
        goto fail;
    p->timeout_ms = cfg->timeout_ms;
    p->max_retries = cfg->max_retries;
    p->backoff_ms = cfg->backoff_ms;
    p->backoff_max_ms = cfg->backoff_max_ms;
    p->retry_after_max_ms = cfg->retry_after_max_ms;
    p->max_concurrency = cfg->max_concurrency;
    p->max_response_bytes = cfg->max_response_bytes;
    p->price_in = cfg->price_in_per_mtok;
    p->price_out = cfg->price_out_per_mtok;
    unsigned long long d = cfg->deadline_ms;
    unsigned wait = cfg->backoff_max_ms > cfg->retry_after_max_ms ? cfg->backoff_max_ms
                                                                  : cfg->retry_after_max_ms;
    if (d == 0) /* room for every attempt and the longest pause allowed between them */
        d = (unsigned long long)cfg->timeout_ms * (cfg->max_retries + 1) +
            (unsigned long long)wait * cfg->max_retries;
    p->deadline_ms = d > 86400000ull ? 86400000u : (unsigned)d;
    *out = p;
    return 0;
nomem:
    snprintf(err, errlen, "out of memory");
    rc = -ENOMEM;
fail:
    llm_provider_destroy(p);
    return rc;
}

static void wipe_free(char *s)
{
    if (s) {
        OPENSSL_cleanse(s, strlen(s));
        free(s);
    }
}

void llm_provider_destroy(llm_provider *p)
{
    if (!p)
        return;
    llm_base *b = p->bases;
    while (b) {
        llm_base *next = b->next;
        llm_base_reap(b);
        if (b->reap)
            event_free(b->reap);
        if (b->dns)
            evdns_base_free(b->dns, 1);
        free(b);
        b = next;
    }
    if (p->ssl)
        SSL_CTX_free(p->ssl);
    wipe_free(p->key);
    wipe_free(p->auth);
    free(p->model);
    free(p->host);
    free(p->host_header);
    free(p->path);
    free(p->anthropic_version);
    free(p->max_tokens_field);
    pthread_mutex_destroy(&p->mu);
    free(p);
}

void llm_provider_stats(llm_provider *p, llm_stats *out)
{
    memset(out, 0, sizeof(*out));
    out->calls = atomic_load(&p->st_calls);
    for (int i = 0; i < LLM_STATUS_COUNT; i++)
        out->by_status[i] = atomic_load(&p->st_status[i]);
    out->attempts = atomic_load(&p->st_attempts);
    out->retries = atomic_load(&p->st_retries);
    out->tokens_in = atomic_load(&p->st_tokens_in);
    out->tokens_out = atomic_load(&p->st_tokens_out);
    out->cost_usd = (double)atomic_load(&p->st_cost_nusd) / 1e9;
    pthread_mutex_lock(&p->mu);
    out->in_flight = p->in_flight;
    out->waiting = p->n_waiting;
    pthread_mutex_unlock(&p->mu);
}

/* ---- results ----------------------------------------------------------------------------- */

void llm_result_move(llm_result *dst, llm_result *src)
{
    *dst = *src;
    memset(src, 0, sizeof(*src));
}

void llm_result_fini(llm_result *r)
{
    free(r->text);
    free(r->value);
    memset(r, 0, sizeof(*r));
}
