/* bench/engram_bench.c: engram-bench, the end-to-end benchmark of engramd over loopback.
 *
 * Creates (or reuses) tenants with the admin key, loads each with structured synthetic
 * memories through memory.store_batch (that load is the store_batch figure), computes the
 * exact ground truth of a query pool by brute force, then drives the chosen workload with
 * the asynchronous load generator at one or more concurrency levels and reports latency
 * percentiles, throughput, recall@k, the server's resident memory and CPU use: a table on
 * stdout, JSON with --json-out, PNG charts with --plot-prefix.
 *
 * --probe-ready is a separate mode for restart measurements: it waits for /healthz to
 * answer 200 and then until every tenant of the data set has answered a search, and
 * prints when each happened.
 *
 * Exit status: 0 success, 1 failure, 2 usage error.
 */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "dataset.h"
#include "hist.h"
#include "loadgen.h"
#include "report.h"
#include "scrape.h"
#include "tenants.h"
#include "workload.h"

#define MAX_LEVELS 32
#define NEW_POOL_MAX ((size_t)400 * 1024 * 1024) /* bytes of pre-generated new vectors */

typedef struct options {
    const char *host;
    unsigned port, http_port;
    const char *admin_key_file, *state_file, *prefix, *tier;
    const char *dataset, *text_dir, *index_engine; /* index_engine NULL: not sent */
    bool dim_given;
    const char *workload;
    double mix[WL_NOPS];
    size_t tenants, memories, dim, conns, depth, top_k, queries, batch;
    size_t inflight; /* 0, or requests in flight over all connections */
    size_t load_conns, load_depth;
    double duration, warmup, drain_timeout;
    uint64_t seed;
    size_t levels[MAX_LEVELS], nlevels;
    bool reuse, keep_stored, quiet;
    const char *json_out, *plot_prefix;
    long server_pid, pg_pid;
    double quiet_below, quiet_wait; /* wait for a quiet machine before each run */
    double probe_timeout;           /* > 0: --probe-ready mode */
} options;

static void usage(FILE *f)
{
    fprintf(f,
            "usage: engram-bench [OPTIONS]\n"
            "\n"
            "Drives engramd over MessagePack-RPC and reports latency, throughput and recall.\n"
            "\n"
            "server:\n"
            "  --host H                 RPC and HTTP host (127.0.0.1)\n"
            "  --port P                 RPC port (7420)\n"
            "  --http-port P            HTTP port for /metrics and /healthz (7421; 0: none)\n"
            "  --admin-key-file F       the admin key, to create tenants\n"
            "  --server-pid PID         engramd's pid, to report its CPU use\n"
            "  --pg-pid PID             the PostgreSQL postmaster's pid, to report the CPU use\n"
            "                           of it and its children\n"
            "  --wait-quiet PCT         before each run, wait until the machine's busy share of\n"
            "                           all cores (sampled over 1 s) is below PCT percent\n"
            "  --wait-quiet-max S       wait at most S seconds for that, then run anyway (300)\n"
            "data set:\n"
            "  --tenants N              tenants (1); connection c acts for tenant c mod N\n"
            "  --memories N             memories loaded per tenant (5000)\n"
            "  --dataset NAME           gaussian | anisotropic | spectral | relu | clustered |\n"
            "                           text (gaussian); see bench/README.md\n"
            "  --text-dir DIR           the text data set (bench/text-dataset.sh DIR; default\n"
            "                           $ENGRAM_TEXT_DATASET); text has its own dimension\n"
            "  --dim D                  embedding dimension of synthetic data sets (768)\n"
            "  --seed S                 data set and request seed (1)\n"
            "  --tier T                 tier of created tenants (premium)\n"
            "  --index-engine E         native | faiss: sent as index_engine when creating\n"
            "                           tenants (not sent unless given)\n"
            "  --batch-size B           memories per store_batch, loading and workload (1000)\n"
            "  --load-connections N     connections that load a tenant (2)\n"
            "  --load-depth N           batches in flight per loading connection (1)\n"
            "  --reuse                  reuse tenants of the same prefix, seed, memories and dim\n"
            "                           when the state file has their keys and they hold the\n"
            "                           data set; memories a run stores are deleted afterwards\n"
            "  --state-file F           tenant keys for --reuse (default engram-bench.state,\n"
            "                           or beside --json-out)\n"
            "  --tenant-prefix P        tenant name prefix (bench)\n"
            "  --keep-stored            with --reuse, keep the memories the run stored\n"
            "workload:\n"
            "  --workload W             search | search_text | context | store | store_batch |\n"
            "                           mixed | load (load only) (search)\n"
            "  --mix SPEC               for mixed: weights, e.g. search=80,store=15,context=5\n"
            "  --top-k K                results per search (10)\n"
            "  --queries Q              query pool per tenant with exact ground truth (1000)\n"
            "  --connections C          connections (1)\n"
            "  --depth D                requests in flight per connection (1)\n"
            "  --inflight N             at most N requests in flight over all connections, each\n"
            "                           free place going to the next connection in turn: with\n"
            "                           --connections = --tenants, N clients' load over many\n"
            "                           tenants (0: no bound)\n"
            "  --sweep-concurrency L    run at each number of connections in L (1,2,4,8,16)\n"
            "  --duration S             measured seconds per run (10)\n"
            "  --warmup S               unmeasured seconds before each run (2)\n"
            "  --drain-timeout S        wait for answers after a run (30)\n"
            "output:\n"
            "  --json-out F             write the results as JSON\n"
            "  --plot-prefix P          draw P-latency.png (and P-throughput.png for a sweep)\n"
            "  --quiet                  no progress messages on stderr\n"
            "other modes:\n"
            "  --probe-ready S          wait up to S seconds for /healthz 200, then until every\n"
            "                           tenant of the data set named by the options (--tenants,\n"
            "                           keys from the state file) has answered a search; print\n"
            "                           JSON {healthz_unix_ns, first_search_unix_ns,\n"
            "                           all_tenants_unix_ns, tenants}\n");
}

