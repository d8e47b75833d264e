/* server/net/offload.c: a thread pool for CPU work off the event loops (see offload.h). */
#include "offload.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <time.h>

typedef struct job {
    struct job *next;
    worker *w;
    void (*work)(void *arg);
    void (*done)(void *arg);
    void *arg;
} job;

struct offload {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    job *head, *tail;
    bool stopping;
    unsigned n;
    pthread_t *threads;
};

static void *run(void *p)
{
    offload *o = p;
    for (;;) {
        pthread_mutex_lock(&o->mu);
        while (!o->head && !o->stopping)
            pthread_cond_wait(&o->cv, &o->mu);
        job *j = o->head;
        if (j) {
            o->head = j->next;
            if (!o->head)
                o->tail = NULL;
        }
        pthread_mutex_unlock(&o->mu);
        if (!j)
            return NULL; /* stopping, nothing left */
        j->work(j->arg);
        /* back to the worker; when it cannot take it (out of memory), its thread is the
         * only place done may run, so it is retried until it goes */
        while (worker_post(j->w, j->done, j->arg) < 0) {
            struct timespec ts = {0, 1000000};
            nanosleep(&ts, NULL);
        }
        free(j);
    }
}

offload *offload_create(unsigned nthreads)
{
    offload *o = calloc(1, sizeof(*o));
    if (!o)
        return NULL;
    o->threads = calloc(nthreads ? nthreads : 1, sizeof(pthread_t));
    if (!o->threads) {
        free(o);
        return NULL;
    }
    pthread_mutex_init(&o->mu, NULL);
    pthread_cond_init(&o->cv, NULL);
    for (unsigned i = 0; i < (nthreads ? nthreads : 1); i++) {
        if (pthread_create(&o->threads[i], NULL, run, o) != 0)
            break;
        o->n++;
    }
    if (o->n == 0) {
        offload_destroy(o);
        return NULL;
    }
    return o;
}

void offload_destroy(offload *o)
{
    if (!o)
        return;
    pthread_mutex_lock(&o->mu);
    o->stopping = true;
    pthread_cond_broadcast(&o->cv);
    pthread_mutex_unlock(&o->mu);
    for (unsigned i = 0; i < o->n; i++)
        pthread_join(o->threads[i], NULL);
    pthread_cond_destroy(&o->cv);
    pthread_mutex_destroy(&o->mu);
    free(o->threads);
    free(o);
}

int offload_run(offload *o, worker *w, void (*work)(void *arg), void (*done)(void *arg), void *arg)
{
    job *j = malloc(sizeof(*j));
    if (!j)
        return -ENOMEM;
    *j = (job){.w = w, .work = work, .done = done, .arg = arg};
    pthread_mutex_lock(&o->mu);
    if (o->tail)
        o->tail->next = j;
    else
        o->head = j;
    o->tail = j;
    pthread_cond_signal(&o->cv);
    pthread_mutex_unlock(&o->mu);
    return 0;
}
