/* tests/unit/test_m_sys.c: server/methods/m_sys.c against a fake request and a fake pool
 * (tests/fakes/fake_req.h): ping, methods (the table as clients see it: flags, parameters,
 * aliases) and auth (the admin key and its client certificate, the tenant key's shape, the
 * lookup statement, the hash check, the identity it sets, the tier's connection cap, the
 * key's last use written after the answer, and the failures of its job).
 */
#include <stdint.h>
#include <string.h>

#include "auth.h"
#include "check.h"
#include "fake_req.h"
#include "methods.h"
#include "pgres.h"
#include "tenancy.h"

static fr_env env;

/* ---- ping and methods ------------------------------------------------------------------- */

static void test_ping(void)
{
    req *r = fr_call(&env, "ping", NULL);
    CHECK(r->ends == 1 && r->done);
    CHECK(fr_is_str(r->result, "pong"));
    CHECK(fr_jobs() == 0);
    fr_free(r);
    /* it takes no arguments: the binder refuses any */
    r = fr_call(&env, "ping", "{\"x\": 1}");
    CHECK(r->bind_failed && r->code == RPC_INVALID_ARGUMENT);
    CHECK(fr_field(r) && strcmp(fr_field(r), "x") == 0);
    fr_free(r);
}

/* The entry of method name in the answer of methods, or NULL. */
static const msgpack_object *method_entry(const req *r, const char *name)
{
    for (long i = 0; i < fr_len(r->result); i++) {
        const msgpack_object *m = &r->result->via.array.ptr[i];
        if (fr_is_str(rpc_map_get(m, "name"), name))
            return m;
    }
    return NULL;
}

/* Whether the string array a holds s. */
static bool has_str(const msgpack_object *a, const char *s)
{
    for (long i = 0; i < fr_len(a); i++)
        if (fr_is_str(&a->via.array.ptr[i], s))
            return true;
    return false;
}

static void test_methods(void)
{
    req *r = fr_call(&env, "methods", NULL);
    CHECK(r->done && r->ends == 1);
    CHECK_MSG(fr_len(r->result) == (long)methods_count, "%ld methods listed of %zu",
              fr_len(r->result), methods_count);
    /* in table order (sorted by name), every one named */
    for (size_t i = 0; i < methods_count && (long)i < fr_len(r->result); i++)
        CHECK(fr_is_str(rpc_map_get(&r->result->via.array.ptr[i], "name"), methods_table[i].name));
    const msgpack_object *auth = method_entry(r, "auth");
    const msgpack_object *flags = rpc_map_get(auth, "flags");
    CHECK(fr_len(flags) == 2 && has_str(flags, "public") && has_str(flags, "auth"));
    const msgpack_object *p = rpc_map_get(auth, "params");
    CHECK(fr_len(p) == 1);
    CHECK(fr_len(p) == 1 && fr_is_str(rpc_map_get(&p->via.array.ptr[0], "name"), "api_key"));
    CHECK(fr_len(p) == 1 && fr_is_str(rpc_map_get(&p->via.array.ptr[0], "type"), "string"));
    CHECK(fr_len(p) == 1 && fr_is_bool(rpc_map_get(&p->via.array.ptr[0], "required"), true));
    /* memory.store: type is listed with its alias, the alias is not a parameter of its own */
    const msgpack_object *store = method_entry(r, "memory.store");
    flags = rpc_map_get(store, "flags");
    CHECK(fr_len(flags) == 2 && has_str(flags, "tenant") && has_str(flags, "write"));
    p = rpc_map_get(store, "params");
    bool type_seen = false, alias_listed = false;
    for (long i = 0; i < fr_len(p); i++) {
        const msgpack_object *e = &p->via.array.ptr[i];
        if (fr_is_str(rpc_map_get(e, "name"), "memory_type"))
            alias_listed = true;
        if (fr_is_str(rpc_map_get(e, "name"), "type")) {
            type_seen = true;
            const msgpack_object *al = rpc_map_get(e, "aliases");
            CHECK(fr_len(al) == 1 && has_str(al, "memory_type"));
            CHECK(fr_is_bool(rpc_map_get(e, "required"), true));
        }
        if (fr_is_str(rpc_map_get(e, "name"), "embedding"))
            CHECK(fr_is_str(rpc_map_get(e, "type"), "vector"));
        if (fr_is_str(rpc_map_get(e, "name"), "importance"))
            CHECK(fr_is_str(rpc_map_get(e, "type"), "number"));
    }
    CHECK(type_seen && !alias_listed);
    /* the query and admin flags */
    CHECK(has_str(rpc_map_get(method_entry(r, "memory.search"), "flags"), "query"));
    CHECK(has_str(rpc_map_get(method_entry(r, "admin.key.create"), "flags"), "admin"));
    CHECK(fr_len(rpc_map_get(method_entry(r, "tenant.usage"), "params")) == 0);
    fr_free(r);
}

/* ---- auth ------------------------------------------------------------------------------ */

