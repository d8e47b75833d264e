/* tests/unit/test_llm.c: llm/ against tests/llm/mock_llm.py over real HTTP and HTTPS.
 *
 * The scripted server runs as a subprocess on a free loopback port (python3 and the script
 * come from LLM_PYTHON and LLM_MOCK, set by meson). Each scenario names a rule by a word in
 * its prompt; the server's /_calls tells what it received (bodies, headers, arrival times,
 * how many requests it held at once), which is what the checks compare with the results.
 * Both protocols run every scenario. Timing checks are bounds on retry waits and timeouts,
 * never measurements of speed.
 *
 * The API keys here are fake, and no reason string may contain them.
 */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netdb.h>
#include <arpa/inet.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <event2/event.h>
#include <event2/thread.h>

#include "check.h"
#include "llm.h"
#include "llm_int.h"
#include "rpc.h"

#define KEY "sk-test-FAKE-0123456789abcdef"
#define MODEL "test-model-1"

static const char *python, *mock_script, *mockctl;

/* ---- the scripted server ----------------------------------------------------------------- */

typedef struct mock {
    pid_t pid;
    int in_fd, out_fd;
    int port, control;
} mock;

/* Starts the server on host (NULL: 127.0.0.1), over HTTPS when cert is given. */
static int mock_start(mock *m, const char *host, const char *cert, const char *key)
{
    int in[2], out[2];
    if (pipe(in) != 0 || pipe(out) != 0)
        return -1;
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        dup2(in[0], 0);
        dup2(out[1], 1);
        close(in[0]);
        close(in[1]);
        close(out[0]);
        close(out[1]);
        setenv("MOCK_LLM_KEY", KEY, 1);
        setenv("PYTHONDONTWRITEBYTECODE", "1", 1);
        const char *h = host ? host : "127.0.0.1";
        if (cert)
            execl(python, python, mock_script, "--host", h, "--port", "0", "--tls-cert", cert,
                  "--tls-key", key, (char *)NULL);
        else
            execl(python, python, mock_script, "--host", h, "--port", "0", (char *)NULL);
        _exit(127);
    }
    close(in[0]);
    close(out[1]);
    m->pid = pid;
    m->in_fd = in[1];
    m->out_fd = out[0];
    char line[128];
    size_t n = 0;
    while (n < sizeof(line) - 1) {
        struct pollfd pf = {.fd = m->out_fd, .events = POLLIN};
        if (poll(&pf, 1, 20000) != 1)
            return -1;
        ssize_t r = read(m->out_fd, line + n, 1);
        if (r != 1)
            return -1;
        if (line[n] == '\n')
            break;
        n++;
    }
    line[n] = '\0';
    return sscanf(line, "PORT %d CONTROL %d", &m->port, &m->control) == 2 ? 0 : -1;
}

static void mock_stop(mock *m)
{
    close(m->in_fd); /* the server exits when its stdin closes */
    for (int i = 0; i < 100; i++) {
        if (waitpid(m->pid, NULL, WNOHANG) == m->pid)
            goto done;
        nanosleep(&(struct timespec){0, 50000000}, NULL);
    }
    kill(m->pid, SIGKILL);
    waitpid(m->pid, NULL, 0);
done:
    close(m->out_fd);
}

/* One request to the control port; the body of a 200 into out (NUL-terminated). */
static int mock_ctl(mock *m, const char *method, const char *path, const char *body, ubuf *out)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)m->control)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0) {
        if (fd >= 0)
            close(fd);
        return -1;
    }
    ubuf req = {0};
    ubuf_printf(&req,
                "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Type: "
                "application/json\r\nContent-Length: %zu\r\n\r\n%s",
                method, path, body ? strlen(body) : 0, body ? body : "");
    size_t off = 0;
    while (off < req.len) {
        ssize_t w = write(fd, req.data + off, req.len - off);
        if (w <= 0)
            break;
        off += (size_t)w;
    }
    ubuf_fini(&req);
    ubuf all = {0};
    char buf[65536];
    ssize_t r;
    while ((r = read(fd, buf, sizeof(buf))) > 0)
        ubuf_append(&all, buf, (size_t)r);
    close(fd);
    int status = -1;
    const char *sep = all.data ? strstr(all.data, "\r\n\r\n") : NULL;
    if (sep && sscanf(all.data, "HTTP/1.%*d %d", &status) == 1 && out)
        ubuf_puts(out, sep + 4);
    ubuf_fini(&all);
    return status == 200 ? 0 : -1;
}

static void mock_script_rules(mock *m, const char *rules)
{
    ubuf b = {0};
    ubuf_printf(&b, "{\"rules\": %s}", rules);
    CHECK_MSG(mock_ctl(m, "POST", "/_script", b.data, NULL) == 0, "cannot load rules");
    ubuf_fini(&b);
}

static void mock_reset(mock *m)
{
    CHECK(mock_ctl(m, "POST", "/_reset", "{}", NULL) == 0);
}

/* What the server received since the last reset: d's root is {"calls": [...],
 * "max_inflight": n}. */
static void mock_calls(mock *m, llm_jdoc *d)
{
    ubuf b = {0};
    memset(d, 0, sizeof(*d));
    CHECK(mock_ctl(m, "GET", "/_calls", NULL, &b) == 0);
    char err[128];
    CHECK_MSG(b.data && llm_jdoc_parse(d, b.data, b.len, 32, err, sizeof(err)) == 0,
              "/_calls is not JSON");
    ubuf_fini(&b);
}

/* A value in a parsed document by a path of keys and indexes: "calls.0.body.model". */
static const msgpack_object *at(const msgpack_object *o, const char *path)
{
    char buf[160];
    snprintf(buf, sizeof(buf), "%s", path);
    char *save = NULL;
    for (char *tok = strtok_r(buf, ".", &save); tok && o; tok = strtok_r(NULL, ".", &save)) {
        if (tok[0] >= '0' && tok[0] <= '9') {
            unsigned i = (unsigned)atoi(tok);
            o = o->type == MSGPACK_OBJECT_ARRAY && i < o->via.array.size ? &o->via.array.ptr[i]
                                                                         : NULL;
        } else {
            o = rpc_map_get(o, tok);
        }
    }
    return o;
}

static bool str_at(const msgpack_object *o, const char *path, const char *want)
{
    return rpc_str_eq(at(o, path), want);
}

static double num_at(const msgpack_object *o, const char *path)
{
    const msgpack_object *v = at(o, path);
    if (!v)
        return -1;
    if (v->type == MSGPACK_OBJECT_POSITIVE_INTEGER)
        return (double)v->via.u64;
    if (v->type == MSGPACK_OBJECT_FLOAT64 || v->type == MSGPACK_OBJECT_FLOAT32)
        return v->via.f64;
    return -1;
}

static unsigned n_calls(const llm_jdoc *d)
{
    const msgpack_object *c = at(&d->root, "calls");
    return c && c->type == MSGPACK_OBJECT_ARRAY ? c->via.array.size : 0;
}

