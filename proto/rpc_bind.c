/* proto/rpc_bind.c: parameter binding: argument maps against method schemas, and the typed
 * readers for values once checked. */
#include "rpc.h"
#include "rpc_internal.h"

#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

/* Longest client-supplied name quoted in an error message. */
#define QUOTE_MAX 64

/* Writes a printable, bounded rendering of client bytes s into out (outlen >= 4 * QUOTE_MAX + 8):
 * printable ASCII as is, everything else as \xNN, cut after QUOTE_MAX bytes with "...". */
static const char *quote(const char *s, size_t n, char *out, size_t outlen)
{
    static const char hex[] = "0123456789abcdef";
    size_t o = 0;

    for (size_t i = 0; i < n && i < QUOTE_MAX && o + 5 < outlen; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c < 0x7f && c != '\\' && c != '\'') {
            out[o++] = (char)c;
        } else {
            out[o++] = '\\';
            out[o++] = 'x';
            out[o++] = hex[c >> 4];
            out[o++] = hex[c & 15];
        }
    }
    if (n > QUOTE_MAX && o + 4 < outlen) {
        memcpy(out + o, "...", 3);
        o += 3;
    }
    out[o] = '\0';
    return out;
}

/* Formats a schema bound for a message: integral values exactly, others with %g. */
static const char *fmt_bound(double d, char *buf, size_t n)
{
    /* integral bounds in full (the OpenAPI document prints them as integers too) */
    if (d == floor(d) && fabs(d) < 1e19)
        snprintf(buf, n, "%.0f", d);
    else
        snprintf(buf, n, "%g", d);
    return buf;
}

/* Nesting beyond which a value is refused by the deep checks (msgpack-c stops at 32). */
#define CHECK_MAX_DEPTH 64

static const char *type_desc(rpc_type t)
{
    switch (t) {
    case RPC_T_ANY:
        return "a value";
    case RPC_T_BOOL:
        return "a boolean";
    case RPC_T_UINT:
        return "an unsigned integer";
    case RPC_T_INT:
        return "an integer";
    case RPC_T_NUM:
        return "a number";
    case RPC_T_STR:
        return "a string";
    case RPC_T_BIN:
        return "a binary";
    case RPC_T_ARRAY:
        return "an array";
    case RPC_T_MAP:
        return "a map";
    case RPC_T_VECTOR:
        return "a vector (bin of float32 or array of numbers)";
    case RPC_T_STR_ARRAY:
        return "an array of strings";
    case RPC_T_UINT_ARRAY:
        return "an array of unsigned integers";
    case RPC_T_TIME:
        return "a time (milliseconds since the epoch, or an RFC 3339 string such as "
               "2026-02-24T10:00:00Z)";
    }
    return "a value of a known type";
}

/* Reports a range failure: "parameter 'x' <verb> between A and B<unit>", or "at least A" /
 * "at most B" when one side is infinite. */
static int range_err(const char *what, const char *verb, double min, double max, const char *unit,
                     char *err, size_t errlen)
{
    char a[40], b[40];

    if (isinf(max) && max > 0)
        rpc_set_err(err, errlen, "parameter '%s' %s at least %s%s", what, verb,
                    fmt_bound(min, a, sizeof(a)), unit);
    else if (isinf(min) && min < 0)
        rpc_set_err(err, errlen, "parameter '%s' %s at most %s%s", what, verb,
                    fmt_bound(max, b, sizeof(b)), unit);
    else
        rpc_set_err(err, errlen, "parameter '%s' %s between %s and %s%s", what, verb,
                    fmt_bound(min, a, sizeof(a)), fmt_bound(max, b, sizeof(b)), unit);
    return RPC_E_INVALID;
}

/* Exact range tests for integers: comparing through double would misjudge values past 2^53. */
static bool u64_in_range(uint64_t u, double min, double max)
{
    if (min > 0) {
        if (min >= 0x1p64)
            return false;
        if (u < (uint64_t)ceil(min))
            return false;
    }
    if (max < 0)
        return false;
    if (max < 0x1p64 && u > (uint64_t)floor(max))
        return false;
    return true;
}

static bool i64_in_range(int64_t v, double min, double max)
{
    if (min > -0x1p63) {
        if (min >= 0x1p63)
            return false;
        if (v < (int64_t)ceil(min))
            return false;
    }
    if (max < 0x1p63) {
        if (max < -0x1p63)
            return false;
        if (v > (int64_t)floor(max))
            return false;
    }
    return true;
}

static bool count_in_range(size_t n, double min, double max)
{
    return (double)n >= min && (double)n <= max;
}

