/* tests/unit/test_net_write.c: a request's database jobs (server/net/req.c): a write's short
 * lock probe in the worker's pool and its second try on the worker's lane when the tenant's
 * lock is held elsewhere, the tenant's next writes sent to the lane directly, a lane that
 * waited in vain, a full queue, and how the job's errors reach the client (req_fail_db). */
#include <errno.h>
#include <string.h>

#include "check.h"
#include "fake_db.h"
#include "fake_hooks.h"
#include "net_rig.h"

static net_rig *rig;

/* How the fake database answers: the pool a job went to decides. */
typedef struct script {
    const char *main_state; /* SQLSTATE of the worker's pool's answers; NULL: DB_OK */
    const char *lane_state; /* the lane's */
    bool main_unavailable;
    const char *main_message; /* the error's message; NULL: "from the script" */
    unsigned main_jobs, lane_jobs;
    int64_t last_rls;
    unsigned last_lock_timeout;
} script;

static void answer(void *ud, const fake_db_job *j, fake_db_answer *out)
{
    script *sc = ud;
    bool lane = j->pool == worker_lane_db(net_rig_worker(rig));
    sc->last_rls = j->rls_tenant;
    sc->last_lock_timeout = j->lock_timeout_ms;
    const char *state = lane ? sc->lane_state : sc->main_state;
    if (lane)
        sc->lane_jobs++;
    else
        sc->main_jobs++;
    if (!lane && sc->main_unavailable) {
        out->status = DB_UNAVAILABLE;
        out->message = "connection lost";
    } else if (state) {
        out->status = DB_ERROR;
        out->sqlstate = state;
        out->message = !lane && sc->main_message ? sc->main_message : "from the script";
    }
}

static void store(int fd, uint32_t id)
{
    char p[32], buf[128];
    size_t pl = rig_map(p, sizeof(p), "n:u", (uint64_t)id);
    size_t n = rig_pack_request(buf, sizeof(buf), false, id, "store", p, pl);
    CHECK(net_rig_send(rig, fd, buf, n) == 0);
}

static int tenant(rig_reader *rd, int64_t t)
{
    int fd = net_rig_connect(rig, false, false, NULL);
    char p[64], key[32], buf[128];
    snprintf(key, sizeof(key), "tenant:%lld", (long long)t);
    size_t pl = rig_map(p, sizeof(p), "api_key:s", key);
    size_t n = rig_pack_request(buf, sizeof(buf), false, 999, "auth", p, pl);
    CHECK(net_rig_send(rig, fd, buf, n) == 0);
    rig_got g;
    CHECK(net_rig_collect(rig, fd, rd, &g, 1) == 1 && !g.error);
    return fd;
}

static void test_write_ok(void)
{
    script sc = {0};
    fake_db_set_answer(answer, &sc);
    rig_reader rd;
    rig_reader_init(&rd);
    int fd = tenant(&rd, 21);
    store(fd, 1);
    rig_got g;
    CHECK(net_rig_collect(rig, fd, &rd, &g, 1) == 1 && !g.error);
    CHECK_STR_CONTAINS(g.text, "\"written\"=>1");
    /* the probe: the worker's pool, the tenant's row-level security, a short lock wait */
    CHECK(sc.main_jobs == 1 && sc.lane_jobs == 0);
    CHECK(sc.last_rls == 21);
    CHECK(sc.last_lock_timeout == (unsigned)net_rig_server(rig)->cfg.write_lock_probe_ms);
    rig_reader_fini(&rd);
    net_rig_close(rig, fd);
    fake_db_set_answer(NULL, NULL);
}

static void test_lock_held_elsewhere(void)
{
    script sc = {.main_state = "55P03"};
    fake_db_set_answer(answer, &sc);
    rig_reader rd;
    rig_reader_init(&rd);
    int fd = tenant(&rd, 22);
    const config *cfg = &net_rig_server(rig)->cfg;
    db_pool *lane = worker_lane_db(net_rig_worker(rig));
    store(fd, 1);
    rig_got g[3];
    int n = net_rig_collect(rig, fd, &rd, g, 3);
    /* the probe found the lock held: the same write waited for it on the lane */
    CHECK(n == 1 && !g[0].error && strstr(g[0].text, "\"written\"=>1"));
    CHECK(sc.main_jobs == 1 && sc.lane_jobs == 1);
    CHECK(sc.last_lock_timeout == (unsigned)cfg->write_lock_wait_ms);
    CHECK(sc.last_rls == 22);
    /* it succeeded there: the tenant's next write probes the pool again */
    sc.main_state = NULL;
    store(fd, 2);
    n = net_rig_collect(rig, fd, &rd, g, 3);
    CHECK(n == 1 && !g[0].error && sc.main_jobs == 2 && sc.lane_jobs == 1);
    /* while one of its writes waits on the lane, the tenant's next writes queue behind it
     * there, in order, and probe nothing ... */
    sc.main_state = "55P03";
    fake_db_hold_pool(lane, true);
    store(fd, 3);
    net_rig_pump(rig, NULL, NULL);
    sc.main_state = NULL;
    store(fd, 4);
    store(fd, 5);
    n = net_rig_collect(rig, fd, &rd, g, 3);
    CHECK(n == 0 && sc.main_jobs == 3 && fake_db_waiting() == 1);
    /* ... while another tenant's writes go to the pool */
    int other = tenant(&rd, 23);
    store(other, 6);
    n = net_rig_collect(rig, other, &rd, g, 1);
    CHECK(n == 1 && !g[0].error && sc.main_jobs == 4);
    fake_db_hold_pool(lane, false);
    n = net_rig_collect_all(rig, fd, &rd, g, 3);
    CHECK(n == 3 && g[0].msgid == 3 && g[1].msgid == 4 && g[2].msgid == 5);
    CHECK(n == 3 && !g[0].error && !g[1].error && !g[2].error);
    CHECK(sc.main_jobs == 4 && sc.lane_jobs == 4);
    rig_reader_fini(&rd);
    net_rig_close(rig, fd);
    net_rig_close(rig, other);
    fake_db_set_answer(NULL, NULL);
}

