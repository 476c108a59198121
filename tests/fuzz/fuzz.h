/*
 * fuzz.h — what corral's fuzz targets share: libFuzzer's two entry points, an always-on check that
 * turns a broken invariant into a crash libFuzzer records, and the way to the shared test data.
 *
 * Every target in tests/fuzz/ is one file that defines LLVMFuzzerTestOneInput (and
 * LLVMFuzzerInitialize, even when it has nothing to set up, so that replay.c can call it). In the
 * fuzz build (CORRAL_FUZZ=ON, clang) libFuzzer supplies main(); in the ordinary gcc builds replay.c
 * does, running every input of the target's committed corpus once, so that each crash ever found
 * stays a regression test of `make test`.
 */
#ifndef CORRAL_FUZZ_H
#define CORRAL_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* An invariant of the code under test. Unlike assert it is on in Release builds too; failing it
 * prints what broke and aborts, which libFuzzer reports as a crash with the input saved. */
#define FUZZ_CHECK(cond, ...)                                                             \
    do {                                                                                  \
        if (!(cond)) {                                                                    \
            fprintf(stderr, "%s:%d: fuzz check failed: %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                                 \
            fputc('\n', stderr);                                                          \
            abort();                                                                      \
        }                                                                                 \
    } while (0)

/* The path of `relative` under the shared test data: $CORRAL_SHARED_DIR when set, else the folder
 * the build was configured with (CORRAL_SHARED_DIR in CMake, ../shared beside the repository).
 * Returns a static buffer that the next call overwrites; called from LLVMFuzzerInitialize only. */
static inline const char *fuzz_shared_path(const char *relative) {
    static char path[4096];
    const char *dir = getenv("CORRAL_SHARED_DIR");
    snprintf(path, sizeof path, "%s/%s", dir && *dir ? dir : CORRAL_FUZZ_SHARED_DIR, relative);
    return path;
}

/* The input as a NUL-terminated string (embedded NULs kept). Caller frees; aborts when memory runs
 * out, which libFuzzer's malloc limit reports. */
static inline char *fuzz_strdup(const uint8_t *data, size_t size) {
    char *s = malloc(size + 1);
    FUZZ_CHECK(s != NULL, "out of memory copying %zu bytes", size);
    if (size) memcpy(s, data, size);
    s[size] = '\0';
    return s;
}

#endif /* CORRAL_FUZZ_H */
