/*
 * kernels_neon_i8mm.c — the i8mm path: kernels_neon.inc and the panel kernels
 * (kernels_panel.inc over kernels_arm.inc) compiled with -march=armv8.2-a+dotprod+i8mm (SDOT,
 * USDOT, SMMLA), engine/CMakeLists.txt.
 */
#if defined(__aarch64__)
#define KN_DOTPROD 1
#define KN_I8MM    1
#include "kernels_neon.inc"
#include "kernels_arm.inc"
#define KP_BITS 128
#include "kernels_panel.inc"

void kernels__fill_neon_i8mm(kernel_ops *ops) {
    kn_fill(ops);
    kp_fill(ops);
}
#endif
