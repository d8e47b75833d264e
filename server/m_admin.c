/* server/m_admin.c: tenant administration (admin connections only). */
#include <stdio.h>
#include <string.h>

#include "auth.h"
#include "embed.h"
#include "embedder.h"
#include "handlers.h"
#include "memrow.h"
#include "sql.h"

/* ---- admin.tenant.create ------------------------------------------------------------- */

enum { P_TC_NAME, P_TC_TIER, P_TC_EMBEDDING };
PARAMS(admin_tenant_create, {"name", RPC_T_STR, RPC_P_REQUIRED | RPC_P_RANGE, 1, 128},
       {"tier", RPC_T_STR, RPC_P_REQUIRED, 0, 0}, {"embedding", RPC_T_MAP, RPC_P_NULLABLE, 0, 0});

typedef struct tc_state {
    char key[AUTH_KEY_LEN + 1];
    const char *name;
} tc_state;

static void tenant_created(req *r, const db_result *res)
{
    tc_state *st = req_state(r);
    if (res->status == DB_ERROR && res->sqlstate && strcmp(res->sqlstate, "23505") == 0) {
        req_fail(r, RPC_ALREADY_EXISTS, "a tenant named '%s' already exists", st->name);
        return;
    }
    if (res->status != DB_OK) {
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

void h_admin_tenant_create(req *r)
{
    server *s = req_server(r);
    const msgpack_object *tier = req_arg(r, P_TC_TIER);
    if (tier_parse(tier->via.str.ptr, tier->via.str.size) < 0) {
        req_fail(r, RPC_INVALID_ARGUMENT, "parameter 'tier' must be free, standard or premium");
        return;
    }
    const char *provider = "builtin";
    const char *model = "";
    long dim = s->cfg.embed_dim;
    const msgpack_object *emb = req_arg(r, P_TC_EMBEDDING);
    char err[256];
    if (emb) {
        for (uint32_t i = 0; i < emb->via.map.size; i++) {
            const msgpack_object_kv *kv = &emb->via.map.ptr[i];
            if (rpc_str_eq(&kv->key, "provider")) {
                if (rpc_str_eq(&kv->val, "builtin")) {
                    provider = "builtin";
                } else if (rpc_str_eq(&kv->val, "openai")) {
                    if (!embedder_available("openai")) {
                        req_fail(r, RPC_INVALID_ARGUMENT,
                                 "embedding provider 'openai' is not configured on this server "
                                 "(openai_url)");
                        return;
                    }
                    provider = "openai";
                } else {
                    req_fail(r, RPC_INVALID_ARGUMENT,
                             "parameter 'embedding.provider' must be builtin or openai");
                    return;
                }
            } else if (rpc_str_eq(&kv->key, "dim")) {
                if (rpc_check_value(&kv->val, RPC_T_UINT, RPC_P_RANGE, EMBED_MIN_DIM, EMBED_MAX_DIM,
                                    "embedding.dim", err, sizeof(err)) != 0) {
                    req_fail(r, RPC_INVALID_ARGUMENT, "%s", err);
                    return;
                }
                dim = (long)kv->val.via.u64;
            } else {
                req_fail(r, RPC_INVALID_ARGUMENT, "unknown parameter 'embedding.%.*s'",
                         (int)(kv->key.type == MSGPACK_OBJECT_STR ? kv->key.via.str.size : 1),
                         kv->key.type == MSGPACK_OBJECT_STR ? kv->key.via.str.ptr : "?");
                return;
            }
        }
    }
    if (strcmp(provider, "openai") == 0) {
        /* the provider's vectors have one dimension; a tenant cannot choose another */
        bool dim_given = false;
        for (uint32_t i = 0; emb && i < emb->via.map.size; i++)
            dim_given = dim_given || rpc_str_eq(&emb->via.map.ptr[i].key, "dim");
        if (dim_given && dim != s->cfg.openai_dim) {
            req_fail(r, RPC_INVALID_ARGUMENT,
                     "parameter 'embedding.dim' must be %d for the openai provider",
                     s->cfg.openai_dim);
            return;
        }
        dim = s->cfg.openai_dim;
        model = s->cfg.openai_model;
    }
    tc_state *st = req_alloc(r, sizeof(*st));
    char *name = req_strdup(r, req_arg(r, P_TC_NAME));
    char *tiername = req_strdup(r, tier);
    if (!st || !name || !tiername) {
        req_fail(r, RPC_INTERNAL, "out of memory");
        return;
    }
    st->name = name;
    char key_id[AUTH_KEY_ID_LEN + 1], hash_hex[65], dimtxt[16];
    uint8_t hash[32];
    auth_new_key(st->key, key_id);
    auth_hash(s, st->key, AUTH_KEY_LEN, hash);
    auth_hash_hex(hash, hash_hex);
    snprintf(dimtxt, sizeof(dimtxt), "%ld", dim);
    req_set_state(r, st);
    const char *vals[] = {name, tiername, provider, model, dimtxt, "default", key_id, hash_hex};
    db_query q = {.stmt = sql_name(SQL_TENANT_CREATE), .nparams = 8, .values = vals};
    req_submit(r, -1, &q, 1, tenant_created);
}
