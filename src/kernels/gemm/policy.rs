//! Which kernels run where: the kinds of adapter, each kind's fixed default
//! ([`FfnKernels::default_for`]) and the variants the tuner times there ([`candidates`], and
//! [`coop_candidates`] on a device with cooperative matrices).

use crate::context::{AdapterDescription, Context};

use super::coop::CoopBlock;
use super::variant::{FfnKernels, GemmOrder, GemmVariant, LaneBlock, TileBlock};

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
    /// The fixed default for a kind of adapter: the 32 × 32 tiles ([`TileBlock::tiled`], `bk4` 8)
    /// on GPUs;
    /// [`GemmVariant::Texture`] 16 × 8 blocks of 8 lanes on LLVM CPU adapters (weights from
    /// texture copies, x from windows; 8 × 16 blocks, then the direct block, where K is too long
    /// for a window of 16 rows; the window block where the weights are past the texture
    /// limits); window 16 × 4 blocks of 8 lanes on SwiftShader (8 × 4 window blocks, then the
    /// direct block, where K is too long): they compile in seconds there and run as fast as any
    /// block measured, where blocks of 8 columns take minutes to compile with bf16 or f16
    /// weights, and texture weights make no consistent difference there.
    pub fn default_for(kind: AdapterKind, order: GemmOrder) -> Self {
        let block = match kind {
            AdapterKind::Gpu => GemmVariant::Tile(TileBlock::tiled(8)),
            AdapterKind::Cpu => GemmVariant::Texture(LaneBlock::new(16, 8, 8)),
            AdapterKind::SwiftShader => GemmVariant::Window(LaneBlock::new(16, 4, 8)),
        };
        FfnKernels { order, up: block, down: block }
    }
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
            GemmVariant::Tile(TileBlock::tiled(2)),
        ],
        AdapterKind::Gpu => vec![
            GemmVariant::Tile(TileBlock::tiled(4)),
            GemmVariant::Tile(TileBlock::tiled(8)),
            GemmVariant::Tile(TileBlock::tiled(16)),
            GemmVariant::Direct(LaneBlock::new(4, 4, 64)),
            GemmVariant::Direct(LaneBlock::new(8, 4, 32)),
            GemmVariant::Tile(TileBlock::wide(64, 4, 4)),
            GemmVariant::Tile(TileBlock::wide(64, 8, 4)),
            GemmVariant::Tile(TileBlock::wide(128, 4, 2)),
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

/// The cooperative-matrix candidates for `ctx`'s device: 32 × 32 and 64 × 32 blocks in each
/// fragment size the adapter reports, one subgroup each; none where cooperative matrices are
/// not enabled or the subgroup size is not fixed.
pub(super) fn coop_candidates(ctx: &Context) -> Vec<GemmVariant> {
    let a = ctx.adapter();
    let [lo, hi] = a.subgroup_sizes;
    if !a.capabilities.cooperative_matrix || lo != hi {
        return Vec::new();
    }
    a.cooperative_f16_sizes
        .iter()
        .flat_map(|&n| [CoopBlock::new(32, 32, n, lo), CoopBlock::new(64, 32, n, lo)])
        .filter(|b| b.validate().is_ok())
        .map(GemmVariant::CoopF16)
        .collect()
}
