//! Kernel variants of the expert GEMM and the accumulation order of each mode: the types a
//! caller names. Their WGSL is generated in `generate/`, their modules and specs assembled in
//! `specs.rs`, the defaults and tuning candidates per adapter chosen in `policy.rs`.
//!
//! Two shapes of kernel, each generated with its register block written out as named
//! variables (a private array indexed by a loop counter is kept in memory by llvmpipe, and
//! loops that index it are not unrolled for it):
//!
//! - [`GemmVariant::Tile`] (GPUs): workgroup-memory tiles of 32 to 128 rows and columns, 4 × 4
//!   to 8 × 8 outputs per invocation, K staged through workgroup memory `4·bk4` at a time. The
//!   GPU default is its 32 × 32 tile of 8 × 8 invocations ([`TileBlock::tiled`], named
//!   `tiled-bk8`); the 32-row tiles of 64 or 128 columns ([`TileBlock::wide`], `tiledw-…`) feed
//!   each staged x value to more outputs, for GPUs whose tiled kernel waits on workgroup memory.
//! - [`GemmVariant::TileF16`] (a precision mode the caller chooses): `Tile` staging its operands
//!   in f16; not bitwise equal to the exact variants (see its docs).
//! - [`GemmVariant::Direct`]: no workgroup memory and no barriers. `lanes` invocations share
//!   one block of `rows` rows and each computes `cols` columns spaced `lanes` apart, reading x
//!   and the weights straight from memory; every loaded value is reused across the whole
//!   block, which is what pays on lavapipe, where each storage-buffer load is a loop over the
//!   SIMD lanes and spilled accumulators cost far less than loads. The K loop is written out
//!   once per live-row count (`rows`, then halves down to 4): a block whose rows past the
//!   first `n` have no entry (the padding at the end of an expert's tile) runs the narrowest
//!   copy that covers its live rows, so padding rows cost no FMAs beyond that.
//! - [`GemmVariant::Window`] (CPU adapters): the direct block, reading its x rows from a
//!   uniform-buffer window that a staging pass fills (`wgsl/gemm/stage.wgsl`). On llvmpipe a
//!   uniform load at an address every lane shares is one scalar load and a broadcast, against a
//!   per-lane loop for a storage load, so only the weight loads stay dear and each feeds `rows`
//!   FMAs. Where a window cannot hold `rows` rows of K the block halves its rows (down to 8,
//!   columns doubled); where no window block fits (or the device's uniform bindings are
//!   smaller than a window) the pass runs as the direct variant of the same block: same
//!   operations, same bits.
//! - [`GemmVariant::Texture`] (LLVM CPU adapters): the window block reading its weights from a
//!   texture copy of the same words (`wgsl/gemm/weights_texture.wgsl`, [`super::texture`]), one
//!   texel fetch per group of four K values. On llvmpipe a storage load is a loop over the
//!   SIMD lanes while a texel fetch serves them together. Where the texture copy is past the
//!   device's texture limits the pass runs as the window variant of the same block, and where no
//!   window fits as the direct one: same operations, same bits.
//!
//! Every exact variant (all but `TileF16`) of one [`GemmOrder`] computes every output with the
//! same operations in the same order, so all variants (and the row-wise decode kernel) are bit-identical within a
//! mode, and no choice depends on M, the tile or the path (batch invariance in both modes).

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

use super::coop::CoopBlock;

/// The accumulation order of every expert projection: the numeric contract of a mode.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GemmOrder {
    /// K in groups of four (entries past K read as 0.0); lane `j` of a four-lane accumulator
    /// takes `k = 4g + j` (`acc = fma(x4, w4, acc)` from zero); the output is
    /// `(acc.x + acc.y) + (acc.z + acc.w)`. moeflow's original order.
    #[default]
    Strict,
    /// One accumulator per output: `acc = fma(x[k], w[k], acc)` from 0.0 for `k` ascending over
    /// K rounded up to a multiple of four (entries past K read as 0.0). A quarter of the
    /// accumulators of [`GemmOrder::Strict`].
    Fast,
}

