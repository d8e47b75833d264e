/* server/domain/consolidate_int.h: what consolidate.c (the run, its text rules, its
 * scheduler) and consolidate_model.c (the chat model's judgment of candidate groups) share:
 * a run's state and the array literals both pass to PostgreSQL. Internal to the module. */
#ifndef ENGRAM_SERVER_CONSOLIDATE_INT_H
#define ENGRAM_SERVER_CONSOLIDATE_INT_H

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <libpq-fe.h>

#include "consolidate.h"
#include "textrule.h"
#include "bg.h"
#include "chat.h"
#include "ubuf.h"

/* Memories changed per transaction (a merge counts its survivor and every member; a group is
 * never split): the tenant's writes wait at most one step, which must stay well under
 * write_lock_wait_ms (2 s) even on a loaded machine. 200 decisions of merge groups of 20
 * changed 4,000 memories in one transaction, and stores racing a run under ThreadSanitizer
 * waited past write_lock_wait_ms and were refused. */
#define CONSOLIDATE_STEP 200

/* Elements of a metadata list (tokens, chains, protocols) kept for the merge guard. */
#define META_LIST 8

/* The metadata a text rule must not contradict: attrs and strategy_id (hashes, 0 when
 * absent) and the first elements of tokens, chains and protocols (hashes). */
typedef struct cmeta {
    uint64_t attrs, strategy;
    uint32_t list[3][META_LIST];
    uint8_t nlist[3];
} cmeta;

/* Why a memory is superseded. */
enum { RULE_NONE, RULE_KEY, RULE_VALUES };

/* What the plan needs of one live memory. */
typedef struct cmem {
    int64_t id;
    int64_t seq;
    int type, scope;
    uint64_t owner; /* agent id (agent scope), clade id (clade scope), 0 (tenant scope) */
    double importance;
    int64_t access;
    int64_t created_ms;
    uint32_t cited, injected; /* its own provenance feedback (prune's usefulness term) */
    bool pinned;
    char *attrs_key;
    textrule_sig sig; /* its text, for the text rules (textrule.h) */
    cmeta meta;
    /* the plan */
    uint32_t parent;     /* union-find */
    int fate;            /* 0 live, 1 merged away, 2 superseded, 3 pruned */
    uint32_t into;       /* merged into / superseded by (an index) */
    int rule;            /* superseded: RULE_KEY or RULE_VALUES */
    const char *why_key; /* superseded by RULE_KEY: the attrs.key (a member's, not owned) */
    uint32_t late;       /* survivor: its newest member (the cluster's age for supersessions) */
    float cos;           /* merged away: cosine similarity to its survivor */
} cmem;

typedef struct loaded {
    cmem *m;
    float *vecs;
    size_t n, cap, dim;
} loaded;

/* True when a should survive over b: higher importance, more accessed, newer, lower id. */
static inline bool better(const cmem *a, const cmem *b)
{
    if (a->importance != b->importance)
        return a->importance > b->importance;
    if (a->access != b->access)
        return a->access > b->access;
    if (a->created_ms != b->created_ms)
        return a->created_ms > b->created_ms;
    return a->id < b->id;
}

/* True when a is newer than b (supersedes it). */
static inline bool newer(const cmem *a, const cmem *b)
{
    if (a->created_ms != b->created_ms)
        return a->created_ms > b->created_ms;
    return a->id > b->id;
}

/* A growing text literal of a PostgreSQL array. */
typedef struct lit {
    ubuf b;
    size_t n;
} lit;

static inline int lit_i64(lit *l, int64_t v)
{
    char num[32];
    int k = snprintf(num, sizeof(num), "%s%lld", l->n++ ? "," : "{", (long long)v);
    return ubuf_append(&l->b, num, (size_t)k);
}

static inline int lit_f64(lit *l, double v)
{
    char num[40];
    int k = snprintf(num, sizeof(num), "%s%.17g", l->n++ ? "," : "{", v);
    return ubuf_append(&l->b, num, (size_t)k);
}

/* An element that is itself a quoted bigint[] literal ("{1,2}"). */
static inline int lit_arr(lit *l, const int64_t *v, size_t n)
{
    if (ubuf_append(&l->b, l->n++ ? ",\"{" : "{\"{", 3) < 0)
        return -ENOMEM;
    for (size_t i = 0; i < n; i++) {
        char num[24];
        int k = snprintf(num, sizeof(num), "%s%lld", i ? "," : "", (long long)v[i]);
        if (ubuf_append(&l->b, num, (size_t)k) < 0)
            return -ENOMEM;
    }
    return ubuf_append(&l->b, "}\"", 2);
}

/* An element that is a quoted string: '"' and '\\' escaped, as PostgreSQL's array input
 * reads them. */
static inline int lit_str(lit *l, const char *v)
{
    if (ubuf_append(&l->b, l->n++ ? ",\"" : "{\"", 2) < 0)
        return -ENOMEM;
    for (; *v; v++) {
        if ((*v == '"' || *v == '\\') && ubuf_putc(&l->b, '\\') < 0)
            return -ENOMEM;
        if (ubuf_putc(&l->b, *v) < 0)
            return -ENOMEM;
    }
    return ubuf_putc(&l->b, '"');
}

static inline const char *lit_end(lit *l)
{
    if (l->n == 0)
        ubuf_append(&l->b, "{", 1);
    ubuf_append(&l->b, "}", 1);
    return l->b.data;
}

