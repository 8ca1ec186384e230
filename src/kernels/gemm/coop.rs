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
//! **Checked before use.** No CPU adapter offers cooperative matrices, so the tests here only
//! build, validate and translate the modules. On a device, a `CoopF16` block runs
//! [`check_on_device`] before any plan may dispatch it (the layer's construction and the tuner
//! call it; a plan only looks its verdict up, and refuses a block without one, since plans
//! never submit): the grouped SwiGLU FFN on a small problem (two experts,
//! partial blocks, K and F no multiple of a chunk), each pass against the CPU reference on the
//! f16-rounded operands: every activation within the gate and up sums' bounds carried through
//! `silu(g)·u`, every output within the bound of the dot of the device's own activations. A
//! kernel past it is refused with an error for the rest of the context's life, so neither a
//! plan nor the tuner ever uses a kernel the device computes wrongly. The test of the check
//! runs it on `TileF16` (which passes) and on the exact tiles (which it refuses) on every
//! adapter here.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use super::variant::{GemmOrder, GemmVariant, WEIGHT_GROUPS, block_prologue};
use super::{ExpertFfn, ExpertWeights, NONE, Params, Pass, WeightDtype};
use crate::context::Context;
use crate::error::{Error, Result};
use crate::kernels::dispatch::{DispatchConfig, DispatchLayout};
use crate::sync::lock;
use crate::tensor::word_bytes;
use crate::workspace::Scratch;

/// K values staged per chunk.
const KC: u32 = 32;

/// Halves between staged rows: [`KC`] plus 8, so every fragment's first value and the stride
/// are 16-byte aligned.
const SK: u32 = KC + 8;

/// The block of [`GemmVariant::CoopF16`]: `rows × cols` outputs in fragments of `size × size`
/// by one subgroup of `lanes` invocations. `size` is 8 or 16 (a size the adapter reports for
/// f16 × f16 → f32); `rows` and `cols` are 16, 32 or 64 and multiples of `size`, with at most
/// 16 fragments (each with a second accumulator in the SwiGLU pass); `lanes` is a power of two
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

