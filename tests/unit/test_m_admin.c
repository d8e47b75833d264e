/* tests/unit/test_m_admin.c: server/methods/m_admin.c against a fake request and a fake pool
 * (tests/fakes/fake_req.h): the admin methods (tenants and keys: how the tenant is named,
 * the validation of tiers, embeddings and engines, the statements and their parameters, the
 * key made and its hash, the answers, what this process learns at once of revocations,
 * deletions and tier changes) and tenant.usage (the tenant's numbers against its tier's
 * limits).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <sodium.h>

#include "auth.h"
#include "check.h"
#include "fake_req.h"
#include "pgres.h"
#include "tenancy.h"

static fr_env env;
static const conn_auth admin = {.authenticated = true, .admin = true, .tenant_id = -1};

static req *call(const char *method, const char *args)
{
    return fr_call_as(&env, &admin, method, args);
}

/* Calls method with args and expects invalid_argument naming field, with no job sent. */
static void expect_invalid(const char *method, const char *args, const char *field)
{
    req *r = call(method, args);
    CHECK_MSG(r->code == RPC_INVALID_ARGUMENT && r->ends == 1, "%s %s: code %d (%s)", method, args,
              (int)r->code, r->msg);
    if (field)
        CHECK_MSG(fr_field(r) && strcmp(fr_field(r), field) == 0, "%s %s: field %s, not %s", method,
                  args, fr_field(r) ? fr_field(r) : "(none)", field);
    CHECK_MSG(fr_jobs() == 0, "%s %s sent a job", method, args);
    fr_clear_jobs();
    fr_free(r);
}

static bool val_is(const fr_job *j, size_t i, const char *want)
{
    const char *v = fr_val(j, 0, i);
    if (!want)
        return v == NULL;
    return v && strcmp(v, want) == 0;
}

/* ---- admin.tenant.create ---------------------------------------------------------------- */

