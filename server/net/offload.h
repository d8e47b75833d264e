/* server/net/offload.h: CPU work taken off the workers' event loops.
 *
 * Decoding a message of hundreds of thousands of values takes tens of milliseconds; on a
 * worker's loop every other client of that worker would wait that long. A small pool of
 * threads runs such work instead, and the result comes back to the worker that asked, on its
 * own thread (worker_post). Nothing here touches the database.
 */
#ifndef ENGRAM_SERVER_OFFLOAD_H
#define ENGRAM_SERVER_OFFLOAD_H

#include "worker.h"

typedef struct offload offload;

/* offload_create starts nthreads threads (at least 1). Returns NULL when out of memory or
 * a thread cannot start. offload_destroy runs what is queued, joins the threads and frees
 * o (NULL is a no-op); call it once no worker submits any more. */
offload *offload_create(unsigned nthreads);
void offload_destroy(offload *o);

/* offload_run runs work(arg) on a pool thread, then done(arg) on worker w's thread. Returns
 * 0, or -ENOMEM (neither runs; the caller does the work itself). Any thread. */
int offload_run(offload *o, worker *w, void (*work)(void *arg), void (*done)(void *arg), void *arg);

#endif
