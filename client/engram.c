/* client/engram.c: the engram command-line tool.
 *
 * One table (commands[]) drives parsing, help and execution: a command names its RPC
 * method, packs its argument map from the command line (prepare, run before connecting,
 * so usage errors never need a server) and prints the result for humans (show). --json
 * replaces show with one line of JSON on stdout. Adding a method is adding a row.
 *
 * Exit status: 0 success, 1 failure ("engram: CODE: MESSAGE" on stderr), 2 usage error.
 * The API key is never printed; only admin tenant create shows the new key it returns.
 */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "client.h"
#include "hash.h"
#include "idmap.h"
#include "json.h"
#include "rpc.h"
#include "ubuf.h"
#include "xxh64.h"

enum { EXIT_OK = 0, EXIT_ERR = 1, EXIT_USAGE = 2 };

#define DEFAULT_HOST "127.0.0.1"
#define DEFAULT_PORT 7420
#define DEFAULT_TIMEOUT_MS 30000
#define DEFAULT_CONNECT_TIMEOUT_MS 1000 /* an engramd that is down answers at once or never */
#define URL_HOST_MAX 256
#define JSON_DEPTH 64                        /* nesting accepted from and printed to JSON */
#define CONTENT_COLS 100                     /* characters of content per search line */
#define KEY_MAX 4096                         /* bytes read from a key file */
#define STDIN_MAX ((size_t)64 * 1024 * 1024) /* bytes read for "-" */
#define MAX_OPTS 32

enum { AUTH_NONE, AUTH_IF_KEY, AUTH_REQUIRED };

/* A command option seen on the command line (--name VALUE or --name=VALUE). */
typedef struct opt_val {
    const char *name; /* not NUL-terminated when given as --name=VALUE */
    size_t name_len;
    const char *value;
} opt_val;

/* Argument maps are packed into a ubuf_sink (ubuf.h): a write that could not be made is
 * remembered in its failed flag. */
typedef ubuf_sink obuf;

typedef struct command command;

typedef struct ctx {
    /* global options */
    const char *url; /* --url URL */
    const char *host;
    const char *port_s;
    const char *timeout_s;
    const char *connect_timeout_s;
    const char *key_opt;
    const char *key_file_opt;
    const char *tls_ca;   /* --tls-ca FILE */
    const char *tls_cert; /* --tls-cert FILE */
    const char *tls_key;  /* --tls-key FILE */
    bool tls;             /* --tls */
    bool json, help;

    /* the command */
    const command *cmd;
    const char **pos; /* its positional arguments */
    int npos;
    opt_val opts[MAX_OPTS];
    int nopts;
    const char *method; /* set by prepare when the table has none */
    obuf args;
    bool has_args;
    uint64_t *ids; /* get and delete: the ids asked for */
    size_t nids;
    char *input; /* "-" read from stdin */

    const char **words; /* every word of the line (owned) */
    char key[KEY_MAX + 1];
    client_conn *conn;
    msgpack_zone zone;
    bool zone_ok;
} ctx;

struct command {
    const char *name;     /* words separated by single spaces */
    const char *synopsis; /* what follows the name in usage */
    const char *help;
    int min_pos, max_pos; /* positional arguments; max -1: any number */
    const char *const *opts;
    int auth;
    const char *method;                             /* NULL: prepare sets ctx.method */
    int (*prepare)(ctx *x, msgpack_packer *pk);     /* NULL: no arguments */
    int (*show)(ctx *x, const msgpack_object *res); /* NULL: pretty JSON */
    int (*exec)(ctx *x); /* commands of many calls: runs once connected (method unused) */
};

/* ---- output helpers ------------------------------------------------------------------ */

/* Writes n bytes of server text for a terminal: C0 and C1 control characters (which could
 * drive the terminal) become '?', or a space for tab/newline/CR when oneline; otherwise
 * newlines are kept and followed by indent. */
static void put_clean(FILE *f, const char *s, size_t n, bool oneline, const char *indent)
{
    for (size_t i = 0; i < n; i++) {
        unsigned char b = (unsigned char)s[i];
        if (b == '\n' && !oneline) {
            fputc('\n', f);
            fputs(indent, f);
        } else if (b == '\t' && !oneline) {
            fputc('\t', f);
        } else if (b == '\n' || b == '\t' || b == '\r') {
            fputc(' ', f);
        } else if (b < 0x20 || b == 0x7f) {
            fputc('?', f);
        } else if (b == 0xc2 && i + 1 < n && (unsigned char)s[i + 1] >= 0x80 &&
                   (unsigned char)s[i + 1] <= 0x9f) {
            fputc('?', f);
            i++;
        } else {
            fputc(b, f);
        }
    }
}

static void put_clean_cstr(FILE *f, const char *s)
{
    put_clean(f, s, strlen(s), true, "");
}

/* Prints "engram: CODE: MESSAGE" and returns EXIT_ERR. */
static int error_out(const char *code, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    fputs("engram: ", stderr);
    put_clean_cstr(stderr, code);
    fputs(": ", stderr);
    put_clean_cstr(stderr, msg);
    fputc('\n', stderr);
    return EXIT_ERR;
}

/* Reports a client failure; for a server error, any detail beside code and message
 * follows on its own lines. */
static int client_fail(ctx *x, const client_error *e)
{
    error_out(e->code[0] ? e->code : "error", "%s", e->message);
    const msgpack_object *o = e->object;
    if (o == NULL || o->type != MSGPACK_OBJECT_MAP)
        return EXIT_ERR;
    for (uint32_t i = 0; i < o->via.map.size; i++) {
        const msgpack_object_kv *kv = &o->via.map.ptr[i];
        json_buf b = {0};
        if (kv->key.type != MSGPACK_OBJECT_STR || rpc_str_eq(&kv->key, "code") ||
            rpc_str_eq(&kv->key, "message"))
            continue;
        if (json_from_msgpack(&kv->val, JSON_BIN_BASE64, JSON_DEPTH, &b) == 0 && b.len > 0) {
            fputs("engram:   ", stderr);
            put_clean(stderr, kv->key.via.str.ptr, kv->key.via.str.size, true, "");
            fputs(": ", stderr);
            put_clean(stderr, b.data, b.len, true, "");
            fputc('\n', stderr);
        }
        json_buf_fini(&b);
    }
    return EXIT_ERR;
}

/* Prints o as JSON: one line, or indented for humans. */
static int print_json(const msgpack_object *o, bool pretty)
{
    json_buf b = {0};
    int rc = json_from_msgpack(o, JSON_BIN_BASE64 | (pretty ? JSON_PRETTY : 0), JSON_DEPTH, &b);
    if (rc == -ENOMEM)
        return error_out("out_of_memory", "out of memory formatting the result");
    if (rc != 0)
        return error_out("bad_response", "the result has no JSON form");
    if (b.len > 0)
        fwrite(b.data, 1, b.len, stdout);
    fputc('\n', stdout);
    json_buf_fini(&b);
    return EXIT_OK;
}

static void print_time(const msgpack_object *o)
{
    if (o == NULL || (o->type != MSGPACK_OBJECT_POSITIVE_INTEGER &&
                      o->type != MSGPACK_OBJECT_NEGATIVE_INTEGER)) {
        fputs("-", stdout);
        return;
    }
    int64_t ms = rpc_get_int(o, 0), sec = ms / 1000 - (ms % 1000 < 0);
    time_t t = (time_t)sec;
    struct tm tm;
    char buf[64];
    if (gmtime_r(&t, &tm) == NULL || strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm) == 0)
        printf("%" PRId64 "ms", ms);
    else
        fputs(buf, stdout);
}

static void print_str_field(const msgpack_object *m, const char *key, bool oneline)
{
    const msgpack_object *o = rpc_map_get(m, key);
    if (o && o->type == MSGPACK_OBJECT_STR)
        put_clean(stdout, o->via.str.ptr, o->via.str.size, oneline, "  ");
    else
        fputs("?", stdout);
}

/* Prints at most cols characters of the string o on one line ("..." when cut). */
static void print_truncated(const msgpack_object *o, size_t cols)
{
    if (o == NULL || o->type != MSGPACK_OBJECT_STR)
        return;
    const char *s = o->via.str.ptr;
    size_t n = o->via.str.size, chars = 0, cut = n;
    for (size_t i = 0; i < n; i++) {
        if (((unsigned char)s[i] & 0xc0) == 0x80)
            continue; /* a continuation byte belongs to the character before */
        if (chars == cols - 3)
            cut = i;
        if (++chars > cols)
            break;
    }
    if (chars <= cols) {
        put_clean(stdout, s, n, true, "");
    } else {
        put_clean(stdout, s, cut, true, "");
        fputs("...", stdout);
    }
}

/* ---- argument packing helpers ---------------------------------------------------------- */

static int usage_error(const ctx *x, const char *fmt, ...);

static const char *opt_get(const ctx *x, const char *name)
{
    for (int i = 0; i < x->nopts; i++)
        if (x->opts[i].name_len == strlen(name) &&
            memcmp(x->opts[i].name, name, x->opts[i].name_len) == 0)
            return x->opts[i].value;
    return NULL;
}

static bool parse_u64(const char *s, uint64_t *out)
{
    uint64_t v = 0;
    if (*s == '\0')
        return false;
    for (; *s; s++) {
        if (*s < '0' || *s > '9')
            return false;
        unsigned d = (unsigned)(*s - '0');
        if (v > (UINT64_MAX - d) / 10)
            return false;
        v = v * 10 + d;
    }
    *out = v;
    return true;
}

static bool parse_num(const char *s, double *out)
{
    char *end;
    if (*s == '\0')
        return false;
    errno = 0;
    double d = strtod(s, &end);
    if (*end != '\0' || errno == ERANGE || !isfinite(d))
        return false;
    *out = d;
    return true;
}

