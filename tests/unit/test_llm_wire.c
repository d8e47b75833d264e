/* tests/unit/test_llm_wire.c: llm/llm_wire.c on canned bytes: the request bodies of both
 * protocols, every answer shape (text, tool use, structured content, refusals, truncation,
 * broken JSON, schema violations), error bodies, Retry-After and the redaction of provider
 * messages. No network: test_llm.c runs the same code against the scripted server.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "llm_int.h"
#include "rpc.h"

static llm_schema *SCHEMA;

static const char *SCHEMA_TEXT =
    "{\"type\":\"object\",\"required\":[\"ids\"],\"additionalProperties\":false,"
    "\"properties\":{\"ids\":{\"type\":\"array\",\"items\":{\"type\":\"integer\"}}}}";

/* Builds the body of req for kind into a parsed document. */
static int body(llm_kind kind, const llm_request *req, llm_jdoc *d, ubuf *text)
{
    llm_wire w = {.kind = kind,
                  .model = "m-1",
                  .max_output_tokens = 300,
                  .openai_max_tokens_field = "max_completion_tokens"};
    char err[128];
    int rc = llm_wire_body(&w, req, text, err, sizeof(err));
    if (rc)
        return rc;
    return llm_jdoc_parse(d, text->data, text->len, 32, err, sizeof(err));
}