/* ---- the rules --------------------------------------------------------------------------- */

static const char *RULES =
    "["
    "{\"name\":\"plain\",\"match\":\"PLAIN-HELLO\",\"reply\":{\"text\":\"Hello from the mock\"},"
    " \"usage\":{\"input_tokens\":21,\"output_tokens\":5}},"
    "{\"name\":\"pick\",\"match\":\"PICK-IDS\",\"reply\":{\"json\":{\"ids\":[4,2]}},"
    " \"usage\":{\"input_tokens\":30,\"output_tokens\":8}},"
    "{\"name\":\"outside\",\"match\":\"OUTSIDE-GROUP\",\"reply\":{\"json\":{\"ids\":[4,999]}}},"
    "{\"name\":\"break\",\"match\":\"BREAK-SCHEMA\",\"reply\":{\"json\":{\"ids\":[1]}},"
    " \"fault\":{\"schema_break\":true},\"usage\":{\"input_tokens\":12,\"output_tokens\":3}},"
    "{\"name\":\"malformed\",\"match\":\"MALFORMED\",\"reply\":{\"text\":\"x\"},"
    " \"fault\":{\"malformed\":true}},"
    "{\"name\":\"truncated\",\"match\":\"TRUNCATE-ME\",\"reply\":{\"text\":\"a long story "
    "that goes on\"},\"fault\":{\"truncated\":true}},"
    "{\"name\":\"refusal\",\"match\":\"REFUSE-ME\",\"reply\":{\"text\":\"x\"},"
    " \"fault\":{\"refusal\":true}},"
    "{\"name\":\"slow\",\"match\":\"SLOW-ANSWER\",\"reply\":{\"text\":\"late\"},"
    " \"fault\":{\"slow_ms\":3000}},"
    "{\"name\":\"rate1\",\"match\":\"RATE-ONCE\",\"reply\":{\"text\":\"after the wait\"},"
    " \"fault\":{\"status\":429,\"retry_after\":1,\"fail_n\":1}},"
    "{\"name\":\"ratedate\",\"match\":\"RATE-DATE\",\"reply\":{\"text\":\"after the date\"},"
    " \"fault\":{\"status\":429,\"retry_after_date\":2,\"fail_n\":1}},"
    "{\"name\":\"ratelong\",\"match\":\"RATE-LONG\",\"reply\":{\"text\":\"x\"},"
    " \"fault\":{\"status\":429,\"retry_after\":30}},"
    "{\"name\":\"ratealways\",\"match\":\"RATE-ALWAYS\",\"reply\":{\"text\":\"x\"},"
    " \"fault\":{\"status\":429}},"
    "{\"name\":\"quota\",\"match\":\"QUOTA-GONE\",\"reply\":{\"text\":\"x\"},"
    " \"fault\":{\"status\":429,\"quota\":true,\"retry_after\":1}},"
    "{\"name\":\"e500\",\"match\":\"FAIL-500-ONCE\",\"reply\":{\"text\":\"recovered\"},"
    " \"fault\":{\"status\":500,\"fail_n\":1}},"
    "{\"name\":\"e529\",\"match\":\"OVERLOADED-TWICE\",\"reply\":{\"text\":\"recovered\"},"
    " \"fault\":{\"status\":529,\"fail_n\":2}},"
    "{\"name\":\"e503\",\"match\":\"FAIL-503-ALWAYS\",\"reply\":{\"text\":\"x\"},"
    " \"fault\":{\"status\":503}},"
    "{\"name\":\"e400\",\"match\":\"BAD-REQUEST\",\"reply\":{\"text\":\"x\"},"
    " \"fault\":{\"status\":400}},"
    "{\"name\":\"drop1\",\"match\":\"DROP-ONCE\",\"reply\":{\"text\":\"second time lucky\"},"
    " \"fault\":{\"drop\":true,\"fail_n\":1}},"
    "{\"name\":\"drop\",\"match\":\"DROP-ALWAYS\",\"reply\":{\"text\":\"x\"},"
    " \"fault\":{\"drop\":true}},"
    "{\"name\":\"partial\",\"match\":\"PARTIAL-BODY\",\"reply\":{\"text\":\"x\"},"
    " \"fault\":{\"partial\":true}},"
    "{\"name\":\"echokey\",\"match\":\"ECHO-KEY\",\"reply\":{\"text\":\"x\"},"
    " \"fault\":{\"echo_key\":true}},"
    "{\"name\":\"echotype\",\"match\":\"KEY-IN-TYPE\",\"reply\":{\"text\":\"x\"},"
    " \"fault\":{\"echo_key\":\"type\"}},"
    "{\"name\":\"conc\",\"match\":\"CONCURRENT\",\"reply\":{\"echo\":true},\"delay_ms\":150},"
    "{\"name\":\"held\",\"match\":\"HOLD-SLOT\",\"reply\":{\"text\":\"held\"},\"delay_ms\":800},"
    "{\"name\":\"long\",\"match\":\"VERY-LONG\",\"reply\":{\"text\":\"x\"},\"delay_ms\":5000}"
    "]";

static const char *SCHEMA_TEXT =
    "{\"type\":\"object\",\"required\":[\"ids\"],\"additionalProperties\":false,"
    "\"properties\":{\"ids\":{\"type\":\"array\",\"items\":{\"type\":\"integer\"}}}}";

static llm_schema *SCHEMA;
static mock M;

/* ---- helpers ----------------------------------------------------------------------------- */

static const char *kname(llm_kind k)
{
    return llm_kind_name(k);
}

static void base_url(const mock *m, llm_kind kind, bool https, char *out, size_t n)
{
    snprintf(out, n, "%s://127.0.0.1:%d%s", https ? "https" : "http", m->port,
             kind == LLM_OPENAI ? "/v1" : "");
}

/* A provider for kind on the plain mock, fast settings; tweak adjusts the config. */
static llm_provider *provider(llm_kind kind, void (*tweak)(llm_config *))
{
    char url[128];
    base_url(&M, kind, false, url, sizeof(url));
    llm_config cfg;
    llm_config_init(&cfg);
    cfg.kind = kind;
    cfg.base_url = url;
    cfg.model = MODEL;
    cfg.api_key = KEY;
    cfg.timeout_ms = 5000;
    cfg.max_retries = 2;
    cfg.backoff_ms = 20;
    cfg.backoff_max_ms = 100;
    cfg.retry_after_max_ms = 5000;
    cfg.price_in_per_mtok = 1.0;
    cfg.price_out_per_mtok = 5.0;
    if (tweak)
        tweak(&cfg);
    llm_provider *p = NULL;
    char err[256];
    int rc = llm_provider_create(&cfg, &p, err, sizeof(err));
    CHECK_MSG(rc == 0, "provider: %s", err);
    return p;
}

