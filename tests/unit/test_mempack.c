/* tests/unit/test_mempack.c: server/mempack: memories packed for responses, decoded back
 * with msgpack and proto/'s readers, and the PostgreSQL parameters built in a request's
 * arena.
 *
 * The request is a fake local to this test: mempack needs only req_alloc and req_auth.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <msgpack.h>

#include "check.h"
#include "mempack.h"

/* ---- a fake request ------------------------------------------------------------------- */

struct req {
    conn_auth auth;
    void *allocs[256];
    size_t nallocs;
};

void *req_alloc(req *r, size_t n)
{
    if (r->nallocs == sizeof(r->allocs) / sizeof(r->allocs[0]))
        return NULL;
    return (r->allocs[r->nallocs++] = malloc(n ? n : 1));
}

const conn_auth *req_auth(req *r)
{
    return &r->auth;
}

static void req_release(req *r)
{
    for (size_t i = 0; i < r->nallocs; i++)
        free(r->allocs[i]);
    r->nallocs = 0;
}

/* ---- decoding ------------------------------------------------------------------------- */

typedef struct packed {
    msgpack_sbuffer sb;
    msgpack_packer pk;
    msgpack_unpacked u;
} packed;

static void packed_init(packed *p)
{
    msgpack_sbuffer_init(&p->sb);
    msgpack_packer_init(&p->pk, &p->sb, msgpack_sbuffer_write);
    msgpack_unpacked_init(&p->u);
}

/* Decodes the one object packed; NULL when the bytes are not exactly one object. */
static const msgpack_object *packed_decode(packed *p)
{
    size_t off = 0;
    if (msgpack_unpack_next(&p->u, p->sb.data, p->sb.size, &off) != MSGPACK_UNPACK_SUCCESS ||
        off != p->sb.size)
        return NULL;
    return &p->u.data;
}

static void packed_fini(packed *p)
{
    msgpack_unpacked_destroy(&p->u);
    msgpack_sbuffer_destroy(&p->sb);
}

static bool is_str(const msgpack_object *o, const char *s)
{
    return o && o->type == MSGPACK_OBJECT_STR && rpc_str_eq(o, s);
}

static bool is_nil(const msgpack_object *o)
{
    return o && o->type == MSGPACK_OBJECT_NIL;
}

static bool is_uint(const msgpack_object *o, uint64_t v)
{
    return o && o->type == MSGPACK_OBJECT_POSITIVE_INTEGER && o->via.u64 == v;
}

static bool is_int(const msgpack_object *o, int64_t v)
{
    if (!o)
        return false;
    if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER)
        return v >= 0 && o->via.u64 == (uint64_t)v;
    return o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER && o->via.i64 == v;
}

static memrow sample(void)
{
    static const char content[] = "gas is cheap on \"L2\"\n";
    static const char md[] = "{\"tokens\": [\"ETH\"], \"attrs\": {\"n\": 2.5, \"ok\": true}}";
    return (memrow){.id = UINT64_MAX,
                    .agent_id = 7,
                    .clade_id = 0,
                    .scope = SCOPE_CLADE,
                    .type = MEM_STRATEGY_OUTCOME,
                    .content = content,
                    .content_len = sizeof(content) - 1,
                    .importance = 0.625,
                    .metadata_json = md,
                    .metadata_len = sizeof(md) - 1,
                    .created_ms = 1700000000000,
                    .updated_ms = 1700000001000,
                    .last_accessed_ms = MEMROW_NO_TIME,
                    .access_count = 4,
                    .expires_ms = 1800000000000,
                    .archived_ms = MEMROW_NO_TIME,
                    .version = 3,
                    .seq = 12,
                    .pinned = true,
                    .archived_reason = NULL,
                    .superseded_by = 0,
                    .merged_into = 99,
                    .cited_count = 2,
                    .injected_count = 5};
}

