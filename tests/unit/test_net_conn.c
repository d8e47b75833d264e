/* tests/unit/test_net_conn.c: a connection's framing and pipelining (server/net/conn.c,
 * req.c) over a socketpair: messages split anywhere or many in one read, oversize and
 * malformed input (only that connection closes), answers in the order requests finish,
 * notifications, unknown methods and parameters, and the in-flight limit before auth. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "fake_db.h"
#include "fake_hooks.h"
#include "net_rig.h"

static net_rig *rig;

/* Sends one request (params: a map packed by rig_map, or NULL) on fd. */
static void call(int fd, uint32_t id, const char *method, const char *params, size_t plen)
{
    char buf[4096];
    size_t n = rig_pack_request(buf, sizeof(buf), false, id, method, params, plen);
    CHECK(net_rig_send(rig, fd, buf, n) == 0);
}

static void echo(int fd, uint32_t id, int64_t v)
{
    char p[64];
    size_t pl = rig_map(p, sizeof(p), "value:i", v);
    call(fd, id, "echo", p, pl);
}

/* A connection that answers: echo answers its value. */
static bool answers(int fd)
{
    rig_reader rd;
    rig_reader_init(&rd);
    echo(fd, 4242, 4242);
    rig_got g;
    int n = net_rig_collect(rig, fd, &rd, &g, 1);
    bool ok = n == 1 && !g.error && g.msgid == 4242 && strcmp(g.text, "4242") == 0;
    rig_reader_fini(&rd);
    return ok;
}

/* Whether the server closed fd (EOF after whatever it still held). */
static bool closed(int fd, rig_reader *rd)
{
    rig_got g;
    net_rig_pump(rig, NULL, NULL);
    while (rig_reader_next(rd, fd, &g) == 1)
        ;
    return rd->eof;
}

static void test_split_frames(void)
{
    int fd = net_rig_connect(rig, false, false, NULL);
    CHECK(fd >= 0);
    char p[64], buf[256];
    size_t pl = rig_map(p, sizeof(p), "value:s", "split across reads");
    size_t n = rig_pack_request(buf, sizeof(buf), false, 7, "echo", p, pl);
    rig_reader rd;
    rig_reader_init(&rd);
    rig_got g;
    /* one byte at a time: nothing is answered before the last */
    for (size_t i = 0; i < n; i++) {
        CHECK(net_rig_send(rig, fd, buf + i, 1) == 0);
        int got = net_rig_collect(rig, fd, &rd, &g, 1);
        CHECK_MSG(got == (i + 1 == n ? 1 : 0), "after %zu of %zu bytes: %d answers", i + 1, n, got);
    }
    CHECK(g.msgid == 7 && !g.error);
    CHECK_STR_CONTAINS(g.text, "split across reads");
    /* two messages split in the middle of each other's neighbours */
    char two[512];
    size_t a = rig_pack_request(two, sizeof(two), false, 8, "echo", p, pl);
    size_t b = rig_pack_request(two + a, sizeof(two) - a, false, 9, "echo", p, pl);
    CHECK(net_rig_send(rig, fd, two, a - 3) == 0);
    CHECK(net_rig_collect(rig, fd, &rd, &g, 1) == 0);
    CHECK(net_rig_send(rig, fd, two + a - 3, 5) == 0);
    CHECK(net_rig_collect(rig, fd, &rd, &g, 1) == 1 && g.msgid == 8);
    CHECK(net_rig_send(rig, fd, two + a + 2, b - 2) == 0);
    CHECK(net_rig_collect(rig, fd, &rd, &g, 1) == 1 && g.msgid == 9);
    rig_reader_fini(&rd);
    net_rig_close(rig, fd);
}

