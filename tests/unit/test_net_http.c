/* tests/unit/test_net_http.c: the HTTP port's connections (server/net/hapi.c, conn.c, http.c)
 * over a socketpair: a request split anywhere or several in one write (answered in order, one
 * at a time), HEAD and keep-alive framing, Expect: 100-continue, heads the port refuses
 * (answered, then only that connection closes), the JSON API's mapping of a call to the
 * method table and back (bodies, errors and their statuses, Retry-After), the bearer key's
 * auth run once per key and cached, and the GET endpoints. */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "fake_db.h"
#include "fake_hooks.h"
#include "net_rig.h"

static net_rig *rig;

static void send_str(int fd, const char *s)
{
    CHECK(net_rig_send(rig, fd, s, strlen(s)) == 0);
}

/* Packs POST /v1/rpc/{method} with body and extra header lines (each ended by CRLF) into
 * buf. */
static size_t post_req(char *buf, size_t cap, const char *method, const char *body,
                       const char *headers)
{
    int n =
        snprintf(buf, cap, "POST /v1/rpc/%s HTTP/1.1\r\nHost: t\r\nContent-Length: %zu\r\n%s\r\n%s",
                 method, strlen(body), headers ? headers : "", body);
    CHECK(n > 0 && (size_t)n < cap);
    return (size_t)n;
}

static void post(int fd, const char *method, const char *body, const char *headers)
{
    char buf[4096];
    size_t n = post_req(buf, sizeof(buf), method, body, headers);
    CHECK(net_rig_send(rig, fd, buf, n) == 0);
}

/* One answer to what was sent: exactly one must arrive. */
static rig_http_got one(int fd, rig_http *h)
{
    rig_http_got g;
    int n = net_rig_http_collect(rig, fd, h, false, &g, 1);
    CHECK_MSG(n == 1, "%d answers", n);
    if (n != 1)
        memset(&g, 0, sizeof(g));
    return g;
}

/* Whether the server closed fd (after whatever it still held). */
static bool closed(int fd, rig_http *h)
{
    rig_http_got g;
    net_rig_pump(rig, NULL, NULL);
    while (rig_http_next(h, fd, false, &g) == 1)
        ;
    return h->eof;
}

static bool header_is(const rig_http_got *g, const char *name, const char *want)
{
    char v[256];
    return rig_http_header(g, name, v, sizeof(v)) && strcmp(v, want) == 0;
}

/* A connection of the HTTP port that answers: GET /livez. */
static bool answers(int fd)
{
    rig_http h;
    rig_http_init(&h);
    send_str(fd, "GET /livez HTTP/1.1\r\nHost: t\r\n\r\n");
    rig_http_got g;
    bool ok = net_rig_http_collect(rig, fd, &h, false, &g, 1) == 1 && g.status == 200;
    rig_http_fini(&h);
    return ok;
}

static void test_get_endpoints(void)
{
    int fd = net_rig_connect(rig, true, false, NULL);
    rig_http h;
    rig_http_init(&h);
    send_str(fd, "GET /livez HTTP/1.1\r\nHost: t\r\n\r\n");
    rig_http_got g = one(fd, &h);
    CHECK(g.status == 200 && strcmp(g.body, "{\"status\":\"alive\"}\n") == 0);
    CHECK(header_is(&g, "Content-Type", "application/json"));
    /* HEAD: the same head, no body; the next answer on the connection starts right after */
    send_str(fd, "HEAD /livez HTTP/1.1\r\nHost: t\r\n\r\nGET /metrics HTTP/1.1\r\nHost: t\r\n\r\n");
    rig_http_got two[2];
    CHECK(net_rig_http_collect(rig, fd, &h, true, &two[0], 1) == 1);
    CHECK(two[0].status == 200 && header_is(&two[0], "Content-Length", "19"));
    CHECK(net_rig_http_collect(rig, fd, &h, false, &two[1], 1) == 1);
    CHECK(two[1].status == 200 && strstr(two[1].body, "# TYPE engram_"));
    CHECK(header_is(&two[1], "Content-Type", "text/plain; version=0.0.4"));
    send_str(fd, "POST /livez HTTP/1.1\r\nHost: t\r\nContent-Length: 0\r\n\r\n");
    g = one(fd, &h);
    CHECK(g.status == 405 && header_is(&g, "Allow", "GET, HEAD"));
    send_str(fd, "GET /no/such/path HTTP/1.1\r\nHost: t\r\n\r\n");
    g = one(fd, &h);
    CHECK(g.status == 404 && strstr(g.body, "\"code\":\"not_found\""));
    /* none of these closes the connection */
    CHECK(!closed(fd, &h));
    rig_http_fini(&h);
    net_rig_close(rig, fd);
}