/// The cooperative-matrix candidates for `ctx`'s device: 32 × 32 and 64 × 32 blocks in each
/// fragment size the adapter reports, one subgroup each; none where cooperative matrices are
/// not enabled or the subgroup size is not fixed.
pub(super) fn candidates(ctx: &Context) -> Vec<GemmVariant> {
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

/// The WGSL body of a cooperative block (after enable_coop.wgsl, common.wgsl, a weights file,
/// half.wgsl, epilogue.wgsl and stage_f16.wgsl); entry point `gemm`.
pub(super) fn generate(b: CoopBlock) -> String {
    let CoopBlock { rows, cols, size: n, lanes } = b;
    let (fr, fc) = (rows / n, cols / n);
    let mat = |scalar: &str, role: &str| format!("coop_mat{n}x{n}<{scalar}, {role}>");
    let mut s = String::new();
    let _ = write!(
        s,
        "// Cooperative-matrix GEMM (generated): one subgroup of {lanes} invocations computes a {rows} x {cols}
// block as {fr} x {fc} fragments of {n} x {n}, f16 x f16 -> f32 on the device's matrix units, K staged
// {KC} at a time, rounded to f16 as staged (stage_f16.wgsl), each staged row {SK} halves apart.
// The sums inside a multiply-add are in the device's order (see coop.rs).

var<workgroup> xs: array<f16, {nx}>;
var<workgroup> ws: array<f16, {nw}>;
var<workgroup> us: array<f16, {nw}>;
var<workgroup> cs: array<f32, {nc}>;
var<workgroup> cu: array<f32, {nc}>;
var<workgroup> block_entry: array<u32, {rows}>;
var<workgroup> block_expert: u32;

// The four staged values of `p` (stage_f16) as f16: widened exactly (unstage_f16), so each
// converts to f16 exactly.
fn halves(p: vec2<u32>) -> vec4<f16> {{
    return vec4<f16>(unstage_f16(p));
}}

{prologue}    for (var t = lid; t < {nc}u; t += {lanes}u) {{
        cs[t] = 0.0;
    }}
    workgroupBarrier();
    let kdim = params.kdim;
    let cend = params.col_base + params.cols;
",
        nx = rows * SK,
        nw = cols * SK,
        nc = rows * cols,
        prologue = block_prologue(rows, cols, lanes),
    );
    // Accumulators start as a fragment of zeros loaded from the cleared block (no zero
    // constructor of a cooperative matrix is relied on).
    for i in 0..fr {
        for j in 0..fc {
            let _ = writeln!(
                s,
                "    var a{i}_{j} = coopLoadT<{c}>(&cs[0], {cols}u);\n    var u{i}_{j} = a{i}_{j};",
                c = mat("f32", "C")
            );
        }
    }
    let g = KC / 4;
    let _ = write!(
        s,
        "    for (var k0 = 0u; k0 < kdim; k0 += {KC}u) {{
        for (var t = lid; t < {rows}u * {g}u; t += {lanes}u) {{
            let r = t / {g}u;
            let q = t % {g}u;
            var xv = vec4<f32>(0.0);
            let e = block_entry[r];
            if e != NONE {{
                xv = x_tail(input_row(row0 + r, e) * kdim, k0 + 4u * q, kdim);
            }}
            let h = halves(stage_f16(xv));
            let at = r * {SK}u + 4u * q;
            xs[at] = h.x;
            xs[at + 1u] = h.y;
            xs[at + 2u] = h.z;
            xs[at + 3u] = h.w;
        }}
        for (var t = lid; t < {cols}u * {g}u; t += {lanes}u) {{
            let c = col0 + t / {g}u;
            let k = k0 + 4u * (t % {g}u);
{WEIGHT_GROUPS}            let hw = halves(stage_f16(wv));
            let hu = halves(stage_f16(uv));
            let at = (t / {g}u) * {SK}u + 4u * (t % {g}u);
            ws[at] = hw.x;
            ws[at + 1u] = hw.y;
            ws[at + 2u] = hw.z;
            ws[at + 3u] = hw.w;
            us[at] = hu.x;
            us[at + 1u] = hu.y;
            us[at + 2u] = hu.z;
            us[at + 3u] = hu.w;
        }}
        workgroupBarrier();
"
    );
    for kk in 0..KC / n {
        for i in 0..fr {
            let _ = writeln!(
                s,
                "        let x{i}_{kk} = coopLoadT<{}>(&xs[{}u], {SK}u);",
                mat("f16", "A"),
                i * n * SK + kk * n
            );
        }
        // Each column fragment of the weights (`w` from ws) or of the up weights (`v` from
        // us), multiplied into every row fragment's accumulator (`a` or `u`).
        let products = |s: &mut String, w: &str, tile: &str, acc: &str, indent: &str| {
            for j in 0..fc {
                let _ = writeln!(
                    s,
                    "{indent}let {w}{j}_{kk} = coopLoad<{}>(&{tile}[{}u], {SK}u);",
                    mat("f16", "B"),
                    j * n * SK + kk * n
                );
                for i in 0..fr {
                    let _ = writeln!(
                        s,
                        "{indent}{acc}{i}_{j} = coopMultiplyAdd(x{i}_{kk}, {w}{j}_{kk}, {acc}{i}_{j});"
                    );
                }
            }
        };
        products(&mut s, "w", "ws", "a", "        ");
        s.push_str("        if SWIGLU {\n");
        products(&mut s, "v", "us", "u", "            ");
        s.push_str("        }\n");
    }
    s.push_str("        workgroupBarrier();\n    }\n");
    for i in 0..fr {
        for j in 0..fc {
            let at = i * n * cols + j * n;
            let _ = writeln!(
                s,
                "    coopStoreT(a{i}_{j}, &cs[{at}u], {cols}u);\n    coopStoreT(u{i}_{j}, &cu[{at}u], {cols}u);"
            );
        }
    }
    let _ = write!(
        s,
        "    workgroupBarrier();
    for (var t = lid; t < {nc}u; t += {lanes}u) {{
        let r = t / {cols}u;
        let c = col0 + t % {cols}u;
        if row0 + r < params.rows && c < cend {{
            let e = block_entry[r];
            var v = epilogue(expert, c, cs[t], cu[t]);
            if e == NONE {{
                v = 0.0;
            }}
            store(row0 + r, e, c, v);
        }}
    }}
}}
",
        nc = rows * cols
    );
    s
}

