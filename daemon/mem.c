/*
 * mem.c — jemalloc arenas per owner, thread binding, and the figures eviction reads.
 *
 * Arenas are made with "arenas.create" and given zero dirty/muzzy decay, so freed pages go back
 * to the system at once instead of lingering for jemalloc's default ten seconds: what the
 * accounting says is released is really released. The scheduler thread runs with its thread
 * cache disabled, so a freed object cannot be handed out again from the cache to a different
 * owner's allocation (which would break the per-arena figures).
 */
#include "mem.h"

#include <jemalloc/jemalloc.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

#include "corral/log.h"

struct mem_owner {
    unsigned arena; /* jemalloc arena index; meaningful when exact */
    bool has_arena;
    _Atomic uint64_t mapped; /* file-mapped bytes */
    _Atomic int64_t known;   /* heap bytes the user reported */
};

const char *mem_allocator_version(void) {
    const char *version = NULL;
    size_t len = sizeof version;
    if (mallctl("version", &version, &len, NULL, 0) != 0) return NULL;
    return version;
}

static int probe_jemalloc(void) {
    uint64_t before = 0, after = 0;
    size_t len = sizeof before;
    if (mallctl("thread.allocated", &before, &len, NULL, 0) != 0) return 0;
    /* volatile keeps the compiler from eliding the malloc/free pair. */
    void *volatile probe = malloc(1 << 16);
    len = sizeof after;
    int rc = mallctl("thread.allocated", &after, &len, NULL, 0);
    free(probe);
    return rc == 0 && probe != NULL && after - before >= (1u << 16);
}

int mem_allocator_is_jemalloc(void) {
    static atomic_int cached = -1;
    int v = atomic_load(&cached);
    if (v < 0) {
        v = probe_jemalloc();
        atomic_store(&cached, v);
    }
    return v;
}

int mem_accounting_exact(void) {
    return mem_allocator_is_jemalloc();
}

/* The allocation counters of corrald's own threads (jemalloc's thread.allocatedp: cumulative
 * bytes allocated by the thread), summed per kind by mem_allocated_bytes. The lock keeps a thread
 * from ending while its counter is read. */
enum { MEM_COUNTED_THREADS = 64 };
static pthread_mutex_t counted_mu = PTHREAD_MUTEX_INITIALIZER;
static const uint64_t *counted[MEM_COUNTED_THREADS];
static mem_thread_kind counted_kind[MEM_COUNTED_THREADS];
static uint64_t counted_retired[MEM_THREAD_KIND_COUNT]; /* what threads that ended allocated */
static _Thread_local int counted_slot = -1;

static void count_this_thread(mem_thread_kind kind) {
    if (counted_slot >= 0) return;
    uint64_t *p = NULL;
    size_t len = sizeof p;
    if (mallctl("thread.allocatedp", &p, &len, NULL, 0) != 0 || !p) return;
    pthread_mutex_lock(&counted_mu);
    for (int i = 0; i < MEM_COUNTED_THREADS; i++)
        if (!counted[i]) {
            counted[i] = p;
            counted_kind[i] = kind;
            counted_slot = i;
            break;
        }
    pthread_mutex_unlock(&counted_mu);
}

void mem_thread_init(mem_thread_kind kind) {
    if (!mem_accounting_exact()) return;
    bool off = false;
    mallctl("thread.tcache.enabled", NULL, NULL, &off, sizeof off);
    count_this_thread(kind);
}

void mem_thread_exit(void) {
    if (counted_slot < 0) return;
    pthread_mutex_lock(&counted_mu);
    counted_retired[counted_kind[counted_slot]] += *counted[counted_slot];
    counted[counted_slot] = NULL;
    pthread_mutex_unlock(&counted_mu);
    counted_slot = -1;
}

uint64_t mem_allocated_bytes(mem_thread_kind kind) {
    pthread_mutex_lock(&counted_mu);
    uint64_t total = counted_retired[kind];
    for (int i = 0; i < MEM_COUNTED_THREADS; i++)
        if (counted[i] && counted_kind[i] == kind) total += *counted[i];
    pthread_mutex_unlock(&counted_mu);
    return total;
}

static int arena_ctl_ssize(unsigned arena, const char *what, ssize_t value) {
    char name[64];
    snprintf(name, sizeof name, "arena.%u.%s", arena, what);
    return mallctl(name, NULL, NULL, &value, sizeof value);
}

