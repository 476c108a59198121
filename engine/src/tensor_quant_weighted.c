/*
 * tensor_quant_weighted.c — the importance-weighted quantizers: what llama.cpp's quantizers do
 * when they are given an importance matrix (ggml's quantize_row_<type>_impl), bit for bit.
 *
 * An importance matrix gives each column j of a weight matrix a weight qw[j]: the mean square of
 * the activations that column multiplies on some calibration text (imatrix.h). The error a
 * rounding of W[i][j] causes in the layer's output is then about qw[j] * (dW[i][j])^2, so instead
 * of the reference quantizers' heuristic weights (x^2, or rms + |x|) every scale search here
 * minimises sum qw[j] * (x[j] - q(x[j]))^2, softened by the value's own size:
 *     w[j] = qw[j] * sqrt(sigma2 + x[j]^2),
 * sigma2 being the row's mean square (Q4_0/Q4_1/Q5_0/Q5_1) or twice the super-block's (Q4_K/Q5_K).
 * Q6_K uses qw[j] as is. The searches themselves are the reference quantizers' own
 * (tensor__fit_scale_symmetric, tensor__fit_scale_min with a wider sweep of 37 grids), except that
 * Q4_K/Q5_K quantize their 8 sub-block scales and mins to 6 bits by a weighted search too
 * (fit_scale_positive, ggml's make_qp_quants) instead of dividing by the largest.
 *
 * The block-of-32 types differ from their references in one more way that ggml keeps: the scale a
 * search returns is stored (rounded to fp16) without re-rounding the codes against the stored
 * value. Bit-exactness needs the same float operations in the same order with no fused
 * multiply-add, as in tensor_quant.c (see its file comment).
 */
#include <assert.h>
#include <math.h>
#include <string.h>

#include "corral/tensor.h"
#include "tensor_blocks.h"
#include "tensor_quant.h"

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif

/* The sweep of the weighted min/scale search: grids of step (max - min) / (nmax - 0.9 + 0.05 k),
 * k = 0..36 (ggml's make_qkx3_quants parameters in every weighted caller). */
#define WEIGHTED_RMIN   -0.9f
#define WEIGHTED_RDELTA 0.05f
#define WEIGHTED_NSTEP  36

/* The mean square of a row: sum x^2 / n, summed in float in index order as ggml does. */
static float row_mean_square(const float *x, int64_t n) {
    float sum_x2 = 0;
    for (int64_t j = 0; j < n; j++) sum_x2 += x[j] * x[j];
    return sum_x2 / (float)n;
}

/* w[j] = qw[j] * sqrt(sigma2 + x[j]^2) for a group of n. */
static void group_weights(const float *x, const float *qw, float sigma2, int n, float *w) {
    for (int j = 0; j < n; j++) w[j] = qw[j] * sqrtf(sigma2 + x[j] * x[j]);
}

/*
 * Fit x[i] ~ scale * L[i] with L[i] in 0..nmax for non-negative x (the 8 scales or the 8 mins of
 * a K-quant super-block), minimising sum w[i] * (x[i] - scale * L[i])^2. (ggml's make_qp_quants.)
 *
 * The starting grid maps the largest x to nmax; 8 neighbours mapping it to nmax + 0.1 k
 * (k = -4..4, k != 0) are tried and the one of least weighted error kept. With those codes the
 * scale is the least-squares sum(w*x*L) / sum(w*L^2); then up to 5 passes of coordinate descent
 * move single codes to the value the others' fit asks for, when that lowers the error (the test
 * slx^2 / sl2 > sumlx^2 / suml2, without division). Codes live in uint8_t, as in ggml: a
 * (theoretical) negative x gives a code that wraps, exactly as there. Returns the scale, 0 for a
 * group whose largest value is below GROUP_MAX_EPS (its codes 0).
 */
