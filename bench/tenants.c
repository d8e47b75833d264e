/* bench/tenants.c: tenant creation, the state file, and blocking calls (see tenants.h). */
#include "tenants.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "client.h"
#include "rpc.h"

#define CALL_TIMEOUT_MS 120000
#define STATE_MAX 4096 /* tenants remembered in one state file */
#define DELETE_RETRIES 10

void tenants_name(const tenants_conf *c, const char *unique, size_t i, char *out)
{
    bool ds = c->dataset && strcmp(c->dataset, "gaussian") != 0;
    /* v2: the synthetic data sets' generator of today (see bench/dataset.c gen_base); tenants
     * loaded by the earlier one, whose vectors differ in the last bits, are not reused */
    snprintf(out, TENANTS_NAME_MAX, "%s%s%s%s%s-v2-s%llu-n%zu-d%zu%s-%zu", c->prefix, ds ? "-" : "",
             ds ? c->dataset : "", c->index_engine ? "-" : "",
             c->index_engine ? c->index_engine : "", (unsigned long long)c->seed, c->memories,
             c->dim, unique, i);
}

/* ---- state file ------------------------------------------------------------------------ */

typedef struct state_entry {
    char name[TENANTS_NAME_MAX];
    char key[TENANTS_KEY_MAX];
} state_entry;

/* Reads up to STATE_MAX entries; a missing file is an empty state. */
static int state_read(const char *path, state_entry **out, size_t *n)
{
    *out = NULL;
    *n = 0;
    FILE *f = fopen(path, "r");
    if (!f)
        return errno == ENOENT ? 0 : -errno;
    state_entry *e = calloc(STATE_MAX, sizeof(*e));
    if (!e) {
        fclose(f);
        return -ENOMEM;
    }
    char line[TENANTS_NAME_MAX + TENANTS_KEY_MAX + 8];
    while (*n < STATE_MAX && fgets(line, sizeof(line), f)) {
        char *sp = strchr(line, ' ');
        if (!sp || line[0] == '#')
            continue;
        *sp = '\0';
        char *key = sp + 1;
        key[strcspn(key, "\r\n")] = '\0';
        if (strlen(line) >= TENANTS_NAME_MAX || strlen(key) >= TENANTS_KEY_MAX || !key[0])
            continue;
        strcpy(e[*n].name, line);
        strcpy(e[*n].key, key);
        (*n)++;
    }
    fclose(f);
    *out = e;
    return 0;
}

/* Adds or replaces name's key and rewrites the file atomically, mode 600. */
static int state_put(const char *path, const char *name, const char *key)
{
    state_entry *e = NULL;
    size_t n = 0;
    int rc = state_read(path, &e, &n);
    if (rc != 0)
        return rc;
    char tmp[4096];
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) {
        free(e);
        return -errno;
    }
    FILE *f = fdopen(fd, "w");
    if (!f) {
        close(fd);
        free(e);
        return -ENOMEM;
    }
    fprintf(f, "# engram-bench tenants: NAME API-KEY (secrets: keep this file private)\n");
    for (size_t i = 0; i < n; i++)
        if (strcmp(e[i].name, name) != 0)
            fprintf(f, "%s %s\n", e[i].name, e[i].key);
    fprintf(f, "%s %s\n", name, key);
    free(e);
    if (fflush(f) != 0 || fsync(fileno(f)) != 0) {
        fclose(f);
        return -EIO;
    }
    if (fclose(f) != 0)
        return -EIO;
    if (rename(tmp, path) != 0)
        return -errno;
    return 0;
}

int tenants_lookup_key(const char *state_file, const char *name, char *key)
{
    state_entry *e = NULL;
    size_t n = 0;
    if (!state_file || state_read(state_file, &e, &n) != 0)
        return 1;
    int rc = 1;
    for (size_t i = 0; i < n; i++) {
        if (strcmp(e[i].name, name) == 0) {
            strcpy(key, e[i].key);
            rc = 0;
        }
    }
    free(e);
    return rc;
}

/* ---- calls ----------------------------------------------------------------------------- */

static int connect_as(const char *host, uint16_t port, const char *key, client_conn **out,
                      client_error *cerr, char *err, size_t errlen)
{
    int rc = client_connect(host, port, CALL_TIMEOUT_MS, out, err, errlen);
    if (rc != 0)
        return 1;
    if (key && client_auth(*out, key, cerr) != 0) {
        snprintf(err, errlen, "auth: %s: %s", cerr->code, cerr->message);
        client_close(*out);
        *out = NULL;
        return 2;
    }
    return 0;
}