/* Every reason is checked for the key, whole or in part. */
static void check_no_key(const llm_result *r)
{
    CHECK_MSG(strstr(r->reason, KEY) == NULL && strstr(r->reason, "0123456789abcdef") == NULL &&
                  strstr(r->reason, "FAKE") == NULL,
              "the reason holds the key: %s", r->reason);
}

/* One call with prompt as the user's message, waited for. */
static llm_result call1(llm_provider *p, const char *prompt, const llm_schema *schema)
{
    llm_message msg = {LLM_USER, prompt, strlen(prompt)};
    llm_request req = {.system = "You answer tests.",
                       .messages = &msg,
                       .n_messages = 1,
                       .schema = schema,
                       .schema_name = schema ? "pick" : NULL};
    llm_result r = {0};
    int rc = llm_call_sync(p, &req, &r);
    CHECK_MSG(rc == 0, "llm_call_sync: %d", rc);
    check_no_key(&r);
    return r;
}

static int64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

#define EXPECT(r, st)                                                                              \
    CHECK_MSG((r).status == (st), "%s: status %s, want %s (%s)", kname(kind),                      \
              llm_status_name((r).status), llm_status_name(st), (r).reason)

/* ---- scenarios --------------------------------------------------------------------------- */

static void test_plain(llm_kind kind)
{
    llm_provider *p = provider(kind, NULL);
    mock_reset(&M);
    llm_result r = call1(p, "Say PLAIN-HELLO please", NULL);
    EXPECT(r, LLM_OK);
    CHECK(r.text && strcmp(r.text, "Hello from the mock") == 0);
    CHECK(r.reason[0] == '\0' && r.http_status == 200 && r.attempts == 1 && !r.value);
    CHECK(r.tokens_in == 21 && r.tokens_out == 5);
    CHECK(r.cost_usd > 45.9e-6 && r.cost_usd < 46.1e-6); /* 21 * 1 + 5 * 5 per million */
    CHECK(strcmp(r.model, MODEL) == 0);
    CHECK(strncmp(r.response_id, kind == LLM_ANTHROPIC ? "msg_mock" : "chatcmpl-mock", 8) == 0);
    CHECK(strcmp(r.stop_reason, kind == LLM_ANTHROPIC ? "end_turn" : "stop") == 0);
    llm_result_fini(&r);

    llm_jdoc d;
    mock_calls(&M, &d);
    CHECK(n_calls(&d) == 1);
    const msgpack_object *c = at(&d.root, "calls.0");
    CHECK(str_at(c, "auth", "ok"));
    CHECK(str_at(c, "rule", "plain"));
    CHECK(str_at(c, "path", kind == LLM_ANTHROPIC ? "/v1/messages" : "/v1/chat/completions"));
    CHECK(str_at(c, "headers.content-type", "application/json"));
    CHECK(str_at(c, "headers.connection", "close"));
    CHECK(str_at(c, "body.model", MODEL));
    if (kind == LLM_ANTHROPIC) {
        CHECK(str_at(c, "headers.anthropic-version", "2023-06-01"));
        CHECK(num_at(c, "body.max_tokens") == 1024);
        CHECK(str_at(c, "body.system", "You answer tests."));
        CHECK(str_at(c, "body.messages.0.role", "user"));
        CHECK(str_at(c, "body.messages.0.content", "Say PLAIN-HELLO please"));
    } else {
        CHECK(num_at(c, "body.max_completion_tokens") == 1024);
        CHECK(str_at(c, "body.messages.0.role", "system"));
        CHECK(str_at(c, "body.messages.1.content", "Say PLAIN-HELLO please"));
    }
    llm_jdoc_fini(&d);

    llm_stats st;
    llm_provider_stats(p, &st);
    CHECK(st.calls == 1 && st.by_status[LLM_OK] == 1 && st.attempts == 1 && st.retries == 0);
    CHECK(st.tokens_in == 21 && st.tokens_out == 5 && st.in_flight == 0 && st.waiting == 0);
    CHECK(st.cost_usd > 45.9e-6 && st.cost_usd < 46.1e-6);
    llm_provider_destroy(p);
}

static void test_structured(llm_kind kind)
{
    llm_provider *p = provider(kind, NULL);
    mock_reset(&M);
    llm_result r = call1(p, "PICK-IDS from the group", SCHEMA);
    EXPECT(r, LLM_OK);
    CHECK(r.text && strcmp(r.text, "{\"ids\":[4,2]}") == 0);
    CHECK(r.value && r.value_len > 0);
    if (r.value) {
        msgpack_zone z;
        msgpack_zone_init(&z, 256);
        msgpack_object o;
        size_t off = 0;
        CHECK(msgpack_unpack(r.value, r.value_len, &off, &z, &o) == MSGPACK_UNPACK_SUCCESS);
        CHECK(num_at(&o, "ids.0") == 4 && num_at(&o, "ids.1") == 2);
        msgpack_zone_destroy(&z);
    }
    CHECK(strcmp(r.stop_reason, kind == LLM_ANTHROPIC ? "tool_use" : "stop") == 0);
    llm_result_fini(&r);
    llm_jdoc d;
    mock_calls(&M, &d);
    const msgpack_object *c = at(&d.root, "calls.0");
    if (kind == LLM_ANTHROPIC) {
        CHECK(str_at(c, "body.tools.0.name", "pick"));
        CHECK(str_at(c, "body.tools.0.input_schema.type", "object"));
        CHECK(str_at(c, "body.tool_choice.type", "tool"));
        CHECK(str_at(c, "body.tool_choice.name", "pick"));
    } else {
        CHECK(str_at(c, "body.response_format.type", "json_schema"));
        CHECK(str_at(c, "body.response_format.json_schema.name", "pick"));
        CHECK(str_at(c, "body.response_format.json_schema.schema.required.0", "ids"));
        const msgpack_object *s = at(c, "body.response_format.json_schema.strict");
        CHECK(s && s->type == MSGPACK_OBJECT_BOOLEAN && s->via.boolean);
    }
    llm_jdoc_fini(&d);

    /* ids outside the group pass the schema: that check is the caller's, and it gets them */
    r = call1(p, "OUTSIDE-GROUP", SCHEMA);
    EXPECT(r, LLM_OK);
    CHECK(r.text && strcmp(r.text, "{\"ids\":[4,999]}") == 0);
    llm_result_fini(&r);
    llm_provider_destroy(p);
}

