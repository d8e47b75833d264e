/* llm/llm.h: a chat model provider: one call to a language model, asynchronous on the
 * caller's libevent loop, over HTTP or HTTPS.
 *
 * Two wire protocols: Anthropic's Messages API (POST {base}/v1/messages) and OpenAI's chat
 * completions (POST {base}/chat/completions, which vLLM, Ollama and llama.cpp's server also
 * speak). A call sends a system prompt and user messages and gets back either text or, when
 * the request carries an output schema (llm_schema.h), a JSON value that has been checked
 * against that schema before the call reports ok: OpenAI's structured outputs
 * (response_format json_schema, strict), Anthropic's forced tool use (one tool whose
 * input_schema is the schema, tool_choice naming it).
 *
 * Failures are typed (timeout, rate limited, HTTP status, transport, TLS, malformed answer,
 * schema violation, truncated, refused) and carry a short reason meant for run records: it
 * never holds the API key and never the prompt. Calls that failed without an answer (no
 * connection, a timeout, 408, 409, 429, 5xx including Anthropic's 529) are retried with
 * exponential backoff and jitter, honouring Retry-After (seconds or an HTTP date) up to a
 * cap, all within a total deadline; an answer the provider billed for (a 200) is never
 * retried here, whatever is wrong with it: the caller decides.
 *
 * Threads: a provider is created once and shared by every thread. A call runs on the event
 * base given to llm_call and its callback runs on that base's thread. The process-wide cap
 * on concurrent requests hands slots between bases with event_active(), so a process that
 * uses a provider from more than one thread must call evthread_use_pthreads() before it
 * creates any event base (engramd does). The library logs nothing.
 *
 * Connections: one connection per attempt ("Connection: close"), made on the caller's base
 * and freed by libevent when the attempt ends. A model call takes seconds; a TCP and TLS
 * handshake is a small share of that, and a connection that never outlives its attempt
 * cannot carry a cancelled or half-read answer into the next one. Host names are resolved
 * with one asynchronous resolver (evdns) per base, made on first use; numeric hosts need
 * none.
 */
#ifndef ENGRAM_LLM_H
#define ENGRAM_LLM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "llm_schema.h"

struct event_base;

typedef struct llm_provider llm_provider;

/* The wire protocol of a provider. */
typedef enum llm_kind {
    LLM_ANTHROPIC = 1, /* Messages API */
    LLM_OPENAI = 2,    /* chat completions */
} llm_kind;

/* A call's outcome: llm_result.status. LLM_OK is 0; the others are positive. */
enum {
    LLM_OK = 0,
    LLM_E_TIMEOUT,      /* no answer within the attempt timeout (every attempt) or the deadline */
    LLM_E_RATE_LIMITED, /* 429, or Anthropic's 529 overloaded, after the retries allowed */
    LLM_E_HTTP,         /* another non-200 status (4xx are not retried, 5xx after retries) */
    LLM_E_TRANSPORT,    /* no connection, or it closed before a whole answer (after retries) */
    LLM_E_TLS,          /* the server's certificate did not verify (not retried) */
    LLM_E_MALFORMED,    /* a 200 whose body is not the protocol's answer, or a structured
                           answer that is not JSON */
    LLM_E_SCHEMA,       /* a structured answer that breaks the request's schema */
    LLM_E_TRUNCATED,    /* the model stopped at the output token limit */
    LLM_E_REFUSED,      /* the model refused (stop reason refusal, a content filter) */
    LLM_E_CANCELLED,    /* llm_detach ended the call before it finished */
    LLM_E_INTERNAL,     /* out of memory while running the call */
    LLM_STATUS_COUNT
};

#define LLM_REASON_MAX 256

/* Provider settings. Initialize with llm_config_init (which sets the defaults shown), then
 * set at least kind, base_url and model. Strings are copied by llm_provider_create. */
