/*
 * fuzz_safetensors.c — the safetensors reader (adapters/safetensors.h), the container of PEFT
 * adapters' weights, on arbitrary bytes: the 8-byte header length, the JSON header (through
 * adapter_json, on jansson), every tensor entry and the layout checks; then what the PEFT loader
 * reads of a file that opens: every tensor by index and by name, its first elements as floats,
 * the metadata.
 *
 * Invariants: a failure is CORRAL_FORMAT with a message naming the file; a file that opens has
 * tensors whose bytes lie inside the buffer, whose size is their element count times the dtype's
 * size, which do not overlap and which cover the data buffer; names are unique and found again.
 */
#include "corral/status.h"
#include "fuzz.h"
#include "safetensors.h"

#define NAME "fuzz.safetensors"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    corral_error err = {0};
    safetensors_file *f = safetensors_open_buffer(data, size, NAME, &err);
    if (!f) {
        FUZZ_CHECK(err.status == CORRAL_FORMAT || err.status == CORRAL_OUT_OF_MEMORY ||
                       (size == 0 && err.status < 0),
                   "status %d: %s", (int)err.status, err.message);
        FUZZ_CHECK(strstr(err.message, NAME) != NULL, "message does not name the file: %s",
                   err.message);
        return 0;
    }
    const uint8_t *end = data + size;
    const uint64_t n = safetensors_tensor_count(f);
    uint64_t covered = 0;
    const uint8_t *lowest = end;
    for (uint64_t i = 0; i < n; i++) {
        const safetensors_tensor *t = safetensors_tensor_at(f, i);
        FUZZ_CHECK(t != NULL && t->name != NULL, "tensor %llu", (unsigned long long)i);
        FUZZ_CHECK(t->dtype < SAFETENSORS_DTYPE_COUNT && t->n_dims <= SAFETENSORS_MAX_DIMS,
                   "tensor '%s': dtype %d, %u dims", t->name, (int)t->dtype, t->n_dims);
        const uint64_t elems = safetensors_tensor_elements(t);
        FUZZ_CHECK(elems * safetensors_dtype_size(t->dtype) == t->size,
                   "tensor '%s': %llu elements of %zu bytes in %llu bytes", t->name,
                   (unsigned long long)elems, safetensors_dtype_size(t->dtype),
                   (unsigned long long)t->size);
        const uint8_t *p = t->data;
        FUZZ_CHECK(p >= data && p <= end && t->size <= (uint64_t)(end - p),
                   "tensor '%s' outside the buffer", t->name);
        if (p < lowest) lowest = p;
        covered += t->size;
        FUZZ_CHECK(safetensors_find_tensor(f, t->name) == t, "tensor '%s' not found by name",
                   t->name);
        float v[16];
        const uint64_t k = elems < 16 ? elems : 16;
        corral_status st = safetensors_tensor_to_f32(t, 0, k, v, &err);
        const int floats = t->dtype == SAFETENSORS_F32 || t->dtype == SAFETENSORS_F16 ||
                           t->dtype == SAFETENSORS_BF16;
        FUZZ_CHECK(floats ? st == CORRAL_OK : st == CORRAL_UNSUPPORTED,
                   "tensor '%s' (%s) to f32: %d", t->name, safetensors_dtype_name(t->dtype),
                   (int)st);
        if (floats && elems > 0)
            FUZZ_CHECK(safetensors_tensor_to_f32(t, elems - 1, 2, v, &err) ==
                           CORRAL_INVALID_ARGUMENT,
                       "tensor '%s': a range past the end was accepted", t->name);
    }
    FUZZ_CHECK(safetensors_tensor_at(f, n) == NULL, "tensor past the count");
    /* No holes and no overlaps: the tensors fill the data buffer from its start to the end. */
    if (n > 0)
        FUZZ_CHECK(covered == (uint64_t)(end - lowest), "%llu bytes of tensors in a buffer of %llu",
                   (unsigned long long)covered, (unsigned long long)(end - lowest));
    (void)safetensors_metadata(f, "format");
    (void)safetensors_find_tensor(f, "");
    safetensors_destroy(&f);
    FUZZ_CHECK(f == NULL, "safetensors_destroy left the pointer");
    return 0;
}
