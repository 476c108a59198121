/*
 * test_fault.c — Check suite for fault guards (fault.h): a read of a mapped file that was
 * truncated under the mapping raises SIGBUS; inside a guard it becomes a jump back to the guard
 * with the address and the cause, as often as it happens; guards nest; outside a guard, in a
 * fatal region or for a SIGBUS sent by kill() the process still dies of SIGBUS.
 */
#include <check.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "corral/fault.h"
#include "testutil.h"

/* A file of two pages mapped read-only, then truncated to one: its second page faults. */
typedef struct shrunk {
    char path[64];
    const volatile unsigned char *map;
    size_t page;
} shrunk;

static void shrunk_make(shrunk *s) {
    s->page = (size_t)sysconf(_SC_PAGESIZE);
    snprintf(s->path, sizeof s->path, "/tmp/corral-test-fault-XXXXXX");
    const int fd = mkstemp(s->path);
    ck_assert_int_ge(fd, 0);
    unsigned char *buf = malloc(2 * s->page);
    memset(buf, 0x5a, 2 * s->page);
    ck_assert_int_eq(write(fd, buf, 2 * s->page), (ssize_t)(2 * s->page));
    free(buf);
    void *m = mmap(NULL, 2 * s->page, PROT_READ, MAP_PRIVATE, fd, 0);
    ck_assert_ptr_ne(m, MAP_FAILED);
    s->map = m;
    ck_assert_int_eq(s->map[s->page], 0x5a); /* read in while the file is whole */
    ck_assert_int_eq(ftruncate(fd, (off_t)s->page), 0);
    close(fd);
}

static void shrunk_free(shrunk *s) {
    munmap((void *)s->map, 2 * s->page);
    unlink(s->path);
}

/* Read the byte at p (the compiler may not drop the read). */
static unsigned char touch(const volatile unsigned char *p) {
    return *p;
}

START_TEST(test_guard_catches_a_read_past_the_end_of_a_file) {
    ck_assert_int_eq(fault_init(NULL), CORRAL_OK);
    shrunk s;
    shrunk_make(&s);
    ck_assert_int_eq(touch(s.map), 0x5a); /* the first page is still the file's */
    ck_assert(!fault_guarded());
    fault_guard g;
    volatile int reached_end = 0;
    if (sigsetjmp(g.env, 0) == 0) {
        fault_guard_enter(&g);
        ck_assert(fault_guarded());
        touch(s.map + s.page + 10);
        reached_end = 1;
        fault_guard_leave(&g);
    }
    ck_assert_int_eq(reached_end, 0);
    ck_assert(!fault_guarded()); /* the fault left the guard */
    ck_assert_uint_eq(g.info.addr, (uintptr_t)(s.map + s.page + 10));
    ck_assert_int_eq(g.info.code, BUS_ADRERR);
    ck_assert_ptr_nonnull(strstr(fault_code_text(g.info.code), "shorter"));
    shrunk_free(&s);
}
END_TEST

START_TEST(test_guard_without_fault_leaves_cleanly) {
    ck_assert_int_eq(fault_init(NULL), CORRAL_OK);
    fault_guard g;
    volatile int ran = 0;
    if (sigsetjmp(g.env, 0) == 0) {
        fault_guard_enter(&g);
        ran = 1;
        fault_guard_leave(&g);
    } else {
        ck_abort_msg("no fault happened");
    }
    ck_assert_int_eq(ran, 1);
    ck_assert(!fault_guarded());
}
END_TEST

START_TEST(test_guards_nest_and_the_inner_one_catches) {
    ck_assert_int_eq(fault_init(NULL), CORRAL_OK);
    shrunk s;
    shrunk_make(&s);
    fault_guard outer, inner;
    volatile int inner_caught = 0, outer_caught = 0;
    if (sigsetjmp(outer.env, 0) == 0) {
        fault_guard_enter(&outer);
        if (sigsetjmp(inner.env, 0) == 0) {
            fault_guard_enter(&inner);
            touch(s.map + s.page);
            fault_guard_leave(&inner);
        } else {
            inner_caught = 1;
        }
        ck_assert(fault_guarded()); /* the outer one is still armed */
        /* A second fault goes to the outer guard. */
        touch(s.map + s.page + 1);
        fault_guard_leave(&outer);
    } else {
        outer_caught = 1;
    }
    ck_assert_int_eq(inner_caught, 1);
    ck_assert_int_eq(outer_caught, 1);
    ck_assert(!fault_guarded());
    shrunk_free(&s);
}
END_TEST