/* Reads all of stdin into x->input (NUL-terminated); returns 0 or EXIT_ERR. */
static int read_stdin(ctx *x, size_t *len)
{
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    if (buf == NULL)
        return error_out("out_of_memory", "out of memory reading standard input");
    for (;;) {
        if (cap - n < 2) {
            if (cap >= STDIN_MAX) {
                free(buf);
                return error_out("input_error", "standard input is larger than %zu bytes",
                                 STDIN_MAX);
            }
            char *p = realloc(buf, cap * 2);
            if (p == NULL) {
                free(buf);
                return error_out("out_of_memory", "out of memory reading standard input");
            }
            buf = p;
            cap *= 2;
        }
        size_t r = fread(buf + n, 1, cap - n - 1, stdin);
        n += r;
        if (r == 0) {
            if (ferror(stdin)) {
                free(buf);
                return error_out("input_error", "cannot read standard input: %s", strerror(errno));
            }
            break;
        }
    }
    buf[n] = '\0';
    free(x->input);
    x->input = buf;
    *len = n;
    return 0;
}

/* A text argument: itself, or standard input for "-" (one trailing newline dropped). */
static int text_arg(ctx *x, const char *arg, const char **text, size_t *len)
{
    if (strcmp(arg, "-") != 0) {
        *text = arg;
        *len = strlen(arg);
        return 0;
    }
    int rc = read_stdin(x, len);
    if (rc != 0)
        return rc;
    if (*len > 0 && x->input[*len - 1] == '\n')
        (*len)--;
    if (*len > 0 && x->input[*len - 1] == '\r')
        (*len)--;
    *text = x->input;
    return 0;
}

