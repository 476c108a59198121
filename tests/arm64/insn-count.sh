#!/usr/bin/env bash
# insn-count.sh [BUILD_DIR] — instructions executed per weight block and row, per type, on the
# scalar path and each ARM path, counted under qemu-aarch64-static (-cpu max): tests/bench/insns
# runs 1 and 3 decode products of a 16 x 4096 weight with one instruction per translation block
# and every executed block logged; the difference of the two counts over 2 x 16 x blocks-per-row
# is the kernel's cost alone (start-up and set-up cancel). A stand-in for speed where emulation
# cannot time anything: it ignores memory, latencies and issue width (README "ARM64").
set -euo pipefail
build=${1:-build-arm64}
cmake --build "$build" --target bench_insns > /dev/null
bin="$build/tests/bench/insns"
count() { # path type reps -> instructions
    QEMU_CPU=max qemu-aarch64-static -singlestep -d nochain,exec -D /dev/stdout "$bin" "$1" "$2" "$3" |
        grep -c '^Trace'
}
printf '%-6s %-8s %8s %8s %8s %8s\n' type scalar neon dotprod i8mm "scalar/best"
for type in ${TYPES:-Q4_0 Q8_0 Q4_K Q6_K Q5_K Q4_1 Q5_0 Q5_1 F16 BF16}; do
    blocks=$(QEMU_CPU=max qemu-aarch64-static "$bin" scalar "$type" 0 | sed 's/.*blocks\/row \([0-9]*\).*/\1/')
    line=$(printf '%-6s' "$type")
    best=0
    scalar=0
    for path in scalar neon dotprod i8mm; do
        a=$(count "$path" "$type" 1)
        b=$(count "$path" "$type" 3)
        per=$(( (b - a) * 10 / (2 * 16 * blocks) ))
        line="$line $(printf '%8s' "$((per / 10)).$((per % 10))")"
        [ "$path" = scalar ] && scalar=$per
        if [ "$path" != scalar ] && { [ "$best" = 0 ] || [ "$per" -lt "$best" ]; }; then best=$per; fi
    done
    echo "$line $(printf '%8s' "x$((scalar / best)).$(( (scalar * 10 / best) % 10 ))")"
done
