/* llm/llm_schema.c: the JSON Schema subset validator (see llm_schema.h), and the JSON
 * document helpers the library shares (llm_int.h).
 */
#include "llm_schema.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json.h"
#include "llm_int.h"
#include "rpc.h"

/* msgpack-c's unpacker holds at most 32 nested containers (MSGPACK_EMBED_STACK_SIZE): no
 * JSON text deeper than that is parsed. A schema level takes two (the schema and its
 * properties), so schemas nest 16 properties deep. */
#define JSON_MAX_DEPTH 32
#define SCHEMA_MAX_DEPTH 32 /* schema levels (check_schema's recursion) */
#define PATH_MAX_LEN 200

struct llm_schema {
    llm_jdoc doc;
    char *json; /* compact text, for requests */
    size_t json_len;
};

/* ---- JSON documents ---------------------------------------------------------------------- */

void llm_jdoc_fini(llm_jdoc *d)
{
    if (d->zone_ok)
        msgpack_zone_destroy(&d->zone);
    ubuf_fini(&d->mp.b);
    memset(d, 0, sizeof(*d));
}

/* Unpacks d->mp into d->root. */
static int jdoc_unpack(llm_jdoc *d)
{
    if (!msgpack_zone_init(&d->zone, 1024))
        return -ENOMEM;
    d->zone_ok = true;
    size_t off = 0;
    msgpack_unpack_return r = msgpack_unpack(d->mp.b.data, d->mp.b.len, &off, &d->zone, &d->root);
    if (r == MSGPACK_UNPACK_NOMEM_ERROR)
        return -ENOMEM;
    /* our own packer wrote these bytes: anything else is a bug, reported as no memory */
    return r == MSGPACK_UNPACK_SUCCESS ? 0 : -ENOMEM;
}

int llm_jdoc_parse(llm_jdoc *d, const char *text, size_t len, unsigned max_depth, char *err,
                   size_t errlen)
{
    msgpack_packer pk;
    msgpack_packer_init(&pk, &d->mp, ubuf_sink_write);
    char jerr[128] = "";
    if (max_depth > JSON_MAX_DEPTH)
        max_depth = JSON_MAX_DEPTH;
    int rc = json_to_msgpack(text, len, max_depth, &pk, jerr, sizeof(jerr));
    if (rc == -ENOMEM || d->mp.failed)
        return -ENOMEM;
    if (rc != 0) {
        if (err)
            snprintf(err, errlen, "%s", jerr[0] ? jerr : "not JSON");
        return LLM_SCHEMA_E_SYNTAX;
    }
    return jdoc_unpack(d);
}

int llm_jdoc_from_object(llm_jdoc *d, const msgpack_object *o)
{
    msgpack_packer pk;
    msgpack_packer_init(&pk, &d->mp, ubuf_sink_write);
    if (msgpack_pack_object(&pk, *o) != 0 || d->mp.failed)
        return -ENOMEM;
    return jdoc_unpack(d);
}

int llm_json_text(const msgpack_object *o, char **out, size_t *len)
{
    json_buf b = {0};
    int rc = json_from_msgpack(o, 0, JSON_MAX_DEPTH, &b);
    if (rc == 0 && !b.data) /* every value prints as something; never expected */
        rc = -ENOMEM;
    if (rc != 0) {
        json_buf_fini(&b);
        return rc;
    }
    *out = b.data;
    *len = b.len;
    return 0;
}

/* ---- checking a schema ------------------------------------------------------------------- */

static const char *const TYPES[] = {"object",  "array",   "string", "number",
                                    "integer", "boolean", "null"};

static bool is_type_name(const msgpack_object *o)
{
    for (size_t i = 0; i < sizeof(TYPES) / sizeof(TYPES[0]); i++)
        if (rpc_str_eq(o, TYPES[i]))
            return true;
    return false;
}

static bool is_number(const msgpack_object *o)
{
    return o->type == MSGPACK_OBJECT_POSITIVE_INTEGER ||
           o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER || o->type == MSGPACK_OBJECT_FLOAT32 ||
           o->type == MSGPACK_OBJECT_FLOAT64;
}

static bool is_count(const msgpack_object *o)
{
    if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER)
        return true;
    /* 2.0 is an integer in JSON Schema */
    return (o->type == MSGPACK_OBJECT_FLOAT64 || o->type == MSGPACK_OBJECT_FLOAT32) &&
           o->via.f64 >= 0 && o->via.f64 <= 9007199254740992.0 && floor(o->via.f64) == o->via.f64;
}