static float fit_scale_positive(int n, int nmax, const float *restrict x, uint8_t *restrict L,
                                const float *restrict w) {
    float max = 0;
    for (int i = 0; i < n; i++) max = max > x[i] ? max : x[i];
    if (max < GROUP_MAX_EPS) {
        memset(L, 0, (size_t)n);
        return 0.0f;
    }
    float iscale = (float)nmax / max;
    for (int i = 0; i < n; i++) L[i] = (uint8_t)nearest_int(iscale * x[i]);
    const float scale = 1 / iscale;
    float best_mse = 0;
    for (int i = 0; i < n; i++) {
        const float diff = x[i] - scale * L[i];
        best_mse += w[i] * diff * diff;
    }
    for (int k = -4; k <= 4; k++) {
        if (k == 0) continue;
        const float iscale_k = (0.1f * (float)k + (float)nmax) / max;
        const float scale_k = 1 / iscale_k;
        float mse = 0;
        for (int i = 0; i < n; i++) {
            int l = nearest_int(iscale_k * x[i]);
            l = l < nmax ? l : nmax;
            const float diff = x[i] - scale_k * (float)l;
            mse += w[i] * diff * diff;
        }
        if (mse < best_mse) {
            best_mse = mse;
            iscale = iscale_k;
        }
    }
    float sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; i++) {
        int l = nearest_int(iscale * x[i]);
        l = l < nmax ? l : nmax;
        L[i] = (uint8_t)l;
        sumlx += w[i] * x[i] * (float)l;
        suml2 += w[i] * (float)l * (float)l;
    }
    for (int pass = 0; pass < 5; pass++) {
        int n_changed = 0;
        for (int i = 0; i < n; i++) {
            float slx = sumlx - w[i] * x[i] * (float)L[i];
            float sl2 = suml2 - w[i] * (float)L[i] * (float)L[i];
            if (slx > 0 && sl2 > 0) {
                int new_l = nearest_int(x[i] * sl2 / slx);
                new_l = new_l < nmax ? new_l : nmax;
                if (new_l != L[i]) {
                    slx += w[i] * x[i] * (float)new_l;
                    sl2 += w[i] * (float)new_l * (float)new_l;
                    if (slx * slx * suml2 > sumlx * sumlx * sl2) {
                        L[i] = (uint8_t)new_l;
                        sumlx = slx;
                        suml2 = sl2;
                        n_changed++;
                    }
                }
            }
        }
        if (!n_changed) break;
    }
    return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

/* ---- Q4_0 and Q5_0: symmetric, one scale per 32 --------------------------------------------- */

/* Codes 0..2*nmax-1 of each block from the weighted symmetric search, the scale stored as is. */
static void quantize_row_symmetric_weighted(const float *restrict x, int64_t n, const float *qw,
                                            int nmax, size_t block_bytes, void *blocks,
                                            void (*store)(void *block, const uint8_t *L)) {
    const float sigma2 = row_mean_square(x, n);
    for (int64_t ib = 0; ib < n / 32; ib++) {
        float w[32];
        uint8_t L[32];
        group_weights(x + 32 * ib, qw + 32 * ib, sigma2, 32, w);
        const float d = tensor__fit_scale_symmetric(32, nmax, x + 32 * ib, w, L);
        void *block = (char *)blocks + (size_t)ib * block_bytes;
        /* Every block type here starts with its fp16 scale. */
        const uint16_t dh = tensor_f32_to_fp16(d);
        memcpy(block, &dh, sizeof dh);
        store(block, L);
    }
}

static void store_q4_0(void *block, const uint8_t *L) {
    block_q4_0 *y = block;
    for (int j = 0; j < 16; j++) y->qs[j] = (uint8_t)(L[j] | L[j + 16] << 4);
}

static void store_q5(uint8_t qs[16], uint8_t qh[4], const uint8_t *L) {
    uint32_t bits = 0;
    for (int j = 0; j < 16; j++) {
        qs[j] = (uint8_t)((L[j] & 0x0F) | (L[j + 16] & 0x0F) << 4);
        bits |= (uint32_t)((L[j] & 0x10u) >> 4) << j;
        bits |= (uint32_t)((L[j + 16] & 0x10u) >> 4) << (j + 16);
    }
    for (int i = 0; i < 4; i++) qh[i] = (uint8_t)(bits >> (8 * i));
}

static void store_q5_0(void *block, const uint8_t *L) {
    block_q5_0 *y = block;
    store_q5(y->qs, y->qh, L);
}

void tensor__quantize_row_q4_0_weighted(const float *restrict src, void *restrict dst, int64_t n,
                                        const float *restrict qw) {
    assert(n % QK4_0 == 0);
    quantize_row_symmetric_weighted(src, n, qw, 8, sizeof(block_q4_0), dst, store_q4_0);
}

void tensor__quantize_row_q5_0_weighted(const float *restrict src, void *restrict dst, int64_t n,
                                        const float *restrict qw) {
    assert(n % QK5_0 == 0);
    quantize_row_symmetric_weighted(src, n, qw, 16, sizeof(block_q5_0), dst, store_q5_0);
}

/* ---- Q4_1 and Q5_1: scale and minimum per 32 ------------------------------------------------ */

void tensor__quantize_row_q4_1_weighted(const float *restrict src, void *restrict dst, int64_t n,
                                        const float *restrict qw) {
    assert(n % QK4_1 == 0);
    block_q4_1 *y = dst;
    const float sigma2 = row_mean_square(src, n);
    for (int64_t ib = 0; ib < n / QK4_1; ib++) {
        float w[QK4_1], min;
        uint8_t L[QK4_1];
        group_weights(src + QK4_1 * ib, qw + QK4_1 * ib, sigma2, QK4_1, w);
        const float d = tensor__fit_scale_min(QK4_1, 15, src + QK4_1 * ib, w, L, &min,
                                              WEIGHTED_RMIN, WEIGHTED_RDELTA, WEIGHTED_NSTEP);
        y[ib].d = tensor_f32_to_fp16(d);
        y[ib].m = tensor_f32_to_fp16(-min);
        for (int j = 0; j < 16; j++) y[ib].qs[j] = (uint8_t)(L[j] | L[j + 16] << 4);
    }
}

