/* server/methods/mempack.h: helpers the memory methods share: packing memories into responses and
 * building PostgreSQL parameters (arrays, ids) in a request's arena. */
#ifndef ENGRAM_SERVER_MEMPACK_H
#define ENGRAM_SERVER_MEMPACK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <libpq-fe.h>
#include <msgpack.h>

#include "json.h"
#include "memrow.h"
#include "req.h"
#include "ubuf.h"

/* The unavailable message of a request whose vectors are of the tenant's previous embedding
 * model (a re-embedding swapped it while the request ran): sent again, it is embedded with the
 * new one. The same words as the database's refusal (engram_embed_gen_message). */
#define MODEL_CHANGED "the tenant's embedding model changed while this request was embedded; retry"

/* Overrides for the fields of a memory the index knows fresher than the database row. */
typedef struct mp_fresh {
    bool set;
    uint64_t access_count;
    int64_t last_access_ms; /* 0: never */
} mp_fresh;

/* mp_pack_memory packs row as a map of its 21 fields plus nextra more that the caller packs
 * next (key, value pairs). fresh may be NULL. */
void mp_pack_memory(msgpack_packer *pk, const memrow *row, const mp_fresh *fresh, uint32_t nextra);

/* mp_pack_rows packs the memory rows of pr (memrow columns from col) as an array of memory
 * maps, nil for a row that does not parse. emb_col >= 0: each map gains "embedding", the
 * column's base64 text as a bin of little-endian float32 (nil when it does not decode).
 * ids, when not NULL, receives the ids of the rows packed (room for every row) and *nids
 * their count. */
void mp_pack_rows(msgpack_packer *pk, const PGresult *pr, int col, int emb_col, uint64_t *ids,
                  size_t *nids);

/* mp_pack_json packs JSON text as the MessagePack value it denotes (nil if it is not). */
void mp_pack_json(msgpack_packer *pk, const char *json, size_t n);

/* mp_pack_time packs key and ms, or nil for MEMROW_NO_TIME. */
void mp_pack_time(msgpack_packer *pk, const char *key, int64_t ms);

/* mp_ids_literal returns the bigint[] literal of ids ("{1,2}") in r's arena, or NULL. */
char *mp_ids_literal(req *r, const uint64_t *ids, size_t n);

/* mp_uint_array reads a uint[] argument into an arena array; NULL when out of memory. */
uint64_t *mp_uint_array(req *r, const msgpack_object *o, size_t *n);

/* A PostgreSQL array literal under construction (ubuf underneath). Every append
 * returns 0 or -ENOMEM. */
typedef struct mp_array {
    ubuf b;
    size_t n;
} mp_array;

int mp_array_str(mp_array *a, const char *s, size_t n); /* s NULL: NULL element */
int mp_array_i64(mp_array *a, int64_t v, bool null);
int mp_array_f64(mp_array *a, double v);
int mp_array_bool(mp_array *a, bool v);
/* mp_array_finish closes the literal and moves it into r's arena (NULL when out of memory);
 * the builder is freed either way. */
char *mp_array_finish(req *r, mp_array *a);
void mp_array_fini(mp_array *a);

/* mp_tenant_param formats the request's tenant id into r's arena. */
const char *mp_tenant_param(req *r);

#endif
