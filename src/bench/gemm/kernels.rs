//! Comparisons of the GEMM's kernels on one path: block shapes, orders, bounds checks,
//! operand sources (direct, window, texture), tiles, the cooperative-matrix mode and the tuned
//! choice against the default.

use super::super::comparison::{Case, Registered, Size, SizeSet};
use super::problem::{PairBuffers, Problem, dense_pair, grouped_pair, layer_shape_sizes, texture_cols};
use crate::context::{BoundsChecks, Context};
use crate::error::Result;
use crate::kernels::gemm::{
    AdapterKind, CoopBlock, DenseKernel, FfnKernels, GemmOrder, GemmVariant, LaneBlock, TileBlock,
    TuneOptions, check_on_device, tune,
};

/// The dense GEMM through the adapter's default block kernel (B) against one output per
/// invocation read straight from memory (A). Bit-identical outputs.
pub(crate) fn tiled_vs_rowwise() -> Registered {
    Registered::new(
        "gemm/block-vs-rowwise-dense",
        "dense GEMM with the adapter's default block kernel (B: 16x8 register blocks reading x from \
                      uniform windows on CPU adapters, 32x32 workgroup-memory tiles elsewhere) against one output \
                      per invocation (A); bit-identical",
        ("rowwise", "block"),
        tiled_vs_rowwise_sizes,
        build_tiled_vs_rowwise,
    )
}

pub(super) fn tiled_vs_rowwise_sizes(set: SizeSet, held_out: bool) -> Vec<Size> {
    let shapes: &[(u32, u32, u32)] = match (set, held_out) {
        (SizeSet::Gpu, false) => &[(4096, 512, 1024), (4096, 1024, 512)],
        (SizeSet::Gpu, true) => &[(2048, 2048, 1024)],
        (SizeSet::Cpu, false) => &[(256, 128, 256), (256, 256, 128)],
        (SizeSet::Cpu, true) => &[(512, 128, 256)],
    };
    shapes.iter().map(|&(r, n, k)| Size::of(&[("rows", r), ("N", n), ("K", k)])).collect()
}

pub(super) fn build_tiled_vs_rowwise(ctx: &Context, size: &Size, seed: u64) -> Result<Case> {
    let block = FfnKernels::default_for(AdapterKind::of(ctx.adapter()), GemmOrder::Strict).down;
    dense_pair(ctx, size, seed, DenseKernel::Rowwise, DenseKernel::Block(block))
}

/// The dense GEMM with the widest block candidate (B: window 32 x 4 blocks on CPU adapters,
/// tiles with a 64-deep K chunk elsewhere) against the adapter's default block (A), strict
/// order; bitwise equal. The dense target of the kernel work is read from B.
pub(crate) fn dense_wide_vs_default() -> Registered {
    Registered::new(
        "gemm/dense-wide-vs-default",
        "dense GEMM y = x . w^T on one f32 weight matrix with the widest block candidate (B: window \
                      32x4 register blocks on CPU adapters, 32x32 tiles with a 64-deep K chunk elsewhere) against \
                      the adapter's default block (A), strict order; bitwise equal",
        ("default", "wide"),
        dense_wide_vs_default_sizes,
        build_dense_wide_vs_default,
    )
}

pub(super) fn dense_wide_vs_default_sizes(set: SizeSet, held_out: bool) -> Vec<Size> {
    let shapes: &[(u32, u32, u32)] = match (set, held_out) {
        (SizeSet::Gpu, false) => &[(4096, 1024, 512), (4096, 4096, 1024)],
        (SizeSet::Gpu, true) => &[(2048, 2048, 2048)],
        (SizeSet::Cpu, false) => &[(256, 1024, 512)],
        (SizeSet::Cpu, true) => &[(384, 768, 512)],
    };
    shapes.iter().map(|&(r, n, k)| Size::of(&[("rows", r), ("N", n), ("K", k)])).collect()
}

pub(super) fn build_dense_wide_vs_default(ctx: &Context, size: &Size, seed: u64) -> Result<Case> {
    let kind = AdapterKind::of(ctx.adapter());
    let default = FfnKernels::default_for(kind, GemmOrder::Strict).down;
    let wide = if ctx.adapter().is_cpu() {
        GemmVariant::Window(LaneBlock::new(32, 4, 8))
    } else {
        GemmVariant::Tile(TileBlock::tiled(16))
    };
    dense_pair(ctx, size, seed, DenseKernel::Block(default), DenseKernel::Block(wide))
}

