#!/bin/bash
# One moe_layer binary (A, e.g. built from an earlier revision in a git worktree) against
# another (B, default: this checkout's) on one adapter: each run its own process, in the order
# A B B A, two blocks per size. Prints the expert stage and total GPU time of every run; quote
# only ratios from one log.
#   A=/path/to/old/moe_layer tools/rev_abba.sh [adapter] > log
set -euo pipefail
export XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-/tmp}
A=${A:?set A to the baseline moe_layer binary}
B=${B:-$(dirname "$0")/../target/release/examples/moe_layer}
ADAPTER=${1:-vulkan}
SIZES=${SIZES:-"256:2 256:8 4:8"}
for size in $SIZES; do
    tokens=${size%%:*}
    k=${size##*:}
    for block in 1 2; do
        for who in A B B A; do
            if [ "$who" = A ]; then bin=$A; else bin=$B; fi
            out=$("$bin" --adapter "$ADAPTER" --tokens "$tokens" --hidden 512 --ffn 1024 --experts 16 --k "$k" --shared-ffn 0 2>&1)
            experts=$(echo "$out" | awk '$1 == "experts" {print $2}')
            total=$(echo "$out" | awk '$1 == "total" {print $2}')
            echo "--tokens $tokens --k $k block $block $who experts_ms=$experts total_ms=$total $(echo "$out" | grep -E '^result')"
        done
    done
done
