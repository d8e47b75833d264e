/* bench/report.c: table, JSON and gnuplot charts (see report.h). */
#include "report.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

static const double pcts[] = {0.50, 0.90, 0.99, 0.999};
static const char *const pct_keys[] = {"p50", "p90", "p99", "p999"};

static double ms(uint64_t ns)
{
    return (double)ns / 1e6;
}

static uint64_t op_requests(const loadgen_opstats *s)
{
    return s->ok + s->errors;
}

/* Requests of every op of a run, merged into one histogram (caller frees). */
static hist *merged(const report_run *r)
{
    hist *h = hist_create();
    for (int op = 0; h && op < WL_NOPS; op++)
        if (r->lr.ops[op].lat)
            hist_merge(h, r->lr.ops[op].lat);
    return h;
}

static uint64_t run_ok_in_window(const report_run *r)
{
    uint64_t n = 0;
    for (int op = 0; op < WL_NOPS; op++)
        n += r->lr.ops[op].done_in_window;
    return n;
}

static double recall_of(const workload_opstats *w)
{
    return w->recall_slots ? (double)w->recall_hits / (double)w->recall_slots : NAN;
}

/* Recall over every vector op of the run. */
static double run_recall(const report_run *r)
{
    uint64_t h = r->wst[WL_SEARCH].recall_hits + r->wst[WL_CONTEXT].recall_hits;
    uint64_t s = r->wst[WL_SEARCH].recall_slots + r->wst[WL_CONTEXT].recall_slots;
    return s ? (double)h / (double)s : NAN;
}

/* The server's mean latency of method i between two scrapes, in ms; NAN if unknown. */
static double server_mean_ms(const report_run *r, size_t i)
{
    if (!r->before.ok || !r->after.ok)
        return NAN;
    double dc = r->after.count[i] - r->before.count[i];
    double ds = r->after.sum_s[i] - r->before.sum_s[i];
    return dc > 0 ? ds / dc * 1e3 : NAN;
}

static int method_of_op(int op)
{
    switch (op) {
    case WL_SEARCH:
    case WL_SEARCH_TEXT:
        return 0;
    case WL_CONTEXT:
        return 1;
    case WL_STORE:
        return 2;
    case WL_STORE_BATCH:
    case WL_LOAD:
        return 3;
    case WL_PING:
        return 6;
    }
    return -1;
}

static void mix_text(const report_conf *c, char *buf, size_t len)
{
    size_t off = 0;
    buf[0] = '\0';
    for (int op = 0; op < WL_NOPS && off < len; op++) {
        if (op == WL_LOAD || c->mix[op] <= 0)
            continue;
        int n = snprintf(buf + off, len - off, "%s%s=%g", off ? "," : "", workload_op_name(op),
                         c->mix[op]);
        if (n > 0)
            off += (size_t)n;
    }
}

/* ---- table ----------------------------------------------------------------------------- */

static void row(FILE *f, const char *lead, const char *op, uint64_t reqs, double rate,
                const hist *h, uint64_t errors, double recall, const char *unit_note)
{
    fprintf(f, "%s %-12s %9llu %10.1f", lead, op, (unsigned long long)reqs, rate);
    for (size_t p = 0; p < 4; p++)
        fprintf(f, " %8.3f", ms(hist_percentile(h, pcts[p])));
    fprintf(f, " %8.3f %7llu", ms(hist_max(h)), (unsigned long long)errors);
    if (isnan(recall))
        fprintf(f, "       -");
    else
        fprintf(f, "  %6.4f", recall);
    fprintf(f, "%s\n", unit_note ? unit_note : "");
}

