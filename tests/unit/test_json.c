/* tests/unit/test_json.c: MessagePack <-> JSON conversion of proto/json. */
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "json.h"

#define S(lit) lit, sizeof(lit) - 1

/* JSON text -> msgpack bytes. Returns the json_to_msgpack result. */
static int j2m(const char *text, size_t len, unsigned max_depth, msgpack_sbuffer *sb, char *err,
               size_t errlen)
{
    msgpack_packer pk;
    msgpack_sbuffer_init(sb);
    msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
    return json_to_msgpack(text, len, max_depth, &pk, err, errlen);
}

/* msgpack bytes -> JSON text appended to out. */
static int m2j(const char *data, size_t n, unsigned flags, unsigned max_depth, json_buf *out)
{
    msgpack_zone z;
    msgpack_object o;
    size_t off = 0;
    int rc;

    msgpack_zone_init(&z, 1024);
    if (msgpack_unpack(data, n, &off, &z, &o) != MSGPACK_UNPACK_SUCCESS)
        abort();
    rc = json_from_msgpack(&o, flags, max_depth, out);
    msgpack_zone_destroy(&z);
    return rc;
}

/* Parses text and prints it back; checks the result equals expect. */
static void round_trip(const char *text, size_t len, unsigned flags, const char *expect)
{
    msgpack_sbuffer sb;
    json_buf out = {0};
    char err[256] = "";
    int rc = j2m(text, len, 64, &sb, err, sizeof(err));

    CHECK_MSG(rc == 0, "parse '%.*s': rc %d %s", (int)len, text, rc, err);
    if (rc == 0) {
        rc = m2j(sb.data, sb.size, flags, 64, &out);
        CHECK_MSG(rc == 0, "print '%.*s': rc %d", (int)len, text, rc);
        CHECK_MSG(rc == 0 && strcmp(out.data, expect) == 0, "'%.*s' -> '%s', want '%s'", (int)len,
                  text, out.data ? out.data : "(null)", expect);
    }
    json_buf_fini(&out);
    msgpack_sbuffer_destroy(&sb);
}

#define RT(text, expect) round_trip(S(text), 0, expect)

/* Expects text to fail with code, an error containing what, and "at offset off". */
static void bad_json(const char *text, size_t len, unsigned max_depth, int code, const char *what,
                     long off)
{
    msgpack_sbuffer sb;
    char err[256] = "";
    char at[64];
    int rc = j2m(text, len, max_depth, &sb, err, sizeof(err));

    CHECK_MSG(rc == code, "'%.*s': rc %d, want %d (%s)", (int)(len > 40 ? 40 : len), text, rc, code,
              err);
    CHECK_MSG(strstr(err, what) != NULL, "'%.*s': '%s' lacks '%s'", (int)(len > 40 ? 40 : len),
              text, err, what);
    if (off >= 0) {
        snprintf(at, sizeof(at), "at offset %ld", off);
        CHECK_MSG(strstr(err, at) != NULL, "'%.*s': '%s' lacks '%s'", (int)(len > 40 ? 40 : len),
                  text, err, at);
    }
    msgpack_sbuffer_destroy(&sb);
}

#define BAD(text, what, off) bad_json(S(text), 64, JSON_E_SYNTAX, what, off)

static void test_buf(void)
{
    json_buf b = {0};

    CHECK(json_buf_append(&b, "", 0) == 0);
    CHECK(b.len == 0);
    CHECK(json_buf_append(&b, "abc", 3) == 0);
    CHECK(b.len == 3 && strcmp(b.data, "abc") == 0);
    for (int i = 0; i < 1000; i++)
        CHECK(json_buf_append(&b, "0123456789", 10) == 0);
    CHECK(b.len == 10003 && b.data[b.len] == '\0' && b.cap > b.len);
    CHECK(memcmp(b.data + 9993, "0123456789", 10) == 0);
    json_buf_fini(&b);
    CHECK(b.data == NULL && b.len == 0 && b.cap == 0);
    json_buf_fini(&b);
}