/// One kernel shape of the grouped, dense and all-experts GEMM (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(from = "VariantRecord", into = "VariantRecord")]
#[non_exhaustive]
pub enum GemmVariant {
    /// Workgroup-memory tiles of `rows` × `cols` outputs (see [`TileBlock`]).
    Tile(TileBlock),
    /// A precision mode, not an exact variant: [`GemmVariant::Tile`] with x and the weights
    /// (the activations and the weights in the down pass) rounded to f16 as they are staged in
    /// workgroup memory (to nearest, ties to even, by integer operations: the same bits on every
    /// adapter; half the workgroup memory and its traffic), products and sums in f32 in the
    /// variant's order, as ggml's default "f32" Vulkan matmuls run. Its outputs are the bits of
    /// the reference on f16-rounded operands (`reference::gemm::FfnWeights::f16_operands`), and
    /// each output of a projection is within `2^-10·S + 2^-24·A + (K/2 + 4)·2^-23·S` of the
    /// exact f32 reference (`S = Σ|x_k·w_k|`, `A = Σ(|x_k| + |w_k|)`) while the operands stay
    /// within ±65504 (past it they round to infinity). Chosen only by the caller
    /// (`KernelChoice::Fixed`, [`FfnKernels`]); never a default or a tuning candidate; the
    /// row-wise decode path stays exact, so a layer with these tiles is not batch-invariant.
    /// Same tiles as `Tile`.
    TileF16(TileBlock),
    /// A precision mode for GPUs with matrix units: [`CoopBlock`] fragments multiplied through
    /// wgpu's experimental cooperative matrices, the operands rounded to f16 as
    /// [`GemmVariant::TileF16`] rounds them, f32 accumulators summed in the device's order.
    /// Each output of a projection is within `(K + 16)·2^-22·Ŝ` of the exact dot of the
    /// rounded operands (`Ŝ = Σ|x̂_k·ŵ_k|`), so within `2^-10·S + 2^-24·A + (K + 16)·2^-21·S`
    /// of the exact f32 reference (see `coop.rs`). Runs only on a device created with
    /// cooperative matrices ([`crate::context::COOPERATIVE_MATRIX_ENV`]) that reports the
    /// block's fragment size for f16 into f32 and one subgroup size equal to its lanes, and
    /// only after it matched the CPU reference within that bound on the device (checked on
    /// first use); chosen by the caller or, on such a device, by the tuner; never a default.
    /// [`FfnKernels::order`] does not apply to it (the sums are in the device's order).
    CoopF16(CoopBlock),
    /// No workgroup memory: a [`LaneBlock`] reading x and the weights from storage.
    Direct(LaneBlock),
    /// [`GemmVariant::Direct`]'s block with x read from a uniform-buffer window (see the
    /// module docs).
    Window(LaneBlock),
    /// [`GemmVariant::Window`]'s block with the weights read from a texture copy (see the
    /// module docs).
    Texture(LaneBlock),
}

/// The block of [`GemmVariant::Direct`], [`GemmVariant::Window`] and [`GemmVariant::Texture`]
/// (which differ only in where they read x and the weights): `lanes` invocations (1..=256)
/// share `rows` rows (1, 2, 4, 8, 16 or 32), each computing `cols` columns (1..=32) spaced
/// `lanes` apart, with at most 1024 accumulators (`2·rows·cols`, both SwiGLU halves).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct LaneBlock {
    /// Rows per block (divides 32, so no block straddles two experts' tiles).
    pub rows: u32,
    /// Columns per invocation.
    pub cols: u32,
    /// Invocations per workgroup.
    pub lanes: u32,
}

impl LaneBlock {
    /// `rows` rows, `cols` columns per invocation, `lanes` invocations.
    pub const fn new(rows: u32, cols: u32, lanes: u32) -> Self {
        LaneBlock { rows, cols, lanes }
    }

