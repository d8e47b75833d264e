/* server/domain/autocompact.c: auto-compact of session transcripts (autocompact.h). */
#include "autocompact.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <msgpack.h>

#include "bg.h"
#include "chat.h"
#include "log.h"
#include "mcall.h"
#include "memrow.h"
#include "pgsync.h"
#include "prompts.h"
#include "sql_bg.h"
#include "tiers.h"

#define DUE_BATCH 16              /* sessions taken per look */
#define ENTRY_SHOWN_MAX 8000      /* bytes of one entry's text shown to the model */
#define ENTRY_SHOWN_MIN 500       /* ... when many entries share the prompt */
#define PROMPT_MAX (400u * 1024u) /* bytes of transcript in one prompt */
#define CUT_NOTE_BYTES 64         /* about what the truncation note adds (37_compact.sql) */

static _Atomic uint64_t n_done, n_failed, n_skipped, n_off, n_freed;

void autocompact_stats_get(autocompact_stats *out)
{
    out->done = atomic_load(&n_done);
    out->failed = atomic_load(&n_failed);
    out->skipped = atomic_load(&n_skipped);
    out->turned_off = atomic_load(&n_off);
    out->tokens_freed = atomic_load(&n_freed);
}

/* ---- the answer's schema, made once -------------------------------------------------------- */

static pthread_once_t schema_once = PTHREAD_ONCE_INIT;
static llm_schema *schema;
static char schema_err[200];

static void schema_make(void)
{
    size_t len;
    const char *json = prompts_get("compact_schema.json", &len);
    if (!json)
        snprintf(schema_err, sizeof(schema_err), "compact_schema.json is not embedded");
    else if (llm_schema_create(json, len, &schema, schema_err, sizeof(schema_err)) != 0)
        schema = NULL;
}

/* ---- one session's job ----------------------------------------------------------------------- */

typedef struct entry {
    int64_t id;
    bool own;         /* the session's own (not inherited from the session it resumed) */
    bool tool;        /* a tool result */
    bool next_user;   /* the next message is the user's: an API round ends here */
    const char *text; /* in the job's entries result */
    size_t bytes, chars;
    bool cut; /* to be truncated */
} entry;

typedef struct job {
    server *s;
    bg_ctx *ctx;
    PGconn *pg;
    int64_t tenant, session;
    char tid[24], sid[24];
    /* engram_compact_state */
    bool active, due, off, enabled;
    int64_t position, window, keep_recent, budget, live_bytes;
    int tier; /* the tenant's (its transcript limits) */
    double threshold;
    char model[CHAT_MODEL_MAX + 1]; /* the session's model (its window) */
    char *summary;                  /* the summary in place, or NULL */
    /* engram_compact_entries: the live messages after it */
    PGresult *rows;
    entry *e;
    size_t n;
    mcall m;
    char err[300];
} job;

static int64_t tokens_of(int64_t bytes)
{
    return (bytes + 3) / 4;
}

static size_t utf8_chars(const char *s, size_t n)
{
    size_t c = 0;
    for (size_t i = 0; i < n; i++)
        c += ((unsigned char)s[i] & 0xC0) != 0x80;
    return c;
}

/* Bytes of the first chars characters of s (n bytes). */
static size_t utf8_prefix(const char *s, size_t n, size_t chars)
{
    size_t i = 0;
    for (size_t c = 0; i < n; i++) {
        if (((unsigned char)s[i] & 0xC0) != 0x80 && c++ == chars)
            break;
    }
    return i;
}

/* Takes the session's state from row 0 of st and reads its tenant's tier and the live
 * messages (j->rows), inside job_read's transaction. Returns 0, -EIO (err) or -ENOMEM. */
