/* tests/unit/test_http1.c: proto/http1.c, the request head parser. */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "http1.h"

static int parse(const char *s, http1_request *rq)
{
    char err[128];
    return http1_parse_head((const uint8_t *)s, strlen(s), 16384, rq, err, sizeof(err));
}

static void test_basic(void)
{
    http1_request rq;
    const char *s = "POST /v1/rpc/memory.store?embeddings=array HTTP/1.1\r\nHost: x\r\n"
                    "Authorization:  Bearer k1 \r\nContent-Length: 12\r\n\r\n{\"a\": true}\n";
    CHECK(parse(s, &rq) == 0);
    CHECK(rq.method == HTTP1_POST && rq.minor == 1 && rq.keep_alive);
    CHECK(rq.path_len == 20 && memcmp(rq.path, "/v1/rpc/memory.store", 20) == 0);
    CHECK(rq.has_length && rq.content_length == 12);
    CHECK(rq.authorization_len == 9 && memcmp(rq.authorization, "Bearer k1", 9) == 0);
    CHECK(rq.head_len == strlen(s) - 12);
    const char *v;
    CHECK(http1_query_get(rq.query, rq.query_len, "embeddings", &v) == 5 &&
          memcmp(v, "array", 5) == 0);
    CHECK(http1_query_get(rq.query, rq.query_len, "embedding", &v) == -1);
    /* bare LF, HTTP/1.0 keep-alive, absolute form */
    CHECK(parse("GET http://h:1/livez?x HTTP/1.0\nConnection: Keep-Alive\n\n", &rq) == 0);
    CHECK(rq.method == HTTP1_GET && rq.minor == 0 && rq.keep_alive);
    CHECK(rq.path_len == 6 && memcmp(rq.path, "/livez", 6) == 0 && rq.query_len == 1);
    CHECK(parse("GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\nExpect: 100-continue\r\n\r\n",
                &rq) == 0);
    CHECK(!rq.keep_alive && rq.expect_100);
    CHECK(parse("GET / HTTP/1.0\r\n\r\n", &rq) == 0 && !rq.keep_alive);
    CHECK(rq.if_none_match == NULL);
    /* If-None-Match (the console's revalidation), trimmed */
    CHECK(parse("GET /console HTTP/1.1\r\nHost: x\r\nIf-None-Match:  \"ab\", W/\"cd\" \r\n\r\n",
                &rq) == 0);
    CHECK(rq.if_none_match_len == 12 && memcmp(rq.if_none_match, "\"ab\", W/\"cd\"", 12) == 0);
}

static void test_errors(void)
{
    http1_request rq;
    CHECK(parse("GET / HTTP/1.1\r\nHost: x\r\n", &rq) == HTTP1_E_INCOMPLETE);
    CHECK(parse("GET / HTTP/1.1\r\n\r\n", &rq) == HTTP1_E_MALFORMED); /* no Host */
    CHECK(parse("GET / HTTP/2.0\r\n\r\n", &rq) == HTTP1_E_VERSION);
    CHECK(parse("GET / FTP/1.0\r\n\r\n", &rq) == HTTP1_E_MALFORMED);
    CHECK(parse("GET  / HTTP/1.1\r\nHost: x\r\n\r\n", &rq) == HTTP1_E_MALFORMED);
    CHECK(parse("GET nope HTTP/1.1\r\nHost: x\r\n\r\n", &rq) == HTTP1_E_MALFORMED);
    CHECK(parse("GET / HTTP/1.1\r\nHost : x\r\n\r\n", &rq) == HTTP1_E_MALFORMED);
    CHECK(parse("GET / HTTP/1.1\r\nHost: x\r\n folded\r\n\r\n", &rq) == HTTP1_E_MALFORMED);
    CHECK(parse("GET / HTTP/1.1\r\nHost: x\r\nHost: y\r\n\r\n", &rq) == HTTP1_E_MALFORMED);
    CHECK(parse("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
                &rq) == HTTP1_E_MALFORMED);
    CHECK(parse("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\n",
                &rq) == 0);
    CHECK(parse("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n", &rq) ==
          HTTP1_E_MALFORMED);
    CHECK(parse("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999999999999\r\n\r\n",
                &rq) == HTTP1_E_MALFORMED);
    CHECK(parse("GET / HTTP/1.1\r\nHost: x\r\nX: a\001b\r\n\r\n", &rq) == HTTP1_E_MALFORMED);
    CHECK(parse("POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n", &rq) == 0 &&
          rq.transfer_encoding);
    /* too large: a head without end at the limit, and too many fields */
    char *big = malloc(20000);
    memset(big, 'a', 20000);
    memcpy(big, "GET / HTTP/1.1\r\nX: ", 19);
    http1_request r2;
    CHECK(http1_parse_head((const uint8_t *)big, 20000, 16384, &r2, NULL, 0) == HTTP1_E_TOO_LARGE);
    free(big);
    char many[4096] = "GET / HTTP/1.1\r\nHost: x\r\n";
    for (int i = 0; i < 101; i++)
        strcat(many, "A: b\r\n");
    strcat(many, "\r\n");
    CHECK(parse(many, &rq) == HTTP1_E_TOO_LARGE);
}

