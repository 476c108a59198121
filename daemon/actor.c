/*
 * actor.c — worker threads for the core's slow tasks (see actor.h).
 *
 * The queue is a list kept in priority order (then posting order), so the thread always takes its
 * head. Queues are short (a few loads, merges and writes at a time), so insertion walks the list.
 */
#include "actor.h"

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "corral/log.h"
#include "mem.h"

struct actor {
    char name[32];
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    actor_task *head;    /* queued, best first */
    actor_task *current; /* the task in `run`, or NULL */
    bool quit;
    void (*done)(actor_task *t, void *ctx);
    void *ctx;
};

void actor_task_init(actor_task *t, void (*run)(actor_task *t), int priority) {
    t->run = run;
    t->priority = priority;
    atomic_init(&t->cancel, 0);
    t->ran = false;
    t->next = NULL;
}

static void *actor_main(void *arg) {
    actor *a = arg;
    /* "corral-loader", ...: for debuggers, and for tests that fault one thread (tests/faultinj). */
    char name[16];
    snprintf(name, sizeof name, "corral-%.8s", a->name);
    pthread_setname_np(pthread_self(), name);
    /* Actors allocate for models' owners too (mem.h): no thread cache. */
    mem_thread_init(MEM_THREAD_CORE);
    pthread_mutex_lock(&a->mu);
    for (;;) {
        while (!a->head && !a->quit) pthread_cond_wait(&a->cv, &a->mu);
        if (a->quit) break;
        actor_task *t = a->head;
        a->head = t->next;
        t->next = NULL;
        a->current = t;
        pthread_mutex_unlock(&a->mu);
        if (!atomic_load(&t->cancel)) {
            t->ran = true;
            t->run(t);
        }
        pthread_mutex_lock(&a->mu);
        a->current = NULL;
        pthread_mutex_unlock(&a->mu);
        a->done(t, a->ctx);
        pthread_mutex_lock(&a->mu);
    }
    pthread_mutex_unlock(&a->mu);
    mem_thread_exit();
    return NULL;
}

actor *actor_new(const char *name, void (*done)(actor_task *t, void *ctx), void *ctx,
                 corral_error *err) {
    actor *a = calloc(1, sizeof *a);
    if (!a) {
        corral_error_set(err, CORRAL_OUT_OF_MEMORY, "out of memory");
        return NULL;
    }
    snprintf(a->name, sizeof a->name, "%s", name);
    pthread_mutex_init(&a->mu, NULL);
    pthread_cond_init(&a->cv, NULL);
    a->done = done;
    a->ctx = ctx;
    /* Signals belong to the daemon's signalfd: block them all in the actor, but those of faults
     * (a task that reads a mapped file catches its SIGBUS: fault.h; the kernel ends a process
     * whose thread faults with the signal blocked). */
    sigset_t all, old;
    sigfillset(&all);
    static const int faults[] = {SIGBUS, SIGSEGV, SIGFPE, SIGILL};
    for (size_t i = 0; i < sizeof faults / sizeof faults[0]; i++) sigdelset(&all, faults[i]);
    pthread_sigmask(SIG_BLOCK, &all, &old);
    const int rc = pthread_create(&a->thread, NULL, actor_main, a);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0) {
        corral_error_set(err, CORRAL_RESOURCE_EXHAUSTED, "cannot start the %s thread: %s", name,
                         strerror(rc));
        pthread_mutex_destroy(&a->mu);
        pthread_cond_destroy(&a->cv);
        free(a);
        return NULL;
    }
    return a;
}

void actor_post(actor *a, actor_task *t) {
    pthread_mutex_lock(&a->mu);
    actor_task **pp = &a->head;
    while (*pp && (*pp)->priority >= t->priority) pp = &(*pp)->next;
    t->next = *pp;
    *pp = t;
    pthread_cond_signal(&a->cv);
    pthread_mutex_unlock(&a->mu);
}

void actor_cancel_all(actor *a) {
    pthread_mutex_lock(&a->mu);
    for (actor_task *t = a->head; t; t = t->next) atomic_store(&t->cancel, 1);
    if (a->current) atomic_store(&a->current->cancel, 1);
    pthread_mutex_unlock(&a->mu);
}

bool actor_idle(actor *a) {
    pthread_mutex_lock(&a->mu);
    const bool idle = !a->head && !a->current;
    pthread_mutex_unlock(&a->mu);
    return idle;
}

void actor_destroy(actor **pa) {
    if (!pa || !*pa) return;
    actor *a = *pa;
    pthread_mutex_lock(&a->mu);
    a->quit = true;
    pthread_cond_signal(&a->cv);
    pthread_mutex_unlock(&a->mu);
    pthread_join(a->thread, NULL);
    /* What never ran goes back to its owner. */
    for (actor_task *t = a->head, *next; t; t = next) {
        next = t->next;
        t->next = NULL;
        a->done(t, a->ctx);
    }
    pthread_mutex_destroy(&a->mu);
    pthread_cond_destroy(&a->cv);
    free(a);
    *pa = NULL;
}