typedef struct llm_config {
    llm_kind kind;
    /* The base URL as the providers' SDKs take it: "https://api.anthropic.com" (the path
     * /v1/messages is appended) or "https://api.openai.com/v1", "http://127.0.0.1:8000/v1"
     * (/chat/completions is appended). A URL that already ends in that path is used as it
     * is. http:// or https://. */
    const char *base_url;
    const char *model;
    /* The API key: Anthropic's x-api-key, OpenAI's Bearer token; NULL or "" sends none
     * (a local server). Never logged, never in a reason; wiped on destroy. */
    const char *api_key;
    /* PEM file of the CA certificates that verify an https server; NULL: the system's store.
     * The server's name (or IP address) is always checked against its certificate. */
    const char *ca_file;
    unsigned timeout_ms;         /* one attempt, connect to last byte (default 60000) */
    unsigned deadline_ms;        /* a whole call, waits included; 0: derived (see below) */
    unsigned max_retries;        /* attempts after the first (default 2) */
    unsigned backoff_ms;         /* first pause before a retry, doubling (default 500) */
    unsigned backoff_max_ms;     /* the longest pause (default 20000) */
    unsigned retry_after_max_ms; /* a longer Retry-After ends the call instead (default 60000) */
    unsigned max_concurrency;    /* requests in flight in this process; 0: no cap (default 4) */
    unsigned max_output_tokens;  /* per call unless the request says (default 1024) */
    size_t max_response_bytes;   /* a longer answer is malformed (default 4 MiB) */
    double price_in_per_mtok;    /* USD per million input tokens, for cost (default 0) */
    double price_out_per_mtok;   /* USD per million output tokens (default 0) */
    /* Anthropic's API version header (default "2023-06-01"). */
    const char *anthropic_version;
    /* OpenAI: the output token limit's field name, "max_completion_tokens" (default; what
     * OpenAI's current models require) or "max_tokens" (older servers). */
    const char *openai_max_tokens_field;
} llm_config;

/* llm_config_init sets every field of cfg to its default (kind 0 and NULL strings for the
 * fields without one). When deadline_ms stays 0 the provider derives it: timeout_ms *
 * (max_retries + 1) + max(backoff_max_ms, retry_after_max_ms) * max_retries, room for every
 * attempt with the longest pauses allowed (300 s with the defaults). */
void llm_config_init(llm_config *cfg);

/* llm_kind_parse reads "anthropic" or "openai" into *out. Returns 0 or -EINVAL. */
int llm_kind_parse(const char *name, llm_kind *out);

/* llm_kind_name returns "anthropic", "openai" or "unknown". */
const char *llm_kind_name(llm_kind kind);

/* llm_status_name returns a fixed name for a status ("ok", "timeout", "rate_limited",
 * "http", "transport", "tls", "malformed", "schema", "truncated", "refused", "cancelled",
 * "internal"), "unknown" otherwise. For run records and metric labels. */
const char *llm_status_name(int status);

/* llm_config_key_from_file reads an API key from a credentials file: its first line that
 * is neither empty nor a '#' comment, with surrounding white space removed; a line
 * "NAME=value" gives value. The key goes into key (keylen bytes, NUL-terminated); the
 * line buffer is wiped. Returns 0, or with err (which names the file, never its content)
 * -ENOENT (no such file), -EIO (unreadable), -EINVAL (no key in it), -ENAMETOOLONG (the
 * key does not fit keylen). */
int llm_config_key_from_file(const char *path, char *key, size_t keylen, char *err, size_t errlen);

/* llm_provider_create checks cfg and makes a provider. Returns 0 with *out, or with err
 * -EINVAL (no kind, model or URL; a URL that is not http(s); a bad setting), -EIO (TLS
 * cannot be set up: an unreadable ca_file), -ENOMEM. Any thread; the provider is then
 * shared by all. */
int llm_provider_create(const llm_config *cfg, llm_provider **out, char *err, size_t errlen);

/* llm_provider_destroy frees p (NULL: no-op). Every base that made calls must have been
 * detached (llm_detach) or have no call left, and its loop must not run. */
void llm_provider_destroy(llm_provider *p);

/* One message of the conversation. Content is plain text: callers escape or delimit what
 * they put in it (it goes into JSON strings, which this library escapes). */
typedef enum llm_role { LLM_USER = 0, LLM_ASSISTANT = 1 } llm_role;

typedef struct llm_message {
    llm_role role;
    const char *text; /* UTF-8, len bytes */
    size_t len;
} llm_message;

/* A request. Everything is copied or encoded by llm_call except schema, which must live
 * until the call's callback has run (schemas are made once and kept). */
