/* server/domain/memfilter.c: search filters, in memory and as SQL parameters (see memfilter.h). */
#include "memfilter.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hash.h"
#include "json.h"
#include "memrow.h"
#include "sql.h"

#define TAG_MAX_BYTES 128
#define TAG_MAX_ITEMS 64

uint64_t mf_tag_hash(const char *s, size_t n)
{
    /* FNV-1a, then a splitmix64 finalizer so nearby strings spread over all 64 bits */
    return hash_mix64(hash_fnv1a(s, n));
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Sorts and deduplicates n hashes in place; returns the new count. */
static uint32_t sort_unique(uint64_t *v, uint32_t n)
{
    if (n < 2)
        return n;
    qsort(v, n, sizeof(*v), cmp_u64);
    uint32_t w = 1;
    for (uint32_t i = 1; i < n; i++)
        if (v[i] != v[w - 1])
            v[w++] = v[i];
    return w;
}

static uint64_t prefixed_hash(char prefix, const char *s, size_t n)
{
    char buf[2 + TAG_MAX_BYTES + 8];
    if (n > TAG_MAX_BYTES + 6)
        n = TAG_MAX_BYTES + 6;
    buf[0] = prefix;
    buf[1] = ':';
    memcpy(buf + 2, s, n);
    return mf_tag_hash(buf, n + 2);
}

/* Hashes the tag-bearing elements of a tokens, chains or protocols list into v (room for
 * every element); returns how many. */
static uint32_t list_tags(char prefix, const msgpack_object *arr, uint64_t *v)
{
    uint32_t k = 0;
    for (uint32_t j = 0; j < arr->via.array.size; j++) {
        const msgpack_object *e = &arr->via.array.ptr[j];
        if (e->type == MSGPACK_OBJECT_STR) {
            v[k++] = prefixed_hash(prefix, e->via.str.ptr, e->via.str.size);
        } else if (e->type == MSGPACK_OBJECT_POSITIVE_INTEGER) {
            char num[24];
            int len = snprintf(num, sizeof(num), "%llu", (unsigned long long)e->via.u64);
            v[k++] = prefixed_hash(prefix, num, (size_t)len);
        }
    }
    return k;
}

/* Sorts and deduplicates the k hashes of v into *out and *n (frees v when none remain). */
static void tags_finish(uint64_t *v, uint32_t k, uint64_t **out, uint32_t *n)
{
    *n = sort_unique(v, k);
    if (*n == 0) {
        free(v);
        v = NULL;
    }
    *out = v;
}

int mf_tags_from_metadata(const msgpack_object *md, uint64_t **out, uint32_t *n)
{
    *out = NULL;
    *n = 0;
    if (!md || md->type != MSGPACK_OBJECT_MAP)
        return 0;
    uint32_t count = 0;
    for (uint32_t i = 0; i < md->via.map.size; i++) {
        const msgpack_object_kv *kv = &md->via.map.ptr[i];
        if (kv->val.type == MSGPACK_OBJECT_ARRAY)
            count += kv->val.via.array.size;
        else
            count++;
    }
    if (count == 0)
        return 0;
    uint64_t *v = malloc(count * sizeof(*v));
    if (!v)
        return -ENOMEM;
    uint32_t k = 0;
    for (uint32_t i = 0; i < md->via.map.size; i++) {
        const msgpack_object_kv *kv = &md->via.map.ptr[i];
        char prefix = rpc_str_eq(&kv->key, "tokens")      ? 't'
                      : rpc_str_eq(&kv->key, "chains")    ? 'c'
                      : rpc_str_eq(&kv->key, "protocols") ? 'p'
                                                          : 0;
        if (prefix && kv->val.type == MSGPACK_OBJECT_ARRAY)
            k += list_tags(prefix, &kv->val, v + k);
        else if (rpc_str_eq(&kv->key, "strategy_id") && kv->val.type == MSGPACK_OBJECT_STR)
            v[k++] = prefixed_hash('s', kv->val.via.str.ptr, kv->val.via.str.size);
    }
    tags_finish(v, k, out, n);
    return 0;
}

int mf_tags_from_json(const char *s, size_t len, uint64_t **out, uint32_t *n)
{
    *out = NULL;
    *n = 0;
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    int rc = json_to_msgpack(s, len, 64, &pk, NULL, 0);
    if (rc == 0 && (msgpack_unpack_next(&u, sb.data, sb.size, NULL) != MSGPACK_UNPACK_SUCCESS ||
                    u.data.type != MSGPACK_OBJECT_ARRAY || u.data.via.array.size != 4))
        rc = -EINVAL;
    if (rc != 0) {
        rc = rc == -ENOMEM ? -ENOMEM : -EINVAL;
        goto done;
    }
    const msgpack_object *f = u.data.via.array.ptr;
    uint32_t count = 1;
    for (int i = 0; i < 3; i++)
        if (f[i].type == MSGPACK_OBJECT_ARRAY)
            count += f[i].via.array.size;
    uint64_t *v = malloc(count * sizeof(*v));
    if (!v) {
        rc = -ENOMEM;
        goto done;
    }
    static const char prefixes[3] = {'t', 'c', 'p'};
    uint32_t k = 0;
    for (int i = 0; i < 3; i++)
        if (f[i].type == MSGPACK_OBJECT_ARRAY)
            k += list_tags(prefixes[i], &f[i], v + k);
    if (f[3].type == MSGPACK_OBJECT_STR)
        v[k++] = prefixed_hash('s', f[3].via.str.ptr, f[3].via.str.size);
    tags_finish(v, k, out, n);
done:
    msgpack_unpacked_destroy(&u);
    msgpack_sbuffer_destroy(&sb);
    return rc;
}

/* A tag string: 1..TAG_MAX_BYTES bytes, no control characters (U+001F joins tags). */
static int check_tag(const msgpack_object *o, const char *what, char *err, size_t errlen)
{
    if (rpc_check_value(o, RPC_T_STR, RPC_P_RANGE, 1, TAG_MAX_BYTES, what, err, errlen) != 0)
        return -EINVAL;
    for (uint32_t i = 0; i < o->via.str.size; i++) {
        if ((unsigned char)o->via.str.ptr[i] < 0x20 || o->via.str.ptr[i] == 0x7f) {
            snprintf(err, errlen, "'%s' must not contain control characters", what);
            return -EINVAL;
        }
    }
    return 0;
}

/* Whether every map and list in o (attrs) has at most max entries; names the first that has
 * more in err. */
static int check_entries(const msgpack_object *o, const char *what, size_t max, unsigned depth,
                         char *err, size_t errlen)
{
    uint32_t n = o->type == MSGPACK_OBJECT_MAP     ? o->via.map.size
                 : o->type == MSGPACK_OBJECT_ARRAY ? o->via.array.size
                                                   : 0;
    if (n > max) {
        snprintf(err, errlen,
                 "'%s' holds a %s of %u entries; at most %zu are allowed in any one map or list "
                 "(max_metadata_entries)",
                 what, o->type == MSGPACK_OBJECT_MAP ? "map" : "list", n, max);
        return -EINVAL;
    }
    if (depth > 64)
        return 0; /* the binder refused deeper values */
    for (uint32_t i = 0; i < n; i++) {
        const msgpack_object *v =
            o->type == MSGPACK_OBJECT_MAP ? &o->via.map.ptr[i].val : &o->via.array.ptr[i];
        if (check_entries(v, what, max, depth + 1, err, errlen) != 0)
            return -EINVAL;
    }
    return 0;
}

int mf_check_metadata(const msgpack_object *md, const char *what, size_t max_entries, char *err,
                      size_t errlen)
{
    char name[160];
    if (md->type != MSGPACK_OBJECT_MAP) {
        snprintf(err, errlen, "'%s' must be a map", what);
        return -EINVAL;
    }
    for (uint32_t i = 0; i < md->via.map.size; i++) {
        const msgpack_object_kv *kv = &md->via.map.ptr[i];
        const msgpack_object *v = &kv->val;
        if (kv->key.type != MSGPACK_OBJECT_STR) {
            snprintf(err, errlen, "'%s' keys must be strings", what);
            return -EINVAL;
        }
        snprintf(name, sizeof(name), "%s.%.*s", what, (int)kv->key.via.str.size,
                 kv->key.via.str.ptr);
        bool list_str = rpc_str_eq(&kv->key, "tokens") || rpc_str_eq(&kv->key, "protocols");
        if (list_str || rpc_str_eq(&kv->key, "chains")) {
            if (rpc_check_value(v, list_str ? RPC_T_STR_ARRAY : RPC_T_UINT_ARRAY, RPC_P_RANGE, 0,
                                TAG_MAX_ITEMS, name, err, errlen) != 0)
                return -EINVAL;
            for (uint32_t j = 0; list_str && j < v->via.array.size; j++) {
                char item[200];
                snprintf(item, sizeof(item), "%s[%u]", name, j);
                if (check_tag(&v->via.array.ptr[j], item, err, errlen) != 0)
                    return -EINVAL;
            }
        } else if (rpc_str_eq(&kv->key, "strategy_id")) {
            if (check_tag(v, name, err, errlen) != 0)
                return -EINVAL;
        } else if (rpc_str_eq(&kv->key, "attrs")) {
            if (rpc_check_value(v, RPC_T_MAP, 0, 0, 0, name, err, errlen) != 0 ||
                check_entries(v, name, max_entries, 0, err, errlen) != 0)
                return -EINVAL;
        } else {
            snprintf(err, errlen,
                     "unknown field '%s' (metadata holds tokens, chains, protocols, strategy_id "
                     "and attrs)",
                     name);
            return -EINVAL;
        }
    }
    return 0;
}

/* ---- parsing ------------------------------------------------------------------------- */

/* Appends s as one element of a PostgreSQL array literal (always quoted). */
static int pg_array_elem(ubuf *b, const char *s, size_t n)
{
    if (b->len > 1 && ubuf_putc(b, ',') < 0)
        return -ENOMEM;
    if (ubuf_putc(b, '"') < 0)
        return -ENOMEM;
    for (size_t i = 0; i < n; i++) {
        if ((s[i] == '"' || s[i] == '\\') && ubuf_putc(b, '\\') < 0)
            return -ENOMEM;
        if (ubuf_putc(b, s[i]) < 0)
            return -ENOMEM;
    }
    return ubuf_putc(b, '"');
}

/* Copies b's text into the arena and frees b; NULL when out of memory. */
static char *arena_take(arena *a, ubuf *b)
{
    char *s = arena_strndup(a, b->data ? (const char *)b->data : "", b->len);
    ubuf_fini(b);
    return s;
}

/* Builds the jsonb[] literal of one containment document {"<field>": [elem]} per element
 * of arr, and the element hashes into *hashes. */
static int tag_list(arena *a, const msgpack_object *arr, const char *field, char prefix, char **sql,
                    uint64_t **hashes, uint32_t *n)
{
    uint32_t count = arr->via.array.size;
    uint64_t *h = arena_alloc(a, count * sizeof(*h));
    ubuf lit = {0};
    if (!h || ubuf_putc(&lit, '{') < 0)
        goto oom;
    for (uint32_t i = 0; i < count; i++) {
        const msgpack_object *e = &arr->via.array.ptr[i];
        json_buf doc = {0};
        char head[64];
        int hl = snprintf(head, sizeof(head), "{\"%s\":[", field);
        if (json_buf_append(&doc, head, (size_t)hl) < 0 || json_from_msgpack(e, 0, 4, &doc) != 0 ||
            json_buf_append(&doc, "]}", 2) < 0 || pg_array_elem(&lit, doc.data, doc.len) < 0) {
            json_buf_fini(&doc);
            goto oom;
        }
        json_buf_fini(&doc);
        if (e->type == MSGPACK_OBJECT_STR) {
            h[i] = prefixed_hash(prefix, e->via.str.ptr, e->via.str.size);
        } else {
            char num[24];
            int len = snprintf(num, sizeof(num), "%llu", (unsigned long long)e->via.u64);
            h[i] = prefixed_hash(prefix, num, (size_t)len);
        }
    }
    if (ubuf_putc(&lit, '}') < 0)
        goto oom;
    *n = sort_unique(h, count);
    *hashes = h;
    *sql = arena_take(a, &lit);
    return *sql ? 0 : -ENOMEM;
oom:
    ubuf_fini(&lit);
    return -ENOMEM;
}

/* A text[] literal of the strings in arr. */
static char *str_array_literal(arena *a, const msgpack_object *arr)
{
    ubuf b = {0};
    if (ubuf_putc(&b, '{') < 0)
        goto oom;
    for (uint32_t i = 0; i < arr->via.array.size; i++) {
        const msgpack_object *e = &arr->via.array.ptr[i];
        if (pg_array_elem(&b, e->via.str.ptr, e->via.str.size) < 0)
            goto oom;
    }
    if (ubuf_putc(&b, '}') < 0)
        goto oom;
    return arena_take(a, &b);
oom:
    ubuf_fini(&b);
    return NULL;
}

int mf_parse_args(arena *a, const score_params *sp, int64_t now_ms,
                  const msgpack_object *const *args, const char *what, mem_filter *f, char *err,
                  size_t errlen)
{
    memset(f, 0, sizeof(*f));
    f->type_mask = (1u << MEM_TYPE_COUNT) - 1;
    f->scope_mask = (1u << SCOPE_COUNT) - 1;
    f->created_after = INT64_MIN;
    f->created_before = INT64_MAX;
    f->now_ms = now_ms;
    f->sp = sp;
    const msgpack_object *o;
    if ((o = args[MF_TYPE_FILTER])) {
        f->type_mask = 0;
        for (uint32_t i = 0; i < o->via.array.size; i++) {
            const msgpack_object *e = &o->via.array.ptr[i];
            int t = memrow_type_parse(e->via.str.ptr, e->via.str.size);
            if (t < 0) {
                snprintf(err, errlen,
                         "parameter '%stype_filter' may hold only fact, preference, episode, "
                         "strategy_outcome and constraint",
                         what);
                return -EINVAL;
            }
            f->type_mask |= (uint8_t)(1u << t);
        }
        if (!(f->sql_types = str_array_literal(a, o)))
            goto oom;
    }
    if ((o = args[MF_SCOPES])) {
        f->scope_mask = 0;
        for (uint32_t i = 0; i < o->via.array.size; i++) {
            const msgpack_object *e = &o->via.array.ptr[i];
            int sc = memrow_scope_parse(e->via.str.ptr, e->via.str.size);
            if (sc < 0) {
                snprintf(err, errlen, "parameter '%sscopes' may hold only agent, clade and tenant",
                         what);
                return -EINVAL;
            }
            f->scope_mask |= (uint8_t)(1u << sc);
        }
        if (!(f->sql_scopes = str_array_literal(a, o)))
            goto oom;
    }
    if ((o = args[MF_MIN_IMPORTANCE])) {
        f->has_min_importance = true;
        f->min_importance = rpc_get_num(o, 0);
    }
    if ((o = args[MF_MIN_COMPOSITE])) {
        f->has_min_composite = true;
        f->min_composite = rpc_get_num(o, 0);
    }
    if ((o = args[MF_TOKENS]) &&
        tag_list(a, o, "tokens", 't', &f->sql_tokens, &f->tokens, &f->ntokens) < 0)
        goto oom;
    if ((o = args[MF_CHAINS]) &&
        tag_list(a, o, "chains", 'c', &f->sql_chains, &f->chains, &f->nchains) < 0)
        goto oom;
    if ((o = args[MF_PROTOCOLS]) &&
        tag_list(a, o, "protocols", 'p', &f->sql_protocols, &f->protocols, &f->nprotocols) < 0)
        goto oom;
    if ((o = args[MF_STRATEGY_ID])) {
        json_buf doc = {0};
        f->has_strategy = true;
        f->strategy = prefixed_hash('s', o->via.str.ptr, o->via.str.size);
        if (json_buf_append(&doc, "{\"strategy_id\":", 15) < 0 ||
            json_from_msgpack(o, 0, 2, &doc) != 0 || json_buf_append(&doc, "}", 1) < 0) {
            json_buf_fini(&doc);
            goto oom;
        }
        if (!(f->sql_strategy = arena_take(a, &doc)))
            goto oom;
    }
    if ((o = args[MF_ATTRS])) {
        json_buf doc = {0};
        int rc = json_buf_append(&doc, "{\"attrs\":", 9);
        if (rc == 0)
            rc = json_from_msgpack(o, 0, 16, &doc);
        if (rc == 0)
            rc = json_buf_append(&doc, "}", 1);
        if (rc != 0) {
            json_buf_fini(&doc);
            if (rc == -ENOMEM)
                goto oom;
            snprintf(err, errlen,
                     "parameter '%sattrs' must hold only JSON values (strings, numbers, booleans, "
                     "nil, arrays, maps with string keys), at most 16 levels deep",
                     what);
            return -EINVAL;
        }
        if (!(f->attrs_json = arena_take(a, &doc)))
            goto oom;
    }
    if ((o = args[MF_CREATED_AFTER]))
        f->created_after = rpc_get_int(o, INT64_MIN);
    if ((o = args[MF_CREATED_BEFORE]))
        f->created_before = rpc_get_int(o, INT64_MAX);
    if ((o = args[MF_AGENT_ID])) {
        f->has_agent = true;
        f->agent_id = rpc_get_uint(o, 0);
    }
    if ((o = args[MF_CLADE_ID])) {
        if (!f->has_agent) {
            snprintf(err, errlen,
                     "parameter '%sclade_id' names the clade of '%sagent_id', which is missing",
                     what, what);
            return -EINVAL;
        }
        f->has_clade = true;
        f->clade_id = rpc_get_uint(o, 0);
    }
    f->include_archived = rpc_get_bool(args[MF_INCLUDE_ARCHIVED], false);
    return 0;
oom:
    snprintf(err, errlen, "out of memory");
    return -ENOMEM;
}

/* ---- evaluation ----------------------------------------------------------------------- */

/* Tells whether the sorted sets a and b intersect. */
static bool intersects(const uint64_t *a, uint32_t na, const uint64_t *b, uint32_t nb)
{
    uint32_t i = 0, j = 0;
    while (i < na && j < nb) {
        if (a[i] == b[j])
            return true;
        if (a[i] < b[j])
            i++;
        else
            j++;
    }
    return false;
}

static bool contains(const uint64_t *a, uint32_t na, uint64_t x)
{
    uint32_t lo = 0, hi = na;
    while (lo < hi) {
        uint32_t mid = (lo + hi) / 2;
        if (a[mid] < x)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < na && a[lo] == x;
}

bool mf_keep(const mem_filter *f, uint64_t id, const mem_meta *m)
{
    if (!(f->type_mask & (1u << m->type)))
        return false;
    if (m->archived && !f->include_archived)
        return false;
    if (m->expires_ms <= f->now_ms)
        return false;
    if (f->has_agent) {
        bool ok = (m->scope == SCOPE_AGENT && m->agent_id == f->agent_id &&
                   (f->scope_mask & (1u << SCOPE_AGENT))) ||
                  (m->scope == SCOPE_CLADE && f->has_clade && m->clade_id == f->clade_id &&
                   (f->scope_mask & (1u << SCOPE_CLADE))) ||
                  (m->scope == SCOPE_TENANT && (f->scope_mask & (1u << SCOPE_TENANT)));
        if (!ok)
            return false;
    } else if (!(f->scope_mask & (1u << m->scope))) {
        return false;
    }
    if (m->created_ms <= f->created_after || m->created_ms >= f->created_before)
        return false;
    if (f->ntokens && !intersects(f->tokens, f->ntokens, m->tags, m->ntags))
        return false;
    if (f->nchains && !intersects(f->chains, f->nchains, m->tags, m->ntags))
        return false;
    if (f->nprotocols && !intersects(f->protocols, f->nprotocols, m->tags, m->ntags))
        return false;
    if (f->has_strategy && !contains(m->tags, m->ntags, f->strategy))
        return false;
    /* in float, as the index holds importance (and the SQL filter compares it) */
    if (f->has_min_importance && m->importance < (float)f->min_importance)
        return false;
    if (f->has_min_composite &&
        score_composite(f->sp, m->created_ms, mem_meta_access_count(m), m->cited, m->injected,
                        m->importance, f->now_ms) < f->min_composite)
        return false;
    if (f->attrs_json) {
        uint64_t v;
        if (!f->attr_ids || !idmap_get(f->attr_ids, id, &v))
            return false;
    }
    return true;
}

bool mf_lifecycle_only(const mem_filter *f)
{
    return f->type_mask == (1u << MEM_TYPE_COUNT) - 1 && !f->has_agent &&
           f->scope_mask == (1u << SCOPE_COUNT) - 1 && f->created_after == INT64_MIN &&
           f->created_before == INT64_MAX && !f->ntokens && !f->nchains && !f->nprotocols &&
           !f->has_strategy && !f->has_min_importance && !f->has_min_composite && !f->attrs_json;
}

int mf_sql_params(arena *a, const mem_filter *f, const char **vals)
{
    char *buf = arena_alloc(a, 7 * 32 + 192);
    if (!buf)
        return -ENOMEM;
    char *agent = buf, *clade = buf + 32, *after = buf + 64, *before = buf + 96, *minc = buf + 128,
         *asof = buf + 160, *weights = buf + 192, *mini = buf + 384;
    vals[0] = f->sql_types;
    vals[1] = f->include_archived ? "true" : "false";
    vals[2] = f->has_agent ? memrow_u64_sql(f->agent_id, agent) : NULL;
    vals[3] = f->has_clade ? memrow_u64_sql(f->clade_id, clade) : NULL;
    vals[4] = f->sql_scopes;
    vals[5] = NULL;
    vals[6] = NULL;
    if (f->created_after != INT64_MIN) {
        snprintf(after, 32, "%lld", (long long)f->created_after);
        vals[5] = after;
    }
    if (f->created_before != INT64_MAX) {
        snprintf(before, 32, "%lld", (long long)f->created_before);
        vals[6] = before;
    }
    vals[7] = f->sql_tokens;
    vals[8] = f->sql_chains;
    vals[9] = f->sql_protocols;
    vals[10] = f->sql_strategy;
    vals[11] = f->attrs_json;
    vals[12] = NULL;
    if (f->has_min_composite) {
        snprintf(minc, 32, "%.17g", f->min_composite);
        vals[12] = minc;
    }
    snprintf(asof, 32, "%lld", (long long)f->now_ms);
    vals[13] = asof;
    snprintf(weights, 192, "{%.17g,%.17g,%.17g,%.17g,%.17g,%.17g}", f->sp->w_recency,
             f->sp->w_access, f->sp->w_explicit, f->sp->recency_days, f->sp->access_saturation,
             f->sp->w_usefulness);
    vals[14] = weights;
    vals[15] = NULL;
    if (f->has_min_importance) {
        snprintf(mini, 32, "%.17g", f->min_importance);
        vals[15] = mini;
    }
    return 0;
}
