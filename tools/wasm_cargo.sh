#!/usr/bin/env bash
# Runs cargo for wasm32-unknown-unknown: `tools/wasm_cargo.sh build --release ...` (the
# arguments go to cargo, the target is added), into target/wasm (CARGO_TARGET_DIR overrides),
# and fails on any warning of moeflow's crates (moeflow, moeflow-web), as clippy's -D warnings
# does natively.
#
# With rustup's wasm32 target installed (`rustup target add wasm32-unknown-unknown`) this is a
# plain cross build. Without it (no prebuilt wasm32 standard library can be fetched here), it
# uses Debian's rustc-web, cargo-web and rust-web-src, which build the standard library from
# source (-Zbuild-std; minutes on 2 cores, once per target directory), linked by the rustup
# toolchain's rust-lld.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$PWD/target/wasm}
(($#)) || { echo "usage: tools/wasm_cargo.sh COMMAND [ARGS...]" >&2; exit 2; }
command=$1
shift
log=$(mktemp)
trap 'rm -f "$log"' EXIT
if rustup target list --installed 2>/dev/null | grep -qx wasm32-unknown-unknown; then
    cargo "$command" --target wasm32-unknown-unknown "$@" 2>&1 | tee "$log"
else
    source tools/rust_web.sh
    rust_web_check wasm_cargo wasm32
    lld="$(rustc --print sysroot)/lib/rustlib/x86_64-unknown-linux-gnu/bin/rust-lld"
    [[ -x $lld ]] || { echo "wasm_cargo: no rust-lld at $lld" >&2; exit 1; }
    CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_LINKER=$lld RUSTC=/usr/bin/rustc RUSTC_BOOTSTRAP=1 \
        /usr/bin/cargo "$command" -Zbuild-std=std,panic_abort --target wasm32-unknown-unknown "$@" 2>&1 | tee "$log"
fi
if grep -E '^warning: `moeflow' "$log"; then
    echo "wasm_cargo: moeflow's wasm32 build has warnings (above)" >&2
    exit 1
fi
