//! Kernel variants of the expert GEMM, the accumulation order of each mode, and the WGSL
//! generated for every (variant, order) pair.
//!
//! Two shapes of kernel, each generated with its register block written out as named
//! variables (a private array indexed by a loop counter is kept in memory by llvmpipe, and
//! loops that index it are not unrolled for it):
//!
//! - [`GemmVariant::Tiled`] (GPUs): 8 × 8 invocations, each a 4 × 4 block of a 32 × 32 output
//!   tile, K staged through workgroup memory `4·bk4` at a time.
//! - [`GemmVariant::TiledWide`] (GPU candidates): the tiled kernel on 32 × `cols` tiles (64 or
//!   128 columns), each invocation 4 rows × `tn` columns: each staged x value feeds `cols`
//!   outputs instead of 32, for GPUs whose tiled kernel waits on workgroup memory.
//! - [`GemmVariant::Tile`] (GPU candidates): the same kernel on 32- to 128-row and -column
//!   tiles, 4 × 4 to 8 × 8 outputs per invocation; `Tiled` and `TiledWide` are its 32-row shapes.
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

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::{Mutex, OnceLock};

use serde::{Deserialize, Serialize};

use crate::context::AdapterDescription;
use crate::error::{Error, Result};
use crate::pipeline::{Access, KernelSpec, Workgroup};
use crate::shader::{Indexing, ShaderPart, ShaderSource, wgsl};
use crate::sync::lock;

