//! The gemm family's kernel specs and shader modules: the row-wise kernels (one module per way
//! of reading x and the weights), the staging and unpacking kernels, and the lists of every
//! module and spec (the contract test's, the tuner's cache key's, a configuration's
//! requirements'). The generated block kernels' specs are `variant.rs`'s.

use crate::pipeline::{Access, KernelSpec, Workgroup};
use crate::shader::{Indexing, ShaderSource, wgsl};

use super::variant::{self, GemmOrder, GemmVariant, TileBlock, WeightLoads};
use super::{AdapterKind, CoopBlock, PARAMS_BYTES, candidates, slots, texture};

/// The row-wise kernel's module: x from storage or from uniform windows, each invocation
/// loading its own (`gemm/rowwise_entry.wgsl`) or a subgroup sharing its loads of a window
/// (`gemm/rowwise_x_subgroup.wgsl`); packed float, native f16 or quantised weights from their
/// buffers, or their texture copies.
macro_rules! rowwise_shader {
    // How x is read (RowX): from storage, from a window, from a window shared by a subgroup.
    ($name:literal, storage, $weights:ident) => {
        rowwise_shader!($name, "gemm/rowwise_x.wgsl", "gemm/rowwise_entry.wgsl", $weights)
    };
    ($name:literal, window, $weights:ident) => {
        rowwise_shader!($name, "gemm/rowwise_x_window.wgsl", "gemm/rowwise_entry.wgsl", $weights)
    };
    ($name:literal, subgroup, $weights:ident) => {
        rowwise_shader!($name, "gemm/rowwise_x_window.wgsl", "gemm/rowwise_x_subgroup.wgsl", $weights)
    };
    ($name:literal, $x:literal, $entry:literal, $($weights:literal),+) => {
        ShaderSource {
            name: concat!("gemm/", $name),
            parts: &[$(wgsl!($weights),)+ wgsl!($x), wgsl!("gemm/rowwise.wgsl"), wgsl!($entry)],
            entry_points: &["rowwise"],
            // Rows below the live count and the dispatch's window rows, columns clamped to the
            // chunk's, entries as the caller's or the layout's row map holds them (below the
            // bound views' rows), the expert read back only through in_chunk, K below kdim in
            // every loop, x windows within the WINDOW_BYTES the host sized them to.
            indexing: Indexing::Proven,
        }
    };
    ($name:literal, $x:literal, $entry:literal, packed) => {
        rowwise_shader!(
            $name,
            $x,
            $entry,
            "gemm/common.wgsl",
            "gemm/order.wgsl",
            "gemm/weights_packed.wgsl",
            "gemm/weight_groups.wgsl",
            "gemm/half.wgsl",
            "gemm/rowwise_w_packed.wgsl",
            "gemm/rowwise_dots.wgsl",
            "gemm/epilogue.wgsl"
        )
    };
    ($name:literal, $x:literal, $entry:literal, quant) => {
        rowwise_shader!(
            $name,
            $x,
            $entry,
            "gemm/common.wgsl",
            "gemm/order.wgsl",
            "gemm/weights_quant.wgsl",
            "gemm/half.wgsl",
            "gemm/quant.wgsl",
            "gemm/quant_blocks.wgsl",
            "gemm/rowwise_w_packed.wgsl",
            "gemm/rowwise_dots_quant.wgsl",
            "gemm/epilogue.wgsl"
        )
    };
    ($name:literal, $x:literal, $entry:literal, f16) => {
        rowwise_shader!(
            $name,
            $x,
            $entry,
            "gemm/enable_f16.wgsl",
            "gemm/common.wgsl",
            "gemm/order.wgsl",
            "gemm/weights_f16.wgsl",
            "gemm/weight_groups.wgsl",
            "gemm/rowwise_w_packed.wgsl",
            "gemm/rowwise_dots.wgsl",
            "gemm/epilogue.wgsl"
        )
    };
    ($name:literal, $x:literal, $entry:literal, texture) => {
        rowwise_shader!(
            $name,
            $x,
            $entry,
            "gemm/common.wgsl",
            "gemm/order.wgsl",
            "gemm/half.wgsl",
            "gemm/weights_texture.wgsl",
            "gemm/rowwise_w_texture.wgsl",
            "gemm/rowwise_dots.wgsl",
            "gemm/epilogue.wgsl"
        )
    };
}
static ROWWISE_SHADER: ShaderSource = rowwise_shader!("rowwise", storage, packed);
static ROWWISE_F16_SHADER: ShaderSource = rowwise_shader!("rowwise_f16", storage, f16);
static ROWWISE_QUANT_SHADER: ShaderSource = rowwise_shader!("rowwise_quant", storage, quant);
static ROWWISE_TEXTURE_SHADER: ShaderSource = rowwise_shader!("rowwise_texture", storage, texture);
static ROWWISE_WINDOW_SHADER: ShaderSource = rowwise_shader!("rowwise_window", window, packed);
static ROWWISE_WINDOW_F16_SHADER: ShaderSource = rowwise_shader!("rowwise_window_f16", window, f16);
static ROWWISE_WINDOW_QUANT_SHADER: ShaderSource = rowwise_shader!("rowwise_window_quant", window, quant);
static ROWWISE_WINDOW_TEXTURE_SHADER: ShaderSource =
    rowwise_shader!("rowwise_window_texture", window, texture);