static void test_round_trips(void)
{
    RT("null", "null");
    RT("true", "true");
    RT("false", "false");
    RT("0", "0");
    RT("-0", "0");
    RT("42", "42");
    RT("-42", "-42");
    RT("\"\"", "\"\"");
    RT("[]", "[]");
    RT("{}", "{}");
    RT(" \t\r\n[ 1 , 2 ,\n3 ] \n", "[1,2,3]");
    RT("{\"a\":1,\"b\":[true,false,null],\"c\":\"x\",\"d\":{\"e\":[[],{}]}}",
       "{\"a\":1,\"b\":[true,false,null],\"c\":\"x\",\"d\":{\"e\":[[],{}]}}");
    RT("{ \"k\" : { } , \"l\" : [ [ ] ] }", "{\"k\":{},\"l\":[[]]}");
    /* duplicate keys pass through as they are */
    RT("{\"a\":1,\"a\":2}", "{\"a\":1,\"a\":2}");

    /* escapes */
    RT("\"\\\"\\\\\\/\\b\\f\\n\\r\\t\"", "\"\\\"\\\\/\\b\\f\\n\\r\\t\"");
    RT("\"\\u0001\\u001f\\u007f\"", "\"\\u0001\\u001f\x7f\"");
    RT("\"\\u0000\"", "\"\\u0000\"");
    RT("\"\\u00e9\\u20AC\"", "\"\xc3\xa9\xe2\x82\xac\"");
    RT("\"caf\xc3\xa9\"", "\"caf\xc3\xa9\"");
    /* surrogate pairs */
    RT("\"\\ud83d\\ude00\"", "\"\xf0\x9f\x98\x80\"");
    RT("\"\\uD800\\uDC00\"", "\"\xf0\x90\x80\x80\"");
    RT("\"\\udbff\\udfff\"", "\"\xf4\x8f\xbf\xbf\"");
    RT("\"a\\ud83d\\ude00b\\n\"", "\"a\xf0\x9f\x98\x80"
                                  "b\\n\"");
    RT("\"\xf0\x9f\x98\x80\"", "\"\xf0\x9f\x98\x80\"");

    /* big integers are exact */
    RT("18446744073709551615", "18446744073709551615");
    RT("9223372036854775807", "9223372036854775807");
    RT("-9223372036854775808", "-9223372036854775808");
    /* past the integer types: float64 */
    RT("18446744073709551616", "1.8446744073709552e+19");
    RT("-9223372036854775809", "-9.223372036854776e+18");
    RT("100000000000000000000000", "1e+23");

    /* floats stay floats, with the fewest digits that read back */
    RT("1.5", "1.5");
    RT("0.1", "0.1");
    RT("1e2", "100.0");
    RT("1E+2", "100.0");
    RT("-2.5e-3", "-0.0025");
    RT("1.0", "1.0");
    RT("-0.0", "-0.0");
    RT("1e-400", "0.0");
    RT("0.30000000000000004", "0.30000000000000004");
    RT("[1.5,2,\"x\"]", "[1.5,2,\"x\"]");
}

