/*
 * cpu_path_gate.c — `cpu_path_gate PATH COMMAND [ARGS...]`: run COMMAND when this CPU and build
 * can run the kernel path PATH (scalar, avx2, avx512; engine/src/kernels.h), otherwise exit 77,
 * which ctest reports as skipped. It lets the correctness suites be registered once per kernel
 * path (unit.model.avx512, ...) and still pass on a CPU that lacks a path.
 */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "kernels.h"

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: cpu_path_gate PATH COMMAND [ARGS...]\n");
        return 2;
    }
    for (int p = 0; p < KERNEL_PATH_COUNT; p++) {
        if (strcmp(argv[1], kernel_path_name((kernel_path)p)) != 0) continue;
        if (!kernels_for_path((kernel_path)p)) {
            char have[256];
            cpu_format_features(cpu_detect_features(), have, sizeof have);
            printf("skipped: this CPU or build cannot run the %s kernels (CPU features: %s)\n",
                   argv[1], have);
            return 77;
        }
        execv(argv[2], argv + 2);
        perror(argv[2]);
        return 127;
    }
    fprintf(stderr, "cpu_path_gate: unknown kernel path '%s'\n", argv[1]);
    return 2;
}
