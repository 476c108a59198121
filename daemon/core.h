/*
 * core.h — corrald's core: the models, their memory, the sessions and the order in which
 * requests get the CPU, behind an interface that any front end can drive.
 *
 * A front end (front_zmq.c: ZeroMQ + protobuf; an HTTP one beside it) translates its clients'
 * messages into jobs (job.h, request.h) and submits them; the core answers through each job's
 * events, which reach the front end through its sink. The core runs on threads of its own: the
 * compute thread (the scheduler, sched.c), and actors for slow work (loader.c: loads, merges,
 * session images; a preparer for sanitizers, tokenizing and constraints), so that nothing a
 * front end calls here waits for compute or I/O.
 */
#ifndef CORRAL_DAEMON_CORE_H
#define CORRAL_DAEMON_CORE_H

#include <stdint.h>

#include "auth.h"
#include "config.h"
#include "corral/status.h"
#include "job.h"

typedef struct core core;

/* Start the core for configuration c: models marked preload are loaded before this returns.
 * Takes ownership of c, even on failure. Caller owns the result (core_destroy). NULL with err
 * set (a preload or a sanitizer profile that fails names the model or profile). */
core *core_new(cfg *c, corral_error *err);

/* What core_new would refuse about c beyond parsing: every sanitizer profile built (plugins
 * loaded). For --check-config. */
corral_status core_check_config(const cfg *c, corral_error *err);

/* The configuration the core started with. Borrowed: valid until core_destroy (a reload does not
 * free it). For front-end settings that apply at start (limits, listen endpoints). */
const cfg *core_initial_config(const core *k);

/* The current configuration's auth table (auth.h: who may act as which app), for a front end to
 * establish the app of its clients' requests. Caller owns the reference (auth_table_release); a
 * reload installs a new table and never changes one that is held. Thread-safe. */
auth_table *core_auth_acquire(core *k);

/* Hand a job over; its events go to its sink (job.h). Thread-safe. */
void core_submit(core *k, job *j);

/* Wake the core after setting a job's cancel or paused flag. Thread-safe. */
void core_poke(core *k);

/* Reload the configuration from `path` (SIGHUP). The file is read and checked off the caller's
 * thread; an unreadable, empty or invalid file is refused with an error log and the running
 * configuration kept. New models appear, removed ones stop taking requests and are unloaded once
 * their requests finish, changed ones take effect at their next load. Thread-safe. */
void core_reload(core *k, const char *path);

/* Begin shutdown: every job in flight or queued ends with Error UNAVAILABLE; jobs submitted from
 * now on too. Returns at once. Thread-safe. */
void core_shutdown(core *k);

/* 1 once the core holds no jobs any more. Thread-safe. */
int core_idle(core *k);

/* Milliseconds since core_new. Thread-safe. */
uint64_t core_uptime_ms(const core *k);

/* Stop the threads, swap sessions out to disk (they survive a restart), free models and configs.
 * Jobs not yet answered are not freed (their front ends own them) and get no further events.
 * NULL-safe; sets *k to NULL. */
void core_destroy(core **k);

#endif /* CORRAL_DAEMON_CORE_H */
