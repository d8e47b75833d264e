/* server/methods/m_admin.c: tenant and key administration (admin connections only), and
 * tenant.usage (a tenant's own view of its usage and limits). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "auth.h"
#include "chat.h"
#include "index_engine.h"
#include "embed.h"
#include "embedder.h"
#include "handlers.h"
#include "log.h"
#include "mempack.h"
#include "memrow.h"
#include "sql.h"
#include "tenancy.h"
#include "tenants.h"

#include <errno.h>
#define LIST_MAX 1000
#define LIST_DEFAULT 100

/* The admin methods name a tenant by tenant_id or by name: exactly one. Fills vals[0..1]
 * with the SQL parameters (id, name). Returns 0, or -1 after failing the request. */
static int tenant_ref(req *r, size_t id_param, size_t name_param, const char **vals)
{
    const msgpack_object *id = req_arg(r, id_param), *name = req_arg(r, name_param);
    if (!id == !name) {
        req_fail(r, RPC_INVALID_ARGUMENT, "name the tenant with 'tenant_id' or 'name' (one)");
        return -EINVAL;
    }
    vals[0] = vals[1] = NULL;
    if (id) {
        char *s = req_alloc(r, 24);
        if (!s) {
            req_fail(r, RPC_INTERNAL, "out of memory");
            return -EINVAL;
        }
        snprintf(s, 24, "%lld", (long long)rpc_get_uint(id, 0));
        vals[0] = s;
    } else if (!(vals[1] = req_strdup(r, name))) {
        req_fail(r, RPC_INTERNAL, "out of memory");
        return -EINVAL;
    }
    return 0;
}

/* Ends r with the JSON text of the first column of the first row as its result. */
static void json_row_done(req *r, const db_result *res)
{
    if (res->status != DB_OK) {
        req_fail_db(r, res);
        return;
    }
    const PGresult *pr = res->res[0];
    if (PQntuples(pr) != 1 || PQgetisnull(pr, 0, 0)) {
        req_fail(r, RPC_INTERNAL, "no result");
        return;
    }
    msgpack_packer *pk = req_result(r);
    mp_pack_json(pk, PQgetvalue(pr, 0, 0), (size_t)PQgetlength(pr, 0, 0));
    req_done(r);
}

/* ---- admin.tenant.create ------------------------------------------------------------- */

/* The index_engine parameter of create and update: NULL when absent, "native" or "faiss",
 * or (update) "default" to clear the tenant's choice; the dispatcher checked it against the
 * table's words (ENUMS). Sets *out to the SQL value (NULL: none) and returns 0, or fails
 * the request and returns -1. */
static int engine_arg(req *r, const msgpack_object *o, const char **out)
{
    *out = NULL;
    if (o && !(*out = req_strdup(r, o))) {
        req_fail(r, RPC_INTERNAL, "out of memory");
        return -EINVAL;
    }
    return 0;
}

enum { P_TC_NAME, P_TC_TIER, P_TC_EMBEDDING, P_TC_INDEX_ENGINE };
ENUMS(admin_tenant_create, {"tier", enum_tiers}, {"index_engine", enum_index_engines});
PARAMS(admin_tenant_create, {"name", RPC_T_STR, RPC_P_REQUIRED | RPC_P_RANGE, 1, 128},
       {"tier", RPC_T_STR, RPC_P_REQUIRED, 0, 0}, {"embedding", RPC_T_MAP, RPC_P_NULLABLE, 0, 0},
       {"index_engine", RPC_T_STR, RPC_P_NULLABLE, 0, 0});

typedef struct tc_state {
    char key[AUTH_KEY_LEN + 1];
} tc_state;