static bool key_is(const msgpack_object_kv *kv, const char *name)
{
    return rpc_str_eq(&kv->key, name);
}

/* Appends to the path (a bounded string); returns the old length to restore. */
static size_t path_push(char *path, const char *fmt, ...)
{
    size_t old = strlen(path);
    if (old >= PATH_MAX_LEN - 4) {
        if (strcmp(path + old - 3, "...") != 0)
            snprintf(path + old, 4, "...");
        return old;
    }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(path + old, PATH_MAX_LEN - old, fmt, ap);
    va_end(ap);
    return old;
}

static void path_pop(char *path, size_t old)
{
    path[old] = '\0';
}

/* Appends ".name" (or "[\"na me\"]" style is not needed: names are shown truncated). */
static size_t path_push_key(char *path, const char *name, size_t len)
{
    if (len > 40)
        return path_push(path, ".%.37s...", name);
    return path_push(path, ".%.*s", (int)len, name);
}

static int unsupported(char *err, size_t errlen, const char *path, const char *fmt, ...)
{
    char what[160];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof(what), fmt, ap);
    va_end(ap);
    if (err)
        snprintf(err, errlen, "schema %s: %s", path, what);
    return LLM_SCHEMA_E_UNSUPPORTED;
}

static int check_schema(const msgpack_object *s, char *path, unsigned depth, char *err,
                        size_t errlen);

static int check_schema_map(const msgpack_object *m, char *path, unsigned depth, char *err,
                            size_t errlen)
{
    if (m->type != MSGPACK_OBJECT_MAP)
        return unsupported(err, errlen, path, "expected an object of schemas");
    for (uint32_t i = 0; i < m->via.map.size; i++) {
        const msgpack_object_kv *kv = &m->via.map.ptr[i];
        if (kv->key.type != MSGPACK_OBJECT_STR)
            return unsupported(err, errlen, path, "a property name is not a string");
        size_t old = path_push_key(path, kv->key.via.str.ptr, kv->key.via.str.size);
        int rc = check_schema(&kv->val, path, depth + 1, err, errlen);
        path_pop(path, old);
        if (rc)
            return rc;
    }
    return 0;
}