static void test_tenant_create(void)
{
    expect_invalid("admin.tenant.create", "{\"name\": \"acme\"}", "tier");
    expect_invalid("admin.tenant.create", "{\"name\": \"acme\", \"tier\": \"gold\"}", "tier");
    expect_invalid("admin.tenant.create", "{\"name\": \"\", \"tier\": \"free\"}", "name");
    expect_invalid("admin.tenant.create",
                   "{\"name\": \"acme\", \"tier\": \"free\", \"embedding\": {\"provider\": "
                   "\"openai\"}}",
                   NULL); /* not configured here (no openai_url) */
    expect_invalid("admin.tenant.create",
                   "{\"name\": \"acme\", \"tier\": \"free\", \"embedding\": {\"provider\": "
                   "\"cohere\"}}",
                   "embedding.provider");
    expect_invalid("admin.tenant.create",
                   "{\"name\": \"acme\", \"tier\": \"free\", \"embedding\": {\"dim\": 0}}",
                   "embedding.dim");
    expect_invalid("admin.tenant.create",
                   "{\"name\": \"acme\", \"tier\": \"free\", \"embedding\": {\"dim\": 1e9}}",
                   "embedding.dim");
    expect_invalid("admin.tenant.create",
                   "{\"name\": \"acme\", \"tier\": \"free\", \"embedding\": {\"colour\": 1}}",
                   "embedding.colour");
    expect_invalid("admin.tenant.create",
                   "{\"name\": \"acme\", \"tier\": \"free\", \"index_engine\": \"hnsw\"}",
                   "index_engine");
    /* "default" is for update only */
    expect_invalid("admin.tenant.create",
                   "{\"name\": \"acme\", \"tier\": \"free\", \"index_engine\": \"default\"}",
                   "index_engine");

    req *r = call("admin.tenant.create", "{\"name\": \"acme\", \"tier\": \"premium\", "
                                         "\"embedding\": {\"provider\": \"builtin\", \"dim\": "
                                         "64}, \"index_engine\": \"faiss\"}");
    fr_job *j = fr_take();
    CHECK(r->ends == 0 && j && j->kind == FR_SUBMIT && j->rls == -1);
    CHECK(j && strcmp(j->q[0].name, "tenant_create") == 0 && j->q[0].nvalues == 9);
    /* name, tier, provider, model, dim, "default", key id, key hash, engine */
    CHECK(val_is(j, 0, "acme") && val_is(j, 1, "premium") && val_is(j, 2, "builtin"));
    CHECK(val_is(j, 3, "") && val_is(j, 4, "64") && val_is(j, 5, "default"));
    CHECK(val_is(j, 8, "faiss"));
    char key_id[AUTH_KEY_ID_LEN + 1] = "", hash[65] = "";
    if (j && fr_val(j, 0, 6) && fr_val(j, 0, 7)) {
        snprintf(key_id, sizeof(key_id), "%s", fr_val(j, 0, 6));
        snprintf(hash, sizeof(hash), "%s", fr_val(j, 0, 7));
    }
    CHECK(strlen(key_id) == AUTH_KEY_ID_LEN && strlen(hash) == 64);
    fr_answer1(j, fr_rows("tenant_id|key_id", 1, "12|34"));
    CHECK(r->done && r->ends == 1);
    CHECK(fr_is_int(fr_get(r, "tenant_id"), 12) && fr_is_int(fr_get(r, "key_id"), 34));
    /* the key shown once: the id sent is its own, and the hash sent is its keyed hash */
    const msgpack_object *k = fr_get(r, "api_key");
    CHECK(k && k->type == MSGPACK_OBJECT_STR && k->via.str.size == AUTH_KEY_LEN);
    if (k && k->type == MSGPACK_OBJECT_STR && k->via.str.size == AUTH_KEY_LEN) {
        char id[AUTH_KEY_ID_LEN + 1], hex[65];
        uint8_t h[32];
        CHECK(auth_key_id(k->via.str.ptr, k->via.str.size, id) && strcmp(id, key_id) == 0);
        auth_hash(&env.srv, k->via.str.ptr, k->via.str.size, h);
        auth_hash_hex(h, hex);
        CHECK(strcmp(hex, hash) == 0);
    }
    fr_free(r);

    /* defaults: the builtin provider at embed_dim, no engine of its own */
    r = call("admin.tenant.create", "{\"name\": \"b\", \"tier\": \"free\"}");
    j = fr_take();
    char dim[16];
    snprintf(dim, sizeof(dim), "%d", env.srv.cfg.embed_dim);
    CHECK(j && val_is(j, 2, "builtin") && val_is(j, 4, dim) && val_is(j, 8, NULL));
    /* a name taken: the database's error goes to req_fail_db */
    fr_answer_error(j, "EG410", "a tenant named b exists", NULL);
    CHECK(r->fail_db && strcmp(r->db_sqlstate, "EG410") == 0 && r->ends == 1);
    fr_free(r);
}

/* ---- admin.tenant.get / list / update / delete ------------------------------------------ */

static void test_tenant_get(void)
{
    expect_invalid("admin.tenant.get", "{}", NULL);
    expect_invalid("admin.tenant.get", "{\"tenant_id\": 3, \"name\": \"acme\"}", NULL);
    expect_invalid("admin.tenant.get", "{\"tenant_id\": -3}", "tenant_id");

    req *r = call("admin.tenant.get", "{\"tenant_id\": 3}");
    fr_job *j = fr_take();
    CHECK(j && strcmp(j->q[0].name, "admin_tenant_get") == 0 && j->rls == -1);
    CHECK(j && val_is(j, 0, "3") && val_is(j, 1, NULL) && val_is(j, 2, env.srv.cfg.index_engine));
    fr_answer1(j, fr_rows("t", 1, "{\"tenant_id\": 3, \"name\": \"acme\", \"tags\": [1, 2]}"));
    CHECK(r->done && fr_is_int(fr_get(r, "tenant_id"), 3) && fr_is_str(fr_get(r, "name"), "acme"));
    CHECK(fr_len(fr_get(r, "tags")) == 2);
    fr_free(r);

    r = call("admin.tenant.get", "{\"name\": \"acme\"}");
    j = fr_take();
    CHECK(j && val_is(j, 0, NULL) && val_is(j, 1, "acme"));
    fr_answer1(j, fr_rows("t", 0)); /* no row: the function raises not found instead */
    CHECK(r->code == RPC_INTERNAL && r->ends == 1);
    fr_free(r);

    r = call("admin.tenant.get", "{\"name\": \"ghost\"}");
    fr_answer_error(fr_take(), "EG404", "no tenant named ghost", NULL);
    CHECK(r->fail_db && strcmp(r->db_sqlstate, "EG404") == 0);
    fr_free(r);
}