static bool json_is_object(const char *s, size_t n)
{
    size_t i = 0;
    while (i < n && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r'))
        i++;
    return i < n && s[i] == '{';
}

/* Packs the JSON object text as a map; what names it in messages. */
static int pack_json_object(const ctx *x, msgpack_packer *pk, const char *what, const char *text,
                            size_t len)
{
    char err[256];
    if (!json_is_object(text, len))
        return usage_error(x, "%s must be a JSON object", what);
    int rc = json_to_msgpack(text, len, JSON_DEPTH, pk, err, sizeof(err));
    if (rc == -ENOMEM)
        return error_out("out_of_memory", "out of memory converting %s", what);
    if (rc != 0)
        return usage_error(x, "%s is not valid JSON: %s", what, err);
    return 0;
}

/* Parses the positional ids ("12" or "#12") into x->ids. */
static int parse_ids(ctx *x)
{
    x->ids = calloc((size_t)x->npos, sizeof(uint64_t));
    if (x->ids == NULL)
        return error_out("out_of_memory", "out of memory");
    for (int i = 0; i < x->npos; i++) {
        const char *s = x->pos[i][0] == '#' ? x->pos[i] + 1 : x->pos[i];
        if (!parse_u64(s, &x->ids[i]))
            return usage_error(x, "'%s' is not a memory id", x->pos[i]);
    }
    x->nids = (size_t)x->npos;
    return 0;
}

static void pack_ids(const ctx *x, msgpack_packer *pk)
{
    msgpack_pack_map(pk, 1);
    rpc_pack_cstr(pk, "ids");
    msgpack_pack_array(pk, (uint32_t)x->nids);
    for (size_t i = 0; i < x->nids; i++)
        msgpack_pack_uint64(pk, x->ids[i]);
}

/* Whether the array of maps arr holds one whose "id" is id. */
static bool has_id(const msgpack_object *arr, uint64_t id, bool bare)
{
    if (arr == NULL || arr->type != MSGPACK_OBJECT_ARRAY)
        return false;
    for (uint32_t i = 0; i < arr->via.array.size; i++) {
        const msgpack_object *e = &arr->via.array.ptr[i];
        const msgpack_object *v = bare ? e : rpc_map_get(e, "id");
        if (v && v->type == MSGPACK_OBJECT_POSITIVE_INTEGER && v->via.u64 == id)
            return true;
    }
    return false;
}

/* ---- commands -------------------------------------------------------------------------- */

static int show_plain(ctx *x, const msgpack_object *res)
{
    if (res->type == MSGPACK_OBJECT_STR) {
        put_clean(stdout, res->via.str.ptr, res->via.str.size, false, "");
        fputc('\n', stdout);
        return EXIT_OK;
    }
    return print_json(res, true);
}

static const char *const store_opts[] = {"type", "importance", "metadata", NULL};

static int prep_store(ctx *x, msgpack_packer *pk)
{
    const char *content, *type = opt_get(x, "type"), *imp_s = opt_get(x, "importance");
    const char *meta = opt_get(x, "metadata");
    double importance = 0.5;
    size_t len;
    int rc;

    if (imp_s && !parse_num(imp_s, &importance))
        return usage_error(x, "--importance must be a number, not '%s'", imp_s);
    rc = text_arg(x, x->pos[0], &content, &len);
    if (rc != 0)
        return rc;
    msgpack_pack_map(pk, meta ? 4 : 3);
    rpc_pack_cstr(pk, "content");
    rpc_pack_strn(pk, content, len);
    rpc_pack_kv_str(pk, "type", type ? type : "fact");
    rpc_pack_kv_num(pk, "importance", importance);
    if (meta) {
        rpc_pack_cstr(pk, "metadata");
        return pack_json_object(x, pk, "--metadata", meta, strlen(meta));
    }
    return 0;
}

static int show_store(ctx *x, const msgpack_object *res)
{
    const msgpack_object *id = rpc_map_get(res, "id");
    if (id == NULL || id->type != MSGPACK_OBJECT_POSITIVE_INTEGER)
        return print_json(res, true);
    printf("%" PRIu64 "\n", id->via.u64);
    return EXIT_OK;
}

static const char *const search_opts[] = {"top-k", NULL};

static int prep_search(ctx *x, msgpack_packer *pk)
{
    const char *query, *k_s = opt_get(x, "top-k");
    uint64_t k = 0;
    size_t len;
    if (k_s && !parse_u64(k_s, &k))
        return usage_error(x, "--top-k must be a non-negative integer, not '%s'", k_s);
    int rc = text_arg(x, x->pos[0], &query, &len);
    if (rc != 0)
        return rc;
    msgpack_pack_map(pk, k_s ? 2 : 1);
    rpc_pack_cstr(pk, "query");
    rpc_pack_strn(pk, query, len);
    if (k_s)
        rpc_pack_kv_uint(pk, "top_k", k);
    return 0;
}

static int show_search(ctx *x, const msgpack_object *res)
{
    const msgpack_object *r = rpc_map_get(res, "results");
    if (r == NULL || r->type != MSGPACK_OBJECT_ARRAY)
        return print_json(res, true);
    if (r->via.array.size == 0)
        puts("(no results)");
    for (uint32_t i = 0; i < r->via.array.size; i++) {
        const msgpack_object *m = &r->via.array.ptr[i];
        if (m->type != MSGPACK_OBJECT_MAP)
            continue;
        printf("#%" PRIu64 "  %.3f  ", rpc_get_uint(rpc_map_get(m, "id"), 0),
               rpc_get_num(rpc_map_get(m, "score"), NAN));
        print_str_field(m, "type", true);
        printf("  imp=%.2f  ", rpc_get_num(rpc_map_get(m, "importance"), NAN));
        print_truncated(rpc_map_get(m, "content"), CONTENT_COLS);
        fputc('\n', stdout);
    }
    return EXIT_OK;
}

static int prep_ids(ctx *x, msgpack_packer *pk)
{
    int rc = parse_ids(x);
    if (rc != 0)
        return rc;
    pack_ids(x, pk);
    return 0;
}

static void show_memory(const msgpack_object *m)
{
    const msgpack_object *meta = rpc_map_get(m, "metadata");
    const msgpack_object *exp = rpc_map_get(m, "expires_at");
    printf("#%" PRIu64 "  ", rpc_get_uint(rpc_map_get(m, "id"), 0));
    print_str_field(m, "type", true);
    printf("  imp=%.2f  scope=", rpc_get_num(rpc_map_get(m, "importance"), NAN));
    print_str_field(m, "scope", true);
    fputs("  created=", stdout);
    print_time(rpc_map_get(m, "created_at"));
    fputs("  updated=", stdout);
    print_time(rpc_map_get(m, "updated_at"));
    if (exp && exp->type != MSGPACK_OBJECT_NIL) {
        fputs("  expires=", stdout);
        print_time(exp);
    }
    printf("  accesses=%" PRId64 "  version=%" PRId64 "\n",
           rpc_get_int(rpc_map_get(m, "access_count"), 0),
           rpc_get_int(rpc_map_get(m, "version"), 0));
    if (meta && meta->type != MSGPACK_OBJECT_NIL &&
        !(meta->type == MSGPACK_OBJECT_MAP && meta->via.map.size == 0)) {
        json_buf b = {0};
        if (json_from_msgpack(meta, JSON_BIN_BASE64, JSON_DEPTH, &b) == 0) {
            fputs("  metadata: ", stdout);
            put_clean(stdout, b.data, b.len, true, "");
            fputc('\n', stdout);
        }
        json_buf_fini(&b);
    }
    fputs("  ", stdout);
    print_str_field(m, "content", false);
    fputc('\n', stdout);
}

static int show_get(ctx *x, const msgpack_object *res)
{
    const msgpack_object *mems = rpc_map_get(res, "memories");
    if (mems == NULL || mems->type != MSGPACK_OBJECT_ARRAY)
        return print_json(res, true);
    for (uint32_t i = 0; i < mems->via.array.size; i++) {
        if (mems->via.array.ptr[i].type != MSGPACK_OBJECT_MAP)
            continue;
        if (i > 0)
            fputc('\n', stdout);
        show_memory(&mems->via.array.ptr[i]);
    }
    for (size_t i = 0; i < x->nids; i++)
        if (!has_id(mems, x->ids[i], false))
            fprintf(stderr, "note: memory #%" PRIu64 " not found\n", x->ids[i]);
    return EXIT_OK;
}

static int show_delete(ctx *x, const msgpack_object *res)
{
    const msgpack_object *del = rpc_map_get(res, "deleted");
    if (del == NULL || del->type != MSGPACK_OBJECT_ARRAY)
        return print_json(res, true);
    for (uint32_t i = 0; i < del->via.array.size; i++)
        printf("deleted #%" PRIu64 "\n", rpc_get_uint(&del->via.array.ptr[i], 0));
    for (size_t i = 0; i < x->nids; i++)
        if (!has_id(del, x->ids[i], true))
            fprintf(stderr, "note: memory #%" PRIu64 " not found\n", x->ids[i]);
    return EXIT_OK;
}

static int show_methods(ctx *x, const msgpack_object *res)
{
    if (res->type != MSGPACK_OBJECT_ARRAY)
        return print_json(res, true);
    for (uint32_t i = 0; i < res->via.array.size; i++) {
        const msgpack_object *m = &res->via.array.ptr[i];
        const msgpack_object *flags = rpc_map_get(m, "flags");
        const msgpack_object *params = rpc_map_get(m, "params");
        print_str_field(m, "name", true);
        fputs("  [", stdout);
        for (uint32_t k = 0;
             flags && flags->type == MSGPACK_OBJECT_ARRAY && k < flags->via.array.size; k++) {
            if (k > 0)
                fputc(',', stdout);
            const msgpack_object *f = &flags->via.array.ptr[k];
            if (f->type == MSGPACK_OBJECT_STR)
                put_clean(stdout, f->via.str.ptr, f->via.str.size, true, "");
        }
        fputc(']', stdout);
        for (uint32_t k = 0;
             params && params->type == MSGPACK_OBJECT_ARRAY && k < params->via.array.size; k++) {
            const msgpack_object *p = &params->via.array.ptr[k];
            fputs("  ", stdout);
            print_str_field(p, "name", true);
            fputc(':', stdout);
            print_str_field(p, "type", true);
            if (rpc_get_bool(rpc_map_get(p, "required"), false))
                fputc('*', stdout);
        }
        fputc('\n', stdout);
    }
    puts("(* required)");
    return EXIT_OK;
}

static const char *const tenant_opts[] = {"tier", "dim", NULL};

static int prep_tenant_create(ctx *x, msgpack_packer *pk)
{
    const char *tier = opt_get(x, "tier"), *dim_s = opt_get(x, "dim");
    uint64_t dim = 0;
    if (tier == NULL)
        return usage_error(x, "--tier is required (free, standard or premium)");
    if (dim_s && !parse_u64(dim_s, &dim))
        return usage_error(x, "--dim must be a positive integer, not '%s'", dim_s);
    msgpack_pack_map(pk, dim_s ? 3 : 2);
    rpc_pack_kv_str(pk, "name", x->pos[0]);
    rpc_pack_kv_str(pk, "tier", tier);
    if (dim_s) {
        rpc_pack_cstr(pk, "embedding");
        msgpack_pack_map(pk, 1);
        rpc_pack_kv_uint(pk, "dim", dim);
    }
    return 0;
}

static int show_tenant_create(ctx *x, const msgpack_object *res)
{
    const msgpack_object *key = rpc_map_get(res, "api_key");
    if (key == NULL || key->type != MSGPACK_OBJECT_STR)
        return print_json(res, true);
    printf("tenant_id: %" PRId64 "\n", rpc_get_int(rpc_map_get(res, "tenant_id"), 0));
    printf("key_id:    %" PRId64 "\n", rpc_get_int(rpc_map_get(res, "key_id"), 0));
    fputs("api_key:   ", stdout);
    put_clean(stdout, key->via.str.ptr, key->via.str.size, true, "");
    fputs("\nThis API key is shown only once: store it now (the server keeps only a hash).\n",
          stdout);
    return EXIT_OK;
}

/* The tenant an admin command names: a number is a tenant_id, anything else a name. */
static void pack_tenant_ref(ctx *x, msgpack_packer *pk, const char *ref, const char *name_key)
{
    uint64_t id;
    if (parse_u64(ref, &id))
        rpc_pack_kv_uint(pk, "tenant_id", id);
    else
        rpc_pack_kv_str(pk, name_key, ref);
    (void)x;
}

static int prep_tenant_ref(ctx *x, msgpack_packer *pk)
{
    msgpack_pack_map(pk, 1);
    pack_tenant_ref(x, pk, x->pos[0], "name");
    return 0;
}

static const char *const tenant_update_opts[] = {"tier", "name", NULL};

static int prep_tenant_update(ctx *x, msgpack_packer *pk)
{
    const char *tier = opt_get(x, "tier"), *name = opt_get(x, "name");
    if (!tier && !name)
        return usage_error(x, "give --tier and/or --name");
    msgpack_pack_map(pk, 1 + (tier != NULL) + (name != NULL));
    pack_tenant_ref(x, pk, x->pos[0], "name");
    if (tier)
        rpc_pack_kv_str(pk, "tier", tier);
    if (name)
        rpc_pack_kv_str(pk, "new_name", name);
    return 0;
}

static const char *const list_opts[] = {"limit", "cursor", NULL};

static int prep_tenant_list(ctx *x, msgpack_packer *pk)
{
    const char *limit = opt_get(x, "limit"), *cursor = opt_get(x, "cursor");
    uint64_t l = 0, c = 0;
    if ((limit && !parse_u64(limit, &l)) || (cursor && !parse_u64(cursor, &c)))
        return usage_error(x, "--limit and --cursor take whole numbers");
    msgpack_pack_map(pk, (limit != NULL) + (cursor != NULL));
    if (limit)
        rpc_pack_kv_uint(pk, "limit", l);
    if (cursor)
        rpc_pack_kv_uint(pk, "cursor", c);
    return 0;
}

static int show_tenant_list(ctx *x, const msgpack_object *res)
{
    const msgpack_object *ts = rpc_map_get(res, "tenants");
    for (uint32_t i = 0; ts && ts->type == MSGPACK_OBJECT_ARRAY && i < ts->via.array.size; i++) {
        const msgpack_object *t = &ts->via.array.ptr[i];
        printf("#%-6" PRId64 " %8" PRId64 " memories  ",
               rpc_get_int(rpc_map_get(t, "tenant_id"), 0),
               rpc_get_int(rpc_map_get(t, "memories"), 0));
        print_str_field(t, "tier", true);
        fputs("  ", stdout);
        print_str_field(t, "name", true);
        fputc('\n', stdout);
    }
    const msgpack_object *next = rpc_map_get(res, "next_cursor");
    if (next && next->type == MSGPACK_OBJECT_POSITIVE_INTEGER)
        printf("more: --cursor %" PRIu64 "\n", next->via.u64);
    (void)x;
    return EXIT_OK;
}

static int prep_key_create(ctx *x, msgpack_packer *pk)
{
    msgpack_pack_map(pk, 2);
    pack_tenant_ref(x, pk, x->pos[0], "tenant");
    rpc_pack_kv_str(pk, "name", x->pos[1]);
    return 0;
}

static int prep_key_list(ctx *x, msgpack_packer *pk)
{
    msgpack_pack_map(pk, 1);
    pack_tenant_ref(x, pk, x->pos[0], "tenant");
    return 0;
}

static int prep_key_revoke(ctx *x, msgpack_packer *pk)
{
    uint64_t id;
    if (!parse_u64(x->pos[0], &id))
        return usage_error(x, "KEY_ID must be a key's number (see admin key list)");
    msgpack_pack_map(pk, 1);
    rpc_pack_kv_uint(pk, "key_id", id);
    return 0;
}

static int prep_call(ctx *x, msgpack_packer *pk)
{
    const char *text;
    size_t len;
    x->method = x->pos[0];
    if (x->npos < 2) {
        x->has_args = false;
        return 0;
    }
    int rc = text_arg(x, x->pos[1], &text, &len);
    if (rc != 0)
        return rc;
    return pack_json_object(x, pk, "JSON-PARAMS", text, len);
}

/* ---- export and import ------------------------------------------------------------------ */

#define EXPORT_PAGE 500
#define IMPORT_BATCH 500
#define LINE_MAX_BYTES ((size_t)64 * 1024 * 1024)

static const char *const export_opts[] = {"out", NULL};
static const char *const import_opts[] = {"embeddings", NULL};

/* The fields of an exported memory that an import gives back to memory.store_batch. */
static const char *const import_fields[] = {
    "content",  "type",       "importance",   "metadata",         "embedding",
    "agent_id", "clade_id",   "scope",        "created_at",       "updated_at",
    "pinned",   "expires_at", "access_count", "last_accessed_at", NULL};

static int pack_export_page(msgpack_packer *pk, void *ud)
{
    const char *cursor = ud;
    msgpack_pack_map(pk, cursor ? 6 : 5);
    rpc_pack_kv_bool(pk, "include_archived", true);
    rpc_pack_kv_str(pk, "order_by", "created_at");
    rpc_pack_kv_str(pk, "order", "asc");
    rpc_pack_kv_uint(pk, "limit", EXPORT_PAGE);
    rpc_pack_kv_bool(pk, "include_embedding", true);
    if (cursor)
        rpc_pack_kv_str(pk, "cursor", cursor);
    return 0;
}

/* engram export: pages through memory.list (archived memories too, with their
 * archived_at and archived_reason) and writes one JSON object per memory. */
static int exec_export(ctx *x)
{
    const char *path = opt_get(x, "out");
    FILE *out = stdout;
    char *cursor = NULL;
    size_t total = 0;
    int rc = EXIT_OK;
    if (path && !(out = fopen(path, "w")))
        return error_out("io_error", "cannot write %s: %s", path, strerror(errno));
    for (;;) {
        client_error e;
        const msgpack_object *res;
        msgpack_zone_clear(&x->zone);
        client_args args = {.pack = pack_export_page, .ud = cursor};
        rc = client_call(x->conn, "memory.list", &args, &x->zone, &res, &e);
        if (rc != 0) {
            rc = client_fail(x, &e);
            break;
        }
        const msgpack_object *mems = rpc_map_get(res, "memories");
        for (uint32_t i = 0; mems && i < mems->via.array.size; i++) {
            json_buf jb = {0};
            if (json_from_msgpack(&mems->via.array.ptr[i], JSON_BIN_BASE64, JSON_DEPTH, &jb) != 0) {
                json_buf_fini(&jb);
                rc = error_out("protocol_error", "a memory cannot be written as JSON");
                goto out;
            }
            fwrite(jb.data, 1, jb.len, out);
            fputc('\n', out);
            json_buf_fini(&jb);
            total++;
        }
        const msgpack_object *next = rpc_map_get(res, "next_cursor");
        free(cursor);
        cursor = NULL;
        if (!next || next->type != MSGPACK_OBJECT_STR)
            break;
        cursor = strndup(next->via.str.ptr, next->via.str.size);
        if (!cursor) {
            rc = error_out("out_of_memory", "out of memory");
            break;
        }
    }
out:
    free(cursor);
    if (path && fclose(out) != 0 && rc == EXIT_OK)
        rc = error_out("io_error", "cannot write %s", path);
    if (rc == EXIT_OK)
        fprintf(stderr, "exported %zu memories\n", total);
    return rc;
}

static int b64val(unsigned char c)
{
    if (c >= 'A' && c <= 'Z')
        return c - 'A';
    if (c >= 'a' && c <= 'z')
        return c - 'a' + 26;
    if (c >= '0' && c <= '9')
        return c - '0' + 52;
    return c == '+' ? 62 : c == '/' ? 63 : -1;
}

/* Decodes standard base64 (with padding) into out (room for n * 3 / 4 bytes); returns the
 * length or -1. */
static long b64decode(const char *s, size_t n, unsigned char *out)
{
    size_t o = 0;
    unsigned acc = 0;
    int bits = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] == '=')
            break;
        int v = b64val((unsigned char)s[i]);
        if (v < 0)
            return -1;
        acc = (acc << 6) | (unsigned)v;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            out[o++] = (unsigned char)(acc >> bits);
        }
    }
    return (long)o;
}

