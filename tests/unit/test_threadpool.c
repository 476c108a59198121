/*
 * test_threadpool.c — Check suite for the thread pool: every thread runs every run exactly once,
 * long series of back-to-back runs (lost wake-ups would hang them: Check's timeout catches that,
 * no timing is measured), slices taken over by the caller, barrier phases, the pool of 1, the
 * default size, and the limits; and faults: a slice that reads a mapped file truncated under it
 * (SIGBUS) ends that slice, the run completes, and the fault reaches the caller's guard (fault.h).
 */
#include <check.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "corral/cpu.h"
#include "corral/fault.h"
#include "corral/threadpool.h"
#include "testutil.h"

enum { MAX_TEST_THREADS = THREADPOOL_MAX_THREADS, BARRIER_MAX_THREADS = 4 };

/* Per-thread run counts and what each thread saw. */
typedef struct count_job {
    _Atomic uint32_t calls[MAX_TEST_THREADS];
    _Atomic uint32_t bad_nth;
    _Atomic uint32_t bad_ith;
    uint32_t want_nth;
} count_job;

static void count_fn(void *arg, uint32_t ith, uint32_t nth) {
    count_job *j = arg;
    if (nth != j->want_nth) atomic_fetch_add(&j->bad_nth, 1);
    if (ith >= nth || ith >= MAX_TEST_THREADS) {
        atomic_fetch_add(&j->bad_ith, 1);
        return;
    }
    atomic_fetch_add(&j->calls[ith], 1);
}

static void check_counts(count_job *j, uint32_t n_threads, uint32_t runs) {
    ck_assert_uint_eq(atomic_load(&j->bad_nth), 0);
    ck_assert_uint_eq(atomic_load(&j->bad_ith), 0);
    for (uint32_t i = 0; i < n_threads; i++)
        ck_assert_msg(atomic_load(&j->calls[i]) == runs, "thread %u ran %u times, not %u", i,
                      atomic_load(&j->calls[i]), runs);
}

START_TEST(test_every_thread_runs_once_per_run) {
    for (uint32_t n = 1; n <= 4; n++) {
        corral_error err;
        threadpool *p = threadpool_new(n, &err);
        ck_assert_msg(p != NULL, "%s", err.message);
        ck_assert_uint_eq(threadpool_n_threads(p), n);
        count_job j = {.want_nth = n};
        for (uint32_t run = 1; run <= 5; run++) {
            threadpool_run(p, count_fn, &j);
            /* Checked after every run: threadpool_run returns only when all threads are done. */
            check_counts(&j, n, run);
        }
        threadpool_destroy(&p);
        ck_assert_ptr_null(p);
    }
}
END_TEST

/* The caller is thread 0. */
typedef struct caller_job {
    pthread_t caller;
    _Atomic int thread0_is_caller;
} caller_job;

static void caller_fn(void *arg, uint32_t ith, uint32_t nth) {
    (void)nth;
    caller_job *j = arg;
    if (ith == 0) atomic_store(&j->thread0_is_caller, pthread_equal(pthread_self(), j->caller));
}

START_TEST(test_caller_is_thread_zero) {
    corral_error err;
    threadpool *p = threadpool_new(3, &err);
    ck_assert_ptr_nonnull(p);
    caller_job j = {.caller = pthread_self()};
    threadpool_run(p, caller_fn, &j);
    ck_assert_int_eq(atomic_load(&j.thread0_is_caller), 1);
    threadpool_destroy(&p);
}
END_TEST

/* Each thread writes its own slice with plain stores; the caller reads them all after the run. */
typedef struct slice_job {
    uint32_t *out;
    uint32_t n;
    uint32_t value;
} slice_job;

static void slice_fn(void *arg, uint32_t ith, uint32_t nth) {
    slice_job *j = arg;
    const uint32_t lo = (uint32_t)((uint64_t)j->n * ith / nth),
                   hi = (uint32_t)((uint64_t)j->n * (ith + 1) / nth);
    for (uint32_t i = lo; i < hi; i++) j->out[i] = j->value + i;
}

/* Runs back to back, per pool size: enough to catch a lost wake-up (which hangs the test until
 * its timeout), few enough to finish on a busy machine, where every run waits for each of its
 * threads to be scheduled (10,000 took over 5 minutes at a load average of 20 with 2 s of CPU). */