static ROWWISE_SUBGROUP_SHADER: ShaderSource = rowwise_shader!("rowwise_subgroup", subgroup, packed);
static ROWWISE_SUBGROUP_F16_SHADER: ShaderSource = rowwise_shader!("rowwise_subgroup_f16", subgroup, f16);
static ROWWISE_SUBGROUP_QUANT_SHADER: ShaderSource =
    rowwise_shader!("rowwise_subgroup_quant", subgroup, quant);
static ROWWISE_SUBGROUP_TEXTURE_SHADER: ShaderSource =
    rowwise_shader!("rowwise_subgroup_texture", subgroup, texture);

/// The gemm family's shader modules (the `_f16` ones need the shader-f16 feature): the
/// row-wise kernel and the generated block kernels of every [`contract_variants`] variant in
/// both orders (the contract test checks them; the tuner's cache keys hash them).
pub(crate) fn shaders() -> Vec<&'static ShaderSource> {
    let mut all = vec![
        &ROWWISE_SHADER,
        &ROWWISE_F16_SHADER,
        &ROWWISE_QUANT_SHADER,
        &ROWWISE_WINDOW_SHADER,
        &ROWWISE_WINDOW_F16_SHADER,
        &ROWWISE_WINDOW_QUANT_SHADER,
        &ROWWISE_TEXTURE_SHADER,
        &ROWWISE_WINDOW_TEXTURE_SHADER,
        &ROWWISE_SUBGROUP_SHADER,
        &ROWWISE_SUBGROUP_F16_SHADER,
        &ROWWISE_SUBGROUP_QUANT_SHADER,
        &ROWWISE_SUBGROUP_TEXTURE_SHADER,
        &STAGE_SHADER,
        &UNPACK_SHADER,
        &UNPACK_QUANT_SHADER,
        &texture::PACK_SHADER,
    ];
    for v in contract_variants() {
        for order in [GemmOrder::Strict, GemmOrder::Fast] {
            for loads in WeightLoads::ALL {
                all.push(variant::spec(v, order, loads).shader);
            }
        }
    }
    all
}

/// The kernels an FFN with `variants` as its block kernels can run, in `order`, reading the
/// weights with `loads`: the blocks, their window and direct fallbacks, the staging, packing
/// and row-wise kernels (for the requirements of a configuration).
pub(crate) fn specs_for(
    variants: &[GemmVariant],
    order: GemmOrder,
    loads: WeightLoads,
) -> Vec<&'static KernelSpec> {
    let mut all: Vec<&'static KernelSpec> = vec![
        &STAGE,
        &texture::PACK,
        &ROWWISE,
        &ROWWISE_F16,
        &ROWWISE_QUANT,
        &ROWWISE_TEXTURE,
        &ROWWISE_WINDOW,
        &ROWWISE_WINDOW_F16,
        &ROWWISE_WINDOW_QUANT,
        &ROWWISE_WINDOW_TEXTURE,
        &ROWWISE_SUBGROUP,
        &ROWWISE_SUBGROUP_F16,
        &ROWWISE_SUBGROUP_QUANT,
        &ROWWISE_SUBGROUP_TEXTURE,
    ];
    for &v in variants {
        for v in [v, v.without_texture(), v.without_window()] {
            all.push(variant::spec(v, order, loads));
        }
    }
    all
}