/// The grouped FFN in the fast order (B) against the strict order (A), same variants: what the
/// strict order costs.
pub(crate) fn fast_vs_strict() -> Registered {
    Registered::new(
        "gemm/fast-vs-strict",
        "grouped expert FFN with one accumulator per output (B, GemmOrder::Fast) against four lane \
                      accumulators (A, GemmOrder::Strict), the adapter's default variants: the cost of the strict order",
        ("strict", "fast"),
        layer_shape_sizes,
        build_fast_vs_strict,
    )
}

pub(super) fn build_fast_vs_strict(ctx: &Context, size: &Size, seed: u64) -> Result<Case> {
    let a = FfnKernels::default_for(AdapterKind::of(ctx.adapter()), GemmOrder::Strict);
    grouped_pair(ctx, size, seed, a, FfnKernels { order: GemmOrder::Fast, ..a })
}

/// The grouped FFN with the GEMM modules built without runtime bounds checks (B, the default)
/// against the same kernels built with them (A): what the checks cost.
pub(crate) fn unchecked_vs_checked() -> Registered {
    Registered::new(
        "gemm/unchecked-vs-checked",
        "grouped expert FFN, the adapter's default variants, strict order, built without runtime bounds \
                      checks (B, BoundsChecks::WhereUnproven) against every module built with them (A, \
                      BoundsChecks::Everywhere); bitwise equal",
        ("checked", "unchecked"),
        layer_shape_sizes,
        build_unchecked_vs_checked,
    )
}

pub(super) fn build_unchecked_vs_checked(ctx: &Context, size: &Size, seed: u64) -> Result<Case> {
    let kernels = FfnKernels::default_for(AdapterKind::of(ctx.adapter()), GemmOrder::Strict);
    let p = Problem::new(size, seed)?;
    let ffn = p.ffn_running(ctx, kernels)?;
    let bufs = PairBuffers::new(ctx, &p)?;
    // The context's choice applies to the pipelines built while it holds.
    let before = ctx.bounds_checks();
    ctx.set_bounds_checks(BoundsChecks::Everywhere);
    let wa = bufs.grouped(ctx, &p, &ffn, false);
    ctx.set_bounds_checks(BoundsChecks::WhereUnproven);
    let wb = bufs.grouped(ctx, &p, &ffn, true);
    ctx.set_bounds_checks(before);
    let note = format!("{} / {} {:?}", kernels.up.name(), kernels.down.name(), kernels.order);
    Ok(bufs.case(p, (wa?, wb?), note, |p, bufs, ctx| {
        p.check_pair(ctx, (&bufs.a, "checked"), (&bufs.b, "unchecked"))
    }))
}

/// The grouped FFN on another workgroup-memory tile (B) against the GPU default, the 32 × 32
/// tiles of `tiled-bk8` (A), in one order: what a tile of the GPU family does at the layer shapes
/// (the figures that decide a tile per rows per expert), or what f16 staging does against the
/// same tile in f32.
pub(super) struct TileVsTile {
    pub(super) order: GemmOrder,
    pub(super) a: GemmVariant,
    pub(super) b: GemmVariant,
}

