/* server/core/config.h: every setting of engramd, in one table.
 *
 * A setting named `rpc_port` is read, in increasing precedence, from its default, from the
 * config file (`rpc_port = 7420`, INI syntax, path from --config or ENGRAM_CONFIG), from
 * the environment (ENGRAM_RPC_PORT) and from the command line (--rpc-port 7420 or
 * --rpc-port=7420). Every value is validated against the table's type and range at start;
 * the first bad one stops engramd with a message naming the setting and where it came
 * from.
 *
 * The same table generates the commented reference file (`engramd --print-config`, shipped
 * as deploy/engramd.conf) and docs/configuration.md (`engramd --print-config=markdown`),
 * and says which settings SIGHUP reloads (CONFIG_RELOAD; main.c applies them).
 */
#ifndef ENGRAM_SERVER_CONFIG_H
#define ENGRAM_SERVER_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

typedef struct config {
    /* network */
    char *listen_host;
    int rpc_port;
    int http_port;
    int workers;
    int max_connections;
    long max_message_bytes;
    int max_depth;
    int max_inflight_per_conn;
    long max_output_bytes;
    long max_result_bytes;
    int frame_timeout_ms;
    int idle_timeout_s;
    int auth_timeout_s;
    int max_connections_per_address;
    int admin_reserved_connections;
    int http_max_connections;
    char *cors_allowed_origins; /* "" when none (http1_origin_listed's list) */
    long max_output_total_bytes;
    int min_send_rate;
    int shutdown_timeout_ms;
    int decode_threads;
    /* TLS (see tls.h); off unless tls_cert_file is set */
    char *tls_cert_file;
    char *tls_key_file;
    char *tls_ca_file;
    int tls_admin_require_client_cert;
    /* database */
    char *pg_dsn;
    char *pg_role;
    int pg_pool_size;
    char *pg_read_dsn; /* hot standbys for reads, "" when none */
    int pg_read_pool_size;
    int db_queue_timeout_ms;
    int db_query_timeout_ms;
    int db_backoff_max_ms;
    int write_lock_probe_ms;
    int write_lock_wait_ms;
    int bg_threads;
    int maintenance_interval_s;
    int access_flush_ms;
    int change_poll_ms;
    int access_fold_idle_s;
    int change_log_retention_hours;
    char *index_dir;
    long index_memory_mb;
    int index_snapshot_interval_s;
    long index_quant_min;
    long index_ann_min;
    int index_ann_candidates;
    int index_ann_max_candidates;
    double index_recall_target;
    double index_tie_margin; /* vindex_opts.tie_margin; 0: every candidate re-ranked exactly */
    double index_recall_budget_percent;
    double index_rows_ram_percent; /* mapped float rows an ANN index keeps in RAM (100: all) */
    int index_compact_percent;
    char *index_engine; /* "native" or "faiss" */
    char *index_faiss_factory;
    int index_faiss_ef_search;
    long row_cache_mb;
    int row_cache_prewarm_percent;
    int consolidate_check_interval_s;
    double consolidate_dedupe_threshold;
    double consolidate_supersede_threshold;
    double consolidate_prune_threshold;
    double consolidate_prune_grace_days;
    int consolidate_threads;
    int consolidate_exact_max;
    double consolidate_model_floor;
    int consolidate_model_group_max;
    int consolidate_model_max_groups;
    /* files */
    char *data_dir;
    char *admin_key_file;
    char *secret_file;
    char *log_level;
    char *log_format; /* "text" or "json" (log.h) */
    int metrics_history_step_s;
    /* memories */
    int embed_dim;
    char *openai_url;
    char *openai_model;
    int openai_dim;
    char *openai_key_env;
    int openai_timeout_ms;
    int openai_retries;
    int openai_batch;
    /* the chat model (llm/llm.h), for consolidation */
    char *llm_provider; /* "", "anthropic" or "openai" */
    char *llm_url;
    char *llm_model;
    char *llm_api_key;
    char *llm_api_key_file;
    char *llm_ca_file;
    int llm_timeout_ms;
    int llm_retries;
    int llm_retry_after_max_ms;
    int llm_max_concurrency;
    int llm_max_output_tokens;
    double llm_price_in_per_mtok;
    double llm_price_out_per_mtok;
    /* auto-compact (server/domain/autocompact.h) */
    char *compact_context_windows; /* "prefix=tokens,...,*=tokens" */
    int compact_check_interval_ms;
    /* memory extraction from transcripts and auto-dream (extract.h, dream.h) */
    int extract_check_interval_s;
    int extract_min_messages;
    long extract_min_tokens;
    int extract_idle_s;
    int extract_stale_s;
    int extract_retry_s;
    int extract_max_entries;
    long extract_max_bytes;
    double extract_min_confidence;
    int extract_neighbours;
    double extract_floor;
    double dream_hours;
    int dream_min_sessions;
    int dream_lock_stale_s;
    int dream_check_interval_s;
    int dream_max_sessions;
    int reembed_batch;
    int reembed_interval_ms;
    int reembed_retry_min_ms;
    int reembed_retry_max_ms;
    long max_content_bytes;
    long max_metadata_bytes;
    int max_metadata_entries;
    long max_query_bytes;
    long max_entry_bytes;
    long max_scratchpad_bytes;
    long max_note_bytes;
    long max_work_item_bytes;
    long max_label_bytes;
    int max_top_k;
    double similarity_weight;
    double score_w_recency;
    double score_w_access;
    double score_w_explicit;
    double score_w_usefulness;
    double provenance_threshold;
    double provenance_overlap_threshold;
    double score_recency_days;
    double score_access_saturation;
    /* tiers, indexed free / standard / premium (see tiers.h) */
    long tier_max_memories[3];
    long tier_max_memory_bytes[3];
    long tier_queries_per_day[3];
    int tier_consolidation_hours[3];
    long tier_model_tokens_per_day[3];
    int tier_checkpoint_ttl_s[3];
    double tier_rate_per_s[3];
    double tier_rate_burst[3];
    long tier_max_session_entries[3];
    long tier_max_session_bytes[3];
    long tier_max_live_sessions[3];
    long tier_max_connections[3];
    int tier_session_retention_days[3];
} config;

