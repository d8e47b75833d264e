/* tests/fakes/fake_hooks.c: a method table and hooks for the network layer's tests (see
 * fake_hooks.h). */
#include "fake_hooks.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "req.h"
#include "tiers.h"
#include "worker.h"

const db_stmt_def fake_hooks_stmt = {"fake_hooks", "SELECT $1::text", 1};

static fake_hooks_state st = {.admit_tier = -1};

/* `later` requests waiting for fake_hooks_release, oldest first. */
#define LATER_MAX 1024
static req *later[LATER_MAX];
static size_t nlater;

fake_hooks_state *fake_hooks_get(void)
{
    return &st;
}

void fake_hooks_reset(void)
{
    st = (fake_hooks_state){.admit_tier = -1};
}

/* ---- methods --------------------------------------------------------------------------- */

static const rpc_param p_none[] = {{NULL, RPC_T_ANY, 0, 0, 0}};
static const size_t np_none = 0;

static void h_admin_only(req *r)
{
    st.calls++;
    rpc_pack_cstr(req_result(r), "admin");
    req_done(r);
}

/* the parameter the real auth takes (methods/m_sys.c), which the HTTP port sends */
static const rpc_param p_auth[] = {{"api_key", RPC_T_STR, RPC_P_REQUIRED | RPC_P_RANGE, 1, 64}};
static const size_t np_auth = 1;

/* Sets r's identity from key ("admin", "tenant:N"); false when key names none. */
static bool auth_as(req *r, const char *key)
{
    conn_auth a = {.authenticated = true};
    long long t;
    if (strcmp(key, "admin") == 0) {
        a.admin = true;
        a.tenant_id = -1;
    } else if (sscanf(key, "tenant:%lld", &t) == 1 && t > 0) {
        a.tenant_id = t;
        a.key_id = t * 10;
        a.tier = TIER_STANDARD;
        a.dim = 8;
    } else {
        return false;
    }
    req_set_auth(r, &a);
    msgpack_packer *pk = req_result(r);
    msgpack_pack_map(pk, 1);
    rpc_pack_kv_bool(pk, "ok", true);
    req_done(r);
    return true;
}

static void auth_db_done(req *r, const db_result *res)
{
    if (res->status != DB_OK) {
        req_fail_db(r, res);
        return;
    }
    if (!auth_as(r, req_state(r)))
        req_fail(r, RPC_UNAUTHENTICATED, "invalid API key");
}

static void h_auth(req *r)
{
    st.calls++;
    st.auths++;
    char *key = req_strdup(r, req_arg(r, 0));
    if (!key) {
        req_fail(r, RPC_INTERNAL, "out of memory");
        return;
    }
    if (strncmp(key, "db:", 3) == 0) {
        req_set_state(r, key + 3);
        const char *v[] = {key};
        db_query q = {.stmt = &fake_hooks_stmt, DB_VALUES(v)};
        req_submit(r, -1, &q, 1, auth_db_done);
        return;
    }
    if (!auth_as(r, key))
        req_fail(r, RPC_UNAUTHENTICATED, "invalid API key");
}

static const rpc_param p_big[] = {
    {"bytes", RPC_T_UINT, RPC_P_REQUIRED | RPC_P_RANGE, 0, 1 << 20},
    {"fill", RPC_T_UINT, RPC_P_RANGE, 0, 255},
};
static const size_t np_big = 2;

static void h_big(req *r)
{
    st.calls++;
    size_t n = (size_t)rpc_get_uint(req_arg(r, 0), 0);
    int fill = (int)rpc_get_uint(req_arg(r, 1), 'x');
    char *b = malloc(n ? n : 1);
    if (!b) {
        req_fail(r, RPC_INTERNAL, "out of memory");
        return;
    }
    memset(b, fill, n);
    msgpack_packer *pk = req_result(r);
    msgpack_pack_bin(pk, n);
    msgpack_pack_bin_body(pk, b, n);
    free(b);
    req_done(r);
}

static const rpc_param p_echo[] = {{"value", RPC_T_ANY, 0, 0, 0}};
static const size_t np_echo = 1;

static void h_echo(req *r)
{
    st.calls++;
    st.echoes++;
    const msgpack_object *v = req_arg(r, 0);
    msgpack_packer *pk = req_result(r);
    if (v)
        msgpack_pack_object(pk, *v);
    else
        msgpack_pack_nil(pk);
    req_done(r);
}

static const rpc_param p_later[] = {{"tag", RPC_T_ANY, 0, 0, 0}};
static const size_t np_later = 1;

static void h_later(req *r)
{
    st.calls++;
    if (nlater == LATER_MAX) {
        req_fail(r, RPC_UNAVAILABLE, "too many waiting");
        return;
    }
    later[nlater++] = r;
}

