/*
 * actor.h — a worker thread that runs the core's slow tasks, in the manner of czmq's zactor: it
 * shares nothing with the compute thread but the tasks handed to it, and talks back only by
 * handing each task back when it is done.
 *
 * The core has two: the loader (model loads, LoRA merges, swap-ins of weights, session images
 * written and read, the cache directory's trimming, reloads of the config file) and the preparer
 * (a request's sanitizers, tokenizing, output constraint). The compute thread posts a task and
 * goes on stepping other work; the actor runs the task's `run` on its own thread and then calls
 * the `done` function it was made with (which puts the task in the core's inbox and wakes the
 * compute thread, where the task's results are taken in). Tasks run one at a time, highest
 * priority first and in posting order among equals.
 *
 * Cancelling: the poster sets `cancel`; a task not yet started is handed back without running
 * (ran = false), and a long run may look at the flag between its steps and stop early.
 */
#ifndef CORRAL_DAEMON_ACTOR_H
#define CORRAL_DAEMON_ACTOR_H

#include <stdatomic.h>
#include <stdbool.h>

#include "corral/status.h"

typedef struct actor_task actor_task;

struct actor_task {
    void (*run)(actor_task *t); /* on the actor's thread */
    int priority;               /* higher runs first */
    atomic_int cancel;          /* set by the poster: skip it, or stop early */
    bool ran;                   /* set by the actor: run was called */
    /* Links, owned by whoever holds the task (the actor's queue, then the core's inbox). */
    actor_task *next;
};

/* Prepare a task for posting (clears cancel, ran and the links). */
void actor_task_init(actor_task *t, void (*run)(actor_task *t), int priority);

typedef struct actor actor;

/* Start an actor thread called `name` (for logs). `done(t, ctx)` is called on the actor's thread
 * after each task ran or was skipped; it must hand the task on quickly and not block. Caller owns
 * the result (actor_destroy). NULL with err when the thread cannot start. */
actor *actor_new(const char *name, void (*done)(actor_task *t, void *ctx), void *ctx,
                 corral_error *err);

/* Queue t; the caller gives t up until it comes back through done. Thread-safe. */
void actor_post(actor *a, actor_task *t);

/* Set `cancel` on every task queued or running (shutdown). Thread-safe. */
void actor_cancel_all(actor *a);

/* Whether the actor has nothing queued or running. Thread-safe. */
bool actor_idle(actor *a);

/* Stop the thread after the task it is running; tasks still queued are handed to done unrun.
 * NULL-safe; sets *a to NULL. */
void actor_destroy(actor **a);

#endif /* CORRAL_DAEMON_ACTOR_H */
