//! Routed experts kept in host memory and computed on the CPU ([`HostExperts`]), as
//! llama.cpp's `--cpu-moe` keeps them: the weights read where they lie (a memory-mapped
//! checkpoint, in their stored format: f32, f16, bf16, Q8_0, Q4_0, MXFP4 or FP8), never
//! uploaded; the (clamped) SwiGLU FFN of the rows routed to them threaded over experts and
//! output columns, its dot products in SIMD chosen at run time for the CPU, each value decoded
//! as [`crate::quant`] decodes it and each dot in the layer's accumulation order, so a host
//! expert's output has the bits of the CPU reference (`reference::gemm::ffn_row`).
//!
//! Files: `projection.rs` (one projection's stored values, expert by expert), `tile.rs` (the
//! layouts the decoders write and the kernels read), `decode.rs` (stored values to tiles and
//! rows; `decode_x86.rs` its MXFP4 blocks in AVX-512 and AVX2), `kernel.rs` (the dot
//! products per order and SIMD target), `x86.rs` and `avx2.rs` (the AVX-512 and AVX2 kernels
//! it calls), `rows.rs` (the rows kernel in portable code: NEON), `experts.rs` (the experts a
//! host holds, checked), `ffn.rs` (the FFN over the rows routed to the host), `memory.rs`
//! (host buffers whose allocation fails as an error). This file is the face.

#[cfg(target_arch = "x86_64")]
mod avx2;
mod decode;
#[cfg(target_arch = "x86_64")]
mod decode_x86;
mod experts;
mod ffn;
mod kernel;
mod memory;
mod projection;
mod rows;
mod tile;
#[cfg(target_arch = "x86_64")]
mod x86;

pub use experts::{HostBias, HostExperts};
pub use ffn::HostEntry;
pub(crate) use memory::filled;
pub use projection::HostProjection;
