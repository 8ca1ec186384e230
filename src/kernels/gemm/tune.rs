//! The GEMM tuner: picks the fastest candidate variant for each projection of an expert FFN by
//! timing them on the device, and remembers the choice on disk.
//!
//! Each candidate runs the grouped GEMM the layer runs (the SwiGLU gate/up pass and the down
//! pass, timed separately) on the FFN's own weights, every expert taking part: expert `e` gets
//! `3·rows/4` rows when `e` is even and `5·rows/4` when odd, for a mean share of `rows`, routed
//! through a dispatch layout with the candidate's own row tile (its block rows, as the layer
//! plans it). So the device is as full as in the layer (a GPU measured on two experts' rows was
//! idle enough to prefer a variant 1.57× slower at full occupancy), and neither share is a
//! multiple of the blocks' rows, so the partial blocks at the end of an expert's tile, which
//! wide blocks pay more for, are in the time as they are in the layer. Times are the GPU clock
//! (timestamps around each pass) where the adapter has timestamps, else host wall time from
//! submit to completion. Candidates are timed in interleaved rounds (the order reversed every
//! other round, a short version of the ABBA protocol) and the median of each decides; the
//! adapter's fixed default stays unless a candidate is faster by more than
//! [`TUNE_DEFAULT_MARGIN`]. Every exact candidate computes the same bits in one order, so
//! among them the choice changes speed only; on a device created with cooperative matrices
//! the candidates also hold [`GemmVariant::CoopF16`] blocks, a precision mode the caller opted
//! into there (within its documented bound, each checked on the device before it is timed).
//!
//! The cache is a JSON file (`MOEFLOW_TUNE_CACHE`, else `$XDG_CACHE_HOME/moeflow/tune.json`,
//! else `$HOME/.cache/moeflow/tune.json`) keyed by adapter, driver, wgpu version, a hash of
//! the kernels' source (so a changed kernel is tuned again) and the problem's class. A file
//! that cannot be read or parsed, or an entry that names no current candidate, is ignored
//! with a log line and rewritten.

use std::path::PathBuf;

use super::ffn::ExpertFfn;
use super::params::{NONE, Params};
use super::passes::Pass;
use super::policy;
use super::tune_cache::{CacheEntry, TuneKey, read_cache, write_cache};
use super::variant::{FfnKernels, GemmOrder, GemmVariant};
use crate::context::Context;
use crate::context::wait::Driver;
use crate::error::{Error, Result};
use crate::kernels::dispatch::{DispatchConfig, DispatchLayout};
use crate::pipeline::Dispatch;
use crate::tensor::word_bytes;
use crate::timer::{Sample, Sampler};
use crate::workspace::Scratch;

/// How much faster than the adapter's fixed default ([`FfnKernels::default_for`]) a candidate
/// must time to replace it: 5%, about the spread of the tuner's medians on the CPU adapters,
/// where a 2% win in the tuner's problem measured as a 4–6% loss in the layer.
pub const TUNE_DEFAULT_MARGIN: f64 = 0.05;

/// How to tune.
#[derive(Clone, Debug)]
pub struct TuneOptions {
    /// Variants to time (default: [`policy::candidates`] for the adapter, and on a device
    /// created with cooperative matrices the [`GemmVariant::CoopF16`] blocks it can run, each
    /// timed only after it passed its check against the CPU reference there).
    pub candidates: Vec<GemmVariant>,
    /// An expert's mean share of rows in the prefill the choice is for (default 32: 256
    /// tokens routed 2 ways over 16 experts); the timed problem gives every expert
    /// `3·rows/4` or `5·rows/4` rows, alternately (see the module docs).
    pub rows: u32,
    /// Interleaved timing rounds (default 5).
    pub rounds: u32,
    /// The cache file (default: see the module docs; `None` keeps nothing).
    pub cache: Option<PathBuf>,
}

impl TuneOptions {
    /// The defaults for `ctx`'s adapter.
    pub fn for_context(ctx: &Context) -> Self {
        TuneOptions {
            candidates: policy::candidates(policy::AdapterKind::of(ctx.adapter()))
                .into_iter()
                .chain(policy::coop_candidates(ctx))
                .collect(),
            rows: 32,
            rounds: 5,
            cache: default_cache_path(),
        }
    }
}

/// The default cache file, if a home or cache directory is known.
pub(crate) fn default_cache_path() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("MOEFLOW_TUNE_CACHE") {
        return Some(PathBuf::from(p));
    }
    let base = match std::env::var_os("XDG_CACHE_HOME") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(std::env::var_os("HOME")?).join(".cache"),
    };
    Some(base.join("moeflow").join("tune.json"))
}

/// What the tuner decided and how.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct Tuned {
    /// The kernels to run.
    pub kernels: FfnKernels,
    /// Taken from the cache file (nothing was timed).
    pub from_cache: bool,
    /// Median seconds per candidate (each listed once) and pass (`up` then `down`), when timed.
    pub timings: Vec<(GemmVariant, f64, f64)>,
    /// The cache key.
    pub key: TuneKey,
}