static int read_state(job *j, PGresult *st)
{
    j->active = strcmp(PQgetvalue(st, 0, 0), "active") == 0;
    j->due = PQgetvalue(st, 0, 1)[0] == 't';
    j->off = PQgetvalue(st, 0, 2)[0] == 't';
    j->position = memrow_i64(st, 0, 3, 0);
    snprintf(j->model, sizeof(j->model), "%s", PQgetvalue(st, 0, 4));
    j->window = memrow_i64(st, 0, 5, 200000);
    j->enabled = PQgetvalue(st, 0, 6)[0] == 't';
    j->threshold = strtod(PQgetvalue(st, 0, 7), NULL);
    j->keep_recent = memrow_i64(st, 0, 8, 10);
    j->budget = memrow_i64(st, 0, 9, 50000);
    j->live_bytes = memrow_i64(st, 0, 10, 0);
    if (!PQgetisnull(st, 0, 11) && !(j->summary = strdup(PQgetvalue(st, 0, 11))))
        return -ENOMEM;
    char ta[32], upto[24];
    snprintf(ta, sizeof(ta), "{%s}", j->tid);
    snprintf(upto, sizeof(upto), "%lld", (long long)j->position);
    const char *tv[] = {ta}, *ev[] = {j->tid, j->sid, upto};
    PGresult *tr = PGSYNC_EXEC(j->pg, sqlb_def(SQLB_TENANT_TIERS), tv, j->err, sizeof(j->err));
    if (!tr)
        return -EIO;
    const char *t = PQntuples(tr) == 1 ? PQgetvalue(tr, 0, 1) : "";
    int ti = tier_parse(t, strlen(t));
    j->tier = ti < 0 || ti >= TIER_COUNT ? TIER_FREE : ti;
    PQclear(tr);
    j->rows = PGSYNC_EXEC(j->pg, sqlb_def(SQLB_COMPACT_ENTRIES), ev, j->err, sizeof(j->err));
    return j->rows ? 0 : -EIO;
}

/* Reads the session's state and its live messages after the summary in place, in one
 * snapshot. Returns 0 (j->rows NULL: the session is gone), -EIO (err) or -ENOMEM. */
static int job_read(job *j)
{
    const char *sv[] = {j->tid, j->sid, j->s->cfg.compact_context_windows};
    if (pgsync_tenant_begin(j->pg, j->tenant, PGSYNC_TX_SNAPSHOT, j->err, sizeof(j->err)) < 0)
        return -EIO;
    PGresult *st = PGSYNC_EXEC(j->pg, sqlb_def(SQLB_COMPACT_STATE), sv, j->err, sizeof(j->err));
    int rc = !st ? -EIO : PQntuples(st) == 1 ? read_state(j, st) : 0;
    PQclear(st);
    if (pgsync_tx_end(j->pg, rc == 0, j->err, sizeof(j->err)) < 0 && rc == 0)
        rc = -EIO;
    if (rc == -ENOMEM)
        snprintf(j->err, sizeof(j->err), "out of memory");
    if (rc < 0 || !j->rows)
        return rc;
    int n = PQntuples(j->rows);
    j->e = calloc((size_t)n + 1, sizeof(*j->e));
    if (!j->e) {
        snprintf(j->err, sizeof(j->err), "out of memory");
        return -ENOMEM;
    }
    for (int i = 0; i < n; i++) {
        entry *e = &j->e[i];
        e->id = memrow_i64(j->rows, i, 0, 0);
        e->own = memrow_i64(j->rows, i, 2, 0) == j->session;
        e->tool = strcmp(PQgetvalue(j->rows, i, 3), "tool") == 0;
        e->text = PQgetvalue(j->rows, i, 4);
        e->bytes = (size_t)PQgetlength(j->rows, i, 4);
        e->chars = utf8_chars(e->text, e->bytes);
        if (i > 0)
            j->e[i - 1].next_user = strcmp(PQgetvalue(j->rows, i, 3), "user") == 0;
    }
    j->n = (size_t)n;
    return 0;
}

/* Records an attempt that wrote nothing (and the model's tokens it spent), in a transaction
 * of its own. */
