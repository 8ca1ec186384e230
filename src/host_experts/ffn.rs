//! The host experts' FFN over the rows routed to them ([`HostExperts::run`]).
//!
//! Two passes, each threaded over tasks of (expert, block of [`TASK_COLS`] output columns):
//! gate and up over every row of an expert at once, each column's weights decoded once per
//! chunk of K and multiplied into all its rows, then the activation; then down over the
//! activations. Each output column's dot runs over K in the layer's order (`kernel.rs`), its
//! bias one add after it, the activation as `wgsl/gemm/epilogue.wgsl` computes it: the bits
//! of `reference::gemm::ffn_row` (tests/gemm.rs).

use std::ops::Range;

use rayon::prelude::*;

use super::decode;
use super::experts::HostExperts;
use super::kernel::{self, RowsKernel};
use super::memory::filled;
use super::projection::{HostProjection, RowMap, Values};
use super::tile::{COLS, Lanes, PAD, QUADS, Quads, R, ROW_COLS};
use crate::error::{Error, Result};
use crate::kernels::gemm::{Activation, GemmOrder};

/// Columns of K decoded into a tile at a time: a multiple of 128 (so FP8's groups and the
/// 32-value blocks stay whole).
const KC: usize = 128;

/// Output columns of one task of one expert.
const TASK_COLS: usize = 64;

/// One row routed to a host expert: token `token`'s x row through expert `expert`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HostEntry {
    /// The row of x.
    pub token: u32,
    /// The expert.
    pub expert: u32,
}

/// The rows of one expert: indices into the entries, in their order.
struct Group {
    expert: u32,
    entries: Vec<usize>,
}

/// Per-thread tiles of decoded weights: four columns' groups side by side for the strict
/// order (or rows, for [`RowsKernel`]), transposed for the fast one; four rows of scratch for the decoders.
struct Tiles {
    quads: Vec<Quads>,
    rows: Vec<f32>,
    lanes: Vec<Lanes>,
    scratch: Vec<f32>,
}

impl Tiles {
    fn new() -> Self {
        Tiles {
            quads: vec![[[0.0; R]; QUADS]; KC / 4],
            rows: vec![0.0; ROW_COLS * KC],
            lanes: vec![[0.0; R]; KC],
            scratch: vec![0.0; 4 * KC],
        }
    }
}

/// A zeroed host buffer of `len` f32s (as [`filled`] gives).
fn zeros(what: &str, len: usize) -> Result<Vec<f32>> {
    filled(what, len, 0.0)
}