void report_table(FILE *f, const report_conf *c, const report_load *l, const report_run *runs,
                  size_t nruns)
{
    char mix[256];
    mix_text(c, mix, sizeof(mix));
    fprintf(f,
            "\nengram-bench: %s (%s) against %s:%u; %zu tenant(s) x %zu memories x %zu dims "
            "(data set %s, index engine %s), top_k %zu, seed %llu\n",
            c->workload, mix[0] ? mix : "-", c->host, (unsigned)c->port, c->tenants, c->memories,
            c->dim, c->dataset ? c->dataset : "gaussian",
            c->index_engine ? c->index_engine : "default", c->top_k, (unsigned long long)c->seed);
    if (!isnan(c->mean_cosine))
        fprintf(f, "data set mean pairwise cosine %.3f (a sample of the first tenant)\n",
                c->mean_cosine);
    if (l->tenants_loaded) {
        fprintf(f,
                "load: %llu memories into %zu tenant(s) in %.2f s = %.0f memories/s "
                "(store_batch of %zu, %zu connection(s) x depth %zu; per batch p50 %.1f ms, "
                "p99 %.1f ms; %llu error(s)%s)\n",
                (unsigned long long)l->memories, l->tenants_loaded, l->seconds,
                l->seconds > 0 ? (double)l->memories / l->seconds : 0.0, c->batch, l->conns,
                l->depth, ms(hist_percentile(l->lat, 0.5)), ms(hist_percentile(l->lat, 0.99)),
                (unsigned long long)l->errors, l->verified ? "; count verified" : "");
    }
    if (l->tenants_reused)
        fprintf(f, "reused %zu loaded tenant(s)\n", l->tenants_reused);
    if (nruns == 0)
        return;
    fprintf(f,
            "\nconns depth op            requests      req/s   p50 ms   p90 ms   p99 ms "
            "p99.9 ms   max ms  errors recall@%zu\n",
            c->top_k);
    for (size_t i = 0; i < nruns; i++) {
        const report_run *r = &runs[i];
        char lead[32];
        snprintf(lead, sizeof(lead), "%5zu %5zu", r->conns, r->depth);
        size_t nops = 0;
        for (int op = 0; op < WL_NOPS; op++) {
            const loadgen_opstats *s = &r->lr.ops[op];
            if (op_requests(s) == 0)
                continue;
            nops++;
            double rate = r->lr.window_s > 0 ? (double)s->done_in_window / r->lr.window_s : 0;
            char note[64] = "";
            if (op == WL_STORE_BATCH)
                snprintf(note, sizeof(note), "  (%.0f memories/s)", rate * (double)c->batch);
            row(f, lead, workload_op_name(op), op_requests(s), rate, s->lat, s->errors,
                (op == WL_SEARCH || op == WL_CONTEXT) ? recall_of(&r->wst[op]) : NAN, note);
        }
        if (nops > 1) {
            hist *h = merged(r);
            uint64_t reqs = 0, errs = 0;
            for (int op = 0; op < WL_NOPS; op++) {
                reqs += op_requests(&r->lr.ops[op]);
                errs += r->lr.ops[op].errors;
            }
            if (h)
                row(f, lead, "all", reqs,
                    r->lr.window_s > 0 ? (double)run_ok_in_window(r) / r->lr.window_s : 0, h, errs,
                    run_recall(r), NULL);
            hist_destroy(h);
        }
        for (int e = 1; e < LOADGEN_NERR; e++) {
            uint64_t n = 0;
            for (int op = 0; op < WL_NOPS; op++)
                n += r->lr.ops[op].err_by[e];
            if (n)
                fprintf(f, "            errors %s: %llu\n", loadgen_err_name(e),
                        (unsigned long long)n);
        }
        if (r->lr.unanswered || r->lr.conn_errors)
            fprintf(f, "            unanswered: %llu, broken connections: %llu\n",
                    (unsigned long long)r->lr.unanswered, (unsigned long long)r->lr.conn_errors);
        fprintf(f, "            window %.2f s", r->lr.window_s);
        if (r->after.ok)
            fprintf(f, "; server resident %.1f MiB", r->after.resident_bytes / 1048576.0);
        fprintf(f, "\n            mean latency, client:");
        bool first_op = true;
        for (int op = 0; op < WL_NOPS; op++) {
            if (!op_requests(&r->lr.ops[op]) || !r->lr.ops[op].lat)
                continue;
            fprintf(f, "%s %s %.3f ms", first_op ? "" : ",", workload_op_name(op),
                    hist_mean(r->lr.ops[op].lat) / 1e6);
            first_op = false;
        }
        /* the server's figures are per method: search and search_text share memory.search */
        bool shown[8] = {false};
        bool any = false;
        for (int op = 0; op < WL_NOPS; op++) {
            int m = method_of_op(op);
            double sm = m >= 0 ? server_mean_ms(r, (size_t)m) : NAN;
            if (!op_requests(&r->lr.ops[op]) || isnan(sm) || shown[m])
                continue;
            shown[m] = true;
            fprintf(f, "%s %s %.3f ms", any ? "," : "; server:", scrape_methods[m], sm);
            any = true;
        }
        fprintf(f, "\n");
        if (r->machine_busy >= 0) {
            fprintf(f, "            cpu: machine %.0f%% busy (%u cores)", r->machine_busy * 100,
                    r->ncpu);
            if (r->client_cores >= 0)
                fprintf(f, ", engram-bench %.2f cores", r->client_cores);
            if (r->server_cores >= 0)
                fprintf(f, ", engramd %.2f cores", r->server_cores);
            if (r->pg_cores >= 0)
                fprintf(f, ", postgres %.2f cores", r->pg_cores);
            if (r->background_busy >= 0)
                fprintf(f, "; busy before the run: %.0f%%", r->background_busy * 100);
            fprintf(f, "\n");
        }
    }
}