int tenants_count(const char *host, uint16_t port, const char *key, uint64_t *total, char *err,
                  size_t errlen)
{
    client_conn *c = NULL;
    client_error cerr;
    if (connect_as(host, port, key, &c, &cerr, err, errlen) != 0)
        return 1;
    msgpack_zone z;
    msgpack_zone_init(&z, 4096);
    const msgpack_object *res = NULL;
    int rc = client_call(c, "memory.stats", NULL, &z, &res, &cerr);
    const msgpack_object *t = rc == 0 ? rpc_map_get(res, "total") : NULL;
    if (rc != 0) {
        snprintf(err, errlen, "memory.stats: %s: %s", cerr.code, cerr.message);
        rc = 1;
    } else if (!t || t->type != MSGPACK_OBJECT_POSITIVE_INTEGER) {
        snprintf(err, errlen, "memory.stats: no total in the answer");
        rc = 1;
    } else {
        *total = t->via.u64;
    }
    msgpack_zone_destroy(&z);
    client_close(c);
    return rc;
}

static const char *str_of(const msgpack_object *o, char *buf, size_t len)
{
    if (!o || o->type != MSGPACK_OBJECT_STR)
        return "";
    snprintf(buf, len, "%.*s", (int)o->via.str.size, o->via.str.ptr);
    return buf;
}

int tenants_settle(const char *host, uint16_t port, const char *key, int timeout_s, char *desc,
                   size_t desclen, char *err, size_t errlen)
{
    client_conn *c = NULL;
    client_error cerr;
    if (connect_as(host, port, key, &c, &cerr, err, errlen) != 0)
        return 1;
    int rc = 1;
    struct timespec t0, now;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        msgpack_zone z;
        msgpack_zone_init(&z, 4096);
        const msgpack_object *res = NULL;
        if (client_call(c, "memory.stats", NULL, &z, &res, &cerr) != 0) {
            snprintf(err, errlen, "memory.stats: %s: %s", cerr.code, cerr.message);
            msgpack_zone_destroy(&z);
            break;
        }
        const msgpack_object *ix = rpc_map_get(res, "index");
        const msgpack_object *loaded = rpc_map_get(ix, "loaded");
        const msgpack_object *est = rpc_map_get(ix, "recall_estimate");
        const msgpack_object *depth = rpc_map_get(ix, "candidate_depth");
        char kind[16], eng[16], use[16], warm[16];
        str_of(rpc_map_get(ix, "kind"), kind, sizeof(kind));
        str_of(rpc_map_get(ix, "engine"), eng, sizeof(eng));
        str_of(rpc_map_get(ix, "engine_in_use"), use, sizeof(use));
        str_of(rpc_map_get(ix, "row_cache_warm"), warm, sizeof(warm));
        bool is_loaded = loaded && loaded->type == MSGPACK_OBJECT_BOOLEAN && loaded->via.boolean;
        bool measured =
            est && (est->type == MSGPACK_OBJECT_FLOAT64 || est->type == MSGPACK_OBJECT_FLOAT32);
        /* the server reads a loaded tenant's rows into its row cache in the background: a
         * run measures the server after that, as it serves once warm */
        bool warming = strcmp(warm, "pending") == 0 || strcmp(warm, "warming") == 0;
        bool ready = is_loaded && !warming &&
                     (strcmp(kind, "ann") != 0 ||
                      (measured && (strcmp(eng, "faiss") != 0 || strcmp(use, "faiss") == 0)));
        if (ready) {
            snprintf(desc, desclen,
                     "index %s, engine %s, recall estimate %.4f, depth %llu, row cache %s", kind,
                     use[0] ? use : eng, measured ? est->via.f64 : 1.0,
                     depth && depth->type == MSGPACK_OBJECT_POSITIVE_INTEGER
                         ? (unsigned long long)depth->via.u64
                         : 0ull,
                     warm[0] ? warm : "-");
            rc = 0;
        }
        msgpack_zone_destroy(&z);
        if (ready)
            break;
        clock_gettime(CLOCK_MONOTONIC, &now);
        if (now.tv_sec - t0.tv_sec > timeout_s) {
            snprintf(err, errlen, "the index did not settle within %d s (loaded %d, kind %s)",
                     timeout_s, is_loaded, kind);
            break;
        }
        struct timespec ms200 = {0, 200000000};
        nanosleep(&ms200, NULL);
    }
    client_close(c);
    return rc;
}

