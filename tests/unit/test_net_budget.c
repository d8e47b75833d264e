/* tests/unit/test_net_budget.c: a connection's budgets (server/net/conn.c, req.c): an answer
 * over max_result_bytes is refused (result_too_large) and the connection goes on; answers a
 * client does not read count against max_output_bytes, so later requests wait (parked) and
 * the connection stops reading, then all resume, in order, once the client reads; an
 * answer that outgrew what was left runs again once it fits; max_inflight_per_conn. The
 * server's side of each connection buffers little in the kernel (net_rig_set_sndbuf), so
 * what the client leaves unread stays where the budgets see it. */
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>

#include <linux/sockios.h>

#include "check.h"
#include "fake_db.h"
#include "fake_hooks.h"
#include "net_rig.h"

#define BUDGET 65536 /* max_output_bytes and max_result_bytes, their least values */

static net_rig *rig;

static void call(int fd, uint32_t id, const char *method, const char *params, size_t plen)
{
    char buf[1024];
    size_t n = rig_pack_request(buf, sizeof(buf), false, id, method, params, plen);
    CHECK(net_rig_send(rig, fd, buf, n) == 0);
}

static void big(int fd, uint32_t id, uint64_t bytes)
{
    char p[64];
    size_t pl = rig_map(p, sizeof(p), "bytes:u fill:u", bytes, (uint64_t)(id & 0xff));
    call(fd, id, "big", p, pl);
}

/* A tenant connection. */
static int tenant(rig_reader *rd)
{
    int fd = net_rig_connect(rig, false, false, NULL);
    char p[64];
    size_t pl = rig_map(p, sizeof(p), "api_key:s", "tenant:1");
    call(fd, 1000, "auth", p, pl);
    rig_got g;
    CHECK(net_rig_collect(rig, fd, rd, &g, 1) == 1 && !g.error);
    return fd;
}

/* Bytes the client sent that the server has not read. */
static int unread_by_server(int fd)
{
    int n = 0;
    ioctl(fd, SIOCOUTQ, &n);
    return n;
}

/* Reads answers until want arrived or nothing more comes. */
static int read_all(int fd, rig_reader *rd, rig_got *g, int want)
{
    int n = net_rig_collect_all(rig, fd, rd, g, (size_t)want);
    CHECK(n >= 0);
    return n;
}

static void test_result_too_large(void)
{
    rig_reader rd;
    rig_reader_init(&rd);
    int fd = tenant(&rd);
    big(fd, 1, BUDGET + 1);
    big(fd, 2, 100);
    rig_got g[2];
    int n = read_all(fd, &rd, g, 2);
    CHECK(n == 2);
    CHECK(n == 2 && g[0].error && g[0].code == RPC_RESULT_TOO_LARGE);
    CHECK(n == 2 && strstr(g[0].text, "\"limit\"=>65536"));
    /* the connection goes on */
    CHECK(n == 2 && !g[1].error && g[1].bin == 100);
    rig_reader_fini(&rd);
    net_rig_close(rig, fd);
}

static void test_parked_until_read(void)
{
    enum { N = 8, SIZE = 30000 };
    fake_hooks_state *st = fake_hooks_get();
    rig_reader rd;
    rig_reader_init(&rd);
    int fd = tenant(&rd);
    unsigned before = st->calls;
    for (uint32_t i = 1; i <= N; i++)
        big(fd, i, SIZE);
    net_rig_pump(rig, NULL, NULL);
    /* the client reads nothing: a few answers fill the budget, the rest wait */
    unsigned ran = st->calls - before;
    CHECK_MSG(ran >= 1 && ran < N, "%u of %d ran", ran, N);
    /* and the connection reads nothing more */
    big(fd, N + 1, 10);
    net_rig_pump(rig, NULL, NULL);
    CHECK(unread_by_server(fd) > 0);
    CHECK(st->calls - before == ran);
    rig_got *g = calloc(N + 1, sizeof(*g));
    int n = read_all(fd, &rd, g, N + 1);
    CHECK_MSG(n == N + 1, "%d answers", n);
    bool ok = true;
    for (int i = 0; i < n; i++)
        ok = ok && !g[i].error && g[i].msgid == (uint32_t)i + 1 && g[i].bin == (i < N ? SIZE : 10);
    CHECK(ok); /* all of them, in order, once read */
    CHECK(unread_by_server(fd) == 0);
    free(g);
    rig_reader_fini(&rd);
    net_rig_close(rig, fd);
}

static void test_run_again(void)
{
    fake_hooks_state *st = fake_hooks_get();
    rig_reader rd;
    rig_reader_init(&rd);
    int fd = tenant(&rd);
    unsigned before = st->calls;
    /* unread output, then an answer larger than its reservation and than what is left: it
     * is packed, found too large for now, and runs again once the output is read */
    big(fd, 1, 20000);
    net_rig_pump(rig, NULL, NULL);
    big(fd, 2, 60000);
    net_rig_pump(rig, NULL, NULL);
    rig_got g[2];
    int n = read_all(fd, &rd, g, 2);
    CHECK(n == 2 && !g[0].error && g[0].bin == 20000);
    CHECK(n == 2 && !g[1].error && g[1].bin == 60000);
    CHECK_MSG(st->calls - before == 3, "%u runs", st->calls - before);
    rig_reader_fini(&rd);
    net_rig_close(rig, fd);
}

static void test_inflight_limit(void)
{
    fake_hooks_state *st = fake_hooks_get();
    rig_reader rd;
    rig_reader_init(&rd);
    int fd = tenant(&rd);
    unsigned before = st->calls;
    char p[32];
    for (uint32_t i = 1; i <= 10; i++) {
        size_t pl = rig_map(p, sizeof(p), "tag:u", (uint64_t)i);
        call(fd, i, "later", p, pl);
    }
    net_rig_pump(rig, NULL, NULL);
    CHECK_MSG(st->calls - before == 4, "%u running", st->calls - before); /* the setting */
    rig_got g[10];
    int total = 0;
    for (int round = 0; round < 10 && total < 10; round++) {
        fake_hooks_release(10, false);
        total += read_all(fd, &rd, g + total, 10 - total);
    }
    CHECK(total == 10 && st->calls - before == 10);
    rig_reader_fini(&rd);
    net_rig_close(rig, fd);
}

int main(void)
{
    const char *settings[] = {"--max-output-bytes=65536", "--max-result-bytes=65536", NULL};
    rig = net_rig_create(fake_hooks(), settings, NULL, NULL);
    if (!rig)
        return 1;
    net_rig_set_sndbuf(rig, 4096);
    test_result_too_large();
    test_parked_until_read();
    test_run_again();
    net_rig_destroy(rig);
    /* the in-flight limit alone, under the default budgets */
    const char *inflight[] = {"--max-inflight-per-conn=4", NULL};
    rig = net_rig_create(fake_hooks(), inflight, NULL, NULL);
    if (!rig)
        return 1;
    test_inflight_limit();
    net_rig_destroy(rig);
    CHECK_RETURN();
}
