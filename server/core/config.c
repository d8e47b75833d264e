/* server/core/config.c: the settings table and its sources (see config.h). */
#include "config.h"

#include "index_engine.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <ini.h>

#include "index_engine.h"
#include "log.h"
#include "vfaiss.h"
#include "vindex.h"

typedef enum { T_INT, T_LONG, T_DOUBLE, T_STR } cfg_type;

#define F_SECRET CONFIG_SECRET
#define F_RELOAD CONFIG_RELOAD
#define F_REREAD CONFIG_REREAD

typedef struct config_def {
    const char *name;
    cfg_type type;
    size_t offset;
    const char *def;
    double min, max;
    unsigned flags;
    const char *help;
} config_def;

#define OFF(f) offsetof(config, f)

/* The one table. Keep it sorted by topic; README's configuration section mirrors it. */
static const config_def defs[] = {
    {"listen_host", T_STR, OFF(listen_host), "127.0.0.1", 0, 0, 0,
     "address the RPC and HTTP ports bind to"},
    {"rpc_port", T_INT, OFF(rpc_port), "7420", 1, 65535, 0, "MessagePack-RPC TCP port"},
    {"http_port", T_INT, OFF(http_port), "7421", 0, 65535, 0,
     "HTTP port: the HTTP/JSON API, /v1/openapi.json, /livez, /readyz, /healthz and /metrics "
     "(0: disabled)"},
    {"workers", T_INT, OFF(workers), "0", 0, 256, 0,
     "worker threads, each with its own event loop (0: one per CPU core)"},
    {"max_connections", T_INT, OFF(max_connections), "10000", 1, 1000000, 0,
     "open client connections before new ones are refused"},
    {"max_message_bytes", T_LONG, OFF(max_message_bytes), "16777216", 1024, 1073741824, 0,
     "largest MessagePack-RPC message accepted"},
    {"max_depth", T_INT, OFF(max_depth), "32", 4, 32, 0,
     "deepest nesting of arrays and maps in a message"},
    {"max_inflight_per_conn", T_INT, OFF(max_inflight_per_conn), "256", 1, 65536, 0,
     "pipelined requests in progress per connection before reading pauses"},
    {"max_output_bytes", T_LONG, OFF(max_output_bytes), "67108864", 65536, 4294967296.0, 0,
     "bytes a connection may hold in unsent answers, answers being packed and requests in "
     "progress: a request is dispatched only when its message, its decoded form and a "
     "reservation for its answer fit, and an answer that outgrows its reservation takes the "
     "rest from here or waits until the client has read enough"},
    {"max_result_bytes", T_LONG, OFF(max_result_bytes), "16777216", 65536, 4294967296.0, 0,
     "largest answer one request may have (MessagePack bytes; at most max_output_bytes): a "
     "larger one is refused with result_too_large, naming this limit, and the client asks "
     "for less (fewer ids, a smaller page)"},
    {"frame_timeout_ms", T_INT, OFF(frame_timeout_ms), "30000", 100, 3600000, 0,
     "time allowed to finish sending a message once it has started"},
    {"idle_timeout_s", T_INT, OFF(idle_timeout_s), "600", 0, 604800, 0,
     "close connections idle this long (0: never)"},
    {"auth_timeout_s", T_INT, OFF(auth_timeout_s), "10", 0, 3600, 0,
     "close a connection that has not authenticated this long after it opened (0: never); "
     "until then it may call only ping, auth and methods, with 64 KiB of unsent answers"},
    {"max_connections_per_address", T_INT, OFF(max_connections_per_address), "1000", 0, 1000000, 0,
     "open connections from one IP address before more from it are refused (0: no limit)"},
    {"admin_reserved_connections", T_INT, OFF(admin_reserved_connections), "8", 0, 10000, 0,
     "RPC connections accepted past max_connections on which only the admin key may "
     "authenticate (a tenant's auth there is refused and the connection closed)"},
    {"http_max_connections", T_INT, OFF(http_max_connections), "1024", 1, 1000000, 0,
     "open connections on the HTTP port (counted apart from max_connections); 16 more are "
     "kept for /livez, /readyz, /healthz and /metrics, so probes answer when it is full"},
    {"cors_allowed_origins", T_STR, OFF(cors_allowed_origins), "", 0, 0, 0,
     "origins (scheme://host[:port], separated by commas or spaces) whose browser pages may "
     "call the HTTP port: their CORS preflights are answered and their Origin is echoed in "
     "Access-Control-Allow-Origin (never '*'); empty: no CORS headers at all"},
    {"max_output_total_bytes", T_LONG, OFF(max_output_total_bytes), "268435456", 0, 1099511627776.0,
     0,
     "unsent answers, answers being packed and incoming messages across all connections, "
     "charged when a request is dispatched: a request that does not fit waits, an eighth more "
     "is kept for connections that hold nothing (so every client's small requests go "
     "through), and a connection that has taken none of at least 1 MiB of unsent output for "
     "5 s while the total is over it is closed (0: no limit)"},
    {"min_send_rate", T_INT, OFF(min_send_rate), "1024", 0, 1073741824, 0,
     "bytes per second a client must keep up while sending a message, once it has been at it "
     "for 5 s; slower senders are closed (0: no floor)"},
    {"decode_threads", T_INT, OFF(decode_threads), "1", 0, 64, 0,
     "threads that decode messages of 256 KiB or 65,536 values and more, off the workers' event "
     "loops, so other clients of a worker never wait for one (0: the workers decode them)"},
    {"shutdown_timeout_ms", T_INT, OFF(shutdown_timeout_ms), "10000", 0, 600000, 0,
     "on SIGTERM, how long in-flight requests may take to finish"},
    {"tls_cert_file", T_STR, OFF(tls_cert_file), "", 0, 0, F_REREAD,
     "PEM certificate chain of the server (its certificate first): when set, with "
     "tls_key_file, the RPC and HTTP ports speak TLS 1.3 only; empty: plain TCP. Re-read "
     "on SIGHUP"},
    {"tls_key_file", T_STR, OFF(tls_key_file), "", 0, 0, F_REREAD,
     "PEM private key of tls_cert_file (unencrypted; keep it mode 600). Re-read on SIGHUP"},
    {"tls_ca_file", T_STR, OFF(tls_ca_file), "", 0, 0, F_REREAD,
     "PEM CA certificates that client certificates are verified against; when set, clients "
     "are asked for a certificate (optional) and one that does not verify fails the "
     "handshake. Re-read on SIGHUP"},
    {"tls_admin_require_client_cert", T_INT, OFF(tls_admin_require_client_cert), "0", 0, 1, 0,
     "1: auth with the admin key succeeds only on a connection that presented a client "
     "certificate verified by tls_ca_file"},
    {"pg_dsn", T_STR, OFF(pg_dsn), "", 0, 0, F_SECRET,
     "PostgreSQL connection string (libpq keyword=value or URI); required"},
    {"pg_role", T_STR, OFF(pg_role), "engram_app", 0, 0, 0,
     "role the server switches to after connecting (SET ROLE): it owns no table and is bound "
     "by row-level security; empty: stay the DSN's user"},
    {"pg_pool_size", T_INT, OFF(pg_pool_size), "2", 1, 64, 0,
     "PostgreSQL connections per worker (pipelined)"},
    {"pg_read_dsn", T_STR, OFF(pg_read_dsn), "", 0, 0, F_SECRET,
     "PostgreSQL connection string of hot standbys for reads (may name several hosts); "
     "memory reads and index loads use it when the standby has replayed every change the "
     "process knows of, else the primary (see docs/operations.md, Read replicas); empty: "
     "every read goes to pg_dsn"},
    {"pg_read_pool_size", T_INT, OFF(pg_read_pool_size), "2", 1, 64, 0,
     "standby connections per worker (pipelined), when pg_read_dsn is set"},
    {"db_queue_timeout_ms", T_INT, OFF(db_queue_timeout_ms), "2000", 10, 600000, 0,
     "longest a request waits for a database connection before 'unavailable'"},
    {"db_query_timeout_ms", T_INT, OFF(db_query_timeout_ms), "10000", 100, 3600000, 0,
     "longest a database statement may run before 'unavailable'"},
    {"write_lock_probe_ms", T_INT, OFF(write_lock_probe_ms), "50", 1, 60000, 0,
     "how long a tenant's write waits for its tenant's row lock in a connection other tenants "
     "share before it moves to the worker's own lane (another transaction holds the lock)"},
    {"write_lock_wait_ms", T_INT, OFF(write_lock_wait_ms), "2000", 10, 600000, 0,
     "how long a write waits on the lane for a lock another transaction holds before it fails "
     "with 'unavailable' (its tenant's queued writes with it)"},
    {"db_backoff_max_ms", T_INT, OFF(db_backoff_max_ms), "2000", 100, 600000, 0,
     "longest pause between reconnection attempts"},
    {"bg_threads", T_INT, OFF(bg_threads), "2", 1, 64, 0,
     "background threads for index loads and maintenance"},
    {"consolidate_check_interval_s", T_INT, OFF(consolidate_check_interval_s), "60", 1, 86400,
     F_RELOAD, "seconds between looks for tenants whose scheduled consolidation is due"},
    {"consolidate_dedupe_threshold", T_DOUBLE, OFF(consolidate_dedupe_threshold), "0.95", 0.5, 1, 0,
     "cosine similarity from which two memories of a type and visibility are near duplicates; "
     "without a model only the same text merges, the others are counted in the run's record"},
    {"consolidate_supersede_threshold", T_DOUBLE, OFF(consolidate_supersede_threshold), "0.85", 0.5,
     1, 0,
     "cosine similarity from which a newer fact or preference is similar to an older; without a "
     "model only a shared attrs.key or a change of values supersedes, the others are counted"},
    {"consolidate_prune_threshold", T_DOUBLE, OFF(consolidate_prune_threshold), "0.15", 0, 1, 0,
     "composite importance under which an old memory is archived by consolidation"},
    {"consolidate_prune_grace_days", T_DOUBLE, OFF(consolidate_prune_grace_days), "30", 0, 36500, 0,
     "age below which consolidation never prunes a memory"},
    {"consolidate_threads", T_INT, OFF(consolidate_threads), "1", 1, 64, 0,
     "threads for a consolidation's similarity search"},
    {"consolidate_exact_max", T_INT, OFF(consolidate_exact_max), "8192", 2, 10000000, 0,
     "largest group of memories compared exactly (all pairs); larger ones in k-means cells"},
    {"consolidate_model_floor", T_DOUBLE, OFF(consolidate_model_floor), "0.8", 0, 1, 0,
     "with a chat model (llm_provider): cosine similarity from which two memories of a type and "
     "visibility that no text rule relates are shown to the model together (a candidate group)"},
    {"consolidate_model_group_max", T_INT, OFF(consolidate_model_group_max), "8", 2, 64, 0,
     "most memories in one candidate group (one model call)"},
    {"consolidate_model_max_groups", T_INT, OFF(consolidate_model_max_groups), "200", 0, 1000000, 0,
     "most candidate groups a run sends to the model, most similar first (0: consolidation "
     "never calls the model)"},
    {"maintenance_interval_s", T_INT, OFF(maintenance_interval_s), "30", 1, 86400, F_RELOAD,
     "seconds between purges of expired memories and old idempotency keys"},
    {"access_flush_ms", T_INT, OFF(access_flush_ms), "5000", 100, 600000, 0,
     "least milliseconds between two writes of a worker's access counts to PostgreSQL (a "
     "worker that wrote none for that long writes at its next tick, 0.1 s): a crash loses at "
     "most this much of them (search results count accesses at once; memory.get reports the "
     "written ones); a memory read many times in that time is one row update"},
    {"change_poll_ms", T_INT, OFF(change_poll_ms), "5000", 100, 3600000, 0,
     "milliseconds between two checks of the loaded tenants' change numbers in PostgreSQL "
     "(one query): a change another process committed but could not announce (it died "
     "between its commit and its NOTIFY) reaches this process's index within this time"},
    {"access_fold_idle_s", T_INT, OFF(access_fold_idle_s), "600", 0, 604800, 0,
     "seconds a memory must go unread before the maintenance folds its pending access count "
     "into its row: a memory read all the time keeps its count in the narrow memory_access "
     "table instead of having its whole row (embedding and index entries) rewritten at every "
     "maintenance; 0 folds at every maintenance"},
    {"change_log_retention_hours", T_INT, OFF(change_log_retention_hours), "168", 1, 87600, 0,
     "hours the change log keeps a change; an index snapshot older than that is rebuilt "
     "from the memories instead of replayed"},
    {"data_dir", T_STR, OFF(data_dir), "var", 0, 0, 0,
     "directory for index snapshots and the server secret"},
    {"index_dir", T_STR, OFF(index_dir), "", 0, 0, 0,
     "directory for index snapshots (default: <data_dir>/index)"},
    {"index_memory_mb", T_LONG, OFF(index_memory_mb), "0", 0, 1e9, 0,
     "memory budget of the loaded indexes in MiB; the least recently used are evicted above "
     "it (0: half of the machine's memory)"},
    {"index_snapshot_interval_s", T_INT, OFF(index_snapshot_interval_s), "300", 1, 86400, 0,
     "a changed index is snapshotted at most this often (and at eviction and shutdown)"},
    {"index_quant_min", T_LONG, OFF(index_quant_min), "512", 1, 1e12, 0,
     "memories from which a tenant's index adds int8 codes (still exact)"},
    {"index_ann_min", T_LONG, OFF(index_ann_min), "4096", 1, 1e12, 0,
     "memories from which a tenant's index searches approximately (sign-bit candidates, "
     "exact re-rank); set above a tenant's size to keep it exact"},
    {"index_ann_candidates", T_INT, OFF(index_ann_candidates), "256", 16, 1000000, 0,
     "approximate search: candidates bounded at least (and at least 16 x top_k)"},
    {"index_ann_max_candidates", T_INT, OFF(index_ann_max_candidates), "16384", 16, 10000000, 0,
     "approximate search: the deepest candidate depth the recall monitor may set; an index "
     "that needs more to reach index_recall_target searches exactly"},
    {"index_recall_target", T_DOUBLE, OFF(index_recall_target), "0.99", 0.5, 1.0, 0,
     "recall@10 each approximate index keeps, as measured by its recall monitor: below it, "
     "the index searches deeper, or exactly"},
    {"index_tie_margin", T_DOUBLE, OFF(index_tie_margin), "2", 0, 1000, 0,
     "approximate search: hits are ranked by their int8 estimates and the float rows read "
     "only for near-ties at the k-th place, those whose estimates are within this many "
     "standard deviations of their error (higher: more rows read, recall nearer exact); 0 "
     "re-ranks every candidate on its float row (exact similarities, more rows read)"},
    {"index_recall_budget_percent", T_DOUBLE, OFF(index_recall_budget_percent), "1", 0, 100, 0,
     "CPU the recall monitor may use, in percent of one core, on average (0: off; a new or "
     "rebuilt index is still measured once; an index whose vectors did not change during "
     "its last 205 probes is probed once a minute only)"},
    {"index_rows_ram_percent", T_DOUBLE, OFF(index_rows_ram_percent), "1", 0, 100, 0,
     "approximate search reads a memory's full-precision vector only for near-ties, from "
     "the snapshot's mapped file: the part of those vectors a tenant keeps in RAM, in "
     "percent, checked each second (past it the pages no search read in the last second "
     "are dropped first, then those read past the cap's worth; the index budget counts "
     "what is in RAM; 100: as much as the kernel keeps)"},
    {"index_engine", T_STR, OFF(index_engine), "native", 0, 0, 0,
     "engine of the approximate tier for tenants that chose none (admin.tenant.create and "
     "update take index_engine): native (the index's own codes) or faiss (a FAISS index "
     "from index_faiss_factory); filters, deletes and the exact re-rank are the index's own "
     "either way"},
    {"index_faiss_factory", T_STR, OFF(index_faiss_factory), "HNSW32,Flat", 0, 0, 0,
     "FAISS index_factory string of the faiss engine (inner product; an index that needs "
     "training is refused)"},
    {"index_faiss_ef_search", T_INT, OFF(index_faiss_ef_search), "64", 1, 100000, 0,
     "efSearch of the faiss engine's HNSW search (more: higher recall, slower)"},
    {"row_cache_mb", T_LONG, OFF(row_cache_mb), "256", 0, 1e6, 0,
     "memory rows cached for search results in MiB, so that searches need no database "
     "round trip (0: none)"},
    {"row_cache_prewarm_percent", T_INT, OFF(row_cache_prewarm_percent), "90", 0, 100, 0,
     "after a tenant's index loads, its newest live memory rows are read into the row cache in "
     "the background while the cache holds less than this share of row_cache_mb, so that the "
     "first searches after a start or an eviction need no database round trip (0: off)"},
    {"index_compact_percent", T_INT, OFF(index_compact_percent), "25", 1, 100, 0,
     "share of deleted vectors at which an index is rebuilt without them (background)"},
    {"admin_key_file", T_STR, OFF(admin_key_file), "", 0, 0, 0,
     "file holding the admin key (created with a new key when missing; empty: no admin)"},
    {"secret_file", T_STR, OFF(secret_file), "", 0, 0, 0,
     "file holding the secret that keys API-key hashes (default: <data_dir>/secret.key, "
     "created when missing)"},
    {"log_level", T_STR, OFF(log_level), "info", 0, 0, F_RELOAD, "debug, info, warn or error"},
    {"log_format", T_STR, OFF(log_format), "text", 0, 0, F_RELOAD,
     "form of the log lines on stderr: text (time, level, file:line, message) or json (one "
     "object per line: time, level, file, line, message)"},
    {"metrics_history_step_s", T_INT, OFF(metrics_history_step_s), "10", 1, 60, 0,
     "seconds between two samples of the last hour's figures the web console charts "
     "(GET /metrics/history: requests, errors, latency, index memory)"},
    {"embed_dim", T_INT, OFF(embed_dim), "384", 8, 4096, 0,
     "dimension of the built-in embedder for new tenants"},
    {"openai_url", T_STR, OFF(openai_url), "", 0, 0, 0,
     "OpenAI-compatible embeddings endpoint (http:// or https://.../v1/embeddings); empty: "
     "the openai provider is off"},
    {"openai_model", T_STR, OFF(openai_model), "text-embedding-3-small", 0, 0, 0,
     "model name sent to the openai provider"},
    {"openai_dim", T_INT, OFF(openai_dim), "1536", 8, 4096, 0,
     "dimension of the openai provider's vectors"},
    {"openai_key_env", T_STR, OFF(openai_key_env), "OPENAI_API_KEY", 0, 0, 0,
     "environment variable holding the provider's API key (sent as a Bearer token)"},
    {"openai_timeout_ms", T_INT, OFF(openai_timeout_ms), "10000", 100, 600000, 0,
     "timeout of one request to the openai provider"},
    {"openai_retries", T_INT, OFF(openai_retries), "2", 0, 10, 0,
     "retries of a failed request to the openai provider"},
    {"openai_batch", T_INT, OFF(openai_batch), "128", 1, 2048, 0,
     "texts per request to the openai provider"},
    {"llm_provider", T_STR, OFF(llm_provider), "", 0, 0, 0,
     "chat model provider for consolidation: anthropic (the Messages API) or openai (chat "
     "completions: OpenAI, vLLM, Ollama, llama.cpp's server); empty: no model, consolidation "
     "uses its text rules only"},
    {"llm_url", T_STR, OFF(llm_url), "", 0, 0, 0,
     "base URL of the chat model API as the SDKs take it (https://api.anthropic.com, "
     "https://api.openai.com/v1, http://127.0.0.1:11434/v1); empty: the provider's public API"},
    {"llm_model", T_STR, OFF(llm_model), "claude-haiku-4-5", 0, 0, 0,
     "model name sent to the provider (a tenant may name another: admin.tenant.update "
     "chat_model)"},
    {"llm_api_key", T_STR, OFF(llm_api_key), "", 0, 0, F_SECRET,
     "API key of the chat model provider (Anthropic's x-api-key, OpenAI's Bearer token); "
     "never logged; prefer llm_api_key_file; empty: none (a local server)"},
    {"llm_api_key_file", T_STR, OFF(llm_api_key_file), "", 0, 0, 0,
     "file holding the API key: its first line that is neither empty nor a # comment ("
     "NAME=value gives value); read at start; keep it mode 600"},
    {"llm_ca_file", T_STR, OFF(llm_ca_file), "", 0, 0, 0,
     "PEM CA certificates that verify the provider's https certificate; empty: the system's"},
    {"llm_timeout_ms", T_INT, OFF(llm_timeout_ms), "60000", 100, 600000, 0,
     "one request to the chat model, connect to last byte"},
    {"llm_retries", T_INT, OFF(llm_retries), "2", 0, 10, 0,
     "retries of a model request that got no answer, a 408, 409, 429 or 5xx (with backoff, "
     "honouring Retry-After)"},
    {"llm_retry_after_max_ms", T_INT, OFF(llm_retry_after_max_ms), "60000", 0, 3600000, 0,
     "longest Retry-After waited for; a longer one ends the call as rate limited"},
    {"llm_max_concurrency", T_INT, OFF(llm_max_concurrency), "4", 1, 1024, 0,
     "model requests in flight in this process (per model name)"},
    {"llm_max_output_tokens", T_INT, OFF(llm_max_output_tokens), "2048", 16, 1000000, 0,
     "output token limit of one model call"},
    {"llm_price_in_per_mtok", T_DOUBLE, OFF(llm_price_in_per_mtok), "1", 0, 1e6, 0,
     "USD per million input tokens, for the cost in tenant.usage, run records and /metrics "
     "(default: Claude Haiku 4.5's list price)"},
    {"llm_price_out_per_mtok", T_DOUBLE, OFF(llm_price_out_per_mtok), "5", 0, 1e6, 0,
     "USD per million output tokens"},
    {"compact_context_windows", T_STR, OFF(compact_context_windows),
     "claude=200000,gpt-4o=128000,gpt-4-turbo=128000,gemini-2.0-flash=1000000,*=200000", 0, 0, 0,
     "context window in tokens of a session's model (config.model), for auto-compact: "
     "comma-separated prefix=tokens, the longest prefix of the model name wins (case-insensitive), "
     "* for every other model"},
    {"compact_check_interval_ms", T_INT, OFF(compact_check_interval_ms), "1000", 50, 3600000, 0,
     "milliseconds between looks for sessions an append made due for auto-compact (with "
     "llm_provider: the summarizing call is the tenant's chat model)"},
    {"extract_check_interval_s", T_INT, OFF(extract_check_interval_s), "60", 1, 86400, 0,
     "with a chat model: seconds between looks for sessions whose automatic extraction is due"},
    {"extract_min_messages", T_INT, OFF(extract_min_messages), "10", 0, 1000000, 0,
     "automatic extraction gate: messages appended to a session since its last extraction (0: "
     "no automatic extraction; session.extract still works)"},
    {"extract_min_tokens", T_LONG, OFF(extract_min_tokens), "1000", 0, 1000000000, 0,
     "automatic extraction gate: tokens of those messages (as appended, else bytes / 4)"},
    {"extract_idle_s", T_INT, OFF(extract_idle_s), "300", 0, 31536000, 0,
     "automatic extraction gate: seconds the session has been idle (no change), unless it "
     "ended"},
    {"extract_stale_s", T_INT, OFF(extract_stale_s), "600", 1, 86400, 0,
     "age after which a session's extraction claim is taken over (its engramd died mid-run)"},
    {"extract_retry_s", T_INT, OFF(extract_retry_s), "900", 0, 31536000, 0,
     "seconds automatic extraction waits before retrying a session whose last run failed"},
    {"extract_max_entries", T_INT, OFF(extract_max_entries), "200", 1, 10000, 0,
     "most transcript messages one extraction reads (one model call); the rest wait for the "
     "next"},
    {"extract_max_bytes", T_LONG, OFF(extract_max_bytes), "200000", 1024, 16777216, 0,
     "about the most bytes of messages one extraction reads"},
    {"extract_min_confidence", T_DOUBLE, OFF(extract_min_confidence), "0.5", 0, 1, 0,
     "extracted facts under this confidence are dropped (counted in the run's result)"},
    {"extract_neighbours", T_INT, OFF(extract_neighbours), "5", 0, 50, 0,
     "existing memories, most similar first, a new fact is compared with (0: every fact is "
     "added without a decision)"},
    {"extract_floor", T_DOUBLE, OFF(extract_floor), "0.6", 0, 1, 0,
     "cosine similarity from which an existing memory is shown to the model beside a new fact "
     "(a fact with none is added without asking)"},
    {"dream_hours", T_DOUBLE, OFF(dream_hours), "24", 0, 87600, 0,
     "auto-dream time gate: hours since a tenant's last pass (0: no auto-dream)"},
    {"dream_min_sessions", T_INT, OFF(dream_min_sessions), "5", 0, 1000000, 0,
     "auto-dream sessions gate: sessions created since the last pass"},
    {"dream_lock_stale_s", T_INT, OFF(dream_lock_stale_s), "3600", 1, 604800, 0,
     "auto-dream lock gate: age after which a pass's lock is taken over (its engramd died)"},
    {"dream_check_interval_s", T_INT, OFF(dream_check_interval_s), "300", 1, 86400, 0,
     "with a chat model: seconds between looks for tenants whose auto-dream is due"},
    {"dream_max_sessions", T_INT, OFF(dream_max_sessions), "50", 1, 100000, 0,
     "most sessions one pass reads (oldest first); the rest wait for the next pass"},
    {"reembed_batch", T_INT, OFF(reembed_batch), "64", 1, 2048, 0,
     "re-embedding (admin.tenant.update embedding): memories embedded and written per batch"},
    {"reembed_interval_ms", T_INT, OFF(reembed_interval_ms), "1000", 10, 600000, 0,
     "re-embedding: milliseconds between looks for jobs to work on"},
    {"reembed_retry_min_ms", T_INT, OFF(reembed_retry_min_ms), "1000", 1, 3600000, 0,
     "re-embedding: pause after the provider failed a batch (doubles per failure in a row)"},
    {"reembed_retry_max_ms", T_INT, OFF(reembed_retry_max_ms), "60000", 1, 3600000, 0,
     "re-embedding: the longest pause after failures in a row"},
    {"max_content_bytes", T_LONG, OFF(max_content_bytes), "65536", 1, 16777216, 0,
     "largest memory content accepted"},
    {"max_metadata_bytes", T_LONG, OFF(max_metadata_bytes), "16384", 256, 16777216, 0,
     "largest metadata of a memory or a checkpoint, and of a filter's metadata fields, in "
     "bytes of its MessagePack form (its JSON is about as long)"},
    {"max_metadata_entries", T_INT, OFF(max_metadata_entries), "256", 1, 1000000, 0,
     "most entries of any one list or map inside a memory's metadata.attrs"},
    {"max_query_bytes", T_LONG, OFF(max_query_bytes), "16384", 64, 16777216, 0,
     "longest query text of memory.search and memory.context"},
    {"max_entry_bytes", T_LONG, OFF(max_entry_bytes), "1048576", 1024, 16777216, 0,
     "longest transcript entry (session.append), summary, sub-agent task, context or output, "
     "and system prompt; a session's total is its tier's max_session_bytes"},
    {"max_scratchpad_bytes", T_LONG, OFF(max_scratchpad_bytes), "262144", 1024, 16777216, 0,
     "longest session scratchpad"},
    {"max_note_bytes", T_LONG, OFF(max_note_bytes), "16384", 64, 16777216, 0,
     "longest session note value"},
    {"max_work_item_bytes", T_LONG, OFF(max_work_item_bytes), "16384", 64, 16777216, 0,
     "longest work item description"},
    {"max_label_bytes", T_LONG, OFF(max_label_bytes), "256", 16, 65536, 0,
     "longest checkpoint label"},
    {"max_top_k", T_INT, OFF(max_top_k), "1000", 1, 100000, 0, "largest top_k a search may ask"},
    {"similarity_weight", T_DOUBLE, OFF(similarity_weight), "0.7", 0, 1, 0,
     "default share of similarity in the search score (the composite importance gets the rest)"},
    {"score_w_recency", T_DOUBLE, OFF(score_w_recency), "0.3", 0, 1, 0,
     "weight of recency in the composite importance"},
    {"score_w_access", T_DOUBLE, OFF(score_w_access), "0.3", 0, 1, 0,
     "weight of access frequency in the composite importance"},
    {"score_w_explicit", T_DOUBLE, OFF(score_w_explicit), "0.4", 0, 1, 0,
     "weight of the author's importance in the composite (the three weights sum to 1)"},
    {"score_w_usefulness", T_DOUBLE, OFF(score_w_usefulness), "0", 0, 1, 0,
     "share of provenance usefulness in the composite: (1 - w) * seed formula + w * (cited + 1) / "
     "(injected + 2); 0 keeps the seed's formula"},
    {"provenance_threshold", T_DOUBLE, OFF(provenance_threshold), "0.8", 0, 1, 0,
     "cosine similarity above which memory.provenance counts a memory as cited by a sentence"},
    {"provenance_overlap_threshold", T_DOUBLE, OFF(provenance_overlap_threshold), "0.5", 0.05, 1, 0,
     "share of a memory's wording (its distinct terms and pairs of consecutive terms) the "
     "response must contain for memory.provenance to count the memory as cited"},
    {"score_recency_days", T_DOUBLE, OFF(score_recency_days), "30", 0.001, 36500, 0,
     "recency decays as exp(-age_days / score_recency_days)"},
    {"score_access_saturation", T_DOUBLE, OFF(score_access_saturation), "10", 1, 1e9, 0,
     "accesses at which the access-frequency term saturates"},
    {"free_max_memories", T_LONG, OFF(tier_max_memories[0]), "100", 0, 1e12, F_RELOAD,
     "memories a free tenant may store (0: unlimited)"},
    {"standard_max_memories", T_LONG, OFF(tier_max_memories[1]), "5000", 0, 1e12, F_RELOAD,
     "memories a standard tenant may store (0: unlimited)"},
    {"premium_max_memories", T_LONG, OFF(tier_max_memories[2]), "50000", 0, 1e12, F_RELOAD,
     "memories a premium tenant may store (0: unlimited)"},
    {"free_max_memory_bytes", T_LONG, OFF(tier_max_memory_bytes[0]), "4194304", 0, 1e15, F_RELOAD,
     "bytes of text (content and metadata) a free tenant's memories may hold, archived ones "
     "and kept versions included (0: unlimited)"},
    {"standard_max_memory_bytes", T_LONG, OFF(tier_max_memory_bytes[1]), "134217728", 0, 1e15,
     F_RELOAD, "bytes of text a standard tenant's memories may hold (0: unlimited)"},
    {"premium_max_memory_bytes", T_LONG, OFF(tier_max_memory_bytes[2]), "2147483648", 0, 1e15,
     F_RELOAD, "bytes of text a premium tenant's memories may hold (0: unlimited)"},
    {"free_queries_per_day", T_LONG, OFF(tier_queries_per_day[0]), "50", 0, 1e12, F_RELOAD,
     "searches and context calls a free tenant may make per UTC day (0: unlimited)"},
    {"standard_queries_per_day", T_LONG, OFF(tier_queries_per_day[1]), "500", 0, 1e12, F_RELOAD,
     "searches and context calls a standard tenant may make per UTC day (0: unlimited)"},
    {"premium_queries_per_day", T_LONG, OFF(tier_queries_per_day[2]), "0", 0, 1e12, F_RELOAD,
     "searches and context calls a premium tenant may make per UTC day (0: unlimited)"},
    {"free_consolidation_hours", T_INT, OFF(tier_consolidation_hours[0]), "168", 0, 8760, F_RELOAD,
     "hours between scheduled consolidations of a free tenant (0: never)"},
    {"standard_consolidation_hours", T_INT, OFF(tier_consolidation_hours[1]), "24", 0, 8760,
     F_RELOAD, "hours between scheduled consolidations of a standard tenant (0: never)"},
    {"premium_consolidation_hours", T_INT, OFF(tier_consolidation_hours[2]), "24", 0, 8760,
     F_RELOAD, "hours between scheduled consolidations of a premium tenant (0: never)"},
    {"free_model_tokens_per_day", T_LONG, OFF(tier_model_tokens_per_day[0]), "20000", 0, 1e15,
     F_RELOAD,
     "chat model tokens (in and out) a free tenant's consolidations may use per UTC day; a "
     "tenant over it consolidates without the model until the day ends (0: unlimited)"},
    {"standard_model_tokens_per_day", T_LONG, OFF(tier_model_tokens_per_day[1]), "200000", 0, 1e15,
     F_RELOAD, "chat model tokens a standard tenant may use per UTC day (0: unlimited)"},
    {"premium_model_tokens_per_day", T_LONG, OFF(tier_model_tokens_per_day[2]), "2000000", 0, 1e15,
     F_RELOAD, "chat model tokens a premium tenant may use per UTC day (0: unlimited)"},
    {"free_checkpoint_ttl_s", T_INT, OFF(tier_checkpoint_ttl_s[0]), "86400", 60, 31536000, F_RELOAD,
     "lifetime of a free tenant's session checkpoints"},
    {"standard_checkpoint_ttl_s", T_INT, OFF(tier_checkpoint_ttl_s[1]), "86400", 60, 31536000,
     F_RELOAD, "lifetime of a standard tenant's session checkpoints"},
    {"premium_checkpoint_ttl_s", T_INT, OFF(tier_checkpoint_ttl_s[2]), "86400", 60, 31536000,
     F_RELOAD, "lifetime of a premium tenant's session checkpoints"},
    {"free_rate_per_s", T_DOUBLE, OFF(tier_rate_per_s[0]), "20", 0, 1e9, F_RELOAD,
     "sustained requests per second of a free tenant (0: unlimited)"},
    {"standard_rate_per_s", T_DOUBLE, OFF(tier_rate_per_s[1]), "200", 0, 1e9, F_RELOAD,
     "sustained requests per second of a standard tenant (0: unlimited)"},
    {"premium_rate_per_s", T_DOUBLE, OFF(tier_rate_per_s[2]), "5000", 0, 1e9, F_RELOAD,
     "sustained requests per second of a premium tenant (0: unlimited)"},
    {"free_rate_burst", T_DOUBLE, OFF(tier_rate_burst[0]), "40", 1, 1e9, F_RELOAD,
     "request burst a free tenant may make above its rate"},
    {"standard_rate_burst", T_DOUBLE, OFF(tier_rate_burst[1]), "400", 1, 1e9, F_RELOAD,
     "request burst a standard tenant may make above its rate"},
    {"premium_rate_burst", T_DOUBLE, OFF(tier_rate_burst[2]), "10000", 1, 1e9, F_RELOAD,
     "request burst a premium tenant may make above its rate"},
    {"free_max_session_entries", T_LONG, OFF(tier_max_session_entries[0]), "1000", 1, 1e12,
     F_RELOAD, "transcript entries per session of a free tenant"},
    {"standard_max_session_entries", T_LONG, OFF(tier_max_session_entries[1]), "10000", 1, 1e12,
     F_RELOAD, "transcript entries per session of a standard tenant"},
    {"premium_max_session_entries", T_LONG, OFF(tier_max_session_entries[2]), "100000", 1, 1e12,
     F_RELOAD, "transcript entries per session of a premium tenant"},
    {"free_max_session_bytes", T_LONG, OFF(tier_max_session_bytes[0]), "1048576", 1024, 1e13,
     F_RELOAD, "transcript content bytes per session of a free tenant"},
    {"standard_max_session_bytes", T_LONG, OFF(tier_max_session_bytes[1]), "16777216", 1024, 1e13,
     F_RELOAD, "transcript content bytes per session of a standard tenant"},
    {"premium_max_session_bytes", T_LONG, OFF(tier_max_session_bytes[2]), "268435456", 1024, 1e13,
     F_RELOAD, "transcript content bytes per session of a premium tenant"},
    {"free_max_live_sessions", T_LONG, OFF(tier_max_live_sessions[0]), "10", 0, 1e12, F_RELOAD,
     "active top-level sessions a free tenant may have at once (0: unlimited)"},
    {"standard_max_live_sessions", T_LONG, OFF(tier_max_live_sessions[1]), "100", 0, 1e12, F_RELOAD,
     "active top-level sessions a standard tenant may have at once (0: unlimited)"},
    {"premium_max_live_sessions", T_LONG, OFF(tier_max_live_sessions[2]), "1000", 0, 1e12, F_RELOAD,
     "active top-level sessions a premium tenant may have at once (0: unlimited)"},
    {"free_max_connections", T_LONG, OFF(tier_max_connections[0]), "16", 0, 1e9, F_RELOAD,
     "connections a free tenant may hold open to one engramd, RPC and HTTP (0: unlimited); "
     "an auth past it is refused with quota_exceeded"},
    {"standard_max_connections", T_LONG, OFF(tier_max_connections[1]), "256", 0, 1e9, F_RELOAD,
     "connections a standard tenant may hold open to one engramd (0: unlimited)"},
    {"premium_max_connections", T_LONG, OFF(tier_max_connections[2]), "2048", 0, 1e9, F_RELOAD,
     "connections a premium tenant may hold open to one engramd (0: unlimited)"},
    {"free_session_retention_days", T_INT, OFF(tier_session_retention_days[0]), "30", 0, 36500,
     F_RELOAD, "days after its last activity a free tenant's session is purged (0: kept forever)"},
    {"standard_session_retention_days", T_INT, OFF(tier_session_retention_days[1]), "30", 0, 36500,
     F_RELOAD,
     "days after its last activity a standard tenant's session is purged (0: kept forever)"},
    {"premium_session_retention_days", T_INT, OFF(tier_session_retention_days[2]), "30", 0, 36500,
     F_RELOAD,
     "days after its last activity a premium tenant's session is purged (0: kept forever)"},
};

