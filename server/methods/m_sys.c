/* server/methods/m_sys.c: ping, auth and methods. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "auth.h"
#include "handlers.h"
#include "json.h"
#include "log.h"
#include "memrow.h"
#include "methods.h"
#include "results.h"
#include "sql.h"
#include "tenancy.h"
#include "tiers.h"

/* ---- ping ---------------------------------------------------------------------------- */

NO_PARAMS(ping);

void h_ping(req *r)
{
    msgpack_packer *pk = req_result(r);
    rpc_pack_cstr(pk, "pong");
    req_done(r);
}

/* ---- auth ---------------------------------------------------------------------------- */

enum { P_AUTH_KEY };
PARAMS(auth, {"api_key", RPC_T_STR, RPC_P_REQUIRED | RPC_P_RANGE, 1, 512});

typedef struct auth_state {
    uint8_t hash[32];
} auth_state;

static void touch_done(void *arg, const db_result *res)
{
    if (res->status != DB_OK)
        log_debug("key last_used_at not updated: %s", res->message ? res->message : "?");
}

static void auth_done(req *r, const db_result *res)
{
    server *s = req_server(r);
    auth_state *st = req_state(r);
    if (res->status != DB_OK) {
        req_fail_db(r, res);
        return;
    }
    const PGresult *pr = res->res[0];
    if (PQntuples(pr) != 1) {
        req_fail(r, RPC_UNAUTHENTICATED, "invalid API key");
        return;
    }
    /* key_hash arrives as bytea text: \x + 64 hex digits */
    const char *hex = PQgetvalue(pr, 0, 2);
    uint8_t stored[32];
    bool ok = strlen(hex) == 66 && hex[0] == '\\' && hex[1] == 'x';
    for (int i = 0; ok && i < 32; i++) {
        unsigned v;
        ok = sscanf(hex + 2 + 2 * i, "%2x", &v) == 1;
        stored[i] = (uint8_t)v;
    }
    if (!ok || !auth_equal(stored, st->hash)) {
        req_fail(r, RPC_UNAUTHENTICATED, "invalid API key");
        return;
    }
    const char *tier = PQgetvalue(pr, 0, 3);
    conn_auth a = {0};
    a.authenticated = true;
    a.key_id = memrow_i64_of(pr, 0, 0, 0, ROWERR_API_KEYS);
    a.tenant_id = memrow_i64_of(pr, 0, 1, 0, ROWERR_API_KEYS);
    a.tier = tier_parse(tier, strlen(tier));
    int64_t dim = memrow_i64_of(pr, 0, 5, 0, ROWERR_API_KEYS);
    if (a.tier < 0)
        rowerr_report(ROWERR_API_KEYS, PQfname(pr, 3), "not a tier");
    if (a.key_id <= 0 || a.tenant_id <= 0 || a.tier < 0 || dim <= 0 || dim > UINT32_MAX) {
        /* a key whose record cannot be read grants nothing (reported through rowerr) */
        req_fail(r, RPC_INTERNAL, "the key's record is unreadable");
        return;
    }
    a.dim = (uint32_t)dim;
    snprintf(a.provider, sizeof(a.provider), "%s", PQgetvalue(pr, 0, 6));
    a.embed_gen = PQnfields(pr) > 7 ? memrow_i64_of(pr, 0, 7, 0, ROWERR_API_KEYS) : 0;
    if (req_auth(r)->reserved) {
        /* the slots past max_connections are the admin's */
        req_close_after(r);
        req_fail(r, RPC_UNAVAILABLE,
                 "connection slots are full (max_connections); this one is kept for the admin "
                 "key, retry later");
        return;
    }
    /* the tier's connections per tenant, in this process: a tenant re-authenticating as
     * itself on this connection keeps its place */
    const tier_limits *tl = &server_tiers(s)[a.tier];
    const conn_auth *was = req_auth(r);
    bool same = was->authenticated && !was->admin && was->tenant_id == a.tenant_id;
    int64_t in_use = 0;
    if (!tenancy_key_claim(s->tenancy, a.key_id, a.tenant_id, a.tier,
                           same ? 0 : tl->max_connections, &in_use)) {
        rpc_detail d[4] = {{"limit", RPC_D_INT, {.i = tl->max_connections}},
                           {"usage", RPC_D_INT, {.i = in_use}},
                           {"requested", RPC_D_INT, {.i = 1}},
                           {"quota", RPC_D_STR, {.s = "connections"}}};
        req_fail_details(r, RPC_QUOTA_EXCEEDED, d, 4,
                         "the tenant has %lld connections open to this server, the most its %s "
                         "tier allows (%s_max_connections)",
                         (long long)in_use, tier_name(a.tier), tier_name(a.tier));
        return;
    }
    a.claimed = true;
    /* this process learns the tenant's model (or, newer than it knew, that a swap it missed
     * happened: the tenant's index goes) */
    tenancy_embedding_changed(s->tenancy, a.tenant_id, a.embed_gen, a.provider, a.dim, false);
    req_set_auth(r, &a);
    /* last_used_at: written after the answer, nothing waits for it */
    char *kid = req_alloc(r, 24);
    if (kid) {
        snprintf(kid, 24, "%lld", (long long)a.key_id);
        const char *kv[] = {kid};
        db_query tq = {.stmt = sql_def(SQL_KEY_TOUCH), DB_VALUES(kv)};
        db_submit(req_db(r), -1, &tq, 1, touch_done, NULL);
    }
    msgpack_packer *pk = req_result(r);
    msgpack_pack_map(pk, 3);
    rpc_pack_kv_int(pk, "tenant_id", a.tenant_id);
    rpc_pack_kv_str(pk, "tier", tier_name(a.tier));
    rpc_pack_kv_str(pk, "name", PQgetvalue(pr, 0, 4));
    req_done(r);
}

