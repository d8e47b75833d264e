/* tests/unit/test_memfilter.c: server/memfilter: filter parameters, the in-memory predicate
 * the vector search applies, the SQL parameters of the same filter, and the tags derived from
 * metadata in both its forms.
 *
 * Arguments go through the real binder (rpc_bind_params with MF_PARAMS), as a request's do.
 * mf_parse_args takes an arena, the bound arguments, the score weights and an error buffer:
 * no request.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>

#include <msgpack.h>

#include "check.h"
#include "json.h"
#include "memfilter.h"
#include "sql.h"

/* ---- what a caller hands mf_parse_args ------------------------------------------------ */

/* One parse: the arena, the bound arguments and the error it reports. */
typedef struct fx {
    arena mem;
    const msgpack_object *args[MF__COUNT];
    bool failed;
    rpc_code code;
    char msg[512];
} fx;

static void fx_release(fx *r)
{
    arena_reset(&r->mem);
}

static server srv = {.score = {.w_recency = 0.3,
                               .w_access = 0.3,
                               .w_explicit = 0.4,
                               .recency_days = 30,
                               .access_saturation = 10}};

#define NOW INT64_C(1700000000000)
#define DAY_MS INT64_C(86400000)

/* One parsed JSON document (msgpack), kept alive while its objects are used. */
typedef struct doc {
    msgpack_sbuffer sb;
    msgpack_unpacked u;
} doc;

static const msgpack_object *doc_parse(doc *d, const char *json)
{
    msgpack_sbuffer_init(&d->sb);
    msgpack_unpacked_init(&d->u);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &d->sb, msgpack_sbuffer_write);
    char err[128];
    if (json_to_msgpack(json, strlen(json), 64, &pk, err, sizeof(err)) != 0 ||
        msgpack_unpack_next(&d->u, d->sb.data, d->sb.size, NULL) != MSGPACK_UNPACK_SUCCESS) {
        fprintf(stderr, "bad test JSON %s\n", json);
        abort();
    }
    return &d->u.data;
}

static void doc_free(doc *d)
{
    msgpack_unpacked_destroy(&d->u);
    msgpack_sbuffer_destroy(&d->sb);
}

static const rpc_param schema[MF__COUNT] = {MF_PARAMS};

/* Binds params (a msgpack map) and parses the filter; returns mf_parse_args's result, or -2 when
 * the binder already refused the arguments (msg then holds its message). */
static int parse_obj(fx *r, const msgpack_object *params, mem_filter *f)
{
    memset(r, 0, sizeof(*r));
    if (rpc_bind_params(params, schema, MF__COUNT, r->args, r->msg, sizeof(r->msg)) != 0)
        return -2;
    int rc = mf_parse_args(&r->mem, &srv.score, NOW, r->args, "", f, r->msg, sizeof(r->msg));
    if (rc < 0) {
        r->failed = true;
        r->code = rc == -EINVAL ? RPC_INVALID_ARGUMENT : RPC_INTERNAL;
    }
    return rc;
}

static int parse(fx *r, doc *d, const char *json, mem_filter *f)
{
    return parse_obj(r, doc_parse(d, json), f);
}

/* Tags of a memory whose metadata is the JSON object md, as a store derives them. */
static uint32_t tags_of(const char *md, uint64_t **tags)
{
    doc d;
    uint32_t n = 0;
    if (mf_tags_from_metadata(doc_parse(&d, md), tags, &n) != 0)
        abort();
    doc_free(&d);
    return n;
}

/* A live, fresh fact in tenant scope, created a day ago, never expiring. */
static mem_meta base_meta(void)
{
    return (mem_meta){.created_ms = NOW - DAY_MS,
                      .expires_ms = INT64_MAX,
                      .importance = 0.5f,
                      .type = MEM_FACT,
                      .scope = SCOPE_TENANT};
}

/* ---- parsing -------------------------------------------------------------------------- */