static void test_many_frames_one_read(void)
{
    int fd = net_rig_connect(rig, false, false, NULL);
    enum { N = 200 };
    char *buf = malloc(N * 64);
    size_t len = 0;
    for (uint32_t i = 1; i <= N; i++) {
        char p[32];
        size_t pl = rig_map(p, sizeof(p), "value:i", (int64_t)i * 3);
        len += rig_pack_request(buf + len, N * 64 - len, false, i, "echo", p, pl);
    }
    CHECK(net_rig_send(rig, fd, buf, len) == 0);
    free(buf);
    rig_reader rd;
    rig_reader_init(&rd);
    rig_got *g = calloc(N + 1, sizeof(*g));
    int n = 0;
    /* before auth a connection runs 8 requests at a time: it reads on as they end */
    for (int round = 0; round < 50 && n < N; round++) {
        int got = net_rig_collect(rig, fd, &rd, g + n, (size_t)(N + 1 - n));
        CHECK(got >= 0);
        n += got > 0 ? got : 0;
    }
    CHECK_MSG(n == N, "%d answers", n);
    bool ordered = true;
    for (int i = 0; i < n; i++) {
        char want[24];
        snprintf(want, sizeof(want), "%d", (i + 1) * 3);
        ordered = ordered && g[i].msgid == (uint32_t)i + 1 && strcmp(g[i].text, want) == 0;
    }
    CHECK(ordered); /* synchronous answers keep the requests' order */
    free(g);
    rig_reader_fini(&rd);
    net_rig_close(rig, fd);
}

static void test_oversize(void)
{
    int other = net_rig_connect(rig, false, false, NULL);
    int fd = net_rig_connect(rig, false, false, NULL);
    size_t max = (size_t)net_rig_server(rig)->cfg.max_message_bytes;
    /* a str32 header announcing more than max_message_bytes: refused before it arrives */
    char big[64];
    size_t n = rig_pack_request(big, sizeof(big), false, 11, "echo", NULL, 0);
    big[n - 1] = (char)0x91; /* params: an array of one map ... */
    big[n++] = (char)0x81;
    big[n++] = (char)0xa5;
    memcpy(big + n, "value", 5);
    n += 5;
    big[n++] = (char)0xdb; /* str32 */
    uint32_t len = (uint32_t)max + 1;
    big[n++] = (char)(len >> 24);
    big[n++] = (char)(len >> 16);
    big[n++] = (char)(len >> 8);
    big[n++] = (char)len;
    CHECK(net_rig_send(rig, fd, big, n) == 0);
    rig_reader rd;
    rig_reader_init(&rd);
    rig_got g;
    int got = net_rig_collect(rig, fd, &rd, &g, 1);
    CHECK(got == 1 && g.error && g.code == RPC_MALFORMED_REQUEST && g.msgid == 11);
    CHECK(closed(fd, &rd));
    rig_reader_fini(&rd);
    net_rig_close(rig, fd);
    CHECK(answers(other)); /* only that connection closed */
    net_rig_close(rig, other);
}

static void test_malformed(void)
{
    static const struct {
        const char *what;
        const char *bytes;
        size_t n;
        int64_t msgid; /* the error answer's msgid, -1: none can be read */
    } cases[] = {
        {"a reserved byte", "\xc1", 1, -1},
        {"not an array", "\x81\xa1x\x01", 4, -1},
        {"a response sent to the server", "\x94\x01\x05\xc0\xc0", 5, -1},
        {"a method that is not a string", "\x94\x00\x09\x07\x90", 5, 9},
        {"params that are not an array", "\x94\x00\x0a\xa4ping\x07", 9, 10},
        {"a request of five items", "\x95\x00\x0b\xa4ping\x90\xc0", 10, 11},
    };
    int other = net_rig_connect(rig, false, false, NULL);
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        int fd = net_rig_connect(rig, false, false, NULL);
        /* a good request first: its answer goes out before the connection closes */
        echo(fd, 1, 5);
        CHECK(net_rig_send(rig, fd, cases[i].bytes, cases[i].n) == 0);
        rig_reader rd;
        rig_reader_init(&rd);
        rig_got g[4];
        int got = net_rig_collect(rig, fd, &rd, g, 4);
        CHECK_MSG(got >= 1 && g[0].msgid == 1 && !g[0].error, "%s: %d answers", cases[i].what, got);
        if (cases[i].msgid >= 0)
            CHECK_MSG(got == 2 && g[1].error && g[1].code == RPC_MALFORMED_REQUEST &&
                          g[1].msgid == (uint32_t)cases[i].msgid,
                      "%s: %d answers", cases[i].what, got);
        else
            CHECK_MSG(got == 1, "%s: %d answers", cases[i].what, got);
        CHECK_MSG(closed(fd, &rd), "%s: still open", cases[i].what);
        rig_reader_fini(&rd);
        net_rig_close(rig, fd);
    }
    CHECK(answers(other));
    net_rig_close(rig, other);
}

