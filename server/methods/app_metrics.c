/* server/methods/app_metrics.c: the index and row cache metrics of /metrics (see app.h). */
#include "app.h"

#include <stdio.h>

#include <event2/buffer.h>

#include "autocompact.h"
#include "chat.h"
#include "llm.h"
#include "metrics.h"
#include "reembed.h"
#include "rowcache.h"
#include "tenants.h"

/* The loaded indexes' gauges. */
static void render_index_gauges(const server *s, const tenants_metrics *tm, struct evbuffer *b)
{
    const metrics_gauge g[] = {
        {"engram_indexes_loaded", "Tenant indexes loaded in memory.", (double)tm->loaded},
        {"engram_index_vectors", "Vectors in the loaded indexes.", (double)tm->vectors},
        {"engram_index_bytes",
         "Memory the loaded indexes hold, in bytes: their heap plus the float rows mapped from "
         "their snapshots that were in RAM when last measured.",
         (double)tm->bytes},
        {"engram_index_budget_bytes",
         "The indexes' memory budget in bytes (index_memory_mb): past it the least recently "
         "used are unloaded.",
         (double)tm->budget},
        {"engram_index_tenants_known", "Tenants the index registry holds (loaded or not).",
         (double)tm->known},
        {"engram_indexes_flat", "Loaded indexes searched exactly over full vectors.",
         (double)tm->by_kind[0]},
        {"engram_indexes_sq8", "Loaded indexes searched over 8-bit codes with an exact re-rank.",
         (double)tm->by_kind[1]},
        {"engram_indexes_ann", "Loaded approximate (graph) indexes.", (double)tm->by_kind[2]},
        {"engram_index_rows_mapped_bytes",
         "Bytes of float rows the loaded indexes map from their snapshot files.",
         (double)tm->rows_mapped},
        {"engram_index_rows_resident_bytes",
         "Bytes of those mapped rows in RAM when the housekeeping last measured them.",
         (double)tm->rows_resident},
        {"engram_index_page_ins",
         "Page-ins of searches reading mapped rows, over the loaded indexes (falls when an "
         "index is unloaded).",
         (double)tm->page_ins},
        {"engram_index_rows_read",
         "Float rows searches read, heap or mapped (exact re-ranks and near-ties), over the "
         "loaded indexes (falls when an index is unloaded).",
         (double)tm->rows_read},
        {"engram_index_tie_reads",
         "Of engram_index_rows_read, the rows read to order near-ties at the k-th place of "
         "searches ranked from int8 codes (index_tie_margin), over the loaded indexes.",
         (double)tm->tie_reads},
        {"engram_index_searches",
         "Index searches answered by the loaded indexes (falls when an index is unloaded): "
         "the denominator of rows read per search.",
         (double)tm->searches},
        {"engram_index_recall_target",
         "The recall@10 the recall monitor keeps approximate indexes at "
         "(index_recall_target).",
         s->cfg.index_recall_target},
    };
    metrics_render_gauges(b, g, sizeof(g) / sizeof(g[0]));
}