static void test_memory(void)
{
    packed p;
    packed_init(&p);
    memrow m = sample();
    mp_pack_memory(&p.pk, &m, NULL, 0);
    const msgpack_object *o = packed_decode(&p);
    CHECK(o && o->type == MSGPACK_OBJECT_MAP && o->via.map.size == 21);
    /* every field under its API name, with its API type */
    CHECK(is_uint(rpc_map_get(o, "id"), UINT64_MAX));
    CHECK(is_uint(rpc_map_get(o, "agent_id"), 7));
    CHECK(is_uint(rpc_map_get(o, "clade_id"), 0));
    CHECK(is_str(rpc_map_get(o, "scope"), "clade"));
    CHECK(is_str(rpc_map_get(o, "type"), "strategy_outcome"));
    CHECK(is_str(rpc_map_get(o, "content"), "gas is cheap on \"L2\"\n"));
    const msgpack_object *imp = rpc_map_get(o, "importance");
    CHECK(imp && imp->type == MSGPACK_OBJECT_FLOAT64 && imp->via.f64 == 0.625);
    CHECK(is_int(rpc_map_get(o, "created_at"), 1700000000000));
    CHECK(is_int(rpc_map_get(o, "updated_at"), 1700000001000));
    CHECK(is_nil(rpc_map_get(o, "last_accessed_at"))); /* never accessed */
    CHECK(is_int(rpc_map_get(o, "access_count"), 4));
    CHECK(is_int(rpc_map_get(o, "expires_at"), 1800000000000));
    CHECK(is_nil(rpc_map_get(o, "archived_at")));
    CHECK(is_nil(rpc_map_get(o, "archived_reason")));
    CHECK(is_nil(rpc_map_get(o, "superseded_by"))); /* 0: none */
    CHECK(is_uint(rpc_map_get(o, "merged_into"), 99));
    const msgpack_object *pinned = rpc_map_get(o, "pinned");
    CHECK(pinned && pinned->type == MSGPACK_OBJECT_BOOLEAN && pinned->via.boolean);
    CHECK(is_int(rpc_map_get(o, "version"), 3));
    CHECK(is_int(rpc_map_get(o, "cited_count"), 2));
    CHECK(is_int(rpc_map_get(o, "injected_count"), 5));
    /* metadata arrives as the JSON it is stored as, turned into a map */
    const msgpack_object *md = rpc_map_get(o, "metadata");
    CHECK(md && md->type == MSGPACK_OBJECT_MAP && md->via.map.size == 2);
    const msgpack_object *tokens = rpc_map_get(md, "tokens");
    CHECK(tokens && tokens->type == MSGPACK_OBJECT_ARRAY && tokens->via.array.size == 1 &&
          is_str(&tokens->via.array.ptr[0], "ETH"));
    const msgpack_object *attrs = rpc_map_get(md, "attrs");
    const msgpack_object *n = rpc_map_get(attrs, "n"), *ok = rpc_map_get(attrs, "ok");
    CHECK(n && n->type == MSGPACK_OBJECT_FLOAT64 && n->via.f64 == 2.5);
    CHECK(ok && ok->type == MSGPACK_OBJECT_BOOLEAN && ok->via.boolean);
    /* the seq is internal: not in the response */
    CHECK(rpc_map_get(o, "seq") == NULL);
    packed_fini(&p);
}

static void test_memory_variants(void)
{
    /* fresher access figures from the index replace the row's */
    packed p;
    packed_init(&p);
    memrow m = sample();
    m.archived_ms = 1750000000000;
    m.archived_reason = "merged";
    m.superseded_by = 5;
    mp_fresh fresh = {.set = true, .access_count = 40, .last_access_ms = 1760000000000};
    mp_pack_memory(&p.pk, &m, &fresh, 1);
    rpc_pack_kv_num(&p.pk, "score", 0.5); /* the caller's extra field */
    const msgpack_object *o = packed_decode(&p);
    CHECK(o && o->via.map.size == 22);
    CHECK(is_int(rpc_map_get(o, "access_count"), 40));
    CHECK(is_int(rpc_map_get(o, "last_accessed_at"), 1760000000000));
    CHECK(is_int(rpc_map_get(o, "archived_at"), 1750000000000));
    CHECK(is_str(rpc_map_get(o, "archived_reason"), "merged"));
    CHECK(is_uint(rpc_map_get(o, "superseded_by"), 5));
    const msgpack_object *score = rpc_map_get(o, "score");
    CHECK(score && score->via.f64 == 0.5);
    packed_fini(&p);

    /* an index that never saw a read: last access 0 means none, not the epoch */
    packed_init(&p);
    fresh = (mp_fresh){.set = true, .access_count = 0, .last_access_ms = 0};
    mp_pack_memory(&p.pk, &m, &fresh, 0);
    o = packed_decode(&p);
    CHECK(o && is_nil(rpc_map_get(o, "last_accessed_at")) &&
          is_int(rpc_map_get(o, "access_count"), 0));
    packed_fini(&p);

    /* fresh.set false: the row's figures */
    packed_init(&p);
    fresh.set = false;
    fresh.access_count = 1000;
    mp_pack_memory(&p.pk, &m, &fresh, 0);
    o = packed_decode(&p);
    CHECK(o && is_int(rpc_map_get(o, "access_count"), 4));
    packed_fini(&p);

    /* metadata that is not JSON (it always is in PostgreSQL) packs as nil, not garbage */
    packed_init(&p);
    m.metadata_json = "{broken";
    m.metadata_len = 7;
    mp_pack_memory(&p.pk, &m, NULL, 0);
    o = packed_decode(&p);
    CHECK(o && is_nil(rpc_map_get(o, "metadata")));
    packed_fini(&p);
}

