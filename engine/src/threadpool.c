/*
 * threadpool.c — the pool behind threadpool.h: parked workers, a generation counter that starts a
 * run, a countdown that ends it, and a reusable barrier, all three waited on the same way.
 *
 * Waiting. A thread that waits for a 32-bit word to change first spins on it (a bounded number of
 * pause instructions: the next run or barrier phase usually comes within microseconds), then
 * yields its core a few times (the thread it waits for may need it), then registers itself in a
 * sleeper count and sleeps in FUTEX_WAIT on the word. The thread that changes the word stores it
 * and only then reads the sleeper count, making the FUTEX_WAKE system call only when someone may be
 * asleep. Both sides use sequentially consistent operations, so one of two things must happen: the
 * waiter sees the new value before it sleeps, or the changer sees the waiter registered and wakes
 * it (and FUTEX_WAIT itself refuses to sleep if the word has already changed). A wake that arrives
 * late, after the waiter has moved on, only causes a spurious return, and every wait loops on its
 * condition.
 *
 * A run. The caller writes fn and arg, sets `pending` to the number of workers, and bumps
 * `generation`. Each worker, on seeing a new generation, claims its slice by a compare-and-swap of
 * the slice's `claimed` word from an older generation to the new one, runs fn, and counts itself
 * out of `pending`. The caller runs slice 0, then (threadpool_run_slices only) claims and runs
 * every slice still unclaimed, and waits for `pending` to reach 0. A worker that wakes late finds
 * its slice claimed for that generation or a later one and goes back to waiting, without touching
 * fn or arg; a worker that owns a slice holds the run open, so fn and arg stay valid while it
 * reads them.
 *
 * The barrier counts arrivals; the last thread to arrive resets the count and bumps `phase`, the
 * others wait for `phase` to change. Each thread reads `phase` before counting itself in, so the
 * last arrival cannot bump it unseen.
 *
 * Faults (fault.h). The function of a threadpool_run_slices run reads weights that are mapped
 * files; if one is truncated under us, the read raises SIGBUS on whichever thread made it. Every
 * slice of such a run therefore runs under a guard of its own thread: a fault ends that slice
 * (the rest of its work is skipped), is recorded in the pool (the first one wins), and the slice
 * is counted out as usual, so the run still ends the normal way — every slice accounted for,
 * `pending` at 0, `busy` cleared — and no thread is left inside fn. Only then does the caller
 * hand the fault on to its own innermost guard (fault_deliver), as if it had faulted itself. The
 * slices take no locks and allocate nothing, and they never meet at a barrier, so skipping the
 * rest of one leaves only its half-written outputs, which the guard's owner discards. A
 * threadpool_run whose threads meet at barriers cannot be cut short this way (the other threads
 * would wait at the next barrier forever): its slices are not guarded, and a fault there still
 * ends the process, on the caller's thread too (a fatal region hides the caller's outer guards).
 * The workers leave SIGBUS (and the other signals of faults) unblocked: the kernel ends a process
 * whose thread faults with the signal blocked, whatever its handler.
 */
#include "corral/threadpool.h"

#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdbool.h>
#include <stdalign.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "corral/cpu.h"
#include "corral/fault.h"
#include "corral/log.h"

/* Pause instructions a waiter spins before it yields: a few to 30 microseconds depending on the
 * CPU's pause latency (27 ns on Zen 5), longer than most gaps between the runs of one token's
 * forward pass and far shorter than a scheduler tick. */
#define THREADPOOL_SPIN_ITERATIONS 1024u

/* sched_yield calls after the spin, before the futex sleep. */
#define THREADPOOL_YIELD_ITERATIONS 8u

/* Keeps words that different threads write on cache lines of their own. */
#define THREADPOOL_CACHE_LINE 64

/* One worker, on a cache line of its own: its slice's claim word is written once per run. */
struct threadpool_worker {
    alignas(THREADPOOL_CACHE_LINE) struct threadpool *pool;
    uint32_t ith;
    /* The last run (generation) whose slice ith was claimed, by this worker or by the caller. */
    _Atomic uint32_t claimed;
};