/* Checks a string's bytes: valid UTF-8 without U+0000 (C strings and PostgreSQL text and
 * jsonb cannot hold it). Returns NULL or what is wrong. */
static const char *str_problem(const char *s, size_t n)
{
    if (!rpc_utf8_valid(s, n))
        return "is not valid UTF-8";
    if (n > 0 && memchr(s, '\0', n) != NULL)
        return "contains a NUL character";
    return NULL;
}

/* Walks a free-form value and checks every string in it (keys too); refuses ext values. */
static int deep_check(const msgpack_object *o, unsigned depth, const char *what, char *err,
                      size_t errlen)
{
    const char *bad;

    if (depth > CHECK_MAX_DEPTH) {
        rpc_set_err(err, errlen, "parameter '%s' is nested too deeply", what);
        return RPC_E_INVALID;
    }
    switch (o->type) {
    case MSGPACK_OBJECT_STR:
        bad = str_problem(o->via.str.ptr, o->via.str.size);
        if (bad != NULL) {
            rpc_set_err(err, errlen, "parameter '%s' holds a string that %s", what, bad);
            return RPC_E_INVALID;
        }
        return 0;
    case MSGPACK_OBJECT_ARRAY:
        for (uint32_t i = 0; i < o->via.array.size; i++) {
            int rc = deep_check(&o->via.array.ptr[i], depth + 1, what, err, errlen);
            if (rc != 0)
                return rc;
        }
        return 0;
    case MSGPACK_OBJECT_MAP:
        for (uint32_t i = 0; i < o->via.map.size; i++) {
            int rc = deep_check(&o->via.map.ptr[i].key, depth + 1, what, err, errlen);
            if (rc == 0)
                rc = deep_check(&o->via.map.ptr[i].val, depth + 1, what, err, errlen);
            if (rc != 0)
                return rc;
        }
        return 0;
    case MSGPACK_OBJECT_EXT:
        /* The scanner lets ext through as valid MessagePack; no Engram parameter uses it. */
        rpc_set_err(err, errlen, "parameter '%s' holds an extension value, which is not supported",
                    what);
        return RPC_E_INVALID;
    default:
        return 0;
    }
}

/* Reads one little-endian float32 from p. */
static float le_float(const uint8_t *p)
{
    uint32_t u = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

/* Reads a vector element of array form as a double: 0, 1 when it is not a number, 2 when
 * it is not finite or has no float32 value. */
static int vec_elem(const msgpack_object *e, double *d)
{
    switch (e->type) {
    case MSGPACK_OBJECT_POSITIVE_INTEGER:
        *d = (double)e->via.u64;
        break;
    case MSGPACK_OBJECT_NEGATIVE_INTEGER:
        *d = (double)e->via.i64;
        break;
    case MSGPACK_OBJECT_FLOAT32:
    case MSGPACK_OBJECT_FLOAT64:
        *d = e->via.f64;
        break;
    default:
        return 1;
    }
    if (!isfinite(*d) || fabs(*d) > FLT_MAX)
        return 2;
    return 0;
}

static int check_vector(const msgpack_object *o, unsigned flags, double min, double max,
                        const char *what, char *err, size_t errlen)
{
    size_t dim;

    if (o->type == MSGPACK_OBJECT_BIN) {
        const uint8_t *p = (const uint8_t *)o->via.bin.ptr;
        if (o->via.bin.size % 4 != 0) {
            rpc_set_err(err, errlen,
                        "parameter '%s' must be a vector: binary length %u is not a multiple of 4",
                        what, o->via.bin.size);
            return RPC_E_INVALID;
        }
        dim = o->via.bin.size / 4;
        for (size_t i = 0; i < dim; i++) {
            if (!isfinite(le_float(p + 4 * i))) {
                rpc_set_err(err, errlen, "parameter '%s' holds a NaN or infinity at index %zu",
                            what, i);
                return RPC_E_INVALID;
            }
        }
    } else if (o->type == MSGPACK_OBJECT_ARRAY) {
        dim = o->via.array.size;
        for (size_t i = 0; i < dim; i++) {
            double d;
            int rc = vec_elem(&o->via.array.ptr[i], &d);
            if (rc == 1) {
                rpc_set_err(err, errlen, "parameter '%s' must be %s: element %zu is %s", what,
                            type_desc(RPC_T_VECTOR), i, rpc_obj_type_name(&o->via.array.ptr[i]));
                return RPC_E_INVALID;
            }
            if (rc == 2) {
                rpc_set_err(err, errlen,
                            "parameter '%s' holds a NaN, infinity or value out of float32 range at "
                            "index %zu",
                            what, i);
                return RPC_E_INVALID;
            }
        }
    } else {
        rpc_set_err(err, errlen, "parameter '%s' must be %s", what, type_desc(RPC_T_VECTOR));
        return RPC_E_INVALID;
    }
    if (dim == 0) {
        rpc_set_err(err, errlen, "parameter '%s' must be a vector of at least 1 dimension", what);
        return RPC_E_INVALID;
    }
    if ((flags & RPC_P_RANGE) && !count_in_range(dim, min, max))
        return range_err(what, "must have", min, max, " dimensions", err, errlen);
    return 0;
}

/* The checks of one schema type below return 0, RPC_E_INVALID with err, or WRONG_TYPE when
 * o is not of that type at all (rpc_check_value words that error). */
#define WRONG_TYPE (-1)

/* Reads exactly n decimal digits at s into *v. */
static bool digits(const char *s, size_t n, int *v)
{
    *v = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9')
            return false;
        *v = *v * 10 + (s[i] - '0');
    }
    return true;
}

