#!/usr/bin/env bash
# Builds the page's module: the moeflow-web crate for wasm32 (tools/wasm_cargo.sh), then its
# JavaScript glue with wasm-bindgen into web/pkg. Needs the wasm-bindgen command-line tool at the
# version web/Cargo.toml pins (`cargo install wasm-bindgen-cli --version 0.2.130`).
set -euo pipefail
cd "$(dirname "$0")/.."
want=$(sed -n 's/^wasm-bindgen = "=\(.*\)"$/\1/p' web/Cargo.toml)
have=$(wasm-bindgen --version 2>/dev/null | awk '{print $2}') || true
[[ $have == "$want" ]] || {
    echo "web/build.sh: wasm-bindgen ${have:-is missing}, the page needs $want (cargo install wasm-bindgen-cli --version $want)" >&2
    exit 1
}
tools/wasm_cargo.sh build --release --manifest-path web/Cargo.toml
wasm-bindgen --target web --no-typescript --out-dir web/pkg \
    "${CARGO_TARGET_DIR:-target/wasm}/wasm32-unknown-unknown/release/moeflow_web.wasm"
echo "web/build.sh: serve web/ (python3 -m http.server -d web) and open index.html"