struct threadpool {
    uint32_t n_threads;
    pthread_t *threads;                /* [n_threads - 1] */
    struct threadpool_worker *workers; /* [n_threads - 1] */
    uint32_t n_started;                /* threads[0 .. n_started) are running */
    threadpool_fn fn;                  /* the current run: written before `generation` */
    void *arg;
    int guarded;        /* the current run's slices run under fault guards (run_slices) */
    atomic_int faulted; /* a slice of the current run faulted: `fault` says how */
    fault_info fault;
    atomic_int stop; /* set before `generation` is bumped: workers exit */
    alignas(THREADPOOL_CACHE_LINE) _Atomic uint32_t generation; /* futex word: bumped per run */
    _Atomic uint32_t generation_sleepers;
    alignas(THREADPOOL_CACHE_LINE) _Atomic uint32_t pending; /* futex word: workers still running */
    _Atomic uint32_t pending_sleepers;
    alignas(THREADPOOL_CACHE_LINE) _Atomic uint32_t barrier_arrived;
    _Atomic uint32_t barrier_phase; /* futex word: bumped when all have arrived */
    _Atomic uint32_t barrier_sleepers;
    alignas(THREADPOOL_CACHE_LINE) atomic_int busy; /* 1 while a run is in progress */
};

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static void futex_wait(_Atomic uint32_t *word, uint32_t expected) {
    /* EAGAIN (the word changed) and EINTR are both answered by the caller's loop. */
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT_PRIVATE, expected, NULL, NULL, 0);
}

static void futex_wake_all(_Atomic uint32_t *word) {
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
}

/* Wait until *word != old and return its new value (spin, then sleep; see the file comment). */
static uint32_t wait_for_change(_Atomic uint32_t *word, uint32_t old, _Atomic uint32_t *sleepers) {
    for (uint32_t i = 0; i < THREADPOOL_SPIN_ITERATIONS; i++) {
        const uint32_t v = atomic_load_explicit(word, memory_order_acquire);
        if (v != old) return v;
        cpu_relax();
    }
    /* When there are more runnable threads than cores, the thread we wait for may be queued
     * behind us: give it the core a few times before paying for a sleep and a wake. */
    for (uint32_t i = 0; i < THREADPOOL_YIELD_ITERATIONS; i++) {
        const uint32_t v = atomic_load_explicit(word, memory_order_acquire);
        if (v != old) return v;
        sched_yield();
    }
    atomic_fetch_add(sleepers, 1);
    uint32_t v;
    while ((v = atomic_load(word)) == old) futex_wait(word, old);
    atomic_fetch_sub(sleepers, 1);
    return v;
}

/* Store a new value into a futex word and wake whoever sleeps on it. */
static void publish(_Atomic uint32_t *word, uint32_t value, _Atomic uint32_t *sleepers) {
    atomic_store(word, value);
    if (atomic_load(sleepers) != 0) futex_wake_all(word);
}

/* Take slice w for run `gen`: 1 if the calling thread now owns it, 0 if it is taken already. The
 * signed difference keeps working when the generation wraps around. */
static int claim_slice(struct threadpool_worker *w, uint32_t gen) {
    uint32_t c = atomic_load(&w->claimed);
    if ((int32_t)(gen - c) <= 0) return 0;
    return atomic_compare_exchange_strong(&w->claimed, &c, gen);
}

/* Run slice ith of the current run on this thread; in a guarded run, a fault ends the slice and
 * is recorded for the caller (the first fault of the run is the one it sees). */
static void run_slice(struct threadpool *p, uint32_t ith) {
    if (!p->guarded) {
        p->fn(p->arg, ith, p->n_threads);
        return;
    }
    fault_guard g;
    if (sigsetjmp(g.env, 0) == 0) {
        fault_guard_enter(&g);
        p->fn(p->arg, ith, p->n_threads);
        fault_guard_leave(&g);
    } else {
        int none = 0;
        if (atomic_compare_exchange_strong(&p->faulted, &none, 1)) p->fault = g.info;
    }
}

static void *worker_main(void *varg) {
    struct threadpool_worker *w = varg;
    struct threadpool *p = w->pool;
    uint32_t seen = 0; /* the pool starts at generation 0 and cannot run before we exist */
    for (;;) {
        seen = wait_for_change(&p->generation, seen, &p->generation_sleepers);
        if (atomic_load(&p->stop)) break;
        /* A worker that woke late may find its slice run by the caller, and the run (or several)
         * over: it then waits for the next generation. Owning the slice means the run cannot end
         * before we do, so fn and arg are still this run's. */
        if (!claim_slice(w, seen)) continue;
        run_slice(p, w->ith);
        /* The last worker out wakes the caller if it went to sleep. */
        if (atomic_fetch_sub(&p->pending, 1) == 1 && atomic_load(&p->pending_sleepers) != 0)
            futex_wake_all(&p->pending);
    }
    return NULL;
}