/* ---- JSON ------------------------------------------------------------------------------ */

static void jnum(FILE *f, double v)
{
    if (isnan(v) || isinf(v))
        fprintf(f, "null");
    else
        fprintf(f, "%.10g", v);
}

static void jlat(FILE *f, const hist *h)
{
    fprintf(f, "{\"count\": %llu", (unsigned long long)hist_count(h));
    for (size_t p = 0; p < 4; p++)
        fprintf(f, ", \"%s\": %.4f", pct_keys[p], ms(hist_percentile(h, pcts[p])));
    fprintf(f, ", \"min\": %.4f, \"max\": %.4f, \"mean\": %.4f}", ms(hist_min(h)), ms(hist_max(h)),
            hist_mean(h) / 1e6);
}

static void jsample(FILE *f, const scrape_sample *s)
{
    if (!s->ok) {
        fprintf(f, "null");
        return;
    }
    fprintf(f,
            "{\"resident_bytes\": %.0f, \"index_vectors\": %.0f, \"index_bytes\": %.0f, "
            "\"requests\": {",
            s->resident_bytes, s->index_vectors, s->index_bytes);
    bool first = true;
    for (size_t m = 0; m < 8; m++) {
        if (s->count[m] <= 0)
            continue;
        fprintf(f, "%s\"%s\": {\"count\": %.0f, \"sum_s\": %.6f}", first ? "" : ", ",
                scrape_methods[m], s->count[m], s->sum_s[m]);
        first = false;
    }
    fprintf(f, "}}");
}