/* Days from 1970-01-01 to the proleptic Gregorian date y-m-d (H. Hinnant's days_from_civil). */
static int64_t days_from_civil(int64_t y, int m, int d)
{
    y -= m <= 2;
    int64_t era = (y >= 0 ? y : y - 399) / 400;
    int64_t yoe = y - era * 400;
    int64_t doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
    int64_t doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + doe - 719468;
}

int rpc_time_parse(const char *s, size_t n, int64_t *ms)
{
    static const int mdays[] = {31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    int y, mo, d, h, mi, sec;
    if (n < 20 || !digits(s, 4, &y) || s[4] != '-' || !digits(s + 5, 2, &mo) || s[7] != '-' ||
        !digits(s + 8, 2, &d) || (s[10] != 'T' && s[10] != 't' && s[10] != ' ') ||
        !digits(s + 11, 2, &h) || s[13] != ':' || !digits(s + 14, 2, &mi) || s[16] != ':' ||
        !digits(s + 17, 2, &sec))
        return -EINVAL;
    bool leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    if (mo < 1 || mo > 12 || d < 1 || d > mdays[mo - 1] || (mo == 2 && d == 29 && !leap) ||
        h > 23 || mi > 59 || sec > 59)
        return -EINVAL;
    size_t i = 19;
    int frac_ms = 0, scale = 100;
    if (i < n && s[i] == '.') {
        size_t start = ++i;
        for (; i < n && s[i] >= '0' && s[i] <= '9'; i++, scale /= 10)
            frac_ms += scale * (s[i] - '0');
        if (i == start)
            return -EINVAL;
    }
    int off = 0; /* minutes east of UTC */
    if (i + 1 == n && (s[i] == 'Z' || s[i] == 'z')) {
        i++;
    } else if (i + 6 == n && (s[i] == '+' || s[i] == '-') && s[i + 3] == ':') {
        int oh, om;
        if (!digits(s + i + 1, 2, &oh) || !digits(s + i + 4, 2, &om) || oh > 23 || om > 59)
            return -EINVAL;
        off = (s[i] == '-' ? -1 : 1) * (oh * 60 + om);
        i += 6;
    }
    if (i != n)
        return -EINVAL;
    int64_t secs = days_from_civil(y, mo, d) * 86400 + h * 3600 + mi * 60 + sec - off * 60;
    *ms = secs * 1000 + frac_ms;
    return 0;
}

/* RPC_T_TIME: a non-negative integer of milliseconds, or an RFC 3339 string at or after the
 * epoch; min/max bound the milliseconds either way. */
static int check_time(const msgpack_object *o, bool ranged, double min, double max,
                      const char *what, char *err, size_t errlen)
{
    int64_t ms;
    if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER) {
        if (ranged && !u64_in_range(o->via.u64, min, max))
            return range_err(what, "must be", min, max, " (milliseconds since the epoch)", err,
                             errlen);
        return 0;
    }
    if (o->type != MSGPACK_OBJECT_STR)
        return WRONG_TYPE;
    if (o->via.str.size > 64 || rpc_time_parse(o->via.str.ptr, o->via.str.size, &ms) != 0) {
        rpc_set_err(err, errlen,
                    "parameter '%s' must be milliseconds since the epoch or an RFC 3339 time "
                    "such as 2026-02-24T10:00:00Z",
                    what);
        return RPC_E_INVALID;
    }
    if (ms < 0 || (ranged && !u64_in_range((uint64_t)ms, min, max)))
        return range_err(what, "must be", ranged ? min : 0, ranged ? max : INFINITY,
                         " (milliseconds since the epoch)", err, errlen);
    return 0;
}