static void job_failed(job *j, const char *status, const char *reason, bool counted,
                       bool exact_bytes)
{
    char bytes[24], err[300];
    snprintf(bytes, sizeof(bytes), "%lld", (long long)j->live_bytes);
    const char *v[] = {
        j->tid, j->sid, status, reason, counted ? "true" : "false", exact_bytes ? bytes : NULL};
    if (pgsync_tenant_begin(j->pg, j->tenant, PGSYNC_TX_WRITE, err, sizeof(err)) < 0) {
        log_warn("auto-compact of session %lld (tenant %lld): %s", (long long)j->session,
                 (long long)j->tenant, err);
        return;
    }
    bool ok = mcall_record(&j->m, j->pg, false, err, sizeof(err)) == 0;
    PGresult *res =
        ok ? PGSYNC_EXEC(j->pg, sqlb_def(SQLB_COMPACT_FAILED), v, err, sizeof(err)) : NULL;
    ok = res != NULL;
    if (pgsync_tx_end(j->pg, ok, err, sizeof(err)) < 0)
        ok = false;
    atomic_fetch_add(counted ? &n_failed : &n_skipped, 1);
    if (ok && counted && strstr(PQgetvalue(res, 0, 0), "\"off\": true"))
        atomic_fetch_add(&n_off, 1);
    if (!ok)
        log_warn("auto-compact of session %lld (tenant %lld): recording '%s': %s",
                 (long long)j->session, (long long)j->tenant, status, err);
    else if (counted)
        log_warn("auto-compact of session %lld (tenant %lld) failed (%s: %s); failures in a "
                 "row %s",
                 (long long)j->session, (long long)j->tenant, status, reason,
                 PQgetvalue(res, 0, 0));
    PQclear(res);
}

/* Marks the tool results to cut, oldest first, among the messages before the keep_recent
 * newest, until the history is under limit tokens. Returns the bytes left. */
static int64_t plan_cuts(job *j, size_t older, double limit, size_t *ncut)
{
    int64_t bytes = j->live_bytes;
    *ncut = 0;
    for (size_t i = 0; i < older && (double)tokens_of(bytes) > limit; i++) {
        entry *e = &j->e[i];
        if (!e->tool || !e->own || e->chars <= (size_t)j->budget)
            continue;
        size_t keep = utf8_prefix(e->text, e->bytes, (size_t)j->budget) + CUT_NOTE_BYTES;
        if (keep >= e->bytes)
            continue;
        e->cut = true;
        bytes -= (int64_t)(e->bytes - keep);
        (*ncut)++;
    }
    return bytes;
}

/* The message a summary compacts through: the last of an API round (the next message is
 * the user's) among the older ones, else the last older one. older > 0. */
static size_t pick_through(const job *j, size_t older)
{
    for (size_t i = older; i-- > 0;)
        if (j->e[i].next_user)
            return i;
    return older - 1;
}

/* The user message asking for a summary of entries [0, through]. Returns 0 or -ENOMEM. */
static int build_prompt(const job *j, size_t through, ubuf *out)
{
    ubuf tr = {0};
    size_t count = through + 1, shown_max = PROMPT_MAX / count;
    int64_t bytes = 0;
    shown_max = shown_max > ENTRY_SHOWN_MAX   ? ENTRY_SHOWN_MAX
                : shown_max < ENTRY_SHOWN_MIN ? ENTRY_SHOWN_MIN
                                              : shown_max;
    int rc = 0;
    for (size_t i = 0; i < count && rc == 0; i++) {
        const entry *e = &j->e[i];
        size_t shown = prompts_utf8_cut(e->text, e->bytes, shown_max);
        bytes += (int64_t)e->bytes;
        rc = ubuf_printf(&tr, "%s{\"id\": %lld, \"role\": \"%s\", \"text\": ", i ? "\n" : "",
                         (long long)e->id, PQgetvalue(j->rows, (int)i, 3));
        rc = rc < 0 ? rc : prompts_json_str(&tr, e->text, shown);
        rc = rc < 0 ? rc : ubuf_puts(&tr, shown < e->bytes ? ", \"cut\": true}" : "}");
    }
    ubuf prev = {0};
    if (rc == 0 && j->summary)
        rc = prompts_json_str(&prev, j->summary, strlen(j->summary));
    else if (rc == 0)
        rc = ubuf_puts(&prev, "(none)");
    if (rc < 0 || ubuf_putc(&tr, '\0') < 0 || ubuf_putc(&prev, '\0') < 0) {
        ubuf_fini(&tr);
        ubuf_fini(&prev);
        return -ENOMEM;
    }
    char cnt[24], tok[24];
    snprintf(cnt, sizeof(cnt), "%zu", count);
    snprintf(tok, sizeof(tok), "%lld", (long long)tokens_of(bytes));
    const char *keys[] = {"session", "count", "tokens", "summary", "transcript"};
    const char *vals[] = {j->sid, cnt, tok, prev.data, tr.data};
    rc = prompts_render("compact_user.txt", keys, vals, 5, out);
    ubuf_fini(&tr);
    ubuf_fini(&prev);
    if (rc == 0 && ubuf_putc(out, '\0') < 0)
        rc = -ENOMEM;
    return rc;
}

