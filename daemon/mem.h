/*
 * mem.h — corrald's memory accounting: who holds how many bytes.
 *
 * Every model is a memory *owner* with a jemalloc arena of its own. While the scheduler works on
 * a model's objects (loading it, its runner's scratch, the KV caches of its requests and sessions)
 * it binds its thread's allocations to that arena (mem_scope_enter), so the arena's statistics
 * are exactly what the model holds on the heap, and destroying the arena when the model goes
 * returns the memory to the system at once. The weights themselves are a file mapping, counted
 * as the owner's mapped bytes. Anything that must outlive the model (messages for clients,
 * sessions' bookkeeping) is allocated in the default arena (mem_scope_default).
 *
 * When jemalloc is not the process allocator (sanitizer builds replace malloc), arenas are not
 * used and an owner's heap bytes are the estimate its user keeps with mem_owner_add_known();
 * mem_accounting_exact() says which mode is on.
 *
 * Threads: owners are created, bound and destroyed by one thread (the scheduler); the byte
 * counts may be read by any thread.
 */
#ifndef CORRAL_DAEMON_MEM_H
#define CORRAL_DAEMON_MEM_H

#include <stddef.h>
#include <stdint.h>

/* jemalloc's version string (mallctl "version"), or NULL if jemalloc is not linked in. */
const char *mem_allocator_version(void);

/* 1 if malloc() is served by jemalloc: a malloc() call moves jemalloc's per-thread allocation
 * counter. 0 when another allocator intercepts malloc (ASan builds do). Cached after the first
 * call. */
int mem_allocator_is_jemalloc(void);

/* 1 when owners' heap figures come from jemalloc arenas (exact), 0 when they are estimates. */
int mem_accounting_exact(void);

typedef struct mem_owner mem_owner;

/* Which of corrald's threads a thread is, for the allocation counters. */
typedef enum mem_thread_kind {
    MEM_THREAD_CORE = 0,  /* the compute thread and the actors */
    MEM_THREAD_FRONT = 1, /* a front end's thread (its transport library allocates there too) */
    MEM_THREAD_KIND_COUNT
} mem_thread_kind;

/* Prepare the calling thread to allocate for owners: turns its jemalloc thread cache off, so a
 * freed object cannot be handed out again from the cache to another owner's allocation, and counts
 * its allocations in mem_allocated_bytes(kind). Call it once in every thread of corrald's own,
 * and mem_thread_exit before such a thread ends. */
void mem_thread_init(mem_thread_kind kind);
void mem_thread_exit(void);

/* Bytes allocated so far by the threads of that kind (jemalloc's per-thread counters, cumulative:
 * frees do not subtract). 0 when jemalloc is not the allocator. What a request costs in
 * allocations is the difference before and after it. Thread-safe. */
uint64_t mem_allocated_bytes(mem_thread_kind kind);

/* What an allocation of `size` bytes really takes: jemalloc rounds a request up to its size class
 * (up to a quarter more for large ones: 847,872 bytes take 917,504). For plans that must match
 * the accounting to the byte. `size` itself when jemalloc is not the allocator. Thread-safe. */
uint64_t mem_allocation_size(uint64_t size);

/* Bytes the process holds on the heap now, over every arena and thread (jemalloc's
 * stats.allocated, refreshed by this call); 0 when jemalloc is not the allocator. What stays
 * allocated after work that should free everything it took (a reload, a request) is the
 * difference before and after it. Thread-safe. */
uint64_t mem_heap_live_bytes(void);

/* A new owner with its own arena (when accounting is exact). NULL when out of memory or when
 * jemalloc cannot create an arena. Caller owns the result. */
mem_owner *mem_owner_new(void);

/* Destroy the owner. Its arena is destroyed with everything still allocated in it: every object
 * allocated in the owner's scope must have been freed before. NULL-safe; sets *o to NULL. */
void mem_owner_destroy(mem_owner **o);

/* Bind the calling thread's allocations to o's arena (o NULL: the default arena). Returns a token
 * for mem_scope_leave, which restores the previous binding. Scopes nest. */
unsigned mem_scope_enter(const mem_owner *o);
void mem_scope_leave(unsigned token);

/* Bind to the default arena (for objects that must outlive any model); restore with
 * mem_scope_leave. */
unsigned mem_scope_default(void);

/* Bytes the owner holds on the heap: its arena's allocated bytes when exact, else the known
 * bytes. Thread-safe. */
uint64_t mem_owner_heap_bytes(const mem_owner *o);

/* The owner's file-mapped bytes (weights), set by its user. Thread-safe. */
void mem_owner_set_mapped(mem_owner *o, uint64_t bytes);
uint64_t mem_owner_mapped_bytes(const mem_owner *o);

/* Heap bytes the user knows it allocated in the owner's scope (KV caches, scratch): the figure
 * used when accounting is not exact. Thread-safe. */
void mem_owner_add_known(mem_owner *o, int64_t delta);

/* Heap plus mapped bytes. */
uint64_t mem_owner_bytes(const mem_owner *o);

/* The process's resident set (VmRSS) and the machine's RAM, in bytes; 0 if unknown. */
uint64_t mem_rss_bytes(void);
uint64_t mem_ram_bytes(void);

#endif /* CORRAL_DAEMON_MEM_H */