/// Chooses `ffn`'s kernels in `order` by timing `opts.candidates` on `ctx` (or reading the
/// cache).
///
/// # Errors
/// An empty candidate list or one whose variants are all refused by the device; device
/// errors while timing. A cache that cannot be read or written is not an error.
#[cfg(not(target_arch = "wasm32"))]
pub fn tune(ctx: &Context, ffn: &ExpertFfn, order: GemmOrder, opts: &TuneOptions) -> Result<Tuned> {
    pollster::block_on(tune_with(ctx, ffn, order, opts, Driver::Inline))
}

/// [`tune`] without blocking the awaiting thread on its timed runs (see
/// [`Context::submit_async`]).
///
/// # Errors
/// As [`tune`].
pub async fn tune_async(
    ctx: &Context,
    ffn: &ExpertFfn,
    order: GemmOrder,
    opts: &TuneOptions,
) -> Result<Tuned> {
    tune_with(ctx, ffn, order, opts, Driver::Await).await
}

/// [`tune`], waiting as `driver` says.
pub(crate) async fn tune_with(
    ctx: &Context,
    ffn: &ExpertFfn,
    order: GemmOrder,
    opts: &TuneOptions,
    driver: Driver,
) -> Result<Tuned> {
    let rows = opts.rows.max(1);
    let key = TuneKey::new(ctx, ffn, order, rows);
    let mut cache = opts.cache.as_deref().map(read_cache).unwrap_or_default();
    if let Some(e) = cache.get(&key) {
        let known = |v: &GemmVariant| opts.candidates.contains(v) && v.validate().is_ok();
        if known(&e.up) && known(&e.down) {
            return Ok(Tuned {
                kernels: FfnKernels { order, up: e.up, down: e.down },
                from_cache: true,
                timings: Vec::new(),
                key,
            });
        }
        log::warn!(
            "moeflow: ignoring the tuning cache entry for {key}: it names a variant that is not a candidate"
        );
    }
    let timings = measure(ctx, ffn, order, rows, opts, driver).await?;
    let default = FfnKernels::default_for(policy::AdapterKind::of(ctx.adapter()), order);
    let best = |pick: fn(&(GemmVariant, f64, f64)) -> f64, fixed: GemmVariant| {
        let fastest = timings
            .iter()
            .filter(|t| pick(t).is_finite())
            .min_by(|a, b| pick(a).total_cmp(&pick(b)))
            .ok_or_else(|| Error::invalid("no GEMM candidate ran on this device"))?;
        // The fixed default stays unless a candidate beats it by more than the timing noise.
        let stays = timings
            .iter()
            .find(|t| t.0 == fixed)
            .is_some_and(|t| pick(fastest) * (1.0 + TUNE_DEFAULT_MARGIN) >= pick(t));
        Ok::<_, Error>(if stays { fixed } else { fastest.0 })
    };
    let kernels = FfnKernels { order, up: best(|t| t.1, default.up)?, down: best(|t| t.2, default.down)? };
    if let Some(path) = &opts.cache {
        cache.insert(
            &key,
            CacheEntry {
                up: kernels.up,
                down: kernels.down,
                timings: timings.iter().map(|(v, u, d)| (v.name(), *u, *d)).collect(),
            },
        );
        write_cache(path, &cache);
    }
    Ok(Tuned { kernels, from_cache: false, timings, key })
}

