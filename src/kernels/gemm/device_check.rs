//! The cooperative-matrix GEMM's device check ([`GemmVariant::CoopF16`]).
//!
//! No CPU adapter offers cooperative matrices, so the tests here only
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

use super::coop::{CoopBlock, Verdicts};
use super::dtype::WeightDtype;
use super::ffn::ExpertFfn;
use super::params::{NONE, Params};
use super::passes::Pass;
use super::variant::{GemmOrder, GemmVariant};
use super::weights::ExpertWeights;
use crate::context::Context;
use crate::context::wait::Driver;
use crate::error::{Error, Result};
use crate::kernels::dispatch::{DispatchConfig, DispatchLayout};
use crate::sync::lock;
use crate::tensor::word_bytes;
use crate::workspace::Scratch;

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
#[cfg(not(target_arch = "wasm32"))]
pub fn check_on_device(ctx: &Context, variants: &[GemmVariant]) -> Result<()> {
    pollster::block_on(check_on_device_with(ctx, variants, Driver::Inline))
}

/// [`check_on_device`], awaiting the device instead of blocking on it.
///
/// # Errors
/// As [`check_on_device`].
pub async fn check_on_device_async(ctx: &Context, variants: &[GemmVariant]) -> Result<()> {
    check_on_device_with(ctx, variants, Driver::Await).await
}

/// [`check_on_device`], its waits driven as `driver` says.
pub(crate) async fn check_on_device_with(
    ctx: &Context,
    variants: &[GemmVariant],
    driver: Driver,
) -> Result<()> {
    for &variant in variants {
        if let GemmVariant::CoopF16(b) = variant {
            check(ctx, b, driver).await?;
        }
    }
    Ok(())
}

/// [`check_on_device`] for one block.
async fn check(ctx: &Context, b: CoopBlock, driver: Driver) -> Result<()> {
    b.require(ctx)?;
    let verdicts = ctx.kept::<Verdicts>();
    if let Some(done) = lock(&verdicts.of).get(&b) {
        return done.clone().map_err(Error::invalid);
    }
    let outcome = match compare(ctx, GemmVariant::CoopF16(b), b.rows.max(32), driver).await? {
        None => Ok(()),
        Some(wrong) => Err(format!(
            "the coop-{} GEMM failed its check against the CPU reference on this device: {wrong}",
            b.name()
        )),
    };
    if let Err(wrong) = &outcome {
        log::warn!("moeflow: {wrong}");
    }
    lock(&verdicts.of).insert(b, outcome.clone());
    outcome.map_err(Error::invalid)
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
async fn compare(ctx: &Context, variant: GemmVariant, tile: u32, driver: Driver) -> Result<Option<String>> {
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
    ctx.run_with(&dispatches.iter().collect::<Vec<_>>(), driver).await?;
    let rows: Vec<u32> = ctx.read_back_with(layout.inverse(), tokens as usize, driver).await?;
    let act: Vec<f32> = ctx.read_back_with(&act, layout.max_rows() as usize * f, driver).await?;
    let got: Vec<f32> = ctx.read_back_with(&partial, tokens as usize * h, driver).await?;

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
            let passed = pollster::block_on(compare(&ctx, GemmVariant::TileF16(tile), 32, Driver::Inline))
                .expect("the check runs");
            assert_eq!(passed, None, "{slug}: f16-staged tiles");
            let refused = pollster::block_on(compare(&ctx, GemmVariant::Tile(tile), 32, Driver::Inline))
                .expect("the check runs");
            assert!(refused.is_some(), "{slug}: exact tiles passed the f16 check");
            eprintln!("{slug}: exact tiles refused: {}", refused.unwrap_or_default());
        }
    }

    /// Where the device has no cooperative matrices the check refuses before running anything
    /// and remembers nothing.
    #[test]
    fn the_check_refuses_devices_without_cooperative_matrices() {
        for ctx in crate::context::test_contexts() {
            let err = pollster::block_on(check(&ctx, CoopBlock::new(32, 32, 16, 32), Driver::Inline))
                .expect_err("no CPU adapter has them");
            assert!(matches!(err, Error::MissingFeature(_)), "{err}");
            assert!(lock(&ctx.kept::<Verdicts>().of).is_empty());
            let err = super::super::coop::passed(&ctx, CoopBlock::new(32, 32, 16, 32))
                .expect_err("no verdict, no plan");
            assert!(matches!(err, Error::MissingFeature(_)), "{err}");
        }
    }
}