#define NDEFS (sizeof(defs) / sizeof(defs[0]))

/* The topics of the reference (config_print_reference): each starts at its first setting. */
static const struct {
    const char *first, *title;
} topics[] = {
    {"listen_host", "Network and client limits"},
    {"tls_cert_file", "TLS"},
    {"pg_dsn", "Database"},
    {"bg_threads", "Background work, consolidation and maintenance"},
    {"data_dir", "Data directory and indexes"},
    {"admin_key_file", "Keys and logging"},
    {"embed_dim", "Embeddings"},
    {"llm_provider", "Chat model (consolidation, auto-compact)"},
    {"max_content_bytes", "Memories and ranking"},
    {"free_max_memories", "Tiers (free, standard, premium)"},
};

/* The FAISS factory must build an index FAISS accepts, without training: tried once at the
 * dimensions tenants get by default, so a typo stops the server rather than every load of a
 * faiss tenant. Returns 0 or -1 after printing why. */
static int check_factory(const config *cfg, FILE *err)
{
    const int dims[] = {cfg->embed_dim, cfg->openai_dim};
    for (size_t i = 0; i < sizeof(dims) / sizeof(dims[0]); i++) {
        char msg[512];
        vfaiss *f = NULL;
        int rc = vfaiss_create((size_t)dims[i], cfg->index_faiss_factory,
                               cfg->index_faiss_ef_search, &f, msg, sizeof(msg));
        vfaiss_destroy(f);
        if (rc != 0) {
            fprintf(err, "engramd: invalid value for index_faiss_factory at dimension %d: %s\n",
                    dims[i], msg);
            return -EINVAL;
        }
    }
    return 0;
}

