/* llm/llm_int.h: what the files of the llm library share and nobody else uses.
 *
 * llm.c (provider, slots, key file), llm_call.c (a call's attempts over evhttp),
 * llm_wire.c (the two protocols' request bodies and answers: no I/O, unit-tested on
 * canned bodies), llm_schema.c (the validator).
 */
#ifndef ENGRAM_LLM_INT_H
#define ENGRAM_LLM_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <pthread.h>
#include <stdatomic.h>

#include <msgpack.h>
#include <openssl/ssl.h>

#include "llm.h"
#include "ubuf.h"

struct evdns_base;
struct llm_callst;

/* What the wire code needs of a provider. */
typedef struct llm_wire {
    llm_kind kind;
    const char *model;
    unsigned max_output_tokens;
    const char *openai_max_tokens_field;
} llm_wire;

/* ---- the provider (llm.c) ---------------------------------------------------------------- */

/* A connection whose attempt has ended, waiting to be freed. */
typedef struct llm_grave {
    struct evhttp_connection *evcon;
    struct llm_grave *next;
} llm_grave;

/* What a provider keeps for one event base: its resolver, its unfinished calls and the
 * connections of ended attempts. The list of bases is under the provider's mutex; the
 * fields below next are touched only on the base's thread.
 *
 * Connections are freed by the provider, from an event of its own (reap), never by libevent
 * (free_on_completion) and never inside libevent's callbacks: libevent 2.1 does not free
 * an auto-freed connection whose connect failed, and it still uses a connection after the
 * callback of a request that succeeded. */
typedef struct llm_base {
    struct event_base *base;
    struct llm_base *next;
    struct evdns_base *dns; /* made on the first call that needs one */
    bool dns_tried;
    bool closing;             /* llm_detach is running: no new calls */
    struct llm_callst *calls; /* unfinished calls (doubly linked) */
    struct event *reap;       /* frees graves; made with the first call */
    llm_grave *graves;
} llm_base;

/* llm_base_reap frees the connections of b's ended attempts (on b's thread, or when its
 * loop no longer runs). */
void llm_base_reap(llm_base *b);

struct llm_provider {
    llm_wire wire;
    char *model;
    char *key;         /* NULL: none; wiped on destroy */
    char *auth;        /* OpenAI's "Bearer <key>"; wiped on destroy */
    char *host;        /* for connecting (no brackets) */
    char *host_header; /* Host: with the port when not the scheme's */
    char *path;        /* with the query, if the URL had one */
    char *anthropic_version;
    char *max_tokens_field;
    int port;
    bool https;
    bool numeric_host;
    SSL_CTX *ssl;
    unsigned timeout_ms, deadline_ms, max_retries, backoff_ms, backoff_max_ms;
    unsigned retry_after_max_ms, max_concurrency;
    size_t max_response_bytes;
    double price_in, price_out;

    pthread_mutex_t mu;
    unsigned in_flight;                       /* slots held (under mu) */
    unsigned n_waiting;                       /* calls queued (under mu) */
    struct llm_callst *wait_head, *wait_tail; /* FIFO of calls wanting a slot (under mu) */
    llm_base *bases;                          /* under mu */

    atomic_uint_least64_t st_calls, st_attempts, st_retries, st_tokens_in, st_tokens_out;
    atomic_uint_least64_t st_cost_nusd; /* cost in billionths of a dollar */
    atomic_uint_least64_t st_status[LLM_STATUS_COUNT];
};

/* llm_ssl_call_index is the SSL ex_data index under which a call's SSL objects point back
 * to the call (for the verify callback); made once per process. */
int llm_ssl_call_index(void);

/* ---- JSON documents (llm_schema.c) ------------------------------------------------------- */

/* A parsed JSON text: its MessagePack bytes and the object tree over them. Zero it before
 * use; free with llm_jdoc_fini. */
typedef struct llm_jdoc {
    ubuf_sink mp;
    msgpack_zone zone;
    bool zone_ok;
    msgpack_object root;
} llm_jdoc;

/* llm_jdoc_parse parses len bytes of JSON text into d (zeroed). Nesting is limited to
 * max_depth containers, and never more than 32 (what msgpack-c's unpacker holds). Returns
 * 0, -ENOMEM, or LLM_SCHEMA_E_SYNTAX with err (also for nesting too deep). */
int llm_jdoc_parse(llm_jdoc *d, const char *text, size_t len, unsigned max_depth, char *err,
                   size_t errlen);

/* llm_jdoc_from_object packs a copy of o into d (zeroed), so that d outlives o's zone.
 * Returns 0 or -ENOMEM. */
int llm_jdoc_from_object(llm_jdoc *d, const msgpack_object *o);

/* llm_jdoc_fini frees d's memory and zeroes it. */
void llm_jdoc_fini(llm_jdoc *d);

/* llm_json_text makes compact JSON text of o in *out (malloc'd, NUL-terminated, length in
 * *len). Returns 0, -ENOMEM, or JSON_E_* of json_from_msgpack. */
int llm_json_text(const msgpack_object *o, char **out, size_t *len);

/* ---- the protocols (llm_wire.c) ---------------------------------------------------------- */

/* llm_wire_body builds the JSON request body of req for w into out (zeroed). Returns 0,
 * -ENOMEM, or -EINVAL with err (text that is not UTF-8, a bad schema name). */
int llm_wire_body(const llm_wire *w, const llm_request *req, ubuf *out, char *err, size_t errlen);

/* llm_wire_answer reads a 200 answer's body into res: status (LLM_OK, LLM_E_MALFORMED,
 * LLM_E_SCHEMA, LLM_E_TRUNCATED, LLM_E_REFUSED), reason, text, value, stop_reason, model,
 * response_id, tokens. schema NULL: a text answer; else the tool (Anthropic) or the
 * content (OpenAI) named schema_name is validated. Returns 0, or -ENOMEM (res's status
 * then undefined). */
int llm_wire_answer(llm_kind kind, const char *body, size_t len, const llm_schema *schema,
                    const char *schema_name, llm_result *res);

/* An error answer's parts, as the provider gave them (both protocols put them in an
 * "error" object). Strings are truncated copies, NUL-terminated, possibly empty. */
typedef struct llm_wire_error {
    char type[48]; /* rate_limit_error, overloaded_error, invalid_request_error... */
    char code[48]; /* OpenAI's code (insufficient_quota, invalid_api_key...) */
    char message[200];
    bool quota; /* the account's quota or spend limit is spent: waiting will not help */
} llm_wire_error;

/* llm_wire_error_parse reads a non-200 body into e (all empty when it is not the expected
 * JSON). Never fails. */
void llm_wire_error_parse(const char *body, size_t len, llm_wire_error *e);

/* llm_wire_retry_after reads a Retry-After header value (delay seconds or an HTTP date,
 * compared with now_unix) into milliseconds. Returns -1 when value is NULL or unreadable.
 * A date in the past is 0. */
long long llm_wire_retry_after(const char *value, long long now_unix);

/* llm_wire_redact copies a provider's message into out (outlen bytes) without anything that
 * may be a key: words holding "***", starting "sk-" or made of 24 or more key-like
 * characters become "[redacted]", control characters become spaces; if key (may be NULL)
 * or any 8 bytes of it still appear, the whole message becomes "[withheld]". */
void llm_wire_redact(const char *msg, const char *key, char *out, size_t outlen);

/* llm_wire_has_key tells whether s holds key or any 8 consecutive bytes of it (all of it
 * when shorter). False when either is NULL or key is empty. */
bool llm_wire_has_key(const char *s, const char *key);

#endif