static void tenant_created(req *r, const db_result *res)
{
    tc_state *st = req_state(r);
    if (res->status != DB_OK) {
        memset(st->key, 0, sizeof(st->key));
        req_fail_db(r, res);
        return;
    }
    const PGresult *pr = res->res[0];
    msgpack_packer *pk = req_result(r);
    msgpack_pack_map(pk, 3);
    rpc_pack_kv_int(pk, "tenant_id", memrow_i64(pr, 0, 0, 0));
    rpc_pack_kv_str(pk, "api_key", st->key);
    rpc_pack_kv_int(pk, "key_id", memrow_i64(pr, 0, 1, 0));
    memset(st->key, 0, sizeof(st->key));
    req_done(r);
}

/* A tenant's embedding model as admin.tenant.create and admin.tenant.update name it. */
typedef struct emb_choice {
    const char *provider; /* "builtin" or "openai" */
    const char *model;    /* "" for builtin, the server's openai_model */
    long dim;
} emb_choice;

/* The embedding parameter of create and update ({provider?, model?, dim?}; NULL: the
 * defaults, the built-in provider at embed_dim): checks it and fills *out. A model, when
 * given, must be the one the server's provider serves. Returns 0, or fails the request and
 * returns -EINVAL. */
static int embedding_arg(req *r, const msgpack_object *emb, emb_choice *out)
{
    server *s = req_server(r);
    *out = (emb_choice){.provider = "builtin", .model = "", .dim = s->cfg.embed_dim};
    bool dim_given = false;
    const msgpack_object *model = NULL;
    char err[256];
    for (uint32_t i = 0; emb && i < emb->via.map.size; i++) {
        const msgpack_object_kv *kv = &emb->via.map.ptr[i];
        if (rpc_str_eq(&kv->key, "provider")) {
            if (rpc_str_eq(&kv->val, "builtin")) {
                out->provider = "builtin";
            } else if (rpc_str_eq(&kv->val, "openai")) {
                if (!embedder_available("openai")) {
                    req_fail(r, RPC_INVALID_ARGUMENT,
                             "embedding provider 'openai' is not configured on this server "
                             "(openai_url)");
                    return -EINVAL;
                }
                out->provider = "openai";
            } else {
                req_fail(r, RPC_INVALID_ARGUMENT,
                         "parameter 'embedding.provider' must be builtin or openai");
                return -EINVAL;
            }
        } else if (rpc_str_eq(&kv->key, "dim")) {
            if (rpc_check_value(&kv->val, RPC_T_UINT, RPC_P_RANGE, EMBED_MIN_DIM, EMBED_MAX_DIM,
                                "embedding.dim", err, sizeof(err)) != 0) {
                req_fail(r, RPC_INVALID_ARGUMENT, "%s", err);
                return -EINVAL;
            }
            out->dim = (long)kv->val.via.u64;
            dim_given = true;
        } else if (rpc_str_eq(&kv->key, "model")) {
            if (kv->val.type != MSGPACK_OBJECT_STR) {
                req_fail(r, RPC_INVALID_ARGUMENT, "parameter 'embedding.model' must be a string");
                return -EINVAL;
            }
            model = &kv->val;
        } else {
            req_fail(r, RPC_INVALID_ARGUMENT, "unknown parameter 'embedding.%.*s'",
                     (int)(kv->key.type == MSGPACK_OBJECT_STR ? kv->key.via.str.size : 1),
                     kv->key.type == MSGPACK_OBJECT_STR ? kv->key.via.str.ptr : "?");
            return -EINVAL;
        }
    }
    if (strcmp(out->provider, "openai") == 0) {
        /* the provider's vectors have one dimension; a tenant cannot choose another */
        if (dim_given && out->dim != s->cfg.openai_dim) {
            req_fail(r, RPC_INVALID_ARGUMENT,
                     "parameter 'embedding.dim' must be %d for the openai provider",
                     s->cfg.openai_dim);
            return -EINVAL;
        }
        out->dim = s->cfg.openai_dim;
        out->model = s->cfg.openai_model;
    }
    /* one model per provider on a server: naming another is a mistake, not a choice */
    if (model && !rpc_str_eq(model, out->model)) {
        req_fail(r, RPC_INVALID_ARGUMENT,
                 "parameter 'embedding.model' must be '%s' for the %s provider on this server",
                 out->model, out->provider);
        return -EINVAL;
    }
    return 0;
}

