/*
 * fuzz_imatrix.c — the importance matrix reader (engine/include/corral/imatrix.h) on arbitrary
 * bytes: llama.cpp's imatrix GGUF layout (through the GGUF reader: entries paired by name, sizes,
 * values) and llama-imatrix's older binary format (entry count, names, counts, values, the
 * optional trailer); then everything a quantizer reads of a matrix that loads.
 *
 * Invariants: a failure is CORRAL_FORMAT (or out of memory) with a message naming the file; a
 * matrix that loads has at least one entry, entries sorted by unique names found again by
 * imatrix_find, and every importance value finite and non-negative.
 */
#include <math.h>
#include <string.h>

#include "corral/imatrix.h"
#include "corral/status.h"
#include "fuzz.h"

#define NAME "fuzz.imatrix"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    corral_error err = {0};
    imatrix *im = imatrix_load_buffer(data, size, NAME, &err);
    if (!im) {
        FUZZ_CHECK(err.status == CORRAL_FORMAT || err.status == CORRAL_OUT_OF_MEMORY ||
                       err.status == CORRAL_UNSUPPORTED,
                   "status %d: %s", (int)err.status, err.message);
        FUZZ_CHECK(strstr(err.message, NAME) != NULL, "message does not name the file: %s",
                   err.message);
        return 0;
    }
    const uint32_t n = imatrix_n_entries(im);
    FUZZ_CHECK(n >= 1, "a matrix without entries loaded");
    for (uint32_t i = 0; i < n; i++) {
        const char *name = imatrix_entry_name(im, i);
        FUZZ_CHECK(name != NULL, "entry %u has no name", i);
        if (i > 0) FUZZ_CHECK(strcmp(imatrix_entry_name(im, i - 1), name) < 0, "entries unsorted");
        uint64_t nv = 0;
        const float *v = imatrix_find(im, name, &nv);
        FUZZ_CHECK(v != NULL && nv >= 1, "entry '%s' not found again", name);
        for (uint64_t j = 0; j < nv; j++)
            FUZZ_CHECK(isfinite(v[j]) && v[j] >= 0, "entry '%s': value %g", name, (double)v[j]);
        (void)imatrix_entry_tokens(im, name);
    }
    for (uint32_t i = 0; i < imatrix_n_datasets(im); i++)
        FUZZ_CHECK(imatrix_dataset(im, i) != NULL, "dataset %u", i);
    (void)imatrix_chunk_count(im);
    imatrix_destroy(&im);
    return 0;
}
