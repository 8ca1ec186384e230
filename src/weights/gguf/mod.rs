//! GGUF files (ggml's model format, versions 2 and 3): the header, the typed metadata, the
//! tensor table, and a tensor's values as f32.
//!
//! Layout (little-endian): magic `GGUF`, version (u32), tensor count and metadata count (u64),
//! the metadata pairs (a string key, a u32 value type, the value), then per tensor its name,
//! dimension count (u32, at most 4), dimensions (u64 each, innermost first, as ggml's `ne`),
//! ggml type (u32) and offset (u64) into the data section, which starts at the next multiple
//! of the alignment (`general.alignment`, 32 by default). Strings are a u64 length and UTF-8
//! bytes.
//!
//! A tensor with dimensions `[d0, d1, ..]` holds `d0` contiguous values per row, so its values
//! read row-major are those of a PyTorch tensor of shape `[.., d1, d0]` (GGUF's
//! `ffn_gate_inp.weight` `[H, E]` is the router `[E, H]`). [`Gguf::tensor_f32`] decodes F32,
//! F16, BF16, Q8_0, Q4_0 and MXFP4 ([`crate::quant`]); other types are listed with their ggml
//! type number and refused by name there.
//!
//! Files: `values.rs` (metadata values, ggml types), `parse.rs` (the header, metadata, tensor
//! table and tensor values of a file's bytes), `file.rs` (a file on disk, memory-mapped),
//! `write.rs` (writing files). This file is the face.

mod file;
mod parse;
mod values;
mod write;

pub use file::GgufFile;
pub use parse::{Gguf, GgufTensor};
pub use values::{GgmlType, GgufValue};
pub use write::GgufWriter;