static int check_schema(const msgpack_object *s, char *path, unsigned depth, char *err,
                        size_t errlen)
{
    if (depth > SCHEMA_MAX_DEPTH)
        return unsupported(err, errlen, path, "nested deeper than %d", SCHEMA_MAX_DEPTH);
    if (s->type == MSGPACK_OBJECT_BOOLEAN)
        return 0;
    if (s->type != MSGPACK_OBJECT_MAP)
        return unsupported(err, errlen, path, "a schema must be an object or a boolean");
    for (uint32_t i = 0; i < s->via.map.size; i++) {
        const msgpack_object_kv *kv = &s->via.map.ptr[i];
        const msgpack_object *v = &kv->val;
        int rc = 0;
        if (kv->key.type != MSGPACK_OBJECT_STR)
            return unsupported(err, errlen, path, "a keyword is not a string");
        if (key_is(kv, "type")) {
            if (v->type == MSGPACK_OBJECT_ARRAY && v->via.array.size > 0) {
                for (uint32_t j = 0; j < v->via.array.size; j++)
                    if (!is_type_name(&v->via.array.ptr[j]))
                        return unsupported(err, errlen, path, "type[%u] is not a type name", j);
            } else if (!is_type_name(v)) {
                return unsupported(err, errlen, path, "type is not a type name or a list of them");
            }
        } else if (key_is(kv, "properties")) {
            size_t old = path_push(path, ".properties");
            rc = check_schema_map(v, path, depth, err, errlen);
            path_pop(path, old);
        } else if (key_is(kv, "required")) {
            if (v->type != MSGPACK_OBJECT_ARRAY)
                return unsupported(err, errlen, path, "required is not a list");
            for (uint32_t j = 0; j < v->via.array.size; j++)
                if (v->via.array.ptr[j].type != MSGPACK_OBJECT_STR)
                    return unsupported(err, errlen, path, "required[%u] is not a string", j);
        } else if (key_is(kv, "additionalProperties") || key_is(kv, "items")) {
            if (key_is(kv, "items") && v->type == MSGPACK_OBJECT_ARRAY)
                return unsupported(err, errlen, path, "items as a list (tuples) is not supported");
            size_t old = path_push(path, key_is(kv, "items") ? ".items" : ".additionalProperties");
            rc = check_schema(v, path, depth + 1, err, errlen);
            path_pop(path, old);
        } else if (key_is(kv, "anyOf")) {
            if (v->type != MSGPACK_OBJECT_ARRAY || v->via.array.size == 0)
                return unsupported(err, errlen, path, "anyOf is not a non-empty list");
            for (uint32_t j = 0; j < v->via.array.size && !rc; j++) {
                size_t old = path_push(path, ".anyOf[%u]", j);
                rc = check_schema(&v->via.array.ptr[j], path, depth + 1, err, errlen);
                path_pop(path, old);
            }
        } else if (key_is(kv, "enum")) {
            if (v->type != MSGPACK_OBJECT_ARRAY || v->via.array.size == 0)
                return unsupported(err, errlen, path, "enum is not a non-empty list");
        } else if (key_is(kv, "const") || key_is(kv, "default") || key_is(kv, "examples")) {
            /* any value */
        } else if (key_is(kv, "minItems") || key_is(kv, "maxItems") || key_is(kv, "minLength") ||
                   key_is(kv, "maxLength")) {
            if (!is_count(v))
                return unsupported(err, errlen, path, "%.*s is not a non-negative integer",
                                   (int)kv->key.via.str.size, kv->key.via.str.ptr);
        } else if (key_is(kv, "minimum") || key_is(kv, "maximum") ||
                   key_is(kv, "exclusiveMinimum") || key_is(kv, "exclusiveMaximum")) {
            if (!is_number(v))
                return unsupported(err, errlen, path, "%.*s is not a number",
                                   (int)kv->key.via.str.size, kv->key.via.str.ptr);
        } else if (key_is(kv, "uniqueItems") || key_is(kv, "deprecated") ||
                   key_is(kv, "readOnly") || key_is(kv, "writeOnly")) {
            if (v->type != MSGPACK_OBJECT_BOOLEAN)
                return unsupported(err, errlen, path, "%.*s is not a boolean",
                                   (int)kv->key.via.str.size, kv->key.via.str.ptr);
        } else if (key_is(kv, "title") || key_is(kv, "description") || key_is(kv, "$schema") ||
                   key_is(kv, "$id") || key_is(kv, "$comment")) {
            if (v->type != MSGPACK_OBJECT_STR)
                return unsupported(err, errlen, path, "%.*s is not a string",
                                   (int)kv->key.via.str.size, kv->key.via.str.ptr);
        } else {
            return unsupported(err, errlen, path, "keyword '%.*s' is not supported",
                               kv->key.via.str.size > 40 ? 40 : (int)kv->key.via.str.size,
                               kv->key.via.str.ptr);
        }
        if (rc)
            return rc;
    }
    return 0;
}

int llm_schema_create(const char *json, size_t len, llm_schema **out, char *err, size_t errlen)
{
    llm_schema *s = calloc(1, sizeof(*s));
    if (!s)
        return -ENOMEM;
    char jerr[160];
    int rc = llm_jdoc_parse(&s->doc, json, len, JSON_MAX_DEPTH, jerr, sizeof(jerr));
    if (rc == LLM_SCHEMA_E_SYNTAX && err)
        snprintf(err, errlen, "the schema is not JSON: %s", jerr);
    if (rc)
        goto fail;
    char path[PATH_MAX_LEN + 8] = "$";
    rc = check_schema(&s->doc.root, path, 0, err, errlen);
    if (rc)
        goto fail;
    rc = llm_json_text(&s->doc.root, &s->json, &s->json_len);
    if (rc) {
        rc = -ENOMEM;
        goto fail;
    }
    *out = s;
    return 0;
fail:
    llm_schema_destroy(s);
    return rc;
}

void llm_schema_destroy(llm_schema *s)
{
    if (!s)
        return;
    llm_jdoc_fini(&s->doc);
    free(s->json);
    free(s);
}

const char *llm_schema_json(const llm_schema *s, size_t *len)
{
    if (len)
        *len = s->json_len;
    return s->json;
}

int llm_schema_root_is_object(const llm_schema *s)
{
    return rpc_str_eq(rpc_map_get(&s->doc.root, "type"), "object");
}

/* ---- validating -------------------------------------------------------------------------- */

