/* server/domain/bg_int.h: what bg.c and its change listener (bg_listen.c) share. */
#ifndef ENGRAM_SERVER_BG_INT_H
#define ENGRAM_SERVER_BG_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "bg.h"

typedef struct periodic periodic;
typedef struct job job;

struct bg {
    server *srv;
    periodic *periodics;
    pthread_t ticker;
    bool ticker_started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    job *head, *tail;
    bool stopping;
    unsigned nthreads;
    pthread_t *threads;
    bg_ctx *ctxs;
    pthread_t listener;
    bool listener_started;
    atomic_bool listener_ok;
    int wake[2]; /* pipe that interrupts the listener's poll on stop */
};

/* bg_stopping tells whether bg_destroy has begun. Any thread. */
bool bg_stopping(bg *b);

/* bg_listener_thread is the change listener (bg_listen.c), started by bg_create with b. */
void *bg_listener_thread(void *arg);

#endif
