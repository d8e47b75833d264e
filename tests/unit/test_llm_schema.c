/* tests/unit/test_llm_schema.c: llm/llm_schema.c, the JSON Schema subset that model answers
 * are checked against: which schemas are accepted, and every keyword on values that pass
 * and values that fail, with the path the message names.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "llm_schema.h"

static char err[256];

/* Validates the JSON value against the JSON schema; the result code. */
static int v(const char *schema, const char *value)
{
    err[0] = '\0';
    return llm_schema_validate_json(schema, strlen(schema), value, strlen(value), err, sizeof(err));
}

#define OK(s, val) CHECK_MSG(v(s, val) == 0, "%s on %s: %s", val, s, err)
#define BAD(s, val, where)                                                                         \
    do {                                                                                           \
        CHECK_MSG(v(s, val) == LLM_SCHEMA_E_INVALID, "%s on %s passed", val, s);                   \
        CHECK_STR_CONTAINS(err, where);                                                            \
    } while (0)

static int create(const char *schema)
{
    llm_schema *s = NULL;
    err[0] = '\0';
    int rc = llm_schema_create(schema, strlen(schema), &s, err, sizeof(err));
    CHECK((rc == 0) == (s != NULL));
    llm_schema_destroy(s);
    return rc;
}

static void test_create(void)
{
    CHECK(create("{\"type\":\"object\"}") == 0);
    CHECK(create("true") == 0);
    CHECK(create("{\"title\":\"t\",\"description\":\"d\",\"$schema\":\"x\",\"default\":1,"
                 "\"examples\":[1],\"$comment\":\"c\",\"type\":\"integer\"}") == 0);
    CHECK(create("{\"type\":") == LLM_SCHEMA_E_SYNTAX);
    CHECK_STR_CONTAINS(err, "not JSON");
    CHECK(create("{\"type\":\"string\",\"pattern\":\"^a\"}") == LLM_SCHEMA_E_UNSUPPORTED);
    CHECK_STR_CONTAINS(err, "'pattern'");
    CHECK(create("{\"properties\":{\"a\":{\"$ref\":\"#/x\"}}}") == LLM_SCHEMA_E_UNSUPPORTED);
    CHECK_STR_CONTAINS(err, "$.properties.a");
    CHECK(create("{\"type\":\"text\"}") == LLM_SCHEMA_E_UNSUPPORTED);
    CHECK(create("{\"type\":[]}") == LLM_SCHEMA_E_UNSUPPORTED);
    CHECK(create("{\"type\":[\"string\",\"nothing\"]}") == LLM_SCHEMA_E_UNSUPPORTED);
    CHECK(create("{\"required\":\"a\"}") == LLM_SCHEMA_E_UNSUPPORTED);
    CHECK(create("{\"required\":[1]}") == LLM_SCHEMA_E_UNSUPPORTED);
    CHECK(create("{\"minItems\":-1}") == LLM_SCHEMA_E_UNSUPPORTED);
    CHECK(create("{\"maxLength\":1.5}") == LLM_SCHEMA_E_UNSUPPORTED);
    CHECK(create("{\"maxLength\":2.0}") == 0);
    CHECK(create("{\"minimum\":\"1\"}") == LLM_SCHEMA_E_UNSUPPORTED);
    CHECK(create("{\"items\":[{\"type\":\"string\"}]}") == LLM_SCHEMA_E_UNSUPPORTED);
    CHECK(create("{\"enum\":[]}") == LLM_SCHEMA_E_UNSUPPORTED);
    CHECK(create("{\"anyOf\":[]}") == LLM_SCHEMA_E_UNSUPPORTED);
    CHECK(create("{\"uniqueItems\":1}") == LLM_SCHEMA_E_UNSUPPORTED);
    CHECK(create("{\"properties\":[]}") == LLM_SCHEMA_E_UNSUPPORTED);
    CHECK(create("{\"additionalProperties\":3}") == LLM_SCHEMA_E_UNSUPPORTED);
    CHECK(create("[1]") == LLM_SCHEMA_E_UNSUPPORTED);
    /* nesting past the limit is refused, not recursed into */
    char deep[4096] = "";
    for (int i = 0; i < 40; i++)
        strcat(deep, "{\"items\":");
    strcat(deep, "true");
    for (int i = 0; i < 40; i++)
        strcat(deep, "}");
    CHECK(create(deep) != 0);

    llm_schema *s = NULL;
    const char *txt = "{ \"type\" : \"object\" ,\n \"required\": [\"a\"] }";
    CHECK(llm_schema_create(txt, strlen(txt), &s, err, sizeof(err)) == 0);
    size_t n = 0;
    CHECK(strcmp(llm_schema_json(s, &n), "{\"type\":\"object\",\"required\":[\"a\"]}") == 0);
    CHECK(n == strlen(llm_schema_json(s, NULL)));
    CHECK(llm_schema_root_is_object(s));
    llm_schema_destroy(s);
    CHECK(llm_schema_create("{\"type\":\"array\"}", 16, &s, err, sizeof(err)) == 0);
    CHECK(!llm_schema_root_is_object(s));
    llm_schema_destroy(s);
    llm_schema_destroy(NULL);
}

