/* tests/unit/test_net_auth.c: who a connection is, as the network layer keeps it
 * (server/net/req.c, conn.c): the auth barrier (requests after an M_AUTH request wait for its
 * answer and run as the identity it sets), a failed auth leaving no identity, the permission
 * flags (M_PUBLIC, M_ADMIN, M_TENANT), the tenant_admit hook's outcomes (revoked, rate
 * limited, a new tier) and the key counts given back when a connection closes. */
#include <errno.h>
#include <string.h>

#include "check.h"
#include "fake_db.h"
#include "fake_hooks.h"
#include "net_rig.h"

static net_rig *rig;

static void call(int fd, uint32_t id, const char *method, const char *params, size_t plen)
{
    char buf[1024];
    size_t n = rig_pack_request(buf, sizeof(buf), false, id, method, params, plen);
    CHECK(net_rig_send(rig, fd, buf, n) == 0);
}

static void auth(int fd, uint32_t id, const char *key)
{
    char p[128];
    size_t pl = rig_map(p, sizeof(p), "api_key:s", key);
    call(fd, id, "auth", p, pl);
}

/* Runs until idle and reads up to max answers into g. */
static int answers(int fd, rig_reader *rd, rig_got *g, size_t max)
{
    int n = net_rig_collect(rig, fd, rd, g, max);
    CHECK(n >= 0);
    return n;
}

static void test_barrier(void)
{
    int fd = net_rig_connect(rig, false, false, NULL);
    fake_hooks_state *st = fake_hooks_get();
    unsigned before = st->calls;
    fake_db_hold(true);
    auth(fd, 1, "db:tenant:5"); /* answered once its database job is */
    call(fd, 2, "query", NULL, 0);
    call(fd, 3, "whoami", NULL, 0);
    rig_reader rd;
    rig_reader_init(&rd);
    rig_got g[4];
    CHECK(answers(fd, &rd, g, 4) == 0);
    /* the requests behind the auth wait: not run, and not refused as unauthenticated */
    CHECK(st->calls - before == 1);
    CHECK(fake_db_waiting() == 1);
    fake_db_hold(false);
    int n = answers(fd, &rd, g, 4);
    CHECK(n == 3);
    CHECK(n == 3 && g[0].msgid == 1 && !g[0].error);
    CHECK(n == 3 && g[1].msgid == 2 && !g[1].error && strstr(g[1].text, "\"tenant\"=>5"));
    CHECK(n == 3 && g[2].msgid == 3 && strstr(g[2].text, "\"authenticated\"=>true"));
    CHECK(st->keys_in_use == 1);
    rig_reader_fini(&rd);
    net_rig_close(rig, fd);
    net_rig_pump(rig, NULL, NULL);
    CHECK(st->keys_in_use == 0); /* the connection gave its key's place back */
}

static void test_failed_auth(void)
{
    int fd = net_rig_connect(rig, false, false, NULL);
    fake_hooks_state *st = fake_hooks_get();
    rig_reader rd;
    rig_reader_init(&rd);
    rig_got g[4];
    auth(fd, 1, "tenant:3");
    auth(fd, 2, "not a key");
    call(fd, 3, "whoami", NULL, 0);
    call(fd, 4, "query", NULL, 0);
    int n = answers(fd, &rd, g, 4);
    CHECK(n == 4);
    CHECK(!g[0].error);
    CHECK(g[1].error && g[1].code == RPC_UNAUTHENTICATED);
    /* a failed auth leaves no identity, whatever the connection was before */
    CHECK_STR_CONTAINS(g[2].text, "\"authenticated\"=>false");
    CHECK(g[3].error && g[3].code == RPC_UNAUTHENTICATED);
    CHECK(st->keys_in_use == 0);
    /* a database failure fails the auth the same way */
    auth(fd, 5, "tenant:3");
    fake_db_set_submit_error(-EAGAIN);
    auth(fd, 6, "db:tenant:4");
    call(fd, 7, "whoami", NULL, 0);
    n = answers(fd, &rd, g, 4);
    fake_db_set_submit_error(0);
    CHECK(n == 3 && !g[0].error && g[1].error && g[1].code == RPC_UNAVAILABLE);
    CHECK(n == 3 && strstr(g[2].text, "\"authenticated\"=>false"));
    CHECK(st->keys_in_use == 0);
    rig_reader_fini(&rd);
    net_rig_close(rig, fd);
}