void h_auth(req *r)
{
    const msgpack_object *key = req_arg(r, P_AUTH_KEY);
    const char *k = key->via.str.ptr;
    size_t n = key->via.str.size;
    server *s = req_server(r);
    if (auth_is_admin(s, k, n)) {
        /* the key alone is not enough here: the admin must also hold a certificate of
         * tls_ca_file (the connection presented it in the handshake) */
        if (s->cfg.tls_admin_require_client_cert && !req_tls_client_cert(r)) {
            log_info("auth: the admin key without a client certificate, refused "
                     "(tls_admin_require_client_cert)");
            req_fail(r, RPC_UNAUTHENTICATED,
                     "the admin key needs a TLS client certificate on this server");
            return;
        }
        conn_auth a = {.authenticated = true, .admin = true, .tenant_id = -1};
        req_set_auth(r, &a);
        msgpack_packer *pk = req_result(r);
        msgpack_pack_map(pk, 1);
        rpc_pack_kv_bool(pk, "admin", true);
        req_done(r);
        return;
    }
    char key_id[AUTH_KEY_ID_LEN + 1];
    if (!auth_key_id(k, n, key_id)) {
        req_fail(r, RPC_UNAUTHENTICATED, "invalid API key");
        return;
    }
    auth_state *st = req_alloc(r, sizeof(*st));
    if (!st) {
        req_fail(r, RPC_INTERNAL, "out of memory");
        return;
    }
    auth_hash(s, k, n, st->hash);
    req_set_state(r, st);
    const char *vals[] = {key_id};
    db_query q = {.stmt = sql_def(SQL_AUTH_LOOKUP), DB_VALUES(vals)};
    req_submit(r, -1, &q, 1, auth_done);
}

/* ---- methods --------------------------------------------------------------------------- */

NO_PARAMS(methods);

static const char *type_name(rpc_type t)
{
    switch (t) {
    case RPC_T_ANY:
        return "any";
    case RPC_T_BOOL:
        return "bool";
    case RPC_T_UINT:
        return "uint";
    case RPC_T_INT:
        return "int";
    case RPC_T_NUM:
        return "number";
    case RPC_T_STR:
        return "string";
    case RPC_T_BIN:
        return "bin";
    case RPC_T_ARRAY:
        return "array";
    case RPC_T_MAP:
        return "map";
    case RPC_T_VECTOR:
        return "vector";
    case RPC_T_STR_ARRAY:
        return "string[]";
    case RPC_T_UINT_ARRAY:
        return "uint[]";
    case RPC_T_TIME:
        return "time";
    }
    return "any";
}

/* The result schema of method name with its components expanded (results_expand), as
 * JSON text in *out (the caller's; empty when none is declared). Returns 0, -ENOMEM or
 * -EINVAL (a table that does not parse: a bug the unit and integration tests catch). */
