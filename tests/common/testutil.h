/*
 * testutil.h — small helpers shared by corral's Check suites: the main() every suite uses,
 * locating the shared test data (CORRAL_SHARED_DIR, set by ctest; ../shared otherwise), and a
 * reproducible pseudo-random sequence.
 */
#ifndef CORRAL_TESTUTIL_H
#define CORRAL_TESTUTIL_H

#include <check.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

/* Path of a file under the shared data folder, e.g. test_shared_path("models/stories260K.gguf").
 * Returns a pointer to a static buffer that the next call overwrites. */
static inline const char *test_shared_path(const char *relative) {
    static char path[4096];
    const char *dir = getenv("CORRAL_SHARED_DIR");
    snprintf(path, sizeof path, "%s/%s", dir && *dir ? dir : "../shared", relative);
    return path;
}

/* The next value of splitmix64 from *state: well mixed, fast, the same on every machine, so a
 * suite's random inputs are the same on every run. */
static inline uint64_t test_splitmix64(uint64_t *state) {
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* int main(void) that runs one suite and reports Check's summary line. */
#define CORRAL_CHECK_MAIN(make_suite)                     \
    int main(void) {                                      \
        SRunner *sr = srunner_create(make_suite());       \
        srunner_run_all(sr, CK_ENV);                      \
        int failed = srunner_ntests_failed(sr);           \
        srunner_free(sr);                                 \
        return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE; \
    }

#endif /* CORRAL_TESTUTIL_H */