/* Index loads, snapshots, evictions, rebuilds and the row cache. */
static void render_index_counters(const server *s, const tenants_metrics *tm, struct evbuffer *b)
{
    uint64_t rc_entries, rc_bytes, rc_hits, rc_misses;
    rc_stats(s->rows, &rc_entries, &rc_bytes, &rc_hits, &rc_misses);
    evbuffer_add_printf(
        b,
        "# HELP engram_index_loads_total Index loads by source: a snapshot plus the changes "
        "after it, or every memory in the database.\n"
        "# TYPE engram_index_loads_total counter\n"
        "engram_index_loads_total{source=\"snapshot\"} %llu\n"
        "engram_index_loads_total{source=\"database\"} %llu\n"
        "# HELP engram_index_snapshots_rejected_total Snapshots found unusable (corrupt, "
        "stale or older than the change log) and rebuilt from the database.\n"
        "# TYPE engram_index_snapshots_rejected_total counter\n"
        "engram_index_snapshots_rejected_total %llu\n"
        "# HELP engram_index_snapshots_written_total Index snapshots written.\n"
        "# TYPE engram_index_snapshots_written_total counter\n"
        "engram_index_snapshots_written_total %llu\n"
        "# HELP engram_index_evictions_total Indexes unloaded to stay within the memory "
        "budget.\n# TYPE engram_index_evictions_total counter\n"
        "engram_index_evictions_total %llu\n"
        "# HELP engram_index_rebuilds_total Background index rebuilds (deleted vectors "
        "dropped, structure changed).\n# TYPE engram_index_rebuilds_total counter\n"
        "engram_index_rebuilds_total %llu\n"
        "# HELP engram_index_tenants_retired_total Tenants never loaded (stored to, looked up) "
        "taken out of the index registry after a spell unused.\n"
        "# TYPE engram_index_tenants_retired_total counter\n"
        "engram_index_tenants_retired_total %llu\n"
        "# HELP engram_index_change_floors Change floors kept for tenants out of the index "
        "registry, for reads on a standby (pg_read_dsn only).\n"
        "# TYPE engram_index_change_floors gauge\nengram_index_change_floors %llu\n"
        "# HELP engram_row_cache_entries Memory rows cached for search results.\n"
        "# TYPE engram_row_cache_entries gauge\nengram_row_cache_entries %llu\n"
        "# HELP engram_row_cache_bytes Bytes of cached memory rows.\n"
        "# TYPE engram_row_cache_bytes gauge\nengram_row_cache_bytes %llu\n"
        "# HELP engram_row_cache_lookups_total Row cache lookups by result.\n"
        "# TYPE engram_row_cache_lookups_total counter\n"
        "engram_row_cache_lookups_total{result=\"hit\"} %llu\n"
        "engram_row_cache_lookups_total{result=\"miss\"} %llu\n"
        "# HELP engram_row_cache_prewarmed_rows_total Rows read into the row cache after index "
        "loads (row_cache_prewarm_percent).\n"
        "# TYPE engram_row_cache_prewarmed_rows_total counter\n"
        "engram_row_cache_prewarmed_rows_total %llu\n"
        "# HELP engram_index_rows_dropped_bytes_total Bytes of mapped float rows dropped from "
        "RAM to hold approximate indexes to index_rows_ram_percent.\n"
        "# TYPE engram_index_rows_dropped_bytes_total counter\n"
        "engram_index_rows_dropped_bytes_total %llu\n",
        (unsigned long long)tm->snapshot_loads, (unsigned long long)tm->database_loads,
        (unsigned long long)tm->snapshots_rejected, (unsigned long long)tm->snapshots_written,
        (unsigned long long)tm->evictions, (unsigned long long)tm->rebuilds,
        (unsigned long long)tm->retired, (unsigned long long)tm->floors,
        (unsigned long long)rc_entries, (unsigned long long)rc_bytes, (unsigned long long)rc_hits,
        (unsigned long long)rc_misses, (unsigned long long)tm->rows_warmed,
        (unsigned long long)tm->rows_dropped);
}

