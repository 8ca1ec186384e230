//! Kernel specifications (`spec.rs`), built pipelines and their cache (`cache.rs`), the
//! caller's buffers as plans bind them (`view.rs`), and encodable dispatches (`dispatch.rs`).
//! This file is the face.

mod cache;
mod dispatch;
mod spec;
mod view;

pub use cache::Kernel;
pub(crate) use cache::{DUMP_PIPELINES, PipelineCache, PipelineKey, dump_pipeline};
pub(crate) use dispatch::Indirect;
pub use dispatch::{BoundBuffer, BoundTexture, Dispatch};
pub use spec::{Access, Constants, KernelSpec, Workgroup};
pub use view::{Binding, BufferView, TextureBinding};