#define ADMIN_KEY "ega_thisistheadminkeyofthetests0123456789"

/* The auth_lookup row of a key: key_id, tenant_id, key_hash (bytea text), tier, name, dim,
 * provider. */
static PGresult *lookup_row(const char *key, const char *tier, const char *dim)
{
    uint8_t h[32];
    char hex[65], bytea[80], row[400];
    auth_hash(&env.srv, key, strlen(key), h);
    auth_hash_hex(h, hex);
    snprintf(bytea, sizeof(bytea), "\\x%s", hex);
    snprintf(row, sizeof(row), "41|7|%s|%s|my key|%s|builtin", bytea, tier, dim);
    return fr_rows("key_id|tenant_id|key_hash|tier|name|dim|provider", 1, row);
}

static void test_auth_admin(void)
{
    conn_auth none = {0};
    /* the binder's refusal of a key reveals nothing: unauthenticated, not invalid_argument */
    req *r = fr_call_as(&env, &none, "auth", "{}");
    CHECK(r->bind_failed && r->code == RPC_UNAUTHENTICATED);
    CHECK_STR_CONTAINS(r->msg, "invalid API key");
    fr_free(r);

    auth_hash(&env.srv, ADMIN_KEY, strlen(ADMIN_KEY), env.srv.admin_hash);
    env.srv.have_admin = true;
    r = fr_call_as(&env, &none, "auth", "{\"api_key\": \"" ADMIN_KEY "\"}");
    CHECK(r->done && r->ends == 1);
    CHECK(fr_is_bool(fr_get(r, "admin"), true));
    CHECK(r->set_auth == 1 && r->new_auth.admin && r->new_auth.authenticated &&
          r->new_auth.tenant_id == -1);
    CHECK(fr_jobs() == 0); /* the admin key is checked in memory */
    fr_free(r);

    /* a key one character off is a tenant key's lookup, which its shape refuses */
    r = fr_call_as(&env, &none, "auth", "{\"api_key\": \"" ADMIN_KEY "x\"}");
    CHECK(r->code == RPC_UNAUTHENTICATED && r->set_auth == 0 && fr_jobs() == 0);
    fr_free(r);

    /* with tls_admin_require_client_cert the key alone is refused ... */
    env.srv.cfg.tls_admin_require_client_cert = true;
    r = fr_call_as(&env, &none, "auth", "{\"api_key\": \"" ADMIN_KEY "\"}");
    CHECK(r->code == RPC_UNAUTHENTICATED && r->set_auth == 0);
    CHECK_STR_CONTAINS(r->msg, "client certificate");
    fr_free(r);
    /* ... and passes with a verified certificate */
    env.tls_client_cert = true;
    r = fr_call_as(&env, &none, "auth", "{\"api_key\": \"" ADMIN_KEY "\"}");
    CHECK(r->done && r->new_auth.admin);
    fr_free(r);
    env.tls_client_cert = false;
    env.srv.cfg.tls_admin_require_client_cert = false;
    env.srv.have_admin = false;
}

