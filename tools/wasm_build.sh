#!/usr/bin/env bash
# Builds the library for the browser: wasm32-unknown-unknown with wgpu's WebGPU back end and the
# core's modules (features webgpu, checkpoint, synth), into target/wasm, failing on any warning
# of moeflow's (tools/wasm_cargo.sh says which toolchain). Extra arguments go to cargo.
set -euo pipefail
exec "$(dirname "$0")/wasm_cargo.sh" build --release --lib --no-default-features \
    --features webgpu,checkpoint,synth "$@"
