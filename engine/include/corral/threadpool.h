/*
 * threadpool.h — a fixed set of threads that run one data-parallel function together.
 *
 * The forward pass splits each matrix product (and attention) into per-thread slices; a run is
 * tens of microseconds, and a token needs hundreds of them, so waking the threads must cost far
 * less than a mutex and condition variable round trip. The pool keeps n_threads - 1 worker threads
 * parked; the thread that calls threadpool_run is thread 0 of the run and does its share of the
 * work too. Between runs the workers spin a bounded number of iterations on a generation counter,
 * yield a few times, and then sleep on it with a futex, so a busy pool answers in about a
 * microsecond and an idle one uses no CPU. Nothing is allocated per run.
 *
 * Two kinds of run. threadpool_run puts slice ith on thread ith, so the threads can meet at
 * threadpool_barrier for work in phases. threadpool_run_slices lets the caller take over the
 * slices of workers that have not started yet: on a machine with more runnable threads than cores
 * (other programs busy) a worker the scheduler has set aside then costs its share of the work
 * instead of a wait of a scheduler time slice. The forward pass uses the second kind.
 *
 * Thread-safety: one run at a time per pool. threadpool_run must not be called by two threads at
 * once on the same pool, nor from inside a run's function on its own pool: both are programming
 * errors that the pool detects and answers by logging and aborting (it cannot return an error to
 * the thread that lost the race without corrupting the run in progress). A daemon owns one pool
 * and serializes its runs; different pools are independent.
 *
 * Faults. A threadpool_run_slices run may read memory-mapped files that break under it (SIGBUS,
 * fault.h): each slice runs under a fault guard of the thread that runs it; a slice that faults
 * stops there, the run ends normally once every slice is over, and the fault is then handed to
 * the caller's innermost guard as if the caller had faulted (fault_deliver; without one, the
 * process ends with SIGBUS as it would have without the pool). A threadpool_run (with barriers)
 * cannot be cut short: a fault in it ends the process.
 */
#ifndef CORRAL_THREADPOOL_H
#define CORRAL_THREADPOOL_H

#include <stdint.h>

#include "corral/status.h"

/* Largest pool threadpool_new accepts. */
#define THREADPOOL_MAX_THREADS 512u

typedef struct threadpool threadpool;

/* The work of one run, called once for every ith = 0 .. nth-1 (nth is the pool's thread count;
 * ith 0 always on the calling thread). arg is the run's argument, shared by all threads. */
typedef void (*threadpool_fn)(void *arg, uint32_t ith, uint32_t nth);

/* A pool of n_threads threads in all, counting the caller of threadpool_run: n_threads - 1 worker
 * threads are started (none for 1). 0 means the number of physical cores
 * (cpu_count_physical_cores). Caller owns the result (threadpool_destroy). NULL with err set:
 * CORRAL_INVALID_ARGUMENT when n_threads > THREADPOOL_MAX_THREADS, CORRAL_RESOURCE_EXHAUSTED when
 * a thread cannot be started, CORRAL_OUT_OF_MEMORY. The workers block every signal, so signals
 * go to the process's own threads (all but the signals of faults: SIGBUS, SIGSEGV, SIGFPE,
 * SIGILL). Installs the SIGBUS handler (fault_init). */
threadpool *threadpool_new(uint32_t n_threads, corral_error *err);

/* Stop and join the workers and free the pool. NULL-safe; sets *p to NULL. Must not be called
 * while a run is in progress. */
void threadpool_destroy(threadpool **p);

/* Threads in the pool, counting the caller (>= 1). NULL counts as a pool of 1. */
uint32_t threadpool_n_threads(const threadpool *p);

/* Call fn(arg, ith, nth) on every thread of the pool and return when all have returned; the
 * calling thread runs ith 0. Everything fn wrote on any thread is visible to the caller when
 * threadpool_run returns. A NULL pool or a pool of 1 calls fn(arg, 0, 1) inline, with no
 * synchronization at all. Not reentrant and one run at a time per pool (see the file comment). */
void threadpool_run(threadpool *p, threadpool_fn fn, void *arg);

/* Like threadpool_run, for work that is divided but never synchronized inside fn: ith names a
 * slice of the work (0 .. nth-1, each run exactly once) rather than a thread. The caller runs
 * slice 0 and then every slice that its worker has not picked up yet (a worker asleep or not
 * scheduled by the operating system), so on a busy machine a missing worker costs its share of
 * the work, not a wait for the scheduler. fn must not call threadpool_barrier. The same rules as
 * threadpool_run otherwise. */
void threadpool_run_slices(threadpool *p, threadpool_fn fn, void *arg);

/* Inside the fn of a threadpool_run of p (not threadpool_run_slices): wait until every thread of
 * the run has reached this barrier, for work in phases (the writes of one phase are visible to all
 * threads in the next). Every thread of the run must call it the same number of times, or the run
 * never ends. No-op for a NULL pool or a pool of 1. */
void threadpool_barrier(threadpool *p);

#endif /* CORRAL_THREADPOOL_H */
