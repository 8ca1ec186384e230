//! Typed wrappers, one module per kernel family: validate the request, build (or fetch) the
//! pipeline, and return [`Dispatch`](crate::pipeline::Dispatch)es for the caller to record.

pub mod combine;
pub mod dispatch;
pub mod gemm;
pub mod routing;
pub(crate) mod sizing;
