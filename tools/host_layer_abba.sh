#!/bin/bash
# The whole layer with every routed expert on the host (moe_layer --cpu-moe: route, grouping
# and combine on the adapter, the experts on the CPU) against the same layer all on the adapter
# (lavapipe by default: a machine with no GPU), same synthetic layer and sizes, each run its own
# process, A B B A, ROUNDS times. Prints each run's host wall per token count (A: submit to
# completion of the one-submission forward; B: first submission to the combine's end) and its
# check; quote only ratios from one log.
#   tools/host_layer_abba.sh [adapter] > log
set -euo pipefail
export XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-/tmp}
ADAPTER=${1:-vulkan}
ROUNDS=${ROUNDS:-2}
SHAPE=${SHAPE:-"--hidden 2048 --ffn 768 --experts 128 --k 8 --shared-ffn 0"}
TOKENS=${TOKENS:-1,8}
DTYPE=${DTYPE:-f32}
BIN=$(dirname "$0")/../target/release/examples/moe_layer
echo "# $($BIN --version 2>/dev/null || true) $(git -C "$(dirname "$0")/.." rev-parse --short HEAD); $SHAPE --dtype $DTYPE --tokens $TOKENS; $(nproc) cores"
for round in $(seq 1 "$ROUNDS"); do
    for who in A B B A; do
        # shellcheck disable=SC2086
        if [ "$who" = A ]; then
            out=$("$BIN" --adapter "$ADAPTER" $SHAPE --dtype "$DTYPE" --tokens "$TOKENS" 2>&1)
        else
            out=$("$BIN" --adapter "$ADAPTER" $SHAPE --dtype "$DTYPE" --tokens "$TOKENS" --cpu-moe 2>&1)
        fi
        walls=$(echo "$out" | awk '$1 == "host" && $2 == "wall" {printf "%s ", $3}')
        experts=$(echo "$out" | awk '$1 == "experts" {printf "%s ", $2} $1 == "host" && $2 != "wall" {printf "%s ", $2}')
        echo "round $round $who host_wall_ms=[ $walls] experts_or_host_ms=[ $experts] $(echo "$out" | grep -E '^result|routed expert weights')"
    done
done