#define BACK_TO_BACK_RUNS 2500

START_TEST(test_thousands_of_runs_back_to_back) {
    for (uint32_t n = 2; n <= 4; n++) {
        corral_error err;
        threadpool *p = threadpool_new(n, &err);
        ck_assert_ptr_nonnull(p);
        count_job cj = {.want_nth = n};
        uint32_t out[37];
        slice_job sj = {.out = out, .n = 37};
        for (uint32_t run = 0; run < BACK_TO_BACK_RUNS; run++) {
            threadpool_run(p, count_fn, &cj);
            sj.value = run * 100;
            threadpool_run(p, slice_fn, &sj);
            for (uint32_t i = 0; i < 37; i++)
                if (out[i] != run * 100 + i)
                    ck_abort_msg("%u threads, run %u: out[%u] = %u", n, run, i, out[i]);
        }
        check_counts(&cj, n, BACK_TO_BACK_RUNS);
        threadpool_destroy(&p);
    }
}
END_TEST

/* The same with threadpool_run_slices, whose slices may run on the caller. */
START_TEST(test_slices_thousands_of_runs) {
    for (uint32_t n = 1; n <= 4; n++) {
        corral_error err;
        threadpool *p = threadpool_new(n, &err);
        ck_assert_ptr_nonnull(p);
        count_job cj = {.want_nth = n};
        uint32_t out[37];
        slice_job sj = {.out = out, .n = 37};
        for (uint32_t run = 0; run < BACK_TO_BACK_RUNS; run++) {
            threadpool_run_slices(p, count_fn, &cj);
            sj.value = run * 100;
            threadpool_run_slices(p, slice_fn, &sj);
            for (uint32_t i = 0; i < 37; i++)
                if (out[i] != run * 100 + i)
                    ck_abort_msg("%u threads, run %u: out[%u] = %u", n, run, i, out[i]);
            /* Mixed with runs that keep every slice on its own thread. */
            if (run % 100 == 0) threadpool_run(p, count_fn, &cj);
        }
        check_counts(&cj, n, BACK_TO_BACK_RUNS + BACK_TO_BACK_RUNS / 100);
        threadpool_destroy(&p);
    }
}
END_TEST

/* Which thread ran each slice. */
typedef struct who_job {
    pthread_t ran_on[4];
    _Atomic uint32_t calls[4];
} who_job;

static void who_fn(void *arg, uint32_t ith, uint32_t nth) {
    (void)nth;
    who_job *j = arg;
    j->ran_on[ith] = pthread_self();
    atomic_fetch_add(&j->calls[ith], 1);
}

/* Workers asleep in the futex take tens of microseconds to wake; a trivial run is over long
 * before, so the caller runs their slices. Each slice still runs exactly once, and a worker that
 * wakes after the run is over must not run the old function again (counts checked after a
 * pause that lets every late worker get there). */
START_TEST(test_slices_taken_by_caller_when_workers_sleep) {
    corral_error err;
    threadpool *p = threadpool_new(3, &err);
    ck_assert_ptr_nonnull(p);
    int stolen = 0;
    for (int attempt = 0; attempt < 20; attempt++) {
        nanosleep(&(struct timespec){.tv_nsec = 5 * 1000 * 1000}, NULL);
        who_job j = {0};
        threadpool_run_slices(p, who_fn, &j);
        ck_assert(pthread_equal(j.ran_on[0], pthread_self()));
        for (int i = 1; i < 3; i++) stolen += pthread_equal(j.ran_on[i], pthread_self()) != 0;
        nanosleep(&(struct timespec){.tv_nsec = 5 * 1000 * 1000}, NULL);
        for (int i = 0; i < 3; i++)
            ck_assert_msg(atomic_load(&j.calls[i]) == 1, "slice %d ran %u times", i,
                          atomic_load(&j.calls[i]));
    }
    printf("  %d of 40 worker slices run by the caller\n", stolen);
    ck_assert_int_gt(stolen, 0);
    /* The workers still serve runs that need them. */
    count_job cj = {.want_nth = 3};
    threadpool_run(p, count_fn, &cj);
    check_counts(&cj, 3, 1);
    threadpool_destroy(&p);
}
END_TEST