static void test_types(void)
{
    OK("{\"type\":\"object\"}", "{}");
    BAD("{\"type\":\"object\"}", "[]", "$: expected object, got array");
    OK("{\"type\":\"array\"}", "[1,\"a\"]");
    OK("{\"type\":\"string\"}", "\"x\"");
    BAD("{\"type\":\"string\"}", "1", "expected string, got integer");
    OK("{\"type\":\"integer\"}", "-3");
    OK("{\"type\":\"integer\"}", "18446744073709551615");
    OK("{\"type\":\"integer\"}", "2.0");
    BAD("{\"type\":\"integer\"}", "2.5", "expected integer, got number");
    OK("{\"type\":\"number\"}", "2");
    OK("{\"type\":\"number\"}", "2.5e3");
    BAD("{\"type\":\"number\"}", "\"2\"", "got string");
    OK("{\"type\":\"boolean\"}", "false");
    BAD("{\"type\":\"boolean\"}", "0", "expected boolean");
    OK("{\"type\":\"null\"}", "null");
    BAD("{\"type\":\"null\"}", "false", "expected null");
    OK("{\"type\":[\"string\",\"null\"]}", "null");
    OK("{\"type\":[\"string\",\"null\"]}", "\"a\"");
    BAD("{\"type\":[\"string\",\"null\"]}", "3", "none of the types");
    OK("true", "{\"anything\":[1,2]}");
    BAD("false", "1", "no value is allowed");
    OK("{}", "[[[]]]");
}

static const char *FACTS =
    "{\"type\":\"object\",\"additionalProperties\":false,\"required\":[\"facts\"],"
    "\"properties\":{\"facts\":{\"type\":\"array\",\"maxItems\":3,\"items\":{"
    "\"type\":\"object\",\"required\":[\"id\",\"text\"],\"additionalProperties\":false,"
    "\"properties\":{\"id\":{\"type\":\"integer\",\"minimum\":1},"
    "\"text\":{\"type\":\"string\",\"minLength\":1,\"maxLength\":20},"
    "\"kind\":{\"enum\":[\"fact\",\"preference\"]}}}}}}";

