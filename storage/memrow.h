/* storage/memrow.h: memory records as PostgreSQL returns them, and their parsers.
 *
 * Names of memory types and scopes live here too: the database stores the names, the
 * server works with the enum values.
 */
#ifndef ENGRAM_STORAGE_MEMROW_H
#define ENGRAM_STORAGE_MEMROW_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <libpq-fe.h>

#include "rowerr.h"

typedef enum mem_type {
    MEM_FACT = 0,
    MEM_PREFERENCE,
    MEM_EPISODE,
    MEM_STRATEGY_OUTCOME,
    MEM_CONSTRAINT,
    MEM_TYPE_COUNT
} mem_type;

typedef enum mem_scope { SCOPE_AGENT = 0, SCOPE_CLADE, SCOPE_TENANT, SCOPE_COUNT } mem_scope;

/* memrow_type_name / memrow_scope_name return the stored name of a value. */
const char *memrow_type_name(mem_type t);
const char *memrow_scope_name(mem_scope s);

/* memrow_type_parse / memrow_scope_parse map a name (n bytes) to its value; -1 if unknown. */
int memrow_type_parse(const char *s, size_t n);
int memrow_scope_parse(const char *s, size_t n);

#define MEMROW_NO_TIME INT64_MIN

/* One memory row. String pointers reference the PGresult it was parsed from. */
typedef struct memrow {
    uint64_t id;
    uint64_t agent_id;
    uint64_t clade_id;
    mem_scope scope;
    mem_type type;
    const char *content;
    size_t content_len;
    double importance;
    const char *metadata_json; /* jsonb as text */
    size_t metadata_len;
    int64_t created_ms;
    int64_t updated_ms;
    int64_t last_accessed_ms; /* MEMROW_NO_TIME when never accessed */
    int64_t access_count;
    int64_t expires_ms;  /* MEMROW_NO_TIME when it does not expire */
    int64_t archived_ms; /* MEMROW_NO_TIME when live */
    int32_t version;
    uint64_t seq;
    bool pinned;
    const char *archived_reason; /* NULL when none */
    uint64_t superseded_by;      /* 0 when none */
    uint64_t merged_into;        /* 0 when none */
    int64_t cited_count;         /* provenance feedback: times cited ... */
    int64_t injected_count;      /* ... of the times injected */
} memrow;

/* What an index needs of a memory, as the change functions return it (engram_memory_meta
 * in migrations/0001_baseline.sql): 14 text columns. Tags are the typed metadata fields as a JSON
 * array [tokens, chains, protocols, strategy_id], NULL from a store. */
typedef struct memrow_meta {
    bool present; /* false: the memory no longer exists (every other field is 0) */
    uint64_t id;
    uint64_t seq;
    uint64_t agent_id;
    uint64_t clade_id;
    int scope;
    int type;
    double importance;
    int64_t created_ms;
    int64_t accessed_ms; /* MEMROW_NO_TIME when never */
    int64_t access_count;
    int64_t expires_ms;  /* MEMROW_NO_TIME when never */
    int64_t archived_ms; /* MEMROW_NO_TIME when live */
    bool pinned;
    /* the typed metadata fields as the JSON array [tokens, chains, protocols, strategy_id]
     * (null where absent); points into the result, "" when none */
    const char *tags;
    size_t tags_len;
    /* provenance feedback: times cited and injected (the loader reads them; the change
     * functions' meta columns do not: 0) */
    int64_t cited_count;
    int64_t injected_count;
} memrow_meta;

#define MEMROW_META_NCOLS 14

/* memrow_meta_parse reads the 14 meta columns starting at column col of row. Returns 0
 * (present false when the memory is gone: its id is NULL), or -EBADMSG when the result has too
 * few columns or a value does not parse (reported through rowerr, table memories). */
int memrow_meta_parse(const PGresult *r, int row, int col, memrow_meta *out);

/* memrow_parse reads row of r, a text-format result with the SQL_MEMROW_COLS columns
 * starting at column col. Returns 0, or -EBADMSG when a column is missing or a value does not
 * parse (an integer column holding other text, an unknown scope or type, an importance that
 * is not a finite number, a boolean other than t/f), reported through rowerr (table
 * memories). NULL where a column may be NULL gives that field's default, as documented on
 * memrow. */
int memrow_parse(const PGresult *r, int row, int col, memrow *out);

/* memrow_i64 parses a text-format integer column; NULL gives def. Text that is not a whole
 * integer gives def too, and is reported through rowerr (table other); memrow_i64_of
 * reports under table. */
int64_t memrow_i64(const PGresult *r, int row, int col, int64_t def);
int64_t memrow_i64_of(const PGresult *r, int row, int col, int64_t def, rowerr_table table);

/* memrow_f64_of parses a text-format number column (finite); NULL gives def, and so does
 * anything else, reported through rowerr under table. */
double memrow_f64_of(const PGresult *r, int row, int col, double def, rowerr_table table);

/* memrow_parse_i64 / memrow_parse_f64 parse the whole of s as a decimal integer (within
 * int64) or a finite number. Return true, or false (*out untouched) when s is anything
 * else (empty, trailing text, out of range). */
bool memrow_parse_i64(const char *s, int64_t *out);
bool memrow_parse_f64(const char *s, double *out);

/* memrow_u64_sql formats v (an unsigned 64-bit identity) as the bigint text that holds
 * the same 64 bits, into buf (>= 24 bytes), and returns buf. */
char *memrow_u64_sql(uint64_t v, char *buf);

#endif