static void test_lane_waited_in_vain(void)
{
    script sc = {.main_state = "55P03", .lane_state = "55P03"};
    fake_db_set_answer(answer, &sc);
    rig_reader rd;
    rig_reader_init(&rd);
    int fd = tenant(&rd, 24);
    store(fd, 1);
    rig_got g[2];
    int n = net_rig_collect(rig, fd, &rd, g, 2);
    CHECK(n == 1 && g[0].error && g[0].code == RPC_UNAVAILABLE);
    CHECK(n == 1 && strstr(g[0].message, "write_lock_wait_ms"));
    rig_reader_fini(&rd);
    net_rig_close(rig, fd);
    fake_db_set_answer(NULL, NULL);
}

static void test_errors(void)
{
    static const struct {
        const char *sqlstate; /* NULL: DB_UNAVAILABLE */
        int code;
        const char *message; /* NULL: "from the script" */
    } cases[] = {
        {NULL, RPC_UNAVAILABLE, NULL},
        {"EG404", RPC_NOT_FOUND, NULL},
        {"EG409", RPC_CONFLICT, NULL},
        {"EG429", RPC_QUOTA_EXCEEDED, NULL},
        {"40001", RPC_UNAVAILABLE, NULL},
        {"08006", RPC_UNAVAILABLE, NULL},
        {"23505", RPC_INTERNAL, NULL},
        /* Citus, the cluster changing under the request: transient */
        {"XX000", RPC_UNAVAILABLE, "could not find valid entry for shard 102040"},
        {"XX000", RPC_UNAVAILABLE,
         "could not commit transaction for shard 102040 on any "
         "active node"},
        {"0A000", RPC_UNAVAILABLE, "COPY FROM not supported with row-level security"},
        /* the coordinator's postmaster killed under the request (test_citus_ha) */
        {"XX000", RPC_UNAVAILABLE, "postmaster was shut down, exiting"},
        /* any other internal error stays one */
        {"XX000", RPC_INTERNAL, NULL},
    };
    rig_reader rd;
    rig_reader_init(&rd);
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        script sc = {.main_state = cases[i].sqlstate,
                     .main_unavailable = !cases[i].sqlstate,
                     .main_message = cases[i].message};
        fake_db_set_answer(answer, &sc);
        int fd = tenant(&rd, 30 + (int64_t)i);
        store(fd, 1);
        rig_got g;
        int n = net_rig_collect(rig, fd, &rd, &g, 1);
        CHECK_MSG(n == 1 && g.error && g.code == cases[i].code, "%s: %s",
                  cases[i].sqlstate ? cases[i].sqlstate : "unavailable", n == 1 ? g.text : "");
        if (cases[i].code == RPC_INTERNAL) /* the database's words stay in the log */
            CHECK(!strstr(g.message, "from the script"));
        net_rig_close(rig, fd);
    }
    fake_db_set_answer(NULL, NULL);
    /* a job that cannot be queued */
    int fd = tenant(&rd, 40);
    fake_db_set_submit_error(-EAGAIN);
    store(fd, 1);
    rig_got g;
    CHECK(net_rig_collect(rig, fd, &rd, &g, 1) == 1 && g.error && g.code == RPC_UNAVAILABLE);
    CHECK_STR_CONTAINS(g.message, "queue full");
    fake_db_set_submit_error(-ENOMEM);
    store(fd, 2);
    CHECK(net_rig_collect(rig, fd, &rd, &g, 1) == 1 && g.error && g.code == RPC_INTERNAL);
    fake_db_set_submit_error(0);
    rig_reader_fini(&rd);
    net_rig_close(rig, fd);
}

static void test_client_gone(void)
{
    /* a write whose client leaves before its job ends: the job still ends (its change may
     * be committed), its answer is dropped, nothing leaks */
    rig_reader rd;
    rig_reader_init(&rd);
    int fd = tenant(&rd, 50);
    fake_db_hold(true);
    store(fd, 1);
    net_rig_pump(rig, NULL, NULL);
    CHECK(fake_db_waiting() == 1);
    net_rig_close(rig, fd);
    net_rig_pump(rig, NULL, NULL);
    uint64_t answered = fake_db_answered();
    fake_db_hold(false);
    net_rig_pump(rig, NULL, NULL);
    CHECK(fake_db_answered() == answered + 1 && fake_db_waiting() == 0);
    rig_reader_fini(&rd);
}

int main(void)
{
    rig = net_rig_create(fake_hooks(), NULL, NULL, NULL);
    if (!rig)
        return 1;
    test_write_ok();
    test_lock_held_elsewhere();
    test_lane_waited_in_vain();
    test_errors();
    test_client_gone();
    net_rig_destroy(rig);
    CHECK(fake_db_waiting() == 0);
    CHECK_RETURN();
}