static void test_exact_bytes(void)
{
    msgpack_sbuffer sb;
    char err[128];

    CHECK(j2m(S("[1,\"a\",{\"k\":null},-1,true]"), 8, &sb, err, sizeof(err)) == 0);
    CHECK(sb.size == 10 && memcmp(sb.data,
                                  "\x95\x01\xa1"
                                  "a\x81\xa1k\xc0\xff\xc3",
                                  10) == 0);
    msgpack_sbuffer_destroy(&sb);

    CHECK(j2m(S("\"ab\\ncd\""), 8, &sb, err, sizeof(err)) == 0);
    CHECK(sb.size == 6 && memcmp(sb.data,
                                 "\xa5"
                                 "ab\ncd",
                                 6) == 0);
    msgpack_sbuffer_destroy(&sb);

    CHECK(j2m(S("1.5"), 8, &sb, err, sizeof(err)) == 0);
    CHECK(sb.size == 9 && memcmp(sb.data, "\xcb\x3f\xf8\x00\x00\x00\x00\x00\x00", 9) == 0);
    msgpack_sbuffer_destroy(&sb);

    CHECK(j2m(S("-9223372036854775808"), 8, &sb, err, sizeof(err)) == 0);
    CHECK(sb.size == 9 && memcmp(sb.data, "\xd3\x80\x00\x00\x00\x00\x00\x00\x00", 9) == 0);
    msgpack_sbuffer_destroy(&sb);

    /* a big array: the count is known before the elements are packed */
    {
        size_t n = 70000;
        char *t = malloc(2 * n + 2);
        size_t k = 0;
        t[k++] = '[';
        for (size_t i = 0; i < n; i++) {
            t[k++] = '7';
            t[k++] = i + 1 < n ? ',' : ']';
        }
        CHECK(j2m(t, k, 8, &sb, err, sizeof(err)) == 0);
        CHECK(sb.size == 5 + n && memcmp(sb.data, "\xdd\x00\x01\x11\x70", 5) == 0);
        CHECK(sb.data[5] == 7 && sb.data[sb.size - 1] == 7);
        msgpack_sbuffer_destroy(&sb);
        free(t);
    }

    /* pk NULL only validates */
    CHECK(json_to_msgpack(S("{\"a\":[1,2]}"), 8, NULL, err, sizeof(err)) == 0);
    CHECK(json_to_msgpack(S("{\"a\":[1,2,]}"), 8, NULL, err, sizeof(err)) == JSON_E_SYNTAX);
}

static void test_invalid(void)
{
    BAD("", "unexpected end of input", 0);
    BAD("   ", "unexpected end of input", 3);
    BAD("[1,2,]", "expected a value", 5);
    BAD("{\"a\":1,}", "expected a string key", 7);
    BAD("{\"a\":1,,\"b\":2}", "expected a string key", 7);
    BAD("[,1]", "expected a value", 1);
    BAD("[1 2]", "expected ',' or ']'", 3);
    BAD("{\"a\":1 \"b\":2}", "expected ',' or '}'", 7);
    BAD("{\"a\" 1}", "expected ':'", 5);
    BAD("{1:2}", "expected a string key", 1);
    BAD("[1}", "expected ',' or ']'", 2);
    BAD("[", "unexpected end of input", 1);
    BAD("[1", "expected ',' or ']'", 2);
    BAD("{\"a\":", "unexpected end of input", 5);
    BAD("01", "leading zeros", 0);
    BAD("-01", "leading zeros", 0);
    BAD("[00]", "leading zeros", 1);
    BAD("NaN", "expected a value", 0);
    BAD("Infinity", "expected a value", 0);
    BAD("-Infinity", "invalid number", 0);
    BAD("[nan]", "invalid literal", 1);
    BAD("+1", "expected a value", 0);
    BAD(".5", "expected a value", 0);
    BAD("1.", "expected a digit after the decimal point", 2);
    BAD("1.e5", "expected a digit after the decimal point", 2);
    BAD("1e", "expected a digit in the exponent", 2);
    BAD("1e+", "expected a digit in the exponent", 3);
    BAD("-", "invalid number", 0);
    BAD("1e400", "number out of range", 0);
    BAD("[-1e309]", "number out of range", 1);
    BAD("tru", "invalid literal", 0);
    BAD("nul", "invalid literal", 0);
    BAD("True", "expected a value", 0);
    BAD("nulll", "unexpected data after the value", 4);
    BAD("1 2", "unexpected data after the value", 2);
    BAD("{} x", "unexpected data after the value", 3);
    BAD("\"abc", "unterminated string", 0);
    BAD("[\"abc\\\"]", "unterminated string", 1);
    BAD("\"a\x01\"", "control character 0x01", 2);
    BAD("\"a\tb\"", "control character 0x09", 2);
    BAD("\"a\nb\"", "control character 0x0a", 2);
    BAD("\"\\x\"", "invalid escape \\x", 1);
    BAD("\"\\U0041\"", "invalid escape", 1);
    BAD("\"\\u12\"", "invalid hex digit", 5);
    BAD("\"\\u12", "truncated \\u escape", 5);
    BAD("\"\\u12g4\"", "invalid hex digit", 5);
    BAD("\"\\ud83d\"", "lone high surrogate", 1);
    BAD("\"\\ud83dx\"", "lone high surrogate", 1);
    BAD("\"x\\ud83d\\u0041\"", "not followed by a low one", 2);
    BAD("\"\\ud83d\\ud83d\"", "not followed by a low one", 1);
    BAD("\"\\ude00\"", "lone low surrogate", 1);
    BAD("\"\\ude00\\ud83d\"", "lone low surrogate", 1);
    BAD("\"\xc0\xaf\"", "invalid UTF-8", 1);
    BAD("\"ab\xed\xa0\x80\"", "invalid UTF-8", 3);
    BAD("\"\xf4\x90\x80\x80\"", "invalid UTF-8", 1);
    BAD("\"\xe2\x82\"", "invalid UTF-8", 1);
    BAD("\"\x80\"", "invalid UTF-8", 1);
    BAD("\xef\xbb\xbf{}", "expected a value", 0); /* a BOM is not JSON */
    BAD("\xff", "expected a value", 0);
    /* embedded NUL outside strings, text not NUL-terminated */
    bad_json("[1]\0", 4, 8, JSON_E_SYNTAX, "unexpected data after the value", 3);
    bad_json("[1,2]", 4, 8, JSON_E_SYNTAX, "unexpected end of input", 4);
    /* err may be NULL, or short */
    {
        msgpack_sbuffer sb;
        char err[8];
        memset(err, 'x', sizeof(err));
        CHECK(j2m(S("[1,]"), 8, &sb, NULL, 0) == JSON_E_SYNTAX);
        msgpack_sbuffer_destroy(&sb);
        CHECK(j2m(S("[1,]"), 8, &sb, err, sizeof(err)) == JSON_E_SYNTAX);
        CHECK(strlen(err) == 7);
        msgpack_sbuffer_destroy(&sb);
    }
}