START_TEST(test_fault_deliver_hands_a_fault_to_the_guard) {
    fault_guard g;
    volatile int caught = 0;
    const fault_info info = {.code = BUS_ADRERR, .addr = 0x1234};
    if (sigsetjmp(g.env, 0) == 0) {
        fault_guard_enter(&g);
        fault_deliver(&info);
    } else {
        caught = 1;
    }
    ck_assert_int_eq(caught, 1);
    ck_assert_uint_eq(g.info.addr, 0x1234);
}
END_TEST

/* The mask survives the jumps (SA_NODEFER): a thousand faults in a row are all caught. */
START_TEST(test_a_thousand_faults_in_a_row) {
    ck_assert_int_eq(fault_init(NULL), CORRAL_OK);
    shrunk s;
    shrunk_make(&s);
    volatile int caught = 0;
    for (int i = 0; i < 1000; i++) {
        fault_guard g;
        if (sigsetjmp(g.env, 0) == 0) {
            fault_guard_enter(&g);
            touch(s.map + s.page + (size_t)i);
            fault_guard_leave(&g);
        } else {
            caught++;
        }
    }
    ck_assert_int_eq(caught, 1000);
    sigset_t now;
    pthread_sigmask(SIG_BLOCK, NULL, &now);
    ck_assert(!sigismember(&now, SIGBUS));
    shrunk_free(&s);
}
END_TEST

START_TEST(test_fault_outside_a_guard_still_kills) {
    ck_assert_int_eq(fault_init(NULL), CORRAL_OK);
    shrunk s;
    shrunk_make(&s);
    touch(s.map + s.page); /* dies of SIGBUS (the test expects it) */
    shrunk_free(&s);
}
END_TEST

START_TEST(test_fault_in_a_fatal_region_kills) {
    ck_assert_int_eq(fault_init(NULL), CORRAL_OK);
    shrunk s;
    shrunk_make(&s);
    fault_guard outer, fatal;
    if (sigsetjmp(outer.env, 0) == 0) {
        fault_guard_enter(&outer);
        fault_guard_enter_fatal(&fatal);
        ck_assert(!fault_guarded());
        touch(s.map + s.page); /* dies: the fatal region hides the outer guard */
        fault_guard_leave(&fatal);
        fault_guard_leave(&outer);
    }
    ck_abort_msg("the outer guard caught a fault of a fatal region");
}
END_TEST

START_TEST(test_sigbus_from_kill_is_not_caught) {
    ck_assert_int_eq(fault_init(NULL), CORRAL_OK);
    fault_guard g;
    if (sigsetjmp(g.env, 0) == 0) {
        fault_guard_enter(&g);
        kill(getpid(), SIGBUS); /* not a fault: the default action ends the process */
        fault_guard_leave(&g);
    }
    ck_abort_msg("a SIGBUS sent by kill() was taken for a fault");
}
END_TEST

START_TEST(test_deliver_without_a_guard_kills) {
    const fault_info info = {.code = BUS_ADRERR, .addr = 0x1234};
    fault_deliver(&info);
}
END_TEST

static Suite *fault_suite(void) {
    Suite *s = suite_create("fault");
    TCase *core = tcase_create("core");
    tcase_add_test(core, test_guard_catches_a_read_past_the_end_of_a_file);
    tcase_add_test(core, test_guard_without_fault_leaves_cleanly);
    tcase_add_test(core, test_guards_nest_and_the_inner_one_catches);
    tcase_add_test(core, test_fault_deliver_hands_a_fault_to_the_guard);
    suite_add_tcase(s, core);
    TCase *limits = tcase_create("limits");
    tcase_add_test(limits, test_a_thousand_faults_in_a_row);
    suite_add_tcase(s, limits);
    TCase *errors = tcase_create("errors");
    tcase_add_test_raise_signal(errors, test_fault_outside_a_guard_still_kills, SIGBUS);
    tcase_add_test_raise_signal(errors, test_fault_in_a_fatal_region_kills, SIGBUS);
    tcase_add_test_raise_signal(errors, test_sigbus_from_kill_is_not_caught, SIGBUS);
    tcase_add_test_raise_signal(errors, test_deliver_without_a_guard_kills, SIGBUS);
    suite_add_tcase(s, errors);
    return s;
}

CORRAL_CHECK_MAIN(fault_suite)
