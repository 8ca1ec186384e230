//! MoE layer weights from safetensors files, with the tensor names of Mixtral
//! (`block_sparse_moe.gate`, `experts.N.w1/w2/w3`), Qwen2-MoE / Qwen3-MoE / OLMoE / DeepSeek
//! (`mlp.gate`, `mlp.experts.N.gate_proj/up_proj/down_proj`, `shared_expert(s)`,
//! `shared_expert_gate`, `mlp.gate.e_score_correction_bias`). Tensors may be f32, f16 or
//! bf16; expert weights also FP8 e4m3 with `weight_scale_inv` block scales (DeepSeek-V3,
//! Qwen3-FP8; docs/quant.md). The routing comes from the family's semantics ([`family`]): a
//! Hugging Face `config.json` names the family and its keys, or flags supply what the family
//! needs.
//!
//! A [`Checkpoint`] maps one file or a sharded checkpoint; [`load_checkpoint_layer`] reads a
//! layer to host f32 ([`LoadedLayer`]), [`upload_checkpoint_layer`] streams it to the device in
//! its stored dtype ([`UploadedLayer`]), both after checking every header.
//!
//! Files: `checkpoint.rs` (files and shards), `tensors.rs` (safetensors data), `naming.rs`
//! (name schemes), `family.rs` (routing semantics), `loaded.rs` (what a load gives),
//! `safetensors_layer.rs` and `gpt_oss.rs` (safetensors layers), `gguf.rs` and `gguf_layer.rs`
//! (GGUF files and layers), `output.rs` (writing results). This file is the face.

mod checkpoint;
pub mod family;
mod file_bytes;
pub mod gguf;
mod gguf_config;
mod gguf_layer;
mod gpt_oss;
mod loaded;
mod naming;
mod output;
mod safetensors_layer;
mod tensors;

pub use checkpoint::Checkpoint;
pub use family::{Family, Routing, RoutingFlags};
#[cfg(not(target_arch = "wasm32"))]
pub use gguf_layer::upload_gguf_layer;
#[cfg(not(target_arch = "wasm32"))]
pub use gguf_layer::upload_gguf_layer_placed;
pub use gguf_layer::{gguf_moe_layers, load_gguf_layer, upload_gguf_layer_async};
#[cfg(not(target_arch = "wasm32"))]
pub use loaded::PlacedLayer;
pub use loaded::{LoadOptions, LoadedLayer, UploadedLayer};
pub use output::{OutTensor, check_output_path, write_atomically, write_tensors};
#[cfg(not(target_arch = "wasm32"))]
pub use safetensors_layer::upload_checkpoint_layer;
#[cfg(not(target_arch = "wasm32"))]
pub use safetensors_layer::upload_checkpoint_layer_placed;
pub use safetensors_layer::{load_checkpoint_layer, load_layer, upload_checkpoint_layer_async};
pub use tensors::{load_input, read_file, to_f32};
