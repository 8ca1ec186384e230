#!/usr/bin/env bash
# Builds the library for the browser: wasm32-unknown-unknown with wgpu's WebGPU back end and the
# core's modules (features webgpu, checkpoint, synth), into target/wasm. Extra arguments go to
# cargo (e.g. --features dag).
#
# With rustup's wasm32 target installed (`rustup target add wasm32-unknown-unknown`) this is a
# plain cross build. Without it (no prebuilt wasm32 standard library can be fetched here), it
# uses Debian's rustc-web, cargo-web and rust-web-src, which build the standard library from
# source (-Zbuild-std; about 7 minutes on 2 cores, once per target directory), linked by the
# rustup toolchain's rust-lld. A warning from moeflow's own code fails the build, as clippy's
# -D warnings does natively.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-target/wasm}
features=webgpu,checkpoint,synth
args=(build --target wasm32-unknown-unknown --release --lib --no-default-features --features "$features" "$@")
log=$(mktemp)
trap 'rm -f "$log"' EXIT
no_warnings() {
    if grep -E '^warning: `moeflow`' "$log"; then
        echo "wasm_build: moeflow's wasm32 build has warnings (above)" >&2
        exit 1
    fi
}
if rustup target list --installed 2>/dev/null | grep -qx wasm32-unknown-unknown; then
    cargo "${args[@]}" 2>&1 | tee "$log"
    no_warnings
    exit 0
fi
for tool in /usr/bin/rustc /usr/bin/cargo; do
    [[ -x $tool ]] || {
        echo "wasm_build: no wasm32 target in rustup and no $tool (apt-get install rustc-web cargo-web rust-web-src)" >&2
        exit 1
    }
done
[[ -d /usr/lib/rustlib/src/rust/library ]] || {
    echo "wasm_build: no standard library sources (apt-get install rust-web-src)" >&2
    exit 1
}
lld="$(rustc --print sysroot)/lib/rustlib/x86_64-unknown-linux-gnu/bin/rust-lld"
[[ -x $lld ]] || {
    echo "wasm_build: no rust-lld at $lld" >&2
    exit 1
}
export CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_LINKER=$lld
RUSTC=/usr/bin/rustc RUSTC_BOOTSTRAP=1 /usr/bin/cargo "${args[0]}" -Zbuild-std=std,panic_abort "${args[@]:1}" 2>&1 | tee "$log"
no_warnings