static void test_depth(void)
{
    msgpack_sbuffer sb;
    char err[256];

    /* depth counts containers: [[[1]]] is 3 */
    CHECK(j2m(S("[[[1]]]"), 3, &sb, err, sizeof(err)) == 0);
    msgpack_sbuffer_destroy(&sb);
    bad_json(S("[[[[1]]]]"), 3, JSON_E_TOO_DEEP, "nesting deeper than 3", 3);
    bad_json(S("{\"a\":{\"b\":[{}]}}"), 3, JSON_E_TOO_DEEP, "nesting deeper than 3", 11);
    CHECK(j2m(S("1"), 0, &sb, err, sizeof(err)) == 0);
    msgpack_sbuffer_destroy(&sb);
    bad_json(S("[]"), 0, JSON_E_TOO_DEEP, "deeper than 0", 0);

    /* very deep text does not exhaust the C stack, with or without the limit */
    {
        size_t n = 200000;
        char *t = malloc(2 * n);
        memset(t, '[', n);
        memset(t + n, ']', n);
        bad_json(t, 2 * n, 1000, JSON_E_TOO_DEEP, "nesting deeper than 1000", 1000);
        CHECK(j2m(t, 2 * n, (unsigned)n, &sb, err, sizeof(err)) == 0);
        CHECK(sb.size == n && (unsigned char)sb.data[0] == 0x91 &&
              (unsigned char)sb.data[n - 1] == 0x90);
        msgpack_sbuffer_destroy(&sb);
        bad_json(t, 2 * n - 1, (unsigned)n, JSON_E_SYNTAX, "expected ',' or ']'", 2 * n - 1);
        free(t);
    }

    /* json_from_msgpack: 5 nested arrays need max_depth 5 */
    {
        json_buf out = {0};
        CHECK(json_buf_append(&out, "keep", 4) == 0);
        CHECK(m2j(S("\x91\x91\x91\x91\x90"), 0, 4, &out) == JSON_E_TOO_DEEP);
        CHECK(out.len == 4 && strcmp(out.data, "keep") == 0);
        CHECK(m2j(S("\x91\x91\x91\x91\x90"), 0, 5, &out) == 0);
        CHECK(strcmp(out.data, "keep[[[[[]]]]]") == 0);
        json_buf_fini(&out);
        CHECK(m2j(S("\x81\xa1k\x80"), 0, 1, &out) == JSON_E_TOO_DEEP);
        CHECK(m2j(S("\x05"), 0, 0, &out) == 0);
        json_buf_fini(&out);
    }
}