/* ---- import: what the tenant holds already ----------------------------------------------
 *
 * An import stores only the memories the tenant does not hold yet, so it can be repeated,
 * with or without embeddings, from the same file or from another export of the same memories
 * cut into other batches. A memory is the same as another when its content, type, agent,
 * clade, scope and creation time are: what an export keeps and nothing an import or a later
 * change alters (importance, metadata, access counts and the embedding may differ). Before
 * storing, the import lists the tenant's memories once (memory.list, archived ones included,
 * without embeddings) and counts each identity; a line whose identity is counted uses up one
 * count and is reported as already present, so a file holding two equal memories where the
 * tenant holds one stores one. A line without created_at matches on the rest (the server
 * would give it the time of the import). Identities are compared as 64-bit hashes: two
 * different memories share one with a probability of about n^2 / 2^65 (3e-8 for a million). */

#define FP_SEED 0x656e6772616d3031ULL /* "engram01" */

static void fp_str(xxh64_state *h, char tag, const msgpack_object *o)
{
    uint64_t n = o && o->type == MSGPACK_OBJECT_STR ? o->via.str.size : 0;
    xxh64_update(h, &tag, 1);
    xxh64_update(h, &n, sizeof(n));
    if (n)
        xxh64_update(h, o->via.str.ptr, (size_t)n);
}

static uint64_t fp_uint(const msgpack_object *o)
{
    return o && o->type == MSGPACK_OBJECT_POSITIVE_INTEGER ? o->via.u64 : 0;
}

/* The identity hashes of a memory map m (a listed memory or a line of an export): *full with
 * its created_at, *loose without. Returns whether m has a created_at. */
static bool import_identity(const msgpack_object *m, uint64_t *full, uint64_t *loose)
{
    xxh64_state h;
    const msgpack_object *type = rpc_map_get(m, "type");
    if (!type || type->type != MSGPACK_OBJECT_STR)
        type = rpc_map_get(m, "memory_type");
    uint64_t agent = fp_uint(rpc_map_get(m, "agent_id"));
    uint64_t clade = fp_uint(rpc_map_get(m, "clade_id"));
    const msgpack_object *scope = rpc_map_get(m, "scope");
    msgpack_object dflt = {.type = MSGPACK_OBJECT_STR};
    if (!scope || scope->type != MSGPACK_OBJECT_STR) { /* the server's default (memory.store) */
        dflt.via.str.ptr = agent ? "agent" : "tenant";
        dflt.via.str.size = (uint32_t)strlen(dflt.via.str.ptr);
        scope = &dflt;
    }
    xxh64_init(&h, FP_SEED);
    fp_str(&h, 'c', rpc_map_get(m, "content"));
    fp_str(&h, 't', type);
    fp_str(&h, 's', scope);
    xxh64_update(&h, &agent, sizeof(agent));
    xxh64_update(&h, &clade, sizeof(clade));
    *loose = xxh64_digest(&h);
    const msgpack_object *at = rpc_map_get(m, "created_at");
    bool has_at = at && (at->type == MSGPACK_OBJECT_POSITIVE_INTEGER ||
                         at->type == MSGPACK_OBJECT_NEGATIVE_INTEGER);
    int64_t t = has_at ? at->via.i64 : 0;
    xxh64_update(&h, "a", 1);
    xxh64_update(&h, &t, sizeof(t));
    *full = xxh64_digest(&h);
    if (*loose == UINT64_MAX) /* idmap's reserved key */
        *loose = 0;
    if (*full == UINT64_MAX)
        *full = 0;
    return has_at;
}

typedef struct import_seen {
    idmap *full;    /* identity with created_at -> how many of the tenant's memories have it */
    idmap *loose;   /* identity without created_at -> how many */
    uint64_t state; /* an order-free hash of the ids listed: the tenant's state at the lookup */
    size_t count;   /* memories listed */
} import_seen;

static int count_up(idmap *m, uint64_t k)
{
    uint64_t n = 0;
    idmap_get(m, k, &n);
    return idmap_put(m, k, n + 1);
}

/* Uses up one count of k; returns whether there was one. */
static bool count_down(idmap *m, uint64_t k)
{
    uint64_t n = 0;
    if (!idmap_get(m, k, &n) || n == 0)
        return false;
    idmap_put(m, k, n - 1); /* replacing a value never fails */
    return true;
}

static int pack_seen_page(msgpack_packer *pk, void *ud)
{
    const char *cursor = ud;
    msgpack_pack_map(pk, cursor ? 3 : 2);
    rpc_pack_kv_bool(pk, "include_archived", true);
    rpc_pack_kv_uint(pk, "limit", 1000);
    if (cursor)
        rpc_pack_kv_str(pk, "cursor", cursor);
    return 0;
}

/* Lists the tenant's memories into seen (initialised by the caller). Returns 0 or an exit
 * code (the error printed). */
static int import_lookup(ctx *x, import_seen *seen)
{
    char *cursor = NULL;
    int rc = EXIT_OK;
    for (;;) {
        client_error e;
        const msgpack_object *res;
        msgpack_zone_clear(&x->zone);
        client_args args = {.pack = pack_seen_page, .ud = cursor};
        if (client_call(x->conn, "memory.list", &args, &x->zone, &res, &e) != 0) {
            rc = client_fail(x, &e);
            break;
        }
        const msgpack_object *mems = rpc_map_get(res, "memories");
        for (uint32_t i = 0; mems && mems->type == MSGPACK_OBJECT_ARRAY && i < mems->via.array.size;
             i++) {
            const msgpack_object *m = &mems->via.array.ptr[i];
            uint64_t full, loose;
            if (m->type != MSGPACK_OBJECT_MAP)
                continue; /* a row the server could not read (nil) */
            import_identity(m, &full, &loose);
            if (count_up(seen->full, full) != 0 || count_up(seen->loose, loose) != 0) {
                rc = error_out("out_of_memory", "out of memory listing the tenant's memories");
                goto out;
            }
            seen->state += hash_mix64(fp_uint(rpc_map_get(m, "id")) ^ HASH_GOLDEN64);
            seen->count++;
        }
        const msgpack_object *next = rpc_map_get(res, "next_cursor");
        free(cursor);
        cursor = NULL;
        if (!next || next->type != MSGPACK_OBJECT_STR)
            break;
        cursor = strndup(next->via.str.ptr, next->via.str.size);
        if (!cursor) {
            rc = error_out("out_of_memory", "out of memory");
            break;
        }
    }
out:
    free(cursor);
    seen->state = hash_mix64(seen->state ^ hash_mix64(seen->count));
    return rc;
}

typedef struct import_batch {
    obuf items; /* the packed memory maps, back to back */
    uint32_t n;
    uint64_t state; /* import_seen.state, part of every batch's idempotency key */
    uint64_t again; /* non-zero: the batch is sent again under a new key (see import_flush) */
    uint32_t narchived;
    uint32_t archived[IMPORT_BATCH]; /* items exported as archived: archived again once stored */
    char *reasons[IMPORT_BATCH];
} import_batch;

/* Packs one exported memory (a map) as a store_batch item into b. Returns 0, or -1 with a
 * message printed. */