static void test_permissions(void)
{
    static const struct {
        const char *key; /* NULL: not authenticated */
        const char *method;
        int code; /* RPC_OK: answered */
    } cases[] = {
        {NULL, "whoami", RPC_OK},
        {NULL, "query", RPC_UNAUTHENTICATED},
        {NULL, "admin.only", RPC_UNAUTHENTICATED},
        {NULL, "store", RPC_UNAUTHENTICATED},
        {"tenant:9", "query", RPC_OK},
        {"tenant:9", "admin.only", RPC_PERMISSION_DENIED},
        {"admin", "admin.only", RPC_OK},
        {"admin", "query", RPC_PERMISSION_DENIED},
        {"admin", "store", RPC_PERMISSION_DENIED},
        {"admin", "whoami", RPC_OK},
    };
    fake_hooks_state *st = fake_hooks_get();
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        int fd = net_rig_connect(rig, false, false, NULL);
        rig_reader rd;
        rig_reader_init(&rd);
        rig_got g[2];
        int want = 1;
        unsigned calls = st->calls + (cases[i].key ? 1 : 0); /* the auth runs */
        if (cases[i].key) {
            auth(fd, 1, cases[i].key);
            want = 2;
        }
        char p[32];
        size_t pl = rig_map(p, sizeof(p), "n:u", (uint64_t)1);
        bool store = strcmp(cases[i].method, "store") == 0;
        call(fd, 2, cases[i].method, store ? p : NULL, store ? pl : 0);
        int n = answers(fd, &rd, g, 2);
        const rig_got *a = &g[n - 1];
        CHECK_MSG(n == want && a->msgid == 2 &&
                      (cases[i].code == RPC_OK ? !a->error : a->error && a->code == cases[i].code),
                  "%s as %s: %d answers, last %s", cases[i].method,
                  cases[i].key ? cases[i].key : "nobody", n, n ? a->text : "");
        /* a refused request never reaches its handler */
        if (cases[i].code != RPC_OK)
            CHECK(st->calls == calls);
        rig_reader_fini(&rd);
        net_rig_close(rig, fd);
    }
    net_rig_pump(rig, NULL, NULL);
    CHECK(st->keys_in_use == 0);
}

static void test_tenant_admit(void)
{
    fake_hooks_state *st = fake_hooks_get();
    int fd = net_rig_connect(rig, false, false, NULL);
    rig_reader rd;
    rig_reader_init(&rd);
    rig_got g[4];
    auth(fd, 1, "tenant:6");
    CHECK(answers(fd, &rd, g, 4) == 1 && !g[0].error);
    unsigned admits = st->admits;
    /* public methods are not admitted (auth, whoami), tenant methods are */
    call(fd, 2, "whoami", NULL, 0);
    call(fd, 3, "query", NULL, 0);
    int n = answers(fd, &rd, g, 4);
    CHECK(n == 2 && st->admits == admits + 1);
    CHECK(n == 2 && strstr(g[1].text, "\"tier\"=>\"standard\""));

    /* the tier changed since the connection authenticated */
    st->admit_tier = TIER_PREMIUM;
    call(fd, 4, "query", NULL, 0);
    n = answers(fd, &rd, g, 4);
    CHECK(n == 1 && strstr(g[0].text, "\"tier\"=>\"premium\""));
    st->admit_tier = -1;

    /* over the tier's request rate */
    st->admit = HOOK_ADMIT_RATE_LIMITED;
    st->retry_ms = 1234;
    unsigned calls = st->calls;
    call(fd, 5, "query", NULL, 0);
    n = answers(fd, &rd, g, 4);
    CHECK(n == 1 && g[0].error && g[0].code == RPC_RATE_LIMITED);
    CHECK(n == 1 && strstr(g[0].text, "\"retry_after_ms\"=>1234"));
    CHECK(st->calls == calls);
    call(fd, 6, "whoami", NULL, 0); /* still authenticated */
    n = answers(fd, &rd, g, 4);
    CHECK(n == 1 && strstr(g[0].text, "\"authenticated\"=>true"));

    /* the key was revoked: the request fails and the connection forgets who it was */
    st->admit = HOOK_ADMIT_REVOKED;
    call(fd, 7, "query", NULL, 0);
    call(fd, 8, "whoami", NULL, 0);
    n = answers(fd, &rd, g, 4);
    CHECK(n == 2 && g[0].error && g[0].code == RPC_UNAUTHENTICATED);
    CHECK(n == 2 && strstr(g[1].text, "\"authenticated\"=>false"));
    CHECK(st->keys_in_use == 0);
    st->admit = HOOK_ADMIT_OK;
    st->retry_ms = 0;
    rig_reader_fini(&rd);
    net_rig_close(rig, fd);
}

static void test_reserved_slot(void)
{
    /* a connection accepted into the slots kept for the admin (admin_reserved_connections):
     * the network layer passes the flag on; the methods decide (app.c's auth refuses tenant
     * keys on it) */
    conn *c = NULL;
    int fd = net_rig_connect(rig, false, true, &c);
    CHECK(fd >= 0 && c && conn_get_auth(c)->reserved);
    rig_reader rd;
    rig_reader_init(&rd);
    rig_got g[2];
    auth(fd, 1, "admin");
    CHECK(answers(fd, &rd, g, 2) == 1 && !g[0].error);
    CHECK(conn_get_auth(c)->admin && conn_get_auth(c)->reserved); /* kept across auth */
    rig_reader_fini(&rd);
    net_rig_close(rig, fd);
}

int main(void)
{
    rig = net_rig_create(fake_hooks(), NULL, NULL, NULL);
    if (!rig)
        return 1;
    test_barrier();
    test_failed_auth();
    test_permissions();
    test_tenant_admit();
    test_reserved_slot();
    net_rig_destroy(rig);
    CHECK(fake_hooks_get()->keys_in_use == 0);
    CHECK_RETURN();
}