/* The summary of a structured answer (a copy, NULL when there is none or it is blank). */
static char *answer_summary(const llm_result *res)
{
    msgpack_unpacked up;
    msgpack_unpacked_init(&up);
    size_t off = 0;
    char *out = NULL;
    if (res->value &&
        msgpack_unpack_next(&up, res->value, res->value_len, &off) == MSGPACK_UNPACK_SUCCESS &&
        up.data.type == MSGPACK_OBJECT_MAP) {
        for (uint32_t i = 0; i < up.data.via.map.size; i++) {
            const msgpack_object *k = &up.data.via.map.ptr[i].key;
            const msgpack_object *v = &up.data.via.map.ptr[i].val;
            if (k->type != MSGPACK_OBJECT_STR || k->via.str.size != 7 ||
                memcmp(k->via.str.ptr, "summary", 7) != 0 || v->type != MSGPACK_OBJECT_STR)
                continue;
            size_t n = v->via.str.size;
            const char *p = v->via.str.ptr;
            bool blank = true;
            for (size_t c = 0; c < n && blank; c++)
                blank = strchr(" \t\r\n", p[c]) != NULL;
            if (!blank && !memchr(p, '\0', n) && (out = malloc(n + 1))) {
                memcpy(out, p, n);
                out[n] = '\0';
            }
        }
    }
    msgpack_unpacked_destroy(&up);
    return out;
}

/* Asks the model for the summary of entries [0, through]. Returns the summary (the
 * caller frees it), or NULL after recording why (job_failed). */
static char *ask_summary(job *j, size_t through)
{
    pthread_once(&schema_once, schema_make);
    if (!schema) {
        job_failed(j, "failed", schema_err, false, true);
        return NULL;
    }
    ubuf prompt = {0};
    if (build_prompt(j, through, &prompt) < 0) {
        ubuf_fini(&prompt);
        job_failed(j, "internal", "out of memory building the prompt", false, true);
        return NULL;
    }
    llm_message msg = {LLM_USER, prompt.data, prompt.len - 1};
    llm_request req = {.system = prompts_get("compact_system.txt", NULL),
                       .messages = &msg,
                       .n_messages = 1,
                       .schema = schema,
                       .schema_name = "transcript_summary",
                       .schema_description = "the summary that replaces the older transcript",
                       .has_temperature = true,
                       .temperature = 0};
    llm_result res = {0};
    int rc = mcall_ask_bg(&j->m, j->ctx, &req, &res);
    ubuf_fini(&prompt);
    char *summary = NULL;
    if (rc == -EAGAIN)
        job_failed(j, j->m.status ? j->m.status : "failed", j->m.reason, false, true);
    else if (rc < 0)
        job_failed(j, "internal", "the request could not be made", false, true);
    else if (res.status == LLM_E_CANCELLED)
        log_info("auto-compact of session %lld (tenant %lld) ended by the shutdown; it stays "
                 "due",
                 (long long)j->session, (long long)j->tenant);
    else if (res.status != LLM_OK)
        job_failed(j, llm_status_name(res.status), res.reason, true, true);
    else if (!(summary = answer_summary(&res)))
        job_failed(j, "malformed", "the answer holds no summary", true, true);
    llm_result_fini(&res);
    return summary;
}

/* Writes the compaction: cuts, the summary through e[through] (summary NULL: none), events.
 * Returns 0, or -EIO with j->err (nothing written). */