void h_admin_tenant_create(req *r)
{
    server *s = req_server(r);
    const msgpack_object *tier = req_arg(r, P_TC_TIER); /* one of enum_tiers (ENUMS) */
    emb_choice ec;
    if (embedding_arg(r, req_arg(r, P_TC_EMBEDDING), &ec) < 0)
        return;
    const char *provider = ec.provider, *model = ec.model;
    long dim = ec.dim;
    const char *engine;
    if (engine_arg(r, req_arg(r, P_TC_INDEX_ENGINE), &engine) < 0)
        return;
    tc_state *st = req_alloc(r, sizeof(*st));
    char *name = req_strdup(r, req_arg(r, P_TC_NAME));
    char *tiername = req_strdup(r, tier);
    char *dimtxt = req_alloc(r, 16);
    if (!st || !name || !tiername || !dimtxt) {
        req_fail(r, RPC_INTERNAL, "out of memory");
        return;
    }
    char key_id[AUTH_KEY_ID_LEN + 1], hash_hex[65];
    uint8_t hash[32];
    auth_new_key(st->key, key_id);
    auth_hash(s, st->key, AUTH_KEY_LEN, hash);
    auth_hash_hex(hash, hash_hex);
    snprintf(dimtxt, 16, "%ld", dim);
    req_set_state(r, st);
    const char *vals[] = {name,      tiername, provider, model, dimtxt,
                          "default", key_id,   hash_hex, engine};
    db_query q = {.stmt = sql_def(SQL_TENANT_CREATE), DB_VALUES(vals)};
    req_submit(r, -1, &q, 1, tenant_created);
}

/* ---- admin.tenant.get / list / update / delete ------------------------------------------ */

enum { P_TG_TENANT_ID, P_TG_NAME };
PARAMS(admin_tenant_get, {"tenant_id", RPC_T_UINT, RPC_P_NULLABLE, 0, 0},
       {"name", RPC_T_STR, RPC_P_NULLABLE | RPC_P_RANGE, 1, 128});

void h_admin_tenant_get(req *r)
{
    const char *vals[3];
    if (tenant_ref(r, P_TG_TENANT_ID, P_TG_NAME, vals) < 0)
        return;
    vals[2] = req_server(r)->cfg.index_engine;
    db_query q = {.stmt = sql_def(SQL_ADMIN_TENANT_GET), DB_VALUES(vals)};
    req_submit(r, -1, &q, 1, json_row_done);
}

enum { P_TL_CURSOR, P_TL_LIMIT };
PARAMS(admin_tenant_list, {"cursor", RPC_T_UINT, RPC_P_NULLABLE, 0, 0},
       {"limit", RPC_T_UINT, RPC_P_NULLABLE | RPC_P_RANGE, 1, LIST_MAX});

typedef struct tl_state {
    uint64_t limit;
} tl_state;

static void tenants_listed(req *r, const db_result *res)
{
    tl_state *st = req_state(r);
    if (res->status != DB_OK) {
        req_fail_db(r, res);
        return;
    }
    const PGresult *pr = res->res[0];
    const char *json = PQgetvalue(pr, 0, 0);
    /* the last tenant's id continues the listing: find it in the parsed array */
    msgpack_sbuffer sb;
    msgpack_packer tmp;
    char err[128];
    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&tmp, &sb, msgpack_sbuffer_write);
    msgpack_zone zone;
    msgpack_zone_init(&zone, 4096);
    msgpack_object arr;
    size_t off = 0;
    if (json_to_msgpack(json, strlen(json), 16, &tmp, err, sizeof(err)) != 0 ||
        msgpack_unpack(sb.data, sb.size, &off, &zone, &arr) != MSGPACK_UNPACK_SUCCESS ||
        arr.type != MSGPACK_OBJECT_ARRAY) {
        msgpack_zone_destroy(&zone);
        msgpack_sbuffer_destroy(&sb);
        req_fail(r, RPC_INTERNAL, "malformed tenant list");
        return;
    }
    msgpack_packer *pk = req_result(r);
    msgpack_pack_map(pk, 2);
    rpc_pack_cstr(pk, "tenants");
    msgpack_pack_object(pk, arr);
    rpc_pack_cstr(pk, "next_cursor");
    const msgpack_object *last =
        arr.via.array.size ? rpc_map_get(&arr.via.array.ptr[arr.via.array.size - 1], "tenant_id")
                           : NULL;
    if (last && arr.via.array.size == st->limit)
        msgpack_pack_uint64(pk, last->via.u64);
    else
        msgpack_pack_nil(pk);
    msgpack_zone_destroy(&zone);
    msgpack_sbuffer_destroy(&sb);
    req_done(r);
}

