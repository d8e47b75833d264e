/* fuzz/server.c: a libFuzzer target that drives the whole request path of engramd's network
 * layer: bytes from a client, through a socketpair, into a real connection of a worker
 * (conn.c's framing, budgets and backpressure), then req.c (decoding, method lookup, the auth
 * barrier, permissions, admission, binding, answers, database jobs with their write lanes)
 * or, on the HTTP port, hapi.c (HTTP/1.1 framing, the JSON API's rpc_call, bearer keys, the
 * GET endpoints). h2o's fuzz/driver.cc is the model: the fuzzer finds what the parsers' own
 * fuzzers cannot, the state carried between requests of one connection.
 *
 * The worker runs on the fuzzer's thread (tests/fakes/net_rig.h), its method table is the
 * network layer tests' (tests/fakes/fake_hooks.h: echo, a slow method answered later, a
 * write through the database, auth by key, ...) and its database pools are answered by
 * tests/fakes/fake_db.h as the input's header says. Everything a connection opened is ended
 * by the end of each input, so a leak, a use after free or a request never answered shows
 * in the input that caused it.
 *
 * An input: 4 header bytes, then the client's bytes.
 *   h[0] bit 0       the HTTP port (else MessagePack-RPC)
 *        bits 1-2    RPC: authenticated first as nobody, tenant:3, the admin, or tenant:4
 *                    through a database job (db:tenant:4)
 *        bit 3       accepted into the reserved slots
 *        bit 4       the client reads its answers as they come (else only at the end: the
 *                    server's output budgets fill up)
 *        bits 5-6    tenant_admit answers ok, ok, rate limited, or revoked
 *        bit 7       the database answers nothing until the client's bytes are all sent
 *   h[1] bits 0-6    the client's bytes are sent in pieces of that many bytes (0: at once),
 *                    with the worker's loop run, and one slow request answered, between
 *                    pieces
 *        bit 7       a second client on the same worker, the same port and first
 *                    authenticated the same, sends the same bytes, its pieces taking turns
 *                    with the first's (the worker's state they share: a tenant's write lane,
 *                    its key's count, the process-wide output budget)
 *   h[2], h[3]       the database's answers, two bits per job in turn: ok, an error with a
 *                    SQLSTATE the server maps, unavailable, or a lock timeout (55P03)
 *
 * Build and run: see README.md, Testing (meson setup with CC=clang and -Dfuzz=true).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fake_db.h"
#include "fake_hooks.h"
#include "log.h"
#include "net_rig.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define REQUIRE(cond)                                                                              \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "%s:%d: invariant broken: %s\n", __FILE__, __LINE__, #cond);           \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

static net_rig *rig;

/* ---- the database's answers ------------------------------------------------------------ */

static uint16_t db_script;
static unsigned db_jobs;

static void db_answer(void *ud, const fake_db_job *j, fake_db_answer *out)
{
    static const char *const states[] = {"EG404", "EG409", "EG429", "EG400", "40001",
                                         "08006", "23505", "EG402", "57014", "EG410"};
    unsigned k = db_jobs++;
    switch ((db_script >> (2 * (k % 8))) & 3) {
    case 0:
        break;
    case 1:
        out->status = DB_ERROR;
        out->sqlstate = states[(k + j->seq) % (sizeof(states) / sizeof(states[0]))];
        out->message = "fuzz";
        break;
    case 2:
        out->status = DB_UNAVAILABLE;
        out->message = "fuzz: no connection";
        break;
    default:
        out->status = DB_ERROR;
        out->sqlstate = "55P03";
        out->message = "fuzz: lock not available";
        break;
    }
}

/* ---- the client ------------------------------------------------------------------------- */

/* Reads and drops what the client can read; false once the server closed the connection. */
static bool drain(int fd)
{
    char buf[65536];
    size_t len = 0;
    long n;
    do {
        len = 0;
        n = net_rig_read(fd, buf, &len, sizeof(buf));
    } while (n > 0);
    return n == 0;
}

/* Authenticates the RPC connection fd as who says (1: tenant:3, 2: the admin, 3: tenant:4
 * through a database job), the way a client would, before its own bytes. */