static const msgpack_object *at(const msgpack_object *o, const char *path)
{
    /* "a.b.0.c": keys and array indexes */
    char buf[128];
    snprintf(buf, sizeof(buf), "%s", path);
    for (char *tok = strtok(buf, "."); tok && o; tok = strtok(NULL, ".")) {
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

static bool str_at(const msgpack_object *root, const char *path, const char *want)
{
    return rpc_str_eq(at(root, path), want);
}

static uint64_t uint_at(const msgpack_object *root, const char *path)
{
    const msgpack_object *o = at(root, path);
    return o && o->type == MSGPACK_OBJECT_POSITIVE_INTEGER ? o->via.u64 : 999999;
}

static void test_bodies(void)
{
    const char *hi = "say \"hi\"\n\ttab \xc3\xa9";
    llm_message msgs[2] = {{LLM_USER, hi, strlen(hi)}, {LLM_ASSISTANT, "ok", 2}};
    llm_request req = {.system = "be brief", .messages = msgs, .n_messages = 2};
    llm_jdoc d = {0};
    ubuf t = {0};

    CHECK(body(LLM_ANTHROPIC, &req, &d, &t) == 0);
    CHECK(str_at(&d.root, "model", "m-1"));
    CHECK(uint_at(&d.root, "max_tokens") == 300);
    CHECK(str_at(&d.root, "system", "be brief"));
    CHECK(str_at(&d.root, "messages.0.role", "user"));
    CHECK(str_at(&d.root, "messages.0.content", "say \"hi\"\n\ttab \xc3\xa9"));
    CHECK(str_at(&d.root, "messages.1.role", "assistant"));
    CHECK(!at(&d.root, "tools") && !at(&d.root, "temperature") && !at(&d.root, "response_format"));
    llm_jdoc_fini(&d);
    ubuf_fini(&t);

    CHECK(body(LLM_OPENAI, &req, &d, &t) == 0);
    CHECK(uint_at(&d.root, "max_completion_tokens") == 300 && !at(&d.root, "max_tokens"));
    CHECK(!at(&d.root, "system"));
    CHECK(str_at(&d.root, "messages.0.role", "system"));
    CHECK(str_at(&d.root, "messages.0.content", "be brief"));
    CHECK(str_at(&d.root, "messages.1.role", "user"));
    CHECK(str_at(&d.root, "messages.2.role", "assistant"));
    llm_jdoc_fini(&d);
    ubuf_fini(&t);

    /* structured: Anthropic's forced tool, OpenAI's json_schema; temperature; a limit */
    req.schema = SCHEMA;
    req.schema_name = "pick_ids";
    req.schema_description = "the ids";
    req.has_temperature = true;
    req.temperature = 0.25;
    req.max_output_tokens = 77;
    CHECK(body(LLM_ANTHROPIC, &req, &d, &t) == 0);
    CHECK(uint_at(&d.root, "max_tokens") == 77);
    CHECK(str_at(&d.root, "tools.0.name", "pick_ids"));
    CHECK(str_at(&d.root, "tools.0.description", "the ids"));
    CHECK(str_at(&d.root, "tools.0.input_schema.type", "object"));
    CHECK(str_at(&d.root, "tools.0.input_schema.required.0", "ids"));
    CHECK(str_at(&d.root, "tool_choice.type", "tool"));
    CHECK(str_at(&d.root, "tool_choice.name", "pick_ids"));
    const msgpack_object *temp = at(&d.root, "temperature");
    CHECK(temp && temp->type == MSGPACK_OBJECT_FLOAT64 && temp->via.f64 == 0.25);
    llm_jdoc_fini(&d);
    ubuf_fini(&t);
    CHECK(body(LLM_OPENAI, &req, &d, &t) == 0);
    CHECK(str_at(&d.root, "response_format.type", "json_schema"));
    CHECK(str_at(&d.root, "response_format.json_schema.name", "pick_ids"));
    CHECK(str_at(&d.root, "response_format.json_schema.description", "the ids"));
    CHECK(str_at(&d.root, "response_format.json_schema.schema.properties.ids.type", "array"));
    const msgpack_object *strict = at(&d.root, "response_format.json_schema.strict");
    CHECK(strict && strict->type == MSGPACK_OBJECT_BOOLEAN && strict->via.boolean);
    llm_jdoc_fini(&d);
    ubuf_fini(&t);

    /* refused: a bad name, text that is not UTF-8 */
    req.schema_name = "has space";
    CHECK(body(LLM_OPENAI, &req, &d, &t) == -EINVAL);
    ubuf_fini(&t);
    req.schema_name = NULL;
    msgs[0].text = "bad \xff byte";
    msgs[0].len = 10;
    CHECK(body(LLM_ANTHROPIC, &req, &d, &t) == -EINVAL);
    ubuf_fini(&t);
    llm_jdoc_fini(&d);
}

/* Reads a canned answer; the status. */
static int answer(llm_kind kind, const char *text, const llm_schema *schema, llm_result *res)
{
    llm_result_fini(res);
    CHECK(llm_wire_answer(kind, text, strlen(text), schema, "result", res) == 0);
    return res->status;
}

static void test_anthropic_answers(void)
{
    llm_result r = {0};
    CHECK(answer(LLM_ANTHROPIC,
                 "{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"model\":"
                 "\"claude-haiku\",\"content\":[{\"type\":\"text\",\"text\":\"Hello\"},"
                 "{\"type\":\"text\",\"text\":\", world\"}],\"stop_reason\":\"end_turn\","
                 "\"usage\":{\"input_tokens\":10,\"output_tokens\":4,"
                 "\"cache_read_input_tokens\":5,\"cache_creation_input_tokens\":1}}",
                 NULL, &r) == LLM_OK);
    CHECK(r.text && strcmp(r.text, "Hello, world") == 0 && r.text_len == 12);
    CHECK(r.tokens_in == 16 && r.tokens_out == 4);
    CHECK(strcmp(r.model, "claude-haiku") == 0 && strcmp(r.response_id, "msg_1") == 0);
    CHECK(strcmp(r.stop_reason, "end_turn") == 0 && !r.value);

    const char *tool = "{\"content\":[{\"type\":\"text\",\"text\":\"thinking\"},{\"type\":"
                       "\"tool_use\",\"id\":\"t\",\"name\":\"result\",\"input\":{\"ids\":[3,1]}}],"
                       "\"stop_reason\":\"tool_use\",\"usage\":{\"input_tokens\":1,"
                       "\"output_tokens\":2}}";
    CHECK(answer(LLM_ANTHROPIC, tool, SCHEMA, &r) == LLM_OK);
    CHECK(r.text && strcmp(r.text, "{\"ids\":[3,1]}") == 0);
    CHECK(r.value != NULL && r.value_len > 0);
    msgpack_zone z;
    msgpack_zone_init(&z, 256);
    msgpack_object o;
    size_t off = 0;
    CHECK(msgpack_unpack(r.value, r.value_len, &off, &z, &o) == MSGPACK_UNPACK_SUCCESS);
    CHECK(uint_at(&o, "ids.0") == 3 && uint_at(&o, "ids.1") == 1);
    msgpack_zone_destroy(&z);

    CHECK(answer(LLM_ANTHROPIC,
                 "{\"content\":[{\"type\":\"tool_use\",\"name\":\"result\",\"input\":"
                 "{\"ids\":[\"3\"]}}],\"stop_reason\":\"tool_use\"}",
                 SCHEMA, &r) == LLM_E_SCHEMA);
    CHECK_STR_CONTAINS(r.reason, "$.ids[0]: expected integer");
    CHECK(!r.value && r.text && strcmp(r.text, "{\"ids\":[\"3\"]}") == 0);
    /* a tool of another name, or none: the model did not answer in the structure */
    CHECK(answer(LLM_ANTHROPIC,
                 "{\"content\":[{\"type\":\"tool_use\",\"name\":\"other\",\"input\":{}}],"
                 "\"stop_reason\":\"tool_use\"}",
                 SCHEMA, &r) == LLM_E_MALFORMED);
    CHECK_STR_CONTAINS(r.reason, "no tool_use block named result");
    CHECK(answer(LLM_ANTHROPIC,
                 "{\"content\":[{\"type\":\"text\",\"text\":\"{\\\"ids\\\":[]}\"}],"
                 "\"stop_reason\":\"end_turn\"}",
                 SCHEMA, &r) == LLM_E_MALFORMED);
    CHECK(answer(LLM_ANTHROPIC,
                 "{\"content\":[{\"type\":\"text\",\"text\":\"Once upon\"}],\"stop_reason\":"
                 "\"max_tokens\",\"usage\":{\"input_tokens\":3,\"output_tokens\":300}}",
                 NULL, &r) == LLM_E_TRUNCATED);
    CHECK(strcmp(r.text, "Once upon") == 0 && r.tokens_out == 300);
    CHECK_STR_CONTAINS(r.reason, "max_tokens");
    CHECK(answer(LLM_ANTHROPIC,
                 "{\"content\":[{\"type\":\"tool_use\",\"name\":\"result\",\"input\":{}}],"
                 "\"stop_reason\":\"max_tokens\"}",
                 SCHEMA, &r) == LLM_E_TRUNCATED);
    CHECK(answer(LLM_ANTHROPIC, "{\"content\":[],\"stop_reason\":\"refusal\"}", SCHEMA, &r) ==
          LLM_E_REFUSED);
    CHECK(answer(LLM_ANTHROPIC, "{\"stop_reason\":\"end_turn\"}", NULL, &r) == LLM_E_MALFORMED);
    CHECK(answer(LLM_ANTHROPIC, "{\"content\":[{\"type\":\"text\",\"te", NULL, &r) ==
          LLM_E_MALFORMED);
    CHECK_STR_CONTAINS(r.reason, "not JSON");
    CHECK(answer(LLM_ANTHROPIC, "[1]", NULL, &r) == LLM_E_MALFORMED);
    CHECK(answer(LLM_ANTHROPIC, "", NULL, &r) == LLM_E_MALFORMED);
    llm_result_fini(&r);
}

static void test_openai_answers(void)
{
    llm_result r = {0};
    CHECK(answer(LLM_OPENAI,
                 "{\"id\":\"chatcmpl-1\",\"object\":\"chat.completion\",\"model\":\"gpt-x\","
                 "\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":"
                 "\"Hi\",\"refusal\":null},\"finish_reason\":\"stop\"}],\"usage\":{"
                 "\"prompt_tokens\":9,\"completion_tokens\":1,\"total_tokens\":10}}",
                 NULL, &r) == LLM_OK);
    CHECK(strcmp(r.text, "Hi") == 0 && r.tokens_in == 9 && r.tokens_out == 1);
    CHECK(strcmp(r.response_id, "chatcmpl-1") == 0 && strcmp(r.stop_reason, "stop") == 0);

    CHECK(answer(LLM_OPENAI,
                 "{\"choices\":[{\"message\":{\"content\":\"{\\\"ids\\\": [7]}\"},"
                 "\"finish_reason\":\"stop\"}]}",
                 SCHEMA, &r) == LLM_OK);
    CHECK(strcmp(r.text, "{\"ids\":[7]}") == 0 && r.value);
    /* a local server without constrained decoding may fence its JSON */
    CHECK(answer(LLM_OPENAI,
                 "{\"choices\":[{\"message\":{\"content\":\"```json\\n{\\\"ids\\\":[]}\\n```\\n\"},"
                 "\"finish_reason\":\"stop\"}]}",
                 SCHEMA, &r) == LLM_OK);
    CHECK(answer(LLM_OPENAI,
                 "{\"choices\":[{\"message\":{\"content\":\"{\\\"ids\\\":[1],\\\"x\\\":1}\"},"
                 "\"finish_reason\":\"stop\"}]}",
                 SCHEMA, &r) == LLM_E_SCHEMA);
    CHECK_STR_CONTAINS(r.reason, "$.x: not an allowed property");
    CHECK(answer(LLM_OPENAI,
                 "{\"choices\":[{\"message\":{\"content\":\"Sure! Here are the ids\"},"
                 "\"finish_reason\":\"stop\"}]}",
                 SCHEMA, &r) == LLM_E_MALFORMED);
    CHECK_STR_CONTAINS(r.reason, "the structured answer is not JSON");
    CHECK(strcmp(r.text, "Sure! Here are the ids") == 0);
    CHECK(answer(LLM_OPENAI,
                 "{\"choices\":[{\"message\":{\"content\":null,\"refusal\":\"I can't\"},"
                 "\"finish_reason\":\"stop\"}]}",
                 SCHEMA, &r) == LLM_E_REFUSED);
    CHECK(strcmp(r.text, "I can't") == 0);
    CHECK(answer(LLM_OPENAI,
                 "{\"choices\":[{\"message\":{\"content\":\"\"},\"finish_reason\":"
                 "\"content_filter\"}]}",
                 NULL, &r) == LLM_E_REFUSED);
    CHECK(answer(LLM_OPENAI,
                 "{\"choices\":[{\"message\":{\"content\":\"{\\\"ids\\\":[1,\"},"
                 "\"finish_reason\":\"length\"}]}",
                 SCHEMA, &r) == LLM_E_TRUNCATED);
    CHECK(answer(LLM_OPENAI, "{\"choices\":[]}", NULL, &r) == LLM_E_MALFORMED);
    CHECK(answer(LLM_OPENAI, "{\"choices\":[{\"message\":{},\"finish_reason\":\"stop\"}]}", NULL,
                 &r) == LLM_E_MALFORMED);
    llm_result_fini(&r);
}

static void test_errors(void)
{
    llm_wire_error e;
    const char *a = "{\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":"
                    "\"Overloaded\"},\"request_id\":\"req_1\"}";
    llm_wire_error_parse(a, strlen(a), &e);
    CHECK(strcmp(e.type, "overloaded_error") == 0 && strcmp(e.message, "Overloaded") == 0);
    CHECK(!e.quota && e.code[0] == '\0');
    const char *o = "{\"error\":{\"message\":\"You exceeded your current quota\",\"type\":"
                    "\"insufficient_quota\",\"param\":null,\"code\":\"insufficient_quota\"}}";
    llm_wire_error_parse(o, strlen(o), &e);
    CHECK(e.quota && strcmp(e.code, "insufficient_quota") == 0);
    const char *s = "{\"type\":\"error\",\"error\":{\"type\":\"rate_limit_error\",\"message\":"
                    "\"x\",\"details\":{\"error_code\":\"enforced_spend_limit_reached\"}}}";
    llm_wire_error_parse(s, strlen(s), &e);
    CHECK(e.quota && strcmp(e.type, "rate_limit_error") == 0);
    llm_wire_error_parse("<html>502 Bad Gateway</html>", 28, &e);
    CHECK(e.type[0] == '\0' && e.message[0] == '\0');
    llm_wire_error_parse(NULL, 0, &e);
    CHECK(e.type[0] == '\0');
}

static void test_retry_after(void)
{
    long long now = 784111777; /* Sun, 06 Nov 1994 08:49:37 GMT */
    CHECK(llm_wire_retry_after(NULL, now) == -1);
    CHECK(llm_wire_retry_after("", now) == -1);
    CHECK(llm_wire_retry_after("7", now) == 7000);
    CHECK(llm_wire_retry_after(" 0 ", now) == 0);
    CHECK(llm_wire_retry_after("1.5", now) == 1500);
    CHECK(llm_wire_retry_after("99999999999", now) == 1000000000000LL);
    CHECK(llm_wire_retry_after("-1", now) == -1);
    CHECK(llm_wire_retry_after("soon", now) == -1);
    CHECK(llm_wire_retry_after("Sun, 06 Nov 1994 08:49:37 GMT", now) == 0);
    CHECK(llm_wire_retry_after("Sun, 06 Nov 1994 08:50:07 GMT", now) == 30000);
    CHECK(llm_wire_retry_after("Mon, 07 Nov 1994 08:49:37 GMT", now) == 86400000);
    CHECK(llm_wire_retry_after("Sat, 05 Nov 1994 08:49:37 GMT", now) == 0);
    CHECK(llm_wire_retry_after("Thu, 01 Jan 1970 00:00:00 GMT", 0) == 0);
    CHECK(llm_wire_retry_after("Sun, 29 Feb 2032 00:00:01 GMT", 1961625600) == 1000);
    CHECK(llm_wire_retry_after("Sun, 06 Nov 1994 08:49:37 UTC", now) == -1);
    CHECK(llm_wire_retry_after("Sun, 06 Foo 1994 08:49:37 GMT", now) == -1);
    CHECK(llm_wire_retry_after("Sunday, 06-Nov-94 08:49:37 GMT", now) == -1);
    CHECK(llm_wire_retry_after("Sun, 06 Nov 1994 08:49:37 GMT junk", now) == -1);
}

static void test_redact(void)
{
    char out[200];
    const char *key = "sk-test-0123456789abcdefXYZ";
    llm_wire_redact("Incorrect API key provided: sk-te***XYZ. See the docs.", key, out,
                    sizeof(out));
    CHECK(strcmp(out, "Incorrect API key provided: [redacted] See the docs.") == 0);
    llm_wire_redact("model \"claude-x\" not found", key, out, sizeof(out));
    CHECK(strcmp(out, "model \"claude-x\" not found") == 0);
    llm_wire_redact("token abcdefghijklmnopqrstuvwxyz012345 is bad", NULL, out, sizeof(out));
    CHECK(strcmp(out, "token [redacted] is bad") == 0);
    llm_wire_redact("see https://platform.example.com/account/api-keys for keys", NULL, out,
                    sizeof(out));
    CHECK_STR_CONTAINS(out, "https://platform.example.com/account/api-keys");
    /* the key, whole or in part, in any form: the message is withheld */
    llm_wire_redact("key=test-0123456789 rejected", key, out, sizeof(out));
    CHECK(strcmp(out, "[withheld]") == 0);
    llm_wire_redact("line\nbreak\tand\x01"
                    "control",
                    NULL, out, sizeof(out));
    CHECK(strcmp(out, "line break and control") == 0);
    char small[12];
    llm_wire_redact("a long message that does not fit", NULL, small, sizeof(small));
    CHECK(strlen(small) < sizeof(small) && strcmp(small, "a long") == 0);
    llm_wire_redact(NULL, NULL, out, sizeof(out));
    CHECK(out[0] == '\0');
    CHECK(llm_wire_has_key("x 6789abcd y", key));
    CHECK(!llm_wire_has_key("x 6789abc y", key));
    CHECK(llm_wire_has_key("short ab!", "ab!") && !llm_wire_has_key("a", ""));
    CHECK(!llm_wire_has_key(NULL, key) && !llm_wire_has_key("x", NULL));
}

int main(void)
{
    char err[200];
    if (llm_schema_create(SCHEMA_TEXT, strlen(SCHEMA_TEXT), &SCHEMA, err, sizeof(err)) != 0) {
        fprintf(stderr, "schema: %s\n", err);
        return 1;
    }
    test_bodies();
    test_anthropic_answers();
    test_openai_answers();
    test_errors();
    test_retry_after();
    test_redact();
    llm_schema_destroy(SCHEMA);
    CHECK_RETURN();
}