/* A tenant's connection: its budget holds many answers' reservations at once. */
static int tenant_conn(void)
{
    int fd = net_rig_connect(rig, false, false, NULL);
    char p[64];
    size_t pl = rig_map(p, sizeof(p), "api_key:s", "tenant:1");
    call(fd, 999, "auth", p, pl);
    rig_reader rd;
    rig_reader_init(&rd);
    rig_got g;
    CHECK(net_rig_collect(rig, fd, &rd, &g, 1) == 1 && !g.error);
    rig_reader_fini(&rd);
    return fd;
}

static void test_pipelining_order(void)
{
    int fd = tenant_conn();
    char p[32];
    size_t pl;
    pl = rig_map(p, sizeof(p), "tag:i", (int64_t)1);
    call(fd, 1, "later", p, pl);
    echo(fd, 2, 2);
    pl = rig_map(p, sizeof(p), "tag:i", (int64_t)3);
    call(fd, 3, "later", p, pl);
    echo(fd, 4, 4);
    rig_reader rd;
    rig_reader_init(&rd);
    rig_got g[4];
    int n = net_rig_collect(rig, fd, &rd, g, 4);
    /* the quick answers do not wait for the slow ones before them */
    CHECK(n == 2 && g[0].msgid == 2 && g[1].msgid == 4);
    CHECK(fake_hooks_waiting() == 2);
    CHECK(fake_hooks_release(1, true) == 1); /* the newest first: 3 */
    n = net_rig_collect(rig, fd, &rd, g, 4);
    CHECK(n == 1 && g[0].msgid == 3 && strcmp(g[0].text, "3") == 0);
    CHECK(fake_hooks_release(1, false) == 1);
    n = net_rig_collect(rig, fd, &rd, g, 4);
    CHECK(n == 1 && g[0].msgid == 1 && strcmp(g[0].text, "1") == 0);
    /* a request waiting when its client goes: its answer is dropped, nothing leaks */
    call(fd, 5, "later", p, pl);
    net_rig_pump(rig, NULL, NULL);
    CHECK(fake_hooks_waiting() == 1);
    rig_reader_fini(&rd);
    net_rig_close(rig, fd);
    net_rig_pump(rig, NULL, NULL);
    CHECK(fake_hooks_release(1, false) == 1);
    net_rig_pump(rig, NULL, NULL);
}

static void test_notifications(void)
{
    int fd = net_rig_connect(rig, false, false, NULL);
    fake_hooks_state *st = fake_hooks_get();
    unsigned before = st->echoes;
    char buf[256], p[32];
    size_t pl = rig_map(p, sizeof(p), "value:i", (int64_t)1);
    size_t n = rig_pack_request(buf, sizeof(buf), true, 0, "echo", p, pl);
    n += rig_pack_request(buf + n, sizeof(buf) - n, true, 0, "no.such.method", NULL, 0);
    n += rig_pack_request(buf + n, sizeof(buf) - n, true, 0, "query", NULL, 0); /* needs auth */
    pl = rig_map(p, sizeof(p), "bytes:s", "many");
    n += rig_pack_request(buf + n, sizeof(buf) - n, true, 0, "big", p, pl); /* bad params */
    CHECK(net_rig_send(rig, fd, buf, n) == 0);
    echo(fd, 77, 77);
    rig_reader rd;
    rig_reader_init(&rd);
    rig_got g[4];
    int got = net_rig_collect(rig, fd, &rd, g, 4);
    /* notifications are run, never answered, even when they fail */
    CHECK(got == 1 && g[0].msgid == 77);
    CHECK(st->echoes == before + 2);
    CHECK(!closed(fd, &rd));
    rig_reader_fini(&rd);
    net_rig_close(rig, fd);
}

