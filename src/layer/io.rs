//! The tensors a forward reads and writes outside its workspace.

use super::config::MoeConfig;
use crate::error::{Error, Result};
use crate::tensor::{DType, Tensor};

/// What the forwards of a [`super::ForwardPlan`] read and write besides their scratch: `x[T, H]`
/// and `y[T, H]` (f32), where T, the rows of `x`, is the plan's maximum token count; and,
/// where the caller wants them in tensors of its own rather than the workspace, the routing
/// results `indices[T, k]` (u32) and `weights[T, k]` (f32), and the router's `logits[T, E]`
/// (f32, for a route mode that writes them). A forward of n tokens reads and writes the first n
/// rows of each.
#[derive(Clone, Copy, Debug)]
pub struct ForwardIo<'b> {
    pub(super) x: Tensor<'b>,
    pub(super) y: Tensor<'b>,
    pub(super) routing: Option<(Tensor<'b>, Tensor<'b>)>,
    pub(super) logits: Option<Tensor<'b>>,
}

/// Which of a forward's results are written to the caller's tensors instead of the workspace.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct CallerOutputs {
    /// The routing indices and weights.
    pub(crate) routing: bool,
    /// The router logits.
    pub(crate) logits: bool,
}

impl<'b> ForwardIo<'b> {
    /// Forwards from `x` into `y` (tensors of one shape; they may be views of one buffer, and
    /// swap roles between layers).
    pub fn new(x: Tensor<'b>, y: Tensor<'b>) -> Self {
        ForwardIo { x, y, routing: None, logits: None }
    }

    /// Writes the routing results to `indices[T, k]` (u32) and `weights[T, k]` (f32) instead
    /// of the workspace (where the next layer sharing it would overwrite them).
    pub fn with_routing(self, indices: Tensor<'b>, weights: Tensor<'b>) -> Self {
        ForwardIo { routing: Some((indices, weights)), ..self }
    }

    /// Writes the router logits to `logits[T, E]` (f32) instead of the workspace.
    pub fn with_logits(self, logits: Tensor<'b>) -> Self {
        ForwardIo { logits: Some(logits), ..self }
    }

    /// The plan's maximum token count: the rows of x.
    pub fn max_tokens(&self) -> u32 {
        self.x.rows()
    }

    /// The input.
    pub fn x(&self) -> Tensor<'b> {
        self.x
    }

    /// The output.
    pub fn y(&self) -> Tensor<'b> {
        self.y
    }

    /// Which results the caller's tensors take.
    pub(crate) fn caller_outputs(&self) -> CallerOutputs {
        CallerOutputs { routing: self.routing.is_some(), logits: self.logits.is_some() }
    }

    /// Checks every tensor against `cfg`'s shape.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for x without rows, or logits asked of a route mode that does
    /// not write them; [`Error::Shape`] naming the tensor whose shape or element type is not the
    /// layer's.
    pub(crate) fn check(&self, cfg: &MoeConfig) -> Result<()> {
        let (t, h, k, e) = (self.x.rows(), cfg.route.hidden, cfg.route.k, cfg.route.experts);
        if t == 0 {
            return Err(Error::invalid("a plan needs a maximum token count of at least 1 (rows of `x`)"));
        }
        self.x.check_shape("x", [t, h], DType::F32)?;
        self.y.check_shape("y", [t, h], DType::F32)?;
        if let Some((indices, weights)) = self.routing {
            indices.check_shape("indices", [t, k], DType::U32)?;
            weights.check_shape("weights", [t, k], DType::F32)?;
        }
        if let Some(logits) = self.logits {
            if !cfg.route_mode.writes_logits() {
                return Err(Error::invalid(format!(
                    "router logits were asked for, but the route mode {:?} does not write them \
                     (use RouteMode::Unfused or RouteMode::Fused {{ write_logits: true }})",
                    cfg.route_mode
                )));
            }
            logits.check_shape("logits", [t, e], DType::F32)?;
        }
        Ok(())
    }
}
