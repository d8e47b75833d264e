/* server/domain/chat.h: engramd's chat model providers (llm/llm.h), made from the settings.
 *
 * One provider per model name: the server's (llm_model) is made at start when llm_provider
 * is set; a tenant's override (tenants.chat_model, admin.tenant.update) gets its own on
 * first use, with the same URL, key, timeouts, retries, prices and concurrency cap (at most
 * CHAT_MAX_MODELS names). The API key comes from llm_api_key or from the first line of
 * llm_api_key_file; it is never logged, never put in a run record, and wiped at exit.
 *
 * Providers are shared by every thread; calls run on the caller's own event base
 * (consolidation: the background thread's, llm.h), never on a worker's.
 */
#ifndef ENGRAM_SERVER_CHAT_H
#define ENGRAM_SERVER_CHAT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "config.h"
#include "llm.h"

#define CHAT_MAX_MODELS 16
#define CHAT_MODEL_MAX 128

/* Why consolidation ran without the model (chat_count_fallback, /metrics). */
typedef enum chat_fallback {
    CHAT_FB_CAP = 0,     /* the tenant's daily token cap was reached */
    CHAT_FB_UNAVAILABLE, /* the provider failed (timeout, transport, 429, 5xx) */
    CHAT_FB_COUNT
} chat_fallback;

/* chat_init reads the llm_* settings at start (cfg must live until chat_fini) and, when
 * llm_provider is set, makes the server's provider (reading llm_api_key_file). Returns 0
 * (also when no provider is configured), or with err (which never holds the key) -EINVAL,
 * -ENOENT, -EIO or -ENOMEM. */
int chat_init(const config *cfg, char *err, size_t errlen);

/* chat_fini destroys the providers and wipes the key. No call may be running. */
void chat_fini(void);

/* chat_available tells whether a provider is configured. Any thread. */
bool chat_available(void);

/* chat_default_model returns the server's model name (llm_model). */
const char *chat_default_model(void);

/* chat_provider returns the provider for model (NULL: the server's), making it on first use.
 * NULL with err when none is configured, the table of names is full or it cannot be made.
 * The provider lives until chat_fini. Any thread. */
llm_provider *chat_provider(const char *model, char *err, size_t errlen);

/* chat_model_name_ok tells whether name (n bytes) may name a model: 1 to CHAT_MODEL_MAX
 * bytes of letters, digits and . _ - : / @ + (what providers' model ids use). */
bool chat_model_name_ok(const char *name, size_t n);

/* chat_count_fallback counts a consolidation run that went without the model. Any thread. */
void chat_count_fallback(chat_fallback why);

/* The counters of every provider, summed, and the fallbacks, for /metrics. Any thread. */
typedef struct chat_stats {
    llm_stats llm;
    uint64_t fallbacks[CHAT_FB_COUNT];
    unsigned providers;
} chat_stats;

void chat_stats_get(chat_stats *out);

#endif