/* Runs separated by pauses long enough for every worker to give up spinning and sleep in the
 * futex: the wake-up path, not the spinning one. */
START_TEST(test_runs_after_workers_sleep) {
    corral_error err;
    threadpool *p = threadpool_new(3, &err);
    ck_assert_ptr_nonnull(p);
    count_job j = {.want_nth = 3};
    for (uint32_t run = 1; run <= 20; run++) {
        nanosleep(&(struct timespec){.tv_nsec = 5 * 1000 * 1000}, NULL);
        threadpool_run(p, count_fn, &j);
        check_counts(&j, 3, run);
    }
    threadpool_destroy(&p);
}
END_TEST

/* Phases: in phase k every thread writes cell [k][ith], then after a barrier checks that every
 * thread's cell of phase k is written. A barrier that let a thread through early shows up as a
 * missing cell. The slow thread rotates so that each one is sometimes the last to arrive. */
enum { N_PHASES = 200 };

typedef struct barrier_job {
    threadpool *pool;
    uint32_t cells[N_PHASES][BARRIER_MAX_THREADS];
    _Atomic uint32_t missing;
} barrier_job;

static void barrier_fn(void *arg, uint32_t ith, uint32_t nth) {
    barrier_job *j = arg;
    for (uint32_t k = 0; k < N_PHASES; k++) {
        if (k % nth == ith) {
            volatile uint32_t spin = 0;
            for (uint32_t i = 0; i < 2000; i++) spin += i;
        }
        j->cells[k][ith] = k + 1;
        threadpool_barrier(j->pool);
        for (uint32_t t = 0; t < nth; t++)
            if (j->cells[k][t] != k + 1) atomic_fetch_add(&j->missing, 1);
    }
}

START_TEST(test_barrier_phases) {
    for (uint32_t n = 1; n <= BARRIER_MAX_THREADS; n++) {
        corral_error err;
        threadpool *p = threadpool_new(n, &err);
        ck_assert_ptr_nonnull(p);
        for (int rep = 0; rep < 5; rep++) {
            barrier_job *j = calloc(1, sizeof *j);
            j->pool = p;
            threadpool_run(p, barrier_fn, j);
            ck_assert_msg(atomic_load(&j->missing) == 0, "%u threads: %u cells not seen", n,
                          atomic_load(&j->missing));
            for (uint32_t k = 0; k < N_PHASES; k++)
                for (uint32_t t = 0; t < n; t++) ck_assert_uint_eq(j->cells[k][t], k + 1);
            free(j);
        }
        threadpool_destroy(&p);
    }
}
END_TEST

/* A pool of 1 and a NULL pool run inline: the function sees ith 0 of 1 on the caller's thread. */
START_TEST(test_pool_of_one_and_null_pool) {
    corral_error err;
    threadpool *p = threadpool_new(1, &err);
    ck_assert_ptr_nonnull(p);
    ck_assert_uint_eq(threadpool_n_threads(p), 1);
    caller_job cj = {.caller = pthread_self()};
    threadpool_run(p, caller_fn, &cj);
    ck_assert_int_eq(atomic_load(&cj.thread0_is_caller), 1);
    count_job j = {.want_nth = 1};
    threadpool_run(p, count_fn, &j);
    threadpool_run(NULL, count_fn, &j);
    check_counts(&j, 1, 2);
    threadpool_barrier(p); /* no-ops outside a multi-threaded run */
    threadpool_barrier(NULL);
    ck_assert_uint_eq(threadpool_n_threads(NULL), 1);
    threadpool_destroy(&p);
}
END_TEST

START_TEST(test_zero_threads_means_physical_cores) {
    corral_error err;
    threadpool *p = threadpool_new(0, &err);
    ck_assert_ptr_nonnull(p);
    const int cores = cpu_count_physical_cores();
    ck_assert_int_ge(cores, 1);
    ck_assert_uint_eq(threadpool_n_threads(p), (uint32_t)cores);
    count_job j = {.want_nth = (uint32_t)cores};
    threadpool_run(p, count_fn, &j);
    check_counts(&j, (uint32_t)cores, 1);
    threadpool_destroy(&p);
}
END_TEST