static const char *type_of(const msgpack_object *v)
{
    switch (v->type) {
    case MSGPACK_OBJECT_NIL:
        return "null";
    case MSGPACK_OBJECT_BOOLEAN:
        return "boolean";
    case MSGPACK_OBJECT_POSITIVE_INTEGER:
    case MSGPACK_OBJECT_NEGATIVE_INTEGER:
        return "integer";
    case MSGPACK_OBJECT_FLOAT32:
    case MSGPACK_OBJECT_FLOAT64:
        return "number";
    case MSGPACK_OBJECT_STR:
        return "string";
    case MSGPACK_OBJECT_ARRAY:
        return "array";
    case MSGPACK_OBJECT_MAP:
        return "object";
    default:
        return "binary";
    }
}

/* A number as long double: exact for every int64, uint64 and double on x86-64. */
static long double num(const msgpack_object *v)
{
    switch (v->type) {
    case MSGPACK_OBJECT_POSITIVE_INTEGER:
        return (long double)v->via.u64;
    case MSGPACK_OBJECT_NEGATIVE_INTEGER:
        return (long double)v->via.i64;
    default:
        return (long double)v->via.f64;
    }
}

static bool has_type(const msgpack_object *v, const msgpack_object *name)
{
    if (rpc_str_eq(name, "number"))
        return is_number(v);
    if (rpc_str_eq(name, "integer"))
        return v->type == MSGPACK_OBJECT_POSITIVE_INTEGER ||
               v->type == MSGPACK_OBJECT_NEGATIVE_INTEGER ||
               ((v->type == MSGPACK_OBJECT_FLOAT64 || v->type == MSGPACK_OBJECT_FLOAT32) &&
                isfinite(v->via.f64) && floor(v->via.f64) == v->via.f64);
    return rpc_str_eq(name, type_of(v));
}

/* A validation's state: the path of the value checked, where the message goes (err NULL:
 * nowhere, inside anyOf), and a budget of comparison steps. The answers checked come from a
 * provider and run on event loops: duplicate keys, uniqueItems and equality are quadratic,
 * so a 4 MiB answer of one flat object could otherwise hold a loop for minutes. */
typedef struct vctx {
    char path[PATH_MAX_LEN + 8];
    char *err;
    size_t errlen;
    uint64_t budget;
} vctx;

#define VALIDATE_BUDGET (4u << 20) /* steps; a few milliseconds; models' answers need far less */

/* Takes one step of the budget; false once it is spent. */
static bool spend(vctx *x)
{
    if (x->budget == 0)
        return false;
    x->budget--;
    return true;
}

/* JSON equality: numbers by value (1 equals 1.0), objects whatever the key order. False
 * also once the budget is spent (the caller then reports that). */
static bool equal(const msgpack_object *a, const msgpack_object *b, vctx *x)
{
    if (!spend(x))
        return false;
    if (is_number(a) && is_number(b))
        return num(a) == num(b);
    if (a->type != b->type)
        return false;
    switch (a->type) {
    case MSGPACK_OBJECT_NIL:
        return true;
    case MSGPACK_OBJECT_BOOLEAN:
        return a->via.boolean == b->via.boolean;
    case MSGPACK_OBJECT_STR:
        return a->via.str.size == b->via.str.size &&
               memcmp(a->via.str.ptr, b->via.str.ptr, a->via.str.size) == 0;
    case MSGPACK_OBJECT_ARRAY:
        if (a->via.array.size != b->via.array.size)
            return false;
        for (uint32_t i = 0; i < a->via.array.size; i++)
            if (!equal(&a->via.array.ptr[i], &b->via.array.ptr[i], x))
                return false;
        return true;
    case MSGPACK_OBJECT_MAP:
        if (a->via.map.size != b->via.map.size)
            return false;
        for (uint32_t i = 0; i < a->via.map.size; i++) {
            const msgpack_object_kv *kv = &a->via.map.ptr[i];
            bool found = false;
            for (uint32_t j = 0; j < b->via.map.size && !found && x->budget; j++)
                if (equal(&kv->key, &b->via.map.ptr[j].key, x))
                    found = equal(&kv->val, &b->via.map.ptr[j].val, x);
            if (!found)
                return false;
        }
        return true;
    default:
        return false;
    }
}

static size_t utf8_chars(const char *p, size_t n)
{
    size_t c = 0;
    for (size_t i = 0; i < n; i++)
        if (((unsigned char)p[i] & 0xC0) != 0x80)
            c++;
    return c;
}