static int import_item(import_batch *b, const msgpack_object *m, bool keep_embeddings, size_t line)
{
    msgpack_packer pk;
    msgpack_packer_init(&pk, &b->items, ubuf_sink_write);
    uint32_t n = 0;
    int64_t now = (int64_t)time(NULL) * 1000;
    for (uint32_t i = 0; i < m->via.map.size; i++) {
        const msgpack_object_kv *kv = &m->via.map.ptr[i];
        for (const char *const *f = import_fields; *f; f++) {
            if (!rpc_str_eq(&kv->key, *f) || kv->val.type == MSGPACK_OBJECT_NIL)
                continue;
            if (!keep_embeddings && strcmp(*f, "embedding") == 0)
                continue;
            if (strcmp(*f, "expires_at") == 0 && kv->val.type == MSGPACK_OBJECT_POSITIVE_INTEGER &&
                (int64_t)kv->val.via.u64 <= now)
                return 1; /* expired since the export: skip it */
            n++;
        }
    }
    const msgpack_object *arch = rpc_map_get(m, "archived_at");
    if (arch && arch->type != MSGPACK_OBJECT_NIL) {
        const msgpack_object *why = rpc_map_get(m, "archived_reason");
        b->archived[b->narchived] = b->n;
        b->reasons[b->narchived++] = why && why->type == MSGPACK_OBJECT_STR
                                         ? strndup(why->via.str.ptr, why->via.str.size)
                                         : NULL;
    }
    msgpack_pack_map(&pk, n);
    for (uint32_t i = 0; i < m->via.map.size; i++) {
        const msgpack_object_kv *kv = &m->via.map.ptr[i];
        for (const char *const *f = import_fields; *f; f++) {
            if (!rpc_str_eq(&kv->key, *f) || kv->val.type == MSGPACK_OBJECT_NIL)
                continue;
            if (strcmp(*f, "embedding") == 0) {
                if (!keep_embeddings)
                    continue;
                if (kv->val.type != MSGPACK_OBJECT_STR) {
                    fprintf(stderr, "engram: line %zu: embedding is not base64\n", line);
                    return -1;
                }
                unsigned char *bin = malloc(kv->val.via.str.size * 3 / 4 + 3);
                long len = bin ? b64decode(kv->val.via.str.ptr, kv->val.via.str.size, bin) : -1;
                if (len < 0) {
                    free(bin);
                    fprintf(stderr, "engram: line %zu: embedding is not base64\n", line);
                    return -1;
                }
                rpc_pack_cstr(&pk, "embedding");
                msgpack_pack_bin(&pk, (size_t)len);
                msgpack_pack_bin_body(&pk, bin, (size_t)len);
                free(bin);
                continue;
            }
            msgpack_pack_object(&pk, kv->key);
            msgpack_pack_object(&pk, kv->val);
        }
    }
    b->n++;
    return b->items.failed ? -1 : 0;
}

typedef struct batch_pack {
    const import_batch *b;
} batch_pack;

static int pack_import_batch(msgpack_packer *pk, void *ud)
{
    const import_batch *b = ud;
    /* the key names the batch's exact items and the tenant's state when the import looked:
     * a batch sent again (two imports of one file at once) is answered from the first, while
     * the same memories imported after they were deleted are stored again */
    char key[96];
    int n = snprintf(key, sizeof(key), "import-%016llx-%016llx-%u",
                     (unsigned long long)xxh64(b->items.b.data, b->items.b.len, FP_SEED),
                     (unsigned long long)b->state, b->n);
    if (b->again)
        snprintf(key + n, sizeof(key) - (size_t)n, "-%llx", (unsigned long long)b->again);
    msgpack_pack_map(pk, 2);
    rpc_pack_cstr(pk, "memories");
    msgpack_pack_array(pk, b->n);
    pk->callback(pk->data, b->items.b.data, b->items.b.len);
    rpc_pack_kv_str(pk, "idempotency_key", key);
    return 0;
}

typedef struct archive_args {
    uint64_t id;
    const char *reason;
} archive_args;

static int pack_archive(msgpack_packer *pk, void *ud)
{
    const archive_args *a = ud;
    msgpack_pack_map(pk, a->reason ? 2 : 1);
    rpc_pack_cstr(pk, "ids");
    msgpack_pack_array(pk, 1);
    msgpack_pack_uint64(pk, a->id);
    if (a->reason)
        rpc_pack_kv_str(pk, "reason", a->reason);
    return 0;
}

static int pack_get_ids(msgpack_packer *pk, void *ud)
{
    const msgpack_object *ids = ud;
    msgpack_pack_map(pk, 1);
    rpc_pack_cstr(pk, "ids");
    return msgpack_pack_object(pk, *ids) == 0 ? 0 : -ENOMEM;
}

/* A batch the server answered as a replay: whether every memory of that earlier answer is
 * still there (*out), by memory.get. Returns 0 or an exit code. */
static int replay_still_there(ctx *x, const msgpack_object *ids, bool *out)
{
    client_error e;
    const msgpack_object *res;
    client_args args = {.pack = pack_get_ids, .ud = (void *)ids};
    *out = false;
    if (!ids || ids->type != MSGPACK_OBJECT_ARRAY || ids->via.array.size == 0)
        return 0;
    if (client_call(x->conn, "memory.get", &args, &x->zone, &res, &e) != 0)
        return client_fail(x, &e);
    const msgpack_object *missing = rpc_map_get(res, "missing");
    *out = !missing || missing->type != MSGPACK_OBJECT_ARRAY || missing->via.array.size == 0;
    return 0;
}

/* Sends one batch, adding its memories to *stored, or to *present when the server answers
 * it as a replay of a batch an identical import stored meanwhile. Returns 0 or an exit code. */
static int import_flush(ctx *x, import_batch *b, size_t *stored, size_t *present)
{
    if (b->n == 0)
        return 0;
    client_error e;
    const msgpack_object *res;
    msgpack_zone_clear(&x->zone);
    client_args args = {.pack = pack_import_batch, .ud = b};
    int rc = client_call(x->conn, "memory.store_batch", &args, &x->zone, &res, &e);
    if (rc != 0)
        return client_fail(x, &e);
    const msgpack_object *ids = rpc_map_get(res, "ids");
    bool replayed = rpc_get_bool(rpc_map_get(res, "replayed"), false);
    if (replayed) {
        /* Another import of the same batch from the same state stored it (it is counted as
         * present), or this state came back: the tenant's memories were deleted down to the
         * very set an earlier import started from, and what it stored is gone. Then the
         * batch goes again under a key of its own. (Some gone and some there would take a
         * concurrent import and a delete of part of what it stored in between; the batch
         * then goes again whole.) */
        bool there;
        if ((rc = replay_still_there(x, ids, &there)) != 0)
            return rc;
        if (!there) {
            b->again = (uint64_t)time(NULL) * 1000003u + (uint64_t)clock();
            msgpack_zone_clear(&x->zone);
            rc = client_call(x->conn, "memory.store_batch", &args, &x->zone, &res, &e);
            b->again = 0;
            if (rc != 0)
                return client_fail(x, &e);
            ids = rpc_map_get(res, "ids");
            replayed = false;
        }
    }
    for (uint32_t k = 0; !replayed && k < b->narchived; k++) {
        uint32_t i = b->archived[k];
        if (!ids || ids->type != MSGPACK_OBJECT_ARRAY || i >= ids->via.array.size)
            break;
        archive_args aa = {.id = ids->via.array.ptr[i].via.u64, .reason = b->reasons[k]};
        const msgpack_object *ares;
        client_args a2 = {.pack = pack_archive, .ud = &aa};
        rc = client_call(x->conn, "memory.archive", &a2, &x->zone, &ares, &e);
        if (rc != 0)
            return client_fail(x, &e);
    }
    for (uint32_t k = 0; k < b->narchived; k++) {
        free(b->reasons[k]);
        b->reasons[k] = NULL;
    }
    b->narchived = 0;
    *(replayed ? present : stored) += b->n;
    ubuf_truncate(&b->items.b, 0);
    b->n = 0;
    return 0;
}

/* engram import: reads JSON Lines, stores the memories the tenant does not hold yet (see
 * import_identity) in batches of IMPORT_BATCH, and reports how many were new and how many
 * were there already. */