static void test_bad_answers(llm_kind kind)
{
    llm_provider *p = provider(kind, NULL);
    mock_reset(&M);
    llm_result r = call1(p, "BREAK-SCHEMA now", SCHEMA);
    EXPECT(r, LLM_E_SCHEMA);
    CHECK_STR_CONTAINS(r.reason, "$.ids: required but missing");
    CHECK(!r.value && r.text && strcmp(r.text, "{}") == 0);
    CHECK(r.attempts == 1 && r.tokens_in == 12 && r.tokens_out == 3); /* billed all the same */
    llm_result_fini(&r);

    r = call1(p, "MALFORMED", NULL);
    EXPECT(r, LLM_E_MALFORMED);
    CHECK_STR_CONTAINS(r.reason, "not JSON");
    CHECK(r.attempts == 1 && r.http_status == 200);
    llm_result_fini(&r);

    r = call1(p, "TRUNCATE-ME", NULL);
    EXPECT(r, LLM_E_TRUNCATED);
    CHECK(r.text && strcmp(r.text, "a long story") == 0 && r.attempts == 1);
    CHECK(r.tokens_out == 1024); /* the mock says it used the whole limit */
    llm_result_fini(&r);
    r = call1(p, "TRUNCATE-ME", SCHEMA);
    EXPECT(r, LLM_E_TRUNCATED);
    llm_result_fini(&r);

    r = call1(p, "REFUSE-ME", SCHEMA);
    EXPECT(r, LLM_E_REFUSED);
    CHECK(r.attempts == 1 && !r.value);
    llm_result_fini(&r);

    llm_jdoc d;
    mock_calls(&M, &d);
    CHECK(n_calls(&d) == 5); /* none of them retried */
    llm_jdoc_fini(&d);
    llm_provider_destroy(p);
}

static void fast_timeout(llm_config *c)
{
    c->timeout_ms = 300;
    c->max_retries = 1;
    c->backoff_ms = 50;
    c->backoff_max_ms = 100;
}

static void test_timeouts(llm_kind kind)
{
    llm_provider *p = provider(kind, fast_timeout);
    mock_reset(&M);
    int64_t t0 = mono_ms();
    llm_result r = call1(p, "SLOW-ANSWER", NULL);
    int64_t dt = mono_ms() - t0;
    EXPECT(r, LLM_E_TIMEOUT);
    CHECK(r.attempts == 2);
    CHECK_STR_CONTAINS(r.reason, "no answer within 300 ms (2 attempts)");
    /* two attempts of 300 ms and a pause of 25 to 50 ms; the server would answer at 3 s */
    CHECK_MSG(dt >= 600 && dt < 2500, "took %lld ms", (long long)dt);
    CHECK(r.latency_ms >= 600 && r.latency_ms < 2500);
    llm_result_fini(&r);
    llm_jdoc d;
    mock_calls(&M, &d);
    CHECK(n_calls(&d) == 2);
    llm_jdoc_fini(&d);
    llm_provider_destroy(p);

    /* the whole call's deadline wins over the retries left */
    p = provider(kind, NULL);
    llm_message msg = {LLM_USER, "SLOW-ANSWER", 11};
    llm_request req = {.messages = &msg, .n_messages = 1, .deadline_ms = 700};
    t0 = mono_ms();
    CHECK(llm_call_sync(p, &req, &r) == 0);
    dt = mono_ms() - t0;
    EXPECT(r, LLM_E_TIMEOUT);
    CHECK_STR_CONTAINS(r.reason, "700 ms deadline");
    CHECK(r.attempts == 1);
    CHECK_MSG(dt >= 700 && dt < 2500, "took %lld ms", (long long)dt);
    check_no_key(&r);
    llm_result_fini(&r);
    llm_provider_destroy(p);
}

/* Arrival times (monotonic seconds at the server) of calls i and j. */
static double gap(const llm_jdoc *d, int i, int j)
{
    char a[32], b[32];
    snprintf(a, sizeof(a), "calls.%d.t", i);
    snprintf(b, sizeof(b), "calls.%d.t", j);
    return num_at(&d->root, b) - num_at(&d->root, a);
}

static void test_rate_limits(llm_kind kind)
{
    llm_provider *p = provider(kind, NULL);
    mock_reset(&M);
    llm_result r = call1(p, "RATE-ONCE", NULL);
    EXPECT(r, LLM_OK);
    CHECK(r.attempts == 2 && r.text && strcmp(r.text, "after the wait") == 0);
    llm_result_fini(&r);
    llm_jdoc d;
    mock_calls(&M, &d);
    CHECK(n_calls(&d) == 2);
    CHECK_MSG(gap(&d, 0, 1) >= 1.0, "Retry-After: 1 not honoured: %.3f s", gap(&d, 0, 1));
    CHECK(gap(&d, 0, 1) < 3.0);
    llm_jdoc_fini(&d);

    /* an HTTP date two seconds ahead (whole seconds: at least one second of wait) */
    mock_reset(&M);
    r = call1(p, "RATE-DATE", NULL);
    EXPECT(r, LLM_OK);
    CHECK(r.attempts == 2);
    llm_result_fini(&r);
    mock_calls(&M, &d);
    CHECK_MSG(gap(&d, 0, 1) >= 1.0, "Retry-After date not honoured: %.3f s", gap(&d, 0, 1));
    CHECK(gap(&d, 0, 1) < 4.0);
    llm_jdoc_fini(&d);

    /* a wait longer than allowed ends the call at once */
    mock_reset(&M);
    int64_t t0 = mono_ms();
    r = call1(p, "RATE-LONG", NULL);
    EXPECT(r, LLM_E_RATE_LIMITED);
    CHECK(r.attempts == 1 && r.http_status == 429 && mono_ms() - t0 < 3000);
    CHECK_STR_CONTAINS(r.reason, "asks to wait 30 s");
    llm_result_fini(&r);

    /* 429 every time: retried with backoff, then rate limited */
    r = call1(p, "RATE-ALWAYS", NULL);
    EXPECT(r, LLM_E_RATE_LIMITED);
    CHECK(r.attempts == 3);
    CHECK_STR_CONTAINS(r.reason, "HTTP 429");
    CHECK_STR_CONTAINS(r.reason,
                       kind == LLM_ANTHROPIC ? "rate_limit_error" : "rate_limit_exceeded");
    CHECK_STR_CONTAINS(r.reason, "(3 attempts)");
    llm_result_fini(&r);

    /* a spent quota or spend limit: waiting does not help, so no retry */
    r = call1(p, "QUOTA-GONE", NULL);
    EXPECT(r, LLM_E_RATE_LIMITED);
    CHECK(r.attempts == 1);
    llm_result_fini(&r);
    mock_calls(&M, &d);
    CHECK(n_calls(&d) == 5);
    llm_jdoc_fini(&d);
    llm_stats st;
    llm_provider_stats(p, &st);
    CHECK(st.calls == 5 && st.attempts == 9 && st.retries == 4);
    CHECK(st.by_status[LLM_OK] == 2 && st.by_status[LLM_E_RATE_LIMITED] == 3);
    llm_provider_destroy(p);
}

