//! The cooperative-matrix precision mode ([`GemmVariant::CoopF16`]): the expert projections on
//! a GPU's matrix units (tensor cores on NVIDIA, simdgroup matrices on Apple) through wgpu's
//! experimental cooperative matrices, with f16 inputs and f32 accumulators.
//!
//! A workgroup is one subgroup of [`CoopBlock::lanes`] invocations (the adapter's only subgroup
//! size: cooperative matrices are subgroup-scoped, so a workgroup of one subgroup needs no
//! subgroup ids). It computes a `rows × cols` block as `(rows/n) × (cols/n)` fragments of
//! `n × n` outputs (`n` = [`CoopBlock::size`], 8 or 16). K is staged 32 values at a time in
//! workgroup memory, x and the weights rounded to f16 as they are staged (`stage_f16.wgsl`: to
//! nearest, ties to even, by integer operations, so the same operands as
//! [`GemmVariant::TileF16`] on every adapter), each staged row 40 halves apart (80 bytes: the
//! 16-byte alignment cooperative loads need); past K and in rows without an entry zeros.
//! Each fragment of x (row-major) and of the weights (column-major: a column of the B matrix is
//! a weight row) is loaded from there and multiplied into the f32 accumulators, `n` values of K
//! at a time; the accumulators are stored to workgroup memory and the epilogue (bias,
//! activation, scatter) runs on them as in every other variant.
//!
//! **Order and bound.** Every product of two f16 values is exact in f32; how the products of
//! one multiply-add are summed (order, internal width, rounding: NVIDIA's tensor cores align
//! and truncate) is the device's. The mode promises a bound, not bits: each output of a
//! projection is within `(K + 16)·2^-22·Ŝ` of the exact dot of the f16-rounded operands
//! (`Ŝ = Σ|x̂_k·ŵ_k|`), so within `2^-10·S + 2^-24·A + (K + 16)·2^-21·S` of the exact f32
//! reference (`S = Σ|x_k·w_k|`, `A = Σ(|x_k| + |w_k|)`) while the operands stay within ±65504.
//!
//! **Checked before use** on each device (`device_check.rs`). The WGSL is `generate/coop.rs`'s.

use std::collections::HashMap;
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use crate::context::Context;
use crate::error::{Error, Result};
use crate::sync::lock;

/// K values staged per chunk.
pub(super) const KC: u32 = 32;

/// Halves between staged rows: [`KC`] plus 8, so every fragment's first value and the stride
/// are 16-byte aligned.
pub(super) const SK: u32 = KC + 8;

/// The block of [`GemmVariant::CoopF16`](super::GemmVariant::CoopF16): `rows × cols` outputs
/// in fragments of `size × size` by one subgroup of `lanes` invocations. `size` is 8 or 16 (a
/// size the adapter reports for f16 × f16 → f32); `rows` and `cols` are 16, 32 or 64 and
/// multiples of `size`, with at most 16 fragments (each with a second accumulator in the SwiGLU pass); `lanes` is a power of two
/// in 4..=128, the adapter's one subgroup size. The dispatch tile is a multiple of `rows`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct CoopBlock {
    /// Output rows per workgroup (entries of one expert's tile).
    pub rows: u32,
    /// Output columns per workgroup.
    pub cols: u32,
    /// Rows, columns and K of one multiply-add.
    pub size: u32,
    /// Invocations per workgroup: one subgroup.
    pub lanes: u32,
}

impl CoopBlock {
    /// `rows × cols` outputs, `size × size` fragments, one subgroup of `lanes`.
    pub const fn new(rows: u32, cols: u32, size: u32, lanes: u32) -> Self {
        CoopBlock { rows, cols, size, lanes }
    }

    /// The short name's shape part, e.g. `r32c32-n16-l32`.
    pub(super) fn name(self) -> String {
        let CoopBlock { rows, cols, size, lanes } = self;
        format!("r{rows}c{cols}-n{size}-l{lanes}")
    }

    /// Fragments per block (of each accumulator).
    fn fragments(self) -> u32 {
        (self.rows / self.size) * (self.cols / self.size)
    }