static void test_split_and_pipelined(void)
{
    fake_hooks_state *st = fake_hooks_get();
    int fd = net_rig_connect(rig, true, false, NULL);
    rig_http h;
    rig_http_init(&h);
    /* one byte at a time: nothing is answered before the last */
    char buf[4096];
    size_t n = post_req(buf, sizeof(buf), "echo", "{\"value\": {\"a\": [1, \"x\"]}}", NULL);
    rig_http_got g;
    for (size_t i = 0; i < n; i++) {
        CHECK(net_rig_send(rig, fd, buf + i, 1) == 0);
        int got = net_rig_http_collect(rig, fd, &h, false, &g, 1);
        CHECK_MSG(got == (i + 1 == n ? 1 : 0), "after %zu of %zu bytes: %d answers", i + 1, n, got);
    }
    CHECK(g.status == 200 && strcmp(g.body, "{\"a\":[1,\"x\"]}\n") == 0);
    /* three requests in one write, the first slow: answered in order, one at a time (the
     * later ones are not even run before it is answered) */
    unsigned echoes = st->echoes;
    size_t len = post_req(buf, sizeof(buf), "later", "{\"tag\": 1}", NULL);
    len += post_req(buf + len, sizeof(buf) - len, "echo", "{\"value\": 2}", NULL);
    len += post_req(buf + len, sizeof(buf) - len, "echo", "{\"value\": 3}", NULL);
    CHECK(net_rig_send(rig, fd, buf, len) == 0);
    rig_http_got three[3];
    CHECK(net_rig_http_collect(rig, fd, &h, false, three, 3) == 0);
    CHECK(st->echoes == echoes && fake_hooks_waiting() == 1);
    CHECK(fake_hooks_release(1, false) == 1);
    int got = net_rig_http_collect(rig, fd, &h, false, three, 3);
    CHECK_MSG(got == 3, "%d answers", got);
    CHECK(got == 3 && three[0].status == 200 && strcmp(three[0].body, "1\n") == 0);
    CHECK(got == 3 && three[1].status == 200 && strcmp(three[1].body, "2\n") == 0);
    CHECK(got == 3 && three[2].status == 200 && strcmp(three[2].body, "3\n") == 0);
    CHECK(st->echoes == echoes + 2);
    /* empty lines before a request are allowed */
    send_str(fd, "\r\n\r\nGET /livez HTTP/1.1\r\nHost: t\r\n\r\n");
    g = one(fd, &h);
    CHECK(g.status == 200);
    rig_http_fini(&h);
    net_rig_close(rig, fd);
}

static void test_connection_close_and_continue(void)
{
    /* Connection: close, and HTTP/1.0 without keep-alive: answered, then closed */
    static const char *const closing[] = {
        "GET /livez HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n",
        "GET /livez HTTP/1.0\r\n\r\n",
    };
    for (size_t i = 0; i < 2; i++) {
        int fd = net_rig_connect(rig, true, false, NULL);
        rig_http h;
        rig_http_init(&h);
        send_str(fd, closing[i]);
        rig_http_got g = one(fd, &h);
        CHECK(g.status == 200 && header_is(&g, "Connection", "close"));
        CHECK_MSG(closed(fd, &h), "%zu: still open", i);
        rig_http_fini(&h);
        net_rig_close(rig, fd);
    }
    /* Expect: 100-continue: the interim answer before the body is sent, once */
    int fd = net_rig_connect(rig, true, false, NULL);
    rig_http h;
    rig_http_init(&h);
    send_str(fd, "POST /v1/rpc/echo HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\n"
                 "Content-Length: 12\r\n\r\n");
    rig_http_got g = one(fd, &h);
    CHECK(g.status == 100);
    send_str(fd, "{\"value\":");
    rig_http_got none;
    CHECK(net_rig_http_collect(rig, fd, &h, false, &none, 1) == 0);
    send_str(fd, "42}");
    g = one(fd, &h);
    CHECK(g.status == 200 && strcmp(g.body, "42\n") == 0);
    rig_http_fini(&h);
    net_rig_close(rig, fd);
}

