/* llm/llm_wire.c: the two protocols on bytes: request bodies, answers, error bodies,
 * Retry-After and the redaction of provider messages (llm_int.h). No I/O, so every shape
 * a provider may send is unit-tested on canned bodies.
 *
 * Anthropic Messages API: {"model", "max_tokens", "system", "messages": [{"role",
 * "content"}], "tools": [{"name", "description", "input_schema"}], "tool_choice": {"type":
 * "tool", "name"}} -> {"id", "type": "message", "model", "content": [{"type": "text",
 * "text"} | {"type": "tool_use", "id", "name", "input"}], "stop_reason", "usage":
 * {"input_tokens", "output_tokens", "cache_creation_input_tokens",
 * "cache_read_input_tokens"}}; errors {"type": "error", "error": {"type", "message"}}.
 *
 * OpenAI chat completions: {"model", "max_completion_tokens" (or "max_tokens"),
 * "messages": [{"role": "system"|"user"|"assistant", "content"}], "response_format":
 * {"type": "json_schema", "json_schema": {"name", "description", "schema", "strict":
 * true}}} -> {"id", "model", "choices": [{"message": {"content", "refusal"},
 * "finish_reason"}], "usage": {"prompt_tokens", "completion_tokens"}}; errors {"error":
 * {"message", "type", "code"}}.
 */
#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json.h"
#include "llm_int.h"
#include "rpc.h"

/* The answer's envelope plus the structured value in it (Anthropic's tool input sits four
 * levels down: a value may nest 28 deep there); llm_jdoc_parse caps it at 32 anyway. */
#define ANSWER_MAX_DEPTH 32

/* ---- request bodies ---------------------------------------------------------------------- */

/* Appends s (n bytes) as a JSON string; -EINVAL when it is not UTF-8. */
static int put_str(ubuf *b, const char *s, size_t n)
{
    if (n > UINT32_MAX)
        return -EINVAL;
    msgpack_object o = {.type = MSGPACK_OBJECT_STR};
    o.via.str.ptr = s;
    o.via.str.size = (uint32_t)n;
    int rc = json_from_msgpack(&o, 0, 0, b);
    return rc == JSON_E_UNSUPPORTED ? -EINVAL : rc;
}

static int put_double(ubuf *b, double d)
{
    msgpack_object o = {.type = MSGPACK_OBJECT_FLOAT64};
    o.via.f64 = d;
    int rc = json_from_msgpack(&o, 0, 0, b);
    return rc == JSON_E_UNSUPPORTED ? -EINVAL : rc;
}

static bool name_ok(const char *name)
{
    size_t n = strlen(name);
    if (n == 0 || n > 64)
        return false;
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)name[i]) && name[i] != '_' && name[i] != '-')
            return false;
    return true;
}

/* The messages of req, with OpenAI's system message first when there is one. */
static int put_messages(ubuf *b, const llm_wire *w, const llm_request *req)
{
    int rc = ubuf_puts(b, "\"messages\":[");
    bool first = true;
    if (!rc && w->kind == LLM_OPENAI && req->system) {
        rc = ubuf_puts(b, "{\"role\":\"system\",\"content\":");
        if (!rc)
            rc = put_str(b, req->system, strlen(req->system));
        if (!rc)
            rc = ubuf_putc(b, '}');
        first = false;
    }
    for (size_t i = 0; !rc && i < req->n_messages; i++) {
        const llm_message *m = &req->messages[i];
        rc = ubuf_printf(b, "%s{\"role\":\"%s\",\"content\":", first ? "" : ",",
                         m->role == LLM_ASSISTANT ? "assistant" : "user");
        if (!rc)
            rc = put_str(b, m->text ? m->text : "", m->text ? m->len : 0);
        if (!rc)
            rc = ubuf_putc(b, '}');
        first = false;
    }
    return rc ? rc : ubuf_putc(b, ']');
}