/// Median seconds of every candidate's gate/up and down pass (infinite where the device
/// refused the variant).
async fn measure(
    ctx: &Context,
    ffn: &ExpertFfn,
    order: GemmOrder,
    rows: u32,
    opts: &TuneOptions,
    driver: Driver,
) -> Result<Vec<(GemmVariant, f64, f64)>> {
    if opts.candidates.is_empty() {
        return Err(Error::invalid("the tuner needs at least one candidate variant"));
    }
    let (e, f, h) = (ffn.experts(), ffn.ffn(), ffn.hidden());
    let shares = timed_rows(rows);
    // Tokens routed one way each, expert by expert: expert `e` takes `shares[e % 2]` of them.
    let experts: Vec<u32> =
        (0..e).flat_map(|ex| std::iter::repeat_n(ex, shares[ex as usize % 2] as usize)).collect();
    let tokens = u32::try_from(experts.len())
        .map_err(|_| Error::limit("tuner rows", experts.len() as u64, u32::MAX.into(), "u32 entries"))?;
    let x = ctx.upload("tune x", &vec![0.25f32; tokens as usize * h as usize])?;
    let indices = ctx.upload("tune indices", &experts)?;
    let partial = ctx.storage_scratch("tune output", word_bytes(u64::from(tokens) * u64::from(h)))?;
    // One dispatch layout (filled once, untimed, before the warm-up) and activation buffer per
    // row tile in use.
    let mut layouts: Vec<(u32, DispatchLayout, wgpu::Buffer)> = Vec::new();
    let mut fills: Vec<Dispatch> = Vec::new();
    let mut build = |v: GemmVariant| -> Result<(Vec<Dispatch>, Vec<Dispatch>)> {
        v.validate()?;
        let tile = v.block_rows();
        if !layouts.iter().any(|(t, ..)| *t == tile) {
            let layout = DispatchLayout::new(ctx, DispatchConfig { experts: e, k: 1, tile }, tokens, 0)?;
            fills.extend(layout.plan(ctx, &indices)?);
            let act = ctx.storage_scratch(
                "tune activations",
                word_bytes(u64::from(layout.max_rows()) * u64::from(f)),
            )?;
            layouts.push((tile, layout, act));
        }
        let Some((_, layout, act)) = layouts.iter().find(|(t, ..)| *t == tile) else {
            return Err(Error::invalid("the tuner lost a dispatch layout it made"));
        };
        let base = Params { k_route: 1, fixed_expert: NONE, ..Params::default() };
        let up = Pass::grouped_gate_up(ffn, order, base, (&x).into(), layout, act.into());
        let down = Pass::down(&up, ffn, act.into(), (&partial).into());
        let scratch = Scratch::Own(ctx);
        Ok((
            up.gemm(scratch, v, Some(layout.tile_expert()))?,
            down.gemm(scratch, v, Some(layout.tile_expert()))?,
        ))
    };
    // A refused variant is recorded as never fastest.
    let mut runs = Vec::new();
    for (i, &v) in opts.candidates.iter().enumerate() {
        if opts.candidates[..i].contains(&v) {
            continue;
        }
        // A cooperative-matrix block is timed only after it passed its device check.
        let checked = super::device_check::check_on_device_with(ctx, &[v], driver).await;
        match checked.and_then(|()| build(v)) {
            Ok(pair) => runs.push((v, Some(pair))),
            Err(e) => {
                log::info!("moeflow: tuner skips {}: {e}", v.name());
                runs.push((v, None));
            }
        }
    }
    ctx.run_with(&fills.iter().collect::<Vec<_>>(), driver).await?;
    let rounds = opts.rounds.max(1);
    let built = runs.iter().filter(|r| r.1.is_some()).count() as u32;
    let mut sampler = Sampler::new(ctx, 2 * rounds * built)?;
    // Warm-up: compiles every pipeline and touches every buffer once.
    for (u, d) in runs.iter().filter_map(|r| r.1.as_ref()) {
        sampler.untimed_with(&u.iter().collect::<Vec<_>>(), 1, driver).await?;
        sampler.untimed_with(&d.iter().collect::<Vec<_>>(), 1, driver).await?;
    }
    let mut samples: Vec<(Vec<Sample>, Vec<Sample>)> = vec![(Vec::new(), Vec::new()); runs.len()];
    for round in 0..rounds {
        let order_of: Vec<usize> =
            if round % 2 == 0 { (0..runs.len()).collect() } else { (0..runs.len()).rev().collect() };
        for i in order_of {
            if let Some((u, d)) = &runs[i].1 {
                samples[i].0.push(sampler.sample_with(&u.iter().collect::<Vec<_>>(), 1, driver).await?);
                samples[i].1.push(sampler.sample_with(&d.iter().collect::<Vec<_>>(), 1, driver).await?);
            }
        }
    }
    // One clock for every candidate, read back once: the GPU's where every sample has it, else
    // the wall clock.
    let flat: Vec<Sample> = samples.iter().flat_map(|(u, d)| u.iter().chain(d)).copied().collect();
    let gpu: Option<Vec<f64>> = sampler.gpu_seconds_with(&flat, driver).await?.into_iter().collect();
    let mut seconds = gpu.unwrap_or_else(|| flat.iter().map(|s| s.wall_s).collect()).into_iter();
    let mut median_of_next = |n: usize| {
        let mut v: Vec<f64> = seconds.by_ref().take(n).collect();
        if v.is_empty() {
            return f64::INFINITY;
        }
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    Ok(runs
        .iter()
        .zip(&samples)
        .map(|((v, _), (u, d))| (*v, median_of_next(u.len()), median_of_next(d.len())))
        .collect())
}

/// The row counts of the timed problem for a mean share of `rows` (see the module docs):
/// `3·rows/4` and `5·rows/4`, at least one row each.
fn timed_rows(rows: u32) -> [u32; 2] {
    [(3 * rows / 4).max(1), (5 * rows / 4).max(1)]
}

#[cfg(test)]
mod tests {
    use super::timed_rows;

    #[test]
    fn the_timed_experts_straddle_the_mean_share_off_the_block_rows() {
        assert_eq!(timed_rows(32), [24, 40]);
        assert_eq!(timed_rows(64), [48, 80]);
        // Neither is a multiple of 16 or 32 at the default share.
        assert!(timed_rows(32).iter().all(|r| r % 16 != 0));
        assert_eq!(timed_rows(1), [1, 1]);
        assert_eq!(timed_rows(0), [1, 1]);
    }
}
