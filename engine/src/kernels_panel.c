/*
 * kernels_panel.c — the panel layout of weight matrices (kernels.h explains it): packing rows
 * into panels, getting a row back out, and the per-block side data of Q8_0 activations that the
 * panel kernels use. Portable C, shared by every path; the panel kernels themselves are in
 * kernels_panel.inc, compiled once per SIMD path.
 *
 * The layout is described per type by its runs of units (tensor_blocks.h gives the fields):
 * fp16 scales are 2-byte units, everything else 4-byte units. Packing and unpacking are the same
 * walk over the units with the copy turned around. Q6_K's codes are also rearranged within the
 * block before they are cut into units (panel_q6_K_recode), so that its kernel spends fewer
 * instructions putting them together.
 */
#include <stddef.h>
#include <string.h>

#include "kernels.h"
#include "tensor_blocks.h"

/* Bytes [offset, offset + length) of a block, cut into units of `unit` bytes. */
typedef struct panel_run {
    uint16_t offset, length, unit;
} panel_run;

typedef struct panel_layout {
    int n_runs;
    panel_run runs[4];
} panel_layout;

/* The units of each type's block; every byte of the block is in exactly one run. */
static const panel_layout panel_layouts[TENSOR_TYPE_COUNT] = {
    [TENSOR_TYPE_Q4_0] = {2, {{0, 2, 2}, {offsetof(block_q4_0, qs), QK4_0 / 2, 4}}},
    [TENSOR_TYPE_Q8_0] = {2, {{0, 2, 2}, {offsetof(block_q8_0, qs), QK8_0, 4}}},
    [TENSOR_TYPE_Q4_K] = {3,
                          {{0, 4, 2},
                           {offsetof(block_q4_K, scales), K_SCALE_SIZE, 4},
                           {offsetof(block_q4_K, qs), QK_K / 2, 4}}},
    [TENSOR_TYPE_Q6_K] = {2, {{0, offsetof(block_q6_K, d), 4}, {offsetof(block_q6_K, d), 2, 2}}},
    [TENSOR_TYPE_F16] = {1, {{0, 2, 2}}},
};

int kernels_panel_layout_known(tensor_type type) {
    return type >= 0 && type < TENSOR_TYPE_COUNT && panel_layouts[type].n_runs > 0;
}

/* Copy one unit of `unit` bytes (2 or 4: constant sizes, so that the copies compile to moves). */
static inline void panel_unit_copy(uint8_t *to, const uint8_t *from, unsigned unit) {
    if (unit == 4)
        memcpy(to, from, 4);
    else
        memcpy(to, from, 2);
}

/*
 * Q6_K in panels. The file keeps a code's low 4 bits in ql and its high 2 bits in qh: elements
 * 128h + 4g + e (k = 0), + 32 (k = 1), + 64 (k = 2) and + 96 (k = 3), for half h, group g (0..7)
 * and e (0..3), are the low nibble of ql[64h + 4g + e], of ql[64h + 32 + 4g + e], the high
 * nibbles of the same, over qh[32h + 4g + e]'s bit pairs 0-1, 2-3, 4-5 and 6-7. Putting one code
 * together from that took the kernel five operations. In panels the 192 code bytes of a block
 * are, per (h, g), three 4-byte units X, Y, Z (at 12 * (8h + g)): byte e of X holds code k = 0 in
 * its low 6 bits, of Y code 1, of Z code 2, and the top bit pairs of X, Y and Z hold code 3's bit
 * pairs 0-1, 2-3 and 4-5. Codes 0-2 are then one AND each, code 3 three shifts and a merge.
 */
enum { PANEL_Q6_K_CODE_BYTES = QK_K / 2 + QK_K / 4 }; /* ql and qh */

static void panel_q6_K_recode(const uint8_t *block, uint8_t *to) {
    const block_q6_K *b = (const block_q6_K *)block;
    memcpy(to, block, sizeof(block_q6_K));
    for (int h = 0; h < 2; h++)
        for (int i = 0; i < 32; i++) { /* i = 4g + e */
            const uint8_t a = b->ql[64 * h + i], c = b->ql[64 * h + 32 + i], q = b->qh[32 * h + i];
            const uint8_t c0 = (uint8_t)((a & 0x0F) | (q & 3) << 4);
            const uint8_t c1 = (uint8_t)((c & 0x0F) | (q >> 2 & 3) << 4);
            const uint8_t c2 = (uint8_t)((a >> 4) | (q >> 4 & 3) << 4);
            const uint8_t c3 = (uint8_t)((c >> 4) | (q >> 6 & 3) << 4);
            uint8_t *x = to + 96 * h + 12 * (i / 4) + i % 4;
            x[0] = (uint8_t)(c0 | (c3 & 3) << 6);
            x[4] = (uint8_t)(c1 | (c3 >> 2 & 3) << 6);
            x[8] = (uint8_t)(c2 | (c3 >> 4) << 6);
        }
}