/// The verdicts of [`check_on_device`] on one device (kept by its [`Context`]): `Err` holds why
/// the block was refused.
#[derive(Default)]
struct Verdicts(Mutex<HashMap<CoopBlock, std::result::Result<(), String>>>);

/// Runs the device check of every cooperative-matrix block among `variants` that has no verdict
/// on `ctx`'s device yet (a submission and a read-back each; the other variants need none), and
/// returns the first refusal. A plan dispatches a `CoopF16` block only after it passed here:
/// [`MoeLayer`](crate::layer::MoeLayer)'s constructors and the tuner call this; a caller of the
/// planners in [`crate::kernels::gemm`] with such a block calls it first.
///
/// # Errors
/// [`Error::MissingFeature`] where the device cannot run the block
/// ([`CoopBlock`]'s requirements); [`Error::InvalidArgument`] naming the first output past the
/// bound where the device computed the check wrongly (remembered: the block stays refused for
/// the context's life); device errors while checking (not remembered).
pub fn check_on_device(ctx: &Context, variants: &[GemmVariant]) -> Result<()> {
    for &variant in variants {
        if let GemmVariant::CoopF16(b) = variant {
            check(ctx, b)?;
        }
    }
    Ok(())
}

/// [`check_on_device`] for one block.
fn check(ctx: &Context, b: CoopBlock) -> Result<()> {
    b.require(ctx)?;
    let verdicts = ctx.kept::<Verdicts>();
    if let Some(done) = lock(&verdicts.0).get(&b) {
        return done.clone().map_err(Error::invalid);
    }
    let outcome = match compare(ctx, GemmVariant::CoopF16(b), b.rows.max(32))? {
        None => Ok(()),
        Some(wrong) => Err(format!(
            "the coop-{} GEMM failed its check against the CPU reference on this device: {wrong}",
            b.name()
        )),
    };
    if let Err(wrong) = &outcome {
        log::warn!("moeflow: {wrong}");
    }
    lock(&verdicts.0).insert(b, outcome.clone());
    outcome.map_err(Error::invalid)
}

/// Whether a plan may dispatch `b` on `ctx`'s device: it is supported and passed
/// [`check_on_device`] there. Looks the verdict up only; submits nothing.
///
/// # Errors
/// [`CoopBlock`]'s requirements; the remembered refusal; [`Error::InvalidArgument`] where the
/// block was never checked on this device.
pub(super) fn passed(ctx: &Context, b: CoopBlock) -> Result<()> {
    b.require(ctx)?;
    match lock(&ctx.kept::<Verdicts>().0).get(&b) {
        Some(verdict) => verdict.clone().map_err(Error::invalid),
        None => Err(Error::invalid(format!(
            "the coop-{} GEMM has not been checked on this device: call kernels::gemm::check_on_device \
             before planning it (a layer's constructors and the tuner do)",
            b.name()
        ))),
    }
}

/// Bound of an f32 sum of `n` exact products on matrix units, `s` the sum of their magnitudes
/// (see the module docs).
fn sum_bound(n: usize, s: f64) -> f64 {
    (n as f64 + 16.0) * 2f64.powi(-22) * s
}