use super::coop::{self, CoopBlock};
use super::{WeightDtype, slots};

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
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum GemmVariant {
    /// Workgroup-memory tiles: 8 × 8 invocations, 4 × 4 outputs each, K staged `4·bk4` at a
    /// time (`bk4` in 1..=16).
    Tiled {
        /// Groups of four K values staged per chunk.
        bk4: u32,
    },
    /// Workgroup-memory tiles of 32 rows × `cols` columns: 8 × `cols / tn` invocations, each
    /// 4 rows × `tn` columns (rows `4·ty + i`, columns `tx + (cols / tn)·j`), K staged `4·bk4`
    /// at a time. `cols` is 32, 64 or 128, `tn` 4 or 8, `bk4` in 1..=16.
    TiledWide {
        /// Output columns per workgroup.
        cols: u32,
        /// Output columns per invocation.
        tn: u32,
        /// Groups of four K values staged per chunk.
        bk4: u32,
    },
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

    /// 32 rows × `cols`, 4 × `tn` per invocation: the tile of [`GemmVariant::TiledWide`]
    /// (and of [`GemmVariant::Tiled`], `wide(32, 4, bk4)`).
    const fn wide(cols: u32, tn: u32, bk4: u32) -> Self {
        TileBlock { rows: 32, cols, tm: 4, tn, bk4 }
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
            GemmVariant::Tiled { .. } | GemmVariant::TiledWide { .. } => 32,
            GemmVariant::Tile(t) | GemmVariant::TileF16(t) => t.rows,
            GemmVariant::CoopF16(b) => b.rows,
            GemmVariant::Direct(b) | GemmVariant::Window(b) | GemmVariant::Texture(b) => b.rows,
        }
    }

    /// Output columns per workgroup.
    pub fn block_cols(self) -> u32 {
        match self {
            GemmVariant::Tiled { .. } => 32,
            GemmVariant::TiledWide { cols, .. } => cols,
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
            GemmVariant::Tiled { bk4 } | GemmVariant::TiledWide { bk4, .. } if !(1..=16).contains(&bk4) => {
                Err(Error::invalid(format!("tiled GEMM bk4 = {bk4} must be in 1..=16")))
            }
            GemmVariant::TiledWide { cols, .. } if !matches!(cols, 32 | 64 | 128) => {
                Err(Error::invalid(format!("wide tiled GEMM cols = {cols} must be 32, 64 or 128")))
            }
            GemmVariant::TiledWide { tn, .. } if !matches!(tn, 4 | 8) => {
                Err(Error::invalid(format!("wide tiled GEMM tn = {tn} must be 4 or 8")))
            }
            GemmVariant::Tiled { .. } | GemmVariant::TiledWide { .. } => Ok(()),
            GemmVariant::Tile(t) | GemmVariant::TileF16(t) => t.validate(),
            GemmVariant::CoopF16(b) => b.validate(),
            GemmVariant::Direct(b) | GemmVariant::Window(b) | GemmVariant::Texture(b) => b.validate(),
        }
    }

    /// A short name, e.g. `direct-r16c8l8` or `tiled-bk8`.
    pub fn name(self) -> String {
        match self {
            GemmVariant::Tiled { bk4 } => format!("tiled-bk{bk4}"),
            GemmVariant::TiledWide { cols, tn, bk4 } => format!("tiledw-c{cols}t{tn}-bk{bk4}"),
            GemmVariant::TileF16(t) => format!("tileh-{}", t.name()),
            GemmVariant::Tile(t) => format!("tile-{}", t.name()),
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
    pub fn workgroup_bytes(self) -> u32 {
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
    fn shape(self) -> Shape {
        match self {
            GemmVariant::Tiled { bk4 } => Shape::Tile { tile: TileBlock::wide(32, 4, bk4), f16: false },
            GemmVariant::TiledWide { cols, tn, bk4 } => {
                Shape::Tile { tile: TileBlock::wide(cols, tn, bk4), f16: false }
            }
            GemmVariant::Tile(tile) => Shape::Tile { tile, f16: false },
            GemmVariant::TileF16(tile) => Shape::Tile { tile, f16: true },
            GemmVariant::CoopF16(b) => Shape::Coop(b),
            GemmVariant::Direct(b) | GemmVariant::Window(b) | GemmVariant::Texture(b) => Shape::Lanes(b),
        }
    }

    /// Invocations per workgroup.
    pub fn invocations(self) -> u32 {
        match self {
            GemmVariant::Tiled { .. } => 64,
            GemmVariant::TiledWide { cols, tn, .. } => 8 * cols / tn,
            GemmVariant::Tile(t) | GemmVariant::TileF16(t) => t.invocations(),
            GemmVariant::CoopF16(b) => b.lanes,
            GemmVariant::Direct(b) | GemmVariant::Window(b) | GemmVariant::Texture(b) => b.lanes,
        }
    }

    /// The direct variant of a window or texture variant's block (what runs where no window
    /// fits); other variants unchanged.
    pub fn without_window(self) -> Self {
        match self {
            GemmVariant::Window(b) | GemmVariant::Texture(b) => GemmVariant::Direct(b),
            other => other,
        }
    }

    /// The window variant of a texture variant's block (what runs where the weights have no
    /// texture copy); other variants unchanged.
    pub fn without_texture(self) -> Self {
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
    pub fn reads_windows(self) -> bool {
        self.source() != OperandSource::Storage
    }

    /// Where the variant's blocks read x and the weights.
    pub(crate) fn source(self) -> OperandSource {
        match self {
            GemmVariant::Texture(_) => OperandSource::Texture,
            GemmVariant::Window(_) => OperandSource::Window,
            GemmVariant::Tiled { .. }
            | GemmVariant::TiledWide { .. }
            | GemmVariant::Tile(_)
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

/// The kinds of adapter the expert kernels' defaults and tuning candidates are chosen for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum AdapterKind {
    /// Hardware GPUs, and any adapter that is not one of the kinds below.
    Gpu,
    /// CPU adapters whose shader compiler is LLVM (Mesa's lavapipe and llvmpipe, WARP).
    Cpu,
    /// SwiftShader (a CPU adapter whose Subzero compiler takes minutes over the large unrolled
    /// blocks the other CPU adapters run best: 223 s for a bf16 window 16 × 8 pipeline, 4.6 s
    /// for 16 × 4; see docs/portability.md).
    SwiftShader,
}

impl AdapterKind {
    /// Every kind.
    pub const ALL: [AdapterKind; 3] = [AdapterKind::Gpu, AdapterKind::Cpu, AdapterKind::SwiftShader];

    /// The kind of `adapter`: SwiftShader by name, else CPU by device type, else GPU.
    pub fn of(adapter: &AdapterDescription) -> Self {
        if adapter.name.contains("SwiftShader") {
            AdapterKind::SwiftShader
        } else if adapter.is_cpu() {
            AdapterKind::Cpu
        } else {
            AdapterKind::Gpu
        }
    }

    /// The most columns a direct or window block gets when the window fallback widens a
    /// block: 32 (the variants' limit), 4 on SwiftShader, where blocks of 8 columns take
    /// minutes to compile.
    pub fn max_block_cols(self) -> u32 {
        match self {
            AdapterKind::Gpu | AdapterKind::Cpu => 32,
            AdapterKind::SwiftShader => 4,
        }
    }
}

impl FfnKernels {
    /// The fixed default for a kind of adapter: [`GemmVariant::Tiled`] on GPUs;
    /// [`GemmVariant::Texture`] 16 × 8 blocks of 8 lanes on LLVM CPU adapters (weights from
    /// texture copies, x from windows; 8 × 16 blocks, then the direct block, where K is too long
    /// for a window of 16 rows; the window block where the weights are past the texture
    /// limits); window 16 × 4 blocks of 8 lanes on SwiftShader (8 × 4 window blocks, then the
    /// direct block, where K is too long): they compile in seconds there and run as fast as any
    /// block measured, where blocks of 8 columns take minutes to compile with bf16 or f16
    /// weights, and texture weights make no consistent difference there.
    pub fn default_for(kind: AdapterKind, order: GemmOrder) -> Self {
        let block = match kind {
            AdapterKind::Gpu => GemmVariant::Tiled { bk4: 8 },
            AdapterKind::Cpu => GemmVariant::Texture(LaneBlock::new(16, 8, 8)),
            AdapterKind::SwiftShader => GemmVariant::Window(LaneBlock::new(16, 4, 8)),
        };
        FfnKernels { order, up: block, down: block }
    }

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

/// The generated block kernels' bindings, by where they read their operands.
static STORAGE_BINDINGS: [(u32, Access); 8] = slots::block_bindings(OperandSource::Storage);
static WINDOW_BINDINGS: [(u32, Access); 8] = slots::block_bindings(OperandSource::Window);
static TEXTURE_BINDINGS: [(u32, Access); 8] = slots::block_bindings(OperandSource::Texture);

/// Bytes of the x window a window kernel declares (`array<vec4<f32>, 4096>`): WebGPU's
/// default `max_uniform_buffer_binding_size`.
pub(crate) const WINDOW_BYTES: u64 = 65536;

/// How a generated block kernel reads the weight buffers.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub(crate) enum WeightLoads {
    /// Packed u32 words, any dtype (quantised ones a header and a code word per step of four).
    Packed,
    /// Native f16 loads (f16 weights on a device with shader-f16).
    NativeF16,
    /// Quantised rows bound as `vec4<u32>` (weights_quant.wgsl): direct and window blocks read
    /// them block by block (quant_blocks.wgsl), tiled blocks step by step.
    Quantised,
}

impl WeightLoads {
    /// The loads for weights of `dtype`, with native f16 loads chosen or not.
    pub(crate) fn of(dtype: WeightDtype, native_f16: bool) -> Self {
        if dtype.is_quantised() {
            WeightLoads::Quantised
        } else if native_f16 {
            WeightLoads::NativeF16
        } else {
            WeightLoads::Packed
        }
    }

    pub(crate) const ALL: [WeightLoads; 3] =
        [WeightLoads::Packed, WeightLoads::NativeF16, WeightLoads::Quantised];
}

/// The kernel spec for `variant` in `order` reading the weights with `loads` (texture variants
/// unpack their texels' words whatever `loads` says: no weights but f32, f16 and bf16 have
/// texture copies), generated and built once per process.
pub(crate) fn spec(variant: GemmVariant, order: GemmOrder, loads: WeightLoads) -> &'static KernelSpec {
    type Key = (GemmVariant, GemmOrder, WeightLoads);
    let loads = if matches!(variant, GemmVariant::Texture(_)) { WeightLoads::Packed } else { loads };
    static SPECS: OnceLock<Mutex<HashMap<Key, &'static KernelSpec>>> = OnceLock::new();
    let mut specs = lock(SPECS.get_or_init(Default::default));
    specs.entry((variant, order, loads)).or_insert_with(|| {
        let name = format!(
            "gemm/{}-{}{}",
            variant.name(),
            match order {
                GemmOrder::Strict => "strict",
                GemmOrder::Fast => "fast",
            },
            match loads {
                WeightLoads::Packed => "",
                WeightLoads::NativeF16 => "-f16",
                WeightLoads::Quantised => "-quant",
            }
        );
        let quantised = loads == WeightLoads::Quantised;
        let body = ShaderPart { path: "gemm (generated)", text: leak(generate(variant, order, quantised)) };
        let mut parts: Vec<ShaderPart> = if matches!(variant, GemmVariant::Texture(_)) {
            vec![
                wgsl!("gemm/common.wgsl"),
                wgsl!("gemm/order.wgsl"),
                wgsl!("gemm/half.wgsl"),
                wgsl!("gemm/weights_texture.wgsl"),
                wgsl!("gemm/epilogue.wgsl"),
                body,
            ]
        } else if loads == WeightLoads::NativeF16 {
            vec![
                wgsl!("gemm/enable_f16.wgsl"),
                wgsl!("gemm/common.wgsl"),
                wgsl!("gemm/order.wgsl"),
                wgsl!("gemm/weights_f16.wgsl"),
                wgsl!("gemm/weight_groups.wgsl"),
                wgsl!("gemm/epilogue.wgsl"),
                body,
            ]
        } else if quantised {
            vec![
                wgsl!("gemm/common.wgsl"),
                wgsl!("gemm/order.wgsl"),
                wgsl!("gemm/weights_quant.wgsl"),
                wgsl!("gemm/half.wgsl"),
                wgsl!("gemm/quant.wgsl"),
                wgsl!("gemm/quant_blocks.wgsl"),
                wgsl!("gemm/epilogue.wgsl"),
                body,
            ]
        } else {
            vec![
                wgsl!("gemm/common.wgsl"),
                wgsl!("gemm/order.wgsl"),
                wgsl!("gemm/weights_packed.wgsl"),
                wgsl!("gemm/weight_groups.wgsl"),
                wgsl!("gemm/half.wgsl"),
                wgsl!("gemm/epilogue.wgsl"),
                body,
            ]
        };
        if matches!(variant, GemmVariant::TileF16(_) | GemmVariant::CoopF16(_)) {
            // The exact widening of staged values (already there but for native f16 loads),
            // then the staging functions, before the generated body.
            let at = parts.len() - 1;
            if !parts.iter().any(|p| p.path == "gemm/half.wgsl") {
                parts.insert(at, wgsl!("gemm/half.wgsl"));
            }
            parts.insert(parts.len() - 1, wgsl!("gemm/stage_f16.wgsl"));
        }
        if matches!(variant, GemmVariant::CoopF16(_)) {
            // f16 and cooperative matrices enabled first (in place of native f16 loads' own
            // `enable f16;`).
            if parts.first().is_some_and(|p| p.path == "gemm/enable_f16.wgsl") {
                parts.remove(0);
            }
            parts.insert(0, wgsl!("gemm/enable_coop.wgsl"));
        }
        let source: &'static ShaderSource = Box::leak(Box::new(ShaderSource {
            name: leak(name),
            parts: Box::leak(parts.into_boxed_slice()),
            entry_points: &["gemm"],
            // Workgroup tiles indexed by the invocation id and loop counters below their
            // lengths (t < rows·BK4 and cols·BK4, ty·tm + i < rows, tx + (cols/tn)·j < cols,
            // g < BK4 <= STRIDE), private vectors by counters below 4; rows below params.rows,
            // columns below the chunk's end, entries from the dispatch layout's row map, the
            // expert from the tile map or the host only through in_chunk, K bounded by
            // x_tail / weight4_tail, and texels within the copies' extents.
            indexing: Indexing::Proven,
        }));
        let bindings = match variant.source() {
            OperandSource::Window => &WINDOW_BINDINGS,
            OperandSource::Texture => &TEXTURE_BINDINGS,
            OperandSource::Storage => &STORAGE_BINDINGS,
        };
        Box::leak(Box::new(KernelSpec {
            shader: source,
            entry: "gemm",
            bindings,
            params_bytes: super::PARAMS_BYTES,
            workgroup: Workgroup::Fixed(variant.invocations()),
        }))
    })
}

/// Generated sources live as long as the process (one per variant, order and weight path).
fn leak(s: String) -> &'static str {
    Box::leak(s.into_boxed_str())
}