static void test_refused_heads(void)
{
    static char long_head[20000];
    memcpy(long_head, "GET /livez HTTP/1.1\r\nHost: t\r\nX-Pad: ", 37);
    memset(long_head + 37, 'a', sizeof(long_head) - 37 - 5);
    memcpy(long_head + sizeof(long_head) - 5, "\r\n\r\n", 5);
    static const struct {
        const char *what, *bytes;
        int status;
    } cases[] = {
        {"not HTTP", "GARBAGE\r\n\r\n", 400},
        {"no Host", "GET /livez HTTP/1.1\r\n\r\n", 400},
        {"HTTP/2", "GET /livez HTTP/2.0\r\nHost: t\r\n\r\n", 505},
        {"chunked", "POST /v1/rpc/echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n",
         411},
        {"a body over max_message_bytes",
         "POST /v1/rpc/echo HTTP/1.1\r\nHost: t\r\nContent-Length: 99999999\r\n\r\n", 413},
        {"two lengths",
         "POST /v1/rpc/echo HTTP/1.1\r\nHost: t\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
         400},
        {"a head over 16 KiB", long_head, 431},
    };
    int other = net_rig_connect(rig, true, false, NULL);
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        int fd = net_rig_connect(rig, true, false, NULL);
        rig_http h;
        rig_http_init(&h);
        /* a good request first: its answer goes out before the refusal */
        send_str(fd, "GET /livez HTTP/1.1\r\nHost: t\r\n\r\n");
        send_str(fd, cases[i].bytes);
        rig_http_got g[3];
        int n = net_rig_http_collect(rig, fd, &h, false, g, 3);
        CHECK_MSG(n == 2 && g[0].status == 200 && g[1].status == cases[i].status &&
                      strstr(g[1].body, "\"code\":") && header_is(&g[1], "Connection", "close"),
                  "%s: %d answers, last %d", cases[i].what, n, n > 0 ? g[n - 1].status : 0);
        CHECK_MSG(closed(fd, &h), "%s: still open", cases[i].what);
        rig_http_fini(&h);
        net_rig_close(rig, fd);
    }
    CHECK(answers(other)); /* only those connections closed */
    net_rig_close(rig, other);
}

static void test_json_api(void)
{
    static const struct {
        const char *what, *method, *body;
        int status;
        const char *in_body;
    } cases[] = {
        {"no body", "whoami", "", 200, "\"authenticated\":false"},
        {"a body of blanks", "whoami", " \r\n ", 200, "\"authenticated\":false"},
        {"not JSON", "echo", "{\"value\": ", 400, "\"code\":\"malformed_request\""},
        {"not an object", "echo", "[1, 2]", 400, "named parameters"},
        {"an unknown parameter", "echo", "{\"colour\": 1}", 400, "\"field\":\"colour\""},
        {"a parameter of the wrong type", "big", "{\"bytes\": \"many\"}", 400,
         "\"code\":\"invalid_argument\""},
        {"an unknown method", "no.such", "{}", 404, "\"code\":\"unknown_method\""},
        {"auth, which takes the bearer key instead", "auth", "{\"api_key\": \"admin\"}", 404,
         "Bearer"},
        {"a tenant method without a key", "query", "{}", 401, "\"code\":\"unauthenticated\""},
        {"an answer over max_result_bytes", "big", "{\"bytes\": 70000}", 413,
         "\"code\":\"result_too_large\""},
    };
    int fd = net_rig_connect(rig, true, false, NULL);
    rig_http h;
    rig_http_init(&h);
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        post(fd, cases[i].method, cases[i].body, NULL);
        rig_http_got g = one(fd, &h);
        CHECK_MSG(g.status == cases[i].status && strstr(g.body, cases[i].in_body), "%s: %d %s",
                  cases[i].what, g.status, g.body);
        if (g.status == 401)
            CHECK(header_is(&g, "WWW-Authenticate", "Bearer realm=\"engram\""));
    }
    send_str(fd, "GET /v1/rpc/echo HTTP/1.1\r\nHost: t\r\n\r\n");
    rig_http_got g = one(fd, &h);
    CHECK(g.status == 405 && header_is(&g, "Allow", "POST"));
    /* a bin result is base64 */
    post(fd, "big", "{\"bytes\": 3, \"fill\": 65}", NULL);
    g = one(fd, &h);
    CHECK(g.status == 200 && strcmp(g.body, "\"QUFB\"\n") == 0);
    CHECK(!closed(fd, &h)); /* a call's errors leave the connection open */
    rig_http_fini(&h);
    net_rig_close(rig, fd);
}

/* How the fake database answers store's jobs in test_bearer: sqlstate NULL is DB_OK. */
static const char *db_state;

static void db_answer(void *ud, const fake_db_job *j, fake_db_answer *out)
{
    if (db_state) {
        out->status = DB_ERROR;
        out->sqlstate = db_state;
        out->message = "from the test";
    }
}