static const config_def *find_def(const char *name, size_t n)
{
    for (size_t i = 0; i < NDEFS; i++)
        if (strlen(defs[i].name) == n && memcmp(defs[i].name, name, n) == 0)
            return &defs[i];
    return NULL;
}

/* Parses and stores one value. Returns 0 or -1 after printing why. */
static int set_value(config *cfg, const config_def *d, const char *val, const char *source,
                     FILE *err)
{
    char *p = (char *)cfg + d->offset;
    char *end = NULL;
    errno = 0;
    switch (d->type) {
    case T_INT:
    case T_LONG: {
        long long v = strtoll(val, &end, 10);
        if (errno || end == val || *end != '\0') {
            fprintf(err, "engramd: invalid value for %s (from %s): '%s' is not an integer\n",
                    d->name, source, val);
            return -EINVAL;
        }
        if ((double)v < d->min || (double)v > d->max) {
            fprintf(err,
                    "engramd: invalid value for %s (from %s): %lld is out of range %.0f..%.0f\n",
                    d->name, source, v, d->min, d->max);
            return -EINVAL;
        }
        if (d->type == T_INT)
            *(int *)(void *)p = (int)v;
        else
            *(long *)(void *)p = (long)v;
        return 0;
    }
    case T_DOUBLE: {
        double v = strtod(val, &end);
        if (errno || end == val || *end != '\0' || !isfinite(v)) {
            fprintf(err, "engramd: invalid value for %s (from %s): '%s' is not a number\n", d->name,
                    source, val);
            return -EINVAL;
        }
        if (v < d->min || v > d->max) {
            fprintf(err, "engramd: invalid value for %s (from %s): %g is out of range %g..%g\n",
                    d->name, source, v, d->min, d->max);
            return -EINVAL;
        }
        *(double *)(void *)p = v;
        return 0;
    }
    case T_STR: {
        char *copy = strdup(val);
        if (!copy) {
            fprintf(err, "engramd: out of memory\n");
            return -EINVAL;
        }
        char **slot = (char **)(void *)p;
        free(*slot);
        *slot = copy;
        return 0;
    }
    }
    return -EINVAL;
}