int report_json(const char *path, const report_conf *c, const report_load *l,
                const report_run *runs, size_t nruns, const scrape_sample *final_sample)
{
    FILE *f = fopen(path, "w");
    if (!f)
        return -errno;
    fprintf(f, "{\n  \"tool\": \"engram-bench\",\n  \"format\": 1,\n");
    fprintf(f,
            "  \"config\": {\"host\": \"%s\", \"port\": %u, \"http_port\": %u, \"workload\": "
            "\"%s\", \"mix\": {",
            c->host, (unsigned)c->port, (unsigned)c->http_port, c->workload);
    bool first = true;
    for (int op = 0; op < WL_NOPS; op++) {
        if (op == WL_LOAD || c->mix[op] <= 0)
            continue;
        fprintf(f, "%s\"%s\": %g", first ? "" : ", ", workload_op_name(op), c->mix[op]);
        first = false;
    }
    char mc[32] = "null";
    if (!isnan(c->mean_cosine))
        snprintf(mc, sizeof(mc), "%.4f", c->mean_cosine);
    fprintf(
        f,
        "}, \"tenants\": %zu, \"memories\": %zu, \"dim\": %zu, \"dataset\": \"%s\", "
        "\"index_engine\": %s%s%s, \"mean_cosine\": %s, \"top_k\": %zu, "
        "\"queries\": %zu, \"batch\": %zu, \"depth\": %zu, \"inflight\": %zu, \"duration_s\": %g, "
        "\"warmup_s\": %g, \"seed\": %llu, \"reuse\": %s},\n",
        c->tenants, c->memories, c->dim, c->dataset ? c->dataset : "gaussian",
        c->index_engine ? "\"" : "", c->index_engine ? c->index_engine : "null",
        c->index_engine ? "\"" : "", mc, c->top_k, c->queries, c->batch, c->depth, c->inflight,
        c->duration_s, c->warmup_s, (unsigned long long)c->seed, c->reuse ? "true" : "false");
    fprintf(f,
            "  \"load\": {\"tenants_loaded\": %zu, \"tenants_reused\": %zu, \"memories\": %llu, "
            "\"seconds\": %.4f, \"memories_per_s\": ",
            l->tenants_loaded, l->tenants_reused, (unsigned long long)l->memories, l->seconds);
    jnum(f, l->seconds > 0 ? (double)l->memories / l->seconds : NAN);
    fprintf(f,
            ", \"batch\": %zu, \"connections\": %zu, \"depth\": %zu, \"batches\": %llu, "
            "\"errors\": %llu, \"verified\": %s, \"batch_latency_ms\": ",
            c->batch, l->conns, l->depth, (unsigned long long)l->batches,
            (unsigned long long)l->errors, l->verified ? "true" : "false");
    jlat(f, l->lat);
    fprintf(f, "},\n  \"runs\": [");
    for (size_t i = 0; i < nruns; i++) {
        const report_run *r = &runs[i];
        uint64_t reqs = 0, ok = 0, errs = 0;
        for (int op = 0; op < WL_NOPS; op++) {
            reqs += r->lr.ops[op].sent;
            ok += r->lr.ops[op].ok;
            errs += r->lr.ops[op].errors;
        }
        hist *h = merged(r);
        if (!h) {
            fclose(f);
            return -ENOMEM;
        }
        fprintf(f,
                "%s\n    {\"connections\": %zu, \"depth\": %zu, \"window_s\": %.4f, "
                "\"window_unix_ns\": [%llu, %llu], \"requests\": %llu, \"ok\": %llu, \"errors\": "
                "%llu, \"unanswered\": %llu, "
                "\"broken_connections\": %llu, \"throughput_rps\": ",
                i ? "," : "", r->conns, r->depth, r->lr.window_s,
                (unsigned long long)r->lr.window_unix_ns[0],
                (unsigned long long)r->lr.window_unix_ns[1], (unsigned long long)reqs,
                (unsigned long long)ok, (unsigned long long)errs,
                (unsigned long long)r->lr.unanswered, (unsigned long long)r->lr.conn_errors);
        jnum(f, r->lr.window_s > 0 ? (double)run_ok_in_window(r) / r->lr.window_s : NAN);
        fprintf(f, ", \"recall_at_k\": ");
        jnum(f, run_recall(r));
        fprintf(f, ", \"latency_ms\": ");
        jlat(f, h);
        hist_destroy(h);
        fprintf(f, ",\n     \"server\": {\"before\": ");
        jsample(f, &r->before);
        fprintf(f, ", \"after\": ");
        jsample(f, &r->after);
        fprintf(f, ", \"resident_bytes\": ");
        jnum(f, r->after.ok ? r->after.resident_bytes : NAN);
        fprintf(f, ", \"mean_latency_ms\": {");
        first = true;
        for (size_t m = 0; m < 8; m++) {
            double sm = server_mean_ms(r, m);
            if (isnan(sm))
                continue;
            fprintf(f, "%s\"%s\": %.4f", first ? "" : ", ", scrape_methods[m], sm);
            first = false;
        }
        fprintf(f, "}},\n     \"cpu\": {\"cores\": %u, \"machine_busy\": ", r->ncpu);
        jnum(f, r->machine_busy >= 0 ? r->machine_busy : NAN);
        fprintf(f, ", \"client_cores\": ");
        jnum(f, r->client_cores >= 0 ? r->client_cores : NAN);
        fprintf(f, ", \"server_cores\": ");
        jnum(f, r->server_cores >= 0 ? r->server_cores : NAN);
        fprintf(f, ", \"postgres_cores\": ");
        jnum(f, r->pg_cores >= 0 ? r->pg_cores : NAN);
        fprintf(f, ", \"background_busy_before\": ");
        jnum(f, r->background_busy >= 0 ? r->background_busy : NAN);
        fprintf(f, "},\n     \"bytes_out\": %llu, \"bytes_in\": %llu,\n     \"ops\": {",
                (unsigned long long)r->lr.bytes_out, (unsigned long long)r->lr.bytes_in);
        first = true;
        for (int op = 0; op < WL_NOPS; op++) {
            const loadgen_opstats *s = &r->lr.ops[op];
            const workload_opstats *w = &r->wst[op];
            if (s->sent == 0 && op_requests(s) == 0)
                continue;
            fprintf(f,
                    "%s\n       \"%s\": {\"sent\": %llu, \"requests\": %llu, \"ok\": %llu, "
                    "\"errors\": %llu, \"error_codes\": {",
                    first ? "" : ",", workload_op_name(op), (unsigned long long)s->sent,
                    (unsigned long long)op_requests(s), (unsigned long long)s->ok,
                    (unsigned long long)s->errors);
            first = false;
            bool ef = true;
            for (int e = 1; e < LOADGEN_NERR; e++) {
                if (!s->err_by[e])
                    continue;
                fprintf(f, "%s\"%s\": %llu", ef ? "" : ", ", loadgen_err_name(e),
                        (unsigned long long)s->err_by[e]);
                ef = false;
            }
            fprintf(f, "}, \"throughput_rps\": ");
            jnum(f, r->lr.window_s > 0 ? (double)s->done_in_window / r->lr.window_s : NAN);
            fprintf(f, ", \"latency_ms\": ");
            jlat(f, s->lat);
            fprintf(f,
                    ", \"answers\": %llu, \"results\": %llu, \"memories\": %llu, "
                    "\"recall_hits\": %llu, \"recall_slots\": %llu, \"recall_at_k\": ",
                    (unsigned long long)w->answers, (unsigned long long)w->results,
                    (unsigned long long)w->memories, (unsigned long long)w->recall_hits,
                    (unsigned long long)w->recall_slots);
            jnum(f, recall_of(w));
            if (op == WL_STORE || op == WL_STORE_BATCH) {
                fprintf(f, ", \"memories_per_s\": ");
                jnum(f, r->lr.window_s > 0
                            ? (double)s->done_in_window *
                                  (op == WL_STORE_BATCH ? (double)c->batch : 1.0) / r->lr.window_s
                            : NAN);
            }
            int m = method_of_op(op);
            fprintf(f, ", \"server_mean_ms\": ");
            jnum(f, m >= 0 ? server_mean_ms(r, (size_t)m) : NAN);
            fprintf(f, "}");
        }
        fprintf(f, "}}");
    }
    fprintf(f, "\n  ],\n  \"server\": ");
    jsample(f, final_sample);
    fprintf(f, ",\n  \"server_resident_bytes\": ");
    jnum(f, final_sample->ok ? final_sample->resident_bytes : NAN);
    fprintf(f, "\n}\n");
    if (ferror(f)) {
        fclose(f);
        return -EIO;
    }
    return fclose(f) == 0 ? 0 : -EIO;
}