    /// Checks the block against its documented ranges.
    pub(super) fn validate(self) -> Result<()> {
        let CoopBlock { rows, cols, size, lanes } = self;
        if !matches!(size, 8 | 16) {
            return Err(Error::invalid(format!("cooperative GEMM fragment size {size} must be 8 or 16")));
        }
        if !matches!(rows, 16 | 32 | 64)
            || !matches!(cols, 16 | 32 | 64)
            || rows % size != 0
            || cols % size != 0
        {
            return Err(Error::invalid(format!(
                "cooperative GEMM block {rows} x {cols}: rows and cols must be 16, 32 or 64 and multiples of {size}"
            )));
        }
        if self.fragments() > 16 {
            return Err(Error::invalid(format!(
                "cooperative GEMM block {}: {} fragments, at most 16",
                self.name(),
                self.fragments()
            )));
        }
        if !lanes.is_power_of_two() || !(4..=128).contains(&lanes) {
            return Err(Error::invalid(format!(
                "cooperative GEMM lanes = {lanes} must be a power of two in 4..=128"
            )));
        }
        Ok(())
    }

    /// Workgroup memory in bytes: the staged x and weight rows (f16), both accumulators'
    /// blocks (f32), the block's entries and its expert.
    pub(super) fn workgroup_bytes(self) -> u32 {
        (self.rows + 2 * self.cols) * SK * 2 + 2 * self.rows * self.cols * 4 + self.rows * 4 + 4
    }

    /// Whether `ctx`'s device can run the block.
    ///
    /// # Errors
    /// [`Error::MissingFeature`] naming what is missing: cooperative matrices (not enabled, or
    /// without this fragment size for f16 into f32), shader-f16, or one subgroup size equal to
    /// `lanes`.
    pub(super) fn require(self, ctx: &Context) -> Result<()> {
        let a = ctx.adapter();
        let name = self.name();
        if !a.capabilities.cooperative_matrix {
            return Err(Error::MissingFeature(format!(
                "the coop-{name} GEMM needs cooperative matrices, which this device does not have enabled (where the adapter offers them, {} = 1 enables them)",
                crate::context::COOPERATIVE_MATRIX_ENV
            )));
        }
        if !a.cooperative_f16_sizes.contains(&self.size) {
            return Err(Error::MissingFeature(format!(
                "the coop-{name} GEMM needs {n} x {n} x {n} cooperative matrices of f16 into f32; the adapter reports sizes {:?}",
                a.cooperative_f16_sizes,
                n = self.size
            )));
        }
        if !a.capabilities.shader_f16 {
            return Err(Error::MissingFeature(format!("the coop-{name} GEMM needs shader-f16")));
        }
        if a.subgroup_sizes != [self.lanes, self.lanes] {
            return Err(Error::MissingFeature(format!(
                "the coop-{name} GEMM needs subgroups of exactly {} invocations; the adapter's are {} to {}",
                self.lanes, a.subgroup_sizes[0], a.subgroup_sizes[1]
            )));
        }
        Ok(())
    }
}

/// The verdicts of the device check (`device_check.rs`) on one device, kept by its
/// [`Context`]: `Err` holds why the block was refused.
#[derive(Default)]
pub(super) struct Verdicts {
    pub(super) of: Mutex<HashMap<CoopBlock, std::result::Result<(), String>>>,
}

/// Whether a plan may dispatch `b` on `ctx`'s device: it is supported and passed
/// `check_on_device` there. Looks the verdict up only; submits nothing.
///
/// # Errors
/// [`CoopBlock::require`]'s errors; the remembered refusal; [`Error::InvalidArgument`] where the
/// block was never checked on this device.
pub(super) fn passed(ctx: &Context, b: CoopBlock) -> Result<()> {
    b.require(ctx)?;
    match lock(&ctx.kept::<Verdicts>().of).get(&b) {
        Some(verdict) => verdict.clone().map_err(Error::invalid),
        None => Err(Error::invalid(format!(
            "the coop-{} GEMM has not been checked on this device: call kernels::gemm::check_on_device \
             before planning it (a layer's constructors and the tuner do)",
            b.name()
        ))),
    }
}