    /// Checks the block against its documented ranges.
    fn validate(self) -> Result<()> {
        let LaneBlock { rows, cols, lanes } = self;
        if !matches!(rows, 1 | 2 | 4 | 8 | 16 | 32) {
            return Err(Error::invalid(format!("direct GEMM rows = {rows} must be 1, 2, 4, 8, 16 or 32")));
        }
        if !(1..=32).contains(&cols) {
            return Err(Error::invalid(format!("direct GEMM cols = {cols} must be in 1..=32")));
        }
        if !(1..=256).contains(&lanes) {
            return Err(Error::invalid(format!("direct GEMM lanes = {lanes} must be in 1..=256")));
        }
        if 2 * rows * cols > MAX_OUTPUTS {
            return Err(Error::invalid(format!(
                "direct GEMM {rows} x {cols} needs {} accumulators with SwiGLU, past {MAX_OUTPUTS}",
                2 * rows * cols
            )));
        }
        Ok(())
    }
}

/// The workgroup-memory tile of [`GemmVariant::Tile`] and [`GemmVariant::TileF16`]: `rows` ×
/// `cols` outputs by `rows / tm` × `cols / tn` invocations (64 to 256), each `tm` rows × `tn`
/// columns (rows `tm·ty + i`, columns `tx + (cols / tn)·j`), K staged `4·bk4` at a time.
/// `rows` and `cols` are 32, 64 or 128, `tm` and `tn` 4 or 8, `bk4` in 1..=16. The dispatch
/// tile is a multiple of `rows`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TileBlock {
    /// Output rows per workgroup (entries of one expert's tile).
    pub rows: u32,
    /// Output columns per workgroup.
    pub cols: u32,
    /// Output rows per invocation.
    pub tm: u32,
    /// Output columns per invocation.
    pub tn: u32,
    /// Groups of four K values staged per chunk.
    pub bk4: u32,
}

impl TileBlock {
    /// `rows` × `cols` outputs, `tm` × `tn` per invocation, `bk4` groups of four staged.
    pub const fn new(rows: u32, cols: u32, tm: u32, tn: u32, bk4: u32) -> Self {
        TileBlock { rows, cols, tm, tn, bk4 }
    }

    /// The 32 × 32 tile of 8 × 8 invocations, 4 × 4 outputs each (the GPU default with
    /// `bk4` = 8; named `tiled-bk{bk4}`).
    pub const fn tiled(bk4: u32) -> Self {
        TileBlock::wide(32, 4, bk4)
    }

    /// 32 rows × `cols` (32, 64 or 128), 4 × `tn` outputs per invocation (named
    /// `tiledw-c{cols}t{tn}-bk{bk4}` for 64 and 128 columns).
    pub const fn wide(cols: u32, tn: u32, bk4: u32) -> Self {
        TileBlock { rows: 32, cols, tm: 4, tn, bk4 }
    }

    /// The variant's short name: `tiled-bk{bk4}` for [`Self::tiled`], `tiledw-c{cols}t{tn}-bk{bk4}`
    /// for the 32-row tiles of 64 or 128 columns ([`Self::wide`]), else `tile-` and
    /// [`Self::name`]'s shape.
    fn variant_name(self) -> String {
        match self.record() {
            VariantRecord::Tiled { bk4 } => format!("tiled-bk{bk4}"),
            VariantRecord::TiledWide { cols, tn, bk4 } => format!("tiledw-c{cols}t{tn}-bk{bk4}"),
            _ => format!("tile-{}", self.name()),
        }
    }

    /// How [`GemmVariant::Tile`] of this tile is recorded: its 32-row tiles under their own
    /// keys (the 32 × 32 tile of [`Self::tiled`], those of 64 or 128 columns of [`Self::wide`]),
    /// every other tile as a `Tile`.
    fn record(self) -> VariantRecord {
        let TileBlock { rows, cols, tm, tn, bk4 } = self;
        if self == TileBlock::tiled(bk4) {
            VariantRecord::Tiled { bk4 }
        } else if rows == 32 && tm == 4 && matches!(cols, 64 | 128) {
            VariantRecord::TiledWide { cols, tn, bk4 }
        } else {
            VariantRecord::Tile(self)
        }
    }

    /// Invocations per workgroup.
    const fn invocations(self) -> u32 {
        (self.rows / self.tm) * (self.cols / self.tn)
    }