static bool quiet;

static void progress(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static void progress(const char *fmt, ...)
{
    if (quiet)
        return;
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "engram-bench: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
}

static uint64_t unix_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

/* ---- option parsing -------------------------------------------------------------------- */

static bool parse_size(const char *s, size_t lo, size_t hi, size_t *out)
{
    char *e;
    errno = 0;
    unsigned long long v = strtoull(s, &e, 10);
    if (errno || e == s || *e || s[0] == '-' || v < lo || v > hi)
        return false;
    *out = (size_t)v;
    return true;
}

static bool parse_double(const char *s, double lo, double hi, double *out)
{
    char *e;
    errno = 0;
    double v = strtod(s, &e);
    if (errno || e == s || *e || !(v >= lo && v <= hi))
        return false;
    *out = v;
    return true;
}

static bool parse_mix(const char *s, double *mix)
{
    for (int op = 0; op < WL_NOPS; op++)
        mix[op] = 0;
    while (*s) {
        const char *eq = strchr(s, '=');
        if (!eq)
            return false;
        int op = workload_op_parse(s, (size_t)(eq - s));
        if (op < 0 || op == WL_LOAD)
            return false;
        char *e;
        double w = strtod(eq + 1, &e);
        if (e == eq + 1 || !(w >= 0 && w <= 1e6) || (*e && *e != ','))
            return false;
        mix[op] = w;
        s = *e ? e + 1 : e;
    }
    double total = 0;
    for (int op = 0; op < WL_NOPS; op++)
        total += mix[op];
    return total > 0;
}

static bool parse_levels(const char *s, options *o)
{
    o->nlevels = 0;
    while (*s) {
        char *e;
        unsigned long v = strtoul(s, &e, 10);
        if (e == s || v < 1 || v > 4096 || (*e && *e != ',') || o->nlevels == MAX_LEVELS)
            return false;
        o->levels[o->nlevels++] = v;
        s = *e ? e + 1 : e;
    }
    return o->nlevels > 0;
}

enum {
    O_HOST = 256,
    O_PORT,
    O_HTTP_PORT,
    O_ADMIN_KEY_FILE,
    O_SERVER_PID,
    O_PG_PID,
    O_QUIET_BELOW,
    O_QUIET_WAIT,
    O_TENANTS,
    O_MEMORIES,
    O_DIM,
    O_DATASET,
    O_TEXT_DIR,
    O_INDEX_ENGINE,
    O_SEED,
    O_TIER,
    O_BATCH,
    O_LOAD_CONNS,
    O_LOAD_DEPTH,
    O_REUSE,
    O_STATE_FILE,
    O_PREFIX,
    O_KEEP_STORED,
    O_WORKLOAD,
    O_MIX,
    O_TOP_K,
    O_QUERIES,
    O_CONNS,
    O_DEPTH,
    O_INFLIGHT,
    O_SWEEP,
    O_DURATION,
    O_WARMUP,
    O_DRAIN,
    O_JSON_OUT,
    O_PLOT_PREFIX,
    O_QUIET,
    O_PROBE,
    O_HELP,
};

static const struct option long_opts[] = {
    {"host", required_argument, NULL, O_HOST},
    {"port", required_argument, NULL, O_PORT},
    {"http-port", required_argument, NULL, O_HTTP_PORT},
    {"admin-key-file", required_argument, NULL, O_ADMIN_KEY_FILE},
    {"server-pid", required_argument, NULL, O_SERVER_PID},
    {"pg-pid", required_argument, NULL, O_PG_PID},
    {"wait-quiet", required_argument, NULL, O_QUIET_BELOW},
    {"wait-quiet-max", required_argument, NULL, O_QUIET_WAIT},
    {"tenants", required_argument, NULL, O_TENANTS},
    {"memories", required_argument, NULL, O_MEMORIES},
    {"dim", required_argument, NULL, O_DIM},
    {"dataset", required_argument, NULL, O_DATASET},
    {"text-dir", required_argument, NULL, O_TEXT_DIR},
    {"index-engine", required_argument, NULL, O_INDEX_ENGINE},
    {"seed", required_argument, NULL, O_SEED},
    {"tier", required_argument, NULL, O_TIER},
    {"batch-size", required_argument, NULL, O_BATCH},
    {"load-connections", required_argument, NULL, O_LOAD_CONNS},
    {"load-depth", required_argument, NULL, O_LOAD_DEPTH},
    {"reuse", no_argument, NULL, O_REUSE},
    {"state-file", required_argument, NULL, O_STATE_FILE},
    {"tenant-prefix", required_argument, NULL, O_PREFIX},
    {"keep-stored", no_argument, NULL, O_KEEP_STORED},
    {"workload", required_argument, NULL, O_WORKLOAD},
    {"mix", required_argument, NULL, O_MIX},
    {"top-k", required_argument, NULL, O_TOP_K},
    {"queries", required_argument, NULL, O_QUERIES},
    {"connections", required_argument, NULL, O_CONNS},
    {"concurrency", required_argument, NULL, O_CONNS},
    {"depth", required_argument, NULL, O_DEPTH},
    {"inflight", required_argument, NULL, O_INFLIGHT},
    {"sweep-concurrency", required_argument, NULL, O_SWEEP},
    {"duration", required_argument, NULL, O_DURATION},
    {"warmup", required_argument, NULL, O_WARMUP},
    {"drain-timeout", required_argument, NULL, O_DRAIN},
    {"json-out", required_argument, NULL, O_JSON_OUT},
    {"plot-prefix", required_argument, NULL, O_PLOT_PREFIX},
    {"quiet", no_argument, NULL, O_QUIET},
    {"probe-ready", required_argument, NULL, O_PROBE},
    {"help", no_argument, NULL, O_HELP},
    {NULL, 0, NULL, 0},
};

/* Returns 0, 1 for --help, or 2 after printing a usage error. */
static int parse_args(int argc, char **argv, options *o)
{
    *o = (options){.host = "127.0.0.1",
                   .port = 7420,
                   .http_port = 7421,
                   .prefix = "bench",
                   .tier = "premium",
                   .dataset = "gaussian",
                   .workload = "search",
                   .tenants = 1,
                   .memories = 5000,
                   .dim = 768,
                   .conns = 1,
                   .depth = 1,
                   .top_k = 10,
                   .queries = 1000,
                   .batch = 1000,
                   .load_conns = 2,
                   .load_depth = 1,
                   .duration = 10,
                   .warmup = 2,
                   .drain_timeout = 30,
                   .seed = 1,
                   .server_pid = -1,
                   .pg_pid = -1,
                   .quiet_below = 0,
                   .quiet_wait = 300};
    bool mix_given = false;
    static char state_buf[4096];
    size_t v;
    int c, li = -1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "h", long_opts, &li)) != -1) {
        bool ok = true;
        switch (c) {
        case O_HOST:
            o->host = optarg;
            break;
        case O_PORT:
            ok = parse_size(optarg, 1, 65535, &v);
            o->port = (unsigned)v;
            break;
        case O_HTTP_PORT:
            ok = parse_size(optarg, 0, 65535, &v);
            o->http_port = (unsigned)v;
            break;
        case O_ADMIN_KEY_FILE:
            o->admin_key_file = optarg;
            break;
        case O_SERVER_PID:
            ok = parse_size(optarg, 1, 1 << 30, &v);
            o->server_pid = (long)v;
            break;
        case O_PG_PID:
            ok = parse_size(optarg, 1, 1 << 30, &v);
            o->pg_pid = (long)v;
            break;
        case O_QUIET_BELOW:
            ok = parse_double(optarg, 1, 100, &o->quiet_below);
            break;
        case O_QUIET_WAIT:
            ok = parse_double(optarg, 0, 86400, &o->quiet_wait);
            break;
        case O_TENANTS:
            ok = parse_size(optarg, 1, 4096, &o->tenants);
            break;
        case O_MEMORIES:
            ok = parse_size(optarg, 0, 100000000, &o->memories);
            break;
        case O_DIM:
            ok = parse_size(optarg, 8, 4096, &o->dim);
            o->dim_given = true;
            break;
        case O_DATASET: {
            dataset_kind k;
            ok = dataset_kind_parse(optarg, &k) == 0;
            o->dataset = optarg;
            break;
        }
        case O_TEXT_DIR:
            o->text_dir = optarg;
            break;
        case O_INDEX_ENGINE:
            ok = strcmp(optarg, "native") == 0 || strcmp(optarg, "faiss") == 0;
            o->index_engine = optarg;
            break;
        case O_SEED:
            ok = parse_size(optarg, 0, SIZE_MAX, &v);
            o->seed = v;
            break;
        case O_TIER:
            o->tier = optarg;
            break;
        case O_BATCH:
            ok = parse_size(optarg, 1, 1000, &o->batch);
            break;
        case O_LOAD_CONNS:
            ok = parse_size(optarg, 1, 64, &o->load_conns);
            break;
        case O_LOAD_DEPTH:
            ok = parse_size(optarg, 1, 16, &o->load_depth);
            break;
        case O_REUSE:
            o->reuse = true;
            break;
        case O_STATE_FILE:
            o->state_file = optarg;
            break;
        case O_PREFIX:
            o->prefix = optarg;
            ok = optarg[0] && strlen(optarg) < 48 && !strpbrk(optarg, " \t\r\n");
            break;
        case O_KEEP_STORED:
            o->keep_stored = true;
            break;
        case O_WORKLOAD:
            o->workload = optarg;
            break;
        case O_MIX:
            ok = parse_mix(optarg, o->mix);
            mix_given = true;
            break;
        case O_TOP_K:
            ok = parse_size(optarg, 1, 1000, &o->top_k);
            break;
        case O_QUERIES:
            ok = parse_size(optarg, 1, 1000000, &o->queries);
            break;
        case O_CONNS:
            ok = parse_size(optarg, 1, 4096, &o->conns);
            break;
        case O_DEPTH:
            ok = parse_size(optarg, 1, LOADGEN_MAX_DEPTH, &o->depth);
            break;
        case O_INFLIGHT:
            ok = parse_size(optarg, 0, 1000000, &o->inflight);
            break;
        case O_SWEEP:
            ok = parse_levels(optarg, o);
            break;
        case O_DURATION:
            ok = parse_double(optarg, 0.1, 86400, &o->duration);
            break;
        case O_WARMUP:
            ok = parse_double(optarg, 0, 3600, &o->warmup);
            break;
        case O_DRAIN:
            ok = parse_double(optarg, 0.1, 3600, &o->drain_timeout);
            break;
        case O_JSON_OUT:
            o->json_out = optarg;
            break;
        case O_PLOT_PREFIX:
            o->plot_prefix = optarg;
            break;
        case O_QUIET:
            o->quiet = true;
            break;
        case O_PROBE:
            ok = parse_double(optarg, 0.1, 3600, &o->probe_timeout);
            break;
        case 'h':
        case O_HELP:
            usage(stdout);
            return 1;
        default:
            fprintf(stderr, "engram-bench: unknown option or missing value: %s\n",
                    argv[optind - 1]);
            return 2;
        }
        if (!ok) {
            fprintf(stderr, "engram-bench: bad value for --%s: %s\n",
                    li >= 0 ? long_opts[li].name : "?", optarg ? optarg : "");
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "engram-bench: unexpected argument %s\n", argv[optind]);
        return 2;
    }
    int op = workload_op_parse(o->workload, strlen(o->workload));
    if (strcmp(o->workload, "mixed") == 0) {
        if (!mix_given) {
            fprintf(stderr, "engram-bench: --workload mixed needs --mix\n");
            return 2;
        }
    } else if (op == WL_LOAD) {
        for (int k = 0; k < WL_NOPS; k++)
            o->mix[k] = 0;
    } else if (op >= 0) {
        if (mix_given) {
            fprintf(stderr, "engram-bench: --mix goes with --workload mixed\n");
            return 2;
        }
        for (int k = 0; k < WL_NOPS; k++)
            o->mix[k] = k == op ? 1 : 0;
    } else {
        fprintf(stderr, "engram-bench: unknown workload %s\n", o->workload);
        return 2;
    }
    bool vector_ops = o->mix[WL_SEARCH] > 0 || o->mix[WL_CONTEXT] > 0;
    bool needs_data = vector_ops || o->mix[WL_SEARCH_TEXT] > 0;
    if (needs_data && o->memories < o->top_k) {
        fprintf(stderr, "engram-bench: --memories must be at least --top-k for searches\n");
        return 2;
    }
    if (!o->state_file) {
        if (o->json_out) {
            snprintf(state_buf, sizeof(state_buf), "%s", o->json_out);
            char *slash = strrchr(state_buf, '/');
            if (slash)
                snprintf(slash + 1, sizeof(state_buf) - (size_t)(slash + 1 - state_buf),
                         "engram-bench.state");
            else
                snprintf(state_buf, sizeof(state_buf), "engram-bench.state");
            o->state_file = state_buf;
        } else {
            o->state_file = "engram-bench.state";
        }
    }
    if (o->nlevels == 0) {
        o->levels[0] = o->conns;
        o->nlevels = 1;
    }
    quiet = o->quiet;
    return 0;
}