static int check_int(const msgpack_object *o, bool ranged, double min, double max, const char *what,
                     char *err, size_t errlen)
{
    if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER) {
        if (o->via.u64 > INT64_MAX) {
            rpc_set_err(err, errlen, "parameter '%s' must be an integer that fits 64 bits", what);
            return RPC_E_INVALID;
        }
    } else if (o->type != MSGPACK_OBJECT_NEGATIVE_INTEGER) {
        return WRONG_TYPE;
    }
    if (ranged && !i64_in_range(o->via.i64, min, max))
        return range_err(what, "must be", min, max, "", err, errlen);
    return 0;
}

static int check_num(const msgpack_object *o, bool ranged, double min, double max, const char *what,
                     char *err, size_t errlen)
{
    if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER) {
        if (ranged && !u64_in_range(o->via.u64, min, max))
            return range_err(what, "must be", min, max, "", err, errlen);
        return 0;
    }
    if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER) {
        if (ranged && !i64_in_range(o->via.i64, min, max))
            return range_err(what, "must be", min, max, "", err, errlen);
        return 0;
    }
    if (o->type != MSGPACK_OBJECT_FLOAT32 && o->type != MSGPACK_OBJECT_FLOAT64)
        return WRONG_TYPE;
    double d = o->via.f64;
    if (!isfinite(d)) {
        rpc_set_err(err, errlen, "parameter '%s' must be a finite number", what);
        return RPC_E_INVALID;
    }
    if (ranged && !(d >= min && d <= max))
        return range_err(what, "must be", min, max, "", err, errlen);
    return 0;
}

static int check_str(const msgpack_object *o, bool ranged, double min, double max, const char *what,
                     char *err, size_t errlen)
{
    if (o->type != MSGPACK_OBJECT_STR)
        return WRONG_TYPE;
    const char *bad = str_problem(o->via.str.ptr, o->via.str.size);
    if (bad != NULL) {
        rpc_set_err(err, errlen, "parameter '%s' %s", what, bad);
        return RPC_E_INVALID;
    }
    if (ranged && !count_in_range(o->via.str.size, min, max))
        return range_err(what, "must be", min, max, " bytes long", err, errlen);
    return 0;
}

static int check_map(const msgpack_object *o, bool ranged, double min, double max, const char *what,
                     char *err, size_t errlen)
{
    if (o->type != MSGPACK_OBJECT_MAP)
        return WRONG_TYPE;
    for (uint32_t i = 0; i < o->via.map.size; i++) {
        if (o->via.map.ptr[i].key.type != MSGPACK_OBJECT_STR) {
            rpc_set_err(err, errlen, "parameter '%s' must be a map with string keys, not %s keys",
                        what, rpc_obj_type_name(&o->via.map.ptr[i].key));
            return RPC_E_INVALID;
        }
    }
    if (ranged && !count_in_range(o->via.map.size, min, max))
        return range_err(what, "must have", min, max, " entries", err, errlen);
    return deep_check(o, 0, what, err, errlen);
}

/* RPC_T_STR_ARRAY and RPC_T_UINT_ARRAY. */
static int check_list(const msgpack_object *o, rpc_type type, bool ranged, double min, double max,
                      const char *what, char *err, size_t errlen)
{
    if (o->type != MSGPACK_OBJECT_ARRAY)
        return WRONG_TYPE;
    for (uint32_t i = 0; i < o->via.array.size; i++) {
        const msgpack_object *e = &o->via.array.ptr[i];
        if (type == RPC_T_UINT_ARRAY) {
            if (e->type != MSGPACK_OBJECT_POSITIVE_INTEGER) {
                rpc_set_err(err, errlen, "parameter '%s' must be %s: element %u is %s", what,
                            type_desc(type), i,
                            e->type == MSGPACK_OBJECT_NEGATIVE_INTEGER ? "negative"
                                                                       : rpc_obj_type_name(e));
                return RPC_E_INVALID;
            }
            continue;
        }
        if (e->type != MSGPACK_OBJECT_STR) {
            rpc_set_err(err, errlen, "parameter '%s' must be %s: element %u is %s", what,
                        type_desc(type), i, rpc_obj_type_name(e));
            return RPC_E_INVALID;
        }
        const char *bad = str_problem(e->via.str.ptr, e->via.str.size);
        if (bad != NULL) {
            rpc_set_err(err, errlen, "parameter '%s[%u]' %s", what, i, bad);
            return RPC_E_INVALID;
        }
    }
    if (ranged && !count_in_range(o->via.array.size, min, max))
        return range_err(what, "must have", min, max, " elements", err, errlen);
    return 0;
}