/* Wake the workers with `stop` set and join those that were started. */
static void threadpool_stop_workers(struct threadpool *p) {
    if (p->n_started == 0) return;
    atomic_store(&p->stop, 1);
    publish(&p->generation, atomic_load_explicit(&p->generation, memory_order_relaxed) + 1,
            &p->generation_sleepers);
    for (uint32_t i = 0; i < p->n_started; i++) pthread_join(p->threads[i], NULL);
    p->n_started = 0;
}

static void threadpool_free(struct threadpool *p) {
    free(p->threads);
    free(p->workers);
    free(p);
}

threadpool *threadpool_new(uint32_t n_threads, corral_error *err) {
    if (n_threads == 0) {
        const int cores = cpu_count_physical_cores();
        n_threads = cores > 0 ? (uint32_t)cores : 1;
        if (n_threads > THREADPOOL_MAX_THREADS) n_threads = THREADPOOL_MAX_THREADS;
    }
    if (n_threads > THREADPOOL_MAX_THREADS) {
        corral_error_set(err, CORRAL_INVALID_ARGUMENT, "%u threads requested; at most %u",
                         n_threads, THREADPOOL_MAX_THREADS);
        return NULL;
    }
    /* Over-aligned members: aligned_alloc needs a size that is a multiple of the alignment. */
    const size_t size = (sizeof(struct threadpool) + THREADPOOL_CACHE_LINE - 1) /
                        THREADPOOL_CACHE_LINE * THREADPOOL_CACHE_LINE;
    struct threadpool *p = aligned_alloc(THREADPOOL_CACHE_LINE, size);
    if (!p) {
        corral_error_set(err, CORRAL_OUT_OF_MEMORY, "out of memory for a pool of %u threads",
                         n_threads);
        return NULL;
    }
    memset(p, 0, size);
    p->n_threads = n_threads;
    if (fault_init(err) != CORRAL_OK) {
        free(p);
        return NULL;
    }
    atomic_init(&p->faulted, 0);
    atomic_init(&p->generation, 0);
    atomic_init(&p->generation_sleepers, 0);
    atomic_init(&p->pending, 0);
    atomic_init(&p->pending_sleepers, 0);
    atomic_init(&p->barrier_arrived, 0);
    atomic_init(&p->barrier_phase, 0);
    atomic_init(&p->barrier_sleepers, 0);
    atomic_init(&p->busy, 0);
    if (n_threads == 1) return p;

    const uint32_t n_workers = n_threads - 1;
    p->threads = calloc(n_workers, sizeof *p->threads);
    p->workers = aligned_alloc(THREADPOOL_CACHE_LINE, n_workers * sizeof *p->workers);
    if (!p->threads || !p->workers) {
        corral_error_set(err, CORRAL_OUT_OF_MEMORY, "out of memory for a pool of %u threads",
                         n_threads);
        threadpool_free(p);
        return NULL;
    }
    /* Workers inherit a mask that blocks every signal but those of faults: handlers run on the
     * process's threads, and a fault with its signal blocked would end the process. */
    sigset_t all, old;
    sigfillset(&all);
    static const int faults[] = {SIGBUS, SIGSEGV, SIGFPE, SIGILL};
    for (size_t i = 0; i < sizeof faults / sizeof faults[0]; i++) sigdelset(&all, faults[i]);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int rc = 0;
    for (uint32_t i = 0; i < n_workers; i++) {
        p->workers[i] = (struct threadpool_worker){.pool = p, .ith = i + 1};
        atomic_init(&p->workers[i].claimed, 0);
        rc = pthread_create(&p->threads[i], NULL, worker_main, &p->workers[i]);
        if (rc != 0) break;
        p->n_started++;
        char name[16];
        snprintf(name, sizeof name, "corral-w%u", i + 1);
        pthread_setname_np(p->threads[i], name);
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0) {
        corral_error_set(err, CORRAL_RESOURCE_EXHAUSTED, "cannot start worker thread %u of %u: %s",
                         p->n_started + 1, n_workers, strerror(rc));
        threadpool_stop_workers(p);
        threadpool_free(p);
        return NULL;
    }
    return p;
}