/// The variants the tuner and the tests draw from for a kind of adapter.
pub fn candidates(kind: AdapterKind) -> Vec<GemmVariant> {
    match kind {
        // No tiled kernel: 22x slower than the texture blocks on lavapipe, and the slowest
        // candidate timed (docs/gemm.md, the tuner).
        AdapterKind::Cpu => vec![
            GemmVariant::Direct(LaneBlock::new(8, 8, 8)),
            GemmVariant::Direct(LaneBlock::new(16, 8, 8)),
            GemmVariant::Direct(LaneBlock::new(16, 16, 8)),
            GemmVariant::Window(LaneBlock::new(16, 8, 8)),
            GemmVariant::Window(LaneBlock::new(32, 4, 8)),
            GemmVariant::Texture(LaneBlock::new(16, 8, 8)),
            GemmVariant::Texture(LaneBlock::new(32, 8, 8)),
        ],
        // Blocks of at most 4 columns: the ones Subzero compiles in seconds.
        AdapterKind::SwiftShader => vec![
            GemmVariant::Window(LaneBlock::new(16, 4, 8)),
            GemmVariant::Window(LaneBlock::new(8, 4, 8)),
            GemmVariant::Window(LaneBlock::new(4, 4, 16)),
            GemmVariant::Direct(LaneBlock::new(4, 4, 64)),
            GemmVariant::Tiled { bk4: 2 },
        ],
        AdapterKind::Gpu => vec![
            GemmVariant::Tiled { bk4: 4 },
            GemmVariant::Tiled { bk4: 8 },
            GemmVariant::Tiled { bk4: 16 },
            GemmVariant::Direct(LaneBlock::new(4, 4, 64)),
            GemmVariant::Direct(LaneBlock::new(8, 4, 32)),
            GemmVariant::TiledWide { cols: 64, tn: 4, bk4: 4 },
            GemmVariant::TiledWide { cols: 64, tn: 8, bk4: 4 },
            GemmVariant::TiledWide { cols: 128, tn: 4, bk4: 2 },
            // The GPU tile family (ggml's medium and large warptiles have 64 x 64 and
            // 128 x 128 outputs of 128 invocations): more outputs per staged value, for
            // experts with many rows. A tile past the device's workgroup memory is refused and
            // never chosen.
            GemmVariant::Tile(TileBlock::new(64, 64, 4, 4, 4)),
            GemmVariant::Tile(TileBlock::new(64, 64, 8, 4, 4)),
            GemmVariant::Tile(TileBlock::new(64, 128, 4, 8, 4)),
            GemmVariant::Tile(TileBlock::new(128, 64, 8, 4, 4)),
            GemmVariant::Tile(TileBlock::new(128, 128, 8, 8, 2)),
        ],
    }
}

