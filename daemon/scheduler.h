/*
 * scheduler.h — corrald's scheduler: the compute thread, the models it serves, the sessions it
 * keeps, and the order in which requests get the CPU.
 *
 * Every request that needs a model (Generate, Tokenize, Load/Unload/Pin/Unpin) and the read-only
 * ones (Status, ListModels) arrive as jobs through sched_submit(); answers leave through the
 * outbox, which the server drains after the scheduler pokes its eventfd.
 *
 * The order of work: compute is one shared resource, used one step at a time. A step is one
 * chunk of a prompt (limits.prefill_chunk tokens) or one generated token. Before each step the
 * scheduler picks, among the requests that can run, one of the highest priority class (realtime,
 * then interactive, then background), and among those the one that waited longest since its last
 * step — so equal requests take turns token by token, and a new urgent request runs at the next
 * step boundary while the others keep their KV state and resume afterwards.
 */
#ifndef CORRAL_DAEMON_SCHEDULER_H
#define CORRAL_DAEMON_SCHEDULER_H

#include "config.h"
#include "corral/status.h"
#include "job.h"

typedef struct sched sched;

/* Create the scheduler for config c and start its thread; models marked preload are loaded
 * first. Takes ownership of c, even on failure; every configuration it is given stays valid until
 * sched_destroy (so pointers into the first one remain usable by the server). notify_fd is an
 * eventfd the scheduler writes to whenever the outbox gains messages. Caller owns the result.
 * NULL with err set (a preload that fails names the model). */
sched *sched_new(cfg *c, int notify_fd, corral_error *err);

/* Build (then drop) every sanitizer profile of c, loading its plugins: what sched_new would refuse
 * about them, for --check-config. */
corral_status sched_check_profiles(const cfg *c, corral_error *err);

/* Hand a job over (see job.h for ownership). Thread-safe. */
void sched_submit(sched *s, job *j);

/* Wake the scheduler after setting a job's cancel or paused flag. Thread-safe. */
void sched_poke(sched *s);

/* Take every message waiting in the outbox, oldest first (a list linked by `next`; the caller
 * owns it). Thread-safe. */
outmsg *sched_take_outbox(sched *s);

/* Apply a reloaded configuration (SIGHUP): new models appear, removed ones stop taking requests
 * and are unloaded once their requests finish, changed ones take effect at their next load.
 * Takes ownership of c. Thread-safe. */
void sched_reload(sched *s, cfg *c);

/* Begin shutdown: every job in flight or queued ends with Error UNAVAILABLE. Returns at once;
 * the outbox then receives the final messages. Thread-safe. */
void sched_shutdown(sched *s);

/* 1 once the scheduler holds no jobs any more (after sched_shutdown). Thread-safe. */
int sched_idle(sched *s);

/* Stop the thread, free models, sessions and configs, and release what it held for unfinished
 * jobs (not the jobs: they belong to the server). NULL-safe; sets *s to NULL. */
void sched_destroy(sched **s);

#endif /* CORRAL_DAEMON_SCHEDULER_H */