static int exec_import(ctx *x)
{
    const char *path = x->npos ? x->pos[0] : NULL;
    const char *emb = opt_get(x, "embeddings");
    bool keep = !emb || strcmp(emb, "keep") == 0;
    if (emb && !keep && strcmp(emb, "drop") != 0)
        return usage_error(x, "--embeddings must be keep or drop");
    FILE *in = path && strcmp(path, "-") != 0 ? fopen(path, "r") : stdin;
    if (!in)
        return error_out("io_error", "cannot read %s: %s", path, strerror(errno));
    import_seen seen = {.full = idmap_create(1024), .loose = idmap_create(1024)};
    import_batch b = {0};
    char *line = NULL;
    size_t cap = 0, lineno = 0, stored = 0, present = 0, expired = 0;
    ssize_t len;
    int rc = EXIT_OK;
    if (!seen.full || !seen.loose) {
        rc = error_out("out_of_memory", "out of memory");
        goto out;
    }
    if ((rc = import_lookup(x, &seen)) != EXIT_OK)
        goto out;
    b.state = seen.state;
    while ((len = getline(&line, &cap, in)) > 0) {
        lineno++;
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r'))
            line[--len] = '\0';
        if (len == 0)
            continue;
        obuf mp = {0};
        msgpack_packer pk;
        msgpack_packer_init(&pk, &mp, ubuf_sink_write);
        char err[160];
        msgpack_object m;
        size_t off = 0;
        msgpack_zone z;
        msgpack_zone_init(&z, 4096);
        if (json_to_msgpack(line, (size_t)len, JSON_DEPTH, &pk, err, sizeof(err)) != 0 ||
            mp.failed ||
            msgpack_unpack(mp.b.data, mp.b.len, &off, &z, &m) != MSGPACK_UNPACK_SUCCESS ||
            m.type != MSGPACK_OBJECT_MAP) {
            fprintf(stderr, "engram: line %zu is not a JSON object\n", lineno);
            msgpack_zone_destroy(&z);
            ubuf_fini(&mp.b);
            rc = EXIT_ERR;
            break;
        }
        uint64_t full, loose;
        bool found = import_identity(&m, &full, &loose) ? count_down(seen.full, full)
                                                        : count_down(seen.loose, loose);
        if (found) {
            count_down(seen.loose, loose); /* keeps the looser count in step */
            present++;
            msgpack_zone_destroy(&z);
            ubuf_fini(&mp.b);
            continue;
        }
        int ir = import_item(&b, &m, keep, lineno);
        msgpack_zone_destroy(&z);
        ubuf_fini(&mp.b);
        if (ir < 0) {
            rc = EXIT_ERR;
            break;
        }
        if (ir > 0)
            expired++;
        if (b.n == IMPORT_BATCH && (rc = import_flush(x, &b, &stored, &present)) != 0)
            break;
    }
    if (rc == EXIT_OK)
        rc = import_flush(x, &b, &stored, &present);
out:
    free(line);
    ubuf_fini(&b.items.b);
    for (uint32_t k = 0; k < b.narchived; k++)
        free(b.reasons[k]);
    idmap_destroy(seen.full);
    idmap_destroy(seen.loose);
    if (in != stdin)
        fclose(in);
    if (rc != EXIT_OK)
        return rc;
    if (x->json)
        printf("{\"imported\":%zu,\"already_present\":%zu,\"expired\":%zu}\n", stored, present,
               expired);
    fprintf(stderr, "imported %zu new memor%s, %zu already present", stored,
            stored == 1 ? "y" : "ies", present);
    if (expired)
        fprintf(stderr, ", %zu expired since the export (skipped)", expired);
    fputc('\n', stderr);
    return rc;
}

static const command commands[] = {
    {"ping", "", "check that the server answers", 0, 0, NULL, AUTH_NONE, "ping", NULL, show_plain,
     NULL},
    {"store", "CONTENT [--type T] [--importance X] [--metadata JSON]",
     "store a memory and print its id; type fact (default), preference, episode,\n"
     "strategy_outcome or constraint; importance in [0,1] (default 0.5)",
     1, 1, store_opts, AUTH_REQUIRED, "memory.store", prep_store, show_store, NULL},
    {"search", "QUERY [--top-k N]", "search memories: one line per hit (id, score, type, content)",
     1, 1, search_opts, AUTH_REQUIRED, "memory.search", prep_search, show_search, NULL},
    {"get", "ID...", "show memories", 1, -1, NULL, AUTH_REQUIRED, "memory.get", prep_ids, show_get,
     NULL},
    {"delete", "ID...", "delete memories", 1, -1, NULL, AUTH_REQUIRED, "memory.delete", prep_ids,
     show_delete, NULL},
    {"methods", "", "list the server's methods and their parameters", 0, 0, NULL, AUTH_IF_KEY,
     "methods", NULL, show_methods, NULL},
    {"admin tenant create", "NAME --tier free|standard|premium [--dim N]",
     "create a tenant (admin key) and print its API key, shown only this once", 1, 1, tenant_opts,
     AUTH_REQUIRED, "admin.tenant.create", prep_tenant_create, show_tenant_create, NULL},
    {"admin tenant list", "[--limit N] [--cursor ID]", "list tenants (admin key)", 0, 0, list_opts,
     AUTH_REQUIRED, "admin.tenant.list", prep_tenant_list, show_tenant_list, NULL},
    {"admin tenant get", "TENANT", "show a tenant (by id or name; admin key)", 1, 1, NULL,
     AUTH_REQUIRED, "admin.tenant.get", prep_tenant_ref, NULL, NULL},
    {"admin tenant update", "TENANT [--tier T] [--name NEW]",
     "change a tenant's tier or name (admin key)", 1, 1, tenant_update_opts, AUTH_REQUIRED,
     "admin.tenant.update", prep_tenant_update, NULL, NULL},
    {"admin tenant delete", "TENANT", "delete a tenant and all of its data (admin key)", 1, 1, NULL,
     AUTH_REQUIRED, "admin.tenant.delete", prep_tenant_ref, NULL, NULL},
    {"admin key create", "TENANT NAME",
     "create another API key for a tenant and print it, shown only this once", 2, 2, NULL,
     AUTH_REQUIRED, "admin.key.create", prep_key_create, show_tenant_create, NULL},
    {"admin key list", "TENANT", "list a tenant's keys (admin key)", 1, 1, NULL, AUTH_REQUIRED,
     "admin.key.list", prep_key_list, NULL, NULL},
    {"admin key revoke", "KEY_ID", "revoke a key: it fails from its next request", 1, 1, NULL,
     AUTH_REQUIRED, "admin.key.revoke", prep_key_revoke, NULL, NULL},
    {"usage", "", "the tenant's usage and limits", 0, 0, NULL, AUTH_REQUIRED, "tenant.usage", NULL,
     NULL, NULL},
    {"call", "METHOD [JSON-PARAMS]",
     "call any method with a JSON object of named parameters; print the result as JSON", 1, 2, NULL,
     AUTH_IF_KEY, NULL, prep_call, NULL, NULL},
    {"export", "[--out FILE]",
     "write every memory of the tenant (embeddings included) as JSON Lines", 0, 0, export_opts,
     AUTH_REQUIRED, NULL, NULL, NULL, exec_export},
    {"import", "[FILE] [--embeddings keep|drop]",
     "store the memories of an export (standard input without FILE), keeping timestamps,\n"
     "importance and access counts; drop re-embeds the content on this server. Memories the\n"
     "tenant holds already (same content, type, agent, clade, scope and creation time) are\n"
     "counted and skipped, so an import can be repeated",
     0, 1, import_opts, AUTH_REQUIRED, NULL, NULL, NULL, exec_import},
};

#define NCOMMANDS (sizeof(commands) / sizeof(commands[0]))

/* ---- usage ------------------------------------------------------------------------------ */

static const char usage_line[] =
    "usage: engram [--url URL | --host H --port P] [--key KEY | --key-file PATH] "
    "[--tls] [--tls-ca FILE] [--tls-cert FILE --tls-key FILE] "
    "[--json] [--timeout-ms N] [--connect-timeout-ms N] COMMAND ...";

static void print_help(FILE *f)
{
    fprintf(f, "%s\n\ncommands:\n", usage_line);
    for (size_t i = 0; i < NCOMMANDS; i++) {
        const command *c = &commands[i];
        fprintf(f, "  %s%s%s\n      ", c->name, c->synopsis[0] ? " " : "", c->synopsis);
        for (const char *h = c->help; *h; h++) {
            fputc(*h, f);
            if (*h == '\n')
                fputs("      ", f);
        }
        fputc('\n', f);
    }
    fputs(
        "\nA CONTENT, QUERY or JSON-PARAMS of - is read from standard input; an ID may be\n"
        "written #12. Put -- before arguments that start with a dash.\n"
        "\noptions (anywhere on the line):\n"
        "  --url URL        the server: engram://HOST[:PORT] (tcp:// too), or\n"
        "                   engrams://HOST[:PORT] for TLS (tls:// too); PORT defaults to 7420\n"
        "                   (ENGRAM_URL, read when neither --url nor --host/--port is given)\n"
        "  --host H         server host (ENGRAM_HOST when ENGRAM_URL is unset; default\n"
        "                   " DEFAULT_HOST ")\n"
        "  --port P         server port (ENGRAM_PORT when ENGRAM_URL is unset; default 7420)\n"
        "  --key KEY        API key (ENGRAM_API_KEY); other local users can see it in ps,\n"
        "                   so prefer --key-file\n"
        "  --key-file PATH  read the API key from the first line of PATH\n"
        "                   (ENGRAM_API_KEY_FILE, or ENGRAM_KEY_FILE, its older name)\n"
        "  --tls            connect over TLS 1.3 (ENGRAM_TLS=1); the server's certificate\n"
        "                   must name the host and chain to the system's CAs or --tls-ca\n"
        "  --tls-ca FILE    PEM CA certificates to verify the server with (ENGRAM_TLS_CA);\n"
        "                   implies --tls\n"
        "  --tls-cert FILE  PEM client certificate to present (ENGRAM_TLS_CERT); implies\n"
        "                   --tls; an admin needs one when the server sets\n"
        "                   tls_admin_require_client_cert\n"
        "  --tls-key FILE   its PEM private key (ENGRAM_TLS_KEY; default: in --tls-cert)\n"
        "                   (ENGRAM_TLS_SERVERNAME: the name the server's certificate must\n"
        "                   carry, when not the host)\n"
        "  --json           print the result as exactly one line of JSON on stdout\n"
        "  --timeout-ms N   per-call timeout (default 30000; 0: none)\n"
        "  --connect-timeout-ms N\n"
        "                   connecting (and the TLS handshake) at most (default 1000; 0: the\n"
        "                   per-call timeout); a refused connection fails at once\n"
        "  -h, --help       print this help\n"
        "\nexit status: 0 success, 1 error (\"engram: CODE: MESSAGE\" on stderr), 2 usage error\n",
        f);
}

/* Prints "engram: MESSAGE" and the usage line to stderr; returns EXIT_USAGE. */
static int usage_error(const ctx *x, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    fputs("engram: ", stderr);
    put_clean_cstr(stderr, msg);
    fputc('\n', stderr);
    if (x && x->cmd)
        fprintf(stderr, "usage: engram [OPTIONS] %s%s%s\n", x->cmd->name,
                x->cmd->synopsis[0] ? " " : "", x->cmd->synopsis);
    else
        fprintf(stderr, "%s\n", usage_line);
    fputs("(engram --help for more)\n", stderr);
    return EXIT_USAGE;
}

