/* tests/unit/test_log.c: server/core/log: the JSON line form parses whatever the message
 * holds (quotes, backslashes, newlines, control bytes, bytes that are not UTF-8, a message
 * cut at the buffer's end), keeps valid UTF-8 as it is, and the text form is unchanged. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <msgpack.h>

#include "check.h"
#include "json.h"
#include "log.h"
#include "rpc.h"

/* Runs fn with stderr sent to a temporary file; returns what was written (malloc'd). */
static char *capture(void (*fn)(void))
{
    FILE *tmp = tmpfile();
    int saved = dup(STDERR_FILENO);
    dup2(fileno(tmp), STDERR_FILENO);
    fn();
    dup2(saved, STDERR_FILENO);
    close(saved);
    long n = ftell(tmp);
    if (n <= 0) /* write(2) moved the descriptor's offset, not the FILE's */
        n = lseek(fileno(tmp), 0, SEEK_END);
    char *buf = calloc(1, (size_t)n + 1);
    if (pread(fileno(tmp), buf, (size_t)n, 0) != n)
        buf[0] = '\0';
    fclose(tmp);
    return buf;
}

/* Parses one JSON line into u; returns 0 when it is a JSON object. */
static int parse_line(const char *line, size_t n, msgpack_sbuffer *sb, msgpack_unpacked *u)
{
    msgpack_packer pk;
    msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
    char err[200];
    if (json_to_msgpack(line, n, 8, &pk, err, sizeof(err)) != 0) {
        fprintf(stderr, "not JSON (%s): %.*s\n", err, (int)n, line);
        return -1;
    }
    if (msgpack_unpack_next(u, sb->data, sb->size, NULL) != MSGPACK_UNPACK_SUCCESS)
        return -1;
    return u->data.type == MSGPACK_OBJECT_MAP ? 0 : -1;
}

static char long_msg[5000];

static void write_lines(void)
{
    log_write(LOG_INFO, "server/core/x.c", 12, "plain");
    log_write(LOG_WARN, "x.c", 1, "quote \" backslash \\ newline\nrow tab\tend");
    log_write(LOG_ERROR, "x.c", 2, "bytes %s|", "\x01\x1f\x7f");
    log_write(LOG_INFO, "x.c", 3, "bad utf-8 %s|", "\xff\xc3(\xed\xa0\x80\xe2\x82");
    log_write(LOG_INFO, "x.c", 4, "ok utf-8 %s", "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80");
    log_write(LOG_DEBUG, "x.c", 5, "%s", long_msg);
}

static void test_json(void)
{
    memset(long_msg, '"', sizeof(long_msg) - 1); /* each escapes to two bytes */
    log_set_level(LOG_DEBUG);
    log_set_format(LOG_JSON);
    char *out = capture(write_lines);
    log_set_format(LOG_TEXT);
    const char *want_msg[] = {"plain",
                              "quote \" backslash \\ newline\nrow tab\tend",
                              "bytes \x01\x1f\x7f|",
                              "bad utf-8 \xef\xbf\xbd\xef\xbf\xbd(\xef\xbf\xbd\xef\xbf\xbd\xef"
                              "\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd|",
                              "ok utf-8 caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80",
                              NULL};
    const char *want_level[] = {"info", "warn", "error", "info", "info", "debug"};
    int lines = 0;
    for (char *p = out, *nl; *p; p = nl + 1, lines++) {
        nl = strchr(p, '\n');
        CHECK(nl != NULL);
        if (!nl || lines >= 6)
            break;
        msgpack_sbuffer sb;
        msgpack_sbuffer_init(&sb);
        msgpack_unpacked u;
        msgpack_unpacked_init(&u);
        CHECK(parse_line(p, (size_t)(nl - p), &sb, &u) == 0);
        const msgpack_object *o = &u.data;
        CHECK(rpc_str_eq(rpc_map_get(o, "level"), want_level[lines]));
        const msgpack_object *t = rpc_map_get(o, "time");
        CHECK(t && t->type == MSGPACK_OBJECT_STR && t->via.str.size == 24 &&
              t->via.str.ptr[23] == 'Z');
        CHECK(rpc_str_eq(rpc_map_get(o, "file"), "x.c"));
        const msgpack_object *m = rpc_map_get(o, "message");
        CHECK(m && m->type == MSGPACK_OBJECT_STR);
        if (m && want_msg[lines])
            CHECK_MSG(m->via.str.size == strlen(want_msg[lines]) &&
                          memcmp(m->via.str.ptr, want_msg[lines], m->via.str.size) == 0,
                      "line %d: message '%.*s'", lines, (int)m->via.str.size, m->via.str.ptr);
        if (m && !want_msg[lines]) /* cut, but whole characters and still JSON */
            CHECK(m->via.str.size > 1000 && m->via.str.ptr[0] == '"');
        if (lines == 0)
            CHECK(rpc_get_int(rpc_map_get(o, "line"), 0) == 12);
        msgpack_unpacked_destroy(&u);
        msgpack_sbuffer_destroy(&sb);
    }
    CHECK_MSG(lines == 6, "%d lines", lines);
    free(out);
}

static void write_text(void)
{
    log_write(LOG_WARN, "a/b/y.c", 7, "text %d", 42);
}

static void test_text(void)
{
    char *out = capture(write_text);
    /* "2024-05-01T12:00:00.123Z warn  y.c:7 text 42\n" */
    CHECK(strlen(out) == 24 + 1 + 5 + 1 + 5 + 1 + 7 + 1);
    CHECK_STR_CONTAINS(out, "Z warn  y.c:7 text 42\n");
    free(out);
    CHECK(log_parse_format("json") == LOG_JSON && log_parse_format("text") == LOG_TEXT);
    CHECK(log_parse_format("JSON") < 0 && log_parse_format("") < 0);
}

int main(void)
{
    test_json();
    test_text();
    CHECK_RETURN();
}