static void test_defaults(void)
{
    fx r;
    doc d;
    mem_filter f;
    CHECK(parse(&r, &d, "{}", &f) == 0);
    CHECK(f.type_mask == (1u << MEM_TYPE_COUNT) - 1);
    CHECK(f.scope_mask == (1u << SCOPE_COUNT) - 1);
    CHECK(f.created_after == INT64_MIN && f.created_before == INT64_MAX);
    CHECK(!f.include_archived && !f.has_agent && !f.has_clade && !f.has_min_importance &&
          !f.has_min_composite && !f.has_strategy);
    CHECK(f.ntokens == 0 && f.nchains == 0 && f.nprotocols == 0 && f.attrs_json == NULL);
    CHECK(f.sp == &srv.score);
    /* nil is the same as absent */
    fx r2;
    doc d2;
    mem_filter f2;
    CHECK(parse(&r2, &d2, "{\"type_filter\":null,\"agent_id\":null,\"include_archived\":null}",
                &f2) == 0);
    CHECK(f2.type_mask == f.type_mask && !f2.has_agent && !f2.include_archived);
    /* every kind of memory passes the empty filter */
    for (int t = 0; t < MEM_TYPE_COUNT; t++)
        for (int s = 0; s < SCOPE_COUNT; s++) {
            mem_meta m = base_meta();
            m.type = (uint8_t)t;
            m.scope = (uint8_t)s;
            m.agent_id = 5;
            m.clade_id = 6;
            CHECK(mf_keep(&f, 1, &m));
        }
    fx_release(&r);
    fx_release(&r2);
    doc_free(&d);
    doc_free(&d2);
}