static void test_bearer(void)
{
    fake_hooks_state *st = fake_hooks_get();
    int fd = net_rig_connect(rig, true, false, NULL);
    rig_http h;
    rig_http_init(&h);
    unsigned auths = st->auths;
    post(fd, "query", "", "Authorization: Basic dXNlcjpwdw==\r\n");
    rig_http_got g = one(fd, &h);
    CHECK(g.status == 401 && header_is(&g, "WWW-Authenticate", "Bearer realm=\"engram\""));
    CHECK(st->auths == auths);
    /* the key's auth runs before the call, once: the next call with it reuses it */
    post(fd, "query", "", "Authorization: Bearer tenant:5\r\n");
    g = one(fd, &h);
    CHECK(g.status == 200 && strstr(g.body, "\"tenant\":5"));
    CHECK(st->auths == auths + 1);
    post(fd, "query", "", "Authorization: bearer   tenant:5\r\n");
    g = one(fd, &h);
    CHECK(g.status == 200 && strstr(g.body, "\"tenant\":5") && st->auths == auths + 1);
    /* another key: its own auth */
    post(fd, "query", "", "Authorization: Bearer tenant:6\r\n");
    g = one(fd, &h);
    CHECK(g.status == 200 && strstr(g.body, "\"tenant\":6") && st->auths == auths + 2);
    CHECK(st->keys_in_use == 1);
    /* a key that fails: 401, and the connection keeps no identity */
    post(fd, "query", "", "Authorization: Bearer nobody\r\n");
    g = one(fd, &h);
    CHECK(g.status == 401 && strstr(g.body, "\"code\":\"unauthenticated\""));
    CHECK(st->keys_in_use == 0);
    post(fd, "whoami", "", NULL);
    g = one(fd, &h);
    CHECK(g.status == 200 && strstr(g.body, "\"authenticated\":false"));
    /* an auth that waits for the database holds its call until it is answered */
    fake_db_hold(true);
    unsigned calls = st->calls;
    post(fd, "query", "", "Authorization: Bearer db:tenant:7\r\n");
    rig_http_got none;
    CHECK(net_rig_http_collect(rig, fd, &h, false, &none, 1) == 0);
    CHECK(st->calls == calls + 1); /* the auth alone */
    fake_db_hold(false);
    g = one(fd, &h);
    CHECK(g.status == 200 && strstr(g.body, "\"tenant\":7"));
    /* errors of the call map to statuses */
    static const struct {
        const char *sqlstate;
        int status;
    } errs[] = {{"EG404", 404}, {"EG409", 409}, {"EG429", 429}, {"40001", 503}, {"XX000", 500}};
    fake_db_set_answer(db_answer, NULL);
    for (size_t i = 0; i < sizeof(errs) / sizeof(errs[0]); i++) {
        db_state = errs[i].sqlstate;
        post(fd, "store", "{\"n\": 1}", "Authorization: Bearer tenant:8\r\n");
        g = one(fd, &h);
        CHECK_MSG(g.status == errs[i].status, "%s: %d %s", errs[i].sqlstate, g.status, g.body);
    }
    db_state = NULL;
    post(fd, "store", "{\"n\": 12}", "Authorization: Bearer tenant:8\r\n");
    g = one(fd, &h);
    CHECK(g.status == 200 && strcmp(g.body, "{\"written\":12}\n") == 0);
    fake_db_set_answer(NULL, NULL);
    /* rate limited: 429 with Retry-After in whole seconds, rounded up */
    st->admit = HOOK_ADMIT_RATE_LIMITED;
    st->retry_ms = 1234;
    post(fd, "query", "", "Authorization: Bearer tenant:8\r\n");
    g = one(fd, &h);
    CHECK(g.status == 429 && header_is(&g, "Retry-After", "2"));
    st->admit = HOOK_ADMIT_OK;
    st->retry_ms = 0;
    /* the admin key on a tenant method: 403 */
    post(fd, "query", "", "Authorization: Bearer admin\r\n");
    g = one(fd, &h);
    CHECK(g.status == 403);
    rig_http_fini(&h);
    net_rig_close(rig, fd);
    net_rig_pump(rig, NULL, NULL);
    CHECK(st->keys_in_use == 0);
}

int main(void)
{
    const char *settings[] = {"--max-message-bytes=65536", "--max-result-bytes=65536", NULL};
    rig = net_rig_create(fake_hooks(), settings, NULL, NULL);
    if (!rig)
        return 1;
    test_get_endpoints();
    test_split_and_pipelined();
    test_connection_close_and_continue();
    test_refused_heads();
    test_json_api();
    test_bearer();
    net_rig_destroy(rig);
    CHECK(fake_db_waiting() == 0);
    CHECK(fake_hooks_get()->keys_in_use == 0);
    CHECK_RETURN();
}
