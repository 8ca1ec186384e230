# Sourced by the cross-build scripts (wasm_cargo.sh, aarch64_test.sh): checks that Debian's
# rustc-web, cargo-web and rust-web-src are installed, the toolchain that builds a target's
# standard library from source (-Zbuild-std) where rustup has no prebuilt one for it.
# `rust_web_check NAME TARGET` exits with NAME's message when a part is missing.
rust_web_check() {
    local name=$1 target=$2 tool
    for tool in /usr/bin/rustc /usr/bin/cargo; do
        [[ -x $tool ]] || {
            echo "$name: no $target target in rustup and no $tool (apt-get install rustc-web cargo-web rust-web-src)" >&2
            exit 1
        }
    done
    [[ -d /usr/lib/rustlib/src/rust/library ]] || {
        echo "$name: no standard library sources (apt-get install rust-web-src)" >&2
        exit 1
    }
}