static void test_from_msgpack(void)
{
    json_buf out = {0};

    /* integers and floats of every encoding */
    CHECK(m2j(S("\xcf\xff\xff\xff\xff\xff\xff\xff\xff"), 0, 8, &out) == 0);
    CHECK(strcmp(out.data, "18446744073709551615") == 0);
    json_buf_fini(&out);
    CHECK(m2j(S("\xd3\x80\x00\x00\x00\x00\x00\x00\x00"), 0, 8, &out) == 0);
    CHECK(strcmp(out.data, "-9223372036854775808") == 0);
    json_buf_fini(&out);
    CHECK(m2j(S("\xd0\x05"), 0, 8, &out) == 0);
    CHECK(strcmp(out.data, "5") == 0);
    json_buf_fini(&out);
    CHECK(m2j(S("\xca\x3d\xcc\xcc\xcd"), 0, 8, &out) == 0); /* float32 0.1 */
    CHECK_MSG(strcmp(out.data, "0.1") == 0, "float32 0.1 -> %s", out.data);
    json_buf_fini(&out);
    CHECK(m2j(S("\xca\x4b\x80\x00\x00"), 0, 8, &out) == 0); /* float32 16777216 */
    CHECK_MSG(strcmp(out.data, "16777216.0") == 0, "-> %s", out.data);
    json_buf_fini(&out);

    /* strings: control characters escaped, DEL and '/' not */
    CHECK(m2j(S("\xa6\x01\x1f\x7f/\"\\"), 0, 8, &out) == 0);
    CHECK(strcmp(out.data, "\"\\u0001\\u001f\x7f/\\\"\\\\\"") == 0);
    json_buf_fini(&out);

    /* what JSON cannot say */
    CHECK(json_buf_append(&out, "x", 1) == 0);
    CHECK(m2j(S("\xc4\x05hello"), 0, 8, &out) == JSON_E_UNSUPPORTED);
    CHECK(m2j(S("\xd4\x01\x00"), JSON_BIN_BASE64, 8, &out) == JSON_E_UNSUPPORTED);
    CHECK(m2j(S("\x81\x01\x02"), 0, 8, &out) == JSON_E_UNSUPPORTED);
    CHECK(m2j(S("\x92\x01\x81\xc0\x02"), 0, 8, &out) == JSON_E_UNSUPPORTED);
    CHECK(m2j(S("\xcb\x7f\xf8\x00\x00\x00\x00\x00\x00"), 0, 8, &out) == JSON_E_UNSUPPORTED);
    CHECK(m2j(S("\xcb\xff\xf0\x00\x00\x00\x00\x00\x00"), 0, 8, &out) == JSON_E_UNSUPPORTED);
    CHECK(m2j(S("\xca\x7f\x80\x00\x00"), 0, 8, &out) == JSON_E_UNSUPPORTED);
    CHECK(m2j(S("\x92\xa1"
                "a\xa2\xc0\xaf"),
              0, 8, &out) == JSON_E_UNSUPPORTED);
    CHECK(m2j(S("\xa3\xed\xa0\x80"), 0, 8, &out) == JSON_E_UNSUPPORTED);
    CHECK(m2j(S("\x81\xa1\xff\x01"), 0, 8, &out) == JSON_E_UNSUPPORTED);
    CHECK(out.len == 1 && strcmp(out.data, "x") == 0); /* failures leave out as it was */
    json_buf_fini(&out);

    /* base64 */
    {
        static const struct {
            const char *mp;
            size_t n;
            const char *json;
        } b64[] = {
            {"\xc4\x00", 2, "\"\""},
            {"\xc4\x01"
             "a",
             3, "\"YQ==\""},
            {"\xc4\x02"
             "ab",
             4, "\"YWI=\""},
            {"\xc4\x03"
             "abc",
             5, "\"YWJj\""},
            {"\xc4\x05hello", 7, "\"aGVsbG8=\""},
            {"\xc4\x03\xff\xfe\xfd", 5, "\"//79\""},
            {"\xc4\x03\xfb\xef\xbe", 5, "\"++++\""},
        };
        for (size_t i = 0; i < sizeof(b64) / sizeof(b64[0]); i++) {
            CHECK(m2j(b64[i].mp, b64[i].n, JSON_BIN_BASE64, 8, &out) == 0);
            CHECK_MSG(strcmp(out.data, b64[i].json) == 0, "base64 %zu: %s", i, out.data);
            json_buf_fini(&out);
        }
    }
}