typedef struct llm_request {
    const char *system;          /* the system prompt (NUL-terminated UTF-8), or NULL */
    const llm_message *messages; /* n_messages >= 1; the first is the user's */
    size_t n_messages;
    /* The answer's structure, or NULL for a text answer. Its root must be an object (both
     * APIs require it). */
    const llm_schema *schema;
    const char *schema_name;        /* the tool's / json_schema's name: [A-Za-z0-9_-]{1,64};
                                       NULL: "result" */
    const char *schema_description; /* what the structure is for (sent to the model), or NULL */
    unsigned max_output_tokens;     /* 0: the provider's */
    bool has_temperature;           /* false: the provider's own default */
    double temperature;
    unsigned deadline_ms; /* 0: the provider's; a shorter budget for this call */
} llm_request;

/* A call's result. Owned by the library while the done callback runs (freed when it
 * returns) unless the callback moves it out with llm_result_move. */
typedef struct llm_result {
    int status;                  /* LLM_OK or an LLM_E_* */
    char reason[LLM_REASON_MAX]; /* "" when ok; otherwise why, briefly, with the attempts */
    int http_status;             /* of the last attempt that got an answer; 0 if none */
    /* Text answers: the text. Structured answers: the JSON text of the value (normalized),
     * present also when it broke the schema or, as the model wrote it, when it was not
     * JSON. NUL-terminated, or NULL. */
    char *text;
    size_t text_len;
    /* Structured answers that passed the schema: the value as MessagePack; else NULL. */
    char *value;
    size_t value_len;
    char stop_reason[32]; /* as the provider said it: end_turn, tool_use, stop, length... */
    char model[96];       /* the model that answered, as the provider named it */
    char response_id[96]; /* the provider's id of the answer (msg_..., chatcmpl-...) */
    uint64_t tokens_in;   /* as the provider counted them (Anthropic: cache tokens too) */
    uint64_t tokens_out;
    double cost_usd;     /* tokens times the configured prices */
    uint64_t latency_ms; /* from llm_call to the result, waits and retries included */
    unsigned attempts;   /* HTTP requests sent */
} llm_result;

/* llm_result_move moves everything src holds into dst (whose previous contents are not
 * freed) and leaves src empty. */
void llm_result_move(llm_result *dst, llm_result *src);

/* llm_result_fini frees what r holds and zeroes it (a zeroed result is a no-op). */
void llm_result_fini(llm_result *r);

/* The callback of a call: runs exactly once, on the thread of the call's base, from its
 * event loop (never inside llm_call). res is the library's; see llm_result. */
typedef void (*llm_done_fn)(llm_result *res, void *arg);

/* llm_call starts a call on base (the calling thread must be the one that runs base, or
 * base's loop must not be running yet). It waits for a slot under the provider's
 * concurrency cap, sends the request, retries as the header comment says, and calls
 * done(res, arg) once. Returns 0 (done will run), or -EINVAL (no message, a message or
 * the system prompt not UTF-8, a schema whose root is not an object, a bad schema_name),
 * -ECANCELED (llm_detach is ending base's calls: from a done callback it runs) or
 * -ENOMEM, and then done never runs. */
int llm_call(llm_provider *p, struct event_base *base, const llm_request *req, llm_done_fn done,
             void *arg);

/* llm_detach ends every unfinished call on base (their callbacks run, inside llm_detach,
 * with LLM_E_CANCELLED) and frees what the provider keeps for base (its resolver). Call it
 * on base's thread before freeing base; base may be used again afterwards. */
void llm_detach(llm_provider *p, struct event_base *base);

/* llm_call_sync makes one call on a private event base and waits for it, for threads
 * that block (background work with its own database connection). On return *out holds
 * the result (free it with llm_result_fini). Returns 0, or -EINVAL / -ENOMEM as llm_call
 * (out then untouched). */
int llm_call_sync(llm_provider *p, const llm_request *req, llm_result *out);

/* Counters since the provider was made, for /metrics. */
typedef struct llm_stats {
    uint64_t calls; /* results delivered */
    uint64_t by_status[LLM_STATUS_COUNT];
    uint64_t attempts; /* HTTP requests sent */
    uint64_t retries;  /* attempts after a call's first */
    uint64_t tokens_in, tokens_out;
    double cost_usd;
    uint64_t in_flight; /* requests holding a slot now */
    uint64_t waiting;   /* calls waiting for a slot now */
} llm_stats;

/* llm_provider_stats copies p's counters into *out. Any thread. */
void llm_provider_stats(llm_provider *p, llm_stats *out);

#endif