size_t fake_hooks_release(size_t n, bool newest_first)
{
    size_t done = 0;
    while (done < n && nlater > 0) {
        req *r;
        if (newest_first) {
            r = later[--nlater];
        } else {
            r = later[0];
            memmove(later, later + 1, --nlater * sizeof(*later));
        }
        const msgpack_object *tag = req_arg(r, 0);
        msgpack_packer *pk = req_result(r);
        if (tag)
            msgpack_pack_object(pk, *tag);
        else
            msgpack_pack_nil(pk);
        req_done(r);
        done++;
    }
    return done;
}

size_t fake_hooks_waiting(void)
{
    return nlater;
}

static void h_query(req *r)
{
    st.calls++;
    const conn_auth *a = req_auth(r);
    msgpack_packer *pk = req_result(r);
    msgpack_pack_map(pk, 2);
    rpc_pack_kv_int(pk, "tenant", a->tenant_id);
    rpc_pack_kv_str(pk, "tier", tier_name(a->tier));
    req_done(r);
}

static const rpc_param p_store[] = {{"n", RPC_T_UINT, RPC_P_REQUIRED, 0, 0}};
static const size_t np_store = 1;

static void store_done(req *r, const db_result *res)
{
    if (res->status != DB_OK) {
        req_fail_db(r, res);
        return;
    }
    msgpack_packer *pk = req_result(r);
    msgpack_pack_map(pk, 1);
    rpc_pack_kv_uint(pk, "written", rpc_get_uint(req_arg(r, 0), 0));
    req_done(r);
}

static void h_store(req *r)
{
    st.calls++;
    char n[24];
    snprintf(n, sizeof(n), "%llu", (unsigned long long)rpc_get_uint(req_arg(r, 0), 0));
    const char *v[] = {n};
    db_query q = {.stmt = &fake_hooks_stmt, DB_VALUES(v)};
    req_submit(r, req_auth(r)->tenant_id, &q, 1, store_done);
}

static void h_whoami(req *r)
{
    st.calls++;
    const conn_auth *a = req_auth(r);
    msgpack_packer *pk = req_result(r);
    msgpack_pack_map(pk, 3);
    rpc_pack_kv_bool(pk, "authenticated", a->authenticated);
    rpc_pack_kv_bool(pk, "admin", a->admin);
    rpc_pack_kv_int(pk, "tenant", a->tenant_id);
    req_done(r);
}

#define M(wire, h, flags)                                                                          \
    {                                                                                              \
        wire, h_##h, p_##h, 0, flags, &np_##h, NULL, NULL                                          \
    }
#define p_admin_only p_none
#define np_admin_only np_none
#define p_query p_none
#define np_query np_none
#define p_whoami p_none
#define np_whoami np_none

static method_def table[] = {
    M("admin.only", admin_only, M_ADMIN),
    M("auth", auth, M_PUBLIC | M_AUTH),
    M("big", big, M_PUBLIC),
    M("echo", echo, M_PUBLIC),
    M("later", later, M_PUBLIC),
    M("query", query, M_TENANT | M_QUERY),
    M("store", store, M_TENANT | M_WRITE),
    M("whoami", whoami, M_PUBLIC),
};

/* ---- hooks ----------------------------------------------------------------------------- */

static int worker_init(worker *w)
{
    st.worker_inits++;
    /* something to free, so a missing worker_fini shows as a leak */
    void *app = malloc(16);
    if (!app)
        return -ENOMEM;
    worker_set_app(w, app);
    return 0;
}

static void worker_tick(worker *w, uint64_t now_ms, bool draining)
{
    st.worker_ticks++;
}

static bool worker_idle(worker *w)
{
    return true;
}

static void worker_fini(worker *w)
{
    st.worker_finis++;
    free(worker_app(w));
    worker_set_app(w, NULL);
}

static void key_in_use(server *s, int64_t key_id, int64_t tenant_id, int tier)
{
    st.keys_in_use++;
}

static void key_released(server *s, int64_t key_id)
{
    st.keys_in_use--;
}

static hook_admit tenant_admit(server *s, int64_t key_id, int64_t tenant_id, int *tier,
                               uint64_t *retry_ms)
{
    st.admits++;
    if (st.admit_tier >= 0)
        *tier = st.admit_tier;
    *retry_ms = st.retry_ms;
    return st.admit;
}

const net_hooks *fake_hooks(void)
{
    static net_hooks h;
    for (size_t i = 0; i < sizeof(table) / sizeof(table[0]); i++)
        table[i].nparams = *table[i].count;
    h = (net_hooks){
        .methods = table,
        .nmethods = sizeof(table) / sizeof(table[0]),
        .worker_init = worker_init,
        .worker_tick = worker_tick,
        .worker_idle = worker_idle,
        .worker_fini = worker_fini,
        .key_in_use = key_in_use,
        .key_released = key_released,
        .tenant_admit = tenant_admit,
    };
    return &h;
}