static void test_server_errors(llm_kind kind)
{
    llm_provider *p = provider(kind, NULL);
    mock_reset(&M);
    llm_result r = call1(p, "FAIL-500-ONCE", NULL);
    EXPECT(r, LLM_OK);
    CHECK(r.attempts == 2 && strcmp(r.text, "recovered") == 0);
    llm_result_fini(&r);
    r = call1(p, "OVERLOADED-TWICE", NULL);
    EXPECT(r, LLM_OK);
    CHECK(r.attempts == 3);
    llm_result_fini(&r);
    r = call1(p, "FAIL-503-ALWAYS", NULL);
    EXPECT(r, LLM_E_HTTP);
    CHECK(r.attempts == 3 && r.http_status == 503);
    CHECK_STR_CONTAINS(r.reason, "HTTP 503");
    llm_result_fini(&r);
    /* a 4xx other than 408, 409, 429 is never retried */
    r = call1(p, "BAD-REQUEST", NULL);
    EXPECT(r, LLM_E_HTTP);
    CHECK(r.attempts == 1 && r.http_status == 400);
    CHECK_STR_CONTAINS(r.reason, "HTTP 400 invalid_request_error: mock fault: HTTP 400");
    llm_result_fini(&r);
    llm_provider_destroy(p);
}

static void test_transport(llm_kind kind)
{
    llm_provider *p = provider(kind, NULL);
    mock_reset(&M);
    llm_result r = call1(p, "DROP-ONCE", NULL);
    EXPECT(r, LLM_OK);
    CHECK(r.attempts == 2 && strcmp(r.text, "second time lucky") == 0);
    llm_result_fini(&r);
    r = call1(p, "DROP-ALWAYS", NULL);
    EXPECT(r, LLM_E_TRANSPORT);
    CHECK(r.attempts == 3 && r.http_status == 0);
    CHECK_STR_CONTAINS(r.reason, "closed before a whole answer");
    llm_result_fini(&r);
    r = call1(p, "PARTIAL-BODY", NULL);
    EXPECT(r, LLM_E_TRANSPORT);
    CHECK(r.attempts == 3);
    llm_result_fini(&r);
    llm_provider_destroy(p);

    /* nobody listening */
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t alen = sizeof(a);
    CHECK(bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0 &&
          getsockname(fd, (struct sockaddr *)&a, &alen) == 0);
    close(fd);
    char url[64];
    snprintf(url, sizeof(url), "http://127.0.0.1:%d", ntohs(a.sin_port));
    llm_config cfg;
    llm_config_init(&cfg);
    cfg.kind = kind;
    cfg.base_url = url;
    cfg.model = MODEL;
    cfg.backoff_ms = 10;
    cfg.backoff_max_ms = 20;
    char err[200];
    CHECK(llm_provider_create(&cfg, &p, err, sizeof(err)) == 0);
    r = call1(p, "anyone?", NULL);
    EXPECT(r, LLM_E_TRANSPORT);
    CHECK(r.attempts == 3);
    CHECK_STR_CONTAINS(r.reason, "127.0.0.1");
    llm_result_fini(&r);
    llm_provider_destroy(p);
}

static void wrong_key(llm_config *c)
{
    c->api_key = "sk-test-FAKE-wrong-key-0000";
}

static void test_keys(llm_kind kind)
{
    llm_provider *p = provider(kind, wrong_key);
    mock_reset(&M);
    llm_result r = call1(p, "PLAIN-HELLO", NULL);
    EXPECT(r, LLM_E_HTTP);
    CHECK(r.http_status == 401 && r.attempts == 1);
    CHECK(strstr(r.reason, "wrong-key") == NULL && strstr(r.reason, "0000") == NULL);
    llm_result_fini(&r);
    llm_jdoc d;
    mock_calls(&M, &d);
    CHECK(str_at(&d.root, "calls.0.auth", "wrong"));
    llm_jdoc_fini(&d);
    llm_provider_destroy(p);

    /* a provider whose error message quotes the key it got */
    p = provider(kind, NULL);
    r = call1(p, "ECHO-KEY", NULL);
    EXPECT(r, LLM_E_HTTP);
    CHECK_STR_CONTAINS(r.reason, "HTTP 400");
    CHECK_MSG(strstr(r.reason, "[redacted]") || strstr(r.reason, "[withheld]"), "%s", r.reason);
    llm_result_fini(&r);
    r = call1(p, "KEY-IN-TYPE", NULL); /* the key where no message redaction looks */
    EXPECT(r, LLM_E_HTTP);
    CHECK_STR_CONTAINS(r.reason, "withheld");
    llm_result_fini(&r);
    llm_provider_destroy(p);

    /* no key at all */
    llm_config cfg;
    llm_config_init(&cfg);
    char url[128];
    base_url(&M, kind, false, url, sizeof(url));
    cfg.kind = kind;
    cfg.base_url = url;
    cfg.model = MODEL;
    char err[200];
    CHECK(llm_provider_create(&cfg, &p, err, sizeof(err)) == 0);
    mock_reset(&M);
    r = call1(p, "PLAIN-HELLO", NULL);
    EXPECT(r, LLM_E_HTTP);
    llm_result_fini(&r);
    mock_calls(&M, &d);
    CHECK(str_at(&d.root, "calls.0.auth", "missing"));
    llm_jdoc_fini(&d);
    llm_provider_destroy(p);
}

/* ---- concurrency ------------------------------------------------------------------------- */

/* Results of async calls. Filled on the calls' threads (no CHECK there: check.h's counters
 * are not thread-safe); checked by the main thread. */
typedef struct tally {
    int done;
    int ok;
    int key_leaks;
    int refused; /* llm_call did not take the call */
    int status[LLM_STATUS_COUNT];
    char reasons[4][LLM_REASON_MAX];
} tally;

static void count_done(llm_result *res, void *arg)
{
    tally *t = arg;
    if (strstr(res->reason, KEY) || strstr(res->reason, "0123456789abcdef") ||
        strstr(res->reason, "FAKE"))
        t->key_leaks++;
    if (t->done < 4)
        snprintf(t->reasons[t->done], LLM_REASON_MAX, "%s", res->reason);
    t->done++;
    t->ok += res->status == LLM_OK;
    if (res->status >= 0 && res->status < LLM_STATUS_COUNT)
        t->status[res->status]++;
}

static void cap2(llm_config *c)
{
    c->max_concurrency = 2;
}

static void run_until(struct event_base *b, const tally *t, int n)
{
    int64_t end = mono_ms() + 30000;
    while (t->done < n && mono_ms() < end)
        event_base_loop(b, EVLOOP_ONCE);
}

typedef struct worker_arg {
    llm_provider *p;
    int n;
    tally t;
} worker_arg;

static void *worker(void *arg)
{
    worker_arg *w = arg;
    struct event_base *b = event_base_new();
    llm_message msg = {LLM_USER, "CONCURRENT from a thread", 24};
    llm_request req = {.messages = &msg, .n_messages = 1};
    for (int i = 0; i < w->n; i++)
        if (llm_call(w->p, b, &req, count_done, &w->t) != 0)
            w->t.refused++;
    run_until(b, &w->t, w->n - w->t.refused);
    llm_detach(w->p, b);
    event_base_free(b);
    return NULL;
}

