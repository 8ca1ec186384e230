//! Row-wise kernels every executor can run (affine, SiLU over a row halo, RMS norm), and
//! the chain of eight such stages from the scheduler experiment this layer reproduces.

use super::graph::{Graph, Reach, Read, Source};
use crate::error::{Error, Result};
use crate::synth::Synth;

/// Program code of [`RowOp::Affine`] (`KIND_AFFINE` in wgsl/dag/program.wgsl).
pub(crate) const KIND_AFFINE: u32 = 0;
/// Program code of [`RowOp::Silu`].
pub(crate) const KIND_SILU: u32 = 1;
/// Program code of [`RowOp::Rms`].
pub(crate) const KIND_RMS: u32 = 2;

/// A row-wise stage kernel over `cols` columns (see `wgsl/dag/program.wgsl` for the exact
/// operations and their order).
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum RowOp {
    /// `fma(x, w[c], b[c])`.
    Affine {
        /// Per-column scale, `cols` values.
        w: Vec<f32>,
        /// Per-column bias, `cols` values.
        b: Vec<f32>,
    },
    /// `h / (1 + exp(-h))` with `h = 0.25 x[r-1] + 0.5 x[r] + 0.25 x[r+1]` (rows clamped):
    /// reads a halo of one row on each side.
    Silu,
    /// `(x * inverseSqrt(mean(x²) + 1e-6)) * gamma[c]` over each row (the sum of squares in
    /// one fixed order over 64 virtual lanes, see `wgsl/dag/program.wgsl`).
    Rms {
        /// Per-column gain, `cols` values.
        gamma: Vec<f32>,
    },
}

impl RowOp {
    /// How the op reads its source.
    pub(crate) fn reach(&self) -> Reach {
        match self {
            RowOp::Silu => Reach::Halo(1),
            RowOp::Affine { .. } | RowOp::Rms { .. } => Reach::RowLocal,
        }
    }

    /// The shader's code for the kind (`KIND_*` in `wgsl/dag/program.wgsl`).
    pub(crate) fn code(&self) -> u32 {
        match self {
            RowOp::Affine { .. } => KIND_AFFINE,
            RowOp::Silu => KIND_SILU,
            RowOp::Rms { .. } => KIND_RMS,
        }
    }

    /// Per-column parameters, in the order the shader reads them.
    pub(crate) fn params(&self) -> Vec<f32> {
        match self {
            RowOp::Affine { w, b } => w.iter().chain(b).copied().collect(),
            RowOp::Silu => Vec::new(),
            RowOp::Rms { gamma } => gamma.clone(),
        }
    }
}

/// A graph of row ops over a `rows x cols` matrix: each stage reads exactly one source.
#[derive(Debug)]
pub struct RowGraph {
    graph: Graph<RowOp>,
    cols: u32,
}

impl RowGraph {
    /// An empty graph over `rows x cols` values, tiled by `tile_rows` rows.
    ///
    /// # Errors
    /// [`Error::Shape`] for zero columns, and [`Graph::new`]'s errors.
    pub fn new(rows: u32, cols: u32, tile_rows: u32) -> Result<Self> {
        if cols == 0 {
            return Err(Error::shape("row graph columns", "at least 1", 0));
        }
        Ok(RowGraph { graph: Graph::new(rows, tile_rows)?, cols })
    }

    /// Adds `op` reading `source`; its reach comes from the op.
    ///
    /// # Errors
    /// [`Error::Shape`] when the op's parameters are not one per column, and
    /// [`Graph::add`]'s errors.
    pub fn add(&mut self, name: impl Into<String>, op: RowOp, source: Source) -> Result<usize> {
        let name = name.into();
        let n = self.cols as usize;
        let lens: Vec<usize> = match &op {
            RowOp::Affine { w, b } => vec![w.len(), b.len()],
            RowOp::Silu => Vec::new(),
            RowOp::Rms { gamma } => vec![gamma.len()],
        };
        if let Some(&len) = lens.iter().find(|&&l| l != n) {
            return Err(Error::shape(format!("parameters of `{name}`"), format!("{n} columns"), len));
        }
        let reach = op.reach();
        self.graph.add(name, op, vec![Read { source, reach }])
    }

    /// The underlying graph.
    pub fn graph(&self) -> &Graph<RowOp> {
        &self.graph
    }

    /// Columns.
    pub fn cols(&self) -> u32 {
        self.cols
    }

    /// The source of stage `s` (`None` for the graph input).
    pub(crate) fn source(&self, s: usize) -> Option<usize> {
        self.graph.stages()[s].reads.first().and_then(|r| match r.source {
            Source::Stage(q) => Some(q),
            Source::Input => None,
        })
    }

    /// The eight-stage chain of the scheduler experiment: (affine, SiLU, RMS) twice, then
    /// (affine, SiLU), over `rows x cols`, one row per tile, parameters from `seed`.
    ///
    /// # Errors
    /// As [`Self::new`].
    pub fn seed_chain(rows: u32, cols: u32, seed: u64) -> Result<Self> {
        let mut g = RowGraph::new(rows, cols, 1)?;
        let mut s = Synth::new(seed);
        let n = cols as usize;
        let mut source = Source::Input;
        for round in 0..3 {
            let w: Vec<f32> = s.uniform(n, 0.5).iter().map(|v| 1.0 + v).collect();
            let affine =
                g.add(format!("affine{round}"), RowOp::Affine { w, b: s.uniform(n, 0.25) }, source)?;
            let silu = g.add(format!("silu{round}"), RowOp::Silu, Source::Stage(affine))?;
            source = Source::Stage(silu);
            if round < 2 {
                let gamma: Vec<f32> = s.uniform(n, 0.25).iter().map(|v| 1.0 + v).collect();
                source = Source::Stage(g.add(format!("rms{round}"), RowOp::Rms { gamma }, source)?);
            }
        }
        Ok(g)
    }
}
