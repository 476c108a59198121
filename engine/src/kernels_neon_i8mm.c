/*
 * kernels_neon_i8mm.c — the i8mm path: kernels_neon.inc, the SMMLA panel kernels of
 * kernels_arm_mmla.inc for Q4_0 and Q8_0 on several tokens, and the other panel kernels
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
#include "kernels_arm_mmla.inc"

void kernels__fill_neon_i8mm(kernel_ops *ops) {
    kn_fill(ops);
    kp_fill(ops);
    kn_mmla_fill(ops); /* SMMLA for Q4_0 and Q8_0 on two tokens or more */
}
#endif