/* ---- the command line ----------------------------------------------------------------- */

/* Matches the longest command name that the leading words spell. Returns the number of
 * words used, 0 when none matches. */
static int match_command(const char **words, int n, const command **out)
{
    int best = 0;
    for (size_t i = 0; i < NCOMMANDS; i++) {
        const char *name = commands[i].name;
        int k = 0;
        while (k < n) {
            size_t wl = strlen(words[k]);
            if (strncmp(name, words[k], wl) != 0 || (name[wl] != ' ' && name[wl] != '\0'))
                break;
            k++;
            name += wl;
            if (*name == '\0')
                break;
            name++;
        }
        if (*name == '\0' && k > best) {
            best = k;
            *out = &commands[i];
        }
    }
    return best;
}

static bool name_is(const char *name, size_t len, const char *s)
{
    return len == strlen(s) && memcmp(name, s, len) == 0;
}

/* Splits argv into global options, command options and words. Returns -1 to go on, or an
 * exit status. */
static int parse_line(ctx *x, int argc, char **argv, const char **words, int *nwords)
{
    bool dashdash = false;
    *nwords = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (dashdash || a[0] != '-' || a[1] == '\0') {
            words[(*nwords)++] = a;
            continue;
        }
        if (strcmp(a, "--") == 0) {
            dashdash = true;
            continue;
        }
        if (strcmp(a, "-h") == 0) {
            x->help = true;
            continue;
        }
        if (a[1] != '-')
            return usage_error(x, "unknown option '%s'", a);
        const char *name = a + 2, *eq = strchr(name, '=');
        size_t nl = eq ? (size_t)(eq - name) : strlen(name);
        if (name_is(name, nl, "help") || name_is(name, nl, "json") || name_is(name, nl, "tls")) {
            if (eq)
                return usage_error(x, "option --%.*s takes no value", (int)nl, name);
            if (name[0] == 'h')
                x->help = true;
            else if (name[0] == 'j')
                x->json = true;
            else
                x->tls = true;
            continue;
        }
        const char *val;
        if (eq) {
            val = eq + 1;
        } else if (i + 1 < argc) {
            val = argv[++i];
        } else {
            return usage_error(x, "option --%.*s needs a value", (int)nl, name);
        }
        if (name_is(name, nl, "url"))
            x->url = val;
        else if (name_is(name, nl, "host"))
            x->host = val;
        else if (name_is(name, nl, "port"))
            x->port_s = val;
        else if (name_is(name, nl, "key"))
            x->key_opt = val;
        else if (name_is(name, nl, "key-file"))
            x->key_file_opt = val;
        else if (name_is(name, nl, "timeout-ms"))
            x->timeout_s = val;
        else if (name_is(name, nl, "connect-timeout-ms"))
            x->connect_timeout_s = val;
        else if (name_is(name, nl, "tls-ca"))
            x->tls_ca = val;
        else if (name_is(name, nl, "tls-cert"))
            x->tls_cert = val;
        else if (name_is(name, nl, "tls-key"))
            x->tls_key = val;
        else if (x->nopts == MAX_OPTS)
            return usage_error(x, "too many options");
        else
            x->opts[x->nopts++] = (opt_val){name, nl, val};
    }
    return -1;
}

/* Checks the command's options and argument count. Returns -1 to go on, or EXIT_USAGE. */
static int check_command(ctx *x)
{
    const command *c = x->cmd;
    for (int i = 0; i < x->nopts; i++) {
        bool known = false;
        for (const char *const *o = c->opts; o && *o && !known; o++)
            known = name_is(x->opts[i].name, x->opts[i].name_len, *o);
        if (!known)
            return usage_error(x, "unknown option --%.*s for %s", (int)x->opts[i].name_len,
                               x->opts[i].name, c->name);
        for (int k = 0; k < i; k++)
            if (x->opts[k].name_len == x->opts[i].name_len &&
                memcmp(x->opts[k].name, x->opts[i].name, x->opts[i].name_len) == 0)
                return usage_error(x, "option --%.*s given twice", (int)x->opts[i].name_len,
                                   x->opts[i].name);
    }
    if (x->npos < c->min_pos)
        return usage_error(x, "%s needs more arguments", c->name);
    if (c->max_pos >= 0 && x->npos > c->max_pos)
        return usage_error(x, "too many arguments for %s", c->name);
    return -1;
}

static const char *env(const char *name)
{
    const char *v = getenv(name);
    return v && v[0] ? v : NULL;
}

/* Reads the key from the first line of path into x->key. Never prints the key. */
static int read_key_file(ctx *x, const char *path)
{
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return error_out("key_file", "cannot open %s: %s", path, strerror(errno));
    size_t n = fread(x->key, 1, sizeof(x->key) - 1, f);
    bool bad = ferror(f) != 0, big = n == sizeof(x->key) - 1 && fgetc(f) != EOF;
    fclose(f);
    x->key[n] = '\0';
    if (bad)
        return error_out("key_file", "cannot read %s", path);
    char *nl = memchr(x->key, '\n', n);
    if (nl)
        *nl = '\0';
    else if (big)
        return error_out("key_file", "%s: the first line is longer than %d bytes", path, KEY_MAX);
    size_t len = strlen(x->key), start = 0;
    while (len > 0 &&
           (x->key[len - 1] == '\r' || x->key[len - 1] == ' ' || x->key[len - 1] == '\t'))
        x->key[--len] = '\0';
    while (x->key[start] == ' ' || x->key[start] == '\t')
        start++;
    memmove(x->key, x->key + start, len - start + 1);
    if (x->key[0] == '\0')
        return error_out("key_file", "%s holds no key on its first line", path);
    return 0;
}

/* Settles the key: --key, --key-file, ENGRAM_API_KEY, ENGRAM_API_KEY_FILE, ENGRAM_KEY_FILE
 * (ENGRAM_API_KEY_FILE's older name) in that order. Sets *key to it or NULL. */
static int resolve_key(ctx *x, const char **key)
{
    *key = NULL;
    if (x->key_opt && x->key_file_opt)
        return usage_error(x, "give --key or --key-file, not both");
    if (x->key_opt) {
        *key = x->key_opt;
        return 0;
    }
    const char *path = x->key_file_opt;
    if (path == NULL) {
        *key = env("ENGRAM_API_KEY");
        if (*key)
            return 0;
        path = env("ENGRAM_API_KEY_FILE");
        if (path == NULL)
            path = env("ENGRAM_KEY_FILE");
    }
    if (path == NULL)
        return 0;
    int rc = read_key_file(x, path);
    if (rc == 0)
        *key = x->key;
    return rc;
}

/* Parses an Engram URL the way every Engram tool does: engram://HOST[:PORT] or
 * tcp://HOST[:PORT] (plain), engrams://HOST[:PORT] or tls://HOST[:PORT] (TLS); HOST:PORT
 * alone is engram://; [v6] brackets an IPv6 address; PORT defaults to DEFAULT_PORT. what
 * names the URL's source in messages. Fills host (NUL-terminated, hostlen bytes at most),
 * *port and *tls and returns true, or writes why (never the URL, which could hold a secret)
 * and returns false. */
static bool parse_url(const char *url, const char *what, char *host, size_t hostlen, uint64_t *port,
                      bool *tls, char *why, size_t whylen)
{
    const char *sep = strstr(url, "://"), *auth = url;
    *tls = false;
    *port = DEFAULT_PORT;
    if (sep) {
        size_t n = (size_t)(sep - url);
        static const struct {
            const char *name;
            bool tls;
        } schemes[] = {{"engram", false}, {"tcp", false}, {"engrams", true}, {"tls", true}};
        bool known = false;
        for (size_t i = 0; i < sizeof(schemes) / sizeof(schemes[0]) && !known; i++) {
            if (n == strlen(schemes[i].name) && strncasecmp(url, schemes[i].name, n) == 0) {
                known = true;
                *tls = schemes[i].tls;
            }
        }
        if (!known && ((n == 4 && strncasecmp(url, "http", 4) == 0) ||
                       (n == 5 && strncasecmp(url, "https", 5) == 0))) {
            snprintf(why, whylen,
                     "%s: %.*s:// names engramd's HTTP/JSON port; the engram CLI speaks "
                     "MessagePack-RPC: use engram://HOST:7420 (engrams:// for TLS)",
                     what, (int)n, url);
            return false;
        }
        if (!known) {
            snprintf(why, whylen,
                     "%s: unknown scheme '%.*s'; use engram://, engrams://, tcp:// or tls://", what,
                     n > 16 ? 16 : (int)n, url);
            return false;
        }
        auth = sep + 3;
    }
    size_t alen = strcspn(auth, "/?#");
    if (auth[alen] != '\0' && strcmp(auth + alen, "/") != 0) {
        snprintf(why, whylen, "%s: an Engram URL is scheme://HOST:PORT, without a path or query",
                 what);
        return false;
    }
    if (memchr(auth, '@', alen)) {
        snprintf(why, whylen,
                 "%s: a URL may not carry credentials; give the key with --key-file or "
                 "ENGRAM_API_KEY(_FILE)",
                 what);
        return false;
    }
    const char *h = auth, *end = auth + alen, *colon;
    size_t hlen;
    if (*h == '[') {
        const char *rb = memchr(h, ']', alen);
        if (rb == NULL) {
            snprintf(why, whylen, "%s: no ']' after the IPv6 address", what);
            return false;
        }
        h++;
        hlen = (size_t)(rb - h);
        colon = rb + 1 < end ? rb + 1 : NULL;
        if (colon && *colon != ':') {
            snprintf(why, whylen, "%s: not HOST:PORT after the IPv6 address", what);
            return false;
        }
    } else {
        colon = memchr(h, ':', alen);
        hlen = colon ? (size_t)(colon - h) : alen;
        if (colon && memchr(colon + 1, ':', (size_t)(end - colon - 1))) {
            snprintf(why, whylen, "%s: an IPv6 address goes in brackets: engram://[::1]:7420",
                     what);
            return false;
        }
    }
    if (hlen == 0 || hlen >= hostlen) {
        snprintf(why, whylen, "%s: %s", what, hlen == 0 ? "no host" : "the host is too long");
        return false;
    }
    memcpy(host, h, hlen);
    host[hlen] = '\0';
    if (colon) {
        char digits[8];
        size_t plen = (size_t)(end - colon - 1);
        uint64_t p = 0;
        if (plen == 0 || plen >= sizeof(digits)) {
            snprintf(why, whylen, "%s: the port must be 1 to 65535", what);
            return false;
        }
        memcpy(digits, colon + 1, plen);
        digits[plen] = '\0';
        if (!parse_u64(digits, &p) || p == 0 || p > 65535) {
            snprintf(why, whylen, "%s: the port must be 1 to 65535", what);
            return false;
        }
        *port = p;
    }
    return true;
}

