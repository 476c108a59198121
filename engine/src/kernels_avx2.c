/*
 * kernels_avx2.c — the avx2 path without VNNI: kernels_avx2.inc compiled with -mavx2 -mfma
 * -mf16c (engine/CMakeLists.txt), for any AVX2 CPU.
 */
#if defined(__x86_64__)
#define KX_VNNI 0
#include "kernels_avx2.inc"
#define KP_BITS 256
#include "kernels_panel.inc"

void kernels__fill_avx2(kernel_ops *ops) {
    kx_fill_256(ops);
    kp_fill(ops);
}
#endif