static void test_types(void)
{
    fx r;
    doc d;
    mem_filter f;
    CHECK(parse(&r, &d, "{\"type_filter\":[\"fact\",\"constraint\"]}", &f) == 0);
    CHECK(f.type_mask == ((1u << MEM_FACT) | (1u << MEM_CONSTRAINT)));
    CHECK(f.sql_types && strcmp(f.sql_types, "{\"fact\",\"constraint\"}") == 0);
    mem_meta m = base_meta();
    CHECK(mf_keep(&f, 1, &m));
    m.type = MEM_CONSTRAINT;
    CHECK(mf_keep(&f, 1, &m));
    m.type = MEM_PREFERENCE;
    CHECK(!mf_keep(&f, 1, &m));
    m.type = MEM_EPISODE;
    CHECK(!mf_keep(&f, 1, &m));
    fx_release(&r);
    doc_free(&d);

    /* an unknown type is the caller's error, named in the message */
    CHECK(parse(&r, &d, "{\"type_filter\":[\"fact\",\"facts\"]}", &f) == -EINVAL);
    CHECK(r.failed && r.code == RPC_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(r.msg, "type_filter");
    fx_release(&r);
    doc_free(&d);
    /* names are case-sensitive, as stored */
    CHECK(parse(&r, &d, "{\"type_filter\":[\"Fact\"]}", &f) == -EINVAL);
    fx_release(&r);
    doc_free(&d);
    /* the binder bounds the list: 1..5 names, so [] never reaches mf_parse_args */
    CHECK(parse(&r, &d, "{\"type_filter\":[]}", &f) == -2);
    CHECK_STR_CONTAINS(r.msg, "type_filter");
    fx_release(&r);
    doc_free(&d);
}

static void test_scopes_and_agents(void)
{
    fx r;
    doc d;
    mem_filter f;
    /* scopes alone: by the memory's scope, whoever it belongs to */
    CHECK(parse(&r, &d, "{\"scopes\":[\"agent\",\"tenant\"]}", &f) == 0);
    CHECK(f.scope_mask == ((1u << SCOPE_AGENT) | (1u << SCOPE_TENANT)));
    CHECK(f.sql_scopes && strcmp(f.sql_scopes, "{\"agent\",\"tenant\"}") == 0);
    mem_meta m = base_meta();
    m.scope = SCOPE_AGENT;
    m.agent_id = 99;
    CHECK(mf_keep(&f, 1, &m));
    m.scope = SCOPE_CLADE;
    CHECK(!mf_keep(&f, 1, &m));
    fx_release(&r);
    doc_free(&d);

    CHECK(parse(&r, &d, "{\"scopes\":[\"global\"]}", &f) == -EINVAL);
    CHECK(r.code == RPC_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(r.msg, "scopes");
    fx_release(&r);
    doc_free(&d);

    /* an agent sees its own agent memories, its clade's when the clade is named, and the
     * tenant's; never another agent's or another clade's */
    CHECK(parse(&r, &d, "{\"agent_id\":7,\"clade_id\":3}", &f) == 0);
    CHECK(f.has_agent && f.agent_id == 7 && f.has_clade && f.clade_id == 3);
    m = base_meta();
    m.scope = SCOPE_AGENT;
    m.agent_id = 7;
    CHECK(mf_keep(&f, 1, &m));
    m.agent_id = 8;
    CHECK(!mf_keep(&f, 1, &m));
    m.scope = SCOPE_CLADE;
    m.clade_id = 3;
    CHECK(mf_keep(&f, 1, &m));
    m.clade_id = 4;
    CHECK(!mf_keep(&f, 1, &m));
    m.scope = SCOPE_TENANT;
    m.agent_id = 12345;
    CHECK(mf_keep(&f, 1, &m));
    fx_release(&r);
    doc_free(&d);

    /* an agent without a clade sees no clade memories, even of a matching clade id 0 */
    CHECK(parse(&r, &d, "{\"agent_id\":7}", &f) == 0);
    m = base_meta();
    m.scope = SCOPE_CLADE;
    m.clade_id = 0;
    CHECK(!mf_keep(&f, 1, &m));
    fx_release(&r);
    doc_free(&d);

    /* agent and scopes together: the agent's view, narrowed to the scopes named */
    CHECK(parse(&r, &d, "{\"agent_id\":7,\"clade_id\":3,\"scopes\":[\"clade\"]}", &f) == 0);
    m = base_meta();
    m.scope = SCOPE_AGENT;
    m.agent_id = 7;
    CHECK(!mf_keep(&f, 1, &m));
    m.scope = SCOPE_CLADE;
    m.clade_id = 3;
    CHECK(mf_keep(&f, 1, &m));
    m.scope = SCOPE_TENANT;
    CHECK(!mf_keep(&f, 1, &m));
    fx_release(&r);
    doc_free(&d);

    /* a clade without its agent is refused */
    CHECK(parse(&r, &d, "{\"clade_id\":3}", &f) == -EINVAL);
    CHECK(r.code == RPC_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(r.msg, "clade_id");
    fx_release(&r);
    doc_free(&d);
}

static void test_time_and_lifecycle(void)
{
    fx r;
    doc d;
    mem_filter f;
    char json[160];
    int64_t a = NOW - 10 * DAY_MS, b = NOW - 5 * DAY_MS;
    snprintf(json, sizeof(json), "{\"created_after\":%lld,\"created_before\":%lld}", (long long)a,
             (long long)b);
    CHECK(parse(&r, &d, json, &f) == 0);
    CHECK(f.created_after == a && f.created_before == b);
    mem_meta m = base_meta();
    /* both bounds are exclusive */
    m.created_ms = a;
    CHECK(!mf_keep(&f, 1, &m));
    m.created_ms = a + 1;
    CHECK(mf_keep(&f, 1, &m));
    m.created_ms = b - 1;
    CHECK(mf_keep(&f, 1, &m));
    m.created_ms = b;
    CHECK(!mf_keep(&f, 1, &m));
    /* the SQL side gets the same bounds as text */
    const char *vals[SQL_FILTER_NPARAMS];
    CHECK(mf_sql_params(&r.mem, &f, vals) == 0);
    char want[32];
    snprintf(want, sizeof(want), "%lld", (long long)a);
    CHECK(vals[5] && strcmp(vals[5], want) == 0);
    snprintf(want, sizeof(want), "%lld", (long long)b);
    CHECK(vals[6] && strcmp(vals[6], want) == 0);
    fx_release(&r);
    doc_free(&d);

    /* an empty window keeps nothing */
    snprintf(json, sizeof(json), "{\"created_after\":%lld,\"created_before\":%lld}", (long long)a,
             (long long)(a + 1));
    CHECK(parse(&r, &d, json, &f) == 0);
    m.created_ms = a;
    CHECK(!mf_keep(&f, 1, &m));
    m.created_ms = a + 1;
    CHECK(!mf_keep(&f, 1, &m));
    fx_release(&r);
    doc_free(&d);

    /* expired memories never pass; expiring exactly now counts as expired */
    CHECK(parse(&r, &d, "{}", &f) == 0);
    m = base_meta();
    m.expires_ms = NOW;
    CHECK(!mf_keep(&f, 1, &m));
    m.expires_ms = NOW + 1;
    CHECK(mf_keep(&f, 1, &m));
    /* archived ones only on request */
    m.archived = 1;
    CHECK(!mf_keep(&f, 1, &m));
    const char *vals2[SQL_FILTER_NPARAMS];
    CHECK(mf_sql_params(&r.mem, &f, vals2) == 0 && strcmp(vals2[1], "false") == 0);
    fx_release(&r);
    doc_free(&d);
    CHECK(parse(&r, &d, "{\"include_archived\":true}", &f) == 0);
    CHECK(mf_keep(&f, 1, &m));
    CHECK(mf_sql_params(&r.mem, &f, vals2) == 0 && strcmp(vals2[1], "true") == 0);
    fx_release(&r);
    doc_free(&d);
}

static void test_tags(void)
{
    fx r;
    doc d;
    mem_filter f;
    uint64_t *tags = NULL;
    mem_meta m = base_meta();
    m.ntags = tags_of("{\"tokens\":[\"ETH\",\"BTC\"],\"chains\":[1,137],\"protocols\":[\"aave\"],"
                      "\"strategy_id\":\"s-1\"}",
                      &tags);
    m.tags = tags;
    CHECK(m.ntags == 6);

    /* tokens: any of the listed */
    CHECK(parse(&r, &d, "{\"tokens\":[\"SOL\",\"BTC\"]}", &f) == 0);
    CHECK(f.ntokens == 2);
    CHECK(mf_keep(&f, 1, &m));
    fx_release(&r);
    doc_free(&d);
    CHECK(parse(&r, &d, "{\"tokens\":[\"SOL\"]}", &f) == 0);
    CHECK(!mf_keep(&f, 1, &m));
    fx_release(&r);
    doc_free(&d);
    /* tokens match exactly (no case folding) */
    CHECK(parse(&r, &d, "{\"tokens\":[\"eth\"]}", &f) == 0);
    CHECK(!mf_keep(&f, 1, &m));
    fx_release(&r);
    doc_free(&d);
    /* a name is a tag of its own field only: "aave" is a protocol, not a token */
    CHECK(parse(&r, &d, "{\"tokens\":[\"aave\"]}", &f) == 0);
    CHECK(!mf_keep(&f, 1, &m));
    fx_release(&r);
    doc_free(&d);
    /* chains are numbers */
    CHECK(parse(&r, &d, "{\"chains\":[137]}", &f) == 0);
    CHECK(mf_keep(&f, 1, &m));
    fx_release(&r);
    doc_free(&d);
    CHECK(parse(&r, &d, "{\"chains\":[10]}", &f) == 0);
    CHECK(!mf_keep(&f, 1, &m));
    fx_release(&r);
    doc_free(&d);
    CHECK(parse(&r, &d, "{\"chains\":[\"137\"]}", &f) == -2); /* the binder wants integers */
    fx_release(&r);
    doc_free(&d);
    /* different fields must all match (any-of within each) */
    CHECK(parse(&r, &d, "{\"tokens\":[\"ETH\"],\"protocols\":[\"aave\",\"uni\"],\"chains\":[1]}",
                &f) == 0);
    CHECK(mf_keep(&f, 1, &m));
    fx_release(&r);
    doc_free(&d);
    CHECK(parse(&r, &d, "{\"tokens\":[\"ETH\"],\"protocols\":[\"uni\"]}", &f) == 0);
    CHECK(!mf_keep(&f, 1, &m));
    fx_release(&r);
    doc_free(&d);
    /* strategy: exactly that one */
    CHECK(parse(&r, &d, "{\"strategy_id\":\"s-1\"}", &f) == 0);
    CHECK(f.has_strategy && mf_keep(&f, 1, &m));
    fx_release(&r);
    doc_free(&d);
    CHECK(parse(&r, &d, "{\"strategy_id\":\"s-10\"}", &f) == 0);
    CHECK(!mf_keep(&f, 1, &m));
    fx_release(&r);
    doc_free(&d);
    /* a memory without tags passes no tag filter */
    mem_meta bare = base_meta();
    CHECK(parse(&r, &d, "{\"tokens\":[\"ETH\"]}", &f) == 0);
    CHECK(!mf_keep(&f, 1, &bare));
    fx_release(&r);
    doc_free(&d);
    free(tags);
}

static void test_tag_sql(void)
{
    fx r;
    doc d;
    mem_filter f;
    /* one containment document per element, as a jsonb[] literal: each element quoted, its
     * quotes and backslashes escaped; the JSON inside escapes the token's own quote */
    CHECK(parse(&r, &d, "{\"tokens\":[\"A\",\"q\\\"x\"],\"chains\":[5]}", &f) == 0);
    CHECK(f.sql_tokens &&
          strcmp(f.sql_tokens,
                 "{\"{\\\"tokens\\\":[\\\"A\\\"]}\",\"{\\\"tokens\\\":[\\\"q\\\\\\\"x\\\"]}\"}") ==
              0);
    CHECK(f.sql_chains && strcmp(f.sql_chains, "{\"{\\\"chains\\\":[5]}\"}") == 0);
    CHECK(f.sql_protocols == NULL);
    /* duplicates collapse in the hash set */
    fx_release(&r);
    doc_free(&d);
    CHECK(parse(&r, &d, "{\"tokens\":[\"A\",\"A\",\"B\"]}", &f) == 0);
    CHECK(f.ntokens == 2);
    fx_release(&r);
    doc_free(&d);
    CHECK(parse(&r, &d, "{\"strategy_id\":\"s\\\"1\"}", &f) == 0);
    CHECK(f.sql_strategy && strcmp(f.sql_strategy, "{\"strategy_id\":\"s\\\"1\"}") == 0);
    fx_release(&r);
    doc_free(&d);
}

/* The same metadata gives the same tag set whichever way it reaches the server: the request's
 * metadata map (stores) and the JSON array index loads and change functions return. */
static void test_tag_forms_agree(void)
{
    uint64_t *a = NULL, *b = NULL;
    uint32_t na = tags_of("{\"tokens\":[\"ETH\",\"BTC\",\"ETH\"],\"chains\":[1],"
                          "\"protocols\":[\"aave\"],\"strategy_id\":\"s-1\",\"attrs\":{\"k\":1}}",
                          &a);
    const char *js = "[[\"ETH\",\"BTC\",\"ETH\"],[1],[\"aave\"],\"s-1\"]";
    uint32_t nb = 0;
    CHECK(mf_tags_from_json(js, strlen(js), &b, &nb) == 0);
    CHECK(na == 5 && nb == 5);
    CHECK(na == nb && memcmp(a, b, na * sizeof(*a)) == 0);
    /* sorted ascending, no duplicates */
    for (uint32_t i = 1; i < na; i++)
        CHECK(a[i - 1] < a[i]);
    /* and the hash is the hash of the prefixed string */
    uint64_t eth = mf_tag_hash("t:ETH", 5);
    bool found = false;
    for (uint32_t i = 0; i < na; i++)
        found = found || a[i] == eth;
    CHECK(found);
    free(a);
    free(b);

    /* no typed fields: no tags, no allocation */
    uint64_t *none = (uint64_t *)1;
    uint32_t nn = 7;
    CHECK(tags_of("{\"attrs\":{\"k\":1}}", &none) == 0 && none == NULL);
    CHECK(mf_tags_from_json("[null,null,null,null]", 21, &none, &nn) == 0 && none == NULL &&
          nn == 0);
    /* not the 4-element array: refused */
    CHECK(mf_tags_from_json("[null,null,null]", 16, &none, &nn) == -EINVAL);
    CHECK(mf_tags_from_json("{\"tokens\":[]}", 13, &none, &nn) == -EINVAL);
    CHECK(mf_tags_from_json("[1,2", 4, &none, &nn) == -EINVAL);
    CHECK(mf_tags_from_json("", 0, &none, &nn) == -EINVAL);
}

/* min_importance: the author's importance as stored, whatever the age and reads (seed 003's
 * MemorySearchRequest) */
static void test_min_importance(void)
{
    fx r;
    doc d;
    mem_filter f;
    CHECK(parse(&r, &d, "{\"min_importance\":0.5}", &f) == 0);
    CHECK(f.has_min_importance && f.min_importance == 0.5 && !f.has_min_composite);
    mem_meta m = base_meta();
    m.created_ms = NOW - 300 * DAY_MS; /* old and never read: a low composite */
    m.importance = 0.5f;               /* the bound is inclusive */
    CHECK(mf_keep(&f, 1, &m));
    m.importance = 0.49f;
    m.created_ms = NOW;
    m.access = mem_access_word(0, 100); /* a high composite does not help */
    CHECK(!mf_keep(&f, 1, &m));
    const char *vals[SQL_FILTER_NPARAMS];
    CHECK(mf_sql_params(&r.mem, &f, vals) == 0);
    CHECK(vals[15] && strtod(vals[15], NULL) == 0.5 && vals[12] == NULL);
    fx_release(&r);
    doc_free(&d);
    CHECK(parse(&r, &d, "{\"min_importance\":1.5}", &f) == -2); /* 0..1 */
    fx_release(&r);
    doc_free(&d);
}

static void test_min_composite(void)
{
    fx r;
    doc d;
    mem_filter f;
    CHECK(parse(&r, &d, "{\"min_composite\":0.5}", &f) == 0);
    CHECK(f.has_min_composite && f.min_composite == 0.5 && !f.has_min_importance);
    /* created now, never read: composite = 0.3 + 0.4 * importance */
    mem_meta m = base_meta();
    m.created_ms = NOW;
    m.importance = 0.5f; /* 0.5 exactly: 0.3 + 0.2 = 0.5, kept (the bound is inclusive) */
    CHECK(mf_keep(&f, 1, &m));
    m.importance = 0.25f; /* 0.4 */
    CHECK(!mf_keep(&f, 1, &m));
    /* reads lift it: 0.4 + 0.3 * 5 / 10 = 0.55 */
    m.access = mem_access_word(0, 5);
    CHECK(mf_keep(&f, 1, &m));
    /* age lowers it: 60 days old, 0.3 * e^-2 + 0.1 + 0.15 < 0.5 */
    m.created_ms = NOW - 60 * DAY_MS;
    CHECK(!mf_keep(&f, 1, &m));
    const char *vals[SQL_FILTER_NPARAMS];
    CHECK(mf_sql_params(&r.mem, &f, vals) == 0);
    CHECK(vals[12] && strtod(vals[12], NULL) == 0.5 && vals[15] == NULL);
    fx_release(&r);
    doc_free(&d);
    CHECK(parse(&r, &d, "{\"min_composite\":1.5}", &f) == -2); /* 0..1 */
    fx_release(&r);
    doc_free(&d);
}

static void test_attrs(void)
{
    fx r;
    doc d;
    mem_filter f;
    CHECK(parse(&r, &d, "{\"attrs\":{\"desk\":\"rates\",\"n\":[1,2]}}", &f) == 0);
    CHECK(f.attrs_json &&
          strcmp(f.attrs_json, "{\"attrs\":{\"desk\":\"rates\",\"n\":[1,2]}}") == 0);
    /* answered by PostgreSQL: without its ids nothing passes; with them, exactly those */
    mem_meta m = base_meta();
    CHECK(!mf_keep(&f, 1, &m));
    idmap *ids = idmap_create(4);
    CHECK(ids && idmap_put(ids, 1, 1) == 0);
    f.attr_ids = ids;
    CHECK(mf_keep(&f, 1, &m));
    CHECK(!mf_keep(&f, 2, &m));
    idmap_destroy(ids);
    fx_release(&r);
    doc_free(&d);

    /* 16 levels of maps are allowed; 17 are refused by mf_parse_args itself */
    char deep[256] = "{\"attrs\":";
    for (int i = 0; i < 16; i++)
        strcat(deep, "{\"a\":");
    strcat(deep, "1");
    for (int i = 0; i < 16; i++)
        strcat(deep, "}");
    strcat(deep, "}");
    CHECK(parse(&r, &d, deep, &f) == 0);
    fx_release(&r);
    doc_free(&d);
    char deeper[256] = "{\"attrs\":";
    for (int i = 0; i < 17; i++)
        strcat(deeper, "{\"a\":");
    strcat(deeper, "1");
    for (int i = 0; i < 17; i++)
        strcat(deeper, "}");
    strcat(deeper, "}");
    CHECK(parse(&r, &d, deeper, &f) == -EINVAL);
    CHECK(r.code == RPC_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(r.msg, "attrs");
    fx_release(&r);
    doc_free(&d);

    /* a binary value has no JSON form */
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 1);
    rpc_pack_cstr(&pk, "attrs");
    msgpack_pack_map(&pk, 1);
    rpc_pack_cstr(&pk, "blob");
    msgpack_pack_bin(&pk, 3);
    msgpack_pack_bin_body(&pk, "abc", 3);
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    CHECK(msgpack_unpack_next(&u, sb.data, sb.size, NULL) == MSGPACK_UNPACK_SUCCESS);
    int rc = parse_obj(&r, &u.data, &f);
    CHECK_MSG(rc < 0, "rc %d", rc);
    CHECK_STR_CONTAINS(r.msg, "attrs");
    fx_release(&r);
    msgpack_unpacked_destroy(&u);
    msgpack_sbuffer_destroy(&sb);
}

static void test_sql_params(void)
{
    fx r;
    doc d;
    mem_filter f;
    /* nothing set: only the always-present parameters are non-NULL */
    CHECK(parse(&r, &d, "{}", &f) == 0);
    const char *vals[SQL_FILTER_NPARAMS];
    CHECK(mf_sql_params(&r.mem, &f, vals) == 0);
    CHECK(vals[0] == NULL && vals[2] == NULL && vals[3] == NULL && vals[4] == NULL);
    CHECK(vals[5] == NULL && vals[6] == NULL && vals[7] == NULL && vals[8] == NULL);
    CHECK(vals[9] == NULL && vals[10] == NULL && vals[11] == NULL && vals[12] == NULL);
    CHECK(vals[15] == NULL);
    CHECK(strcmp(vals[1], "false") == 0);
    CHECK(strcmp(vals[13], "1700000000000") == 0); /* as of the filter's time */
    /* the score weights, in the order PostgreSQL's engram_composite takes them, then the
     * usefulness weight engram_composite_u takes */
    CHECK(strcmp(vals[14],
                 "{0.29999999999999999,0.29999999999999999,0.40000000000000002,30,10,0}") == 0);
    fx_release(&r);
    doc_free(&d);
    /* agent ids are unsigned 64-bit identities, passed as the bigint of the same bits */
    CHECK(parse(&r, &d, "{\"agent_id\":18446744073709551615,\"clade_id\":42}", &f) == 0);
    CHECK(mf_sql_params(&r.mem, &f, vals) == 0);
    CHECK(vals[2] && strcmp(vals[2], "-1") == 0);
    CHECK(vals[3] && strcmp(vals[3], "42") == 0);
    fx_release(&r);
    doc_free(&d);
}

static void test_check_metadata(void)
{
    static const struct {
        const char *json;
        const char *want; /* NULL: valid; else a part of the message */
    } cases[] = {
        {"{}", NULL},
        {"{\"tokens\":[\"ETH\"],\"chains\":[1,2],\"protocols\":[],\"strategy_id\":\"x\","
         "\"attrs\":{\"a\":{\"b\":[1]}}}",
         NULL},
        {"[]", "must be a map"},
        {"{\"colour\":\"red\"}", "unknown field 'md.colour'"},
        {"{\"tokens\":\"ETH\"}", "md.tokens"},
        {"{\"tokens\":[1]}", "md.tokens"},
        {"{\"tokens\":[\"\"]}", "md.tokens[0]"},
        {"{\"tokens\":[\"ok\",\"bad\\u0007\"]}", "control characters"},
        {"{\"tokens\":[\"tab\\there\"]}", "control characters"},
        {"{\"protocols\":[\"\\u007f\"]}", "control characters"},
        {"{\"chains\":[-1]}", "md.chains"},
        {"{\"chains\":[\"1\"]}", "md.chains"},
        {"{\"strategy_id\":7}", "md.strategy_id"},
        {"{\"strategy_id\":\"\"}", "md.strategy_id"},
        {"{\"attrs\":[1]}", "md.attrs"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        doc d;
        char err[300] = "";
        int rc = mf_check_metadata(doc_parse(&d, cases[i].json), "md", 256, err, sizeof(err));
        if (!cases[i].want) {
            CHECK_MSG(rc == 0, "%s: %s", cases[i].json, err);
        } else {
            CHECK_MSG(rc == -EINVAL, "%s accepted", cases[i].json);
            CHECK_STR_CONTAINS(err, cases[i].want);
        }
        doc_free(&d);
    }
    /* 128-byte tags are the longest; 64 entries the most */
    char json[9000];
    char tag[130];
    memset(tag, 'x', 128);
    tag[128] = '\0';
    snprintf(json, sizeof(json), "{\"tokens\":[\"%s\"]}", tag);
    doc d;
    char err[300];
    CHECK(mf_check_metadata(doc_parse(&d, json), "md", 256, err, sizeof(err)) == 0);
    doc_free(&d);
    tag[128] = 'x';
    tag[129] = '\0';
    snprintf(json, sizeof(json), "{\"tokens\":[\"%s\"]}", tag);
    CHECK(mf_check_metadata(doc_parse(&d, json), "md", 256, err, sizeof(err)) == -EINVAL);
    doc_free(&d);
    for (int n = 64; n <= 65; n++) {
        size_t len = (size_t)snprintf(json, sizeof(json), "{\"chains\":[");
        for (int i = 0; i < n; i++)
            len += (size_t)snprintf(json + len, sizeof(json) - len, "%s%d", i ? "," : "", i);
        snprintf(json + len, sizeof(json) - len, "]}");
        CHECK(mf_check_metadata(doc_parse(&d, json), "md", 256, err, sizeof(err)) ==
              (n == 64 ? 0 : -EINVAL));
        doc_free(&d);
    }
    /* attrs: at most max_entries entries in any map or list, at any depth */
    const char *attrs[] = {"{\"attrs\":{\"a\":1,\"b\":2,\"c\":3}}",
                           "{\"attrs\":{\"a\":1,\"b\":2,\"c\":3,\"d\":4}}",
                           "{\"attrs\":{\"a\":[1,2,3]}}", "{\"attrs\":{\"a\":[1,2,3,4]}}",
                           "{\"attrs\":{\"a\":{\"b\":[[1,2,3,4]]}}}"};
    const int want[] = {0, -EINVAL, 0, -EINVAL, -EINVAL};
    for (size_t i = 0; i < sizeof(attrs) / sizeof(attrs[0]); i++) {
        CHECK_MSG(mf_check_metadata(doc_parse(&d, attrs[i]), "md", 3, err, sizeof(err)) == want[i],
                  "%s", attrs[i]);
        if (want[i])
            CHECK_STR_CONTAINS(err, "max_metadata_entries");
        doc_free(&d);
    }
}

/* The access word: 44 bits of milliseconds above a 20-bit count, each clamped, never
 * spilling into the other. */
static void test_access_word(void)
{
    mem_meta m = base_meta();
    CHECK(mem_meta_access_count(&m) == 0 && mem_meta_last_access(&m) == 0);
    mem_meta_set_access(&m, NOW, 7);
    CHECK(mem_meta_access_count(&m) == 7 && mem_meta_last_access(&m) == NOW);
    mem_meta_set_access(&m, NOW, (uint64_t)MEM_ACCESS_COUNT_MAX + 5); /* saturates */
    CHECK(mem_meta_access_count(&m) == MEM_ACCESS_COUNT_MAX && mem_meta_last_access(&m) == NOW);
    mem_meta_set_access(&m, INT64_MAX, 1); /* clamped, the count intact */
    CHECK(mem_meta_last_access(&m) == MEM_ACCESS_MS_MAX && mem_meta_access_count(&m) == 1);
    CHECK(MEM_ACCESS_MS_MAX > INT64_C(17000000000000)); /* past the year 2500 */
    mem_meta_set_access(&m, -5, 2);
    CHECK(mem_meta_last_access(&m) == 0 && mem_meta_access_count(&m) == 2);
    /* a saturated count still ranks as accessed (score_access_saturation is far below) */
    mem_meta_set_access(&m, NOW, UINT64_MAX);
    CHECK(mem_meta_access_count(&m) == MEM_ACCESS_COUNT_MAX);
}

int main(void)
{
    test_defaults();
    test_types();
    test_scopes_and_agents();
    test_time_and_lifecycle();
    test_tags();
    test_tag_sql();
    test_tag_forms_agree();
    test_min_importance();
    test_min_composite();
    test_attrs();
    test_sql_params();
    test_check_metadata();
    test_access_word();
    CHECK_RETURN();
}