int llm_wire_body(const llm_wire *w, const llm_request *req, ubuf *out, char *err, size_t errlen)
{
    const char *name = req->schema_name ? req->schema_name : "result";
    if (req->schema && !name_ok(name)) {
        snprintf(err, errlen, "schema_name must be 1 to 64 of A-Z a-z 0-9 _ -");
        return -EINVAL;
    }
    unsigned max_tokens = req->max_output_tokens ? req->max_output_tokens : w->max_output_tokens;
    size_t slen = 0;
    const char *schema = req->schema ? llm_schema_json(req->schema, &slen) : NULL;
    int rc = ubuf_puts(out, "{\"model\":");
    if (!rc)
        rc = put_str(out, w->model, strlen(w->model));
    if (!rc)
        rc = ubuf_printf(out, ",\"%s\":%u,",
                         w->kind == LLM_ANTHROPIC ? "max_tokens" : w->openai_max_tokens_field,
                         max_tokens);
    if (!rc && req->has_temperature) {
        rc = ubuf_puts(out, "\"temperature\":");
        if (!rc)
            rc = put_double(out, req->temperature);
        if (!rc)
            rc = ubuf_putc(out, ',');
    }
    if (!rc && w->kind == LLM_ANTHROPIC && req->system) {
        rc = ubuf_puts(out, "\"system\":");
        if (!rc)
            rc = put_str(out, req->system, strlen(req->system));
        if (!rc)
            rc = ubuf_putc(out, ',');
    }
    if (!rc)
        rc = put_messages(out, w, req);
    if (!rc && schema && w->kind == LLM_ANTHROPIC) {
        rc = ubuf_printf(out, ",\"tools\":[{\"name\":\"%s\",", name);
        if (!rc && req->schema_description) {
            rc = ubuf_puts(out, "\"description\":");
            if (!rc)
                rc = put_str(out, req->schema_description, strlen(req->schema_description));
            if (!rc)
                rc = ubuf_putc(out, ',');
        }
        if (!rc)
            rc = ubuf_puts(out, "\"input_schema\":");
        if (!rc)
            rc = ubuf_append(out, schema, slen);
        if (!rc)
            rc = ubuf_printf(out, "}],\"tool_choice\":{\"type\":\"tool\",\"name\":\"%s\"}", name);
    } else if (!rc && schema) {
        rc = ubuf_printf(out,
                         ",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":"
                         "{\"name\":\"%s\",",
                         name);
        if (!rc && req->schema_description) {
            rc = ubuf_puts(out, "\"description\":");
            if (!rc)
                rc = put_str(out, req->schema_description, strlen(req->schema_description));
            if (!rc)
                rc = ubuf_putc(out, ',');
        }
        if (!rc)
            rc = ubuf_puts(out, "\"schema\":");
        if (!rc)
            rc = ubuf_append(out, schema, slen);
        if (!rc)
            rc = ubuf_puts(out, ",\"strict\":true}}");
    }
    if (!rc)
        rc = ubuf_putc(out, '}');
    if (rc == -EINVAL)
        snprintf(err, errlen, "the system prompt or a message is not valid UTF-8");
    else if (rc)
        snprintf(err, errlen, "out of memory");
    return rc;
}

/* ---- answers ----------------------------------------------------------------------------- */

static void copy_str(char *dst, size_t cap, const msgpack_object *o)
{
    dst[0] = '\0';
    if (!o || o->type != MSGPACK_OBJECT_STR)
        return;
    size_t n = o->via.str.size < cap - 1 ? o->via.str.size : cap - 1;
    memcpy(dst, o->via.str.ptr, n);
    dst[n] = '\0';
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)dst[i] < 0x20 || dst[i] == 0x7f)
            dst[i] = ' ';
}

static uint64_t get_count(const msgpack_object *m, const char *key)
{
    const msgpack_object *o = rpc_map_get(m, key);
    return o && o->type == MSGPACK_OBJECT_POSITIVE_INTEGER ? o->via.u64 : 0;
}

static int set_text(llm_result *res, const char *p, size_t n)
{
    free(res->text);
    res->text = malloc(n + 1);
    if (!res->text) {
        res->text_len = 0;
        return -ENOMEM;
    }
    memcpy(res->text, p, n);
    res->text[n] = '\0';
    res->text_len = n;
    return 0;
}