/* An element that is SQL NULL. */
static inline int lit_null(lit *l)
{
    return ubuf_append(&l->b, l->n++ ? ",NULL" : "{NULL", 5);
}

static inline void set_err(consolidate_result *out, const char *fmt, const char *a)
{
    out->status = -1;
    snprintf(out->error, sizeof(out->error), fmt, a);
}

/* A pair of memories of one group (type, visibility) at consolidate_model_floor or above
 * that no text rule relates: what the model may be asked about. Indexes into the run's
 * memories. */
typedef struct mpair {
    uint32_t a, b;
    float sim;
} mpair;

/* One decision of the model that changes memories, as planned: 'same' (other merges into
 * keep, text: the merged text or NULL), 'newer' (other is superseded by keep, text: keep's
 * text with absolute dates or NULL), 'contradiction' (both flagged). Indexes into the run's
 * memories; text and why are owned. */
enum { MDEC_SAME = 0, MDEC_NEWER, MDEC_DISTINCT, MDEC_CONTRADICTION, MDEC__COUNT };
typedef struct mdec {
    int kind;
    uint32_t keep, other;
    char *text;
    char *why;
} mdec;

/* The chat model's part of a run (consolidate_model.c). */
typedef struct model_run {
    bool wanted;  /* a provider is configured and groups may be sent: pairs are collected */
    float floor;  /* consolidate_model_floor */
    mpair *pairs; /* candidate pairs, from step_pairs */
    size_t npairs, cpairs;
    mdec *dec; /* planned decisions that change memories */
    size_t ndec, cdec;
    char model[CHAT_MODEL_MAX + 1];
    const char *status; /* see consolidate_model.c; NULL: not configured (settings.model null) */
    char reason[300];
    int64_t cap, tokens_today;
    int groups, judged, rejected, unasked, calls;
    int remembered;               /* candidate pairs skipped: judged before, both texts unchanged */
    int newly_judged;             /* pairs remembered by this run */
    int by_relation[MDEC__COUNT]; /* decisions the model made, valid groups only */
    int applied[5];               /* merged, superseded, flagged, rewritten, skipped */
    uint64_t tokens_in, tokens_out;
    double cost_usd;
    ubuf errors; /* JSON objects, comma-separated: the groups whose answer changed nothing */
    int nerrors;
    ubuf log; /* JSON objects, comma-separated: the first decisions, with their reasons */
    int nlog;
} model_run;

/* A supersession candidate: an older memory, a newer one of its group about the same
 * thing, and the rule that says so. */
typedef struct cand {
    uint32_t a, b;
    int rule;
} cand;

/* What a run planned by rule, for its record (settings.rules). */
typedef struct rule_counts {
    int same_text;    /* memories merged into a survivor of the same text */
    int attrs_key;    /* superseded: a newer memory with the same attrs.key */
    int values;       /* superseded: a newer text that differs only in quantities */
    int near_kept;    /* pairs at the dedupe threshold left alone: other texts */
    int similar_kept; /* fact and preference pairs at the supersede threshold left alone */
} rule_counts;

/* One run's state, from the read to the record. Every array is owned here and freed by
 * run_fini. Each step below returns 0, or a negative errno (-ENOMEM, -EIO otherwise) with
 * out->error set. */
typedef struct run {
    server *s;
    bg_ctx *ctx;
    const config *cfg;
    PGconn *pg;
    int64_t tenant;
    const char *trigger;
    char tid[24];
    int64_t started; /* wall clock, ms: the "now" of every decision */
    uint64_t seq;    /* the tenant's change number the read saw */
    loaded l;        /* the live memories and their vectors */
    cand *cands;     /* supersession candidates */
    size_t ncand, ccand;
    double *imp;      /* survivors' merged importance (a pruned memory: its composite) */
    int64_t *acc;     /* survivors' merged access counts */
    int64_t *members; /* each survivor's merged members, by a counting sort ... */
    int64_t *mseqs;   /* ... with their change numbers ... */
    float *mcos;      /* ... and their cosine similarity to the survivor */
    size_t *first;    /* first[i] ends survivor i's run of members */
    rule_counts rules;
    model_run model; /* the chat model's part (consolidate_model.c) */
    consolidate_result *out;
} run;

/* consolidate_model_pair offers a candidate pair to the model's part (called by step_pairs
 * for pairs at the floor that no rule relates). Returns 0 or -ENOMEM. */
int consolidate_model_pair(run *r, uint32_t a, uint32_t b, float sim);

/* consolidate_model_plan asks the model about the candidate groups (after the text rules'
 * plan, on memories no rule changes) and plans its decisions. A model that cannot be asked
 * or whose answers fail changes nothing and says why in r->model; only a database failure
 * fails the run. Returns 0 or -EIO / -ENOMEM with r->out->error set. */
int consolidate_model_plan(run *r, bg_ctx *ctx);

/* consolidate_model_apply applies the planned decisions in steps (after the rules' steps).
 * Returns 0 or -EIO with r->out->error set. */
int consolidate_model_apply(run *r);

/* consolidate_model_record appends the model's part of the run record to settings: a JSON
 * member ', "model": {...}' (null when no provider is configured). Returns 0 or -ENOMEM. */
int consolidate_model_record(const run *r, ubuf *settings);

/* consolidate_model_fini frees what r->model holds. */
void consolidate_model_fini(run *r);

#endif
