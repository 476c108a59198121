/*
 * kernels_neon_dotprod.c — the dotprod path: kernels_neon.inc and the panel kernels
 * (kernels_panel.inc over kernels_arm.inc) compiled with -march=armv8.2-a+dotprod (SDOT),
 * engine/CMakeLists.txt.
 */
#if defined(__aarch64__)
#define KN_DOTPROD 1
#define KN_I8MM    0
#include "kernels_neon.inc"
#include "kernels_arm.inc"
#define KP_BITS 128
#include "kernels_panel.inc"

void kernels__fill_neon_dotprod(kernel_ops *ops) {
    kn_fill(ops);
    kp_fill(ops);
}
#endif