static int write_compaction(job *j, const char *summary, size_t through, int64_t *freed)
{
    ubuf ids = {0}, data = {0};
    int rc = ubuf_putc(&ids, '{');
    for (size_t i = 0; i < j->n && rc == 0; i++)
        if (j->e[i].cut)
            rc = ubuf_printf(&ids, "%s%lld", ids.len > 1 ? "," : "", (long long)j->e[i].id);
    rc = rc < 0 ? rc : ubuf_puts(&ids, "}");
    rc = rc < 0 ? rc : ubuf_puts(&data, "{\"model\": ");
    rc = rc < 0 ? rc : prompts_json_str(&data, j->m.model, strlen(j->m.model));
    rc = rc < 0 ? rc : ubuf_puts(&data, ", \"session_model\": ");
    rc = rc < 0 ? rc : prompts_json_str(&data, j->model, strlen(j->model));
    rc = rc < 0
             ? rc
             : ubuf_printf(&data,
                           ", \"context_window\": %lld, \"threshold\": %.17g, "
                           "\"model_calls\": %d, \"model_tokens_in\": %llu, "
                           "\"model_tokens_out\": %llu}",
                           (long long)j->window, j->threshold, j->m.calls,
                           (unsigned long long)j->m.tokens_in, (unsigned long long)j->m.tokens_out);
    if (rc < 0 || ubuf_putc(&ids, '\0') < 0 || ubuf_putc(&data, '\0') < 0) {
        ubuf_fini(&ids);
        ubuf_fini(&data);
        snprintf(j->err, sizeof(j->err), "out of memory");
        return -ENOMEM;
    }
    const tier_limits *tl = &server_tiers(j->s)[j->tier];
    char thr[24], cnt[24], budget[24], me[24], mb[24];
    snprintf(thr, sizeof(thr), "%lld", summary ? (long long)j->e[through].id : 0LL);
    snprintf(cnt, sizeof(cnt), "%zu", through + 1);
    snprintf(budget, sizeof(budget), "%lld", (long long)j->budget);
    snprintf(me, sizeof(me), "%lld", (long long)tl->max_session_entries);
    snprintf(mb, sizeof(mb), "%lld", (long long)tl->max_session_bytes);
    const char *v[] = {
        j->tid, j->sid, summary ? thr : NULL, summary, cnt, ids.data, budget, data.data, me, mb};
    rc = pgsync_tenant_begin(j->pg, j->tenant, PGSYNC_TX_WRITE, j->err, sizeof(j->err));
    bool ok = rc == 0 && mcall_record(&j->m, j->pg, false, j->err, sizeof(j->err)) == 0;
    PGresult *res =
        ok ? PGSYNC_EXEC(j->pg, sqlb_def(SQLB_COMPACT_FINISH), v, j->err, sizeof(j->err)) : NULL;
    ok = res != NULL;
    if (rc == 0 && pgsync_tx_end(j->pg, ok, j->err, sizeof(j->err)) < 0)
        ok = false;
    if (ok) {
        const char *js = PQgetvalue(res, 0, 0), *f = strstr(js, "\"tokens_freed\": ");
        *freed = f ? strtoll(f + 16, NULL, 10) : 0;
    }
    PQclear(res);
    ubuf_fini(&ids);
    ubuf_fini(&data);
    return ok ? 0 : -EIO;
}

