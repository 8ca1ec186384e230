#!/usr/bin/env bash
# The benchmark run for a lent GPU machine that has no Rust toolchain: the binaries are built
# here and carried in .gpu/ (with the Vulkan loader packages in .gl/), then this script runs
# the matrix comparisons, the peers' layer shape and a GEMM kernel sweep there, each under its
# own time limit, and leaves everything in $OUT (results.tgz plus the logs).
#
#   cargo build --release --examples && cp target/release/examples/{bench_matrix,moe_layer} .gpu/
#   (optionally a GEMM sweep binary as .gpu/gemm_lab with its kernels in .gpu/lab/)
#   git rev-parse HEAD > .gpu/REVISION   # then, on the machine: bash tools/gpu_run.sh
set -u
for f in .gl/*.deb; do dpkg -x "$f" /; done
ldconfig
export XDG_RUNTIME_DIR=/tmp/xdg && mkdir -p "$XDG_RUNTIME_DIR"
export MOEFLOW_GIT_REVISION
MOEFLOW_GIT_REVISION=$(cat .gpu/REVISION)
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT/m"
B=.gpu
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv > "$OUT/m/nvidia-smi.txt" 2>&1
if ! timeout 60 $B/moe_layer --adapter vulkan --tokens 16 --hidden 64 --ffn 32 --experts 8 --k 2 --shared-ffn 0 > "$OUT/m/smoke.txt" 2>&1; then
    export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
    export __EGL_VENDOR_LIBRARY_FILENAMES=/usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json
    timeout 60 $B/moe_layer --adapter vulkan --tokens 16 --hidden 64 --ffn 32 --experts 8 --k 2 --shared-ffn 0 > "$OUT/m/smoke.txt" 2>&1
fi
head -3 "$OUT/m/smoke.txt"
BUDGET=${BUDGET:-500} # seconds for all steps, so the results are packed before the call ends
step() { # name, seconds, command...
    local name=$1 secs=$2; shift 2
    local left=$((BUDGET - SECONDS))
    if [ "$left" -lt 20 ]; then echo "$name: skipped (time budget spent)"; return; fi
    [ "$secs" -gt "$left" ] && secs=$left
    local t0=$SECONDS
    timeout "$secs" "$@" > "$OUT/m/$name.log" 2>&1
    echo "$name: exit $? in $((SECONDS - t0)) s"
}
for k in 2 8; do
    step layer-k$k 60 $B/moe_layer --adapter vulkan --tokens 256 --hidden 512 --ffn 1024 --experts 16 --k $k --shared-ffn 0
done
step layer-default 60 $B/moe_layer --adapter vulkan
if [ -x $B/gemm_lab ]; then
    step gemm-lab 90 env LAB_DIR=$B/lab LAB_M=4096 LAB_N=4096 LAB_K=4096 LAB_REPS=5 $B/gemm_lab --nocapture --test-threads 1
fi
for c in gemm/ layer route dispatch combine; do
    step "matrix-${c%/}" 100 $B/bench_matrix --adapter vulkan --comparison "$c" --out "$OUT/m/${c%/}"
done
step matrix-dag 100 $B/bench_matrix --adapter vulkan --comparison dag/ --out "$OUT/m/dag"
tar czf "$OUT/results.tgz" -C "$OUT" m
grep -h "GFLOP/s\|total\|result:" "$OUT"/m/layer-*.log "$OUT"/m/gemm-lab.log 2>/dev/null | tail -40