void h_admin_tenant_list(req *r)
{
    tl_state *st = req_alloc(r, sizeof(*st));
    char *after = req_alloc(r, 24), *limit = req_alloc(r, 16);
    if (!st || !after || !limit) {
        req_fail(r, RPC_INTERNAL, "out of memory");
        return;
    }
    st->limit = rpc_get_uint(req_arg(r, P_TL_LIMIT), LIST_DEFAULT);
    snprintf(after, 24, "%lld", (long long)rpc_get_uint(req_arg(r, P_TL_CURSOR), 0));
    snprintf(limit, 16, "%llu", (unsigned long long)st->limit);
    req_set_state(r, st);
    const char *vals[] = {after, limit, req_server(r)->cfg.index_engine};
    db_query q = {.stmt = sql_def(SQL_ADMIN_TENANT_LIST), DB_VALUES(vals)};
    req_submit(r, -1, &q, 1, tenants_listed);
}

enum {
    P_TU_TENANT_ID,
    P_TU_NAME,
    P_TU_NEW_NAME,
    P_TU_TIER,
    P_TU_INDEX_ENGINE,
    P_TU_CHAT_MODEL,
    P_TU_EMBEDDING,
    P_TU_CANCEL_REEMBED
};
static const char *const engines_or_default[] = {"native", "faiss", "default", NULL};
ENUMS(admin_tenant_update, {"tier", enum_tiers}, {"index_engine", engines_or_default});
PARAMS(admin_tenant_update, {"tenant_id", RPC_T_UINT, RPC_P_NULLABLE, 0, 0},
       {"name", RPC_T_STR, RPC_P_NULLABLE | RPC_P_RANGE, 1, 128},
       {"new_name", RPC_T_STR, RPC_P_NULLABLE | RPC_P_RANGE, 1, 128},
       {"tier", RPC_T_STR, RPC_P_NULLABLE, 0, 0}, {"index_engine", RPC_T_STR, RPC_P_NULLABLE, 0, 0},
       {"chat_model", RPC_T_STR, RPC_P_NULLABLE, 0, 0},
       {"embedding", RPC_T_MAP, RPC_P_NULLABLE, 0, 0},
       {"cancel_reembed", RPC_T_BOOL, RPC_P_NULLABLE, 0, 0});

/* The chat_model parameter of update: NULL when absent; "default" (the server's model),
 * "none" (no model for the tenant) or a model name, which needs a provider configured here.
 * Sets *out to the SQL value and returns 0, or fails the request and returns -1. */
static int chat_model_arg(req *r, const msgpack_object *o, const char **out)
{
    *out = NULL;
    if (!o)
        return 0;
    bool keyword = rpc_str_eq(o, "default") || rpc_str_eq(o, "none");
    if (!keyword && !chat_model_name_ok(o->via.str.ptr, o->via.str.size)) {
        req_fail(r, RPC_INVALID_ARGUMENT,
                 "parameter 'chat_model' must be default, none or a model name (1 to %d "
                 "letters, digits and . _ - : / @ +)",
                 CHAT_MODEL_MAX);
        return -EINVAL;
    }
    if (!keyword && !chat_available()) {
        req_fail(r, RPC_INVALID_ARGUMENT,
                 "parameter 'chat_model': no chat model provider is configured on this server "
                 "(llm_provider)");
        return -EINVAL;
    }
    if (!(*out = req_strdup(r, o))) {
        req_fail(r, RPC_INTERNAL, "out of memory");
        return -EINVAL;
    }
    return 0;
}