/// One accumulation step of output (i, j) with `x` and weight vectors, in `order`.
fn step(out: &mut String, order: GemmOrder, acc: &str, x: &str, w: &str, indent: &str) {
    match order {
        GemmOrder::Strict => {
            let _ = writeln!(out, "{indent}{acc} = fma({x}, {w}, {acc});");
        }
        GemmOrder::Fast => {
            let _ = writeln!(
                out,
                "{indent}{acc} = fma({x}.w, {w}.w, fma({x}.z, {w}.z, fma({x}.y, {w}.y, fma({x}.x, {w}.x, {acc}))));"
            );
        }
    }
}

/// The output value of accumulator `acc` in `order`.
fn result(order: GemmOrder, acc: &str) -> String {
    match order {
        GemmOrder::Strict => format!("lanes_sum({acc})"),
        GemmOrder::Fast => acc.to_string(),
    }
}

fn zero(order: GemmOrder) -> &'static str {
    match order {
        GemmOrder::Strict => "vec4<f32>(0.0)",
        GemmOrder::Fast => "0.0",
    }
}

/// The WGSL body (after common.wgsl and a weights file) of `variant` in `order`; entry
/// point `gemm`. With `quantised`, direct and window blocks read the weights block by block
/// (after weights_quant.wgsl, quant.wgsl and quant_blocks.wgsl).
pub(crate) fn generate(variant: GemmVariant, order: GemmOrder, quantised: bool) -> String {
    match variant.shape() {
        Shape::Lanes(b) => direct(b.rows, b.cols, b.lanes, order, variant.source(), quantised),
        Shape::Tile { tile, f16 } => tiled(tile, f16, order),
        Shape::Coop(b) => coop::generate(b),
    }
}