static int invalid(vctx *x, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static int invalid(vctx *x, const char *fmt, ...)
{
    if (x->err) {
        char what[160];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(what, sizeof(what), fmt, ap);
        va_end(ap);
        snprintf(x->err, x->errlen, "%s: %s", x->path, what);
    }
    return LLM_SCHEMA_E_INVALID;
}

static int too_large(vctx *x)
{
    return invalid(x, "the answer is too large to check");
}

static int validate(const msgpack_object *s, const msgpack_object *v, vctx *x);

static int validate_object(const msgpack_object *s, const msgpack_object *v, vctx *x)
{
    const msgpack_object *props = rpc_map_get(s, "properties");
    const msgpack_object *extra = rpc_map_get(s, "additionalProperties");
    const msgpack_object *req = rpc_map_get(s, "required");
    for (uint32_t i = 0; i < v->via.map.size; i++) {
        const msgpack_object_kv *kv = &v->via.map.ptr[i];
        if (kv->key.type != MSGPACK_OBJECT_STR)
            return invalid(x, "a key is not a string");
        for (uint32_t j = 0; j < i; j++) {
            if (!spend(x))
                return too_large(x);
            if (equal(&kv->key, &v->via.map.ptr[j].key, x)) {
                size_t old = path_push_key(x->path, kv->key.via.str.ptr, kv->key.via.str.size);
                int rc = invalid(x, "the key appears twice");
                path_pop(x->path, old);
                return rc;
            }
        }
    }
    if (req)
        for (uint32_t i = 0; i < req->via.array.size; i++) {
            const msgpack_object *name = &req->via.array.ptr[i];
            bool found = false;
            for (uint32_t j = 0; j < v->via.map.size && !found; j++)
                found = equal(name, &v->via.map.ptr[j].key, x);
            if (!x->budget)
                return too_large(x);
            if (!found) {
                size_t old = path_push_key(x->path, name->via.str.ptr, name->via.str.size);
                int rc = invalid(x, "required but missing");
                path_pop(x->path, old);
                return rc;
            }
        }
    for (uint32_t i = 0; i < v->via.map.size; i++) {
        const msgpack_object_kv *kv = &v->via.map.ptr[i];
        const msgpack_object *sub = NULL;
        if (props)
            for (uint32_t j = 0; j < props->via.map.size && !sub; j++)
                if (equal(&kv->key, &props->via.map.ptr[j].key, x))
                    sub = &props->via.map.ptr[j].val;
        if (!x->budget)
            return too_large(x);
        if (!sub)
            sub = extra;
        if (!sub)
            continue;
        size_t old = path_push_key(x->path, kv->key.via.str.ptr, kv->key.via.str.size);
        int rc;
        if (sub == extra && extra->type == MSGPACK_OBJECT_BOOLEAN && !extra->via.boolean)
            rc = invalid(x, "not an allowed property");
        else
            rc = validate(sub, &kv->val, x);
        path_pop(x->path, old);
        if (rc)
            return rc;
    }
    return 0;
}

static int validate_array(const msgpack_object *s, const msgpack_object *v, vctx *x)
{
    const msgpack_object *k;
    uint32_t n = v->via.array.size;
    if ((k = rpc_map_get(s, "minItems")) && (long double)n < num(k))
        return invalid(x, "%u items, fewer than minItems %.0Lf", n, num(k));
    if ((k = rpc_map_get(s, "maxItems")) && (long double)n > num(k))
        return invalid(x, "%u items, more than maxItems %.0Lf", n, num(k));
    const msgpack_object *items = rpc_map_get(s, "items");
    if (items)
        for (uint32_t i = 0; i < n; i++) {
            size_t old = path_push(x->path, "[%u]", i);
            int rc = validate(items, &v->via.array.ptr[i], x);
            path_pop(x->path, old);
            if (rc)
                return rc;
        }
    if ((k = rpc_map_get(s, "uniqueItems")) && k->via.boolean)
        for (uint32_t i = 1; i < n; i++)
            for (uint32_t j = 0; j < i; j++) {
                if (!spend(x))
                    return too_large(x);
                if (equal(&v->via.array.ptr[i], &v->via.array.ptr[j], x))
                    return invalid(x, "items %u and %u are equal (uniqueItems)", j, i);
            }
    return 0;
}

static int validate(const msgpack_object *s, const msgpack_object *v, vctx *x)
{
    if (!spend(x))
        return too_large(x);
    if (s->type == MSGPACK_OBJECT_BOOLEAN)
        return s->via.boolean ? 0 : invalid(x, "no value is allowed here");
    const msgpack_object *k = rpc_map_get(s, "type");
    if (k) {
        bool ok = false;
        if (k->type == MSGPACK_OBJECT_ARRAY) {
            for (uint32_t i = 0; i < k->via.array.size && !ok; i++)
                ok = has_type(v, &k->via.array.ptr[i]);
        } else {
            ok = has_type(v, k);
        }
        if (!ok) {
            if (k->type == MSGPACK_OBJECT_STR)
                return invalid(x, "expected %.*s, got %s", (int)k->via.str.size, k->via.str.ptr,
                               type_of(v));
            return invalid(x, "%s is none of the types allowed", type_of(v));
        }
    }
    if ((k = rpc_map_get(s, "const")) && !equal(k, v, x))
        return x->budget ? invalid(x, "not the constant required") : too_large(x);
    if ((k = rpc_map_get(s, "enum"))) {
        bool ok = false;
        for (uint32_t i = 0; i < k->via.array.size && !ok; i++)
            ok = equal(&k->via.array.ptr[i], v, x);
        if (!ok)
            return x->budget ? invalid(x, "not one of the enum's %u values", k->via.array.size)
                             : too_large(x);
    }
    if ((k = rpc_map_get(s, "anyOf"))) {
        bool ok = false;
        char *err = x->err;
        x->err = NULL; /* the alternatives' own messages are not the answer's */
        for (uint32_t i = 0; i < k->via.array.size && !ok && x->budget; i++)
            ok = validate(&k->via.array.ptr[i], v, x) == 0;
        x->err = err;
        if (!ok)
            return x->budget ? invalid(x, "matches none of the anyOf schemas") : too_large(x);
    }
    if (is_number(v)) {
        long double n = num(v);
        if ((k = rpc_map_get(s, "minimum")) && n < num(k))
            return invalid(x, "less than minimum %Lg", num(k));
        if ((k = rpc_map_get(s, "maximum")) && n > num(k))
            return invalid(x, "more than maximum %Lg", num(k));
        if ((k = rpc_map_get(s, "exclusiveMinimum")) && n <= num(k))
            return invalid(x, "not more than exclusiveMinimum %Lg", num(k));
        if ((k = rpc_map_get(s, "exclusiveMaximum")) && n >= num(k))
            return invalid(x, "not less than exclusiveMaximum %Lg", num(k));
        return 0;
    }
    switch (v->type) {
    case MSGPACK_OBJECT_STR: {
        size_t n = utf8_chars(v->via.str.ptr, v->via.str.size);
        if ((k = rpc_map_get(s, "minLength")) && (long double)n < num(k))
            return invalid(x, "%zu characters, fewer than minLength %.0Lf", n, num(k));
        if ((k = rpc_map_get(s, "maxLength")) && (long double)n > num(k))
            return invalid(x, "%zu characters, more than maxLength %.0Lf", n, num(k));
        return 0;
    }
    case MSGPACK_OBJECT_MAP:
        return validate_object(s, v, x);
    case MSGPACK_OBJECT_ARRAY:
        return validate_array(s, v, x);
    default:
        return 0;
    }
}

int llm_schema_validate(const llm_schema *s, const msgpack_object *value, char *err, size_t errlen)
{
    vctx x = {.path = "$", .err = err, .errlen = errlen, .budget = VALIDATE_BUDGET};
    return validate(&s->doc.root, value, &x);
}

int llm_schema_validate_json(const char *schema_json, size_t schema_len, const char *value_json,
                             size_t value_len, char *err, size_t errlen)
{
    llm_schema *s = NULL;
    llm_jdoc v = {0};
    char jerr[160];
    int rc = llm_schema_create(schema_json, schema_len, &s, err, errlen);
    if (rc)
        return rc;
    rc = llm_jdoc_parse(&v, value_json, value_len, JSON_MAX_DEPTH, jerr, sizeof(jerr));
    if (rc == LLM_SCHEMA_E_SYNTAX && err)
        snprintf(err, errlen, "the value is not JSON: %s", jerr);
    if (rc == 0)
        rc = llm_schema_validate(s, &v.root, err, errlen);
    llm_jdoc_fini(&v);
    llm_schema_destroy(s);
    return rc;
}