static void test_auth_tenant(void)
{
    conn_auth none = {0};
    char key[AUTH_KEY_LEN + 1], id[AUTH_KEY_ID_LEN + 1], args[200];
    auth_new_key(key, id);
    snprintf(args, sizeof(args), "{\"api_key\": \"%s\"}", key);

    /* not the shape of a tenant key: refused without a lookup */
    req *r = fr_call_as(&env, &none, "auth", "{\"api_key\": \"egk_short\"}");
    CHECK(r->code == RPC_UNAUTHENTICATED && fr_jobs() == 0);
    fr_free(r);

    /* the lookup by the key's id, with no tenant bound (the key says which) */
    r = fr_call_as(&env, &none, "auth", args);
    CHECK(r->ends == 0 && fr_jobs() == 1);
    fr_job *j = fr_take();
    CHECK(j && j->kind == FR_SUBMIT && j->rls == -1 && j->nq == 1);
    CHECK(j && strcmp(j->q[0].name, "auth_lookup") == 0);
    CHECK(j && fr_val(j, 0, 0) && strcmp(fr_val(j, 0, 0), id) == 0);
    /* the full key is never a parameter */
    for (size_t i = 0; j && i < j->q[0].nvalues; i++)
        CHECK(!fr_val(j, 0, i) || !strstr(fr_val(j, 0, i), key + 17));
    fr_answer1(j, lookup_row(key, "premium", "384"));
    CHECK(r->done && r->ends == 1);
    CHECK(fr_is_int(fr_get(r, "tenant_id"), 7));
    CHECK(fr_is_str(fr_get(r, "tier"), "premium"));
    CHECK(fr_is_str(fr_get(r, "name"), "my key"));
    CHECK(r->set_auth == 1 && r->new_auth.authenticated && !r->new_auth.admin);
    CHECK(r->new_auth.tenant_id == 7 && r->new_auth.key_id == 41);
    CHECK(r->new_auth.tier == TIER_PREMIUM && r->new_auth.dim == 384);
    CHECK(strcmp(r->new_auth.provider, "builtin") == 0 && r->new_auth.claimed);
    /* last_used_at goes as a job of its own, after the answer, on the worker's pool */
    CHECK(fr_jobs() == 1);
    j = fr_take();
    CHECK(j && j->kind == FR_POOL && strcmp(j->q[0].name, "key_touch") == 0);
    CHECK(j && fr_val(j, 0, 0) && strcmp(fr_val(j, 0, 0), "41") == 0);
    fr_answer_error(j, "XX000", "touch failed", NULL); /* nothing waits for it */
    fr_free(r);
    tenancy_key_released(env.srv.tenancy, 41);

    /* no such key; a hash that does not match; an unreadable record */
    r = fr_call_as(&env, &none, "auth", args);
    fr_answer1(fr_take(), fr_rows("key_id|tenant_id|key_hash|tier|name|dim|provider", 0));
    CHECK(r->code == RPC_UNAUTHENTICATED && r->set_auth == 0);
    fr_free(r);
    char other[AUTH_KEY_LEN + 1], oid[AUTH_KEY_ID_LEN + 1];
    auth_new_key(other, oid);
    r = fr_call_as(&env, &none, "auth", args);
    fr_answer1(fr_take(), lookup_row(other, "free", "8"));
    CHECK(r->code == RPC_UNAUTHENTICATED && r->set_auth == 0);
    CHECK(fr_jobs() == 0);
    fr_free(r);
    r = fr_call_as(&env, &none, "auth", args);
    fr_answer1(fr_take(), lookup_row(key, "gold", "8"));
    CHECK(r->code == RPC_INTERNAL && r->set_auth == 0);
    fr_free(r);
    r = fr_call_as(&env, &none, "auth", args);
    fr_answer1(fr_take(), lookup_row(key, "free", "0"));
    CHECK(r->code == RPC_INTERNAL && r->set_auth == 0);
    fr_free(r);

    /* the job failed: passed to req_fail_db as it came */
    r = fr_call_as(&env, &none, "auth", args);
    fr_answer_unavailable(fr_take(), "no connection");
    CHECK(r->fail_db && r->db_status == DB_UNAVAILABLE && r->ends == 1 && r->set_auth == 0);
    fr_free(r);

    /* a connection accepted into the admin's reserved slots: a tenant key is refused and
     * the connection closes */
    conn_auth reserved = {.reserved = true};
    r = fr_call_as(&env, &reserved, "auth", args);
    fr_answer1(fr_take(), lookup_row(key, "free", "8"));
    CHECK(r->code == RPC_UNAVAILABLE && r->close_after && r->set_auth == 0);
    fr_free(r);
    fr_clear_jobs();
}

static void test_auth_connection_cap(void)
{
    conn_auth none = {0};
    char key[AUTH_KEY_LEN + 1], id[AUTH_KEY_ID_LEN + 1], args[200];
    auth_new_key(key, id);
    snprintf(args, sizeof(args), "{\"api_key\": \"%s\"}", key);
    tier_limits *tl = &env.tiers[TIER_FREE];
    int64_t saved = tl->max_connections;
    tl->max_connections = 1;
    /* the first connection takes the tier's one place */
    req *a = fr_call_as(&env, &none, "auth", args);
    fr_answer1(fr_take(), lookup_row(key, "free", "8"));
    CHECK(a->done && a->new_auth.claimed);
    fr_clear_jobs();
    /* a second is refused with the numbers */
    req *b = fr_call_as(&env, &none, "auth", args);
    fr_answer1(fr_take(), lookup_row(key, "free", "8"));
    CHECK(b->code == RPC_QUOTA_EXCEEDED && b->set_auth == 0);
    CHECK(fr_is_int(fr_get(b, "limit"), 1) && fr_is_int(fr_get(b, "usage"), 1));
    CHECK(fr_is_int(fr_get(b, "requested"), 1));
    CHECK(fr_is_str(fr_get(b, "quota"), "connections"));
    CHECK_STR_CONTAINS(b->msg, "free_max_connections");
    fr_free(b);
    /* the first connection authenticating again as the same tenant keeps its place */
    req *c = fr_call_as(&env, &a->new_auth, "auth", args);
    fr_answer1(fr_take(), lookup_row(key, "free", "8"));
    CHECK(c->done);
    fr_clear_jobs();
    fr_free(c);
    fr_free(a);
    tenancy_key_released(env.srv.tenancy, 41);
    tenancy_key_released(env.srv.tenancy, 41);
    tl->max_connections = saved;
}

int main(void)
{
    if (fr_env_init(&env, NULL, false) < 0) {
        fprintf(stderr, "cannot set up the test server\n");
        return 1;
    }
    if (auth_init() < 0)
        return 1;
    test_ping();
    test_methods();
    test_auth_admin();
    test_auth_tenant();
    test_auth_connection_cap();
    fr_env_fini(&env);
    CHECK_RETURN();
}
