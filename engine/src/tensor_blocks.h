/*
 * tensor_blocks.h — the on-disk block layouts of ggml's quantized tensor types (private).
 *
 * A quantized row is a packed array of these blocks, exactly as llama.cpp writes them into GGUF
 * files, so every field and its order is fixed by the file format. Scales stored as IEEE half
 * are kept as raw uint16_t bits (tensor_fp16_to_f32 converts them); multi-byte fields are
 * little-endian, which is what every host corral runs on reads natively. Each struct is pinned
 * by a static assert to the byte size in the trait table (tensor.c): a layout that drifts from
 * the format fails the build instead of reading garbage.
 *
 * Within a block of 32 ("legacy" types) element j and element j + 16 share a byte: the low
 * nibble holds j, the high nibble j + 16. The K-quants group 256 elements into a super-block of
 * sub-blocks (8 of 32 for Q4_K/Q5_K, 16 of 16 for Q6_K), each with its own 6- or 8-bit scale.
 */
#ifndef CORRAL_TENSOR_BLOCKS_H
#define CORRAL_TENSOR_BLOCKS_H

#include <stdint.h>

#define QK4_0        32
#define QK4_1        32
#define QK5_0        32
#define QK5_1        32
#define QK8_0        32
#define QK8_1        32
/* Elements per K-quant super-block. */
#define QK_K         256
/* Bytes of packed 6-bit scales and mins of Q4_K/Q5_K: 8 scales + 8 mins of 6 bits. */
#define K_SCALE_SIZE 12

/* Q4_0: x = d * (q - 8), q in 0..15. */
typedef struct block_q4_0 {
    uint16_t d;            /* fp16 scale */
    uint8_t qs[QK4_0 / 2]; /* nibbles: low = element j, high = element j + 16 */
} block_q4_0;
_Static_assert(sizeof(block_q4_0) == 18, "block_q4_0 must be 18 bytes");

/* Q4_1: x = d * q + m, q in 0..15. */
typedef struct block_q4_1 {
    uint16_t d; /* fp16 scale */
    uint16_t m; /* fp16 minimum */
    uint8_t qs[QK4_1 / 2];
} block_q4_1;
_Static_assert(sizeof(block_q4_1) == 20, "block_q4_1 must be 20 bytes");

/* Q5_0: x = d * (q - 16), q in 0..31; bit 4 of element j is bit j of qh (little-endian). */
typedef struct block_q5_0 {
    uint16_t d;
    uint8_t qh[4]; /* fifth bits */
    uint8_t qs[QK5_0 / 2];
} block_q5_0;
_Static_assert(sizeof(block_q5_0) == 22, "block_q5_0 must be 22 bytes");

/* Q5_1: x = d * q + m, q in 0..31; fifth bits as in Q5_0. */
typedef struct block_q5_1 {
    uint16_t d;
    uint16_t m;
    uint8_t qh[4];
    uint8_t qs[QK5_1 / 2];
} block_q5_1;
_Static_assert(sizeof(block_q5_1) == 24, "block_q5_1 must be 24 bytes");

/* Q8_0: x = d * q, q in -127..127. Also the activation type of Q4_0/Q5_0/Q8_0. */
typedef struct block_q8_0 {
    uint16_t d;
    int8_t qs[QK8_0];
} block_q8_0;
_Static_assert(sizeof(block_q8_0) == 34, "block_q8_0 must be 34 bytes");

/* Q8_1: as Q8_0 plus s = d * sum(qs) (fp16), which the Q4_1/Q5_1 dot products use to apply the
 * weights' minimum in one multiply. Activation type only. */
typedef struct block_q8_1 {
    uint16_t d;
    uint16_t s;
    int8_t qs[QK8_1];
} block_q8_1;
_Static_assert(sizeof(block_q8_1) == 36, "block_q8_1 must be 36 bytes");

/* Q4_K: 8 sub-blocks of 32; sub-block j has x = d * sc[j] * q - dmin * m[j], q in 0..15, with
 * the 6-bit sc[j] and m[j] packed into `scales` (see tensor_quant.c, k4_scale_min). The 256
 * quants are stored in 4 chunks of 32 bytes: chunk c holds elements 64c..64c+31 in the low
 * nibbles and 64c+32..64c+63 in the high nibbles. */
typedef struct block_q4_K {
    uint16_t d;    /* fp16 super-block scale of the sub-block scales */
    uint16_t dmin; /* fp16 super-block scale of the sub-block mins */
    uint8_t scales[K_SCALE_SIZE];
    uint8_t qs[QK_K / 2];
} block_q4_K;
_Static_assert(sizeof(block_q4_K) == 144, "block_q4_K must be 144 bytes");

/* Q5_K: Q4_K plus a fifth bit per element: bit 2c of qh[l] is the high bit of element
 * 64c + l, bit 2c + 1 that of element 64c + 32 + l. */
typedef struct block_q5_K {
    uint16_t d;
    uint16_t dmin;
    uint8_t scales[K_SCALE_SIZE];
    uint8_t qh[QK_K / 8];
    uint8_t qs[QK_K / 2];
} block_q5_K;
_Static_assert(sizeof(block_q5_K) == 176, "block_q5_K must be 176 bytes");

/* Q6_K: 16 sub-blocks of 16; x = d * scales[j] * (q - 32), q in 0..63. Per half (128
 * elements) h: ql[64h + l] holds elements 128h + l (low nibble) and 128h + 64 + l (high),
 * ql[64h + 32 + l] elements 128h + 32 + l and 128h + 96 + l; qh[32h + l] holds their top two
 * bits at shifts 0, 2, 4, 6 in the order l, 32 + l, 64 + l, 96 + l. */
typedef struct block_q6_K {
    uint8_t ql[QK_K / 2];     /* low 4 bits */
    uint8_t qh[QK_K / 4];     /* high 2 bits */
    int8_t scales[QK_K / 16]; /* 8-bit signed sub-block scales */
    uint16_t d;               /* fp16 super-block scale */
} block_q6_K;
_Static_assert(sizeof(block_q6_K) == 210, "block_q6_K must be 210 bytes");

/* Q8_K: the activation type of the K-quants. The scale is a full float, and bsums holds the sum
 * of each group of 16 quants so that the dot products can apply the weights' mins per group. */
typedef struct block_q8_K {
    float d;
    int8_t qs[QK_K];
    int16_t bsums[QK_K / 16];
} block_q8_K;
_Static_assert(sizeof(block_q8_K) == 292, "block_q8_K must be 292 bytes");

#endif /* CORRAL_TENSOR_BLOCKS_H */