static void test_objects(void)
{
    OK(FACTS, "{\"facts\":[]}");
    OK(FACTS,
       "{\"facts\":[{\"id\":1,\"text\":\"a\"},{\"id\":2,\"text\":\"b\",\"kind\":\"fact\"}]}");
    BAD(FACTS, "{}", "$.facts: required but missing");
    BAD(FACTS, "{\"facts\":[],\"extra\":1}", "$.extra: not an allowed property");
    BAD(FACTS, "{\"facts\":[{\"id\":1,\"text\":\"a\"},{\"text\":\"b\"}]}",
        "$.facts[1].id: required but missing");
    BAD(FACTS, "{\"facts\":[{\"id\":\"1\",\"text\":\"a\"}]}", "$.facts[0].id: expected integer");
    BAD(FACTS, "{\"facts\":[{\"id\":0,\"text\":\"a\"}]}", "$.facts[0].id: less than minimum 1");
    BAD(FACTS, "{\"facts\":[{\"id\":1,\"text\":\"\"}]}", "$.facts[0].text: 0 characters");
    BAD(FACTS, "{\"facts\":[{\"id\":1,\"text\":\"a\",\"kind\":\"opinion\"}]}",
        "$.facts[0].kind: not one of the enum's 2 values");
    BAD(FACTS,
        "{\"facts\":[{\"id\":1,\"text\":\"a\"},{\"id\":2,\"text\":\"a\"},"
        "{\"id\":3,\"text\":\"a\"},{\"id\":4,\"text\":\"a\"}]}",
        "$.facts: 4 items, more than maxItems 3");
    /* a key twice never validates: which one would a reader take? */
    BAD(FACTS, "{\"facts\":[],\"facts\":[]}", "$.facts: the key appears twice");
    /* additionalProperties as a schema */
    const char *ap = "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\"}},"
                     "\"additionalProperties\":{\"type\":\"integer\"}}";
    OK(ap, "{\"a\":\"x\",\"b\":1,\"c\":2}");
    BAD(ap, "{\"a\":\"x\",\"b\":\"y\"}", "$.b: expected integer");
    BAD(ap, "{\"a\":1}", "$.a: expected string");
    /* messages never quote the value (it is model output, maybe memory content) */
    BAD("{\"type\":\"object\",\"properties\":{\"s\":{\"maxLength\":3}}}",
        "{\"s\":\"SECRET-CONTENT\"}", "$.s");
    CHECK(strstr(err, "SECRET") == NULL);
    BAD("{\"enum\":[\"a\"]}", "\"SECRET-CONTENT\"", "$");
    CHECK(strstr(err, "SECRET") == NULL);
}

static void test_values(void)
{
    /* const and enum compare as JSON: 1 equals 1.0, objects whatever the key order */
    OK("{\"const\":1}", "1.0");
    BAD("{\"const\":1}", "true", "not the constant");
    OK("{\"const\":{\"a\":[1,{\"b\":null}],\"c\":\"x\"}}",
       "{\"c\":\"x\",\"a\":[1.0,{\"b\":null}]}");
    BAD("{\"const\":{\"a\":1}}", "{\"a\":1,\"b\":2}", "not the constant");
    BAD("{\"const\":[1,2]}", "[2,1]", "not the constant");
    OK("{\"enum\":[null,\"a\",3]}", "null");
    OK("{\"enum\":[null,\"a\",3]}", "3.0");
    BAD("{\"enum\":[null,\"a\",3]}", "\"b\"", "enum");
    /* numbers */
    OK("{\"minimum\":-1,\"maximum\":1}", "1");
    OK("{\"minimum\":-1,\"maximum\":1}", "-1.0");
    BAD("{\"minimum\":-1,\"maximum\":1}", "1.0000001", "more than maximum 1");
    OK("{\"exclusiveMinimum\":0}", "0.001");
    BAD("{\"exclusiveMinimum\":0}", "0", "exclusiveMinimum");
    BAD("{\"exclusiveMaximum\":10}", "10", "exclusiveMaximum");
    BAD("{\"maximum\":9223372036854775807}", "18446744073709551615", "more than maximum");
    OK("{\"minimum\":5}", "\"not a number: minimum does not apply\"");
    /* strings count code points, not bytes */
    OK("{\"maxLength\":5}", "\"h\\u00e9llo\"");
    OK("{\"maxLength\":2}", "\"\\ud83d\\ude00\\u00e9\"");
    BAD("{\"maxLength\":4}", "\"h\\u00e9llo\"", "5 characters, more than maxLength 4");
    BAD("{\"minLength\":2}", "\"\\u00e9\"", "fewer than minLength");
    /* arrays */
    OK("{\"minItems\":1,\"uniqueItems\":true}", "[1,\"1\",[1]]");
    BAD("{\"minItems\":1}", "[]", "fewer than minItems 1");
    BAD("{\"uniqueItems\":true}", "[{\"a\":1},2,{\"a\":1.0}]", "items 0 and 2 are equal");
    OK("{\"uniqueItems\":false}", "[1,1]");
    BAD("{\"items\":{\"type\":\"integer\"}}", "[1,2,\"3\"]", "$[2]: expected integer");
    /* anyOf */
    const char *any = "{\"anyOf\":[{\"type\":\"string\",\"maxLength\":1},{\"type\":\"integer\"}]}";
    OK(any, "\"a\"");
    OK(any, "7");
    BAD(any, "\"ab\"", "matches none of the anyOf");
    BAD(any, "null", "matches none of the anyOf");
}