/* The check of o against type, or WRONG_TYPE. */
static int check_typed(const msgpack_object *o, rpc_type type, unsigned flags, double min,
                       double max, const char *what, char *err, size_t errlen)
{
    const bool ranged = (flags & RPC_P_RANGE) != 0;
    switch (type) {
    case RPC_T_ANY:
        return deep_check(o, 0, what, err, errlen);
    case RPC_T_BOOL:
        return o->type == MSGPACK_OBJECT_BOOLEAN ? 0 : WRONG_TYPE;
    case RPC_T_UINT:
        if (o->type != MSGPACK_OBJECT_POSITIVE_INTEGER)
            return WRONG_TYPE;
        if (ranged && !u64_in_range(o->via.u64, min, max))
            return range_err(what, "must be", min, max, "", err, errlen);
        return 0;
    case RPC_T_INT:
        return check_int(o, ranged, min, max, what, err, errlen);
    case RPC_T_NUM:
        return check_num(o, ranged, min, max, what, err, errlen);
    case RPC_T_STR:
        return check_str(o, ranged, min, max, what, err, errlen);
    case RPC_T_BIN:
        if (o->type != MSGPACK_OBJECT_BIN)
            return WRONG_TYPE;
        if (ranged && !count_in_range(o->via.bin.size, min, max))
            return range_err(what, "must be", min, max, " bytes long", err, errlen);
        return 0;
    case RPC_T_ARRAY:
        if (o->type != MSGPACK_OBJECT_ARRAY)
            return WRONG_TYPE;
        if (ranged && !count_in_range(o->via.array.size, min, max))
            return range_err(what, "must have", min, max, " elements", err, errlen);
        return deep_check(o, 0, what, err, errlen);
    case RPC_T_MAP:
        return check_map(o, ranged, min, max, what, err, errlen);
    case RPC_T_VECTOR:
        return check_vector(o, flags, min, max, what, err, errlen);
    case RPC_T_STR_ARRAY:
    case RPC_T_UINT_ARRAY:
        return check_list(o, type, ranged, min, max, what, err, errlen);
    case RPC_T_TIME:
        return check_time(o, ranged, min, max, what, err, errlen);
    }
    rpc_set_err(err, errlen, "parameter '%s' has an unknown schema type %d", what, (int)type);
    return RPC_E_INVALID;
}

int rpc_check_value(const msgpack_object *o, rpc_type type, unsigned flags, double min, double max,
                    const char *what, char *err, size_t errlen)
{
    if (what == NULL)
        what = "?";
    if (o == NULL) {
        rpc_set_err(err, errlen, "missing parameter '%s'", what);
        return RPC_E_INVALID;
    }
    if (o->type == MSGPACK_OBJECT_NIL && (flags & RPC_P_NULLABLE))
        return 0;
    int rc = check_typed(o, type, flags, min, max, what, err, errlen);
    if (rc != WRONG_TYPE)
        return rc;
    rpc_set_err(err, errlen, "parameter '%s' must be %s, not %s", what, type_desc(type),
                rpc_obj_type_name(o));
    return RPC_E_INVALID;
}

/* ---- limits --------------------------------------------------------------------------- */

static double limits_tab[RPC_LIMITS_MAX];
static bool limits_set[RPC_LIMITS_MAX];

void rpc_limits_set(const double *limits, size_t n)
{
    for (size_t i = 1; i < RPC_LIMITS_MAX; i++) {
        limits_set[i] = i < n;
        limits_tab[i] = i < n ? limits[i] : INFINITY;
    }
}

double rpc_limit_value(unsigned i)
{
    return i > 0 && i < RPC_LIMITS_MAX && limits_set[i] ? limits_tab[i] : INFINITY;
}

static bool is_container(rpc_type t)
{
    return t == RPC_T_MAP || t == RPC_T_ARRAY || t == RPC_T_ANY;
}

double rpc_param_max(const rpc_param *p)
{
    if (RPC_P_LIMIT_OF(p->flags))
        return rpc_limit_value(RPC_P_LIMIT_OF(p->flags));
    if (is_container(p->type))
        return RPC_VALUE_MAX_DEFAULT;
    if (p->flags & RPC_P_RANGE)
        return p->max;
    if (p->type == RPC_T_STR)
        return RPC_STR_MAX_DEFAULT;
    return INFINITY;
}

/* Bytes of a MessagePack header for a length or count n: fix form (fixmax), 8, 16 or 32
 * bits. */