static void fail(llm_result *res, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Sets res's failure status and reason. */
static void fail(llm_result *res, int status, const char *fmt, ...)
{
    res->status = status;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(res->reason, sizeof(res->reason), fmt, ap);
    va_end(ap);
}

/* Validates the structured value v: sets text to its JSON and, when it passes, value to
 * its MessagePack. */
static int take_value(llm_result *res, const msgpack_object *v, const llm_schema *schema)
{
    llm_jdoc d = {0};
    char why[200];
    int rc = llm_jdoc_from_object(&d, v);
    if (rc)
        goto out;
    free(res->text);
    res->text = NULL;
    rc = llm_json_text(&d.root, &res->text, &res->text_len);
    if (rc) {
        rc = rc == -ENOMEM ? -ENOMEM : 0;
        if (!rc)
            fail(res, LLM_E_MALFORMED, "the structured answer has no JSON form");
        goto out;
    }
    if (llm_schema_validate(schema, &d.root, why, sizeof(why)) != 0) {
        fail(res, LLM_E_SCHEMA, "the answer breaks the schema: %s", why);
        goto out;
    }
    res->value = d.mp.b.data; /* take the bytes: d keeps only its zone */
    res->value_len = d.mp.b.len;
    memset(&d.mp, 0, sizeof(d.mp));
    res->status = LLM_OK;
out:
    llm_jdoc_fini(&d);
    return rc;
}

/* Strips one Markdown code fence around a JSON answer (```json ... ```), which local
 * servers without constrained decoding tend to add. */
static void unfence(const char **p, size_t *n)
{
    const char *s = *p, *e = *p + *n;
    while (s < e && isspace((unsigned char)*s))
        s++;
    while (e > s && isspace((unsigned char)e[-1]))
        e--;
    if (e - s < 6 || strncmp(s, "```", 3) != 0 || strncmp(e - 3, "```", 3) != 0)
        return;
    const char *nl = memchr(s, '\n', (size_t)(e - s));
    if (!nl || nl >= e - 3)
        return;
    *p = nl + 1;
    *n = (size_t)(e - 3 - *p);
}

static int anthropic_answer(const msgpack_object *root, const llm_schema *schema, const char *name,
                            llm_result *res)
{
    const msgpack_object *usage = rpc_map_get(root, "usage");
    res->tokens_in = get_count(usage, "input_tokens") +
                     get_count(usage, "cache_creation_input_tokens") +
                     get_count(usage, "cache_read_input_tokens");
    res->tokens_out = get_count(usage, "output_tokens");
    const msgpack_object *stop = rpc_map_get(root, "stop_reason");
    copy_str(res->stop_reason, sizeof(res->stop_reason), stop);
    const msgpack_object *content = rpc_map_get(root, "content");
    if (!content || content->type != MSGPACK_OBJECT_ARRAY) {
        fail(res, LLM_E_MALFORMED, "the answer has no content list");
        return 0;
    }
    ubuf text = {0};
    const msgpack_object *input = NULL;
    for (uint32_t i = 0; i < content->via.array.size; i++) {
        const msgpack_object *blk = &content->via.array.ptr[i];
        const msgpack_object *type = rpc_map_get(blk, "type");
        if (rpc_str_eq(type, "text")) {
            const msgpack_object *t = rpc_map_get(blk, "text");
            if (t && t->type == MSGPACK_OBJECT_STR &&
                ubuf_append(&text, t->via.str.ptr, t->via.str.size) != 0) {
                ubuf_fini(&text);
                return -ENOMEM;
            }
        } else if (rpc_str_eq(type, "tool_use") && rpc_str_eq(rpc_map_get(blk, "name"), name) &&
                   !input) {
            input = rpc_map_get(blk, "input");
        }
    }
    int rc = set_text(res, text.data ? text.data : "", text.len);
    ubuf_fini(&text);
    if (rc)
        return rc;
    if (rpc_str_eq(stop, "refusal")) {
        fail(res, LLM_E_REFUSED, "the model refused (stop_reason refusal)");
        return 0;
    }
    if (rpc_str_eq(stop, "max_tokens") || rpc_str_eq(stop, "model_context_window_exceeded")) {
        fail(res, LLM_E_TRUNCATED, "the answer was cut at the token limit (stop_reason %s)",
             res->stop_reason);
        return 0;
    }
    if (!schema) {
        res->status = LLM_OK;
        return 0;
    }
    if (!input) {
        fail(res, LLM_E_MALFORMED, "the answer has no tool_use block named %s", name);
        return 0;
    }
    return take_value(res, input, schema);
}

static int openai_answer(const msgpack_object *root, const llm_schema *schema, llm_result *res)
{
    const msgpack_object *usage = rpc_map_get(root, "usage");
    res->tokens_in = get_count(usage, "prompt_tokens");
    res->tokens_out = get_count(usage, "completion_tokens");
    const msgpack_object *choices = rpc_map_get(root, "choices");
    if (!choices || choices->type != MSGPACK_OBJECT_ARRAY || choices->via.array.size == 0) {
        fail(res, LLM_E_MALFORMED, "the answer has no choices");
        return 0;
    }
    const msgpack_object *choice = &choices->via.array.ptr[0];
    const msgpack_object *finish = rpc_map_get(choice, "finish_reason");
    copy_str(res->stop_reason, sizeof(res->stop_reason), finish);
    const msgpack_object *msg = rpc_map_get(choice, "message");
    const msgpack_object *refusal = rpc_map_get(msg, "refusal");
    const msgpack_object *content = rpc_map_get(msg, "content");
    if (refusal && refusal->type == MSGPACK_OBJECT_STR) {
        int rc = set_text(res, refusal->via.str.ptr, refusal->via.str.size);
        if (!rc)
            fail(res, LLM_E_REFUSED, "the model refused (message.refusal)");
        return rc;
    }
    if (content && content->type == MSGPACK_OBJECT_STR) {
        int rc = set_text(res, content->via.str.ptr, content->via.str.size);
        if (rc)
            return rc;
    }
    if (rpc_str_eq(finish, "content_filter")) {
        fail(res, LLM_E_REFUSED, "the answer was filtered (finish_reason content_filter)");
        return 0;
    }
    if (rpc_str_eq(finish, "length")) {
        fail(res, LLM_E_TRUNCATED, "the answer was cut at the token limit (finish_reason %s)",
             res->stop_reason);
        return 0;
    }
    if (!res->text) {
        fail(res, LLM_E_MALFORMED, "the answer's message has no content");
        return 0;
    }
    if (!schema) {
        res->status = LLM_OK;
        return 0;
    }
    const char *p = res->text;
    size_t n = res->text_len;
    unfence(&p, &n);
    llm_jdoc d = {0};
    char why[160];
    int rc = llm_jdoc_parse(&d, p, n, ANSWER_MAX_DEPTH, why, sizeof(why));
    if (rc == LLM_SCHEMA_E_SYNTAX) {
        fail(res, LLM_E_MALFORMED, "the structured answer is not JSON: %s", why);
        rc = 0;
    } else if (rc == 0) {
        rc = take_value(res, &d.root, schema);
    }
    llm_jdoc_fini(&d);
    return rc;
}

int llm_wire_answer(llm_kind kind, const char *body, size_t len, const llm_schema *schema,
                    const char *schema_name, llm_result *res)
{
    llm_jdoc d = {0};
    char why[160];
    int rc = llm_jdoc_parse(&d, body, len, ANSWER_MAX_DEPTH, why, sizeof(why));
    if (rc == LLM_SCHEMA_E_SYNTAX) {
        fail(res, LLM_E_MALFORMED, "the answer is not JSON: %s", why);
        rc = 0;
        goto out;
    }
    if (rc)
        goto out;
    if (d.root.type != MSGPACK_OBJECT_MAP) {
        fail(res, LLM_E_MALFORMED, "the answer is not a JSON object");
        goto out;
    }
    copy_str(res->model, sizeof(res->model), rpc_map_get(&d.root, "model"));
    copy_str(res->response_id, sizeof(res->response_id), rpc_map_get(&d.root, "id"));
    if (kind == LLM_ANTHROPIC)
        rc = anthropic_answer(&d.root, schema, schema_name ? schema_name : "result", res);
    else
        rc = openai_answer(&d.root, schema, res);
out:
    llm_jdoc_fini(&d);
    return rc;
}

void llm_wire_error_parse(const char *body, size_t len, llm_wire_error *e)
{
    memset(e, 0, sizeof(*e));
    llm_jdoc d = {0};
    if (!body || llm_jdoc_parse(&d, body, len, 16, NULL, 0) != 0) {
        llm_jdoc_fini(&d);
        return;
    }
    const msgpack_object *err = rpc_map_get(&d.root, "error");
    if (err && err->type == MSGPACK_OBJECT_MAP) {
        copy_str(e->type, sizeof(e->type), rpc_map_get(err, "type"));
        copy_str(e->code, sizeof(e->code), rpc_map_get(err, "code"));
        copy_str(e->message, sizeof(e->message), rpc_map_get(err, "message"));
        const msgpack_object *details = rpc_map_get(err, "details");
        e->quota = strcmp(e->code, "insufficient_quota") == 0 ||
                   strcmp(e->type, "insufficient_quota") == 0 ||
                   rpc_str_eq(rpc_map_get(details, "error_code"), "enforced_spend_limit_reached");
    }
    llm_jdoc_fini(&d);
}

/* ---- Retry-After ------------------------------------------------------------------------- */

/* Days since 1970-01-01 of a civil date (Howard Hinnant's algorithm). */
static long long days_from_civil(long long y, unsigned m, unsigned d)
{
    y -= m <= 2;
    long long era = (y >= 0 ? y : y - 399) / 400;
    unsigned yoe = (unsigned)(y - era * 400);
    unsigned doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
    unsigned doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + (long long)doe - 719468;
}

/* An IMF-fixdate ("Sun, 06 Nov 1994 08:49:37 GMT") as Unix seconds; -1 if it is not one. */
static long long http_date(const char *s)
{
    static const char months[] = "JanFebMarAprMayJunJulAugSepOctNovDec";
    char wday[4], mon[4], zone[4];
    int d, y, hh, mm, ss, used = 0;
    if (sscanf(s, "%3[A-Za-z], %2d %3s %4d %2d:%2d:%2d %3s%n", wday, &d, mon, &y, &hh, &mm, &ss,
               zone, &used) != 8 ||
        strcmp(zone, "GMT") != 0 || s[used] != '\0')
        return -1;
    const char *m = strstr(months, mon);
    if (!m || (m - months) % 3 != 0 || d < 1 || d > 31 || y < 1970 || y > 9999 || hh > 23 ||
        mm > 59 || ss > 60 || hh < 0 || mm < 0 || ss < 0)
        return -1;
    unsigned month = (unsigned)(m - months) / 3 + 1;
    return days_from_civil(y, month, (unsigned)d) * 86400 + hh * 3600 + mm * 60 + ss;
}

long long llm_wire_retry_after(const char *value, long long now_unix)
{
    if (!value)
        return -1;
    while (*value == ' ' || *value == '\t')
        value++;
    char buf[64];
    size_t n = strlen(value);
    while (n > 0 && (value[n - 1] == ' ' || value[n - 1] == '\t'))
        n--;
    if (n == 0 || n >= sizeof(buf))
        return -1;
    memcpy(buf, value, n);
    buf[n] = '\0';
    if (isdigit((unsigned char)buf[0])) {
        /* delay-seconds; a fraction is read too (some servers send one) */
        char *end;
        errno = 0;
        double s = strtod(buf, &end);
        if (*end != '\0' || errno || s < 0)
            return -1;
        return s > 1e9 ? (long long)1e12 : (long long)(s * 1000.0 + 0.5);
    }
    if (buf[3] != ',')
        return -1;
    long long t = http_date(buf);
    if (t < 0)
        return -1;
    return t <= now_unix ? 0 : (t - now_unix) * 1000;
}

/* ---- redaction --------------------------------------------------------------------------- */

static bool keyish(char c)
{
    return isalnum((unsigned char)c) || c == '-' || c == '_';
}

/* Whether word (n bytes) may be a key or part of one. */
static bool suspicious(const char *w, size_t n)
{
    while (n > 0 && strchr(".,;:)('\"", w[n - 1]))
        n--;
    while (n > 0 && strchr("(\"'", w[0])) {
        w++;
        n--;
    }
    for (size_t i = 0; i + 3 <= n; i++)
        if (memcmp(w + i, "***", 3) == 0)
            return true;
    if (n >= 3 && memcmp(w, "sk-", 3) == 0)
        return true;
    if (n < 24)
        return false;
    for (size_t i = 0; i < n; i++)
        if (!keyish(w[i]))
            return false;
    return true;
}

static bool contains(const char *hay, const char *needle, size_t n)
{
    size_t h = strlen(hay);
    for (size_t i = 0; n > 0 && i + n <= h; i++)
        if (memcmp(hay + i, needle, n) == 0)
            return true;
    return false;
}

bool llm_wire_has_key(const char *s, const char *key)
{
    if (!s || !key || !*key)
        return false;
    size_t kn = strlen(key);
    size_t win = kn < 8 ? kn : 8;
    for (size_t i = 0; i + win <= kn; i++)
        if (contains(s, key + i, win))
            return true;
    return false;
}

void llm_wire_redact(const char *msg, const char *key, char *out, size_t outlen)
{
    if (outlen == 0)
        return;
    out[0] = '\0';
    size_t o = 0;
    const char *p = msg ? msg : "";
    while (*p) {
        while (*p && isspace((unsigned char)*p))
            p++;
        const char *w = p;
        while (*p && !isspace((unsigned char)*p))
            p++;
        size_t n = (size_t)(p - w);
        if (n == 0)
            break;
        const char *put = suspicious(w, n) ? "[redacted]" : w;
        size_t pn = put == w ? n : strlen(put);
        if (o + (o > 0) + pn >= outlen)
            break;
        if (o > 0)
            out[o++] = ' ';
        for (size_t i = 0; i < pn; i++)
            out[o++] = (unsigned char)put[i] < 0x20 || put[i] == 0x7f ? ' ' : put[i];
        out[o] = '\0';
    }
    if (llm_wire_has_key(out, key))
        snprintf(out, outlen, "[withheld]");
}