typedef struct create_args {
    const char *name, *tier, *engine;
    size_t dim;
} create_args;

static int pack_create(msgpack_packer *pk, void *ud)
{
    const create_args *a = ud;
    msgpack_pack_map(pk, a->engine ? 4 : 3);
    rpc_pack_kv_str(pk, "name", a->name);
    rpc_pack_kv_str(pk, "tier", a->tier);
    if (a->engine)
        rpc_pack_kv_str(pk, "index_engine", a->engine);
    rpc_pack_cstr(pk, "embedding");
    msgpack_pack_map(pk, 1);
    rpc_pack_kv_uint(pk, "dim", a->dim);
    return 0;
}

static int read_key_file(const char *path, char *key, char *err, size_t errlen)
{
    FILE *f = path ? fopen(path, "r") : NULL;
    if (!f) {
        snprintf(err, errlen, "cannot read the admin key file %s", path ? path : "(none given)");
        return 1;
    }
    size_t n = fread(key, 1, TENANTS_KEY_MAX - 1, f);
    fclose(f);
    key[n] = '\0';
    while (n > 0 && (key[n - 1] == '\n' || key[n - 1] == '\r' || key[n - 1] == ' '))
        key[--n] = '\0';
    if (n == 0) {
        snprintf(err, errlen, "the admin key file %s is empty", path);
        return 1;
    }
    return 0;
}

/* Creates the tenant and copies its key into ti->key. */
static int create_tenant(const tenants_conf *c, client_conn **admin, tenant_info *ti, char *err,
                         size_t errlen)
{
    client_error cerr;
    if (!*admin) {
        char akey[TENANTS_KEY_MAX];
        if (read_key_file(c->admin_key_file, akey, err, errlen) != 0)
            return 1;
        int rc = connect_as(c->host, c->port, akey, admin, &cerr, err, errlen);
        memset(akey, 0, sizeof(akey));
        if (rc != 0)
            return 1;
    }
    create_args a = {ti->name, c->tier, c->index_engine, c->dim};
    client_args args = {.pack = pack_create, .ud = &a};
    msgpack_zone z;
    msgpack_zone_init(&z, 4096);
    const msgpack_object *res = NULL;
    int rc = client_call(*admin, "admin.tenant.create", &args, &z, &res, &cerr);
    const msgpack_object *k = rc == 0 ? rpc_map_get(res, "api_key") : NULL;
    if (rc != 0) {
        if (strcmp(cerr.code, "already_exists") == 0)
            snprintf(err, errlen,
                     "tenant %s exists but its key is not in the state file: use another "
                     "--tenant-prefix or --seed",
                     ti->name);
        else
            snprintf(err, errlen, "admin.tenant.create: %s: %s", cerr.code, cerr.message);
        rc = 1;
    } else if (!k || k->type != MSGPACK_OBJECT_STR || k->via.str.size >= TENANTS_KEY_MAX) {
        snprintf(err, errlen, "admin.tenant.create: no api_key in the answer");
        rc = 1;
    } else {
        memcpy(ti->key, k->via.str.ptr, k->via.str.size);
        ti->key[k->via.str.size] = '\0';
    }
    msgpack_zone_destroy(&z);
    return rc;
}

int tenants_prepare(const tenants_conf *c, size_t first, size_t n, tenant_info *out, char *err,
                    size_t errlen)
{
    char unique[64] = "";
    if (!c->reuse) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        snprintf(unique, sizeof(unique), "-r%lld.%ld", (long long)ts.tv_sec, (long)getpid());
    }
    client_conn *admin = NULL;
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++) {
        tenant_info *ti = &out[i];
        memset(ti, 0, sizeof(*ti));
        tenants_name(c, unique, first + i, ti->name);
        bool have = c->reuse && tenants_lookup_key(c->state_file, ti->name, ti->key) == 0;
        if (have) {
            char cerr[256];
            if (tenants_count(c->host, c->port, ti->key, &ti->held, cerr, sizeof(cerr)) == 0) {
                if (ti->held == c->memories) {
                    ti->need_load = false;
                    continue;
                }
                if (ti->held != 0) {
                    snprintf(err, errlen,
                             "tenant %s holds %llu memories, not %zu: use another "
                             "--tenant-prefix (or a new state file and database)",
                             ti->name, (unsigned long long)ti->held, c->memories);
                    rc = 1;
                    break;
                }
                ti->need_load = true;
                continue;
            }
            if (!strstr(cerr, "unauthenticated")) {
                snprintf(err, errlen, "tenant %s: %s", ti->name, cerr);
                rc = 1;
                break;
            }
            /* a key from another server or database: make the tenant here */
        }
        if (create_tenant(c, &admin, ti, err, errlen) != 0) {
            rc = 1;
            break;
        }
        ti->need_load = true;
        ti->held = 0;
        if (c->reuse && c->state_file) {
            int src = state_put(c->state_file, ti->name, ti->key);
            if (src != 0) {
                snprintf(err, errlen, "cannot write the state file %s: %s", c->state_file,
                         strerror(-src));
                rc = 1;
            }
        }
    }
    client_close(admin);
    return rc;
}

