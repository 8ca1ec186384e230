//! The gemm family's kernel specs and shader modules: the row-wise kernels (one module per way
//! of reading x and the weights), the staging and unpacking kernels, and the lists of every
//! module and spec (the contract test's, the tuner's cache key's, a configuration's
//! requirements'); and the generated block kernels' modules, assembled from `wgsl/gemm/`
//! fragments and the body `generate/` writes, once per (variant, order, weight loads).

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use crate::pipeline::{Access, KernelSpec, Workgroup};
use crate::shader::{Indexing, ShaderPart, ShaderSource, wgsl};
use crate::sync::lock;

use super::coop::CoopBlock;
use super::dtype::WeightDtype;
use super::generate::generate;
use super::params::PARAMS_BYTES;
use super::policy::{AdapterKind, candidates};
use super::slots;
use super::texture;
use super::variant::{GemmOrder, GemmVariant, OperandSource, TileBlock};

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
/// How the row-wise kernel reads x (the table's first index).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum RowX {
    /// Each invocation from storage.
    Storage = 0,
    /// Each invocation from the dispatch's uniform window.
    Window = 1,
    /// From the uniform window, each load shared by a subgroup (`gemm/rowwise_x_subgroup.wgsl`;
    /// needs subgroups, and pads every row's columns to whole workgroups).
    WindowShared = 2,
}

impl RowX {
    /// Invocations a row of `cols` output columns takes (`row_lanes` in `gemm/rowwise.wgsl`:
    /// `cols` rounded up to the module's `ROW_ALIGN`).
    pub(super) fn row_lanes(self, cols: u32) -> u64 {
        let align = match self {
            RowX::Storage | RowX::Window => 1,
            RowX::WindowShared => u64::from(ROWWISE_SUBGROUP_ROW_ALIGN),
        };
        u64::from(cols).div_ceil(align) * align
    }
}

/// `ROW_ALIGN` of `gemm/rowwise_x_subgroup.wgsl`: a row's invocations fill whole workgroups.
pub(crate) const ROWWISE_SUBGROUP_ROW_ALIGN: u32 = 64;

/// How the row-wise kernel reads the weights (the table's second index).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum RowWeights {
    /// Packed u32 words, any float dtype.
    Packed = 0,
    /// Native f16 loads.
    NativeF16 = 1,
    /// Quantised blocks.
    Quantised = 2,
    /// Texture copies.
    Texture = 3,
}

/// The row-wise kernel's modules, by [`RowX`] and [`RowWeights`].
static ROWWISE_SHADERS: [[ShaderSource; 4]; 3] = [
    [
        rowwise_shader!("rowwise", storage, packed),
        rowwise_shader!("rowwise_f16", storage, f16),
        rowwise_shader!("rowwise_quant", storage, quant),
        rowwise_shader!("rowwise_texture", storage, texture),
    ],
    [
        rowwise_shader!("rowwise_window", window, packed),
        rowwise_shader!("rowwise_window_f16", window, f16),
        rowwise_shader!("rowwise_window_quant", window, quant),
        rowwise_shader!("rowwise_window_texture", window, texture),
    ],
    [
        rowwise_shader!("rowwise_subgroup", subgroup, packed),
        rowwise_shader!("rowwise_subgroup_f16", subgroup, f16),
        rowwise_shader!("rowwise_subgroup_quant", subgroup, quant),
        rowwise_shader!("rowwise_subgroup_texture", subgroup, texture),
    ],
];

/// Every row-wise module as `(RowX, RowWeights)` indices, in the order the tuner's kernel hash
/// has always read them (a new order would re-key every tune cache).
const ROWWISE_ORDER: [(usize, usize); 12] =
    [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2), (0, 3), (1, 3), (2, 0), (2, 1), (2, 2), (2, 3)];

/// The gemm family's shader modules (the `_f16` ones need the shader-f16 feature): the
/// row-wise kernel and the generated block kernels of every [`contract_variants`] variant in
/// both orders (the contract test checks them; the tuner's cache keys hash them).
pub(crate) fn shaders() -> Vec<&'static ShaderSource> {
    let mut all: Vec<&'static ShaderSource> =
        ROWWISE_ORDER.iter().map(|&(x, w)| &ROWWISE_SHADERS[x][w]).collect();
    all.extend([&STAGE_SHADER, &UNPACK_SHADER, &UNPACK_QUANT_SHADER, &texture::PACK_SHADER]);
    for v in contract_variants() {
        for order in [GemmOrder::Strict, GemmOrder::Fast] {
            for loads in WeightLoads::ALL {
                all.push(spec(v, order, loads).shader);
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
    let mut all: Vec<&'static KernelSpec> = vec![&STAGE, &texture::PACK];
    all.extend(ROWWISE.iter().flatten());
    for &v in variants {
        for v in [v, v.without_texture(), v.without_window()] {
            all.push(spec(v, order, loads));
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

use Access::{ReadWrite, Uniform};
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
/// The unpacking kernels ([`ExpertWeights::unpack`](super::ExpertWeights::unpack), natively only).
#[cfg(not(target_arch = "wasm32"))]
pub(super) static UNPACK: KernelSpec = unpack(&UNPACK_SHADER);
#[cfg(not(target_arch = "wasm32"))]
pub(super) static UNPACK_QUANT: KernelSpec = unpack(&UNPACK_QUANT_SHADER);
/// An unpacking kernel: one invocation per group of four values.
#[cfg(not(target_arch = "wasm32"))]
const fn unpack(shader: &'static ShaderSource) -> KernelSpec {
    KernelSpec {
        shader,
        entry: "unpack",
        bindings: &[
            (slots::PARAMS, Uniform),
            (slots::W, Access::Read),
            (slots::W_UP, Access::Read),
            (slots::OUT, ReadWrite),
        ],
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
/// The row-wise kernels, by [`RowX`] and [`RowWeights`] (see [`rowwise_spec`]).
static ROWWISE: [[KernelSpec; 4]; 3] = {
    const fn row(
        shaders: &'static [ShaderSource; 4],
        bindings: &'static [(u32, Access)],
        texture: &'static [(u32, Access)],
    ) -> [KernelSpec; 4] {
        [
            rowwise(&shaders[0], bindings),
            rowwise(&shaders[1], bindings),
            rowwise(&shaders[2], bindings),
            rowwise(&shaders[3], texture),
        ]
    }
    [
        row(&ROWWISE_SHADERS[0], &ROWWISE_BINDINGS, &ROWWISE_TEXTURE_BINDINGS),
        row(&ROWWISE_SHADERS[1], &ROWWISE_WINDOW_BINDINGS, &ROWWISE_WINDOW_TEXTURE_BINDINGS),
        row(&ROWWISE_SHADERS[2], &ROWWISE_WINDOW_BINDINGS, &ROWWISE_WINDOW_TEXTURE_BINDINGS),
    ]
};

/// The row-wise kernel reading x as `x` says and the weights as `w` says.
pub(super) fn rowwise_spec(x: RowX, w: RowWeights) -> &'static KernelSpec {
    &ROWWISE[x as usize][w as usize]
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
            params_bytes: PARAMS_BYTES,
            workgroup: Workgroup::Fixed(variant.invocations()),
        }))
    })
}

/// Generated sources live as long as the process (one per variant, order and weight path).
fn leak(s: String) -> &'static str {
    Box::leak(s.into_boxed_str())
}

#[cfg(test)]
mod tests {
    /// The blocks the contract test builds are within their documented ranges.
    #[test]
    fn the_contract_variants_are_valid() {
        for v in super::contract_variants() {
            assert!(v.validate().is_ok(), "{}", v.name());
        }
    }
}
