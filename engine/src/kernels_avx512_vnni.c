/*
 * kernels_avx512_vnni.c — the avx512 path with AVX512-VNNI: kernels_avx512.inc compiled with the
 * avx512 flags plus -mavx512vnni (engine/CMakeLists.txt); chosen only when the CPU reports it.
 */
#if defined(__x86_64__)
#define KX_VNNI 1
#define KX_EVEX 1
#include "kernels_avx512.inc"
#define KP_BITS 512
#include "kernels_panel.inc"

void kernels__fill_avx512_vnni(kernel_ops *ops) {
    kx_fill_512(ops);
    kp_fill(ops);
}
#endif
