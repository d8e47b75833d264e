/* server/net/climits.c: process-wide client limits (see climits.h). */
#include "climits.h"

#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "hash.h"
#include "idmap.h"

struct climits {
    pthread_mutex_t mu;
    idmap *per_addr; /* address key -> open connections */
    long per_addr_max;
    atomic_llong buffered;
    long long budget;
    atomic_ullong refused_ms; /* monotonic ms of the last charge the budget refused */
};

climits *climits_create(const config *cfg)
{
    climits *cl = calloc(1, sizeof(*cl));
    if (!cl)
        return NULL;
    cl->per_addr = idmap_create(64);
    if (!cl->per_addr || pthread_mutex_init(&cl->mu, NULL)) {
        idmap_destroy(cl->per_addr);
        free(cl);
        return NULL;
    }
    cl->per_addr_max = cfg->max_connections_per_address;
    cl->budget = cfg->max_output_total_bytes;
    return cl;
}

void climits_destroy(climits *cl)
{
    if (!cl)
        return;
    idmap_destroy(cl->per_addr);
    pthread_mutex_destroy(&cl->mu);
    free(cl);
}

/* A 64-bit key of the address: IPv4 as is, IPv6 folded (FNV-1a), never the idmap's
 * reserved keys. */
static uint64_t addr_key(const struct sockaddr *sa)
{
    const unsigned char *b = NULL;
    size_t n = 0;
    if (sa && sa->sa_family == AF_INET) {
        b = (const unsigned char *)&((const struct sockaddr_in *)sa)->sin_addr;
        n = 4;
    } else if (sa && sa->sa_family == AF_INET6) {
        b = (const unsigned char *)&((const struct sockaddr_in6 *)sa)->sin6_addr;
        n = 16;
    }
    uint64_t h = hash_fnv1a(b, n);
    return (h >> 2) | 1; /* neither 0 nor all ones */
}

bool climits_addr_take(climits *cl, const struct sockaddr *sa, uint64_t *key)
{
    uint64_t k = addr_key(sa), v = 0;
    bool ok = true;
    pthread_mutex_lock(&cl->mu);
    idmap_get(cl->per_addr, k, &v);
    if (cl->per_addr_max > 0 && (long)v >= cl->per_addr_max)
        ok = false;
    if (ok && idmap_put(cl->per_addr, k, v + 1) != 0)
        ok = false;
    pthread_mutex_unlock(&cl->mu);
    *key = k;
    return ok;
}

void climits_addr_release(climits *cl, uint64_t key)
{
    uint64_t v = 0;
    pthread_mutex_lock(&cl->mu);
    if (idmap_get(cl->per_addr, key, &v)) {
        if (v <= 1)
            idmap_del(cl->per_addr, key);
        else
            idmap_put(cl->per_addr, key, v - 1);
    }
    pthread_mutex_unlock(&cl->mu);
}

void climits_buffered(climits *cl, long long delta)
{
    atomic_fetch_add_explicit(&cl->buffered, delta, memory_order_relaxed);
}

bool climits_over(climits *cl)
{
    return cl->budget > 0 && atomic_load_explicit(&cl->buffered, memory_order_relaxed) > cl->budget;
}

bool climits_try_charge(climits *cl, size_t bytes, bool reserve)
{
    if (cl->budget <= 0) {
        atomic_fetch_add_explicit(&cl->buffered, (long long)bytes, memory_order_relaxed);
        return true;
    }
    long long limit = cl->budget + (reserve ? cl->budget / CLIMITS_RESERVE_DIV : 0);
    long long cur = atomic_load_explicit(&cl->buffered, memory_order_relaxed);
    do {
        if (cur + (long long)bytes > limit) {
            struct timespec ts;
            clock_gettime(CLOCK_MONOTONIC, &ts);
            atomic_store_explicit(&cl->refused_ms,
                                  (unsigned long long)ts.tv_sec * 1000u +
                                      (unsigned long long)ts.tv_nsec / 1000000u,
                                  memory_order_relaxed);
            return false;
        }
    } while (!atomic_compare_exchange_weak_explicit(&cl->buffered, &cur, cur + (long long)bytes,
                                                    memory_order_relaxed, memory_order_relaxed));
    return true;
}

bool climits_pressed(climits *cl, uint64_t now_ms)
{
    if (climits_over(cl))
        return true;
    unsigned long long at = atomic_load_explicit(&cl->refused_ms, memory_order_relaxed);
    return at != 0 && now_ms - at < CLIMITS_PRESSURE_MS;
}

size_t climits_budget(climits *cl)
{
    return cl->budget > 0 ? (size_t)cl->budget : 0;
}

size_t climits_buffered_total(climits *cl)
{
    long long b = atomic_load_explicit(&cl->buffered, memory_order_relaxed);
    return b > 0 ? (size_t)b : 0;
}

long climits_fit_descriptors(config *cfg, long reserve, char *msg, size_t msglen)
{
    msg[0] = '\0';
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
        return -errno;
    rlim_t before = rl.rlim_cur;
    if (rl.rlim_cur < rl.rlim_max) {
        rlim_t want = rl.rlim_max == RLIM_INFINITY ? 1048576 : rl.rlim_max;
        struct rlimit nr = {.rlim_cur = want, .rlim_max = rl.rlim_max};
        if (setrlimit(RLIMIT_NOFILE, &nr) == 0)
            rl.rlim_cur = want;
    }
    long limit = rl.rlim_cur == RLIM_INFINITY ? 1048576 : (long)rl.rlim_cur;
    long room = limit - reserve;
    if (room < 16)
        room = 16;
    size_t n = 0;
    if (rl.rlim_cur != before)
        n = (size_t)snprintf(msg, msglen, "descriptor limit raised from %llu to %ld",
                             (unsigned long long)before, limit);
    if (cfg->max_connections > room) {
        if (n < msglen)
            snprintf(msg + n, msglen - n,
                     "%smax_connections lowered from %d to %ld to leave %ld descriptors for the "
                     "database, snapshots and listeners (descriptor limit %ld)",
                     n ? "; " : "", cfg->max_connections, room, reserve, limit);
        cfg->max_connections = (int)room;
    }
    return limit;
}