START_TEST(test_destroy_idle_and_never_run) {
    corral_error err;
    threadpool *p = threadpool_new(4, &err);
    ck_assert_ptr_nonnull(p);
    threadpool_destroy(&p); /* never ran: workers are parked at generation 0 */
    ck_assert_ptr_null(p);
    threadpool_destroy(&p); /* NULL-safe */
    threadpool_destroy(NULL);
    p = threadpool_new(3, &err);
    count_job j = {.want_nth = 3};
    threadpool_run(p, count_fn, &j);
    /* Long enough for the workers to be asleep in the futex when destroy wakes them. */
    nanosleep(&(struct timespec){.tv_nsec = 20 * 1000 * 1000}, NULL);
    threadpool_destroy(&p);
    ck_assert_ptr_null(p);
    check_counts(&j, 3, 1);
}
END_TEST

START_TEST(test_many_pools_created_and_destroyed) {
    for (uint32_t i = 0; i < 300; i++) {
        corral_error err;
        const uint32_t n = 1 + i % 4;
        threadpool *p = threadpool_new(n, &err);
        ck_assert_msg(p != NULL, "pool %u: %s", i, err.message);
        count_job j = {.want_nth = n};
        if (i % 2) threadpool_run(p, count_fn, &j); /* half of them never run */
        threadpool_destroy(&p);
        check_counts(&j, n, i % 2);
    }
    /* Two pools alive at once are independent. */
    corral_error err;
    threadpool *a = threadpool_new(2, &err), *b = threadpool_new(3, &err);
    ck_assert_ptr_nonnull(a);
    ck_assert_ptr_nonnull(b);
    count_job ja = {.want_nth = 2}, jb = {.want_nth = 3};
    for (int r = 0; r < 100; r++) {
        threadpool_run(a, count_fn, &ja);
        threadpool_run(b, count_fn, &jb);
    }
    check_counts(&ja, 2, 100);
    check_counts(&jb, 3, 100);
    threadpool_destroy(&a);
    threadpool_destroy(&b);
}
END_TEST

START_TEST(test_too_many_threads) {
    corral_error err;
    ck_assert_ptr_null(threadpool_new(THREADPOOL_MAX_THREADS + 1, &err));
    ck_assert_int_eq(err.status, CORRAL_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(err.message, "513"));
    ck_assert_ptr_null(threadpool_new(UINT32_MAX, &err));
    ck_assert_int_eq(err.status, CORRAL_INVALID_ARGUMENT);
}
END_TEST

/* Runs from two threads at once on one pool are refused by aborting (a programming error). */
static void nested_fn(void *arg, uint32_t ith, uint32_t nth) {
    (void)nth;
    threadpool *p = arg;
    if (ith == 0) threadpool_run(p, count_fn, &(count_job){.want_nth = 2});
}

START_TEST(test_nested_run_aborts) {
    corral_error err;
    threadpool *p = threadpool_new(2, &err);
    ck_assert_ptr_nonnull(p);
    threadpool_run(p, nested_fn, p); /* aborts: Check expects SIGABRT */
}
END_TEST

/* ---- faults ---------------------------------------------------------------------------------- */

/* A mapped file whose second page is gone (truncated after the mapping). */
typedef struct shrunk_map {
    const volatile unsigned char *map;
    size_t page;
    char path[64];
} shrunk_map;

static void shrunk_map_make(shrunk_map *s) {
    s->page = (size_t)sysconf(_SC_PAGESIZE);
    snprintf(s->path, sizeof s->path, "/tmp/corral-test-pool-XXXXXX");
    const int fd = mkstemp(s->path);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(ftruncate(fd, (off_t)(2 * s->page)), 0);
    void *m = mmap(NULL, 2 * s->page, PROT_READ, MAP_PRIVATE, fd, 0);
    ck_assert_ptr_ne(m, MAP_FAILED);
    s->map = m;
    ck_assert_int_eq(ftruncate(fd, (off_t)s->page), 0);
    close(fd);
}

static void shrunk_map_free(shrunk_map *s) {
    munmap((void *)s->map, 2 * s->page);
    unlink(s->path);
}

/* Slices below `faulty` write their index; the others read the missing page first. */
typedef struct fault_job {
    const shrunk_map *m;
    uint32_t faulty;
    _Atomic uint32_t done[8];
    _Atomic uint32_t started;
} fault_job;