/// A value in [-1, 1) from an xorshift state.
fn next(state: &mut u64) -> f32 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    ((*state >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
}

/// Runs the grouped SwiGLU FFN with `variant` for both projections (rows padded to `tile`) on
/// a small problem and compares each pass with the CPU reference on f16-rounded operands: the
/// gate/up pass's activations against `silu(g)·u` of the exact dots, with the sums' bounds
/// carried through (the slope of `silu(g)·u` in `g` is below 1.1 in magnitude); the down
/// pass's outputs against the exact dots of the device's own activations rounded to f16.
/// `Some` describes the first value past its bound. (Any kernel that rounds its operands to f16
/// and sums in f32 passes, so the tests run it on `TileF16` where no adapter has cooperative
/// matrices.)
fn compare(ctx: &Context, variant: GemmVariant, tile: u32) -> Result<Option<String>> {
    // Two experts, 37 and 5 rows (partial blocks); K of 72 and 40 and F of 40, no multiple of
    // a chunk; N of 40 and 72, no multiple of a block.
    let (e, h, f, tokens) = (2u32, 72usize, 40usize, 42u32);
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut values = |len: usize| -> Vec<f32> { (0..len).map(|_| next(&mut state)).collect() };
    let x = values(tokens as usize * h);
    let (gate, up, down) = (values(2 * f * h), values(2 * f * h), values(2 * h * f));
    let experts: Vec<u32> = (0..tokens).map(|t| u32::from(t >= 37)).collect();
    let weights = |w: &[f32], n: usize, k: usize| {
        ExpertWeights::from_f32(ctx, w, WeightDtype::F32, e, n as u32, k as u32)
    };
    let ffn = ExpertFfn::new(weights(&gate, f, h)?, weights(&up, f, h)?, weights(&down, h, f)?)?;
    let (xb, ib) = (ctx.upload("coop check x", &x)?, ctx.upload("coop check experts", &experts)?);
    let partial = ctx.zeroed("coop check output", word_bytes(u64::from(tokens) * h as u64))?;
    let layout = DispatchLayout::new(ctx, DispatchConfig { experts: e, k: 1, tile }, tokens, 0)?;
    let act = ctx.zeroed("coop check activations", word_bytes(u64::from(layout.max_rows()) * f as u64))?;
    let base = Params { k_route: 1, fixed_expert: NONE, ..Params::default() };
    let up_pass = Pass::grouped_gate_up(&ffn, GemmOrder::Strict, base, (&xb).into(), &layout, (&act).into());
    let down_pass = Pass::down(&up_pass, &ffn, (&act).into(), (&partial).into());
    let scratch = Scratch::Own(ctx);
    let mut dispatches = layout.plan(ctx, &ib)?;
    // The block under check is planned without the verdict it is about to get.
    dispatches.extend(up_pass.gemm_unchecked(scratch, variant, Some(layout.tile_expert()))?);
    dispatches.extend(down_pass.gemm_unchecked(scratch, variant, Some(layout.tile_expert()))?);
    ctx.run(&dispatches.iter().collect::<Vec<_>>())?;
    let rows: Vec<u32> = ctx.read_back(layout.inverse(), tokens as usize)?;
    let act: Vec<f32> = ctx.read_back(&act, layout.max_rows() as usize * f)?;
    let got: Vec<f32> = ctx.read_back(&partial, tokens as usize * h)?;

    let round = |v: &[f32]| -> Vec<f64> { v.iter().map(|&x| f64::from(half::f16::from_f32(x))).collect() };
    let (xr, gr, ur, dr) = (round(&x), round(&gate), round(&up), round(&down));
    for t in 0..tokens as usize {
        let ex = experts[t] as usize;
        let xt = &xr[t * h..(t + 1) * h];
        let row = rows[t] as usize;
        let Some(dev_act) = act.get(row * f..(row + 1) * f) else {
            return Ok(Some(format!("token {t}: grouped row {row} past the layout's rows")));
        };
        for (j, &a_dev) in dev_act.iter().enumerate() {
            let dot = |w: &[f64]| {
                let r = &w[(ex * f + j) * h..(ex * f + j + 1) * h];
                let dot: f64 = xt.iter().zip(r).map(|(a, b)| a * b).sum();
                let mag: f64 = xt.iter().zip(r).map(|(a, b)| (a * b).abs()).sum();
                (dot, sum_bound(h, mag))
            };
            let ((g, bg), (u, bu)) = (dot(&gr), dot(&ur));
            let silu = g / (1.0 + (-g).exp());
            let want = silu * u;
            // The sums' bounds carried through, and the epilogue's own f32 rounding and exp.
            let bound =
                1.1 * bg * (u.abs() + bu) + (silu.abs() + 1.1 * bg) * bu + 2f64.powi(-16) * want.abs();
            let a = f64::from(a_dev);
            if !a.is_finite() || (a - want).abs() > bound {
                return Ok(Some(format!(
                    "gate/up, token {t} (expert {ex}) column {j}: {a} against {want}, bound {bound:e}"
                )));
            }
        }
        let ar = round(dev_act);
        for c in 0..h {
            let w = &dr[(ex * h + c) * f..(ex * h + c + 1) * f];
            let want: f64 = ar.iter().zip(w).map(|(a, b)| a * b).sum();
            let bound = sum_bound(f, ar.iter().zip(w).map(|(a, b)| (a * b).abs()).sum());
            let g = f64::from(got[t * h + c]);
            if !g.is_finite() || (g - want).abs() > bound {
                return Ok(Some(format!(
                    "down, token {t} (expert {ex}) column {c}: {g} against {want}, bound {bound:e}"
                )));
            }
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::gemm::TileBlock;

    /// The device check passes a kernel that rounds its operands to f16 and sums in f32
    /// (`TileF16`, within the bound on every adapter here) and refuses the exact f32 tiles,
    /// whose unrounded operands put their gate and up sums about 2^-8 of the row's scale
    /// away: the check can fail.
    #[test]
    fn the_device_check_passes_f16_operands_and_refuses_unrounded_ones() {
        for ctx in crate::context::test_contexts() {
            let tile = TileBlock::new(32, 32, 4, 4, 2);
            let slug = ctx.adapter().slug();
            let passed = compare(&ctx, GemmVariant::TileF16(tile), 32).expect("the check runs");
            assert_eq!(passed, None, "{slug}: f16-staged tiles");
            let refused = compare(&ctx, GemmVariant::Tile(tile), 32).expect("the check runs");
            assert!(refused.is_some(), "{slug}: exact tiles passed the f16 check");
            eprintln!("{slug}: exact tiles refused: {}", refused.unwrap_or_default());
        }
    }

    /// The blocks the contract test builds are within their documented ranges.
    #[test]
    fn the_contract_variants_are_valid() {
        for v in super::super::specs::contract_variants() {
            assert!(v.validate().is_ok(), "{}", v.name());
        }
    }

    /// Where the device has no cooperative matrices the check refuses before running anything
    /// and remembers nothing.
    #[test]
    fn the_check_refuses_devices_without_cooperative_matrices() {
        for ctx in crate::context::test_contexts() {
            let err = check(&ctx, CoopBlock::new(32, 32, 16, 32)).expect_err("no CPU adapter has them");
            assert!(matches!(err, Error::MissingFeature(_)), "{err}");
            assert!(lock(&ctx.kept::<Verdicts>().0).is_empty());
            let err = passed(&ctx, CoopBlock::new(32, 32, 16, 32)).expect_err("no verdict, no plan");
            assert!(matches!(err, Error::MissingFeature(_)), "{err}");
        }
    }
}