/* The recall monitor's estimates and work. */
static void render_recall(const tenants_metrics *tm, struct evbuffer *b)
{
    evbuffer_add_printf(
        b, "# HELP engram_index_recall_estimate Recall@10 of searches as the recall monitor "
           "measures it, over the loaded indexes of a kind (exact kinds are 1): the lowest and "
           "the mean.\n# TYPE engram_index_recall_estimate gauge\n"
           "engram_index_recall_estimate{kind=\"flat\",stat=\"min\"} 1\n"
           "engram_index_recall_estimate{kind=\"sq8\",stat=\"min\"} 1\n");
    if (tm->recall_measured)
        evbuffer_add_printf(b,
                            "engram_index_recall_estimate{kind=\"ann\",stat=\"min\"} %.4f\n"
                            "engram_index_recall_estimate{kind=\"ann\",stat=\"mean\"} %.4f\n",
                            tm->recall_min, tm->recall_sum / (double)tm->recall_measured);
    evbuffer_add_printf(
        b,
        "# HELP engram_index_recall_measured Approximate indexes with a recall estimate.\n"
        "# TYPE engram_index_recall_measured gauge\nengram_index_recall_measured %llu\n"
        "# HELP engram_index_exact_fallbacks Approximate indexes searching exactly because no "
        "candidate depth reached the recall target.\n"
        "# TYPE engram_index_exact_fallbacks gauge\nengram_index_exact_fallbacks %llu\n"
        "# HELP engram_index_recall_probes_total Probe queries the recall monitor ran.\n"
        "# TYPE engram_index_recall_probes_total counter\nengram_index_recall_probes_total %llu\n"
        "# HELP engram_index_recall_probe_seconds_total Time the recall monitor spent.\n"
        "# TYPE engram_index_recall_probe_seconds_total counter\n"
        "engram_index_recall_probe_seconds_total %.6f\n"
        "# HELP engram_index_recall_steady_skips_total Rounds in which the recall monitor "
        "passed over an index whose samples were all taken on its vectors as they are (probed "
        "once a minute only).\n"
        "# TYPE engram_index_recall_steady_skips_total counter\n"
        "engram_index_recall_steady_skips_total %llu\n",
        (unsigned long long)tm->recall_measured, (unsigned long long)tm->exact_fallbacks,
        (unsigned long long)tm->recall_probes, (double)tm->recall_probe_ns / 1e9,
        (unsigned long long)tm->recall_steady_skips);
}

/* Re-embedding (reembed.h): this process's side vectors, failed batches and swaps. */
static void render_reembed(struct evbuffer *b)
{
    reembed_metrics m;
    reembed_get_metrics(&m);
    evbuffer_add_printf(
        b,
        "# HELP engram_reembed_vectors_total Vectors of a tenant's new embedding model written "
        "by re-embedding jobs (admin.tenant.update embedding).\n"
        "# TYPE engram_reembed_vectors_total counter\nengram_reembed_vectors_total %llu\n"
        "# HELP engram_reembed_failures_total Re-embedding batches the embedding provider "
        "failed (each pauses the job: reembed_retry_min_ms).\n"
        "# TYPE engram_reembed_failures_total counter\nengram_reembed_failures_total %llu\n"
        "# HELP engram_reembed_swaps_total Re-embeddings completed (tenants moved to their new "
        "model) by this process.\n"
        "# TYPE engram_reembed_swaps_total counter\nengram_reembed_swaps_total %llu\n",
        (unsigned long long)m.vectors, (unsigned long long)m.failures, (unsigned long long)m.swaps);
}