/* Flags of a setting. CONFIG_SECRET: never printed. CONFIG_RELOAD: SIGHUP applies a new value
 * without a restart. CONFIG_REREAD: the file the setting names is read again on SIGHUP (a new
 * path needs a restart). */
enum { CONFIG_SECRET = 1, CONFIG_RELOAD = 2, CONFIG_REREAD = 4 };

/* config_load fills cfg from defaults, the config file, the environment and argv (argv[0]
 * is skipped; argv entries that are not settings are errors). On --help it prints the
 * settings table to out and sets *exit_now; likewise --print-config[=ini|markdown] prints
 * the reference (config_print_reference) and --check-config, once every value passed
 * validation, prints the effective settings (config_print). Returns 0, or -EINVAL after printing a
 * message that names the bad setting to err. Strings in cfg are owned by cfg: free with
 * config_free. */
int config_load(config *cfg, int argc, char **argv, FILE *out, FILE *err, bool *exit_now);

/* config_free releases the strings of cfg. */
void config_free(config *cfg);

/* config_print writes every effective setting as `name = value` (secrets redacted). */
void config_print(const config *cfg, FILE *out);

/* The formats of config_print_reference. */
typedef enum { CONFIG_REF_INI, CONFIG_REF_MARKDOWN } config_ref_format;

/* config_print_reference writes every setting of the table with its default, range,
 * environment variable, flag, description and whether SIGHUP reloads it: as a commented
 * INI file that --config reads back to the defaults (every setting commented out), or as
 * the Markdown of docs/configuration.md. */
void config_print_reference(config_ref_format fmt, FILE *out);

/* config_diff_fn receives one setting whose value differs: its name, its CONFIG_* flags and
 * both values as text (secrets as "(redacted)"). */
typedef void (*config_diff_fn)(const char *name, unsigned flags, const char *old_value,
                               const char *new_value, void *arg);

/* config_diff calls fn for every setting whose value differs between a and b, in table
 * order. */
void config_diff(const config *a, const config *b, config_diff_fn fn, void *arg);

#endif