void threadpool_destroy(threadpool **pp) {
    if (!pp || !*pp) return;
    threadpool_stop_workers(*pp);
    threadpool_free(*pp);
    *pp = NULL;
}

uint32_t threadpool_n_threads(const threadpool *p) {
    return p ? p->n_threads : 1;
}

static void threadpool_run_impl(threadpool *p, threadpool_fn fn, void *arg, int steal) {
    if (!p || p->n_threads == 1) {
        /* One thread: a fault reaches the caller's own guard directly, and a run with barriers
         * has nobody else to wait for. */
        fn(arg, 0, 1);
        return;
    }
    if (atomic_exchange(&p->busy, 1) != 0) {
        /* Two runs at once, or a run from inside a run: the pool's state would be corrupted. */
        log_error("threadpool_run called while a run of the same pool is in progress",
                  LOG_UINT("threads", p->n_threads));
        abort();
    }
    p->fn = fn;
    p->arg = arg;
    p->guarded = steal; /* run_slices: no barriers, so a slice can be cut short */
    atomic_store_explicit(&p->faulted, 0, memory_order_relaxed);
    atomic_store_explicit(&p->pending, p->n_threads - 1, memory_order_relaxed);
    const uint32_t gen = atomic_load_explicit(&p->generation, memory_order_relaxed) + 1;
    fault_guard fatal;
    if (!steal) fault_guard_enter_fatal(&fatal);
    publish(&p->generation, gen, &p->generation_sleepers);
    run_slice(p, 0);
    /* Slices whose workers have not claimed them yet (asleep, or not scheduled) are ours. */
    for (uint32_t i = 1; steal && i < p->n_threads; i++) {
        if (!claim_slice(&p->workers[i - 1], gen)) continue;
        run_slice(p, i);
        atomic_fetch_sub(&p->pending, 1);
    }
    /* Wait for pending to reach 0: spin, then sleep on each value it passes through. */
    uint32_t left = atomic_load_explicit(&p->pending, memory_order_acquire);
    for (uint32_t i = 0; left != 0 && i < THREADPOOL_SPIN_ITERATIONS; i++) {
        cpu_relax();
        left = atomic_load_explicit(&p->pending, memory_order_acquire);
    }
    for (uint32_t i = 0; left != 0 && i < THREADPOOL_YIELD_ITERATIONS; i++) {
        sched_yield();
        left = atomic_load_explicit(&p->pending, memory_order_acquire);
    }
    if (left != 0) {
        atomic_fetch_add(&p->pending_sleepers, 1);
        while ((left = atomic_load(&p->pending)) != 0) futex_wait(&p->pending, left);
        atomic_fetch_sub(&p->pending_sleepers, 1);
    }
    if (!steal) fault_guard_leave(&fatal);
    /* Every slice is over (pending reached 0 with acquire order: the recorded fault is
     * visible). */
    const bool faulted = atomic_load(&p->faulted) != 0;
    const fault_info info = p->fault;
    atomic_store_explicit(&p->busy, 0, memory_order_release);
    if (faulted) fault_deliver(&info);
}

void threadpool_barrier(threadpool *p) {
    if (!p || p->n_threads == 1) return;
    const uint32_t phase = atomic_load_explicit(&p->barrier_phase, memory_order_acquire);
    if (atomic_fetch_add(&p->barrier_arrived, 1) + 1 == p->n_threads) {
        /* Nobody counts itself into the next barrier before it sees the new phase. */
        atomic_store_explicit(&p->barrier_arrived, 0, memory_order_relaxed);
        publish(&p->barrier_phase, phase + 1, &p->barrier_sleepers);
    } else {
        wait_for_change(&p->barrier_phase, phase, &p->barrier_sleepers);
    }
}

void threadpool_run(threadpool *p, threadpool_fn fn, void *arg) {
    threadpool_run_impl(p, fn, arg, 0);
}

void threadpool_run_slices(threadpool *p, threadpool_fn fn, void *arg) {
    threadpool_run_impl(p, fn, arg, 1);
}
