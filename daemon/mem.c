/*
 * mem.c — allocator introspection through jemalloc's mallctl interface.
 */
#include "mem.h"

#include <jemalloc/jemalloc.h>
#include <stdint.h>
#include <stdlib.h>

const char *mem_allocator_version(void) {
    const char *version = NULL;
    size_t len = sizeof version;
    if (mallctl("version", &version, &len, NULL, 0) != 0) return NULL;
    return version;
}

int mem_allocator_is_jemalloc(void) {
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