static void authenticate(int fd, int who)
{
    static const char *const keys[] = {NULL, "tenant:3", "admin", "db:tenant:4"};
    char params[128], msg[256];
    size_t pl = rig_map(params, sizeof(params), "api_key:s", keys[who]);
    size_t n = rig_pack_request(msg, sizeof(msg), false, 0xfffffff0u, "auth", params, pl);
    (void)net_rig_send(rig, fd, msg, n);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    /* small limits, so that inputs of a few KiB reach them */
    static const char *const settings[] = {
        "--max-message-bytes=65536",  "--max-result-bytes=65536", "--max-output-bytes=65536",
        "--max-inflight-per-conn=16", "--max-depth=16",           NULL};
    rig = net_rig_create(fake_hooks(), settings, NULL, NULL);
    if (!rig) {
        fprintf(stderr, "fuzz/server: cannot set up the network layer\n");
        exit(1);
    }
    log_set_level(LOG_OFF);
    net_rig_set_sndbuf(rig, 8192);
    fake_db_set_answer(db_answer, NULL);
    return 0;
}

/* A client of the input: its end of the socketpair, and whether the server still reads. */
typedef struct client {
    int fd;
    bool open;
} client;

/* Sends n bytes of the input on cl; false once the server closed the connection or reads no
 * more. */
static bool send_piece(client *cl, const uint8_t *data, size_t n)
{
    if (!cl->open)
        return false;
    if (net_rig_send(rig, cl->fd, data, n) < 0)
        cl->open = false;
    return cl->open;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 4)
        return 0;
    uint8_t flags = data[0];
    size_t piece = data[1] & 0x7f ? data[1] & 0x7f : size;
    bool twin = data[1] & 0x80;
    db_script = (uint16_t)(data[2] | data[3] << 8);
    db_jobs = 0;
    data += 4;
    size -= 4;
    bool http = flags & 1, reads = flags & 0x10, hold = flags & 0x80;
    int who = (flags >> 1) & 3;
    static const hook_admit admits[] = {HOOK_ADMIT_OK, HOOK_ADMIT_OK, HOOK_ADMIT_RATE_LIMITED,
                                        HOOK_ADMIT_REVOKED};
    fake_hooks_state *st = fake_hooks_get();
    st->admit = admits[(flags >> 5) & 3];
    st->retry_ms = 1500;
    fake_db_hold(hold);

    client cl[2];
    size_t ncl = twin ? 2 : 1;
    for (size_t i = 0; i < ncl; i++) {
        cl[i].fd = net_rig_connect(rig, http, flags & 8, NULL);
        cl[i].open = true;
        REQUIRE(cl[i].fd >= 0);
        if (!http && who)
            authenticate(cl[i].fd, who);
    }
    for (size_t off = 0; off < size;) {
        size_t n = size - off < piece ? size - off : piece;
        bool any = false;
        for (size_t i = 0; i < ncl; i++) {
            if (!send_piece(&cl[i], data + off, n))
                continue; /* the server closed the connection, or reads no more */
            any = true;
            net_rig_pump(rig, NULL, NULL);
        }
        if (!any)
            break;
        off += n;
        fake_hooks_release(1, (off & 1) != 0);
        for (size_t i = 0; reads && i < ncl; i++)
            if (cl[i].open && !drain(cl[i].fd))
                cl[i].open = false;
    }
    /* the rest of the input's life: the database answers, every slow request is answered,
     * the clients read everything, then go */
    fake_db_hold(false);
    for (int round = 0; round < 8 && (fake_hooks_waiting() || fake_db_waiting()); round++) {
        fake_hooks_release(SIZE_MAX, false);
        net_rig_pump(rig, NULL, NULL);
        for (size_t i = 0; i < ncl; i++)
            drain(cl[i].fd);
    }
    for (size_t i = 0; i < ncl; i++)
        net_rig_close(rig, cl[i].fd);
    net_rig_pump(rig, NULL, NULL);
    fake_hooks_release(SIZE_MAX, false);
    net_rig_pump(rig, NULL, NULL);

    /* nothing of the connections may be left: no request waiting, no job, no key counted */
    REQUIRE(fake_hooks_waiting() == 0);
    REQUIRE(fake_db_waiting() == 0);
    REQUIRE(st->keys_in_use == 0);
    REQUIRE(atomic_load(&net_rig_server(rig)->nconns) == 0);
    REQUIRE(atomic_load(&net_rig_server(rig)->nhttp) == 0);
    st->admit = HOOK_ADMIT_OK;
    st->retry_ms = 0;
    return 0;
}
