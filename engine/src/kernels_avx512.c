/*
 * kernels_avx512.c — the avx512 path without VNNI: kernels_avx512.inc compiled with -mavx512f
 * -mavx512bw -mavx512vl -mavx2 -mfma -mf16c (engine/CMakeLists.txt), for Skylake-X class CPUs.
 */
#if defined(__x86_64__)
#define KX_VNNI 0
#define KX_EVEX 1
#include "kernels_avx512.inc"
#define KP_BITS 512
#include "kernels_panel.inc"

void kernels__fill_avx512(kernel_ops *ops) {
    kx_fill_512(ops);
    kp_fill(ops);
}
#endif