/// The block's expert, or an early return (shared by both shapes).
const EXPERT: &str = "    var expert = params.fixed_expert;
    if flag(FLAG_EXPERT_FROM_TILES) {
        expert = tile_expert[(params.row_offset + row0) / params.tile_rows];
    }
    if !in_chunk(expert) {
        return;
    }
";

/// [`EXPERT`] for a block with barriers or cooperative operations after it: one invocation
/// reads the expert, tests it against the chunk, and the workgroup shares it (NONE outside the
/// chunk) through `workgroupUniformLoad`, so the early return stays in uniform control flow for
/// WGSL's uniformity analysis (which takes no load from a `read_write` binding, as
/// `tile_expert` is, to be uniform, and naga no result of a helper such as `in_chunk` that
/// reads its argument). The same expert, the same bits.
const EXPERT_SHARED: &str = "    if lid == 0u {
        block_expert = params.fixed_expert;
        if flag(FLAG_EXPERT_FROM_TILES) {
            block_expert = tile_expert[(params.row_offset + row0) / params.tile_rows];
        }
        if !in_chunk(block_expert) {
            block_expert = NONE;
        }
    }
    let expert = workgroupUniformLoad(&block_expert);
    if expert == NONE {
        return;
    }
";

/// The weight and up-weight groups of four (`wv`, `uv`) at column `c` and K offset `k` in the
/// staging loop of a workgroup-memory block: zeros past the chunk's columns (and, by
/// `weight4_tail`, past K); `uv` only under SWIGLU. Shared by the tiled and the cooperative
/// kernels.
pub(super) const WEIGHT_GROUPS: &str = "            var wv = vec4<f32>(0.0);
            var uv = vec4<f32>(0.0);
            if c < cend {
                wv = weight4_tail(false, weight_row(expert, c), k, kdim);
                if SWIGLU {
                    uv = weight4_tail(true, weight_row(expert, c), k, kdim);
                }
            }
";