typedef struct tu_state {
    const char *tier;   /* the new tier, or NULL */
    const char *engine; /* the new engine choice ("default" clears it), or NULL */
} tu_state;

static void tenant_updated(req *r, const db_result *res)
{
    const tu_state *st = req_state(r);
    server *s = req_server(r);
    if (res->status == DB_OK && PQntuples(res->res[0]) == 1) {
        int64_t id = memrow_i64(res->res[0], 0, 1, 0);
        /* this process learns the new tier and engine at once; others by notification */
        if (st->tier)
            tenancy_tier_changed(s->tenancy, id, tier_parse(st->tier, strlen(st->tier)));
        if (st->engine) {
            const char *e = strcmp(st->engine, "default") == 0 ? s->cfg.index_engine : st->engine;
            tenants_engine_changed(s->tenants, id, index_engine_parse(e, strlen(e)));
        }
    }
    json_row_done(r, res);
}

void h_admin_tenant_update(req *r)
{
    const char *vals[11] = {NULL};
    if (tenant_ref(r, P_TU_TENANT_ID, P_TU_NAME, vals) < 0)
        return;
    const msgpack_object *tier = req_arg(r, P_TU_TIER), *nn = req_arg(r, P_TU_NEW_NAME);
    const msgpack_object *engine = req_arg(r, P_TU_INDEX_ENGINE);
    const msgpack_object *chat = req_arg(r, P_TU_CHAT_MODEL);
    const msgpack_object *emb = req_arg(r, P_TU_EMBEDDING);
    bool cancel = rpc_get_bool(req_arg(r, P_TU_CANCEL_REEMBED), false);
    if (!tier && !nn && !engine && !chat && !emb && !cancel) {
        req_fail(r, RPC_INVALID_ARGUMENT,
                 "admin.tenant.update needs 'tier', 'new_name', 'index_engine', 'chat_model', "
                 "'embedding' or 'cancel_reembed'");
        return;
    }
    /* a new embedding model: re-embedded in the background (server/domain/reembed.h) */
    emb_choice ec;
    if (emb) {
        if (embedding_arg(r, emb, &ec) < 0)
            return;
        char *dim = req_alloc(r, 16);
        if (!dim) {
            req_fail(r, RPC_INTERNAL, "out of memory");
            return;
        }
        snprintf(dim, 16, "%ld", ec.dim);
        vals[7] = ec.provider;
        vals[8] = ec.model;
        vals[9] = dim;
    }
    vals[10] = cancel ? "true" : "false";
    if (chat_model_arg(r, chat, &vals[6]) < 0)
        return;
    if (engine_arg(r, engine, &vals[4]) < 0)
        return;
    vals[2] = nn ? req_strdup(r, nn) : NULL;
    vals[3] = tier ? req_strdup(r, tier) : NULL;
    vals[5] = req_server(r)->cfg.index_engine;
    tu_state *st = req_alloc(r, sizeof(*st));
    if ((nn && !vals[2]) || (tier && !vals[3]) || !st) {
        req_fail(r, RPC_INTERNAL, "out of memory");
        return;
    }
    st->tier = vals[3];
    st->engine = vals[4];
    req_set_state(r, st);
    db_query q = {.stmt = sql_def(SQL_ADMIN_TENANT_UPDATE), DB_VALUES(vals)};
    req_submit(r, -1, &q, 1, tenant_updated);
}

enum { P_TD_TENANT_ID, P_TD_NAME };
PARAMS(admin_tenant_delete, {"tenant_id", RPC_T_UINT, RPC_P_NULLABLE, 0, 0},
       {"name", RPC_T_STR, RPC_P_NULLABLE | RPC_P_RANGE, 1, 128});