/* The chat model's calls, tokens and cost (process totals), and consolidation's fallbacks. */
static void render_model(struct evbuffer *b)
{
    chat_stats cs;
    chat_stats_get(&cs);
    evbuffer_add_printf(b, "# HELP engram_model_calls_total Chat model calls (consolidation) by "
                           "result.\n# TYPE engram_model_calls_total counter\n");
    for (int k = 0; k < LLM_STATUS_COUNT; k++)
        evbuffer_add_printf(b, "engram_model_calls_total{result=\"%s\"} %llu\n", llm_status_name(k),
                            (unsigned long long)cs.llm.by_status[k]);
    evbuffer_add_printf(
        b,
        "# HELP engram_model_requests_total HTTP requests to the chat model, retries included.\n"
        "# TYPE engram_model_requests_total counter\nengram_model_requests_total %llu\n"
        "# HELP engram_model_tokens_total Chat model tokens as the provider counted them (per "
        "tenant: tenant.usage).\n# TYPE engram_model_tokens_total counter\n"
        "engram_model_tokens_total{direction=\"in\"} %llu\n"
        "engram_model_tokens_total{direction=\"out\"} %llu\n"
        "# HELP engram_model_cost_usd_total Chat model cost at llm_price_*_per_mtok.\n"
        "# TYPE engram_model_cost_usd_total counter\nengram_model_cost_usd_total %.6f\n"
        "# HELP engram_model_in_flight Chat model requests holding a slot, and waiting for one.\n"
        "# TYPE engram_model_in_flight gauge\nengram_model_in_flight{state=\"running\"} %llu\n"
        "engram_model_in_flight{state=\"waiting\"} %llu\n"
        "# HELP engram_consolidation_model_fallbacks_total Consolidation runs (or their later "
        "groups) done without the model: the tenant's daily token cap, or the provider "
        "failing.\n# TYPE engram_consolidation_model_fallbacks_total counter\n"
        "engram_consolidation_model_fallbacks_total{reason=\"cap\"} %llu\n"
        "engram_consolidation_model_fallbacks_total{reason=\"unavailable\"} %llu\n",
        (unsigned long long)cs.llm.attempts, (unsigned long long)cs.llm.tokens_in,
        (unsigned long long)cs.llm.tokens_out, cs.llm.cost_usd,
        (unsigned long long)cs.llm.in_flight, (unsigned long long)cs.llm.waiting,
        (unsigned long long)cs.fallbacks[CHAT_FB_CAP],
        (unsigned long long)cs.fallbacks[CHAT_FB_UNAVAILABLE]);
    autocompact_stats as;
    autocompact_stats_get(&as);
    evbuffer_add_printf(
        b,
        "# HELP engram_autocompact_total Auto-compact attempts by result: done (written), "
        "failed (counted against the session), skipped (could not be made: no model, the "
        "tenant's token cap, nothing to summarize, under the threshold).\n"
        "# TYPE engram_autocompact_total counter\n"
        "engram_autocompact_total{result=\"done\"} %llu\n"
        "engram_autocompact_total{result=\"failed\"} %llu\n"
        "engram_autocompact_total{result=\"skipped\"} %llu\n"
        "# HELP engram_autocompact_sessions_off_total Sessions whose failures in a row turned "
        "auto-compact off.\n# TYPE engram_autocompact_sessions_off_total counter\n"
        "engram_autocompact_sessions_off_total %llu\n"
        "# HELP engram_autocompact_tokens_freed_total Tokens (estimated, 4 bytes each) the "
        "compactions freed.\n# TYPE engram_autocompact_tokens_freed_total counter\n"
        "engram_autocompact_tokens_freed_total %llu\n",
        (unsigned long long)as.done, (unsigned long long)as.failed, (unsigned long long)as.skipped,
        (unsigned long long)as.turned_off, (unsigned long long)as.tokens_freed);
}

/* How long index loads took, by source (a histogram). */
static void render_load_histogram(const tenants_metrics *tm, struct evbuffer *b)
{
    static const char *const sources[2] = {"snapshot", "database"};
    evbuffer_add_printf(b, "# HELP engram_index_load_duration_seconds Time from a tenant's first "
                           "use (or the start-up preload) to its index being ready, by source.\n"
                           "# TYPE engram_index_load_duration_seconds histogram\n");
    for (int src = 0; src < 2; src++) {
        uint64_t cum = 0;
        for (size_t i = 0; i < TENANTS_LOAD_BUCKETS; i++) {
            cum += tm->load_hist[src][i];
            if (i < TENANTS_LOAD_BUCKETS - 1)
                evbuffer_add_printf(
                    b, "engram_index_load_duration_seconds_bucket{source=\"%s\",le=\"%g\"} %llu\n",
                    sources[src], tenants_load_bounds_s[i], (unsigned long long)cum);
            else
                evbuffer_add_printf(
                    b,
                    "engram_index_load_duration_seconds_bucket{source=\"%s\",le=\"+Inf\"} %llu\n",
                    sources[src], (unsigned long long)cum);
        }
        evbuffer_add_printf(b,
                            "engram_index_load_duration_seconds_sum{source=\"%s\"} %.6f\n"
                            "engram_index_load_duration_seconds_count{source=\"%s\"} %llu\n",
                            sources[src], (double)tm->load_us[src] / 1e6, sources[src],
                            (unsigned long long)cum);
    }
}

void app_metrics(server *s, struct evbuffer *b)
{
    tenants_metrics tm = {0};
    if (s->tenants)
        tenants_stats(s->tenants, &tm);
    render_index_gauges(s, &tm, b);
    render_index_counters(s, &tm, b);
    render_recall(&tm, b);
    render_model(b);
    render_reembed(b);
    render_load_histogram(&tm, b);
}