/* ---- CPU accounting -------------------------------------------------------------------- */

typedef struct cpu_snap {
    uint64_t t_ns;
    unsigned long long busy, total; /* /proc/stat jiffies of all cores */
    double self_s, server_s;        /* CPU seconds of this process and of --server-pid */
    double pg_s;                    /* CPU seconds of every process named postgres */
} cpu_snap;

static void read_proc_stat(unsigned long long *busy, unsigned long long *total)
{
    *busy = *total = 0;
    FILE *f = fopen("/proc/stat", "r");
    if (!f)
        return;
    unsigned long long v[10] = {0};
    if (fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2],
               &v[3], &v[4], &v[5], &v[6], &v[7], &v[8], &v[9]) >= 8) {
        for (int i = 0; i < 8; i++)
            *total += v[i];
        *busy = *total - v[3] - v[4]; /* minus idle and iowait */
    }
    fclose(f);
}

/* CPU seconds (user + system) of pid from /proc/<pid>/stat, and its parent in *ppid (may
 * be NULL); with children, plus the CPU of its children that have exited and been waited
 * for. -1 if unreadable. */
static double proc_cpu_s(long pid, long *ppid, bool children)
{
    char path[64];
    snprintf(path, sizeof(path), "/proc/%ld/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    char buf[1024];
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    char *p = strrchr(buf, ')');
    if (!p)
        return -1;
    long parent = 0, cut = 0, cst = 0;
    unsigned long long ut = 0, st = 0;
    /* after ") ": state (field 3), ppid (4), then 5..13, utime 14, stime 15, cutime 16,
     * cstime 17 */
    if (sscanf(p + 2, "%*c %ld %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu %ld %ld", &parent, &ut,
               &st, &cut, &cst) != 5)
        return -1;
    if (ppid)
        *ppid = parent;
    double ticks = (double)(ut + st);
    if (children && cut > 0 && cst >= 0)
        ticks += (double)(cut + cst);
    return ticks / (double)sysconf(_SC_CLK_TCK);
}

/* CPU seconds of the PostgreSQL postmaster pg_pid and its children: the live ones
 * (backends, writers) and, through the postmaster's children times, those that exited
 * (parallel query workers, autovacuum workers, ended sessions). */
static double postgres_cpu_s(long pg_pid)
{
    if (pg_pid <= 0)
        return -1;
    double sum = proc_cpu_s(pg_pid, NULL, true);
    if (sum < 0)
        return -1;
    DIR *d = opendir("/proc");
    if (!d)
        return -1;
    struct dirent *e;
    while ((e = readdir(d))) {
        char *end;
        long pid = strtol(e->d_name, &end, 10), parent = 0;
        if (*end || pid <= 0 || pid == pg_pid)
            continue;
        double c = proc_cpu_s(pid, &parent, false);
        if (c > 0 && parent == pg_pid)
            sum += c;
    }
    closedir(d);
    return sum;
}

static void cpu_take(cpu_snap *s, long server_pid, long pg_pid)
{
    s->t_ns = loadgen_now_ns();
    read_proc_stat(&s->busy, &s->total);
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    s->self_s = (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 +
                (double)ru.ru_stime.tv_sec + ru.ru_stime.tv_usec / 1e6;
    s->server_s = server_pid > 0 ? proc_cpu_s(server_pid, NULL, false) : -1;
    s->pg_s = postgres_cpu_s(pg_pid);
}

/* The busy share of all cores over a second with nothing of ours running: other work on
 * the machine that the run will compete with. With o->quiet_below set, samples until the
 * share is below it or o->quiet_wait seconds have passed, and returns the last sample. */
static double background_busy(const options *o)
{
    uint64_t deadline = loadgen_now_ns() + (uint64_t)(o->quiet_wait * 1e9);
    bool told = false;
    for (;;) {
        unsigned long long b0, t0, b1, t1;
        read_proc_stat(&b0, &t0);
        const struct timespec second = {1, 0};
        nanosleep(&second, NULL);
        read_proc_stat(&b1, &t1);
        double busy = t1 > t0 ? (double)(b1 - b0) / (double)(t1 - t0) : -1;
        if (o->quiet_below <= 0 || busy < 0 || busy * 100 < o->quiet_below ||
            loadgen_now_ns() >= deadline) {
            if (told)
                progress("machine %.0f%% busy: running", busy * 100);
            return busy;
        }
        if (!told)
            progress("machine %.0f%% busy before the run: waiting for below %.0f%% (at most "
                     "%.0f s)",
                     busy * 100, o->quiet_below, o->quiet_wait);
        told = true;
    }
}

/* ---- a run ----------------------------------------------------------------------------- */

typedef struct run_ctx {
    const options *o;
    report_run *rr;
    cpu_snap c0, c1;
} run_ctx;

static void on_window(void *ud, bool start)
{
    run_ctx *x = ud;
    if (start) {
        if (x->o->http_port)
            scrape_metrics(x->o->host, (uint16_t)x->o->http_port, &x->rr->before);
        cpu_take(&x->c0, x->o->server_pid, x->o->pg_pid);
    } else {
        cpu_take(&x->c1, x->o->server_pid, x->o->pg_pid);
    }
}

/* The workload's window callback is ours; the rest go to the workload. */
typedef struct wl_ud {
    workload *w;
    run_ctx *x;
} wl_ud;

static int ud_next(void *ud, size_t conn, uint32_t msgid, msgpack_packer *pk, loadgen_req *req)
{
    return workload_next(((wl_ud *)ud)->w, conn, msgid, pk, req);
}

static int ud_done(void *ud, size_t conn, const loadgen_req *req, const rpc_response *resp,
                   bool measured)
{
    return workload_done(((wl_ud *)ud)->w, conn, req, resp, measured);
}

static void ud_window(void *ud, bool start)
{
    on_window(((wl_ud *)ud)->x, start);
}

static void fill_cpu(report_run *rr, const cpu_snap *a, const cpu_snap *b)
{
    rr->ncpu = (unsigned)sysconf(_SC_NPROCESSORS_ONLN);
    double wall = (double)(b->t_ns - a->t_ns) / 1e9;
    rr->machine_busy =
        b->total > a->total ? (double)(b->busy - a->busy) / (double)(b->total - a->total) : -1;
    rr->client_cores = wall > 0 ? (b->self_s - a->self_s) / wall : -1;
    rr->server_cores = (wall > 0 && a->server_s >= 0 && b->server_s >= 0)
                           ? (b->server_s - a->server_s) / wall
                           : -1;
    rr->pg_cores = (wall > 0 && a->pg_s >= 0 && b->pg_s >= 0) ? (b->pg_s - a->pg_s) / wall : -1;
}

/* ---- probe mode ------------------------------------------------------------------------ */

/* Probes the tenants of the data set ds (only read). */
static int probe_ready(const options *o, const dataset *ds)
{
    uint64_t t0 = loadgen_now_ns();
    uint64_t deadline = t0 + (uint64_t)(o->probe_timeout * 1e9);
    tenants_conf tc = {.prefix = o->prefix,
                       .seed = o->seed,
                       .memories = o->memories,
                       .dim = o->dim,
                       .dataset = o->dataset,
                       .index_engine = o->index_engine};
    size_t nt = o->tenants > 0 ? (size_t)o->tenants : 1;
    char(*keys)[TENANTS_KEY_MAX] = calloc(nt, sizeof(*keys));
    float *q = malloc(o->dim * sizeof(float));
    int rc = 1;
    if (!keys || !q || dataset_queries(ds, 0, 0, 1, q) != 0) {
        fprintf(stderr, "engram-bench: out of memory\n");
        goto out;
    }
    for (size_t i = 0; i < nt; i++) {
        char name[TENANTS_NAME_MAX];
        tenants_name(&tc, "", i, name);
        if (tenants_lookup_key(o->state_file, name, keys[i]) != 0) {
            fprintf(stderr, "engram-bench: no key for tenant %s in %s\n", name, o->state_file);
            goto out;
        }
    }
    const struct timespec pause = {0, 5000000};
    uint64_t healthz = 0, first = 0, all = 0;
    while (loadgen_now_ns() < deadline) {
        int status = 0;
        char *body = NULL;
        int grc = scrape_get(o->host, (uint16_t)o->http_port, "/healthz", 1000, &status, &body);
        free(body);
        if (grc == 0 && status == 200) {
            healthz = unix_ns();
            break;
        }
        nanosleep(&pause, NULL);
    }
    if (!healthz) {
        fprintf(stderr, "engram-bench: /healthz did not answer 200 within %.1f s\n",
                o->probe_timeout);
        goto out;
    }
    /* serving means every tenant answers a search: each in turn, retried until it does */
    char err[256] = "";
    for (size_t i = 0; i < nt; i++) {
        bool ok = false;
        while (!ok && loadgen_now_ns() < deadline) {
            int left = (int)((deadline - loadgen_now_ns()) / 1000000) + 1;
            ok = tenants_probe_search(o->host, (uint16_t)o->port, keys[i], q, o->dim, left, err,
                                      sizeof(err)) == 0;
            if (!ok)
                nanosleep(&pause, NULL);
        }
        if (!ok) {
            fprintf(stderr, "engram-bench: tenant %zu answered no search within %.1f s: %s\n", i,
                    o->probe_timeout, err);
            goto out;
        }
        if (i == 0)
            first = unix_ns();
    }
    all = unix_ns();
    printf("{\"healthz_unix_ns\": %llu, \"first_search_unix_ns\": %llu, "
           "\"all_tenants_unix_ns\": %llu, \"tenants\": %zu}\n",
           (unsigned long long)healthz, (unsigned long long)first, (unsigned long long)all, nt);
    rc = 0;
out:
    if (keys)
        memset(keys, 0, nt * sizeof(*keys));
    free(keys);
    free(q);
    return rc;
}

/* ---- main flow ------------------------------------------------------------------------- */

/* Opens the data set o names into *ds and fits o to it: the text data set has its own
 * dimension and a fixed number of memories and queries. Returns 0, or an exit status after
 * a message. */
static int open_dataset(options *o, dataset **ds)
{
    char err[512] = "";
    int rc = dataset_open(o->dataset, o->seed, o->dim, o->text_dir, ds, err, sizeof(err));
    if (rc != 0) {
        fprintf(stderr, "engram-bench: data set %s: %s\n", o->dataset, err);
        return rc == -ENOMEM ? 1 : 2;
    }
    if (dataset_dim(*ds) != o->dim) {
        if (o->dim_given)
            progress("the %s data set has %zu dimensions: --dim %zu does not apply", o->dataset,
                     dataset_dim(*ds), o->dim);
        o->dim = dataset_dim(*ds);
    }
    if (o->memories > dataset_size(*ds)) {
        fprintf(stderr, "engram-bench: the %s data set has %zu memories; --memories %zu is more\n",
                o->dataset, dataset_size(*ds), o->memories);
        dataset_destroy(*ds);
        *ds = NULL;
        return 2;
    }
    if (o->queries > dataset_query_size(*ds)) {
        progress("the %s data set has %zu queries: --queries %zu cut to that", o->dataset,
                 dataset_query_size(*ds), o->queries);
        o->queries = dataset_query_size(*ds);
    }
    return 0;
}

typedef struct bench {
    options o;
    dataset *ds;
    tenant_info *ti;
    uint64_t *tids;
    float *queries;       /* tenants x queries x dim */
    dataset_truth *truth; /* tenants, or NULL */
    report_load load;
    double mean_cosine; /* of tenant 0's first memories; NAN when not measured */
    report_run *runs;
    size_t nruns;
    scrape_sample final;
} bench;

/* Loads tenant i from its generated vectors (and computes its ground truth from them). */
static int load_tenant(bench *b, size_t i)
{
    const options *o = &b->o;
    size_t dim = o->dim, n = o->memories;
    float *vec = malloc((n ? n : 1) * dim * sizeof(float));
    const char **keys = calloc(o->load_conns, sizeof(*keys));
    workload *w = NULL;
    int rc = -ENOMEM;
    if (!vec || !keys)
        goto out;
    progress("tenant %s: generating %zu memories", b->ti[i].name, n);
    if ((rc = dataset_vectors(b->ds, b->tids[i], 0, n, vec)) != 0)
        goto out;
    if (b->truth) {
        progress("tenant %s: exact ground truth of %zu queries", b->ti[i].name, o->queries);
        rc = dataset_truth_init(&b->truth[i], b->ds, b->tids[i], n,
                                b->queries + i * o->queries * dim, o->queries, o->top_k, vec);
        if (rc != 0)
            goto out;
    }
    workload_conf wc = {.ds = b->ds,
                        .seed = o->seed,
                        .ntenants = 1,
                        .tenant_ids = &b->tids[i],
                        .memories = 0,
                        .top_k = o->top_k,
                        .batch = o->batch};
    w = workload_create(&wc);
    rc = -ENOMEM;
    if (!w || workload_prepare_load(w, 0, 0, n, vec) != 0 ||
        workload_reset_stats(w, o->load_conns, 0))
        goto out;
    free(vec);
    vec = NULL;
    for (size_t c = 0; c < o->load_conns; c++)
        keys[c] = b->ti[i].key;
    progress("tenant %s: loading %zu memories with store_batch", b->ti[i].name, n);
    wl_ud ud = {w, NULL};
    loadgen_conf lc = {.host = o->host,
                       .port = (uint16_t)o->port,
                       .conns = o->load_conns,
                       .depth = o->load_depth,
                       .keys = keys,
                       .duration_s = 0,
                       .drain_timeout_s = o->drain_timeout,
                       .nops = WL_NOPS,
                       .next = ud_next,
                       .done = ud_done,
                       .ud = &ud};
    loadgen_result lr;
    char err[256] = "";
    rc = loadgen_run(&lc, &lr, err, sizeof(err));
    if (rc != 0) {
        fprintf(stderr, "engram-bench: loading %s: %s\n", b->ti[i].name, err);
        rc = 1;
        goto out;
    }
    const loadgen_opstats *s = &lr.ops[WL_LOAD];
    hist_merge(b->load.lat, s->lat);
    b->load.memories += workload_stats(w, WL_LOAD)->memories;
    b->load.seconds += lr.window_s;
    b->load.batches += s->ok + s->errors;
    b->load.errors += s->errors + lr.unanswered;
    b->load.tenants_loaded++;
    progress("tenant %s: %llu memories in %.2f s (%.0f/s), %llu batch error(s)", b->ti[i].name,
             (unsigned long long)workload_stats(w, WL_LOAD)->memories, lr.window_s,
             lr.window_s > 0 ? (double)workload_stats(w, WL_LOAD)->memories / lr.window_s : 0,
             (unsigned long long)(s->errors + lr.unanswered));
    for (int e = 1; e < LOADGEN_NERR; e++)
        if (s->err_by[e])
            fprintf(stderr, "engram-bench: load errors %s: %llu\n", loadgen_err_name(e),
                    (unsigned long long)s->err_by[e]);
    rc = (s->errors || lr.unanswered) ? 1 : 0;
    loadgen_result_fini(&lr);
out:
    workload_destroy(w);
    free(vec);
    free(keys);
    return rc;
}

static int setup_data(bench *b)
{
    const options *o = &b->o;
    bool vector_ops = o->mix[WL_SEARCH] > 0 || o->mix[WL_CONTEXT] > 0;
    tenants_conf tc = {.host = o->host,
                       .port = (uint16_t)o->port,
                       .admin_key_file = o->admin_key_file,
                       .state_file = o->state_file,
                       .prefix = o->prefix,
                       .tier = o->tier,
                       .seed = o->seed,
                       .memories = o->memories,
                       .dim = o->dim,
                       .dataset = o->dataset,
                       .index_engine = o->index_engine,
                       .reuse = o->reuse};
    char err[512] = "";
    if (tenants_prepare(&tc, 0, o->tenants, b->ti, err, sizeof(err)) != 0) {
        fprintf(stderr, "engram-bench: %s\n", err);
        return 1;
    }
    for (size_t i = 0; i < o->tenants; i++)
        b->tids[i] = i;
    b->mean_cosine = NAN;
    if (o->memories >= 2) { /* the data set's shape, for the report: a sample of 20,000 */
        size_t m = o->memories < 20000 ? o->memories : 20000;
        float *x = malloc(m * o->dim * sizeof(float));
        if (!x || dataset_vectors(b->ds, b->tids[0], 0, m, x) != 0) {
            free(x);
            return -ENOMEM;
        }
        b->mean_cosine = dataset_mean_cosine(x, m, o->dim);
        free(x);
        progress("data set %s: mean pairwise cosine %.3f (first %zu memories)", o->dataset,
                 b->mean_cosine, m);
    }
    if (vector_ops) {
        b->queries = malloc(o->tenants * o->queries * o->dim * sizeof(float));
        b->truth = calloc(o->tenants, sizeof(*b->truth));
        if (!b->queries || !b->truth)
            return -ENOMEM;
        for (size_t i = 0; i < o->tenants; i++)
            if (dataset_queries(b->ds, b->tids[i], 0, o->queries,
                                b->queries + i * o->queries * o->dim) != 0)
                return -ENOMEM;
    }
    b->load.conns = o->load_conns;
    b->load.depth = o->load_depth;
    bool all_ok = true;
    for (size_t i = 0; i < o->tenants; i++) {
        if (b->ti[i].need_load && o->memories > 0) {
            int rc = load_tenant(b, i);
            if (rc != 0)
                return rc;
            uint64_t total = 0;
            if (tenants_count(o->host, (uint16_t)o->port, b->ti[i].key, &total, err, sizeof(err)) !=
                    0 ||
                total != o->memories) {
                fprintf(stderr, "engram-bench: tenant %s holds %llu memories after loading %zu\n",
                        b->ti[i].name, (unsigned long long)total, o->memories);
                all_ok = false;
            }
        } else {
            if (!b->ti[i].need_load)
                b->load.tenants_reused++;
            if (b->truth && o->memories > 0) {
                progress("tenant %s: reused; exact ground truth of %zu queries", b->ti[i].name,
                         o->queries);
                int rc = dataset_truth_init(&b->truth[i], b->ds, b->tids[i], o->memories,
                                            b->queries + i * o->queries * o->dim, o->queries,
                                            o->top_k, NULL);
                if (rc != 0)
                    return rc;
            }
        }
    }
    /* measure settled indexes: loaded (a search loads one), recall measured, and a faiss
     * tenant's FAISS index built */
    for (size_t i = 0; i < o->tenants && all_ok && o->memories > 0 && b->queries; i++) {
        char desc[160];
        if (tenants_probe_search(o->host, (uint16_t)o->port, b->ti[i].key,
                                 b->queries + i * o->queries * o->dim, o->dim, 60000, err,
                                 sizeof(err)) != 0 ||
            tenants_settle(o->host, (uint16_t)o->port, b->ti[i].key, 600, desc, sizeof(desc), err,
                           sizeof(err)) != 0) {
            fprintf(stderr, "engram-bench: tenant %s: %s\n", b->ti[i].name, err);
            all_ok = false;
            break;
        }
        progress("tenant %s: %s", b->ti[i].name, desc);
    }
    b->load.verified = all_ok && b->load.tenants_loaded > 0;
    return all_ok ? 0 : 1;
}

static int run_levels(bench *b)
{
    const options *o = &b->o;
    workload_conf wc = {.ds = b->ds,
                        .seed = o->seed,
                        .ntenants = o->tenants,
                        .tenant_ids = b->tids,
                        .memories = o->memories,
                        .top_k = o->top_k,
                        .batch = o->batch,
                        .queries = b->queries,
                        .nq = o->queries,
                        .truth = b->truth,
                        .keep_ids = o->reuse && !o->keep_stored};
    memcpy(wc.mix, o->mix, sizeof(wc.mix));
    workload *w = workload_create(&wc);
    if (!w)
        return -ENOMEM;
    int rc = 0;
    for (size_t l = 0; l < o->nlevels && rc == 0; l++) {
        size_t conns = o->levels[l];
        report_run *rr = &b->runs[b->nruns];
        memset(rr, 0, sizeof(*rr));
        rr->conns = conns;
        rr->depth = o->depth;
        rr->machine_busy = rr->client_cores = rr->server_cores = rr->pg_cores = -1;
        /* Pre-generate the new memories the store ops will probably need: a generous guess
         * of 20,000 memories/s for the whole run, bounded in bytes. */
        double store_share = 0, total = 0;
        for (int op = 0; op < WL_NOPS; op++)
            total += o->mix[op];
        store_share = (o->mix[WL_STORE] + o->mix[WL_STORE_BATCH] * (double)o->batch) / total;
        if (store_share > 0) {
            double want = 20000.0 * (o->duration + o->warmup) * (store_share > 1 ? 1 : store_share);
            size_t cap = NEW_POOL_MAX / (o->dim * sizeof(float)) / o->tenants;
            size_t per = (size_t)(want / (double)o->tenants) + o->batch * o->depth * conns;
            if (per > cap)
                per = cap;
            progress("pre-generating %zu new memories per tenant", per);
            if ((rc = workload_prepare_new(w, per)) != 0)
                break;
        }
        if ((rc = workload_reset_stats(w, conns, l + 1)) != 0)
            break;
        rr->background_busy = background_busy(o);
        const char **keys = calloc(conns, sizeof(*keys));
        if (!keys) {
            rc = -ENOMEM;
            break;
        }
        for (size_t c = 0; c < conns; c++)
            keys[c] = b->ti[c % o->tenants].key;
        run_ctx x = {.o = o, .rr = rr};
        wl_ud ud = {w, &x};
        loadgen_conf lc = {.host = o->host,
                           .port = (uint16_t)o->port,
                           .conns = conns,
                           .depth = o->depth,
                           .max_inflight = o->inflight,
                           .keys = keys,
                           .warmup_s = o->warmup,
                           .duration_s = o->duration,
                           .drain_timeout_s = o->drain_timeout,
                           .nops = WL_NOPS,
                           .next = ud_next,
                           .done = ud_done,
                           .window = ud_window,
                           .ud = &ud};
        progress("run: %s, %zu connection(s) x depth %zu, %.1f s warm-up + %.1f s", o->workload,
                 conns, o->depth, o->warmup, o->duration);
        char err[256] = "";
        int lrc = loadgen_run(&lc, &rr->lr, err, sizeof(err));
        free(keys);
        if (lrc != 0) {
            fprintf(stderr, "engram-bench: run failed: %s\n", err);
            rc = 1;
            break;
        }
        if (o->http_port)
            scrape_metrics(o->host, (uint16_t)o->http_port, &rr->after);
        fill_cpu(rr, &x.c0, &x.c1);
        for (int op = 0; op < WL_NOPS; op++)
            rr->wst[op] = *workload_stats(w, op);
        b->nruns++;
    }
    /* put the reused data set back as it was: delete what the runs stored */
    if (wc.keep_ids) {
        for (size_t i = 0; i < o->tenants; i++) {
            size_t n = 0;
            const uint64_t *ids = workload_kept_ids(w, i, &n);
            if (n == 0)
                continue;
            progress("tenant %s: deleting the %zu memories the run stored", b->ti[i].name, n);
            char err[256];
            if (tenants_delete(o->host, (uint16_t)o->port, b->ti[i].key, ids, n, err,
                               sizeof(err)) != 0) {
                fprintf(stderr, "engram-bench: cleanup of %s: %s\n", b->ti[i].name, err);
                if (rc == 0)
                    rc = 1;
            }
        }
        workload_clear_kept_ids(w);
    }
    workload_destroy(w);
    return rc;
}

int main(int argc, char **argv)
{
    bench b;
    memset(&b, 0, sizeof(b));
    int prc = parse_args(argc, argv, &b.o);
    if (prc == 1)
        return 0;
    if (prc != 0) {
        fprintf(stderr, "try engram-bench --help\n");
        return 2;
    }
    int rc = open_dataset(&b.o, &b.ds);
    if (rc != 0)
        return rc;
    const options *o = &b.o;
    if (o->probe_timeout > 0) {
        rc = probe_ready(o, b.ds);
        dataset_destroy(b.ds);
        return rc;
    }

    rc = 1;
    b.ti = calloc(o->tenants, sizeof(*b.ti));
    b.tids = calloc(o->tenants, sizeof(*b.tids));
    b.runs = calloc(o->nlevels, sizeof(*b.runs));
    b.load.lat = hist_create();
    if (!b.ds || !b.ti || !b.tids || !b.runs || !b.load.lat) {
        fprintf(stderr, "engram-bench: out of memory\n");
        goto out;
    }
    int src = setup_data(&b);
    if (src != 0) {
        if (src < 0)
            fprintf(stderr, "engram-bench: setup: %s\n", strerror(-src));
        goto out;
    }
    bool load_only = strcmp(o->workload, "load") == 0;
    int rrc = load_only ? 0 : run_levels(&b);
    if (rrc < 0)
        fprintf(stderr, "engram-bench: %s\n", strerror(-rrc));
    if (o->http_port)
        scrape_metrics(o->host, (uint16_t)o->http_port, &b.final);

    report_conf rc_ = {.host = o->host,
                       .port = (uint16_t)o->port,
                       .http_port = (uint16_t)o->http_port,
                       .workload = o->workload,
                       .tenants = o->tenants,
                       .memories = o->memories,
                       .dim = o->dim,
                       .dataset = o->dataset,
                       .index_engine = o->index_engine,
                       .mean_cosine = b.mean_cosine,
                       .top_k = o->top_k,
                       .queries = o->queries,
                       .batch = o->batch,
                       .depth = o->depth,
                       .inflight = o->inflight,
                       .duration_s = o->duration,
                       .warmup_s = o->warmup,
                       .seed = o->seed,
                       .reuse = o->reuse};
    memcpy(rc_.mix, o->mix, sizeof(rc_.mix));
    report_table(stdout, &rc_, &b.load, b.runs, b.nruns);
    if (b.final.ok)
        printf("server resident memory: %.1f MiB (index: %.0f vectors, %.1f MiB)\n",
               b.final.resident_bytes / 1048576.0, b.final.index_vectors,
               b.final.index_bytes / 1048576.0);
    fflush(stdout);
    rc = rrc != 0 ? 1 : 0;
    if (o->json_out) {
        int jrc = report_json(o->json_out, &rc_, &b.load, b.runs, b.nruns, &b.final);
        if (jrc != 0) {
            fprintf(stderr, "engram-bench: cannot write %s: %s\n", o->json_out, strerror(-jrc));
            rc = 1;
        }
    }
    if (o->plot_prefix && b.nruns > 0 && report_plots(o->plot_prefix, &rc_, b.runs, b.nruns) != 0)
        rc = 1;
out:
    for (size_t i = 0; b.runs && i < b.nruns; i++)
        loadgen_result_fini(&b.runs[i].lr);
    for (size_t i = 0; b.truth && i < o->tenants; i++)
        dataset_truth_fini(&b.truth[i]);
    if (b.ti)
        memset(b.ti, 0, o->tenants * sizeof(*b.ti));
    free(b.truth);
    free(b.queries);
    free(b.runs);
    free(b.tids);
    free(b.ti);
    hist_destroy(b.load.lat);
    dataset_destroy(b.ds);
    return rc;
}
