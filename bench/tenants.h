/* bench/tenants.h: the benchmark's tenants: creation through the admin key, the state file
 * that keeps their API keys for --reuse, and the blocking calls around a run (count,
 * cleanup, readiness probe).
 *
 * Names are derived from the data set: "<prefix>-s<seed>-n<memories>-d<dim>-<i>" for
 * tenant i of the gaussian data set, "<prefix>-<dataset>[-<engine>]-s..." for another data
 * set or an explicit index engine, so a second run with the same parameters finds the same
 * tenants; without
 * reuse a unique "-r<time>.<pid>" is added before "-<i>" so runs never share a tenant.
 * The admin API can create a tenant but not look one up, so the state file (one line
 * "NAME KEY" per tenant, mode 600) is what makes reuse possible.
 */
#ifndef ENGRAM_BENCH_TENANTS_H
#define ENGRAM_BENCH_TENANTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define TENANTS_NAME_MAX 128
#define TENANTS_KEY_MAX 256

typedef struct tenants_conf {
    const char *host;
    uint16_t port;
    const char *admin_key_file; /* may be NULL when every tenant is reused */
    const char *state_file;     /* NULL: keys are not kept */
    const char *prefix;
    const char *tier;
    uint64_t seed;
    size_t memories, dim;
    const char *dataset;      /* data set name; NULL or "gaussian": not in tenant names */
    const char *index_engine; /* NULL: not sent; else admin.tenant.create's index_engine */
    bool reuse;
} tenants_conf;

typedef struct tenant_info {
    char name[TENANTS_NAME_MAX];
    char key[TENANTS_KEY_MAX];
    uint64_t held;  /* memories the tenant held when checked */
    bool need_load; /* true: empty, load it; false: holds the data set already */
} tenant_info;

/* tenants_name writes tenant i's name for c into out (TENANTS_NAME_MAX bytes); unique is
 * the run's suffix ("" with reuse). */
void tenants_name(const tenants_conf *c, const char *unique, size_t i, char *out);

/* tenants_prepare makes tenants first .. first + n - 1 ready (out has n entries): with
 * reuse, a tenant whose key is in the state file and that holds exactly c->memories
 * memories is kept (need_load false), one that holds none is loaded; otherwise it is
 * created with the admin key (tier, embedding dim, and index_engine when c->index_engine is
 * set) and its key saved in the state file.
 * Returns 0, or 1 with a message in err (cannot connect, bad admin key, a reused tenant
 * holding an unexpected number of memories, a name taken by a tenant whose key is lost),
 * or a negative errno. */
int tenants_prepare(const tenants_conf *c, size_t first, size_t n, tenant_info *out, char *err,
                    size_t errlen);

/* tenants_lookup_key sets key (TENANTS_KEY_MAX bytes) to the key the state file holds for
 * name. Returns 0, or 1 when the file or the name is missing. */
int tenants_lookup_key(const char *state_file, const char *name, char *key);

/* tenants_count sets *total to memory.stats' total of the tenant with key. Returns 0, or 1
 * with err. */
int tenants_count(const char *host, uint16_t port, const char *key, uint64_t *total, char *err,
                  size_t errlen);

/* tenants_settle waits (at most timeout_s) until the tenant's index on the server is
 * loaded and settled, as memory.stats reports it: exact kinds at once; an approximate index
 * once its recall monitor has an estimate and, for a faiss tenant, once the FAISS index is
 * built and serving. A benchmark measures the index it means to, not one still getting
 * ready. Fills desc (a one-line summary: kind, engine in use, estimate, depth). Returns 0,
 * or 1 with err (timed out, or a call failed). */
int tenants_settle(const char *host, uint16_t port, const char *key, int timeout_s, char *desc,
                   size_t desclen, char *err, size_t errlen);

/* tenants_delete deletes the n memories ids (only read) of the tenant with key, 1000 per
 * call. Returns 0, or 1 with err. */
int tenants_delete(const char *host, uint16_t port, const char *key, const uint64_t *ids, size_t n,
                   char *err, size_t errlen);

/* tenants_probe_search sends one memory.search with the vector q (dim floats) as the tenant
 * with key and waits for the answer (timeout_ms). Returns 0 when it was answered without
 * error, else 1 with err. */
int tenants_probe_search(const char *host, uint16_t port, const char *key, const float *q,
                         size_t dim, int timeout_ms, char *err, size_t errlen);

#endif
