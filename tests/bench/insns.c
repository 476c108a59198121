/*
 * insns.c — `insns PATH TYPE REPS [TOKENS]`: REPS products of a 16-row weight of TYPE (4096
 * elements a row) with TOKENS activation rows (default 1: decode) on the kernel path PATH: the
 * path's panel kernel when it has one for the type, else its vec_dot row by row and token by
 * token (PATH scalar: always vec_dot, the reference kernels).
 *
 * It exists to be counted, not timed: tests/arm64/insn-count.sh runs it under qemu-aarch64-static
 * with one instruction per translation block and every block logged, for two values of REPS, and
 * divides the difference by the blocks computed. That gives executed instructions per weight
 * block and row on each ARM path and on the scalar path, the stand-in for speed that emulation
 * allows (README "ARM64"). Prints what it ran and a checksum of the outputs (so the compiler
 * keeps every call).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "corral/tensor.h"
#include "kernels.h"

enum { ROWS = KERNEL_PANEL_ROWS, N_IN = 4096, MAX_TOK = 16 };

int main(int argc, char **argv) {
    if (argc != 4 && argc != 5) {
        fprintf(stderr, "usage: insns PATH TYPE REPS [TOKENS]\n");
        return 2;
    }
    int path = -1;
    for (int p = 0; p < KERNEL_PATH_COUNT; p++)
        if (strcmp(argv[1], kernel_path_name((kernel_path)p)) == 0) path = p;
    tensor_type type = TENSOR_TYPE_COUNT;
    for (uint32_t t = 0; t < TENSOR_TYPE_COUNT; t++) {
        const tensor_type_traits *tt = tensor_type_get_traits(t);
        if (tt && tensor_type_is_supported(t) && strcmp(tt->name, argv[2]) == 0) type = t;
    }
    const int reps = atoi(argv[3]);
    const int n_tok = argc == 5 ? atoi(argv[4]) : 1;
    const kernel_ops *ops = path >= 0 ? kernels_for_path((kernel_path)path) : NULL;
    if (!ops || type == TENSOR_TYPE_COUNT || reps < 0 || n_tok < 1 || n_tok > MAX_TOK) {
        fprintf(stderr, "insns: no path '%s' on this CPU, or no type '%s'\n", argv[1], argv[2]);
        return 2;
    }
    const tensor_type_traits *tt = tensor_type_get_traits(type);
    const tensor_type act = tt->vec_dot_type;
    float *w = malloc(sizeof(float) * ROWS * N_IN), *x = malloc(sizeof(float) * N_IN * n_tok);
    uint64_t s = 0x9E3779B97F4A7C15ull;
    for (int i = 0; i < ROWS * N_IN + N_IN * n_tok; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        const float v = (float)(s >> 40) / (float)(1u << 24) - 0.5f;
        if (i < ROWS * N_IN)
            w[i] = v;
        else
            x[i - ROWS * N_IN] = v;
    }
    const size_t row = tensor_row_size(type, N_IN);
    uint8_t *q = malloc(row * ROWS), *panel = malloc(row * ROWS);
    for (int r = 0; r < ROWS; r++) tt->from_float(w + (size_t)r * N_IN, q + row * r, N_IN);
    const size_t yrow = tensor_row_size(act, N_IN);
    uint8_t *y = malloc(yrow * n_tok);
    for (int t = 0; t < n_tok; t++)
        ops->type[act].from_float(x + (size_t)t * N_IN, y + yrow * t, N_IN);
    const bool use_panel = ops->type[type].panel_dot && kernels_panel_layout_known(type);
    static kernel_act_aux aux[MAX_TOK][N_IN / 32];
    float *yf = malloc(sizeof(float) * N_IN * n_tok);
    if (use_panel) {
        kernels_panel_pack(type, q, N_IN, ROWS, 0, 1, panel);
        for (int t = 0; t < n_tok; t++) {
            if (act == TENSOR_TYPE_Q8_0) kernels_act_aux(y + yrow * t, N_IN, aux[t]);
            if (type == TENSOR_TYPE_F16)
                tensor_type_get_traits(act)->to_float(y + yrow * t, yf + (size_t)N_IN * t, N_IN);
        }
    }
    float out[MAX_TOK * ROWS];
    double sum = 0;
    for (int k = 0; k < reps; k++) {
        if (use_panel) {
            const bool f16 = type == TENSOR_TYPE_F16;
            ops->type[type].panel_dot(N_IN, panel, 1, f16 ? (void *)yf : y,
                                      f16 ? N_IN * sizeof(float) : yrow, aux[0], N_IN / 32, n_tok,
                                      out, ROWS);
        } else {
            for (int t = 0; t < n_tok; t++)
                for (int r = 0; r < ROWS; r++)
                    ops->type[type].vec_dot(N_IN, &out[t * ROWS + r], q + row * r, y + yrow * t);
        }
        for (int i = 0; i < n_tok * ROWS; i++) sum += out[i];
    }
    printf("%s %s %s reps %d tokens %d blocks/row %lld checksum %.6g\n", ops->name, tt->name,
           use_panel ? "panel" : "vec_dot", reps, n_tok, (long long)(N_IN / tt->block_size), sum);
    free(w), free(x), free(q), free(panel), free(y), free(yf);
    return 0;
}
