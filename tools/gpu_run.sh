#!/usr/bin/env bash
# The benchmark run for a lent GPU machine that has no Rust toolchain: the binaries are built
# here and carried in .gpu/ (with the Vulkan loader packages in .gl/), then this script runs, in
# order of worth and each under its own time limit: the layer at the peers' shape; the `gemm/`
# comparisons that concern GPUs, the tuner's first; the cooperative-matrix mode (its comparison
# and the tuner with it, on a device created with cooperative matrices); a Qwen3-30B-A3B-shaped layer (E=128,
# H=2048, F=768, k=8) at 1, 8, 512 and 4096 tokens in f32 and bf16; ggml's Vulkan MUL_MAT_ID at
# the same shapes; the MoE task program against the staged forward (`dag/moe` comparisons);
# Burn's MoE forward against moeflow's layer (A B B A, separate processes); the rest of the
# matrix and the held-out `gemm/` run. Everything lands in $OUT (results.tgz plus the logs).
#
#   cargo build --release --examples && cp target/release/examples/{bench_matrix,moe_layer} .gpu/
#   git rev-parse HEAD > .gpu/REVISION
#   optional peers in .gpu/peers/: burn_moe.xz (xz of the peer binary, ../shared/peers/burn_moe),
#   ggml.tar.xz (ggmlpack/test-backend-ops built after tools/ggml_moe_perf_cases.sh, and
#   ggmlpack/lib/*.so.0), libgomp.so.1
#   then, on the machine: BUDGET=<seconds> bash tools/gpu_run.sh (PEERS=0 skips the peers)
# Dry run on a CPU adapter: ADAPTER=vulkan B=target/release/examples OUT=/tmp/dry BUDGET=120
# bash tools/gpu_run.sh (DRY=1 leaves out the .gl packages and the revision file).
set -u
if [ "${DRY:-0}" != 1 ]; then
    for f in .gl/*.deb; do dpkg -x "$f" /; done
    ldconfig
    export MOEFLOW_GIT_REVISION
    MOEFLOW_GIT_REVISION=$(cat .gpu/REVISION)
fi
export XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-/tmp/xdg} && mkdir -p "$XDG_RUNTIME_DIR"
OUT=${OUT:-/tmp/out}
M=$OUT/m
mkdir -p "$M"
B=${B:-.gpu}
BUDGET=${BUDGET:-500} # seconds for all steps, so the results are packed before the call ends
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv > "$M/nvidia-smi.txt" 2>&1
smoke() { timeout 60 $B/moe_layer --adapter "${ADAPTER:-vulkan}" --tokens 16 --hidden 64 --ffn 32 --experts 8 --k 2 --shared-ffn 0 > "$M/smoke.txt" 2>&1; }
if ! smoke; then
    export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
    export __EGL_VENDOR_LIBRARY_FILENAMES=/usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json
    smoke
fi
head -5 "$M/smoke.txt"
step() { # name, seconds, command...
    local name=$1 secs=$2; shift 2
    local left=$((BUDGET - SECONDS))
    if [ "$left" -lt 15 ]; then echo "$name: skipped (time budget spent)"; return; fi
    [ "$secs" -gt "$left" ] && secs=$left
    local t0=$SECONDS
    timeout "$secs" "$@" > "$M/$name.log" 2>&1
    echo "$name: exit $? in $((SECONDS - t0)) s"
}
ADAPTER=${ADAPTER:-vulkan}
layer() { $B/moe_layer --adapter "$ADAPTER" --tokens 256 --hidden 512 --ffn 1024 --experts 16 --k "$1" --shared-ffn 0; }
# The Qwen3-30B-A3B-shaped layer, one process per dtype (the weights are made and uploaded once).
qwen3() {
    $B/moe_layer --adapter "$ADAPTER" --tokens 1,8,512,4096 --hidden 2048 --ffn 768 --experts 128 --k 8 \
        --shared-ffn 0 --dtype "$1"
}
export B ADAPTER && export -f layer qwen3 # `step` runs commands under `timeout`, which needs them exported
for k in 2 8; do step layer-k$k 40 bash -c "layer $k"; done
# The GEMM comparisons that concern GPUs, most wanted first (the window and texture ones compare
# CPU adapters' blocks: on an H200 `gemm/window-vs-direct` did not finish a size in 55 s).
GEMM=(--comparison tuned-vs-default --comparison tile64-vs-tiled --comparison tile128-vs-tiled
    --comparison grouped-vs-dense --comparison unchecked-vs-checked --comparison f16-staged-vs-f32-tile
    --comparison fast-vs-strict --comparison decode-vs-grouped --comparison dense-wide
    --comparison block-vs-rowwise --comparison grouped-vs-bucketed --comparison direct-vs-tiled)
step matrix-gemm 180 $B/bench_matrix --adapter "$ADAPTER" "${GEMM[@]}" --out "$M/gemm"
# The cooperative-matrix mode on a device created with it: its own comparison against f32
# tiles, and the tuner with the cooperative blocks among its candidates (each checked against
# the CPU reference on the device first).
step matrix-coop 60 env MOEFLOW_COOPERATIVE_MATRIX=1 $B/bench_matrix --adapter "$ADAPTER" \
    --comparison coop-vs-f32-tile --comparison tuned-vs-default --out "$M/coop"
for dtype in f32 bf16; do step qwen3-$dtype 60 bash -c "qwen3 $dtype"; done
if [ "${PEERS:-1}" = 1 ] && [ -f $B/peers/ggml.tar.xz ]; then
    tar xJf $B/peers/ggml.tar.xz -C /tmp && cp $B/peers/libgomp.so.1 /tmp/ggmlpack/lib/
    # The peers' shape (n_mats=16) and the Qwen3 shape (n_mats=128), as tools/ggml_moe_perf_cases.sh adds them.
    ggml_perf() {
        for mats in 16 128; do
            LD_LIBRARY_PATH=/tmp/ggmlpack/lib GGML_VK_VISIBLE_DEVICES=0 \
                /tmp/ggmlpack/test-backend-ops perf -o MUL_MAT_ID -b Vulkan0 -p "n_mats=$mats"
        done
    }
    export -f ggml_perf
    step peers-ggml 100 bash -c ggml_perf
fi
# The MoE task program (passes, queue) against the staged forward.
step matrix-dag-moe 60 $B/bench_matrix --adapter "$ADAPTER" --comparison dag/moe --out "$M/dag-moe"
if [ "${PEERS:-1}" = 1 ] && [ -f $B/peers/burn_moe.xz ]; then
    xz -dc $B/peers/burn_moe.xz > /tmp/burn_moe && chmod +x /tmp/burn_moe
    # Burn's forward (A) against moeflow's layer (B), each run its own process, A B B A per k.
    peer_abba() {
        for k in 2 8; do
            for who in A B B A; do
                if [ "$who" = A ]; then
                    echo "k=$k A"; ITERS=5 WARMUP=2 CHECK=0 /tmp/burn_moe 256 512 1024 16 "$k" 2>&1 | grep -E '^(CHECK|first|config)'
                else
                    echo "k=$k B"; layer "$k" 2>&1 | grep -E '^  (experts|total|host wall)|^result'
                fi
            done
        done
    }
    export -f peer_abba
    step peers-burn 90 bash -c peer_abba
fi
for c in layer route dispatch combine; do
    step matrix-$c 45 $B/bench_matrix --adapter "$ADAPTER" --comparison $c/ --out "$M/$c"
done
step matrix-gemm-held-out 120 $B/bench_matrix --adapter "$ADAPTER" "${GEMM[@]}" --held-out --out "$M/gemm-held-out"
tar czf "$OUT/results.tgz" -C "$OUT" m
grep -h "experts\|total\|host wall\|result:" "$M"/layer-*.log | head -12
grep -h "^M=\|  experts\|result:" "$M"/qwen3-*.log 2>/dev/null | head -20
grep -h "MUL_MAT_ID" "$M"/peers-ggml.log 2>/dev/null | head -24
tail -20 "$M"/peers-burn.log 2>/dev/null