static size_t head_bytes(uint64_t n, uint64_t fixmax, bool has8)
{
    if (n <= fixmax)
        return 1;
    if (has8 && n <= 0xff)
        return 2;
    return n <= 0xffff ? 3 : 5;
}

size_t rpc_value_bytes(const msgpack_object *o)
{
    size_t n = 0;
    switch (o->type) {
    case MSGPACK_OBJECT_NIL:
    case MSGPACK_OBJECT_BOOLEAN:
        return 1;
    case MSGPACK_OBJECT_POSITIVE_INTEGER:
        return o->via.u64 <= 0x7f          ? 1
               : o->via.u64 <= 0xff        ? 2
               : o->via.u64 <= 0xffff      ? 3
               : o->via.u64 <= 0xffffffffu ? 5
                                           : 9;
    case MSGPACK_OBJECT_NEGATIVE_INTEGER:
        return o->via.i64 >= -32         ? 1
               : o->via.i64 >= -128      ? 2
               : o->via.i64 >= -32768    ? 3
               : o->via.i64 >= INT32_MIN ? 5
                                         : 9;
    case MSGPACK_OBJECT_FLOAT32:
        return 5;
    case MSGPACK_OBJECT_FLOAT64:
        return 9;
    case MSGPACK_OBJECT_STR:
        return head_bytes(o->via.str.size, 31, true) + o->via.str.size;
    case MSGPACK_OBJECT_BIN:
        return (o->via.bin.size <= 0xff ? 2 : o->via.bin.size <= 0xffff ? 3 : 5) + o->via.bin.size;
    case MSGPACK_OBJECT_EXT:
        return 6 + o->via.ext.size;
    case MSGPACK_OBJECT_ARRAY:
        n = head_bytes(o->via.array.size, 15, false);
        for (uint32_t i = 0; i < o->via.array.size; i++)
            n += rpc_value_bytes(&o->via.array.ptr[i]);
        return n;
    case MSGPACK_OBJECT_MAP:
        n = head_bytes(o->via.map.size, 15, false);
        for (uint32_t i = 0; i < o->via.map.size; i++)
            n += rpc_value_bytes(&o->via.map.ptr[i].key) + rpc_value_bytes(&o->via.map.ptr[i].val);
        return n;
    }
    return 1;
}

bool rpc_message_field(const char *msg, char *out, size_t n)
{
    if (n)
        out[0] = '\0';
    const char *a = msg ? strchr(msg, '\'') : NULL;
    const char *b = a ? strchr(a + 1, '\'') : NULL;
    if (!b || b == a + 1 || n == 0)
        return false;
    /* "memories[3]: parameter 'content' ...": a nested item names its place first */
    size_t pre = 0;
    const char *colon = strstr(msg, ": ");
    if (colon && colon < a && colon > msg && memchr(msg, ' ', (size_t)(colon - msg)) == NULL)
        pre = (size_t)(colon - msg);
    size_t len = (size_t)(b - a - 1);
    int k = snprintf(out, n, "%.*s%s%.*s", (int)pre, msg, pre ? "." : "", (int)len, a + 1);
    return k > 0;
}

int rpc_check_param(const msgpack_object *o, const rpc_param *p, const char *what, char *err,
                    size_t errlen)
{
    bool ranged = (p->flags & RPC_P_RANGE) != 0;
    double max = rpc_param_max(p);
    double min = ranged ? p->min : p->type == RPC_T_INT || p->type == RPC_T_NUM ? -INFINITY : 0;
    unsigned flags = p->flags;
    if (what == NULL)
        what = p->name;
    if (!is_container(p->type) && p->type != RPC_T_STR_ARRAY && p->type != RPC_T_UINT_ARRAY &&
        !isinf(max)) {
        /* the effective maximum applies as a range */
        flags |= RPC_P_RANGE;
        return rpc_check_value(o, p->type, flags, min, max, what, err, errlen);
    }
    int rc = rpc_check_value(o, p->type, flags, p->min, p->max, what, err, errlen);
    if (rc != 0 || o == NULL || o->type == MSGPACK_OBJECT_NIL)
        return rc;
    if (is_container(p->type)) {
        size_t bytes = rpc_value_bytes(o);
        if ((double)bytes > max) {
            char b[40];
            rpc_set_err(err, errlen,
                        "parameter '%s' must be at most %s bytes (as MessagePack), not %zu", what,
                        fmt_bound(max, b, sizeof(b)), bytes);
            return RPC_E_INVALID;
        }
    } else if (p->type == RPC_T_STR_ARRAY) {
        unsigned lim = RPC_P_LIMIT_OF(p->flags);
        double emax = lim ? rpc_limit_value(lim) : RPC_STR_MAX_DEFAULT;
        for (uint32_t i = 0; i < o->via.array.size; i++) {
            if ((double)o->via.array.ptr[i].via.str.size > emax) {
                char b[40];
                rpc_set_err(err, errlen, "parameter '%s[%u]' must be at most %s bytes long", what,
                            i, fmt_bound(emax, b, sizeof(b)));
                return RPC_E_INVALID;
            }
        }
    }
    return 0;
}

