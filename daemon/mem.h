/*
 * mem.h — corrald's memory module. For now: the facts about the allocator. corrald is linked with
 * jemalloc so that memory can be accounted per owner and returned to the system when a model goes;
 * this module confirms at runtime that jemalloc really is the process allocator.
 */
#ifndef CORRAL_DAEMON_MEM_H
#define CORRAL_DAEMON_MEM_H

#include <stddef.h>

/* jemalloc's version string (mallctl "version"), or NULL if jemalloc is not linked in. */
const char *mem_allocator_version(void);

/* 1 if malloc() is served by jemalloc: a malloc() call moves jemalloc's per-thread allocation
 * counter. 0 when another allocator intercepts malloc (ASan builds do). */
int mem_allocator_is_jemalloc(void);

#endif /* CORRAL_DAEMON_MEM_H */