typedef struct ini_ctx {
    config *cfg;
    FILE *err;
    const char *path;
    int failed;
} ini_ctx;

static int on_ini(void *user, const char *section, const char *name, const char *value)
{
    ini_ctx *c = user;
    if (c->failed)
        return 0;
    if (section[0] && strcmp(section, "engram") != 0 && strcmp(section, "engramd") != 0) {
        fprintf(c->err, "engramd: %s: unknown section [%s]\n", c->path, section);
        c->failed = 1;
        return 0;
    }
    const config_def *d = find_def(name, strlen(name));
    if (!d) {
        fprintf(c->err, "engramd: %s: unknown setting '%s'\n", c->path, name);
        c->failed = 1;
        return 0;
    }
    char src[600];
    snprintf(src, sizeof(src), "config file %s", c->path);
    if (set_value(c->cfg, d, value, src, c->err) < 0) {
        c->failed = 1;
        return 0;
    }
    return 1;
}

static void env_name(const config_def *d, char *buf, size_t n)
{
    snprintf(buf, n, "ENGRAM_%s", d->name);
    for (char *p = buf; *p; p++)
        *p = (char)toupper((unsigned char)*p);
}

static void flag_name(const config_def *d, char *buf, size_t n)
{
    snprintf(buf, n, "--%s", d->name);
    for (char *p = buf + 2; *p; p++)
        if (*p == '_')
            *p = '-';
}