static void test_concurrency(llm_kind kind)
{
    llm_provider *p = provider(kind, cap2);
    mock_reset(&M);
    struct event_base *b = event_base_new();
    tally t = {0};
    char texts[6][32];
    for (int i = 0; i < 6; i++) {
        snprintf(texts[i], sizeof(texts[i]), "CONCURRENT %d", i);
        llm_message msg = {LLM_USER, texts[i], strlen(texts[i])};
        llm_request req = {.messages = &msg, .n_messages = 1};
        CHECK(llm_call(p, b, &req, count_done, &t) == 0);
    }
    CHECK(t.done == 0); /* never inside llm_call */
    llm_stats st;
    llm_provider_stats(p, &st);
    CHECK(st.in_flight == 2 && st.waiting == 4);
    run_until(b, &t, 6);
    CHECK_MSG(t.ok == 6, "%d of 6 ok: %s", t.ok, t.reasons[0]);
    CHECK(t.key_leaks == 0);
    llm_jdoc d;
    mock_calls(&M, &d);
    CHECK(n_calls(&d) == 6);
    CHECK_MSG(num_at(&d.root, "max_inflight") == 2, "the server held %.0f at once",
              num_at(&d.root, "max_inflight"));
    llm_jdoc_fini(&d);
    llm_provider_stats(p, &st);
    CHECK(st.in_flight == 0 && st.waiting == 0 && st.calls == 6);
    llm_detach(p, b);

    /* two threads, each with its own loop, share the cap of 2 */
    mock_reset(&M);
    worker_arg w[2] = {{p, 3, {0}}, {p, 3, {0}}};
    pthread_t th[2];
    for (int i = 0; i < 2; i++)
        CHECK(pthread_create(&th[i], NULL, worker, &w[i]) == 0);
    for (int i = 0; i < 2; i++)
        pthread_join(th[i], NULL);
    CHECK_MSG(w[0].t.ok == 3 && w[1].t.ok == 3, "threads: %d and %d ok (%s)", w[0].t.ok, w[1].t.ok,
              w[0].t.reasons[0]);
    CHECK(w[0].t.refused == 0 && w[1].t.refused == 0);
    CHECK(w[0].t.key_leaks == 0 && w[1].t.key_leaks == 0);
    mock_calls(&M, &d);
    CHECK(n_calls(&d) == 6);
    CHECK_MSG(num_at(&d.root, "max_inflight") <= 2, "the server held %.0f at once",
              num_at(&d.root, "max_inflight"));
    llm_jdoc_fini(&d);
    llm_provider_destroy(p);

    /* a call that cannot get a slot before its deadline */
    p = provider(kind, cap2);
    mock_reset(&M);
    tally t2 = {0};
    llm_message hold = {LLM_USER, "HOLD-SLOT", 9};
    llm_request rh = {.messages = &hold, .n_messages = 1};
    CHECK(llm_call(p, b, &rh, count_done, &t2) == 0);
    CHECK(llm_call(p, b, &rh, count_done, &t2) == 0);
    llm_message quick = {LLM_USER, "PLAIN-HELLO", 11};
    llm_request rq = {.messages = &quick, .n_messages = 1, .deadline_ms = 300};
    CHECK(llm_call(p, b, &rq, count_done, &t2) == 0);
    run_until(b, &t2, 3);
    CHECK(t2.ok == 2 && t2.status[LLM_E_TIMEOUT] == 1);
    CHECK_STR_CONTAINS(t2.reasons[0], "no free slot within the 300 ms deadline");
    llm_detach(p, b);
    llm_provider_destroy(p);
    event_base_free(b);
}

static void stop_loop(evutil_socket_t fd, short what, void *arg)
{
    event_base_loopbreak(arg);
}

static void test_detach(llm_kind kind)
{
    llm_provider *p = provider(kind, cap2);
    mock_reset(&M);
    struct event_base *b = event_base_new();
    tally t = {0};
    llm_message msg = {LLM_USER, "VERY-LONG", 9};
    llm_request req = {.messages = &msg, .n_messages = 1};
    for (int i = 0; i < 3; i++) /* two in flight, one waiting for a slot */
        CHECK(llm_call(p, b, &req, count_done, &t) == 0);
    struct timeval tv = {0, 300000};
    event_base_once(b, -1, EV_TIMEOUT, stop_loop, b, &tv);
    event_base_dispatch(b);
    CHECK(t.done == 0);
    llm_detach(p, b);
    CHECK(t.done == 3 && t.status[LLM_E_CANCELLED] == 3);
    CHECK_STR_CONTAINS(t.reasons[0], "cancelled");
    llm_stats st;
    llm_provider_stats(p, &st);
    CHECK(st.in_flight == 0 && st.waiting == 0);
    /* the base can be used again */
    tally t2 = {0};
    llm_message hi = {LLM_USER, "PLAIN-HELLO", 11};
    llm_request rq = {.messages = &hi, .n_messages = 1};
    CHECK(llm_call(p, b, &rq, count_done, &t2) == 0);
    run_until(b, &t2, 1);
    CHECK(t2.ok == 1);
    llm_detach(p, b);
    event_base_free(b);
    llm_provider_destroy(p);
}

static void *sync_thread(void *arg)
{
    llm_provider *p = arg;
    llm_result *r = calloc(1, sizeof(*r));
    llm_message msg = {LLM_USER, "PICK-IDS in the background", 26};
    llm_request req = {.messages = &msg, .n_messages = 1, .schema = SCHEMA};
    CHECK(llm_call_sync(p, &req, r) == 0);
    return r;
}

static void test_sync_thread(llm_kind kind)
{
    llm_provider *p = provider(kind, NULL);
    pthread_t th;
    void *out = NULL;
    CHECK(pthread_create(&th, NULL, sync_thread, p) == 0);
    pthread_join(th, &out);
    llm_result *r = out;
    EXPECT(*r, LLM_OK);
    CHECK(r->value != NULL);
    llm_result_fini(r);
    free(r);
    llm_provider_destroy(p);
}

/* ---- TLS --------------------------------------------------------------------------------- */