static void tenant_deleted(req *r, const db_result *res)
{
    if (res->status != DB_OK) {
        req_fail_db(r, res);
        return;
    }
    int64_t id = memrow_i64(res->res[0], 0, 0, 0);
    /* connections of the tenant fail from their next request; its index goes */
    tenancy_deleted(req_server(r)->tenancy, id);
    msgpack_packer *pk = req_result(r);
    msgpack_pack_map(pk, 2);
    rpc_pack_kv_int(pk, "tenant_id", id);
    rpc_pack_kv_bool(pk, "deleted", true);
    req_done(r);
}

void h_admin_tenant_delete(req *r)
{
    const char *vals[2];
    if (tenant_ref(r, P_TD_TENANT_ID, P_TD_NAME, vals) < 0)
        return;
    db_query q = {.stmt = sql_def(SQL_ADMIN_TENANT_DELETE), DB_VALUES(vals)};
    req_submit(r, -1, &q, 1, tenant_deleted);
}

/* ---- admin.key.create / list / revoke ----------------------------------------------------- */

enum { P_KC_TENANT_ID, P_KC_TENANT, P_KC_NAME };
PARAMS(admin_key_create, {"tenant_id", RPC_T_UINT, RPC_P_NULLABLE, 0, 0},
       {"tenant", RPC_T_STR, RPC_P_NULLABLE | RPC_P_RANGE, 1, 128},
       {"name", RPC_T_STR, RPC_P_REQUIRED | RPC_P_RANGE, 1, 128});

static void key_created(req *r, const db_result *res)
{
    tc_state *st = req_state(r);
    if (res->status != DB_OK) {
        memset(st->key, 0, sizeof(st->key));
        req_fail_db(r, res);
        return;
    }
    const PGresult *pr = res->res[0];
    msgpack_packer *pk = req_result(r);
    msgpack_pack_map(pk, 5);
    rpc_pack_kv_int(pk, "tenant_id", memrow_i64(pr, 0, 0, 0));
    rpc_pack_kv_int(pk, "key_id", memrow_i64(pr, 0, 1, 0));
    rpc_pack_kv_str(pk, "name", req_state(r) ? ((const char *)st + sizeof(*st)) : "");
    rpc_pack_kv_str(pk, "api_key", st->key);
    rpc_pack_kv_int(pk, "created_at", memrow_i64(pr, 0, 2, 0));
    memset(st->key, 0, sizeof(st->key));
    req_done(r);
}

void h_admin_key_create(req *r)
{
    server *s = req_server(r);
    const char *vals[5];
    if (tenant_ref(r, P_KC_TENANT_ID, P_KC_TENANT, vals) < 0)
        return;
    const msgpack_object *name = req_arg(r, P_KC_NAME);
    /* the state holds the key, then the key's name right behind it */
    tc_state *st = req_alloc(r, sizeof(*st) + name->via.str.size + 1);
    if (!st) {
        req_fail(r, RPC_INTERNAL, "out of memory");
        return;
    }
    char *nm = (char *)st + sizeof(*st);
    memcpy(nm, name->via.str.ptr, name->via.str.size);
    nm[name->via.str.size] = '\0';
    char key_id[AUTH_KEY_ID_LEN + 1], *hash_hex = req_alloc(r, 65);
    if (!hash_hex) {
        req_fail(r, RPC_INTERNAL, "out of memory");
        return;
    }
    uint8_t hash[32];
    auth_new_key(st->key, key_id);
    auth_hash(s, st->key, AUTH_KEY_LEN, hash);
    auth_hash_hex(hash, hash_hex);
    char *kid = req_alloc(r, sizeof(key_id));
    if (!kid) {
        req_fail(r, RPC_INTERNAL, "out of memory");
        return;
    }
    memcpy(kid, key_id, sizeof(key_id));
    req_set_state(r, st);
    vals[2] = nm;
    vals[3] = kid;
    vals[4] = hash_hex;
    db_query q = {.stmt = sql_def(SQL_ADMIN_KEY_CREATE), DB_VALUES(vals)};
    req_submit(r, -1, &q, 1, key_created);
}

