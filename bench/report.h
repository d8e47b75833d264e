/* bench/report.h: engram-bench's results as a table for people, as JSON and as PNG charts
 * drawn by gnuplot. */
#ifndef ENGRAM_BENCH_REPORT_H
#define ENGRAM_BENCH_REPORT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "hist.h"
#include "loadgen.h"
#include "scrape.h"
#include "workload.h"

/* What was asked for. */
typedef struct report_conf {
    const char *host;
    uint16_t port, http_port;
    const char *workload; /* the --workload name */
    double mix[WL_NOPS];  /* the weights in use */
    size_t tenants, memories, dim, top_k, queries, batch, depth;
    size_t inflight;     /* --inflight: requests in flight over all connections (0: no bound) */
    const char *dataset; /* data set name */
    const char *index_engine; /* NULL: the server's default */
    double mean_cosine;       /* of the data set (a sample); NAN: not measured */
    double duration_s, warmup_s;
    uint64_t seed;
    bool reuse;
} report_conf;

/* The loading of the data set (store_batch of prepared batches). */
typedef struct report_load {
    size_t tenants_loaded, tenants_reused;
    uint64_t memories; /* stored by the load, summed over tenants */
    double seconds;    /* the load windows, summed */
    size_t conns, depth;
    hist *lat; /* per batch; owned by the caller */
    uint64_t batches, errors;
    bool verified; /* memory.stats counted the expected total afterwards */
} report_load;

/* One measured run (one concurrency level). */
typedef struct report_run {
    size_t conns, depth;
    loadgen_result lr;             /* owned by the caller */
    workload_opstats wst[WL_NOPS]; /* the workload's counters */
    scrape_sample before, after;   /* /metrics at the window's opening and after the run */
    double machine_busy;           /* busy share of all the machine's cores; < 0: unknown */
    double client_cores;           /* CPU of this process, in cores; < 0: unknown */
    double server_cores;           /* CPU of --server-pid, in cores; < 0: unknown */
    double pg_cores;               /* CPU of processes named postgres; < 0: unknown */
    double background_busy;        /* busy share of all cores just before the run */
    unsigned ncpu;
} report_run;

/* report_table prints the table of load and runs to f. */
void report_table(FILE *f, const report_conf *c, const report_load *l, const report_run *runs,
                  size_t nruns);

/* report_json writes everything as one JSON object to path. Returns 0 or -errno. */
int report_json(const char *path, const report_conf *c, const report_load *l,
                const report_run *runs, size_t nruns, const scrape_sample *final_sample);

/* report_plots draws <prefix>-latency.png (latency by percentile: one curve per run, or per
 * op for a single mixed run) and, with more than one run, <prefix>-throughput.png
 * (throughput and p99 against connections). gnuplot's pngcairo terminal is used, its png
 * terminal when pngcairo is missing. Returns 0, or 1 with a message on stderr when gnuplot
 * failed or is not installed. */
int report_plots(const char *prefix, const report_conf *c, const report_run *runs, size_t nruns);

#endif