/// The GPU tile family's comparisons.
pub(crate) fn tile_comparisons() -> Vec<Registered> {
    let tiled = GemmVariant::Tile(TileBlock::tiled(8));
    let tile64 = GemmVariant::Tile(TileBlock::new(64, 64, 4, 4, 4));
    vec![
        Registered::configured(
            "gemm/coop-vs-f32-tile",
            "grouped expert FFN on cooperative matrices (B, the CoopF16 precision mode: 32x32 \
             blocks of 16x16 f16 fragments into f32, one subgroup each) against 64x64 f32 tiles \
             (A), strict order for A; B checked within 1% of each row's scale of the reference on \
             f16-rounded operands (after its own device check); only on devices created with \
             cooperative matrices (MOEFLOW_COOPERATIVE_MATRIX=1)",
            ("f32 tiles", "coop f16"),
            CoopVsTile { a: GemmVariant::Tile(TileBlock::new(64, 64, 4, 4, 4)) },
            CoopVsTile::sizes,
            CoopVsTile::build,
        ),
        Registered::configured(
            "gemm/tile64-vs-tiled",
            "grouped expert FFN on 64x64 tiles of 256 invocations, 4x4 outputs each, K chunks of \
             16 (B) against the default 32x32 tiles of 64 invocations (A), strict order; bitwise equal",
            ("tiled", "tile64"),
            TileVsTile { order: GemmOrder::Strict, a: tiled, b: tile64 },
            TileVsTile::sizes,
            TileVsTile::build,
        ),
        Registered::configured(
            "gemm/tile128-vs-tiled",
            "grouped expert FFN on 128x128 tiles of 256 invocations, 8x8 outputs each, K chunks of \
             8 (B) against the default 32x32 tiles (A), fast order (one accumulator per output); \
             bitwise equal",
            ("tiled", "tile128"),
            TileVsTile {
                order: GemmOrder::Fast,
                a: tiled,
                b: GemmVariant::Tile(TileBlock::new(128, 128, 8, 8, 2)),
            },
            TileVsTile::sizes,
            TileVsTile::build,
        ),
        Registered::configured(
            "gemm/f16-staged-vs-f32-tile",
            "grouped expert FFN on 64x64 tiles staging x and the weights in f16 (B, the \
             TileF16 precision mode) against the same tiles in f32 (A), strict order; B checked \
             against the reference on f16-rounded operands",
            ("f32 tiles", "f16 tiles"),
            TileVsTile {
                order: GemmOrder::Strict,
                a: tile64,
                b: GemmVariant::TileF16(TileBlock::new(64, 64, 4, 4, 4)),
            },
            TileVsTile::sizes,
            TileVsTile::build,
        ),
    ]
}

impl TileVsTile {
    pub(super) fn sizes(&self, set: SizeSet, held_out: bool) -> Vec<Size> {
        layer_shape_sizes(set, held_out)
    }
    pub(super) fn build(&self, ctx: &Context, size: &Size, seed: u64) -> Result<Case> {
        let a = FfnKernels { order: self.order, up: self.a, down: self.a };
        grouped_pair(ctx, size, seed, a, FfnKernels { up: self.b, down: self.b, ..a })
    }
}

/// The grouped FFN on cooperative-matrix blocks of the device's subgroup size (B) against
/// exact f32 tiles (A).
pub(super) struct CoopVsTile {
    pub(super) a: GemmVariant,
}

impl CoopVsTile {
    pub(super) fn sizes(&self, set: SizeSet, held_out: bool) -> Vec<Size> {
        layer_shape_sizes(set, held_out)
    }
    pub(super) fn build(&self, ctx: &Context, size: &Size, seed: u64) -> Result<Case> {
        let lanes = ctx.adapter().subgroup_sizes[1];
        let b = GemmVariant::CoopF16(CoopBlock::new(32, 32, 16, lanes));
        check_on_device(ctx, &[b])?;
        let a = FfnKernels { order: GemmOrder::Strict, up: self.a, down: self.a };
        grouped_pair(ctx, size, seed, a, FfnKernels { up: b, down: b, ..a })
    }
}

/// The grouped FFN with direct (CPU-shaped) blocks (B) against workgroup-memory tiles (A).
pub(crate) fn direct_vs_tiled() -> Registered {
    Registered::new(
        "gemm/direct-vs-tiled",
        "grouped expert FFN with direct 16x8 register blocks of 8 lanes, no workgroup memory (B), \
                      against 32x32 workgroup-memory tiles of 4x4 blocks (A), strict order; bitwise equal",
        ("tiled", "direct"),
        layer_shape_sizes,
        build_direct_vs_tiled,
    )
}

pub(super) fn build_direct_vs_tiled(ctx: &Context, size: &Size, seed: u64) -> Result<Case> {
    let tiled = GemmVariant::Tile(TileBlock::tiled(8));
    let direct = GemmVariant::Direct(LaneBlock::new(16, 8, 8));
    let a = FfnKernels { order: GemmOrder::Strict, up: tiled, down: tiled };
    grouped_pair(ctx, size, seed, a, FfnKernels { up: direct, down: direct, ..a })
}

/// The grouped FFN with window blocks (B: x read from uniform-buffer windows a staging pass
/// fills) against the same direct blocks reading x from storage (A).
pub(crate) fn window_vs_direct() -> Registered {
    Registered::new(
        "gemm/window-vs-direct",
        "grouped expert FFN with 16x8 register blocks of 8 lanes reading x from uniform-buffer \
                      windows filled by a staging pass (B) against the same blocks reading x from storage (A), \
                      strict order; bitwise equal",
        ("direct", "window"),
        layer_shape_sizes,
        build_window_vs_direct,
    )
}

