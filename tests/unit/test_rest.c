/* tests/unit/test_rest.c: server/net/rest.c, the seeds' REST routes: matching, the path's id,
 * the query's parameters typed by the method's table, percent-decoding. */
#include <errno.h>
#include <string.h>

#include "check.h"
#include "rest.h"

static const rest_route *match(http1_method v, const char *path, uint64_t *id, char *allow)
{
    return rest_match(v, path, strlen(path), id, allow, 64);
}

static void test_match(void)
{
    uint64_t id;
    char allow[64];
    const rest_route *r = match(HTTP1_POST, "/v1/memory", &id, allow);
    CHECK(r && strcmp(r->method, "memory.store") == 0 && id == 0);
    r = match(HTTP1_POST, "/v1/sessions/42/checkpoint", &id, allow);
    CHECK(r && strcmp(r->method, "session.checkpoint") == 0 && id == 42 &&
          strcmp(r->id_param, "session_id") == 0);
    r = match(HTTP1_PATCH, "/v1/sessions/18446744073709551615/scratchpad", &id, allow);
    CHECK(r && strcmp(r->method, "session.scratchpad.update") == 0 && id == UINT64_MAX);
    r = match(HTTP1_GET, "/v1/sessions/7/scratchpad", &id, allow);
    CHECK(r && strcmp(r->method, "session.scratchpad.get") == 0 && id == 7);
    r = match(HTTP1_POST, "/v1/sessions/9/spawn", &id, allow);
    CHECK(r && strcmp(r->id_param, "parent_id") == 0 && id == 9);
    /* a known path with another verb: no route, the verbs it takes */
    CHECK(!match(HTTP1_GET, "/v1/memory", &id, allow) && strcmp(allow, "POST") == 0);
    CHECK(!match(HTTP1_POST, "/v1/sessions/7/scratchpad", &id, allow) &&
          strcmp(allow, "GET, PATCH") == 0);
    /* not numbers, overflow, trailing bytes, prefixes: unknown paths */
    CHECK(!match(HTTP1_POST, "/v1/sessions/abc/checkpoint", &id, allow) && !allow[0]);
    CHECK(!match(HTTP1_POST, "/v1/sessions//checkpoint", &id, allow) && !allow[0]);
    CHECK(!match(HTTP1_POST, "/v1/sessions/18446744073709551616/checkpoint", &id, allow) &&
          !allow[0]);
    CHECK(!match(HTTP1_POST, "/v1/memory/", &id, allow) && !allow[0]);
    CHECK(!match(HTTP1_POST, "/v1/memoryx", &id, allow) && !allow[0]);
    CHECK(!match(HTTP1_POST, "/v1/sessions/1/checkpoint/x", &id, allow) && !allow[0]);
    char name[32];
    rest_id_name(match(HTTP1_POST, "/v1/sessions/9/spawn", &id, allow), name, sizeof(name));
    CHECK(strcmp(name, "parentId") == 0);
    rest_id_name(match(HTTP1_POST, "/v1/memory", &id, allow), name, sizeof(name));
    CHECK(name[0] == '\0');
}

static void test_decode(void)
{
    char out[64];
    CHECK(rest_decode("a%2Cb+c%3a", 10, out) == 6 && memcmp(out, "a,b c:", 6) == 0);
    CHECK(rest_decode("%", 1, out) == -1 && rest_decode("%4", 2, out) == -1 &&
          rest_decode("%zz", 3, out) == -1);
    CHECK(rest_decode("", 0, out) == 0);
}

static const msgpack_object_kv *find(const msgpack_object_kv *kv, long n, const char *key)
{
    for (long i = 0; i < n; i++)
        if (rpc_str_eq(&kv[i].key, key))
            return &kv[i];
    return NULL;
}

static void test_args(void)
{
    static const rpc_param notes[] = {{"session_id", RPC_T_UINT, RPC_P_REQUIRED, 0, 0},
                                      {"scopes", RPC_T_STR_ARRAY, RPC_P_NULLABLE, 0, 0},
                                      {"categories", RPC_T_STR_ARRAY, RPC_P_NULLABLE, 0, 0},
                                      {"since", RPC_T_TIME, RPC_P_NULLABLE, 0, 0},
                                      {"agent_id", RPC_T_UINT, RPC_P_NULLABLE, 0, 0}};
    uint64_t id;
    char allow[64], err[200];
    const rest_route *r = match(HTTP1_GET, "/api/v1/session/12/scratchpad", &id, allow);
    CHECK(r && strcmp(r->method, "session.notes") == 0);
    msgpack_zone zone;
    msgpack_zone_init(&zone, 1024);
    msgpack_object_kv kv[1 + REST_QUERY_MAX];
    const char *q = "scope=session,carry_forward&since=2026-02-24T10%3A00%3A00Z&agent_id=7"
                    "&embeddings=array";
    long n = rest_args(r, id, q, strlen(q), notes, 5, &zone, kv, err, sizeof(err));
    CHECK(n == 4);
    const msgpack_object_kv *x = find(kv, n, "session_id");
    CHECK(x && x->val.type == MSGPACK_OBJECT_POSITIVE_INTEGER && x->val.via.u64 == 12);
    x = find(kv, n, "scopes");
    CHECK(x && x->val.type == MSGPACK_OBJECT_ARRAY && x->val.via.array.size == 2 &&
          rpc_str_eq(&x->val.via.array.ptr[0], "session") &&
          rpc_str_eq(&x->val.via.array.ptr[1], "carry_forward"));
    x = find(kv, n, "since");
    CHECK(x && rpc_str_eq(&x->val, "2026-02-24T10:00:00Z"));
    x = find(kv, n, "agent_id");
    CHECK(x && x->val.type == MSGPACK_OBJECT_POSITIVE_INTEGER && x->val.via.u64 == 7);
    /* a time as digits is a number; a uint that is not digits stays a string (the binder
     * refuses it with the parameter's name) */
    q = "since=1771927200000&agent_id=seven";
    n = rest_args(r, id, q, strlen(q), notes, 5, &zone, kv, err, sizeof(err));
    CHECK(n == 3 && find(kv, n, "since")->val.type == MSGPACK_OBJECT_POSITIVE_INTEGER &&
          find(kv, n, "agent_id")->val.type == MSGPACK_OBJECT_STR);
    /* no query: the id alone; refusals */
    CHECK(rest_args(r, id, NULL, 0, notes, 5, &zone, kv, err, sizeof(err)) == 1);
    q = "limit=3";
    CHECK(rest_args(r, id, q, strlen(q), notes, 5, &zone, kv, err, sizeof(err)) == -EINVAL &&
          strstr(err, "unknown query parameter 'limit'"));
    q = "scope=a&scope=b";
    CHECK(rest_args(r, id, q, strlen(q), notes, 5, &zone, kv, err, sizeof(err)) == -EINVAL &&
          strstr(err, "twice"));
    q = "scope=%zz";
    CHECK(rest_args(r, id, q, strlen(q), notes, 5, &zone, kv, err, sizeof(err)) == -EINVAL);
    msgpack_zone_destroy(&zone);
}

int main(void)
{
    test_match();
    test_decode();
    test_args();
    CHECK_RETURN();
}
