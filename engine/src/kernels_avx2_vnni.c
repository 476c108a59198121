/*
 * kernels_avx2_vnni.c — the avx2 path with AVX-VNNI: kernels_avx2.inc compiled with -mavx2 -mfma
 * -mf16c -mavxvnni (engine/CMakeLists.txt); chosen only when the CPU reports AVX-VNNI.
 */
#if defined(__x86_64__)
#define KX_VNNI 1
#include "kernels_avx2.inc"
#define KP_BITS 256
#include "kernels_panel.inc"

void kernels__fill_avx2_vnni(kernel_ops *ops) {
    kx_fill_256(ops);
    kp_fill(ops);
}
#endif