static void test_find_end_resumes(void)
{
    const char *s = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
    size_t n = strlen(s), scanned = 0, end = 0;
    /* one byte at a time: the end is found exactly once the last byte is there */
    for (size_t len = 1; len <= n; len++) {
        end = http1_find_end((const uint8_t *)s, len, &scanned);
        CHECK(end == 0 || len == n);
    }
    CHECK(end == n);
}

/* The CORS request headers, and the allow-list (cors_allowed_origins). */
static void test_cors(void)
{
    http1_request rq;
    CHECK(parse("OPTIONS /v1/rpc/ping HTTP/1.1\r\nHost: x\r\nOrigin:  https://app.example \r\n"
                "Access-Control-Request-Method: POST\r\n\r\n",
                &rq) == 0);
    CHECK(rq.method == HTTP1_OPTIONS && rq.cors_preflight);
    CHECK(rq.origin_len == 19 && memcmp(rq.origin, "https://app.example", 19) == 0);
    CHECK(parse("GET / HTTP/1.1\r\nHost: x\r\n\r\n", &rq) == 0);
    CHECK(rq.origin == NULL && !rq.cors_preflight);
    CHECK(parse("GET / HTTP/1.1\r\nHost: x\r\nOrigin: a\r\nOrigin: b\r\n\r\n", &rq) ==
          HTTP1_E_MALFORMED);
    const char *list = "https://app.example, http://localhost:3000 ,https://b.example";
    CHECK(http1_origin_listed(list, "https://app.example", 19));
    CHECK(http1_origin_listed(list, "http://localhost:3000", 21));
    CHECK(http1_origin_listed(list, "https://b.example", 17));
    /* byte for byte: no prefix, suffix, case or port games */
    CHECK(!http1_origin_listed(list, "https://app.exampl", 18));
    CHECK(!http1_origin_listed(list, "https://app.example.evil", 24));
    CHECK(!http1_origin_listed(list, "HTTPS://APP.EXAMPLE", 19));
    CHECK(!http1_origin_listed(list, "http://localhost", 16));
    CHECK(!http1_origin_listed(list, "null", 4));
    CHECK(!http1_origin_listed(list, "", 0));
    CHECK(!http1_origin_listed("", "https://app.example", 19));
    CHECK(!http1_origin_listed(" , ", "", 0));
    /* the statuses the port answers with have their phrases (204: preflights) */
    const int statuses[] = {200, 204, 304, 400, 401, 402, 403, 404, 405,
                            408, 409, 411, 413, 429, 431, 500, 503, 505};
    for (size_t i = 0; i < sizeof(statuses) / sizeof(statuses[0]); i++)
        CHECK_MSG(strcmp(http1_reason(statuses[i]), "Unknown") != 0, "%d", statuses[i]);
}

int main(void)
{
    test_basic();
    test_errors();
    test_find_end_resumes();
    test_cors();
    CHECK_RETURN();
}