static void test_tenant_list(void)
{
    expect_invalid("admin.tenant.list", "{\"limit\": 0}", "limit");
    expect_invalid("admin.tenant.list", "{\"limit\": 1001}", "limit");

    req *r = call("admin.tenant.list", NULL);
    fr_job *j = fr_take();
    CHECK(j && strcmp(j->q[0].name, "admin_tenant_list") == 0);
    CHECK(j && val_is(j, 0, "0") && val_is(j, 1, "100"));
    fr_answer1(j, fr_rows("t", 1, "[{\"tenant_id\": 1}, {\"tenant_id\": 2}]"));
    CHECK(r->done && fr_len(fr_get(r, "tenants")) == 2);
    CHECK(fr_is_nil(fr_get(r, "next_cursor"))); /* fewer than the limit: the last page */
    fr_free(r);

    /* a full page continues after its last tenant */
    r = call("admin.tenant.list", "{\"cursor\": 5, \"limit\": 2}");
    j = fr_take();
    CHECK(j && val_is(j, 0, "5") && val_is(j, 1, "2"));
    fr_answer1(j, fr_rows("t", 1, "[{\"tenant_id\": 6}, {\"tenant_id\": 9}]"));
    CHECK(fr_is_int(fr_get(r, "next_cursor"), 9));
    CHECK(fr_is_int(fr_path(r, "tenants.1.tenant_id"), 9));
    fr_free(r);

    r = call("admin.tenant.list", "{\"limit\": 2}");
    fr_answer1(fr_take(), fr_rows("t", 1, "{\"not\": \"an array\"}"));
    CHECK(r->code == RPC_INTERNAL);
    fr_free(r);
    r = call("admin.tenant.list", NULL);
    fr_answer_unavailable(fr_take(), "down");
    CHECK(r->fail_db && r->db_status == DB_UNAVAILABLE);
    fr_free(r);
}