void tensor__quantize_row_q5_1_weighted(const float *restrict src, void *restrict dst, int64_t n,
                                        const float *restrict qw) {
    assert(n % QK5_1 == 0);
    block_q5_1 *y = dst;
    const float sigma2 = row_mean_square(src, n);
    for (int64_t ib = 0; ib < n / QK5_1; ib++) {
        float w[QK5_1], min;
        uint8_t L[QK5_1];
        group_weights(src + QK5_1 * ib, qw + QK5_1 * ib, sigma2, QK5_1, w);
        const float d = tensor__fit_scale_min(QK5_1, 31, src + QK5_1 * ib, w, L, &min,
                                              WEIGHTED_RMIN, WEIGHTED_RDELTA, WEIGHTED_NSTEP);
        y[ib].d = tensor_f32_to_fp16(d);
        y[ib].m = tensor_f32_to_fp16(-min);
        store_q5(y[ib].qs, y[ib].qh, L);
    }
}

/* ---- Q4_K and Q5_K --------------------------------------------------------------------------- */

/* One Q4_K (nmax 15) or Q5_K (nmax 31) super-block: per sub-block of 32 a weighted (scale, min)
 * fit; the 8 scales and the 8 mins quantized to 6 bits by fit_scale_positive, weighted by each
 * sub-block's total weight (capped at 63 when cap63, as ggml's Q5_K does); then the shared end
 * (tensor__k4_finish). */
static void k4_quantize_superblock_weighted(const float *restrict x, const float *restrict qw,
                                            int nmax, int cap63, uint8_t L[QK_K], uint16_t *d_out,
                                            uint16_t *dmin_out, uint8_t packed[K_SCALE_SIZE]) {
    float sum_x2 = 0;
    for (int l = 0; l < QK_K; l++) sum_x2 += x[l] * x[l];
    const float sigma2 = 2 * sum_x2 / QK_K;
    float scales[QK_K / 32], mins[QK_K / 32], sw[QK_K / 32];
    for (int j = 0; j < QK_K / 32; j++) {
        float w[32];
        group_weights(x + 32 * j, qw + 32 * j, sigma2, 32, w);
        float sumw = 0;
        for (int l = 0; l < 32; l++) sumw += w[l];
        sw[j] = sumw;
        scales[j] = tensor__fit_scale_min(32, nmax, x + 32 * j, w, L + 32 * j, &mins[j],
                                          WEIGHTED_RMIN, WEIGHTED_RDELTA, WEIGHTED_NSTEP);
    }
    uint8_t ls[QK_K / 32], lm[QK_K / 32];
    const float d_block = fit_scale_positive(QK_K / 32, 63, scales, ls, sw);
    const float m_block = fit_scale_positive(QK_K / 32, 63, mins, lm, sw);
    for (int j = 0; cap63 && j < QK_K / 32; j++) {
        ls[j] = ls[j] < 63 ? ls[j] : 63;
        lm[j] = lm[j] < 63 ? lm[j] : 63;
    }
    tensor__k4_finish(x, nmax, ls, lm, d_block, m_block, L, d_out, dmin_out, packed);
}

void tensor__quantize_row_q4_K_weighted(const float *restrict src, void *restrict dst, int64_t n,
                                        const float *restrict qw) {
    assert(n % QK_K == 0);
    block_q4_K *y = dst;
    for (int64_t i = 0; i < n / QK_K; i++) {
        uint8_t L[QK_K];
        k4_quantize_superblock_weighted(src + QK_K * i, qw + QK_K * i, 15, 0, L, &y[i].d,
                                        &y[i].dmin, y[i].scales);
        tensor__q4_K_store_codes(&y[i], L);
    }
}

/* ggml's Q5_K caps the 6-bit codes of the scales and mins at 63 where its Q4_K does not; they
 * differ only for a (theoretical) negative scale, whose code wrapped in uint8_t. */
void tensor__quantize_row_q5_K_weighted(const float *restrict src, void *restrict dst, int64_t n,
                                        const float *restrict qw) {
    assert(n % QK_K == 0);
    block_q5_K *y = dst;
    for (int64_t i = 0; i < n / QK_K; i++) {
        uint8_t L[QK_K];
        k4_quantize_superblock_weighted(src + QK_K * i, qw + QK_K * i, 31, 1, L, &y[i].d,
                                        &y[i].dmin, y[i].scales);
        tensor__q5_K_store_codes(&y[i], L);
    }
}

/* ---- Q6_K ------------------------------------------------------------------------------------ */

void tensor__quantize_row_q6_K_weighted(const float *restrict src, void *restrict dst, int64_t n,
                                        const float *restrict qw) {
    assert(n % QK_K == 0);
    block_q6_K *y = dst;
    for (int64_t i = 0; i < n / QK_K; i++) {
        tensor__q6_K_quantize_superblock(src + QK_K * i, qw + QK_K * i, &y[i]);
    }
}