enum { P_KL_TENANT_ID, P_KL_TENANT };
PARAMS(admin_key_list, {"tenant_id", RPC_T_UINT, RPC_P_NULLABLE, 0, 0},
       {"tenant", RPC_T_STR, RPC_P_NULLABLE | RPC_P_RANGE, 1, 128});

static void keys_listed(req *r, const db_result *res)
{
    if (res->status != DB_OK) {
        req_fail_db(r, res);
        return;
    }
    const PGresult *pr = res->res[0];
    msgpack_packer *pk = req_result(r);
    msgpack_pack_map(pk, 1);
    rpc_pack_cstr(pk, "keys");
    mp_pack_json(pk, PQgetvalue(pr, 0, 0), (size_t)PQgetlength(pr, 0, 0));
    req_done(r);
}

void h_admin_key_list(req *r)
{
    const char *vals[2];
    if (tenant_ref(r, P_KL_TENANT_ID, P_KL_TENANT, vals) < 0)
        return;
    db_query q = {.stmt = sql_def(SQL_ADMIN_KEY_LIST), DB_VALUES(vals)};
    req_submit(r, -1, &q, 1, keys_listed);
}

enum { P_KR_KEY_ID };
PARAMS(admin_key_revoke, {"key_id", RPC_T_UINT, RPC_P_REQUIRED, 0, 0});

static void key_revoked(req *r, const db_result *res)
{
    if (res->status != DB_OK) {
        req_fail_db(r, res);
        return;
    }
    int64_t key = (int64_t)rpc_get_uint(req_arg(r, P_KR_KEY_ID), 0);
    /* connections of this process holding the key fail from their next request */
    tenancy_revoked(req_server(r)->tenancy, key);
    msgpack_packer *pk = req_result(r);
    msgpack_pack_map(pk, 3);
    rpc_pack_kv_int(pk, "key_id", key);
    rpc_pack_kv_int(pk, "tenant_id", memrow_i64(res->res[0], 0, 0, 0));
    rpc_pack_kv_bool(pk, "revoked", true);
    req_done(r);
}

void h_admin_key_revoke(req *r)
{
    char *kid = req_alloc(r, 24);
    if (!kid) {
        req_fail(r, RPC_INTERNAL, "out of memory");
        return;
    }
    snprintf(kid, 24, "%lld", (long long)rpc_get_uint(req_arg(r, P_KR_KEY_ID), 0));
    const char *vals[] = {kid};
    db_query q = {.stmt = sql_def(SQL_ADMIN_KEY_REVOKE), DB_VALUES(vals)};
    req_submit(r, -1, &q, 1, key_revoked);
}

/* ---- tenant.usage (a tenant's own) ------------------------------------------------------- */

NO_PARAMS(tenant_usage);