static void test_tenant_update(void)
{
    expect_invalid("admin.tenant.update", "{\"tenant_id\": 4}", NULL);
    expect_invalid("admin.tenant.update", "{\"tenant_id\": 4, \"tier\": \"gold\"}", "tier");
    expect_invalid("admin.tenant.update", "{\"tenant_id\": 4, \"index_engine\": \"x\"}",
                   "index_engine");
    expect_invalid("admin.tenant.update", "{\"tier\": \"free\"}", NULL);
    /* a chat model: a name of the allowed characters, and a provider configured here */
    expect_invalid("admin.tenant.update", "{\"tenant_id\": 4, \"chat_model\": \"a b\"}",
                   "chat_model");
    expect_invalid("admin.tenant.update", "{\"tenant_id\": 4, \"chat_model\": \"haiku\"}",
                   "chat_model");
    req *rn = call("admin.tenant.update", "{\"tenant_id\": 4, \"chat_model\": \"none\"}");
    fr_job *jn = fr_take();
    CHECK(jn && val_is(jn, 6, "none") && val_is(jn, 3, NULL));
    fr_answer1(jn, fr_rows("t|id", 1, "{\"tenant_id\": 4, \"chat_model\": \"none\"}|4"));
    CHECK(rn->done && fr_is_str(fr_get(rn, "chat_model"), "none"));
    fr_free(rn);

    /* tiers are tracked for tenants with connections (a tenant without one reads its tier
     * when it connects): tenant 4 has one, at the free tier */
    CHECK(tenancy_tier(env.srv.tenancy, 4, -1) == -1);
    tenancy_key_in_use(env.srv.tenancy, 40, 4, TIER_FREE);
    CHECK(tenancy_tier(env.srv.tenancy, 4, -1) == TIER_FREE);
    req *r = call("admin.tenant.update",
                  "{\"tenant_id\": 4, \"tier\": \"premium\", \"new_name\": \"beta\", "
                  "\"index_engine\": \"default\"}");
    fr_job *j = fr_take();
    CHECK(j && strcmp(j->q[0].name, "admin_tenant_update") == 0 && j->q[0].nvalues == 11);
    /* id, name, new name, tier, engine ("default" clears the tenant's), the server's, the
     * chat model (none given), the embedding's provider, model, dim (none given), cancel */
    CHECK(j && val_is(j, 7, NULL) && val_is(j, 8, NULL) && val_is(j, 9, NULL) &&
          val_is(j, 10, "false"));
    CHECK(j && val_is(j, 0, "4") && val_is(j, 1, NULL) && val_is(j, 2, "beta"));
    CHECK(j && val_is(j, 3, "premium") && val_is(j, 4, "default") &&
          val_is(j, 5, env.srv.cfg.index_engine) && val_is(j, 6, NULL));
    fr_answer1(j, fr_rows("t|id", 1, "{\"tenant_id\": 4, \"tier\": \"premium\"}|4"));
    CHECK(r->done && fr_is_str(fr_get(r, "tier"), "premium"));
    /* this process knows the new tier at once */
    CHECK(tenancy_tier(env.srv.tenancy, 4, -1) == TIER_PREMIUM);
    fr_free(r);

    /* a failed update changes nothing here */
    r = call("admin.tenant.update", "{\"name\": \"beta\", \"tier\": \"free\"}");
    j = fr_take();
    CHECK(j && val_is(j, 0, NULL) && val_is(j, 1, "beta") && val_is(j, 4, NULL));
    fr_answer_error(j, "EG404", "no tenant", NULL);
    CHECK(r->fail_db && tenancy_tier(env.srv.tenancy, 4, -1) == TIER_PREMIUM);
    fr_free(r);
}

static void test_tenant_delete(void)
{
    expect_invalid("admin.tenant.delete", "{}", NULL);
    CHECK(tenancy_key_ok(env.srv.tenancy, 80, 8));
    req *r = call("admin.tenant.delete", "{\"tenant_id\": 8}");
    fr_job *j = fr_take();
    CHECK(j && strcmp(j->q[0].name, "admin_tenant_delete") == 0 && val_is(j, 0, "8"));
    fr_answer1(j, fr_rows("id", 1, "8"));
    CHECK(r->done && fr_is_int(fr_get(r, "tenant_id"), 8) &&
          fr_is_bool(fr_get(r, "deleted"), true));
    /* the tenant's connections fail from their next request */
    CHECK(!tenancy_key_ok(env.srv.tenancy, 80, 8));
    fr_free(r);

    r = call("admin.tenant.delete", "{\"name\": \"ghost\"}");
    fr_answer_error(fr_take(), "EG404", "no tenant", NULL);
    CHECK(r->fail_db && strcmp(r->db_sqlstate, "EG404") == 0);
    fr_free(r);
}

/* ---- admin.key.create / list / revoke ------------------------------------------------------ */