static bool key_is(const msgpack_object *k, const char *s, size_t n)
{
    return k->type == MSGPACK_OBJECT_STR && k->via.str.size == n &&
           (n == 0 || memcmp(k->via.str.ptr, s, n) == 0);
}

/* The name under which the value of schema[slot] came among the first j keys of params: one
 * of its aliases (the RPC_P_ALIAS entries right after it), else its own. */
static const char *earlier_name(const msgpack_object *params, uint32_t j, const rpc_param *schema,
                                size_t n, size_t slot)
{
    for (size_t a = slot + 1; a < n && (schema[a].flags & RPC_P_ALIAS); a++)
        for (uint32_t e = 0; e < j; e++)
            if (key_is(&params->via.map.ptr[e].key, schema[a].name, strlen(schema[a].name)))
                return schema[a].name;
    return schema[slot].name;
}

int rpc_bind_params(const msgpack_object *params, const rpc_param *schema, size_t n,
                    const msgpack_object **out, char *err, size_t errlen)
{
    char q[4 * QUOTE_MAX + 8];
    int rc;

    for (size_t i = 0; i < n; i++)
        out[i] = NULL;
    if (params == NULL)
        goto required;
    if (params->type != MSGPACK_OBJECT_MAP) {
        rpc_set_err(err, errlen, "parameters must be a map, not %s", rpc_obj_type_name(params));
        rc = RPC_E_INVALID;
        goto fail;
    }
    for (uint32_t j = 0; j < params->via.map.size; j++) {
        const msgpack_object *k = &params->via.map.ptr[j].key;
        const msgpack_object *v = &params->via.map.ptr[j].val;
        size_t i;

        if (k->type != MSGPACK_OBJECT_STR) {
            rpc_set_err(err, errlen, "parameter names must be strings, not %s",
                        rpc_obj_type_name(k));
            rc = RPC_E_INVALID;
            goto fail;
        }
        for (i = 0; i < n; i++)
            if (key_is(k, schema[i].name, strlen(schema[i].name)))
                break;
        if (i == n) {
            rpc_set_err(err, errlen, "unknown parameter '%s'",
                        quote(k->via.str.ptr, k->via.str.size, q, sizeof(q)));
            rc = RPC_E_INVALID;
            goto fail;
        }
        /* Every earlier key is a distinct schema name, so this loop runs at most n times. */
        for (uint32_t e = 0; e < j; e++) {
            if (key_is(&params->via.map.ptr[e].key, k->via.str.ptr, k->via.str.size)) {
                rpc_set_err(err, errlen, "duplicate parameter '%s'", schema[i].name);
                rc = RPC_E_INVALID;
                goto fail;
            }
        }
        if (v->type == MSGPACK_OBJECT_NIL && (schema[i].flags & RPC_P_NULLABLE))
            continue;
        rc = rpc_check_param(v, &schema[i], schema[i].name, err, errlen);
        if (rc != 0)
            goto fail;
        size_t slot = i; /* an alias binds to the parameter it names */
        while (slot > 0 && (schema[slot].flags & RPC_P_ALIAS))
            slot--;
        if (out[slot] != NULL && !msgpack_object_equal(*out[slot], *v)) {
            rpc_set_err(err, errlen, "parameters '%s' and '%s' name the same parameter and differ",
                        earlier_name(params, j, schema, n, slot), schema[i].name);
            rc = RPC_E_INVALID;
            goto fail;
        }
        out[slot] = v;
    }

required:
    for (size_t i = 0; i < n; i++) {
        if ((schema[i].flags & RPC_P_REQUIRED) && out[i] == NULL) {
            rpc_set_err(err, errlen, "missing required parameter '%s'", schema[i].name);
            rc = RPC_E_INVALID;
            goto fail;
        }
    }
    return 0;

fail:
    for (size_t i = 0; i < n; i++)
        out[i] = NULL;
    return rc;
}

uint64_t rpc_get_uint(const msgpack_object *o, uint64_t def)
{
    if (o == NULL || o->type != MSGPACK_OBJECT_POSITIVE_INTEGER)
        return def;
    return o->via.u64;
}