/// Every candidate variant of every kind of adapter, f16-staged tiles (which are never
/// candidates) and cooperative-matrix blocks, once each: the variants the contract tests build.
pub(super) fn contract_variants() -> Vec<GemmVariant> {
    let mut variants: Vec<GemmVariant> = AdapterKind::ALL.into_iter().flat_map(candidates).collect();
    variants.push(GemmVariant::TileF16(TileBlock::new(64, 64, 4, 4, 4)));
    variants.push(GemmVariant::TileF16(TileBlock::new(128, 128, 8, 8, 2)));
    // Cooperative-matrix blocks in both fragment sizes (no adapter here runs them: built,
    // validated and translated only).
    variants.push(GemmVariant::CoopF16(CoopBlock::new(32, 32, 16, 32)));
    variants.push(GemmVariant::CoopF16(CoopBlock::new(32, 32, 8, 32)));
    variants.sort_by_key(|v| v.name());
    variants.dedup();
    variants
}

/// Every gemm kernel (for the contract test, `src/contract.rs`): the unpack kernel and
/// [`specs_for`] every [`contract_variants`] variant in both orders, with every way of loading
/// weights.
#[cfg(test)]
pub(crate) fn specs() -> Vec<&'static KernelSpec> {
    let variants = contract_variants();
    let mut all: Vec<&'static KernelSpec> = vec![&UNPACK, &UNPACK_QUANT];
    for order in [GemmOrder::Strict, GemmOrder::Fast] {
        for loads in WeightLoads::ALL {
            for spec in specs_for(&variants, order, loads) {
                if !all.iter().any(|s| std::ptr::eq(*s, spec)) {
                    all.push(spec);
                }
            }
        }
    }
    all
}

static STAGE_SHADER: ShaderSource = ShaderSource {
    name: "gemm/stage",
    parts: &[wgsl!("gemm/common.wgsl"), wgsl!("gemm/stage.wgsl")],
    entry_points: &["stage"],
    indexing: Indexing::Checked,
};

/// The weights' values as the kernels load them (`ExpertWeights::unpack`): f32, f16 and bf16
/// through the packed loads.
static UNPACK_SHADER: ShaderSource = ShaderSource {
    name: "gemm/unpack",
    parts: &[
        wgsl!("gemm/common.wgsl"),
        wgsl!("gemm/weights_packed.wgsl"),
        wgsl!("gemm/weight_groups.wgsl"),
        wgsl!("gemm/half.wgsl"),
        wgsl!("gemm/unpack.wgsl"),
    ],
    entry_points: &["unpack"],
    indexing: Indexing::Checked,
};

/// [`UNPACK_SHADER`] for the quantised formats, through the quantised loads.
static UNPACK_QUANT_SHADER: ShaderSource = ShaderSource {
    name: "gemm/unpack-quant",
    parts: &[
        wgsl!("gemm/common.wgsl"),
        wgsl!("gemm/weights_quant.wgsl"),
        wgsl!("gemm/half.wgsl"),
        wgsl!("gemm/quant.wgsl"),
        wgsl!("gemm/unpack.wgsl"),
    ],
    entry_points: &["unpack"],
    indexing: Indexing::Checked,
};