static void print_help(FILE *out)
{
    fprintf(out, "usage: engramd [SETTINGS...]\n"
                 "       engramd migrate [SETTINGS...]\n"
                 "       engramd create-tenant NAME TIER KEY_FILE [SETTINGS...]\n\n"
                 "Settings (flag / environment / config-file key, default, range):\n");
    for (size_t i = 0; i < NDEFS; i++) {
        const config_def *d = &defs[i];
        char flag[64], env[64];
        flag_name(d, flag, sizeof(flag));
        env_name(d, env, sizeof(env));
        fprintf(out, "  %-26s %-28s default '%s'", flag, env, d->def);
        if (d->type == T_INT || d->type == T_LONG)
            fprintf(out, ", %.0f..%.0f", d->min, d->max);
        else if (d->type == T_DOUBLE)
            fprintf(out, ", %g..%g", d->min, d->max);
        fprintf(out, "\n      %s\n", d->help);
    }
    fprintf(out, "  --config PATH              ENGRAM_CONFIG                 an INI file of the "
                 "settings above (name = value)\n"
                 "  --print-config[=ini|markdown]  print the commented reference of every "
                 "setting and exit\n"
                 "  --check-config             validate the settings, print the effective "
                 "values and exit\n"
                 "Settings marked reload take effect on SIGHUP; the others need a restart.\n");
}