/* Reads the command line: the words, help, the command and its options. Returns -1 to go
 * on, or an exit status. */
static int read_command(ctx *x, int argc, char **argv)
{
    const char **words = calloc((size_t)argc + 1, sizeof(*words));
    int nwords, rc;

    if (words == NULL)
        return error_out("out_of_memory", "out of memory");
    x->words = words; /* freed by main */
    rc = parse_line(x, argc, argv, words, &nwords);
    if (rc >= 0)
        return rc;
    if (x->help || (nwords == 1 && strcmp(words[0], "help") == 0)) {
        print_help(stdout);
        return EXIT_OK;
    }
    if (nwords == 0)
        return usage_error(x, "no command given");
    int used = match_command(words, nwords, &x->cmd);
    if (used == 0) {
        if (x->nopts > 0)
            return usage_error(x, "unknown option --%.*s", (int)x->opts[0].name_len,
                               x->opts[0].name);
        return usage_error(x, "unknown command '%s'", words[0]);
    }
    x->pos = words + used;
    x->npos = nwords - used;
    return check_command(x);
}

/* Where and how to connect. host points into url_host or at a flag, the environment or
 * DEFAULT_HOST; tls's strings likewise. */
typedef struct conn_plan {
    char url_host[URL_HOST_MAX];
    const char *host;
    uint64_t port, timeout, connect_timeout;
    client_tls tls;
    bool use_tls;
} conn_plan;

/* Settles the connection from the flags and the environment: --url, or --host and --port;
 * else ENGRAM_URL; else ENGRAM_HOST and ENGRAM_PORT (the names before ENGRAM_URL); else the
 * defaults; the timeouts; TLS. Returns -1 to go on, or EXIT_USAGE. */
static int settle_connection(ctx *x, conn_plan *p)
{
    bool url_tls = false;

    p->port = DEFAULT_PORT;
    p->timeout = DEFAULT_TIMEOUT_MS;
    p->connect_timeout = DEFAULT_CONNECT_TIMEOUT_MS;
    if (x->url && (x->host || x->port_s))
        return usage_error(x, "give --url or --host/--port, not both");
    const char *url = x->url ? x->url : (x->host || x->port_s) ? NULL : env("ENGRAM_URL");
    if (url) {
        char why[256];
        if (!parse_url(url, x->url ? "--url" : "ENGRAM_URL", p->url_host, sizeof(p->url_host),
                       &p->port, &url_tls, why, sizeof(why)))
            return usage_error(x, "%s", why);
        p->host = p->url_host;
    } else {
        p->host = x->host ? x->host : env("ENGRAM_HOST") ? env("ENGRAM_HOST") : DEFAULT_HOST;
        const char *port_s = x->port_s ? x->port_s : env("ENGRAM_PORT");
        if (port_s && (!parse_u64(port_s, &p->port) || p->port == 0 || p->port > 65535))
            return usage_error(x, "the port must be 1 to 65535, not '%s'", port_s);
    }
    if (x->timeout_s && (!parse_u64(x->timeout_s, &p->timeout) || p->timeout > INT_MAX))
        return usage_error(x, "--timeout-ms must be 0 to %d, not '%s'", INT_MAX, x->timeout_s);
    if (x->connect_timeout_s &&
        (!parse_u64(x->connect_timeout_s, &p->connect_timeout) || p->connect_timeout > INT_MAX))
        return usage_error(x, "--connect-timeout-ms must be 0 to %d, not '%s'", INT_MAX,
                           x->connect_timeout_s);
    if (p->connect_timeout == 0 || (p->timeout > 0 && p->timeout < p->connect_timeout))
        p->connect_timeout = p->timeout; /* the call's own deadline bounds connecting too */
    /* TLS: flags win over the environment; any file asked for means TLS */
    p->tls = (client_tls){
        .ca_file = x->tls_ca ? x->tls_ca : env("ENGRAM_TLS_CA"),
        .cert_file = x->tls_cert ? x->tls_cert : env("ENGRAM_TLS_CERT"),
        .key_file = x->tls_key ? x->tls_key : env("ENGRAM_TLS_KEY"),
        .server_name = env("ENGRAM_TLS_SERVERNAME"),
    };
    const char *tls_env = env("ENGRAM_TLS");
    p->use_tls = x->tls || url_tls || (tls_env && strcmp(tls_env, "0") != 0) || p->tls.ca_file ||
                 p->tls.cert_file || p->tls.key_file;
    if (p->tls.key_file && !p->tls.cert_file)
        return usage_error(x, "--tls-key needs --tls-cert");
    return -1;
}

/* Settles the API key the command needs (none for ping, whatever the key settings say) and
 * packs its arguments, both before connecting. Sets *key to the key or NULL. Returns -1 to
 * go on, or an exit status. */
static int prepare_call(ctx *x, const char **key)
{
    int rc;

    *key = NULL;
    if (x->cmd->auth != AUTH_NONE) {
        rc = resolve_key(x, key);
        if (rc != 0)
            return rc;
    }
    if (x->cmd->auth == AUTH_REQUIRED && *key == NULL)
        return error_out("unauthenticated",
                         "%s needs an API key: use --key-file, --key, "
                         "ENGRAM_API_KEY_FILE or ENGRAM_API_KEY",
                         x->cmd->name);
    x->method = x->cmd->method;
    x->has_args = x->cmd->prepare != NULL;
    if (x->cmd->prepare) {
        msgpack_packer pk;
        msgpack_packer_init(&pk, &x->args, ubuf_sink_write);
        rc = x->cmd->prepare(x, &pk);
        if (rc != 0)
            return rc;
        if (x->args.failed)
            return error_out("out_of_memory", "out of memory packing the request");
    }
    if (!msgpack_zone_init(&x->zone, 8192))
        return error_out("out_of_memory", "out of memory");
    x->zone_ok = true;
    return -1;
}

/* Connects as p says, authenticates with key (when not NULL) and runs the command: its
 * exec, or the call and its output. Returns the exit status. */
static int call_command(ctx *x, const conn_plan *p, const char *key)
{
    client_error e;
    char err[512];
    int rc;

    rc = client_connect_tls(p->host, (uint16_t)p->port, (int)p->connect_timeout,
                            p->use_tls ? &p->tls : NULL, &x->conn, err, sizeof(err));
    if (rc == CLIENT_E_TIMEOUT)
        return error_out("timeout", "%s (in %" PRIu64 " ms; --connect-timeout-ms)", err,
                         p->connect_timeout);
    if (rc != 0)
        return error_out(rc == -ENOMEM        ? "out_of_memory"
                         : rc == CLIENT_E_TLS ? "tls_failed"
                                              : "connect_failed",
                         "%s", err);
    client_set_timeout(x->conn, (int)p->timeout);
    if (key) {
        rc = client_auth(x->conn, key, &e);
        if (rc != 0)
            return client_fail(x, &e);
    }
    if (x->cmd->exec)
        return x->cmd->exec(x);
    const msgpack_object *res;
    client_args args = {.packed = x->args.b.data, .packed_len = x->args.b.len};
    rc = client_call(x->conn, x->method, x->has_args ? &args : NULL, &x->zone, &res, &e);
    if (rc != 0)
        return client_fail(x, &e);
    if (x->json)
        return print_json(res, false);
    return x->cmd->show ? x->cmd->show(x, res) : print_json(res, true);
}

/* The command line's command, checked whole (options, arguments, connection settings, key)
 * before connecting, then run. Returns the exit status. */
static int run(ctx *x, int argc, char **argv)
{
    conn_plan plan;
    const char *key;
    int rc;

    rc = read_command(x, argc, argv);
    if (rc >= 0)
        return rc;
    rc = settle_connection(x, &plan);
    if (rc >= 0)
        return rc;
    rc = prepare_call(x, &key);
    if (rc >= 0)
        return rc;
    return call_command(x, &plan, key);
}

int main(int argc, char **argv)
{
    ctx x;
    memset(&x, 0, sizeof(x));
    int rc = run(&x, argc, argv);

    client_close(x.conn);
    if (x.zone_ok)
        msgpack_zone_destroy(&x.zone);
    ubuf_fini(&x.args.b);
    free(x.ids);
    free(x.input);
    free(x.words);
    /* the key read from a file does not outlive its use */
    volatile char *k = x.key;
    for (size_t i = 0; i < sizeof(x.key); i++)
        k[i] = 0;
    if (fflush(stdout) != 0 || ferror(stdout)) {
        if (rc == EXIT_OK)
            rc = error_out("io_error", "cannot write standard output");
    }
    return rc;
}