static void fault_fn(void *arg, uint32_t ith, uint32_t nth) {
    (void)nth;
    fault_job *j = arg;
    atomic_fetch_add(&j->started, 1);
    if (ith >= j->faulty) (void)j->m->map[j->m->page + ith];
    atomic_store(&j->done[ith], 1);
}

/* Runs job on p under a guard; 1 when the fault came through. */
static int run_guarded(threadpool *p, fault_job *job, fault_info *info) {
    fault_guard g;
    if (sigsetjmp(g.env, 0) == 0) {
        fault_guard_enter(&g);
        threadpool_run_slices(p, fault_fn, job);
        fault_guard_leave(&g);
        return 0;
    }
    *info = g.info;
    return 1;
}

START_TEST(test_slice_fault_reaches_the_callers_guard) {
    shrunk_map m;
    shrunk_map_make(&m);
    for (uint32_t n = 1; n <= 4; n++) {
        corral_error err;
        threadpool *p = threadpool_new(n, &err);
        ck_assert_ptr_nonnull(p);
        /* Every slice faults, then only the last: many times, so that workers and the caller
         * both fault (which slice runs where depends on scheduling). */
        for (int round = 0; round < 200; round++) {
            fault_job job = {.m = &m, .faulty = round % 2 ? 0 : n - 1};
            fault_info info = {0};
            ck_assert_int_eq(run_guarded(p, &job, &info), 1);
            ck_assert_uint_eq(atomic_load(&job.started), n); /* every slice ran */
            ck_assert(info.addr >= (uintptr_t)m.map + m.page &&
                      info.addr < (uintptr_t)m.map + m.page + n);
            for (uint32_t i = 0; i < job.faulty; i++)
                ck_assert_uint_eq(atomic_load(&job.done[i]), 1); /* the others completed */
            for (uint32_t i = job.faulty; i < n; i++)
                ck_assert_uint_eq(atomic_load(&job.done[i]), 0); /* cut short */
        }
        /* The pool still works, and a run without a fault passes its guard. */
        count_job cj = {.want_nth = n};
        for (int run = 0; run < 100; run++) threadpool_run_slices(p, count_fn, &cj);
        check_counts(&cj, n, 100);
        fault_job fine = {.m = &m, .faulty = n};
        fault_info info;
        ck_assert_int_eq(run_guarded(p, &fine, &info), 0);
        threadpool_destroy(&p);
    }
    shrunk_map_free(&m);
}
END_TEST

START_TEST(test_slice_fault_without_a_guard_kills) {
    shrunk_map m;
    shrunk_map_make(&m);
    corral_error err;
    threadpool *p = threadpool_new(2, &err);
    fault_job job = {.m = &m, .faulty = 0};
    threadpool_run_slices(p, fault_fn, &job); /* dies of SIGBUS, as without the pool */
}
END_TEST

static Suite *threadpool_suite(void) {
    Suite *s = suite_create("threadpool");
    TCase *core = tcase_create("core");
    tcase_add_test(core, test_every_thread_runs_once_per_run);
    tcase_add_test(core, test_caller_is_thread_zero);
    tcase_add_test(core, test_thousands_of_runs_back_to_back);
    tcase_add_test(core, test_runs_after_workers_sleep);
    tcase_add_test(core, test_slices_thousands_of_runs);
    tcase_add_test(core, test_slices_taken_by_caller_when_workers_sleep);
    tcase_add_test(core, test_barrier_phases);
    tcase_add_test(core, test_pool_of_one_and_null_pool);
    tcase_add_test(core, test_zero_threads_means_physical_cores);
    tcase_add_test(core, test_destroy_idle_and_never_run);
    suite_add_tcase(s, core);
    TCase *limits = tcase_create("limits");
    tcase_add_test(limits, test_many_pools_created_and_destroyed);
    tcase_add_test(limits, test_too_many_threads);
    suite_add_tcase(s, limits);
    TCase *errors = tcase_create("errors");
    tcase_add_test_raise_signal(errors, test_nested_run_aborts, SIGABRT);
    tcase_add_test(errors, test_slice_fault_reaches_the_callers_guard);
    tcase_add_test_raise_signal(errors, test_slice_fault_without_a_guard_kills, SIGBUS);
    suite_add_tcase(s, errors);
    return s;
}

CORRAL_CHECK_MAIN(threadpool_suite)