static void test_json_errors(void)
{
    CHECK(v("{\"type\":\"object\"}", "{\"a\":") == LLM_SCHEMA_E_SYNTAX);
    CHECK_STR_CONTAINS(err, "the value is not JSON");
    CHECK(v("{\"type\":\"object\"", "{}") == LLM_SCHEMA_E_SYNTAX);
    CHECK_STR_CONTAINS(err, "the schema is not JSON");
    CHECK(v("{\"format\":\"email\"}", "\"a@b\"") == LLM_SCHEMA_E_UNSUPPORTED);
    /* values nested deeper than the parser's limit (32) are refused as not JSON */
    char deep[300];
    memset(deep, '[', 33);
    memset(deep + 33, ']', 33);
    deep[66] = '\0';
    CHECK(v("true", deep) == LLM_SCHEMA_E_SYNTAX);
    deep[32] = ']';
    deep[64] = '\0';
    CHECK(v("{\"items\":{\"items\":{\"type\":\"array\"}}}", deep) == 0);
    /* long paths are cut, not overflowed */
    char schema[8192] = "", value[8192] = "";
    for (int i = 0; i < 15; i++) {
        strcat(schema, "{\"properties\":{\"a_rather_long_property_name\":");
        strcat(value, "{\"a_rather_long_property_name\":");
    }
    strcat(schema, "{\"type\":\"string\"}");
    strcat(value, "1");
    for (int i = 0; i < 15; i++) {
        strcat(schema, "}}");
        strcat(value, "}");
    }
    CHECK(v(schema, value) == LLM_SCHEMA_E_INVALID);
    CHECK_STR_CONTAINS(err, "...");
    CHECK(strlen(err) < sizeof(err) - 1);
}

/* Quadratic checks on big answers stop at the work budget instead of running for minutes. */
static void test_budget(void)
{
    size_t cap = 20000 * 16 + 16;
    char *big = malloc(cap);
    size_t n = 0;
    n += (size_t)snprintf(big + n, cap - n, "{");
    for (int i = 0; i < 20000; i++)
        n += (size_t)snprintf(big + n, cap - n, "%s\"k%d\":1", i ? "," : "", i);
    snprintf(big + n, cap - n, "}");
    BAD("{\"type\":\"object\"}", big, "too large to check");
    n = 0;
    n += (size_t)snprintf(big + n, cap - n, "[");
    for (int i = 0; i < 5000; i++)
        n += (size_t)snprintf(big + n, cap - n, "%s%d", i ? "," : "", i);
    snprintf(big + n, cap - n, "]");
    BAD("{\"uniqueItems\":true}", big, "too large to check");
    OK("{\"items\":{\"type\":\"integer\"}}", big); /* linear checks are not limited so */
    n = 0;
    n += (size_t)snprintf(big + n, cap - n, "[");
    for (int i = 0; i < 1000; i++)
        n += (size_t)snprintf(big + n, cap - n, "%s%d", i ? "," : "", i);
    snprintf(big + n, cap - n, "]");
    OK("{\"uniqueItems\":true}", big);
    free(big);
}

int main(void)
{
    test_create();
    test_types();
    test_objects();
    test_values();
    test_json_errors();
    test_budget();
    CHECK_RETURN();
}