    /// The short name's shape part, e.g. `r64c64-m4n4-bk4`.
    fn name(self) -> String {
        let TileBlock { rows, cols, tm, tn, bk4 } = self;
        format!("r{rows}c{cols}-m{tm}n{tn}-bk{bk4}")
    }

    /// Checks the tile against its documented ranges.
    fn validate(self) -> Result<()> {
        let TileBlock { rows, cols, tm, tn, bk4 } = self;
        if !(1..=16).contains(&bk4) {
            return Err(Error::invalid(format!("tiled GEMM bk4 = {bk4} must be in 1..=16")));
        }
        if !matches!(rows, 32 | 64 | 128) || !matches!(cols, 32 | 64 | 128) {
            return Err(Error::invalid(format!(
                "GEMM tile {rows} x {cols}: rows and cols must be 32, 64 or 128"
            )));
        }
        if !matches!(tm, 4 | 8) || !matches!(tn, 4 | 8) {
            return Err(Error::invalid(format!("GEMM tile tm = {tm}, tn = {tn}: each must be 4 or 8")));
        }
        if !(64..=256).contains(&self.invocations()) {
            return Err(Error::invalid(format!(
                "GEMM tile {}: {} invocations, must be 64 to 256",
                self.name(),
                self.invocations()
            )));
        }
        Ok(())
    }
}

/// Largest accumulator count (outputs per invocation, both SwiGLU halves counted) a variant
/// may ask for.
const MAX_OUTPUTS: u32 = 1024;

impl GemmVariant {
    /// Rows per workgroup block; dispatch tiles must be a multiple of it.
    pub fn block_rows(self) -> u32 {
        match self {
            GemmVariant::Tile(t) | GemmVariant::TileF16(t) => t.rows,
            GemmVariant::CoopF16(b) => b.rows,
            GemmVariant::Direct(b) | GemmVariant::Window(b) | GemmVariant::Texture(b) => b.rows,
        }
    }

    /// Output columns per workgroup.
    pub(crate) fn block_cols(self) -> u32 {
        match self {
            GemmVariant::Tile(t) | GemmVariant::TileF16(t) => t.cols,
            GemmVariant::CoopF16(b) => b.cols,
            GemmVariant::Direct(b) | GemmVariant::Window(b) | GemmVariant::Texture(b) => b.cols * b.lanes,
        }
    }

    /// Checks the parameters against their documented ranges.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] naming the parameter.
    pub fn validate(self) -> Result<()> {
        match self {
            GemmVariant::Tile(t) | GemmVariant::TileF16(t) => t.validate(),
            GemmVariant::CoopF16(b) => b.validate(),
            GemmVariant::Direct(b) | GemmVariant::Window(b) | GemmVariant::Texture(b) => b.validate(),
        }
    }

    /// A short name, e.g. `direct-r16c8l8` or `tiled-bk8`.
    pub fn name(self) -> String {
        match self {
            GemmVariant::TileF16(t) => format!("tileh-{}", t.name()),
            GemmVariant::Tile(t) => t.variant_name(),
            GemmVariant::CoopF16(b) => format!("coop-{}", b.name()),
            GemmVariant::Direct(b) | GemmVariant::Window(b) | GemmVariant::Texture(b) => {
                let kind = match self.source() {
                    OperandSource::Storage => "direct",
                    OperandSource::Window => "window",
                    OperandSource::Texture => "texture",
                };
                format!("{kind}-r{}c{}l{}", b.rows, b.cols, b.lanes)
            }
        }
    }

    /// Workgroup memory the variant uses, in bytes.
    pub(crate) fn workgroup_bytes(self) -> u32 {
        match self.shape() {
            // An x tile of `rows` rows, w and up tiles of `cols` rows, each row `tile_stride`
            // groups of four (a vec4 of f32, or of f16 packed in a vec2<u32>), plus the block's
            // entries and its expert.
            Shape::Tile { tile: t, f16 } => {
                (t.rows + 2 * t.cols) * tile_stride(t.bk4) * if f16 { 8 } else { 16 } + t.rows * 4 + 4
            }
            Shape::Coop(b) => b.workgroup_bytes(),
            Shape::Lanes(_) => 0,
        }
    }