mem_owner *mem_owner_new(void) {
    mem_owner *o = calloc(1, sizeof *o);
    if (!o || !mem_accounting_exact()) return o;
    unsigned idx;
    size_t len = sizeof idx;
    if (mallctl("arenas.create", &idx, &len, NULL, 0) != 0) {
        log_error("jemalloc cannot create an arena");
        free(o);
        return NULL;
    }
    o->arena = idx;
    o->has_arena = true;
    /* Return freed pages immediately. */
    arena_ctl_ssize(idx, "dirty_decay_ms", 0);
    arena_ctl_ssize(idx, "muzzy_decay_ms", 0);
    return o;
}

void mem_owner_destroy(mem_owner **po) {
    if (!po || !*po) return;
    mem_owner *o = *po;
    if (o->has_arena) {
        char name[64];
        snprintf(name, sizeof name, "arena.%u.destroy", o->arena);
        if (mallctl(name, NULL, NULL, NULL, 0) != 0)
            log_warn("jemalloc arena not destroyed", LOG_UINT("arena", o->arena));
    }
    free(o);
    *po = NULL;
}

static unsigned bind_arena(unsigned arena) {
    unsigned old = 0;
    size_t len = sizeof old;
    if (mallctl("thread.arena", &old, &len, &arena, sizeof arena) != 0) return arena;
    return old;
}

/* The arena a thread uses when not in an owner's scope. */
static unsigned default_arena(void) {
    return 0;
}

unsigned mem_scope_enter(const mem_owner *o) {
    if (!mem_accounting_exact()) return 0;
    return bind_arena(o && o->has_arena ? o->arena : default_arena());
}

unsigned mem_scope_default(void) {
    return mem_scope_enter(NULL);
}

void mem_scope_leave(unsigned token) {
    if (!mem_accounting_exact()) return;
    bind_arena(token);
}

static uint64_t arena_allocated(unsigned arena) {
    uint64_t epoch = 1;
    size_t len = sizeof epoch;
    mallctl("epoch", &epoch, &len, &epoch, len); /* refresh the statistics */
    uint64_t total = 0;
    const char *parts[] = {"small.allocated", "large.allocated"};
    for (int i = 0; i < 2; i++) {
        char name[96];
        snprintf(name, sizeof name, "stats.arenas.%u.%s", arena, parts[i]);
        size_t value = 0;
        len = sizeof value;
        if (mallctl(name, &value, &len, NULL, 0) == 0) total += value;
    }
    return total;
}

uint64_t mem_allocation_size(uint64_t size) {
    if (size == 0 || !mem_allocator_is_jemalloc()) return size;
    const size_t real = nallocx((size_t)size, 0);
    return real ? real : size;
}

uint64_t mem_heap_live_bytes(void) {
    if (!mem_allocator_is_jemalloc()) return 0;
    uint64_t epoch = 1;
    size_t len = sizeof epoch;
    mallctl("epoch", &epoch, &len, &epoch, len); /* refresh the statistics */
    size_t value = 0;
    len = sizeof value;
    return mallctl("stats.allocated", &value, &len, NULL, 0) == 0 ? value : 0;
}

uint64_t mem_owner_heap_bytes(const mem_owner *o) {
    if (!o) return 0;
    if (o->has_arena) return arena_allocated(o->arena);
    const int64_t known = atomic_load(&o->known);
    return known > 0 ? (uint64_t)known : 0;
}

void mem_owner_set_mapped(mem_owner *o, uint64_t bytes) {
    if (o) atomic_store(&o->mapped, bytes);
}

uint64_t mem_owner_mapped_bytes(const mem_owner *o) {
    return o ? atomic_load(&o->mapped) : 0;
}

void mem_owner_add_known(mem_owner *o, int64_t delta) {
    if (o) atomic_fetch_add(&o->known, delta);
}

uint64_t mem_owner_bytes(const mem_owner *o) {
    return mem_owner_heap_bytes(o) + mem_owner_mapped_bytes(o);
}

uint64_t mem_rss_bytes(void) {
    FILE *fp = fopen("/proc/self/status", "r");
    if (!fp) return 0;
    char line[256];
    uint64_t kb = 0;
    while (fgets(line, sizeof line, fp))
        if (sscanf(line, "VmRSS: %lu kB", (unsigned long *)&kb) == 1) break;
    fclose(fp);
    return kb * 1024;
}

uint64_t mem_ram_bytes(void) {
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
    return pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page : 0;
}
