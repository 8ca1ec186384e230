#!/usr/bin/env bash
# Adds moeflow's MoE shapes to the perf cases of ggml's tests/test-backend-ops.cpp (a checkout of
# ggml-org/ggml or llama.cpp), so that `test-backend-ops perf -o MUL_MAT_ID` times ggml's grouped
# expert matmuls at the shapes tools/gpu_run.sh runs moeflow's layer at:
#   the peers' shape: E=16, k=2 and 8, H=512, F=1024, 256 tokens, f32;
#   Qwen3-30B-A3B:    E=128, k=8, H=2048, F=768, 1, 8, 512 and 4096 tokens, f32 and bf16 weights.
# Each shape as two MUL_MAT_ID cases: the fused gate/up projection (m = 2F, k = H) and the down
# projection (m = H, k = F), activations f32. Idempotent.
#   bash tools/ggml_moe_perf_cases.sh /path/to/ggml
set -euo pipefail
src=${1:?the ggml checkout}/tests/test-backend-ops.cpp
grep -q "moeflow MoE shapes" "$src" && exit 0
cases='    // moeflow MoE shapes (tools/ggml_moe_perf_cases.sh): fused gate/up (m = 2F, k = H), down (m = H, k = F)
    for (int n_used : {2, 8}) {
        test_cases.emplace_back(new test_mul_mat_id(GGML_TYPE_F32, GGML_TYPE_F32, 16, n_used, false, 2048, 256, 512));
        test_cases.emplace_back(new test_mul_mat_id(GGML_TYPE_F32, GGML_TYPE_F32, 16, n_used, false, 512, 256, 1024));
    }
    for (ggml_type type_a : {GGML_TYPE_F32, GGML_TYPE_BF16}) {
        for (int n : {1, 8, 512, 4096}) {
            test_cases.emplace_back(new test_mul_mat_id(type_a, GGML_TYPE_F32, 128, 8, false, 1536, n, 2048));
            test_cases.emplace_back(new test_mul_mat_id(type_a, GGML_TYPE_F32, 128, 8, false, 2048, n, 768));
        }
    }
'
# Insert after the first declaration of the case list inside make_test_cases_perf().
awk -v cases="$cases" '
    /make_test_cases_perf\(\)/ { inperf = 1 }
    { print }
    inperf && /std::vector<std::unique_ptr<test_case>> test_cases;/ { printf "%s", cases; inperf = 0; done = 1 }
    END { if (!done) exit 1 }
' "$src" > "$src.moeflow" || { echo "no make_test_cases_perf() case list in $src"; rm -f "$src.moeflow"; exit 1; }
mv "$src.moeflow" "$src"
echo "added moeflow MoE shapes to $src"