    /// The kernel shape the variant's WGSL is generated from.
    pub(super) fn shape(self) -> Shape {
        match self {
            GemmVariant::Tile(tile) => Shape::Tile { tile, f16: false },
            GemmVariant::TileF16(tile) => Shape::Tile { tile, f16: true },
            GemmVariant::CoopF16(b) => Shape::Coop(b),
            GemmVariant::Direct(b) | GemmVariant::Window(b) | GemmVariant::Texture(b) => Shape::Lanes(b),
        }
    }

    /// Invocations per workgroup.
    pub(crate) fn invocations(self) -> u32 {
        match self {
            GemmVariant::Tile(t) | GemmVariant::TileF16(t) => t.invocations(),
            GemmVariant::CoopF16(b) => b.lanes,
            GemmVariant::Direct(b) | GemmVariant::Window(b) | GemmVariant::Texture(b) => b.lanes,
        }
    }

    /// The direct variant of a window or texture variant's block (what runs where no window
    /// fits); other variants unchanged.
    pub(crate) fn without_window(self) -> Self {
        match self {
            GemmVariant::Window(b) | GemmVariant::Texture(b) => GemmVariant::Direct(b),
            other => other,
        }
    }

    /// The window variant of a texture variant's block (what runs where the weights have no
    /// texture copy); other variants unchanged.
    pub(crate) fn without_texture(self) -> Self {
        match self {
            GemmVariant::Texture(b) => GemmVariant::Window(b),
            other => other,
        }
    }

    /// The same kind of block with `block` (window and texture variants, whose rows the window
    /// fallback halves); other variants unchanged.
    pub(crate) fn with_block(self, block: LaneBlock) -> Self {
        match self {
            GemmVariant::Window(_) => GemmVariant::Window(block),
            GemmVariant::Texture(_) => GemmVariant::Texture(block),
            other => other,
        }
    }

    /// Whether x comes from uniform windows (window and texture variants).
    pub(crate) fn reads_windows(self) -> bool {
        self.source() != OperandSource::Storage
    }

    /// Where the variant's blocks read x and the weights.
    pub(crate) fn source(self) -> OperandSource {
        match self {
            GemmVariant::Texture(_) => OperandSource::Texture,
            GemmVariant::Window(_) => OperandSource::Window,
            GemmVariant::Tile(_)
            | GemmVariant::TileF16(_)
            | GemmVariant::CoopF16(_)
            | GemmVariant::Direct(_) => OperandSource::Storage,
        }
    }
}

/// Where a kernel reads its operands: a variant's blocks ([`GemmVariant::source`]) and the
/// row-wise passes beside them, which read as the blocks do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum OperandSource {
    /// x and the weights from storage.
    Storage,
    /// x from the dispatch's uniform window (rows `params.win_row0 ..`, `ceil(K / 4)` vec4 per
    /// row, zero past K and in rows without an entry), the weights from storage.
    Window,
    /// x from the window, the weights from their texture copy (zero past K).
    Texture,
}

/// The kernels of one expert FFN: an order, and a variant for each projection (the SwiGLU
/// gate/up pass carries twice the accumulators of the down pass, so they may differ).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct FfnKernels {
    /// Accumulation order of every projection.
    pub order: GemmOrder,
    /// The fused gate/up (SwiGLU) projection.
    pub up: GemmVariant,
    /// The down projection (also dense GEMMs and the shared expert's down).
    pub down: GemmVariant,
}

impl FfnKernels {
    /// Checks both variants.
    ///
    /// # Errors
    /// As [`GemmVariant::validate`].
    pub fn validate(self) -> Result<()> {
        self.up.validate()?;
        self.down.validate()
    }

    /// Rows per block of the gate/up and down passes: dispatch tiles must be a multiple of it.
    pub fn block_rows(self) -> u32 {
        self.up.block_rows().max(self.down.block_rows())
    }
}

