/*
 * refdata.c — readers for the shared reference files (formats in ../shared/README.md).
 */
#include "refdata.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

char *ref_read_file(const char *relative, size_t *len) {
    FILE *fp = fopen(test_shared_path(relative), "rb");
    if (!fp) return NULL;
    fseek(fp, 0, SEEK_END);
    long size = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    char *buf = size >= 0 ? malloc((size_t)size + 1) : NULL;
    if (!buf || fread(buf, 1, (size_t)size, fp) != (size_t)size) {
        free(buf);
        fclose(fp);
        return NULL;
    }
    fclose(fp);
    buf[size] = '\0';
    if (len) *len = (size_t)size;
    return buf;
}

int ref_read_index(ref_stem *rows, int max) {
    char *text = ref_read_file("reference/INDEX.tsv", NULL);
    if (!text) return -1;
    int n = 0;
    char *save = NULL;
    char *line = strtok_r(text, "\n", &save); /* header */
    while ((line = strtok_r(NULL, "\n", &save)) && n < max) {
        ref_stem *r = &rows[n];
        memset(r, 0, sizeof *r);
        char stop[8] = "";
        if (sscanf(line, "%127[^\t]\t%255[^\t]\t%255[^\t]\t%d\t%255[^\t]\t%d\t%7[^\t]", r->stem,
                   r->model, r->lora, &r->n_ids, r->prompt, &r->max_new, stop) == 7) {
            r->stop_on_eog = strcmp(stop, "yes") == 0;
            n++;
        }
    }
    free(text);
    return n;
}

int ref_read_ids(const char *relative, int32_t *ids, int max) {
    FILE *fp = fopen(test_shared_path(relative), "r");
    if (!fp) return -1;
    int n = 0;
    long v;
    while (n < max && fscanf(fp, "%ld", &v) == 1) ids[n++] = (int32_t)v;
    fclose(fp);
    return n;
}

float *ref_read_f32(const char *relative, size_t *n) {
    size_t len = 0;
    char *bytes = ref_read_file(relative, &len);
    if (!bytes) return NULL;
    float *f = malloc(len ? len : 1);
    if (f) memcpy(f, bytes, len);
    free(bytes);
    *n = len / sizeof(float);
    return f;
}

int ref_argmax(const float *x, int n) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

double ref_top1_margin(const float *x, int n) {
    const int best = ref_argmax(x, n);
    double second = -INFINITY;
    for (int i = 0; i < n; i++)
        if (i != best && x[i] > second) second = x[i];
    return x[best] - second;
}
