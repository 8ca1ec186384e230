#!/bin/bash
# The host expert stage (benches/host_experts.rs, moeflow's CPU FFN) against ggml's CPU
# MUL_MAT_ID at Qwen3-30B-A3B's expert shape (E=128, k=8, H=2048, F=768), per weight type at
# M = 1 and 8: each program its own process, A B B A per type, ROUNDS times. ggml's figure is
# its fused gate/up case (m = 1536, k = 2048) plus its down case (m = 2048, k = 768), its
# us/run; moeflow's is the whole FFN (gate, up, activation, down) per run, median of its
# timed runs. Writes the raw lines (JSON from moeflow, ggml's lines as printed) to stdout.
#   GGML=/path/to/test-backend-ops tools/host_abba.sh > log
# ggml: built from ggml-org/ggml d99724f2 with ../shared/peers/bin/ggml-perf-cases-v2.patch,
# -DGGML_NATIVE=ON -DGGML_VULKAN=OFF, Release; its CPU backend runs hardware_concurrency threads.
#
# TYPES names the weight types (default: f32 f16 q8_0 q4_0 mxfp4); mxfp4-ggml is MXFP4 with
# moeflow holding ggml's block_mxfp4 bytes (a GGUF file's, the bytes ggml reads) rather than
# gpt-oss's layout, against ggml's mxfp4.
#
# ROUTINGS=16 times both sides cold instead: each run routes the tokens to other experts
# (16 routings taken in turn), so the weights come from memory as in a model's decode, where
# test-backend-ops repeats one op on one routing (on a CPU whose last-level cache holds one
# op's experts, it times them from there). ggml's side is then tools/ggml_moe_cold.c (both
# cases as one graph on its CPU backend, built here against the ggml build GGML lies in:
# GGML=<tree>/<build>/bin/test-backend-ops, its libraries in <build>/src).
set -euo pipefail
GGML=${GGML:?set GGML to a test-backend-ops built with the moeflow perf cases}
ROUNDS=${ROUNDS:-2}
TYPES=${TYPES:-"f32 f16 q8_0 q4_0 mxfp4"}
ITERS=${ITERS:-20}
ROUTINGS=${ROUTINGS:-1}
cd "$(dirname "$0")/.."
cargo bench --bench host_experts --no-run >/dev/null 2>&1
BENCH=$(ls -t target/release/deps/host_experts-* | grep -v '\.d$' | head -1)
if [ "$ROUTINGS" != 1 ]; then
    BUILD=$(cd "$(dirname "$GGML")/.." && pwd)
    COLD=target/ggml_moe_cold
    cc -O2 tools/ggml_moe_cold.c -I"$BUILD/../include" -L"$BUILD/src" -lggml -lggml-base -lggml-cpu \
        -Wl,-rpath,"$BUILD/src" -o "$COLD"
fi
echo "# moeflow $(git rev-parse --short HEAD); bench $BENCH; ggml $GGML; routings $ROUTINGS; $(nproc) cores"
echo "# $(grep -m1 'model name' /proc/cpuinfo)"
for round in $(seq 1 "$ROUNDS"); do
    for type in $TYPES; do
        # moeflow's arguments and ggml's type name for this type.
        case "$type" in
        mxfp4-ggml) ours=(--dtypes mxfp4 --mxfp4-layout ggml) theirs=mxfp4 ;;
        *) ours=(--dtypes "$type") theirs=$type ;;
        esac
        for who in A B B A; do
            if [ "$who" = A ]; then
                echo "round $round $type A $("$BENCH" "${ours[@]}" --tokens 1,8 --iters "$ITERS" --routings "$ROUTINGS" | tr '\n' ' ')"
            elif [ "$ROUTINGS" != 1 ]; then
                for m in 1 8; do
                    echo "round $round $type B $("$COLD" "$theirs" "$m" "$(nproc)" "$ROUTINGS" "$ITERS")"
                done
            else
                "$GGML" perf -o MUL_MAT_ID -b CPU -p "type_a=$theirs,.*n_mats=128,n_used=8,b=0,m=(1536|2048),n=(1|8),k=" 2>&1 |
                    sed 's/\x1b\[[0-9;]*m//g' | grep 'MUL_MAT_ID(' | sed "s/^ */round $round $type B /"
            fi
        done
    done
done