#[derive(Clone, Copy, Debug)]
pub(super) enum Shape {
    /// A lane block (direct, window and texture variants), no workgroup memory.
    Lanes(LaneBlock),
    /// A workgroup-memory tile (every tiled variant), staged as f16 (packed by
    /// `pack2x16float`) or as f32.
    Tile { tile: TileBlock, f16: bool },
    /// A cooperative-matrix block (coop.rs).
    Coop(CoopBlock),
}

/// the rows of consecutive columns at one K group hit different workgroup-memory banks (a row
/// of `bk4` vec4 with `bk4` even puts every such read in the same banks on a GPU).
pub(super) fn tile_stride(bk4: u32) -> u32 {
    bk4 | 1
}

/// How a [`GemmVariant`] is written in tune caches and bench records: the 32-row tiles under
/// their own keys (`{"tiled": {"bk4": 8}}`, `{"tiledwide": {"cols": 64, "tn": 4, "bk4": 4}}`),
/// every other variant as its own case. Records written before the tiles had one name read
/// back as the same variants.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
enum VariantRecord {
    Tiled { bk4: u32 },
    TiledWide { cols: u32, tn: u32, bk4: u32 },
    Tile(TileBlock),
    TileF16(TileBlock),
    CoopF16(CoopBlock),
    Direct(LaneBlock),
    Window(LaneBlock),
    Texture(LaneBlock),
}

impl From<VariantRecord> for GemmVariant {
    fn from(r: VariantRecord) -> Self {
        match r {
            VariantRecord::Tiled { bk4 } => GemmVariant::Tile(TileBlock::tiled(bk4)),
            VariantRecord::TiledWide { cols, tn, bk4 } => GemmVariant::Tile(TileBlock::wide(cols, tn, bk4)),
            VariantRecord::Tile(t) => GemmVariant::Tile(t),
            VariantRecord::TileF16(t) => GemmVariant::TileF16(t),
            VariantRecord::CoopF16(b) => GemmVariant::CoopF16(b),
            VariantRecord::Direct(b) => GemmVariant::Direct(b),
            VariantRecord::Window(b) => GemmVariant::Window(b),
            VariantRecord::Texture(b) => GemmVariant::Texture(b),
        }
    }
}

impl From<GemmVariant> for VariantRecord {
    fn from(v: GemmVariant) -> Self {
        match v {
            GemmVariant::Tile(t) => t.record(),
            GemmVariant::TileF16(t) => VariantRecord::TileF16(t),
            GemmVariant::CoopF16(b) => VariantRecord::CoopF16(b),
            GemmVariant::Direct(b) => VariantRecord::Direct(b),
            GemmVariant::Window(b) => VariantRecord::Window(b),
            GemmVariant::Texture(b) => VariantRecord::Texture(b),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The 32-row tiles keep the names and records they had as variants of their own
    /// (`Tiled`, `TiledWide`), and read back from those records as one `Tile`.
    #[test]
    fn tiles_keep_their_names_and_records() {
        let tiled = GemmVariant::Tile(TileBlock::tiled(8));
        assert_eq!(tiled.name(), "tiled-bk8");
        assert_eq!(serde_json::to_string(&tiled).unwrap(), r#"{"tiled":{"bk4":8}}"#);
        let wide = GemmVariant::Tile(TileBlock::wide(64, 4, 4));
        assert_eq!(wide.name(), "tiledw-c64t4-bk4");
        let record = r#"{"tiledwide":{"cols":64,"tn":4,"bk4":4}}"#;
        assert_eq!(serde_json::to_string(&wide).unwrap(), record);
        assert_eq!(serde_json::from_str::<GemmVariant>(record).unwrap(), wide);
        let big = GemmVariant::Tile(TileBlock::new(64, 64, 4, 4, 4));
        assert_eq!(big.name(), "tile-r64c64-m4n4-bk4");
        let text = serde_json::to_string(&big).unwrap();
        assert!(text.starts_with(r#"{"tile":"#), "{text}");
        assert_eq!(serde_json::from_str::<GemmVariant>(&text).unwrap(), big);
        let direct = GemmVariant::Direct(LaneBlock::new(16, 8, 8));
        assert_eq!(
            serde_json::from_str::<GemmVariant>(&serde_json::to_string(&direct).unwrap()).unwrap(),
            direct
        );
    }
}
