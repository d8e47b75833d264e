/* bench/scrape.h: a minimal blocking HTTP/1.0 GET for engramd's /healthz and /metrics, and
 * a reader for Prometheus text exposition. */
#ifndef ENGRAM_BENCH_SCRAPE_H
#define ENGRAM_BENCH_SCRAPE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* scrape_get fetches path from host:port with a GET, within timeout_ms. On success returns
 * 0, sets *status to the HTTP status and *body to the NUL-terminated body (malloc'ed; the
 * caller frees it). Returns a negative errno (-ECONNREFUSED while the server is not
 * listening, -ETIMEDOUT, -ENOMEM, -EPROTO for a reply that is not HTTP). */
int scrape_get(const char *host, uint16_t port, const char *path, int timeout_ms, int *status,
               char **body);

/* scrape_value finds the sample named name (with exactly the label set labels, e.g.
 * "method=\"memory.search\"", or NULL for none) in a Prometheus text body and sets *v.
 * Returns true when found. */
bool scrape_value(const char *body, const char *name, const char *labels, double *v);

/* Server-side figures read from /metrics at one moment. */
typedef struct scrape_sample {
    bool ok;               /* the scrape worked */
    double resident_bytes; /* engram_process_resident_bytes */
    double index_vectors;  /* engram_index_vectors */
    double index_bytes;    /* engram_index_bytes */
    double sum_s[8];       /* engram_request_duration_seconds_sum of methods[i] */
    double count[8];       /* engram_request_duration_seconds_count of methods[i] */
} scrape_sample;

/* scrape_methods lists the methods whose server-side latency scrape_metrics reads. */
extern const char *const scrape_methods[8];

/* scrape_metrics reads /metrics into *out (out->ok false when the scrape failed). */
void scrape_metrics(const char *host, uint16_t port, scrape_sample *out);

#endif