static void test_json_and_time(void)
{
    packed p;
    packed_init(&p);
    msgpack_pack_array(&p.pk, 4);
    mp_pack_json(&p.pk, "[1, -2, \"x\", null]", 18);
    mp_pack_json(&p.pk, "", 0);
    msgpack_pack_map(&p.pk, 2);
    mp_pack_time(&p.pk, "a", MEMROW_NO_TIME);
    mp_pack_time(&p.pk, "b", 0); /* 0 is a time (the epoch), unlike MEMROW_NO_TIME */
    /* 20 levels of nesting are the most metadata may have */
    char deep[64] = "";
    for (int i = 0; i < 21; i++)
        strcat(deep, "[");
    for (int i = 0; i < 21; i++)
        strcat(deep, "]");
    mp_pack_json(&p.pk, deep, strlen(deep));
    const msgpack_object *o = packed_decode(&p);
    CHECK(o && o->type == MSGPACK_OBJECT_ARRAY && o->via.array.size == 4);
    const msgpack_object *a = &o->via.array.ptr[0];
    CHECK(a->type == MSGPACK_OBJECT_ARRAY && a->via.array.size == 4 &&
          is_int(&a->via.array.ptr[0], 1) && is_int(&a->via.array.ptr[1], -2) &&
          is_str(&a->via.array.ptr[2], "x") && is_nil(&a->via.array.ptr[3]));
    CHECK(is_nil(&o->via.array.ptr[1]));
    const msgpack_object *t = &o->via.array.ptr[2];
    CHECK(is_nil(rpc_map_get(t, "a")) && is_int(rpc_map_get(t, "b"), 0));
    CHECK(is_nil(&o->via.array.ptr[3])); /* 21 levels: refused */
    packed_fini(&p);
}

static void test_params(void)
{
    req r = {.auth = {.tenant_id = 9000000000}};
    /* bigint[] of ids: the bigint of the same 64 bits */
    const uint64_t ids[] = {1, 42, UINT64_MAX};
    char *lit = mp_ids_literal(&r, ids, 3);
    CHECK(lit && strcmp(lit, "{1,42,-1}") == 0);
    lit = mp_ids_literal(&r, ids, 0);
    CHECK(lit && strcmp(lit, "{}") == 0);
    const char *tp = mp_tenant_param(&r);
    CHECK(tp && strcmp(tp, "9000000000") == 0);

    /* text[] literals: every element quoted, quotes and backslashes escaped, NULL bare */
    mp_array a = {0};
    CHECK(mp_array_str(&a, "plain", 5) == 0);
    CHECK(mp_array_str(&a, "q\"uote", 6) == 0);
    CHECK(mp_array_str(&a, "back\\slash", 10) == 0);
    CHECK(mp_array_str(&a, NULL, 0) == 0);
    CHECK(mp_array_str(&a, "", 0) == 0);
    CHECK(mp_array_str(&a, "a,b}", 4) == 0);
    char *s = mp_array_finish(&r, &a);
    CHECK(s && strcmp(s, "{\"plain\",\"q\\\"uote\",\"back\\\\slash\",NULL,\"\",\"a,b}\"}") == 0);
    CHECK(a.n == 0 && a.b.data == NULL); /* the builder is freed */
    /* numbers and booleans */
    CHECK(mp_array_i64(&a, -5, false) == 0 && mp_array_i64(&a, 0, true) == 0 &&
          mp_array_i64(&a, INT64_MAX, false) == 0);
    s = mp_array_finish(&r, &a);
    CHECK(s && strcmp(s, "{-5,NULL,9223372036854775807}") == 0);
    CHECK(mp_array_f64(&a, 0.1) == 0 && mp_array_f64(&a, -2) == 0);
    s = mp_array_finish(&r, &a);
    CHECK(s && strcmp(s, "{0.10000000000000001,-2}") == 0); /* reads back to the same double */
    CHECK(mp_array_bool(&a, true) == 0 && mp_array_bool(&a, false) == 0);
    s = mp_array_finish(&r, &a);
    CHECK(s && strcmp(s, "{t,f}") == 0);
    /* an empty array */
    s = mp_array_finish(&r, &a);
    CHECK(s && strcmp(s, "{}") == 0);
    /* mp_array_fini drops a builder that is not finished */
    CHECK(mp_array_str(&a, "x", 1) == 0);
    mp_array_fini(&a);
    CHECK(a.n == 0 && a.b.data == NULL);

    /* uint arrays from a bound argument */
    packed p;
    packed_init(&p);
    msgpack_pack_array(&p.pk, 3);
    msgpack_pack_uint64(&p.pk, 3);
    msgpack_pack_uint64(&p.pk, 0);
    msgpack_pack_uint64(&p.pk, UINT64_MAX);
    const msgpack_object *o = packed_decode(&p);
    size_t n = 0;
    uint64_t *v = mp_uint_array(&r, o, &n);
    CHECK(v && n == 3 && v[0] == 3 && v[1] == 0 && v[2] == UINT64_MAX);
    packed_fini(&p);
    req_release(&r);
}

int main(void)
{
    test_memory();
    test_memory_variants();
    test_json_and_time();
    test_params();
    CHECK_RETURN();
}