static void test_float_round_trip(void)
{
    static const double vals[] = {
        0.1,
        1.0 / 3,
        2.0 / 3,
        1e300,
        -1e-300,
        5e-324,
        DBL_MIN,
        DBL_MAX,
        -DBL_MAX,
        123456789.123,
        1e21,
        1e22,
        1e-7,
        9007199254740993.0,
        0.5,
        -2.5,
        3.141592653589793,
        2.718281828459045,
        1e15,
        1e16,
        1e17,
    };
    for (size_t i = 0; i < sizeof(vals) / sizeof(vals[0]); i++) {
        msgpack_sbuffer sb, sb2;
        msgpack_packer pk;
        json_buf out = {0}, out2 = {0};
        char err[128];
        double back;

        msgpack_sbuffer_init(&sb);
        msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
        msgpack_pack_double(&pk, vals[i]);
        CHECK(m2j(sb.data, sb.size, 0, 8, &out) == 0);
        back = strtod(out.data, NULL);
        CHECK_MSG(memcmp(&back, &vals[i], sizeof(back)) == 0, "%.17g -> %s", vals[i], out.data);
        CHECK_MSG(strlen(out.data) <= 24, "%s too long", out.data);
        /* and back through json_to_msgpack to the same bytes and text */
        CHECK(j2m(out.data, out.len, 8, &sb2, err, sizeof(err)) == 0);
        CHECK_MSG(sb2.size == sb.size && memcmp(sb2.data, sb.data, sb.size) == 0, "%s", out.data);
        CHECK(m2j(sb2.data, sb2.size, 0, 8, &out2) == 0);
        CHECK(strcmp(out.data, out2.data) == 0);
        msgpack_sbuffer_destroy(&sb2);
        msgpack_sbuffer_destroy(&sb);
        json_buf_fini(&out);
        json_buf_fini(&out2);
    }
    /* shortest form where 15 digits suffice */
    {
        json_buf out = {0};
        CHECK(m2j(S("\xcb\x3f\xb9\x99\x99\x99\x99\x99\x9a"), 0, 8, &out) == 0); /* 0.1 */
        CHECK(strcmp(out.data, "0.1") == 0);
        json_buf_fini(&out);
    }
}

static void test_pretty(void)
{
    static const char in[] = "{\"a\":[1,2],\"b\":{},\"c\":[],\"d\":{\"e\":null}}";
    static const char want[] = "{\n"
                               "  \"a\": [\n"
                               "    1,\n"
                               "    2\n"
                               "  ],\n"
                               "  \"b\": {},\n"
                               "  \"c\": [],\n"
                               "  \"d\": {\n"
                               "    \"e\": null\n"
                               "  }\n"
                               "}";
    round_trip(S(in), JSON_PRETTY, want);
    round_trip(S("[]"), JSON_PRETTY, "[]");
    round_trip(S("7"), JSON_PRETTY, "7");
    /* pretty text parses back to the same value */
    round_trip(S(want), 0, in);
}

int main(void)
{
    test_buf();
    test_round_trips();
    test_exact_bytes();
    test_invalid();
    test_depth();
    test_from_msgpack();
    test_float_round_trip();
    test_pretty();
    CHECK_RETURN();
}