int64_t rpc_get_int(const msgpack_object *o, int64_t def)
{
    if (o == NULL)
        return def;
    if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER)
        return o->via.i64;
    if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER && o->via.u64 <= INT64_MAX)
        return (int64_t)o->via.u64;
    return def;
}

int64_t rpc_get_time(const msgpack_object *o, int64_t def)
{
    int64_t ms;
    if (o && o->type == MSGPACK_OBJECT_STR &&
        rpc_time_parse(o->via.str.ptr, o->via.str.size, &ms) == 0)
        return ms;
    return rpc_get_int(o, def);
}

double rpc_get_num(const msgpack_object *o, double def)
{
    if (o == NULL)
        return def;
    switch (o->type) {
    case MSGPACK_OBJECT_POSITIVE_INTEGER:
        return (double)o->via.u64;
    case MSGPACK_OBJECT_NEGATIVE_INTEGER:
        return (double)o->via.i64;
    case MSGPACK_OBJECT_FLOAT32:
    case MSGPACK_OBJECT_FLOAT64:
        return o->via.f64;
    default:
        return def;
    }
}

bool rpc_get_bool(const msgpack_object *o, bool def)
{
    if (o == NULL || o->type != MSGPACK_OBJECT_BOOLEAN)
        return def;
    return o->via.boolean;
}

char *rpc_get_str(const msgpack_object *o, void *(*alloc)(void *ud, size_t n), void *ud)
{
    char *s;

    if (o == NULL || o->type != MSGPACK_OBJECT_STR)
        return NULL;
    s = alloc(ud, (size_t)o->via.str.size + 1);
    if (s == NULL)
        return NULL;
    if (o->via.str.size > 0)
        memcpy(s, o->via.str.ptr, o->via.str.size);
    s[o->via.str.size] = '\0';
    return s;
}

bool rpc_str_eq(const msgpack_object *o, const char *s)
{
    return o != NULL && s != NULL && key_is(o, s, strlen(s));
}

const msgpack_object *rpc_map_get(const msgpack_object *m, const char *key)
{
    size_t n;

    if (m == NULL || m->type != MSGPACK_OBJECT_MAP || key == NULL)
        return NULL;
    n = strlen(key);
    for (uint32_t i = 0; i < m->via.map.size; i++)
        if (key_is(&m->via.map.ptr[i].key, key, n))
            return &m->via.map.ptr[i].val;
    return NULL;
}

size_t rpc_vector_dim(const msgpack_object *o)
{
    if (o == NULL)
        return 0;
    if (o->type == MSGPACK_OBJECT_BIN)
        return o->via.bin.size / 4;
    if (o->type == MSGPACK_OBJECT_ARRAY)
        return o->via.array.size;
    return 0;
}

int rpc_get_vector(const msgpack_object *o, const char *param, float *out, size_t dim, char *err,
                   size_t errlen)
{
    size_t have;

    if (param == NULL)
        param = "?";
    if (o == NULL || (o->type != MSGPACK_OBJECT_BIN && o->type != MSGPACK_OBJECT_ARRAY) ||
        (o->type == MSGPACK_OBJECT_BIN && o->via.bin.size % 4 != 0)) {
        rpc_set_err(err, errlen, "parameter '%s' must be %s", param, type_desc(RPC_T_VECTOR));
        return RPC_E_INVALID;
    }
    have = rpc_vector_dim(o);
    if (have != dim) {
        rpc_set_err(err, errlen, "parameter '%s' has dimension %zu, expected %zu", param, have,
                    dim);
        return RPC_E_INVALID;
    }
    for (size_t i = 0; i < dim; i++) {
        bool ok;
        float f = 0;

        if (o->type == MSGPACK_OBJECT_BIN) {
            f = le_float((const uint8_t *)o->via.bin.ptr + 4 * i);
            ok = isfinite(f);
        } else {
            double d;
            int rc = vec_elem(&o->via.array.ptr[i], &d);
            if (rc == 1) {
                rpc_set_err(err, errlen, "parameter '%s' must be %s: element %zu is %s", param,
                            type_desc(RPC_T_VECTOR), i, rpc_obj_type_name(&o->via.array.ptr[i]));
                return RPC_E_INVALID;
            }
            ok = rc == 0;
            if (ok)
                f = (float)d; /* in float range: checked by vec_elem */
        }
        if (!ok) {
            rpc_set_err(err, errlen,
                        "parameter '%s' holds a NaN, infinity or value out of float32 range at "
                        "index %zu",
                        param, i);
            return RPC_E_INVALID;
        }
        out[i] = f;
    }
    return 0;
}