static void test_tls(const char *dir)
{
    char cert[700], key[700], ca[700], other[700];
    snprintf(cert, sizeof(cert), "%s/server.pem", dir);
    snprintf(key, sizeof(key), "%s/server.key", dir);
    snprintf(ca, sizeof(ca), "%s/ca.pem", dir);
    snprintf(other, sizeof(other), "%s/other_ca.pem", dir);
    mock tm;
    if (mock_start(&tm, NULL, cert, key) != 0) {
        CHECK_MSG(0, "the HTTPS mock did not start");
        return;
    }
    mock_script_rules(&tm, RULES);
    for (llm_kind kind = LLM_ANTHROPIC; kind <= LLM_OPENAI; kind++) {
        mock_reset(&tm);
        char url[128];
        base_url(&tm, kind, true, url, sizeof(url));
        llm_config cfg;
        llm_config_init(&cfg);
        cfg.kind = kind;
        cfg.base_url = url;
        cfg.model = MODEL;
        cfg.api_key = KEY;
        cfg.ca_file = ca;
        cfg.backoff_ms = 10;
        cfg.backoff_max_ms = 20;
        llm_provider *p = NULL;
        char err[256];
        CHECK_MSG(llm_provider_create(&cfg, &p, err, sizeof(err)) == 0, "%s", err);
        llm_result r = call1(p, "PICK-IDS over TLS", SCHEMA);
        EXPECT(r, LLM_OK);
        CHECK(r.value != NULL);
        llm_result_fini(&r);
        r = call1(p, "DROP-ONCE", NULL); /* a new TLS connection for the retry */
        EXPECT(r, LLM_OK);
        CHECK_MSG(r.attempts == 2, "%u attempts", r.attempts);
        llm_result_fini(&r);
        llm_provider_destroy(p);

        /* a CA that did not sign the server's certificate: refused, not retried */
        cfg.ca_file = other;
        CHECK(llm_provider_create(&cfg, &p, err, sizeof(err)) == 0);
        r = call1(p, "PLAIN-HELLO", NULL);
        EXPECT(r, LLM_E_TLS);
        CHECK(r.attempts == 1 && r.http_status == 0);
        CHECK_STR_CONTAINS(r.reason, "did not verify");
        llm_result_fini(&r);
        llm_provider_destroy(p);
        /* nor does the system's store know the test CA */
        cfg.ca_file = NULL;
        CHECK(llm_provider_create(&cfg, &p, err, sizeof(err)) == 0);
        r = call1(p, "PLAIN-HELLO", NULL);
        EXPECT(r, LLM_E_TLS);
        llm_result_fini(&r);
        llm_provider_destroy(p);
        llm_jdoc d;
        mock_calls(&tm, &d);
        CHECK(n_calls(&d) == 3); /* the refused handshakes never reached HTTP */
        llm_jdoc_fini(&d);
    }

    /* by name: "localhost" through the provider's resolver, checked against the SAN, when
     * this machine resolves it to 127.0.0.1 first (the mock listens there only) */
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *ai = NULL;
    bool v4 = getaddrinfo("localhost", NULL, &hints, &ai) == 0 && ai->ai_family == AF_INET &&
              ((struct sockaddr_in *)ai->ai_addr)->sin_addr.s_addr == htonl(INADDR_LOOPBACK);
    if (ai)
        freeaddrinfo(ai);
    if (v4) {
        char url[128];
        snprintf(url, sizeof(url), "https://localhost:%d", tm.port);
        llm_config cfg;
        llm_config_init(&cfg);
        cfg.kind = LLM_ANTHROPIC;
        cfg.base_url = url;
        cfg.model = MODEL;
        cfg.api_key = KEY;
        cfg.ca_file = ca;
        llm_provider *p = NULL;
        char err[256];
        CHECK(llm_provider_create(&cfg, &p, err, sizeof(err)) == 0);
        llm_kind kind = LLM_ANTHROPIC;
        llm_result r = call1(p, "PLAIN-HELLO", NULL);
        EXPECT(r, LLM_OK);
        llm_result_fini(&r);
        llm_provider_destroy(p);
    } else {
        fprintf(stderr, "note: localhost does not resolve to 127.0.0.1 first; the TLS test by "
                        "name was skipped\n");
    }
    mock_stop(&tm);
}

/* An IPv6 literal in the URL: brackets in the Host header, none for connecting. Where the
 * machine has no ::1, says so and skips. */
static void test_ipv6(void)
{
    int fd = socket(AF_INET6, SOCK_STREAM, 0);
    struct sockaddr_in6 a = {.sin6_family = AF_INET6, .sin6_addr = IN6ADDR_LOOPBACK_INIT};
    bool have = fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0;
    if (fd >= 0)
        close(fd);
    mock m6;
    if (!have || mock_start(&m6, "::1", NULL, NULL) != 0) {
        fprintf(stderr, "note: no IPv6 loopback here; the IPv6 test was skipped\n");
        return;
    }
    mock_script_rules(&m6, RULES);
    char url[80];
    snprintf(url, sizeof(url), "http://[::1]:%d/v1/", m6.port);
    llm_config cfg;
    llm_config_init(&cfg);
    cfg.kind = LLM_OPENAI;
    cfg.base_url = url;
    cfg.model = MODEL;
    cfg.api_key = KEY;
    llm_provider *p = NULL;
    char err[200];
    CHECK_MSG(llm_provider_create(&cfg, &p, err, sizeof(err)) == 0, "%s", err);
    llm_kind kind = LLM_OPENAI;
    llm_result r = call1(p, "PLAIN-HELLO", NULL);
    EXPECT(r, LLM_OK);
    llm_result_fini(&r);
    llm_jdoc d;
    mock_calls(&m6, &d);
    char host[40];
    snprintf(host, sizeof(host), "[::1]:%d", m6.port);
    CHECK(str_at(&d.root, "calls.0.headers.host", host));
    CHECK(str_at(&d.root, "calls.0.path", "/v1/chat/completions"));
    llm_jdoc_fini(&d);
    llm_provider_destroy(p);
    mock_stop(&m6);
}

/* ---- configuration ----------------------------------------------------------------------- */

static int write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    if (!f)
        return -1;
    fputs(text, f);
    fclose(f);
    return 0;
}