/* ---- plots ----------------------------------------------------------------------------- */

/* Writes a datablock of (1 / (1 - q), latency ms) points of h up to the last recorded
 * rank, for a percentile plot on a log axis. */
static void percentile_block(FILE *g, const char *name, const hist *h)
{
    fprintf(g, "$%s << EOD\n", name);
    double n = (double)hist_count(h);
    for (int i = 0; i <= 120; i++) {
        double x = pow(10.0, i / 20.0); /* 1 .. 10^6 */
        double q = 1.0 - 1.0 / x;
        if (x > n && i > 0)
            break;
        fprintf(g, "%.6g %.6g\n", x, ms(hist_percentile(h, q)));
    }
    fprintf(g, "%.6g %.6g\nEOD\n", n > 1 ? n : 1.0, ms(hist_max(h)));
}

static int run_gnuplot(const char *script, const char *terminal)
{
    FILE *g = popen("gnuplot", "w");
    if (!g)
        return -1;
    fprintf(g, "set terminal %s size 1000,620 font ',11'\n%s", terminal, script);
    int st = pclose(g);
    return (st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 0) ? 0 : -1;
}

/* Renders with pngcairo, else png. The script is kept in a memory stream. */
static int render(const char *script)
{
    if (run_gnuplot(script, "pngcairo") == 0)
        return 0;
    return run_gnuplot(script, "png");
}