static void test_keys(void)
{
    expect_invalid("admin.key.create", "{\"tenant_id\": 3}", "name");
    expect_invalid("admin.key.create", "{\"name\": \"ci\"}", NULL);
    expect_invalid("admin.key.create", "{\"tenant_id\": 3, \"tenant\": \"a\", \"name\": \"ci\"}",
                   NULL);

    req *r = call("admin.key.create", "{\"tenant\": \"acme\", \"name\": \"ci key\"}");
    fr_job *j = fr_take();
    CHECK(j && strcmp(j->q[0].name, "admin_key_create") == 0 && j->q[0].nvalues == 5);
    CHECK(j && val_is(j, 0, NULL) && val_is(j, 1, "acme") && val_is(j, 2, "ci key"));
    char key_id[32] = "", hash[80] = "";
    if (j && fr_val(j, 0, 3) && fr_val(j, 0, 4)) {
        snprintf(key_id, sizeof(key_id), "%s", fr_val(j, 0, 3));
        snprintf(hash, sizeof(hash), "%s", fr_val(j, 0, 4));
    }
    fr_answer1(j, fr_rows("tenant_id|key_id|created_at", 1, "3|77|1700000000000"));
    CHECK(r->done && fr_len(r->result) == 5);
    CHECK(fr_is_int(fr_get(r, "tenant_id"), 3) && fr_is_int(fr_get(r, "key_id"), 77));
    CHECK(fr_is_str(fr_get(r, "name"), "ci key"));
    CHECK(fr_is_int(fr_get(r, "created_at"), 1700000000000));
    const msgpack_object *k = fr_get(r, "api_key");
    CHECK(k && k->type == MSGPACK_OBJECT_STR && k->via.str.size == AUTH_KEY_LEN);
    if (k && k->type == MSGPACK_OBJECT_STR && k->via.str.size == AUTH_KEY_LEN) {
        char id[AUTH_KEY_ID_LEN + 1], hex[65];
        uint8_t h[32];
        CHECK(auth_key_id(k->via.str.ptr, k->via.str.size, id) && strcmp(id, key_id) == 0);
        auth_hash(&env.srv, k->via.str.ptr, k->via.str.size, h);
        auth_hash_hex(h, hex);
        CHECK(strcmp(hex, hash) == 0);
    }
    fr_free(r);

    r = call("admin.key.create", "{\"tenant_id\": 3, \"name\": \"x\"}");
    fr_answer_error(fr_take(), "EG404", "no tenant 3", NULL);
    CHECK(r->fail_db && !r->done);
    fr_free(r);

    r = call("admin.key.list", "{\"tenant_id\": 3}");
    j = fr_take();
    CHECK(j && strcmp(j->q[0].name, "admin_key_list") == 0 && val_is(j, 0, "3"));
    fr_answer1(j, fr_rows("k", 1, "[{\"key_id\": 77, \"name\": \"ci key\"}]"));
    CHECK(r->done && fr_is_int(fr_path(r, "keys.0.key_id"), 77));
    fr_free(r);

    expect_invalid("admin.key.revoke", "{}", "key_id");
    tenancy_key_in_use(env.srv.tenancy, 77, 3, TIER_FREE);
    CHECK(tenancy_key_ok(env.srv.tenancy, 77, 3));
    r = call("admin.key.revoke", "{\"key_id\": 77}");
    j = fr_take();
    CHECK(j && strcmp(j->q[0].name, "admin_key_revoke") == 0 && val_is(j, 0, "77"));
    fr_answer1(j, fr_rows("tenant_id", 1, "3"));
    CHECK(r->done && fr_is_int(fr_get(r, "key_id"), 77) && fr_is_int(fr_get(r, "tenant_id"), 3));
    CHECK(fr_is_bool(fr_get(r, "revoked"), true));
    CHECK(!tenancy_key_ok(env.srv.tenancy, 77, 3)); /* its connections fail from now on */
    fr_free(r);
    tenancy_key_released(env.srv.tenancy, 77);

    r = call("admin.key.revoke", "{\"key_id\": 78}");
    fr_answer_error(fr_take(), "EG404", "no key 78", NULL);
    CHECK(r->fail_db && strcmp(r->db_sqlstate, "EG404") == 0);
    fr_free(r);
}

/* ---- tenant.usage ------------------------------------------------------------------------ */