typedef struct ids_args {
    const uint64_t *ids;
    size_t n;
} ids_args;

static int pack_ids(msgpack_packer *pk, void *ud)
{
    const ids_args *a = ud;
    msgpack_pack_map(pk, 1);
    rpc_pack_cstr(pk, "ids");
    msgpack_pack_array(pk, a->n);
    for (size_t i = 0; i < a->n; i++)
        msgpack_pack_uint64(pk, a->ids[i]);
    return 0;
}

int tenants_delete(const char *host, uint16_t port, const char *key, const uint64_t *ids, size_t n,
                   char *err, size_t errlen)
{
    client_conn *c = NULL;
    client_error cerr;
    if (connect_as(host, port, key, &c, &cerr, err, errlen) != 0)
        return 1;
    msgpack_zone z;
    msgpack_zone_init(&z, 4096);
    int rc = 0;
    for (size_t off = 0; off < n && rc == 0; off += 1000) {
        ids_args a = {ids + off, n - off < 1000 ? n - off : 1000};
        client_args args = {.pack = pack_ids, .ud = &a};
        const msgpack_object *res = NULL;
        /* unavailable may be retried (the protocol says so); seen in practice as a
         * deadlock (40P01) with the server's batched access-count writes */
        for (int attempt = 0;; attempt++) {
            int crc = client_call(c, "memory.delete", &args, &z, &res, &cerr);
            msgpack_zone_clear(&z);
            if (crc == 0)
                break;
            if (crc == CLIENT_E_SERVER && strcmp(cerr.code, "unavailable") == 0 &&
                attempt < DELETE_RETRIES) {
                fprintf(stderr, "engram-bench: memory.delete: %s, retrying\n", cerr.message);
                struct timespec pause = {0, 50000000L * (attempt + 1)};
                nanosleep(&pause, NULL);
                continue;
            }
            snprintf(err, errlen, "memory.delete: %s: %s", cerr.code, cerr.message);
            rc = 1;
            break;
        }
    }
    msgpack_zone_destroy(&z);
    client_close(c);
    return rc;
}

typedef struct probe_args {
    const float *q;
    size_t dim;
} probe_args;

static int pack_probe(msgpack_packer *pk, void *ud)
{
    const probe_args *a = ud;
    msgpack_pack_map(pk, 3);
    rpc_pack_cstr(pk, "embedding");
    rpc_pack_vector(pk, a->q, a->dim);
    rpc_pack_kv_uint(pk, "top_k", 10);
    rpc_pack_kv_num(pk, "similarity_weight", 1.0);
    return 0;
}

int tenants_probe_search(const char *host, uint16_t port, const char *key, const float *q,
                         size_t dim, int timeout_ms, char *err, size_t errlen)
{
    client_conn *c = NULL;
    client_error cerr;
    if (connect_as(host, port, key, &c, &cerr, err, errlen) != 0)
        return 1;
    client_set_timeout(c, timeout_ms);
    probe_args a = {q, dim};
    client_args args = {.pack = pack_probe, .ud = &a};
    msgpack_zone z;
    msgpack_zone_init(&z, 65536);
    const msgpack_object *res = NULL;
    int rc = client_call(c, "memory.search", &args, &z, &res, &cerr);
    if (rc != 0) {
        snprintf(err, errlen, "memory.search: %s: %s", cerr.code, cerr.message);
        rc = 1;
    }
    msgpack_zone_destroy(&z);
    client_close(c);
    return rc;
}