/* What the command line asks before any setting is read: help, the reference, a check, the
 * config file (*path). Returns 1 when the process should exit now (help or reference
 * printed), 0 to go on, -EINVAL on a bad flag. */
static int scan_flags(int argc, char **argv, FILE *out, FILE *err, const char **path,
                      bool *check_only)
{
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            print_help(out);
            return 1;
        }
        if (strncmp(argv[i], "--print-config", 14) == 0) {
            const char *f = argv[i] + 14;
            if (strcmp(f, "") != 0 && strcmp(f, "=ini") != 0 && strcmp(f, "=markdown") != 0) {
                fprintf(err, "engramd: --print-config takes =ini or =markdown, not '%s'\n", f);
                return -EINVAL;
            }
            config_print_reference(
                strcmp(f, "=markdown") == 0 ? CONFIG_REF_MARKDOWN : CONFIG_REF_INI, out);
            return 1;
        }
        if (strcmp(argv[i], "--check-config") == 0)
            *check_only = true;
        if (strcmp(argv[i], "--config") == 0 && i + 1 < argc)
            *path = argv[i + 1];
        else if (strncmp(argv[i], "--config=", 9) == 0)
            *path = argv[i] + 9;
    }
    return 0;
}

/* The settings of the INI file at path. Returns 0 or -EINVAL (reported on err). */
static int load_file(config *cfg, const char *path, FILE *err)
{
    ini_ctx c = {.cfg = cfg, .err = err, .path = path};
    int r = ini_parse(path, on_ini, &c);
    if (r < 0) {
        fprintf(err, "engramd: cannot read config file %s: %s\n", path, strerror(errno));
        return -EINVAL;
    }
    if (c.failed)
        return -EINVAL;
    if (r > 0) {
        fprintf(err, "engramd: %s:%d: syntax error\n", path, r);
        return -EINVAL;
    }
    return 0;
}

/* The settings of the environment (ENGRAM_<NAME>). Returns 0 or -EINVAL. */
static int load_env(config *cfg, FILE *err)
{
    for (size_t i = 0; i < NDEFS; i++) {
        char env[64];
        env_name(&defs[i], env, sizeof(env));
        const char *v = getenv(env);
        if (v && set_value(cfg, &defs[i], v, env, err) < 0)
            return -EINVAL;
    }
    return 0;
}

/* The settings of the command line (--name=value or --name value). Returns 0 or -EINVAL. */
static int load_flags(config *cfg, int argc, char **argv, FILE *err)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--config") == 0) {
            i++;
            continue;
        }
        if (strncmp(a, "--config=", 9) == 0 || strcmp(a, "--check-config") == 0)
            continue;
        if (strncmp(a, "--", 2) != 0) {
            fprintf(err, "engramd: unexpected argument '%s' (try --help)\n", a);
            return -EINVAL;
        }
        const char *name = a + 2;
        const char *eq = strchr(name, '=');
        size_t n = eq ? (size_t)(eq - name) : strlen(name);
        char key[64];
        if (n >= sizeof(key)) {
            fprintf(err, "engramd: unknown setting '%s' (try --help)\n", a);
            return -EINVAL;
        }
        for (size_t k = 0; k < n; k++)
            key[k] = name[k] == '-' ? '_' : name[k];
        key[n] = '\0';
        const config_def *d = find_def(key, n);
        if (!d) {
            fprintf(err, "engramd: unknown setting '%s' (try --help)\n", a);
            return -EINVAL;
        }
        const char *val = eq ? eq + 1 : NULL;
        if (!val) {
            if (i + 1 >= argc) {
                fprintf(err, "engramd: %s needs a value\n", a);
                return -EINVAL;
            }
            val = argv[++i];
        }
        char src[96];
        snprintf(src, sizeof(src), "--%.*s", (int)n, name);
        if (set_value(cfg, d, val, src, err) < 0)
            return -EINVAL;
    }
    return 0;
}

/* compact_context_windows: prefix=tokens entries, comma-separated, tokens 1000 to 100000000,
 * prefixes of letters, digits and . _ - / : (or *). Returns 0 or -EINVAL (reported on err). */
static int check_windows(const char *list, FILE *err)
{
    const char *p = list;
    while (*p) {
        const char *comma = strchr(p, ','), *end = comma ? comma : p + strlen(p);
        const char *eq = memchr(p, '=', (size_t)(end - p));
        bool ok = eq && eq > p && eq + 1 < end && eq - p <= 128;
        for (const char *c = p; ok && c < eq; c++)
            ok = isalnum((unsigned char)*c) || strchr("._-/:", *c) || (*c == '*' && eq - p == 1);
        long long v = 0;
        for (const char *c = ok ? eq + 1 : end; c < end; c++) {
            ok = ok && isdigit((unsigned char)*c) && v < 1000000000LL;
            v = v * 10 + (*c - '0');
        }
        if (!ok || v < 1000 || v > 100000000) {
            fprintf(err,
                    "engramd: invalid value for compact_context_windows: '%s' (prefix=tokens, "
                    "comma-separated, tokens 1000 to 100000000; * for every other model)\n",
                    list);
            return -EINVAL;
        }
        p = comma ? comma + 1 : end;
    }
    return 0;
}