impl HostExperts<'_> {
    /// Computes `out[i, H]` = expert `entries[i].expert`'s FFN of `x[entries[i].token]` for
    /// every entry, from `x[tokens, H]`: `down(act(gate x + b_g, up x + b_u)) + b_d`, each
    /// output the bits of `reference::gemm::ffn_row` on the decoded weights in this order.
    /// Entries of one expert may come in any order and repeat a token; no entries is no
    /// work.
    ///
    /// # Errors
    /// [`Error::Shape`] when `x` is not whole rows of H or `out` is not `entries.len()` rows;
    /// [`Error::InvalidArgument`] for an entry whose token is past x's rows or whose expert
    /// the host does not hold (or is past E); [`Error::HostMemory`] where the host cannot
    /// allocate the rows' working buffers.
    pub fn run(&self, x: &[f32], entries: &[HostEntry], out: &mut [f32]) -> Result<()> {
        let [experts, _, h] = self.shape();
        let h = h as usize;
        if !x.len().is_multiple_of(h) {
            return Err(Error::shape("host experts' x", format!("rows of H = {h}"), x.len()));
        }
        if out.len() as u64 != entries.len() as u64 * h as u64 {
            return Err(Error::shape(
                "host experts' out",
                format!("{} rows of H = {h} (one per entry)", entries.len()),
                out.len(),
            ));
        }
        let tokens = x.len() / h;
        let mut by_expert: Vec<Vec<usize>> = vec![Vec::new(); experts as usize];
        for (i, en) in entries.iter().enumerate() {
            if en.token as usize >= tokens {
                return Err(Error::invalid(format!(
                    "host entry {i} names token {} but x has {tokens} rows",
                    en.token
                )));
            }
            if !self.holds(en.expert) {
                return Err(Error::invalid(format!(
                    "host entry {i} is routed to expert {}, which the host does not hold (it holds {:?} of 0..{experts})",
                    en.expert,
                    self.experts()
                )));
            }
            by_expert[en.expert as usize].push(i);
        }
        let groups: Vec<Group> = by_expert
            .into_iter()
            .enumerate()
            .filter(|(_, rows)| !rows.is_empty())
            .map(|(e, entries)| Group { expert: e as u32, entries })
            .collect();
        if groups.is_empty() {
            return Ok(());
        }
        match &self.pool {
            Some(pool) => pool.install(|| self.compute(x, entries, &groups, out)),
            None => self.compute(x, entries, &groups, out),
        }
    }

    /// [`Self::run`] on checked entries grouped by expert.
    fn compute(&self, x: &[f32], entries: &[HostEntry], groups: &[Group], out: &mut [f32]) -> Result<()> {
        let [_, f, h] = self.shape();
        let (f, h) = (f as usize, h as usize);
        let (f4, h4) = (f.next_multiple_of(PAD), h.next_multiple_of(PAD));
        // Each expert's rows of x, K padded with zeros to a multiple of the kernels' step.
        let xs = groups
            .iter()
            .map(|g| {
                let mut rows = zeros("host experts' x rows", g.entries.len() * h4)?;
                for (row, &i) in rows.chunks_exact_mut(h4).zip(&g.entries) {
                    let t = entries[i].token as usize;
                    row[..h].copy_from_slice(&x[t * h..(t + 1) * h]);
                }
                Ok(rows)
            })
            .collect::<Result<Vec<_>>>()?;
        let up_tasks = tasks(groups.len(), f);
        let act_blocks: Vec<Vec<f32>> = up_tasks
            .par_iter()
            .map_init(Tiles::new, |tiles, &(g, ref cols)| {
                self.gate_up_block(tiles, &groups[g], &xs[g], cols.clone())
            })
            .collect::<Result<_>>()?;
        let mut acts = groups
            .iter()
            .map(|g| zeros("host experts' activations", g.entries.len() * f4))
            .collect::<Result<Vec<_>>>()?;
        for ((g, cols), block) in up_tasks.iter().zip(&act_blocks) {
            for (src, dst) in block.chunks_exact(cols.len()).zip(acts[*g].chunks_exact_mut(f4)) {
                dst[cols.clone()].copy_from_slice(src);
            }
        }
        drop(act_blocks);
        let down_tasks = tasks(groups.len(), h);
        let out_blocks: Vec<Vec<f32>> = down_tasks
            .par_iter()
            .map_init(Tiles::new, |tiles, &(g, ref cols)| {
                self.down_block(tiles, &groups[g], &acts[g], cols.clone())
            })
            .collect::<Result<_>>()?;
        for ((g, cols), block) in down_tasks.iter().zip(&out_blocks) {
            for (src, &i) in block.chunks_exact(cols.len()).zip(&groups[*g].entries) {
                out[i * h + cols.start..i * h + cols.end].copy_from_slice(src);
            }
        }
        Ok(())
    }

    /// Columns `cols` of the activations of `group`'s rows: `[rows, cols]`.
    fn gate_up_block(
        &self,
        tiles: &mut Tiles,
        group: &Group,
        x: &[f32],
        cols: Range<usize>,
    ) -> Result<Vec<f32>> {
        let [_, f, h] = self.shape();
        let (f, h) = (f as usize, h as usize);
        let (e, rows) = (group.expert, group.entries.len());
        let mut g = self.dots(tiles, values(&self.gate, e)?, h, cols.clone(), x, rows)?;
        let u = self.dots(tiles, values(&self.up, e)?, h, cols.clone(), x, rows)?;
        for (g_row, u_row) in g.chunks_exact_mut(cols.len()).zip(u.chunks_exact(cols.len())) {
            for ((gv, &uv), n) in g_row.iter_mut().zip(u_row).zip(cols.clone()) {
                let i = e as usize * f + n;
                *gv = match &self.bias {
                    Some(bias) => epilogue(self.activation, *gv + bias.gate[i], uv + bias.up[i]),
                    None => epilogue(self.activation, *gv, uv),
                };
            }
        }
        Ok(g)
    }

    /// Columns `cols` of the outputs of `group`'s rows from their activations `act`
    /// (`[rows, F padded to four]`): `[rows, cols]`.
    fn down_block(
        &self,
        tiles: &mut Tiles,
        group: &Group,
        act: &[f32],
        cols: Range<usize>,
    ) -> Result<Vec<f32>> {
        let [_, f, h] = self.shape();
        let (f, h) = (f as usize, h as usize);
        let e = group.expert;
        let mut d = self.dots(tiles, values(&self.down, e)?, f, cols.clone(), act, group.entries.len())?;
        if let Some(bias) = &self.bias {
            for row in d.chunks_exact_mut(cols.len()) {
                for (v, n) in row.iter_mut().zip(cols.clone()) {
                    *v += bias.down[e as usize * h + n];
                }
            }
        }
        Ok(d)
    }

    /// `[rows, cols]`: the dot products, in this order, of columns `cols` of one expert's
    /// `[N, k]` weights `v` (row `n` stored row `map.at(n)`) with each of the `rows` rows of
    /// `x` (K padded with zeros to a multiple of [`PAD`]).
    fn dots(
        &self,
        tiles: &mut Tiles,
        (v, map): (&Values<'_>, RowMap),
        k: usize,
        cols: Range<usize>,
        x: &[f32],
        rows: usize,
    ) -> Result<Vec<f32>> {
        let stride = k.next_multiple_of(PAD);
        let width = cols.len();
        let mut out = zeros("host experts' output block", rows * width)?;
        match self.order {
            GemmOrder::Strict => {
                let mut acc = filled("host experts' accumulators", rows, [[0.0f32; R]; QUADS])?;
                let by_rows = RowsKernel::new(self.rows, rows, v.dtype());
                for sub in cols.clone().step_by(COLS) {
                    let sub = sub..cols.end.min(sub + COLS);
                    acc.fill([[0.0; R]; QUADS]);
                    match &by_rows {
                        // Eight columns at a time, each streaming through K.
                        Some(kernel) => {
                            for (block, first) in sub.clone().step_by(ROW_COLS).enumerate() {
                                let block_rows = first..sub.end.min(first + ROW_COLS);
                                // Rows read where they lie go through K in one run.
                                let chunk = if decode::in_place(v, k, block_rows.len()) { k } else { KC };
                                for at in (0..k).step_by(chunk) {
                                    let ks = at..k.min(at + chunk);
                                    let rows =
                                        decode::row_block(v, map, k, block_rows.clone(), ks, &mut tiles.rows);
                                    kernel.run(&rows, block * ROW_COLS / 4, x, stride, at, &mut acc);
                                }
                            }
                        }
                        None => {
                            for at in (0..k).step_by(KC) {
                                let ks = at..k.min(at + KC);
                                let tile = &mut tiles.quads[..ks.len().div_ceil(4)];
                                decode::quads(v, map, k, sub.clone(), ks, tile, &mut tiles.scratch);
                                kernel::strict_quads(tile, x, stride, at, &mut acc);
                            }
                        }
                    }
                    for (o, a) in out.chunks_exact_mut(width).zip(&acc) {
                        for (c, n) in sub.clone().enumerate() {
                            o[n - cols.start] = kernel::strict_sum(a, c);
                        }
                    }
                }
            }
            GemmOrder::Fast => {
                let mut acc = filled("host experts' accumulators", rows, [0.0f32; R])?;
                for sub in cols.clone().step_by(R) {
                    let sub = sub..cols.end.min(sub + R);
                    acc.fill([0.0; R]);
                    for at in (0..k).step_by(KC) {
                        let ks = at..k.min(at + KC);
                        let tile = &mut tiles.lanes[..ks.len().next_multiple_of(4)];
                        decode::transposed(v, map, k, sub.clone(), ks, tile, &mut tiles.scratch[..KC]);
                        kernel::fast_chunk(tile, x, stride, at, &mut acc);
                    }
                    for (o, a) in out.chunks_exact_mut(width).zip(&acc) {
                        for (r, n) in sub.clone().enumerate() {
                            o[n - cols.start] = a[r];
                        }
                    }
                }
            }
        }
        Ok(out)
    }
}