/* The inverse of panel_q6_K_recode. */
static void panel_q6_K_decode(const uint8_t *from, uint8_t *block) {
    block_q6_K *b = (block_q6_K *)block;
    memcpy(block + PANEL_Q6_K_CODE_BYTES, from + PANEL_Q6_K_CODE_BYTES,
           sizeof(block_q6_K) - PANEL_Q6_K_CODE_BYTES);
    for (int h = 0; h < 2; h++)
        for (int i = 0; i < 32; i++) {
            const uint8_t *x = from + 96 * h + 12 * (i / 4) + i % 4;
            const uint8_t c0 = x[0] & 63, c1 = x[4] & 63, c2 = x[8] & 63;
            const uint8_t c3 = (uint8_t)((x[0] >> 6) | (x[4] >> 6) << 2 | (x[8] >> 6) << 4);
            b->ql[64 * h + i] = (uint8_t)((c0 & 0x0F) | (c2 & 0x0F) << 4);
            b->ql[64 * h + 32 + i] = (uint8_t)((c1 & 0x0F) | (c3 & 0x0F) << 4);
            b->qh[32 * h + i] =
                (uint8_t)((c0 >> 4) | (c1 >> 4) << 2 | (c2 >> 4) << 4 | (c3 >> 4) << 6);
        }
}

/* Put block b of row r into its panel block. */
static inline void panel_block_put(const panel_layout *l, uint8_t *panel_block,
                                   const uint8_t *row_block, int r) {
    for (int i = 0; i < l->n_runs; i++) {
        const panel_run *run = &l->runs[i];
        for (unsigned o = run->offset; o < (unsigned)run->offset + run->length; o += run->unit)
            panel_unit_copy(panel_block + (size_t)KERNEL_PANEL_ROWS * o + (size_t)run->unit * r,
                            row_block + o, run->unit);
    }
}

/* Take block b of row r out of its panel block. */
static inline void panel_block_get(const panel_layout *l, const uint8_t *panel_block,
                                   uint8_t *row_block, int r) {
    for (int i = 0; i < l->n_runs; i++) {
        const panel_run *run = &l->runs[i];
        for (unsigned o = run->offset; o < (unsigned)run->offset + run->length; o += run->unit)
            panel_unit_copy(row_block + o,
                            panel_block + (size_t)KERNEL_PANEL_ROWS * o + (size_t)run->unit * r,
                            run->unit);
    }
}

void kernels_panel_pack(tensor_type type, const void *src, int64_t n_in, int64_t n_out, int64_t p0,
                        int64_t p1, void *dst) {
    const panel_layout *l = &panel_layouts[type];
    const tensor_type_traits *tt = tensor_type_get_traits(type);
    const size_t row_bytes = tensor_row_size(type, n_in);
    const int64_t n_blocks = n_in / tt->block_size;
    const int64_t n_panels = n_out / KERNEL_PANEL_ROWS;
    for (int64_t p = p0; p < p1; p++) {
        const uint8_t *rows = (const uint8_t *)src + (size_t)p * KERNEL_PANEL_ROWS * row_bytes;
        uint8_t *panel = (uint8_t *)dst + (size_t)p * KERNEL_PANEL_ROWS * row_bytes;
        for (int64_t b = 0; b < n_blocks; b++) {
            uint8_t *pb = panel + (size_t)b * KERNEL_PANEL_ROWS * tt->type_size;
            for (int r = 0; r < KERNEL_PANEL_ROWS; r++) {
                const uint8_t *row_block = rows + r * row_bytes + b * tt->type_size;
                uint8_t recoded[sizeof(block_q6_K)];
                if (type == TENSOR_TYPE_Q6_K) {
                    panel_q6_K_recode(row_block, recoded);
                    row_block = recoded;
                }
                panel_block_put(l, pb, row_block, r);
            }
        }
    }
    if (p1 == n_panels) {
        const size_t done = (size_t)n_panels * KERNEL_PANEL_ROWS * row_bytes;
        memcpy((uint8_t *)dst + done, (const uint8_t *)src + done,
               (size_t)(n_out - n_panels * KERNEL_PANEL_ROWS) * row_bytes);
    }
}

void kernels_panel_get_row(tensor_type type, const void *packed, int64_t n_in, int64_t n_out,
                           int64_t row, void *dst) {
    const tensor_type_traits *tt = tensor_type_get_traits(type);
    const size_t row_bytes = tensor_row_size(type, n_in);
    const int64_t n_panels = n_out / KERNEL_PANEL_ROWS;
    if (row >= n_panels * KERNEL_PANEL_ROWS) {
        memcpy(dst, (const uint8_t *)packed + (size_t)row * row_bytes, row_bytes);
        return;
    }
    const panel_layout *l = &panel_layouts[type];
    const int r = (int)(row % KERNEL_PANEL_ROWS);
    const uint8_t *panel =
        (const uint8_t *)packed + (size_t)(row / KERNEL_PANEL_ROWS) * KERNEL_PANEL_ROWS * row_bytes;
    for (int64_t b = 0; b < n_in / tt->block_size; b++) {
        const uint8_t *pb = panel + (size_t)b * KERNEL_PANEL_ROWS * tt->type_size;
        uint8_t *row_block = (uint8_t *)dst + b * tt->type_size;
        if (type == TENSOR_TYPE_Q6_K) {
            uint8_t recoded[sizeof(block_q6_K)];
            panel_block_get(l, pb, recoded, r);
            panel_q6_K_decode(recoded, row_block);
        } else {
            panel_block_get(l, pb, row_block, r);
        }
    }
}

void kernels_act_aux(const void *y_q8_0, int64_t n, kernel_act_aux *aux) {
    const block_q8_0 *y = y_q8_0;
    for (int64_t b = 0; b < n / QK8_0; b++) {
        int32_t sum = 0;
        for (int j = 0; j < QK8_0; j++) sum += y[b].qs[j];
        aux[b] = (kernel_act_aux){
            .d = tensor_fp16_to_f32(y[b].d), .neg8_sum = -8 * sum, .neg128_sum = -128 * sum};
    }
}