static char *latency_script(const char *prefix, const report_conf *c, const report_run *runs,
                            size_t nruns)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *g = open_memstream(&buf, &len);
    if (!g)
        return NULL;
    char mix[256];
    mix_text(c, mix, sizeof(mix));
    fprintf(g, "set output '%s-latency.png'\n", prefix);
    fprintf(g,
            "set title 'engram-bench %s (%s): latency by percentile, %zu x %zu x %zu' "
            "noenhanced\n",
            c->workload, mix, c->tenants, c->memories, c->dim);
    fprintf(g, "set logscale x\nset logscale y\nset grid xtics ytics mytics\n"
               "set xlabel 'percentile'\nset ylabel 'latency (ms)'\n"
               "set xtics ('0%%%%' 1, '90%%%%' 10, '99%%%%' 100, '99.9%%%%' 1000, "
               "'99.99%%%%' 10000, '99.999%%%%' 100000, '99.9999%%%%' 1000000)\n"
               "set key left top\n");
    /* single run: one curve per op; several runs: one curve per run, ops merged */
    size_t ncurves = 0;
    char plot[4096] = "";
    size_t off = 0;
    if (nruns == 1) {
        for (int op = 0; op < WL_NOPS; op++) {
            const hist *h = runs[0].lr.ops[op].lat;
            if (!h || hist_count(h) == 0)
                continue;
            char name[32];
            snprintf(name, sizeof(name), "op%d", op);
            percentile_block(g, name, h);
            off += (size_t)snprintf(plot + off, sizeof(plot) - off,
                                    "%s$%s using 1:2 with lines lw 2 title '%s, %zu conn x %zu' "
                                    "noenhanced",
                                    ncurves ? ", " : "plot ", name, workload_op_name(op),
                                    runs[0].conns, runs[0].depth);
            ncurves++;
        }
    } else {
        for (size_t i = 0; i < nruns && off < sizeof(plot) - 200; i++) {
            hist *h = merged(&runs[i]);
            if (!h)
                continue;
            if (hist_count(h)) {
                char name[32];
                snprintf(name, sizeof(name), "run%zu", i);
                percentile_block(g, name, h);
                off +=
                    (size_t)snprintf(plot + off, sizeof(plot) - off,
                                     "%s$%s using 1:2 with lines lw 2 title '%zu conn x %zu'",
                                     ncurves ? ", " : "plot ", name, runs[i].conns, runs[i].depth);
                ncurves++;
            }
            hist_destroy(h);
        }
    }
    if (ncurves)
        fprintf(g, "%s\n", plot);
    fclose(g);
    if (!ncurves) {
        free(buf);
        return NULL;
    }
    return buf;
}

static char *sweep_script(const char *prefix, const report_conf *c, const report_run *runs,
                          size_t nruns)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *g = open_memstream(&buf, &len);
    if (!g)
        return NULL;
    char mix[256];
    mix_text(c, mix, sizeof(mix));
    fprintf(g, "$sweep << EOD\n");
    for (size_t i = 0; i < nruns; i++) {
        hist *h = merged(&runs[i]);
        double rate =
            runs[i].lr.window_s > 0 ? (double)run_ok_in_window(&runs[i]) / runs[i].lr.window_s : 0;
        fprintf(g, "%zu %.3f %.4f %.4f\n", runs[i].conns, rate,
                h ? ms(hist_percentile(h, 0.99)) : 0.0, h ? ms(hist_percentile(h, 0.5)) : 0.0);
        hist_destroy(h);
    }
    fprintf(g, "EOD\n");
    fprintf(g, "set output '%s-throughput.png'\n", prefix);
    fprintf(g,
            "set title 'engram-bench %s (%s): throughput against connections, %zu x %zu x "
            "%zu, depth %zu' noenhanced\n",
            c->workload, mix, c->tenants, c->memories, c->dim, c->depth);
    fprintf(g, "set logscale x 2\nset grid\nset xlabel 'connections'\n"
               "set ylabel 'requests/s'\nset y2label 'latency (ms)'\nset ytics nomirror\n"
               "set y2tics\nset yrange [0:*]\nset y2range [0:*]\nset key left top\n"
               "plot $sweep using 1:2 with linespoints lw 2 pt 7 title 'throughput', "
               "$sweep using 1:3 axes x1y2 with linespoints lw 2 pt 5 title 'p99', "
               "$sweep using 1:4 axes x1y2 with linespoints lw 2 pt 4 title 'p50'\n");
    fclose(g);
    return buf;
}

int report_plots(const char *prefix, const report_conf *c, const report_run *runs, size_t nruns)
{
    int rc = 0;
    char *s = latency_script(prefix, c, runs, nruns);
    if (s && render(s) != 0) {
        fprintf(stderr, "engram-bench: gnuplot failed to draw %s-latency.png\n", prefix);
        rc = 1;
    }
    free(s);
    if (nruns > 1) {
        s = sweep_script(prefix, c, runs, nruns);
        if (s && render(s) != 0) {
            fprintf(stderr, "engram-bench: gnuplot failed to draw %s-throughput.png\n", prefix);
            rc = 1;
        }
        free(s);
    }
    return rc;
}
