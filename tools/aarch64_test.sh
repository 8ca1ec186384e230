#!/usr/bin/env bash
# Builds moeflow's library tests for aarch64 (Linux) and runs them under qemu: the portable
# host experts' kernels as an ARM CPU compiles them (NEON), on a machine that has none.
# `tools/aarch64_test.sh host_experts` (the arguments go to the test binary as its filter and
# options), into target/aarch64 (CARGO_TARGET_DIR overrides). The library is built with the
# `synth` feature only (no wgpu back end), so the GPU tests report no adapter.
#
# Needs qemu-user and an aarch64 linker and C library (apt-get install qemu-user
# gcc-aarch64-linux-gnu libc6-dev-arm64-cross). With rustup's aarch64 target installed
# (`rustup target add aarch64-unknown-linux-gnu`) this is a plain cross build; without it (no
# prebuilt standard library can be fetched here) it uses Debian's rustc-web, cargo-web and
# rust-web-src, which build the standard library from source (-Zbuild-std; minutes on 2
# cores, once per target directory).
set -euo pipefail
cd "$(dirname "$0")/.."
for tool in qemu-aarch64 aarch64-linux-gnu-gcc; do
    command -v "$tool" >/dev/null || {
        echo "aarch64_test: no $tool (apt-get install qemu-user gcc-aarch64-linux-gnu libc6-dev-arm64-cross)" >&2
        exit 1
    }
done
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$PWD/target/aarch64}
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="qemu-aarch64 -L /usr/aarch64-linux-gnu"
args=(test --release --lib --no-default-features --features synth --target aarch64-unknown-linux-gnu)
if rustup target list --installed 2>/dev/null | grep -qx aarch64-unknown-linux-gnu; then
    exec cargo "${args[@]}" -- "$@"
fi
source tools/rust_web.sh
rust_web_check aarch64_test aarch64
RUSTC=/usr/bin/rustc RUSTC_BOOTSTRAP=1 exec /usr/bin/cargo "${args[@]}" -Zbuild-std -- "$@"
