/* server/domain/chat.c: the chat model providers made from the settings (see chat.h). */
#include "chat.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"

#define KEY_MAX 1024

static const config *chat_cfg;
static llm_kind chat_kind;
static char chat_key[KEY_MAX]; /* wiped by chat_fini */
static pthread_mutex_t chat_mu = PTHREAD_MUTEX_INITIALIZER;
static struct {
    char *model;
    llm_provider *p;
} models[CHAT_MAX_MODELS];
static unsigned nmodels;
static _Atomic uint64_t fallbacks[CHAT_FB_COUNT];

/* The provider's public API when llm_url is empty. */
static const char *default_url(llm_kind k)
{
    return k == LLM_ANTHROPIC ? "https://api.anthropic.com" : "https://api.openai.com/v1";
}

/* Makes the provider of model from the settings. Called with chat_mu held. */
static llm_provider *make(const char *model, char *err, size_t errlen)
{
    const config *c = chat_cfg;
    llm_config lc;
    llm_config_init(&lc);
    lc.kind = chat_kind;
    lc.base_url = c->llm_url[0] ? c->llm_url : default_url(chat_kind);
    lc.model = model;
    lc.api_key = chat_key[0] ? chat_key : NULL;
    lc.ca_file = c->llm_ca_file[0] ? c->llm_ca_file : NULL;
    lc.timeout_ms = (unsigned)c->llm_timeout_ms;
    lc.max_retries = (unsigned)c->llm_retries;
    lc.retry_after_max_ms = (unsigned)c->llm_retry_after_max_ms;
    if (lc.backoff_max_ms > lc.retry_after_max_ms && lc.retry_after_max_ms > 0)
        lc.backoff_max_ms = lc.retry_after_max_ms;
    lc.max_concurrency = (unsigned)c->llm_max_concurrency;
    lc.max_output_tokens = (unsigned)c->llm_max_output_tokens;
    lc.price_in_per_mtok = c->llm_price_in_per_mtok;
    lc.price_out_per_mtok = c->llm_price_out_per_mtok;
    llm_provider *p = NULL;
    if (llm_provider_create(&lc, &p, err, errlen) < 0)
        return NULL;
    return p;
}

int chat_init(const config *cfg, char *err, size_t errlen)
{
    chat_cfg = cfg;
    if (!cfg->llm_provider[0])
        return 0;
    if (llm_kind_parse(cfg->llm_provider, &chat_kind) < 0) {
        snprintf(err, errlen, "llm_provider must be anthropic or openai");
        return -EINVAL;
    }
    if (cfg->llm_api_key_file[0]) {
        int rc = llm_config_key_from_file(cfg->llm_api_key_file, chat_key, sizeof(chat_key), err,
                                          errlen);
        if (rc < 0)
            return rc;
    } else if (cfg->llm_api_key[0]) {
        if (strlen(cfg->llm_api_key) >= sizeof(chat_key)) {
            snprintf(err, errlen, "llm_api_key is longer than %d bytes", KEY_MAX - 1);
            return -EINVAL;
        }
        strcpy(chat_key, cfg->llm_api_key);
    }
    char perr[256];
    if (!chat_provider(NULL, perr, sizeof(perr))) {
        snprintf(err, errlen, "chat model provider: %s", perr);
        return -EINVAL;
    }
    /* the key is never logged: only whether there is one and where it came from */
    log_info("chat model provider %s: %s, model %s, API key %s", cfg->llm_provider,
             cfg->llm_url[0] ? cfg->llm_url : default_url(chat_kind), cfg->llm_model,
             !chat_key[0]               ? "none"
             : cfg->llm_api_key_file[0] ? "from llm_api_key_file"
                                        : "from llm_api_key");
    return 0;
}

void chat_fini(void)
{
    pthread_mutex_lock(&chat_mu);
    for (unsigned i = 0; i < nmodels; i++) {
        llm_provider_destroy(models[i].p);
        free(models[i].model);
        models[i].p = NULL;
        models[i].model = NULL;
    }
    nmodels = 0;
    pthread_mutex_unlock(&chat_mu);
    volatile char *k = chat_key;
    for (size_t i = 0; i < sizeof(chat_key); i++)
        k[i] = 0;
}

bool chat_available(void)
{
    return chat_cfg && chat_cfg->llm_provider[0];
}

const char *chat_default_model(void)
{
    return chat_cfg ? chat_cfg->llm_model : "";
}

llm_provider *chat_provider(const char *model, char *err, size_t errlen)
{
    if (!chat_available()) {
        snprintf(err, errlen, "no chat model is configured (llm_provider)");
        return NULL;
    }
    if (!model || !model[0])
        model = chat_cfg->llm_model;
    llm_provider *p = NULL;
    pthread_mutex_lock(&chat_mu);
    for (unsigned i = 0; i < nmodels && !p; i++)
        if (strcmp(models[i].model, model) == 0)
            p = models[i].p;
    if (!p && nmodels == CHAT_MAX_MODELS) {
        snprintf(err, errlen, "more than %d model names in use", CHAT_MAX_MODELS);
    } else if (!p) {
        char *name = strdup(model);
        p = name ? make(model, err, errlen) : NULL;
        if (p) {
            models[nmodels].model = name;
            models[nmodels++].p = p;
        } else {
            if (!name)
                snprintf(err, errlen, "out of memory");
            free(name);
        }
    }
    pthread_mutex_unlock(&chat_mu);
    return p;
}

bool chat_model_name_ok(const char *name, size_t n)
{
    if (n == 0 || n > CHAT_MODEL_MAX)
        return false;
    for (size_t i = 0; i < n; i++) {
        char c = name[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              strchr("._-:/@+", c)))
            return false;
    }
    return true;
}

void chat_count_fallback(chat_fallback why)
{
    if (why < CHAT_FB_COUNT)
        atomic_fetch_add(&fallbacks[why], 1);
}

void chat_stats_get(chat_stats *out)
{
    memset(out, 0, sizeof(*out));
    for (int i = 0; i < CHAT_FB_COUNT; i++)
        out->fallbacks[i] = atomic_load(&fallbacks[i]);
    pthread_mutex_lock(&chat_mu);
    for (unsigned i = 0; i < nmodels; i++) {
        llm_stats s;
        llm_provider_stats(models[i].p, &s);
        out->llm.calls += s.calls;
        for (int k = 0; k < LLM_STATUS_COUNT; k++)
            out->llm.by_status[k] += s.by_status[k];
        out->llm.attempts += s.attempts;
        out->llm.retries += s.retries;
        out->llm.tokens_in += s.tokens_in;
        out->llm.tokens_out += s.tokens_out;
        out->llm.cost_usd += s.cost_usd;
        out->llm.in_flight += s.in_flight;
        out->llm.waiting += s.waiting;
    }
    out->providers = nmodels;
    pthread_mutex_unlock(&chat_mu);
}
