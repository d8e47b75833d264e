/* server/domain/autocompact.h: auto-compact of session transcripts on the server (issue 32,
 * item 5; seed 001).
 *
 * session.append marks a session due (storage/functions/37_compact.sql) when the history a
 * model is given (the live compaction summary and the live messages after it, 4 bytes a
 * token) passes config.compaction.threshold of the context window of the session's model
 * (the setting compact_context_windows). The append is answered after its own commit; the
 * compaction runs here, on a background thread, every compact_check_interval_ms:
 *
 *   1. one job per session at a time, also across engramd processes: a session-level
 *      advisory lock on the job thread's connection (a process that dies drops it, and the
 *      session, still due, is taken up by the next look of any process);
 *   2. tool results among the older messages (all but the config.compaction.keep_recent
 *      newest) longer than config.compaction.tool_result_budget characters are cut to that
 *      many, oldest first, until the history is under the threshold (the full text is kept
 *      in session_entries.original_content);
 *   3. if it is still over, the tenant's chat model (mcall.h) summarizes the older API rounds
 *      (through the last message before a user message, keeping at least keep_recent
 *      messages) into a summary entry (engram_session_summarize); the transcript goes into
 *      the prompt as JSON lines between <transcript> and </transcript>, escaped so that no
 *      text can close the block (prompts_json_str): what it says is data;
 *   4. one transaction writes compact_start, the cuts, the summary and compact_end (whose
 *      data carries tokens_freed), and counts the model's tokens against the tenant's day.
 *
 * Nothing is written before the model has answered: a fault (timeout, 429, 5xx, a dropped
 * connection, an answer that is not JSON or breaks the schema, an empty summary), a crash
 * or a restart in the middle leaves every entry as it was. A fault counts a failure of the
 * session (its reason in session.get's auto_compact.last); config.compaction.max_failures
 * in a row turn auto-compact off for the session. What stops an attempt without being the
 * compaction's failure (no chat model, the tenant's chat_model none, the tier's daily token
 * cap reached, nothing old enough to summarize) is recorded the same way, not counted.
 */
#ifndef ENGRAM_SERVER_AUTOCOMPACT_H
#define ENGRAM_SERVER_AUTOCOMPACT_H

#include <stdint.h>

#include "server.h"

/* autocompact_start registers the periodic look for due sessions on s->bg (every
 * compact_check_interval_ms). Call once at start-up, before other threads use s->bg.
 * Returns 0 or -ENOMEM. */
int autocompact_start(server *s);

/* Counters since start, for /metrics. */
typedef struct autocompact_stats {
    uint64_t done;         /* compactions written */
    uint64_t failed;       /* attempts that failed (counted against their session) */
    uint64_t skipped;      /* attempts that could not be made (not counted) */
    uint64_t turned_off;   /* sessions whose failures turned auto-compact off */
    uint64_t tokens_freed; /* estimated tokens the compactions freed */
} autocompact_stats;

/* autocompact_stats_get copies the counters into *out. Any thread. */
void autocompact_stats_get(autocompact_stats *out);

#endif