/// The entry point of a workgroup-memory block of `rows` × `cols` outputs and `threads`
/// invocations up to its first barrier: the block's first row and column (an early return past
/// the rows), its expert ([`EXPERT_SHARED`]) and its rows' entries in `block_entry` (NONE past
/// the rows). Shared by the tiled and the cooperative kernels.
pub(super) fn block_prologue(rows: u32, cols: u32, threads: u32) -> String {
    format!(
        "@compute @workgroup_size({threads})
fn gemm(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {{
    let row0 = wid.x * {rows}u;
    let col0 = params.col_base + wid.y * {cols}u;
    if row0 >= params.rows {{
        return;
    }}
{EXPERT_SHARED}    for (var r = lid; r < {rows}u; r += {threads}u) {{
        var e = NONE;
        if row0 + r < params.rows {{
            e = entry_of(row0 + r);
        }}
        block_entry[r] = e;
    }}
"
    )
}

/// The direct block, reading its operands from `source` (quantised weights block by block
/// with `quantised`).
fn direct(
    rows: u32,
    cols: u32,
    lanes: u32,
    order: GemmOrder,
    source: OperandSource,
    quantised: bool,
) -> String {
    let mut s = String::new();
    let window = source != OperandSource::Storage;
    let (what, from, first_row) = match source {
        OperandSource::Storage => ("Direct", "reading x and the weights straight from memory", ""),
        OperandSource::Window => (
            "Window",
            "reading x from the dispatch's uniform window and the weights from memory",
            "params.win_row0 + ",
        ),
        OperandSource::Texture => (
            "Texture",
            "reading x from the dispatch's uniform window and the weights from their texture",
            "params.win_row0 + ",
        ),
    };
    if window {
        s.push_str(
            "// The x rows of this dispatch: row win_row0 + r at r * ceil(K / 4) (see stage.wgsl).\n\
             @group(0) @binding(7) var<uniform> xw: array<vec4<f32>, 4096>;\n\n",
        );
    }
    let _ = write!(
        s,
        "// {what} GEMM (generated): {lanes} invocations share {rows} rows; each computes {cols} columns
// spaced {lanes} apart, {from} (no workgroup memory, no barriers). Order: {order:?} (see
// variant.rs). Rows past the row count or without an entry read row 0 (or zeros) and are
// discarded; columns past the chunk's last read its last column and are discarded.

@compute @workgroup_size({lanes})
fn gemm(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {{
    let row0 = {first_row}wid.x * {rows}u;
    if row0 >= params.rows {{
        return;
    }}
{EXPERT}    let kdim = params.kdim;
    let cend = params.col_base + params.cols;
    let col0 = params.col_base + wid.y * {}u + lid;
",
        cols * lanes
    );
    if window {
        s.push_str("    let kp4 = (kdim + 3u) / 4u;\n");
    }
    for i in 0..rows {
        let _ = writeln!(
            s,
            "    let r{i} = row0 + {i}u;
    var e{i} = NONE;
    if r{i} < params.rows {{
        e{i} = entry_of(r{i});
    }}"
        );
        if window {
            let _ = writeln!(s, "    let x{i}b = (r{i} - params.win_row0) * kp4;");
        } else {
            let _ = writeln!(
                s,
                "    var x{i}b = 0u;
    if e{i} != NONE {{
        x{i}b = input_row(r{i}, e{i}) * kdim;
    }}"
            );
        }
    }
    for j in 0..cols {
        let (name, at) = match source {
            OperandSource::Texture => ("t", "weight_texel_row"),
            OperandSource::Storage | OperandSource::Window => ("b", "weight_row"),
        };
        let _ = writeln!(
            s,
            "    let c{j} = col0 + {}u;\n    let w{j}{name} = {at}(expert, min(c{j}, cend - 1u));",
            j * lanes
        );
    }
    for i in 0..rows {
        for j in 0..cols {
            let _ = writeln!(s, "    var a{i}_{j} = {z};\n    var u{i}_{j} = {z};", z = zero(order));
        }
    }
    // The block's live rows: up to the last row with an entry (padding rows of a grouped
    // tile come last). A block with no entry past row `n` runs a copy of the K loop over
    // its first `n` rows only (the same operations for those rows; the other rows'
    // accumulators stay zero and their outputs are discarded as before), so the padding of a
    // tile costs a fraction of its FMAs. The branch is the same for every invocation.
    let copies = live_copies(rows);
    if copies.len() > 1 {
        s.push_str("    var live = 0u;\n");
        for i in 0..rows {
            let _ = writeln!(s, "    if e{i} != NONE {{\n        live = {}u;\n    }}", i + 1);
        }
    }
    for (c, &n) in copies.iter().enumerate() {
        let open = if c == 0 { "    if" } else { "    } else if" };
        match copies.get(c + 1) {
            Some(next) => {
                let _ = writeln!(s, "{open} live > {next}u {{");
            }
            None if c > 0 => s.push_str("    } else {\n"),
            None => {}
        }
        if quantised {
            k_loop_quantised(&mut s, n, cols, order, source);
        } else {
            k_loop(&mut s, n, cols, order, source);
        }
    }
    if copies.len() > 1 {
        s.push_str("    }\n");
    }
    for i in 0..rows {
        for j in 0..cols {
            let _ = writeln!(
                s,
                "    if r{i} < params.rows && c{j} < cend {{
        var v = epilogue(expert, c{j}, {}, {});
        if e{i} == NONE {{
            v = 0.0;
        }}
        store(r{i}, e{i}, c{j}, v);
    }}",
                result(order, &format!("a{i}_{j}")),
                result(order, &format!("u{i}_{j}"))
            );
        }
    }
    s.push_str("}\n");
    s
}

/// The row counts of a block's copies of the K loop, widest first: `rows`, then halves
/// down to 4 rows (a 16-row block runs 16, 8 or 4 rows, whichever is the fewest that covers
/// its live rows).
fn live_copies(rows: u32) -> Vec<u32> {
    let mut copies = vec![rows];
    let mut n = rows / 2;
    while n >= 4 {
        copies.push(n);
        n /= 2;
    }
    copies
}

/// One copy of the direct block's K loop over its first `rows` rows: the loads take the
/// bounded path in the last, partial group of four (a branch that is the same for every
/// invocation), so the unrolled FMAs are emitted once per copy. Windows and textures hold
/// zeros past K: their loads need no bound.
fn k_loop(s: &mut String, rows: u32, cols: u32, order: GemmOrder, source: OperandSource) {
    let _ = writeln!(s, "    for (var k = 0u; k < kdim; k += 4u) {{");
    x_loads(s, rows, source, "        ");
    k_step(s, rows, cols, order, "        ", |j, up| match source {
        OperandSource::Texture => format!("weight_texel({up}, w{j}t, k / 4u)"),
        OperandSource::Storage | OperandSource::Window => format!("weight_group({up}, w{j}b, k, kdim)"),
    });
    s.push_str("    }\n");
}

/// [`k_loop`] for quantised weights (rows at `w{j}b`): block by block of 32 values, each
/// column's block read once (row_block: header word, scale, code words as vec4s), then its
/// steps of four in K order, each with the same values as weight_group's (block_vec4: 0.0 at
/// K and past it), so the same bits. The steps run as a loop that stops at K (a branch the
/// same for every invocation).
fn k_loop_quantised(s: &mut String, rows: u32, cols: u32, order: GemmOrder, source: OperandSource) {
    let _ = writeln!(s, "    for (var k0 = 0u; k0 < kdim; k0 += 32u) {{");
    for j in 0..cols {
        let _ = writeln!(s, "        let b{j} = row_block(w{j}b, k0);");
    }
    s.push_str(
        "        for (var s = 0u; s < 8u; s++) {
            let k = k0 + 4u * s;
            if k >= kdim {
                break;
            }
",
    );
    x_loads(s, rows, source, "            ");
    k_step(s, rows, cols, order, "            ", |j, up| format!("block_vec4(b{j}, {up}, s, k)"));
    s.push_str("        }\n    }\n");
}

/// The step's x of rows 0 .. `rows` (`x{i}`, values k .. k + 3), from storage or the window.
fn x_loads(s: &mut String, rows: u32, source: OperandSource, indent: &str) {
    for i in 0..rows {
        match source {
            OperandSource::Storage => {
                let _ = writeln!(s, "{indent}let x{i} = x_group(x{i}b, k, kdim);");
            }
            OperandSource::Window | OperandSource::Texture => {
                let _ = writeln!(s, "{indent}let x{i} = xw[x{i}b + k / 4u];");
            }
        }
    }
}

/// One step of four K values of a direct block: each column's weights (`w{j}`, the expression
/// `load(j, false)`) and the FMAs of every row into accumulators `a{i}_{j}`; under SWIGLU the
/// up projection's (`v{j}`, `load(j, true)`) into `u{i}_{j}`.
fn k_step(
    s: &mut String,
    rows: u32,
    cols: u32,
    order: GemmOrder,
    indent: &str,
    load: impl Fn(u32, bool) -> String,
) {
    let half = |s: &mut String, acc: &str, w: &str, up: bool, indent: &str| {
        for j in 0..cols {
            let _ = writeln!(s, "{indent}let {w}{j} = {};", load(j, up));
        }
        for i in 0..rows {
            for j in 0..cols {
                step(s, order, &format!("{acc}{i}_{j}"), &format!("x{i}"), &format!("{w}{j}"), indent);
            }
        }
    };
    half(s, "a", "w", false, indent);
    let _ = writeln!(s, "{indent}if SWIGLU {{");
    half(s, "u", "v", true, &format!("{indent}    "));
    let _ = writeln!(s, "{indent}}}");
}

/// The two kernel shapes the variants are generated from.
#[derive(Clone, Copy, Debug)]
enum Shape {
    /// A lane block (direct, window and texture variants), no workgroup memory.
    Lanes(LaneBlock),
    /// A workgroup-memory tile (every tiled variant), staged as f16 (packed by
    /// `pack2x16float`) or as f32.
    Tile { tile: TileBlock, f16: bool },
    /// A cooperative-matrix block (coop.rs).
    Coop(CoopBlock),
}

/// vec4 per row of a staged tile: `bk4` rounded up to an odd count, so that invocations reading
/// the rows of consecutive columns at one K group hit different workgroup-memory banks (a row
/// of `bk4` vec4 with `bk4` even puts every such read in the same banks on a GPU).
fn tile_stride(bk4: u32) -> u32 {
    bk4 | 1
}

/// The tiled kernel on `t.rows` × `t.cols` tiles, `t.tm` × `t.tn` outputs per invocation.
fn tiled(t: TileBlock, f16: bool, order: GemmOrder) -> String {
    let TileBlock { rows, cols, tm, tn, bk4 } = t;
    // A staged group of four: a vec4 of f32, or four f16 packed in two words (rounded to nearest
    // even by stage_f16, widened back exactly by unstage_f16).
    let (group, staged) = if f16 {
        ("vec2<u32>", "rounded to f16 as they are staged (stage_f16.wgsl)")
    } else {
        ("vec4<f32>", "in f32")
    };
    let stage = |v: &str| if f16 { format!("stage_f16({v})") } else { v.to_string() };
    let load = |p: &str| if f16 { format!("unstage_f16({p})") } else { p.to_string() };
    let (ty_n, tx_n) = (rows / tm, cols / tn);
    let threads = ty_n * tx_n;
    let stride = tile_stride(bk4);
    let mut s = String::new();
    let _ = write!(
        s,
        "// Tiled GEMM (generated): a workgroup of {ty_n} x {tx_n} invocations computes a {rows} x {cols} block,
// each invocation {tm} rows x {tn} columns (rows ty * {tm} + i, columns tx + {tx_n} j), streaming K
// through workgroup memory in chunks of {} ({bk4} groups of four; past K zeros), {staged}, each
// staged row {stride} groups apart. Order: {order:?} (see variant.rs).

const BK4: u32 = {bk4}u;
const STRIDE: u32 = {stride}u;

var<workgroup> xs: array<{group}, {nx}>;
var<workgroup> ws: array<{group}, {nw}>;
var<workgroup> us: array<{group}, {nw}>;
var<workgroup> block_entry: array<u32, {rows}>;
var<workgroup> block_expert: u32;

{prologue}    workgroupBarrier();
    let ty = lid / {tx_n}u;
    let tx = lid % {tx_n}u;
    let kdim = params.kdim;
    let cend = params.col_base + params.cols;
",
        4 * bk4,
        nx = rows * stride,
        nw = cols * stride,
        prologue = block_prologue(rows, cols, threads),
    );
    for i in 0..tm {
        for j in 0..tn {
            let _ = writeln!(s, "    var a{i}_{j} = {z};\n    var u{i}_{j} = {z};", z = zero(order));
        }
    }
    let _ = writeln!(
        s,
        "    for (var k0 = 0u; k0 < kdim; k0 += 4u * BK4) {{
        for (var t = lid; t < {rows}u * BK4; t += {threads}u) {{
            let r = t / BK4;
            let k = k0 + 4u * (t % BK4);
            var xv = vec4<f32>(0.0);
            let e = block_entry[r];
            if e != NONE {{
                xv = x_tail(input_row(row0 + r, e) * kdim, k, kdim);
            }}
            xs[r * STRIDE + t % BK4] = {xs_store};
        }}
        for (var t = lid; t < {cols}u * BK4; t += {threads}u) {{
            let k = k0 + 4u * (t % BK4);
            let c = col0 + t / BK4;
{WEIGHT_GROUPS}            ws[(t / BK4) * STRIDE + t % BK4] = {ws_store};
            us[(t / BK4) * STRIDE + t % BK4] = {us_store};
        }}
        workgroupBarrier();
        for (var g = 0u; g < BK4; g++) {{
            if k0 + 4u * g < kdim {{",
        xs_store = stage("xv"),
        ws_store = stage("wv"),
        us_store = stage("uv"),
    );
    for i in 0..tm {
        let _ = writeln!(
            s,
            "                let x{i} = {};",
            load(&format!("xs[(ty * {tm}u + {i}u) * STRIDE + g]"))
        );
    }
    for j in 0..tn {
        let _ = writeln!(
            s,
            "                let w{j} = {};",
            load(&format!("ws[(tx + {}u) * STRIDE + g]", tx_n * j))
        );
    }
    for i in 0..tm {
        for j in 0..tn {
            step(&mut s, order, &format!("a{i}_{j}"), &format!("x{i}"), &format!("w{j}"), "                ");
        }
    }
    let _ = writeln!(s, "                if SWIGLU {{");
    for j in 0..tn {
        let _ = writeln!(
            s,
            "                    let v{j} = {};",
            load(&format!("us[(tx + {}u) * STRIDE + g]", tx_n * j))
        );
    }
    for i in 0..tm {
        for j in 0..tn {
            step(
                &mut s,
                order,
                &format!("u{i}_{j}"),
                &format!("x{i}"),
                &format!("v{j}"),
                "                    ",
            );
        }
    }
    let _ =
        writeln!(s, "                }}\n            }}\n        }}\n        workgroupBarrier();\n    }}");
    for i in 0..tm {
        let _ = writeln!(s, "    let e{i} = block_entry[ty * {tm}u + {i}u];");
        for j in 0..tn {
            let _ = writeln!(
                s,
                "    if row0 + ty * {tm}u + {i}u < params.rows && col0 + tx + {jj}u < cend {{
        var v = epilogue(expert, col0 + tx + {jj}u, {}, {});
        if e{i} == NONE {{
            v = 0.0;
        }}
        store(row0 + ty * {tm}u + {i}u, e{i}, col0 + tx + {jj}u, v);
    }}",
                result(order, &format!("a{i}_{j}")),
                result(order, &format!("u{i}_{j}")),
                jj = tx_n * j
            );
        }
    }
    s.push_str("}\n");
    s
}