static void test_key_file(const char *dir)
{
    char path[512], key[64], err[256];
    snprintf(path, sizeof(path), "%s/key", dir);
    struct {
        const char *text, *want;
    } cases[] = {
        {"sk-plain-key\n", "sk-plain-key"},
        {"  sk-spaced \r\n", "sk-spaced"},
        {"# my key\n\nANTHROPIC_API_KEY=\"sk-ant-quoted\"\n", "sk-ant-quoted"},
        {"export OPENAI_API_KEY=sk-exported\nOTHER=x\n", "sk-exported"},
        {"QUJDREVGR0g=\n", "QUJDREVGR0g="},
        {"abc=def\n", "abc=def"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        CHECK(write_file(path, cases[i].text) == 0);
        key[0] = '\0';
        CHECK(llm_config_key_from_file(path, key, sizeof(key), err, sizeof(err)) == 0);
        CHECK_MSG(strcmp(key, cases[i].want) == 0, "case %zu: got '%s'", i, key);
    }
    CHECK(write_file(path, "# nothing here\n\n") == 0);
    CHECK(llm_config_key_from_file(path, key, sizeof(key), err, sizeof(err)) == -EINVAL);
    CHECK_STR_CONTAINS(err, "holds no key");
    CHECK(write_file(path, "sk-this-key-is-far-too-long-for-the-buffer-0123456789-0123456789\n") ==
          0);
    CHECK(llm_config_key_from_file(path, key, 16, err, sizeof(err)) == -ENAMETOOLONG);
    CHECK(strstr(err, "sk-this") == NULL);
    snprintf(path, sizeof(path), "%s/missing", dir);
    CHECK(llm_config_key_from_file(path, key, sizeof(key), err, sizeof(err)) == -ENOENT);
}

static void test_config(void)
{
    llm_config cfg;
    llm_provider *p = NULL;
    char err[256];
    llm_config_init(&cfg);
    CHECK(cfg.timeout_ms == 60000 && cfg.max_retries == 2 && cfg.max_concurrency == 4);
    cfg.base_url = "http://127.0.0.1:1";
    cfg.model = "m";
    CHECK(llm_provider_create(&cfg, &p, err, sizeof(err)) == -EINVAL);
    CHECK_STR_CONTAINS(err, "kind");
    cfg.kind = LLM_OPENAI;
    cfg.base_url = "ftp://127.0.0.1/";
    CHECK(llm_provider_create(&cfg, &p, err, sizeof(err)) == -EINVAL);
    cfg.base_url = "not a url";
    CHECK(llm_provider_create(&cfg, &p, err, sizeof(err)) == -EINVAL);
    cfg.base_url = "http://user:secret@127.0.0.1/v1";
    CHECK(llm_provider_create(&cfg, &p, err, sizeof(err)) == -EINVAL);
    CHECK(strstr(err, "secret") == NULL);
    cfg.base_url = "https://127.0.0.1/v1";
    cfg.ca_file = "/nonexistent/ca.pem";
    CHECK(llm_provider_create(&cfg, &p, err, sizeof(err)) == -EIO);
    cfg.ca_file = NULL;
    cfg.model = NULL;
    CHECK(llm_provider_create(&cfg, &p, err, sizeof(err)) == -EINVAL);
    cfg.model = "m";
    cfg.openai_max_tokens_field = "max_new_tokens";
    CHECK(llm_provider_create(&cfg, &p, err, sizeof(err)) == -EINVAL);
    cfg.openai_max_tokens_field = "max_tokens";
    CHECK(llm_provider_create(&cfg, &p, err, sizeof(err)) == 0);
    llm_provider_destroy(p);
    llm_provider_destroy(NULL);

    llm_kind k;
    CHECK(llm_kind_parse("anthropic", &k) == 0 && k == LLM_ANTHROPIC);
    CHECK(llm_kind_parse("openai", &k) == 0 && k == LLM_OPENAI);
    CHECK(llm_kind_parse("gemini", &k) == -EINVAL);
    CHECK(strcmp(llm_status_name(LLM_E_SCHEMA), "schema") == 0);
    CHECK(strcmp(llm_status_name(99), "unknown") == 0);

    /* URL forms: a full endpoint URL is used as it is, a query string kept, max_tokens */
    char url[160];
    snprintf(url, sizeof(url), "http://127.0.0.1:%d/v1/chat/completions/?api-version=1", M.port);
    llm_config_init(&cfg);
    cfg.kind = LLM_OPENAI;
    cfg.base_url = url;
    cfg.model = MODEL;
    cfg.api_key = KEY;
    cfg.openai_max_tokens_field = "max_tokens";
    CHECK(llm_provider_create(&cfg, &p, err, sizeof(err)) == 0);
    mock_reset(&M);
    llm_kind kind = LLM_OPENAI;
    llm_result r = call1(p, "PLAIN-HELLO", NULL);
    EXPECT(r, LLM_OK);
    llm_result_fini(&r);
    llm_jdoc d;
    mock_calls(&M, &d);
    CHECK(str_at(&d.root, "calls.0.path", "/v1/chat/completions?api-version=1"));
    CHECK(num_at(&d.root, "calls.0.body.max_tokens") == 1024);
    CHECK(!at(&d.root, "calls.0.body.max_completion_tokens"));
    char host[32];
    snprintf(host, sizeof(host), "127.0.0.1:%d", M.port);
    CHECK(str_at(&d.root, "calls.0.headers.host", host));
    llm_jdoc_fini(&d);

    /* requests refused at the door: done never runs */
    struct event_base *b = event_base_new();
    tally t = {0};
    llm_message bad = {LLM_USER, "\xff\xfe", 2};
    llm_request req = {.messages = &bad, .n_messages = 1};
    CHECK(llm_call(p, b, &req, count_done, &t) == -EINVAL);
    req.n_messages = 0;
    CHECK(llm_call(p, b, &req, count_done, &t) == -EINVAL);
    llm_schema *arr = NULL;
    CHECK(llm_schema_create("{\"type\":\"array\"}", 16, &arr, err, sizeof(err)) == 0);
    llm_message ok = {LLM_USER, "x", 1};
    llm_request rs = {.messages = &ok, .n_messages = 1, .schema = arr};
    CHECK(llm_call(p, b, &rs, count_done, &t) == -EINVAL);
    rs.schema = SCHEMA;
    rs.schema_name = "bad name!";
    CHECK(llm_call(p, b, &rs, count_done, &t) == -EINVAL);
    event_base_loop(b, EVLOOP_NONBLOCK);
    CHECK(t.done == 0);
    llm_schema_destroy(arr);
    llm_detach(p, b);
    event_base_free(b);
    llm_provider_destroy(p);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    evthread_use_pthreads();
    python = getenv("LLM_PYTHON");
    mock_script = getenv("LLM_MOCK");
    mockctl = getenv("LLM_MOCKCTL");
    if (!python || !mock_script || !mockctl) {
        fprintf(stderr, "LLM_PYTHON, LLM_MOCK and LLM_MOCKCTL must be set (meson test does)\n");
        return 1;
    }
    char err[256];
    if (llm_schema_create(SCHEMA_TEXT, strlen(SCHEMA_TEXT), &SCHEMA, err, sizeof(err)) != 0) {
        fprintf(stderr, "schema: %s\n", err);
        return 1;
    }
    char dir[] = "/tmp/test_llm.XXXXXX";
    if (!mkdtemp(dir) || mock_start(&M, NULL, NULL, NULL) != 0) {
        fprintf(stderr, "cannot start %s with %s\n", mock_script, python);
        return 1;
    }
    mock_script_rules(&M, RULES);

    test_config();
    test_key_file(dir);
    test_ipv6();
    for (llm_kind kind = LLM_ANTHROPIC; kind <= LLM_OPENAI; kind++) {
        fprintf(stderr, "-- %s\n", kname(kind));
        test_plain(kind);
        test_structured(kind);
        test_bad_answers(kind);
        test_timeouts(kind);
        test_rate_limits(kind);
        test_server_errors(kind);
        test_transport(kind);
        test_keys(kind);
        test_concurrency(kind);
        test_detach(kind);
        test_sync_thread(kind);
    }

    char cmd[1024];
    snprintf(cmd, sizeof(cmd), "'%s' '%s' pki '%s/pki' > /dev/null", python, mockctl, dir);
    if (system(cmd) == 0) {
        char pki[600];
        snprintf(pki, sizeof(pki), "%s/pki", dir);
        test_tls(pki);
    } else {
        CHECK_MSG(0, "cannot make the test PKI (%s)", cmd);
    }

    mock_stop(&M);
    llm_schema_destroy(SCHEMA);
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "cannot remove %s\n", dir);
    CHECK_RETURN();
}