/* The chat model's settings: a known provider, a model name, one source of the key. Returns 0
 * or -EINVAL (reported on err). */
static int check_llm(const config *cfg, FILE *err)
{
    const char *p = cfg->llm_provider;
    if (p[0] && strcmp(p, "anthropic") != 0 && strcmp(p, "openai") != 0) {
        fprintf(err,
                "engramd: invalid value for llm_provider: '%s' (anthropic, openai, or empty "
                "for none)\n",
                p);
        return -EINVAL;
    }
    if (p[0] && !cfg->llm_model[0]) {
        fprintf(err, "engramd: llm_model is required when llm_provider is set\n");
        return -EINVAL;
    }
    if (cfg->llm_api_key[0] && cfg->llm_api_key_file[0]) {
        fprintf(err, "engramd: set llm_api_key or llm_api_key_file, not both\n");
        return -EINVAL;
    }
    if (check_windows(cfg->compact_context_windows, err) < 0)
        return -EINVAL;
    if (cfg->llm_url[0] && strncmp(cfg->llm_url, "http://", 7) != 0 &&
        strncmp(cfg->llm_url, "https://", 8) != 0) {
        fprintf(err, "engramd: llm_url must start with http:// or https://\n");
        return -EINVAL;
    }
    return 0;
}

/* Each entry of cors_allowed_origins is an origin as browsers send it: http:// or https://,
 * a host, an optional port, nothing after (no path, no trailing slash), no wildcard.
 * Returns 0 or -EINVAL (reported on err). */
static int check_origins(const char *list, FILE *err)
{
    for (const char *p = list; *p;) {
        while (*p == ',' || *p == ' ' || *p == '\t')
            p++;
        const char *e = p;
        while (*e && *e != ',' && *e != ' ' && *e != '\t')
            e++;
        size_t n = (size_t)(e - p);
        if (n == 0)
            break;
        size_t scheme = strncmp(p, "https://", 8) == 0 ? 8 : strncmp(p, "http://", 7) == 0 ? 7 : 0;
        bool ok = scheme && n > scheme && n <= 255;
        for (size_t i = scheme; ok && i < n; i++)
            ok = isalnum((unsigned char)p[i]) || strchr(".-:[]", p[i]);
        if (!ok) {
            fprintf(err,
                    "engramd: invalid value for cors_allowed_origins: '%.*s' is not an origin "
                    "(http:// or https://, a host, an optional :port, nothing after; '*' is "
                    "not allowed: list each origin)\n",
                    (int)n, p);
            return -EINVAL;
        }
        p = e;
    }
    return 0;
}

/* The checks that span settings. Returns 0 or -EINVAL (reported on err). */
static int check_settings(const config *cfg, FILE *err)
{
    if (!cfg->pg_dsn[0]) {
        fprintf(err, "engramd: pg_dsn is required (--pg-dsn or ENGRAM_PG_DSN); deploy/run "
                     "provides an embedded PostgreSQL\n");
        return -EINVAL;
    }
    if (log_parse_level(cfg->log_level) < 0) {
        fprintf(err, "engramd: invalid value for log_level: '%s' (debug, info, warn, error)\n",
                cfg->log_level);
        return -EINVAL;
    }
    if (check_origins(cfg->cors_allowed_origins, err) < 0)
        return -EINVAL;
    if (log_parse_format(cfg->log_format) < 0) {
        fprintf(err, "engramd: invalid value for log_format: '%s' (text or json)\n",
                cfg->log_format);
        return -EINVAL;
    }
    double wsum = cfg->score_w_recency + cfg->score_w_access + cfg->score_w_explicit;
    if (wsum < 1 - 1e-9 || wsum > 1 + 1e-9) {
        fprintf(err,
                "engramd: score_w_recency + score_w_access + score_w_explicit must be 1 (they "
                "are %g + %g + %g)\n",
                cfg->score_w_recency, cfg->score_w_access, cfg->score_w_explicit);
        return -EINVAL;
    }
    if (index_engine_parse(cfg->index_engine, strlen(cfg->index_engine)) < 0) {
        fprintf(err, "engramd: invalid value for index_engine: '%s' (native or faiss)\n",
                cfg->index_engine);
        return -EINVAL;
    }
    if (check_factory(cfg, err) < 0)
        return -EINVAL;
    if (cfg->max_result_bytes > cfg->max_output_bytes) {
        fprintf(err,
                "engramd: max_result_bytes (%ld) must not exceed max_output_bytes (%ld): an "
                "answer must fit in its connection's budget\n",
                cfg->max_result_bytes, cfg->max_output_bytes);
        return -EINVAL;
    }
    if (cfg->max_output_total_bytes > 0 && cfg->max_result_bytes > cfg->max_output_total_bytes) {
        fprintf(err,
                "engramd: max_result_bytes (%ld) must not exceed max_output_total_bytes (%ld): "
                "an answer must fit in the process's budget\n",
                cfg->max_result_bytes, cfg->max_output_total_bytes);
        return -EINVAL;
    }
    if (!cfg->tls_cert_file[0] != !cfg->tls_key_file[0]) {
        fprintf(err, "engramd: tls_cert_file and tls_key_file go together: set both for TLS, "
                     "or neither\n");
        return -EINVAL;
    }
    if (cfg->tls_ca_file[0] && !cfg->tls_cert_file[0]) {
        fprintf(err, "engramd: tls_ca_file needs tls_cert_file and tls_key_file (client "
                     "certificates are only asked for over TLS)\n");
        return -EINVAL;
    }
    if (cfg->tls_admin_require_client_cert && !cfg->tls_ca_file[0]) {
        fprintf(err, "engramd: tls_admin_require_client_cert needs tls_ca_file (the CA that "
                     "admin client certificates are verified against)\n");
        return -EINVAL;
    }
    if (cfg->http_port == cfg->rpc_port) {
        fprintf(err, "engramd: http_port and rpc_port must differ (both %d)\n", cfg->rpc_port);
        return -EINVAL;
    }
    return check_llm(cfg, err);
}

int config_load(config *cfg, int argc, char **argv, FILE *out, FILE *err, bool *exit_now)
{
    memset(cfg, 0, sizeof(*cfg));
    *exit_now = false;
    bool check_only = false;
    for (size_t i = 0; i < NDEFS; i++)
        if (set_value(cfg, &defs[i], defs[i].def, "default", err) < 0)
            return -EINVAL;
    /* the config file first: flags and the environment override it */
    const char *path = getenv("ENGRAM_CONFIG");
    int rc = scan_flags(argc, argv, out, err, &path, &check_only);
    if (rc != 0) {
        *exit_now = rc > 0;
        return rc > 0 ? 0 : rc;
    }
    if ((path && *path && load_file(cfg, path, err) < 0) || load_env(cfg, err) < 0 ||
        load_flags(cfg, argc, argv, err) < 0 || check_settings(cfg, err) < 0)
        return -EINVAL;
    if (check_only) {
        config_print(cfg, out);
        *exit_now = true;
    }
    return 0;
}

void config_free(config *cfg)
{
    for (size_t i = 0; i < NDEFS; i++) {
        if (defs[i].type != T_STR)
            continue;
        char **slot = (char **)(void *)((char *)cfg + defs[i].offset);
        free(*slot);
        *slot = NULL;
    }
}

/* Writes the value of setting d in cfg to buf as text: exact for numbers (%.17g), the string
 * itself, or "(redacted)" for a secret when redact is set. */
static void format_value(const config *cfg, const config_def *d, bool redact, char *buf, size_t n)
{
    const char *p = (const char *)cfg + d->offset;
    switch (d->type) {
    case T_INT:
        snprintf(buf, n, "%d", *(const int *)(const void *)p);
        return;
    case T_LONG:
        snprintf(buf, n, "%ld", *(const long *)(const void *)p);
        return;
    case T_DOUBLE:
        snprintf(buf, n, "%.17g", *(const double *)(const void *)p);
        return;
    case T_STR:
        snprintf(buf, n, "%s",
                 redact && (d->flags & F_SECRET) ? "(redacted)" : *(char *const *)(const void *)p);
        return;
    }
    buf[0] = '\0';
}