/* Compacts the session j names (its advisory lock held). */
static void job_run(job *j)
{
    if (job_read(j) < 0) {
        log_warn("auto-compact of session %lld (tenant %lld): reading it: %s",
                 (long long)j->session, (long long)j->tenant, j->err);
        return;
    }
    if (!j->rows || !j->due || j->off)
        return; /* another process finished it, or it is gone */
    if (!j->active || !j->enabled) {
        job_failed(j, j->active ? "disabled" : "not_active",
                   j->active ? "config.compaction.enabled is false" : "the session is not active",
                   false, true);
        return;
    }
    double limit = j->threshold * (double)j->window;
    if ((double)tokens_of(j->live_bytes) <= limit) {
        job_failed(j, "under_threshold", "the live history is under the threshold", false, true);
        return;
    }
    size_t older = j->n > (size_t)j->keep_recent ? j->n - (size_t)j->keep_recent : 0, ncut;
    int64_t left = plan_cuts(j, older, limit, &ncut);
    char *summary = NULL;
    size_t through = 0;
    if ((double)tokens_of(left) > limit) {
        if (older == 0) {
            job_failed(j, "nothing_to_compact",
                       "every live message is among the config.compaction.keep_recent newest",
                       false, true);
            return;
        }
        if (mcall_open(&j->m, j->s, j->pg, j->tenant, j->err, sizeof(j->err)) < 0) {
            log_warn("auto-compact of session %lld (tenant %lld): the model state: %s",
                     (long long)j->session, (long long)j->tenant, j->err);
            return;
        }
        if (j->m.status) {
            job_failed(j, j->m.status, j->m.reason, false, true);
            return;
        }
        through = pick_through(j, older);
        if (!(summary = ask_summary(j, through)))
            return;
        size_t replaced = j->summary ? strlen(j->summary) : 0, len = strlen(summary);
        for (size_t i = 0; i <= through; i++)
            replaced += j->e[i].bytes;
        if (len >= replaced) {
            char why[160];
            snprintf(why, sizeof(why),
                     "the summary (%zu bytes) is not shorter than what it would replace (%zu "
                     "bytes)",
                     len, replaced);
            job_failed(j, "no_gain", why, true, true);
            free(summary);
            return;
        }
    }
    int64_t freed = 0;
    mcall unrecorded = j->m; /* the tokens to record again if the write rolls back */
    if (write_compaction(j, summary, through, &freed) < 0) {
        j->m = unrecorded;
        if (PQstatus(j->pg) == CONNECTION_OK)
            job_failed(j, "write_failed", j->err, true, false);
        else
            log_warn("auto-compact of session %lld (tenant %lld): %s", (long long)j->session,
                     (long long)j->tenant, j->err);
    } else {
        atomic_fetch_add(&n_done, 1);
        atomic_fetch_add(&n_freed, freed > 0 ? (uint64_t)freed : 0);
        log_info("session %lld (tenant %lld) auto-compacted: %zu tool results cut, %s, about "
                 "%lld tokens freed",
                 (long long)j->session, (long long)j->tenant, ncut,
                 summary ? "older rounds summarized" : "no summary needed", (long long)freed);
    }
    free(summary);
}

/* Takes the session's lock and compacts it; returns false when the connection broke. */
static bool compact_one(server *s, bg_ctx *ctx, PGconn *pg, int64_t tenant, int64_t session)
{
    job j = {.s = s, .ctx = ctx, .pg = pg, .tenant = tenant, .session = session};
    snprintf(j.tid, sizeof(j.tid), "%lld", (long long)tenant);
    snprintf(j.sid, sizeof(j.sid), "%lld", (long long)session);
    const char *v[] = {j.tid, j.sid};
    PGresult *res = PGSYNC_EXEC(pg, sqlb_def(SQLB_COMPACT_LOCK), v, j.err, sizeof(j.err));
    bool locked = res && PQgetvalue(res, 0, 0)[0] == 't';
    PQclear(res);
    if (!locked)
        return res != NULL || PQstatus(pg) == CONNECTION_OK;
    job_run(&j);
    res = PGSYNC_EXEC(pg, sqlb_def(SQLB_COMPACT_UNLOCK), v, j.err, sizeof(j.err));
    PQclear(res);
    PQclear(j.rows);
    free(j.e);
    free(j.summary);
    return PQstatus(pg) == CONNECTION_OK;
}

/* Every compact_check_interval_ms: the sessions due, one after another. */
static void look(bg_ctx *ctx, void *arg)
{
    server *s = arg;
    char err[300];
    PGconn *pg = bg_conn(ctx, err, sizeof(err));
    if (!pg)
        return;
    char lim[16];
    snprintf(lim, sizeof(lim), "%d", DUE_BATCH);
    const char *v[] = {lim};
    PGresult *res = PGSYNC_EXEC(pg, sqlb_def(SQLB_COMPACT_DUE), v, err, sizeof(err));
    if (!res) {
        log_warn("auto-compact: %s", err);
        if (PQstatus(pg) != CONNECTION_OK)
            bg_conn_failed(ctx);
        return;
    }
    int n = PQntuples(res);
    int64_t ids[2 * DUE_BATCH];
    for (int i = 0; i < n && i < DUE_BATCH; i++) {
        ids[2 * i] = memrow_i64(res, i, 0, 0);
        ids[2 * i + 1] = memrow_i64(res, i, 1, 0);
    }
    PQclear(res);
    for (int i = 0; i < n && i < DUE_BATCH && !bg_cancelled(ctx); i++) {
        if (!compact_one(s, ctx, pg, ids[2 * i], ids[2 * i + 1])) {
            bg_conn_failed(ctx);
            return;
        }
    }
}

int autocompact_start(server *s)
{
    return bg_every(s->bg, (unsigned)s->cfg.compact_check_interval_ms, look, s);
}
