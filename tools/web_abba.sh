#!/usr/bin/env bash
# The same synthetic layer natively on SwiftShader through wgpu (A: moe_layer, naga's SPIR-V)
# and in headless Chromium on SwiftShader through Dawn (B: the web page, Tint's SPIR-V): each
# run its own process, in the order A B B A, BLOCKS blocks (default 2). Prints every run's total
# GPU milliseconds per token count; quote only ratios from one log. Needs web/build.sh's output,
# npm ci in web/test, and a release moe_layer (cargo build --release --example moe_layer).
#   tools/web_abba.sh > log
set -euo pipefail
cd "$(dirname "$0")/.."
export XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-/tmp}
SWIFTSHADER_ICD=/usr/lib/chromium/vk_swiftshader_icd.json
TOKENS=${TOKENS:-1,64}
HIDDEN=${HIDDEN:-256} FFN=${FFN:-128} EXPERTS=${EXPERTS:-16} K=${K:-4} DTYPE=${DTYPE:-f32}
BLOCKS=${BLOCKS:-2}
native() {
    VK_ICD_FILENAMES=$SWIFTSHADER_ICD WGPU_BACKEND=vulkan target/release/examples/moe_layer \
        --adapter vulkan --tokens "$TOKENS" --hidden "$HIDDEN" --ffn "$FFN" --experts "$EXPERTS" \
        --k "$K" --shared-ffn 0 --dtype "$DTYPE" 2>&1 |
        awk '/^M=/ { m = substr($1, 3, length($1) - 3) } $1 == "total" { print "M=" m " gpu_ms=" $2 }'
}
browser() {
    node web/test/measure.mjs "tokens=$TOKENS&hidden=$HIDDEN&ffn=$FFN&experts=$EXPERTS&k=$K&dtype=$DTYPE" |
        awk '{ print $1, $2 }'
}
for block in $(seq "$BLOCKS"); do
    for who in A B B A; do
        if [[ $who == A ]]; then out=$(native); else out=$(browser); fi
        while read -r line; do echo "block $block $who $line"; done <<<"$out"
    done
done