void config_print(const config *cfg, FILE *out)
{
    for (size_t i = 0; i < NDEFS; i++) {
        const config_def *d = &defs[i];
        const char *p = (const char *)cfg + d->offset;
        fprintf(out, "%s = ", d->name);
        switch (d->type) {
        case T_INT:
            fprintf(out, "%d\n", *(const int *)(const void *)p);
            break;
        case T_LONG:
            fprintf(out, "%ld\n", *(const long *)(const void *)p);
            break;
        case T_DOUBLE:
            fprintf(out, "%g\n", *(const double *)(const void *)p);
            break;
        case T_STR:
            fprintf(out, "%s\n",
                    (d->flags & F_SECRET) ? "(redacted)" : *(char *const *)(const void *)p);
            break;
        }
    }
}

void config_diff(const config *a, const config *b, config_diff_fn fn, void *arg)
{
    for (size_t i = 0; i < NDEFS; i++) {
        char va[1024], vb[1024];
        format_value(a, &defs[i], false, va, sizeof(va));
        format_value(b, &defs[i], false, vb, sizeof(vb));
        if (strcmp(va, vb) == 0)
            continue;
        if (defs[i].flags & F_SECRET)
            fn(defs[i].name, defs[i].flags, "(redacted)", "(redacted)", arg);
        else
            fn(defs[i].name, defs[i].flags, va, vb, arg);
    }
}

/* The range of d as text ("1..65535"), or "" for a string. */
static void format_range(const config_def *d, char *buf, size_t n)
{
    if (d->type == T_INT || d->type == T_LONG)
        snprintf(buf, n, "%.0f..%.0f", d->min, d->max);
    else if (d->type == T_DOUBLE)
        snprintf(buf, n, "%g..%g", d->min, d->max);
    else
        buf[0] = '\0';
}

/* What SIGHUP does to d, in words. */
static const char *reload_words(const config_def *d)
{
    if (d->flags & F_RELOAD)
        return "reloaded on SIGHUP";
    if (d->flags & F_REREAD)
        return "restart (the file is re-read on SIGHUP)";
    return "restart";
}

/* Writes text as comment lines of at most 92 columns, each starting with prefix. */
static void print_wrapped(FILE *out, const char *prefix, const char *text)
{
    const size_t width = 92 - strlen(prefix);
    while (*text) {
        size_t n = strlen(text);
        if (n > width) {
            n = width;
            while (n > 0 && text[n] != ' ')
                n--;
            if (n == 0) /* one word longer than the line: keep it whole */
                n = strcspn(text, " ");
        }
        fprintf(out, "%s%.*s\n", prefix, (int)n, text);
        text += n;
        while (*text == ' ')
            text++;
    }
}

static const char *topic_of(const config_def *d)
{
    for (size_t t = 0; t < sizeof(topics) / sizeof(topics[0]); t++)
        if (strcmp(topics[t].first, d->name) == 0)
            return topics[t].title;
    return NULL;
}

static void print_reference_ini(FILE *out)
{
    fprintf(
        out,
        "# engramd configuration: every setting, commented out at its default.\n"
        "#\n"
        "# Generated by `engramd --print-config` from the settings table (server/core/config.c);\n"
        "# docs/configuration.md is generated from the same table. Uncomment a line to\n"
        "# change a setting. A setting is read, in increasing precedence, from its default,\n"
        "# this file (engramd --config FILE, or ENGRAM_CONFIG), its environment variable and\n"
        "# its command-line flag. `engramd --config FILE --check-config` validates a file\n"
        "# and prints the effective values.\n"
        "#\n"
        "# Settings marked \"reloaded on SIGHUP\" take effect when engramd receives SIGHUP\n"
        "# (systemctl reload engramd); the others need a restart, and a reload that finds\n"
        "# one of them changed logs a warning and keeps the running value.\n"
        "\n"
        "[engramd]\n");
    for (size_t i = 0; i < NDEFS; i++) {
        const config_def *d = &defs[i];
        const char *topic = topic_of(d);
        if (topic)
            fprintf(out, "\n# ==== %s ====\n", topic);
        char flag[64], env[64], range[96], line[512];
        flag_name(d, flag, sizeof(flag));
        env_name(d, env, sizeof(env));
        format_range(d, range, sizeof(range));
        fprintf(out, "\n");
        print_wrapped(out, "# ", d->help);
        snprintf(line, sizeof(line), "%s%s%s%s, %s; %s%s", range[0] ? "range " : "", range,
                 range[0] ? "; " : "", env, flag, reload_words(d),
                 (d->flags & F_SECRET) ? "; secret, never printed" : "");
        fprintf(out, "# %s\n#%s = %s\n", line, d->name, d->def); /* one line: greppable */
    }
}

/* Writes s with the characters Markdown tables treat specially escaped. */
static void md_cell(FILE *out, const char *s)
{
    for (; *s; s++) {
        if (*s == '|' || *s == '*' || *s == '_' || *s == '<' || *s == '>' || *s == '`')
            fputc('\\', out);
        fputc(*s, out);
    }
}

static void print_reference_markdown(FILE *out)
{
    fprintf(
        out,
        "# Configuration\n"
        "\n"
        "<!-- Generated by `engramd --print-config=markdown` from the settings table in\n"
        "     server/core/config.c; tests/integration/test_config_reference.py fails when this "
        "file\n"
        "     differs from what the code generates. Regenerate it with\n"
        "     deploy/gen-config-docs.sh, never edit it by hand. -->\n"
        "\n"
        "Every setting of `engramd` is read, in increasing precedence, from its default, from\n"
        "the configuration file (`engramd --config FILE`, or the `ENGRAM_CONFIG` variable),\n"
        "from its environment variable and from its command-line flag (`--name value` or\n"
        "`--name=value`). Every value is checked against its type and range at start; the\n"
        "first bad one stops `engramd` with a message naming the setting and where it came\n"
        "from.\n"
        "\n"
        "The configuration file is INI: `name = value` lines, `#` or `;` comments, and an\n"
        "optional `[engramd]` (or `[engram]`) section header. "
        "[`deploy/engramd.conf`](../deploy/engramd.conf)\n"
        "is the commented reference of every setting at its default (`engramd\n"
        "--print-config` writes it); `engramd --config FILE --check-config` validates a file\n"
        "and prints the effective values without starting.\n"
        "\n"
        "**Reload.** On SIGHUP (`systemctl reload engramd`) `engramd` reads its configuration\n"
        "again, from the same file, environment and flags. Settings marked *SIGHUP* below take\n"
        "their new values at once: the log level, the maintenance and consolidation intervals\n"
        "and every tier limit (memories, queries, rates, sessions, retention); each change is\n"
        "logged. The TLS certificate, key and CA files are read again (at the same paths).\n"
        "Any other setting needs a restart: a reload that finds one changed logs a warning\n"
        "and keeps the running value. A file with an error changes nothing (the error is\n"
        "logged, and `engram_config_reloads_total{result=\"failed\"}` counts it).\n");
    for (size_t i = 0; i < NDEFS; i++) {
        const config_def *d = &defs[i];
        const char *topic = topic_of(d);
        if (topic)
            fprintf(out,
                    "\n## %s\n\n"
                    "| Setting | Default | Range | Environment / flag | Reload | Description |\n"
                    "|---|---|---|---|---|---|\n",
                    topic);
        char flag[64], env[64], range[96];
        flag_name(d, flag, sizeof(flag));
        env_name(d, env, sizeof(env));
        format_range(d, range, sizeof(range));
        fprintf(out, "| `%s` | %s%s%s | %s | `%s` `%s` | %s | ", d->name, d->def[0] ? "`" : "",
                d->def[0] ? d->def : "(empty)", d->def[0] ? "`" : "", range[0] ? range : "", env,
                flag,
                (d->flags & F_RELOAD)   ? "SIGHUP"
                : (d->flags & F_REREAD) ? "restart (file re-read on SIGHUP)"
                                        : "restart");
        md_cell(out, d->help);
        fprintf(out, "%s |\n", (d->flags & F_SECRET) ? " (secret: never printed)" : "");
    }
}

void config_print_reference(config_ref_format fmt, FILE *out)
{
    if (fmt == CONFIG_REF_MARKDOWN)
        print_reference_markdown(out);
    else
        print_reference_ini(out);
}