/// The tasks of a pass over `groups` experts' `cols` output columns: (expert group, columns),
/// [`TASK_COLS`] at a time.
fn tasks(groups: usize, cols: usize) -> Vec<(usize, Range<usize>)> {
    (0..groups)
        .flat_map(|g| (0..cols).step_by(TASK_COLS).map(move |c| (g, c..cols.min(c + TASK_COLS))))
        .collect()
}

/// Expert `e`'s values of `p` and where its rows lie in them ([`HostExperts::new`] checked that
/// the projections hold the same experts, and [`HostExperts::run`] that each entry's expert is
/// held).
fn values<'p, 'a>(p: &'p HostProjection<'a>, e: u32) -> Result<(&'p Values<'a>, RowMap)> {
    p.values(e).ok_or_else(|| Error::invalid(format!("host memory holds no weights of expert {e}")))
}

/// The activation of a gate/up pair as the kernels' epilogue computes it
/// (`wgsl/gemm/epilogue.wgsl`): SwiGLU `g / (1 + exp(-g)) · u`; gpt-oss's clamped SwiGLU
/// `(u' + 1) · (g' / (1 + exp(-(alpha · g'))))` with `g' = min(g, limit)` and
/// `u' = clamp(u, -limit, limit)`.
fn epilogue(activation: Activation, g: f32, u: f32) -> f32 {
    match activation {
        Activation::ClampedSwiglu { alpha, limit } => {
            let (gc, uc) = (g.min(limit), u.clamp(-limit, limit));
            (uc + 1.0) * (gc / (1.0 + (-(alpha * gc)).exp()))
        }
        Activation::Swiglu => g / (1.0 + (-g).exp()) * u,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bits::canonical;
    use crate::host_experts::kernel::RowsIsa;
    use crate::kernels::gemm::{QuantisedValues, StoredValues, WeightDtype};
    use crate::reference::gemm::{FfnWeights, ffn_row};
    use crate::synth::StoredExperts;

    /// Every rows kernel this CPU runs (an AVX-512 machine would otherwise never run AVX2's,
    /// nor an x86 one the portable kernel NEON runs) gives the reference's bits for experts of
    /// one and two tokens, in every dtype: rows read where they lie (K a multiple of 16; H =
    /// 288, past the portable kernel's span of 256 values) and decoded a chunk at a time (K =
    /// 40).
    #[test]
    fn every_rows_kernel_gives_the_references_bits() {
        #[cfg(target_arch = "x86_64")]
        let isas: Vec<RowsIsa> = [RowsIsa::Avx512, RowsIsa::Avx2, RowsIsa::Portable]
            .into_iter()
            .filter(|i| i.supported())
            .collect();
        #[cfg(target_arch = "x86_64")]
        if !isas.contains(&RowsIsa::Avx2) {
            println!("skipped AVX2's rows kernel: this CPU has no AVX2, FMA and F16C");
        }
        #[cfg(not(target_arch = "x86_64"))]
        let isas = [RowsIsa::Portable];
        let (e, h) = (3usize, 288usize);
        let mut state = 0x2545_f491_u32;
        let mut random = |n: usize| -> Vec<f32> {
            (0..n)
                .map(|_| {
                    state ^= state << 13;
                    state ^= state >> 17;
                    state ^= state << 5;
                    (state % 2001) as f32 / 2000.0 - 0.5
                })
                .collect()
        };
        let cases = [
            (WeightDtype::F32, 40),
            (WeightDtype::F16, 40),
            (WeightDtype::Bf16, 40),
            (WeightDtype::Q8_0, 64),
            (WeightDtype::Q4_0, 64),
            // F = 288 too: the down rows' scales are read eight blocks at a time, then one.
            (WeightDtype::Mxfp4, 288),
        ];
        for (dtype, f) in cases {
            let shapes = [[e, f, h], [e, f, h], [e, h, f]];
            let mut values = shapes.map(|shape| random(shape.iter().product()));
            // Expert 0's gate: a block of zeros, given an infinite (NaN for MXFP4) scale below.
            values[0][32..64].fill(0.0);
            let mut stored: Vec<StoredExperts> = shapes
                .iter()
                .zip(&values)
                .map(|(&shape, v)| StoredExperts::new(dtype, v, shape).unwrap())
                .collect();
            let (special, tiny) = match dtype {
                WeightDtype::Mxfp4 => (255, 0),
                _ => (half::f16::INFINITY.to_bits(), 1),
            };
            // Block formats only (the others ignore it): 0 times the special scale is NaN; the
            // smallest scale in all of expert 2's down row 0, whose output is then that small.
            stored[0].set_block_scale(1, special).unwrap();
            stored[2].set_block_scales(2 * h * f / 32..2 * h * f / 32 + f / 32, tiny).unwrap();
            fn project(s: &StoredExperts) -> HostProjection<'_> {
                let mut p = HostProjection::new(s.shape()).unwrap();
                for x in 0..s.shape()[0] {
                    p.hold(x, s.expert(x)).unwrap();
                }
                p
            }
            let x = random(2 * h);
            // Expert 0 takes one token, expert 2 two.
            let entries = [(0, 0), (0, 2), (1, 2)].map(|(token, expert)| HostEntry { token, expert });
            let w = FfnWeights {
                gate: stored[0].decoded(),
                up: stored[1].decoded(),
                down: stored[2].decoded(),
                hidden: h,
                ffn: f,
                order: GemmOrder::Strict,
                activation: Activation::Swiglu,
                bias: None,
                f16_operands: false,
            };
            // MXFP4 also as ggml stores it (`block_mxfp4`), read where it lies.
            let ggml: Vec<Vec<Vec<u8>>> = match dtype {
                WeightDtype::Mxfp4 => stored
                    .iter()
                    .map(|s| {
                        (0..e as u32)
                            .map(|x| match s.expert(x) {
                                StoredValues::Quantised(QuantisedValues::Mxfp4 { codes, scales }) => {
                                    crate::quant::mxfp4_to_ggml(codes, scales).unwrap()
                                }
                                other => panic!("{other:?} is not MXFP4"),
                            })
                            .collect()
                    })
                    .collect(),
                _ => Vec::new(),
            };
            fn ggml_project<'a>(s: &StoredExperts, blocks: &'a [Vec<u8>]) -> HostProjection<'a> {
                let mut p = HostProjection::new(s.shape()).unwrap();
                for (x, b) in blocks.iter().enumerate() {
                    p.hold_ggml_mxfp4(x as u32, b).unwrap();
                }
                p
            }
            for &isa in &isas {
                let mut layouts =
                    vec![("as stored", [project(&stored[0]), project(&stored[1]), project(&stored[2])])];
                if !ggml.is_empty() {
                    let [g, u, d] = [0, 1, 2].map(|i| ggml_project(&stored[i], &ggml[i]));
                    layouts.push(("ggml's blocks", [g, u, d]));
                }
                for (layout, [g, u, d]) in layouts {
                    let host = HostExperts::new(g, u, d, GemmOrder::Strict, Activation::Swiglu).unwrap();
                    let host = HostExperts { rows: Some(isa), ..host };
                    let mut out = vec![0.0; entries.len() * h];
                    host.run(&x, &entries, &mut out).unwrap();
                    for (i, en) in entries.iter().enumerate() {
                        let t = en.token as usize;
                        let want = ffn_row(&x[t * h..(t + 1) * h], en.expert as usize, &w);
                        assert_eq!(
                            canonical(&out[i * h..(i + 1) * h]),
                            canonical(&want),
                            "{isa:?} {dtype:?} {layout}: entry {i}"
                        );
                    }
                }
            }
        }
    }
}