static void test_unknown_method_and_params(void)
{
    int fd = net_rig_connect(rig, false, false, NULL);
    char p[64];
    call(fd, 1, "no.such.method", NULL, 0);
    size_t pl = rig_map(p, sizeof(p), "bytes:s", "many");
    call(fd, 2, "big", p, pl);
    pl = rig_map(p, sizeof(p), "colour:s", "red");
    call(fd, 3, "echo", p, pl);
    call(fd, 4, "big", NULL, 0);
    rig_reader rd;
    rig_reader_init(&rd);
    rig_got g[4];
    int n = net_rig_collect(rig, fd, &rd, g, 4);
    CHECK(n == 4);
    CHECK(g[0].error && g[0].code == RPC_UNKNOWN_METHOD);
    CHECK_STR_CONTAINS(g[0].message, "no.such.method");
    CHECK(g[1].error && g[1].code == RPC_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(g[1].text, "\"field\"=>\"bytes\"");
    CHECK(g[2].error && g[2].code == RPC_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(g[2].message, "colour");
    CHECK(g[3].error && g[3].code == RPC_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(g[3].message, "bytes");
    rig_reader_fini(&rd);
    CHECK(answers(fd)); /* none of these closes the connection */
    net_rig_close(rig, fd);
}

static void test_budget_before_auth(void)
{
    int fd = net_rig_connect(rig, false, false, NULL);
    fake_hooks_state *st = fake_hooks_get();
    unsigned before = st->calls;
    char p[32];
    for (uint32_t i = 1; i <= 20; i++) {
        size_t pl = rig_map(p, sizeof(p), "tag:i", (int64_t)i);
        call(fd, i, "later", p, pl);
    }
    net_rig_pump(rig, NULL, NULL);
    /* before auth a connection's budget is 64 KiB, and each request reserves 32 KiB for its
     * answer: one runs, the others wait for its answer */
    CHECK_MSG(st->calls - before == 1, "%u running", st->calls - before);
    rig_reader rd;
    rig_reader_init(&rd);
    rig_got g[20];
    int total = 0;
    for (int round = 0; round < 40 && total < 20; round++) {
        fake_hooks_release(8, false);
        int n = net_rig_collect(rig, fd, &rd, g + total, (size_t)(20 - total));
        total += n > 0 ? n : 0;
    }
    CHECK_MSG(total == 20 && st->calls - before == 20, "%d answers, %u runs", total,
              st->calls - before);
    bool ordered = true;
    for (int i = 0; i < total; i++)
        ordered = ordered && g[i].msgid == (uint32_t)i + 1;
    CHECK(ordered);
    rig_reader_fini(&rd);
    net_rig_close(rig, fd);
}

int main(void)
{
    const char *settings[] = {"--max-message-bytes=65536", NULL};
    rig = net_rig_create(fake_hooks(), settings, NULL, NULL);
    if (!rig) {
        fprintf(stderr, "cannot set up the rig\n");
        return 1;
    }
    CHECK(fake_hooks_get()->worker_inits == 1);
    test_split_frames();
    test_many_frames_one_read();
    test_oversize();
    test_malformed();
    test_pipelining_order();
    test_notifications();
    test_unknown_method_and_params();
    test_budget_before_auth();
    net_rig_destroy(rig);
    CHECK(fake_hooks_get()->worker_finis == 1);
    CHECK(fake_db_waiting() == 0);
    CHECK_RETURN();
}
