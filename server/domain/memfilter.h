/* server/domain/memfilter.h: the search filters of memory.search, memory.context, memory.list
 * and memory.delete's filter.
 *
 * One parse of the request's filter parameters yields both forms a filter takes: a
 * predicate over the index's per-memory metadata (vector search, exact with respect to the
 * filter) and the parameters of the SQL filter in storage/sql.c (text search, list). The
 * typed metadata fields (tokens, chains, protocols, strategy_id) are matched as tags:
 * 64-bit hashes of "t:<token>", "c:<chain>", "p:<protocol>", "s:<strategy>", the strings
 * PostgreSQL's engram_tags() produces. attrs containment is answered by PostgreSQL.
 */
#ifndef ENGRAM_SERVER_MEMFILTER_H
#define ENGRAM_SERVER_MEMFILTER_H

#include <stdbool.h>
#include <stdint.h>

#include <msgpack.h>

#include "arena.h"
#include "idmap.h"
#include "plimits.h"
#include "rpc.h"
#include "score.h"
#include "tenants.h"

/* The filter parameters every filtered method takes first, in this order. */
enum {
    MF_TYPE_FILTER = 0,
    MF_MIN_IMPORTANCE,
    MF_MIN_COMPOSITE,
    MF_TOKENS,
    MF_CHAINS,
    MF_PROTOCOLS,
    MF_STRATEGY_ID,
    MF_ATTRS,
    MF_CREATED_AFTER,
    MF_CREATED_BEFORE,
    MF_SCOPES,
    MF_AGENT_ID,
    MF_CLADE_ID,
    MF_INCLUDE_ARCHIVED,
    MF__COUNT
};

#define MF_PARAMS                                                                                  \
    {"type_filter", RPC_T_STR_ARRAY, RPC_P_NULLABLE | RPC_P_RANGE, 1, 5},                          \
        {"min_importance", RPC_T_NUM, RPC_P_NULLABLE | RPC_P_RANGE, 0, 1},                         \
        {"min_composite", RPC_T_NUM, RPC_P_NULLABLE | RPC_P_RANGE, 0, 1},                          \
        {"tokens", RPC_T_STR_ARRAY, RPC_P_NULLABLE | RPC_P_RANGE, 1, 64},                          \
        {"chains", RPC_T_UINT_ARRAY, RPC_P_NULLABLE | RPC_P_RANGE, 1, 64},                         \
        {"protocols", RPC_T_STR_ARRAY, RPC_P_NULLABLE | RPC_P_RANGE, 1, 64},                       \
        {"strategy_id", RPC_T_STR, RPC_P_NULLABLE | RPC_P_RANGE, 1, 128},                          \
        {"attrs", RPC_T_MAP, RPC_P_NULLABLE | RPC_P_RANGE | RPC_P_LIMIT(PLIM_METADATA), 1, 64},    \
        {"created_after", RPC_T_INT, RPC_P_NULLABLE, 0, 0},                                        \
        {"created_before", RPC_T_INT, RPC_P_NULLABLE, 0, 0},                                       \
        {"scopes", RPC_T_STR_ARRAY, RPC_P_NULLABLE | RPC_P_RANGE, 1, 3},                           \
        {"agent_id", RPC_T_UINT, RPC_P_NULLABLE, 0, 0},                                            \
        {"clade_id", RPC_T_UINT, RPC_P_NULLABLE, 0, 0},                                            \
    {                                                                                              \
        "include_archived", RPC_T_BOOL, RPC_P_NULLABLE, 0, 0                                       \
    }

typedef struct mem_filter {
    uint8_t type_mask;  /* bit per mem_type */
    uint8_t scope_mask; /* bit per mem_scope */
    bool include_archived;
    bool has_agent;
    uint64_t agent_id;
    bool has_clade;
    uint64_t clade_id;
    int64_t created_after;   /* exclusive; INT64_MIN: none */
    int64_t created_before;  /* exclusive; INT64_MAX: none */
    bool has_min_importance; /* the author's importance, as stored */
    double min_importance;
    bool has_min_composite; /* the composite importance as of now_ms */
    double min_composite;
    uint64_t *tokens, *chains, *protocols; /* sorted tag hashes, any-of within each */
    uint32_t ntokens, nchains, nprotocols;
    bool has_strategy;
    uint64_t strategy;
    char *attrs_json; /* {"attrs": ...} containment document, or NULL */
    idmap *attr_ids;  /* ids PostgreSQL found for attrs (set by the caller), or NULL */
    char *sql_tokens, *sql_chains, *sql_protocols, *sql_strategy, *sql_types, *sql_scopes;
    /* evaluation context */
    int64_t now_ms;
    const score_params *sp;
} mem_filter;

/* mf_parse_args reads the MF__COUNT filter arguments args[0..MF__COUNT) (bound with the
 * schema MF_PARAMS; NULL where absent) into f, allocating in a; the filter evaluates
 * with sp (kept) at now_ms. what prefixes parameter names in messages ("" or "filter.").
 * Returns 0, -EINVAL with the reason in err (an invalid argument) or -ENOMEM. */
int mf_parse_args(arena *a, const score_params *sp, int64_t now_ms,
                  const msgpack_object *const *args, const char *what, mem_filter *f, char *err,
                  size_t errlen);

/* mf_keep tells whether a memory passes f (everything but attrs, which needs
 * f->attr_ids: when set, the memory's id must be in it). Thread-safe. */
bool mf_keep(const mem_filter *f, uint64_t id, const mem_meta *m);

/* mf_lifecycle_only tells whether f passes every memory that is neither archived (unless
 * f includes archived ones) nor expired: no type, scope, agent, time, tag, importance,
 * composite or attrs condition. */
bool mf_lifecycle_only(const mem_filter *f);

/* mf_sql_params fills vals[0..SQL_FILTER_NPARAMS) with the text parameters $2..$17 of the
 * SQL filter (NULL entries are SQL NULL), allocating in a. Returns 0 or -ENOMEM. */
int mf_sql_params(arena *a, const mem_filter *f, const char **vals);

/* mf_tag_hash returns the hash of one tag string ("t:ETH"). */
uint64_t mf_tag_hash(const char *s, size_t n);

/* mf_tags_from_metadata derives the same tags from a request's metadata map. Returns 0 or
 * -ENOMEM; the caller owns *out (free). */
int mf_tags_from_metadata(const msgpack_object *metadata, uint64_t **out, uint32_t *n);

/* mf_tags_from_json derives the same tags from the JSON array [tokens, chains, protocols,
 * strategy_id] (a field null when absent) that index loads read from PostgreSQL. Returns 0,
 * -ENOMEM, or -EINVAL when the text is not such an array; the caller owns *out (free). */
int mf_tags_from_json(const char *s, size_t len, uint64_t **out, uint32_t *n);

/* mf_check_metadata validates a metadata map: only tokens (strings), chains (unsigned
 * integers), protocols (strings), strategy_id (string) and attrs (map); tag strings 1..128
 * bytes without control characters; at most 64 entries per list; in attrs, at most
 * max_entries entries in any one map or list, at any depth (max_metadata_entries; the
 * binder bounds the whole map's bytes: max_metadata_bytes). what prefixes messages
 * ("metadata" or "memories[3].metadata"). Returns 0 or -EINVAL with err. */
int mf_check_metadata(const msgpack_object *md, const char *what, size_t max_entries, char *err,
                      size_t errlen);

#endif