static void test_usage(void)
{
    tier_limits *tl = &env.tiers[TIER_STANDARD];
    tier_limits saved = *tl;
    tl->max_memories = 5000;
    tl->max_memory_bytes = 0; /* unlimited: nil */
    tl->queries_per_day = 900;
    tl->max_live_sessions = 0;
    tl->session_retention_days = 30;
    tl->rate_per_s = 20;
    tl->rate_burst = 40;
    req *r = fr_call(&env, "tenant.usage", NULL);
    fr_job *j = fr_take();
    CHECK(j && strcmp(j->q[0].name, "tenant_usage") == 0);
    /* the tenant's own, under its row-level security */
    CHECK(j && j->rls == 7 && val_is(j, 0, "7"));
    tl->model_tokens_per_day = 200000;
    /* tier, stored, today, storage bytes, resets at, archived, live sessions, bytes, model
     * calls, tokens in, tokens out, cost, chat model (NULL: the server's), name */
    fr_answer1(
        j, fr_rows("tier|stored|today|storage|resets|archived|live|bytes|calls|tin|tout|"
                   "cost|chat|name",
                   1, "standard|120|33|4096|1700086400000|5|2|777|3|900|100|0.0014|haiku-x|acme"));
    CHECK(r->done);
    CHECK(fr_is_int(fr_get(r, "tenant_id"), 7) && fr_is_str(fr_get(r, "tier"), "standard"));
    CHECK(fr_is_str(fr_get(r, "name"), "acme"));
    CHECK(fr_is_int(fr_path(r, "memories.stored"), 120));
    CHECK(fr_is_int(fr_path(r, "memories.archived"), 5));
    CHECK(fr_is_int(fr_path(r, "memories.limit"), 5000));
    CHECK(fr_is_int(fr_path(r, "memories.bytes"), 777));
    CHECK(fr_is_nil(fr_path(r, "memories.bytes_limit")));
    CHECK(fr_is_int(fr_path(r, "queries.today"), 33));
    CHECK(fr_is_int(fr_path(r, "queries.limit"), 900));
    CHECK(fr_is_int(fr_path(r, "queries.resets_at"), 1700086400000));
    CHECK(fr_is_int(fr_path(r, "sessions.live"), 2));
    CHECK(fr_is_nil(fr_path(r, "sessions.limit")));
    CHECK(fr_is_int(fr_path(r, "sessions.retention_days"), 30));
    CHECK(fr_is_int(fr_get(r, "storage_bytes"), 4096));
    CHECK(fr_num(fr_path(r, "rate.per_second")) == 20 && fr_num(fr_path(r, "rate.burst")) == 40);
    /* the chat model's day, against the tier's cap */
    CHECK(fr_is_str(fr_path(r, "model.chat_model"), "haiku-x"));
    CHECK(fr_is_int(fr_path(r, "model.calls_today"), 3));
    CHECK(fr_is_int(fr_path(r, "model.tokens_in_today"), 900));
    CHECK(fr_is_int(fr_path(r, "model.tokens_out_today"), 100));
    CHECK(fr_is_int(fr_path(r, "model.tokens_today"), 1000));
    CHECK(fr_num(fr_path(r, "model.cost_usd_today")) == 0.0014);
    CHECK(fr_is_int(fr_path(r, "model.tokens_limit"), 200000));
    fr_free(r);
    *tl = saved;

    r = fr_call(&env, "tenant.usage", NULL);
    fr_answer1(fr_take(), fr_rows("tier|stored|today|storage|resets|archived|live|bytes|calls|tin|"
                                  "tout|cost|chat|name",
                                  0));
    CHECK(r->code == RPC_NOT_FOUND);
    fr_free(r);
    r = fr_call(&env, "tenant.usage", NULL);
    fr_answer_error(fr_take(), "57014", "canceled", NULL);
    CHECK(r->fail_db && strcmp(r->db_sqlstate, "57014") == 0);
    fr_free(r);
}

int main(void)
{
    if (fr_env_init(&env, NULL, false) < 0 || auth_init() < 0) {
        fprintf(stderr, "cannot set up the test server\n");
        return 1;
    }
    randombytes_buf(env.srv.secret, sizeof(env.srv.secret));
    test_tenant_create();
    test_tenant_get();
    test_tenant_list();
    test_tenant_update();
    test_tenant_delete();
    test_keys();
    test_usage();
    CHECK(fr_jobs() == 0);
    fr_env_fini(&env);
    CHECK_RETURN();
}
