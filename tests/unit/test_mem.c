/*
 * test_mem.c — Check suite for corrald's memory accounting: allocations made in an owner's scope
 * are charged to it exactly (when jemalloc is the allocator), freed memory is uncharged, scopes
 * nest and restore, and destroying an owner returns its arena.
 */
#include <check.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "mem.h"
#include "testutil.h"

/* Allocations the compiler cannot elide (malloc/free pairs with unobserved results may be removed
 * altogether at -O3). */
static void *volatile keep;
static void *alloc(size_t n) {
    void *p = malloc(n);
    keep = p;
    return keep;
}

START_TEST(test_owner_is_charged_for_its_scope) {
    mem_thread_init(MEM_THREAD_CORE);
    mem_owner *a = mem_owner_new(), *b = mem_owner_new();
    ck_assert_ptr_nonnull(a);
    ck_assert_ptr_nonnull(b);
    if (!mem_accounting_exact()) {
        /* Sanitizer builds: the figures are what the user reports. */
        mem_owner_add_known(a, 1000);
        ck_assert_uint_eq(mem_owner_heap_bytes(a), 1000);
        mem_owner_destroy(&a);
        mem_owner_destroy(&b);
        return;
    }
    const uint64_t a0 = mem_owner_heap_bytes(a), b0 = mem_owner_heap_bytes(b);
    unsigned scope = mem_scope_enter(a);
    void *big = alloc(8 << 20);
    void *small[100];
    for (int i = 0; i < 100; i++) small[i] = alloc(100);
    unsigned inner = mem_scope_enter(b);
    void *other = alloc(1 << 20);
    mem_scope_leave(inner);
    void *back_in_a = alloc(1 << 20);
    mem_scope_leave(scope);
    void *outside = alloc(1 << 20);
    const uint64_t a1 = mem_owner_heap_bytes(a), b1 = mem_owner_heap_bytes(b);
    ck_assert_uint_ge(a1 - a0, (8u << 20) + (1u << 20) + 100 * 100);
    ck_assert_uint_lt(a1 - a0, (8u << 20) + (1u << 20) + 100 * 100 + (64u << 10));
    ck_assert_uint_ge(b1 - b0, 1u << 20);
    ck_assert_uint_lt(b1 - b0, (1u << 20) + (64u << 10));
    /* Frees from outside the scope go back to the owner's arena. */
    free(big);
    free(back_in_a);
    for (int i = 0; i < 100; i++) free(small[i]);
    free(other);
    free(outside);
    ck_assert_uint_le(mem_owner_heap_bytes(a), a0 + 1024);
    ck_assert_uint_le(mem_owner_heap_bytes(b), b0 + 1024);
    mem_owner_set_mapped(a, 12345);
    ck_assert_uint_eq(mem_owner_bytes(a), mem_owner_heap_bytes(a) + 12345);
    mem_owner_destroy(&a);
    mem_owner_destroy(&b);
    ck_assert_ptr_null(a);
}
END_TEST

START_TEST(test_destroy_returns_memory) {
    mem_thread_init(MEM_THREAD_CORE);
    if (!mem_accounting_exact()) return;
    const uint64_t rss0 = mem_rss_bytes();
    mem_owner *o = mem_owner_new();
    unsigned scope = mem_scope_enter(o);
    void *blocks[64];
    for (int i = 0; i < 64; i++) {
        blocks[i] = alloc(1 << 20);
        memset(blocks[i], 7, 1 << 20);
    }
    mem_scope_leave(scope);
    ck_assert_uint_ge(mem_rss_bytes(), rss0 + (48u << 20));
    for (int i = 0; i < 64; i++) free(blocks[i]);
    mem_owner_destroy(&o);
    /* Zero decay and the arena's destruction give the pages back at once. */
    ck_assert_uint_lt(mem_rss_bytes(), rss0 + (16u << 20));
}
END_TEST

START_TEST(test_null_and_figures) {
    ck_assert_uint_eq(mem_owner_heap_bytes(NULL), 0);
    ck_assert_uint_eq(mem_owner_mapped_bytes(NULL), 0);
    mem_owner_destroy(NULL);
    mem_owner *o = NULL;
    mem_owner_destroy(&o);
    ck_assert_uint_gt(mem_ram_bytes(), 64u << 20);
    ck_assert_uint_gt(mem_rss_bytes(), 0);
    ck_assert_ptr_nonnull(mem_allocator_version());
}
END_TEST

/* A thread of the core's kind that allocates 1 MiB and ends. */
static void *core_thread(void *arg) {
    (void)arg;
    mem_thread_init(MEM_THREAD_CORE);
    free(alloc(1 << 20));
    mem_thread_exit();
    return NULL;
}

START_TEST(test_allocations_are_counted_per_kind_of_thread) {
    if (!mem_accounting_exact()) {
        ck_assert_uint_eq(mem_allocated_bytes(MEM_THREAD_CORE), 0);
        return;
    }
    mem_thread_init(MEM_THREAD_FRONT);
    const uint64_t core0 = mem_allocated_bytes(MEM_THREAD_CORE);
    const uint64_t front0 = mem_allocated_bytes(MEM_THREAD_FRONT);
    /* This thread is a front end's: its allocation counts there, not for the core. */
    free(alloc(256 << 10));
    ck_assert_uint_ge(mem_allocated_bytes(MEM_THREAD_FRONT) - front0, 256 << 10);
    ck_assert_uint_eq(mem_allocated_bytes(MEM_THREAD_CORE), core0);
    /* A core thread's bytes stay counted after it ended (counters are cumulative). */
    pthread_t t;
    ck_assert_int_eq(pthread_create(&t, NULL, core_thread, NULL), 0);
    pthread_join(t, NULL);
    ck_assert_uint_ge(mem_allocated_bytes(MEM_THREAD_CORE) - core0, 1 << 20);
    ck_assert_uint_lt(mem_allocated_bytes(MEM_THREAD_FRONT) - front0, 1 << 20);
    mem_thread_exit();
}
END_TEST

static Suite *mem_suite(void) {
    Suite *s = suite_create("mem");
    TCase *core = tcase_create("core");
    tcase_add_test(core, test_owner_is_charged_for_its_scope);
    tcase_add_test(core, test_destroy_returns_memory);
    tcase_add_test(core, test_allocations_are_counted_per_kind_of_thread);
    suite_add_tcase(s, core);
    TCase *errors = tcase_create("errors");
    tcase_add_test(errors, test_null_and_figures);
    suite_add_tcase(s, errors);
    return s;
}

CORRAL_CHECK_MAIN(mem_suite)