use Access::{Read, ReadWrite, Uniform};
pub(super) static STAGE: KernelSpec = KernelSpec {
    shader: &STAGE_SHADER,
    entry: "stage",
    bindings: &[
        (slots::PARAMS, Uniform),
        (slots::X, ReadWrite),
        (slots::ROW_ENTRY, ReadWrite),
        (slots::WINDOW, ReadWrite),
    ],
    params_bytes: PARAMS_BYTES,
    workgroup: Workgroup::Fixed(64),
};
pub(super) static UNPACK: KernelSpec = unpack(&UNPACK_SHADER);
pub(super) static UNPACK_QUANT: KernelSpec = unpack(&UNPACK_QUANT_SHADER);
/// An unpacking kernel: one invocation per group of four values.
const fn unpack(shader: &'static ShaderSource) -> KernelSpec {
    KernelSpec {
        shader,
        entry: "unpack",
        bindings: &[(slots::PARAMS, Uniform), (slots::W, Read), (slots::W_UP, Read), (slots::OUT, ReadWrite)],
        params_bytes: PARAMS_BYTES,
        workgroup: Workgroup::Fixed(64),
    }
}
/// The row-wise kernels' bindings, by where they read x and the weights.
static ROWWISE_BINDINGS: [(u32, Access); 9] = slots::rowwise_bindings(false, false);
static ROWWISE_TEXTURE_BINDINGS: [(u32, Access); 9] = slots::rowwise_bindings(false, true);
static ROWWISE_WINDOW_BINDINGS: [(u32, Access); 9] = slots::rowwise_bindings(true, false);
static ROWWISE_WINDOW_TEXTURE_BINDINGS: [(u32, Access); 9] = slots::rowwise_bindings(true, true);
/// A row-wise kernel: 64 invocations per workgroup, one per (row, column) output.
const fn rowwise(shader: &'static ShaderSource, bindings: &'static [(u32, Access)]) -> KernelSpec {
    KernelSpec {
        shader,
        entry: "rowwise",
        bindings,
        params_bytes: PARAMS_BYTES,
        workgroup: Workgroup::Fixed(64),
    }
}
pub(super) static ROWWISE: KernelSpec = rowwise(&ROWWISE_SHADER, &ROWWISE_BINDINGS);
pub(super) static ROWWISE_F16: KernelSpec = rowwise(&ROWWISE_F16_SHADER, &ROWWISE_BINDINGS);
pub(super) static ROWWISE_QUANT: KernelSpec = rowwise(&ROWWISE_QUANT_SHADER, &ROWWISE_BINDINGS);
pub(super) static ROWWISE_TEXTURE: KernelSpec = rowwise(&ROWWISE_TEXTURE_SHADER, &ROWWISE_TEXTURE_BINDINGS);
pub(super) static ROWWISE_WINDOW: KernelSpec = rowwise(&ROWWISE_WINDOW_SHADER, &ROWWISE_WINDOW_BINDINGS);
pub(super) static ROWWISE_WINDOW_F16: KernelSpec =
    rowwise(&ROWWISE_WINDOW_F16_SHADER, &ROWWISE_WINDOW_BINDINGS);
pub(super) static ROWWISE_WINDOW_QUANT: KernelSpec =
    rowwise(&ROWWISE_WINDOW_QUANT_SHADER, &ROWWISE_WINDOW_BINDINGS);
pub(super) static ROWWISE_WINDOW_TEXTURE: KernelSpec =
    rowwise(&ROWWISE_WINDOW_TEXTURE_SHADER, &ROWWISE_WINDOW_TEXTURE_BINDINGS);
pub(super) static ROWWISE_SUBGROUP: KernelSpec = rowwise(&ROWWISE_SUBGROUP_SHADER, &ROWWISE_WINDOW_BINDINGS);
pub(super) static ROWWISE_SUBGROUP_F16: KernelSpec =
    rowwise(&ROWWISE_SUBGROUP_F16_SHADER, &ROWWISE_WINDOW_BINDINGS);
pub(super) static ROWWISE_SUBGROUP_QUANT: KernelSpec =
    rowwise(&ROWWISE_SUBGROUP_QUANT_SHADER, &ROWWISE_WINDOW_BINDINGS);
pub(super) static ROWWISE_SUBGROUP_TEXTURE: KernelSpec =
    rowwise(&ROWWISE_SUBGROUP_TEXTURE_SHADER, &ROWWISE_WINDOW_TEXTURE_BINDINGS);