static int result_schema_text(const char *name, ubuf *out)
{
    out->len = 0;
    const char *schema = results_find(name);
    if (!schema)
        return 0;
    int rc = results_expand(schema, out);
    if (rc < 0)
        return rc;
    char err[96];
    return json_to_msgpack(out->data, out->len, 16, NULL, err, sizeof(err)) == 0 ? 0 : -EINVAL;
}

void h_methods(req *r)
{
    /* every result schema expanded and checked before anything is packed */
    ubuf *texts = req_alloc(r, methods_count * sizeof(*texts));
    if (!texts) {
        req_fail(r, RPC_INTERNAL, "out of memory");
        return;
    }
    memset(texts, 0, methods_count * sizeof(*texts));
    for (size_t i = 0; i < methods_count; i++) {
        if (result_schema_text(methods_table[i].name, &texts[i]) < 0) {
            log_error("the result schema of %s does not expand", methods_table[i].name);
            for (size_t j = 0; j <= i; j++)
                ubuf_fini(&texts[j]);
            req_fail(r, RPC_INTERNAL, "result schema table broken");
            return;
        }
    }
    msgpack_packer *pk = req_result(r);
    msgpack_pack_array(pk, (uint32_t)methods_count);
    for (size_t i = 0; i < methods_count; i++) {
        const method_def *m = &methods_table[i];
        msgpack_pack_map(pk, texts[i].len ? 4 : 3);
        rpc_pack_kv_str(pk, "name", m->name);
        rpc_pack_cstr(pk, "flags");
        static const struct {
            unsigned bit;
            const char *name;
        } names[] = {{M_PUBLIC, "public"}, {M_ADMIN, "admin"}, {M_TENANT, "tenant"},
                     {M_QUERY, "query"},   {M_WRITE, "write"}, {M_AUTH, "auth"}};
        uint32_t nflags = 0;
        for (size_t f = 0; f < sizeof(names) / sizeof(names[0]); f++)
            nflags += (m->flags & names[f].bit) != 0;
        msgpack_pack_array(pk, nflags);
        for (size_t f = 0; f < sizeof(names) / sizeof(names[0]); f++)
            if (m->flags & names[f].bit)
                rpc_pack_cstr(pk, names[f].name);
        /* an alias is listed with the parameter it names ("aliases"), not as one */
        uint32_t np = 0;
        for (size_t k = 0; k < m->nparams; k++)
            np += !(m->params[k].flags & RPC_P_ALIAS);
        rpc_pack_cstr(pk, "params");
        msgpack_pack_array(pk, np);
        for (size_t k = 0; k < m->nparams; k++) {
            const rpc_param *p = &m->params[k];
            if (p->flags & RPC_P_ALIAS)
                continue;
            uint32_t na = 0;
            while (k + 1 + na < m->nparams && (m->params[k + 1 + na].flags & RPC_P_ALIAS))
                na++;
            const char *const *words = hooks_param_enum(m, k);
            msgpack_pack_map(pk, 3 + (na ? 1 : 0) + (words ? 1 : 0));
            rpc_pack_kv_str(pk, "name", p->name);
            rpc_pack_kv_str(pk, "type", type_name(p->type));
            rpc_pack_kv_bool(pk, "required", (p->flags & RPC_P_REQUIRED) != 0);
            if (words) { /* the strings it takes (each of its strings, for a string[]) */
                uint32_t nw = 0;
                while (words[nw])
                    nw++;
                rpc_pack_cstr(pk, "enum");
                msgpack_pack_array(pk, nw);
                for (uint32_t w = 0; w < nw; w++)
                    rpc_pack_cstr(pk, words[w]);
            }
            if (na) {
                rpc_pack_cstr(pk, "aliases");
                msgpack_pack_array(pk, na);
                for (uint32_t a = 1; a <= na; a++)
                    rpc_pack_cstr(pk, m->params[k + a].name);
            }
        }
        if (texts[i].len) {
            /* checked above: cannot fail but by a packer that remembers its own failure */
            rpc_pack_cstr(pk, "result");
            (void)json_to_msgpack(texts[i].data, texts[i].len, 16, pk, NULL, 0);
        }
        ubuf_fini(&texts[i]);
    }
    req_done(r);
}
