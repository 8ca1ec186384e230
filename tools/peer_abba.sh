#!/bin/bash
# Burn's wgpu MoE forward (A, the peer in ../shared/peers/burn_moe) against moeflow's layer (B)
# at N=256, H=512, F=1024, E=16, k=2 and 8, no shared expert, on lavapipe: each run its own
# process, warm, in the order A B B A. Quote only ratios from one run.
#   BURN=/path/to/target/release/burn_moe tools/peer_abba.sh > log
set -euo pipefail
export XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-/tmp}
A=${BURN:?set BURN to the burn_moe binary}
B=${MOEFLOW:-$(dirname "$0")/../target/release/examples/moe_layer}
for k in 2 8; do
    for who in A B B A; do
        if [ "$who" = A ]; then
            out=$(ITERS=3 WARMUP=2 CHECK=0 "$A" 256 512 1024 16 "$k" 2>&1)
            echo "k=$k A $(echo "$out" | grep -E '^CHECK (same|fresh)-x' | sed 's/;.*GFLOP\/s;/;/' | tr '\n' ' ')"
        else
            out=$("$B" --adapter vulkan --tokens 256 --hidden 512 --ffn 1024 --experts 16 --k "$k" --shared-ffn 0 2>&1)
            echo "k=$k B $(echo "$out" | grep -E '^  (experts|total|host wall)' | tr -s ' ' | tr '\n' ' ') $(echo "$out" | grep -E '^result')"
        fi
    done
done