static void usage_done(req *r, const db_result *res)
{
    if (res->status != DB_OK) {
        req_fail_db(r, res);
        return;
    }
    const PGresult *pr = res->res[0];
    if (PQntuples(pr) != 1) {
        req_fail(r, RPC_NOT_FOUND, "tenant not found");
        return;
    }
    const char *tiername = PQgetvalue(pr, 0, 0);
    int tier = tier_parse(tiername, strlen(tiername));
    const tier_limits *tl = &server_tiers(req_server(r))[tier < 0 ? 0 : tier];
    msgpack_packer *pk = req_result(r);
    msgpack_pack_map(pk, 9);
    rpc_pack_kv_int(pk, "tenant_id", req_auth(r)->tenant_id);
    rpc_pack_kv_str(pk, "name", PQnfields(pr) > 13 ? PQgetvalue(pr, 0, 13) : "");
    rpc_pack_kv_str(pk, "tier", tiername);
    rpc_pack_cstr(pk, "memories");
    msgpack_pack_map(pk, 5);
    rpc_pack_kv_int(pk, "stored", memrow_i64(pr, 0, 1, 0)); /* live: what the limit counts */
    rpc_pack_kv_int(pk, "archived", memrow_i64(pr, 0, 5, 0));
    if (tl->max_memories)
        rpc_pack_kv_int(pk, "limit", tl->max_memories);
    else
        rpc_pack_kv_nil(pk, "limit");
    /* the text of the memories, archived ones and kept versions included: the byte quota */
    rpc_pack_kv_int(pk, "bytes", memrow_i64(pr, 0, 7, 0));
    if (tl->max_memory_bytes)
        rpc_pack_kv_int(pk, "bytes_limit", tl->max_memory_bytes);
    else
        rpc_pack_kv_nil(pk, "bytes_limit");
    rpc_pack_cstr(pk, "queries");
    msgpack_pack_map(pk, 3);
    rpc_pack_kv_int(pk, "today", memrow_i64(pr, 0, 2, 0));
    if (tl->queries_per_day)
        rpc_pack_kv_int(pk, "limit", tl->queries_per_day);
    else
        rpc_pack_kv_nil(pk, "limit");
    rpc_pack_kv_int(pk, "resets_at", memrow_i64(pr, 0, 4, 0));
    rpc_pack_cstr(pk, "sessions");
    msgpack_pack_map(pk, 3);
    rpc_pack_kv_int(pk, "live", memrow_i64(pr, 0, 6, 0)); /* what the cap counts */
    if (tl->max_live_sessions)
        rpc_pack_kv_int(pk, "limit", tl->max_live_sessions);
    else
        rpc_pack_kv_nil(pk, "limit");
    if (tl->session_retention_days)
        rpc_pack_kv_int(pk, "retention_days", tl->session_retention_days);
    else
        rpc_pack_kv_nil(pk, "retention_days");
    rpc_pack_kv_int(pk, "storage_bytes", memrow_i64(pr, 0, 3, 0));
    rpc_pack_cstr(pk, "rate");
    msgpack_pack_map(pk, 2);
    rpc_pack_kv_num(pk, "per_second", tl->rate_per_s);
    rpc_pack_kv_num(pk, "burst", tl->rate_burst);
    /* the chat model's calls of the UTC day (consolidation), against the tier's cap */
    rpc_pack_cstr(pk, "model");
    msgpack_pack_map(pk, 8);
    const char *cm = PQgetisnull(pr, 0, 12) ? NULL : PQgetvalue(pr, 0, 12);
    rpc_pack_kv_str(pk, "chat_model", cm ? cm : chat_available() ? chat_default_model() : "none");
    rpc_pack_kv_int(pk, "calls_today", memrow_i64(pr, 0, 8, 0));
    rpc_pack_kv_int(pk, "tokens_in_today", memrow_i64(pr, 0, 9, 0));
    rpc_pack_kv_int(pk, "tokens_out_today", memrow_i64(pr, 0, 10, 0));
    rpc_pack_kv_int(pk, "tokens_today", memrow_i64(pr, 0, 9, 0) + memrow_i64(pr, 0, 10, 0));
    rpc_pack_kv_num(pk, "cost_usd_today", strtod(PQgetvalue(pr, 0, 11), NULL));
    if (tl->model_tokens_per_day)
        rpc_pack_kv_int(pk, "tokens_limit", tl->model_tokens_per_day);
    else
        rpc_pack_kv_nil(pk, "tokens_limit");
    rpc_pack_kv_int(pk, "resets_at", memrow_i64(pr, 0, 4, 0));
    req_done(r);
}

void h_tenant_usage(req *r)
{
    const char *tid = mp_tenant_param(r);
    if (!tid) {
        req_fail(r, RPC_INTERNAL, "out of memory");
        return;
    }
    const char *vals[] = {tid};
    db_query q = {.stmt = sql_def(SQL_TENANT_USAGE), DB_VALUES(vals)};
    req_submit(r, req_auth(r)->tenant_id, &q, 1, usage_done);
}
