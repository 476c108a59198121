/*
 * refdata.h — reading the shared reference data (../shared/reference): the stem index, id lists
 * and logit matrices that llama.cpp and an independent float64 implementation produced.
 */
#ifndef CORRAL_REFDATA_H
#define CORRAL_REFDATA_H

#include <stddef.h>
#include <stdint.h>

/* One row of reference/INDEX.tsv. */
typedef struct ref_stem {
    char stem[128];
    char model[256]; /* relative to the shared dir, e.g. "models/stories260K.gguf" */
    char lora[256];  /* "-" or "lora/file.gguf:scale" */
    int n_ids;
    char prompt[256]; /* "text:Once upon a time" or "ids:1,262,..." */
    int max_new;
    int stop_on_eog;
} ref_stem;

/* Read INDEX.tsv. Returns the number of rows (at most max), or -1 when the file is unreadable. */
int ref_read_index(ref_stem *rows, int max);

/* Read whitespace-separated integers from a file under the shared dir. Returns the count read
 * (at most max), or -1. */
int ref_read_ids(const char *relative, int32_t *ids, int max);

/* Read a little-endian float32 file under the shared dir into a malloc'ed array; *n gets the
 * number of floats. NULL when unreadable. Caller frees. */
float *ref_read_f32(const char *relative, size_t *n);

/* Read a whole file under the shared dir into a malloc'ed, NUL-terminated buffer (*len bytes).
 * NULL when unreadable. Caller frees. */
char *ref_read_file(const char *relative, size_t *len);

/* The index of the largest of x[0..n) (the first on ties): a greedy choice. */
int ref_argmax(const float *x, int n);

/* How far the largest of x[0..n) is above the second: where it is small, float noise may flip
 * the greedy choice, so comparisons of greedy ids stop there. */
double ref_top1_margin(const float *x, int n);

#endif /* CORRAL_REFDATA_H */
