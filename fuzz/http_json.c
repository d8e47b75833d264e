/* fuzz/http_json.c: a libFuzzer target for the HTTP port's request path up to dispatch: the
 * HTTP/1.x head parser (proto/http1.c), then the JSON body as the JSON API converts it
 * (json_to_msgpack under the RPC depth limit, the RPC scanner's limits on the result, the
 * parameter map decoded), and the result printed back as JSON.
 *
 * Each input is the bytes a connection would deliver. The head is parsed in one shot and
 * in growing prefixes (a prefix may never succeed where the whole failed, and a head found
 * complete in a prefix must parse the same); the body is what Content-Length says follows.
 * Invariants abort() with a message when broken; ASan and UBSan catch the rest.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "http1.h"
#include "json.h"
#include "rpc.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define REQUIRE(cond)                                                                              \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "%s:%d: invariant broken: %s\n", __FILE__, __LINE__, #cond);           \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

#define HEAD_MAX 4096

static void body_path(const uint8_t *body, size_t n)
{
    msgpack_sbuffer sb;
    msgpack_packer pk;
    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    char err[256];
    int rc = json_to_msgpack((const char *)body, n, 30, &pk, err, sizeof(err));
    REQUIRE(rc == 0 || rc == JSON_E_SYNTAX || rc == JSON_E_TOO_DEEP);
    REQUIRE(rc == 0 || sb.size == 0); /* a syntax error never reaches the packer */
    if (rc == 0) {
        rpc_limits lim;
        rpc_limits_default(&lim);
        lim.max_message = 1 << 20;
        lim.max_objects = 1 << 16;
        rpc_scanner *sc = rpc_scanner_create(&lim);
        REQUIRE(sc);
        size_t mlen = 0;
        int s = rpc_scanner_scan(sc, (const uint8_t *)sb.data, sb.size, &mlen, err, sizeof(err));
        REQUIRE(s != RPC_E_INCOMPLETE); /* the converter packs exactly one whole value */
        if (s == 0) {
            REQUIRE(mlen == sb.size);
            msgpack_zone zone;
            msgpack_zone_init(&zone, 2048);
            msgpack_object o;
            size_t off = 0;
            REQUIRE(msgpack_unpack(sb.data, sb.size, &off, &zone, &o) == MSGPACK_UNPACK_SUCCESS);
            json_buf jb = {0};
            int j = json_from_msgpack(&o, JSON_BIN_BASE64, 64, &jb);
            REQUIRE(j == 0 || j == -12 /* -ENOMEM */);
            if (j == 0) /* what was printed reads back */
                REQUIRE(json_to_msgpack(jb.data, jb.len, 64, NULL, NULL, 0) == 0);
            json_buf_fini(&jb);
            msgpack_zone_destroy(&zone);
        }
        rpc_scanner_destroy(sc);
    }
    msgpack_sbuffer_destroy(&sb);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    http1_request rq, rp;
    char err[256];
    int rc = http1_parse_head(data, size, HEAD_MAX, &rq, err, sizeof(err));
    REQUIRE(rc >= 0 && rc <= HTTP1_E_VERSION);
    size_t scanned = 0;
    size_t end = http1_find_end(data, size, &scanned);
    if (rc == 0) {
        REQUIRE(end == rq.head_len && rq.head_len <= size && rq.head_len <= HEAD_MAX);
        REQUIRE(rq.path >= (const char *)data || rq.path_len == 1);
        REQUIRE(!rq.authorization ||
                rq.authorization + rq.authorization_len <= (const char *)data + rq.head_len);
        /* any prefix ending at or after the head parses the same */
        REQUIRE(http1_parse_head(data, rq.head_len, HEAD_MAX, &rp, NULL, 0) == 0);
        REQUIRE(rp.head_len == rq.head_len && rp.content_length == rq.content_length &&
                rp.keep_alive == rq.keep_alive && rp.path_len == rq.path_len);
        size_t avail = size - rq.head_len;
        size_t n = rq.has_length && rq.content_length < avail ? (size_t)rq.content_length : avail;
        body_path(data + rq.head_len, n);
    } else if (rc == HTTP1_E_INCOMPLETE) {
        REQUIRE(end == 0 && size < HEAD_MAX);
    }
    /* growing prefixes: incomplete until the head's end arrives */
    size_t step = size / 7 + 1;
    for (size_t len = 0; len < size; len += step) {
        int p = http1_parse_head(data, len, HEAD_MAX, &rp, NULL, 0);
        if (rc == 0 && len < rq.head_len)
            REQUIRE(p == HTTP1_E_INCOMPLETE || (p == HTTP1_E_TOO_LARGE && len >= HEAD_MAX));
    }
    /* the body path alone, on the raw input */
    body_path(data, size);
    return 0;
}