pub(super) fn build_window_vs_direct(ctx: &Context, size: &Size, seed: u64) -> Result<Case> {
    let direct = GemmVariant::Direct(LaneBlock::new(16, 8, 8));
    let window = GemmVariant::Window(LaneBlock::new(16, 8, 8));
    let a = FfnKernels { order: GemmOrder::Strict, up: direct, down: direct };
    grouped_pair(ctx, size, seed, a, FfnKernels { up: window, down: window, ..a })
}

/// The grouped FFN with texture blocks (B: the weights read from texture copies made on the
/// device) against the same window blocks reading the weights from storage (A).
pub(crate) fn texture_vs_window() -> Registered {
    Registered::new(
        "gemm/texture-vs-window",
        "grouped expert FFN with 16x8 register blocks of 8 lanes (16x4 on SwiftShader) reading the \
                      weights from texture copies (B) against the same blocks reading them from storage (A), x \
                      from uniform windows in both, strict order; bitwise equal",
        ("window", "texture"),
        layer_shape_sizes,
        build_texture_vs_window,
    )
}

pub(super) fn build_texture_vs_window(ctx: &Context, size: &Size, seed: u64) -> Result<Case> {
    let cols = texture_cols(ctx);
    let window = GemmVariant::Window(LaneBlock::new(16, cols, 8));
    let texture = GemmVariant::Texture(LaneBlock::new(16, cols, 8));
    let a = FfnKernels { order: GemmOrder::Strict, up: window, down: window };
    grouped_pair(ctx, size, seed, a, FfnKernels { up: texture, down: texture, ..a })
}

/// The dense GEMM with texture blocks of 32 rows (B) against window 32 x 4 blocks (A, the
/// widest storage-weight block), strict order; bitwise equal.
pub(crate) fn dense_texture_vs_window() -> Registered {
    Registered::new(
        "gemm/dense-texture-vs-window",
        "dense GEMM y = x . w^T on one f32 weight matrix with 32x8 register blocks (32x4 on \
                      SwiftShader) reading the weights from a texture copy (B) against window 32x4 blocks reading \
                      them from storage (A), strict order; bitwise equal",
        ("window", "texture"),
        dense_wide_vs_default_sizes,
        build_dense_texture_vs_window,
    )
}

pub(super) fn build_dense_texture_vs_window(ctx: &Context, size: &Size, seed: u64) -> Result<Case> {
    let window = GemmVariant::Window(LaneBlock::new(32, 4, 8));
    let texture = GemmVariant::Texture(LaneBlock::new(32, texture_cols(ctx), 8));
    dense_pair(ctx, size, seed, DenseKernel::Block(window), DenseKernel::Block(texture))
}

/// The grouped FFN with the tuner's choice (B) against the adapter's fixed default (A); the
/// note says which variants the tuner chose.
pub(crate) fn tuned_vs_default() -> Registered {
    Registered::new(
        "gemm/tuned-vs-default",
        "grouped expert FFN with the variants the tuner picked on this adapter (B; the note names \
                      them) against the adapter's fixed default (A), strict order; bitwise equal",
        ("default", "tuned"),
        layer_shape_sizes,
        build_tuned_vs_default,
    )
}

pub(super) fn build_tuned_vs_default(ctx: &Context, size: &Size, seed: u64) -> Result<Case> {
    let a = FfnKernels::default_for(AdapterKind::of(ctx.adapter()), GemmOrder::Strict);
    let p = Problem::new(size, seed)?;
    let opts = TuneOptions { cache: None, ..TuneOptions::for_context(ctx) };
    let tuned = tune(ctx, &p.ffn(ctx)?, GemmOrder::Strict, &opts)?;
    let mut case = grouped_pair(ctx, size, seed, a, tuned.kernels)?;
    let timings: Vec<String> = tuned
        .timings
        .iter()
        .map(|(v, u, d)| format!("{} {:.1}/{:.1} ms", v.name(), u * 1e3, d * 1e3))
        .collect();
    case.note = Some(format!(
        "tuned: up {}, down {} (up/down on every expert, 3/4 and 5/4 of {} rows alternately: {})",
        tuned.kernels.up.name(),
        tuned.kernels.down.name(),
        opts.rows,
        timings.join(", ")
    ));
    Ok(case)
}
