#!/usr/bin/env bash
# serve_stories.sh BUILD_DIR — the whole arm64 stack under qemu: corrald (aarch64, qemu -cpu
# max, so the i8mm kernels) serves stories260K over real ZeroMQ, and the aarch64 corral CLI (also
# under qemu) asks it for the greedy text, which must equal llama.cpp's reference byte for byte;
# then the Q4_0 model (the panel kernels) and `corral ps`. Run by scripts/test-arm64.
#
# Nothing here waits on time: the daemon's readiness is polled a bounded number of times (the CLI
# itself waits for the answer), and every step fails loudly with the daemon's log.
set -euo pipefail
build=$(cd "$1" && pwd)
shared=${CORRAL_SHARED_DIR:?set CORRAL_SHARED_DIR}
cpu=${ARM64_QEMU_CPU:-max}
dir=$(mktemp -d /tmp/corral-arm64.XXXXXX)
endpoint="ipc://$dir/corral.sock"
cat > "$dir/corral.yaml" <<YAML
listen: ["$endpoint"]
memory: {swap_dir: "$dir/swap"}
models:
  - name: stories
    path: $shared/models/stories260K.gguf
    context: 512
  - name: stories-q4
    path: $shared/models/stories260K-q4_0.gguf
    context: 512
YAML

# The CPU the daemon sees: under -cpu max, every ARM feature the kernels use.
QEMU_CPU=$cpu qemu-aarch64-static "$build/daemon/corrald" --version > "$dir/version.txt"
grep -q "^cpu features: neon dotprod i8mm" "$dir/version.txt" || [ "$cpu" != max ] || {
    echo "serve_stories: corrald --version under qemu -cpu max: $(cat "$dir/version.txt")" >&2
    exit 1
}
QEMU_CPU=$cpu qemu-aarch64-static "$build/daemon/corrald" -c "$dir/corral.yaml" 2> "$dir/corrald.log" &
daemon=$!
fail() {
    echo "serve_stories: $*" >&2
    echo "--- corrald log:" >&2
    cat "$dir/corrald.log" >&2
    kill "$daemon" 2>/dev/null || true
    wait "$daemon" 2>/dev/null || true
    rm -rf "$dir"
    exit 1
}
cli() {
    QEMU_CPU=$cpu qemu-aarch64-static "$build/clients/cli/corral" "$@" --endpoint "$endpoint"
}

# Ready when `corral status` answers (each try waits for the daemon itself; at most 60 tries).
ready=0
for _ in $(seq 60); do
    kill -0 "$daemon" 2>/dev/null || fail "corrald exited during start-up"
    if cli status > "$dir/status.txt" 2>&1; then
        ready=1
        break
    fi
    sleep 1
done
[ "$ready" = 1 ] || fail "corrald never answered corral status: $(cat "$dir/status.txt")"

cli run stories "Once upon a time" -n 256 --temp 0 > "$dir/out.txt" 2> "$dir/err.txt" ||
    fail "corral run failed: $(cat "$dir/err.txt")"
cmp -s "$dir/out.txt" "$shared/reference/stories260K.greedy.txt" ||
    fail "greedy text differs from reference/stories260K.greedy.txt:
$(diff "$dir/out.txt" "$shared/reference/stories260K.greedy.txt" | head -20)"
echo "serve_stories: stories260K greedy text byte-exact ($(wc -c < "$dir/out.txt") bytes)"

cli run stories-q4 "Once upon a time" -n 64 --temp 0 --stats > "$dir/q4.txt" 2> "$dir/q4err.txt" ||
    fail "corral run stories-q4 failed: $(cat "$dir/q4err.txt")"
[ -s "$dir/q4.txt" ] || fail "stories-q4 generated nothing"
grep -q generated "$dir/q4err.txt" || fail "no --stats line: $(cat "$dir/q4err.txt")"
echo "serve_stories: stories260K-q4_0 generated $(wc -c < "$dir/q4.txt") bytes"

cli ps > "$dir/ps.txt" 2>&1 || fail "corral ps failed: $(cat "$dir/ps.txt")"
grep -q stories "$dir/ps.txt" || fail "corral ps lists no model: $(cat "$dir/ps.txt")"

kill -TERM "$daemon"
status=0
wait "$daemon" || status=$?
[ "$status" = 0 ] || fail "corrald exited with status $status after SIGTERM"
rm -rf "$dir"
echo "serve_stories: corrald stopped cleanly"
